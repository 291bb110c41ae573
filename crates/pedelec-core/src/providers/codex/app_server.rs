//! A session's thread on `codex app-server` (a process its site's sessions
//! share, `server`), JSON-RPC over its stdio, kept across turns.
//!
//! The server routes the thread's messages and the answers to the
//! runtime's requests into a bounded channel of the runtime's own (full,
//! the server stops reading, so a fast agent waits in its pipe, not in
//! Core's memory). The turn's task reads the channel, answers server
//! requests, and maps notifications to events; permission answers given
//! off that task go through the server's writer.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::approval::{self, Handling};
use super::server::{Connection, Servers};
use super::wire::{self, Incoming, RpcError, TurnEnd, TurnMapper};
use crate::providers::process::{CommandLine, ExitReport};
use crate::providers::{
    AgentEvent, BoxFuture, MCP_SERVER_NAME, PermissionAsker, ProviderConfig, ProviderFailure, ProviderSession,
    ProviderSetup, SteerInbox, SteerInput, TurnOutcome, TurnRequest, TurnSink, effort_name, with_attachment_paths,
    with_guidance,
};

/// Messages read from codex that may wait for the turn's task.
const QUEUED_MESSAGES: usize = 1024;
/// How long codex gets to end a turn after `turn/interrupt` (it answers at
/// once when well) before its runtime is dropped and restarted.
const INTERRUPT_WAIT: Duration = Duration::from_secs(2);
/// How long a process whose stdout closed gets to exit before it is ended.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// How long a last message (`turn/interrupt`) gets to reach codex before the group is signalled.
const CLOSE_FLUSH: Duration = Duration::from_millis(200);
/// How long `thread/resume` is retried while the thread's previous
/// app-server, ended a moment ago (SIGTERM, SIGKILL 1.5 s later), still
/// holds it: codex 0.171 refuses with "thread … already has an active writer".
const RESUME_WAIT: Duration = Duration::from_secs(5);
const RESUME_RETRY: Duration = Duration::from_millis(100);

pub(super) struct AppServerSession {
    config: ProviderConfig,
    /// The provider's warm codex, while the provider is Core's: the first
    /// runtime takes it, and a cold start asks for the next.
    warm: Option<std::sync::Weak<crate::providers::warm::WarmPool<Arc<Connection>>>>,
    /// The provider's running app-servers, per site.
    servers: Arc<Servers>,
    setup: ProviderSetup,
    /// The codex thread to continue (the session's provider identity).
    thread_id: Option<String>,
    runtime: Option<Runtime>,
}

impl AppServerSession {
    pub(super) fn new(
        config: ProviderConfig,
        setup: ProviderSetup,
        warm: Option<std::sync::Weak<crate::providers::warm::WarmPool<Arc<Connection>>>>,
        servers: Arc<Servers>,
    ) -> Self {
        AppServerSession { config, warm, servers, thread_id: setup.provider_session_id.clone(), setup, runtime: None }
    }
}

/// A session's thread on a running app-server (shared with other threads
/// of the same site, see `server`).
struct Runtime {
    server: Arc<Connection>,
    /// What the server routes to this runtime: its thread's messages and
    /// the answers to its requests.
    inbound: mpsc::Receiver<Incoming>,
    inbound_tx: mpsc::Sender<Incoming>,
    /// Activities recording permission answers given off the turn's task.
    answered: mpsc::UnboundedReceiver<pedelec_protocol::pb::Activity>,
    answered_tx: mpsc::UnboundedSender<pedelec_protocol::pb::Activity>,
    thread_id: String,
    /// The thread started in this runtime: its first turn carries the guidance.
    fresh: bool,
    /// A turn asked for and not seen to end (Core dropped it: timeout,
    /// `end()`): its id, empty until `turn/start` answers.
    active_turn: Option<String>,
    /// Its state is unknown (codex gone, or deaf to `turn/interrupt`).
    broken: bool,
    /// The file paths of each file-change item, for its approval request.
    file_paths: HashMap<String, Vec<String>>,
    /// The session's workspace: the policy's confinement root.
    workspace: std::path::PathBuf,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // The server lives on for its other threads (and ends with the last).
        self.server.unregister(&self.thread_id, &self.inbound_tx);
        if self.broken {
            // Its state is unknown: no thread should be trusted to it.
            self.server.kill();
        }
    }
}

