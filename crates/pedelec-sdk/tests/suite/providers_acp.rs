//! The `acp` adapter against `pedelec-fake-acp` (crates/pedelec-test-agents),
//! a real ACP agent built with the `agent-client-protocol` crate: the whole
//! chain SDK → Core → agent → `pedelec-core mcp` → Core → SDK handler and
//! back, preparation, the provider identity across turns and `resume()`
//! (`session/load`), crashes, hangs, tool errors, the permission policy and
//! usage. The fake records what it saw in a JSON-lines log.

use std::path::PathBuf;
use std::time::Duration;

use pedelec_sdk::{PedelecSession, SessionOptions, SessionStatus};
use serde_json::Value;

use super::*;

fn fake_acp() -> PathBuf {
    let bin = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    assert!(bin.is_file(), "run `cargo build -p pedelec-test-agents` first ({} not found)", bin.display());
    bin
}

/// A tempdir holding the fake's log, and Core configured with provider `fake`.
struct Fake {
    dir: tempfile::TempDir,
    harness: Harness,
}

impl Fake {
    fn start(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fake-acp.log");
        let settings = format!(
            "{extra}[providers.fake]\nkind = \"acp\"\ncommand = [\"{}\", \"--acp\"]\n\
             env = {{ PEDELEC_FAKE_ACP_LOG = \"{}\" }}\n",
            fake_acp().display(),
            log.display()
        );
        Fake { dir, harness: Harness::with_config(Via::Grpc, &settings) }
    }

    fn start_with_env(env: &str) -> Self {
        // `env` replaces the table above: the log variable must stay in it.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fake-acp.log");
        let settings = format!(
            "[providers.fake]\nkind = \"acp\"\ncommand = [\"{}\"]\n\
             env = {{ PEDELEC_FAKE_ACP_LOG = \"{}\", {env} }}\n",
            fake_acp().display(),
            log.display()
        );
        Fake { dir, harness: Harness::with_config(Via::Grpc, &settings) }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("fake-acp.log")
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == kind)
            .collect()
    }

    async fn session(&self, tools: Vec<pedelec_sdk::ToolSpec>, guidance: &str) -> PedelecSession {
        let client = self.harness.client().await;
        client
            .create_session(SessionOptions {
                provider: Some("fake".into()),
                guidance: guidance.into(),
                tools,
                ..Default::default()
            })
            .await
            .unwrap()
    }
}

fn chats(recorder: &Recorder) -> Vec<String> {
    recorder.lines().into_iter().filter(|l| l.starts_with("chat ")).collect()
}

fn is_gone(pid: u64) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    !proc.exists() || std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
}

async fn all_gone(pids: &[u64]) {
    for &pid in pids {
        eventually(&format!("process {pid} is gone"), || is_gone(pid)).await;
    }
}

