//! A blocking client for Core's tool socket, and the `tool call` / `tool
//! list` commands built on it (the `pedelec-tool` binary, and `pedelec-core
//! tool …`, run the same code).
//!
//! An agent that can only run shell commands calls a frontend tool by
//! starting this client, so its start is part of every call: it links no
//! async runtime and no HTTP/2, reads the session's tool token and Core's
//! endpoint from the environment (`PEDELEC_TOOL_TOKEN`, and
//! `PEDELEC_TOOL_ENDPOINT` or `PEDELEC_CORE_SOCKET`), sends one frame and
//! waits for one.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use pedelec_protocol::ErrorCode;
use pedelec_protocol::discovery::{self, Platform};
use pedelec_protocol::pb::{
    self, call_tool_response::Outcome, tool_socket_request::Call, tool_socket_response::Result as Answer,
};
use pedelec_protocol::tool_socket::{self, HEADER_LEN, decode_body, encode_frame, frame_len};

/// How long a call may wait for Core's answer: a tool's own deadline is at
/// most `MAX_TOOL_TIMEOUT`, after which Core answers `TOOL_TIMEOUT`; the
/// margin covers a Core that is slow to say so. Past it Core is taken to be
/// stuck, and the call fails instead of waiting for ever.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(pedelec_protocol::limits::MAX_TOOL_TIMEOUT.as_secs() + 60);

/// Why a call did not reach Core or did not come back.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0} is not set; Core sets it for the agents it starts")]
    MissingEnv(&'static str),
    #[error("cannot reach Core's tool socket at {endpoint}: {source}")]
    Connect { endpoint: String, source: std::io::Error },
    #[error("the tool socket failed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] tool_socket::FrameError),
    #[error("Core answered request {got} while request {want} was waiting")]
    WrongAnswer { want: u64, got: u64 },
}

impl LinkError {
    /// As an error on the wire: Core could not be asked.
    pub fn to_pb(&self) -> pb::Error {
        pb::Error::new(ErrorCode::CoreRuntimeUnavailable, self.to_string())
    }
}

#[cfg(unix)]
type Connection = std::os::unix::net::UnixStream;
#[cfg(windows)]
type Connection = std::fs::File;

/// One connection to the tool socket, authenticated by a session's token.
/// Calls on it run one at a time.
pub struct ToolClient {
    connection: Connection,
    token: String,
    next_id: u64,
}

impl ToolClient {
    /// Connects with the token and endpoint from the environment.
    pub fn from_env() -> Result<Self, LinkError> {
        let env = |k: &str| std::env::var(k).ok();
        let token = env(tool_socket::TOKEN_ENV).ok_or(LinkError::MissingEnv(tool_socket::TOKEN_ENV))?;
        let endpoint = tool_socket::endpoint_from_env(Platform::current(), env).unwrap_or_else(|| {
            let core = discovery::default_socket(env, &discovery::default_state_dir(env));
            tool_socket::endpoint_for(Platform::current(), &core)
        });
        Self::connect(&endpoint, token)
    }

    /// Connects to the tool socket at `endpoint`.
    pub fn connect(endpoint: &Path, token: String) -> Result<Self, LinkError> {
        let connection =
            open(endpoint).map_err(|source| LinkError::Connect { endpoint: endpoint.display().to_string(), source })?;
        Ok(ToolClient { connection, token, next_id: 1 })
    }

    /// The session's tools and guidance.
    pub fn list(&mut self) -> Result<Result<pb::ListToolsResponse, pb::Error>, LinkError> {
        let call = Call::ListTools(pb::ListToolsRequest { tool_token: self.token.clone() });
        Ok(match self.round_trip(call)? {
            Answer::ListTools(listed) => Ok(listed),
            other => Err(unexpected(other)),
        })
    }

    /// Calls `tool`; the inner `Ok` is the result JSON text, the inner `Err`
    /// Core's refusal or the handler's error.
    pub fn call(&mut self, tool: &str, args_json: String) -> Result<Result<String, pb::Error>, LinkError> {
        let call =
            Call::CallTool(pb::CallToolRequest { tool_token: self.token.clone(), tool: tool.to_owned(), args_json });
        Ok(match self.round_trip(call)? {
            Answer::CallTool(pb::CallToolResponse { outcome: Some(Outcome::ResultJson(json)) }) => Ok(json),
            Answer::CallTool(pb::CallToolResponse { outcome: Some(Outcome::Error(error)) }) => Err(error),
            other => Err(unexpected(other)),
        })
    }

