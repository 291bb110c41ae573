//! The agent side of the tool broker: `pedelec-core mcp`, a stdio MCP
//! server. It reaches Core over the tool socket (`crate::tool_socket`) with
//! the session's tool token, read from the environment so it never shows on
//! a command line. (`pedelec-core tool call` is the `pedelec-tool` client's
//! code: see that crate.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pedelec_protocol::ErrorCode;
use pedelec_protocol::discovery::{self, Platform};
use pedelec_protocol::pb::{
    self, call_tool_response::Outcome, tool_socket_request::Call, tool_socket_response::Result as Answer,
};
use pedelec_protocol::tool_socket::{self, HEADER_LEN, decode_body, encode_frame, frame_len};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::providers::{PERMISSION_PROMPT_ENV, TOOL_TOKEN_ENV};

/// Why the bridge cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("{0} is not set; the bridge is started by Core with the session's tool token")]
    MissingEnv(&'static str),
    #[error("cannot reach Core's tool socket at {endpoint}: {source}")]
    Connect { endpoint: String, source: std::io::Error },
    #[error("{}: {}", .0.code, .0.message)]
    Refused(pb::Error),
    #[error("the MCP transport failed: {0}")]
    Mcp(String),
}

type Waiting = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>>;

/// One tool-socket connection, authenticated by one session's token. MCP
/// clients call tools concurrently, so requests are told apart by id: each
/// waits for its own answer, and a reader task hands answers out. When the
/// connection ends, every waiting call fails (the map becomes `None`).
#[derive(Clone)]
pub struct AgentToolsLink {
    writer: Arc<tokio::sync::Mutex<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>>,
    waiting: Waiting,
    next_id: Arc<AtomicU64>,
    token: String,
}

fn core_gone() -> pb::Error {
    pb::Error::new(ErrorCode::CoreRuntimeUnavailable, "the connection to Core's tool socket ended")
}

impl AgentToolsLink {
    /// Connects with the token and endpoint from the environment (the rule
    /// is `pedelec_protocol::tool_socket::endpoint_from_env`).
    pub async fn from_env() -> Result<Self, BridgeError> {
        let env = |k: &str| std::env::var(k).ok();
        let token = env(TOOL_TOKEN_ENV).ok_or(BridgeError::MissingEnv(TOOL_TOKEN_ENV))?;
        let endpoint = tool_socket::endpoint_from_env(Platform::current(), env).unwrap_or_else(|| {
            let core = discovery::default_socket(env, &discovery::default_state_dir(env));
            tool_socket::endpoint_for(Platform::current(), &core)
        });
        let stream = pedelec_ipc::connect_local(&endpoint)
            .await
            .map_err(|source| BridgeError::Connect { endpoint: endpoint.display().to_string(), source })?;
        let (reader, writer) = tokio::io::split(stream);
        let waiting: Waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(hand_out_answers(reader, waiting.clone()));
        Ok(AgentToolsLink {
            writer: Arc::new(tokio::sync::Mutex::new(Box::new(writer))),
            waiting,
            next_id: Arc::new(AtomicU64::new(1)),
            token,
        })
    }

    async fn round_trip(&self, call: Call) -> Result<Answer, pb::Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.waiting.lock().expect("waiting lock").as_mut() {
            Some(waiting) => waiting.insert(id, tx),
            None => return Err(core_gone()),
        };
        let frame = encode_frame(&pb::ToolSocketRequest { id, call: Some(call) });
        if self.writer.lock().await.write_all(&frame).await.is_err() {
            if let Some(waiting) = self.waiting.lock().expect("waiting lock").as_mut() {
                waiting.remove(&id);
            }
            return Err(core_gone());
        }
        match rx.await {
            Ok(Answer::Error(error)) => Err(error),
            Ok(answer) => Ok(answer),
            Err(_) => Err(core_gone()),
        }
    }

    pub async fn list(&self) -> Result<pb::ListToolsResponse, pb::Error> {
        match self.round_trip(Call::ListTools(pb::ListToolsRequest { tool_token: self.token.clone() })).await? {
            Answer::ListTools(listed) => Ok(listed),
            _ => Err(wrong_answer()),
        }
    }

    /// Asks whether claude may run `tool` with `input_json` (the permission prompt).
    pub async fn request_permission(
        &self,
        tool: &str,
        input_json: String,
    ) -> Result<pb::AgentPermissionResponse, pb::Error> {
        let request = pb::AgentPermissionRequest { tool_token: self.token.clone(), tool: tool.to_owned(), input_json };
        match self.round_trip(Call::RequestPermission(request)).await? {
            Answer::RequestPermission(answer) => Ok(answer),
            _ => Err(wrong_answer()),
        }
    }

    /// Calls a tool; `Ok` is the result JSON text, `Err` the broker's or the handler's error.
    pub async fn call(&self, tool: &str, args_json: String) -> Result<String, pb::Error> {
        let request = pb::CallToolRequest { tool_token: self.token.clone(), tool: tool.to_owned(), args_json };
        match self.round_trip(Call::CallTool(request)).await? {
            Answer::CallTool(pb::CallToolResponse { outcome: Some(Outcome::ResultJson(json)) }) => Ok(json),
            Answer::CallTool(pb::CallToolResponse { outcome: Some(Outcome::Error(error)) }) => Err(error),
            _ => Err(wrong_answer()),
        }
    }
}

