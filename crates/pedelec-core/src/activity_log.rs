//! The activity log (issue 42): per site, what its sessions did — started
//! and ended, commands the agent ran, files it edited, frontend tools it
//! called, permission requests settled — for the user's control center.
//!
//! The rules, stated once here and sans-IO:
//! - An entry is made from what Core already records or announces: a
//!   session's creation (`registry`), its transcript entries (`ended`,
//!   `resumed`, a settled `agent_activity` of kind command or file edit, a
//!   frontend `tool_call`) and its `PermissionSettled` events. Nothing else
//!   is read, so the log never says more than the session's own history.
//! - Every entry is bounded: its summary at [`MAX_SUMMARY_CHARS`], each
//!   string inside its detail at [`MAX_DETAIL_STRING_CHARS`], at most
//!   [`MAX_DETAIL_PATHS`] paths, and the detail's JSON at
//!   [`MAX_DETAIL_BYTES`] (a larger one becomes `{"clipped":true}`). A log
//!   entry is about 5 KiB at most, whatever the agent produced.
//! - Entries are appended and never changed; the store deletes those older
//!   than the retention (`ended_session_retention_days`).
//! - The log grows no faster than what it reports: apart from a session's
//!   start and a permission's settlement (each needing a session, or an
//!   agent's request in a turn), every entry stands for a transcript entry,
//!   which `max_transcript_bytes` bounds per session; an entry is at most a
//!   few times the size of the smallest transcript entry it stands for.
//! - A page is newest first, `limit` at most [`MAX_ACTIVITY_PAGE`] (export:
//!   [`MAX_ACTIVITY_EXPORT`]); a cursor is one Core handed out
//!   ([`cursor_of`]); anything else is `INVALID_ARGUMENT` naming the field.

use std::borrow::Cow;

use pedelec_protocol::{ErrorCode, limits, pb};
use serde_json::{Value, json};

use crate::error::{CoreError, CoreResult};
use crate::transcript::{AgentActivity, Ended, EntryKind, ToolCall, TranscriptEntry};

/// A summary's most characters: one line in the control center.
pub const MAX_SUMMARY_CHARS: usize = 300;
/// A string inside an entry's detail, at most (a command's output, a tool's
/// arguments): enough to recognise it, never the whole of it.
pub const MAX_DETAIL_STRING_CHARS: usize = 500;
/// Paths kept of one edit (the rest are counted).
pub const MAX_DETAIL_PATHS: usize = 20;
/// An entry's detail JSON, at most.
pub const MAX_DETAIL_BYTES: usize = 4096;
/// Entries in a `ListActivity` page when the request names no limit.
pub const DEFAULT_ACTIVITY_PAGE: u32 = 100;
/// The most entries one `ListActivity` page holds; more is refused.
pub const MAX_ACTIVITY_PAGE: u32 = 1000;
/// The most entries one `ExportActivity` part holds (and its default).
/// At the entry bound that is about 25 MiB of JSON lines.
pub const MAX_ACTIVITY_EXPORT: u32 = 5000;

/// How a cursor starts: `act-<id>`, the id of the last entry handed out.
const CURSOR_PREFIX: &str = "act-";

/// An entry about to be appended (the store numbers it).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    pub origin: String,
    pub session_id: String,
    pub at_ms: i64,
    pub kind: pb::ActivityLogKind,
    pub summary: String,
    /// The detail as JSON text, bounded.
    pub detail_json: String,
    pub read_only: bool,
}

impl NewEntry {
    fn new(
        origin: &str,
        session_id: &str,
        at_ms: i64,
        kind: pb::ActivityLogKind,
        summary: &str,
        detail: Value,
    ) -> Self {
        NewEntry {
            origin: origin.to_owned(),
            session_id: session_id.to_owned(),
            at_ms,
            kind,
            summary: clip(summary.trim(), MAX_SUMMARY_CHARS).into_owned(),
            detail_json: bounded_detail(detail),
            read_only: false,
        }
    }
}

/// The stored spelling of a kind (the `kind` column).
pub fn kind_name(kind: pb::ActivityLogKind) -> &'static str {
    match kind {
        pb::ActivityLogKind::Unspecified => "unspecified",
        pb::ActivityLogKind::SessionStarted => "session_started",
        pb::ActivityLogKind::SessionEnded => "session_ended",
        pb::ActivityLogKind::CommandRun => "command_run",
        pb::ActivityLogKind::FileEdited => "file_edited",
        pb::ActivityLogKind::ToolCalled => "tool_called",
        pb::ActivityLogKind::PermissionAnswered => "permission_answered",
        pb::ActivityLogKind::SessionResumed => "session_resumed",
    }
}

