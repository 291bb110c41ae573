//! The harness: start/kill/restart Core, clients, recorders.

mod activity;
mod activity_log;
mod agent_tools;
mod asset_escape;
mod asset_handoff;
mod assets;
mod attachments;
mod bad_input;
mod bridge;
mod cancel;
mod changes;
mod consent;
mod daemon;
mod durability;
mod folder_picker;
mod fork;
mod history;
mod interop;
mod lifecycle;
mod permissions;
mod prepare;
mod providers_acp;
mod providers_cli;
mod providers_openai;
mod readme;
mod real_agents;
mod set_model;
mod settings;
mod site_limits;
mod status_and_events;
mod steer;
mod tool_socket;
mod tools;
mod typed;
mod warm;
mod workspace_grants;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_protocol::pb::{self, core_client::CoreClient};
use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::native::{NativeMessagingTransport, find_host_binary};
use pedelec_sdk::{Pedelec, PedelecSession, SessionOptions, ToolSpec, sync_handler};
use serde_json::json;

pub const ORIGIN: &str = "app:pedelec-tests";
/// The caller origin of owner calls, as the extension sends it.
pub const OWNER: &str = "app:pedelec-extension";

/// The extension id the native-host tests present (32 characters a–p).
pub const EXTENSION_ID: &str = "pedelecpedelecpedelecpedelecpede";

/// Which transport a seed test drives Core through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The SDK's gRPC transport straight to Core's socket.
    Grpc,
    /// A real `pedelec-native-host` process speaking native-messaging frames.
    Native,
}

/// Runs each listed `async fn name(via: Via)` once per transport.
#[macro_export]
macro_rules! over_both_transports {
    ($($name:ident),* $(,)?) => {
        mod grpc {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::suite::Via::Grpc).await
                }
            )*
        }
        mod native_host {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::suite::Via::Native).await
                }
            )*
        }
    };
}
pub use over_both_transports;

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub core: CoreProcess,
    pub grace: Duration,
    pub via: Via,
    /// Variables set in Core's environment, at every start.
    pub env: Vec<(String, String)>,
}

impl Harness {
    pub fn start() -> Self {
        Self::start_via(Via::Grpc)
    }

    pub fn start_via(via: Via) -> Self {
        Self::with_config(via, "")
    }

    /// Core with `settings` as its config.toml (its own config dir, never the developer's).
    pub fn with_config(via: Via, settings: &str) -> Self {
        Self::with_config_env(via, settings, &[])
    }

