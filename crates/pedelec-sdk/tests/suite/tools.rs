//! Seed: frontend tools (`onTool`, precedence, failures, recovery).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_sdk::{SessionOptions, SessionStatus, ToolName, ToolSpec, handler};
use serde_json::json;

use super::*;

fn replies(log: &Recorder) -> Vec<String> {
    log.lines().into_iter().filter(|l| l.starts_with("chat")).collect()
}

async fn handler_precedence_is_named_then_inline_then_generic(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let inline = ToolSpec::new("a".to_string(), "tool a", schema_object())
        .with_handler(handler(|_: serde_json::Value, _| async { Ok::<_, String>(json!("inline")) }));
    let plain = ToolSpec::new("b".to_string(), "tool b", schema_object());
    let session =
        client.create_session(SessionOptions { tools: vec![inline, plain], ..Default::default() }).await.unwrap();
    let log = Recorder::attach(&session);
    let _generic = session.on_any_tool(|name: String, _, _| async move { Ok(json!(format!("generic:{name}"))) });
    let named = session.on_tool_sync("a".to_string(), |_: serde_json::Value, _| Ok::<_, String>("named"));
    session.send_text("/tool a {}\n/tool b {}").await.unwrap();
    named.dispose();
    session.send_text("/tool a {}").await.unwrap();
    assert_eq!(
        replies(&log),
        vec![
            "chat \"Tool a returned \\\"named\\\". Tool b returned \\\"generic:b\\\".\" [user]",
            "chat \"Tool a returned \\\"inline\\\".\" [user]",
        ]
    );
}

async fn tool_contexts_name_the_request_and_the_tool(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session(SessionOptions {
            tools: vec![ToolSpec::new("t".to_string(), "t", schema_object())],
            ..Default::default()
        })
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let _off = session.on_tool_sync("t".to_string(), move |args: serde_json::Value, ctx| {
        *s.lock().unwrap() = Some((args, ctx));
        Ok::<_, String>(json!(1))
    });
    session.send_text("/tool t {\"k\": [1, 2]}").await.unwrap();
    let (args, ctx) = seen.lock().unwrap().clone().unwrap();
    assert_eq!(args, json!({"k": [1, 2]}));
    assert_eq!(ctx.kind.as_str(), "tool_call");
    assert_eq!(ctx.tool, "t");
    assert!(ctx.tool_request_id.starts_with("tool-"));
    assert!(ctx.turn_id.is_some());
}

/// A session with one tool `t` (no handler yet), and a recorder of it.
async fn session_with_tool_t(h: &Harness) -> (PedelecSession, Recorder) {
    let session = h
        .client()
        .await
        .create_session(SessionOptions {
            tools: vec![ToolSpec::new("t".to_string(), "t", schema_object())],
            ..Default::default()
        })
        .await
        .unwrap();
    let log = Recorder::attach(&session);
    (session, log)
}

async fn a_failing_handler_becomes_tool_handler_error_for_the_agent(via: Via) {
    let h = Harness::start_via(via);
    let (session, log) = session_with_tool_t(&h).await;
    let _off = session.on_tool("t".to_string(), |_: serde_json::Value, _| async { Err::<(), _>("disk full") });
    session.send_text("/tool t {}").await.unwrap();
    assert_eq!(replies(&log), vec!["chat \"Tool t failed with TOOL_HANDLER_ERROR: disk full.\" [user]"]);
}

async fn a_panicking_handler_becomes_tool_handler_error_for_the_agent(via: Via) {
    let h = Harness::start_via(via);
    let (session, log) = session_with_tool_t(&h).await;
    let _off = session.on_tool_sync("t".to_string(), |_: serde_json::Value, _| -> Result<(), String> {
        panic!("the handler's own bug")
    });
    // Without the catch, the agent would wait for TOOL_TIMEOUT (60 s) and this would time out.
    let turn = tokio::time::timeout(Duration::from_secs(20), session.send_text("/tool t {}"));
    turn.await.expect("the agent is answered at once").unwrap();
    assert_eq!(
        replies(&log),
        vec![
            "chat \"Tool t failed with TOOL_HANDLER_ERROR: the tool handler panicked: the handler's own bug.\" [user]"
        ]
    );
}

