//! History entries in the shape the browser API returns (`getHistory`):
//! plain JSON with a `kind` discriminator and numbers for ids and times, the
//! same for every transport. Pure, so it is tested natively.
//!
//! # Examples
//!
//! ```
//! use pedelec_sdk::history::page_json;
//! use pedelec_sdk::pb::{self, history_entry::Kind};
//!
//! let said = pb::HistoryText { text: "hi".into(), ..Default::default() };
//! let kind = Some(Kind::UserText(said));
//! let entry = pb::HistoryEntry { id: 1, seq: 2, at_ms: 3, operation_id: "op-1".into(), kind };
//! let page = pb::GetHistoryResponse { entries: vec![entry], has_more: false };
//! assert_eq!(
//!     page_json(&page),
//!     serde_json::json!({
//!         "entries": [{ "id": 1, "seq": 2, "at": 3, "operationId": "op-1", "kind": "user_text", "text": "hi" }],
//!         "hasMore": false,
//!     }),
//! );
//! ```

use pedelec_protocol::pb::{self, history_entry::Kind};
use serde_json::{Value, json};

/// One entry: `{ id, seq, at, operationId, kind, … }` with the kind's fields
/// (`text`, `interrupted` when cut short by a cancel; `toolRequestId`, `tool`, `args`; `result` or `errorCode`;
/// `activity`, `summary`; `reason`; `error`).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::history::entry_json;
/// use pedelec_sdk::pb::{self, history_entry::Kind};
///
/// let args_json = r#"{"a":1}"#.into();
/// let call = pb::HistoryToolCall { tool_request_id: "tool-1".into(), tool: "add".into(), args_json };
/// let entry = pb::HistoryEntry { id: 7, seq: 9, kind: Some(Kind::ToolCall(call)), ..Default::default() };
/// let json = entry_json(&entry);
/// assert_eq!(json["kind"], "tool_call");
/// // Arguments come back as JSON, not as the text Core recorded.
/// assert_eq!(json["args"], serde_json::json!({ "a": 1 }));
/// // No operation is `null`, not "".
/// assert!(json["operationId"].is_null());
/// ```
pub fn entry_json(entry: &pb::HistoryEntry) -> Value {
    let mut out = json!({
        "id": entry.id,
        "seq": entry.seq,
        "at": entry.at_ms,
        "operationId": if entry.operation_id.is_empty() { Value::Null } else { json!(entry.operation_id) },
    });
    let (kind, fields) = match &entry.kind {
        Some(Kind::UserText(t)) if !t.attachments.is_empty() => {
            ("user_text", json!({ "text": t.text, "attachments": t.attachments }))
        }
        Some(Kind::UserText(t)) => ("user_text", json!({ "text": t.text })),
        Some(Kind::AssistantMessage(t)) if t.interrupted => {
            ("assistant_message", json!({ "text": t.text, "interrupted": true }))
        }
        Some(Kind::AssistantMessage(t)) => ("assistant_message", json!({ "text": t.text })),
        Some(Kind::ToolCall(c)) => (
            "tool_call",
            json!({ "toolRequestId": c.tool_request_id, "tool": c.tool, "args": parse_or_text(&c.args_json) }),
        ),
        Some(Kind::ToolResult(r)) => {
            let outcome = match &r.outcome {
                Some(pb::history_tool_result::Outcome::ResultJson(j)) => json!({ "result": parse_or_text(j) }),
                Some(pb::history_tool_result::Outcome::ErrorCode(code)) => json!({ "errorCode": code }),
                None => json!({}),
            };
            let mut fields = json!({ "toolRequestId": r.tool_request_id });
            merge(&mut fields, outcome);
            ("tool_result", fields)
        }
        Some(Kind::Activity(a)) => {
            let mut fields = json!({ "activity": a.kind, "summary": a.summary });
            if let Some(detail) = &a.activity {
                fields["detail"] = activity_json(detail);
            }
            ("activity", fields)
        }
        Some(Kind::ToolFailed(f)) => ("tool_failed", json!({ "tool": f.tool, "reason": f.reason })),
        Some(Kind::OperationCompleted(o)) => (
            "operation_completed",
            json!({ "error": o.error.as_ref().map(|e| json!({ "code": e.code, "message": e.message })) }),
        ),
        Some(Kind::Ended(e)) => ("ended", json!({ "reason": e.reason })),
        Some(Kind::Resumed(_)) => ("resumed", json!({})),
        Some(Kind::ModelChanged(m)) => (
            "model_changed",
            json!({ "model": m.model, "effortLevel": pb::EffortLevel::try_from(m.effort_level).ok().and_then(|e| e.seed_str()) }),
        ),
        None => ("unknown", json!({})),
    };
    out["kind"] = json!(kind);
    merge(&mut out, fields);
    out
}

