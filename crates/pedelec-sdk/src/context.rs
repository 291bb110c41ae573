//! The context objects handed to every callback, with the seed's field names.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use pedelec_sdk::{Pedelec, SessionOptions};
//!
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! let _off = session.on_chat(|text, ctx| {
//!     // Which turn a message belongs to, and when Core emitted it.
//!     println!("[{:?} at {}] {text}", ctx.turn_id, ctx.event_emitted_at);
//! });
//! session.send_text("Hello").await?;
//! # Ok(())
//! # }
//! ```

use pedelec_protocol::{SessionStatus, pb};

/// Where an event came from.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta, Source};
///
/// let meta = SessionMeta::default();
/// // The SDK's own status changes (an optimistic `running`) say so.
/// assert_eq!(meta.sdk(EventKind::SdkStatusChanged, None).source, Source::Sdk);
/// assert_eq!(meta.core(EventKind::StatusChanged, None, 0, None).source, Source::Core);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Core,
    Sdk,
}

impl Source {
    /// The seed's `source` string.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::Source;
    ///
    /// assert_eq!(Source::Core.as_str(), "core");
    /// assert_eq!(Source::Sdk.as_str(), "sdk");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Core => "core",
            Source::Sdk => "sdk",
        }
    }
}

/// What a callback's context reports. [`EventKind::as_str`] is the seed's
/// `kind` string, what the JavaScript API passes on.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta};
///
/// let ctx = SessionMeta::default().core(EventKind::ChatDelta, None, 0, None);
/// assert_eq!(ctx.kind, EventKind::ChatDelta);
/// assert_eq!(ctx.kind.as_str(), "chat_delta");
/// assert_eq!(EventKind::SdkEnded.to_string(), "sdk_ended");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Core changed the session's status.
    StatusChanged,
    /// The SDK changed the handle's status itself (an optimistic `running`,
    /// its undoing, a local `end()`).
    SdkStatusChanged,
    Chat,
    ChatDelta,
    ToolCall,
    Activity,
    PermissionRequested,
    /// An error Core reported.
    Error,
    /// An error of the SDK's own (a tool result it could not submit, a lost transport).
    SdkError,
    /// Core ended the session.
    Ended,
    /// The handle ended without Core's `Ended` (a local `end()`, a revoked origin).
    SdkEnded,
}

impl EventKind {
    /// The seed's `kind` string.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::EventKind;
    ///
    /// assert_eq!(EventKind::StatusChanged.as_str(), "status_changed");
    /// assert_eq!(EventKind::PermissionRequested.as_str(), "permission_requested");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::StatusChanged => "status_changed",
            EventKind::SdkStatusChanged => "sdk_status_changed",
            EventKind::Chat => "chat",
            EventKind::ChatDelta => "chat_delta",
            EventKind::ToolCall => "tool_call",
            EventKind::Activity => "activity",
            EventKind::PermissionRequested => "permission_requested",
            EventKind::Error => "error",
            EventKind::SdkError => "sdk_error",
            EventKind::Ended => "ended",
            EventKind::SdkEnded => "sdk_ended",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fields common to every callback context (`PedelecEventContext`).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta};
/// use pedelec_sdk::pb::{TurnInfo, TurnKind};
///
/// let meta = SessionMeta { session_id: "sess-1".into(), provider: "scripted".into(), ..Default::default() };
/// let turn = TurnInfo { turn_id: "turn-1".into(), kind: TurnKind::User as i32, started_at_ms: 10 };
/// let ctx = meta.core(EventKind::Chat, Some(&turn), 12, Some(13));
/// assert_eq!((ctx.kind, ctx.session_id.as_str()), (EventKind::Chat, "sess-1"));
/// assert_eq!((ctx.turn_id.as_deref(), ctx.turn_kind), (Some("turn-1"), Some(TurnKind::User)));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EventContext {
    pub kind: EventKind,
    pub session_id: String,
    pub provider: String,
    /// The session's effort level when known (never `Unspecified`).
    pub effort_level: Option<pb::EffortLevel>,
    /// When this SDK handle was constructed (ms since epoch).
    pub session_created_at: i64,
    /// When the SDK received a Core event; absent for SDK-originated events.
    pub event_received_at: Option<i64>,
    /// Core's emit time for Core events; the SDK's clock for its own.
    pub event_emitted_at: i64,
    pub turn_id: Option<String>,
    pub turn_started_at: Option<i64>,
    /// The turn's kind when the event belongs to one (never `Unspecified`).
    pub turn_kind: Option<pb::TurnKind>,
    pub source: Source,
}

