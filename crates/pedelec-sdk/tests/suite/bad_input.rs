//! Bad input: a clear error code, and nothing changes.

use std::io::Write;

use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::{limits, pb};
use pedelec_sdk::{ErrorCode, SessionOptions, SessionStatus, ToolSpec};
use serde_json::json;

use super::*;

fn code(status: tonic::Status) -> String {
    error_from_status(&status).code
}

fn create(tools: Vec<pb::ToolDefinition>, workspace: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        skills: Some(pb::Skills { guidance: String::new(), tools }),
        workspace: Some(pb::WorkspaceSpec { path: workspace.into() }),
        caller_origin: ORIGIN.into(),
        ..Default::default()
    }
}

fn tool(name: &str, description: &str, schema: &str) -> pb::ToolDefinition {
    pb::ToolDefinition {
        name: name.into(),
        description: description.into(),
        input_schema_json: schema.into(),
        timeout_ms: 0,
    }
}

fn workspaces(h: &Harness) -> usize {
    std::fs::read_dir(h.state().join("workspaces")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_wrong_origins_and_bad_fields() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let missing =
        || pb::SendTextRequest { session_id: "sess-nope".into(), caller_origin: ORIGIN.into(), text: "x".into() };
    assert_eq!(code(raw.send_text(missing()).await.unwrap_err()), "THREAD_NOT_FOUND");
    let sub = pb::SubscribeRequest { session_id: "sess-nope".into(), caller_origin: ORIGIN.into() };
    assert_eq!(code(raw.subscribe(sub).await.unwrap_err()), "THREAD_NOT_FOUND");
    let long = pb::EndRequest { session_id: "x".repeat(limits::MAX_ID_LEN + 1), caller_origin: ORIGIN.into() };
    assert_eq!(code(raw.end(long).await.unwrap_err()), "INVALID_ARGUMENT");
    let mut no_origin = create(vec![], "");
    no_origin.caller_origin.clear();
    assert_eq!(code(raw.create_session(no_origin).await.unwrap_err()), "INVALID_ARGUMENT");
    let mut bad_provider = create(vec![], "");
    bad_provider.provider = "nonexistent".into();
    assert_eq!(code(raw.create_session(bad_provider).await.unwrap_err()), "PROVIDER_NOT_FOUND");
    let mut bad_effort = create(vec![], "");
    bad_effort.effort_level = 42;
    assert_eq!(code(raw.create_session(bad_effort).await.unwrap_err()), "INVALID_ARGUMENT");
    assert_eq!(workspaces(&h), 0, "no session was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tool_manifest_rule_is_refused() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let obj = r#"{"type":"object"}"#;
    let cases = vec![
        vec![tool("9lives", "d", obj)],
        vec![tool("has space", "d", obj)],
        vec![tool("a", "d", obj), tool("a", "d", obj)],
        vec![tool("a", " ", obj)],
        vec![tool("a", "d", "[]")],
        vec![tool("a", "d", r#"{"type":"string"}"#)],
        vec![tool("a", "d", "{not json")],
        vec![tool("a", "d", r#"{"type":"object","properties":{"x":{"type":"nonsense"}}}"#)],
    ];
    for tools in cases {
        let label = format!("{tools:?}");
        let error = error_from_status(&raw.create_session(create(tools, "")).await.unwrap_err());
        assert_eq!(error.code, "TOOLS_MANIFEST_INVALID", "{label}");
        assert!(error.details_json.contains("problems"), "details name the problem: {}", error.details_json);
    }
    assert_eq!(workspaces(&h), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_workspace_rule_is_refused() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    let managed_inside = h.state().join("workspaces");
    std::fs::create_dir_all(&managed_inside).unwrap();
    for path in [
        "relative/path".to_string(),
        "/definitely/not/here".to_string(),
        file.path().display().to_string(),
        managed_inside.display().to_string(),
        h.state().display().to_string(),
    ] {
        let status = raw.create_session(create(vec![], &path)).await.unwrap_err();
        assert_eq!(code(status), "WORKSPACE_INVALID", "{path}");
    }
    assert_eq!(workspaces(&h), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_text_duplicate_results_and_sends_after_end_change_nothing() {
    let h = Harness::start();
    let client = h.client().await;
    let session = client
        .create_session(SessionOptions {
            tools: vec![ToolSpec::new("t".to_string(), "t", json!({"type": "object"}))],
            ..Default::default()
        })
        .await
        .unwrap();
    let log = Recorder::attach(&session);
    let err = session.send_text("x".repeat(limits::MAX_TEXT_BYTES + 1)).await.unwrap_err();
    assert!(err.is(ErrorCode::TextTooLarge));
    assert_eq!(session.get_status(), SessionStatus::Idle, "the optimistic running was undone");

    let mut raw = h.raw().await;
    let result = |id: &str, json: &str| pb::SubmitToolResultRequest {
        session_id: session.session_id().into(),
        caller_origin: ORIGIN.into(),
        tool_request_id: id.into(),
        outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson(json.into())),
    };
    assert_eq!(code(raw.submit_tool_result(result("tool-unknown", "1")).await.unwrap_err()), "TOOL_REQUEST_NOT_FOUND");

    // A real pending call: answer it with invalid JSON (refused, still pending), then properly, then again.
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/tool t {}").await });
    let mut events = raw
        .subscribe(pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() })
        .await
        .unwrap()
        .into_inner();
    let request_id = loop {
        let event = events.message().await.unwrap().unwrap();
        match event.kind {
            Some(pb::session_event::Kind::ToolCall(call)) => break call.tool_request_id,
            Some(pb::session_event::Kind::Snapshot(s)) if !s.pending_tools.is_empty() => {
                break s.pending_tools[0].tool_request_id.clone();
            }
            _ => {}
        }
    };
    assert_eq!(code(raw.submit_tool_result(result(&request_id, "{oops")).await.unwrap_err()), "INVALID_ARGUMENT");
    raw.submit_tool_result(result(&request_id, "\"ok\"")).await.unwrap();
    assert_eq!(
        code(raw.submit_tool_result(result(&request_id, "\"again\"")).await.unwrap_err()),
        "TOOL_REQUEST_NOT_FOUND"
    );
    turn.await.unwrap().unwrap();
    assert!(log.lines().iter().any(|l| l.contains("Tool t returned \\\"ok\\\"")), "{:?}", log.lines());

    session.end().await.unwrap();
    let after_end =
        pb::SendTextRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into(), text: "x".into() };
    assert_eq!(code(raw.send_text(after_end).await.unwrap_err()), "SESSION_ENDED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_socket_does_not_disturb_other_clients() {
    let h = Harness::start();
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    for garbage in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0xffu8; 4096][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff",
    ] {
        let mut raw = std::os::unix::net::UnixStream::connect(h.socket()).unwrap();
        let _ = raw.write_all(garbage);
        drop(raw);
    }
    session.send_text("still fine").await.unwrap();
    let other = h.client().await;
    other.ping().await.unwrap();
}
