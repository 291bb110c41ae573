//! `acp`: any Agent Client Protocol agent (v1) over stdio, through the
//! `agent-client-protocol` crate.
//!
//! **Runtime.** One long-lived agent process serves up to 16 sessions of
//! one site (`share`; never another site's): the site's first session
//! takes the warm one (`warm`) or starts it, in a private folder of its own
//! (each ACP session works in the workspace its `session/new` names), with
//! the configured command and environment; its process group is ours (see
//! `runtime` for why we spawn it rather than the crate). Updates and
//! permission requests are routed to each session's runtime by
//! `sessionId`. `shutdown()` sends `session/cancel` for a running prompt
//! and leaves the agent, which ends (group SIGTERM, then SIGKILL, so the
//! MCP bridges it started go too) with its last session. A session's later
//! runtime gets a fresh agent, where its `session/load` is a real load.

//! **Handshake.** `initialize` with protocol version 1 and no client
//! capabilities: we implement neither `fs/*` nor `terminal/*`, so the agent
//! uses its own file and shell access in the workspace (a request for them
//! anyway is answered "method not found" by the crate). An agent that
//! answers another protocol version is refused (`PROVIDER_UNAVAILABLE`), as
//! is one that needs authentication first (`-32000`): run it once in a
//! terminal to log in.
//!
//! **Conversation.** With a provider session id from an earlier runtime (a
//! later turn after a restart, or after `end()` + `resume()`) and an agent
//! that advertises `loadSession`, `session/load` continues it; the history
//! it replays is discarded. Otherwise — no id, no `loadSession`, or a load
//! the agent refuses — `session/new` starts a new conversation, with an
//! activity in the transcript saying why. Both pass `cwd` = the workspace
//! and, when the session has frontend tools, the MCP bridge as the stdio
//! server `pedelec`: `command` = the `pedelec-core` executable, `args` =
//! `["mcp"]`, and the tool token and Core socket in `env` (never in argv).
//! The ACP `sessionId` is the provider identity reported to Core.
//!
//! **Fork.** A forked session's first runtime sends `session/fork` of the
//! parent's ACP session (an agent advertising `sessionCapabilities.fork`
//! reads it from its own store, so the parent's process need not be this
//! one) and continues the new session it answers with. Whether the agent
//! forks is learnt from any session's `initialize`, or from a probe (the
//! agent started in a private folder for `initialize` alone) when `Fork`
//! asks first.
//!
//! **Turns.** One `session/prompt` with one text block per turn, then one
//! block per attachment: images inline (`image`, when the agent advertises
//! `promptCapabilities.image`; else `ATTACHMENT_UNSUPPORTED` before the
//! prompt), other files as `resource_link`s to their paths. The
//! session's guidance is prepended (`with_guidance`) to the first prompt of a
//! new conversation only; a loaded one already has it. Updates are mapped by
//! `updates::TurnMapper` (deltas, one message per `messageId`, tool-call /
//! thinking / plan / permission activities). A preparation turn is a turn
//! like any other; Core checks the answer.
//!
//! **Usage.** `usage_update` is context occupancy, never a total. A total
//! comes only from `PromptResponse.usage` (the crate's
//! `unstable_end_turn_token_usage` feature, enabled in Cargo.toml); it counts
//! one turn, so the session's total is the sum over turns. Agents that do not
//! send it (Cursor, Gemini today) leave usage undefined.
//!
//! **Model and effort.** ACP v1 has no stable `set_model`; a model is applied
//! through a `model` select config option and effort through a
//! `thought_level` one (`session/set_config_option`), where the agent offers
//! them (`options`). Otherwise the agent keeps its defaults and the
//! transcript says so.
//!
//! **Permissions.** `session/request_permission` is answered by the fixed
//! policy in `permission`: the session's own tools and workspace-confined
//! file work are allowed once, commands, fetches and anything outside the
//! workspace are rejected.
//!
//! **Cancel.** `Cancel` sends `session/cancel` and waits for the prompt's
//! answer (`stopReason: cancelled`); the runtime and its ACP session live on,
//! so the next turn continues the same conversation. Permission requests are
//! answered as they arrive, so none is open to answer `cancelled`.
//! claude-agent-acp answers the prompt after a cancelled one with the stale
//! stop of the cancelled turn (its upstream issue #551), so its runtime is
//! restarted after a cancel and the next turn continues by `session/load`
//! (on a fresh agent, as every later runtime of a session). An agent whose
//! turn ignored a cancel takes no new session.
//!
//! **Failures.** The process exiting or closing stdout mid-request fails the
//! turn with `PROVIDER_CRASHED` (exit status and stderr tail in the
//! details): not fatal for an agent that advertises `loadSession`, whose
//! next turn loads the session on a new agent (an agent found gone between
//! turns is replaced before the prompt, once); fatal (the session moves to
//! `error`) for one that cannot load, which lost the conversation. A
//! JSON-RPC error answer or a `refusal`/`cancelled` stop is a failed turn on
//! a live runtime. A hang is bounded by Core's turn timeout.

