//! The agent side of the tool broker: `pedelec-core mcp` (a stdio MCP
//! server) and `pedelec-core tool call NAME JSON` (for agents that only run
//! shell commands). Both reach Core's `AgentTools` service over the socket
//! with the session's tool token, read from the environment so it never
//! shows on a command line.

use std::path::PathBuf;
use std::sync::Arc;

use pedelec_protocol::pb::{self, agent_tools_client::AgentToolsClient, call_tool_response::Outcome};
use pedelec_protocol::{ErrorCode, grpc::error_from_status};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use tonic::transport::Channel;

use crate::providers::{PERMISSION_PROMPT_ENV, SOCKET_ENV, TOOL_TOKEN_ENV};

/// Why the bridge cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("{0} is not set; the bridge is started by Core with the session's tool token")]
    MissingEnv(&'static str),
    #[error("cannot reach Core at {socket}: {source}")]
    Connect { socket: String, source: tonic::transport::Error },
    #[error("{}: {}", .0.code, .0.message)]
    Refused(pb::Error),
    #[error("the MCP transport failed: {0}")]
    Mcp(String),
}

/// A connection to `AgentTools`, authenticated by one session's token.
#[derive(Clone)]
pub struct AgentToolsLink {
    client: AgentToolsClient<Channel>,
    token: String,
}

impl AgentToolsLink {
    /// Connects with the socket and token from the environment.
    pub async fn from_env() -> Result<Self, BridgeError> {
        let token = std::env::var(TOOL_TOKEN_ENV).map_err(|_| BridgeError::MissingEnv(TOOL_TOKEN_ENV))?;
        let socket = std::env::var_os(SOCKET_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::config::default_socket(&crate::config::default_state_dir()));
        let channel = pedelec_protocol::grpc::local_channel(&socket)
            .await
            .map_err(|source| BridgeError::Connect { socket: socket.display().to_string(), source })?;
        Ok(AgentToolsLink { client: pedelec_protocol::with_message_limits!(AgentToolsClient::new(channel)), token })
    }

    pub async fn list(&self) -> Result<pb::ListToolsResponse, pb::Error> {
        let request = pb::ListToolsRequest { tool_token: self.token.clone() };
        self.client.clone().list_tools(request).await.map(|r| r.into_inner()).map_err(|s| error_from_status(&s))
    }

    /// Asks whether claude may run `tool` with `input_json` (the permission prompt).
    pub async fn request_permission(
        &self,
        tool: &str,
        input_json: String,
    ) -> Result<pb::AgentPermissionResponse, pb::Error> {
        let request = pb::AgentPermissionRequest { tool_token: self.token.clone(), tool: tool.to_owned(), input_json };
        self.client.clone().request_permission(request).await.map(|r| r.into_inner()).map_err(|s| error_from_status(&s))
    }

    /// Calls a tool; `Ok` is the result JSON text, `Err` the broker's or the handler's error.
    pub async fn call(&self, tool: &str, args_json: String) -> Result<String, pb::Error> {
        let request = pb::CallToolRequest { tool_token: self.token.clone(), tool: tool.to_owned(), args_json };
        let response = self.client.clone().call_tool(request).await.map_err(|s| error_from_status(&s))?;
        match response.into_inner().outcome {
            Some(Outcome::ResultJson(json)) => Ok(json),
            Some(Outcome::Error(error)) => Err(error),
            None => Err(pb::Error::new(ErrorCode::Internal, "Core answered a tool call with no outcome")),
        }
    }
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
    Tool::new(definition.name, definition.description, Arc::new(schema))
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
    let running = bridge.serve(rmcp::transport::stdio()).await.map_err(|e| BridgeError::Mcp(e.to_string()))?;
    running.waiting().await.map_err(|e| BridgeError::Mcp(e.to_string()))?;
    Ok(())
}

/// `pedelec-core tool call NAME JSON`: prints the result JSON on stdout (exit 0)
/// or `{"code","message"}` on stderr (exit 1; 2 when the token is refused).
pub async fn tool_call(name: &str, args_json: &str) -> i32 {
    if let Err(e) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(args_json) {
        let error = pb::Error::new(ErrorCode::ToolArgsInvalid, format!("the arguments must be a JSON object: {e}"));
        return report(&error, 1);
    }
    let link = match AgentToolsLink::from_env().await {
        Ok(link) => link,
        Err(e) => return report(&pb::Error::new(ErrorCode::CoreRuntimeUnavailable, e.to_string()), 2),
    };
    match link.call(name, args_json.to_owned()).await {
        Ok(json) => {
            println!("{json}");
            0
        }
        Err(error) if error.code == ErrorCode::ToolTokenInvalid.as_str() => report(&error, 2),
        Err(error) => report(&error, 1),
    }
}

/// `pedelec-core tool list`: the session's tools as JSON lines.
pub async fn tool_list() -> i32 {
    let link = match AgentToolsLink::from_env().await {
        Ok(link) => link,
        Err(e) => return report(&pb::Error::new(ErrorCode::CoreRuntimeUnavailable, e.to_string()), 2),
    };
    match link.list().await {
        Ok(listed) => {
            for tool in listed.tools {
                let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
                println!(
                    "{}",
                    serde_json::json!({ "name": tool.name, "description": tool.description, "inputSchema": schema })
                );
            }
            0
        }
        Err(error) => report(&error, 2),
    }
}

fn report(error: &pb::Error, exit: i32) -> i32 {
    eprintln!("{}", serde_json::json!({ "code": error.code, "message": error.message }));
    exit
}
