//! Core's listening endpoint: a Unix socket, or on Windows a named pipe.
//!
//! Both refuse to start a second Core on a live endpoint; a stale socket
//! file (a Core that died) is taken over, a pipe has no such file.

use std::io;
use std::path::Path;

use pedelec_protocol::ErrorCode;

use crate::error::{CoreError, CoreResult};

#[cfg(unix)]
pub use unix::{ConnectInfo, Listener, Stream, connect_info};
#[cfg(windows)]
pub use windows::{ConnectInfo, Listener, Stream, connect_info};

fn already_served(endpoint: &Path) -> CoreError {
    CoreError::new(
        ErrorCode::CoreRuntimeUnavailable,
        format!("another Core is already serving on {}", endpoint.display()),
    )
}

#[cfg(unix)]
mod unix {
    use super::*;
    use std::path::PathBuf;

    pub type Stream = tokio::net::UnixStream;

    pub struct Listener {
        listener: tokio::net::UnixListener,
        path: PathBuf,
    }

    impl Listener {
        /// Binds the socket (0600, in a 0700 dir): refuses when a live
        /// Core answers on it, takes over a stale one.
        pub async fn bind(socket: &Path) -> CoreResult<Listener> {
            if let Some(parent) = socket.parent() {
                crate::platform::files::ensure_private_dir(parent)?;
            }
            if socket.exists() {
                if tokio::net::UnixStream::connect(socket).await.is_ok() {
                    return Err(already_served(socket));
                }
                tracing::info!(socket = %socket.display(), "taking over a stale socket");
                std::fs::remove_file(socket).map_err(|e| CoreError::io("removing a stale socket", e))?;
            }
            let listener = tokio::net::UnixListener::bind(socket)
                .map_err(|e| CoreError::io(format!("binding {}", socket.display()), e))?;
            crate::platform::files::restrict_file(socket).map_err(|e| CoreError::io("restricting the socket", e))?;
            Ok(Listener { listener, path: socket.to_owned() })
        }

        pub async fn accept(&mut self) -> io::Result<Stream> {
            self.listener.accept().await.map(|(stream, _)| stream)
        }

        /// What removes the socket file at shutdown, once the listener is gone.
        pub fn remover(&self) -> impl FnOnce() + use<> {
            let path = self.path.clone();
            move || {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// What tonic learns of a peer: its credentials where the socket has them.
    pub type ConnectInfo = <Stream as tonic::transport::server::Connected>::ConnectInfo;

    pub fn connect_info(stream: &Stream) -> ConnectInfo {
        tonic::transport::server::Connected::connect_info(stream)
    }
}

#[cfg(windows)]
mod windows {
    use super::*;
    use std::ffi::c_void;
    use std::path::PathBuf;
    use std::ptr::null_mut;

    use tokio::net::windows::named_pipe::{NamedPipeServer, PipeMode, ServerOptions};
    use windows_sys::Win32::Foundation::{CloseHandle, ERROR_ACCESS_DENIED, HANDLE, LocalFree};
    use windows_sys::Win32::Security::Authorization::{
        ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
    };
    use windows_sys::Win32::Security::{GetTokenInformation, SECURITY_ATTRIBUTES, TOKEN_QUERY, TOKEN_USER, TokenUser};
    use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

    pub type Stream = NamedPipeServer;

    /// A security descriptor whose DACL admits only the user Core runs as
    /// (`D:P(A;;GA;;;<user SID>)`): the default DACL of a pipe lets every
    /// user of the machine read, which would let them connect.
    struct OwnerOnly {
        descriptor: *mut c_void,
    }

    // SAFETY: the descriptor is immutable after creation and only read by
    // CreateNamedPipeW; it is freed once, on drop.
    unsafe impl Send for OwnerOnly {}
    unsafe impl Sync for OwnerOnly {}

    impl OwnerOnly {
        fn new() -> io::Result<Self> {
            let sid = current_user_sid()?;
            let sddl: Vec<u16> = format!("D:P(A;;GA;;;{sid})").encode_utf16().chain(Some(0)).collect();
            let mut descriptor = null_mut();
            // SAFETY: sddl is NUL-terminated; the out pointer is freed with LocalFree on drop.
            let ok = unsafe {
                ConvertStringSecurityDescriptorToSecurityDescriptorW(
                    sddl.as_ptr(),
                    SDDL_REVISION_1,
                    &mut descriptor,
                    null_mut(),
                )
            };
            if ok == 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(OwnerOnly { descriptor })
        }

        fn attributes(&self) -> SECURITY_ATTRIBUTES {
            SECURITY_ATTRIBUTES {
                nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
                lpSecurityDescriptor: self.descriptor,
                bInheritHandle: 0,
            }
        }
    }

    impl Drop for OwnerOnly {
        fn drop(&mut self) {
            // SAFETY: allocated by ConvertStringSecurityDescriptorToSecurityDescriptorW.
            unsafe { LocalFree(self.descriptor) };
        }
    }

    /// The string SID (`S-1-5-21-…`) of the user this process runs as.
    fn current_user_sid() -> io::Result<String> {
        let mut token: HANDLE = null_mut();
        // SAFETY: the pseudo handle of the current process needs no closing; token is closed below.
        if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buffer = vec![0u64; 64];
        let mut needed = 0u32;
        // SAFETY: the buffer is 512 bytes, 8-aligned, enough for TOKEN_USER and its SID.
        let ok = unsafe {
            GetTokenInformation(token, TokenUser, buffer.as_mut_ptr().cast(), (buffer.len() * 8) as u32, &mut needed)
        };
        let error = io::Error::last_os_error();
        // SAFETY: token came from OpenProcessToken.
        unsafe { CloseHandle(token) };
        if ok == 0 {
            return Err(error);
        }
        // SAFETY: GetTokenInformation filled a TOKEN_USER at the buffer's start.
        let sid = unsafe { (*buffer.as_ptr().cast::<TOKEN_USER>()).User.Sid };
        let mut text = null_mut();
        // SAFETY: sid points into buffer, alive here; text is freed with LocalFree.
        if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: text is a NUL-terminated UTF-16 string from ConvertSidToStringSidW.
        let len = (0..).take_while(|&i| unsafe { *text.add(i) } != 0).count();
        let sid = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(text, len) });
        unsafe { LocalFree(text.cast()) };
        Ok(sid)
    }

