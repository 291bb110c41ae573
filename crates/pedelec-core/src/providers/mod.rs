//! Provider adapters: each turns a turn into normalised events through a [`TurnSink`].

mod scripted;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use pedelec_protocol::{ErrorCode, pb};

pub use scripted::Scripted;

/// The preparation prompt Core sends; the provider must answer exactly [`PREPARED_ACK`].
pub const PREPARE_PROMPT: &str =
    "Pedelec is preparing this session. Reply with exactly PEDELEC_PREPARED and nothing else.";
/// The acknowledgement a preparation must produce (surrounding whitespace allowed).
pub const PREPARED_ACK: &str = "PEDELEC_PREPARED";

pub type BoxFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// One turn handed to a provider.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub kind: pb::TurnKind,
    pub text: String,
}

/// Where a provider reports what happens during a turn.
pub trait TurnSink: Send + Sync {
    /// A best-effort fragment of assistant text.
    fn delta(&self, text: &str);
    /// One complete logical assistant message.
    fn message(&self, text: &str);
    /// The provider's cumulative token total for the session.
    fn usage(&self, total_tokens: u64);
    /// The provider's own session identity (for resume).
    fn provider_session(&self, id: &str);
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
}

impl ProviderFailure {
    pub fn turn(message: impl Into<String>) -> Self {
        ProviderFailure { code: ErrorCode::ProviderError, message: message.into(), fatal: false }
    }
    pub fn crashed(message: impl Into<String>) -> Self {
        ProviderFailure { code: ErrorCode::ProviderCrashed, message: message.into(), fatal: true }
    }
}

/// What a provider needs to start (or restart) a session's runtime.
#[derive(Debug, Clone)]
pub struct ProviderSetup {
    pub session_id: String,
    pub model: String,
    pub effort_level: pb::EffortLevel,
    pub workspace: PathBuf,
    pub guidance: String,
    pub tools: Vec<pb::ToolDefinition>,
    /// Identity from an earlier run, to continue the same provider conversation.
    pub provider_session_id: Option<String>,
    /// Usage total already known for the session.
    pub usage_total: Option<u64>,
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
}

/// A provider Core can start sessions with.
pub trait Provider: Send + Sync {
    fn info(&self) -> pb::ProviderInfo;
    fn default_model(&self) -> String;
    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure>;
}

/// The providers this Core offers.
#[derive(Clone)]
pub struct Providers {
    all: Vec<Arc<dyn Provider>>,
}

impl Providers {
    pub fn builtin() -> Self {
        Providers { all: vec![Arc::new(Scripted)] }
    }

    /// The provider used when a request names none.
    pub fn default_code(&self) -> String {
        "scripted".into()
    }

    pub fn get(&self, code: &str) -> Option<Arc<dyn Provider>> {
        self.all.iter().find(|p| p.info().code == code).cloned()
    }

    pub fn list(&self) -> Vec<pb::ProviderInfo> {
        self.all.iter().map(|p| p.info()).collect()
    }

    pub fn default_models(&self) -> std::collections::HashMap<String, String> {
        self.all.iter().map(|p| (p.info().code, p.default_model())).collect()
    }
}