mod options;
mod permission;
mod runtime;
mod updates;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, EnvVariable, ForkSessionRequest, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, McpServer, McpServerStdio, NewSessionRequest,
    PromptRequest, SessionConfigOption, SessionId, SetSessionConfigOptionRequest, TextContent,
};
use std::sync::Arc;

use pedelec_protocol::ErrorCode;

use super::process::CommandLine;
use super::share::Shared;
use super::warm::WarmPool;
use super::{
    AgentEvent, BoxFuture, MCP_SERVER_NAME, Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup,
    TurnOutcome, TurnRequest, TurnSink, with_guidance,
};
use permission::PermissionPolicy;
use runtime::{Connection, Runtime};
use updates::{Inbound, TurnMapper};

/// JSON-RPC code an agent answers with when it needs `authenticate` first.
const AUTH_REQUIRED: i32 = -32000;

pub struct Acp {
    config: ProviderConfig,
    /// Whether the agent advertises `sessionCapabilities.fork`: learnt from
    /// a session's `initialize`, or probed once when `Fork` asks first.
    forks: Arc<tokio::sync::OnceCell<bool>>,
    /// The agent kept started for the next site (`warm = true`).
    warm: Option<Arc<WarmPool<Arc<Connection>>>>,
    /// The running agents, each serving one site's sessions (`share`).
    shared: Arc<Shared<Connection>>,
}

impl Acp {
    pub fn new(config: ProviderConfig) -> Self {
        let warm = config.warm.map(|limits| {
            let command = command_of(&config);
            let code = config.code.clone();
            WarmPool::new(limits, move || {
                let (command, code) = (command.clone(), code.clone());
                Box::pin(async move {
                    let wait = super::warm::START_WAIT;
                    tokio::time::timeout(wait, connect(&command, &code))
                        .await
                        .unwrap_or_else(|_| {
                            Err(ProviderFailure::crashed(format!(
                                "it did not answer initialize within {} s",
                                wait.as_secs()
                            )))
                        })
                        .map_err(|f| f.message)
                })
            })
        });
        Acp { config, forks: Arc::default(), warm, shared: Arc::default() }
    }

    fn command(&self) -> CommandLine {
        command_of(&self.config)
    }

    /// Starts the agent only to read its capabilities from `initialize` (no
    /// session is opened, so it works on nothing); an agent that cannot
    /// start cannot fork either.
    async fn probe_forks(&self) -> bool {
        let command = self.command();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), connect(&command, &self.config.code));
        matches!(answer.await, Ok(Ok(conn)) if conn.init.get().is_some_and(advertises_fork))
    }
}

