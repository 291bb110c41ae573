//! Session assets from the SDK: tickets come through the transport, bytes go
//! over Core's 127.0.0.1 transfer server (HTTP/1.1), streamed both ways.

use std::path::Path;

use bytes::BytesMut;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use pedelec_protocol::{AssetPath, ErrorCode, limits, pb};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::PedelecError;

/// Something to upload: a name, a MIME type, its exact size and its bytes.
pub struct UploadSource {
    pub name: String,
    pub mime_type: String,
    pub size: u64,
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
}

impl UploadSource {
    /// A file on disk (name from its file name).
    pub async fn from_path(path: impl AsRef<Path>) -> Result<Self, PedelecError> {
        let path = path.as_ref();
        let io =
            |e: std::io::Error| PedelecError::new(ErrorCode::AssetUploadFailed, format!("{}: {e}", path.display()));
        let file = tokio::fs::File::open(path).await.map_err(io)?;
        let size = file.metadata().await.map_err(io)?.len();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "upload".into());
        Ok(UploadSource { name, mime_type: "application/octet-stream".into(), size, reader: Box::new(file) })
    }

    /// Bytes in memory.
    pub fn from_bytes(name: impl Into<String>, mime_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        UploadSource {
            name: name.into(),
            mime_type: mime_type.into(),
            size: bytes.len() as u64,
            reader: Box::new(std::io::Cursor::new(bytes)),
        }
    }

    /// Any async reader delivering exactly `size` bytes.
    pub fn from_reader(
        name: impl Into<String>,
        mime_type: impl Into<String>,
        size: u64,
        reader: impl AsyncRead + Send + Unpin + 'static,
    ) -> Self {
        UploadSource { name: name.into(), mime_type: mime_type.into(), size, reader: Box::new(reader) }
    }
}

/// A file read back from the assets (`readAsset(path, "file")`).
#[derive(Debug, Clone, PartialEq)]
pub struct AssetFile {
    pub name: String,
    pub mime_type: String,
    /// Modification time, ms since epoch.
    pub modified_at: i64,
    pub bytes: Vec<u8>,
}

/// Validates a public path before any request.
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
pub async fn put(ticket: &pb::AssetTicket, source: UploadSource) -> Result<(), PedelecError> {
    let code = ErrorCode::AssetUploadFailed;
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
        .header(hyper::header::HOST, "127.0.0.1")
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

/// GETs a download ticket's file, bounded by the 100 MiB read limit.
pub async fn get(ticket: &pb::AssetTicket) -> Result<AssetFile, PedelecError> {
    let code = ErrorCode::AssetDownloadFailed;
    let (mut sender, uri) = connect(ticket, code).await?;
    let request = hyper::Request::get(uri.path())
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {}", ticket.token))
        .body(BodyExt::boxed_unsync(http_body_util::Empty::new().map_err(|never| match never {})))
        .map_err(|e| failed(code, e))?;
    let response = sender.send_request(request).await.map_err(|e| failed(code, e))?;
    if !response.status().is_success() {
        return Err(error_from(response, code).await);
    }
    let asset = ticket.asset.clone().unwrap_or_default();
    let mut bytes = download_buffer(asset.size.min(limits::MAX_ASSET_BYTES) as usize);
    let mut body = response.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| failed(code, e))?;
        if (bytes.len() + chunk.len()) as u64 > limits::MAX_ASSET_BYTES {
            return Err(PedelecError::new(ErrorCode::AssetTooLarge, "the asset exceeds the 100 MiB read limit"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(AssetFile { name: asset.name, mime_type: asset.mime_type, modified_at: asset.modified_at_ms, bytes })
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
