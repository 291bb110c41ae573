//! Who serves a named pipe (Windows).
//!
//! A pipe name is first come, first served: another local user who creates
//! `\\.\pipe\pedelec-<user>-core` before Core does would receive every
//! prompt, tool result and tool token the client sends. So before sending
//! anything a client asks the system which process serves the pipe it
//! opened, and goes on only if that process runs as the client's own user
//! (the same SID in both processes' tokens). A server it cannot inspect
//! (another user's process that refuses `PROCESS_QUERY_LIMITED_INFORMATION`)
//! is refused too.

use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle, RawHandle};

use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::Security::{EqualSid, GetTokenInformation, PSID, TOKEN_QUERY, TOKEN_USER, TokenUser};
use windows_sys::Win32::System::Pipes::GetNamedPipeServerProcessId;
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, OpenProcess, OpenProcessToken, PROCESS_QUERY_LIMITED_INFORMATION,
};

/// Why a pipe's server is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum PipeServerRefused {
    #[error("cannot tell which process serves the pipe: {0}")]
    UnknownServer(std::io::Error),
    #[error("cannot inspect the pipe's server process {pid} (another user's?): {source}")]
    Uninspectable { pid: u32, source: std::io::Error },
    #[error("the pipe is served by process {pid}, which runs as another user: refusing to send it anything")]
    OtherUser { pid: u32 },
}

impl From<PipeServerRefused> for std::io::Error {
    fn from(refused: PipeServerRefused) -> Self {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, refused)
    }
}

/// `Ok` only if the process serving `pipe` (an open client end) runs as
/// the current process's user.
pub fn check_server_is_current_user(pipe: RawHandle) -> Result<(), PipeServerRefused> {
    let mut pid = 0u32;
    // SAFETY: `pipe` is an open pipe handle the caller holds; `pid` is ours to write.
    if unsafe { GetNamedPipeServerProcessId(pipe as HANDLE, &mut pid) } == 0 {
        return Err(PipeServerRefused::UnknownServer(std::io::Error::last_os_error()));
    }
    let inspect = |source| PipeServerRefused::Uninspectable { pid, source };
    // SAFETY: plain call; the handle it returns (if any) is owned below.
    let server = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    if server.is_null() {
        return Err(inspect(std::io::Error::last_os_error()));
    }
    // SAFETY: a handle OpenProcess just returned, closed once when dropped.
    let server = unsafe { OwnedHandle::from_raw_handle(server as RawHandle) };
    let theirs = TokenUserBuf::of(server.as_raw_handle() as HANDLE).map_err(inspect)?;
    // SAFETY: the current process's pseudo-handle; it needs no closing.
    let ours = TokenUserBuf::of(unsafe { GetCurrentProcess() })
        .map_err(|e| PipeServerRefused::UnknownServer(std::io::Error::other(format!("our own user: {e}"))))?;
    // SAFETY: both SIDs point into buffers that live until the end of this function.
    if unsafe { EqualSid(theirs.sid(), ours.sid()) } == 0 {
        return Err(PipeServerRefused::OtherUser { pid });
    }
    Ok(())
}

/// A process token's `TOKEN_USER`, in a buffer aligned for it.
struct TokenUserBuf(Vec<u64>);

impl TokenUserBuf {
    fn of(process: HANDLE) -> std::io::Result<Self> {
        let mut token: HANDLE = std::ptr::null_mut();
        // SAFETY: `process` is a process handle with query rights; `token` is ours to write.
        if unsafe { OpenProcessToken(process, TOKEN_QUERY, &mut token) } == 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a handle OpenProcessToken just returned, closed once when dropped.
        let token = unsafe { OwnedHandle::from_raw_handle(token as RawHandle) };
        let mut needed = 0u32;
        // SAFETY: asks for the size only (no buffer); `needed` is ours to write.
        unsafe {
            GetTokenInformation(token.as_raw_handle() as HANDLE, TokenUser, std::ptr::null_mut(), 0, &mut needed)
        };
        if needed == 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buffer = vec![0u64; (needed as usize).div_ceil(8)];
        // SAFETY: `buffer` holds at least `needed` bytes, aligned to 8.
        let filled = unsafe {
            GetTokenInformation(
                token.as_raw_handle() as HANDLE,
                TokenUser,
                buffer.as_mut_ptr().cast(),
                (buffer.len() * 8) as u32,
                &mut needed,
            )
        };
        if filled == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TokenUserBuf(buffer))
    }

    fn sid(&self) -> PSID {
        // SAFETY: the buffer was filled with a TOKEN_USER (whose SID points
        // into the same buffer) and is aligned for it.
        unsafe { (*self.0.as_ptr().cast::<TOKEN_USER>()).User.Sid }
    }
}
