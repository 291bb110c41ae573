//! The session machine's rules, tested without sockets, tasks or sleeps:
//! each test feeds inputs with explicit times and reads the effects.

use std::time::{Duration, Instant};

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, OperationId, SessionStatus, ToolRequestId, TurnId, limits};

use super::machine::{Effect, Identity, Now, SEQ_RESERVATION, SessionState, Start};
use crate::providers::ProviderFailure;
use crate::store::SessionRecord;

fn identity(auto_end: bool) -> Identity {
    Identity {
        id: "sess-1".into(),
        origin: "https://app.example".into(),
        info: pb::SessionInfo {
            session_id: "sess-1".into(),
            provider: "scripted".into(),
            model: "m".into(),
            created_at_ms: 1_000,
            auto_end_on_disconnect: auto_end,
            ..Default::default()
        },
        workspace: "/w".into(),
        managed_workspace: true,
        tool_token_digest: crate::tool_token::ToolTokenDigest::of("token"),
        fork_of: None,
    }
}

fn t0() -> Now {
    Now { instant: Instant::now(), epoch_ms: 1_700_000_000_000 }
}

fn op(n: u32) -> OperationId {
    OperationId::new(format!("op-{n}"))
}

fn ids(n: u32) -> (OperationId, TurnId) {
    (op(n), TurnId::new(format!("turn-{n}")))
}

fn tool_ok(_: &str, _: &str) -> Result<Duration, pb::Error> {
    Ok(Duration::from_secs(60))
}

/// One line per effect, for assertions and snapshots.
fn render(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|effect| match effect {
            Effect::Emit(e) => {
                let kind = match e.kind.as_ref().expect("every event has a kind") {
                    Kind::StatusChanged(s) => format!(
                        "status {} -> {}",
                        SessionStatus::from_pb(s.previous).map_or("?", |s| s.as_str()),
                        SessionStatus::from_pb(s.status).map_or("?", |s| s.as_str())
                    ),
                    Kind::OperationStarted(_) => "operation_started".into(),
                    Kind::Chat(c) => format!("chat {:?}", c.text),
                    Kind::ChatDelta(c) => format!("delta {:?}", c.text),
                    Kind::ToolCall(c) => format!("tool_call {} {}", c.tool_request_id, c.tool),
                    Kind::ToolCallSettled(s) => format!("tool_settled {} {:?}", s.tool_request_id, s.code),
                    Kind::UsageUpdated(u) => format!("usage {:?}", u.usage.and_then(|u| u.total_tokens)),
                    Kind::Error(e) => format!("error {}", e.error.as_ref().map_or("", |e| e.code.as_str())),
                    Kind::OperationCompleted(c) => {
                        format!("completed {}", c.error.as_ref().map_or("ok", |e| e.code.as_str()))
                    }
                    Kind::Ended(e) => format!("ended {}", e.reason),
                    Kind::PermissionRequested(p) => format!("permission_requested {}", p.permission_id),
                    Kind::PermissionSettled(p) => {
                        format!("permission_settled {} {:?} {}", p.permission_id, p.option_id, p.reason)
                    }
                    Kind::ActivityUpdated(a) => {
                        let a = a.activity.clone().unwrap_or_default();
                        format!("activity {} {}", a.activity_id, pedelec_protocol::activity::summary(&a))
                    }
                    Kind::Snapshot(_) => "snapshot".into(),
                    Kind::ModelChanged(m) => format!("model_changed {} {}", m.model, m.effort_level),
                };
                format!("emit #{} [{}] {kind}", e.seq, e.operation_id)
            }
            Effect::Append(entry) => format!("append #{} {}", entry.seq, entry.kind),
            Effect::Save(record) => {
                format!("save {} active={:?}", record.status, record.active_operation.as_deref().unwrap_or("-"))
            }
            Effect::AnswerTool { request, answer } => match answer {
                Ok(json) => format!("answer {request} {json}"),
                Err(e) => format!("answer {request} error {}", e.code),
            },
            Effect::StopTurn(op) => format!("stop {op}"),
            Effect::CancelTurn(op) => format!("cancel {op}"),
            Effect::AnswerPermission { permission_id, answer } => {
                format!("answer_permission {permission_id} {answer:?}")
            }
            Effect::ArmDisconnectTimer { epoch } => format!("arm_disconnect {epoch}"),
        })
        .collect()
}

fn begin(m: &mut SessionState, kind: pb::OperationKind, n: u32, out: &mut Vec<Effect>) -> Start {
    m.begin(kind, "hello".into(), ids(n), t0(), out).expect("may start")
}

/// A `SendText` begun and announced.
fn running(m: &mut SessionState, n: u32) -> OperationId {
    let mut out = Vec::new();
    begin(m, pb::OperationKind::SendText, n, &mut out);
    m.announce(&op(n), t0(), &mut out).expect("announces");
    op(n)
}

fn call(m: &mut SessionState, operation: &OperationId, request: &str, now: Now) -> Vec<Effect> {
    let mut out = Vec::new();
    m.call_tool(Some(operation), "getState", "{}".into(), tool_ok, ToolRequestId::new(request), now, &mut out)
        .expect("the call is registered");
    out
}

