//! `cancel()`: a running operation stops, its awaited call rejects with
//! `OPERATION_CANCELLED`, pending tool calls are withdrawn, the status
//! returns to idle, the text so far stays, the next turn goes on; from a
//! second handle of the same origin, never from another origin. And
//! `list_sessions()`: this origin's sessions only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::{HistoryQuery, PedelecSession, SessionOptions, SessionStatus, ToolSpec};

use super::{Harness, ORIGIN, Recorder, Via, eventually, schema_object};

/// A tool whose handler never answers; the request ids it was called with.
fn stalling_tool(calls: Arc<Mutex<Vec<String>>>) -> ToolSpec {
    ToolSpec::new("stall".to_string(), "Never answers", schema_object()).with_handler(pedelec_sdk::handler(
        move |_: serde_json::Value, ctx: pedelec_sdk::ToolCallContext| {
            calls.lock().unwrap().push(ctx.tool_request_id.clone());
            async {
                std::future::pending::<()>().await;
                Ok::<serde_json::Value, String>(serde_json::Value::Null)
            }
        },
    ))
}

async fn session_with(client: &pedelec_sdk::Pedelec, tools: Vec<ToolSpec>) -> PedelecSession {
    client
        .create_session(SessionOptions { tools, auto_end_on_disconnect: false, ..Default::default() })
        .await
        .expect("create")
}

/// Cancel mid-stream: what streamed stays as an interrupted message, the
/// next turn runs on the same thread.
async fn cancel_stops_a_streaming_turn_and_keeps_its_text(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = session_with(&client, Vec::new()).await;
    let recorder = Recorder::attach(&session);
    let words = (1..=200).map(|n| format!("w{n}")).collect::<Vec<_>>().join(" ");
    let turn = {
        let session = session.clone();
        let text = format!("/slow 20\n{words}");
        tokio::spawn(async move { session.send_text(text).await })
    };
    eventually("a few deltas", || recorder.count("delta ") >= 5).await;
    session.cancel().await.expect("cancel");
    assert_eq!(session.get_status(), SessionStatus::Idle, "idle once cancel() resolves");
    let error = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().unwrap_err();
    assert_eq!(error.code, "OPERATION_CANCELLED", "{error:?}");
    let streamed = recorder.count("delta ");
    assert!(streamed < 200, "the turn stopped early ({streamed} deltas)");
    assert_eq!(recorder.count("error "), 0, "a cancel raises no error: {:?}", recorder.lines());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recorder.count("delta "), streamed, "nothing streams after the cancel");

    session.send_text("next").await.expect("the next turn runs");
    let entries = session.history(HistoryQuery::default()).await.unwrap().entries;
    let interrupted = entries
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::AssistantMessage(t)) if t.interrupted => Some(t.text.clone()),
            _ => None,
        })
        .expect("the streamed text is in the transcript");
    assert!(interrupted.starts_with("You said: w1 w2"), "{interrupted:?}");
    let outcomes: Vec<Option<String>> = entries
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::OperationCompleted(o)) => Some(o.error.as_ref().map(|e| e.code.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, [Some("OPERATION_CANCELLED".to_string()), None]);
    session.end().await.unwrap();
}

/// Cancel while the agent waits for a frontend tool: the call is withdrawn
/// (a late result is refused), the turn ends, the event sequence is the
/// documented one.
async fn cancel_withdraws_a_pending_tool_call(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let session = session_with(&client, vec![stalling_tool(calls.clone())]).await;
    let recorder = Recorder::attach(&session);
    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/tool stall {}").await })
    };
    eventually("the tool wait", || session.get_status() == SessionStatus::WaitingToolResult).await;
    session.cancel().await.expect("cancel");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    let error = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().unwrap_err();
    assert_eq!(error.code, "OPERATION_CANCELLED");

    // The handler answering now is too late: Core refuses it, changing nothing.
    let request = calls.lock().unwrap().first().cloned().expect("the handler was called");
    let mut raw = h.raw().await;
    let late = raw
        .submit_tool_result(pb::SubmitToolResultRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            tool_request_id: request,
            outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson("{}".into())),
        })
        .await
        .unwrap_err();
    let late = pedelec_protocol::grpc::error_from_status(&late);
    assert_eq!(late.code, "TOOL_REQUEST_NOT_FOUND");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    // The same on both transports: one snapshot.
    insta::assert_snapshot!("a_cancelled_tool_turn", recorder.transcript());
    session.end().await.unwrap();
}

