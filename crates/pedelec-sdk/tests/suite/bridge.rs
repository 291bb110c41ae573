//! The MCP bridge (`pedelec-core mcp`) and `pedelec-core tool call`, driven
//! the way an agent drives them: a child process with the tool token in its
//! environment, newline-delimited JSON-RPC on stdio.

use std::process::Stdio;

use pedelec_sdk::{SessionOptions, ToolSpec, sync_handler};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

pub struct McpClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
    /// Replies that arrived while waiting for another id (rmcp answers concurrently).
    early: Vec<Value>,
}

pub fn bridge_command(socket: &std::path::Path, token: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(pedelec_sdk::daemon::find_core_binary());
    command
        .args(args)
        .env("PEDELEC_TOOL_TOKEN", token)
        .env("PEDELEC_CORE_SOCKET", socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

impl McpClient {
    pub async fn start(socket: &std::path::Path, token: &str) -> Self {
        let mut child = bridge_command(socket, token, &["mcp"]).spawn().expect("pedelec-core mcp starts");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = McpClient { child, stdin, lines, next_id: 1, early: Vec::new() };
        let init = client
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test-agent", "version": "1"}}),
            )
            .await;
        assert_eq!(init["result"]["serverInfo"]["name"], "pedelec", "{init}");
        client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        client
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        self.reply(id).await
    }

    async fn reply(&mut self, id: u64) -> Value {
        if let Some(i) = self.early.iter().position(|m| m["id"] == id) {
            return self.early.remove(i);
        }
        loop {
            let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
                .await
                .expect("the bridge answers")
                .unwrap()
                .expect("the bridge is still running");
            let message: Value = serde_json::from_str(&line).expect("stdout carries only JSON-RPC");
            if message["id"] == id {
                return message;
            }
            self.early.push(message);
        }
    }

    /// `tools/call`; the result object.
    pub async fn call(&mut self, name: &str, arguments: Value) -> Value {
        let reply = self.request("tools/call", json!({"name": name, "arguments": arguments})).await;
        reply["result"].clone()
    }

    pub async fn close(mut self) {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "the bridge exits cleanly when the agent closes stdin");
    }
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

fn token_of(h: &Harness, session: &PedelecSession) -> String {
    h.tool_token(session.session_id())
}

/// Marked read-only (WebMCP's `readOnlyHint`): the agent's MCP listing carries the annotation.
fn failing_tool() -> ToolSpec {
    ToolSpec::new("explode".to_string(), "Always fails", schema_object())
        .read_only()
        .with_handler(sync_handler(|_: Value, _| Err::<Value, _>("the page is not ready".to_string())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_lists_the_sessions_tools_and_routes_calls_to_the_handler() {
    let h = Harness::start();
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions {
            tools: vec![counter_tool(counter.clone()), failing_tool()],
            guidance: "Use the counter.".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut mcp = McpClient::start(&h.socket(), &token_of(&h, &session)).await;
    let listed = mcp.request("tools/list", json!({})).await;
    insta::assert_json_snapshot!("mcp_tools_list", listed["result"]);

    // Calls reach the handler only during a turn (the agent acts inside one).
    let sess = session.clone();
    let turn = tokio::spawn(async move { sess.send_text("/sleep 60000").await });
    core_running(&h, &session).await;
    let ok = mcp.call("update_counter", json!({"delta": 5})).await;
    assert_eq!(ok["isError"], false, "{ok}");
    assert_eq!(serde_json::from_str::<Value>(&text_of(&ok)).unwrap(), json!({"value": 5}));
    assert_eq!(ok["structuredContent"], json!({"value": 5}));
    assert_eq!(*counter.lock().unwrap(), 5);

    let unknown = mcp.call("no_such_tool", json!({})).await;
    assert_eq!(unknown["isError"], true);
    assert!(text_of(&unknown).starts_with("TOOL_NOT_FOUND:"), "{unknown}");
    let invalid = mcp.call("update_counter", json!({"delta": "five"})).await;
    assert!(text_of(&invalid).starts_with("TOOL_ARGS_INVALID:"), "{invalid}");
    let failed = mcp.call("explode", json!({})).await;
    assert!(text_of(&failed).starts_with("TOOL_HANDLER_ERROR:"), "{failed}");
    assert!(text_of(&failed).contains("the page is not ready"));
    mcp.close().await;
    // The turn only held the session running; ending it stops the wait.
    session.end().await.unwrap();
    assert!(turn.await.unwrap().is_err(), "the ended turn does not complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_outlives_its_timeout_reaches_the_agent_as_tool_timeout() {
    let h = Harness::start();
    let client = h.client().await;
    let slow = ToolSpec::new("slow".to_string(), "Never answers in time", schema_object())
        .timeout_ms(200)
        .with_handler(pedelec_sdk::handler(|_: Value, _| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, String>(json!(null))
        }));
    let session = client.create_session(SessionOptions { tools: vec![slow], ..Default::default() }).await.unwrap();
    let mut mcp = McpClient::start(&h.socket(), &token_of(&h, &session)).await;
    let sess = session.clone();
    let turn = tokio::spawn(async move { sess.send_text("/sleep 60000").await });
    core_running(&h, &session).await;
    let timed_out = mcp.call("slow", json!({})).await;
    assert!(text_of(&timed_out).starts_with("TOOL_TIMEOUT:"), "{timed_out}");
    // The turn only held the session running; ending it stops the wait.
    session.end().await.unwrap();
    assert!(turn.await.unwrap().is_err(), "the ended turn does not complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_foreign_and_ended_tokens_are_refused() {
    let h = Harness::start();
    let client = h.client().await;
    let (mine, _) = counter_session(&client).await;
    let theirs = client
        .create_session(SessionOptions {
            tools: vec![ToolSpec::new("their_tool".to_string(), "Theirs", schema_object())],
            ..Default::default()
        })
        .await
        .unwrap();

    // Another session's token reaches that session's tools only.
    let mut mcp = McpClient::start(&h.socket(), &token_of(&h, &theirs)).await;
    let listed = mcp.request("tools/list", json!({})).await;
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["their_tool"]);
    mcp.close().await;

    let refused = |output: std::process::Output| {
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let forged = bridge_command(&h.socket(), &"a".repeat(64), &["mcp"]).output().await.unwrap();
    assert!(refused(forged).contains("TOOL_TOKEN_INVALID"));
    let mine_token = token_of(&h, &mine);
    mine.end().await.unwrap();
    let ended = bridge_command(&h.socket(), &mine_token, &["mcp"]).output().await.unwrap();
    assert!(refused(ended).contains("TOOL_TOKEN_INVALID"));
    let missing = tokio::process::Command::new(pedelec_sdk::daemon::find_core_binary())
        .arg("mcp")
        .env_remove("PEDELEC_TOOL_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(refused(missing).contains("PEDELEC_TOOL_TOKEN is not set"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_from_a_shell_has_the_same_authentication_and_results() {
    let h = Harness::start();
    let client = h.client().await;
    let (session, counter) = counter_session(&client).await;
    let token = token_of(&h, &session);
    let sess = session.clone();
    let turn = tokio::spawn(async move { sess.send_text("/sleep 60000").await });
    core_running(&h, &session).await;

    let run = |token: String, args: &'static [&'static str]| {
        let socket = h.socket();
        async move { bridge_command(&socket, &token, args).output().await.unwrap() }
    };
    let ok = run(token.clone(), &["tool", "call", "update_counter", r#"{"delta":3}"#]).await;
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&ok.stdout).unwrap(), json!({"value": 3}));
    assert_eq!(*counter.lock().unwrap(), 3);

    let listed = run(token.clone(), &["tool", "list"]).await;
    let first: Value = serde_json::from_slice(listed.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["name"], "update_counter");

    for (args, code, exit) in [
        (&["tool", "call", "update_counter", r#"{"delta":"x"}"#][..], "TOOL_ARGS_INVALID", 1),
        (&["tool", "call", "nope", "{}"][..], "TOOL_NOT_FOUND", 1),
        (&["tool", "call", "update_counter", "not json"][..], "TOOL_ARGS_INVALID", 1),
    ] {
        let args: &'static [&'static str] = Box::leak(args.to_vec().into_boxed_slice());
        let out = run(token.clone(), args).await;
        assert_eq!(out.status.code(), Some(exit), "{args:?}");
        let error: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(error["code"], code, "{args:?}");
    }
    let forged = run("b".repeat(64), &["tool", "call", "update_counter", "{}"]).await;
    assert_eq!(forged.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&forged.stderr).contains("TOOL_TOKEN_INVALID"));
    // The turn only held the session running; ending it stops the wait.
    session.end().await.unwrap();
    assert!(turn.await.unwrap().is_err(), "the ended turn does not complete");
}
