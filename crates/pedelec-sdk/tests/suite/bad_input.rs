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
        workspace: Some(pb::WorkspaceSpec { path: workspace.into(), ..Default::default() }),
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
        read_only_hint: false,
    }
}

fn workspaces(h: &Harness) -> usize {
    std::fs::read_dir(h.workspaces()).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_wrong_origins_and_bad_fields() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let missing = || pb::SendTextRequest {
        session_id: "sess-nope".into(),
        caller_origin: ORIGIN.into(),
        text: "x".into(),
        ..Default::default()
    };
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
    let managed_inside = h.workspaces();
    std::fs::create_dir_all(&managed_inside).unwrap();
    for (path, expected) in [
        ("relative/path".to_string(), "WORKSPACE_INVALID"),
        ("/definitely/not/here".to_string(), "WORKSPACE_INVALID"),
        (file.path().display().to_string(), "WORKSPACE_INVALID"),
        // Core's own state (managed workspaces, the database) is never a workspace.
        (managed_inside.display().to_string(), "WORKSPACE_NOT_ALLOWED"),
        (h.state().display().to_string(), "WORKSPACE_NOT_ALLOWED"),
    ] {
        let status = raw.create_session(create(vec![], &path)).await.unwrap_err();
        assert_eq!(code(status), expected, "{path}");
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
    let after_end = pb::SendTextRequest {
        session_id: session.session_id().into(),
        caller_origin: ORIGIN.into(),
        text: "x".into(),
        ..Default::default()
    };
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

/// The native host's relay stream: each call answered under its own id, and
/// frames it cannot carry refused one by one without ending the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_stream_answers_each_call_by_id_and_refuses_what_it_cannot_carry() {
    use pb::native_frame::Body;
    use pb::native_request::Call;
    use pb::native_response::Result as Reply;

    let h = Harness::start();
    let session = h.raw().await.create_session(create(vec![], "")).await.unwrap().into_inner().session.unwrap();
    let channel = pedelec_sdk::grpc::local_channel(&h.socket()).await.unwrap();
    let mut relay = pb::core_relay_client::CoreRelayClient::new(channel)
        .max_encoding_message_size(limits::GRPC_MESSAGE_MAX)
        .max_decoding_message_size(limits::GRPC_MESSAGE_MAX);
    let request = |id: u32, call: Call| pb::NativeFrame {
        request_id: id,
        body: Some(Body::Request(pb::NativeRequest { call: Some(call) })),
        ..Default::default()
    };
    // Over tonic's default 4 MiB message limit, within the tool-result limit.
    let big_result = format!("\"{}\"", "x".repeat(5 * 1024 * 1024));
    let frames = vec![
        request(1, Call::Ping(pb::PingRequest {})),
        request(0, Call::Ping(pb::PingRequest {})),
        request(
            2,
            Call::Subscribe(pb::SubscribeRequest {
                session_id: session.session_id.clone(),
                caller_origin: ORIGIN.into(),
            }),
        ),
        pb::NativeFrame { request_id: 3, body: Some(Body::Event(pb::SessionEvent::default())), ..Default::default() },
        pb::NativeFrame {
            request_id: 4,
            body: Some(Body::Request(pb::NativeRequest { call: None })),
            ..Default::default()
        },
        request(
            5,
            Call::SendText(pb::SendTextRequest {
                session_id: "nope".into(),
                caller_origin: ORIGIN.into(),
                text: "hi".into(),
                ..Default::default()
            }),
        ),
        request(
            6,
            Call::SubmitToolResult(pb::SubmitToolResultRequest {
                session_id: session.session_id.clone(),
                caller_origin: ORIGIN.into(),
                tool_request_id: "no-such-request".into(),
                outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson(big_result)),
            }),
        ),
        request(
            7,
            Call::End(pb::EndRequest {
                session_id: session.session_id.clone(),
                caller_origin: "https://other.example".into(),
            }),
        ),
        request(8, Call::Ping(pb::PingRequest {})),
    ];
    let sent = frames.len();
    let mut answers = relay.relay(futures::stream::iter(frames)).await.unwrap().into_inner();
    let mut by_id = std::collections::BTreeMap::new();
    for _ in 0..sent {
        let frame = answers.message().await.unwrap().expect("an answer per frame");
        assert!(by_id.insert(frame.request_id, frame.body.unwrap()).is_none(), "one answer per id");
    }
    let error = |id: u32| match &by_id[&id] {
        Body::Error(e) => e.code.clone(),
        other => panic!("{id}: {other:?}"),
    };
    assert!(
        matches!(&by_id[&1], Body::Response(pb::NativeResponse { result: Some(Reply::Ping(p)) }) if p.pid == h.core.pid().unwrap())
    );
    assert!(matches!(&by_id[&8], Body::Response(pb::NativeResponse { result: Some(Reply::Ping(_)) })));
    assert_eq!(error(0), "INVALID_ARGUMENT");
    assert_eq!(error(2), "INVALID_ARGUMENT");
    assert_eq!(error(3), "INVALID_ARGUMENT");
    assert_eq!(error(4), "INVALID_ARGUMENT");
    assert_eq!(error(5), "THREAD_NOT_FOUND");
    assert_eq!(error(6), "TOOL_REQUEST_NOT_FOUND");
    assert_eq!(error(7), "THREAD_ACCESS_DENIED");
    // Nothing changed: the session is still there and not ended.
    let resumed: PedelecSession = h.client().await.resume_session(&session.session_id).await.unwrap();
    assert_ne!(resumed.get_status(), SessionStatus::Ended);
}

