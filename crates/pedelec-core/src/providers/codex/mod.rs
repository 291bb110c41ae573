//! `codex`: the Codex CLI through `codex app-server` (JSON-RPC over stdio),
//! one long-lived process per site serving its sessions' threads; `codex
//! exec --json` (one process per turn, [`exec`]) for a codex too old for it.
//!
//! **Which.** `codex --version` (the configured command, once per provider)
//! picks the backend: [`backend_for`] takes app-server from
//! [`APP_SERVER_SINCE`] (0.171.0, the version whose generated schema this
//! adapter follows) and exec for anything older or unreadable.
//!
//! **Runtime** ([`app_server`], [`server`]). One `codex app-server` serves
//! the threads of one site's sessions (at most 16; another site's sessions
//! never share it, so a slow reader or a crash stays within the site). The
//! first session of a site without one takes the warm one (`warm`) or
//! starts it, in its workspace, with the configured environment. Its
//! process group is ours: it ends with the last thread's runtime, and takes
//! what it started (MCP bridges, shells) with it. A runtime lives across
//! its session's turns; closing it interrupts a running turn and sends
//! `thread/unsubscribe`, so codex unloads the thread. `initialize` (client `pedelec-core`, no experimental
//! API), then `thread/resume` of the session's thread (its provider
//! identity) or, without one or when codex cannot resume it (an activity
//! says so), `thread/start`. A thread is written by one app-server at a
//! time, so while the previous runtime's process is still ending ("already
//! has an active writer") the resume is retried for up to 5 s. Both carry
//! cwd = workspace, sandbox `workspace-write` (without /tmp and $TMPDIR),
//! the model, and our MCP server as dotted config keys
//! (`mcp_servers.pedelec.*`: `pedelec-core mcp`, an `env` table with the
//! tool token and Core socket — for the bridge alone, never in codex's own
//! environment or on a command line — a tool timeout above the session's
//! longest, `default_tools_approval_mode = "approve"`). The guidance is
//! prepended to the first turn of a started thread only.
//!
//! **Turns.** `turn/start` with the text (attached files as paths in it,
//! images as `localImage` inputs) and the effort (`low`/`high`); the turn
//! ends at its `turn/completed`. `item/agentMessage/delta` → deltas; a
//! completed `agentMessage` → a message; command executions, file changes,
//! MCP calls, web searches, reasoning summaries and `turn/plan/updated` →
//! activities ([`wire`]); `thread/tokenUsage/updated`'s `total` (input +
//! output) → usage, the thread's running total. A `failed` turn fails with
//! its error's message (else the last `error` notification's).
//!
//! **Approvals** ([`approval`]). Approval policy `never` when Core's policy
//! answers permissions (nothing is asked, as with exec), `on-request` when
//! the application does (`PermissionMode::App`): codex then asks for what
//! the sandbox would not allow (a command outside it, a file change it
//! cannot make), and each request goes to the session's [`PermissionAsker`]
//! like an ACP agent's. The policy's own answer declines commands and allows
//! file changes confined to the workspace. Our MCP tools never ask.
//!
//! **Steer.** Text the user adds during a turn goes as `turn/steer` with
//! the running turn's id (held until `turn/start` names it); codex's answer
//! settles the `Steer` call, and a refusal (the turn ended) is
//! `TURN_NOT_RUNNING`.
//!
//! **Cancel.** `turn/interrupt`; codex ends the turn `interrupted` and the
//! process lives on for the next turn. One that does not within 2 s, a turn
//! Core dropped unfinished (timeout, `end()`), or codex exiting mid-turn
//! (a non-fatal `PROVIDER_CRASHED` with exit status and stderr tail: the
//! thread is on disk) leaves the runtime to be replaced: the next turn
//! starts codex again and resumes the thread. Failing to come up at all
//! (`initialize`, `thread/start`) is fatal.
//!
//! **Crash.** codex exiting fails the running turn of every thread on it
//! (non-fatal `PROVIDER_CRASHED`); each session's next turn starts a new
//! app-server for the site and resumes its own thread. A runtime found
//! broken (codex deaf to `turn/interrupt`) ends its app-server, and with it
//! the turns of the site's other threads there, which resume the same way.

mod app_server;
mod approval;
mod exec;
mod server;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

pub use exec::{CodexParser, turn_args};

use super::warm::WarmPool;
use super::{
    BoxFuture, Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup, TurnRequest, TurnSink,
};

/// How a codex is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `codex app-server`, one process per session.
    AppServer,
    /// `codex exec --json`, one process per turn.
    Exec,
}

/// The first codex whose app-server protocol this adapter speaks.
pub const APP_SERVER_SINCE: (u64, u64, u64) = (0, 171, 0);

/// How long `codex --version` may take.
const VERSION_WAIT: Duration = Duration::from_secs(10);

/// The version in `codex --version`'s output (`codex-cli 0.171.0`, a
/// pre-release suffix ignored).
pub fn parse_version(output: &str) -> Option<(u64, u64, u64)> {
    let word = output.lines().next()?.split_whitespace().last()?;
    let core = word.split(['-', '+']).next()?;
    let mut numbers = core.split('.').map(|n| n.parse::<u64>().ok());
    let version = (numbers.next()??, numbers.next()??, numbers.next()??);
    numbers.next().is_none().then_some(version)
}