/// Status callback context: adds the status before the change.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta, StatusContext};
/// use pedelec_sdk::SessionStatus;
///
/// let meta = SessionMeta { session_id: "sess-1".into(), ..Default::default() };
/// let ctx = StatusContext { base: meta.sdk(EventKind::SdkStatusChanged, None), previous_status: SessionStatus::Idle };
/// // The common fields are reachable directly.
/// assert_eq!(ctx.session_id, "sess-1");
/// assert_eq!(ctx.previous_status, SessionStatus::Idle);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct StatusContext {
    pub base: EventContext,
    pub previous_status: SessionStatus,
}

/// Tool handler context: adds the Core tool request id and the tool name.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta, ToolCallContext};
///
/// let base = SessionMeta::default().core(EventKind::ToolCall, None, 0, None);
/// let ctx = ToolCallContext { base, tool_request_id: "tool-1".into(), tool: "update_counter".into() };
/// assert_eq!(ctx.kind, EventKind::ToolCall);
/// assert_eq!(ctx.tool, "update_counter");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallContext {
    pub base: EventContext,
    pub tool_request_id: String,
    pub tool: String,
}

impl std::ops::Deref for StatusContext {
    type Target = EventContext;
    fn deref(&self) -> &EventContext {
        &self.base
    }
}

impl std::ops::Deref for ToolCallContext {
    type Target = EventContext;
    fn deref(&self) -> &EventContext {
        &self.base
    }
}

/// Handle metadata every context repeats.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::{EventKind, SessionMeta};
/// use pedelec_sdk::EffortLevel;
///
/// let meta = SessionMeta { session_id: "sess-1".into(), effort_level: Some(EffortLevel::Low), ..Default::default() };
/// assert_eq!(meta.core(EventKind::Chat, None, 0, None).effort_level, Some(EffortLevel::Low));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionMeta {
    pub session_id: String,
    pub provider: String,
    /// Never `Unspecified` (see [`SessionMeta::effort`]).
    pub effort_level: Option<pb::EffortLevel>,
    pub session_created_at: i64,
}

/// Milliseconds since the epoch. In the browser `SystemTime::now` panics
/// (wasm32-unknown-unknown has no clock), so the page's `Date.now()` is used.
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// Milliseconds since the epoch.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::now_ms;
///
/// let before = now_ms();
/// assert!(before > 1_600_000_000_000);
/// assert!(now_ms() >= before);
/// ```
#[cfg(not(all(target_arch = "wasm32", feature = "web")))]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl SessionMeta {
    /// Context of an SDK-originated event.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::{EventKind, SessionMeta, Source};
    ///
    /// let ctx = SessionMeta::default().sdk(EventKind::SdkError, None);
    /// assert_eq!(ctx.source, Source::Sdk);
    /// // Nothing was received from Core.
    /// assert_eq!(ctx.event_received_at, None);
    /// ```
    pub fn sdk(&self, kind: EventKind, turn: Option<&pb::TurnInfo>) -> EventContext {
        let mut ctx = self.core(kind, turn, now_ms(), None);
        ctx.source = Source::Sdk;
        ctx
    }

    /// Context of a Core event.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::{EventKind, SessionMeta};
    /// use pedelec_sdk::pb::TurnInfo;
    ///
    /// let meta = SessionMeta::default();
    /// let ctx = meta.core(EventKind::ChatDelta, None, 1_000, Some(1_004));
    /// assert_eq!((ctx.event_emitted_at, ctx.event_received_at), (1_000, Some(1_004)));
    /// // A turn without an id is no turn.
    /// assert_eq!(meta.core(EventKind::Chat, Some(&TurnInfo::default()), 0, None).turn_id, None);
    /// ```
    pub fn core(
        &self,
        kind: EventKind,
        turn: Option<&pb::TurnInfo>,
        emitted_at: i64,
        received_at: Option<i64>,
    ) -> EventContext {
        let turn = turn.filter(|t| !t.turn_id.is_empty());
        EventContext {
            kind,
            session_id: self.session_id.clone(),
            provider: self.provider.clone(),
            effort_level: self.effort_level,
            session_created_at: self.session_created_at,
            event_received_at: received_at,
            event_emitted_at: emitted_at,
            turn_id: turn.map(|t| t.turn_id.clone()),
            turn_started_at: turn.map(|t| t.started_at_ms),
            turn_kind: turn
                .and_then(|t| pb::TurnKind::try_from(t.kind).ok())
                .filter(|k| *k != pb::TurnKind::Unspecified),
            source: Source::Core,
        }
    }

    /// A wire effort level as a context names it: `None` for unspecified or unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::EffortLevel;
    ///
    /// assert_eq!(SessionMeta::effort(EffortLevel::High as i32), Some(EffortLevel::High));
    /// assert_eq!(SessionMeta::effort(0), None);
    /// assert_eq!(SessionMeta::effort(42), None);
    /// ```
    pub fn effort(wire: i32) -> Option<pb::EffortLevel> {
        pb::EffortLevel::try_from(wire).ok().filter(|e| *e != pb::EffortLevel::Unspecified)
    }
}
