//! Transfers through Core's asset hand-off socket (Unix; the ticket's
//! `local_socket`): the client hands Core its open file to upload, or is
//! handed Core's file to download, and the kernel copies from file to file.
//! The exchange's rules are `pedelec_protocol::handoff`; this is the
//! client's side of it.
//!
//! A ticket whose hand-off socket cannot be reached (no such socket here, a
//! Core that offers none) falls back to the ticket's url: the ticket is not
//! used up until Core reads a request for it.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use pedelec_ipc::handoff as exchange;
use pedelec_protocol::pb::asset_handoff_response::Result as Answer;
use pedelec_protocol::{ErrorCode, handoff, limits, pb};

use crate::error::PedelecError;

fn failed(code: ErrorCode, message: impl std::fmt::Display) -> PedelecError {
    PedelecError::new(code, message.to_string())
}

/// Connects to the ticket's hand-off socket; `None` when there is none to reach.
fn connect(ticket: &pb::AssetTicket) -> Option<UnixStream> {
    if ticket.local_socket.is_empty() {
        return None;
    }
    match UnixStream::connect(&ticket.local_socket) {
        Ok(socket) => Some(socket),
        Err(error) => {
            tracing::debug!(%error, socket = %ticket.local_socket, "no asset hand-off socket; transferring over the url");
            None
        }
    }
}

/// Sends the ticket's request (with `file` beside it) and reads Core's answer
/// and the file that came with it.
fn exchange(
    socket: &UnixStream,
    ticket: &pb::AssetTicket,
    file: Option<&File>,
    code: ErrorCode,
) -> Result<(Answer, Option<OwnedFd>), PedelecError> {
    let io = |e: std::io::Error| failed(code, format!("the asset hand-off failed: {e}"));
    socket.set_write_timeout(Some(handoff::REQUEST_TIMEOUT)).map_err(io)?;
    socket.set_read_timeout(Some(handoff::RESPONSE_TIMEOUT)).map_err(io)?;
    let request = pb::AssetHandoffRequest { url: ticket.url.clone(), token: ticket.token.clone() };
    exchange::send(socket, &request, file.map(|f| f.as_fd())).map_err(io)?;
    let (response, files) = exchange::receive::<pb::AssetHandoffResponse>(socket, handoff::MAX_RESPONSE, 1)
        .map_err(|e| failed(code, format!("the asset hand-off failed: {e}")))?;
    let answer = response.result.ok_or_else(|| failed(code, "the asset hand-off answered nothing"))?;
    Ok((answer, files.into_iter().next()))
}

/// Uploads `file` (exactly the ticket's declared size) by handing it to Core;
/// `None` when the ticket's hand-off socket cannot be reached.
pub(super) async fn upload(ticket: &pb::AssetTicket, file: File) -> Option<Result<(), PedelecError>> {
    let code = ErrorCode::AssetUploadFailed;
    let ticket = ticket.clone();
    let run = tokio::task::spawn_blocking(move || {
        let socket = connect(&ticket)?;
        Some(exchange(&socket, &ticket, Some(&file), code).and_then(|(answer, _)| match answer {
            Answer::Path(_) => Ok(()),
            Answer::Error(error) => Err(error.into()),
            Answer::Size(_) => Err(failed(code, "the asset hand-off answered an upload as a download")),
        }))
    });
    run.await.unwrap_or_else(|e| Some(Err(failed(code, e))))
}

/// Is handed the ticket's file by Core and checks it: a regular file of at
/// least the size Core announced, which is within the read limit. `None`
/// when the ticket's hand-off socket cannot be reached.
fn download_blocking(ticket: &pb::AssetTicket) -> Option<Result<(File, u64), PedelecError>> {
    let code = ErrorCode::AssetDownloadFailed;
    let socket = connect(ticket)?;
    Some(exchange(&socket, ticket, None, code).and_then(|(answer, file)| {
        let size = match answer {
            Answer::Size(size) => size,
            Answer::Error(error) => return Err(error.into()),
            Answer::Path(_) => return Err(failed(code, "the asset hand-off answered a download as an upload")),
        };
        if size > limits::MAX_ASSET_BYTES {
            return Err(PedelecError::new(ErrorCode::AssetTooLarge, "the asset exceeds the 100 MiB read limit"));
        }
        let file = File::from(file.ok_or_else(|| failed(code, "the asset hand-off sent no file"))?);
        let meta = file.metadata().map_err(|e| failed(code, e))?;
        if !meta.is_file() || meta.len() < size {
            return Err(failed(code, "the file handed over is not the asset"));
        }
        Ok((file, size))
    }))
}

/// Reads the ticket's file into memory through the hand-off socket, into a
/// buffer of the size Core announced; `None` when it cannot be reached.
pub(super) async fn read(ticket: &pb::AssetTicket) -> Option<Result<Vec<u8>, PedelecError>> {
    let code = ErrorCode::AssetDownloadFailed;
    let ticket = ticket.clone();
    let run = tokio::task::spawn_blocking(move || {
        Some(download_blocking(&ticket)?.and_then(|(file, size)| {
            let mut buffer = super::download_buffer(size as usize);
            read_into(&file, size as usize, &mut buffer)
                .map_err(|e| failed(code, format!("reading the asset failed: {e}")))?;
            Ok(buffer)
        }))
    });
    run.await.unwrap_or_else(|e| Some(Err(failed(code, e))))
}

/// Reads the first `size` bytes of `file` into the empty `buffer`, straight into its
/// spare capacity: zeroing it first would be one more pass over 100 MiB of
/// fresh memory.
fn read_into(file: &File, size: usize, buffer: &mut Vec<u8>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    buffer.reserve(size);
    while buffer.len() < size {
        let filled = buffer.len();
        let spare = &mut buffer.spare_capacity_mut()[..size - filled];
        // SAFETY: `spare` is writable memory of `buffer` of exactly the
        // length passed; pread writes at most that many bytes into it.
        let n = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), filled as libc::off_t) };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n < 0 => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
            // SAFETY: pread initialised these `n` bytes right after the
            // `filled` ones already initialised.
            n => unsafe { buffer.set_len(filled + n as usize) },
        }
    }
    Ok(())
}

/// Copies the ticket's file into `out` through the hand-off socket and
/// returns its size; `None` when it cannot be reached.
pub(super) async fn copy_to(ticket: &pb::AssetTicket, out: File) -> Option<Result<u64, PedelecError>> {
    let code = ErrorCode::AssetDownloadFailed;
    let ticket = ticket.clone();
    let run = tokio::task::spawn_blocking(move || {
        Some(download_blocking(&ticket)?.and_then(|(file, size)| {
            let copied = exchange::copy_range(&file, &out, size, |_, _| {})
                .map_err(|e| failed(code, format!("copying the asset failed: {e}")))?;
            if copied != size {
                return Err(failed(code, format!("{copied} of {size} bytes could be read")));
            }
            Ok(size)
        }))
    });
    run.await.unwrap_or_else(|e| Some(Err(failed(code, e))))
}