/// Every kind an entry may have (not `Unspecified`).
const KINDS: [pb::ActivityLogKind; 7] = [
    pb::ActivityLogKind::SessionStarted,
    pb::ActivityLogKind::SessionEnded,
    pb::ActivityLogKind::CommandRun,
    pb::ActivityLogKind::FileEdited,
    pb::ActivityLogKind::ToolCalled,
    pb::ActivityLogKind::PermissionAnswered,
    pb::ActivityLogKind::SessionResumed,
];

/// The kind a stored spelling names (unspecified for one a newer Core wrote).
pub fn parse_kind(stored: &str) -> pb::ActivityLogKind {
    KINDS.into_iter().find(|k| kind_name(*k) == stored).unwrap_or(pb::ActivityLogKind::Unspecified)
}

/// A session was created.
pub fn session_started(origin: &str, info: &pb::SessionInfo, workspace: &str) -> NewEntry {
    let model = if info.model.is_empty() { String::new() } else { format!(" ({})", info.model) };
    let fork = if info.forked_from.is_empty() { String::new() } else { format!(", forked from {}", info.forked_from) };
    let mut details = json!({ "provider": info.provider, "model": info.model, "workspace": workspace });
    if !info.forked_from.is_empty() {
        details["forkedFrom"] = json!(info.forked_from);
    }
    NewEntry::new(
        origin,
        &info.session_id,
        info.created_at_ms,
        pb::ActivityLogKind::SessionStarted,
        &format!("started {}{model} in {workspace}{fork}", info.provider),
        details,
    )
}

/// The entry a transcript entry makes, if any. `read_only` says whether a
/// frontend tool of that name is marked read-only (`read_only_hint`).
pub fn of_transcript(
    origin: &str,
    session_id: &str,
    entry: &TranscriptEntry,
    read_only: impl FnOnce(&str) -> bool,
) -> Option<NewEntry> {
    let at = entry.at_ms;
    match entry.kind {
        EntryKind::Ended => {
            let body: Ended = entry.body.parse()?;
            Some(NewEntry::new(
                origin,
                session_id,
                at,
                pb::ActivityLogKind::SessionEnded,
                &format!("ended ({})", body.reason),
                json!({ "reason": body.reason }),
            ))
        }
        EntryKind::Resumed => {
            Some(NewEntry::new(origin, session_id, at, pb::ActivityLogKind::SessionResumed, "resumed", json!({})))
        }
        EntryKind::ToolCall => {
            let body: ToolCall = entry.body.parse()?;
            let mut out = NewEntry::new(
                origin,
                session_id,
                at,
                pb::ActivityLogKind::ToolCalled,
                &format!("called {}", body.tool),
                json!({
                    "tool": body.tool,
                    "toolRequestId": body.tool_request_id,
                    "args": clip(&body.args, MAX_DETAIL_STRING_CHARS),
                }),
            );
            out.read_only = read_only(&body.tool);
            Some(out)
        }
        EntryKind::AgentActivity => {
            let body: AgentActivity = entry.body.parse()?;
            let activity = body.activity?;
            of_agent_activity(origin, session_id, at, &activity)
        }
        _ => None,
    }
}

/// A settled command or file edit of the agent's.
fn of_agent_activity(origin: &str, session_id: &str, at: i64, activity: &pb::Activity) -> Option<NewEntry> {
    let status = pedelec_protocol::activity::status_name(activity.status).unwrap_or("reported");
    match pb::ActivityKind::try_from(activity.kind).ok()? {
        pb::ActivityKind::Command => {
            let command = if activity.command.is_empty() { &activity.title } else { &activity.command };
            Some(NewEntry::new(
                origin,
                session_id,
                at,
                pb::ActivityLogKind::CommandRun,
                &format!("ran {command} ({status})"),
                json!({
                    "command": clip(command, MAX_DETAIL_STRING_CHARS),
                    "title": clip(&activity.title, MAX_DETAIL_STRING_CHARS),
                    "status": status,
                    "output": clip(&activity.output, MAX_DETAIL_STRING_CHARS),
                }),
            ))
        }
        pb::ActivityKind::FileEdit => {
            let paths: Vec<Cow<str>> =
                activity.paths.iter().take(MAX_DETAIL_PATHS).map(|p| clip(p, MAX_DETAIL_STRING_CHARS)).collect();
            let what = if paths.is_empty() { activity.title.clone() } else { paths.join(", ") };
            Some(NewEntry::new(
                origin,
                session_id,
                at,
                pb::ActivityLogKind::FileEdited,
                &format!("edited {what} ({status})"),
                json!({
                    "paths": paths,
                    "pathCount": activity.paths.len(),
                    "title": clip(&activity.title, MAX_DETAIL_STRING_CHARS),
                    "status": status,
                }),
            ))
        }
        _ => None,
    }
}