/// An activity as `onActivity` hands it to JS: `{ activityId, kind, title,
/// status, command, paths, output, plan: [{ content, status }] }` with
/// snake_case kinds and statuses (`status` null when it has none).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::history::activity_json;
/// use pedelec_sdk::pb::{Activity, ActivityKind, ActivityStatus};
///
/// let activity = Activity {
///     activity_id: "call-1".into(),
///     kind: ActivityKind::Command as i32,
///     status: ActivityStatus::InProgress as i32,
///     command: "cargo test".into(),
///     ..Default::default()
/// };
/// let json = activity_json(&activity);
/// assert_eq!((json["kind"].as_str(), json["status"].as_str()), (Some("command"), Some("in_progress")));
/// assert_eq!(json["command"], "cargo test");
/// ```
pub fn activity_json(activity: &pb::Activity) -> Value {
    use pedelec_protocol::activity::{kind_name, status_name};
    json!({
        "activityId": activity.activity_id,
        "kind": kind_name(activity.kind),
        "title": activity.title,
        "status": status_name(activity.status),
        "command": activity.command,
        "paths": activity.paths,
        "output": activity.output,
        "plan": activity.plan.iter().map(|e| json!({ "content": e.content, "status": status_name(e.status) })).collect::<Vec<_>>(),
    })
}

/// A permission request as `onPermission` hands it to JS: `{ permissionId,
/// activity, options: [{ optionId, name, kind }], policyOptionId,
/// deadlineAt }`, kinds as `allow_once`, `allow_always`, `reject_once`,
/// `reject_always`.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::history::permission_json;
/// use pedelec_sdk::pb::{PermissionOption, PermissionOptionKind, PermissionRequest};
///
/// let request = PermissionRequest {
///     permission_id: "perm-1".into(),
///     options: vec![PermissionOption {
///         option_id: "allow".into(),
///         name: "Allow once".into(),
///         kind: PermissionOptionKind::AllowOnce as i32,
///     }],
///     deadline_at_ms: 1_700_000_060_000,
///     ..Default::default()
/// };
/// let json = permission_json(&request);
/// assert_eq!(json["options"][0]["kind"], "allow_once");
/// // No policy choice and no activity are `null`.
/// assert!(json["policyOptionId"].is_null() && json["activity"].is_null());
/// ```
pub fn permission_json(request: &pb::PermissionRequest) -> Value {
    let kind = |k: i32| match pb::PermissionOptionKind::try_from(k).unwrap_or(pb::PermissionOptionKind::Unspecified) {
        pb::PermissionOptionKind::AllowOnce => "allow_once",
        pb::PermissionOptionKind::AllowAlways => "allow_always",
        pb::PermissionOptionKind::RejectOnce => "reject_once",
        pb::PermissionOptionKind::RejectAlways => "reject_always",
        pb::PermissionOptionKind::Unspecified => "other",
    };
    json!({
        "permissionId": request.permission_id,
        "activity": request.activity.as_ref().map(activity_json),
        "options": request.options.iter().map(|o| json!({ "optionId": o.option_id, "name": o.name, "kind": kind(o.kind) })).collect::<Vec<_>>(),
        "policyOptionId": if request.policy_option_id.is_empty() { Value::Null } else { json!(request.policy_option_id) },
        "deadlineAt": request.deadline_at_ms,
    })
}

/// `listSessions()`: `[{ sessionId, provider, model, status, createdAt,
/// lastActivityAt }]` in Core's order (newest created first).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::history::sessions_json;
/// use pedelec_sdk::pb::{SessionInfo, SessionStatus, SessionSummary};
///
/// let summary = SessionSummary {
///     session: Some(SessionInfo { session_id: "sess-1".into(), provider: "scripted".into(), ..Default::default() }),
///     status: SessionStatus::Idle as i32,
///     last_activity_at_ms: 5,
/// };
/// let json = sessions_json(&[summary]);
/// assert_eq!(json[0]["sessionId"], "sess-1");
/// assert_eq!(json[0]["status"], "idle");
/// ```
pub fn sessions_json(sessions: &[pb::SessionSummary]) -> Value {
    let one = |s: &pb::SessionSummary| {
        let info = s.session.clone().unwrap_or_default();
        let status = pedelec_protocol::SessionStatus::from_pb(s.status).map(|st| st.as_str()).unwrap_or("unknown");
        json!({
            "sessionId": info.session_id,
            "provider": info.provider,
            "model": info.model,
            "status": status,
            "createdAt": info.created_at_ms,
            "lastActivityAt": s.last_activity_at_ms,
        })
    };
    Value::Array(sessions.iter().map(one).collect())
}