/// The thread settings `thread/start` and `thread/resume` both carry: the
/// same as `exec`'s command line, with our MCP server as dotted config keys
/// (merged into the user's config as `-c` would be).
fn thread_params(setup: &ProviderSetup, asks: bool) -> serde_json::Map<String, Value> {
    let server = format!("mcp_servers.{MCP_SERVER_NAME}");
    let mut config = serde_json::Map::new();
    config.insert(format!("{server}.command"), json!(setup.bridge.command.display().to_string()));
    config.insert(format!("{server}.args"), json!(["mcp"]));
    // The token goes to the bridge alone: never in codex's own environment
    // (a warm codex started before the session; its shells never see it).
    let env: serde_json::Map<String, Value> =
        setup.bridge.env().into_iter().map(|(name, value)| (name, Value::String(value))).collect();
    config.insert(format!("{server}.env"), Value::Object(env));
    config.insert(format!("{server}.tool_timeout_sec"), json!(setup.longest_tool_timeout().as_secs() + 5));
    // Our tools are validated by Core and decided by the application's
    // handler: codex must not hold them for approval.
    config.insert(format!("{server}.default_tools_approval_mode"), json!("approve"));
    // `workspace-write` would also make /tmp and $TMPDIR writable, outside
    // the session's workspace.
    config.insert("sandbox_workspace_write.exclude_slash_tmp".into(), json!(true));
    config.insert("sandbox_workspace_write.exclude_tmpdir_env_var".into(), json!(true));
    let mut params = serde_json::Map::new();
    params.insert("cwd".into(), json!(setup.workspace.display().to_string()));
    params.insert("sandbox".into(), json!("workspace-write"));
    // Asked only for what the sandbox would not allow, when someone answers.
    params.insert("approvalPolicy".into(), json!(if asks { "on-request" } else { "never" }));
    if !setup.model.is_empty() {
        params.insert("model".into(), json!(setup.model));
    }
    params.insert("config".into(), Value::Object(config));
    params
}

/// `turn/start`'s input: the text, then images as codex's local images
/// (other files go as paths in the text).
fn turn_input(text: &str, images: &[&Path]) -> Value {
    let mut input = vec![json!({ "type": "text", "text": text, "text_elements": [] })];
    input.extend(images.iter().map(|path| json!({ "type": "localImage", "path": path.display().to_string() })));
    Value::Array(input)
}

fn refused(what: &str, error: &RpcError) -> ProviderFailure {
    let mut failure = ProviderFailure::turn(format!("codex refused {what}: {} ({})", error.message, error.code));
    failure.details = json!({ "rpcCode": error.code });
    failure
}

/// codex refused a steered text: most often the turn it named had ended
/// (`expectedTurnId` no longer active), else a turn that takes no steering.
fn steer_refused(error: &RpcError) -> pedelec_protocol::pb::Error {
    pedelec_protocol::pb::Error::new(
        pedelec_protocol::ErrorCode::TurnNotRunning,
        format!("codex did not take the text into the turn: {} ({})", error.message, error.code),
    )
}

/// What a running turn is told from outside: stop, or take more of the user's text.
struct TurnControls<'a> {
    cancel: &'a tokio_util::sync::CancellationToken,
    steering: SteerInbox,
    /// `turn/start`'s `outputSchema`: codex constrains the final message.
    output_schema: Option<Value>,
}

