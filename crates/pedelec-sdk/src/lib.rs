#![doc = include_str!("../README.md")]
//!
//! # Overview
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
#[cfg(any(unix, windows))]
pub mod daemon;
/// The SDK's error, [`PedelecError`]: a stable code, a message and JSON details
/// (re-exported from `pedelec-client`).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::error::PedelecError;
/// use pedelec_sdk::{ErrorCode, pb};
///
/// // Core's errors arrive as `pb::Error`; details travel as JSON text.
/// let wire = pb::Error::with_details(ErrorCode::ToolNotFound, "no such tool", &serde_json::json!({ "tool": "x" }));
/// let error = PedelecError::from(wire);
/// assert!(error.is(ErrorCode::ToolNotFound));
/// assert_eq!(error.details, Some(serde_json::json!({ "tool": "x" })));
/// assert_eq!(error.to_string(), "TOOL_NOT_FOUND: no such tool");
/// ```
pub use pedelec_client::error;
/// The gRPC transport to Core's Unix socket, with the message limits both
/// ends use (re-exported from `pedelec-client`).
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use std::sync::Arc;
/// use pedelec_sdk::grpc::GrpcTransport;
/// use pedelec_sdk::{Pedelec, SessionOptions};
///
/// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
/// let pedelec = Pedelec::with_transport(Arc::new(transport), "app:my-tool");
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// session.send_text("Hello").await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "grpc")]
pub use pedelec_client::grpc;
pub mod history;
pub mod machine;
#[cfg(feature = "grpc")]
pub mod native;
pub mod owner;
#[cfg(any(feature = "grpc", all(feature = "web", target_arch = "wasm32")))]
mod router;
pub mod session;
pub mod stream;
pub mod tool;
/// What a transport provides — calls, subscriptions, spawning and a clock —
/// so one session implementation runs over gRPC, native messaging and the
/// browser's port (re-exported from `pedelec-client`).
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::grpc::GrpcTransport;
/// use pedelec_sdk::pb::PingRequest;
/// use pedelec_sdk::transport::{Call, Reply, Transport, unexpected};
///
/// // The raw request vocabulary the SDK builds on.
/// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
/// match transport.call(Call::Ping(PingRequest {})).await? {
///     Reply::Ping(pong) => println!("Core {}", pong.version),
///     other => return Err(unexpected(&other)),
/// }
/// # Ok(())
/// # }
/// ```
pub use pedelec_client::transport;
#[cfg(all(feature = "web", target_arch = "wasm32"))]
pub mod web;

pub use client::{Pedelec, SessionOptions};
pub use context::{EventContext, EventKind, Source, StatusContext, ToolCallContext};
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::{ErrorCode, Pedelec, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// session.end().await?;
/// let refused = session.send_text("Too late.").await.unwrap_err();
/// // Codes are the stable part; messages are for people.
/// assert_eq!(refused.error_code(), Some(ErrorCode::SessionEnded));
/// # Ok(())
/// # }
/// ```
pub use error::PedelecError;
pub use owner::Owner;
pub use pedelec_protocol::{ErrorCode, SessionStatus, activity, pb, pb::EffortLevel};
pub use session::{Disposer, HistoryQuery, PedelecSession, PedelecSessionUsage, SendOptions};
pub use stream::{SessionEvent, SessionEvents, Turn};
pub use tool::{ToolName, ToolSpec, handler, sync_handler};
