//! Pedelec's one vocabulary crate.
//!
//! It holds the types generated from `proto/pedelec/v1` (module [`pb`]), their
//! proto3 canonical JSON mapping ([`json`]), and every rule that Core and the
//! SDK must agree on: session statuses and their transitions ([`status`]), the
//! per-session event gate ([`gate`]), asset paths ([`asset_path`]), error
//! codes ([`error_code`]), limits ([`limits`]), tool manifest rules
//! ([`tools`]), the preparation handshake ([`prepare`]), id newtypes ([`ids`]), usage growth ([`usage`]), agent activities ([`activity`]), native-messaging
//! framing ([`native`]) and event batches ([`event_batch`]).
//!
//! It does no I/O and needs no async runtime, so it builds for
//! `wasm32-unknown-unknown` (without the default `grpc` feature).

pub mod activity;
pub mod asset_path;
pub mod discovery;
pub mod error_code;
pub mod event_batch;
pub mod gate;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod ids;
pub mod json;
pub mod limits;
pub mod native;
pub mod prepare;
pub mod registration;
pub mod status;
pub mod tools;
pub mod usage;

/// Generated protocol messages (and, with `grpc`, the tonic services).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/pedelec.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/pedelec.v1.serde.rs"));
}

pub use asset_path::{AssetPath, AssetPathError};
pub use error_code::ErrorCode;
pub use gate::{EventGate, Verdict};
pub use ids::{OperationId, SessionId, ToolRequestId, TurnId};
pub use status::SessionStatus;

/// Milliseconds since the Unix epoch, the clock every `*_at_ms` field uses.
pub type EpochMillis = i64;
