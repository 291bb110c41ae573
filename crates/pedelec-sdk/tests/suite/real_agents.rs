//! The conformance matrix: the real agent programs from the npm registry
//! (pinned in `agents/package.json`, installed by `cargo xtask agents` or
//! `cargo xtask ci` into `target/agents`), driven through Core and the SDK,
//! with our model server (`pedelec_test_agents::model_server`) standing in for
//! the vendor's API.
//!
//! Every agent runs the same scenario: preparation, a frontend tool call
//! reaching the SDK's handler over MCP and its result reaching the model, a
//! handler error reaching the model as `TOOL_HANDLER_ERROR`, a second turn on
//! the same agent thread, usage, `end()` then `resume()` continuing the
//! thread. The normalised event sequence is one insta snapshot per agent.
//! Figures (tool round trip as the agent sees it, first-turn start-up, model
//! requests per turn) go to stderr; `cargo xtask agents` prints them.
//!
//! A missing agent skips the test locally and fails it under `CI=true`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pedelec_sdk::SessionOptions;
use pedelec_test_agents::model_server::{ModelServer, Recorded, standard_script};

use super::*;

/// The model the Claude agents ask for (our server serves any name).
const MODEL: &str = "pedelec-test-model";
/// The model the codex agents ask for: one codex ships metadata for, as a
/// user's would be. With a name it does not know, codex-acp prepends a
/// warning to every answer (`codex_acp_prepares_with_a_model_codex_does_not_know`).
const CODEX_MODEL: &str = "gpt-5.5";
/// The model gemini-cli asks for.
const GEMINI_MODEL: &str = "gemini-2.5-flash";

/// Where `npm ci` put the agents.
fn agents_modules() -> PathBuf {
    match std::env::var_os("PEDELEC_AGENTS_DIR") {
        Some(dir) => PathBuf::from(dir).join("node_modules"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/agents/node_modules"),
    }
}

/// The agent's executable (a name in `node_modules/.bin`, or a path under
/// `node_modules`), or `None` (skip) when it is not installed and this is
/// not CI.
fn agent(name: &str) -> Option<PathBuf> {
    let path = if name.contains('/') { agents_modules().join(name) } else { agents_modules().join(".bin").join(name) };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{} is not installed under CI (run `cargo xtask agents` or `cargo xtask ci`)", path.display());
    }
    eprintln!("skipping: {} is not installed (cargo xtask agents installs it)", path.display());
    None
}

/// A harness whose Core is stopped cleanly at the end (SIGTERM), so Core
/// ends its agents' process groups itself: the plain harness's SIGKILL would
/// leave real agents' children (claude, codex-acp's binary) running after
/// the test.
struct AgentHarness(Harness);

impl AgentHarness {
    fn start(settings: &str) -> Self {
        AgentHarness(Harness::with_config(Via::Grpc, settings))
    }
}

impl std::ops::Deref for AgentHarness {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.0
    }
}

impl std::ops::DerefMut for AgentHarness {
    fn deref_mut(&mut self) -> &mut Harness {
        &mut self.0
    }
}

impl Drop for AgentHarness {
    fn drop(&mut self) {
        self.0.core.terminate();
    }
}

/// One agent's place in the matrix: how Core is configured for it.
/// What a model asking to read a file outside the workspace gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadsOutside {
    /// The agent's sandbox or Core's permission policy refuses it.
    Refused,
    /// Nothing confines reads (codex's `workspace-write` sandbox limits writes only).
    Allowed,
}

struct Rig {
    provider: &'static str,
    model: &'static str,
    /// The config.toml for Core.
    settings: String,
    /// Whether the agent streams text deltas.
    streams: bool,
    /// Whether the matrix asks for a long answer and checks it arrives in
    /// more than one delta (and times the first one).
    streams_long_answers: bool,
    /// How the agent's token total relates to what the model server served.
    usage: Usage,
    /// Whether `end()` + `resume()` continues the agent's own thread.
    resumes: Resumes,
    /// Whether the agent retries a refused model request without end and
    /// without telling the client (opencode 1.18), so only Core's turn
    /// timeout settles the turn.
    retries_refusals: bool,
    /// Whether a file outside the workspace can be read through the agent
    /// (SECURITY.md's table states the same).
    reads_outside: ReadsOutside,
    /// Whether `steer()` adds text to a running turn (else `STEER_UNSUPPORTED`).
    steers: bool,
    /// Whether `fork()` continues a copy of the conversation (else `FORK_UNSUPPORTED`).
    forks: bool,
    /// Whether the agent writes a file in its workspace when the model asks
    /// (in Core's default permission policy, on this machine).
    writes: bool,
    /// Whether Core can keep one started for the next session (ACP agents).
    warms: bool,
    /// Kept alive for the agent's home/config dirs.
    _home: tempfile::TempDir,
}

impl Rig {
    /// Options for a session on this rig's agent and model.
    fn options<T: pedelec_sdk::ToolName>(&self) -> SessionOptions<T> {
        SessionOptions { provider: Some(self.provider.into()), model: Some(self.model.into()), ..Default::default() }
    }
}

/// A TOML basic string (JSON's escapes are a subset of TOML's).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

fn env_table(pairs: &[(&str, String)]) -> String {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("{k} = {}", toml_str(v))).collect();
    format!("{{ {} }}", fields.join(", "))
}

/// Variables every Node-based agent gets: no telemetry, no update checks, no
/// network but the model server.
fn quiet_env(home: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOME", home.display().to_string()),
        ("XDG_CONFIG_HOME", home.join(".config").display().to_string()),
        ("XDG_DATA_HOME", home.join(".local/share").display().to_string()),
        ("XDG_CACHE_HOME", home.join(".cache").display().to_string()),
        ("NO_PROXY", "127.0.0.1,localhost".into()),
    ]
}

fn codex_home(home: &Path, server: &ModelServer, model: &str) -> PathBuf {
    let codex_home = home.join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    let config = format!(
        "model = \"{model}\"\nmodel_provider = \"pedelec\"\ncheck_for_update_on_startup = false\n\
         [model_providers.pedelec]\nname = \"Pedelec test model server\"\nbase_url = \"{}/v1\"\n\
         wire_api = \"responses\"\nrequest_max_retries = 0\nstream_max_retries = 0\n\
         [analytics]\nenabled = false\n",
        server.origin()
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    codex_home
}

fn claude_env(home: &Path, server: &ModelServer) -> Vec<(&'static str, String)> {
    let mut env = quiet_env(home);
    env.extend([
        ("ANTHROPIC_BASE_URL", server.origin()),
        ("ANTHROPIC_API_KEY", "sk-ant-pedelec-test".into()),
        ("CLAUDE_CONFIG_DIR", home.join("claude").display().to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("DISABLE_TELEMETRY", "1".into()),
        ("DISABLE_ERROR_REPORTING", "1".into()),
    ]);
    env
}

/// Whether an agent continues its own thread after `end()` + `resume()`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Resumes {
    Yes,
    /// gemini-cli 0.61 mostly answers `session/load` with "No previous
    /// sessions found for this project" although it wrote the chat (its
    /// listing skips it), and sometimes loads it; Core then starts a new
    /// conversation and says so in an activity. Either way the turn works.
    Sometimes,
}

/// What an agent's usage report covers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Usage {
    /// Every conversation request: the session's usage equals what was served.
    Exact,
    /// Only the last model call of each turn (opencode 1.18's prompt usage):
    /// some, but less than what was served.
    LastCallOfTurn,
    /// None at all: codex-acp 0.16 sends only context occupancy
    /// (`usage_update {used,size}`) and an empty prompt result.
    Unreported,
}

/// Core's config.toml for one provider: its command line and environment.
fn provider_settings(provider: &str, program: &Path, args: &[&str], env: &[(&str, String)]) -> String {
    let argv: Vec<String> = std::iter::once(program.display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| toml_str(&a))
        .collect();
    format!("[providers.{provider}]\ncommand = [{}]\nenv = {}\n", argv.join(", "), env_table(env))
}

impl Rig {
    /// An agent that streams, reports exact usage and resumes its thread.
    fn new(provider: &'static str, model: &'static str, settings: String, home: tempfile::TempDir) -> Rig {
        Rig {
            provider,
            model,
            settings,
            streams: true,
            streams_long_answers: false,
            usage: Usage::Exact,
            resumes: Resumes::Yes,
            retries_refusals: false,
            reads_outside: ReadsOutside::Refused,
            steers: false,
            forks: true,
            writes: true,
            warms: true,
            _home: home,
        }
    }

    /// The environment of a codex-based agent: its own CODEX_HOME pointing at the model server.
    fn codex_env(home: &Path, server: &ModelServer) -> Vec<(&'static str, String)> {
        let codex_home = codex_home(home, server, CODEX_MODEL);
        let mut env = quiet_env(home);
        env.push(("CODEX_HOME", codex_home.display().to_string()));
        env
    }

    fn codex(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let settings = provider_settings("codex", program, &[], &Self::codex_env(home.path(), server));
        Rig {
            streams_long_answers: true,
            reads_outside: ReadsOutside::Allowed,
            steers: true,
            ..Rig::new("codex", CODEX_MODEL, settings, home)
        }
    }

    fn claude(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let settings = provider_settings("claude", program, &[], &claude_env(home.path(), server));
        // claude 2.1's own permission mode refuses the write ("you haven't
        // granted it yet"): nothing asks Core.
        Rig { writes: false, warms: false, steers: true, ..Rig::new("claude", MODEL, settings, home) }
    }