/// The `agent_activity` summaries in Core's transcript of `session`.
fn transcript_activities(h: &Harness, session: &str) -> Vec<String> {
    pedelec_core::store::read_transcript(&h.database(), session)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind.as_str() == "agent_activity")
        .map(|e| e.body.json()["summary"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_tool_call_goes_through_the_mcp_bridge_to_the_sdk_handler() {
    let fake = Fake::start("");
    let counter = Arc::new(Mutex::new(0));
    let session = fake.session(vec![counter_tool(counter.clone())], "You are a counter bot.").await;
    let recorder = Recorder::attach(&session);
    session.send_text("tool update_counter {\"delta\": 2}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2, "the SDK handler ran");
    assert_eq!(chats(&recorder), vec![r#"chat "ACP tool update_counter: {\"value\":2}" [user]"#]);
    assert!(recorder.count("delta ") >= 2, "chunks stream as deltas: {:?}", recorder.lines());

    // What the agent was given.
    let start = &fake.events("start")[0];
    let token = fake.harness.tool_token(session.session_id());
    let argv: Vec<String> = serde_json::from_value(start["argv"].clone()).unwrap();
    assert_eq!(argv[1..], ["--acp".to_string()], "the configured command, nothing added");
    assert!(!argv.iter().any(|a| a.contains(&token)), "the token is not on the agent's command line");
    let env_names: Vec<String> = serde_json::from_value(start["envNames"].clone()).unwrap();
    assert!(!env_names.contains(&"PEDELEC_TOOL_TOKEN".to_string()), "the token is for the bridge only");
    let init = &fake.events("initialize")[0];
    assert_eq!(init["clientCapabilities"]["fs"], serde_json::json!({"readTextFile": false, "writeTextFile": false}));
    assert_eq!(init["clientCapabilities"]["terminal"], false);
    let new = &fake.events("session_new")[0];
    let workspace = fake.harness.raw().await;
    let mut raw = workspace;
    let live = pb::ListLiveSessionsRequest { caller_origin: OWNER.into(), ..Default::default() };
    let listed = raw.list_live_sessions(live).await.unwrap().into_inner().sessions;
    assert_eq!(new["cwd"], Value::from(listed[0].workspace_path.clone()), "session/new's cwd is the workspace");
    let folder = std::path::Path::new(start["cwd"].as_str().unwrap());
    assert!(
        folder.file_name().unwrap().to_string_lossy().starts_with("pedelec-agent-fake-"),
        "the agent process runs in a private folder of its own, never a session's workspace: {folder:?}"
    );
    let core = pedelec_sdk::daemon::find_core_binary();
    assert_eq!(
        new["mcpServers"],
        serde_json::json!([{
            "name": "pedelec",
            "command": core.display().to_string(),
            "args": ["mcp"],
            "env": [
                {"name": "PEDELEC_TOOL_TOKEN", "valueLen": token.len()},
                {"name": "PEDELEC_CORE_SOCKET", "valueLen": fake.harness.socket().display().to_string().len()},
            ],
        }])
    );
    let mcp = &fake.events("mcp_started")[0];
    assert_eq!(mcp["tokenInMcpCmdline"], false);
    assert_eq!(mcp["tokenInAgentArgv"], false);
    assert_eq!(fake.events("tools_list")[0]["names"], serde_json::json!(["update_counter"]));
    let prompt = &fake.events("prompt")[0];
    assert_eq!(prompt["text"], "You are a counter bot.\n\ntool update_counter {\"delta\": 2}", "guidance first");
    assert_eq!(fake.events("permission")[0]["chosen"], "allow_once", "the session's own tool is allowed");

    // The second turn: same process, same ACP session and MCP server, no guidance.
    session.send_text("tool update_counter {\"delta\": 3}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 5);
    assert_eq!(fake.events("start").len(), 1, "one long-lived agent process");
    assert_eq!(fake.events("mcp_started").len(), 1);
    assert_eq!(fake.events("prompt")[1]["text"], "tool update_counter {\"delta\": 3}");
    let activities = transcript_activities(&fake.harness, session.session_id());
    assert!(
        activities.iter().any(|a| a == "pedelec/update_counter (completed)"),
        "tool calls are activities in the transcript, recorded once settled: {activities:?}"
    );

    // end() takes the agent and the bridge it started with it.
    let pids = [start["pid"].as_u64().unwrap(), mcp["pid"].as_u64().unwrap()];
    session.end().await.unwrap();
    all_gone(&pids).await;
    assert!(fake.events("cancel").is_empty(), "nothing to cancel between turns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_prepare_resolves_on_the_exact_acknowledgement() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "Be brief.").await;
    let recorder = Recorder::attach(&session);
    session.prepare().await.unwrap();
    assert!(chats(&recorder).is_empty(), "the preparation answer is not chat: {:?}", recorder.lines());
    session.send_text("hello").await.unwrap();
    assert_eq!(chats(&recorder), vec![r#"chat "ACP echo: hello" [user]"#]);
    let prompts = fake.events("prompt");
    assert!(prompts[0]["text"].as_str().unwrap().starts_with("Be brief.\n\n"), "{prompts:?}");
    assert_eq!(prompts[1]["text"], "hello");
    assert_eq!(fake.events("session_new")[0]["mcpServers"], serde_json::json!([]), "no tools, no bridge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_identity_survives_turns_and_resume_loads_the_session() {
    let fake = Fake::start("");
    let counter = Arc::new(Mutex::new(0));
    let session = fake.session(vec![counter_tool(counter.clone())], "Guide.").await;
    let recorder = Recorder::attach(&session);
    session.send_text("one").await.unwrap();
    session.send_text("history").await.unwrap();
    assert_eq!(chats(&recorder)[1], r#"chat "ACP history: 1 earlier prompts: one" [user]"#);
    let acp_id = fake.events("session_new")[0]["sessionId"].as_str().unwrap().to_owned();
    let record = pedelec_core::store::read_record(&fake.harness.database(), session.session_id()).unwrap().unwrap();
    assert_eq!(record.provider_session_id.as_deref(), Some(acp_id.as_str()), "the ACP sessionId is the identity");

    let first_pid = fake.events("start")[0]["pid"].as_u64().unwrap();
    session.end().await.unwrap();
    all_gone(&[first_pid]).await;
    session.resume().await.unwrap();
    session.send_text("history").await.unwrap();
    assert_eq!(fake.events("start").len(), 2, "a new runtime");
    assert_eq!(fake.events("session_new").len(), 1, "no new conversation");
    let load = &fake.events("session_load")[0];
    assert_eq!(load["sessionId"], acp_id.as_str());
    assert_eq!(load["found"], true);
    assert_eq!(load["mcpServers"][0]["args"], serde_json::json!(["mcp"]), "the bridge comes along");
    assert_eq!(chats(&recorder)[2], r#"chat "ACP history: 2 earlier prompts: one | history" [user]"#);
    assert!(
        !recorder.lines().iter().any(|l| l.contains("replayed")),
        "the replayed history is not this turn's output: {:?}",
        recorder.lines()
    );
    assert_eq!(fake.events("prompt")[2]["text"], "history", "a loaded conversation already has the guidance");
    // The bridge works in the loaded session too.
    session.send_text("tool update_counter {\"delta\": 1}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_without_load_session_starts_a_new_conversation_after_resume() {
    let fake = Fake::start_with_env("PEDELEC_FAKE_ACP_NO_LOAD = \"1\"");
    let session = fake.session(vec![], "Guide.").await;
    let recorder = Recorder::attach(&session);
    session.send_text("one").await.unwrap();
    session.end().await.unwrap();
    session.resume().await.unwrap();
    session.send_text("history").await.unwrap();
    assert!(fake.events("session_load").is_empty());
    assert_eq!(fake.events("session_new").len(), 2);
    assert_eq!(chats(&recorder)[1], r#"chat "ACP history: 0 earlier prompts: " [user]"#);
    assert!(fake.events("prompt")[1]["text"].as_str().unwrap().starts_with("Guide.\n\n"), "a new conversation");
    let activities = transcript_activities(&fake.harness, session.session_id());
    assert!(activities.iter().any(|a| a.contains("cannot load sessions")), "{activities:?}");
}

/// An agent that keeps its sessions (`loadSession`) crashing mid-turn fails
/// that turn with its exit status and stderr; the session stays usable and
/// its next turn loads the conversation on a new agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_crash_mid_turn_fails_the_turn_with_exit_status_and_stderr_and_the_next_turn_loads() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("remember the heron").await.unwrap();
    let error =
        tokio::time::timeout(Duration::from_secs(20), session.send_text("crash")).await.expect("no hang").unwrap_err();
    assert_eq!(error.code, "SEND_TEXT_FAILED", "{error:?}");
    let details = error.details.clone().unwrap_or_default();
    assert_eq!(details["providerCode"], "PROVIDER_CRASHED", "{details}");
    assert_eq!(details["exitCode"], 3, "{details}");
    assert!(details["stderrTail"].as_str().unwrap_or("").contains("crashing on purpose"), "{details}");
    assert_eq!(session.get_status(), SessionStatus::Idle, "the session goes on");
    assert!(recorder.lines().iter().any(|l| l.contains("about to crash")), "deltas before the crash streamed");
    session.send_text("history").await.expect("the turn after the crash");
    assert_eq!(fake.events("initialize").len(), 2, "a new agent");
    assert_eq!(fake.events("session_load").len(), 1, "which loaded the conversation");
    assert!(chats(&recorder).iter().any(|c| c.contains("remember the heron")), "{:?}", recorder.lines());
}

/// An agent that cannot load sessions crashing mid-turn takes the
/// conversation with it: the session moves to error, with the exit status
/// and stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_crash_of_an_agent_without_load_moves_the_session_to_error() {
    let fake = Fake::start_with_env("PEDELEC_FAKE_ACP_NO_LOAD = \"1\"");
    let session = fake.session(vec![], "").await;
    let error =
        tokio::time::timeout(Duration::from_secs(20), session.send_text("crash")).await.expect("no hang").unwrap_err();
    assert_eq!(error.code, "SESSION_ERROR", "{error:?}");
    let details = error.details.clone().unwrap_or_default();
    assert_eq!(details["providerCode"], "PROVIDER_CRASHED", "{details}");
    assert_eq!(details["exitCode"], 3, "{details}");
    eventually("error status", || session.get_status() == SessionStatus::Error).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_unknown_tools_and_invalid_args_come_back_to_the_agent_as_tool_errors() {
    let fake = Fake::start("");
    let counter = Arc::new(Mutex::new(0));
    let session = fake.session(vec![counter_tool(counter.clone())], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("tool nope {}").await.unwrap();
    session.send_text("tool update_counter {\"delta\": \"two\"}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 0, "the handler never ran");
    let replies = chats(&recorder);
    assert!(replies[0].starts_with(r#"chat "ACP tool nope error: TOOL_NOT_FOUND"#), "{replies:?}");
    assert!(replies[1].starts_with(r#"chat "ACP tool update_counter error: TOOL_ARGS_INVALID"#), "{replies:?}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_permission_requests_follow_the_policy() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("hi").await.unwrap();
    let workspace = fake.events("session_new")[0]["cwd"].as_str().unwrap().to_owned();
    for (ask, chosen) in [
        ("permission execute".to_string(), "reject_once"),
        (format!("permission edit {workspace}/notes.md"), "allow_once"),
        ("permission edit notes.md".to_string(), "allow_once"),
        (format!("permission read {workspace}/../../etc/passwd"), "reject_once"),
        ("permission fetch".to_string(), "reject_once"),
    ] {
        session.send_text(ask.clone()).await.unwrap();
        let last = chats(&recorder).pop().unwrap();
        assert_eq!(last, format!("chat \"ACP permission: {chosen}\" [user]"), "{ask}");
    }
}

/// The defence of a shared agent's permission routing: a request naming no
/// ACP session open on the agent is refused, even for a file the asking
/// session's own policy would allow. Routing it to any session instead
/// (the first, the asker's) would allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_a_permission_request_for_no_open_session_is_refused() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("hi").await.unwrap();
    let workspace = fake.events("session_new")[0]["cwd"].as_str().unwrap().to_owned();
    session.send_text(format!("permission edit {workspace}/notes.md")).await.unwrap();
    assert_eq!(chats(&recorder).pop().unwrap(), "chat \"ACP permission: allow_once\" [user]", "its own: allowed");
    session.send_text(format!("permission-as sess-forged edit {workspace}/notes.md")).await.unwrap();
    assert_eq!(chats(&recorder).pop().unwrap(), "chat \"ACP permission: reject_once\" [user]", "no such session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_usage_is_the_sum_of_prompt_response_totals() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("hello").await.unwrap();
    assert_eq!(session.usage().total_tokens, None, "no PromptResponse.usage, no total");
    session.send_text("usage 10").await.unwrap();
    session.send_text("usage 5").await.unwrap();
    assert_eq!(session.usage().total_tokens, Some(15));
    assert_eq!(recorder.count("usage "), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_end_during_a_hanging_turn_cancels_and_ends_the_process() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let s = session.clone();
    let pending = tokio::spawn(async move { s.send_text("hang").await });
    eventually("the prompt reaches the agent", || !fake.events("prompt").is_empty()).await;
    let pid = fake.events("start")[0]["pid"].as_u64().unwrap();
    session.end().await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("settled").unwrap().unwrap_err();
    assert_eq!(error.code, "SESSION_ENDED", "{error:?}");
    all_gone(&[pid]).await;
    assert_eq!(fake.events("cancel").len(), 1, "session/cancel reached the agent before it was stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_hang_past_the_turn_timeout_restarts_and_continues_the_session() {
    let fake = Fake::start("turn_timeout_secs = 1\n");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("one").await.unwrap();
    let error = session.send_text("hang").await.unwrap_err();
    assert_eq!(error.code, "SEND_TEXT_FAILED");
    assert_eq!(error.details.clone().unwrap_or_default()["providerCode"], "PROVIDER_TIMEOUT");
    all_gone(&[fake.events("start")[0]["pid"].as_u64().unwrap()]).await;
    session.send_text("history").await.unwrap();
    assert_eq!(fake.events("session_load").len(), 1, "the new runtime continues the ACP session");
    assert_eq!(chats(&recorder).last().unwrap(), r#"chat "ACP history: 2 earlier prompts: one | hang" [user]"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_model_and_effort_go_through_session_config_options() {
    let fake = Fake::start("");
    let client = fake.harness.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            provider: Some("fake".into()),
            model: Some("Fake Large".into()),
            effort_level: Some(pedelec_sdk::EffortLevel::Low),
            ..Default::default()
        })
        .await
        .unwrap();
    session.send_text("hi").await.unwrap();
    let set: Vec<(String, String)> = fake
        .events("set_config_option")
        .iter()
        .map(|e| (e["configId"].as_str().unwrap().to_owned(), e["value"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(set, vec![("model".into(), "fake-large".into()), ("thinking".into(), "low".into())]);

    let other = client
        .create_session::<String>(SessionOptions {
            provider: Some("fake".into()),
            model: Some("gpt-9".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    other.send_text("hi").await.unwrap();
    assert_eq!(fake.events("set_config_option").len(), 2, "an unknown model is not sent");
    let activities = transcript_activities(&fake.harness, other.session_id());
    assert!(activities.iter().any(|a| a.contains("offers no model \"gpt-9\"")), "{activities:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_requests_for_capabilities_we_do_not_offer_are_refused_not_hung() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("fs /etc/hostname").await.unwrap();
    assert_eq!(chats(&recorder), vec![r#"chat "ACP fs: error -32601" [user]"#], "method not found");
}

/// An agent killed between turns: the next turn starts it again and loads
/// the session (nothing was running, so nothing fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_agent_dying_between_turns_is_started_again_on_the_next_turn() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    session.send_text("hi").await.unwrap();
    let pid = fake.events("start")[0]["pid"].as_u64().unwrap();
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    all_gone(&[pid]).await;
    tokio::time::timeout(Duration::from_secs(20), session.send_text("again")).await.expect("no hang").unwrap();
    assert_eq!(fake.events("initialize").len(), 2, "a new agent");
    assert_eq!(fake.events("session_load").len(), 1, "which loaded the conversation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_garbage_and_over_long_lines_on_stdout_do_not_wedge_the_session() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    session.send_text("garbage").await.unwrap();
    session.send_text("after").await.unwrap();
    assert_eq!(chats(&recorder), vec![r#"chat "ACP garbage: still here" [user]"#, r#"chat "ACP echo: after" [user]"#]);
    assert_eq!(session.get_status(), SessionStatus::Idle);
    assert_eq!(fake.events("start").len(), 1, "the same agent process throughout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_an_error_answer_fails_the_turn_but_keeps_the_runtime() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let recorder = Recorder::attach(&session);
    let error = session.send_text("fail").await.unwrap_err();
    assert_eq!(error.code, "SEND_TEXT_FAILED", "{error:?}");
    let details = error.details.clone().unwrap_or_default();
    assert_eq!(details["providerCode"], "PROVIDER_ERROR", "{details}");
    assert_eq!(details["acpCode"], -32603, "{details}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    session.send_text("next").await.unwrap();
    assert_eq!(chats(&recorder), vec![r#"chat "ACP echo: next" [user]"#]);
    assert_eq!(fake.events("start").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_an_agent_that_needs_a_login_is_unavailable_with_the_reason() {
    let fake = Fake::start_with_env("PEDELEC_FAKE_ACP_NEEDS_AUTH = \"1\"");
    let session = fake.session(vec![], "").await;
    let error = session.send_text("hi").await.unwrap_err();
    assert_eq!(error.code, "SESSION_ERROR", "{error:?}");
    let details = error.details.clone().unwrap_or_default();
    assert_eq!(details["providerCode"], "PROVIDER_UNAVAILABLE", "{details}");
    assert!(error.message.contains("needs authentication"), "{error:?}");
    all_gone(&[fake.events("start")[0]["pid"].as_u64().unwrap()]).await;
}

/// `cancel()` sends `session/cancel`; an agent that ignores it (`hang`) is
/// dropped after Core's cancel grace and restarted, the cancel still
/// settles, and the next turn continues the conversation by `session/load`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_cancel_reaches_the_agent_and_one_that_ignores_it_is_restarted() {
    let fake = Fake::start("");
    let session = fake.session(Vec::new(), "").await;
    session.send_text("remember the heron").await.unwrap();
    let hanging = session.clone();
    let turn = tokio::spawn(async move { hanging.send_text("hang").await });
    eventually("the hanging prompt reached the agent", || fake.events("prompt").len() == 2).await;
    session.cancel().await.expect("the cancel settles even so");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    assert_eq!(turn.await.unwrap().unwrap_err().code, "OPERATION_CANCELLED");
    // The cancel's own, and the shutdown's after the grace (the prompt was still open).
    let cancels = fake.events("cancel");
    let acp_session = &fake.events("session_new")[0]["sessionId"];
    assert!(!cancels.is_empty() && cancels.iter().all(|c| c["sessionId"] == *acp_session), "{cancels:?}");

    let recorder = Recorder::attach(&session);
    session.send_text("history").await.expect("the turn after the restart");
    assert_eq!(fake.events("initialize").len(), 2, "the runtime was restarted");
    let loads = fake.events("session_load");
    assert_eq!(loads.len(), 1, "the conversation was loaded: {loads:?}");
    assert!(chats(&recorder).iter().any(|c| c.contains("remember the heron")), "{:?}", recorder.lines());
}

/// Attachments to an ACP agent: a file goes as a `resource_link` block; an
/// image to an agent without `promptCapabilities.image` (the fake) is refused
/// with ATTACHMENT_UNSUPPORTED before the agent sees a prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_attachments_are_links_and_images_need_the_capability() {
    let fake = Fake::start("");
    let session = fake.session(Vec::new(), "").await;
    let notes = pedelec_sdk::assets::UploadSource::from_bytes("notes.txt", "text/plain", b"remember".to_vec());
    session.upload_asset(notes, Some("/notes.txt")).await.unwrap();
    let png = pedelec_sdk::assets::UploadSource::from_bytes("p.png", "image/png", b"\x89PNG".to_vec());
    session.upload_asset(png, Some("/p.png")).await.unwrap();
    let options = |path: &str| pedelec_sdk::SendOptions { attachments: vec![path.into()], ..Default::default() };
    session.send_text_with("read the notes", options("/notes.txt")).await.unwrap();
    let prompts = fake.events("prompt");
    assert_eq!(prompts[0]["blocks"], 2, "the text and the link: {prompts:?}");
    let error = session.send_text_with("look", options("/p.png")).await.unwrap_err();
    assert_eq!(error.code, "ATTACHMENT_UNSUPPORTED", "{error:?}");
    assert_eq!(fake.events("prompt").len(), 1, "the agent never saw that turn");
    session.send_text("still here").await.unwrap();
}

/// An agent that streams faster than the application reads is held back by
/// Core's flow control (it waits in its stdout pipe), so a reader that keeps
/// reading sees every delta and is never re-synchronised past some of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_a_fast_agent_waits_for_a_slow_reader_and_no_delta_is_lost() {
    const N: usize = 60_000;
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let deltas = Arc::new(Mutex::new(String::new()));
    let seen = deltas.clone();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    let _off = session.on_chat_delta(move |delta, _| {
        seen.lock().unwrap().push_str(delta);
        // A reader slower than the agent, at most 50 000 deltas/s: 1 ms
        // every 50 deltas. The SDK runs the handlers of what it read in one
        // go, so it is silent towards Core for a batch's sleeps (~20 ms for
        // 1 000 events), well under the 100 ms after which Core counts it as
        // stalled and stops waiting for it.
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 50 == 49 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    session.send_text(&format!("deltas {N}")).await.unwrap();
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), N, "every delta reached the handler");
    let expected: String = (0..N).map(|i| format!("w{} ", i % 10)).collect();
    assert_eq!(*deltas.lock().unwrap(), expected, "in order, none twice");
}

/// `fork()` on an ACP agent that does not advertise
/// `sessionCapabilities.fork`: `FORK_UNSUPPORTED` whether or not a session
/// of it ran yet (Core then probes the agent with `initialize` alone), and
/// no session is created, opened or prompted for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_fork_without_the_capability_is_refused_before_anything_is_sent() {
    let fake = Fake::start("");
    let session = fake.session(vec![], "").await;
    let error = session.fork().await.expect_err("the fake cannot fork");
    assert_eq!(error.code, "FORK_UNSUPPORTED", "{error:?}");
    assert_eq!(fake.events("initialize").len(), 1, "probed once");
    assert!(fake.events("session_new").is_empty() && fake.events("prompt").is_empty());
    session.send_text("hello").await.unwrap();
    let again = session.fork().await.expect_err("still cannot fork");
    assert_eq!(again.code, "FORK_UNSUPPORTED");
    assert_eq!(fake.events("session_new").len(), 1, "only the session's own");
    assert_eq!(fake.events("prompt").len(), 1);
    let listed = fake.harness.client().await.list_sessions().await.unwrap();
    assert_eq!(listed.len(), 1, "no fork was made");
}
