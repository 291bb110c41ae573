//! Provider adapters: each turns a turn into normalised events through a [`TurnSink`].

mod acp;
pub mod catalog;
pub mod claude;
pub mod cli_turn;
pub mod codex;
pub mod detect;
mod events;
pub mod openai;
pub mod process;
#[cfg(unix)]
pub mod reaper;
mod scripted;
pub mod share;
pub mod warm;

use std::path::PathBuf;
use std::sync::Arc;

use pedelec_protocol::{ErrorCode, pb};

use crate::error::CoreResult;
use crate::settings::{ProviderKind, Settings};
pub use catalog::ProviderConfig;

pub use events::{AgentEvent, TurnOutcome, activity, failed_on_agent_side, note, with_status};
pub use scripted::Scripted;

pub use pedelec_protocol::prepare::{PREPARE_PROMPT, PREPARED_ACK};

pub use futures::future::BoxFuture;

/// One turn handed to a provider.
#[derive(Debug)]
pub struct TurnRequest {
    pub kind: pb::TurnKind,
    pub text: String,
    /// Tripped by `Cancel`: the provider winds the turn down its own way
    /// (keeping its conversation consistent for the next turn) and returns;
    /// its result no longer matters, the operation completes as cancelled.
    /// One that does not return within the session's cancel grace is dropped
    /// and its runtime restarted.
    pub cancel: tokio_util::sync::CancellationToken,
    /// Files sent with the text, checked by Core (they exist, within limits).
    pub attachments: Vec<Attachment>,
    /// The user's text for this turn while it runs (`Steer`); only a
    /// provider whose [`Provider::steers`] is true is sent any.
    pub steering: SteerInbox,
    /// A JSON Schema the turn's final answer must satisfy
    /// (`SendText.output_schema_json`), for a provider that can hand it to
    /// its agent natively; the text already asks for it in words.
    pub output_schema: Option<serde_json::Value>,
}

/// Text the user adds to a running turn, and where the provider answers
/// once the agent took it (or could not: the turn ended first, the agent
/// refused). Dropping `taken` unanswered means the turn ended.
#[derive(Debug)]
pub struct SteerInput {
    pub text: String,
    pub taken: tokio::sync::oneshot::Sender<Result<(), pb::Error>>,
}

/// Steered texts on their way to one turn, or taken by a provider and not
/// yet by its agent, at a time; more is `SESSION_BUSY`.
pub const STEER_QUEUE: usize = 8;

/// Where a turn receives [`SteerInput`]s.
pub type SteerInbox = tokio::sync::mpsc::Receiver<SteerInput>;

/// One file sent with a user text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Its public asset path, e.g. `/screens/page.png`.
    pub path: String,
    /// Where it is on disk (inside the workspace's runtime directory), for
    /// agents that read files themselves; Core itself never reopens it.
    pub file: PathBuf,
    pub mime: String,
    pub size: u64,
    /// An image's bytes, read from the very descriptor Core checked
    /// (`assets::attachment`): reading `file` again could follow a link the
    /// agent put there since.
    pub image: Option<ImageBytes>,
}

/// An image attachment's bytes; shared, and kept out of debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageBytes(pub std::sync::Arc<[u8]>);

impl std::fmt::Debug for ImageBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageBytes({} bytes)", self.0.len())
    }
}

impl Attachment {
    /// Whether it goes as image content (see `asset_path::is_attachable_image`).
    pub fn is_image(&self) -> bool {
        pedelec_protocol::asset_path::is_attachable_image(&self.mime)
    }

    /// An image's bytes as base64, for prompt content.
    pub fn image_base64(&self) -> Result<String, ProviderFailure> {
        let bytes = self
            .image
            .as_ref()
            .ok_or_else(|| ProviderFailure::turn(format!("the attachment {} is not an image", self.path)))?;
        Ok(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes.0))
    }

    /// The refusal of a provider that cannot take images.
    pub fn unsupported(&self, provider: &str) -> ProviderFailure {
        ProviderFailure {
            code: ErrorCode::AttachmentUnsupported,
            message: format!("{provider} cannot take the image {} ({})", self.path, self.mime),
            fatal: false,
            details: serde_json::json!({ "attachment": self.path, "mimeType": self.mime }),
        }
    }

    /// A line naming the file for agents that get files as paths.
    pub fn as_path_line(&self) -> String {
        format!("- {} ({}, {} bytes)", self.file.display(), self.mime, self.size)
    }
}