impl Runtime {
    /// A runtime on `server`, for a thread not opened yet.
    fn on(server: Arc<Connection>, workspace: &Path) -> Runtime {
        let (inbound_tx, inbound) = mpsc::channel(QUEUED_MESSAGES);
        let (answered_tx, answered) = mpsc::unbounded_channel();
        Runtime {
            server,
            inbound,
            inbound_tx,
            answered,
            answered_tx,
            thread_id: String::new(),
            fresh: false,
            active_turn: None,
            broken: false,
            file_paths: HashMap::new(),
            workspace: workspace.to_path_buf(),
        }
    }

    fn send(&self, line: String) {
        self.server.send(line);
    }

    fn start_request(&mut self, method: &str, params: Value) -> i64 {
        self.server.request(method, params, &self.inbound_tx)
    }

    /// The thread's messages come to this runtime from now on.
    fn open_thread(&mut self, thread: String) {
        self.server.register(&thread, &self.inbound_tx);
        self.thread_id = thread;
    }

    /// Why codex went away: its exit status and stderr tail. Not fatal:
    /// the thread is on disk, and the next turn starts codex again and
    /// resumes it.
    async fn gone(&mut self, context: &str, report: Option<ExitReport>) -> ProviderFailure {
        self.broken = true;
        let report = match report {
            Some(report) => report,
            None => self.server.exit_report(EXIT_WAIT).await,
        };
        let mut failure = report.crashed(context);
        failure.fatal = false;
        failure
    }

    /// Sends a request and waits for its answer, serving what arrives
    /// meanwhile (the policy answers questions; nothing to report yet).
    async fn request(&mut self, method: &str, params: Value) -> Result<Result<Value, RpcError>, ProviderFailure> {
        let id = self.start_request(method, params);
        loop {
            let message = tokio::select! {
                message = self.inbound.recv() => message,
                report = self.server.exited() => {
                    return Err(self.gone(&format!("codex app-server went away during {method}"), Some(report)).await);
                }
            };
            match message {
                None => return Err(self.gone(&format!("codex app-server went away during {method}"), None).await),
                Some(Incoming::Response { id: answered, outcome }) if answered == id => return Ok(outcome),
                Some(Incoming::Request { id, method, params }) => self.serve(id, &method, &params, None, None),
                Some(Incoming::Notification { method, params }) if method == "configWarning" => {
                    tracing::info!(summary = %wire_text(&params, "summary"), "codex configuration warning");
                }
                Some(other) => tracing::trace!(?other, "codex message outside a turn"),
            }
        }
    }

    /// Answers a server request: at once, or (a question, with an asker)
    /// once the application answered, off this task.
    fn serve(
        &mut self,
        id: Value,
        method: &str,
        params: &Value,
        asker: Option<&Arc<dyn PermissionAsker>>,
        sink: Option<&dyn TurnSink>,
    ) {
        let item = wire_text(params, "itemId");
        let paths = self.file_paths.get(&item).cloned().unwrap_or_default();
        match approval::handling(method, params, &self.workspace, &paths) {
            Handling::Answer(result) => self.send(wire::response(&id, result)),
            Handling::Refuse(message) => {
                tracing::info!(method, "refused a codex request Pedelec does not serve");
                self.send(wire::error_response(&id, approval::NOT_SERVED, &message));
            }
            Handling::Ask(ask) => match asker {
                None => {
                    tracing::info!(title = %ask.activity.title, decision = %ask.policy, "answered a codex approval by the policy");
                    self.send(wire::response(&id, approval::approval_result(&ask.policy)));
                    let record = approval::answered(&ask, &ask.policy);
                    match sink {
                        Some(sink) => sink.activity(record),
                        None => drop(self.answered_tx.send(record)),
                    }
                }
                Some(asker) => {
                    // Off the turn's task: its other traffic (a cancel among it) flows meanwhile.
                    let answer = asker.ask(approval::to_app(&ask));
                    let (outgoing, answered) = (self.server.outgoing(), self.answered_tx.clone());
                    tokio::spawn(async move {
                        let decision = approval::decision(&ask, answer.await);
                        tracing::info!(title = %ask.activity.title, %decision, "the application answered a codex approval");
                        let _ = outgoing.send(wire::response(&id, approval::approval_result(&decision)));
                        let _ = answered.send(approval::answered(&ask, &decision));
                    });
                }
            },
        }
    }
}

