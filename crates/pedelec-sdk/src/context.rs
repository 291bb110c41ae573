//! The context objects handed to every callback, with the seed's field names.

use pedelec_protocol::{SessionStatus, pb};

/// Where an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Core,
    Sdk,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Core => "core",
            Source::Sdk => "sdk",
        }
    }
}

/// Fields common to every callback context (`PedelecEventContext`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventContext {
    /// `"status_changed" | "sdk_status_changed" | "chat" | "chat_delta" | "tool_call" | "error" | "sdk_error" | "ended" | "sdk_ended"`.
    pub kind: &'static str,
    pub session_id: String,
    pub provider: String,
    /// `"default" | "low" | "high"` when known.
    pub effort_level: Option<&'static str>,
    /// When this SDK handle was constructed (ms since epoch).
    pub session_created_at: i64,
    /// When the SDK received a Core event; absent for SDK-originated events.
    pub event_received_at: Option<i64>,
    /// Core's emit time for Core events; the SDK's clock for its own.
    pub event_emitted_at: i64,
    pub turn_id: Option<String>,
    pub turn_started_at: Option<i64>,
    /// `"user" | "prepare"`.
    pub turn_kind: Option<&'static str>,
    pub source: Source,
}

/// Status callback context: adds the status before the change.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusContext {
    pub base: EventContext,
    pub previous_status: SessionStatus,
}

/// Tool handler context: adds the Core tool request id and the tool name.
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionMeta {
    pub session_id: String,
    pub provider: String,
    pub effort_level: Option<&'static str>,
    pub session_created_at: i64,
}

/// Milliseconds since the epoch. In the browser `SystemTime::now` panics
/// (wasm32-unknown-unknown has no clock), so the page's `Date.now()` is used.
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// Milliseconds since the epoch.
#[cfg(not(all(target_arch = "wasm32", feature = "web")))]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl SessionMeta {
    /// Context of an SDK-originated event.
    pub fn sdk(&self, kind: &'static str, turn: Option<&pb::TurnInfo>) -> EventContext {
        let mut ctx = self.core(kind, turn, now_ms(), None);
        ctx.source = Source::Sdk;
        ctx
    }

    /// Context of a Core event.
    pub fn core(
        &self,
        kind: &'static str,
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
            turn_kind: turn.and_then(|t| pb::TurnKind::try_from(t.kind).ok()).and_then(|k| k.seed_str()),
            source: Source::Core,
        }
    }
}