    fn codex_acp(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let settings = provider_settings("codex-acp", program, &[], &Self::codex_env(home.path(), server));
        // codex-acp runs shell commands in its bubblewrap sandbox, which a
        // machine without bwrap does not have: the command fails, nothing is written.
        let bwrap = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("bwrap").is_file()));
        // codex-acp 0.16 advertises no `sessionCapabilities.fork`.
        Rig {
            usage: Usage::Unreported,
            writes: bwrap,
            forks: false,
            ..Rig::new("codex-acp", CODEX_MODEL, settings, home)
        }
    }

    fn claude_acp(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let settings = provider_settings("claude-acp", program, &[], &claude_env(home.path(), server));
        Rig::new("claude-acp", MODEL, settings, home)
    }

    fn gemini(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let mut env = quiet_env(home.path());
        env.extend([
            // @google/genai honours it; gemini-cli then authenticates as a "gateway".
            ("GOOGLE_GEMINI_BASE_URL", server.origin()),
            ("GEMINI_API_KEY", "pedelec-test-key".into()),
            ("GEMINI_CLI_NO_RELAUNCH", "true".into()),
        ]);
        let settings = provider_settings("gemini", program, &["--acp"], &env);
        // gemini-cli 0.61 routes `session/fork` but advertises no `sessionCapabilities.fork`.
        Rig { resumes: Resumes::Sometimes, forks: false, ..Rig::new("gemini", GEMINI_MODEL, settings, home) }
    }

    fn opencode(program: &Path, server: &ModelServer) -> Rig {
        let home = tempfile::tempdir().unwrap();
        let config = home.path().join("opencode.json");
        let provider = serde_json::json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"pedelec": {
                "npm": "@ai-sdk/openai-compatible", "name": "Pedelec test model server",
                "options": {"baseURL": format!("{}/v1", server.origin()), "apiKey": "pedelec-test-key"},
                // A vision model, as a user's would be configured: opencode
                // drops images for a model without image input.
                "models": {MODEL: {"name": "Pedelec test model", "attachment": true,
                                   "modalities": {"input": ["text", "image"], "output": ["text"]}},
                           // A second one for set_model.
                           "pedelec-test-model-2": {"name": "Pedelec test model 2"}}}},
            "model": format!("pedelec/{MODEL}"), "autoupdate": false, "share": "disabled"
        });
        std::fs::write(&config, provider.to_string()).unwrap();
        let mut env = quiet_env(home.path());
        env.push(("OPENCODE_CONFIG", config.display().to_string()));
        env.push(("OPENCODE_DISABLE_AUTOUPDATE", "1".into()));
        let settings = provider_settings("opencode", program, &["acp"], &env);
        let rig = Rig::new("opencode", "pedelec/pedelec-test-model", settings, home);
        Rig { usage: Usage::LastCallOfTurn, retries_refusals: true, ..rig }
    }
}

fn failing_tool() -> pedelec_sdk::ToolSpec {
    pedelec_sdk::ToolSpec::new("explode".to_string(), "Always fails", schema_object())
        .with_handler(sync_handler(|_: serde_json::Value, _| Err::<serde_json::Value, _>("the fuse blew".to_string())))
}

/// What the scenario measured.
struct Figures {
    startup: Duration,
    /// From sending the long answer's text to its first delta.
    first_delta: Option<Duration>,
    tool_round_trip: Duration,
    requests_per_turn: Vec<usize>,
}

fn generations_since(server: &ModelServer, from: usize) -> Vec<Recorded> {
    server.generations().into_iter().skip(from).collect()
}

/// What the model server saw and answered, for failure messages.
fn server_log(server: &ModelServer) -> String {
    let lines: Vec<String> = server
        .recorded()
        .iter()
        .map(|r| {
            format!(
                "{} {:?} tools={:?} last_user={:?} results={:?} → {:?}",
                r.request.path,
                r.request.api,
                r.request.tool_names(),
                r.request.last_user_text().chars().take(120).collect::<String>(),
                r.request.tool_results(),
                r.answer.as_ref().map(|a| &a.reply)
            )
        })
        .collect();
    lines.join("\n")
}

/// codex prefixes a tool's output with how long it took (`Wall time: 0.0036 seconds`).
fn without_wall_time(line: &str) -> String {
    let Some(start) = line.find("Wall time: ") else { return line.to_owned() };
    let rest = &line[start + "Wall time: ".len()..];
    let end = rest.find(" seconds").unwrap_or(0);
    format!("{}Wall time: N{}", &line[..start], &rest[end..])
}

/// Turns the recorder's log into a snapshot that does not depend on timing
/// or on how an agent cut its text into deltas.
fn normalised(recorder: &Recorder) -> String {
    recorder
        .transcript()
        .lines()
        .map(|line| {
            if line.starts_with("deltas ×") {
                let text = line.split_once(' ').map(|(_, rest)| rest).unwrap_or_default();
                let text = text.split_once(' ').map(|(_, t)| t).unwrap_or_default();
                without_wall_time(&format!("deltas {text}"))
            } else if line.starts_with("usage ") {
                "usage".to_string()
            } else if line.starts_with("ended ") || line.contains("→ended ") {
                // end() settles from Core's event or the SDK's own, whichever comes first.
                line.split(" [").next().unwrap_or_default().to_owned()
            } else {
                without_wall_time(line)
            }
        })
        .fold(Vec::<String>::new(), |mut out, line| {
            // Repeated usage updates collapse into one line.
            if !(line == "usage" && out.last().is_some_and(|l| l == "usage")) {
                out.push(line);
            }
            out
        })
        .join("\n")
}

/// The latest state of every activity a session reports.
fn activities(session: &pedelec_sdk::PedelecSession) -> Arc<Mutex<Vec<pedelec_protocol::pb::Activity>>> {
    let seen: Arc<Mutex<Vec<pedelec_protocol::pb::Activity>>> = Arc::default();
    let into = seen.clone();
    std::mem::forget(session.on_activity(move |a, _| {
        let mut all = into.lock().unwrap();
        match all.iter_mut().find(|known| known.activity_id == a.activity_id) {
            Some(known) => *known = a.clone(),
            None => all.push(a.clone()),
        }
    }));
    seen
}

fn describe_activities(seen: &[pedelec_protocol::pb::Activity]) -> Vec<String> {
    seen.iter()
        .map(|a| {
            format!("{} {}", pedelec_protocol::activity::kind_name(a.kind), pedelec_protocol::activity::summary(a))
        })
        .collect()
}

async fn scenario(rig: Rig, server: &ModelServer) -> (String, Figures) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions {
            tools: vec![counter_tool(counter.clone()), failing_tool()],
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .expect("create");
    let recorder = Recorder::attach(&session);
    let seen = activities(&session);

    // Preparation: the agent answers exactly PEDELEC_PREPARED (hidden from chat).
    let started = Instant::now();
    session.prepare().await.unwrap_or_else(|e| panic!("{}: prepare failed: {e:?}", rig.provider));
    let first = server.generations().first().map(|r| r.received).expect("the agent asked the model");
    let startup = first - started;
    recorder.push("-- prepared".into());

    // A frontend tool call over MCP; its result reaches the model.
    let before = server.generations().len();
    session
        .send_text(r#"call update_counter {"delta":2}"#)
        .await
        .unwrap_or_else(|e| panic!("{}: tool turn failed: {e:?}; log {:?}", rig.provider, recorder.lines()));
    assert_eq!(
        *counter.lock().unwrap(),
        2,
        "{}: the SDK handler ran; log {:?}; model server {}",
        rig.provider,
        recorder.lines(),
        server_log(server)
    );
    let turn = generations_since(server, before);
    let call = turn.iter().position(|r| {
        matches!(
            r.answer.as_ref().map(|a| &a.reply),
            Some(pedelec_test_agents::model_server::ModelReply::ToolCall { .. })
        )
    });
    let call = call.unwrap_or_else(|| panic!("{}: the model was never asked to call the tool", rig.provider));
    let result = turn[call + 1..]
        .iter()
        // Agents wrap results in their own JSON (gemini: `{"output": "…"}`), so escapes are ignored.
        .find(|r| r.request.tool_results().iter().any(|t| t.replace(['\\', ' '], "").contains(r#""value":2"#)))
        .unwrap_or_else(|| panic!("{}: the tool result never reached the model: {}", rig.provider, server_log(server)));
    let tool_round_trip = result.received - turn[call].answered;
    let mut requests_per_turn = vec![turn.len()];
    // The agent's own view of that call is an activity that completed.
    let tool_activity = seen.lock().unwrap().iter().any(|a| {
        a.status == pedelec_protocol::pb::ActivityStatus::Completed as i32
            && (a.title.contains("update_counter") || a.output.contains("value"))
    });
    assert!(
        tool_activity,
        "{}: the tool call is a completed activity: {:?}",
        rig.provider,
        describe_activities(&seen.lock().unwrap())
    );
    recorder.push("-- tool turn".into());

    // A handler error reaches the model as TOOL_HANDLER_ERROR.
    let before = server.generations().len();
    session.send_text("call explode {}").await.unwrap_or_else(|e| panic!("{}: error turn: {e:?}", rig.provider));
    let turn = generations_since(server, before);
    assert!(
        turn.iter().any(|r| r.request.tool_results().iter().any(|t| t.contains("TOOL_HANDLER_ERROR"))),
        "{}: the handler error reached the model: {:?}",
        rig.provider,
        turn.iter().map(|r| r.request.tool_results()).collect::<Vec<_>>()
    );
    requests_per_turn.push(turn.len());
    recorder.push("-- error turn".into());

    // A second plain turn continues the same agent thread: the model sees the earlier turns.
    let before = server.generations().len();
    session.send_text("second turn").await.unwrap();
    let turn = generations_since(server, before);
    let texts: Vec<String> = turn.iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    assert!(
        texts.iter().any(|t| t.contains("call update_counter")),
        "{}: the second turn carries the first turn's history",
        rig.provider
    );
    requests_per_turn.push(turn.len());
    recorder.push("-- plain turn".into());

    // A long answer streams: more than one delta, as the model sent it.
    let mut first_delta = None;
    if rig.streams_long_answers {
        let first: Arc<Mutex<Option<Instant>>> = Arc::default();
        let at = first.clone();
        let _off = session.on_chat_delta(move |_, _| {
            at.lock().unwrap().get_or_insert_with(Instant::now);
        });
        let before = recorder.count("delta ");
        let sent = Instant::now();
        session.send_text("long 40").await.unwrap_or_else(|e| panic!("{}: long answer: {e:?}", rig.provider));
        let deltas = recorder.count("delta ") - before;
        assert!(deltas > 1, "{}: a long answer arrives in more than one delta, not {deltas}", rig.provider);
        first_delta = first.lock().unwrap().map(|t| t - sent);
        recorder.push("-- long answer".into());
    }

    // end() then resume() continues the thread.
    session.end().await.unwrap();
    session.resume().await.unwrap();
    let before = server.generations().len();
    session.send_text("after resume").await.unwrap();
    let turn = generations_since(server, before);
    let texts: Vec<String> = turn.iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    if rig.resumes == Resumes::Yes {
        assert!(
            texts.iter().any(|t| t.contains("second turn")),
            "{}: the resumed thread carries the earlier history: {texts:?}; events {:?}",
            rig.provider,
            recorder.lines()
        );
    }
    requests_per_turn.push(turn.len());
    recorder.push("-- resumed turn".into());

    // What the conversation cost: structured-output side requests (gemini's
    // model router) are the agent's own overhead, and no agent counts them.
    let served: u64 = server
        .generations()
        .iter()
        .filter(|r| r.request.json_schema().is_none())
        .filter_map(|r| r.answer.as_ref())
        .map(|a| a.input_tokens + a.output_tokens)
        .sum();
    let reported = session.usage().total_tokens;
    eprintln!("PEDELEC_AGENT_USAGE {}: reported {reported:?}, served {served}", rig.provider);
    match rig.usage {
        Usage::Exact => assert_eq!(reported, Some(served), "{}: usage is what the model server served", rig.provider),
        Usage::LastCallOfTurn => assert!(
            reported.is_some_and(|r| r > 0 && r < served),
            "{}: usage {reported:?} counts part of the {served} served",
            rig.provider
        ),
        Usage::Unreported => assert_eq!(reported, None, "{}: no usage", rig.provider),
    }
    let lines = recorder.lines();
    assert!(!lines.iter().any(|l| l.starts_with("error ")), "{}: no errors: {lines:?}", rig.provider);
    if rig.streams {
        assert!(recorder.count("delta ") > 0, "{}: the agent streams deltas", rig.provider);
    }
    session.end().await.unwrap();
    (normalised(&recorder), Figures { startup, first_delta, tool_round_trip, requests_per_turn })
}

fn report(provider: &str, figures: &Figures) {
    eprintln!(
        "PEDELEC_AGENT_FIGURES {provider}: tool round trip (agent side) {} µs, first-turn start-up {} ms, first delta of a long answer {}, model requests per turn {:?}",
        figures.tool_round_trip.as_micros(),
        figures.startup.as_millis(),
        figures.first_delta.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis())),
        figures.requests_per_turn
    );
}

macro_rules! matrix {
    ($($name:ident: $bin:literal => $rig:path),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(program) = agent($bin) else { return };
                let server = ModelServer::start(standard_script()).await.unwrap();
                let rig = $rig(&program, &server);
                let provider = rig.provider;
                let (transcript, figures) = scenario(rig, &server).await;
                report(provider, &figures);
                insta::assert_snapshot!(transcript);
            }
        )*
    };
}