/// A permission request settled. `request` is the request as it was asked
/// (`None` if the shell no longer knows it).
pub fn permission_settled(
    origin: &str,
    session_id: &str,
    at_ms: i64,
    request: Option<&pb::PermissionRequest>,
    settled: &pb::PermissionSettled,
) -> NewEntry {
    let option = request.and_then(|r| r.options.iter().find(|o| o.option_id == settled.option_id));
    let granted = option.is_some_and(|o| {
        matches!(
            pb::PermissionOptionKind::try_from(o.kind),
            Ok(pb::PermissionOptionKind::AllowOnce | pb::PermissionOptionKind::AllowAlways)
        )
    });
    let about = request.and_then(|r| r.activity.as_ref());
    let what = about.map(|a| {
        if !a.command.is_empty() {
            a.command.clone()
        } else if !a.paths.is_empty() {
            a.paths.join(", ")
        } else {
            a.title.clone()
        }
    });
    let what = what.filter(|w| !w.is_empty()).unwrap_or_else(|| settled.permission_id.clone());
    let answer = match (settled.reason.as_str(), granted) {
        ("answered", true) => format!("granted ({})", settled.option_id),
        ("answered", false) if settled.option_id.is_empty() => "rejected".to_owned(),
        ("answered", false) => format!("denied ({})", settled.option_id),
        ("timeout", _) => "timed out".to_owned(),
        (other, _) => other.to_owned(),
    };
    let kind = about.map_or("other", |a| pedelec_protocol::activity::kind_name(a.kind));
    NewEntry::new(
        origin,
        session_id,
        at_ms,
        pb::ActivityLogKind::PermissionAnswered,
        &format!("permission {answer}: {what}"),
        json!({
            "permissionId": settled.permission_id,
            "optionId": settled.option_id,
            "granted": granted,
            "reason": settled.reason,
            "about": kind,
            "what": clip(&what, MAX_DETAIL_STRING_CHARS),
            "userOnly": request.is_some_and(|r| r.user_only),
        }),
    )
}

/// What a `ListActivity` or `ExportActivity` request asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Only this origin's entries.
    pub origin: Option<String>,
    /// Only entries numbered below this (the cursor).
    pub before_id: Option<i64>,
    /// Entries to return (at least one).
    pub limit: u32,
}

impl Query {
    /// Checks a request's fields: `limit` 0 means `default`, over `max` is
    /// refused; `cursor` must be one [`cursor_of`] made; `origin` must look
    /// like an origin. Each refusal is `INVALID_ARGUMENT` with `field`.
    pub fn check(origin: &str, cursor: &str, limit: u32, default: u32, max: u32) -> CoreResult<Query> {
        let refuse = |field: &str, message: String| {
            Err(CoreError::with_details(ErrorCode::InvalidArgument, message, json!({ "field": field })))
        };
        if limit > max {
            return refuse("limit", format!("limit {limit} is over {max}"));
        }
        let origin = match origin {
            "" => None,
            origin if origin_problem(origin).is_some() => {
                let problem = origin_problem(origin).unwrap_or_default();
                return refuse("origin", format!("origin filter is not an origin: {problem}"));
            }
            origin => Some(origin.to_owned()),
        };
        let before_id = match cursor {
            "" => None,
            cursor => match parse_cursor(cursor) {
                Some(id) => Some(id),
                None => return refuse("cursor", "cursor is not one Core handed out".to_owned()),
            },
        };
        Ok(Query { origin, before_id, limit: if limit == 0 { default } else { limit } })
    }
}

