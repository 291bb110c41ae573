//! `GetHistory`: a session's transcript entries as the protocol's
//! `HistoryEntry`s. Pure: the store reads the rows, this reads their bodies.

use pedelec_protocol::pb::{self, history_entry::Kind};

use crate::session::outcome::outcome_from_entry;
use crate::store::{EntryKind, TranscriptEntry};

/// A stored entry as the client sees it; `None` for kinds that are not part
/// of the history (a preparation's prompt) or that this Core does not know.
pub fn entry(id: u64, stored: &TranscriptEntry) -> Option<pb::HistoryEntry> {
    let body = &stored.body.json();
    let text = |key: &str| body.get(key).and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    let kind = match &stored.kind {
        EntryKind::UserText => Kind::UserText(pb::HistoryText {
            text: text("text"),
            interrupted: false,
            attachments: body
                .get("attachments")
                .and_then(serde_json::Value::as_array)
                .map(|paths| paths.iter().filter_map(serde_json::Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default(),
        }),
        EntryKind::Chat => Kind::AssistantMessage(pb::HistoryText {
            text: text("text"),
            interrupted: body.get("interrupted").and_then(serde_json::Value::as_bool).unwrap_or(false),
            attachments: Vec::new(),
        }),
        EntryKind::ToolCall => Kind::ToolCall(pb::HistoryToolCall {
            tool_request_id: text("tool_request_id"),
            tool: text("tool"),
            args_json: text("args"),
        }),
        EntryKind::ToolResult => {
            use pb::history_tool_result::Outcome;
            let outcome = match body.get("result").and_then(serde_json::Value::as_str) {
                Some(json) => Outcome::ResultJson(json.to_owned()),
                None => Outcome::ErrorCode(text("error")),
            };
            Kind::ToolResult(pb::HistoryToolResult { tool_request_id: text("tool_request_id"), outcome: Some(outcome) })
        }
        EntryKind::AgentActivity => Kind::Activity(pb::HistoryActivity {
            kind: text("kind"),
            summary: text("summary"),
            activity: body.get("activity").and_then(|a| serde_json::from_value(a.clone()).ok()),
        }),
        EntryKind::ToolFailed => Kind::ToolFailed(pb::HistoryToolFailed { tool: text("tool"), reason: text("reason") }),
        EntryKind::OperationCompleted => Kind::OperationCompleted(outcome_from_entry(body)?),
        EntryKind::Ended => Kind::Ended(pb::Ended { reason: text("reason") }),
        EntryKind::Resumed => Kind::Resumed(pb::HistoryResumed {}),
        EntryKind::Prepare | EntryKind::Other(_) => return None,
    };
    Some(pb::HistoryEntry {
        id,
        seq: stored.seq,
        at_ms: stored.at_ms,
        operation_id: text("operation_id"),
        kind: Some(kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EntryBody;

    fn stored(kind: &str, body: serde_json::Value) -> TranscriptEntry {
        TranscriptEntry { seq: 7, at_ms: 1, kind: EntryKind::parse(kind), body: EntryBody::new(&body) }
    }

    #[test]
    fn every_recorded_kind_reads_back_and_preparation_stays_hidden() {
        let rows = [
            stored("user_text", serde_json::json!({ "operation_id": "op-1", "text": "hi" })),
            stored("prepare", serde_json::json!({ "operation_id": "op-0", "text": "Reply with …" })),
            stored("chat", serde_json::json!({ "operation_id": "op-1", "text": "hello" })),
            stored(
                "tool_call",
                serde_json::json!({ "operation_id": "op-1", "tool_request_id": "tool-1", "tool": "t", "args": "{}" }),
            ),
            stored(
                "tool_result",
                serde_json::json!({ "operation_id": "op-1", "tool_request_id": "tool-1", "result": "{\"n\":1}" }),
            ),
            stored("tool_result", serde_json::json!({ "tool_request_id": "tool-2", "error": "TOOL_HANDLER_ERROR" })),
            stored("agent_activity", serde_json::json!({ "operation_id": "op-1", "kind": "command", "summary": "ls" })),
            stored("tool_failed", serde_json::json!({ "operation_id": "op-1", "tool": "t", "reason": "refused" })),
            stored("operation_completed", serde_json::json!({ "operation_id": "op-1", "kind": 2, "error": null })),
            stored("ended", serde_json::json!({ "reason": "requested" })),
            stored("resumed", serde_json::json!({})),
            stored("from_a_newer_core", serde_json::json!({})),
        ];
        let entries: Vec<pb::HistoryEntry> =
            rows.iter().enumerate().filter_map(|(i, row)| entry(i as u64 + 1, row)).collect();
        let page = pb::GetHistoryResponse { entries, has_more: false };
        let json: serde_json::Value = serde_json::from_str(&pedelec_protocol::json::to_json(&page)).unwrap();
        insta::assert_json_snapshot!(json);
    }
}
