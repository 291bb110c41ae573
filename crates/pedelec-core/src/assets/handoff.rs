//! The asset hand-off socket (Unix): the same tickets as the loopback
//! transfer server, redeemed by handing over an open file instead of
//! streaming bytes (the exchange is `AssetHandoffRequest` in `core.proto`;
//! its rules are `pedelec_protocol::handoff`, its frames and descriptor passing
//! `pedelec_ipc::handoff`).
//!
//! An upload is copied by the kernel from the client's file into the
//! temporary file (`copy_file_range`), its writeback started piece by
//! piece as the copy goes, then fsynced and renamed into place exactly as a
//! streamed one. A download hands the client Core's file, open read-only.
//!
//! Each exchange runs on a blocking thread: it is a handful of blocking
//! system calls and one copy, with nothing to wait on between them but the
//! client's one request (bounded by `handoff::REQUEST_TIMEOUT`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use hyper::StatusCode;
use pedelec_ipc::handoff as exchange;
use pedelec_protocol::pb::asset_handoff_response::Result as Answer;
use pedelec_protocol::{ErrorCode, handoff, pb};
use tokio::sync::Semaphore;

use super::{AssetPath, AssetServer, Failure, SlotGuard, Staged, Ticket, TicketKind, open_download};
use crate::platform::endpoint::Listener;

/// Exchanges served at once; more connections wait in the backlog. Each
/// holds a blocking thread for its copy, or for at most the request timeout.
const MAX_CONCURRENT: usize = 16;

impl AssetServer {
    /// Serves the hand-off socket on `listener` (bound at `path`, which
    /// tickets name from now on) until the task is dropped.
    pub async fn serve_handoff(self: Arc<Self>, mut listener: Listener, path: &Path) {
        let _ = self.local_socket.set(path.to_string_lossy().into_owned());
        let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            match listener.accept().await {
                Ok(stream) => {
                    let server = self.clone();
                    tokio::task::spawn_blocking(move || {
                        server.exchange(stream);
                        drop(slot);
                    });
                }
                Err(error) => {
                    // Out of descriptors, most often: a short pause lets some close.
                    tracing::warn!(%error, "the asset hand-off socket could not accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// One connection's exchange: its request, then one answer.
    fn exchange(&self, stream: tokio::net::UnixStream) {
        let Ok(socket) = stream.into_std() else { return };
        if socket.set_nonblocking(false).is_err()
            || socket.set_read_timeout(Some(handoff::REQUEST_TIMEOUT)).is_err()
            || socket.set_write_timeout(Some(handoff::REQUEST_TIMEOUT)).is_err()
        {
            return;
        }
        let (answer, file) = match exchange::receive::<pb::AssetHandoffRequest>(&socket, handoff::MAX_REQUEST, 1) {
            Ok((request, files)) => self.answer(&request, files),
            Err(e) => (refused(ErrorCode::InvalidArgument, e.to_string()), None),
        };
        let response = pb::AssetHandoffResponse { result: Some(answer) };
        if let Err(error) = exchange::send(&socket, &response, file.as_ref().map(|f| f.as_fd())) {
            tracing::debug!(%error, "an asset hand-off client went away before its answer");
        }
    }

    fn answer(&self, request: &pb::AssetHandoffRequest, files: Vec<OwnedFd>) -> (Answer, Option<std::fs::File>) {
        let Some(id) = handoff::ticket_id(&request.url) else {
            return (refused(ErrorCode::InvalidArgument, "the url names no transfer ticket"), None);
        };
        let ticket = match self.redeem(id, &request.token) {
            Ok(ticket) => ticket,
            Err((_, code, message)) => return (refused(code, message), None),
        };
        match ticket.kind.clone() {
            TicketKind::Upload { target, size } => {
                let mut files = files.into_iter();
                let (Some(file), None) = (files.next(), files.next()) else {
                    return (refused(ErrorCode::InvalidArgument, "an upload hands over exactly one file"), None);
                };
                let ticket = match self.claim_slot(id, ticket) {
                    Ok(ticket) => ticket,
                    Err((_, code, message)) => return (refused(code, message), None),
                };
                let _slot = SlotGuard { server: self, session_id: &ticket.session_id, token: &ticket.token };
                match land_file(&ticket, &target, size, std::fs::File::from(file)) {
                    Ok(()) => (Answer::Path(target.to_string()), None),
                    Err((_, code, message)) => (refused(code, message), None),
                }
            }
            TicketKind::Download { path } => {
                if !files.is_empty() {
                    return (refused(ErrorCode::InvalidArgument, "a download hands over no file"), None);
                }
                match open_download(&ticket, &path) {
                    Ok((file, meta)) => (Answer::Size(meta.len()), Some(file)),
                    Err((_, code, message)) => (refused(code, message), None),
                }
            }
        }
    }
}

fn refused(code: ErrorCode, message: impl Into<String>) -> Answer {
    Answer::Error(pb::Error::new(code, message))
}

/// Copies the first `size` bytes of the client's file into a temporary file,
/// fsyncs it and lands it at `target`: whole or not at all, as a streamed
/// upload (`receive`).
fn land_file(ticket: &Ticket, target: &AssetPath, size: u64, src: std::fs::File) -> Result<(), Failure> {
    let failed = |m: String| (StatusCode::BAD_REQUEST, ErrorCode::AssetUploadFailed, m);
    let meta = src.metadata().map_err(|e| failed(format!("the file handed over cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(failed("the file handed over is not a regular file".into()));
    }
    if meta.len() != size {
        return Err(failed(format!("the file handed over is {} bytes, the ticket declared {size}", meta.len())));
    }
    let (staged, out) = Staged::create(ticket, target, size)?;
    let mut writeback = crate::writeback::Writeback::new();
    let copied = exchange::copy_range(&src, &out, size, |file, n| writeback.wrote(file, n))
        .map_err(|e| failed(format!("copying the file handed over failed: {e}")))?;
    if copied != size {
        return Err(failed(format!("{copied} of the declared {size} bytes could be read")));
    }
    out.sync_all().map_err(|e| failed(e.to_string()))?;
    staged.land(target)
}
