//! `pedelec-fake-acp`: the fake ACP agent described in the crate docs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation, InitializeRequest,
    InitializeResponse, LoadSessionRequest, LoadSessionResponse, McpServer, NewSessionRequest, NewSessionResponse,
    PermissionOption, PermissionOptionKind, PromptRequest, PromptResponse, ReadTextFileRequest,
    RequestPermissionOutcome, RequestPermissionRequest, SessionConfigOption, SessionNotification, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, StopReason, TextContent, ToolCall, ToolCallLocation,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, Usage,
};
use agent_client_protocol::{Agent, Client, Lines};
use futures::{SinkExt, StreamExt};
use pedelec_test_agents::log::EventLog;
use pedelec_test_agents::mcp::McpClient;
use pedelec_test_agents::percentile_us;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const LOG_ENV: &str = "PEDELEC_FAKE_ACP_LOG";
const NO_LOAD_ENV: &str = "PEDELEC_FAKE_ACP_NO_LOAD";
const AUTH_ENV: &str = "PEDELEC_FAKE_ACP_NEEDS_AUTH";
const TOKEN_ENV: &str = "PEDELEC_TOOL_TOKEN";

/// One ACP session: where its MCP servers come from and what was said.
struct Session {
    mcp_servers: Vec<McpServer>,
    history: Vec<String>,
    mcp: Option<Arc<McpClient>>,
}

struct Fake {
    log: EventLog,
    /// Raw bytes for stdout, in order with the protocol's own lines.
    raw: futures::channel::mpsc::UnboundedSender<Vec<u8>>,
    sessions: Mutex<HashMap<String, Session>>,
    next: AtomicU64,
    store: Option<PathBuf>,
}

type FakeRef = Arc<Fake>;

impl Fake {
    fn store_path(&self, id: &str) -> Option<PathBuf> {
        self.store.as_ref().map(|dir| dir.join(format!("{id}.json")))
    }

    fn persist(&self, id: &str, history: &[String]) {
        if let Some(path) = self.store_path(id) {
            let _ = std::fs::create_dir_all(path.parent().expect("a file in the store"));
            let _ = std::fs::write(path, serde_json::to_string(history).unwrap_or_default());
        }
    }

    fn stored_history(&self, id: &str) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(self.store_path(id)?).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// The config options every session offers: a model and a thought level.
fn config_options() -> Vec<SessionConfigOption> {
    serde_json::from_value(json!([
        { "id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "fake-small",
          "options": [{ "value": "fake-small", "name": "Fake Small" }, { "value": "fake-large", "name": "Fake Large" }] },
        { "id": "thinking", "name": "Thinking", "category": "thought_level", "type": "select", "currentValue": "medium",
          "options": [{ "value": "low", "name": "Low" }, { "value": "medium", "name": "Medium" },
                      { "value": "high", "name": "High" }] }
    ]))
    .expect("valid config options")
}

/// `session/new` params as the log shows them: env values become their length.
fn redacted_servers(servers: &[McpServer]) -> Value {
    Value::Array(
        servers
            .iter()
            .map(|server| match server {
                McpServer::Stdio(stdio) => json!({
                    "name": stdio.name,
                    "command": stdio.command,
                    "args": stdio.args,
                    "env": stdio.env.iter().map(|e| json!({ "name": e.name, "valueLen": e.value.len() })).collect::<Vec<_>>(),
                }),
                other => json!({ "other": format!("{other:?}").chars().take(80).collect::<String>() }),
            })
            .collect(),
    )
}

fn text_of(prompt: &[ContentBlock]) -> String {
    prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

/// The command is the last paragraph: guidance, if any, comes first.
fn command_of(text: &str) -> &str {
    text.rsplit("\n\n").next().unwrap_or(text).trim()
}

fn chunk(session: &str, text: impl Into<String>) -> SessionNotification {
    SessionNotification::new(
        session.to_owned(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(text)))),
    )
}