fn finish(m: &mut SessionState, operation: &OperationId, result: Result<(), ProviderFailure>) -> Vec<Effect> {
    let mut out = Vec::new();
    m.finish(operation, result, t0(), &mut out).expect("the operation was running");
    m.completion_committed(operation, t0(), &mut out);
    out
}

fn code(error: crate::error::CoreError) -> ErrorCode {
    error.code()
}

fn snapshot(m: &SessionState) -> pb::Snapshot {
    match m.snapshot(t0()).kind {
        Some(Kind::Snapshot(s)) => s,
        other => panic!("not a snapshot: {other:?}"),
    }
}

#[test]
fn a_tool_turn_from_start_to_completion() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    let start = begin(&mut m, pb::OperationKind::SendText, 1, &mut out);
    assert!(matches!(start, Start::New(ref b) if b.operation == op(1) && b.text == "hello"));
    m.announce(&op(1), t0(), &mut out).unwrap();
    m.delta(&op(1), "Hel", t0(), &mut out);
    m.message(&op(1), "Hello", t0(), &mut out);
    m.usage_reported(&op(1), 12, t0(), &mut out);
    out.extend(call(&mut m, &op(1), "tool-1", t0()));
    let result = pb::SubmitToolResultRequest {
        tool_request_id: "tool-1".into(),
        outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson("{\"n\":1}".into())),
        ..Default::default()
    };
    m.submit_tool_result(result, t0(), &mut out).unwrap();
    out.extend(finish(&mut m, &op(1), Ok(())));
    insta::assert_snapshot!(render(&out).join("\n"));
    assert_eq!(m.status(), SessionStatus::Idle);
    let snap = snapshot(&m);
    assert_eq!(snap.recent_outcomes.len(), 1);
    assert!(snap.active_operation.is_none() && snap.pending_tools.is_empty());
}

#[test]
fn starting_is_refused_with_the_seed_codes_and_changes_nothing() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    let big = "x".repeat(limits::MAX_TEXT_BYTES + 1);
    let refused = m.begin(pb::OperationKind::SendText, big, ids(1), t0(), &mut out).unwrap_err();
    assert_eq!(code(refused), ErrorCode::TextTooLarge);
    running(&mut m, 2);
    let busy = m.begin(pb::OperationKind::SendText, "again".into(), ids(3), t0(), &mut out).unwrap_err();
    assert_eq!(code(busy), ErrorCode::SessionBusy);
    let busy = m.begin(pb::OperationKind::Prepare, String::new(), ids(4), t0(), &mut out).unwrap_err();
    assert_eq!(code(busy), ErrorCode::SessionBusy, "a preparation does not start beside a user turn");
    assert!(out.is_empty(), "a refusal has no effect: {:?}", render(&out));
    m.finish(&op(2), Err(ProviderFailure::crashed("gone")), t0(), &mut out).unwrap();
    m.completion_committed(&op(2), t0(), &mut out);
    assert_eq!(m.status(), SessionStatus::Error);
    let error = m.begin(pb::OperationKind::SendText, "x".into(), ids(5), t0(), &mut out).unwrap_err();
    assert_eq!(code(error), ErrorCode::SessionError);
    m.end("requested", t0(), &mut out).unwrap();
    let ended = m.begin(pb::OperationKind::Prepare, String::new(), ids(6), t0(), &mut out).unwrap_err();
    assert_eq!(code(ended), ErrorCode::SessionEnded);
}

#[test]
fn the_next_operation_is_refused_until_the_completion_is_committed() {
    let mut m = SessionState::new(identity(false));
    running(&mut m, 1);
    let mut out = Vec::new();
    let committed = m.finish(&op(1), Ok(()), t0(), &mut out).unwrap();
    assert_eq!(committed.status, SessionStatus::Idle, "what is committed is the state after the completion");
    assert_eq!(m.status(), SessionStatus::Running, "the status moves only when the completion is announced");
    assert!(!render(&out).iter().any(|l| l.contains("] completed")), "not announced before it is durable");
    assert!(!render(&out).iter().any(|l| l.contains("-> idle")), "nor is idle");
    assert!(snapshot(&m).recent_outcomes.is_empty(), "nor reported by snapshots");
    assert_eq!(m.record().active_operation, None, "the record being committed no longer has it active");
    let busy = m.begin(pb::OperationKind::SendText, "x".into(), ids(2), t0(), &mut out).unwrap_err();
    assert_eq!(code(busy), ErrorCode::SessionBusy);
    m.completion_committed(&op(1), t0(), &mut out);
    assert!(render(&out).last().unwrap().ends_with("completed ok"));
    assert!(m.begin(pb::OperationKind::SendText, "x".into(), ids(2), t0(), &mut out).is_ok());
}