    fn round_trip(&mut self, call: Call) -> Result<Answer, LinkError> {
        let id = self.next_id;
        self.next_id += 1;
        self.connection.write_all(&encode_frame(&pb::ToolSocketRequest { id, call: Some(call) }))?;
        let mut header = [0u8; HEADER_LEN];
        self.connection.read_exact(&mut header)?;
        let mut body = vec![0u8; frame_len(header)?];
        self.connection.read_exact(&mut body)?;
        let response: pb::ToolSocketResponse = decode_body(&body)?;
        if response.id != id {
            return Err(LinkError::WrongAnswer { want: id, got: response.id });
        }
        Ok(response
            .result
            .unwrap_or_else(|| Answer::Error(pb::Error::new(ErrorCode::Internal, "Core answered with no result"))))
    }
}

/// A refusal passes through; any other answer to the wrong call is Core's bug.
fn unexpected(answer: Answer) -> pb::Error {
    match answer {
        Answer::Error(error) => error,
        _ => pb::Error::new(ErrorCode::Internal, "Core answered a different call"),
    }
}

#[cfg(unix)]
fn open(endpoint: &Path) -> std::io::Result<Connection> {
    let connection = std::os::unix::net::UnixStream::connect(endpoint)?;
    connection.set_read_timeout(Some(ANSWER_DEADLINE))?;
    Ok(connection)
}

/// A named pipe opens as a file. Every instance taken answers
/// `ERROR_PIPE_BUSY` until Core offers the next (it does as it accepts), so
/// that is retried briefly. Windows gives a synchronous pipe no read
/// timeout; Core's own tool deadline is what ends a wait there. A pipe
/// served by another user's process is refused before anything (the token
/// first of all) is sent on it.
#[cfg(windows)]
fn open(endpoint: &Path) -> std::io::Result<Connection> {
    const ERROR_PIPE_BUSY: i32 = 231;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::OpenOptions::new().read(true).write(true).open(endpoint) {
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(pipe) => {
                use std::os::windows::io::AsRawHandle;
                pedelec_ipc::pipe_owner::check_server_is_current_user(pipe.as_raw_handle())?;
                return Ok(pipe);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The exit status of a tool command: 0 with the result on stdout, 1 when
/// the tool or its arguments failed, 2 when the session could not be
/// reached (a refused token, or no Core).
pub mod exit {
    pub const OK: u8 = 0;
    pub const FAILED: u8 = 1;
    pub const UNREACHABLE: u8 = 2;
}

/// `tool call NAME [JSON]`: prints the result JSON on stdout, or
/// `{"code","message"}` on stderr. `args_json` `None` is `{}`; `-` reads
/// the arguments from standard input (for arguments too long for a command
/// line).
pub fn run_call(name: &str, args_json: Option<&str>) -> u8 {
    let args = match args_json {
        None => "{}".to_owned(),
        Some("-") => {
            let mut text = String::new();
            let limit = pedelec_protocol::limits::MAX_TOOL_JSON_BYTES as u64 + 1;
            if let Err(e) = std::io::stdin().take(limit).read_to_string(&mut text) {
                return report(
                    &pb::Error::new(ErrorCode::ToolArgsInvalid, format!("reading the arguments: {e}")),
                    exit::FAILED,
                );
            }
            text
        }
        Some(text) => text.to_owned(),
    };
    // Checked here as well as in Core so a typo fails before any round trip,
    // with the parser's own words.
    if let Err(e) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&args) {
        let error = pb::Error::new(ErrorCode::ToolArgsInvalid, format!("the arguments must be a JSON object: {e}"));
        return report(&error, exit::FAILED);
    }
    let answer = ToolClient::from_env().and_then(|mut client| client.call(name, args));
    match answer {
        Ok(Ok(json)) => {
            println!("{json}");
            exit::OK
        }
        Ok(Err(error)) if error.code == ErrorCode::ToolTokenInvalid.as_str() => report(&error, exit::UNREACHABLE),
        Ok(Err(error)) => report(&error, exit::FAILED),
        Err(e) => report(&e.to_pb(), exit::UNREACHABLE),
    }
}

/// `tool list`: the session's tools as JSON lines
/// (`{"name","description","inputSchema"}`).
pub fn run_list() -> u8 {
    match ToolClient::from_env().and_then(|mut client| client.list()) {
        Ok(Ok(listed)) => {
            let mut out = std::io::stdout().lock();
            for tool in listed.tools {
                let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
                let line =
                    serde_json::json!({ "name": tool.name, "description": tool.description, "inputSchema": schema });
                let _ = writeln!(out, "{line}");
            }
            exit::OK
        }
        Ok(Err(error)) => report(&error, exit::UNREACHABLE),
        Err(e) => report(&e.to_pb(), exit::UNREACHABLE),
    }
}

fn report(error: &pb::Error, status: u8) -> u8 {
    eprintln!("{}", serde_json::json!({ "code": error.code, "message": error.message }));
    status
}