/// Sends `text` as three chunks (the client must join them).
fn say(cx: &ConnectionTo<Client>, session: &str, text: &str) -> agent_client_protocol::Result<()> {
    let chars: Vec<char> = text.chars().collect();
    let third = chars.len().div_ceil(3).max(1);
    for piece in chars.chunks(third) {
        cx.send_notification(chunk(session, piece.iter().collect::<String>()))?;
    }
    Ok(())
}

async fn mcp_for(fake: &FakeRef, session: &str) -> Result<Arc<McpClient>, String> {
    let servers = {
        let sessions = fake.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = sessions.get(session).ok_or("no such session")?;
        if let Some(mcp) = &entry.mcp {
            return Ok(mcp.clone());
        }
        entry.mcp_servers.clone()
    };
    let Some(McpServer::Stdio(server)) = servers.first() else {
        return Err("session/new gave no stdio MCP server".into());
    };
    let env: Vec<(String, String)> = server.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
    let client = McpClient::start(&server.command, &server.args, &env).await?;
    let token = env.iter().find(|(k, _)| k == TOKEN_ENV).map(|(_, v)| v.clone()).unwrap_or_default();
    let cmdline = client
        .pid()
        .and_then(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let names = client.tool_names().await?;
    fake.log.record(
        "mcp_started",
        json!({
            "pid": client.pid(),
            "command": server.command,
            "args": server.args,
            "tokenLen": token.len(),
            "tokenInMcpCmdline": !token.is_empty() && cmdline.contains(&token),
            "tokenInAgentArgv": !token.is_empty() && std::env::args().any(|a| a.contains(&token)),
        }),
    );
    fake.log.record("tools_list", json!({ "names": names }));
    let client = Arc::new(client);
    if let Some(entry) = fake.sessions.lock().unwrap_or_else(|p| p.into_inner()).get_mut(session) {
        entry.mcp = Some(client.clone());
    }
    Ok(client)
}

/// The tool call a `permission KIND PATH` command asks about.
fn permission_asked(fake: &Fake, what: &str) -> ToolCallUpdate {
    let (kind, path) = what.split_once(' ').unwrap_or((what, ""));
    let kind: ToolKind = serde_json::from_value(json!(kind)).unwrap_or(ToolKind::Other);
    let id = format!("perm-{}", fake.next.fetch_add(1, Ordering::Relaxed));
    let mut fields = ToolCallUpdateFields::new().title(what.to_owned()).kind(kind);
    if !path.trim().is_empty() {
        fields = fields.locations(vec![ToolCallLocation::new(path.trim())]);
    }
    ToolCallUpdate::new(id, fields)
}

async fn ask_permission(
    fake: &FakeRef,
    cx: &ConnectionTo<Client>,
    session: &str,
    call: ToolCallUpdate,
) -> agent_client_protocol::Result<String> {
    let options = vec![
        PermissionOption::new("opt-allow-once", "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new("opt-allow-always", "Always allow", PermissionOptionKind::AllowAlways),
        PermissionOption::new("opt-reject-once", "Reject", PermissionOptionKind::RejectOnce),
    ];
    let response =
        cx.send_request(RequestPermissionRequest::new(session.to_owned(), call, options)).block_task().await?;
    let chosen = match response.outcome {
        RequestPermissionOutcome::Selected(selected) => match selected.option_id.0.as_ref() {
            "opt-allow-once" => "allow_once",
            "opt-allow-always" => "allow_always",
            "opt-reject-once" => "reject_once",
            _ => "unknown_option",
        },
        _ => "cancelled",
    };
    fake.log.record("permission", json!({ "chosen": chosen }));
    Ok(chosen.to_owned())
}

/// Runs one prompt; the reply text and the response to send.
async fn run_prompt(
    fake: &FakeRef,
    cx: &ConnectionTo<Client>,
    session: &str,
    command: &str,
) -> agent_client_protocol::Result<PromptResponse> {
    let (word, rest) = command.split_once(' ').unwrap_or((command, ""));
    let rest = rest.trim();
    let mut usage = None;
    let reply = match word {
        _ if command.contains("Reply with exactly PEDELEC_PREPARED") => "PEDELEC_PREPARED".to_owned(),
        "tool" => {
            let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
            let id = format!("call-{}", fake.next.fetch_add(1, Ordering::Relaxed));
            let args: Value = serde_json::from_str(args.trim()).unwrap_or(Value::String(args.trim().to_owned()));
            let title = format!("pedelec/{name}");
            cx.send_notification(SessionNotification::new(
                session.to_owned(),
                SessionUpdate::ToolCall(
                    ToolCall::new(id.clone(), title.clone())
                        .kind(ToolKind::Other)
                        .status(ToolCallStatus::Pending)
                        .raw_input(args.clone()),
                ),
            ))?;
            let fields = ToolCallUpdateFields::new().title(title).kind(ToolKind::Other).raw_input(args.clone());
            let chosen = ask_permission(fake, cx, session, ToolCallUpdate::new(id.clone(), fields)).await?;
            if !chosen.starts_with("allow") {
                format!("ACP tool {name} refused: {chosen}")
            } else {
                let outcome = match mcp_for(fake, session).await {
                    Ok(mcp) => mcp.call_tool(name, args).await,
                    Err(error) => Err(error),
                };
                let (status, reply) = match outcome {
                    Ok(done) if done.is_error => {
                        (ToolCallStatus::Failed, format!("ACP tool {name} error: {}", done.text))
                    }
                    Ok(done) => (ToolCallStatus::Completed, format!("ACP tool {name}: {}", done.text)),
                    Err(error) => (ToolCallStatus::Failed, format!("ACP tool {name} failed: {error}")),
                };
                cx.send_notification(SessionNotification::new(
                    session.to_owned(),
                    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, ToolCallUpdateFields::new().status(status))),
                ))?;
                reply
            }
        }
        "tools" => {
            let mut parts = rest.splitn(3, ' ');
            let n: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(1);
            let name = parts.next().unwrap_or("");
            let args: Value = serde_json::from_str(parts.next().unwrap_or("{}")).unwrap_or(json!({}));
            match mcp_for(fake, session).await {
                Ok(mcp) => {
                    let mut times = Vec::with_capacity(n);
                    let mut failures = 0;
                    for _ in 0..n {
                        let started = Instant::now();
                        let outcome = mcp.call_tool(name, args.clone()).await;
                        times.push(started.elapsed());
                        if !matches!(outcome, Ok(ref done) if !done.is_error) {
                            failures += 1;
                        }
                    }
                    times.sort();
                    format!(
                        "ACP tools: {n} calls, p50 {} µs, p99 {} µs, {failures} failed",
                        percentile_us(&times, 0.5),
                        percentile_us(&times, 0.99)
                    )
                }
                Err(error) => format!("ACP tools failed: {error}"),
            }
        }
        "permission" => {
            let chosen = ask_permission(fake, cx, session, permission_asked(fake, rest)).await?;
            format!("ACP permission: {chosen}")
        }
        "permission-as" => {
            // A permission request naming another ACP session (`SESSION KIND PATH`):
            // what an agent confused (or steered) about whose request it is sends.
            let (other, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let chosen = ask_permission(fake, cx, other, permission_asked(fake, rest)).await?;
            format!("ACP permission: {chosen}")
        }
        "fs" => {
            // Pedelec advertises no fs capability: the request must be refused, not hang.
            match cx.send_request(ReadTextFileRequest::new(session.to_owned(), rest)).block_task().await {
                Ok(read) => format!("ACP fs: read {} bytes", read.content.len()),
                Err(error) => format!("ACP fs: error {}", i32::from(error.code)),
            }
        }
        "garbage" => {
            // Between messages, so no protocol line is torn: what a buggy
            // agent or a stray print would put on stdout.
            for line in [
                b"not json at all".to_vec(),
                b"[1,2]".to_vec(),
                vec![b'x'; 2 * 1024 * 1024],
                vec![0xff, 0xfe],
                Vec::new(),
            ] {
                let _ = fake.raw.unbounded_send(line);
            }
            "ACP garbage: still here".to_owned()
        }
        "fail" => {
            return Err(agent_client_protocol::Error::internal_error().data(json!(format!("asked to fail: {rest}"))));
        }
        "history" => {
            let sessions = fake.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let history = sessions.get(session).map(|s| s.history.clone()).unwrap_or_default();
            let earlier = &history[..history.len().saturating_sub(1)];
            format!("ACP history: {} earlier prompts: {}", earlier.len(), earlier.join(" | "))
        }
        "usage" => {
            usage = rest.parse::<u64>().ok();
            "ACP usage".to_owned()
        }
        "crash" => {
            cx.send_notification(chunk(session, "about to crash"))?;
            // Let the chunk reach the client before the process goes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            eprintln!("pedelec-fake-acp: crashing on purpose (fake stack trace)");
            std::process::exit(3);
        }
        "hang" => std::future::pending::<String>().await,
        // For the benchmark of deltas through a provider process: N short
        // `agent_message_chunk`s in ACP's wire format, written as lines of
        // their own (the crate's per-message dispatch would make this
        // process, not the client, what the benchmark measures). They go
        // into stdout's queue before the prompt's response does.
        "deltas" => {
            let session = serde_json::to_string(session).unwrap_or_default();
            for i in 0..rest.parse::<usize>().unwrap_or(0) {
                let line = format!(
                    r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{session},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"w{} "}}}}}}}}"#,
                    i % 10
                );
                let _ = fake.raw.unbounded_send(line.into_bytes());
            }
            String::new()
        }
        _ => {
            cx.send_notification(SessionNotification::new(
                session.to_owned(),
                SessionUpdate::AgentThoughtChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
                    "echoing the prompt",
                )))),
            ))?;
            format!("ACP echo: {command}")
        }
    };
    say(cx, session, &reply)?;
    let mut response = PromptResponse::new(StopReason::EndTurn);
    if let Some(total) = usage {
        response = response.usage(Usage::new(total, total / 2, total - total / 2));
    }
    Ok(response)
}