async fn arguments_are_validated_before_they_reach_the_app(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions { tools: vec![counter_tool(counter.clone())], ..Default::default() })
        .await
        .unwrap();
    let log = Recorder::attach(&session);
    session.send_text("/tool update_counter {\"delta\": \"two\"}\n/tool nope {}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 0, "the handler never ran");
    let reply = replies(&log).join("");
    assert!(reply.contains("Tool update_counter failed with TOOL_ARGS_INVALID"), "{reply}");
    assert!(reply.contains("Tool nope failed with TOOL_NOT_FOUND"), "{reply}");
}

async fn core_times_a_tool_out_and_a_late_result_is_refused(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let slow = ToolSpec::new("slow".to_string(), "slow", schema_object()).timeout_ms(200);
    let session = client.create_session(SessionOptions { tools: vec![slow], ..Default::default() }).await.unwrap();
    let log = Recorder::attach(&session);
    let _off = session.on_tool("slow".to_string(), |_: serde_json::Value, _| async {
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        Ok::<_, String>(json!("late"))
    });
    session.send_text("/tool slow {}").await.unwrap();
    assert!(replies(&log).join("").contains("failed with TOOL_TIMEOUT"));
    eventually("the late submit to fail", || log.count("error SUBMIT_TOOL_RESULT_FAILED [sdk/sdk_error]") == 1).await;
    assert_eq!(session.get_status(), SessionStatus::Idle, "an SDK error does not change status");
}

#[derive(Clone, Debug, PartialEq)]
enum Tools {
    UpdateCounter,
}

impl ToolName for Tools {
    fn as_str(&self) -> &str {
        "update_counter"
    }
    fn from_name(name: &str) -> Option<Self> {
        (name == "update_counter").then_some(Tools::UpdateCounter)
    }
}

async fn a_recovered_tool_call_waits_for_its_handler_after_resume_session(via: Via) {
    let h = Harness::start_via(via);
    let first = h.client().await;
    let spec = ToolSpec::new(Tools::UpdateCounter, "counter", schema_object());
    let session = first
        .create_session(SessionOptions { tools: vec![spec], auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/tool update_counter {\"delta\": 5}").await });
    eventually("waiting", || session.get_status() == SessionStatus::WaitingToolResult).await;

    let second = h.client().await;
    let recovered = second.resume_session::<Tools>(session.session_id()).await.unwrap();
    assert_eq!(
        recovered.get_status(),
        SessionStatus::WaitingToolResult,
        "synchronised from the snapshot before returning"
    );
    assert_eq!(recovered.provider(), "scripted");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(session.get_status(), SessionStatus::WaitingToolResult, "queued, not answered, without a handler");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let _off = recovered.on_tool_sync(Tools::UpdateCounter, move |args: serde_json::Value, _| {
        c.lock().unwrap().push(args);
        Ok::<_, String>(json!({"value": 5}))
    });
    turn.await.unwrap().unwrap();
    assert_eq!(*calls.lock().unwrap(), vec![json!({"delta": 5})]);
}

async fn generic_handlers_see_typed_names(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let spec = ToolSpec::new(Tools::UpdateCounter, "counter", schema_object());
    let session = client.create_session(SessionOptions { tools: vec![spec], ..Default::default() }).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _off = session.on_any_tool(move |name: Tools, _, _| {
        s.lock().unwrap().push(name);
        async { Ok(json!(0)) }
    });
    session.send_text("/tool update_counter {}").await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![Tools::UpdateCounter]);
}