    /// Core with `settings` as its config.toml and `env` in its environment.
    pub fn with_config_env(via: Via, settings: &str, env: &[(&str, &str)]) -> Self {
        let grace = Duration::from_millis(300);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("config")).expect("config dir");
        // Tests open explicit workspaces in temporary directories: allowed
        // for local (`app:`) callers only where config.toml says so.
        let roots = format!("allowed_workspace_roots = [{:?}]\n", std::env::temp_dir().display().to_string());
        let settings =
            if settings.contains("allowed_workspace_roots") { settings.to_owned() } else { roots + settings };
        std::fs::write(dir.path().join("config/config.toml"), settings).expect("config.toml");
        let core = Self::spawn_core(dir.path(), grace, env);
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Harness { dir, core, grace, via, env }
    }

    fn spawn_core(dir: &std::path::Path, grace: Duration, env: &[(&str, &str)]) -> CoreProcess {
        let config = dir.join("config").display().to_string();
        // Outside the state directory: the tests play the agent, and the
        // database keeps only the tokens' digests.
        let witness = dir.join("tool-tokens").display().to_string();
        CoreProcess::spawn_with_env(
            &pedelec_sdk::daemon::find_core_binary(),
            &dir.join("run/core.sock"),
            &dir.join("state"),
            grace,
            &["--config-dir", &config, "--tool-token-witness", &witness],
            env,
        )
        .expect("Core starts (run `cargo build -p pedelec-core -p pedelec-native-host` first)")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/core.sock")
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Where Core makes managed workspaces: beside the state dir it was
    /// given (`<state>-workspaces`), never inside it.
    pub fn workspaces(&self) -> PathBuf {
        self.dir.path().join("state-workspaces")
    }

    pub fn database(&self) -> PathBuf {
        self.state().join("sessions.sqlite3")
    }

    /// The tool token Core last minted for `session_id` (a restart or a
    /// resume of an ended session mints a new one), as its agent gets it.
    pub fn tool_token(&self, session_id: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("tool-tokens"))
            .unwrap_or_default()
            .lines()
            .rev()
            .filter_map(|line| line.split_once(' '))
            .find(|(id, _)| *id == session_id)
            .map(|(_, token)| token.to_owned())
            .unwrap_or_else(|| panic!("Core minted no tool token for {session_id}"))
    }

    pub async fn client(&self) -> Pedelec {
        self.client_for(ORIGIN).await
    }

    pub async fn client_for(&self, origin: &str) -> Pedelec {
        // A web origin reaches Core only once the user approved it (Core.SetConsent).
        if origin.starts_with("http") {
            self.approve(origin, &[]).await;
        }
        Pedelec::with_transport(self.transport().await, origin)
    }

    /// A transport to Core over this harness's `via`, for raw calls.
    pub async fn transport(&self) -> Arc<dyn pedelec_sdk::transport::Transport> {
        match self.via {
            Via::Grpc => Arc::new(pedelec_sdk::grpc::GrpcTransport::connect(self.socket()).await.expect("connect")),
            Via::Native => {
                let socket = self.socket().display().to_string();
                let transport = NativeMessagingTransport::spawn(
                    &find_host_binary(),
                    &format!("chrome-extension://{EXTENSION_ID}/"),
                    &[("PEDELEC_CORE_SOCKET", &socket), ("PEDELEC_ALLOWED_EXTENSIONS", EXTENSION_ID)],
                )
                .expect("the native host starts");
                Arc::new(transport)
            }
        }
    }

    /// What the user's click in the extension does: approves `origin` and
    /// grants it `folders` (each with `may_approve_commands` false).
    pub async fn approve(&self, origin: &str, folders: &[&std::path::Path]) -> pb::OriginConsent {
        let folders = folders
            .iter()
            .map(|f| pb::FolderGrant {
                path: f.display().to_string(),
                may_approve_commands: false,
                ..Default::default()
            })
            .collect();
        let consent = pb::OriginConsent { origin: origin.into(), approved: true, folders, ..Default::default() };
        self.set_consent(consent).await
    }

    /// `Core.SetConsent` as the extension makes it.
    pub async fn set_consent(&self, consent: pb::OriginConsent) -> pb::OriginConsent {
        let request = pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) };
        self.raw().await.set_consent(request).await.expect("consent set").into_inner().consent.expect("stored")
    }

    pub async fn raw(&self) -> CoreClient<tonic::transport::Channel> {
        CoreClient::new(pedelec_sdk::grpc::local_channel(&self.socket()).await.expect("raw connect"))
    }

    /// `kill -9`, then a fresh Core on the same state.
    pub fn crash_and_restart(&mut self) {
        self.core.kill();
        self.restart();
    }

    pub fn restart(&mut self) {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.core = Self::spawn_core(self.dir.path(), self.grace, &env);
    }
}

/// A scripted session that stays when its last subscriber leaves (a test
/// may drop and re-attach handles).
pub async fn kept_session(client: &Pedelec) -> PedelecSession {
    client.create_session(SessionOptions { auto_end_on_disconnect: false, ..Default::default() }).await.expect("create")
}

/// The user's texts in `session`'s history, oldest first.
pub async fn user_texts(session: &PedelecSession) -> Vec<String> {
    let history = session.history(pedelec_sdk::HistoryQuery::default()).await.expect("history").entries;
    history
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(pb::history_entry::Kind::UserText(t)) => Some(t.text),
            _ => None,
        })
        .collect()
}