/// The text with a list of the attached files' paths appended (for
/// providers and file kinds that take files as paths in the workspace).
pub fn with_attachment_paths(text: &str, attachments: &[&Attachment]) -> String {
    if attachments.is_empty() {
        return text.to_owned();
    }
    let lines: Vec<String> = attachments.iter().map(|a| a.as_path_line()).collect();
    format!("{text}\n\nAttached files:\n{}", lines.join("\n"))
}

/// Where a provider reports what happens during a turn.
pub trait TurnSink: Send + Sync {
    /// Resolves when the session's subscribers can take more events; a
    /// provider awaits it between events it produces in bulk, so a slow
    /// reader slows the agent instead of filling Core's memory.
    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
    /// A best-effort fragment of assistant text.
    fn delta(&self, text: &str);
    /// One complete logical assistant message.
    fn message(&self, text: &str);
    /// The provider's cumulative token total for the session.
    fn usage(&self, total_tokens: u64);
    /// The provider's own session identity (for resume).
    fn provider_session(&self, id: &str);
    /// Agent-side work (a command, an MCP call, a file edit, a plan), or an
    /// update of one reported before (same `activity_id`; an empty id is a
    /// new activity each time): shown live, kept in the transcript once settled.
    fn activity(&self, activity: pb::Activity);
    /// The agent could not make a call of the frontend tool `tool` (see
    /// [`AgentEvent::ToolFailed`]); the application hears of it as an error.
    fn tool_failed(&self, _tool: &str, _reason: &str) {}
    /// This turn's agent reports each call of a frontend tool in its stream
    /// before making it over the MCP bridge; Core then holds a bridged call
    /// until [`TurnSink::tool_call_reported`], so it cannot overtake the text
    /// streamed before it.
    fn reports_tool_calls(&self) {}
    /// The agent took `text` the user steered into the turn: it is the
    /// user's from here on, after what the turn said so far. Called before
    /// the provider answers the [`SteerInput`] and goes on.
    fn steered(&self, _text: &str) {}
    /// Whether the agent called a frontend tool or asked permission in this
    /// turn so far (those reach Core beside the provider's stream): proof
    /// that the agent was working on the turn.
    fn agent_called_out(&self) -> bool {
        false
    }
    /// The agent's stream reported a call of the frontend tool `tool`.
    fn tool_call_reported(&self, _tool: &str) {}
    /// Calls a frontend tool and waits for the application's result (JSON text).
    fn call_tool<'a>(&'a self, tool: &'a str, args_json: String) -> BoxFuture<'a, Result<String, pb::Error>>;
}

/// Why a turn failed.
#[derive(Debug, Clone)]
pub struct ProviderFailure {
    pub code: ErrorCode,
    pub message: String,
    /// The provider runtime is gone; the session moves to `error`.
    pub fatal: bool,
    /// Extra facts for the error's details (exit status, stderr tail); `Null` for none.
    pub details: serde_json::Value,
}

impl ProviderFailure {
    pub fn turn(message: impl Into<String>) -> Self {
        ProviderFailure {
            code: ErrorCode::ProviderError,
            message: message.into(),
            fatal: false,
            details: serde_json::Value::Null,
        }
    }
    pub fn crashed(message: impl Into<String>) -> Self {
        ProviderFailure {
            code: ErrorCode::ProviderCrashed,
            message: message.into(),
            fatal: true,
            details: serde_json::Value::Null,
        }
    }
    /// The turn stopped because `Cancel` asked it to (the runtime lives on).
    pub fn cancelled() -> Self {
        ProviderFailure::coded(ErrorCode::OperationCancelled, "the turn was cancelled", false)
    }
    pub fn coded(code: ErrorCode, message: impl Into<String>, fatal: bool) -> Self {
        ProviderFailure { code, message: message.into(), fatal, details: serde_json::Value::Null }
    }
}

/// How an agent process reaches this session's frontend tools: it runs
/// `command mcp` (the MCP bridge) or `command tool call …` with these
/// variables in its environment — the token never goes on a command line.
#[derive(Debug, Clone)]
pub struct ToolBridge {
    /// The `pedelec-core` executable.
    pub command: PathBuf,
    pub socket: PathBuf,
    pub tool_token: String,
}

