//! `GetHistory`: a session's transcript entries as the protocol's
//! `HistoryEntry`s. Pure: the store reads the rows, this reads their bodies.

use pedelec_protocol::pb::{self, history_entry::Kind};

use crate::transcript::{
    AgentActivity, Chat, Completion, Ended, EntryKind, ToolCall, ToolFailed, ToolResult, TranscriptEntry, UserText,
};

/// A stored entry as the client sees it; `None` for kinds that are not part
/// of the history (a preparation's prompt), that this Core does not know,
/// or whose body does not read as its kind's.
pub fn entry(id: u64, stored: &TranscriptEntry) -> Option<pb::HistoryEntry> {
    let body = &stored.body;
    let (operation_id, kind) = match &stored.kind {
        EntryKind::UserText => {
            let b: UserText = body.parse()?;
            let text = pb::HistoryText { text: b.text.into(), interrupted: false, attachments: b.attachments.into() };
            (b.operation_id, Kind::UserText(text))
        }
        EntryKind::Chat => {
            let b: Chat = body.parse()?;
            let text = pb::HistoryText { text: b.text.into(), interrupted: b.interrupted, attachments: Vec::new() };
            (b.operation_id, Kind::AssistantMessage(text))
        }
        EntryKind::ToolCall => {
            let b: ToolCall = body.parse()?;
            let call = pb::HistoryToolCall {
                tool_request_id: b.tool_request_id.into(),
                tool: b.tool.into(),
                args_json: b.args.into(),
            };
            (b.operation_id, Kind::ToolCall(call))
        }
        EntryKind::ToolResult => {
            use pb::history_tool_result::Outcome;
            let b: ToolResult = body.parse()?;
            let outcome = match b.result {
                Some(json) => Outcome::ResultJson(json.into()),
                None => Outcome::ErrorCode(b.error.unwrap_or_default().into()),
            };
            let result = pb::HistoryToolResult { tool_request_id: b.tool_request_id.into(), outcome: Some(outcome) };
            (b.operation_id, Kind::ToolResult(result))
        }
        EntryKind::AgentActivity => {
            let b: AgentActivity = body.parse()?;
            let activity = pb::HistoryActivity {
                kind: b.kind.into(),
                summary: b.summary,
                activity: b.activity.map(std::borrow::Cow::into_owned),
            };
            (b.operation_id, Kind::Activity(activity))
        }
        EntryKind::ToolFailed => {
            let b: ToolFailed = body.parse()?;
            (b.operation_id, Kind::ToolFailed(pb::HistoryToolFailed { tool: b.tool.into(), reason: b.reason.into() }))
        }
        EntryKind::OperationCompleted => {
            let outcome = body.parse::<Completion>()?.outcome();
            (outcome.operation_id.clone().into(), Kind::OperationCompleted(outcome))
        }
        EntryKind::Ended => {
            let b: Ended = body.parse()?;
            (Default::default(), Kind::Ended(pb::Ended { reason: b.reason.into() }))
        }
        EntryKind::Resumed => (Default::default(), Kind::Resumed(pb::HistoryResumed {})),
        EntryKind::ModelChanged => {
            let crate::transcript::ModelChanged(changed) = body.parse()?;
            (Default::default(), Kind::ModelChanged(changed))
        }
        EntryKind::Prepare | EntryKind::TurnChanges | EntryKind::Other(_) => return None,
    };
    Some(pb::HistoryEntry {
        id,
        seq: stored.seq,
        at_ms: stored.at_ms,
        operation_id: operation_id.into(),
        kind: Some(kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::EntryBody;

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