/// Issue 40: a client that sends its next text as soon as it sees `idle`
/// must be accepted. Every way an operation ends is played; after each step
/// whose effects say `-> idle`, a new `SendText` must start. The effects of a
/// step reach subscribers only after it, under the same lock, so the state
/// after the step is the one such a client meets.
#[test]
fn idle_is_announced_only_with_the_operation_released() {
    type Ending = fn(&mut SessionState, &OperationId, &mut Vec<Effect>);
    let endings: [(&str, Ending); 5] = [
        ("success", |m, o, out| {
            m.finish(o, Ok(()), t0(), out).unwrap();
        }),
        ("turn failure", |m, o, out| {
            m.finish(o, Err(ProviderFailure::turn("no")), t0(), out).unwrap();
        }),
        ("cancel", |m, o, out| {
            m.cancel(Some(o), t0(), out).unwrap();
            m.finish(o, Ok(()), t0(), out).unwrap();
        }),
        ("after a tool wait", |m, o, out| {
            out.extend(call(m, o, "tool-1", t0()));
            m.finish(o, Ok(()), t0(), out).unwrap();
        }),
        ("completion not committed", |m, o, out| {
            m.finish(o, Ok(()), t0(), out).unwrap();
            let lines = render(out);
            assert!(!lines.iter().any(|l| l.contains("-> idle")), "idle before the release: {lines:?}");
            m.completion_not_committed(o, "disk full", t0(), out);
        }),
    ];
    for (name, ending) in endings {
        let mut m = SessionState::new(identity(false));
        let operation = running(&mut m, 1);
        let mut out = Vec::new();
        ending(&mut m, &operation, &mut out);
        let lines = render(&out);
        if lines.iter().any(|l| l.contains("-> idle")) {
            let next = m.begin(pb::OperationKind::SendText, "next".into(), ids(2), t0(), &mut Vec::new());
            assert!(next.is_ok(), "{name}: idle was announced with the operation still held: {lines:?}");
            continue;
        }
        out.clear();
        m.completion_committed(&operation, t0(), &mut out);
        let lines: Vec<String> = render(&out).into_iter().filter(|l| l.starts_with("emit")).collect();
        let n = lines.len();
        assert!(n >= 2, "{name}: {lines:?}");
        assert!(lines[n - 2].ends_with(&format!("[{operation}] status running -> idle")), "{name}: {lines:?}");
        assert!(lines[n - 1].contains(&format!("[{operation}] completed")), "{name}: {lines:?}");
        let next = m.begin(pb::OperationKind::SendText, "next".into(), ids(2), t0(), &mut Vec::new());
        assert!(next.is_ok(), "{name}: idle was announced with the operation still held");
    }
}

/// An `End` while a completion is being committed announces what the turn
/// left, in the documented order: its status, its completion, then the end.
#[test]
fn an_end_while_the_completion_is_committed_announces_it_in_order() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.finish(&operation, Ok(()), t0(), &mut out).unwrap();
    out.clear();
    m.end("requested", t0(), &mut out).unwrap();
    let lines: Vec<String> = render(&out).into_iter().filter(|l| l.starts_with("emit")).collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l.split("] ").nth(1).unwrap()).collect();
    assert_eq!(kinds, ["status running -> idle", "completed ok", "status idle -> ended", "ended requested"]);
}

#[test]
fn preparation_is_idempotent_and_its_text_is_hidden() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    let Start::New(begun) = begin(&mut m, pb::OperationKind::Prepare, 1, &mut out) else { panic!("new") };
    assert_eq!(begun.turn_kind, pb::TurnKind::Prepare);
    let again = begin(&mut m, pb::OperationKind::Prepare, 2, &mut out);
    assert_eq!(again, Start::Existing(super::machine::accepted(&op(1), pb::OperationKind::Prepare, false)));
    m.announce(&op(1), t0(), &mut out).unwrap();
    out.clear();
    m.delta(&op(1), "PEDELEC_", t0(), &mut out);
    m.message(&op(1), "PEDELEC_PREPARED", t0(), &mut out);
    assert!(out.is_empty(), "preparation text never reaches events or the transcript: {:?}", render(&out));
    finish(&mut m, &op(1), Ok(()));
    assert!(m.prepared());
    let done = begin(&mut m, pb::OperationKind::Prepare, 3, &mut out);
    assert!(matches!(done, Start::Existing(a) if a.already_done && a.operation_id.is_empty()));
}

#[test]
fn a_preparation_without_the_acknowledgement_fails() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    begin(&mut m, pb::OperationKind::Prepare, 1, &mut out);
    m.announce(&op(1), t0(), &mut out).unwrap();
    m.message(&op(1), "I'd rather not.", t0(), &mut out);
    let out = finish(&mut m, &op(1), Ok(()));
    let lines = render(&out);
    assert!(lines.iter().any(|l| l.ends_with("error PREPARE_FAILED")), "{lines:?}");
    assert!(lines.last().unwrap().ends_with("completed PREPARE_FAILED"), "{lines:?}");
    assert!(!m.prepared());
    assert_eq!(m.status(), SessionStatus::Idle);
}

#[test]
fn provider_failures_map_to_operation_codes_and_fatal_ones_to_the_error_status() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let out = finish(&mut m, &operation, Err(ProviderFailure::turn("model said no")));
    assert!(render(&out).last().unwrap().ends_with("completed SEND_TEXT_FAILED"));
    let outcome = snapshot(&m).recent_outcomes.pop().unwrap();
    let details: serde_json::Value = serde_json::from_str(&outcome.error.unwrap().details_json).unwrap();
    assert_eq!(details["providerCode"], "PROVIDER_ERROR");
    assert_eq!(m.status(), SessionStatus::Idle);
    let operation = running(&mut m, 2);
    let out = finish(&mut m, &operation, Err(ProviderFailure::crashed("exited 9")));
    let lines = render(&out);
    assert!(lines.iter().any(|l| l.ends_with("status running -> error")), "{lines:?}");
    assert!(lines.last().unwrap().ends_with("completed SESSION_ERROR"));
    assert_eq!(m.status(), SessionStatus::Error);
    assert_eq!(code(m.can_resume().unwrap_err()), ErrorCode::SessionError);
}