fn command_of(config: &ProviderConfig) -> CommandLine {
    let mut command = CommandLine::new(&config.command);
    command.env.extend(config.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    command
}

/// Starts the agent in a private folder of its own and initialises it.
async fn connect(command: &CommandLine, code: &str) -> Result<Arc<Connection>, ProviderFailure> {
    let conn = Connection::spawn(command, code).await?;
    // No session yet: a policy over no workspace answers nothing anyway.
    let mut runtime = Runtime::on(conn.clone(), PermissionPolicy { workspace: "".into(), tools: Vec::new() }, None);
    let init = initialize(&mut runtime).await?;
    if init.protocol_version != ProtocolVersion::V1 {
        return Err(ProviderFailure::coded(
            ErrorCode::ProviderUnavailable,
            format!("the agent speaks ACP version {:?}; Pedelec speaks version 1", init.protocol_version),
            true,
        ));
    }
    let _ = conn.init.set(init);
    Ok(conn)
}

/// `initialize` with protocol version 1 and no client capabilities.
async fn initialize(runtime: &mut Runtime) -> Result<InitializeResponse, ProviderFailure> {
    let initialize = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(ClientCapabilities::new())
        .client_info(Implementation::new("pedelec-core", env!("CARGO_PKG_VERSION")));
    runtime.request("initialize", initialize, drop).await?.map_err(|e| answer_failure("initialize", &e, true))
}

fn advertises_fork(init: &InitializeResponse) -> bool {
    init.agent_capabilities.session_capabilities.fork.is_some()
}

impl Provider for Acp {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// `session/fork`, where the agent advertises it.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { *self.forks.get_or_init(|| self.probe_forks()).await })
    }

    fn warm(&self) -> pedelec_protocol::pb::WarmProcess {
        super::warm::status_of(self.warm.as_ref())
    }

    fn warm_up(&self) {
        super::warm::warm_up(self.warm.as_ref(), self.info().available);
    }

    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        let info = self.info();
        if !info.available {
            return Err(ProviderFailure {
                code: ErrorCode::ProviderUnavailable,
                message: format!("{} is not available: {}", info.name, info.reason),
                fatal: true,
                details: serde_json::json!({ "provider": info.code }),
            });
        }
        Ok(Box::new(AcpSession {
            config: self.config.clone(),
            command: self.command(),
            forks: self.forks.clone(),
            warm: self.warm.as_ref().map(Arc::downgrade),
            shared: self.shared.clone(),
            loads: false,
            identity: setup.provider_session_id.clone(),
            total: setup.usage_total,
            setup,
            runtime: None,
        }))
    }
}

/// A connected agent with its ACP session.
struct Live {
    runtime: Runtime,
    session_id: SessionId,
    /// A new conversation: its first prompt carries the guidance.
    fresh: bool,
    /// A `session/prompt` is unanswered (the turn may have been dropped by
    /// Core's timeout or `end()`), so shutting down sends `session/cancel`.
    prompting: bool,
    /// The agent answers the prompt after a cancelled one with that turn's
    /// stale stop, running nothing (claude-agent-acp: its query stream still
    /// holds the interrupted turn's `idle`, upstream issue #551). Such a
    /// runtime is restarted after a cancel; the next turn loads the session.
    stale_stop_after_cancel: bool,
    /// The agent takes `image` content blocks (`promptCapabilities.image`).
    takes_images: bool,
    /// The agent advertises `loadSession`: a new runtime continues this one's session.
    loads: bool,
}

struct AcpSession {
    config: ProviderConfig,
    command: CommandLine,
    /// The provider's knowledge of the agent's fork capability, filled
    /// from this session's `initialize` when nobody probed it yet.
    forks: Arc<tokio::sync::OnceCell<bool>>,
    /// The provider's warm agent, while the provider is Core's (a settings
    /// change replaces it): the first runtime takes it, and every start asks
    /// for the next one.
    warm: Option<std::sync::Weak<WarmPool<Arc<Connection>>>>,
    /// The provider's running agents, per site.
    shared: Arc<Shared<Connection>>,
    setup: ProviderSetup,
    runtime: Option<Live>,
    /// The ACP session to continue in the next runtime.
    identity: Option<String>,
    /// The last runtime's agent advertised `loadSession`.
    loads: bool,
    /// The session's token total so far.
    total: Option<u64>,
}

fn mcp_servers(setup: &ProviderSetup) -> Vec<McpServer> {
    if setup.tools.is_empty() {
        // Nothing to call: spare the agent a bridge process.
        return Vec::new();
    }
    let bridge = &setup.bridge;
    let env = bridge.env().into_iter().map(|(name, value)| EnvVariable::new(name, value)).collect();
    vec![McpServer::Stdio(
        McpServerStdio::new(MCP_SERVER_NAME, bridge.command.clone()).args(vec!["mcp".to_owned()]).env(env),
    )]
}

