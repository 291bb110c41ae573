//! The browser's pipes as async I/O.
//!
//! `tokio::io::stdin/stdout` hand every read and write to the blocking
//! thread pool — a thread hop per frame. On Unix, browsers connect the host
//! with pipes, so those are registered with the reactor directly; anything
//! else (a file, a terminal) falls back to tokio's blocking wrappers.
//!
//! On Windows the browser's anonymous pipes cannot join an I/O completion
//! port, so tokio's wrappers are what there is. They are binary: Rust's
//! standard streams never translate line endings (no C runtime text mode),
//! so a length prefix holding the bytes 0x0A or 0x0D arrives as sent.

use tokio::io::{AsyncRead, AsyncWrite};

pub type Input = Box<dyn AsyncRead + Unpin + Send>;
pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

#[cfg(unix)]
fn duplicate(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::fs::File> {
    fd.try_clone_to_owned().ok().map(std::fs::File::from)
}

/// stdin: a reactor-registered pipe when it is one.
#[cfg(unix)]
pub fn input() -> Input {
    use std::os::fd::AsFd;
    match duplicate(std::io::stdin().as_fd()).map(tokio::net::unix::pipe::Receiver::from_file) {
        Some(Ok(pipe)) => Box::new(pipe),
        _ => Box::new(tokio::io::stdin()),
    }
}

/// stdout: a reactor-registered pipe when it is one.
#[cfg(unix)]
pub fn output() -> Output {
    use std::os::fd::AsFd;
    match duplicate(std::io::stdout().as_fd()).map(tokio::net::unix::pipe::Sender::from_file) {
        Some(Ok(pipe)) => Box::new(pipe),
        _ => Box::new(tokio::io::stdout()),
    }
}

/// stdin, read on the blocking pool.
#[cfg(windows)]
pub fn input() -> Input {
    Box::new(tokio::io::stdin())
}

/// stdout, written on the blocking pool.
#[cfg(windows)]
pub fn output() -> Output {
    Box::new(tokio::io::stdout())
}
