//! Asset requests every transport shares: the usability check, the tickets
//! and the listing. Only moving the bytes differs (hyper natively, `fetch` in
//! the browser), so the rules here are written once; the native byte moves
//! follow (feature `grpc`).

use pedelec_protocol::{ErrorCode, pb};
use serde::de::DeserializeOwned;

use super::PedelecSession;
use crate::error::PedelecError;
use crate::tool::ToolName;
use crate::transport::{Call, Reply, unexpected};

impl<T: ToolName> PedelecSession<T> {
    pub(crate) fn check_assets_usable(&self) -> Result<(), PedelecError> {
        match self.get_status().refuse_assets() {
            Some((code, message)) => Err(PedelecError::new(code, message)),
            None => Ok(()),
        }
    }

    fn check_asset_path(path: &str) -> Result<(), PedelecError> {
        pedelec_protocol::AssetPath::parse(path)
            .map(|_| ())
            .map_err(|e| PedelecError::new(ErrorCode::AssetPathInvalid, format!("{path:?}: {e}")))
    }

    /// An upload ticket for a file of `size` bytes, after the path and size checks.
    pub(crate) async fn upload_ticket(
        &self,
        file_name: &str,
        size: u64,
        target_path: Option<&str>,
    ) -> Result<pb::AssetTicket, PedelecError> {
        self.check_assets_usable()?;
        if let Some(path) = target_path {
            Self::check_asset_path(path)?;
        }
        if size > pedelec_protocol::limits::MAX_ASSET_BYTES {
            return Err(PedelecError::new(ErrorCode::AssetTooLarge, "a file is limited to 100 MiB"));
        }
        let request = pb::CreateAssetUploadRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            target_path: target_path.unwrap_or_default().to_owned(),
            file_name: file_name.to_owned(),
            size,
        };
        match self.shell.transport.call(Call::CreateAssetUpload(request)).await? {
            Reply::CreateAssetUpload(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// A download ticket for one public path.
    pub(crate) async fn download_ticket(&self, path: &str) -> Result<pb::AssetTicket, PedelecError> {
        self.check_assets_usable()?;
        Self::check_asset_path(path)?;
        let request = pb::CreateAssetDownloadRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            path: path.to_owned(),
        };
        match self.shell.transport.call(Call::CreateAssetDownload(request)).await? {
            Reply::CreateAssetDownload(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// Completed regular files from every level, newest first then by name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// for asset in session.list_assets().await? {
    ///     println!("{} {} bytes", asset.path, asset.size);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_assets(&self) -> Result<Vec<pb::Asset>, PedelecError> {
        self.check_assets_usable()?;
        let request = pb::ListAssetsRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
        };
        match self.shell.transport.call(Call::ListAssets(request)).await? {
            Reply::ListAssets(r) => Ok(r.assets),
            other => Err(unexpected(&other)),
        }
    }
}

/// Strict UTF-8 for `readAsset(path, "text")`.
pub(crate) fn asset_text(path: &str, bytes: Vec<u8>) -> Result<String, PedelecError> {
    String::from_utf8(bytes)
        .map_err(|e| PedelecError::new(ErrorCode::AssetTextDecodeFailed, format!("{path} is not UTF-8: {e}")))
}

/// Strict JSON for `readAsset(path, "json")`.
pub(crate) fn asset_json<J: DeserializeOwned>(path: &str, text: &str) -> Result<J, PedelecError> {
    serde_json::from_str(text)
        .map_err(|e| PedelecError::new(ErrorCode::AssetInvalidJson, format!("{path} is not valid JSON: {e}")))
}

#[cfg(feature = "grpc")]
impl<T: ToolName> PedelecSession<T> {
    /// Uploads one file; returns its public path. `target_path` writes exactly
    /// there (creating parents, replacing a regular file).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::assets::UploadSource;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let source = UploadSource::from_bytes("report.json", "application/json", br#"{"ok":true}"#.to_vec());
    /// let path = session.upload_asset(source, Some("/results/report.json")).await?;
    /// assert_eq!(path, "/results/report.json");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn upload_asset(
        &self,
        source: crate::assets::UploadSource,
        target_path: Option<&str>,
    ) -> Result<String, PedelecError> {
        let ticket = self.upload_ticket(&source.name, source.size, target_path).await?;
        crate::assets::put(&ticket, source).await?;
        Ok(ticket.path)
    }

    /// Reads a file (`readAsset(path, "file")`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let file = session.read_asset_file("/results/report.json").await?;
    /// println!("{} is {} bytes of {}", file.name, file.bytes.len(), file.mime_type);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_file(&self, path: &str) -> Result<crate::assets::AssetFile, PedelecError> {
        let ticket = self.download_ticket(path).await?;
        crate::assets::get(&ticket).await
    }

    /// Downloads a file into `dest` on this machine and returns its size:
    /// whole or not at all (see [`crate::assets::get_to_file`]). Large
    /// assets are best read this way rather than into memory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let size = session.download_asset_to("/results/big.bin", std::path::Path::new("big.bin")).await?;
    /// println!("{size} bytes");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn download_asset_to(&self, path: &str, dest: &std::path::Path) -> Result<u64, PedelecError> {
        let ticket = self.download_ticket(path).await?;
        crate::assets::get_to_file(&ticket, dest).await
    }

    /// Reads a file as strict UTF-8 (`ASSET_TEXT_DECODE_FAILED` otherwise).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let notes = session.read_asset_text("/notes.md").await?;
    /// println!("{notes}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_text(&self, path: &str) -> Result<String, PedelecError> {
        asset_text(path, self.read_asset_file(path).await?.bytes)
    }

    /// Reads and parses JSON (`ASSET_INVALID_JSON` otherwise); `J` is typing only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// #[derive(serde::Deserialize)]
    /// struct Report {
    ///     passed: u32,
    ///     failed: u32,
    /// }
    ///
    /// let report: Report = session.read_asset_json("/results/report.json").await?;
    /// println!("{} passed, {} failed", report.passed, report.failed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_json<J: DeserializeOwned>(&self, path: &str) -> Result<J, PedelecError> {
        asset_json(path, &self.read_asset_text(path).await?)
    }
}