fn wire_text(value: &Value, key: &str) -> String {
    crate::providers::cli_turn::str_field(value, key)
}

impl Runtime {
    /// Everything that arrived between turns: questions are answered by
    /// the policy, the rest (a dropped turn's tail) is not this turn's.
    fn drain(&mut self) {
        while let Ok(message) = self.inbound.try_recv() {
            if let Incoming::Request { id, method, params } = message {
                self.serve(id, &method, &params, None, None);
            }
        }
        while self.answered.try_recv().is_ok() {}
    }

    /// One turn: `turn/start`, then its notifications until `turn/completed`.
    /// A cancel sends `turn/interrupt`; codex then ends the turn `interrupted`.
    async fn turn(
        &mut self,
        input: Value,
        effort: Option<&str>,
        controls: TurnControls<'_>,
        asker: Option<&Arc<dyn PermissionAsker>>,
        sink: &dyn TurnSink,
    ) -> Result<(), ProviderFailure> {
        let TurnControls { cancel, mut steering, output_schema } = controls;
        // Steered texts waiting for the turn's id, and those sent, by request id.
        let mut steers_waiting: Vec<SteerInput> = Vec::new();
        let mut steers_sent: HashMap<i64, SteerInput> = HashMap::new();
        self.drain();
        sink.reports_tool_calls();
        let mut params = json!({ "threadId": self.thread_id, "input": input });
        if let Some(effort) = effort {
            params["effort"] = json!(effort);
        }
        if let Some(schema) = output_schema {
            params["outputSchema"] = schema;
        }
        let start = self.start_request("turn/start", params);
        // Set before the answer: a turn dropped while waiting for it still runs in codex.
        self.active_turn = Some(String::new());
        let mut mapper = TurnMapper::new(Some(self.thread_id.clone()));
        let mut outcome = TurnOutcome::default();
        let mut interrupting = false;
        let mut deadline: Option<tokio::time::Instant> = None;
        let cancelled = cancel.cancelled();
        tokio::pin!(cancelled);
        let end = loop {
            let message = tokio::select! {
                biased;
                () = &mut cancelled, if !interrupting => {
                    interrupting = true;
                    deadline = Some(tokio::time::Instant::now() + INTERRUPT_WAIT);
                    // Without the turn's id yet, the interrupt goes once `turn/start` answers.
                    if let Some(turn) = self.active_turn.clone().filter(|t| !t.is_empty()) {
                        self.interrupt(&turn);
                    }
                    continue;
                }
                () = async { tokio::time::sleep_until(deadline.expect("only with a deadline")).await }, if deadline.is_some() => {
                    tracing::warn!("codex did not end an interrupted turn; restarting it");
                    self.broken = true;
                    return Err(ProviderFailure::cancelled());
                }
                Some(record) = self.answered.recv() => {
                    sink.activity(record);
                    continue;
                }
                Some(steer) = steering.recv(), if !interrupting => {
                    match self.active_turn.clone().filter(|t| !t.is_empty()) {
                        Some(turn) => {
                            let id = self.steer(&turn, &steer.text);
                            steers_sent.insert(id, steer);
                        }
                        // Sent once `turn/start` names the turn.
                        None => steers_waiting.push(steer),
                    }
                    continue;
                }
                // What codex wrote before it went is still the turn's.
                message = self.inbound.recv() => message,
                // Its stdout may outlive it (a child holding the pipe): the exit says it too.
                report = self.server.exited() => {
                    return Err(self.gone("codex app-server went away mid-turn", Some(report)).await);
                }
            };
            let Some(message) = message else {
                return Err(self.gone("codex app-server went away mid-turn", None).await);
            };
            match message {
                Incoming::Response { id, outcome: answer } if id == start => match answer {
                    Ok(result) => {
                        let turn = result.pointer("/turn/id").and_then(Value::as_str).unwrap_or_default().to_owned();
                        mapper.serve_turn(&turn);
                        if interrupting {
                            self.interrupt(&turn);
                        }
                        for steer in steers_waiting.drain(..) {
                            let id = self.steer(&turn, &steer.text);
                            steers_sent.insert(id, steer);
                        }
                        self.active_turn = Some(turn);
                    }
                    Err(error) => {
                        self.active_turn = None;
                        return Err(refused("turn/start", &error));
                    }
                },
                Incoming::Response { id, outcome } if steers_sent.contains_key(&id) => {
                    let steer = steers_sent.remove(&id).expect("checked above");
                    if outcome.is_ok() {
                        sink.steered(&steer.text);
                    }
                    let _ = steer.taken.send(outcome.map(drop).map_err(|error| steer_refused(&error)));
                }
                Incoming::Response { outcome: Err(error), .. } => {
                    tracing::debug!(?error, "codex refused a request of ours");
                }
                Incoming::Response { .. } => {}
                Incoming::Request { id, method, params } => self.serve(id, &method, &params, asker, Some(sink)),
                Incoming::Notification { method, params } => {
                    if method == "item/started" {
                        self.remember_paths(&params);
                    }
                    for event in mapper.notification(&method, &params) {
                        outcome.apply(sink, event);
                    }
                    if let Some(end) = mapper.ended.take() {
                        break end;
                    }
                    // Reading pauses (and codex blocks on its pipe) while readers catch up.
                    sink.ready().await;
                }
                Incoming::Invalid(reason) => outcome.apply(sink, AgentEvent::Skipped { reason }),
            }
        };
        self.active_turn = None;
        self.file_paths.clear();
        while let Ok(record) = self.answered.try_recv() {
            sink.activity(record);
        }
        if interrupting || cancel.is_cancelled() {
            return Err(ProviderFailure::cancelled());
        }
        match (end, outcome.failure) {
            (TurnEnd::Completed, None) => Ok(()),
            (TurnEnd::Completed, Some(message)) | (TurnEnd::Failed(message), _) => Err(ProviderFailure::turn(message)),
            (TurnEnd::Interrupted, _) => Err(ProviderFailure::turn("codex interrupted the turn")),
        }
    }