#[test]
fn output_of_an_operation_that_is_not_running_is_ignored() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    begin(&mut m, pb::OperationKind::SendText, 1, &mut out);
    out.clear();
    m.delta(&op(1), "too early", t0(), &mut out);
    m.message(&op(9), "someone else's", t0(), &mut out);
    m.usage_reported(&op(9), 5, t0(), &mut out);
    m.tool_failed(&op(9), "t", "r", t0(), &mut out);
    assert!(out.is_empty(), "{:?}", render(&out));
    assert!(m.finish(&op(9), Ok(()), t0(), &mut out).is_none());
    let early = m.call_tool(Some(&op(1)), "t", "{}".into(), tool_ok, "tool-x".into(), t0(), &mut out);
    assert_eq!(early.unwrap_err().code, "SESSION_BUSY", "no tool call before the turn is announced");
}

#[test]
fn usage_only_grows() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    for total in [10, 10, 4, 11] {
        m.usage_reported(&operation, total, t0(), &mut out);
    }
    let lines = render(&out);
    assert_eq!(lines.iter().filter(|l| l.contains("usage")).count(), 2, "{lines:?}");
    assert_eq!(m.usage(), Some(11));
}

#[test]
fn tool_calls_are_checked_before_anything_changes() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    let huge = "1".repeat(limits::MAX_TOOL_JSON_BYTES + 1);
    let refused = m.call_tool(Some(&operation), "t", huge, tool_ok, "tool-1".into(), t0(), &mut out);
    assert_eq!(refused.unwrap_err().code, "TOOL_ARGS_INVALID");
    let bad = |_: &str, _: &str| Err(pb::Error::new(ErrorCode::ToolNotFound, "no such tool"));
    let refused = m.call_tool(Some(&operation), "nope", "{}".into(), bad, "tool-2".into(), t0(), &mut out);
    assert_eq!(refused.unwrap_err().code, "TOOL_NOT_FOUND");
    let other = m.call_tool(Some(&op(7)), "t", "{}".into(), tool_ok, "tool-3".into(), t0(), &mut out);
    assert_eq!(other.unwrap_err().code, "SESSION_BUSY");
    assert!(out.is_empty());
    assert_eq!(m.status(), SessionStatus::Running);
    // An external agent (no operation named) calls during whichever turn runs.
    let started = m.call_tool(None, "t", "{}".into(), tool_ok, "tool-4".into(), t0(), &mut out).unwrap();
    assert_eq!(started.operation, operation);
    assert_eq!(snapshot(&m).pending_tools[0].deadline_at_ms, t0().epoch_ms + 60_000);
}

#[test]
fn bad_tool_results_are_refused_and_change_nothing() {
    use pb::submit_tool_result_request::Outcome;
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    let answer =
        |outcome| pb::SubmitToolResultRequest { tool_request_id: "tool-1".into(), outcome, ..Default::default() };
    let mut out = Vec::new();
    for (outcome, expected) in [
        (Some(Outcome::ResultJson("{not json".into())), ErrorCode::InvalidArgument),
        (Some(Outcome::ResultJson(" ".repeat(limits::MAX_TOOL_JSON_BYTES + 1))), ErrorCode::InvalidArgument),
        (Some(Outcome::Error(pb::Error { code: "MADE_UP".into(), ..Default::default() })), ErrorCode::InvalidArgument),
        (None, ErrorCode::InvalidArgument),
    ] {
        assert_eq!(code(m.submit_tool_result(answer(outcome), t0(), &mut out).unwrap_err()), expected);
    }
    let unknown = pb::SubmitToolResultRequest {
        tool_request_id: "tool-9".into(),
        outcome: Some(Outcome::ResultJson("1".into())),
        ..Default::default()
    };
    assert_eq!(code(m.submit_tool_result(unknown, t0(), &mut out).unwrap_err()), ErrorCode::ToolRequestNotFound);
    assert!(out.is_empty());
    assert_eq!(m.status(), SessionStatus::WaitingToolResult);
    assert_eq!(snapshot(&m).pending_tools.len(), 1);
    let error = pb::Error::new(ErrorCode::ToolHandlerError, "handler threw");
    m.submit_tool_result(answer(Some(Outcome::Error(error))), t0(), &mut out).unwrap();
    assert!(render(&out).iter().any(|l| l == "answer tool-1 error TOOL_HANDLER_ERROR"));
    let twice = m.submit_tool_result(answer(Some(Outcome::ResultJson("1".into()))), t0(), &mut out);
    assert_eq!(code(twice.unwrap_err()), ErrorCode::ToolRequestNotFound, "a second answer is refused");
}

