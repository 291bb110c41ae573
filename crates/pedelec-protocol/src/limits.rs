//! Every size and time bound that crosses a process boundary.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::limits::MAX_TEXT_BYTES;
//!
//! // Core refuses a longer `SendText` with TEXT_TOO_LARGE; the bound is in bytes.
//! let text = "Analyze the current page.";
//! assert!(text.len() <= MAX_TEXT_BYTES);
//! ```

use std::time::Duration;

/// Largest asset file, either direction.
pub const MAX_ASSET_BYTES: u64 = 100 * 1024 * 1024;
/// Chrome's limit for one message from the native host to the browser.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::NATIVE_HOST_TO_BROWSER_MAX;
/// use pedelec_protocol::native::encode_frame;
///
/// let too_big = "x".repeat(NATIVE_HOST_TO_BROWSER_MAX + 1);
/// assert!(encode_frame(&too_big, NATIVE_HOST_TO_BROWSER_MAX).is_err());
/// ```
pub const NATIVE_HOST_TO_BROWSER_MAX: usize = 1024 * 1024;
/// Encoded events one batch frame holds at most: in base64 (4/3 of it) with
/// its envelope, a batch still fits one host→browser message.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{NATIVE_BATCH_BYTES_BUDGET, NATIVE_HOST_TO_BROWSER_MAX};
///
/// // Base64 makes 4 bytes of every 3; what is left holds the envelope.
/// let base64_len = NATIVE_BATCH_BYTES_BUDGET.div_ceil(3) * 4;
/// assert!(base64_len + 64 * 1024 < NATIVE_HOST_TO_BROWSER_MAX);
/// ```
pub const NATIVE_BATCH_BYTES_BUDGET: usize = 704 * 1024;
/// Events one batch frame may carry (a receiver refuses more). It bounds
/// what a receiver holds at once: decoded, an event takes a few hundred
/// bytes, and the browser SDK's wasm memory never shrinks once grown.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::event_batch::EventBatcher;
/// use pedelec_protocol::limits::NATIVE_BATCH_MAX_EVENTS;
/// use pedelec_protocol::pb;
///
/// let mut batcher = EventBatcher::new(1);
/// let full = (0..=NATIVE_BATCH_MAX_EVENTS as u64)
///     .find_map(|seq| batcher.push(pb::SessionEvent { session_id: "s".into(), seq, ..Default::default() }));
/// // The event one over the limit starts the next batch.
/// assert!(full.is_some());
/// ```
pub const NATIVE_BATCH_MAX_EVENTS: usize = 1024;
/// How long the native host may hold the acknowledgement of a request sent
/// with `NativeFrame.defer_ack` for a frame to ride on, before it writes a
/// frame of acknowledgements alone. Long enough to span a browser tool round
/// trip (about a millisecond), so that the next tool call carries it; short
/// enough that nothing waits on it noticeably.
pub const NATIVE_ACK_DELAY: Duration = Duration::from_millis(10);
/// Acknowledgements the native host holds at most; one more is written at
/// once with those held. Bounds a frame's `acks` (a few KiB of JSON).
pub const NATIVE_MAX_HELD_ACKS: usize = 256;
/// Chrome's limit for one message from the browser to the native host.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{NATIVE_BROWSER_TO_HOST_MAX, NATIVE_HOST_TO_BROWSER_MAX};
/// use pedelec_protocol::native::FrameDecoder;
///
/// // The host reads what the browser sends with this limit.
/// let decoder = FrameDecoder::new(NATIVE_BROWSER_TO_HOST_MAX);
/// assert!(NATIVE_BROWSER_TO_HOST_MAX > NATIVE_HOST_TO_BROWSER_MAX);
/// ```
pub const NATIVE_BROWSER_TO_HOST_MAX: usize = 64 * 1024 * 1024;
/// Largest gRPC message either way (tonic's default is 4 MiB). A snapshot
/// carries a session's whole transcript, and a tool result may be
/// [`MAX_TOOL_JSON_BYTES`], so Core and its clients allow this much.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{GRPC_MESSAGE_MAX, MAX_TOOL_JSON_BYTES};
///
/// // Above tonic's default of 4 MiB, and room for the largest tool result.
/// assert!(GRPC_MESSAGE_MAX > 4 * 1024 * 1024);
/// assert!(GRPC_MESSAGE_MAX >= MAX_TOOL_JSON_BYTES);
/// ```
pub const GRPC_MESSAGE_MAX: usize = 64 * 1024 * 1024;
/// Operation outcomes a snapshot carries per session (`Snapshot.recent_outcomes`).
pub const RECENT_OUTCOMES: usize = 32;
/// The longest error code that crosses a process boundary (longer ones are clipped).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ERROR_CODE_CHARS;
/// use pedelec_protocol::pb;
///
/// let error = pb::Error { code: "X".repeat(500), ..Default::default() }.bounded();
/// assert_eq!(error.code.chars().count(), MAX_ERROR_CODE_CHARS);
/// ```
pub const MAX_ERROR_CODE_CHARS: usize = 64;
/// The longest error message that crosses a process boundary (clipped with "…").
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ERROR_MESSAGE_CHARS;
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let error = pb::Error::new(ErrorCode::InvalidArgument, "é".repeat(5_000)).bounded();
/// assert_eq!(error.message.chars().count(), MAX_ERROR_MESSAGE_CHARS);
/// assert!(error.message.ends_with('…'));
/// ```
pub const MAX_ERROR_MESSAGE_CHARS: usize = 1024;
/// Error details larger than this are replaced by `{"clipped": true, "bytes": N}`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ERROR_DETAILS_BYTES;
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let details = serde_json::json!({ "list": "x".repeat(MAX_ERROR_DETAILS_BYTES) });
/// let error = pb::Error::with_details(ErrorCode::InvalidArgument, "bad", &details).bounded();
/// assert!(error.details_json.len() < MAX_ERROR_DETAILS_BYTES);
/// assert!(error.details_json.contains(r#""clipped":true"#));
/// ```
pub const MAX_ERROR_DETAILS_BYTES: usize = 4096;
/// Transcript entries in one `GetHistory` page when the request names no limit.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{DEFAULT_HISTORY_PAGE, MAX_HISTORY_PAGE};
///
/// assert_eq!(DEFAULT_HISTORY_PAGE, 100);
/// assert!(DEFAULT_HISTORY_PAGE <= MAX_HISTORY_PAGE);
/// ```
pub const DEFAULT_HISTORY_PAGE: u32 = 100;
/// The most transcript entries one `GetHistory` page may ask for.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::{limits::MAX_HISTORY_PAGE, pb};
///
/// // The largest page one request may ask for; Core refuses more with INVALID_ARGUMENT.
/// let request = pb::GetHistoryRequest { session_id: "sess-1".into(), limit: MAX_HISTORY_PAGE, ..Default::default() };
/// assert_eq!(request.limit, 1000);
/// ```
pub const MAX_HISTORY_PAGE: u32 = 1000;
/// Sessions in one `ListSessions` page when the request names no limit.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{DEFAULT_LISTED_SESSIONS, MAX_LISTED_SESSIONS};
///
/// assert_eq!(DEFAULT_LISTED_SESSIONS, 100);
/// assert!(DEFAULT_LISTED_SESSIONS <= MAX_LISTED_SESSIONS);
/// ```
pub const DEFAULT_LISTED_SESSIONS: u32 = 100;
/// The most sessions one `ListSessions` page holds (a larger limit is clipped).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{DEFAULT_LISTED_SESSIONS, MAX_LISTED_SESSIONS};
///
/// // How Core reads `ListSessionsRequest.limit`.
/// let page = |limit: u32| if limit == 0 { DEFAULT_LISTED_SESSIONS } else { limit.min(MAX_LISTED_SESSIONS) };
/// assert_eq!(page(0), 100);
/// assert_eq!(page(50_000), 1000);
/// ```
pub const MAX_LISTED_SESSIONS: u32 = 1000;
/// Ended sessions `ListLiveSessions` adds with `include_ended` when the
/// request names no `ended_limit`.
pub const DEFAULT_ENDED_LISTED: u32 = 50;
/// The largest `ListLiveSessionsRequest.ended_limit` (a larger one is
/// refused, not clipped: the user's window asked for something it cannot show).
pub const MAX_ENDED_LISTED: u32 = 1000;