fn wrong_answer() -> pb::Error {
    pb::Error::new(ErrorCode::Internal, "Core answered a different call")
}

/// Reads answers until the connection ends, then fails whatever still waits.
async fn hand_out_answers(mut reader: impl AsyncRead + Unpin, waiting: Waiting) {
    let mut reader = tokio::io::BufReader::new(&mut reader);
    loop {
        let mut header = [0u8; HEADER_LEN];
        if reader.read_exact(&mut header).await.is_err() {
            break;
        }
        let Ok(len) = frame_len(header) else { break };
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).await.is_err() {
            break;
        }
        let Ok(response) = decode_body::<pb::ToolSocketResponse>(&body) else { break };
        let waiter = waiting.lock().expect("waiting lock").as_mut().and_then(|w| w.remove(&response.id));
        if let (Some(waiter), Some(result)) = (waiter, response.result) {
            let _ = waiter.send(result);
        }
    }
    // Dropping the senders fails each waiting call with `core_gone`.
    waiting.lock().expect("waiting lock").take();
}

/// The MCP server: lists the session's tools and forwards calls to the broker.
#[derive(Clone)]
struct McpBridge {
    link: AgentToolsLink,
    guidance: Arc<str>,
    /// Serve the permission-prompt tool too ([`PERMISSION_PROMPT_ENV`]).
    permission_prompt: bool,
}

/// The permission-prompt tool as claude calls it: `{tool_name, input, tool_use_id}`.
fn permission_prompt_tool() -> Tool {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "tool_name": { "type": "string" },
            "input": { "type": "object" },
            "tool_use_id": { "type": "string" },
        },
        "required": ["tool_name", "input"],
    });
    let serde_json::Value::Object(schema) = schema else { unreachable!("an object literal") };
    Tool::new(
        pedelec_protocol::tools::PERMISSION_PROMPT_TOOL,
        "Asks the application whether a tool may run (used by Claude Code's permission prompt).",
        Arc::new(schema),
    )
}

impl McpBridge {
    /// The permission prompt's answer in the shape claude parses: one text
    /// block `{"behavior":"allow","updatedInput":…}` or `{"behavior":"deny","message":…}`.
    async fn permission_prompt(&self, arguments: serde_json::Map<String, serde_json::Value>) -> CallToolResult {
        let tool = arguments.get("tool_name").and_then(|t| t.as_str()).unwrap_or_default().to_owned();
        let input = arguments.get("input").cloned().unwrap_or_else(|| serde_json::json!({}));
        let answer = match self.link.request_permission(&tool, input.to_string()).await {
            Ok(answer) if answer.allowed => serde_json::json!({ "behavior": "allow", "updatedInput": input }),
            Ok(answer) => serde_json::json!({ "behavior": "deny", "message": answer.message }),
            Err(error) => {
                serde_json::json!({ "behavior": "deny", "message": format!("{}: {}", error.code, error.message) })
            }
        };
        CallToolResult::success(vec![ContentBlock::text(answer.to_string())])
    }
}

fn to_mcp_tool(definition: pb::ToolDefinition) -> Tool {
    // The manifest was validated when the session was created: the schema is a JSON object.
    let schema = match serde_json::from_str::<serde_json::Value>(&definition.input_schema_json) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::from_iter([("type".to_owned(), serde_json::Value::from("object"))]),
    };
    let tool = Tool::new(definition.name, definition.description, Arc::new(schema));
    // The application's WebMCP `readOnlyHint`, as MCP spells the same hint.
    if definition.read_only_hint { tool.annotate(rmcp::model::ToolAnnotations::new().read_only(true)) } else { tool }
}

/// An MCP tool result for a broker outcome: a tool-level error carries the
/// code so the agent (and its model) can tell a timeout from bad arguments.
pub fn mcp_result(outcome: Result<String, pb::Error>) -> CallToolResult {
    match outcome {
        Ok(json) => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(json.clone())]);
            if let Ok(value @ serde_json::Value::Object(_)) = serde_json::from_str(&json) {
                result.structured_content = Some(value);
            }
            result
        }
        Err(error) => CallToolResult::error(vec![ContentBlock::text(format!("{}: {}", error.code, error.message))]),
    }
}