#[test]
fn the_status_returns_to_running_only_when_the_last_pending_call_settles() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    call(&mut m, &operation, "tool-2", t0());
    let mut out = Vec::new();
    m.tool_timed_out(&"tool-1".into(), t0(), &mut out);
    assert_eq!(m.status(), SessionStatus::WaitingToolResult);
    assert_eq!(
        render(&out),
        ["answer tool-1 error TOOL_TIMEOUT", "emit #6 [op-1] tool_settled tool-1 \"TOOL_TIMEOUT\""]
    );
    out.clear();
    m.tool_timed_out(&"tool-1".into(), t0(), &mut out);
    assert!(out.is_empty(), "a second timeout of the same call is nothing");
    m.tool_timed_out(&"tool-2".into(), t0(), &mut out);
    assert_eq!(m.status(), SessionStatus::Running);
}

#[test]
fn an_abandoned_call_is_settled_at_once_and_its_late_answer_refused() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    let mut out = Vec::new();
    m.tool_abandoned(&"tool-1".into(), t0(), &mut out);
    assert_eq!(
        render(&out),
        [
            "answer tool-1 error TOOL_CALL_ABANDONED",
            "emit #5 [op-1] tool_settled tool-1 \"TOOL_CALL_ABANDONED\"",
            "emit #6 [op-1] status waiting_tool_result -> running",
        ]
    );
    assert!(snapshot(&m).pending_tools.is_empty());
    out.clear();
    m.tool_abandoned(&"tool-1".into(), t0(), &mut out);
    assert!(out.is_empty(), "abandoning a settled call is nothing");
    let late = pb::SubmitToolResultRequest {
        tool_request_id: "tool-1".into(),
        outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson("1".into())),
        ..Default::default()
    };
    assert_eq!(code(m.submit_tool_result(late, t0(), &mut out).unwrap_err()), ErrorCode::ToolRequestNotFound);
    assert!(out.is_empty());
}

#[test]
fn a_turn_that_ends_while_waiting_for_a_tool_answers_the_agent_and_passes_through_running() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    let lines = render(&finish(&mut m, &operation, Ok(())));
    assert_eq!(
        lines,
        [
            "answer tool-1 error SESSION_BUSY",
            "emit #5 [op-1] status waiting_tool_result -> running",
            "append #5 operation_completed",
            "emit #6 [op-1] status running -> idle",
            "emit #7 [op-1] completed ok",
        ]
    );
    assert!(snapshot(&m).pending_tools.is_empty());
}

#[test]
fn the_turn_timeout_clock_excludes_tool_waits() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let start = t0();
    assert_eq!(m.tool_wait_so_far(start.instant), Duration::ZERO);
    call(&mut m, &operation, "tool-1", start.later(Duration::from_secs(1)));
    assert_eq!(m.tool_wait_so_far(start.later(Duration::from_secs(4)).instant), Duration::from_secs(3));
    let mut out = Vec::new();
    m.tool_timed_out(&"tool-1".into(), start.later(Duration::from_secs(6)), &mut out);
    assert_eq!(m.tool_wait_so_far(start.later(Duration::from_secs(100)).instant), Duration::from_secs(5));
    // A new operation starts its own count.
    finish(&mut m, &operation, Ok(()));
    running(&mut m, 2);
    assert_eq!(m.tool_wait_so_far(start.later(Duration::from_secs(100)).instant), Duration::ZERO);
}

#[test]
fn ending_settles_everything_and_ends_once() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    let mut out = Vec::new();
    let record = m.end("requested", t0(), &mut out).expect("ends");
    assert_eq!(record.status, SessionStatus::Ended);
    assert_eq!(record.active_operation, None);
    let lines = render(&out);
    assert_eq!(
        lines,
        [
            "answer tool-1 error SESSION_ENDED",
            "stop op-1",
            "append #4 operation_completed",
            "emit #5 [op-1] completed SESSION_ENDED",
            "emit #6 [] status waiting_tool_result -> ended",
            "emit #7 [] ended requested",
            "append #7 ended",
        ]
    );
    assert!(m.end("again", t0(), &mut out).is_none());
    let late = m.call_tool(None, "t", "{}".into(), tool_ok, "tool-2".into(), t0(), &mut out);
    assert_eq!(late.unwrap_err().code, "SESSION_ENDED");
    assert!(m.can_resume().unwrap());
}

#[test]
fn ending_while_a_completion_is_committed_reports_that_completion() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.finish(&operation, Ok(()), t0(), &mut out).unwrap();
    out.clear();
    m.end("requested", t0(), &mut out).unwrap();
    let lines = render(&out);
    assert!(lines.contains(&"emit #4 [op-1] completed ok".to_owned()), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("stop")), "the turn already ended: {lines:?}");
    out.clear();
    m.completion_committed(&operation, t0(), &mut out);
    assert!(out.is_empty(), "announced once, not twice");
    assert_eq!(snapshot(&m).recent_outcomes.len(), 1);
}

#[test]
fn ending_before_the_announcement_makes_the_announcement_fail() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    begin(&mut m, pb::OperationKind::SendText, 1, &mut out);
    m.end("requested", t0(), &mut out).unwrap();
    assert_eq!(code(m.announce(&op(1), t0(), &mut out).unwrap_err()), ErrorCode::SessionEnded);
}