/// How many ended sessions `ListLiveSessionsRequest.ended_limit` asks for:
/// 0 is [`DEFAULT_ENDED_LISTED`], over [`MAX_ENDED_LISTED`] is `None`
/// (`INVALID_ARGUMENT`, details `field` "ended_limit").
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::ended_listed;
///
/// assert_eq!(ended_listed(0), Some(50));
/// assert_eq!(ended_listed(7), Some(7));
/// assert_eq!(ended_listed(1000), Some(1000));
/// assert_eq!(ended_listed(1001), None);
/// ```
pub fn ended_listed(limit: u32) -> Option<u32> {
    match limit {
        0 => Some(DEFAULT_ENDED_LISTED),
        n if n <= MAX_ENDED_LISTED => Some(n),
        _ => None,
    }
}

/// Events queued for one subscriber before the provider was made to wait.
/// No longer Core's rule: subscribers read Core's per-session event log at
/// their own pace and a provider never waits (see `session::log` in Core);
/// kept as a size clients may use for their own queues.
pub const SUBSCRIBER_QUEUE_EVENTS: usize = 4096;
/// How long a full subscriber queue could hold a provider up before Core
/// re-synchronised that subscriber. No longer Core's rule (a subscriber is
/// re-synchronised only when it falls out of the event log, however long it
/// was silent); benches and tests use it as a yardstick of a stall.
pub const SUBSCRIBER_LAG_TIMEOUT: Duration = Duration::from_secs(2);
/// Tool-call timeout when a tool does not set `timeout_ms`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::DEFAULT_TOOL_TIMEOUT;
/// use pedelec_protocol::{pb, tools::tool_timeout};
///
/// // A tool whose `timeout_ms` is 0 gets the default.
/// assert_eq!(tool_timeout(&pb::ToolDefinition::default()), DEFAULT_TOOL_TIMEOUT);
/// ```
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest tool timeout a manifest may ask for.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TOOL_TIMEOUT;
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::{ManifestRule, check_manifest};
///
/// let slow = ToolDefinition {
///     name: "slow".into(),
///     description: "Waits".into(),
///     input_schema_json: "{}".into(),
///     timeout_ms: MAX_TOOL_TIMEOUT.as_millis() as u32 + 1,
///     read_only_hint: false,
/// };
/// assert_eq!(check_manifest(&[slow]), [ManifestRule::TimeoutTooLong("slow".into())]);
/// ```
pub const MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Largest `SendText` text, in UTF-8 bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TEXT_BYTES;
///
/// // Bytes, not characters: "é" counts twice.
/// let text = "é".repeat(MAX_TEXT_BYTES / 2 + 1);
/// assert!(text.len() > MAX_TEXT_BYTES);
/// ```
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;
/// Largest tool arguments or result JSON, in bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TOOL_JSON_BYTES;
///
/// let result = serde_json::json!({ "value": 42 }).to_string();
/// assert!(result.len() <= MAX_TOOL_JSON_BYTES);
/// assert_eq!(MAX_TOOL_JSON_BYTES, 8 * 1024 * 1024);
/// ```
pub const MAX_TOOL_JSON_BYTES: usize = 8 * 1024 * 1024;
/// Most tools in one session manifest.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TOOLS;
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::{ManifestRule, check_manifest};
///
/// let tools: Vec<_> = (0..=MAX_TOOLS)
///     .map(|n| ToolDefinition {
///         name: format!("tool_{n}"),
///         description: "d".into(),
///         input_schema_json: "{}".into(),
///         timeout_ms: 0,
///         read_only_hint: false,
///     })
///     .collect();
/// assert_eq!(check_manifest(&tools), [ManifestRule::TooMany]);
/// ```
pub const MAX_TOOLS: usize = 128;
/// Longest tool name.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TOOL_NAME_LEN;
/// use pedelec_protocol::tools::is_valid_tool_name;
///
/// assert!(is_valid_tool_name(&"a".repeat(MAX_TOOL_NAME_LEN)));
/// assert!(!is_valid_tool_name(&"a".repeat(MAX_TOOL_NAME_LEN + 1)));
/// ```
pub const MAX_TOOL_NAME_LEN: usize = 64;
/// Largest tool description or JSON schema text, in bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_TOOL_SCHEMA_BYTES;
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::{ManifestRule, check_manifest};
///
/// let wordy = ToolDefinition {
///     name: "wordy".into(),
///     description: "d".repeat(MAX_TOOL_SCHEMA_BYTES + 1),
///     input_schema_json: "{}".into(),
///     timeout_ms: 0,
///     read_only_hint: false,
/// };
/// assert_eq!(check_manifest(&[wordy]), [ManifestRule::TooLarge("wordy".into())]);
/// ```
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// The largest output schema a `SendText` may carry (its JSON text).
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 64 * 1024;
/// Largest skill guidance text, in bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_GUIDANCE_BYTES;
///
/// let guidance = "Answer in one sentence.";
/// assert!(guidance.len() <= MAX_GUIDANCE_BYTES);
/// assert_eq!(MAX_GUIDANCE_BYTES, 256 * 1024);
/// ```
pub const MAX_GUIDANCE_BYTES: usize = 256 * 1024;
/// Longest public asset path, in bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ASSET_PATH_BYTES;
/// use pedelec_protocol::{AssetPath, AssetPathError};
///
/// let long = format!("/{}", "a".repeat(MAX_ASSET_PATH_BYTES));
/// assert_eq!(AssetPath::parse(&long), Err(AssetPathError::TooLong));
/// ```
pub const MAX_ASSET_PATH_BYTES: usize = 1024;
/// Most segments in a public asset path.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ASSET_PATH_SEGMENTS;
/// use pedelec_protocol::{AssetPath, AssetPathError};
///
/// assert!(AssetPath::parse(&"/a".repeat(MAX_ASSET_PATH_SEGMENTS)).is_ok());
/// assert_eq!(AssetPath::parse(&"/a".repeat(MAX_ASSET_PATH_SEGMENTS + 1)), Err(AssetPathError::TooDeep));
/// ```
pub const MAX_ASSET_PATH_SEGMENTS: usize = 32;
/// Longest caller origin.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ORIGIN_LEN;
///
/// assert!("https://app.example.com".len() <= MAX_ORIGIN_LEN);
/// assert_eq!(MAX_ORIGIN_LEN, 512);
/// ```
pub const MAX_ORIGIN_LEN: usize = 512;
/// Longest identifier (session, operation, tool request) accepted from a client.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_ID_LEN;
/// use pedelec_protocol::{activity::bounded, pb};
///
/// // An agent's activity id is clipped to it too.
/// let activity = bounded(pb::Activity { activity_id: "x".repeat(1_000), ..Default::default() });
/// assert_eq!(activity.activity_id.chars().count(), MAX_ID_LEN + 1);
/// ```
pub const MAX_ID_LEN: usize = 128;
/// Longest workspace path.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_WORKSPACE_PATH_BYTES;
///
/// assert!("/home/ada/projects/site".len() <= MAX_WORKSPACE_PATH_BYTES);
/// assert_eq!(MAX_WORKSPACE_PATH_BYTES, 4096);
/// ```
pub const MAX_WORKSPACE_PATH_BYTES: usize = 4096;
/// The most folders the user may grant one web origin (`Core.SetConsent`).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_WORKSPACE_GRANTS;
/// use pedelec_protocol::pb::{FolderGrant, OriginConsent};
///
/// let folder = FolderGrant { path: "/home/ada/site".into(), may_approve_commands: false, ..Default::default() };
/// let consent = OriginConsent { origin: "https://ada.example".into(), approved: true, folders: vec![folder], ..Default::default() };
/// assert!(consent.folders.len() <= MAX_WORKSPACE_GRANTS);
/// ```
pub const MAX_WORKSPACE_GRANTS: usize = 64;
/// The largest per-site live session limit (`OriginConsent.max_live_sessions`).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::MAX_SITE_LIVE_SESSIONS;
/// use pedelec_protocol::pb::OriginConsent;
///
/// let consent = OriginConsent { origin: "https://ada.example".into(), max_live_sessions: 3, ..Default::default() };
/// assert!(consent.max_live_sessions <= MAX_SITE_LIVE_SESSIONS);
/// ```
pub const MAX_SITE_LIVE_SESSIONS: u32 = 1000;
/// The most provider codes one origin's consent may list (`OriginConsent.providers`).
pub const MAX_SITE_PROVIDERS: usize = 64;
/// How long an asset ticket stays valid.
pub const ASSET_TICKET_TTL: Duration = Duration::from_secs(60);