/// Starts a scripted turn that waits up to 20 s for steered text, and
/// returns once Core runs it: the handle says running as soon as it sends,
/// Core answers the turn's changes so far only once the turn runs.
pub async fn a_turn_waiting_for_steer(
    session: &PedelecSession,
) -> tokio::task::JoinHandle<Result<(), pedelec_sdk::PedelecError>> {
    let running = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/wait-steer 20000").await })
    };
    for _ in 0..500 {
        if session.changes(None).await.is_ok_and(|c| c.in_progress) {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the turn never ran in Core");
}

/// A session with the `update_counter` tool (inline handler) on the scripted provider.
pub async fn counter_session(client: &Pedelec) -> (PedelecSession, Arc<Mutex<i64>>) {
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions { tools: vec![counter_tool(counter.clone())], ..Default::default() })
        .await
        .expect("create");
    (session, counter)
}

pub fn counter_tool(counter: Arc<Mutex<i64>>) -> ToolSpec {
    ToolSpec::new(
        "update_counter".to_string(),
        "Add delta to the counter",
        json!({"type": "object", "properties": {"delta": {"type": "integer"}}, "required": ["delta"]}),
    )
    .with_handler(sync_handler(move |args: serde_json::Value, _| {
        let mut c = counter.lock().unwrap();
        *c += args["delta"].as_i64().unwrap_or(0);
        Ok::<_, String>(json!({ "value": *c }))
    }))
}

pub fn schema_object() -> serde_json::Value {
    json!({"type": "object"})
}

/// Records every callback as a normalised line, for assertions and snapshots.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<String>>>);

impl Recorder {
    pub fn attach(session: &PedelecSession) -> Self {
        let r = Recorder::default();
        let l = r.clone();
        std::mem::forget(session.on_status(move |s, ctx| {
            l.push(format!("status {}→{s} [{}/{}]", ctx.previous_status, ctx.source.as_str(), ctx.kind))
        }));
        let l = r.clone();
        std::mem::forget(session.on_chat_delta(move |t, _| l.push(format!("delta {t:?}"))));
        let l = r.clone();
        std::mem::forget(session.on_chat(move |t, ctx| {
            l.push(format!("chat {t:?} [{}]", ctx.turn_kind.and_then(|k| k.seed_str()).unwrap_or("-")))
        }));
        let l = r.clone();
        std::mem::forget(
            session.on_error(move |e, ctx| l.push(format!("error {} [{}/{}]", e.code, ctx.source.as_str(), ctx.kind))),
        );
        let l = r.clone();
        std::mem::forget(session.on_ended(move |ctx| l.push(format!("ended [{}/{}]", ctx.source.as_str(), ctx.kind))));
        let l = r.clone();
        std::mem::forget(session.on_usage(move |n| l.push(format!("usage {n}"))));
        r
    }

    pub fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.lines().iter().filter(|l| l.starts_with(prefix)).count()
    }

    /// The log with runs of deltas joined, so snapshots stay readable.
    pub fn transcript(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut run: Option<(usize, String)> = None;
        for line in self.lines() {
            if let Some(text) = line.strip_prefix("delta ") {
                let text: String = serde_json::from_str(text).unwrap_or_default();
                let entry = run.get_or_insert((0, String::new()));
                entry.0 += 1;
                entry.1.push_str(&text);
                continue;
            }
            if let Some((n, text)) = run.take() {
                out.push(format!("deltas ×{n} {text:?}"));
            }
            out.push(line);
        }
        if let Some((n, text)) = run.take() {
            out.push(format!("deltas ×{n} {text:?}"));
        }
        out.join("\n")
    }
}

/// Polls `f` until it holds (bounded), for state that arrives asynchronously.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Waits until Core itself has the session running: the SDK turns `running`
/// locally as soon as `send_text` is called, before Core has announced the
/// operation, and an agent's tool call is only accepted once it has.
pub async fn core_running(h: &Harness, session: &PedelecSession) {
    let mut raw = h.raw().await;
    for _ in 0..1000 {
        let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
        let mut events = raw.subscribe(request).await.expect("subscribe").into_inner();
        let first = events.message().await.expect("a snapshot").expect("a snapshot");
        if let Some(pb::session_event::Kind::Snapshot(snapshot)) = first.kind
            && snapshot.status == pb::SessionStatus::Running as i32
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("Core never reported the session running");
}
