//! `cargo xtask bench`: the figures issue 3 asks for, against a real Core
//! process (release build) on a temporary socket.

mod common;

use common::{hwm_kib, mib, rss_anon_kib, rss_kib};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
use serde_json::json;

/// How long Core is left alone before its idle RSS is read: a few of its
/// quiet ticks (`platform::memory::QUIET_TICK`, 1 s).
const IDLE: Duration = Duration::from_secs(3);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("core.sock");
    let state = dir.path().join("state");
    let core = CoreProcess::spawn(&socket, &state, Duration::from_secs(3))?;
    let pid = core.pid().unwrap_or(0);
    let client = Pedelec::connect(&socket, "app:bench").await?;
    if std::env::var("PEDELEC_BENCH_ONLY").as_deref() == Ok("assets") {
        return assets(&client, pid, dir.path()).await;
    }

    // 1. Tool-call round trip, measured at the agent (the scripted provider
    //    times each call from asking to receiving the result).
    let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
    let session = client.create_session(SessionOptions { tools: vec![tool], ..Default::default() }).await?;
    let _h = session.on_tool_sync("t".to_string(), |args: serde_json::Value, _| Ok::<_, String>(args));
    let reply = Arc::new(std::sync::Mutex::new(String::new()));
    let r = reply.clone();
    let _c = session.on_chat(move |text, _| *r.lock().unwrap() = text.to_string());
    session.send_text("/tools 200 t {\"n\": 1}").await?; // warm-up
    session.send_text("/tools 2000 t {\"n\": 1}").await?;
    println!("tool-call round trip (2000 calls, agent → SDK handler → agent): {}", reply.lock().unwrap());
    // `PEDELEC_BENCH_ONLY=tools`: this figure alone, five times (to profile it).
    if std::env::var("PEDELEC_BENCH_ONLY").as_deref() == Ok("tools") {
        for _ in 0..5 {
            session.send_text("/tools 2000 t {\"n\": 1}").await?;
            println!("tool-call round trip (2000 calls, agent → SDK handler → agent): {}", reply.lock().unwrap());
        }
        return Ok(());
    }

    // 2. Chat-delta throughput of one long turn.
    let deltas = Arc::new(AtomicU64::new(0));
    let d = deltas.clone();
    let _d = session.on_chat_delta(move |_, _| {
        d.fetch_add(1, Ordering::Relaxed);
    });
    session.send_text("/deltas 10000").await?; // warm-up
    deltas.store(0, Ordering::SeqCst);
    let started = Instant::now();
    session.send_text("/deltas 100000").await?;
    let elapsed = started.elapsed();
    let n = deltas.load(Ordering::SeqCst);
    let scripted_rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "chat deltas (in-process scripted provider, the floor): {n} delivered to the SDK in {:.1} ms = {:.0} deltas/s",
        elapsed.as_secs_f64() * 1e3,
        n as f64 / elapsed.as_secs_f64()
    );

    // `PEDELEC_BENCH_ONLY=providers`: the floor above, then the provider processes only.
    if std::env::var("PEDELEC_BENCH_ONLY").as_deref() == Ok("providers") {
        return provider_deltas(dir.path(), scripted_rate).await;
    }

    // 2b. Cancel → idle: a turn streaming slowly is cancelled midway; the
    //     time from calling cancel() until it resolves (the SDK has seen the
    //     operation settle, status idle).
    let mut cancels = Vec::new();
    for round in 0..101 {
        deltas.store(0, Ordering::SeqCst);
        let running = session.clone();
        let text = format!("/slow 5\n/deltas 1\n{}", "word ".repeat(40));
        let turn = tokio::spawn(async move { running.send_text(text).await });
        while deltas.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let started = Instant::now();
        session.cancel().await?;
        let took = started.elapsed();
        assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle);
        let outcome = turn.await?;
        assert!(outcome.is_err_and(|e| e.code == "OPERATION_CANCELLED"), "round {round}");
        if round > 0 {
            cancels.push(took);
        }
    }
    cancels.sort();
    println!(
        "cancel → idle (scripted, {} cancels mid-stream): p50 {:.2} ms, p99 {:.2} ms",
        cancels.len(),
        cancels[cancels.len() / 2].as_secs_f64() * 1e3,
        cancels[cancels.len() * 99 / 100].as_secs_f64() * 1e3
    );
    session.end().await?;
    let after_burst = rss_kib(pid);
    drop(core);

    // 3. RSS idle and with 1000 idle sessions, on a fresh Core.
    let state = dir.path().join("state-rss");
    let mut core = CoreProcess::spawn(&socket, &state, Duration::from_secs(3))?;
    let pid = core.pid().unwrap_or(0);
    let client = Pedelec::connect(&socket, "app:bench").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started_rss = rss_kib(pid);
    // Idle is what a user sees of a Core nobody is using: a few quiet ticks
    // in, after it handed back what start-up left mapped (`platform::memory`).
    tokio::time::sleep(IDLE).await;
    let idle_rss = rss_kib(pid);
    let mut ids = Vec::new();
    let started = Instant::now();
    for _ in 0..1000 {
        let s = client
            .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
            .await?;
        ids.push(s.session_id().to_string());
    }
    let create_ms = started.elapsed().as_secs_f64() * 1e3;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy_rss = rss_kib(pid);
    tokio::time::sleep(IDLE).await;
    let loaded_rss = rss_kib(pid);
    // What the trim costs: a new session and a turn of 20 tool calls, on the
    // Core that just handed its code back, then the same again, warm
    // (`PEDELEC_CORE_TRIM_AFTER_QUIET_MS=0` runs it on a Core that keeps it).
    let mut first_turns = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
        let s = client.create_session(SessionOptions { tools: vec![tool], ..Default::default() }).await?;
        let _h = s.on_tool_sync("t".to_string(), |args: serde_json::Value, _| Ok::<_, String>(args));
        s.send_text("/tools 20 t {\"n\": 1}").await?;
        first_turns.push(started.elapsed().as_secs_f64() * 1e3);
        s.end().await?;
    }
    println!(
        "after 3 s of quiet (and the quiet trim): a new session and a 20-call tool turn {:.2} ms, the same again warm {:.2} ms",
        first_turns[0], first_turns[1]
    );
    println!(
        "Core RSS: idle {} (300 ms after start {}; target ≤ 6 MiB), with 1000 idle sessions {} (300 ms after creating them {}, in {create_ms:.0} ms; target ≤ 9 MiB); after the 100k-delta burst {}",
        mib(idle_rss),
        mib(started_rss),
        mib(loaded_rss),
        mib(busy_rss),
        mib(after_burst)
    );

    // 5. Assets: 100 MiB upload and download over loopback, vs cp.
    assets(&client, pid, dir.path()).await?;

    // 3b. Ended sessions cost no memory and no start-up time: RSS after
    //     creating and ending 10 000 sessions against idle, and a restart
    //     with 20 000 ended ones stored against one with none.
    ended_sessions(dir.path()).await?;

    // 4. Restart with 1000 stored sessions: spawn → first resume_session answered.
    core.kill();
    let started = Instant::now();
    let _core = CoreProcess::spawn(&socket, &state, Duration::from_secs(30))?;
    let client = Pedelec::connect(&socket, "app:bench").await?;
    let resumed = client.resume_session::<String>(&ids[999]).await?;
    let restart = started.elapsed();
    println!(
        "restart after kill -9 with 1000 stored sessions → resume_session answered: {:.1} ms (status {})",
        restart.as_secs_f64() * 1e3,
        resumed.get_status()
    );
    drop(_core);

    // 6. The same round trip from an ACP agent: pedelec-fake-acp → `pedelec-core mcp`
    //    → Core → SDK handler → back, timed inside the agent.
    acp_round_trip(dir.path()).await?;
    provider_deltas(dir.path(), scripted_rate).await?;
    Ok(())
}