#[test]
fn a_failed_commit_before_the_announcement_leaves_the_session_free() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    begin(&mut m, pb::OperationKind::SendText, 1, &mut out);
    out.clear();
    m.announce_failed(&op(1), pb::Error::new(ErrorCode::Internal, "disk full"), t0(), &mut out);
    assert_eq!(render(&out), ["append #0 operation_completed", "save idle active=\"-\""]);
    assert_eq!(m.status(), SessionStatus::Idle);
    assert!(snapshot(&m).active_operation.is_none());
    assert!(m.begin(pb::OperationKind::SendText, "x".into(), ids(2), t0(), &mut out).is_ok());
}

#[test]
fn resume_is_idempotent_and_refused_while_busy() {
    let mut m = SessionState::new(identity(true));
    assert!(!m.can_resume().unwrap(), "idle: nothing to do");
    running(&mut m, 1);
    assert_eq!(code(m.can_resume().unwrap_err()), ErrorCode::SessionBusy);
    let mut out = Vec::new();
    m.end("requested", t0(), &mut out).unwrap();
    out.clear();
    let record = m.resume(true, t0(), &mut out).unwrap();
    assert_eq!(record.status, SessionStatus::Idle);
    assert!(render(&out).iter().any(|l| l.starts_with("arm_disconnect")), "unwatched: the timer is armed");
    assert!(m.resume(true, t0(), &mut out).is_none());
}

#[test]
fn restore_reports_an_interrupted_operation_as_core_restarted() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    call(&mut m, &operation, "tool-1", t0());
    let mut stored: SessionRecord = m.record();
    assert_eq!(stored.active_operation.as_deref(), Some("op-1"));
    stored.recent_outcomes = vec![crate::transcript::Completion {
        operation_id: "op-0".into(),
        kind: 2,
        error: None,
        message: None,
        ..Default::default()
    }];
    let (m, out) = SessionState::restore(identity(false), &stored, t0());
    let lines = render(&out);
    let ceiling = stored.seq_ceiling;
    assert_eq!(
        lines,
        [
            // The first event after a restart moves the stored ceiling on.
            "save waiting_tool_result active=\"-\"".to_owned(),
            format!("emit #{} [] error CORE_RESTARTED", ceiling + 1),
            format!("append #{} operation_completed", ceiling + 1),
            format!("emit #{} [] status waiting_tool_result -> running", ceiling + 2),
            format!("emit #{} [] status running -> idle", ceiling + 3),
            "save idle active=\"-\"".to_owned(),
        ]
    );
    assert!(ceiling >= SEQ_RESERVATION, "numbering continues above every seq emitted before");
    let snap = snapshot(&m);
    let outcomes: Vec<_> = snap
        .recent_outcomes
        .iter()
        .map(|o| (o.operation_id.as_str(), o.error.as_ref().map(|e| e.code.as_str())))
        .collect();
    assert_eq!(outcomes, [("op-0", None), ("op-1", Some("CORE_RESTARTED"))]);
    assert!(snap.pending_tools.is_empty() && snap.active_operation.is_none());
}

#[test]
fn numbering_reserves_seqs_ahead_and_saves_when_it_reaches_the_reservation() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    let saves_before = |out: &Vec<Effect>| out.iter().filter(|e| matches!(e, Effect::Save(_))).count();
    for _ in 0..SEQ_RESERVATION {
        m.delta(&operation, "x", t0(), &mut out);
    }
    assert_eq!(saves_before(&out), 1, "one save per reservation, not per event");
    let mut seqs = out.iter().filter_map(|e| if let Effect::Emit(e) = e { Some(e.seq) } else { None });
    let first = seqs.next().unwrap();
    assert!(seqs.all(|s| s > first), "strictly increasing");
    assert!(m.record().seq_ceiling >= m.last_seq());
}

#[test]
fn only_the_last_outcomes_are_kept() {
    let mut m = SessionState::new(identity(false));
    for n in 0..(limits::RECENT_OUTCOMES as u32 + 5) {
        let operation = running(&mut m, n);
        finish(&mut m, &operation, Ok(()));
    }
    let outcomes = snapshot(&m).recent_outcomes;
    assert_eq!(outcomes.len(), limits::RECENT_OUTCOMES);
    assert_eq!(outcomes.last().unwrap().operation_id, format!("op-{}", limits::RECENT_OUTCOMES + 4));
    assert_eq!(outcomes[0].operation_id, "op-5", "oldest first");
}

#[test]
fn the_disconnect_timer_fires_only_for_the_latest_abandonment() {
    let mut m = SessionState::new(identity(true));
    let mut out = Vec::new();
    m.unwatched(&mut out);
    let [Effect::ArmDisconnectTimer { epoch: first }] = out[..] else { panic!("{:?}", render(&out)) };
    m.watched();
    assert!(!m.disconnect_due(first, true), "a subscriber came since");
    out.clear();
    m.unwatched(&mut out);
    let [Effect::ArmDisconnectTimer { epoch: second }] = out[..] else { panic!("{:?}", render(&out)) };
    assert!(!m.disconnect_due(second, false), "someone watches now");
    assert!(m.disconnect_due(second, true));
    let mut quiet = SessionState::new(identity(false));
    out.clear();
    quiet.unwatched(&mut out);
    assert!(out.is_empty(), "without auto_end_on_disconnect nothing is armed");
}

