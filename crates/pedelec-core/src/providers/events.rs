//! The normalised vocabulary every adapter's parser produces, and how it
//! reaches a turn's [`TurnSink`]. Parsers are sans-IO (`line → events`), so
//! recorded transcripts are tested without any process.

use pedelec_protocol::pb;
use serde::Serialize;

use super::TurnSink;

/// An activity of `kind` with a title (what parsers start from).
pub fn activity(id: impl Into<String>, kind: pb::ActivityKind, title: impl Into<String>) -> pb::Activity {
    pb::Activity { activity_id: id.into(), kind: kind as i32, title: title.into(), ..Default::default() }
}

/// A note about the provider (no id: each note is its own activity).
pub fn note(title: impl Into<String>) -> pb::Activity {
    activity("", pb::ActivityKind::Note, title)
}

/// The activity with `status`.
pub fn with_status(mut activity: pb::Activity, status: pb::ActivityStatus) -> pb::Activity {
    activity.status = status as i32;
    activity
}

/// What an agent's output means, independent of its wire format.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The provider's own session/thread identity (for later turns and resume).
    SessionId { id: String },
    /// A best-effort fragment of assistant text.
    Delta { text: String },
    /// One complete assistant message.
    Message { text: String },
    /// Agent-side work, or an update of it (same `activity_id`): a command,
    /// an MCP/tool call, a file change, a plan, reasoning, a note.
    Activity(pb::Activity),
    /// The provider's cumulative token total.
    Usage { total_tokens: u64 },
    /// Something the agent reported that does not end the turn.
    Notice { message: String },
    /// The agent reports that one of the session's frontend tools failed on
    /// its side (`tool` is the manifest name; `reason` the agent's words).
    ToolFailed { tool: String, reason: String },
    /// The agent is about to call the frontend tool `tool` (its manifest
    /// name) over the MCP bridge.
    ToolCalling { tool: String },
    /// The turn failed.
    Failed { message: String },
    /// The turn finished.
    TurnDone,
    /// A line that is not the format (garbage, over-long, unknown JSON); skipped.
    Skipped { reason: String },
}

/// The text of a tool result's content as agents send it: a string, or
/// blocks (at any depth) whose `text` fields are joined by spaces; `None`
/// when there is no text.
pub(crate) fn content_text(content: &serde_json::Value) -> Option<String> {
    fn collect(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(text)) = map.get("text") {
                    out.push(text.clone());
                }
                map.values().for_each(|v| collect(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    if let serde_json::Value::String(text) = content {
        return Some(text.clone()).filter(|t| !t.is_empty());
    }
    let mut texts = Vec::new();
    collect(content, &mut texts);
    (!texts.is_empty()).then(|| texts.join(" "))
}

/// Whether a frontend tool failure the agent reports happened on its side.
/// A failure whose text carries one of our error codes came from Core (the
/// handler's `TOOL_HANDLER_ERROR`, `TOOL_ARGS_INVALID`, `TOOL_TIMEOUT`, …),
/// and the application has already seen it; only the others — an approval
/// the agent refused itself, its MCP client failing — are news.
pub fn failed_on_agent_side(reason: &str) -> bool {
    !pedelec_protocol::ErrorCode::ALL.iter().any(|code| reason.contains(code.as_str()))
}

/// Where a turn stands after applying events.
#[derive(Debug, Default)]
pub struct TurnOutcome {
    pub done: bool,
    pub failure: Option<String>,
}

impl TurnOutcome {
    /// Applies one event to `sink` and tracks whether the turn finished or failed.
    pub fn apply(&mut self, sink: &dyn TurnSink, event: AgentEvent) {
        match event {
            AgentEvent::SessionId { id } => sink.provider_session(&id),
            AgentEvent::Delta { text } => sink.delta(&text),
            AgentEvent::Message { text } => sink.message(&text),
            AgentEvent::Activity(activity) => sink.activity(activity),
            AgentEvent::Usage { total_tokens } => sink.usage(total_tokens),
            AgentEvent::Notice { message } => tracing::info!(%message, "agent notice"),
            AgentEvent::ToolFailed { tool, reason } => {
                if failed_on_agent_side(&reason) {
                    sink.tool_failed(&tool, &reason);
                }
            }
            AgentEvent::ToolCalling { tool } => sink.tool_call_reported(&tool),
            AgentEvent::Failed { message } => {
                self.failure.get_or_insert(message);
            }
            AgentEvent::TurnDone => self.done = true,
            AgentEvent::Skipped { reason } => tracing::warn!(%reason, "skipped a line of agent output"),
        }
    }
}
