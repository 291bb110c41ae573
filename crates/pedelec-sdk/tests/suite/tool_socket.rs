//! Core's tool socket (`pedelec_protocol::tool_socket`) and the `pedelec-tool`
//! client an agent's shell starts per call: the same authentication and
//! results as the gRPC `AgentTools` service, and the frames a third-party or
//! hostile client can send.

use std::process::Stdio;

use pedelec_protocol::discovery::Platform;
use pedelec_protocol::pb::{tool_socket_request::Call, tool_socket_response::Result as Answer};
use pedelec_protocol::tool_socket::{HEADER_LEN, MAX_FRAME, decode_body, encode_frame, endpoint_for, frame_len};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::*;

fn echo_tool() -> ToolSpec {
    ToolSpec::new("echo".to_string(), "Answers with its arguments", schema_object())
        .with_handler(sync_handler(|args: Value, _| Ok::<_, String>(args)))
}

/// A tool nothing answers: the session registers no handler for it.
fn hold_tool() -> ToolSpec {
    ToolSpec::new("hold".to_string(), "Never answered", schema_object())
}

/// A session with the counter, echo and hold tools, held running by a long turn
/// (Core accepts agent tool calls only while a turn runs).
async fn running_session(h: &Harness) -> (PedelecSession, Arc<Mutex<i64>>, tokio::task::JoinHandle<()>) {
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions {
            tools: vec![counter_tool(counter.clone()), echo_tool(), hold_tool()],
            ..Default::default()
        })
        .await
        .unwrap();
    let sess = session.clone();
    let turn = tokio::spawn(async move {
        let _ = sess.send_text("/sleep 60000").await;
    });
    core_running(h, &session).await;
    (session, counter, turn)
}

fn token_of(h: &Harness, session: &PedelecSession) -> String {
    h.tool_token(session.session_id())
}

fn tool_command(h: &Harness, token: Option<&str>, args: &[&str]) -> tokio::process::Command {
    let mut command =
        tokio::process::Command::new(pedelec_sdk::daemon::find_binary("pedelec-tool", "PEDELEC_TOOL_BIN"));
    command
        .args(args)
        .env("PEDELEC_CORE_SOCKET", h.socket())
        .env_remove("PEDELEC_TOOL_ENDPOINT")
        .env_remove("PEDELEC_TOOL_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("PEDELEC_TOOL_TOKEN", token);
    }
    command
}

