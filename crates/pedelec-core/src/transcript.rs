//! What a session's transcript holds: each entry's kind, and its body as
//! one type per kind. The machine writes these types, the store keeps them
//! as JSON text, and the history reads them back; the JSON of an entry is
//! defined here once. Fields added since the first release, and an entry's
//! operation, default when a row lacks them.

use std::borrow::Cow;

use pedelec_protocol::pb;
use serde::{Deserialize, Serialize};

/// One transcript entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptEntry {
    pub seq: u64,
    pub at_ms: i64,
    pub kind: EntryKind,
    pub body: EntryBody,
}

/// What a transcript entry records; stored in its row's `kind` column by
/// [`EntryKind::as_str`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// The user's text of a turn, with its attachments.
    UserText,
    /// A preparation's prompt: stored, never shown in the history.
    Prepare,
    /// One complete assistant message.
    Chat,
    ToolCall,
    ToolResult,
    AgentActivity,
    /// The agent could not call a frontend tool.
    ToolFailed,
    OperationCompleted,
    Ended,
    Resumed,
    /// `SetModel` changed the model or effort.
    ModelChanged,
    /// What a user turn changed in the workspace: read by `GetChanges`,
    /// never shown in the history.
    TurnChanges,
    /// A kind this Core does not know (a row written by a newer one): kept
    /// as it is, left out of the history.
    Other(String),
}

impl EntryKind {
    const NAMED: [(EntryKind, &'static str); 12] = [
        (EntryKind::UserText, "user_text"),
        (EntryKind::TurnChanges, "turn_changes"),
        (EntryKind::ModelChanged, "model_changed"),
        (EntryKind::Prepare, "prepare"),
        (EntryKind::Chat, "chat"),
        (EntryKind::ToolCall, "tool_call"),
        (EntryKind::ToolResult, "tool_result"),
        (EntryKind::AgentActivity, "agent_activity"),
        (EntryKind::ToolFailed, "tool_failed"),
        (EntryKind::OperationCompleted, "operation_completed"),
        (EntryKind::Ended, "ended"),
        (EntryKind::Resumed, "resumed"),
    ];

    /// The stored spelling.
    pub fn as_str(&self) -> &str {
        match self {
            EntryKind::Other(kind) => kind,
            known => Self::NAMED.iter().find(|(k, _)| k == known).map_or("", |(_, name)| name),
        }
    }

    /// The kind a stored spelling names.
    pub fn parse(stored: &str) -> EntryKind {
        Self::NAMED
            .iter()
            .find(|(_, name)| *name == stored)
            .map_or_else(|| EntryKind::Other(stored.to_owned()), |(kind, _)| kind.clone())
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transcript entry's body as JSON text, serialised once where the entry
/// is made and written to its row as it is. A turn of many messages makes
/// an entry per message, and building each as a `serde_json::Value` tree
/// (a map, its keys, a copy of the text) only to print it for the row is
/// work for nothing. Readers of the history parse it ([`EntryBody::parse`]);
/// they are few and read rarely.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryBody(String);

impl EntryBody {
    /// `value` serialised. Serialising a `serde_json::Value` or a derived
    /// struct cannot fail; anything that does is stored as `null`, as an
    /// unreadable stored body reads.
    pub fn new(value: &impl serde::Serialize) -> Self {
        EntryBody(serde_json::to_string(value).unwrap_or_else(|_| "null".into()))
    }

    /// A body read back from its row.
    pub(crate) fn stored(text: String) -> Self {
        EntryBody(text)
    }

    /// The stored text's length in bytes (what `max_transcript_bytes` counts).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The body as a JSON tree (`null` if the stored text is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// The body as its kind's type (`None` if it does not read as one),
    /// borrowing its text where no escape was stored.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Option<T> {
        serde_json::from_str(&self.0).ok()
    }

    /// The stored text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A body type, which names the kind of entry it is.
pub trait Body: Serialize + Sized {
    const KIND: EntryKind;

    /// The entry's kind and stored text, made where the entry is made.
    fn encode(&self) -> (EntryKind, EntryBody) {
        (Self::KIND, EntryBody::new(self))
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn no_attachments(attachments: &[String]) -> bool {
    attachments.is_empty()
}

/// The user's text of a turn (`user_text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserText<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    #[serde(borrow)]
    pub text: Cow<'a, str>,
    /// The asset paths attached, if any.
    #[serde(default, skip_serializing_if = "no_attachments")]
    pub attachments: Cow<'a, [String]>,
}

impl Body for UserText<'_> {
    const KIND: EntryKind = EntryKind::UserText;
}

/// What a user turn changed in its workspace (`turn_changes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TurnChanges(pub pedelec_protocol::pb::GetChangesResponse);

impl Body for TurnChanges {
    const KIND: EntryKind = EntryKind::TurnChanges;
}

/// A preparation's prompt (`prepare`): the same body as a user's text.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Prepare<'a>(pub UserText<'a>);

impl Body for Prepare<'_> {
    const KIND: EntryKind = EntryKind::Prepare;
}

/// One complete assistant message (`chat`), or what streamed of one before
/// its turn was cut short (`interrupted`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chat<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    #[serde(borrow)]
    pub text: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub interrupted: bool,
}

impl Body for Chat<'_> {
    const KIND: EntryKind = EntryKind::Chat;
}

/// A frontend tool call the agent made (`tool_call`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    #[serde(borrow)]
    pub tool_request_id: Cow<'a, str>,
    #[serde(borrow)]
    pub tool: Cow<'a, str>,
    /// The arguments as JSON text.
    #[serde(borrow)]
    pub args: Cow<'a, str>,
}

