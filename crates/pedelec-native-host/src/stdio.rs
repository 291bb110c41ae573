//! The browser's pipes as non-blocking async I/O.
//!
//! `tokio::io::stdin/stdout` hand every read and write to the blocking
//! thread pool — a thread hop per frame. Browsers connect the host with
//! pipes, so those are registered with the reactor directly; anything else
//! (a file, a terminal) falls back to tokio's blocking wrappers.

use std::os::fd::AsFd;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

pub type Input = Box<dyn AsyncRead + Unpin + Send>;
pub type Output = Box<dyn AsyncWrite + Unpin + Send>;

fn duplicate(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::fs::File> {
    fd.try_clone_to_owned().ok().map(std::fs::File::from)
}

/// stdin: a reactor-registered pipe when it is one.
pub fn input() -> Input {
    match duplicate(std::io::stdin().as_fd()).map(pipe::Receiver::from_file) {
        Some(Ok(pipe)) => Box::new(pipe),
        _ => Box::new(tokio::io::stdin()),
    }
}

/// stdout: a reactor-registered pipe when it is one.
pub fn output() -> Output {
    match duplicate(std::io::stdout().as_fd()).map(pipe::Sender::from_file) {
        Some(Ok(pipe)) => Box::new(pipe),
        _ => Box::new(tokio::io::stdout()),
    }
}
