//! Provider figures: the tool-call round trip through the MCP bridge
//! (agent → `pedelec-core mcp` → Core → SDK handler → back), and each
//! adapter parser's throughput on a large recorded transcript.

use std::process::Stdio;
use std::time::{Duration, Instant};

use pedelec_core::providers::claude::ClaudeParser;
use pedelec_core::providers::cli_turn::{LineParser, parse_transcript};
use pedelec_core::providers::codex::CodexParser;
use pedelec_core::providers::codex::wire::TranscriptParser;
use pedelec_sdk::daemon::{CoreProcess, find_core_binary};
use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[path = "../../pedelec-sdk/examples/common/mod.rs"]
mod common;

fn percentile(sorted: &[Duration], p: f64) -> u128 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_micros()
}

fn transcript(name: &str) -> String {
    let path = format!("{}/../pedelec-core/tests/transcripts/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("recorded transcript")
}

fn lines_per_second(name: &str, text: &str, mut parser: impl FnMut() -> Box<dyn LineParser>) {
    let big: String = text.repeat(20_000 / text.lines().count().max(1) + 1);
    let lines = big.lines().count();
    let mut p = parser();
    let started = Instant::now();
    let events = parse_transcript(p.as_mut(), &big).len();
    let elapsed = started.elapsed();
    println!(
        "{name} parser: {lines} lines ({:.1} MB) → {events} events in {:.1} ms = {:.0} lines/s ({:.0} MB/s)",
        big.len() as f64 / 1e6,
        elapsed.as_secs_f64() * 1e3,
        lines as f64 / elapsed.as_secs_f64(),
        big.len() as f64 / 1e6 / elapsed.as_secs_f64()
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("core.sock");
    let state = dir.path().join("state");
    // The bench plays the agent: Core stores only the token's digest, so it
    // has Core write the token it mints to a file outside the state dir.
    let witness = dir.path().join("tool-tokens");
    let witness_arg = witness.display().to_string();
    let _core = CoreProcess::spawn_with_args(
        &find_core_binary(),
        &socket,
        &state,
        Duration::from_secs(3),
        &["--tool-token-witness", &witness_arg],
    )?;
    let client = Pedelec::connect(&socket, "app:bench").await?;
    let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
    let session = client.create_session(SessionOptions { tools: vec![tool], ..Default::default() }).await?;
    let _h = session.on_tool_sync("t".to_string(), |args: Value, _| Ok::<_, String>(args));
    let token = std::fs::read_to_string(&witness)?
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{} ", session.session_id())).map(str::to_owned))
        .expect("Core minted the session's token");

    let mut bridge = tokio::process::Command::new(find_core_binary())
        .arg("mcp")
        .env("PEDELEC_TOOL_TOKEN", &token)
        .env("PEDELEC_CORE_SOCKET", &socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = bridge.stdin.take().unwrap();
    let mut lines = BufReader::new(bridge.stdout.take().unwrap()).lines();
    let mut send = async |message: Value| {
        stdin.write_all(format!("{message}\n").as_bytes()).await.unwrap();
    };
    send(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}})).await;
    lines.next_line().await?;
    send(json!({"jsonrpc":"2.0","method":"notifications/initialized"})).await;

    // The in-process floor on the same Core, before and after the bridge's
    // calls: the scripted provider calling the same tool inside Core.
    let floor_before = common::scripted_tool_floor_us(&session).await?;
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/sleep 600000").await });
    while session.get_status() != pedelec_sdk::SessionStatus::Running {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut timings = Vec::new();
    for id in 1..=2200u64 {
        let started = Instant::now();
        send(json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"t","arguments":{"n":id}}})).await;
        let reply: Value = serde_json::from_str(&lines.next_line().await?.expect("a reply"))?;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        if id > 200 {
            timings.push(started.elapsed());
        }
    }
    timings.sort();
    shell_round_trip(&token, &socket, 300).await?;
    session.cancel().await?;
    let _ = turn.await;
    let floor = (floor_before + common::scripted_tool_floor_us(&session).await?) / 2.0;
    // The issue's ≤ 150 µs was set beside an in-process figure of 92 µs on
    // its machine: 1.63× that floor.
    println!(
        "MCP bridge tool-call round trip (2000 calls, agent → pedelec-core mcp → Core → SDK handler → agent): p50={}us p99={}us = {:.2}× the in-process floor of {floor:.0} µs in this run (target ≤ 150 µs, 1.63× the floor it was set beside)",
        percentile(&timings, 0.5),
        percentile(&timings, 0.99),
        percentile(&timings, 0.5) as f64 / floor,
    );
    session.end().await?;

    lines_per_second("codex", &transcript("codex_tool_turn.jsonl"), || Box::new(CodexParser::default()));
    lines_per_second("codex app-server", &transcript("codex_app_server_turns.jsonl"), || {
        Box::new(TranscriptParser::default())
    });
    lines_per_second("claude", &transcript("claude_tool_turn.jsonl"), || Box::new(ClaudeParser::new(0)));
    let sse = transcript("openai_tool_round.sse").repeat(3000);
    let started = Instant::now();
    let (events, _) = pedelec_core::providers::openai::replay(sse.as_bytes());
    let elapsed = started.elapsed();
    let chunks = sse.matches("data:").count();
    println!(
        "openai SSE parser: {chunks} chunks ({:.1} MB) → {} events in {:.1} ms = {:.0} chunks/s",
        sse.len() as f64 / 1e6,
        events.len(),
        elapsed.as_secs_f64() * 1e3,
        chunks as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// Spawn → exit of `program args…`, `n` times; sorted.
async fn spawn_times(
    program: &std::path::Path,
    args: &[&str],
    envs: &[(&str, &std::ffi::OsStr)],
    n: usize,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let out = tokio::process::Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await?;
        times.push(started.elapsed());
        assert!(out.status.success(), "{} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    }
    times.sort();
    Ok(times)
}

/// The shell tool path (an agent that runs a tool client per call, as
/// codex's and claude's shell tools do), beside its floor in the same run:
/// spawning `/bin/true`. Measured with the small `pedelec-tool` client (the
/// path to use) and with `pedelec-core tool call` (the same code in Core's
/// binary, which costs the spawn of a 17 MB executable: also printed).
async fn shell_round_trip(token: &str, socket: &std::path::Path, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let core = find_core_binary();
    let tool = pedelec_sdk::daemon::find_binary("pedelec-tool", "PEDELEC_TOOL_BIN");
    let envs = [("PEDELEC_TOOL_TOKEN", std::ffi::OsStr::new(token)), ("PEDELEC_CORE_SOCKET", socket.as_os_str())];
    let mut small = Vec::new();
    let mut big = Vec::new();
    let mut truth = Vec::new();
    // Interleaved in rounds, so a slow stretch of the machine falls on all three alike.
    for _ in 0..10 {
        small.extend(spawn_times(&tool, &["call", "t", r#"{"n": 1}"#], &envs, n / 10).await?);
        big.extend(spawn_times(&core, &["tool", "call", "t", r#"{"n": 1}"#], &envs, n / 10).await?);
        truth.extend(spawn_times(std::path::Path::new("/bin/true"), &[], &[], n / 10).await?);
    }
    for times in [&mut small, &mut big, &mut truth] {
        times.sort();
    }
    let p50 = |t: &[Duration]| percentile(t, 0.5);
    println!(
        "shell tool path ({n} calls, agent spawns `pedelec-tool call` → Core → SDK handler → exit): p50={}us p99={}us; floor /bin/true p50={}us ({:.2}× the floor; target ≤ 1000us, 1.43× the 700 µs /bin/true it was set beside)",
        p50(&small),
        percentile(&small, 0.99),
        p50(&truth),
        p50(&small) as f64 / p50(&truth) as f64,
    );
    println!(
        "  the same through `pedelec-core tool call` (Core's 17 MB binary): p50={}us ({:.2}× the floor)",
        p50(&big),
        p50(&big) as f64 / p50(&truth) as f64,
    );
    Ok(())
}
