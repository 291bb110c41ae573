//! pedelec-sdk: drive a local AI coding agent session through Pedelec Core.
//!
//! [`Pedelec`] creates and re-attaches sessions; [`PedelecSession`] sends
//! text, streams answers and answers frontend tool calls. The session logic
//! is the sans-IO [`machine::SessionMachine`]; transports ([`transport`],
//! with [`grpc`] to Core's socket, and `web` over the browser extension's
//! port in wasm32) only move messages.

#[cfg(feature = "grpc")]
pub mod assets;
pub mod client;
pub mod context;
#[cfg(unix)]
pub mod daemon;
pub use pedelec_client::error;
#[cfg(feature = "grpc")]
pub use pedelec_client::grpc;
pub mod history;
pub mod machine;
#[cfg(feature = "grpc")]
pub mod native;
pub mod session;
pub mod stream;
pub mod tool;
pub use pedelec_client::transport;
#[cfg(all(feature = "web", target_arch = "wasm32"))]
pub mod web;

pub use client::{Pedelec, SessionOptions};
pub use context::{EventContext, Source, StatusContext, ToolCallContext};
pub use error::PedelecError;
pub use pedelec_protocol::{ErrorCode, SessionStatus, activity, pb, pb::EffortLevel};
pub use session::{Disposer, HistoryQuery, PedelecSession, PedelecSessionUsage, SendOptions};
pub use stream::{SessionEvent, SessionEvents, Turn};
pub use tool::{ToolName, ToolSpec, handler, sync_handler};
