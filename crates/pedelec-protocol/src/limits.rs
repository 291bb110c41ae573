//! Every size and time bound that crosses a process boundary.

use std::time::Duration;

/// Largest asset file, either direction.
pub const MAX_ASSET_BYTES: u64 = 100 * 1024 * 1024;
/// Chrome's limit for one message from the native host to the browser.
pub const NATIVE_HOST_TO_BROWSER_MAX: usize = 1024 * 1024;
/// Encoded events one batch frame holds at most: in base64 (4/3 of it) with
/// its envelope, a batch still fits one host→browser message.
pub const NATIVE_BATCH_BYTES_BUDGET: usize = 704 * 1024;
/// Events one batch frame may carry (a receiver refuses more). It bounds
/// what a receiver holds at once: decoded, an event takes a few hundred
/// bytes, and the browser SDK's wasm memory never shrinks once grown.
pub const NATIVE_BATCH_MAX_EVENTS: usize = 1024;
/// Chrome's limit for one message from the browser to the native host.
pub const NATIVE_BROWSER_TO_HOST_MAX: usize = 64 * 1024 * 1024;
/// Largest gRPC message either way (tonic's default is 4 MiB). A snapshot
/// carries a session's whole transcript, and a tool result may be
/// [`MAX_TOOL_JSON_BYTES`], so Core and its clients allow this much.
pub const GRPC_MESSAGE_MAX: usize = 64 * 1024 * 1024;
/// Operation outcomes a snapshot carries per session (`Snapshot.recent_outcomes`).
pub const RECENT_OUTCOMES: usize = 32;
/// The longest error code that crosses a process boundary (longer ones are clipped).
pub const MAX_ERROR_CODE_CHARS: usize = 64;
/// The longest error message that crosses a process boundary (clipped with "…").
pub const MAX_ERROR_MESSAGE_CHARS: usize = 1024;
/// Error details larger than this are replaced by `{"clipped": true, "bytes": N}`.
pub const MAX_ERROR_DETAILS_BYTES: usize = 4096;
/// Transcript entries in one `GetHistory` page when the request names no limit.
pub const DEFAULT_HISTORY_PAGE: u32 = 100;
/// The most transcript entries one `GetHistory` page may ask for.
pub const MAX_HISTORY_PAGE: u32 = 1000;
/// Sessions in one `ListSessions` page when the request names no limit.
pub const DEFAULT_LISTED_SESSIONS: u32 = 100;
/// The most sessions one `ListSessions` page holds (a larger limit is clipped).
pub const MAX_LISTED_SESSIONS: u32 = 1000;
/// Events queued for one subscriber before the provider is made to wait.
pub const SUBSCRIBER_QUEUE_EVENTS: usize = 4096;
/// How long a full subscriber queue may hold a provider up before that
/// subscriber is dropped and re-synchronised with a fresh snapshot.
pub const SUBSCRIBER_LAG_TIMEOUT: Duration = Duration::from_secs(2);
/// Tool-call timeout when a tool does not set `timeout_ms`.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest tool timeout a manifest may ask for.
pub const MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Largest `SendText` text, in UTF-8 bytes.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;
/// Largest tool arguments or result JSON, in bytes.
pub const MAX_TOOL_JSON_BYTES: usize = 8 * 1024 * 1024;
/// Most tools in one session manifest.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name.
pub const MAX_TOOL_NAME_LEN: usize = 64;
/// Largest tool description or JSON schema text, in bytes.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;
/// Largest skill guidance text, in bytes.
pub const MAX_GUIDANCE_BYTES: usize = 256 * 1024;
/// Longest public asset path, in bytes.
pub const MAX_ASSET_PATH_BYTES: usize = 1024;
/// Most segments in a public asset path.
pub const MAX_ASSET_PATH_SEGMENTS: usize = 32;
/// Longest caller origin.
pub const MAX_ORIGIN_LEN: usize = 512;
/// Longest identifier (session, operation, tool request) accepted from a client.
pub const MAX_ID_LEN: usize = 128;
/// Longest workspace path.
pub const MAX_WORKSPACE_PATH_BYTES: usize = 4096;
/// The most granted roots one request may carry (`WorkspaceSpec.granted_roots`).
pub const MAX_WORKSPACE_GRANTS: usize = 64;
/// How long an asset ticket stays valid.
pub const ASSET_TICKET_TTL: Duration = Duration::from_secs(60);

/// The most attachments one `SendText` may carry.
pub const MAX_ATTACHMENTS: usize = 16;
/// The largest image sent inline as image content.
pub const MAX_IMAGE_ATTACHMENT_BYTES: u64 = 20 * 1024 * 1024;