async fn ended_sessions(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use futures::StreamExt;
    const ENDED: usize = 10_000;
    let socket = dir.join("ended.sock");
    let state = dir.join("state-ended");
    let mut core = CoreProcess::spawn(&socket, &state, Duration::from_secs(3))?;
    let pid = core.pid().unwrap_or(0);
    let client = Pedelec::connect(&socket, "app:bench").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cold = rss_kib(pid);
    // Create and end `n` sessions, `in_flight` at a time; then wait past one
    // eviction sweep (for any session something still held at its end).
    let churn = |n: usize, in_flight: usize| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            let results: Vec<Result<(), pedelec_sdk::PedelecError>> = futures::stream::iter(0..n)
                .map(|_| {
                    let client = client.clone();
                    async move {
                        let options = SessionOptions { auto_end_on_disconnect: false, ..Default::default() };
                        client.create_session::<String>(options).await?.end().await
                    }
                })
                .buffer_unordered(in_flight)
                .collect()
                .await;
            let took = started.elapsed();
            tokio::time::sleep(Duration::from_secs(6)).await;
            (took, results.iter().filter(|r| r.is_err()).count())
        }
    };
    // The baseline is idle Core after a warm-up of 100 sessions: the first
    // use of each code path brings the binary's pages in once, whatever the
    // count; the target is about what ended sessions keep.
    churn(100, 1).await;
    let (idle, idle_anon) = (rss_kib(pid), rss_anon_kib(pid));
    // One after another, as an application does; then as many again with
    // 32 at once.
    let (took, failed) = churn(ENDED, 1).await;
    let (after, after_anon) = (rss_kib(pid), rss_anon_kib(pid));
    let (took2, failed2) = churn(ENDED, 32).await;
    let (after2, after2_anon) = (rss_kib(pid), rss_anon_kib(pid));
    println!(
        "ended sessions: Core RSS idle {} (cold {}), after creating and ending {ENDED} one by one {} (+{}, anonymous +{}; target ≤ +2 MiB; {:.1} s, {failed} failed), after {ENDED} more 32 at once {} (+{}, anonymous +{}; {:.1} s, {failed2} failed)",
        mib(idle),
        mib(cold),
        mib(after),
        mib(after.saturating_sub(idle)),
        mib(after_anon.saturating_sub(idle_anon)),
        took.as_secs_f64(),
        mib(after2),
        mib(after2.saturating_sub(idle)),
        mib(after2_anon.saturating_sub(idle_anon)),
        took2.as_secs_f64()
    );
    drop(client);

    // Spawn → first call answered, with 10 000 ended sessions stored and with none.
    let restart = |state: &std::path::Path| -> Result<Duration, Box<dyn std::error::Error>> {
        let started = Instant::now();
        let core = CoreProcess::spawn(&socket, state, Duration::from_secs(3))?;
        let took = started.elapsed();
        drop(core);
        Ok(took)
    };
    core.kill();
    let empty = dir.join("state-empty");
    let mut with_ended = Vec::new();
    let mut with_none = Vec::new();
    for _ in 0..5 {
        with_ended.push(restart(&state)?);
        with_none.push(restart(&empty)?);
    }
    with_ended.sort();
    with_none.sort();
    println!(
        "restart after kill -9 → serving (median of 5): with {} ended sessions stored {:.1} ms, with none {:.1} ms ({:.2}×)",
        2 * ENDED,
        with_ended[2].as_secs_f64() * 1e3,
        with_none[2].as_secs_f64() * 1e3,
        with_ended[2].as_secs_f64() / with_none[2].as_secs_f64()
    );
    Ok(())
}

