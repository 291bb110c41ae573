//! pedelec-client: how a program talks to Core, without any session logic.
//!
//! The request vocabulary is the native envelope's `Call`/`Reply`
//! ([`transport`]), so the SDK's transports (gRPC, native messaging, the
//! browser port) and the native host's relay all speak the same messages.
//! `grpc::GrpcTransport` (feature `grpc`) is the channel over Core's Unix
//! socket with the message limits both ends use. The SDK builds sessions on
//! top of this crate; the native host only relays through it.
//!
//! # Examples
//!
//! ```
//! use pedelec_client::PedelecError;
//! use pedelec_client::transport::{Reply, unexpected};
//! use pedelec_protocol::{ErrorCode, pb};
//!
//! // Core refused a call: its error arrives as `pb::Error`...
//! let refused = PedelecError::from(pb::Error::new(ErrorCode::SessionBusy, "a turn is running"));
//! assert!(refused.is(ErrorCode::SessionBusy));
//! // ...and a reply that does not fit its call is the transport's error.
//! let wrong = unexpected(&Reply::Ping(pb::PingResponse::default()));
//! assert_eq!(wrong.error_code(), Some(ErrorCode::TransportError));
//! ```

pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod transport;

/// The client error, at the crate root (the same type as [`error::PedelecError`]).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::ErrorCode;
///
/// let error: pedelec_client::PedelecError = pedelec_client::error::PedelecError::new(ErrorCode::Internal, "oops");
/// assert_eq!(error.to_string(), "INTERNAL: oops");
/// ```
pub use error::PedelecError;
