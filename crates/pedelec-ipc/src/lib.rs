//! The local I/O that Core and its clients share, kept out of
//! `pedelec-protocol` so the vocabulary stays pure and builds for wasm32:
//!
//! - [`dial`] (feature `grpc`): a connection and a tonic channel to Core's
//!   local endpoint, a Unix socket or a named pipe.
//! - [`pipe_owner`] (Windows): a named pipe is trusted only when a process of
//!   this user serves it.
//! - [`handoff`] (feature `handoff`, Unix): the asset hand-off exchange, a
//!   frame with an open file beside it, and the copy from such a file.

#[cfg(feature = "grpc")]
pub mod dial;
#[cfg(all(unix, feature = "handoff"))]
pub mod handoff;
#[cfg(windows)]
pub mod pipe_owner;

#[cfg(feature = "grpc")]
pub use dial::{connect_local, local_channel};