super::over_both_transports!(
    handler_precedence_is_named_then_inline_then_generic,
    tool_contexts_name_the_request_and_the_tool,
    a_failing_handler_becomes_tool_handler_error_for_the_agent,
    a_panicking_handler_becomes_tool_handler_error_for_the_agent,
    arguments_are_validated_before_they_reach_the_app,
    core_times_a_tool_out_and_a_late_result_is_refused,
    a_recovered_tool_call_waits_for_its_handler_after_resume_session,
    generic_handlers_see_typed_names,
);

/// The turn timeout does not count the time a turn waits for a frontend
/// tool: a handler slower than the whole turn timeout (but within its own
/// tool timeout) still answers, and the turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_timeout_stops_counting_while_the_turn_waits_for_a_tool() {
    let h = Harness::with_config(Via::Grpc, "turn_timeout_secs = 1\n");
    let client = h.client().await;
    let slow = ToolSpec::new("slow".to_string(), "Answers after 1.5 s", schema_object()).with_handler(handler(
        |_: serde_json::Value, _| async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            Ok::<_, String>(json!({ "done": true }))
        },
    ));
    let session = client.create_session(SessionOptions { tools: vec![slow], ..Default::default() }).await.unwrap();
    session.send_text("/tool slow {}").await.expect("the turn outlives its timeout only by its tool wait");
    // Without a tool wait the timeout still holds.
    let err = session.send_text("/sleep 3000").await.unwrap_err();
    assert_eq!(err.details.as_ref().and_then(|d| d["providerCode"].as_str()), Some("PROVIDER_TIMEOUT"), "{err:?}");
}

/// A transport whose first `failures` tool-result submits fail to deliver.
struct FlakySubmits {
    inner: pedelec_sdk::grpc::GrpcTransport,
    failures: std::sync::atomic::AtomicU32,
}

impl pedelec_sdk::transport::Transport for FlakySubmits {
    fn call(
        &self,
        call: pedelec_sdk::transport::Call,
    ) -> pedelec_sdk::transport::BoxFuture<'static, Result<pedelec_sdk::transport::Reply, pedelec_sdk::PedelecError>>
    {
        use std::sync::atomic::Ordering;
        if matches!(call, pedelec_sdk::transport::Call::SubmitToolResult(_))
            && self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
        {
            let lost = pedelec_sdk::PedelecError::new(
                pedelec_sdk::ErrorCode::TransportError,
                "the request was lost on the way",
            );
            return Box::pin(async move { Err(lost) });
        }
        self.inner.call(call)
    }
    fn subscribe(
        &self,
        request: pb::SubscribeRequest,
    ) -> pedelec_sdk::transport::BoxFuture<
        'static,
        Result<pedelec_sdk::transport::EventStream, pedelec_sdk::PedelecError>,
    > {
        self.inner.subscribe(request)
    }
    fn spawn(&self, task: pedelec_sdk::transport::BoxFuture<'static, ()>) {
        self.inner.spawn(task)
    }
    fn sleep(&self, duration: Duration) -> pedelec_sdk::transport::BoxFuture<'static, ()> {
        self.inner.sleep(duration)
    }
}

/// A tool result that failed to reach Core is submitted again: the turn gets
/// the handler's answer, not TOOL_TIMEOUT, and nothing is reported failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_lost_on_the_way_is_submitted_again() {
    let h = Harness::start();
    let inner = pedelec_sdk::grpc::GrpcTransport::connect(h.socket()).await.unwrap();
    let transport = FlakySubmits { inner, failures: std::sync::atomic::AtomicU32::new(2) };
    let client = Pedelec::with_transport(Arc::new(transport), ORIGIN);
    let (session, counter) = counter_session(&client).await;
    let recorder = Recorder::attach(&session);
    session.send_text("/tool update_counter {\"delta\": 4}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 4);
    let lines = recorder.lines();
    assert!(lines.iter().any(|l| l.contains(r#"Tool update_counter returned {\"value\":4}"#)), "{lines:?}");
    assert_eq!(recorder.count("error "), 0, "{lines:?}");
}
