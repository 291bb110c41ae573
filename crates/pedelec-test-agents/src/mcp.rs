//! A minimal MCP client over stdio: newline-delimited JSON-RPC to a server
//! process the agent spawns. Servers may answer concurrent requests out of
//! order (rmcp does), so replies are matched to requests by id.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// One running MCP server and the requests waiting for its answers.
pub struct McpClient {
    child: Child,
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiters: Waiters,
    next_id: AtomicU64,
}

/// What a `tools/call` came back with.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    pub is_error: bool,
    /// The text content blocks, joined.
    pub text: String,
}

impl McpClient {
    /// Spawns `command args` with `env` added, and completes the MCP handshake
    /// (`initialize`, then `notifications/initialized`).
    pub async fn start(command: &Path, args: &[String], env: &[(String, String)]) -> Result<Self, String> {
        let mut child = Command::new(command)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the MCP server {}: {e}", command.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let waiters: Waiters = Arc::default();
        let routes = waiters.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("pedelec-fake-acp: MCP server wrote a non-JSON line: {line}");
                    continue;
                };
                // Only responses carry a numeric id we issued; server-initiated
                // requests and notifications are not needed by this client.
                if let Some(id) = message.get("id").and_then(Value::as_u64)
                    && message.get("method").is_none()
                    && let Some(waiter) = routes.lock().unwrap_or_else(|p| p.into_inner()).remove(&id)
                {
                    let _ = waiter.send(message);
                }
            }
            // EOF: dropping the remaining senders fails their requests.
            routes.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });
        let client = McpClient { child, stdin: tokio::sync::Mutex::new(stdin), waiters, next_id: AtomicU64::new(1) };
        client
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": { "name": "pedelec-fake-acp", "version": env!("CARGO_PKG_VERSION") },
                }),
            )
            .await?;
        client.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await?;
        Ok(client)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn send(&self, message: Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().await;
        stdin.write_all(line.as_bytes()).await.map_err(|e| format!("MCP write: {e}"))?;
        stdin.flush().await.map_err(|e| format!("MCP flush: {e}"))
    }

    /// One request; the `result`, or the JSON-RPC error as text.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await?;
        let reply = rx.await.map_err(|_| format!("the MCP server closed before answering {method}"))?;
        match (reply.get("result"), reply.get("error")) {
            (Some(result), _) => Ok(result.clone()),
            (None, Some(error)) => Err(format!(
                "JSON-RPC error {}: {}",
                error.get("code").unwrap_or(&Value::Null),
                error.get("message").and_then(Value::as_str).unwrap_or("")
            )),
            _ => Err(format!("a reply to {method} with neither result nor error")),
        }
    }

    /// The names `tools/list` reports.
    pub async fn tool_names(&self) -> Result<Vec<String>, String> {
        let listed = self.request("tools/list", json!({})).await?;
        Ok(listed["tools"]
            .as_array()
            .map(|tools| tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default())
    }

    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<ToolOutcome, String> {
        let result = self.request("tools/call", json!({ "name": name, "arguments": arguments })).await?;
        let text = result["content"]
            .as_array()
            .map(|blocks| blocks.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join(""))
            .unwrap_or_default();
        Ok(ToolOutcome { is_error: result["isError"].as_bool().unwrap_or(false), text })
    }
}