/// The most attachments one `SendText` may carry.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::asset_path::check_attachments;
/// use pedelec_protocol::limits::MAX_ATTACHMENTS;
/// use pedelec_protocol::ErrorCode;
///
/// let paths: Vec<String> = (0..=MAX_ATTACHMENTS).map(|n| format!("/file-{n}.txt")).collect();
/// assert_eq!(check_attachments(&paths).unwrap_err().0, ErrorCode::InvalidArgument);
/// assert!(check_attachments(&paths[..MAX_ATTACHMENTS]).is_ok());
/// ```
pub const MAX_ATTACHMENTS: usize = 16;
/// The largest image sent inline as image content.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::{MAX_ASSET_BYTES, MAX_IMAGE_ATTACHMENT_BYTES};
///
/// assert_eq!(MAX_IMAGE_ATTACHMENT_BYTES, 20 * 1024 * 1024);
/// // Core refuses a larger image as an attachment (ASSET_TOO_LARGE); as an asset it may stay.
/// assert!(MAX_IMAGE_ATTACHMENT_BYTES < MAX_ASSET_BYTES);
/// ```
pub const MAX_IMAGE_ATTACHMENT_BYTES: u64 = 20 * 1024 * 1024;

/// Why `model` cannot name a model (`SetModel`), or `None` when it can: it
/// is not empty, at most [`MAX_ID_LEN`] bytes, does not start with `-`, and
/// has no control characters: it reaches agents' command lines (`--model
/// NAME`), where a leading dash would read as a flag. Spaces are allowed:
/// ACP agents name models by their options' display names ("Fake Large").
///
/// # Examples
///
/// ```
/// use pedelec_protocol::limits::model_name_problem;
///
/// assert_eq!(model_name_problem("gpt-5.1-codex"), None);
/// assert_eq!(model_name_problem("claude-sonnet-4-5@20250929"), None);
/// assert!(model_name_problem("").is_some());
/// assert_eq!(model_name_problem("Fake Large"), None);
/// assert!(model_name_problem("tab\tbed").is_some());
/// assert!(model_name_problem("x\u{0}y").is_some());
/// assert!(model_name_problem(&"m".repeat(129)).is_some());
/// assert!(model_name_problem("--dangerously-skip-permissions").is_some());
/// ```
pub fn model_name_problem(model: &str) -> Option<&'static str> {
    if model.is_empty() {
        Some("the model name is empty")
    } else if model.len() > MAX_ID_LEN {
        Some("the model name is longer than 128 bytes")
    } else if model.starts_with('-') {
        Some("the model name starts with a dash")
    } else if model.chars().any(char::is_control) {
        Some("the model name has control characters")
    } else {
        None
    }
}