#[test]
fn agent_tool_failures_are_raised_with_a_clipped_reason() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.tool_failed(&operation, "getState", &"r".repeat(2_000), t0(), &mut out);
    let Some(event) = out.iter().find_map(|e| if let Effect::Emit(e) = e { Some(e) } else { None }) else {
        panic!("{:?}", render(&out))
    };
    assert!(
        matches!(out.last(), Some(Effect::Append(entry)) if entry.kind == crate::transcript::EntryKind::ToolFailed && entry.seq == event.seq)
    );
    let Some(Kind::Error(raised)) = &event.kind else { panic!("not an error") };
    let error = raised.error.as_ref().unwrap();
    assert_eq!(error.code, "TOOL_CALL_FAILED");
    let details: serde_json::Value = serde_json::from_str(&error.details_json).unwrap();
    assert_eq!(details["reason"].as_str().unwrap().len(), 500);
    assert_eq!(m.status(), SessionStatus::Running, "the turn goes on");
}

#[test]
fn a_completion_that_cannot_be_stored_ends_the_operation_with_internal() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.finish(&operation, Err(ProviderFailure::turn("model said no")), t0(), &mut out).unwrap();
    out.clear();
    m.completion_not_committed(&operation, "disk I/O error", t0(), &mut out);
    let lines = render(&out);
    // The status moves with the announcement, after the INTERNAL error.
    assert_eq!(
        lines,
        [
            "emit #4 [] error INTERNAL",
            "append #4 operation_completed",
            "emit #5 [op-1] status running -> idle",
            "emit #6 [op-1] completed INTERNAL"
        ]
    );
    let outcome = snapshot(&m).recent_outcomes.pop().unwrap();
    let details: serde_json::Value = serde_json::from_str(&outcome.error.unwrap().details_json).unwrap();
    assert_eq!(details["turnError"], "SEND_TEXT_FAILED", "the turn's own failure is kept");
    assert_eq!(m.status(), SessionStatus::Idle, "the session stays usable");
    assert!(m.begin(pb::OperationKind::SendText, "x".into(), ids(2), t0(), &mut out).is_ok());
}

#[test]
fn cancelling_nothing_changes_nothing() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    assert_eq!(m.cancel(None, t0(), &mut out), None, "idle: nothing to cancel");
    let running = running(&mut m, 1);
    let mut out = Vec::new();
    assert_eq!(m.cancel(Some(&op(9)), t0(), &mut out), None, "another operation's id");
    assert!(out.is_empty());
    finish(&mut m, &running, Ok(()));
    m.end("requested", t0(), &mut out);
    let mut out = Vec::new();
    assert_eq!(m.cancel(None, t0(), &mut out), None, "ended");
    assert!(out.is_empty());
}

#[test]
fn a_cancelled_tool_turn_withdraws_its_calls_keeps_its_text_and_completes_cancelled() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.message(&operation, "Looking.", t0(), &mut out);
    out.extend(call(&mut m, &operation, "tool-1", t0()));
    m.delta(&operation, "Half a ", t0(), &mut out);
    m.delta(&operation, "sentence", t0(), &mut out);
    out.clear();
    assert_eq!(m.cancel(None, t0(), &mut out), Some(operation.clone()));
    let cancel = render(&out);
    assert_eq!(m.status(), SessionStatus::Running, "the turn winds down");
    // A second cancel while it winds down asks nothing new.
    let mut again = Vec::new();
    assert_eq!(m.cancel(None, t0(), &mut again), Some(operation.clone()));
    assert!(again.is_empty(), "{again:?}");
    // The agent may not call a tool any more.
    let mut refused = Vec::new();
    let error = m
        .call_tool(Some(&operation), "getState", "{}".into(), tool_ok, ToolRequestId::new("tool-2"), t0(), &mut refused)
        .unwrap_err();
    assert_eq!(error.code, "OPERATION_CANCELLED");
    assert!(refused.is_empty());
    // What the agent still says while winding down is not shown.
    let mut late = Vec::new();
    m.delta(&operation, "more", t0(), &mut late);
    m.message(&operation, "Half a sentence more", t0(), &mut late);
    assert!(late.is_empty(), "{late:?}");
    // However the provider wound down (here: it finished normally), the outcome is cancelled.
    let finished = finish(&mut m, &operation, Ok(()));
    let interrupted = finished.iter().find_map(|e| match e {
        Effect::Append(entry) if entry.kind == crate::transcript::EntryKind::Chat => Some(entry.body.json()),
        _ => None,
    });
    let interrupted = interrupted.expect("the streamed text is kept");
    assert_eq!(
        (interrupted["text"].as_str(), interrupted["interrupted"].as_bool()),
        (Some("Half a sentence"), Some(true))
    );
    let done = render(&finished);
    assert_eq!(m.status(), SessionStatus::Idle);
    let outcome = snapshot(&m).recent_outcomes.pop().unwrap();
    assert_eq!(outcome.error.unwrap().code, "OPERATION_CANCELLED");
    insta::assert_snapshot!([cancel, done].concat().join("\n"));
}