impl Body for ToolCall<'_> {
    const KIND: EntryKind = EntryKind::ToolCall;
}

/// The application's answer to a tool call (`tool_result`): its result as
/// JSON text, or the code of its error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    #[serde(borrow)]
    pub tool_request_id: Cow<'a, str>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub result: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub error: Option<Cow<'a, str>>,
}

impl Body for ToolResult<'_> {
    const KIND: EntryKind = EntryKind::ToolResult;
}

/// Agent-side work, settled (`agent_activity`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentActivity<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    /// `activity::kind_name` of the activity's kind.
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    pub summary: String,
    #[serde(default)]
    pub activity: Option<Cow<'a, pb::Activity>>,
}

impl Body for AgentActivity<'_> {
    const KIND: EntryKind = EntryKind::AgentActivity;
}

/// The agent could not call a frontend tool (`tool_failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFailed<'a> {
    #[serde(default, borrow)]
    pub operation_id: Cow<'a, str>,
    #[serde(borrow)]
    pub tool: Cow<'a, str>,
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
}

impl Body for ToolFailed<'_> {
    const KIND: EntryKind = EntryKind::ToolFailed;
}

/// How an operation ended (`operation_completed`): what brings its outcome
/// back after a restart. Entries from before kinds and messages were
/// recorded read as kind unspecified and an empty message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub operation_id: String,
    /// `pb::OperationKind` as its number.
    #[serde(default)]
    pub kind: i32,
    /// The error's code; `None` for success.
    pub error: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// A typed turn's answer (JSON text, valid against its output schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl Body for Completion {
    const KIND: EntryKind = EntryKind::OperationCompleted;
}

impl Completion {
    pub fn of(outcome: &pb::OperationOutcome) -> Self {
        Completion {
            operation_id: outcome.operation_id.clone(),
            kind: outcome.kind,
            error: outcome.error.as_ref().map(|e| e.code.clone()),
            message: outcome.error.as_ref().map(|e| e.message.clone()),
            output: (!outcome.output_json.is_empty()).then(|| outcome.output_json.clone()),
        }
    }

    pub fn outcome(&self) -> pb::OperationOutcome {
        let error = self.error.as_ref().map(|code| pb::Error {
            code: code.clone(),
            message: self.message.clone().unwrap_or_default(),
            details_json: String::new(),
        });
        pb::OperationOutcome {
            operation_id: self.operation_id.clone(),
            kind: self.kind,
            error,
            output_json: self.output.clone().unwrap_or_default(),
        }
    }
}

/// The session ended (`ended`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ended<'a> {
    #[serde(borrow)]
    pub reason: Cow<'a, str>,
}

impl Body for Ended<'_> {
    const KIND: EntryKind = EntryKind::Ended;
}

/// `SetModel` changed the model or effort (`model_changed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelChanged(pub pedelec_protocol::pb::ModelChanged);

impl Body for ModelChanged {
    const KIND: EntryKind = EntryKind::ModelChanged;
}

/// An ended session was resumed (`resumed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resumed {}

impl Body for Resumed {
    const KIND: EntryKind = EntryKind::Resumed;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_kind_reads_back_as_written_and_an_unknown_one_is_kept() {
        for (kind, name) in EntryKind::NAMED {
            assert_eq!(kind.as_str(), name);
            assert_eq!(EntryKind::parse(name), kind);
        }
        assert_eq!(EntryKind::parse("from_a_newer_core"), EntryKind::Other("from_a_newer_core".into()));
        assert_eq!(EntryKind::Other("x".into()).as_str(), "x");
    }

    /// The JSON rows already in users' databases hold: each body reads back
    /// from the text an earlier Core wrote, and writes that text again.
    #[test]
    fn bodies_keep_the_stored_json() {
        fn same<'a, T: Body + Deserialize<'a> + PartialEq + std::fmt::Debug>(stored: &'a str) {
            let body: T = serde_json::from_str(stored).unwrap_or_else(|e| panic!("{stored}: {e}"));
            assert_eq!(serde_json::to_string(&body).unwrap(), stored);
        }
        same::<UserText>(r#"{"operation_id":"op-1","text":"hi"}"#);
        same::<UserText>(r#"{"operation_id":"op-1","text":"hi","attachments":["a.png"]}"#);
        same::<Chat>(r#"{"operation_id":"op-1","text":"hello"}"#);
        same::<Chat>(r#"{"operation_id":"op-1","text":"hel","interrupted":true}"#);
        same::<ToolCall>(r#"{"operation_id":"op-1","tool_request_id":"tr-1","tool":"t","args":"{}"}"#);
        same::<ToolResult>(r#"{"operation_id":"op-1","tool_request_id":"tr-1","result":"{\"n\":1}"}"#);
        same::<ToolResult>(r#"{"operation_id":"op-1","tool_request_id":"tr-1","error":"TOOL_TIMEOUT"}"#);
        same::<ToolFailed>(r#"{"operation_id":"op-1","tool":"t","reason":"no"}"#);
        same::<Completion>(r#"{"operation_id":"op-1","kind":2,"error":"SEND_TEXT_FAILED","message":"m"}"#);
        same::<Completion>(r#"{"operation_id":"op-1","kind":2,"error":null,"message":null}"#);
        same::<Ended>(r#"{"reason":"client"}"#);
        same::<Resumed>("{}");
        let old: Completion = serde_json::from_str(r#"{"operation_id":"op-0","error":null}"#).unwrap();
        assert_eq!((old.kind, old.outcome().error), (0, None), "a row from before kinds were kept");
    }
}
