//! Session assets from the SDK: tickets come through the transport, bytes go
//! over Core's 127.0.0.1 transfer server (HTTP/1.1), streamed both ways — or,
//! on Unix, files are handed over whole through the ticket's hand-off socket
//! (`handoff`), and the kernel copies them.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use pedelec_sdk::assets::UploadSource;
//! use pedelec_sdk::{Pedelec, SessionOptions};
//!
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! let source = UploadSource::from_path("report.json").await?;
//! let path = session.upload_asset(source, Some("/results/report.json")).await?;
//! let report: serde_json::Value = session.read_asset_json(&path).await?;
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use bytes::BytesMut;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use pedelec_protocol::{AssetPath, ErrorCode, limits, pb};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::PedelecError;

#[cfg(unix)]
mod handoff;

/// Something to upload: a name, a MIME type, its exact size and its bytes.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::assets::UploadSource;
///
/// let source = UploadSource::from_bytes("notes.txt", "text/plain", b"remember".to_vec());
/// assert_eq!((source.name.as_str(), source.size), ("notes.txt", 8));
/// ```
pub struct UploadSource {
    pub name: String,
    pub mime_type: String,
    pub size: u64,
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    /// The file behind `reader` when it is one ([`UploadSource::from_path`]):
    /// a Core on this machine copies it from file to file (the ticket's
    /// hand-off socket) instead of receiving its bytes through a socket.
    /// Windows has no descriptor passing: there it is kept and never read.
    #[cfg_attr(not(unix), allow(dead_code))]
    file: Option<std::fs::File>,
}

impl UploadSource {
    /// A file on disk (name from its file name).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::assets::UploadSource;
    ///
    /// let source = UploadSource::from_path("screens/page.png").await?;
    /// assert_eq!(source.name, "page.png");
    /// // The type is not guessed from the name.
    /// assert_eq!(source.mime_type, "application/octet-stream");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_path(path: impl AsRef<Path>) -> Result<Self, PedelecError> {
        let path = path.as_ref();
        let io =
            |e: std::io::Error| PedelecError::new(ErrorCode::AssetUploadFailed, format!("{}: {e}", path.display()));
        let file = tokio::fs::File::open(path).await.map_err(io)?;
        let size = file.metadata().await.map_err(io)?.len();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "upload".into());
        // The same open file, for a hand-off: it reads at explicit offsets,
        // so sharing the reader's file offset does not matter.
        let handed = file.try_clone().await.map_err(io)?.into_std().await;
        Ok(UploadSource {
            name,
            mime_type: "application/octet-stream".into(),
            size,
            reader: Box::new(file),
            file: Some(handed),
        })
    }

    /// Bytes in memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::assets::UploadSource;
    ///
    /// let json = serde_json::to_vec(&serde_json::json!({ "ok": true })).unwrap();
    /// let source = UploadSource::from_bytes("result.json", "application/json", json);
    /// assert_eq!(source.size, 11);
    /// ```
    pub fn from_bytes(name: impl Into<String>, mime_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        UploadSource {
            name: name.into(),
            mime_type: mime_type.into(),
            size: bytes.len() as u64,
            reader: Box::new(std::io::Cursor::new(bytes)),
            file: None,
        }
    }

    /// Any async reader delivering exactly `size` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::assets::UploadSource;
    ///
    /// // Core keeps the file only if exactly `size` bytes arrive.
    /// let reader = std::io::Cursor::new(vec![0u8; 4096]);
    /// let source = UploadSource::from_reader("zeros.bin", "application/octet-stream", 4096, reader);
    /// assert_eq!(source.size, 4096);
    /// ```
    pub fn from_reader(
        name: impl Into<String>,
        mime_type: impl Into<String>,
        size: u64,
        reader: impl AsyncRead + Send + Unpin + 'static,
    ) -> Self {
        UploadSource { name: name.into(), mime_type: mime_type.into(), size, reader: Box::new(reader), file: None }
    }
}