    /// `turn/steer`: adds the user's text to the running turn `turn`
    /// (codex refuses it once another turn is active); returns the request id.
    fn steer(&mut self, turn: &str, text: &str) -> i64 {
        let input = json!([{ "type": "text", "text": text, "text_elements": [] }]);
        let params = json!({ "threadId": self.thread_id, "input": input, "expectedTurnId": turn });
        self.start_request("turn/steer", params)
    }

    fn interrupt(&mut self, turn: &str) {
        let params = json!({ "threadId": self.thread_id, "turnId": turn });
        self.start_request("turn/interrupt", params);
    }

    /// A file-change item's paths, which its approval request does not repeat.
    fn remember_paths(&mut self, params: &Value) {
        let Some(item) = params.get("item").filter(|i| i.get("type").and_then(Value::as_str) == Some("fileChange"))
        else {
            return;
        };
        let changes = item.get("changes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let paths = changes.iter().map(|c| wire_text(c, "path")).collect();
        self.file_paths.insert(wire_text(item, "id"), paths);
    }

    /// Ends the runtime: a running turn is interrupted first (so codex
    /// records it ended), and the thread is unsubscribed (codex unloads it
    /// once no one follows it); the server ends with its last thread.
    fn close(mut self) {
        if let Some(turn) = self.active_turn.take().filter(|t| !t.is_empty()) {
            self.interrupt(&turn);
        }
        if !self.thread_id.is_empty() {
            let params = json!({ "threadId": self.thread_id });
            self.start_request("thread/unsubscribe", params);
            // No longer one of the server's threads: only the flush waits.
            self.server.unregister(&self.thread_id, &self.inbound_tx);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    tokio::time::sleep(CLOSE_FLUSH).await;
                    drop(self);
                });
            }
            Err(_) => drop(self),
        }
    }
}