/// Environment variable carrying the session's tool token to the bridge.
pub const TOOL_TOKEN_ENV: &str = pedelec_protocol::tool_socket::TOKEN_ENV;
/// Environment variable carrying Core's socket to the bridge.
pub const SOCKET_ENV: &str = pedelec_protocol::tool_socket::CORE_ENDPOINT_ENV;
/// Set (to `1`) in the bridge's environment when it serves the
/// permission-prompt tool as well (claude with `PERMISSION_MODE_APP`).
pub const PERMISSION_PROMPT_ENV: &str = "PEDELEC_PERMISSION_PROMPT";
/// The MCP server name agents see the frontend tools under.
pub const MCP_SERVER_NAME: &str = "pedelec";

/// The effort name CLIs share (`low`/`high`); `None` leaves the provider's default.
pub fn effort_name(level: pb::EffortLevel) -> Option<&'static str> {
    match level {
        pb::EffortLevel::Low => Some("low"),
        pb::EffortLevel::High => Some("high"),
        pb::EffortLevel::Default | pb::EffortLevel::Unspecified => None,
    }
}

/// The first turn of a fresh provider conversation carries the session's guidance.
pub fn with_guidance(guidance: &str, text: &str) -> String {
    if guidance.trim().is_empty() { text.to_owned() } else { format!("{}\n\n{text}", guidance.trim()) }
}

impl ToolBridge {
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (TOOL_TOKEN_ENV.to_owned(), self.tool_token.clone()),
            (SOCKET_ENV.to_owned(), self.socket.display().to_string()),
        ]
    }
}

/// How a permission request was settled, as the asking provider hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    /// The application chose this option.
    Selected(String),
    /// Rejected without an option: the application said no, or the deadline passed.
    Rejected,
    /// The operation ended (cancelled, finished, the session ended) first.
    Cancelled,
}

/// Asks the application about an agent's permission request (sessions in
/// `PERMISSION_MODE_APP`): resolves with the application's answer, a
/// rejection at the deadline, or a cancel when the operation ends; an error
/// when no turn runs to ask for (the provider then applies its policy).
pub trait PermissionAsker: Send + Sync + std::fmt::Debug {
    fn ask(&self, request: pb::PermissionRequest) -> BoxFuture<'static, Result<PermissionAnswer, pb::Error>>;
}

/// What a provider needs to start (or restart) a session's runtime.
#[derive(Debug, Clone)]
pub struct ProviderSetup {
    pub session_id: String,
    /// The origin that created the session: agents shared between sessions
    /// are shared within one origin only (`codex::server`).
    pub origin: String,
    pub model: String,
    pub effort_level: pb::EffortLevel,
    pub workspace: PathBuf,
    /// The session's private runtime directory (inside `.pedelec-runtime/`).
    pub runtime_dir: PathBuf,
    pub guidance: String,
    pub tools: Vec<pb::ToolDefinition>,
    /// Identity from an earlier run, to continue the same provider conversation.
    pub provider_session_id: Option<String>,
    /// For a forked session that has no identity of its own yet: the
    /// parent's, whose conversation this runtime continues a copy of
    /// (`Provider::forks`). `None` once `provider_session_id` is set.
    pub fork_from: Option<String>,
    /// Usage total already known for the session.
    pub usage_total: Option<u64>,
    pub bridge: ToolBridge,
    /// Core's own directories (state, settings): the agent is told to keep
    /// out of them where its sandbox can say so (claude's deny rules).
    pub private_dirs: Vec<PathBuf>,
    /// Present when the application answers permission requests.
    pub permissions: Option<Arc<dyn PermissionAsker>>,
}

impl ProviderSetup {
    /// The longest per-call timeout among the session's tools (the default when it has none),
    /// so an agent's own MCP timeout never cuts a call Core still waits for.
    pub fn longest_tool_timeout(&self) -> std::time::Duration {
        self.tools
            .iter()
            .map(pedelec_protocol::tools::tool_timeout)
            .max()
            .unwrap_or(pedelec_protocol::limits::DEFAULT_TOOL_TIMEOUT)
    }
}

/// A running provider runtime for one session.
pub trait ProviderSession: Send {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>>;
    /// Stops the runtime (process tree, connections).
    fn shutdown(&mut self) {}
    /// Whether it holds an agent process that could be ended between turns
    /// at no loss: a new runtime continues the same conversation (the agent
    /// resumes its own session). Core then ends an idle one
    /// (`agent_idle_timeout_secs`).
    fn idle_process_resumable(&self) -> bool {
        false
    }
}