/// A file read back from the assets (`readAsset(path, "file")`).
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
/// println!("{} ({}, {} bytes)", file.name, file.mime_type, file.bytes.len());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AssetFile {
    pub name: String,
    pub mime_type: String,
    /// Modification time, ms since epoch.
    pub modified_at: i64,
    pub bytes: Vec<u8>,
}

/// Validates a public path before any request.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::ErrorCode;
/// use pedelec_sdk::assets::check_path;
///
/// assert_eq!(check_path("/results/report.json").unwrap().file_name(), "report.json");
/// let refused = check_path("results/report.json").unwrap_err();
/// assert!(refused.is(ErrorCode::AssetPathInvalid));
/// ```
pub fn check_path(path: &str) -> Result<AssetPath, PedelecError> {
    AssetPath::parse(path).map_err(|e| PedelecError::new(ErrorCode::AssetPathInvalid, format!("{path:?}: {e}")))
}

fn failed(code: ErrorCode, e: impl std::fmt::Display) -> PedelecError {
    PedelecError::new(code, e.to_string())
}

async fn connect(
    ticket: &pb::AssetTicket,
    code: ErrorCode,
) -> Result<(hyper::client::conn::http1::SendRequest<TransferBody>, hyper::Uri), PedelecError> {
    let uri: hyper::Uri = ticket.url.parse().map_err(|e| failed(code, e))?;
    let host = uri.host().unwrap_or_default();
    if host != "127.0.0.1" {
        return Err(failed(code, format!("refusing a non-loopback transfer URL {}", ticket.url)));
    }
    let stream =
        tokio::net::TcpStream::connect((host, uri.port_u16().unwrap_or(80))).await.map_err(|e| failed(code, e))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| failed(code, e))?;
    tokio::spawn(connection);
    Ok((sender, uri))
}

/// The `Host` a transfer names: the ticket url's own authority, address and
/// port, the only one Core's transfer server answers to.
fn host_of(uri: &hyper::Uri) -> String {
    uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default()
}

type TransferBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

async fn error_from(response: hyper::Response<hyper::body::Incoming>, code: ErrorCode) -> PedelecError {
    let status = response.status();
    let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    match serde_json::from_slice::<pb::Error>(&body) {
        Ok(error) if !error.code.is_empty() => error.into(),
        _ => failed(code, format!("transfer failed with HTTP {status}")),
    }
}

const UPLOAD_CHUNK: usize = 1 << 20;

/// PUTs the source to an upload ticket.
///
/// [`PedelecSession::upload_asset`](crate::PedelecSession::upload_asset)
/// asks for the ticket and calls this; a program speaking to Core's API
/// itself gets the ticket from `CreateAssetUpload`.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::assets::{UploadSource, put};
/// use pedelec_sdk::grpc::GrpcTransport;
/// use pedelec_sdk::pb::CreateAssetUploadRequest;
/// use pedelec_sdk::transport::{Call, Reply, Transport, unexpected};
///
/// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
/// let request = CreateAssetUploadRequest {
///     session_id: "sess-1".into(),
///     caller_origin: "app:my-tool".into(),
///     file_name: "notes.txt".into(),
///     size: 5,
///     target_path: String::new(),
/// };
/// let ticket = match transport.call(Call::CreateAssetUpload(request)).await? {
///     Reply::CreateAssetUpload(ticket) => ticket,
///     other => return Err(unexpected(&other)),
/// };
/// put(&ticket, UploadSource::from_bytes("notes.txt", "text/plain", b"hello".to_vec())).await?;
/// println!("uploaded to {}", ticket.path);
/// # Ok(())
/// # }
/// ```
pub async fn put(ticket: &pb::AssetTicket, source: UploadSource) -> Result<(), PedelecError> {
    let code = ErrorCode::AssetUploadFailed;
    #[cfg(unix)]
    if let Some(file) = &source.file {
        let file = file.try_clone().map_err(|e| failed(code, e))?;
        if let Some(result) = handoff::upload(ticket, file).await {
            return result;
        }
    }
    let (mut sender, uri) = connect(ticket, code).await?;
    // One buffer, read into without zeroing; once hyper has written a chunk
    // and dropped it, `reserve` takes the same allocation back.
    let state = (source.reader, BytesMut::new());
    let chunks = futures::stream::unfold(state, |(mut reader, mut buf)| async move {
        buf.reserve(UPLOAD_CHUNK);
        match reader.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(Frame::data(buf.split().freeze())), (reader, buf))),
            Err(e) => Some((Err(e), (reader, buf))),
        }
    });
    let request = hyper::Request::put(uri.path())
        .header(hyper::header::HOST, host_of(&uri))
        .header(hyper::header::AUTHORIZATION, format!("Bearer {}", ticket.token))
        .header(hyper::header::CONTENT_TYPE, &source.mime_type)
        .header(hyper::header::CONTENT_LENGTH, source.size)
        .body(BodyExt::boxed_unsync(StreamBody::new(chunks)))
        .map_err(|e| failed(code, e))?;
    let response = sender.send_request(request).await.map_err(|e| failed(code, e))?;
    if !response.status().is_success() {
        return Err(error_from(response, code).await);
    }
    Ok(())
}