fn answer_failure(what: &str, error: &agent_client_protocol::Error, fatal: bool) -> ProviderFailure {
    let code = i32::from(error.code);
    let (code, message) = if code == AUTH_REQUIRED {
        (ErrorCode::ProviderUnavailable, format!("the ACP agent needs authentication ({what}): {}", error.message))
    } else {
        (ErrorCode::ProviderError, format!("the ACP agent refused {what}: {} ({code})", error.message))
    };
    ProviderFailure {
        code,
        message,
        fatal: fatal || code == ErrorCode::ProviderUnavailable,
        details: serde_json::json!({ "acpCode": i32::from(error.code), "acpData": error.data }),
    }
}

/// Hands events to the turn's sink, keeping the session's token total.
fn apply(events: Vec<AgentEvent>, sink: &dyn TurnSink, outcome: &mut TurnOutcome, total: &mut Option<u64>) {
    for event in events {
        if let AgentEvent::Usage { total_tokens } = event {
            *total = Some(total_tokens);
        }
        outcome.apply(sink, event);
    }
}

impl AcpSession {
    fn policy(&self) -> PermissionPolicy {
        PermissionPolicy {
            workspace: self.setup.workspace.clone(),
            tools: self.setup.tools.iter().map(|t| t.name.clone()).collect(),
        }
    }

    /// Starts the agent and opens (or continues) the ACP session.
    async fn open(&mut self, sink: &dyn TurnSink) -> Result<Live, ProviderFailure> {
        let (command, code) = (self.command.clone(), self.config.code.clone());
        let conn = super::share::process_for(
            &self.shared,
            self.warm.as_ref(),
            &self.setup.origin,
            self.identity.as_deref(),
            async move { connect(&command, &code).await },
        )
        .await?;
        let init = conn.init.get().cloned().expect("a connection is shared once initialised");
        let mut runtime = Runtime::on(conn, self.policy(), self.setup.permissions.clone());
        let _ = self.forks.set(advertises_fork(&init));
        let cwd = self.setup.workspace.clone();
        let mut loaded = None;
        if let Some(id) = self.identity.clone() {
            if init.agent_capabilities.load_session {
                let load = LoadSessionRequest::new(id.clone(), cwd.clone()).mcp_servers(mcp_servers(&self.setup));
                // The replay of the conversation is history, not this turn.
                match runtime.request("session/load", load, drop).await? {
                    Ok(response) => {
                        let late = runtime
                            .discard_until_quiet(
                                std::time::Duration::from_millis(100),
                                std::time::Duration::from_secs(2),
                            )
                            .await;
                        tracing::debug!(late, "discarded the tail of a session/load replay");
                        loaded = Some((SessionId::new(id), response.config_options.unwrap_or_default()));
                    }
                    Err(error) => sink.activity(super::note(format!(
                        "the agent could not load session {id} ({}); starting a new conversation",
                        error.message
                    ))),
                }
            } else {
                sink.activity(super::note(format!(
                    "the agent cannot load sessions (no loadSession); session {id} is not continued"
                )));
            }
        }
        // A forked session's first runtime: a new ACP session continuing a
        // copy of the parent's (the agent reads it from its own store).
        if let (None, None, Some(parent)) = (&loaded, &self.identity, self.setup.fork_from.clone()) {
            if advertises_fork(&init) {
                // claude-agent-acp forks through Claude Code, which finds a
                // conversation by id only in its working directory's project:
                // a copied workspace names the parent's file instead.
                let agent = init.agent_info.as_ref().map(|info| info.name.as_str()).unwrap_or_default();
                // Claude Code writes the parent's file shortly after its
                // turn: wait for it to settle when a turn of it just ended.
                let file = match agent.ends_with("claude-agent-acp") {
                    true => super::claude::settled_conversation_file(&self.config, &parent).await,
                    false => None,
                };
                let source = file.map_or(parent.clone(), |file| file.display().to_string());
                let fork = ForkSessionRequest::new(source, cwd.clone()).mcp_servers(mcp_servers(&self.setup));
                let response = runtime
                    .request("session/fork", fork, drop)
                    .await?
                    .map_err(|e| answer_failure("session/fork", &e, true))?;
                loaded = Some((response.session_id, response.config_options.unwrap_or_default()));
            } else {
                sink.activity(super::note(format!(
                    "the agent cannot fork sessions (no sessionCapabilities.fork); session {parent} is not continued"
                )));
            }
        }
        let fresh = loaded.is_none();
        let (session_id, config) = match loaded {
            Some(found) => found,
            None => {
                let new = NewSessionRequest::new(cwd).mcp_servers(mcp_servers(&self.setup));
                let response = runtime
                    .request("session/new", new, drop)
                    .await?
                    .map_err(|e| answer_failure("session/new", &e, true))?;
                (response.session_id, response.config_options.unwrap_or_default())
            }
        };
        tracing::info!(session = %self.setup.session_id, acp_session = %session_id.0, fresh, "ACP session open");
        runtime.route(&session_id);
        sink.provider_session(&session_id.0);
        self.identity = Some(session_id.0.to_string());
        self.configure(&mut runtime, &session_id, &config, sink).await?;
        let agent = init.agent_info.as_ref().map(|info| info.name.as_str()).unwrap_or_default();
        let stale_stop_after_cancel = agent.ends_with("claude-agent-acp") && init.agent_capabilities.load_session;
        let takes_images = init.agent_capabilities.prompt_capabilities.image;
        let loads = init.agent_capabilities.load_session;
        self.loads = loads;
        Ok(Live { runtime, session_id, fresh, prompting: false, stale_stop_after_cancel, takes_images, loads })
    }