impl ServerHandler for McpBridge {
    fn get_info(&self) -> InitializeResult {
        let info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("pedelec", env!("CARGO_PKG_VERSION")));
        if self.guidance.is_empty() { info } else { info.with_instructions(self.guidance.to_string()) }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let listed = self
            .link
            .list()
            .await
            .map_err(|e| McpError::invalid_request(format!("{}: {}", e.code, e.message), None))?;
        let mut tools: Vec<Tool> = listed.tools.into_iter().map(to_mcp_tool).collect();
        if self.permission_prompt {
            tools.push(permission_prompt_tool());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if self.permission_prompt && request.name == pedelec_protocol::tools::PERMISSION_PROMPT_TOOL {
            return Ok(self.permission_prompt(request.arguments.unwrap_or_default()).await.into());
        }
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default()).to_string();
        let outcome = self.link.call(&request.name, args).await;
        if let Err(error) = &outcome
            && error.code == ErrorCode::ToolTokenInvalid.as_str()
        {
            // Not a tool failure: this bridge may not act for any session.
            return Err(McpError::invalid_request(format!("{}: {}", error.code, error.message), None));
        }
        Ok(mcp_result(outcome).into())
    }
}

/// `pedelec-core mcp`: serves MCP on stdio until the agent closes it.
pub async fn serve_mcp() -> Result<(), BridgeError> {
    let link = AgentToolsLink::from_env().await?;
    // Checked up front so a forged or stale token fails the server's start,
    // which agents report, instead of every call.
    let listed = link.list().await.map_err(BridgeError::Refused)?;
    let permission_prompt = std::env::var(PERMISSION_PROMPT_ENV).is_ok_and(|v| v == "1");
    let bridge = McpBridge { link, guidance: listed.guidance.into(), permission_prompt };
    let running = bridge.serve(stdio()).await.map_err(|e| BridgeError::Mcp(e.to_string()))?;
    running.waiting().await.map_err(|e| BridgeError::Mcp(e.to_string()))?;
    Ok(())
}

type StdioReader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type StdioWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The bridge's stdio, read and written on the reactor where the agent
/// passed something pollable: tokio's blocking stdio costs a thread
/// hand-off per message each way, a large part of a tool call's round trip. Pipes (codex, Rust agents) go through rmcp's
/// `stdio_pipes`; sockets (Node's libuv passes a socketpair for each of
/// stdin and stdout: claude, gemini, opencode) become Unix streams. A
/// terminal, a file or a mix gets the blocking handles, as before.
fn stdio() -> (StdioReader, StdioWriter) {
    #[cfg(unix)]
    if let Some((read, write)) = socket_stdio() {
        return (Box::new(read), Box::new(write));
    }
    let (read, write) = rmcp::transport::stdio_pipes();
    (Box::new(read), Box::new(write))
}

/// stdin and stdout as non-blocking streams, when both are sockets. Only
/// then is anything changed: `O_NONBLOCK` is set on descriptions that
/// nothing else in this process reads or writes, and that no child inherits
/// (the bridge starts none).
#[cfg(unix)]
fn socket_stdio() -> Option<(tokio::net::UnixStream, tokio::net::UnixStream)> {
    use std::os::fd::AsFd;
    socket_streams(std::io::stdin().as_fd(), std::io::stdout().as_fd())
}

#[cfg(unix)]
fn socket_streams(
    read: std::os::fd::BorrowedFd<'_>,
    write: std::os::fd::BorrowedFd<'_>,
) -> Option<(tokio::net::UnixStream, tokio::net::UnixStream)> {
    use std::os::unix::fs::FileTypeExt;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| -> Option<std::fs::File> {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        file.metadata().ok()?.file_type().is_socket().then_some(file)
    };
    let (read, write) = (dup(read)?, dup(write)?);
    let stream = |file: std::fs::File| -> Option<tokio::net::UnixStream> {
        let stream = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(file));
        stream.set_nonblocking(true).ok()?;
        tokio::net::UnixStream::from_std(stream).ok()
    };
    Some((stream(read)?, stream(write)?))
}

#[cfg(all(test, unix))]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn socket_stdio_is_polled_and_anything_else_is_left_alone() {
        let (mut agent_in, bridge_in) = UnixStream::pair().unwrap();
        let (mut agent_out, bridge_out) = UnixStream::pair().unwrap();
        let (mut read, mut write) = super::socket_streams(bridge_in.as_fd(), bridge_out.as_fd()).expect("two sockets");
        agent_in.write_all(b"{\"jsonrpc\":\"2.0\"}\n").unwrap();
        let mut line = [0u8; 18];
        read.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"{\"jsonrpc\":\"2.0\"}\n");
        write.write_all(b"ok\n").await.unwrap();
        let mut answer = [0u8; 3];
        agent_out.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"ok\n");

        // A pipe (or a file, a terminal) beside a socket: nothing is taken,
        // and the socket stays blocking for the blocking handles.
        let (pipe_read, _pipe_write) = std::io::pipe().unwrap();
        let (_other, lone) = UnixStream::pair().unwrap();
        assert!(super::socket_streams(pipe_read.as_fd(), lone.as_fd()).is_none());
        assert!(super::socket_streams(lone.as_fd(), pipe_read.as_fd()).is_none());
        // Still blocking: a read waits out its timeout instead of failing at once.
        lone.set_read_timeout(Some(std::time::Duration::from_millis(50))).unwrap();
        let started = std::time::Instant::now();
        assert!((&lone).read(&mut [0u8; 1]).is_err());
        assert!(started.elapsed() >= std::time::Duration::from_millis(40), "{:?}", started.elapsed());
    }
}