/// Nothing running: a no-op, idle or ended.
async fn cancelling_an_idle_or_ended_session_is_a_no_op(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = session_with(&client, Vec::new()).await;
    let recorder = Recorder::attach(&session);
    session.cancel().await.expect("idle: a no-op");
    session.send_text("still fine").await.expect("a turn after it");
    session.end().await.unwrap();
    session.cancel().await.expect("ended: a no-op");
    let mut raw = h.raw().await;
    let answer = raw
        .cancel(pb::CancelRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            operation_id: String::new(),
        })
        .await
        .expect("Core answers a cancel of nothing")
        .into_inner();
    assert_eq!(answer, pb::CancelResponse::default());
    assert_eq!(recorder.count("error "), 0, "{:?}", recorder.lines());
}

/// A second handle of the same origin (another tab) cancels the first one's
/// turn; another origin may not.
async fn a_second_handle_cancels_and_another_origin_cannot(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let session = session_with(&client, vec![stalling_tool(calls)]).await;
    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/tool stall {}").await })
    };
    eventually("the tool wait", || session.get_status() == SessionStatus::WaitingToolResult).await;

    let mut raw = h.raw().await;
    let foreign = raw
        .cancel(pb::CancelRequest {
            session_id: session.session_id().into(),
            caller_origin: "https://evil.example".into(),
            operation_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&foreign).code, "THREAD_ACCESS_DENIED");
    let malformed = raw
        .cancel(pb::CancelRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            operation_id: "x".repeat(10_000),
        })
        .await
        .unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&malformed).code, "INVALID_ARGUMENT");
    assert_eq!(session.get_status(), SessionStatus::WaitingToolResult, "neither changed anything");

    let second_tab = h.client().await;
    let other = second_tab.resume_session::<String>(session.session_id()).await.expect("attach");
    other.cancel().await.expect("the second handle cancels");
    assert_eq!(other.get_status(), SessionStatus::Idle);
    let error = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().unwrap_err();
    assert_eq!(error.code, "OPERATION_CANCELLED");
    session.end().await.unwrap();
}

/// `list_sessions()`: this origin's sessions, newest first, with their status; nothing of another origin's.
async fn list_sessions_shows_only_the_callers_sessions(via: Via) {
    let h = Harness::start_via(via);
    let mine = h.client().await;
    let theirs = h.client_for("https://other.example").await;
    let first = session_with(&mine, Vec::new()).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = session_with(&mine, Vec::new()).await;
    let foreign = session_with(&theirs, Vec::new()).await;
    first.send_text("hello").await.unwrap();
    first.end().await.unwrap();

    let listed = mine.list_sessions().await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|s| s.session.as_ref().unwrap().session_id.as_str()).collect();
    assert_eq!(ids, [second.session_id(), first.session_id()], "newest created first, mine only");
    assert_eq!(listed[0].status, pb::SessionStatus::Idle as i32);
    assert_eq!(listed[1].status, pb::SessionStatus::Ended as i32);
    let first_info = listed[1].session.as_ref().unwrap();
    assert_eq!(first_info.provider, "scripted");
    assert!(listed[1].last_activity_at_ms >= first_info.created_at_ms);
    assert!(listed[1].last_activity_at_ms >= listed[0].last_activity_at_ms, "the first one was active last");

    let listed = theirs.list_sessions().await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|s| s.session.as_ref().unwrap().session_id.as_str()).collect();
    assert_eq!(ids, [foreign.session_id()]);
    let nobody = h.client_for("https://nobody.example").await;
    assert!(nobody.list_sessions().await.unwrap().is_empty());
}

super::over_both_transports!(
    cancel_stops_a_streaming_turn_and_keeps_its_text,
    cancel_withdraws_a_pending_tool_call,
    cancelling_an_idle_or_ended_session_is_a_no_op,
    a_second_handle_cancels_and_another_origin_cannot,
    list_sessions_shows_only_the_callers_sessions,
);