/// Exit status, stdout as JSON (or Null), stderr's `code`.
async fn run(mut command: tokio::process::Command) -> (Option<i32>, Value, String) {
    let out = command.output().await.expect("pedelec-tool runs (build it: cargo build -p pedelec-tool)");
    let stdout = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = serde_json::from_str::<Value>(&stderr)
        .ok()
        .and_then(|e| e["code"].as_str().map(str::to_owned))
        .unwrap_or(stderr);
    (out.status.code(), stdout, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pedelec_tool_calls_the_sessions_tools_with_its_token() {
    let h = Harness::start();
    let (session, counter, turn) = running_session(&h).await;
    let token = token_of(&h, &session);
    let t = Some(token.as_str());

    let (status, out, _) = run(tool_command(&h, t, &["call", "update_counter", r#"{"delta":3}"#])).await;
    assert_eq!((status, out), (Some(0), json!({"value": 3})));
    assert_eq!(*counter.lock().unwrap(), 3);
    // No arguments are `{}`.
    let (status, out, _) = run(tool_command(&h, t, &["call", "echo"])).await;
    assert_eq!((status, out), (Some(0), json!({})));
    // `-` reads them from stdin: here longer than a command line may be.
    let long = json!({ "text": "x".repeat(300_000) });
    let mut command = tool_command(&h, t, &["call", "echo", "-"]);
    let mut child = command.stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(long.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), long);
    // The endpoint may also be named outright.
    let mut command = tool_command(&h, t, &["call", "update_counter", r#"{"delta":1}"#]);
    command.env("PEDELEC_CORE_SOCKET", "/nonexistent/core.sock");
    command.env("PEDELEC_TOOL_ENDPOINT", endpoint_for(Platform::current(), &h.socket()));
    assert_eq!(run(command).await.1, json!({"value": 4}));

    let out = tool_command(&h, t, &["list"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["update_counter", "echo", "hold"]);

    for (args, code) in [
        (&["call", "update_counter", r#"{"delta":"x"}"#][..], "TOOL_ARGS_INVALID"),
        (&["call", "update_counter"][..], "TOOL_ARGS_INVALID"),
        (&["call", "nope", "{}"][..], "TOOL_NOT_FOUND"),
        (&["call", "echo", "not json"][..], "TOOL_ARGS_INVALID"),
        (&["call", "echo", "[1]"][..], "TOOL_ARGS_INVALID"),
    ] {
        let (status, out, got) = run(tool_command(&h, t, args)).await;
        assert_eq!((status, out, got.as_str()), (Some(1), Value::Null, code), "{args:?}");
    }
    assert_eq!(*counter.lock().unwrap(), 4, "no failed call reached the handler");

    // Not reachable: exit 2, the result never printed.
    let forged = "b".repeat(64);
    let (status, _, code) = run(tool_command(&h, Some(&forged), &["call", "echo", "{}"])).await;
    assert_eq!((status, code.as_str()), (Some(2), "TOOL_TOKEN_INVALID"));
    let (status, _, code) = run(tool_command(&h, Some(&forged), &["list"])).await;
    assert_eq!((status, code.as_str()), (Some(2), "TOOL_TOKEN_INVALID"));
    let (status, _, code) = run(tool_command(&h, None, &["call", "echo", "{}"])).await;
    assert_eq!((status, code.as_str()), (Some(2), "CORE_RUNTIME_UNAVAILABLE"));
    let mut command = tool_command(&h, t, &["call", "echo", "{}"]);
    command.env("PEDELEC_CORE_SOCKET", h.dir.path().join("run/no-core.sock"));
    let (status, _, code) = run(command).await;
    assert_eq!((status, code.as_str()), (Some(2), "CORE_RUNTIME_UNAVAILABLE"));

    session.end().await.unwrap();
    turn.await.unwrap();
    let (status, _, code) = run(tool_command(&h, t, &["call", "echo", "{}"])).await;
    assert_eq!((status, code.as_str()), (Some(2), "TOOL_TOKEN_INVALID"), "an ended session's token is refused");
}

struct RawSocket(UnixStream);

impl RawSocket {
    async fn connect(h: &Harness) -> Self {
        RawSocket(UnixStream::connect(endpoint_for(Platform::current(), &h.socket())).await.expect("the tool socket"))
    }

    async fn send(&mut self, id: u64, call: Option<Call>) {
        self.0.write_all(&encode_frame(&pb::ToolSocketRequest { id, call })).await.unwrap();
    }

    /// The next response, or `None` when Core closed the connection.
    async fn next(&mut self) -> Option<pb::ToolSocketResponse> {
        let mut header = [0u8; HEADER_LEN];
        let read = tokio::time::timeout(Duration::from_secs(10), self.0.read_exact(&mut header)).await;
        read.expect("Core answers or closes").ok()?;
        let mut body = vec![0u8; frame_len(header).unwrap()];
        self.0.read_exact(&mut body).await.unwrap();
        Some(decode_body(&body).unwrap())
    }

    async fn closed(&mut self) -> bool {
        self.next().await.is_none()
    }
}

fn call(token: &str, tool: &str, args: Value) -> Option<Call> {
    Some(Call::CallTool(pb::CallToolRequest {
        tool_token: token.into(),
        tool: tool.into(),
        args_json: args.to_string(),
    }))
}

/// The result of a call that succeeded.
fn result_json(response: &pb::ToolSocketResponse) -> Value {
    let Some(Answer::CallTool(pb::CallToolResponse {
        outcome: Some(pb::call_tool_response::Outcome::ResultJson(json)),
    })) = &response.result
    else {
        panic!("not a result: {response:?}")
    };
    serde_json::from_str(json).unwrap()
}

fn refusal(response: &pb::ToolSocketResponse) -> &str {
    match &response.result {
        Some(Answer::Error(error)) => &error.code,
        Some(Answer::CallTool(pb::CallToolResponse { outcome: Some(pb::call_tool_response::Outcome::Error(e)) })) => {
            &e.code
        }
        other => panic!("not a refusal: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_socket_answers_concurrent_requests_by_id_and_refuses_bad_ones() {
    let h = Harness::start();
    let (session, counter, turn) = running_session(&h).await;
    let token = token_of(&h, &session);
    let mut socket = RawSocket::connect(&h).await;

    // Two calls in flight on one connection, answered each with its id.
    socket.send(7, call(&token, "update_counter", json!({"delta": 2}))).await;
    socket.send(9, call(&token, "echo", json!({"n": 9}))).await;
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let response = socket.next().await.expect("an answer");
        answers.insert(response.id, result_json(&response));
    }
    assert_eq!(answers, [(7, json!({"value": 2})), (9, json!({"n": 9}))].into());

    // A frame that arrives in pieces, with another call's answer going out
    // while it is half read, is read whole: the read in progress is never
    // abandoned.
    let split = encode_frame(&pb::ToolSocketRequest { id: 10, call: call(&token, "echo", json!({"n": 10})) });
    socket.send(8, call(&token, "echo", json!({"n": 8}))).await;
    socket.0.write_all(&split[..3]).await.unwrap();
    let response = socket.next().await.expect("an answer");
    assert_eq!(response.id, 8, "answered while the next frame is a header's three bytes in");
    socket.0.write_all(&split[3..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    socket.0.write_all(&split[10..]).await.unwrap();
    let response = socket.next().await.expect("an answer");
    assert_eq!((response.id, result_json(&response)), (10, json!({"n": 10})));

    // Refusals keep the connection.
    socket.send(11, None).await;
    let response = socket.next().await.unwrap();
    assert_eq!((response.id, refusal(&response)), (11, "INVALID_ARGUMENT"));
    socket.send(12, Some(Call::ListTools(pb::ListToolsRequest { tool_token: "c".repeat(64) }))).await;
    let response = socket.next().await.unwrap();
    assert_eq!((response.id, refusal(&response)), (12, "TOOL_TOKEN_INVALID"));
    socket.send(13, call(&token, "update_counter", json!({"delta": "two"}))).await;
    let response = socket.next().await.unwrap();
    assert_eq!((response.id, refusal(&response)), (13, "TOOL_ARGS_INVALID"));
    socket.send(14, Some(Call::ListTools(pb::ListToolsRequest { tool_token: token.clone() }))).await;
    let Some(Answer::ListTools(listed)) = socket.next().await.unwrap().result else { panic!("a listing") };
    assert_eq!(listed.tools.len(), 3);

    // Frames that cannot be read end the connection, after one answer with
    // id 0 that says why; Core reads no further.
    let bad_frames: [Vec<u8>; 3] = [
        ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec(),
        u32::MAX.to_le_bytes().to_vec(),
        [&3u32.to_le_bytes()[..], &[0xff, 0xff, 0xff]].concat(),
    ];
    for frame in bad_frames {
        let mut bad = RawSocket::connect(&h).await;
        bad.0.write_all(&frame).await.unwrap();
        let response = bad.next().await.expect("the reason");
        assert_eq!((response.id, refusal(&response)), (0, "INVALID_ARGUMENT"), "{frame:?}");
        assert!(bad.closed().await, "{frame:?}");
    }
    // A frame cut short by the client's close.
    let mut cut = RawSocket::connect(&h).await;
    cut.0.write_all(&100u32.to_le_bytes()).await.unwrap();
    cut.0.write_all(&[0u8; 10]).await.unwrap();
    cut.0.shutdown().await.unwrap();
    let response = cut.next().await;
    assert!(response.is_none() || response.is_some_and(|r| r.id == 0), "at most the reason, then the end");

    // A call whose client went away is withdrawn at once: `hold` has no
    // handler, so only the abandonment can settle it.
    let mut gone = RawSocket::connect(&h).await;
    gone.send(1, call(&token, "hold", json!({}))).await;
    let pending = |want: usize| {
        let h = &h;
        let id = session.session_id().to_owned();
        async move {
            for _ in 0..500 {
                let mut raw = h.raw().await;
                let request = pb::SubscribeRequest { session_id: id.clone(), caller_origin: ORIGIN.into() };
                let mut events = raw.subscribe(request).await.unwrap().into_inner();
                if let Some(pb::session_event::Kind::Snapshot(s)) = events.message().await.unwrap().unwrap().kind
                    && s.pending_tools.len() == want
                {
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("never {want} pending tool calls");
        }
    };
    assert_eq!(pending(1).await.status, pb::SessionStatus::WaitingToolResult as i32);
    drop(gone);
    assert_eq!(pending(0).await.status, pb::SessionStatus::Running as i32, "withdrawn, the turn runs on");
    socket.send(15, call(&token, "update_counter", json!({"delta": 10}))).await;
    assert_eq!(socket.next().await.unwrap().id, 15, "the other connection is unharmed");
    assert_eq!(*counter.lock().unwrap(), 12);

    session.end().await.unwrap();
    turn.await.unwrap();
}