/// Why `origin` cannot be an origin, if it cannot.
fn origin_problem(origin: &str) -> Option<&'static str> {
    if origin.len() > limits::MAX_ORIGIN_LEN {
        return Some("over 512 bytes");
    }
    if origin.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("it holds control characters or spaces");
    }
    let scheme = origin.split_once(':').map(|(scheme, _)| scheme).unwrap_or_default();
    let scheme_ok = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Some("it has no scheme (`https://…`, `app:…`)");
    }
    None
}

/// The cursor of the page after one whose last (oldest) entry is `id`.
pub fn cursor_of(id: u64) -> String {
    format!("{CURSOR_PREFIX}{id}")
}

fn parse_cursor(cursor: &str) -> Option<i64> {
    let digits = cursor.strip_prefix(CURSOR_PREFIX)?;
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0')
    {
        return None;
    }
    digits.parse::<i64>().ok().filter(|id| *id > 0)
}

/// `text` cut to `max` characters, with "…" when cut.
fn clip(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some(_) => {
            let cut = text.char_indices().nth(max.saturating_sub(1)).map_or(text.len(), |(i, _)| i);
            Cow::Owned(format!("{}…", &text[..cut]))
        }
    }
}

/// `detail` as JSON text of at most [`MAX_DETAIL_BYTES`].
fn bounded_detail(detail: Value) -> String {
    let text = detail.to_string();
    if text.len() <= MAX_DETAIL_BYTES { text } else { json!({ "clipped": true, "bytes": text.len() }).to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Body;

    fn entry(body: &impl Body) -> TranscriptEntry {
        let (kind, body) = body.encode();
        TranscriptEntry { seq: 3, at_ms: 1_000, kind, body }
    }

    fn activity(kind: pb::ActivityKind, command: &str, paths: &[&str]) -> pb::Activity {
        pb::Activity {
            activity_id: "a-1".into(),
            kind: kind as i32,
            title: "Work".into(),
            status: pb::ActivityStatus::Completed as i32,
            command: command.into(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            output: "x".repeat(10_000),
            plan: Vec::new(),
        }
    }

    fn of(entry: &TranscriptEntry) -> Option<NewEntry> {
        of_transcript("https://site.example", "sess-1", entry, |tool| tool == "read_page")
    }

    #[test]
    fn commands_edits_tool_calls_and_ends_make_entries_and_other_entries_none() {
        let command = activity(pb::ActivityKind::Command, "cargo test", &[]);
        let made = of(&entry(&AgentActivity {
            operation_id: "op-1".into(),
            kind: "command".into(),
            summary: String::new(),
            activity: Some(Cow::Owned(command)),
        }))
        .unwrap();
        assert_eq!(made.kind, pb::ActivityLogKind::CommandRun);
        assert_eq!(made.summary, "ran cargo test (completed)");
        assert!(made.detail_json.len() <= MAX_DETAIL_BYTES, "the command's output was clipped");
        let detail: Value = serde_json::from_str(&made.detail_json).unwrap();
        assert_eq!(detail["output"].as_str().unwrap().chars().count(), MAX_DETAIL_STRING_CHARS);

        let edit = activity(pb::ActivityKind::FileEdit, "", &["src/a.rs", "src/b.rs"]);
        let made = of(&entry(&AgentActivity {
            operation_id: "op-1".into(),
            kind: "file_edit".into(),
            summary: String::new(),
            activity: Some(Cow::Owned(edit)),
        }))
        .unwrap();
        assert_eq!(
            (made.kind, made.summary.as_str()),
            (pb::ActivityLogKind::FileEdited, "edited src/a.rs, src/b.rs (completed)")
        );

        let read = activity(pb::ActivityKind::FileRead, "", &["src/a.rs"]);
        let not_logged = AgentActivity {
            operation_id: "op-1".into(),
            kind: "file_read".into(),
            summary: String::new(),
            activity: Some(Cow::Owned(read)),
        };
        assert_eq!(of(&entry(&not_logged)), None, "reads are not in the log");

        let call = |tool: &str| ToolCall {
            operation_id: "op-1".into(),
            tool_request_id: "tr-1".into(),
            tool: tool.to_owned().into(),
            args: "{\"q\":1}".into(),
        };
        let made = of(&entry(&call("read_page"))).unwrap();
        assert_eq!(
            (made.kind, made.read_only, made.summary.as_str()),
            (pb::ActivityLogKind::ToolCalled, true, "called read_page")
        );
        assert!(!of(&entry(&call("write_page"))).unwrap().read_only);

        let ended = of(&entry(&Ended { reason: "client".into() })).unwrap();
        assert_eq!(
            (ended.kind, ended.at_ms, ended.origin.as_str()),
            (pb::ActivityLogKind::SessionEnded, 1_000, "https://site.example")
        );
        let chat = crate::transcript::Chat { operation_id: "op-1".into(), text: "hi".into(), interrupted: false };
        assert_eq!(of(&entry(&chat)), None);
    }

    #[test]
    fn a_permission_answer_says_what_was_asked_and_whether_it_was_granted() {
        let option = |id: &str, kind: pb::PermissionOptionKind| pb::PermissionOption {
            option_id: id.into(),
            name: id.into(),
            kind: kind as i32,
        };
        let request = pb::PermissionRequest {
            permission_id: "perm-1".into(),
            activity: Some(activity(pb::ActivityKind::Command, "rm -rf build", &[])),
            options: vec![
                option("allow", pb::PermissionOptionKind::AllowOnce),
                option("deny", pb::PermissionOptionKind::RejectOnce),
            ],
            ..Default::default()
        };
        let settled = |option: &str, reason: &str| pb::PermissionSettled {
            permission_id: "perm-1".into(),
            option_id: option.into(),
            reason: reason.into(),
        };
        let granted = permission_settled("app:x", "sess-1", 5, Some(&request), &settled("allow", "answered"));
        assert_eq!(granted.summary, "permission granted (allow): rm -rf build");
        assert_eq!(serde_json::from_str::<Value>(&granted.detail_json).unwrap()["granted"], true);
        let denied = permission_settled("app:x", "sess-1", 5, Some(&request), &settled("deny", "answered"));
        assert_eq!(denied.summary, "permission denied (deny): rm -rf build");
        let late = permission_settled("app:x", "sess-1", 5, None, &settled("", "timeout"));
        assert_eq!(late.summary, "permission timed out: perm-1");
    }

    #[test]
    fn a_huge_summary_is_clipped_and_a_huge_detail_replaced() {
        let long = "é".repeat(5_000);
        let made = NewEntry::new("app:x", "s", 0, pb::ActivityLogKind::CommandRun, &long, json!({ "a": long.clone() }));
        assert_eq!(made.summary.chars().count(), MAX_SUMMARY_CHARS);
        assert!(made.summary.ends_with('…'));
        assert_eq!(serde_json::from_str::<Value>(&made.detail_json).unwrap()["clipped"], true);
    }

    #[test]
    fn queries_take_their_defaults_and_refuse_what_core_never_handed_out() {
        let ok = Query::check("", "", 0, 100, 1000).unwrap();
        assert_eq!(ok, Query { origin: None, before_id: None, limit: 100 });
        let paged = Query::check("https://a.example", &cursor_of(42), 7, 100, 1000).unwrap();
        assert_eq!(paged, Query { origin: Some("https://a.example".into()), before_id: Some(42), limit: 7 });
        let field = |e: CoreError| e.to_pb().details_json;
        for (origin, cursor, limit, named) in [
            ("", "", 1001, "limit"),
            ("", "", u32::MAX, "limit"),
            ("", "42", 0, "cursor"),
            ("", "act-", 0, "cursor"),
            ("", "act-0", 0, "cursor"),
            ("", "act-007", 0, "cursor"),
            ("", "act-99999999999999999999", 0, "cursor"),
            ("", "act--1", 0, "cursor"),
            ("no scheme", "", 0, "origin"),
            ("https://a.example\n", "", 0, "origin"),
            ("://a", "", 0, "origin"),
        ] {
            let refused = Query::check(origin, cursor, limit, 100, 1000).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::InvalidArgument);
            assert!(field(refused).contains(named), "{origin:?} {cursor:?} {limit}");
        }
        let long = format!("https://{}", "a".repeat(600));
        assert!(Query::check(&long, "", 0, 100, 1000).is_err());
    }

    #[test]
    fn every_kind_reads_back_as_stored() {
        for kind in KINDS {
            assert_eq!(parse_kind(kind_name(kind)), kind);
        }
        assert_eq!(parse_kind("from_a_newer_core"), pb::ActivityLogKind::Unspecified);
    }
}