/// A Core of its own under `dir` (socket, state and config dir named after
/// `name`) whose `config.toml` is `settings`, and a client of it.
async fn core_with_settings(
    dir: &std::path::Path,
    name: &str,
    settings: &str,
) -> Result<(CoreProcess, Pedelec), Box<dyn std::error::Error>> {
    let config = dir.join(format!("{name}-config"));
    std::fs::create_dir_all(&config)?;
    std::fs::write(config.join("config.toml"), settings)?;
    let socket = dir.join(format!("{name}.sock"));
    let config_arg = config.display().to_string();
    let core = CoreProcess::spawn_with_args(
        &pedelec_sdk::daemon::find_core_binary(),
        &socket,
        &dir.join(format!("state-{name}")),
        Duration::from_secs(3),
        &["--config-dir", &config_arg],
    )?;
    let client = Pedelec::connect(&socket, "app:bench").await?;
    Ok((core, client))
}

async fn acp_round_trip(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let agent = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    if !agent.is_file() {
        println!("ACP tool-call round trip: skipped (build pedelec-test-agents first)");
        return Ok(());
    }
    let settings = format!("[providers.fake]\nkind = \"acp\"\ncommand = [\"{}\"]\n", agent.display());
    let (_core, client) = core_with_settings(dir, "acp", &settings).await?;
    let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
    let session = client
        .create_session(SessionOptions { provider: Some("fake".into()), tools: vec![tool], ..Default::default() })
        .await?;
    let _h = session.on_tool_sync("t".to_string(), |args: serde_json::Value, _| Ok::<_, String>(args));
    let reply = Arc::new(std::sync::Mutex::new(String::new()));
    let r = reply.clone();
    let _c = session.on_chat(move |text, _| *r.lock().unwrap() = text.to_string());
    // The floor on the same Core, just before and after: the scripted
    // provider calling the same tool inside Core.
    let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
    let scripted = client.create_session(SessionOptions { tools: vec![tool], ..Default::default() }).await?;
    let _s = scripted.on_tool_sync("t".to_string(), |args: serde_json::Value, _| Ok::<_, String>(args));
    session.send_text("tools 200 t {\"n\": 1}").await?; // warm-up (starts the agent and the bridge)
    let before = common::scripted_tool_floor_us(&scripted).await?;
    session.send_text("tools 2000 t {\"n\": 1}").await?;
    let after = common::scripted_tool_floor_us(&scripted).await?;
    let text = reply.lock().unwrap().clone();
    let p50 = common::reported_p50_us(&text).unwrap_or(f64::NAN);
    let floor = (before + after) / 2.0;
    // The target, ≤ 170 µs (the bridge's 150 + 20), was set beside an
    // in-process figure of 92 µs on its machine: 1.85× that floor.
    println!(
        "ACP tool-call round trip (2000 calls, ACP agent → MCP bridge → SDK handler → agent): {text} = {:.2}× the in-process floor of {floor:.0} µs in this run (target ≤ 170 µs, 1.85× the floor it was set beside)",
        p50 / floor
    );
    session.end().await?;
    scripted.end().await?;
    Ok(())
}

