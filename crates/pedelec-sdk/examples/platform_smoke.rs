//! The smoke test of one platform's build, run by `cargo xtask ci` natively
//! and, for the Windows build, under wine: Core serves on this OS's endpoint
//! (a Unix socket, or a named pipe), a scripted session answers a frontend
//! tool over gRPC and through the native host, and `end()` ends an agent's
//! whole process tree (the agent and the child it started). The host's
//! `install`, `status` and `uninstall` register it for Chrome where this OS
//! looks (a manifest file; on Windows also the registry key naming it), in
//! a temporary profile.
//!
//! The agent is this program itself, behind a shim script as npm installs
//! agents (`tree-agent.cmd` on Windows): Core starts it (as a `claude`-kind
//! provider, `PEDELEC_SMOKE_ROLE=agent`); it starts a copy of itself as its
//! own child (`heartbeat`) and both write a growing counter to a file of
//! their own until they are ended. Once the counters stop, the tree is gone.
//!
//! Usage: `platform_smoke [--core PATH] [--host PATH]`; exits non-zero with
//! the failed step on stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::native::NativeMessagingTransport;
use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec, sync_handler};
use serde_json::json;

const ROLE: &str = "PEDELEC_SMOKE_ROLE";
const BEAT_FILE: &str = "PEDELEC_SMOKE_BEAT";
const EXTENSION: &str = "ighbaanpnpjegfpbhfnaekbncchadgfe";

type Failure = Box<dyn std::error::Error>;

fn flag(name: &str) -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(PathBuf::from)
}

/// Writes a growing counter to `file` every 20 ms, for ever.
fn beat(file: &Path) -> ! {
    for n in 0u64.. {
        let _ = std::fs::write(file, n.to_string());
        std::thread::sleep(Duration::from_millis(20));
    }
    unreachable!()
}