    async fn configure(
        &self,
        runtime: &mut Runtime,
        session_id: &SessionId,
        config: &[SessionConfigOption],
        sink: &dyn TurnSink,
    ) -> Result<(), ProviderFailure> {
        let (choices, notes) = options::choices(config, &self.setup.model, self.setup.effort_level);
        for note in notes {
            tracing::info!(%note, "ACP session option not applied");
            sink.activity(super::note(note));
        }
        for choice in choices {
            let request = SetSessionConfigOptionRequest::new(
                session_id.clone(),
                choice.config_id.clone(),
                agent_client_protocol::v1::schema::SessionConfigOptionValue::value_id(choice.value.clone()),
            );
            if let Err(error) = runtime.request("session/set_config_option", request, drop).await? {
                sink.activity(super::note(format!(
                    "the agent refused {} {:?}: {}",
                    choice.what, choice.value, error.message
                )));
            }
        }
        Ok(())
    }

    async fn turn(&mut self, turn: TurnRequest, sink: &dyn TurnSink) -> Result<(), ProviderFailure> {
        // The site's agent went away between turns (another session's turn
        // crashed it): this session continues on a new one.
        if self.runtime.as_ref().is_some_and(|live| !live.runtime.running()) {
            tracing::debug!(session = %self.setup.session_id, "the ACP agent went away between turns; starting it again");
            self.runtime = None;
        }
        let reused = self.runtime.is_some();
        let mut heard = false;
        let mut result = self.prompt(&turn, sink, &mut heard).await;
        // The agent died between turns and the prompt found it gone before
        // it said or did anything of this turn (its exit had not been seen
        // yet): the turn goes to a new agent, once, as if it had been seen.
        // One that called a frontend tool or asked permission was working
        // on the turn, whatever its stream said: that crash is the turn's.
        if reused
            && !heard
            && !sink.agent_called_out()
            && !turn.cancel.is_cancelled()
            && self.loads_sessions()
            && matches!(&result, Err(f) if f.code == ErrorCode::ProviderCrashed)
        {
            tracing::debug!(session = %self.setup.session_id, "the ACP agent was gone before the turn; starting it again");
            self.runtime = None;
            result = self.prompt(&turn, sink, &mut heard).await;
        }
        match result {
            // The agent keeps its sessions (`loadSession`): losing the
            // process loses no conversation, so the session goes on and the
            // next turn loads it on a new one.
            Err(mut failure) if failure.code == ErrorCode::ProviderCrashed && self.loads_sessions() => {
                self.runtime = None;
                failure.fatal = false;
                Err(failure)
            }
            other => other,
        }
    }

    /// Whether the agent advertised `loadSession` (once a runtime opened).
    fn loads_sessions(&self) -> bool {
        self.runtime.as_ref().map_or(self.loads, |live| live.loads)
    }

