//! pedelec-client: how a program talks to Core, without any session logic.
//!
//! The request vocabulary is the native envelope's `Call`/`Reply`
//! ([`transport`]), so the SDK's transports (gRPC, native messaging, the
//! browser port) and the native host's relay all speak the same messages.
//! `grpc::GrpcTransport` (feature `grpc`) is the channel over Core's Unix
//! socket with the message limits both ends use. The SDK builds sessions on
//! top of this crate; the native host only relays through it.

pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod transport;

pub use error::PedelecError;