/// Calls the session's frontend tool as an agent that only runs shell
/// commands does: the bridge command and environment (tool token, Core's
/// endpoint) from the `--mcp-config` file Core gave it, as
/// `<bridge> tool call update_counter {"delta":7}`; the printed result goes
/// to `out`.
fn call_tool_through_the_bridge(out: &Path) -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().collect();
    let config =
        args.iter().position(|a| a == "--mcp-config").and_then(|i| args.get(i + 1)).ok_or("no --mcp-config")?;
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config)?)?;
    let server = config["mcpServers"].as_object().and_then(|s| s.values().next()).ok_or("no MCP server")?;
    let env = server["env"].as_object().ok_or("no bridge environment")?;
    let output = std::process::Command::new(server["command"].as_str().ok_or("no bridge command")?)
        .args(["tool", "call", "update_counter", r#"{"delta":7}"#])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default())))
        .output()?;
    if !output.status.success() {
        return Err(format!("tool call failed: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    std::fs::write(out, output.stdout)?;
    Ok(())
}

/// The agent: calls the frontend tool through the bridge, starts its
/// heartbeat child, then beats itself; never answers.
fn agent() -> ! {
    let file = PathBuf::from(std::env::var_os(BEAT_FILE).expect("the beat file is set"));
    if let Err(error) = call_tool_through_the_bridge(&file.with_extension("tool")) {
        eprintln!("the smoke agent's tool call failed: {error}");
        std::process::exit(1);
    }
    let exe = std::env::current_exe().expect("own path");
    let child = std::process::Command::new(exe)
        .env(ROLE, "heartbeat")
        .env(BEAT_FILE, file.with_extension("child"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn();
    if let Err(error) = child {
        eprintln!("the smoke agent could not start its child: {error}");
        std::process::exit(1);
    }
    beat(&file.with_extension("agent"))
}

/// The agent's command as npm installs one: a shim script that runs the
/// program (`tree-agent.cmd` on Windows, found through `PATHEXT` from the
/// extensionless name the settings give; a shell script elsewhere).
fn write_shim(dir: &Path, exe: &Path) -> std::io::Result<PathBuf> {
    let name = dir.join("tree-agent");
    if cfg!(windows) {
        std::fs::write(name.with_extension("cmd"), format!("@\"{}\" %*\r\n", exe.display()))?;
    } else {
        std::fs::write(&name, format!("#!/bin/sh\nexec '{}' \"$@\"\n", exe.display()))?;
        #[cfg(unix)]
        std::fs::set_permissions(&name, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    Ok(name)
}

/// The counter file's contents, as written; `None` before it exists. Not
/// parsed: a beat is a truncate and then a write, and a process killed
/// between the two leaves the file empty for good, which must read as a
/// counter that stopped (it once failed "end() ended the agent's child"
/// when the empty file read as no counter at all, for the whole wait).
fn counter(file: &Path) -> Option<String> {
    std::fs::read_to_string(file).ok()
}

/// Waits until `file`'s counter moves (`moving`) or has stood still for 400 ms.
async fn wait_counter(file: &Path, moving: bool, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        let before = counter(file);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let after = counter(file);
        let moved = after.is_some() && before != after;
        if moved == moving && (moving || after.is_some()) {
            return true;
        }
    }
    false
}

fn check(ok: bool, what: &str) -> Result<(), Failure> {
    if ok {
        println!("  ✓ {what}");
        Ok(())
    } else {
        Err(format!("failed: {what}").into())
    }
}

fn counter_tool(seen: Arc<std::sync::Mutex<Vec<i64>>>) -> ToolSpec<String> {
    ToolSpec::new(
        "update_counter".to_string(),
        "Add `delta` to the counter",
        json!({"type": "object", "properties": {"delta": {"type": "integer"}}, "required": ["delta"]}),
    )
    .with_handler(sync_handler(move |args: serde_json::Value, _| {
        let delta = args["delta"].as_i64().unwrap_or(0);
        let mut seen = seen.lock().unwrap();
        seen.push(delta);
        Ok::<_, String>(json!({ "value": seen.iter().sum::<i64>() }))
    }))
}

/// A scripted turn that calls the frontend tool twice and streams a reply.
async fn tool_turn(pedelec: &Pedelec, how: &str) -> Result<(), Failure> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let options = SessionOptions {
        tools: vec![counter_tool(seen.clone())],
        provider: Some("scripted".into()),
        ..Default::default()
    };
    let session = pedelec.create_session(options).await?;
    let chat = Arc::new(std::sync::Mutex::new(Vec::new()));
    let said = chat.clone();
    let _chat = session.on_chat(move |text, _| said.lock().unwrap().push(text.to_owned()));
    session.send_text("Counting.\n/tool update_counter {\"delta\": 2}\n/tool update_counter {\"delta\": 3}").await?;
    check(*seen.lock().unwrap() == [2, 3], &format!("{how}: the frontend tool answered both calls in order"))?;
    let chat = chat.lock().unwrap().clone();
    check(
        chat.iter().any(|m| m.contains("Counting.")),
        &format!("{how}: the reply arrived as a chat message {chat:?}"),
    )?;
    session.end().await?;
    check(session.get_status() == pedelec_sdk::SessionStatus::Ended, &format!("{how}: end() ended the session"))
}

async fn smoke() -> Result<(), Failure> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config)?;
    let beat_file = dir.path().join("beat");
    let shim = write_shim(dir.path(), &std::env::current_exe()?)?;
    let settings = format!(
        "[providers.tree]\nkind = \"claude\"\ncommand = [{shim:?}]\nenv = {{ {ROLE} = \"agent\", {BEAT_FILE} = {beat:?} }}\n",
        shim = shim.display().to_string(),
        beat = beat_file.display().to_string(),
    );
    std::fs::write(config.join("config.toml"), settings)?;
    // This OS's kind of endpoint, private to this run.
    let endpoint = if cfg!(windows) {
        PathBuf::from(format!(r"\\.\pipe\pedelec-smoke-{}-core", std::process::id()))
    } else {
        dir.path().join("core.sock")
    };
    let core_bin = flag("--core").unwrap_or_else(pedelec_sdk::daemon::find_core_binary);
    let config_arg = config.display().to_string();
    let mut core = CoreProcess::spawn_with_args(
        &core_bin,
        &endpoint,
        &state,
        Duration::from_secs(5),
        &["--config-dir", &config_arg],
    )?;
    println!("▶ Core {} on {}", core_bin.display(), endpoint.display());

    let pedelec = Pedelec::connect(&endpoint, "app:platform-smoke").await?;
    let pong = pedelec.ping().await?;
    check(Some(pong.pid) == core.pid(), &format!("Core answers on its endpoint (pid {})", pong.pid))?;
    tool_turn(&pedelec, "over gRPC").await?;

    let host_bin = flag("--host").unwrap_or_else(pedelec_sdk::native::find_host_binary);
    let endpoint_text = endpoint.display().to_string();
    let envs = [("PEDELEC_CORE_SOCKET", endpoint_text.as_str()), ("PEDELEC_ALLOWED_EXTENSIONS", EXTENSION)];
    let origin = format!("chrome-extension://{EXTENSION}/");
    let transport = NativeMessagingTransport::spawn(&host_bin, &origin, &envs)?;
    let through_host = Pedelec::with_transport(Arc::new(transport), origin);
    check(through_host.ping().await?.pid == pong.pid, "the native host relays framed requests to Core")?;
    tool_turn(&through_host, "through the native host").await?;

    // The agent calls the frontend tool through the bridge, then its whole
    // tree ends with the session.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let options =
        SessionOptions { tools: vec![counter_tool(seen.clone())], provider: Some("tree".into()), ..Default::default() };
    let session = pedelec.create_session(options).await?;
    let running = session.clone();
    let turn = tokio::spawn(async move { running.send_text("start your child").await });
    let (agent_beat, child_beat) = (beat_file.with_extension("agent"), beat_file.with_extension("child"));
    check(wait_counter(&agent_beat, true, Duration::from_secs(20)).await, "the agent runs")?;
    check(wait_counter(&child_beat, true, Duration::from_secs(20)).await, "the agent's child runs")?;
    let answer = std::fs::read_to_string(beat_file.with_extension("tool")).unwrap_or_default();
    check(
        *seen.lock().unwrap() == [7] && answer.contains(r#""value":7"#),
        &format!("the agent's `pedelec-core tool call` reached the frontend tool over the endpoint: {}", answer.trim()),
    )?;
    session.end().await?;
    let settled = tokio::time::timeout(Duration::from_secs(10), turn).await;
    check(matches!(settled, Ok(Ok(Err(_)))), "the running turn settled with an error at end()")?;
    check(wait_counter(&agent_beat, false, Duration::from_secs(10)).await, "end() ended the agent")?;
    check(wait_counter(&child_beat, false, Duration::from_secs(10)).await, "end() ended the agent's child")?;

    register(&host_bin, dir.path())?;
    core.kill();
    println!("platform smoke passed");
    Ok(())
}

/// The host's registration commands, in a profile of `home`'s own.
fn register(host: &Path, home: &Path) -> Result<(), Failure> {
    let profile: &[(&str, &Path)] = if cfg!(windows) {
        &[("LOCALAPPDATA", home), ("USERPROFILE", home)]
    } else {
        &[("HOME", home), ("XDG_CONFIG_HOME", &home.join(".config"))]
    };
    let run = |args: &[&str]| -> Result<String, Failure> {
        let out = std::process::Command::new(host).args(args).envs(profile.iter().copied()).output()?;
        if !out.status.success() {
            return Err(format!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(String::from_utf8(out.stdout)?)
    };
    let host_arg = host.display().to_string();
    let installed = run(&["install", "--extension-id", EXTENSION, "--browser", "chrome", "--host-path", &host_arg])?;
    let manifest = installed.trim().strip_prefix("registered ").map(PathBuf::from).ok_or("no manifest path")?;
    check(
        manifest.starts_with(home),
        &format!("install wrote Chrome's manifest in the profile: {}", manifest.display()),
    )?;
    let text: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest)?)?;
    check(text["path"] == host_arg.as_str(), "the manifest names the host binary")?;
    let status = run(&["status"])?;
    let chrome = status.lines().find(|l| l.starts_with("chrome ")).unwrap_or_default().to_owned();
    // On Windows, status finds the manifest through the registry key.
    check(chrome.contains("registered for") && chrome.contains(&manifest.display().to_string()), "status: registered")?;
    let removed = run(&["uninstall", "--browser", "chrome"])?;
    check(removed.contains("removed") && !manifest.exists(), "uninstall removed the manifest")?;
    let status = run(&["status"])?;
    check(status.lines().any(|l| l.starts_with("chrome ") && l.contains("not registered")), "status: not registered")
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match std::env::var(ROLE).as_deref() {
        Ok("agent") => agent(),
        Ok("heartbeat") => beat(Path::new(&std::env::var_os(BEAT_FILE).expect("the beat file is set"))),
        _ => {}
    }
    match smoke().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("platform smoke: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
