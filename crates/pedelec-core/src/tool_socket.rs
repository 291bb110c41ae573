//! Core's tool socket: the `AgentTools` calls as length-prefixed protobuf
//! frames on a second local endpoint (the layout and its rules are in
//! `pedelec_protocol::tool_socket`). The calls run the same code as the gRPC
//! service ([`AgentToolsService`]); only the transport differs, so a tool
//! client needs no HTTP/2 and no async runtime to start.

use std::sync::Arc;

use pedelec_protocol::ErrorCode;
use pedelec_protocol::pb::{self, tool_socket_request::Call, tool_socket_response::Result as Answer};
use pedelec_protocol::tool_socket::{FrameError, HEADER_LEN, decode_body, encode_frame, frame_len};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Semaphore;

use crate::platform::endpoint::Listener;
use crate::service::AgentToolsService;

/// Requests one connection may have in flight; past it Core stops reading
/// that connection until one completes, so a client that floods it is held
/// back instead of growing Core's memory. An answer is written before the
/// connection is read on, so a client that does not read its answers is
/// held back too.
pub const MAX_IN_FLIGHT: usize = 64;

/// Accepts connections until the task is dropped, at most `max_connections`
/// at once (the rest wait in the backlog).
pub async fn serve(mut listener: Listener, tools: AgentToolsService, max_connections: usize) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok(stream) => {
                let tools = tools.clone();
                tokio::spawn(async move {
                    connection(stream, tools).await;
                    drop(slot);
                });
            }
            Err(error) => {
                // Out of descriptors, most often: a short pause lets some close.
                tracing::warn!(%error, "the tool socket could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection until the client closes it or sends a frame that
/// cannot be read; its calls still in flight are then abandoned (dropped,
/// as a dropped gRPC request stops its call).
///
/// One task does it all: reading, the calls in flight, and writing their
/// answers. A shell tool client makes one call per connection, and each
/// task hop on its path (a task per call, another writing) was a wake-up of
/// a parked worker thread, tens of microseconds each on a small VM.
pub async fn connection<S: AsyncRead + AsyncWrite + Send + 'static>(stream: S, tools: AgentToolsService) {
    let (reader, mut writer) = tokio::io::split(stream);
    // A read is not cancel-safe (a frame half read would be lost), so the
    // one in progress lives across the loop and is only ever polled.
    let mut reading = std::pin::pin!(read_next(BufReader::new(reader)));
    let mut in_flight = futures::stream::FuturesUnordered::new();
    loop {
        tokio::select! {
            (reader, request) = &mut reading, if in_flight.len() < MAX_IN_FLIGHT => match request {
                Ok(Some(request)) => {
                    let tools = &tools;
                    in_flight.push(async move {
                        let result = answer(tools, request.call).await;
                        encode_frame(&pb::ToolSocketResponse { id: request.id, result: Some(result) })
                    });
                    reading.set(read_next(reader));
                }
                Ok(None) => return,
                Err(error) => {
                    // The stream has no next frame to find: say why, once, then
                    // end the connection (its calls in flight go with it).
                    tracing::debug!(%error, "ending a tool-socket connection");
                    let refusal = Answer::Error(pb::Error::new(ErrorCode::InvalidArgument, error.to_string()));
                    let frame = encode_frame(&pb::ToolSocketResponse { id: 0, result: Some(refusal) });
                    let _ = tokio::time::timeout(LAST_WORD, async {
                        if writer.write_all(&frame).await.is_ok() {
                            let _ = writer.shutdown().await;
                        }
                    })
                    .await;
                    return;
                }
            },
            Some(frame) = futures::StreamExt::next(&mut in_flight), if !in_flight.is_empty() => {
                if writer.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// How long the refusal of a bad frame may take to leave before the
/// connection is dropped anyway (a client that does not read).
const LAST_WORD: std::time::Duration = std::time::Duration::from_secs(2);

/// What a body buffer starts at: it grows as bytes arrive, so a length
/// prefix alone (up to `MAX_FRAME`) reserves no memory.
const FIRST_READ: usize = 64 * 1024;

/// [`read_request`] on a reader it owns and hands back.
async fn read_next<R: AsyncRead + Unpin>(mut reader: R) -> (R, Result<Option<pb::ToolSocketRequest>, FrameError>) {
    let request = read_request(&mut reader).await;
    (reader, request)
}

/// The next request; `None` at a clean end of the stream.
async fn read_request<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<pb::ToolSocketRequest>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    match reader.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(FrameError::Malformed(e.to_string())),
    }
    let len = frame_len(header)?;
    let mut body = Vec::with_capacity(len.min(FIRST_READ));
    let read = reader.take(len as u64).read_to_end(&mut body).await;
    read.map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() < len {
        return Err(FrameError::Malformed(format!(
            "the connection ended {} bytes into a {len}-byte frame",
            body.len()
        )));
    }
    decode_body(&body).map(Some)
}

async fn answer(tools: &AgentToolsService, call: Option<Call>) -> Answer {
    let refused = |e: crate::error::CoreError| Answer::Error(e.to_pb());
    match call {
        Some(Call::ListTools(r)) => tools.list(&r.tool_token).map_or_else(refused, Answer::ListTools),
        Some(Call::CallTool(r)) => tools.call(r).await.map_or_else(refused, Answer::CallTool),
        Some(Call::RequestPermission(r)) => tools.permission(r).await.map_or_else(refused, Answer::RequestPermission),
        None => Answer::Error(pb::Error::new(ErrorCode::InvalidArgument, "the request names no call")),
    }
}