/// 100 MiB uploads and downloads against `cp` (and `cp` + fsync, since an
/// upload is durable before it is listed) of the same file, measured in the
/// same run: from and to a file, which a local client hands over (the
/// ticket's hand-off socket), into memory, and streamed over the loopback
/// url as a reader or a browser sends it. `PEDELEC_BENCH_ONLY=assets` runs
/// only this.
async fn assets(client: &Pedelec, pid: u32, dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let session = client.create_session::<String>(SessionOptions::default()).await?;
    let src = dir.join("big.bin");
    let data: Vec<u8> = (0..100u32 * 1024 * 1024).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    std::fs::write(&src, &data)?;
    drop(data);
    let mb = 100.0 * 1024.0 * 1024.0 / 1e6;
    // Five of each, interleaved with their floors: writeback and the page
    // cache carry over from one transfer to the next, so one run alone lands
    // on whatever the previous left behind.
    const RUNS: usize = 5;
    let (mut cps, mut cp_syncs, mut ups, mut streamed_ups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut to_files, mut reads) = (Vec::new(), Vec::new());
    let before = rss_kib(pid);
    let (mut after_up, mut after_down) = (0, 0);
    for run in 0..RUNS {
        let t = Instant::now();
        let status = std::process::Command::new("cp").arg(&src).arg(dir.join("copy.bin")).status()?;
        cps.push(t.elapsed().as_secs_f64());
        assert!(status.success());
        // Uploads fsync before the rename, so also time a copy that does.
        let copy = dir.join(format!("copy-sync-{run}.bin"));
        let t = Instant::now();
        std::fs::copy(&src, &copy)?;
        std::fs::File::open(&copy)?.sync_all()?;
        cp_syncs.push(t.elapsed().as_secs_f64());
        std::fs::remove_file(&copy)?;
        // A file: handed over to Core, which copies it.
        let t = Instant::now();
        session.upload_asset(pedelec_sdk::assets::UploadSource::from_path(&src).await?, Some("/big.bin")).await?;
        ups.push(t.elapsed().as_secs_f64());
        after_up = after_up.max(hwm_kib(pid));
        // The same bytes as a reader: streamed over the loopback url.
        let file = tokio::fs::File::open(&src).await?;
        let reader =
            pedelec_sdk::assets::UploadSource::from_reader("big.bin", "application/octet-stream", 100 << 20, file);
        let t = Instant::now();
        session.upload_asset(reader, Some("/streamed.bin")).await?;
        streamed_ups.push(t.elapsed().as_secs_f64());
        after_up = after_up.max(hwm_kib(pid));
        // Into a file, as `cp` writes one.
        let dest = dir.join("downloaded.bin");
        let t = Instant::now();
        let size = session.download_asset_to("/big.bin", &dest).await?;
        to_files.push(t.elapsed().as_secs_f64());
        assert_eq!(size, 100 * 1024 * 1024);
        std::fs::remove_file(&dest)?;
        after_down = after_down.max(hwm_kib(pid));
        // Into memory.
        let t = Instant::now();
        let file = session.read_asset_file("/big.bin").await?;
        reads.push(t.elapsed().as_secs_f64());
        assert_eq!(file.bytes.len(), 100 * 1024 * 1024);
        drop(file);
        after_down = after_down.max(hwm_kib(pid));
    }
    // Throughputs, each run beside the floor measured just before it.
    let rate = |t: &f64| mb / t;
    let ratios = |xs: &[f64], floors: &[f64]| -> Vec<f64> { xs.iter().zip(floors).map(|(x, f)| f / x).collect() };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(",");
    let figure = |what: &str, times: &[f64], floors: &[f64], floor: &str, target: &str| {
        let r = ratios(times, floors);
        println!(
            "  {what}: median {:.0} MB/s, ÷ {floor} median {:.2}× min {:.2}× [{}]{target}",
            median(times.iter().map(rate).collect()),
            median(r.clone()),
            min(&r),
            list(&r)
        );
    };
    println!(
        "assets 100 MiB, {RUNS} runs each beside its floor (cp median {:.0} MB/s, cp+fsync median {:.0} MB/s):",
        median(cps.iter().map(rate).collect()),
        median(cp_syncs.iter().map(rate).collect())
    );
    figure("upload of a file (handed over)", &ups, &cp_syncs, "cp+fsync", " (target ≥ 1.0×)");
    figure("upload of a reader (streamed over the url)", &streamed_ups, &cp_syncs, "cp+fsync", "");
    figure("download to a file (handed over)", &to_files, &cps, "cp", " (target ≥ 0.8× in every run)");
    figure("download into memory (handed over)", &reads, &cps, "cp", "");
    println!(
        "  Core peak RSS growth: upload {}, download {}",
        mib(after_up.saturating_sub(before)),
        mib(after_down.saturating_sub(before))
    );
    session.end().await?;
    Ok(())
}