matrix! {
    codex: "codex" => Rig::codex,
    claude: "claude" => Rig::claude,
    codex_acp: "codex-acp" => Rig::codex_acp,
    claude_acp: "claude-agent-acp" => Rig::claude_acp,
    gemini: "gemini" => Rig::gemini,
    opencode: "opencode-linux-x64/bin/opencode" => Rig::opencode,
}

/// codex-acp prepends "Model metadata for `…` not found" to the model's text
/// when it has no metadata for the model; preparation must still succeed,
/// and the warning must stay out of chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_prepares_with_a_model_codex_does_not_know() {
    let Some(program) = agent("codex-acp") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let codex_home = codex_home(home.path(), &server, MODEL);
    let mut env = quiet_env(home.path());
    env.push(("CODEX_HOME", codex_home.display().to_string()));
    let settings = provider_settings("codex-acp", &program, &[], &env);
    let h = AgentHarness::start(&settings);
    let client = h.client().await;
    let session = client
        .create_session(SessionOptions {
            provider: Some("codex-acp".into()),
            model: Some(MODEL.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session.prepare().await.expect("the acknowledgement after codex's own warning counts");
    assert_eq!(recorder.count("chat "), 0, "preparation text never reaches chat: {:?}", recorder.lines());
    session.end().await.unwrap();
}

/// A frontend tool call the agent itself refuses is visible to the app: an
/// error event with TOOL_CALL_FAILED and the agent's reason, not only the
/// model's prose. The user's own agent config refuses one tool: codex asks
/// approval for it (a per-tool setting beats the server default Core passes)
/// and `codex` (policy mode: approval policy `never`) has nobody to ask; claude's settings say to ask for it (an
/// `ask` rule beats `--allowedTools`) and `claude -p` has nobody to ask. (A
/// claude `deny` rule removes the tool from what the model is offered: no
/// call, so nothing fails.)
async fn refused_tool_reaches_on_error(rig: Rig, server: &ModelServer, reason_says: &str) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let session = client.create_session(SessionOptions { tools: vec![failing_tool()], ..rig.options() }).await.unwrap();
    let errors: Arc<Mutex<Vec<pedelec_sdk::PedelecError>>> = Arc::default();
    let seen = errors.clone();
    let _off = session.on_error(move |e, _| seen.lock().unwrap().push(e.clone()));
    let reported = activities(&session);
    session.send_text("call explode {}").await.expect("the turn itself completes");
    // The failed call is an activity too, failed, with the agent's reason.
    let failed = reported
        .lock()
        .unwrap()
        .iter()
        .any(|a| a.status == pedelec_protocol::pb::ActivityStatus::Failed as i32 && a.output.contains(reason_says));
    assert!(
        failed,
        "{}: a failed activity says why: {:?}",
        rig.provider,
        describe_activities(&reported.lock().unwrap())
    );
    let errors = errors.lock().unwrap().clone();
    let failed = errors.iter().find(|e| e.code == "TOOL_CALL_FAILED").unwrap_or_else(|| {
        panic!("{}: no TOOL_CALL_FAILED among {errors:?}; model server {}", rig.provider, server_log(server))
    });
    let details = failed.details.clone().unwrap_or_default();
    assert_eq!(details["tool"], "explode", "{}", rig.provider);
    assert!(details["reason"].as_str().unwrap_or_default().contains(reason_says), "{}: {details}", rig.provider);
    session.end().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_refused_frontend_tool_reaches_on_error() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let config = rig._home.path().join("codex-home/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[mcp_servers.pedelec.tools.explode]\napproval_mode = \"prompt\"\n");
    std::fs::write(&config, text).unwrap();
    refused_tool_reaches_on_error(rig, &server, "requires approval").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_refused_frontend_tool_reaches_on_error() {
    let Some(program) = agent("claude") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::claude(&program, &server);
    let settings = rig._home.path().join("claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, r#"{"permissions": {"ask": ["mcp__pedelec__explode"]}}"#).unwrap();
    refused_tool_reaches_on_error(rig, &server, "explode").await;
}

/// Every process whose parent chain leads to `root` (from /proc).
fn descendants(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The command may hold spaces and parentheses: fields follow the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
        parents.push((pid, ppid));
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// Waits (bounded, generously: real agents start in seconds under load) until
/// the turn waits for a frontend tool.
async fn waits_for_tool(session: &pedelec_sdk::PedelecSession) {
    for _ in 0..600 {
        if session.get_status() == pedelec_sdk::SessionStatus::WaitingToolResult {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {} never waited for its tool", session.session_id());
}

/// Whether a process runs (a zombie no longer does: nobody may reap orphans here).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X"))
}

/// Those of `pids` still running after up to 5 s.
async fn survivors_after_a_while(pids: &[u32]) -> Vec<u32> {
    for _ in 0..200 {
        if pids.iter().all(|pid| !alive(*pid)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    pids.iter().copied().filter(|pid| alive(*pid)).collect()
}

/// A tool whose handler never answers, to hold a turn in `waiting_tool_result`.
fn stalling_tool() -> pedelec_sdk::ToolSpec {
    pedelec_sdk::ToolSpec::new("stall".to_string(), "Never answers", schema_object()).with_handler(
        pedelec_sdk::handler(|_: serde_json::Value, _| async {
            std::future::pending::<()>().await;
            Ok::<serde_json::Value, String>(serde_json::Value::Null)
        }),
    )
}

/// The edges of a real agent: `end()` during a tool wait takes the agent's
/// whole process tree (the MCP bridge included); a model that asks the agent
/// to write outside the workspace gets nothing written; `kill -9` of Core
/// mid-turn, a restart and `resume_session` continue the session.
async fn edges(rig: Rig, server: &ModelServer) {
    let mut h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let options = || SessionOptions { tools: vec![stalling_tool()], auto_end_on_disconnect: false, ..rig.options() };
    let core_pid = h.core.pid().expect("Core runs");

    // end() while the agent waits for a frontend tool.
    let session = client.create_session(options()).await.unwrap();
    let waiting = session.clone();
    let turn = tokio::spawn(async move { waiting.send_text("call stall {}").await });
    waits_for_tool(&session).await;
    assert!(!descendants(core_pid).is_empty(), "{}: the agent runs under Core", rig.provider);
    session.end().await.unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("the awaited turn settles");
    assert!(settled.unwrap().is_err(), "{}: the turn ended with the session", rig.provider);
    for _ in 0..200 {
        if descendants(core_pid).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(descendants(core_pid), Vec::<u32>::new(), "{}: end() killed the agent's whole tree", rig.provider);

    // A write outside the workspace is refused and nothing is written.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped.txt");
    let session = client.create_session(options()).await.unwrap();
    let before = server.generations().len();
    let _ = session.send_text(format!("write {}", target.display())).await;
    let asked = generations_since(server, before).iter().any(|r| {
        matches!(r.answer.as_ref().map(|a| &a.reply),
            Some(pedelec_test_agents::model_server::ModelReply::ToolCall { arguments, .. })
                if arguments.to_string().contains(&*target.to_string_lossy()))
    });
    assert!(asked, "{}: the model asked the agent to write there: {}", rig.provider, server_log(server));
    assert!(!target.exists(), "{}: the agent wrote outside its workspace: {}", rig.provider, server_log(server));

    // A read outside the workspace: the secret reaches the model only where
    // nothing confines reads (the rig says which, as SECURITY.md does).
    let secret = format!("pedelec-secret-{}", std::process::id());
    let file = outside.path().join("secret.txt");
    std::fs::write(&file, &secret).unwrap();
    let before = server.generations().len();
    let _ = session.send_text(format!("read {}", file.display())).await;
    let generations = generations_since(server, before);
    let asked = generations.iter().any(|r| {
        matches!(r.answer.as_ref().map(|a| &a.reply),
            Some(pedelec_test_agents::model_server::ModelReply::ToolCall { arguments, .. })
                if arguments.to_string().contains(&*file.to_string_lossy()))
    });
    assert!(asked, "{}: the model asked the agent to read there: {}", rig.provider, server_log(server));
    let leaked = generations.iter().any(|r| r.request.body.to_string().contains(&secret));
    let observed = if leaked { ReadsOutside::Allowed } else { ReadsOutside::Refused };
    assert_eq!(observed, rig.reads_outside, "{}: a read outside the workspace: {}", rig.provider, server_log(server));

    // kill -9 of Core mid-turn; a fresh Core resumes the session and its agent thread.
    let session_id = session.session_id().to_owned();
    session.send_text("remember the word pelican").await.unwrap();
    let stalled = session.clone();
    let _stalled = tokio::spawn(async move { stalled.send_text("call stall {}").await });
    waits_for_tool(&session).await;
    let agents = descendants(core_pid);
    assert!(!agents.is_empty(), "{}: the agent runs under Core", rig.provider);
    h.crash_and_restart();
    // A crashed Core cannot end its agents: they must die with it.
    let survivors = survivors_after_a_while(&agents).await;
    assert!(survivors.is_empty(), "{}: agent processes outlived a kill -9 of Core: {survivors:?}", rig.provider);
    let client = h.client().await;
    let resumed = client.resume_session::<String>(&session_id).await.expect("the session survives kill -9");
    let before = server.generations().len();
    resumed.send_text("after the crash").await.expect("a turn after the restart");
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    if rig.resumes == Resumes::Yes {
        assert!(
            texts.iter().any(|t| t.contains("pelican")),
            "{}: the agent thread continues after the restart: {texts:?}",
            rig.provider
        );
    }
    // end() then Core's death before its delayed SIGKILL: whatever survives
    // the dead Core is ended by the next one.
    let core_pid = h.core.pid().expect("Core runs");
    resumed.send_text("one more turn").await.unwrap();
    let agents = descendants(core_pid);
    resumed.end().await.unwrap();
    h.crash_and_restart();
    let survivors = survivors_after_a_while(&agents).await;
    assert!(
        survivors.is_empty(),
        "{}: agent processes outlived end(), Core and Core's restart: {survivors:?}",
        rig.provider
    );
}

/// The vendor API refusing a request (HTTP 400) fails the turn for the app —
/// the awaited `send_text` rejects, it never hangs or passes for a success —
/// and the session takes the next turn. opencode 1.18 retries a 400 with
/// backoff and tells the client nothing, so for it only Core's turn timeout
/// (10 s here) ends the turn (`providerCode` `PROVIDER_TIMEOUT`).
async fn model_refusal_fails_the_turn(rig: Rig, _server: &ModelServer) {
    // Short, so an agent that retries the refusal for ever (opencode) is
    // settled by Core; yet long enough for the next turn's cold start of
    // that agent on a loaded 2-core machine (10 s was cut once there).
    let settings = format!("turn_timeout_secs = 15\n{}", rig.settings);
    let h = AgentHarness::start(&settings);
    let client = h.client().await;
    let session = client.create_session(SessionOptions { ..rig.options() }).await.unwrap();
    let chats = Recorder::attach(&session);
    let outcome = tokio::time::timeout(Duration::from_secs(60), session.send_text("fail 400")).await;
    let outcome = outcome.unwrap_or_else(|_| panic!("{}: a refused model request must settle the turn", rig.provider));
    match outcome {
        Err(error) => {
            assert_eq!(error.code, "SEND_TEXT_FAILED", "{}: {error:?}", rig.provider);
            let provider_code = error.details.as_ref().and_then(|d| d["providerCode"].as_str()).unwrap_or_default();
            assert_eq!(
                provider_code == "PROVIDER_TIMEOUT",
                rig.retries_refusals,
                "{}: settled by the agent, not the turn timeout: {error:?}",
                rig.provider
            );
        }
        // Some agents turn an API error into a reply of their own; then it must say so.
        Ok(()) => assert!(
            chats.lines().iter().any(|l| l.starts_with("chat ") && l.contains("400")),
            "{}: the turn passed for a success without a word of the error: {:?}",
            rig.provider,
            chats.lines()
        ),
    }
    session.send_text("still here").await.unwrap_or_else(|e| panic!("{}: the next turn: {e:?}", rig.provider));
    session.end().await.unwrap();
}

/// One test per agent in `mod $module`, each running `$run(rig, &server)`.
macro_rules! per_agent {
    ($module:ident => $run:path) => {
        mod $module {
            use super::*;
            per_agent!(@each $run;
                codex: "codex" => Rig::codex,
                claude: "claude" => Rig::claude,
                codex_acp: "codex-acp" => Rig::codex_acp,
                claude_acp: "claude-agent-acp" => Rig::claude_acp,
                gemini: "gemini" => Rig::gemini,
                opencode: "opencode-linux-x64/bin/opencode" => Rig::opencode,
            );
        }
    };
    (@each $run:path; $($name:ident: $bin:literal => $rig:path),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let Some(program) = agent($bin) else { return };
                let server = ModelServer::start(standard_script()).await.unwrap();
                $run($rig(&program, &server), &server).await;
            }
        )*
    };
}

per_agent!(edges => super::edges);
per_agent!(model_refusal => super::model_refusal_fails_the_turn);

/// `cancel()` with a real agent waiting on a frontend tool: the awaited turn
/// rejects with `OPERATION_CANCELLED`, the session is idle when `cancel()`
/// resolves, and the next turn runs on the same agent thread (the model sees
/// the turn before the cancelled one). The cancel → idle time goes to stderr
/// (`cargo xtask agents` prints it).
async fn cancel_while_the_agent_waits(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let session = client
        .create_session(SessionOptions { tools: vec![stalling_tool()], auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session
        .send_text("remember the word heron")
        .await
        .unwrap_or_else(|e| panic!("{}: first turn: {e:?}", rig.provider));
    let stalled = session.clone();
    let turn = tokio::spawn(async move { stalled.send_text("call stall {}").await });
    waits_for_tool(&session).await;
    let started = Instant::now();
    session.cancel().await.unwrap_or_else(|e| panic!("{}: cancel: {e:?}", rig.provider));
    let to_idle = started.elapsed();
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle, "{}: idle after cancel()", rig.provider);
    let settled = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("the cancelled turn settles");
    let error = settled.unwrap().expect_err("the cancelled turn rejects");
    assert_eq!(error.code, "OPERATION_CANCELLED", "{}: {error:?}", rig.provider);
    eprintln!("PEDELEC_AGENT_CANCEL {}: cancel → idle {} ms", rig.provider, to_idle.as_millis());

    let before = server.generations().len();
    session
        .send_text("after the cancel")
        .await
        .unwrap_or_else(|e| panic!("{}: the turn after a cancel: {e:?}; {}", rig.provider, server_log(server)));
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    assert!(
        texts.iter().any(|t| t.contains("heron")),
        "{}: the turn after a cancel continues the agent thread: {texts:?}; events {:?}; {}",
        rig.provider,
        recorder.lines(),
        server_log(server)
    );
    session.end().await.unwrap();
}

per_agent!(cancel => super::cancel_while_the_agent_waits);

/// A frontend tool that answers `{"held":true}` once `release` is notified.
fn held_tool(release: Arc<tokio::sync::Notify>) -> pedelec_sdk::ToolSpec {
    pedelec_sdk::ToolSpec::new("hold".to_string(), "Answers when released", schema_object()).with_handler(
        pedelec_sdk::handler(move |_: serde_json::Value, _| {
            let release = release.clone();
            async move {
                release.notified().await;
                Ok::<serde_json::Value, String>(serde_json::json!({ "held": true }))
            }
        }),
    )
}

/// `steer()` while a real agent's turn waits on a frontend tool. An agent
/// that takes input mid-turn takes the text: a later model request of the
/// same turn carries it, the turn completes, and the history has it as the
/// user's. Every other agent refuses with `STEER_UNSUPPORTED`, and no model
/// request ever sees the text.
async fn steer_during_a_turn(rig: Rig, server: &ModelServer) {
    const STEERED: &str = "please also mention the otter";
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let session = client
        .create_session(SessionOptions {
            tools: vec![held_tool(release.clone())],
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    let before = server.generations().len();
    let held = session.clone();
    let turn = tokio::spawn(async move { held.send_text("call hold {}").await });
    waits_for_tool(&session).await;
    // Taken at once (codex) or at the turn's next tool round, once the
    // held call answers (claude): steer and release together.
    let steering = session.clone();
    let steered = tokio::spawn(async move { steering.steer(STEERED).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.notify_one();
    let steered = steered.await.unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(60), turn).await.expect("the turn settles").unwrap();
    settled.unwrap_or_else(|e| panic!("{}: the steered turn: {e:?}; {}", rig.provider, server_log(server)));
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    let seen = texts.iter().any(|t| t.contains(STEERED));
    if rig.steers {
        steered.unwrap_or_else(|e| panic!("{}: steer: {e:?}", rig.provider));
        assert!(seen, "{}: a model request of the turn carries the steered text: {texts:?}", rig.provider);
        assert_eq!(super::user_texts(&session).await, ["call hold {}", STEERED], "{}", rig.provider);
    } else {
        let error = steered.expect_err("an agent that cannot be steered refuses");
        assert_eq!(error.code, "STEER_UNSUPPORTED", "{}: {error:?}", rig.provider);
        assert!(!seen, "{}: nothing was sent: {texts:?}", rig.provider);
    }
    eprintln!("PEDELEC_AGENT_STEER {}: {}", rig.provider, if rig.steers { "taken" } else { "STEER_UNSUPPORTED" });
    session.end().await.unwrap();
}

per_agent!(steer => super::steer_during_a_turn);

/// A flood of steered texts into one claude turn is bounded: claude holds
/// at most `STEER_QUEUE` (8) texts it has not taken yet, Core's inbox 8
/// more, and the rest are refused with `SESSION_BUSY`; every text taken is
/// the user's in the history, and the turn settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_a_flood_of_steered_texts_is_bounded() {
    let Some(program) = agent("claude") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::claude(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let release = Arc::new(tokio::sync::Notify::new());
    let session = h
        .client()
        .await
        .create_session(SessionOptions {
            tools: vec![held_tool(release.clone())],
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    let held = session.clone();
    let turn = tokio::spawn(async move { held.send_text("call hold {}").await });
    waits_for_tool(&session).await;
    let steers: Vec<_> = (0..20)
        .map(|i| {
            let session = session.clone();
            tokio::spawn(async move { session.steer(format!("extra {i}")).await })
        })
        .collect();
    // The held tool round is the only place claude takes a text, so until
    // the release nothing is taken: what settles now was refused.
    for _ in 0..400 {
        if steers.iter().filter(|s| s.is_finished()).count() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    release.notify_one();
    let mut taken = 0;
    let mut busy = 0;
    for steer in steers {
        match tokio::time::timeout(Duration::from_secs(60), steer).await.expect("each steer settles").unwrap() {
            Ok(()) => taken += 1,
            Err(e) if e.code == "SESSION_BUSY" => busy += 1,
            Err(e) => panic!("steer: {e:?}"),
        }
    }
    tokio::time::timeout(Duration::from_secs(60), turn).await.expect("the turn settles").unwrap().unwrap();
    assert!(busy >= 4, "at most 16 texts wait at once: {taken} taken, {busy} busy");
    assert_eq!(taken + busy, 20);
    assert_eq!(super::user_texts(&session).await.len(), 1 + taken, "each taken text is the user's");
    session.end().await.unwrap();
}

/// Waits until a model request for `text` reached the model server.
async fn model_asked(server: &ModelServer, text: &str) {
    for _ in 0..400 {
        if server.arrived_user_texts().iter().any(|t| t == text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no model request for {text:?} within 10 s: {}", server_log(server));
}

/// A turn after a steered one answers its own text, nothing left over.
async fn assert_answered_only_itself(session: &PedelecSession, recorder: &Recorder) {
    session.send_text("still here").await.unwrap();
    let last = recorder.lines().into_iter().rfind(|l| l.starts_with("chat "));
    assert_eq!(last.as_deref(), Some("chat \"Echo: still here\" [user]"), "{:?}", recorder.lines());
}

/// Text steered into a claude turn that has no tool round left (the model
/// is still answering) is taken as a turn of its own right after the
/// answer, inside the same operation: `send_text` resolves once, after the
/// model answered the steered text too, and the history has both texts as
/// the user's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_steered_after_the_last_tool_round_is_answered_in_the_same_operation() {
    const STEERED: &str = "please also mention the otter";
    let Some(program) = agent("claude") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::claude(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let session = after_a_first_turn(&rig, &h).await;
    let recorder = Recorder::attach(&session);
    let held = session.clone();
    let turn = tokio::spawn(async move { held.send_text("slow 1500").await });
    // The model's first byte is 1.5 s after its request: the steer arrives mid-answer.
    model_asked(&server, "slow 1500").await;
    session.steer(STEERED).await.unwrap_or_else(|e| panic!("steer: {e:?}; {}", server_log(&server)));
    tokio::time::timeout(Duration::from_secs(30), turn).await.expect("the turn settles").unwrap().unwrap();
    assert_eq!(super::user_texts(&session).await, ["remember the word heron", "slow 1500", STEERED]);
    let chats: Vec<String> = recorder.lines().into_iter().filter(|l| l.starts_with("chat ")).collect();
    assert!(chats.iter().any(|c| c.contains(&format!("Echo: {STEERED}"))), "the steered text was answered: {chats:?}");
    // Nothing of that operation is left for the next turn.
    assert_answered_only_itself(&session, &recorder).await;
    session.end().await.unwrap();
}

/// A cancel while a steered text waits in claude's queue stops the turn
/// and the steered text's own turn: `cancel()` settles, the steer hears
/// `TURN_NOT_RUNNING`, the history keeps no steered text, and the next
/// turn answers only itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_cancel_stops_a_steered_text_not_yet_taken() {
    let Some(program) = agent("claude") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::claude(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let session = after_a_first_turn(&rig, &h).await;
    let recorder = Recorder::attach(&session);
    let held = session.clone();
    let turn = tokio::spawn(async move { held.send_text("slow 5000").await });
    model_asked(&server, "slow 5000").await;
    let steering = session.clone();
    let steered = tokio::spawn(async move { steering.steer("and then a song").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    session.cancel().await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().unwrap_err();
    assert_eq!(error.code, "OPERATION_CANCELLED", "{error:?}");
    let refused = tokio::time::timeout(Duration::from_secs(15), steered).await.expect("settles").unwrap();
    assert_eq!(refused.expect_err("not taken").code, "TURN_NOT_RUNNING");
    assert_answered_only_itself(&session, &recorder).await;
    assert_eq!(super::user_texts(&session).await, ["remember the word heron", "slow 5000", "still here"]);
    session.end().await.unwrap();
}

/// `changes()` after a real agent's turn that writes a file in its
/// workspace with its own tool: Core lists exactly what is on disk — the
/// file created, with its unified diff, where the agent wrote it; nothing
/// where it did not — whatever the agent.
async fn changes_of_an_agents_turn(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let ws = tempfile::tempdir().unwrap();
    let workspace = ws.path().canonicalize().unwrap();
    let session = client
        .create_session::<String>(SessionOptions {
            workspace_path: Some(workspace.clone()),
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    let target = workspace.join("from-agent.txt");
    session
        .send_text(format!("create {}", target.display()))
        .await
        .unwrap_or_else(|e| panic!("{}: the writing turn: {e:?}; {}", rig.provider, server_log(server)));
    let changes = session.changes(None).await.unwrap_or_else(|e| panic!("{}: changes: {e:?}", rig.provider));
    assert!(changes.complete && !changes.in_progress, "{}: {changes:?}", rig.provider);
    let listed: Vec<&str> = changes.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(target.exists(), rig.writes, "{}: written as expected; {}", rig.provider, server_log(server));
    if !rig.writes {
        assert!(listed.is_empty(), "{}: nothing written, nothing listed: {changes:?}", rig.provider);
        session.end().await.unwrap();
        return;
    }
    assert_eq!(listed, ["from-agent.txt"], "{}: the agent's file, and nothing else: {changes:?}", rig.provider);
    let file = &changes.files[0];
    assert_eq!(file.kind(), pedelec_protocol::pb::ChangeKind::Created, "{}", rig.provider);
    assert!(
        file.diff
            .starts_with("--- a/from-agent.txt\n+++ b/from-agent.txt\n@@ -0,0 +1 @@\n+written by the model server"),
        "{}: {}",
        rig.provider,
        file.diff
    );
    eprintln!("PEDELEC_AGENT_CHANGES {}: {listed:?}", rig.provider);
    session.end().await.unwrap();
}

per_agent!(changes => super::changes_of_an_agents_turn);

/// A session on `rig`'s agent whose first turn told the model a word
/// ("heron") that later turns of the same conversation still carry.
async fn after_a_first_turn(rig: &Rig, h: &AgentHarness) -> pedelec_sdk::PedelecSession {
    let session = h
        .client()
        .await
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    session
        .send_text("remember the word heron")
        .await
        .unwrap_or_else(|e| panic!("{}: first turn: {e:?}", rig.provider));
    session
}

/// `set_model()` between two turns of a real agent: the next turn's model
/// requests name the new model, and the agent continues the same
/// conversation (the model sees the earlier turn).
async fn set_model_between_turns(rig: Rig, server: &ModelServer) {
    // The model to switch to, and the name the model server then sees.
    // claude-agent-acp takes only models from its own list, and gemini-cli
    // routes among its own: neither runs the session's model at creation
    // either, so for them the switch is only recorded and the turn goes on.
    let (second, served) = match rig.provider {
        "codex" | "codex-acp" => ("gpt-5.4", Some("gpt-5.4")),
        "opencode" => ("pedelec/pedelec-test-model-2", Some("pedelec-test-model-2")),
        "claude" => ("pedelec-test-model-2", Some("pedelec-test-model-2")),
        _ => ("pedelec-test-model-2", None),
    };
    let h = AgentHarness::start(&rig.settings);
    let session = after_a_first_turn(&rig, &h).await;
    let info = session.set_model(second, None).await.unwrap_or_else(|e| panic!("{}: set_model: {e:?}", rig.provider));
    assert_eq!(info.model, second);
    let before = server.generations().len();
    session
        .send_text("after the switch")
        .await
        .unwrap_or_else(|e| panic!("{}: the turn after set_model: {e:?}; {}", rig.provider, server_log(server)));
    let requests = generations_since(server, before);
    let models: Vec<String> = requests.iter().map(|r| r.request.model()).collect();
    let texts: Vec<String> = requests.iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    eprintln!("PEDELEC_AGENT_SET_MODEL {}: {models:?}", rig.provider);
    if let Some(served) = served {
        assert!(!models.is_empty() && models.iter().all(|m| m == served), "{}: {models:?}", rig.provider);
    }
    // The runtime restarts on the new model and resumes the agent's thread
    // (gemini-cli's resume is unreliable: see `Resumes::Sometimes`).
    if rig.resumes == Resumes::Yes {
        assert!(texts.iter().any(|t| t.contains("heron")), "{}: the same conversation: {texts:?}", rig.provider);
    }
    session.end().await.unwrap();
}

per_agent!(set_model => super::set_model_between_turns);

/// `set_tools()` between two turns of a real agent: the next turn's model
/// requests offer the new tool, and the agent's call of it reaches the
/// handler given with it.
async fn set_tools_between_turns(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let session = after_a_first_turn(&rig, &h).await;
    let called = Arc::new(Mutex::new(0));
    let count = called.clone();
    let title = pedelec_sdk::ToolSpec::new("page_title".to_string(), "The page's title", schema_object()).with_handler(
        pedelec_sdk::sync_handler(move |_: serde_json::Value, _| {
            *count.lock().unwrap() += 1;
            Ok::<_, String>(serde_json::json!({ "title": "Pedelec" }))
        }),
    );
    session.set_tools(vec![title]).await.unwrap_or_else(|e| panic!("{}: set_tools: {e:?}", rig.provider));
    let before = server.generations().len();
    session
        .send_text("call page_title {}")
        .await
        .unwrap_or_else(|e| panic!("{}: the turn after set_tools: {e:?}; {}", rig.provider, server_log(server)));
    let offered = generations_since(server, before).iter().any(|r| r.request.tool_named("page_title").is_some());
    assert!(offered, "{}: the new tool is offered; {}", rig.provider, server_log(server));
    assert_eq!(*called.lock().unwrap(), 1, "{}: the handler answered; {}", rig.provider, server_log(server));
    session.end().await.unwrap();
}

per_agent!(set_tools => super::set_tools_between_turns);

/// `fork()` after a first turn of a real agent: the fork's next model
/// requests carry the parent's conversation (the word of its first turn);
/// afterwards each session's turns stay its own. An agent that cannot fork
/// refuses with `FORK_UNSUPPORTED`, and no model request follows.
async fn fork_after_a_first_turn(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let session = after_a_first_turn(&rig, &h).await;
    let before = server.generations().len();
    let started = std::time::Instant::now();
    let forked = session.fork().await;
    if !rig.forks {
        let error = forked.expect_err("an agent that cannot fork refuses");
        assert_eq!(error.code, "FORK_UNSUPPORTED", "{}: {error:?}", rig.provider);
        assert_eq!(server.generations().len(), before, "{}: nothing was sent", rig.provider);
        eprintln!("PEDELEC_AGENT_FORK {}: FORK_UNSUPPORTED", rig.provider);
        session.end().await.unwrap();
        return;
    }
    let fork = forked.unwrap_or_else(|e| panic!("{}: fork: {e:?}", rig.provider));
    let forked_in = started.elapsed();
    assert_ne!(fork.session_id(), session.session_id());
    fork.send_text("on the fork")
        .await
        .unwrap_or_else(|e| panic!("{}: the fork's turn: {e:?}; {}", rig.provider, server_log(server)));
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    assert!(
        texts.iter().any(|t| t.contains("heron")),
        "{}: the fork continues the conversation: {texts:?}",
        rig.provider
    );
    let before = server.generations().len();
    session
        .send_text("on the parent")
        .await
        .unwrap_or_else(|e| panic!("{}: the parent's turn: {e:?}; {}", rig.provider, server_log(server)));
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    assert!(
        !texts.iter().any(|t| t.contains("on the fork")),
        "{}: the parent never sees the fork's turn: {texts:?}",
        rig.provider
    );
    eprintln!("PEDELEC_AGENT_FORK {}: forked in {forked_in:?}", rig.provider);
    fork.end().await.unwrap();
    session.end().await.unwrap();
}

per_agent!(fork => super::fork_after_a_first_turn);

/// A typed turn (`output_schema`) on a real agent: the call resolves with
/// the model's answer as a value of the schema, whether the agent takes the
/// schema natively (codex's `outputSchema`) or only as Core's words.
async fn typed_answer(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let session = h
        .client()
        .await
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "bird": { "type": "string" }, "count": { "type": "integer" } },
        "required": ["bird", "count"],
        "additionalProperties": false,
    });
    let options = pedelec_sdk::SendOptions { output_schema: Some(schema.clone()), ..Default::default() };
    let before = server.generations().len();
    let value = session
        .send_text_with("how many herons?", options)
        .await
        .unwrap_or_else(|e| panic!("{}: the typed turn: {e:?}; {}", rig.provider, server_log(server)));
    let native = generations_since(server, before).iter().any(|r| r.request.json_schema() == Some(&schema));
    assert_eq!(value, Some(pedelec_test_agents::model_server::example_for(&schema)), "{}", rig.provider);
    eprintln!("PEDELEC_AGENT_TYPED {}: {}", rig.provider, if native { "native schema" } else { "asked in words" });
    session.end().await.unwrap();
}

per_agent!(typed => super::typed_answer);

/// Permissions to the app with a real agent (`PermissionMode::App`): the
/// model asks the agent to write outside its workspace; where the agent asks
/// permission for that, the request reaches `on_permission` as a file edit
/// naming the path, and the app's answer decides — allowed, the file is
/// written; rejected, it is not (codex asks for the model's request to run
/// the write outside its sandbox). An agent that never asks (its sandbox
/// refuses the write) writes nothing either way.
async fn the_app_answers_permissions(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            permission_mode: pedelec_protocol::pb::PermissionMode::App,
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    let allow = Arc::new(Mutex::new(true));
    let asked: Arc<Mutex<Vec<pedelec_protocol::pb::PermissionRequest>>> = Arc::default();
    let (decide, seen) = (allow.clone(), asked.clone());
    let _off = session.on_permission(move |request, _| {
        seen.lock().unwrap().push(request.clone());
        let wanted = if *decide.lock().unwrap() {
            [
                pedelec_protocol::pb::PermissionOptionKind::AllowOnce,
                pedelec_protocol::pb::PermissionOptionKind::AllowAlways,
            ]
        } else {
            [
                pedelec_protocol::pb::PermissionOptionKind::RejectOnce,
                pedelec_protocol::pb::PermissionOptionKind::RejectAlways,
            ]
        };
        // "Once" first: an "always" would spare the agent asking again.
        let chosen = wanted
            .iter()
            .find_map(|k| request.options.iter().find(|o| o.kind == *k as i32))
            .map(|o| o.option_id.clone());
        async move { chosen }
    });
    let outside = tempfile::tempdir().unwrap();
    let allowed = outside.path().join("allowed.txt");
    let _ = session.send_text(format!("write {}", allowed.display())).await;
    let requests = asked.lock().unwrap().clone();
    let names_it = requests.iter().any(|r| {
        let about = r.activity.clone().unwrap_or_default();
        about.paths.iter().chain([&about.title, &about.command]).any(|t| t.contains("allowed.txt"))
    });
    eprintln!(
        "PEDELEC_AGENT_PERMISSIONS {}: {} request(s) {:?}, written when allowed: {}",
        rig.provider,
        requests.len(),
        requests.iter().map(|r| r.activity.clone().unwrap_or_default().title).collect::<Vec<_>>(),
        allowed.exists()
    );
    if requests.is_empty() {
        assert!(
            !allowed.exists(),
            "{}: written outside the workspace without asking: {}",
            rig.provider,
            server_log(server)
        );
    } else {
        assert!(names_it, "{}: the request names the file: {requests:?}", rig.provider);
        assert!(allowed.exists(), "{}: the app allowed the write: {}", rig.provider, server_log(server));
    }

    *allow.lock().unwrap() = false;
    let rejected = outside.path().join("rejected.txt");
    let _ = session.send_text(format!("write {}", rejected.display())).await;
    assert!(!rejected.exists(), "{}: the app rejected the write: {}", rig.provider, server_log(server));
    session.end().await.unwrap();
}

per_agent!(permissions => super::the_app_answers_permissions);

/// A real 1×1 PNG (agents may decode what they are given).
const TINY_PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4, 0x89, 0x00, 0x00, 0x00, 0x0A, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00, 0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00,
    0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

/// Attachments with a real agent: a JSON file and a PNG go with a text. The
/// file reaches the model (as a link or path the agent passes on, or its
/// content); the image reaches it as image content (its base64 in the model
/// request) or as a path, or the turn is refused with ATTACHMENT_UNSUPPORTED
/// before the agent sees it — never silently dropped.
async fn attachments_reach_the_model(rig: Rig, server: &ModelServer) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    let json = pedelec_sdk::assets::UploadSource::from_bytes("facts.json", "application/json", br#"{"n":7}"#.to_vec());
    session.upload_asset(json, Some("/data/facts.json")).await.unwrap();
    let png = pedelec_sdk::assets::UploadSource::from_bytes("dot.png", "image/png", TINY_PNG.to_vec());
    session.upload_asset(png, Some("/screens/dot.png")).await.unwrap();
    let attach = |path: &str| pedelec_sdk::SendOptions { attachments: vec![path.into()], ..Default::default() };

    let before = server.generations().len();
    session.send_text_with("look at the facts", attach("/data/facts.json")).await.unwrap();
    let bodies: Vec<String> = generations_since(server, before).iter().map(|r| r.request.body.to_string()).collect();
    assert!(
        bodies.iter().any(|b| b.contains("facts.json") || b.contains(r#"{\"n\":7}"#)),
        "{}: the file reached the model: {bodies:?}",
        rig.provider
    );

    let before = server.generations().len();
    let sent = session.send_text_with("look at the picture", attach("/screens/dot.png")).await;
    use base64::Engine;
    let inline = base64::engine::general_purpose::STANDARD.encode(TINY_PNG);
    let bodies: Vec<String> = generations_since(server, before).iter().map(|r| r.request.body.to_string()).collect();
    let how = match &sent {
        Err(error) if error.code == "ATTACHMENT_UNSUPPORTED" => "refused before the turn",
        Err(error) => panic!("{}: the image turn failed: {error:?}", rig.provider),
        Ok(None) if bodies.iter().any(|b| b.contains(&inline)) => "image content",
        Ok(None) if bodies.iter().any(|b| b.contains("dot.png")) => "a path",
        Ok(_) => panic!("{}: the image was dropped: {bodies:?}", rig.provider),
    };
    eprintln!("PEDELEC_AGENT_ATTACHMENTS {}: the image went as {how}", rig.provider);
    session.send_text("after the attachments").await.unwrap();
    session.end().await.unwrap();
}

per_agent!(attachments => super::attachments_reach_the_model);

/// A process's command line, its arguments joined by spaces.
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .unwrap_or_default()
}

/// `kill -9` of a session's persistent agent process (the processes under
/// Core whose command line holds `marker`) while its turn waits on a
/// frontend tool: the awaited turn fails promptly with `PROVIDER_CRASHED`,
/// the session stays usable, the next turn starts the agent again and
/// resumes the conversation, and the killed processes are reaped.
async fn killed_mid_turn(rig: Rig, server: &ModelServer, marker: &str, one_process: bool, saved_in: Option<PathBuf>) {
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let core_pid = h.core.pid().expect("Core runs");
    let session = client
        .create_session(SessionOptions { tools: vec![stalling_tool()], auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    session.send_text("remember the word osprey").await.unwrap();
    let stalled = session.clone();
    let turn = tokio::spawn(async move { stalled.send_text("call stall {}").await });
    waits_for_tool(&session).await;
    // An agent that saves its conversation lazily (claude) must have saved
    // the first turn before the kill, or there is nothing to resume.
    if let Some(dir) = saved_in {
        let saved = || {
            std::fs::read_dir(&dir).into_iter().flatten().flatten().any(|project| {
                std::fs::read_dir(project.path()).into_iter().flatten().flatten().any(|f| {
                    f.path().extension().is_some_and(|e| e == "jsonl") && f.metadata().is_ok_and(|m| m.len() > 0)
                })
            })
        };
        for _ in 0..200 {
            if saved() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(saved(), "{}: the conversation was saved before the kill", rig.provider);
    }
    let agent: Vec<u32> = descendants(core_pid).into_iter().filter(|pid| command_line(*pid).contains(marker)).collect();
    assert!(!agent.is_empty(), "{}: the agent runs under Core", rig.provider);
    if one_process {
        assert_eq!(agent.len(), 1, "{}: one process serves the session's turns", rig.provider);
    }
    let killed = Instant::now();
    for pid in &agent {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    let settled = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("the turn settles");
    let error = settled.unwrap().expect_err("the turn fails");
    let to_failure = killed.elapsed();
    eprintln!("PEDELEC_AGENT_CRASH {}: kill -9 → failed turn {} ms", rig.provider, to_failure.as_millis());
    let provider_code = error.details.as_ref().and_then(|d| d["providerCode"].as_str()).unwrap_or_default();
    assert_eq!((error.code.as_str(), provider_code), ("SEND_TEXT_FAILED", "PROVIDER_CRASHED"), "{error:?}");
    assert!(to_failure < Duration::from_secs(5), "promptly: {to_failure:?}");
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle, "the session stays usable");

    let before = server.generations().len();
    session.send_text("after the crash").await.unwrap_or_else(|e| panic!("the turn after the crash: {e:?}"));
    let texts: Vec<String> =
        generations_since(server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    if rig.resumes == Resumes::Yes {
        assert!(texts.iter().any(|t| t.contains("osprey")), "{}: the conversation resumed: {texts:?}", rig.provider);
    }
    assert!(
        survivors_after_a_while(&agent).await.is_empty(),
        "the killed processes are gone (reaped by the runtime that replaced them)"
    );
    session.end().await.unwrap();
}

/// The defence for a codex started before its session: the session's tool
/// token reaches the MCP bridge alone (the thread's MCP server config), so
/// it is in no codex process's environment — nor in the shells codex runs —
/// and codex keeps it nowhere in its home (thread config is not saved).
/// Passing it through codex's environment, as before the warm start, fails
/// the first check.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_keeps_the_tool_token_out_of_its_environment_and_home() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let h = AgentHarness::start(&format!("{}warm = true\n", rig.settings));
    let core_pid = h.core.pid().expect("Core runs");
    let counter = Arc::new(Mutex::new(0));
    let session = h
        .client()
        .await
        .create_session(SessionOptions {
            tools: vec![counter_tool(counter.clone())],
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    session.send_text(r#"call update_counter {"delta":2}"#).await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2, "the tool worked through the bridge");
    let token = h.tool_token(session.session_id());
    let codex: Vec<u32> =
        descendants(core_pid).into_iter().filter(|pid| command_line(*pid).contains("app-server")).collect();
    assert!(!codex.is_empty(), "codex runs under Core");
    for pid in codex {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&environ).contains(&token), "the token is not in codex's environment ({pid})");
    }
    let home = rig._home.path().to_path_buf();
    let mut stack = vec![home];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                assert!(!String::from_utf8_lossy(&bytes).contains(&token), "codex saved the token in {path:?}");
            }
        }
    }
    session.end().await.unwrap();
}

/// One site's codex sessions share one `codex app-server` (a thread each),
/// another site's get their own; each session's tool calls reach its own
/// handler (the thread's MCP server carries that session's token), and a
/// kill -9 of the shared process mid-turn settles every turn on it, after
/// which each session's next turn resumes its own thread.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_sessions_of_a_site_share_one_app_server() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let core_pid = h.core.pid().expect("Core runs");
    let app_servers = || {
        let all = descendants(core_pid);
        // The shim's child is the codex binary: count the processes Core started.
        all.iter()
            .copied()
            .filter(|pid| command_line(*pid).contains("app-server") && !all.contains(&parent_of(*pid)))
            .collect::<Vec<_>>()
    };
    let site = h.client().await;
    let other = h.client_for("app:another-program").await;
    let counters: Vec<Arc<Mutex<i64>>> = (0..3).map(|_| Arc::default()).collect();
    let mut sessions = Vec::new();
    for (client, counter) in [&site, &site, &other].into_iter().zip(&counters) {
        let session = client
            .create_session(SessionOptions {
                tools: vec![counter_tool(counter.clone()), stalling_tool()],
                auto_end_on_disconnect: false,
                ..rig.options()
            })
            .await
            .unwrap();
        sessions.push(session);
    }
    for (i, session) in sessions.iter().enumerate() {
        let word = ["heron", "egret", "stork"][i];
        session.send_text(&format!("remember the word {word}")).await.unwrap();
        session.send_text(&format!(r#"call update_counter {{"delta":{}}}"#, i + 1)).await.unwrap();
    }
    let counts: Vec<i64> = counters.iter().map(|c| *c.lock().unwrap()).collect();
    assert_eq!(counts, [1, 2, 3], "each session's tool call reached its own handler");
    let running = app_servers();
    assert_eq!(running.len(), 2, "one app-server for the site's two sessions, one for the other site: {running:?}");

    // Both of the site's sessions wait on a tool in the shared process; it is killed.
    let stalled: Vec<_> = sessions[..2]
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move { s.send_text("call stall {}").await })
        })
        .collect();
    for session in &sessions[..2] {
        waits_for_tool(session).await;
    }
    let shared = sessions_process(&running);
    let group: Vec<u32> = std::iter::once(shared).chain(descendants(shared)).collect();
    for pid in &group {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    for turn in stalled {
        let settled = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("every turn settles");
        let error = settled.unwrap().expect_err("the turn fails");
        let provider_code = error.details.as_ref().and_then(|d| d["providerCode"].as_str()).unwrap_or_default();
        assert_eq!(provider_code, "PROVIDER_CRASHED", "{error:?}");
    }
    for (i, session) in sessions.iter().enumerate() {
        let before = server.generations().len();
        session.send_text("which word?").await.unwrap_or_else(|e| panic!("session {i} after the crash: {e:?}"));
        let texts: Vec<String> =
            generations_since(&server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
        let word = ["heron", "egret", "stork"][i];
        assert!(texts.iter().any(|t| t.contains(word)), "session {i} continued its own thread: {texts:?}");
        assert!(
            !texts.iter().any(|t| ["heron", "egret", "stork"].iter().any(|w| *w != word && t.contains(w))),
            "session {i} sees no other session's conversation: {texts:?}"
        );
    }
    for session in &sessions {
        session.end().await.unwrap();
    }
}

/// The parent of `pid` (0 when unknown).
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0)
}

/// Of the top-level app-servers, the one serving the two stalled sessions:
/// the one with two MCP bridges under it.
fn sessions_process(running: &[u32]) -> u32 {
    *running
        .iter()
        .max_by_key(|pid| descendants(**pid).iter().filter(|p| command_line(**p).contains(" mcp")).count())
        .expect("an app-server")
}

/// `kill -9` mid-turn of each agent's persistent or shared process: codex's
/// app-server (its node shim and binary), the session's one claude CLI, a
/// site's shared ACP agent.
async fn agent_killed_mid_turn(rig: Rig, server: &ModelServer) {
    // What names the agent's processes on their command lines.
    let (marker, one_process) = match rig.provider {
        "codex" => ("app-server", false),
        "claude" => ("--input-format", true),
        "claude-acp" => ("claude-agent-acp", false),
        other => (other, false),
    };
    // Claude Code saves its conversation lazily.
    let saved_in = rig.provider.starts_with("claude").then(|| rig._home.path().join("claude/projects"));
    killed_mid_turn(rig, server, marker, one_process, saved_in).await;
}

per_agent!(crash => super::agent_killed_mid_turn);

/// A claude session's turns share one CLI: the second turn starts no
/// process, so its first delta comes about as soon as the model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_turns_share_one_cli() {
    let Some(program) = agent("claude") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::claude(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let core_pid = h.core.pid().expect("Core runs");
    let session = h
        .client()
        .await
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    let clis = || {
        descendants(core_pid)
            .into_iter()
            .filter(|pid| command_line(*pid).contains("--input-format"))
            .collect::<Vec<_>>()
    };
    session.send_text("first").await.unwrap();
    let first = clis();
    second_turn_first_delta(&rig, &session, &server).await;
    assert_eq!(clis(), first, "the second turn ran on the same CLI");
    assert_eq!(first.len(), 1);
    session.end().await.unwrap();
}

/// A codex session's second turn goes to its running app-server thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_second_turn_on_its_running_thread() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let session = h
        .client()
        .await
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    session.send_text("first").await.unwrap();
    second_turn_first_delta(&rig, &session, &server).await;
    session.end().await.unwrap();
}

/// Sends a turn to a session whose agent already runs and prints its first
/// delta after the send, beside the model server's own time for it.
async fn second_turn_first_delta(rig: &Rig, session: &PedelecSession, server: &ModelServer) {
    let first_delta = Arc::new(Mutex::new(None::<Instant>));
    let seen = first_delta.clone();
    let _off = session.on_chat_delta(move |_, _| {
        seen.lock().unwrap().get_or_insert_with(Instant::now);
    });
    let before = server.generations().len();
    let sent = Instant::now();
    session.send_text("second").await.unwrap();
    let to_delta = first_delta.lock().unwrap().map(|at| at - sent).expect("the second turn streamed");
    let floor = generations_since(server, before).iter().map(|r| r.answered - r.received).max().unwrap_or_default();
    eprintln!(
        "PEDELEC_AGENT_SECOND_TURN {}: first delta {} ms after send; model server {} ms; difference {} ms (target ≤ 20)",
        rig.provider,
        to_delta.as_millis(),
        floor.as_millis(),
        to_delta.saturating_sub(floor).as_millis()
    );
}

/// A codex turn that outlives Core's turn timeout (a model that does not
/// answer for a minute): the turn fails `PROVIDER_TIMEOUT`, Core ends that
/// app-server (the turn interrupted first), and the next turn's app-server
/// resumes the same thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_turn_past_the_timeout_then_the_thread_goes_on() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let h = AgentHarness::start(&format!("turn_timeout_secs = 2\n{}", rig.settings));
    let client = h.client().await;
    let core_pid = h.core.pid().expect("Core runs");
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    session.send_text("remember the word egret").await.unwrap();
    let app_server = || -> Vec<u32> {
        descendants(core_pid).into_iter().filter(|pid| command_line(*pid).contains("app-server")).collect()
    };
    let first = app_server();
    let error = tokio::time::timeout(Duration::from_secs(20), session.send_text("slow 60000"))
        .await
        .expect("the timeout settles the turn")
        .expect_err("the turn fails");
    let provider_code = error.details.as_ref().and_then(|d| d["providerCode"].as_str()).unwrap_or_default();
    assert_eq!(provider_code, "PROVIDER_TIMEOUT", "{error:?}");
    assert!(survivors_after_a_while(&first).await.is_empty(), "the timed-out app-server was ended");

    let before = server.generations().len();
    session.send_text("after the timeout").await.unwrap_or_else(|e| panic!("the turn after the timeout: {e:?}"));
    let texts: Vec<String> =
        generations_since(&server, before).iter().flat_map(|r| r.request.history()).map(|(_, _, t)| t).collect();
    assert!(texts.iter().any(|t| t.contains("egret")), "the new app-server resumed the thread: {texts:?}");
    session.end().await.unwrap();
}

/// `cancel()` while codex waits for the application's answer to an
/// approval (`PermissionMode::App`, a handler that never answers): the
/// turn is interrupted, the awaited turn rejects `OPERATION_CANCELLED`,
/// nothing is written, and the next turn runs on the same codex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cancel_while_an_approval_waits_for_the_app() {
    let Some(program) = agent("codex") else { return };
    let server = ModelServer::start(standard_script()).await.unwrap();
    let rig = Rig::codex(&program, &server);
    let h = AgentHarness::start(&rig.settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            permission_mode: pedelec_protocol::pb::PermissionMode::App,
            auto_end_on_disconnect: false,
            ..rig.options()
        })
        .await
        .unwrap();
    let asked = Arc::new(Mutex::new(0));
    let seen = asked.clone();
    let _off = session.on_permission(move |_, _| {
        *seen.lock().unwrap() += 1;
        std::future::pending::<Option<String>>()
    });
    let outside = tempfile::tempdir().unwrap();
    let file = outside.path().join("never.txt");
    let waiting = session.clone();
    let path = file.display().to_string();
    let turn = tokio::spawn(async move { waiting.send_text(format!("write {path}")).await });
    eventually("the approval reaches the app", || *asked.lock().unwrap() > 0).await;
    let started = Instant::now();
    session.cancel().await.expect("cancel");
    eprintln!("PEDELEC_AGENT_CANCEL_APPROVAL codex: cancel → idle {} ms", started.elapsed().as_millis());
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle);
    let settled = tokio::time::timeout(Duration::from_secs(10), turn).await.expect("the turn settles");
    assert_eq!(settled.unwrap().expect_err("cancelled").code, "OPERATION_CANCELLED");
    assert!(!file.exists(), "nothing written without an answer");
    session.send_text("after the cancel").await.expect("the next turn");
    session.end().await.unwrap();
}

/// The resident memory of `pids` together (from /proc), in bytes.
fn resident(pids: &[u32]) -> u64 {
    let page = 4096;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/statm")).ok())
        .filter_map(|statm| statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .sum::<u64>()
        * page
}

/// A new session's first turn, from `send_text` to its first delta, the
/// model server's own time over that turn's requests (the floor: from each
/// request's arrival to its answer's last byte, the longest), and the
/// resident memory of the agent's processes after the turn (every process
/// under Core: the persistent agent and what it started).
async fn first_delta_of_a_new_session(rig: &Rig, h: &AgentHarness, server: &ModelServer) -> (Duration, Duration, u64) {
    let session = h
        .client()
        .await
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..rig.options() })
        .await
        .unwrap();
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let at = first.clone();
    let _off = session.on_chat_delta(move |_, _| {
        at.lock().unwrap().get_or_insert_with(Instant::now);
    });
    let before = server.generations().len();
    let sent = Instant::now();
    session.send_text("hello").await.unwrap_or_else(|e| panic!("{}: first turn: {e:?}", rig.provider));
    let first = first.lock().unwrap().unwrap_or_else(|| panic!("{}: the first turn streamed no delta", rig.provider));
    let floor = generations_since(server, before).iter().map(|r| r.answered - r.received).max().unwrap_or_default();
    // A warm agent for the next session runs under Core too: not this
    // one's. Once it is up (or the provider keeps none), its pid is known.
    let mut next = warm_state(h, rig.provider).await;
    for _ in 0..600 {
        if !matches!(next.state(), pb::WarmState::Starting | pb::WarmState::Idle) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        next = warm_state(h, rig.provider).await;
    }
    let next = next.pid;
    let warm: Vec<u32> = if next == 0 { Vec::new() } else { descendants(next).into_iter().chain([next]).collect() };
    let agent: Vec<u32> =
        descendants(h.core.pid().expect("Core runs")).into_iter().filter(|pid| !warm.contains(pid)).collect();
    let rss = resident(&agent);
    session.end().await.unwrap();
    (first - sent, floor, rss)
}

/// What `provider`'s warm process is doing (ListAgents, as the user's window reads it).
async fn warm_state(h: &AgentHarness, provider: &str) -> pb::WarmProcess {
    let mut raw = h.raw().await;
    let listed = raw.list_agents(pb::ListAgentsRequest { caller_origin: OWNER.into() }).await.unwrap().into_inner();
    let agent = listed.agents.into_iter().find(|a| a.provider.as_ref().is_some_and(|p| p.code == provider));
    agent.and_then(|a| a.warm).unwrap_or_default()
}

/// Warm start (issue 41): the same first turn of a new session with the
/// agent started cold and with it kept warm (`warm = true`), against the
/// model server's own time. An agent that can be kept warm (ACP, codex
/// app-server) is ready before the session exists, its session's turn
/// works, and the next warm one starts; the claude CLI takes its workspace
/// at spawn and says OFF.
/// `cargo xtask agents` prints the figures.
async fn warm_start(rig: Rig, server: &ModelServer) {
    let cold = {
        let h = AgentHarness::start(&rig.settings);
        first_delta_of_a_new_session(&rig, &h, server).await
    };
    // Ready warm agents are ended 3 s after nobody took them.
    let h = AgentHarness::start(&format!("warm_idle_timeout_secs = 3\n{}warm = true\n", rig.settings));
    if !rig.warms {
        assert_eq!(
            warm_state(&h, rig.provider).await.state(),
            pb::WarmState::Off,
            "{}: cannot be kept warm",
            rig.provider
        );
        eprintln!(
            "PEDELEC_AGENT_FIGURES {}: new session → first delta cold {} ms (model server {} ms); not kept warm (takes its workspace at spawn); persistent agent {} MiB",
            rig.provider,
            cold.0.as_millis(),
            cold.1.as_millis(),
            cold.2 >> 20
        );
        return;
    }
    let mut ready = None;
    for _ in 0..600 {
        let warm = warm_state(&h, rig.provider).await;
        match warm.state() {
            pb::WarmState::Ready => {
                ready = Some(warm);
                break;
            }
            pb::WarmState::Failed => panic!("{}: the warm agent failed: {}", rig.provider, warm.reason),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let ready = ready.unwrap_or_else(|| panic!("{}: no warm agent within 30 s", rig.provider));
    let warm = first_delta_of_a_new_session(&rig, &h, server).await;
    let mut next = warm_state(&h, rig.provider).await;
    for _ in 0..600 {
        if next.state() == pb::WarmState::Ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        next = warm_state(&h, rig.provider).await;
    }
    assert_eq!(next.state(), pb::WarmState::Ready, "{}: the next warm agent: {next:?}", rig.provider);
    assert_ne!(next.pid, ready.pid, "{}: the session took the first", rig.provider);
    // Nobody takes the next one: it is ended after its idle time.
    let mut reaped = warm_state(&h, rig.provider).await;
    for _ in 0..200 {
        if reaped.state() == pb::WarmState::Reaped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        reaped = warm_state(&h, rig.provider).await;
    }
    assert_eq!(reaped.state(), pb::WarmState::Reaped, "{}: the idle warm agent: {reaped:?}", rig.provider);
    assert!(survivors_after_a_while(&[next.pid]).await.is_empty(), "{}: the idle warm agent ended", rig.provider);
    eprintln!(
        "PEDELEC_AGENT_FIGURES {}: new session → first delta warm {} ms, cold {} ms; model server {} ms; warm − model server = {} ms (target ≤ 100); warm process {} MiB; persistent agent after a turn {} MiB",
        rig.provider,
        warm.0.as_millis(),
        cold.0.as_millis(),
        warm.1.as_millis(),
        warm.0.saturating_sub(warm.1).as_millis(),
        ready.rss_bytes >> 20,
        warm.2 >> 20
    );
}

per_agent!(warm => super::warm_start);