/// Errors that would echo hostile input stay small: a 100 000-character
/// error code in a tool result, and a manifest of 129 tools (a problem per
/// tool), each answer fitting well within the 8 KiB of metadata gRPC
/// clients accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_that_echo_hostile_input_are_clipped() {
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let mut raw = h.raw().await;
    let bad_code = pb::SubmitToolResultRequest {
        session_id: session.session_id().into(),
        caller_origin: ORIGIN.into(),
        tool_request_id: "tool-x".into(),
        outcome: Some(pb::submit_tool_result_request::Outcome::Error(pb::Error {
            code: "X".repeat(100_000),
            message: String::new(),
            details_json: String::new(),
        })),
    };
    let status = raw.submit_tool_result(bad_code).await.unwrap_err();
    let size = |s: &tonic::Status| s.message().len() + s.details().len();
    assert!(size(&status) < 8 * 1024, "{} bytes", size(&status));
    let error = error_from_status(&status);
    assert_eq!(error.code, "INVALID_ARGUMENT");
    assert!(error.message.ends_with('…'), "says it was clipped: {}", error.message);

    let tools: Vec<pb::ToolDefinition> = (0..=limits::MAX_TOOLS)
        .map(|i| pb::ToolDefinition {
            name: format!("tool_with_a_long_name_{i:0>40}"),
            description: String::new(),
            input_schema_json: "not json".into(),
            ..Default::default()
        })
        .collect();
    let create = pb::CreateSessionRequest {
        caller_origin: ORIGIN.into(),
        skills: Some(pb::Skills { tools, ..Default::default() }),
        ..Default::default()
    };
    let status = raw.create_session(create).await.unwrap_err();
    assert!(size(&status) < 8 * 1024, "{} bytes", size(&status));
    assert_eq!(error_from_status(&status).code, "TOOLS_MANIFEST_INVALID");
}

/// Silent connections cannot lock clients out: beyond the connection limit
/// one is closed at once, and one that never speaks is closed after the
/// handshake timeout, freeing its slot; a client that speaks is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_clients_still_get_in() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("core.sock");
    let _core = pedelec_sdk::daemon::CoreProcess::spawn_with_args(
        &pedelec_sdk::daemon::find_core_binary(),
        &socket,
        &dir.path().join("state"),
        Duration::from_secs(3),
        &["--max-connections", "20", "--handshake-timeout-ms", "400"],
    )
    .unwrap();
    let early = pedelec_sdk::Pedelec::connect(&socket, ORIGIN).await.unwrap();
    early.ping().await.unwrap();
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(tokio::net::UnixStream::connect(&socket).await.unwrap());
    }
    // Closed means the read sees the end (or a reset) rather than waiting.
    async fn closed_within(stream: &mut tokio::net::UnixStream, wait: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(tokio::time::timeout(wait, stream.read(&mut byte)).await, Ok(Ok(0) | Err(_)))
    }
    let mut refused = 0;
    for stream in &mut silent {
        if closed_within(stream, Duration::from_millis(100)).await {
            refused += 1;
        }
    }
    assert!(refused >= 19, "the connections beyond the limit were closed at once ({refused} of 40)");
    early.ping().await.expect("a client that spoke keeps its connection");
    for stream in &mut silent {
        assert!(
            closed_within(stream, Duration::from_secs(3)).await,
            "a silent connection is closed after the handshake timeout"
        );
    }
    let fresh = pedelec_sdk::Pedelec::connect(&socket, ORIGIN).await.unwrap();
    fresh.ping().await.expect("a fresh client gets in");
}