/// 6b. Chat deltas of one 100 000-delta turn through a provider process, in
/// each wire format Core reads, beside the in-process scripted provider
/// (`floor`, measured above in this run). The processes print the real
/// formats: `pedelec-fake-stream` claude stream-json and codex exec --json
/// (codex streams no text deltas there: its 100 000 `agent_message` items
/// are whole messages, counted as chat messages), `pedelec-fake-acp` ACP
/// `agent_message_chunk`s, and the model server OpenAI chat-completions SSE
/// over loopback HTTP (on a thread and runtime of its own, so it does not
/// share this one's). Each turn includes starting its process.
async fn provider_deltas(dir: &std::path::Path, floor: f64) -> Result<(), Box<dyn std::error::Error>> {
    use pedelec_test_agents::model_server::{Answer, ModelReply, ModelRequest, ModelServer, Script};
    const N: usize = 100_000;
    let stream = pedelec_sdk::daemon::find_binary("pedelec-fake-stream", "PEDELEC_FAKE_STREAM_BIN");
    let acp = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    if !stream.is_file() || !acp.is_file() {
        println!("deltas through a provider process: skipped (build pedelec-test-agents first)");
        return Ok(());
    }
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let script: Script =
                Arc::new(|_: &ModelRequest| Answer::new(ModelReply::Text { text: "w ".repeat(N), chunks: N }));
            let model = ModelServer::start(script).await.expect("the model server starts");
            let _ = addr_tx.send(model.addr);
            std::future::pending::<()>().await
        })
    });
    let addr = addr_rx.recv()?;
    let count = format!("env = {{ PEDELEC_FAKE_STREAM_DELTAS = \"{N}\" }}\n");
    let (stream, acp) = (stream.display().to_string(), acp.display().to_string());
    let settings = format!(
        "[providers.claude]\ncommand = [{stream:?}, \"claude\"]\n{count}\
         [providers.codex]\ncommand = [{stream:?}, \"codex\"]\n{count}\
         [providers.fake]\nkind = \"acp\"\ncommand = [{acp:?}]\n\
         [providers.ollama]\nbase_url = \"http://{addr}/v1\"\nmodel = \"bench\"\napi_key_env = \"PATH\"\n"
    );
    let (_core, client) = core_with_settings(dir, "stream", &settings).await?;
    let acp_prompt = format!("deltas {N}");
    for (provider, prompt, format) in [
        ("claude", "go", "claude stream-json"),
        ("codex", "go", "codex exec --json: agent_message items, each a chat message"),
        ("fake", acp_prompt.as_str(), "ACP agent_message_chunk"),
        ("ollama", "go", "OpenAI chat-completions SSE over loopback HTTP"),
    ] {
        // `PEDELEC_BENCH_PROVIDER=ollama` runs one format alone (to profile it).
        if std::env::var("PEDELEC_BENCH_PROVIDER").is_ok_and(|only| only != provider) {
            continue;
        }
        let session = client
            .create_session::<String>(SessionOptions { provider: Some(provider.into()), ..Default::default() })
            .await?;
        let seen = Arc::new(AtomicU64::new(0));
        let (d, c) = (seen.clone(), seen.clone());
        let _d = session.on_chat_delta(move |_, _| {
            d.fetch_add(1, Ordering::Relaxed);
        });
        let _c = (provider == "codex").then(|| {
            session.on_chat(move |_, _| {
                c.fetch_add(1, Ordering::Relaxed);
            })
        });
        // One warm-up turn, as the floor has, then the median of three
        // (`PEDELEC_BENCH_REPEAT=N`: of N, so a profile of the run is
        // mostly the turn). Each claude and codex turn is a new process.
        let repeat = std::env::var("PEDELEC_BENCH_REPEAT").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
        let mut rates = Vec::new();
        let mut n = 0;
        for round in 0..=repeat {
            seen.store(0, Ordering::SeqCst);
            let started = Instant::now();
            session.send_text(prompt).await?;
            let elapsed = started.elapsed();
            n = seen.load(Ordering::SeqCst);
            if round > 0 {
                rates.push(n as f64 / elapsed.as_secs_f64());
            }
        }
        let listed = rates.iter().map(|r| format!("{:.0}k", r / 1e3)).collect::<Vec<_>>().join(", ");
        rates.sort_by(f64::total_cmp);
        let rate = rates[rates.len() / 2];
        println!(
            "deltas through a provider process ({format}): {n} per turn, median of {repeat} after a warm-up {rate:.0}/s [{listed}] ({:.2}× the in-process floor of {floor:.0}/s; target ≥ 500000/s)",
            rate / floor,
        );
        session.end().await?;
    }
    Ok(())
}