/// GETs a download ticket's file: the response whose body is its bytes, or
/// the transfer server's error.
async fn request_download(
    ticket: &pb::AssetTicket,
    code: ErrorCode,
) -> Result<hyper::Response<hyper::body::Incoming>, PedelecError> {
    let (mut sender, uri) = connect(ticket, code).await?;
    let request = hyper::Request::get(uri.path())
        .header(hyper::header::HOST, host_of(&uri))
        .header(hyper::header::AUTHORIZATION, format!("Bearer {}", ticket.token))
        .body(BodyExt::boxed_unsync(http_body_util::Empty::new().map_err(|never| match never {})))
        .map_err(|e| failed(code, e))?;
    let response = sender.send_request(request).await.map_err(|e| failed(code, e))?;
    if !response.status().is_success() {
        return Err(error_from(response, code).await);
    }
    Ok(response)
}

/// GETs a download ticket's file, bounded by the 100 MiB read limit.
///
/// [`PedelecSession::read_asset_file`](crate::PedelecSession::read_asset_file)
/// asks for the ticket and calls this.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::assets::get;
/// use pedelec_sdk::grpc::GrpcTransport;
/// use pedelec_sdk::pb::CreateAssetDownloadRequest;
/// use pedelec_sdk::transport::{Call, Reply, Transport, unexpected};
///
/// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
/// let request = CreateAssetDownloadRequest {
///     session_id: "sess-1".into(),
///     caller_origin: "app:my-tool".into(),
///     path: "/notes.txt".into(),
/// };
/// let ticket = match transport.call(Call::CreateAssetDownload(request)).await? {
///     Reply::CreateAssetDownload(ticket) => ticket,
///     other => return Err(unexpected(&other)),
/// };
/// let file = get(&ticket).await?;
/// println!("{}: {} bytes of {}", file.name, file.bytes.len(), file.mime_type);
/// # Ok(())
/// # }
/// ```
pub async fn get(ticket: &pb::AssetTicket) -> Result<AssetFile, PedelecError> {
    let code = ErrorCode::AssetDownloadFailed;
    let asset = ticket.asset.clone().unwrap_or_default();
    let file =
        |bytes| AssetFile { name: asset.name, mime_type: asset.mime_type, modified_at: asset.modified_at_ms, bytes };
    #[cfg(unix)]
    if let Some(read) = handoff::read(ticket).await {
        return read.map(file);
    }
    let mut bytes = download_buffer(asset.size.min(limits::MAX_ASSET_BYTES) as usize);
    let response = request_download(ticket, code).await?;
    let mut body = response.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| failed(code, e))?;
        if (bytes.len() + chunk.len()) as u64 > limits::MAX_ASSET_BYTES {
            return Err(PedelecError::new(ErrorCode::AssetTooLarge, "the asset exceeds the 100 MiB read limit"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(file(bytes))
}

/// Streams a download ticket's file into `dest` and returns its size. The
/// bytes go to a temporary file beside `dest` (same directory, so the final
/// rename is atomic) written by a thread of its own, and replace `dest` only
/// once every byte arrived: a failed or dropped download leaves `dest` as it
/// was and no partial file. Not fsynced — like `cp`; call `sync_all` on the
/// result if it must survive a power cut.
///
/// For a large asset this is the path to take: the bytes pass through the
/// page cache as `cp`'s do, instead of filling fresh memory.
///
/// # Examples
///
/// ```no_run
/// # async fn example(ticket: pedelec_sdk::pb::AssetTicket) -> Result<(), pedelec_sdk::PedelecError> {
/// let size = pedelec_sdk::assets::get_to_file(&ticket, std::path::Path::new("/tmp/report.json")).await?;
/// println!("{size} bytes written");
/// # Ok(())
/// # }
/// ```
pub async fn get_to_file(ticket: &pb::AssetTicket, dest: &std::path::Path) -> Result<u64, PedelecError> {
    let code = ErrorCode::AssetDownloadFailed;
    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let partial = tempfile::Builder::new()
        .prefix(".pedelec-download-")
        .tempfile_in(&dir)
        .map_err(|e| failed(code, format!("cannot write beside {}: {e}", dest.display())))?;
    #[cfg(unix)]
    {
        let out = partial.reopen().map_err(|e| failed(code, e))?;
        if let Some(copied) = handoff::copy_to(ticket, out).await {
            return land_download(ticket, partial, dest, copied?);
        }
    }
    let response = request_download(ticket, code).await?;
    // Disk writes on a thread of their own through a short queue: the
    // network side never blocks the runtime on the disk, memory stays bounded.
    let (chunks, mut queue) = tokio::sync::mpsc::channel::<Bytes>(16);
    let file = partial.reopen().map_err(|e| failed(code, e))?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write;
        let mut out = file;
        while let Some(chunk) = queue.blocking_recv() {
            out.write_all(&chunk)?;
        }
        out.flush()
    });
    let mut received = 0u64;
    let mut body = response.into_body().into_data_stream();
    let streamed = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| failed(code, e))?;
            received += chunk.len() as u64;
            if received > limits::MAX_ASSET_BYTES {
                return Err(PedelecError::new(ErrorCode::AssetTooLarge, "the asset exceeds the 100 MiB read limit"));
            }
            if chunks.send(chunk).await.is_err() {
                break;
            }
        }
        Ok(())
    }
    .await;
    drop(chunks);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| failed(code, e))?
        .map_err(|_| failed(code, "the download writer failed"))?;
    streamed?;
    written.map_err(|e| failed(code, format!("writing {}: {e}", dest.display())))?;
    land_download(ticket, partial, dest, received)
}