/// The backend for a codex that printed `output` to `--version`.
pub fn backend_for(output: &str) -> Backend {
    match parse_version(output) {
        Some(version) if version >= APP_SERVER_SINCE => Backend::AppServer,
        _ => Backend::Exec,
    }
}

/// Runs `codex --version` (the configured command and environment).
async fn probe(config: &ProviderConfig) -> Backend {
    let Some(program) = config.command.first() else { return Backend::Exec };
    let Ok(program) = super::process::resolve_program(program) else { return Backend::Exec };
    let mut command = tokio::process::Command::new(program);
    command
        .args(&config.command[1..])
        .arg("--version")
        .envs(&config.env)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(VERSION_WAIT, command.output()).await {
        Ok(Ok(output)) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Ok(Err(error)) => {
            tracing::warn!(%error, "codex --version failed; using codex exec");
            return Backend::Exec;
        }
        Err(_) => {
            tracing::warn!("codex --version did not answer; using codex exec");
            return Backend::Exec;
        }
    };
    let backend = backend_for(&output);
    tracing::info!(version = %output.trim(), ?backend, "codex backend");
    backend
}

pub struct Codex {
    config: ProviderConfig,
    /// Probed at the first turn of the first session (or by the warm
    /// start), then kept.
    backend: Arc<tokio::sync::OnceCell<Backend>>,
    /// The app-server kept started for the next session (`warm = true`).
    warm: Option<Arc<WarmPool<Arc<server::Connection>>>>,
    /// The running app-servers, per site (`server`).
    servers: Arc<server::Servers>,
}

impl Codex {
    pub fn new(config: ProviderConfig) -> Self {
        let backend: Arc<tokio::sync::OnceCell<Backend>> = Arc::default();
        let warm = config.warm.map(|limits| {
            let (config, backend) = (config.clone(), backend.clone());
            WarmPool::new(limits, move || {
                let (config, backend) = (config.clone(), backend.clone());
                Box::pin(async move {
                    if *backend.get_or_init(|| probe(&config)).await != Backend::AppServer {
                        return Err("this codex is too old for app-server (codex exec starts per turn)".to_owned());
                    }
                    app_server::start_warm(config).await
                })
            })
        });
        Codex { config, backend, warm, servers: Arc::default() }
    }
}

impl Provider for Codex {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// app-server's `turn/steer`; `exec` takes nothing while a turn runs.
    fn steers(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { *self.backend.get_or_init(|| probe(&self.config)).await == Backend::AppServer })
    }

    /// app-server's `thread/fork`; `exec` has no fork.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { *self.backend.get_or_init(|| probe(&self.config)).await == Backend::AppServer })
    }

    fn warm(&self) -> pedelec_protocol::pb::WarmProcess {
        super::warm::status_of(self.warm.as_ref())
    }

    fn warm_up(&self) {
        super::warm::warm_up(self.warm.as_ref(), self.info().available);
    }

    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        Ok(Box::new(CodexSession {
            config: self.config.clone(),
            backend: self.backend.clone(),
            warm: self.warm.as_ref().map(Arc::downgrade),
            servers: self.servers.clone(),
            setup: Some(setup),
            inner: None,
        }))
    }
}

/// A session whose backend is chosen at its first turn (the probe is a process run).
struct CodexSession {
    config: ProviderConfig,
    backend: Arc<tokio::sync::OnceCell<Backend>>,
    warm: Option<std::sync::Weak<WarmPool<Arc<server::Connection>>>>,
    servers: Arc<server::Servers>,
    setup: Option<ProviderSetup>,
    inner: Option<Box<dyn ProviderSession>>,
}

impl ProviderSession for CodexSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(async move {
            if self.inner.is_none() {
                let config = &self.config;
                let backend = *self.backend.get_or_init(|| probe(config)).await;
                let setup = self.setup.take().expect("a session without a backend keeps its setup");
                self.inner = Some(match backend {
                    Backend::AppServer => Box::new(app_server::AppServerSession::new(
                        config.clone(),
                        setup,
                        self.warm.clone(),
                        self.servers.clone(),
                    )),
                    Backend::Exec => Box::new(exec::ExecSession {
                        config: config.clone(),
                        thread_id: setup.provider_session_id.clone(),
                        setup,
                    }),
                });
            }
            self.inner.as_mut().expect("chosen above").run_turn(turn, sink).await
        })
    }

    fn shutdown(&mut self) {
        if let Some(inner) = self.inner.as_mut() {
            inner.shutdown();
        }
    }

    fn idle_process_resumable(&self) -> bool {
        self.inner.as_ref().is_some_and(|inner| inner.idle_process_resumable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_follows_the_version() {
        assert_eq!(parse_version("codex-cli 0.171.0\n"), Some((0, 171, 0)));
        assert_eq!(parse_version("codex-cli 0.172.0-alpha.3"), Some((0, 172, 0)));
        assert_eq!(backend_for("codex-cli 0.171.0"), Backend::AppServer);
        assert_eq!(backend_for("codex-cli 1.0.0"), Backend::AppServer);
        assert_eq!(backend_for("codex-cli 0.170.9"), Backend::Exec);
        assert_eq!(backend_for("codex-cli 0.1.0-fake"), Backend::Exec);
        for unreadable in ["", "codex", "{\"type\":\"thread.started\"}", "codex-cli 0.171", "codex-cli 0.171.0.1"] {
            assert_eq!(backend_for(unreadable), Backend::Exec, "{unreadable:?}");
        }
    }
}