// One thread, as an agent's own loop: a tool call's answer is read and
// handed to the waiting call on the thread that waits, with no hop between
// worker threads (on two workers this stand-in had cost the ACP tool round
// trip ~30 µs more than a bare MCP client's).
#[tokio::main(flavor = "current_thread")]
async fn main() -> agent_client_protocol::Result<()> {
    let log = EventLog::from_env(LOG_ENV);
    let store = log.path().map(|p| PathBuf::from(format!("{}.sessions", p.display())));
    let mut env_names: Vec<String> = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
    env_names.sort();
    log.record(
        "start",
        json!({
            "pid": std::process::id(),
            "argv": std::env::args().collect::<Vec<_>>(),
            "cwd": std::env::current_dir().ok(),
            "envNames": env_names,
        }),
    );
    // Our own stdio transport (instead of the crate's `Stdio`) so `garbage`
    // can put raw lines on stdout in order with the protocol's.
    let (raw, mut out) = futures::channel::mpsc::unbounded::<Vec<u8>>();
    tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let mut batch = Vec::new();
        while let Some(line) = out.next().await {
            // What is already queued goes out in the same write.
            batch.extend_from_slice(&line);
            batch.push(b'\n');
            while batch.len() < 64 * 1024
                && let Ok(line) = out.try_recv()
            {
                batch.extend_from_slice(&line);
                batch.push(b'\n');
            }
            if stdout.write_all(&batch).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
            batch.clear();
        }
    });
    let outgoing = raw
        .clone()
        .sink_map_err(std::io::Error::other)
        .with(async |line: String| Ok::<_, std::io::Error>(line.into_bytes()));
    let incoming = futures::stream::unfold(tokio::io::BufReader::new(tokio::io::stdin()).lines(), async |mut lines| {
        match lines.next_line().await {
            Ok(Some(line)) => Some((Ok(line), lines)),
            Ok(None) => None,
            Err(error) => Some((Err(error), lines)),
        }
    });
    let transport = Lines::new(Box::pin(outgoing), Box::pin(incoming));
    let fake: FakeRef = Arc::new(Fake { log, raw, sessions: Mutex::default(), next: AtomicU64::new(1), store });

    let f_init = fake.clone();
    let f_new = fake.clone();
    let f_load = fake.clone();
    let f_prompt = fake.clone();
    let f_cancel = fake.clone();
    let f_config = fake.clone();
    Agent
        .v1()
        .name("pedelec-fake-acp")
        .on_receive_request(
            async move |init: InitializeRequest, responder, _cx| {
                f_init.log.record(
                    "initialize",
                    json!({ "clientCapabilities": init.client_capabilities, "clientInfo": init.client_info }),
                );
                let load = std::env::var_os(NO_LOAD_ENV).is_none();
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(AgentCapabilities::new().load_session(load))
                        .agent_info(Implementation::new("pedelec-fake-acp", env!("CARGO_PKG_VERSION"))),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |new: NewSessionRequest, responder, _cx| {
                if std::env::var_os(AUTH_ENV).is_some() {
                    return responder.respond_with_error(agent_client_protocol::Error::auth_required());
                }
                let id = format!("fake-{}-{}", std::process::id(), f_new.next.fetch_add(1, Ordering::Relaxed));
                f_new.log.record(
                    "session_new",
                    json!({ "sessionId": id, "cwd": new.cwd, "mcpServers": redacted_servers(&new.mcp_servers) }),
                );
                f_new.persist(&id, &[]);
                f_new
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.clone(), Session { mcp_servers: new.mcp_servers, history: Vec::new(), mcp: None });
                responder.respond(NewSessionResponse::new(id).config_options(config_options()))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |load: LoadSessionRequest, responder, cx| {
                let id = load.session_id.0.to_string();
                let known =
                    f_load.sessions.lock().unwrap_or_else(|p| p.into_inner()).get(&id).map(|s| s.history.clone());
                let history = known.or_else(|| f_load.stored_history(&id));
                f_load.log.record(
                    "session_load",
                    json!({
                        "sessionId": id,
                        "found": history.is_some(),
                        "cwd": load.cwd,
                        "mcpServers": redacted_servers(&load.mcp_servers),
                    }),
                );
                let Some(history) = history else {
                    return responder.respond_with_error(
                        agent_client_protocol::v1::schema::Error::resource_not_found(Some(id)).into(),
                    );
                };
                // The replay a real agent sends before answering; the client
                // must not mistake it for the next turn's output.
                for said in &history {
                    cx.send_notification(SessionNotification::new(
                        id.clone(),
                        SessionUpdate::UserMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
                            said.clone(),
                        )))),
                    ))?;
                    cx.send_notification(chunk(&id, format!("(replayed answer to {said})")))?;
                }
                f_load
                    .sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, Session { mcp_servers: load.mcp_servers, history, mcp: None });
                responder.respond(LoadSessionResponse::new().config_options(config_options()))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |prompt: PromptRequest, responder, cx| {
                let id = prompt.session_id.0.to_string();
                let text = text_of(&prompt.prompt);
                let command = command_of(&text).to_owned();
                let history = {
                    let mut sessions = f_prompt.sessions.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(session) = sessions.get_mut(&id) else {
                        drop(sessions);
                        return responder.respond_with_error(
                            agent_client_protocol::v1::schema::Error::resource_not_found(Some(id)).into(),
                        );
                    };
                    session.history.push(command.clone());
                    session.history.clone()
                };
                f_prompt.persist(&id, &history);
                f_prompt.log.record("prompt", json!({ "sessionId": id, "blocks": prompt.prompt.len(), "text": text }));
                // Off the dispatch loop: a prompt waits on permission answers
                // and must not block `session/cancel`.
                let fake = f_prompt.clone();
                let conn = cx.clone();
                cx.spawn(async move {
                    match run_prompt(&fake, &conn, &id, &command).await {
                        Ok(response) => responder.respond(response),
                        Err(error) => responder.respond_with_error(error),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |set: SetSessionConfigOptionRequest, responder, _cx| {
                let value = serde_json::to_value(&set.value).unwrap_or_default();
                f_config.log.record(
                    "set_config_option",
                    json!({ "sessionId": set.session_id.0.to_string(), "configId": set.config_id.0.to_string(),
                            "value": value["value"] }),
                );
                responder.respond(SetSessionConfigOptionResponse::new(config_options()))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |cancel: CancelNotification, _cx| {
                f_cancel.log.record("cancel", json!({ "sessionId": cancel.session_id.0.to_string() }));
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await
}