    pub struct Listener {
        name: PathBuf,
        security: OwnerOnly,
        /// The instance the next client connects to; one is always offered.
        next: NamedPipeServer,
    }

    impl Listener {
        fn create(name: &Path, security: &OwnerOnly, first: bool) -> io::Result<NamedPipeServer> {
            let mut attributes = security.attributes();
            // SAFETY: attributes and the descriptor it points to outlive the call.
            unsafe {
                ServerOptions::new()
                    .first_pipe_instance(first)
                    .reject_remote_clients(true)
                    .pipe_mode(PipeMode::Byte)
                    .create_with_security_attributes_raw(name, (&mut attributes as *mut SECURITY_ATTRIBUTES).cast())
            }
        }

        /// Creates the pipe's first instance; a pipe of that name held by
        /// another process (a live Core) refuses it.
        pub async fn bind(name: &Path) -> CoreResult<Listener> {
            let security = OwnerOnly::new().map_err(|e| CoreError::io("building the pipe's access list", e))?;
            let next = match Self::create(name, &security, true) {
                Ok(next) => next,
                Err(e) if e.raw_os_error() == Some(ERROR_ACCESS_DENIED as i32) => return Err(already_served(name)),
                Err(e) => return Err(CoreError::io(format!("creating the pipe {}", name.display()), e)),
            };
            Ok(Listener { name: name.to_owned(), security, next })
        }

        /// Waits for a client on the offered instance, then offers the next.
        pub async fn accept(&mut self) -> io::Result<Stream> {
            if let Err(e) = self.next.connect().await {
                // That instance is spent; offer a fresh one.
                self.next = Self::create(&self.name, &self.security, false)?;
                return Err(e);
            }
            let following = Self::create(&self.name, &self.security, false)?;
            Ok(std::mem::replace(&mut self.next, following))
        }

        /// A pipe leaves nothing behind to remove.
        pub fn remover(&self) -> impl FnOnce() + use<> {
            || {}
        }
    }

    /// A pipe tells tonic nothing of its peer (the ACL already admitted it).
    pub type ConnectInfo = ();

    pub fn connect_info(_stream: &Stream) -> ConnectInfo {}
}
