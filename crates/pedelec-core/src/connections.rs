//! Who may hold a connection to Core's socket, and for how long.
//!
//! Every connection is a descriptor. Without bounds, a thousand silent
//! connections (opened, never speaking) exhaust them and lock every real
//! client out. So: at most `max` connections at once (one more is closed at
//! once, leaving descriptors for agents, the database and files); a
//! connection must start speaking (the HTTP/2 preface) within `handshake`,
//! or it is closed — its slot is free again for a client that does speak.
//! Connections that spoke and then went half-open are ended by HTTP/2
//! keepalive pings (see `daemon`). The handshake wait runs per connection,
//! so one slow client never holds back the accepting of others.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::platform::endpoint::{self, Listener, Stream};

/// The bounds of [`incoming`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max: usize,
    pub handshake: Duration,
}

/// Connections at most, unless told otherwise: far more clients than any
/// machine runs, far fewer than the raised descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a new connection may stay silent.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Self {
        Limits { max: DEFAULT_MAX_CONNECTIONS, handshake: DEFAULT_HANDSHAKE_TIMEOUT }
    }
}

/// A connection holding one of the slots until it is dropped; the bytes
/// read to see that it speaks are handed on first.
pub struct Connection {
    stream: Stream,
    first: Vec<u8>,
    _slot: OwnedSemaphorePermit,
}

/// The accepted connections that spoke in time, within the bounds.
pub fn incoming(
    mut listener: Listener,
    limits: Limits,
) -> impl futures::Stream<Item = io::Result<Connection>> + Send + 'static {
    let slots = Arc::new(Semaphore::new(limits.max));
    let (ready, accepted) = tokio::sync::mpsc::channel::<io::Result<Connection>>(64);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok(stream) => stream,
                Err(error) => {
                    // Out of descriptors and the like: say so, keep serving.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(max = limits.max, "refused a connection: Core is at its connection limit");
                drop(stream);
                continue;
            };
            let handed = ready.clone();
            tokio::spawn(async move {
                let mut stream = stream;
                // Its first bytes prove it speaks (readiness alone can be spurious).
                let mut first = vec![0u8; 64];
                match tokio::time::timeout(limits.handshake, tokio::io::AsyncReadExt::read(&mut stream, &mut first))
                    .await
                {
                    Ok(Ok(n)) if n > 0 => {
                        first.truncate(n);
                        let _ = handed.send(Ok(Connection { stream, first, _slot: slot })).await;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "a connection failed before it spoke"),
                    Err(_) => tracing::debug!("closed a connection that stayed silent"),
                }
            });
            if ready.is_closed() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(accepted)
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.first.is_empty() {
            let n = self.first.len().min(buf.remaining());
            buf.put_slice(&self.first[..n]);
            self.first.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = endpoint::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        endpoint::connect_info(&self.stream)
    }
}