#[test]
fn a_cancel_before_the_announcement_is_remembered_for_the_shell() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    begin(&mut m, pb::OperationKind::SendText, 1, &mut out);
    out.clear();
    assert_eq!(m.cancel(None, t0(), &mut out), Some(op(1)));
    assert!(m.cancel_requested(&op(1)));
    m.announce(&op(1), t0(), &mut out).unwrap();
    let done = render(&finish(&mut m, &op(1), Err(ProviderFailure::cancelled())));
    assert!(done.iter().any(|l| l.contains("completed OPERATION_CANCELLED")), "{done:?}");
    assert!(!done.iter().any(|l| l.contains("error ")), "a cancel raises no error event: {done:?}");
}

#[test]
fn a_runtime_that_dies_while_cancelled_still_puts_the_session_in_error() {
    let mut m = SessionState::new(identity(false));
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.cancel(None, t0(), &mut out);
    finish(&mut m, &operation, Err(ProviderFailure::crashed("gone")));
    assert_eq!(m.status(), SessionStatus::Error);
}

#[test]
fn the_summary_names_the_status_and_the_last_activity() {
    let mut m = SessionState::new(identity(false));
    assert_eq!(m.summary().last_activity_at_ms, 1_000, "the creation time before any event");
    running(&mut m, 1);
    let summary = m.summary();
    assert_eq!(summary.status, pb::SessionStatus::Running as i32);
    assert_eq!(summary.last_activity_at_ms, t0().epoch_ms);
    assert_eq!(summary.session.unwrap().session_id, "sess-1");
}

fn permission(id: &str) -> pb::PermissionRequest {
    let option = |id: &str, kind: pb::PermissionOptionKind| pb::PermissionOption {
        option_id: id.into(),
        name: id.into(),
        kind: kind as i32,
    };
    pb::PermissionRequest {
        permission_id: id.into(),
        options: vec![
            option("yes", pb::PermissionOptionKind::AllowOnce),
            option("no", pb::PermissionOptionKind::RejectOnce),
        ],
        policy_option_id: "no".into(),
        ..Default::default()
    }
}

#[test]
fn permission_requests_wait_for_the_app_and_every_ending_settles_them() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    let refused = m.ask_permission(permission("perm-0"), t0(), &mut out).unwrap_err();
    assert_eq!(refused.code, "SESSION_BUSY", "no turn: the provider falls back to its policy");
    let operation = running(&mut m, 1);
    let mut out = Vec::new();
    m.ask_permission(permission("perm-1"), t0(), &mut out).unwrap();
    m.ask_permission(permission("perm-2"), t0(), &mut out).unwrap();
    m.ask_permission(permission("perm-3"), t0(), &mut out).unwrap();
    assert_eq!(snapshot(&m).pending_permissions.len(), 3);
    let bad = m.answer_permission("perm-1", "maybe", t0(), &mut out).unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidArgument);
    m.answer_permission("perm-1", "yes", t0(), &mut out).unwrap();
    let again = m.answer_permission("perm-1", "yes", t0(), &mut out).unwrap_err();
    assert_eq!(again.code(), ErrorCode::PermissionRequestNotFound, "the first answer wins");
    m.permission_timed_out("perm-2", t0(), &mut out);
    m.cancel(None, t0(), &mut out);
    assert!(snapshot(&m).pending_permissions.is_empty());
    out.extend(finish(&mut m, &operation, Err(ProviderFailure::cancelled())));
    insta::assert_snapshot!(render(&out).join("\n"));
}

#[test]
fn new_ids_are_random_v4_uuids_after_their_prefix() {
    let ids: std::collections::HashSet<String> = (0..1000).map(|_| super::new_id("tool")).collect();
    assert_eq!(ids.len(), 1000, "ids repeat");
    for id in &ids {
        let hex = id.strip_prefix("tool-").expect("the prefix");
        let uuid = uuid::Uuid::parse_str(hex).expect("32 hex digits");
        assert_eq!(uuid.get_version_num(), 4, "{id}");
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{id}");
    }
}

#[test]
fn a_new_model_is_recorded_announced_and_saved_and_the_same_one_changes_nothing() {
    let mut m = SessionState::new(identity(false));
    let mut out = Vec::new();
    assert!(!m.set_model("m", None, t0(), &mut out).unwrap(), "the model it has, the effort kept: no change");
    assert!(out.is_empty());
    out.clear();
    let changed = m.set_model("m2", Some(pb::EffortLevel::High), t0(), &mut out).unwrap();
    assert!(changed);
    let rendered = render(&out);
    assert!(
        rendered.iter().any(|l| l.ends_with(&format!("model_changed m2 {}", pb::EffortLevel::High as i32))),
        "{rendered:?}"
    );
    assert!(out.iter().any(|e| matches!(e, Effect::Append(entry) if entry.kind.to_string() == "model_changed")));
    let saved = out.iter().find_map(|e| if let Effect::Save(record) = e { Some(record.clone()) } else { None });
    assert_eq!(saved.map(|r| r.model), Some("m2".to_owned()));
    assert_eq!(snapshot(&m).model, "m2");
    out.clear();
    assert!(!m.set_model("m2", None, t0(), &mut out).unwrap(), "the same model again");
    assert!(out.is_empty(), "changes nothing: {:?}", render(&out));
}