/// A page: `{ entries, hasMore }`.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::history::page_json;
/// use pedelec_sdk::pb::GetHistoryResponse;
///
/// let json = page_json(&GetHistoryResponse { entries: Vec::new(), has_more: true });
/// assert_eq!(json, serde_json::json!({ "entries": [], "hasMore": true }));
/// ```
pub fn page_json(page: &pb::GetHistoryResponse) -> Value {
    json!({ "entries": page.entries.iter().map(entry_json).collect::<Vec<_>>(), "hasMore": page.has_more })
}

/// A turn's changes as `getChanges()` resolves with them (pedelec.d.ts `TurnChanges`).
pub fn changes_json(changes: &pb::GetChangesResponse) -> Value {
    let kind = |k: i32| match pb::ChangeKind::try_from(k) {
        Ok(pb::ChangeKind::Created) => "created",
        Ok(pb::ChangeKind::Modified) => "modified",
        Ok(pb::ChangeKind::Deleted) => "deleted",
        _ => "unspecified",
    };
    let files: Vec<Value> = changes
        .files
        .iter()
        .map(|f| {
            json!({ "path": f.path, "kind": kind(f.kind), "diff": f.diff, "binary": f.binary, "secret": f.secret,
                    "diffTruncated": f.diff_truncated, "size": f.size })
        })
        .collect();
    json!({ "turnId": changes.turn_id, "operationId": changes.operation_id, "files": files,
            "complete": changes.complete, "inProgress": changes.in_progress })
}

/// JSON text as a value; text Core recorded that is not JSON stays a string.
fn parse_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_javascript_shape() {
        let entry = |id: u64, operation: &str, kind: Kind| pb::HistoryEntry {
            id,
            seq: id * 2,
            at_ms: 1_700_000_000_000,
            operation_id: operation.into(),
            kind: Some(kind),
        };
        let page = pb::GetHistoryResponse {
            entries: vec![
                entry(
                    1,
                    "op-1",
                    Kind::UserText(pb::HistoryText { text: "hi".into(), interrupted: false, attachments: vec![] }),
                ),
                entry(
                    2,
                    "op-1",
                    Kind::AssistantMessage(pb::HistoryText {
                        text: "hello".into(),
                        interrupted: false,
                        attachments: vec![],
                    }),
                ),
                entry(
                    3,
                    "op-1",
                    Kind::ToolCall(pb::HistoryToolCall {
                        tool_request_id: "tool-1".into(),
                        tool: "t".into(),
                        args_json: "{\"n\":1}".into(),
                    }),
                ),
                entry(
                    4,
                    "op-1",
                    Kind::ToolResult(pb::HistoryToolResult {
                        tool_request_id: "tool-1".into(),
                        outcome: Some(pb::history_tool_result::Outcome::ResultJson("[1,2]".into())),
                    }),
                ),
                entry(
                    5,
                    "op-1",
                    Kind::ToolResult(pb::HistoryToolResult {
                        tool_request_id: "tool-2".into(),
                        outcome: Some(pb::history_tool_result::Outcome::ErrorCode("TOOL_TIMEOUT".into())),
                    }),
                ),
                entry(
                    6,
                    "op-1",
                    Kind::Activity(pb::HistoryActivity {
                        kind: "command".into(),
                        summary: "ls".into(),
                        activity: None,
                    }),
                ),
                entry(7, "op-1", Kind::ToolFailed(pb::HistoryToolFailed { tool: "t".into(), reason: "no".into() })),
                entry(
                    8,
                    "op-1",
                    Kind::OperationCompleted(pb::OperationOutcome {
                        operation_id: "op-1".into(),
                        kind: 2,
                        error: Some(pb::Error::new(pedelec_protocol::ErrorCode::CoreRestarted, "restarted")),
                        ..Default::default()
                    }),
                ),
                entry(9, "", Kind::Ended(pb::Ended { reason: "requested".into() })),
                entry(10, "", Kind::Resumed(pb::HistoryResumed {})),
            ],
            has_more: true,
        };
        insta::assert_json_snapshot!(page_json(&page));
    }
}