/// Replaces `dest` with a download's complete temporary file, once exactly
/// the size the ticket announced arrived, and returns that size.
fn land_download(
    ticket: &pb::AssetTicket,
    partial: tempfile::NamedTempFile,
    dest: &Path,
    received: u64,
) -> Result<u64, PedelecError> {
    let code = ErrorCode::AssetDownloadFailed;
    if let Some(expected) = ticket.asset.as_ref().map(|a| a.size)
        && expected != received
    {
        return Err(failed(code, format!("{received} of {expected} bytes arrived")));
    }
    partial.persist(dest).map_err(|e| failed(code, format!("replacing {}: {}", dest.display(), e.error)))?;
    Ok(received)
}

/// An empty buffer with room for `len` bytes, backed by transparent huge pages
/// where the kernel offers them (Linux `madvise` mode). Filling 100 MiB of
/// fresh 4 KiB pages costs ~25 600 page faults — a third of a download's CPU
/// time, on the one thread that receives it.
fn download_buffer(len: usize) -> Vec<u8> {
    let buffer = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buffer.as_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let whole = (start + len).saturating_sub(first) / HUGE * HUGE;
        if len >= 2 * HUGE && whole > 0 {
            // SAFETY: advice only, on whole pages inside this allocation; the
            // contents (none yet) and the allocation's ownership are untouched.
            unsafe { libc::madvise(first as *mut libc::c_void, whole, libc::MADV_HUGEPAGE) };
        }
    }
    buffer
}
