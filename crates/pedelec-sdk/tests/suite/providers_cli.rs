//! The codex and claude adapters against fake executables (shell scripts
//! that print the real JSON-line formats and record the argv, environment
//! and stdin they got), the `pedelec-core tool call` path, and the faults:
//! missing binary, crash mid-turn, garbage and over-long lines, a hang past
//! the turn timeout.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use pedelec_sdk::{EffortLevel, PedelecError, SessionOptions, SessionStatus};

use super::*;

/// Writes an executable `sh` script that records its argv, stdin and the
/// names of the PEDELEC_* variables it saw, then runs `body`. Asked its
/// `--version`, it names a codex older than app-server, so Core drives it
/// through `exec --json`.
fn fake_agent(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let log = dir.join(format!("{name}.log"));
    let core = pedelec_sdk::daemon::find_core_binary();
    let script = format!(
        "#!/bin/sh\nLOG='{log}'\nCORE='{core}'\n\
         [ \"$1\" = --version ] && {{ echo 'codex-cli 0.1.0-fake'; exit 0; }}\n\
         printf '%s\\n' \"$@\" > \"$LOG.argv\"\n\
         cat > \"$LOG.stdin\"\n\
         env | grep '^PEDELEC_' | cut -d= -f1 | sort > \"$LOG.env\"\n\
         pwd > \"$LOG.cwd\"\n{body}\n",
        log = log.display(),
        core = core.display(),
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// [`fake_agent`] for claude, which keeps its process across turns: it
/// records its argv once, then runs `body` for each line (one user message
/// per turn) it reads on stdin, appending the line to the stdin record.
fn fake_claude(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("claude");
    let log = dir.join("claude.log");
    let core = pedelec_sdk::daemon::find_core_binary();
    let script = format!(
        "#!/bin/sh\nLOG='{log}'\nCORE='{core}'\n\
         printf '%s\\n' \"$@\" > \"$LOG.argv\"\n\
         echo $$ >> \"$LOG.pids\"\n\
         env | grep '^PEDELEC_' | cut -d= -f1 | sort > \"$LOG.env\"\n\
         pwd > \"$LOG.cwd\"\n\
         while IFS= read -r line; do\nprintf '%s\\n' \"$line\" >> \"$LOG.stdin\"\n{body}\ndone\n",
        log = log.display(),
        core = core.display(),
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn recorded(dir: &Path, name: &str, what: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log.{what}"))).unwrap_or_default()
}

fn config(provider: &str, program: &Path, extra: &str) -> String {
    format!("[providers.{provider}]\ncommand = [\"{}\"]\n{extra}", program.display())
}

const CODEX_TOOL_TURN: &str = r#"
echo '{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}'
echo '{"type":"turn.started"}'
RESULT=$("$CORE" tool call update_counter '{"delta":2}')
echo '{"type":"item.completed","item":{"id":"item_0","type":"mcp_tool_call","server":"pedelec","tool":"update_counter","arguments":{"delta":2},"status":"completed"}}'
ESCAPED=$(printf '%s' "$RESULT" | sed 's/"/\\"/g')
echo "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_1\",\"type\":\"agent_message\",\"text\":\"tool said $ESCAPED\"}}"
echo '{"type":"turn.completed","usage":{"input_tokens":100,"cached_input_tokens":50,"output_tokens":20}}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_turns_reach_frontend_tools_and_resume_the_thread() {
    let bin = tempfile::tempdir().unwrap();
    let codex = fake_agent(bin.path(), "codex", CODEX_TOOL_TURN);
    let h = Harness::with_config(Via::Grpc, &config("codex", &codex, "model = \"gpt-test\"\n"));
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions {
            provider: Some("codex".into()),
            effort_level: Some(EffortLevel::High),
            guidance: "You are a counter bot.".into(),
            tools: vec![counter_tool(counter.clone())],
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session.send_text("raise the counter").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2);
    assert!(
        recorder.lines().contains(&r#"chat "tool said {\"value\":2}" [user]"#.to_string()),
        "{:?}",
        recorder.lines()
    );
    assert_eq!(session.usage().total_tokens, Some(120));

    let argv = recorded(bin.path(), "codex", "argv");
    let token = h.tool_token(session.session_id());
    assert!(!argv.contains(&token), "the tool token stays off the command line");
    let args: Vec<&str> = argv.lines().collect();
    let workspace = recorded(bin.path(), "codex", "cwd");
    let core = pedelec_sdk::daemon::find_core_binary().display().to_string();
    let expected = [
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        "--cd",
        workspace.trim(),
        "-c",
        &format!("mcp_servers.pedelec.command=\"{core}\""),
        "-c",
        "mcp_servers.pedelec.args=[\"mcp\"]",
        "-c",
        "mcp_servers.pedelec.env_vars=[\"PEDELEC_TOOL_TOKEN\",\"PEDELEC_CORE_SOCKET\"]",
        "-c",
        "mcp_servers.pedelec.tool_timeout_sec=65",
        "-c",
        "mcp_servers.pedelec.default_tools_approval_mode=\"approve\"",
        "-c",
        "sandbox_workspace_write.exclude_slash_tmp=true",
        "-c",
        "sandbox_workspace_write.exclude_tmpdir_env_var=true",
        "-m",
        "gpt-test",
        "-c",
        "model_reasoning_effort=\"high\"",
        "-",
    ];
    assert_eq!(args, expected);
    assert_eq!(recorded(bin.path(), "codex", "env"), "PEDELEC_CORE_SOCKET\nPEDELEC_TOOL_TOKEN\n");
    assert_eq!(recorded(bin.path(), "codex", "stdin"), "You are a counter bot.\n\nraise the counter");

    // The next turn continues the thread; after end + resume it still does.
    session.send_text("again").await.unwrap();
    let argv = recorded(bin.path(), "codex", "argv");
    assert!(argv.ends_with("resume\n0199a213-81c0-7800-8aa1-bbab2a035a53\n-\n"), "{argv}");
    assert_eq!(recorded(bin.path(), "codex", "stdin"), "again", "guidance only starts a thread");
    session.end().await.unwrap();
    session.resume().await.unwrap();
    session.send_text("after resume").await.unwrap();
    assert!(recorded(bin.path(), "codex", "argv").contains("resume\n0199a213-81c0-7800-8aa1-bbab2a035a53\n"));
    assert_eq!(*counter.lock().unwrap(), 6);
}

const CLAUDE_TURN: &str = r#"
cp "$(sed -n '/--mcp-config/{n;p}' "$LOG.argv")" "$LOG.mcp"
stat -c %a "$(sed -n '/--mcp-config/{n;p}' "$LOG.argv")" > "$LOG.mode"
S='"session_id":"8f1c2a3e-5b6d-4e7f-9a0b-1c2d3e4f5a6b"'
echo "{\"type\":\"system\",\"subtype\":\"init\",$S}"
echo "{\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}},\"parent_tool_use_id\":null,$S}"
echo "{\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"there\"}},\"parent_tool_use_id\":null,$S}"
echo "{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"Hello there\"}]},\"parent_tool_use_id\":null,$S}"
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"Hello there\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":5,\"output_tokens\":7},$S}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_streams_deltas_and_gets_the_bridge_in_a_private_mcp_config() {
    let bin = tempfile::tempdir().unwrap();
    let claude = fake_claude(bin.path(), CLAUDE_TURN);
    // Claude's config dir, holding the conversation the fake names (Core
    // resumes a conversation only where Claude saved it).
    let claude_config = bin.path().join("claude-config");
    let saved = claude_config.join("projects/-fake");
    std::fs::create_dir_all(&saved).unwrap();
    std::fs::write(saved.join("8f1c2a3e-5b6d-4e7f-9a0b-1c2d3e4f5a6b.jsonl"), "{}\n").unwrap();
    let env = format!("env = {{ CLAUDE_CONFIG_DIR = \"{}\" }}\n", claude_config.display());
    let h = Harness::with_config(Via::Grpc, &config("claude", &claude, &env));
    let client = h.client().await;
    let session = client
        .create_session(SessionOptions {
            provider: Some("claude".into()),
            model: Some("sonnet".into()),
            effort_level: Some(EffortLevel::Low),
            tools: vec![counter_tool(Arc::default())],
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session.send_text("hi").await.unwrap();
    let transcript = recorder.transcript();
    assert!(transcript.contains(r#"deltas "Hello there""#) || transcript.contains("delta"), "{transcript}");
    assert!(recorder.lines().contains(&r#"chat "Hello there" [user]"#.to_string()), "{transcript}");
    assert_eq!(session.usage().total_tokens, Some(22));

    let argv = recorded(bin.path(), "claude", "argv");
    let args: Vec<&str> = argv.lines().collect();
    let mcp_path = args[args.iter().position(|a| *a == "--mcp-config").unwrap() + 1];
    // Deny rules keep claude's file tools out of Core's state and config dirs.
    let state = h.state().display().to_string();
    let config = h.dir.path().join("config").display().to_string();
    let (read_state, edit_state) = (format!("Read(/{state}/**)"), format!("Edit(/{state}/**)"));
    let (read_config, edit_config) = (format!("Read(/{config}/**)"), format!("Edit(/{config}/**)"));
    assert!(read_state.starts_with("Read(//"), "an absolute path in claude's rule syntax: {read_state}");
    assert_eq!(
        args,
        [
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--mcp-config",
            mcp_path,
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__pedelec",
            "--disallowedTools",
            &read_state,
            &edit_state,
            &read_config,
            &edit_config,
            "--model",
            "sonnet",
            "--effort",
            "low",
            "--input-format",
            "stream-json",
            "--replay-user-messages",
        ]
    );
    // The message is a stream-json user message on stdin.
    let message: serde_json::Value = serde_json::from_str(recorded(bin.path(), "claude", "stdin").trim()).unwrap();
    assert_eq!(
        message,
        json!({ "type": "user", "message": { "role": "user", "content": [{ "type": "text", "text": "hi" }] } })
    );
    assert_eq!(recorded(bin.path(), "claude", "mode").trim(), "600");
    let mcp: serde_json::Value = serde_json::from_str(&recorded(bin.path(), "claude", "mcp")).unwrap();
    let token = h.tool_token(session.session_id());
    let server = &mcp["mcpServers"]["pedelec"];
    assert_eq!(server["args"], json!(["mcp"]));
    assert_eq!(server["env"]["PEDELEC_TOOL_TOKEN"], json!(token));
    assert!(!argv.contains(&token));

    // The next turn goes to the same process; each turn's usage adds up.
    session.send_text("more").await.unwrap();
    assert_eq!(recorded(bin.path(), "claude", "argv"), argv, "the same CLI");
    assert_eq!(recorded(bin.path(), "claude", "pids").lines().count(), 1);
    assert_eq!(recorded(bin.path(), "claude", "stdin").lines().count(), 2);
    assert_eq!(session.usage().total_tokens, Some(44), "each turn's usage adds up");
    // After end + resume, a new CLI resumes the conversation.
    session.end().await.unwrap();
    session.resume().await.unwrap();
    session.send_text("after resume").await.unwrap();
    let argv = recorded(bin.path(), "claude", "argv");
    assert!(
        argv.ends_with(
            "--resume\n8f1c2a3e-5b6d-4e7f-9a0b-1c2d3e4f5a6b\n--input-format\nstream-json\n--replay-user-messages\n"
        ),
        "{argv}"
    );
    assert_eq!(recorded(bin.path(), "claude", "pids").lines().count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_is_reported_unavailable_with_the_reason() {
    let h = Harness::with_config(Via::Grpc, "[providers.codex]\ncommand = [\"pedelec-no-such-codex\"]\n");
    let client = h.client().await;
    let providers = client.list_providers().await.unwrap();
    let codex = providers.iter().find(|p| p.code == "codex").unwrap();
    assert!(!codex.available);
    assert!(codex.reason.contains("pedelec-no-such-codex is not on PATH"), "{}", codex.reason);
    assert!(providers.iter().any(|p| p.code == "scripted" && p.available));
    for code in ["gemini", "cursor", "opencode", "claude-acp", "codex-acp", "claude", "openai", "ollama", "llamacpp"] {
        assert!(providers.iter().any(|p| p.code == code), "{code} is listed");
    }
    let refused = client
        .create_session::<String>(SessionOptions { provider: Some("codex".into()), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code, "PROVIDER_UNAVAILABLE");
}

fn details(error: &PedelecError) -> serde_json::Value {
    error.details.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_turn_moves_the_session_to_error_with_the_exit_status_and_stderr() {
    let bin = tempfile::tempdir().unwrap();
    let codex = fake_agent(
        bin.path(),
        "codex",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}'\necho 'segfault in the model loop' >&2\nexit 3",
    );
    let h = Harness::with_config(Via::Grpc, &config("codex", &codex, ""));
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("codex".into()), ..Default::default() })
        .await
        .unwrap();
    let error = session.send_text("go").await.unwrap_err();
    assert_eq!(error.code, "SESSION_ERROR", "{error:?}");
    let details = details(&error);
    assert_eq!(details["providerCode"], "PROVIDER_CRASHED");
    assert_eq!(details["exitCode"], 3);
    assert!(details["stderrTail"].as_str().unwrap().contains("segfault in the model loop"), "{details}");
    eventually("error status", || session.get_status() == SessionStatus::Error).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_over_long_lines_do_not_wedge_the_turn() {
    let bin = tempfile::tempdir().unwrap();
    let codex = fake_agent(
        bin.path(),
        "codex",
        r#"echo 'not json at all'
echo '[1,2]'
head -c 2097152 /dev/zero | tr '\0' 'x'; echo
printf '\377\376\n'
echo '{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"still here"}}'
echo '{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}'"#,
    );
    let h = Harness::with_config(Via::Grpc, &config("codex", &codex, ""));
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("codex".into()), ..Default::default() })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session.send_text("go").await.unwrap();
    assert!(recorder.lines().contains(&r#"chat "still here" [user]"#.to_string()), "{:?}", recorder.lines());
    assert_eq!(session.get_status(), SessionStatus::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_past_the_turn_timeout_fails_the_turn_and_kills_the_process_group() {
    let bin = tempfile::tempdir().unwrap();
    let pids = bin.path().join("pids");
    let codex = fake_agent(
        bin.path(),
        "codex",
        &format!(
            "echo '{{\"type\":\"thread.started\",\"thread_id\":\"t-2\"}}'\nsleep 60 &\necho $$ $! > '{}'\nwait",
            pids.display()
        ),
    );
    let h = Harness::with_config(Via::Grpc, &format!("turn_timeout_secs = 1\n{}", config("codex", &codex, "")));
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("codex".into()), ..Default::default() })
        .await
        .unwrap();
    let error = session.send_text("go").await.unwrap_err();
    assert_eq!(error.code, "SEND_TEXT_FAILED");
    assert_eq!(details(&error)["providerCode"], "PROVIDER_TIMEOUT");
    assert_eq!(session.get_status(), SessionStatus::Idle, "a timeout is not fatal");
    let pids = std::fs::read_to_string(&pids).unwrap();
    for pid in pids.split_whitespace() {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        eventually(&format!("process {pid} is gone"), || {
            !proc.exists() || std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_mid_turn_ends_the_agents_whole_process_tree() {
    let bin = tempfile::tempdir().unwrap();
    let pids = bin.path().join("pids");
    let claude = fake_claude(
        bin.path(),
        &format!(
            "sh -c 'sleep 60' &\nsleep 60 &\necho $$ $! > '{}.partial'\nmv '{0}.partial' '{0}'\nwait",
            pids.display()
        ),
    );
    let h = Harness::with_config(Via::Grpc, &config("claude", &claude, ""));
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("claude".into()), ..Default::default() })
        .await
        .unwrap();
    let sess = session.clone();
    let turn = tokio::spawn(async move { sess.send_text("work for a minute").await });
    eventually("the agent started", || pids.exists()).await;
    session.end().await.unwrap();
    assert!(turn.await.unwrap().is_err(), "the turn does not complete");
    for pid in std::fs::read_to_string(&pids).unwrap().split_whitespace() {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        eventually(&format!("process {pid} is gone"), || {
            !proc.exists() || std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
        })
        .await;
    }
}

/// A claude CLI that ended before it saved the conversation (a `kill -9`
/// soon after a turn) left nothing to resume: where Claude's projects
/// folder holds no such conversation, the next CLI starts a new one, and
/// the transcript says so, instead of every later turn failing `--resume`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_conversation_that_was_never_saved_starts_anew() {
    let bin = tempfile::tempdir().unwrap();
    let claude = fake_claude(bin.path(), CLAUDE_TURN);
    let claude_config = bin.path().join("claude-config");
    std::fs::create_dir_all(claude_config.join("projects")).unwrap();
    let env = format!("env = {{ CLAUDE_CONFIG_DIR = \"{}\" }}\n", claude_config.display());
    let h = Harness::with_config(Via::Grpc, &config("claude", &claude, &env));
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            provider: Some("claude".into()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    session.send_text("hi").await.unwrap();
    session.end().await.unwrap();
    session.resume().await.unwrap();
    session.send_text("again").await.expect("a new conversation, not a failed --resume");
    let argv = recorded(bin.path(), "claude", "argv");
    assert!(!argv.contains("--resume"), "{argv}");
    let notes: Vec<String> = pedelec_core::store::read_transcript(&h.database(), session.session_id())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind.as_str() == "agent_activity")
        .map(|e| e.body.json()["summary"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(notes.iter().any(|n| n.contains("was not saved")), "{notes:?}");
}