/// `codex app-server` with the configured environment (no session's token:
/// that goes in the thread's MCP server config).
fn command(config: &ProviderConfig) -> CommandLine {
    let mut command = CommandLine::new(&config.command).arg("app-server");
    command.env.extend(config.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    command
}

/// Failing to come up is the runtime being unusable: fatal, as for ACP.
fn fatal(mut failure: ProviderFailure) -> ProviderFailure {
    failure.fatal = true;
    failure
}

/// `initialize`, then `initialized`.
async fn handshake(runtime: &mut Runtime) -> Result<(), ProviderFailure> {
    let initialize = json!({
        "clientInfo": { "name": "pedelec-core", "title": "Pedelec", "version": env!("CARGO_PKG_VERSION") },
        "capabilities": { "experimentalApi": false, "requestAttestation": false },
    });
    runtime.request("initialize", initialize).await.map_err(fatal)?.map_err(|e| fatal(refused("initialize", &e)))?;
    runtime.send(wire::notification("initialized"));
    Ok(())
}

/// Starts `codex app-server` in a private folder of its own and initialises it.
async fn start(config: &ProviderConfig) -> Result<Arc<Connection>, ProviderFailure> {
    let server = Connection::spawn(&command(config), &config.code)?;
    handshake(&mut Runtime::on(server.clone(), Path::new(""))).await?;
    Ok(server)
}

/// Starts a warm codex (`warm::WarmPool`'s start).
pub(super) async fn start_warm(config: ProviderConfig) -> Result<Arc<Connection>, String> {
    let started = async { start(&config).await.map_err(|f| f.message) };
    let wait = crate::providers::warm::START_WAIT;
    tokio::time::timeout(wait, started)
        .await
        .unwrap_or_else(|_| Err(format!("it did not answer initialize within {} s", wait.as_secs())))
}

impl AppServerSession {
    /// Starts codex (or takes the warm one) and opens the thread:
    /// `thread/resume` of the session's thread when it has one; for a
    /// fork's first runtime, `thread/fork` of the parent's; else (or when
    /// codex cannot resume) `thread/start`.
    async fn open(&mut self, sink: &dyn TurnSink) -> Result<Runtime, ProviderFailure> {
        let config = self.config.clone();
        let server = crate::providers::share::process_for(
            &self.servers,
            self.warm.as_ref(),
            &self.setup.origin,
            None,
            async move { start(&config).await },
        )
        .await?;
        let mut runtime = Runtime::on(server, &self.setup.workspace);
        let params = thread_params(&self.setup, self.setup.permissions.is_some());
        let mut opened = None;
        if let Some(thread) = self.thread_id.clone() {
            let mut resume = params.clone();
            resume.insert("threadId".into(), json!(thread));
            resume.insert("excludeTurns".into(), json!(true));
            let deadline = tokio::time::Instant::now() + RESUME_WAIT;
            loop {
                match runtime.request("thread/resume", Value::Object(resume.clone())).await.map_err(fatal)? {
                    Ok(_) => opened = Some((thread, false)),
                    Err(error) if error.message.contains("active writer") && tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(RESUME_RETRY).await;
                        continue;
                    }
                    Err(error) => {
                        tracing::warn!(%thread, reason = %error.message, "codex could not resume a thread");
                        sink.activity(crate::providers::note(format!(
                            "codex could not resume thread {thread} ({}); starting a new conversation",
                            error.message
                        )));
                    }
                }
                break;
            }
        }
        // A forked session's first runtime: a new thread continuing a copy
        // of the parent's (codex reads the parent's rollout from disk).
        if let (None, Some(parent)) = (&opened, self.setup.fork_from.clone().filter(|_| self.thread_id.is_none())) {
            let mut fork = params.clone();
            fork.insert("threadId".into(), json!(parent));
            fork.insert("excludeTurns".into(), json!(true));
            let answer = runtime.request("thread/fork", Value::Object(fork)).await.map_err(fatal)?;
            let result = answer.map_err(|e| fatal(refused("thread/fork", &e)))?;
            let id = result.pointer("/thread/id").and_then(Value::as_str).unwrap_or_default().to_owned();
            if id.is_empty() {
                return Err(ProviderFailure::crashed("codex forked a thread without an id"));
            }
            opened = Some((id, false));
        }
        let (thread, fresh) = match opened {
            Some(found) => found,
            None => {
                let answer = runtime.request("thread/start", Value::Object(params)).await.map_err(fatal)?;
                let result = answer.map_err(|e| fatal(refused("thread/start", &e)))?;
                let id = result.pointer("/thread/id").and_then(Value::as_str).unwrap_or_default().to_owned();
                if id.is_empty() {
                    return Err(ProviderFailure::crashed("codex started a thread without an id"));
                }
                (id, true)
            }
        };
        tracing::info!(session = %self.setup.session_id, %thread, fresh, "codex app-server thread open");
        sink.provider_session(&thread);
        self.thread_id = Some(thread.clone());
        runtime.open_thread(thread);
        runtime.fresh = fresh;
        Ok(runtime)
    }

    async fn run(&mut self, turn: TurnRequest, sink: &dyn TurnSink) -> Result<(), ProviderFailure> {
        // A runtime whose last turn was dropped unfinished, or that broke,
        // is not trusted with another: a fresh one resumes the thread.
        if self.runtime.as_ref().is_some_and(|r| r.broken || r.active_turn.is_some()) {
            tracing::debug!("restarting codex app-server after an unfinished turn");
            if let Some(old) = self.runtime.take() {
                old.close();
            }
        }
        if self.runtime.is_none() {
            let runtime = self.open(sink).await?;
            self.runtime = Some(runtime);
        }
        let runtime = self.runtime.as_mut().expect("opened above");
        let (images, files): (Vec<&crate::providers::Attachment>, Vec<&crate::providers::Attachment>) =
            turn.attachments.iter().partition(|a| a.is_image());
        let image_paths: Vec<&Path> = images.iter().map(|a| a.file.as_path()).collect();
        let text = with_attachment_paths(&turn.text, &files);
        let text = if runtime.fresh { with_guidance(&self.setup.guidance, &text) } else { text };
        runtime.fresh = false;
        let input = turn_input(&text, &image_paths);
        let asker = self.setup.permissions.clone();
        let controls =
            TurnControls { cancel: &turn.cancel, steering: turn.steering, output_schema: turn.output_schema };
        let result = runtime.turn(input, effort_name(self.setup.effort_level), controls, asker.as_ref(), sink).await;
        if runtime.broken {
            self.runtime = None;
        }
        result
    }
}

impl ProviderSession for AppServerSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(self.run(turn, sink))
    }

    fn shutdown(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.close();
        }
    }

    /// The thread is on disk: a new app-server resumes it.
    fn idle_process_resumable(&self) -> bool {
        self.runtime.as_ref().is_some_and(|r| !r.broken && r.active_turn.is_none()) && self.thread_id.is_some()
    }
}

impl Drop for AppServerSession {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_input_carries_images_as_local_images() {
        let input = turn_input("look", &[Path::new("/ws/.pedelec-runtime/a.png")]);
        assert_eq!(
            input,
            json!([{"type": "text", "text": "look", "text_elements": []},
                   {"type": "localImage", "path": "/ws/.pedelec-runtime/a.png"}])
        );
    }
}