    /// One `session/prompt`; `heard` turns true once anything of the turn
    /// came from the agent.
    async fn prompt(
        &mut self,
        turn: &TurnRequest,
        sink: &dyn TurnSink,
        heard: &mut bool,
    ) -> Result<(), ProviderFailure> {
        if self.runtime.is_none() {
            let live = self.open(sink).await?;
            self.runtime = Some(live);
        }
        let live = self.runtime.as_mut().expect("opened above");
        // Leftovers of an abandoned turn must not leak into this one.
        let stale = live.runtime.drain();
        if !stale.is_empty() {
            tracing::debug!(count = stale.len(), "dropped ACP updates from before this turn");
        }
        // An image the agent cannot take is refused before it sees the turn.
        if let Some(image) = turn.attachments.iter().find(|a| a.is_image() && !live.takes_images) {
            return Err(image.unsupported("this ACP agent (no promptCapabilities.image)"));
        }
        let mut blocks = Vec::with_capacity(1 + turn.attachments.len());
        for attachment in &turn.attachments {
            blocks.push(attachment_block(attachment).await?);
        }
        let text = if live.fresh { with_guidance(&self.setup.guidance, &turn.text) } else { turn.text.clone() };
        live.fresh = false;
        blocks.insert(0, ContentBlock::Text(TextContent::new(text)));
        let prompt = PromptRequest::new(live.session_id.clone(), blocks);
        let tools = self.setup.tools.iter().map(|t| t.name.clone()).collect();
        let mut mapper = TurnMapper::new(live.session_id.0.to_string()).with_tools(tools);
        let mut outcome = TurnOutcome::default();
        let total = &mut self.total;
        live.prompting = true;
        let session_id = live.session_id.clone();
        let answer = live
            .runtime
            .request_cancellable(
                "session/prompt",
                prompt,
                |item: Inbound| {
                    *heard = true;
                    apply(mapper.apply(item), sink, &mut outcome, total)
                },
                Some((&turn.cancel, &session_id)),
                Some(sink),
            )
            .await?;
        live.prompting = false;
        if live.stale_stop_after_cancel {
            // claude-agent-acp: Claude Code writes this conversation's file soon (see `claude`).
            super::claude::answered(&live.session_id.0);
        }
        if turn.cancel.is_cancelled() && live.stale_stop_after_cancel {
            tracing::debug!("restarting the ACP agent after a cancel (its next prompt would answer a stale stop)");
            if let Some(live) = self.runtime.take() {
                live.runtime.close();
            }
            return Err(super::ProviderFailure::cancelled());
        }
        let response = answer.map_err(|e| answer_failure("session/prompt", &e, false))?;
        let prior = *total;
        apply(mapper.finish(&response, prior), sink, &mut outcome, total);
        match outcome.failure {
            Some(message) => Err(ProviderFailure::turn(message)),
            None => Ok(()),
        }
    }
}

/// An attachment as prompt content: an image inline (base64), any other
/// file as a `resource_link` to its path (every ACP agent takes links).
async fn attachment_block(attachment: &super::Attachment) -> Result<ContentBlock, ProviderFailure> {
    use agent_client_protocol::v1::schema::{ImageContent, ResourceLink};
    if attachment.is_image() {
        let data = attachment.image_base64()?;
        return Ok(ContentBlock::Image(ImageContent::new(data, attachment.mime.clone())));
    }
    let name = attachment.path.rsplit('/').next().unwrap_or_default().to_owned();
    let uri = format!("file://{}", attachment.file.display());
    // No mimeType: opencode 1.18 turns a link with one into a model "file
    // part" and refuses any type but images and PDFs; without it the agent
    // reads the file itself.
    Ok(ContentBlock::ResourceLink(ResourceLink::new(name, uri).size(attachment.size as i64)))
}

impl ProviderSession for AcpSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(self.turn(turn, sink))
    }

    fn idle_process_resumable(&self) -> bool {
        self.runtime.as_ref().is_some_and(|live| live.loads && !live.prompting)
    }

    fn shutdown(&mut self) {
        if let Some(live) = self.runtime.take() {
            if live.prompting {
                // Lets the agent stop its model and tool work before the group is signalled.
                live.runtime.notify(CancelNotification::new(live.session_id.clone()));
                // A turn left running (a hang, a timeout): no new session joins that agent.
                live.runtime.retire();
            }
            live.runtime.close();
        }
    }
}

impl Drop for AcpSession {
    fn drop(&mut self) {
        self.shutdown();
    }
}