/// A provider Core can start sessions with.
pub trait Provider: Send + Sync {
    /// The resolved settings this provider runs with.
    fn config(&self) -> &ProviderConfig;
    fn code(&self) -> String {
        self.config().code.clone()
    }
    /// Name, code and whether it can run here (with the reason when not); never a secret.
    /// By default: whether the configured program resolves.
    fn info(&self) -> pb::ProviderInfo {
        program_info(self.config())
    }
    fn default_model(&self) -> String {
        self.config().model.clone().unwrap_or_default()
    }
    /// Whether a session needs a model name (`MODEL_REQUIRED` otherwise).
    fn requires_model(&self) -> bool {
        false
    }
    /// Whether its turns take the user's text while they run (`Steer`);
    /// when false, Core refuses with `STEER_UNSUPPORTED` before sending anything.
    fn steers(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(false))
    }
    /// Whether a session can be forked: its first runtime continues a copy
    /// of the parent's conversation from [`ProviderSetup::fork_from`]. When
    /// false, Core refuses `Fork` with `FORK_UNSUPPORTED` before creating
    /// anything.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(false))
    }
    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure>;
    /// Its warm process (`warm`): what it is doing; OFF when it keeps none.
    fn warm(&self) -> pb::WarmProcess {
        pb::WarmProcess { state: pb::WarmState::Off as i32, ..Default::default() }
    }
    /// Starts its warm process if it keeps one and none is ready (Core's
    /// start, a settings change).
    fn warm_up(&self) {}
}

/// The providers as the settings say now: read whole for each create and
/// runtime start, replaced whole when the user changes the settings
/// (`Core.SetSettings`). A running runtime keeps the provider it started with.
pub struct LiveProviders(std::sync::RwLock<Providers>);

impl LiveProviders {
    pub fn new(providers: Providers) -> Self {
        LiveProviders(std::sync::RwLock::new(providers))
    }

    /// The providers now (cheap: a list of shared handles).
    pub fn now(&self) -> Providers {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The new providers' warm processes start; the old ones' end with them.
    pub fn replace(&self, providers: Providers) {
        providers.warm_up();
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = providers;
    }
}

/// The providers this Core offers.
#[derive(Clone)]
pub struct Providers {
    all: Vec<Arc<dyn Provider>>,
    default: String,
}

impl Providers {
    /// The presets alone, `scripted` the default.
    pub fn builtin() -> Self {
        Self::from_settings(&Settings::default()).expect("the presets are valid")
    }

    pub fn from_settings(settings: &Settings) -> CoreResult<Self> {
        let all = catalog::resolve(settings)?.into_iter().map(build).collect();
        let default = settings.default_provider.clone().unwrap_or_else(|| "scripted".into());
        Ok(Providers { all, default })
    }

    /// The provider used when a request names none.
    pub fn default_code(&self) -> String {
        self.default.clone()
    }

    pub fn get(&self, code: &str) -> Option<Arc<dyn Provider>> {
        self.all.iter().find(|p| p.code() == code).cloned()
    }

    pub fn list(&self) -> Vec<pb::ProviderInfo> {
        self.all.iter().map(|p| p.info()).collect()
    }

    /// What Core detects of each provider (`ListAgents`, `doctor`): see [`detect`].
    pub fn agents(&self) -> pb::ListAgentsResponse {
        detect::agents(self)
    }

    /// Starts the warm processes of the providers that keep one.
    pub fn warm_up(&self) {
        self.all.iter().for_each(|p| p.warm_up());
    }

    pub fn default_models(&self) -> std::collections::HashMap<String, String> {
        self.all.iter().map(|p| (p.code(), p.default_model())).collect()
    }
}

fn build(config: ProviderConfig) -> Arc<dyn Provider> {
    match config.kind {
        ProviderKind::Scripted => Arc::new(Scripted::new(config)),
        ProviderKind::Acp => Arc::new(acp::Acp::new(config)),
        ProviderKind::Codex => Arc::new(codex::Codex::new(config)),
        ProviderKind::Claude => Arc::new(claude::Claude::new(config)),
        ProviderKind::Openai => Arc::new(openai::OpenAi::new(config)),
    }
}

/// Availability of a process-based provider: its program must resolve.
pub(crate) fn program_info(config: &ProviderConfig) -> pb::ProviderInfo {
    let found = config.command.first().map(|p| process::resolve_program(p));
    let (available, reason) = match found {
        Some(Ok(_)) => (true, String::new()),
        Some(Err(reason)) => (false, reason),
        None => (false, "no command configured".into()),
    };
    pb::ProviderInfo { name: config.name.clone(), code: config.code.clone(), available, reason }
}
