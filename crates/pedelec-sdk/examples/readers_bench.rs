//! `cargo xtask bench`: the figures issue 40 asks for (every reader at its
//! own pace), against a real Core process (release build) on a temporary
//! socket:
//!
//! 1. A 200 000-delta turn alone, then beside 20 raw gRPC subscribers that
//!    subscribe and never read: the ratio to the turn alone (the floor).
//! 2. Core's peak RSS during those turns, and the part the event log takes:
//!    the silent subscribers pin the whole turn in the log, the turn alone
//!    (its one reader keeping up) leaves it next to empty.
//! 3. A stock Python grpcio reader (`interop/python/client.py … read`)
//!    during the same turn: every delta and the completion, no re-sync.

mod common;

use common::{hwm_kib, mib, rss_kib};
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::{Pedelec, PedelecSession, SessionOptions, pb};

const DELTAS: u64 = 200_000;
const SILENT: usize = 20;
const ORIGIN: &str = "app:bench";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("core.sock");
    let state = dir.path().join("state");
    let core = CoreProcess::spawn(&socket, &state, Duration::from_secs(3))?;
    let pid = core.pid().unwrap_or(0);
    let client = Pedelec::connect(&socket, ORIGIN).await?;
    let session = client.create_session::<String>(SessionOptions::default()).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(pid);

    // The floor: the turn alone, its one reader (this SDK) keeping up.
    // VmHWM only grows, so it is read after the turns alone and again after
    // the turns with silent subscribers: each figure is the peak up to then.
    turn(&session).await?; // warm-up
    let mut alone = Vec::new();
    for _ in 0..3 {
        alone.push(turn(&session).await?);
    }
    alone.sort();
    let peak_alone = hwm_kib(pid);
    let sdk_alone = fewest();

    // Fresh silent subscribers for each turn: held across turns they would
    // fall out of the log and measure re-syncs instead.
    let raw = pb::core_client::CoreClient::new(pedelec_sdk::grpc::local_channel(&socket).await?);
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut with_silent = Vec::new();
    for _ in 0..3 {
        let mut silent = Vec::new();
        for _ in 0..SILENT {
            silent.push(raw.clone().subscribe(request.clone()).await?.into_inner());
        }
        with_silent.push(turn(&session).await?);
        drop(silent);
    }
    with_silent.sort();
    let sdk_silent = fewest();
    let peak_silent = hwm_kib(pid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    // A few of Core's quiet ticks (1 s): what stays once it has handed back
    // what the allocator kept, as bench.rs reads idle RSS.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_quiet = rss_kib(pid);
    println!(
        "{DELTAS}-delta turn: alone {} best, {} median of 3 (the floor); with {SILENT} silent subscribers {} best, {} median of 3 = {:.2}× best, {:.2}× median (target ≤ 1.2×); the SDK's reader got at least {sdk_alone} / {DELTAS} deltas alone, {sdk_silent} / {DELTAS} with them",
        ms(alone[0]),
        ms(alone[1]),
        ms(with_silent[0]),
        ms(with_silent[1]),
        with_silent[0].as_secs_f64() / alone[0].as_secs_f64(),
        with_silent[1].as_secs_f64() / alone[1].as_secs_f64(),
    );
    // The log's part: the same turns alone on a Core whose log may keep only
    // 1 MiB per session. The SDK's reader falls behind Core during the turn,
    // so even alone the default log holds much of it at the peak.
    let config = dir.path().join("config-small-log");
    std::fs::create_dir_all(&config)?;
    std::fs::write(config.join("config.toml"), "event_log_session_mib = 1\n")?;
    let small_socket = dir.path().join("small.sock");
    let small_core = CoreProcess::spawn_with_args(
        &pedelec_sdk::daemon::find_core_binary(),
        &small_socket,
        &dir.path().join("state-small"),
        Duration::from_secs(3),
        &["--config-dir", config.to_str().ok_or("a UTF-8 temporary path")?],
    )?;
    let small_pid = small_core.pid().unwrap_or(0);
    let small_client = Pedelec::connect(&small_socket, ORIGIN).await?;
    let small_session = small_client.create_session::<String>(SessionOptions::default()).await?;
    let mut small = Vec::new();
    for _ in 0..4 {
        small.push(turn(&small_session).await?);
    }
    small[1..].sort();
    let sdk_small = fewest();
    let peak_small = hwm_kib(small_pid);
    small_session.end().await?;
    drop(small_core);
    println!(
        "Core RSS during the {DELTAS}-delta turn: peak {} alone, {} with {SILENT} silent subscribers (VmHWM after each set of turns), {} before the turns (VmRSS), {} 500 ms after the silent subscribers left and {} 3.5 s after (VmRSS); the log's part {} (peak alone − peak alone on a Core with event_log_session_mib = 1: {}, its turn {} median of 3, the SDK's reader got at least {sdk_small} / {DELTAS} deltas there)",
        mib(peak_alone),
        mib(peak_silent),
        mib(before),
        mib(after),
        mib(after_quiet),
        mib(peak_alone.saturating_sub(peak_small)),
        mib(peak_small),
        ms(small[2]),
    );

    python_reader(&client, &socket).await?;
    session.end().await?;
    drop(core);
    Ok(())
}

/// One `/deltas 200000` turn, sent to its end (the SDK resolves on the
/// turn's OperationCompleted).
async fn turn(session: &PedelecSession<String>) -> Result<Duration, Box<dyn std::error::Error>> {
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let _count = session.on_chat_delta(move |_, _| {
        c.fetch_add(1, Ordering::Relaxed);
    });
    let started = Instant::now();
    session.send_text(format!("/deltas {DELTAS}")).await?;
    let took = started.elapsed();
    // Deltas come before the completion on the stream: all are counted here.
    FEWEST.fetch_min(count.load(Ordering::SeqCst), Ordering::SeqCst);
    Ok(took)
}

/// The fewest deltas the SDK's own reader received in one turn since the
/// last reset: whether the turn's floor reader kept every delta too.
static FEWEST: AtomicU64 = AtomicU64::new(u64::MAX);

fn fewest() -> u64 {
    FEWEST.swap(u64::MAX, Ordering::SeqCst)
}

/// The interop client's `read` mode subscribes to a fresh session; once it
/// holds its snapshot the turn is sent, and it reads at Python's pace.
async fn python_reader(client: &Pedelec, socket: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join("target/interop-venv/bin/python");
    if !python.exists() {
        println!("python grpcio reader: skipped ({} is missing; cargo xtask ci installs it)", python.display());
        return Ok(());
    }
    let session = client.create_session::<String>(SessionOptions::default()).await?;
    // Bounded as the interop test is: a stuck reader must not hang the bench.
    let mut child = std::process::Command::new("timeout")
        .arg("600")
        .arg(&python)
        .arg(root.join("interop/python/client.py"))
        .arg(socket)
        .args(["read", session.session_id(), ORIGIN])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("the reader's stdout")?;
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let lines = std::sync::Arc::new(std::sync::Mutex::new(lines_rx));
    let next_line = |timeout: Duration| {
        let lines = lines.clone();
        tokio::task::spawn_blocking(move || lines.lock().unwrap().recv_timeout(timeout).ok())
    };
    // Generating the Python modules with protoc comes first (a few seconds).
    match next_line(Duration::from_secs(120)).await? {
        Some(line) if line == "READY" => {}
        other => return Err(format!("the Python reader did not subscribe: {other:?}").into()),
    }
    let started = Instant::now();
    session.send_text(format!("/deltas {DELTAS}")).await?;
    let turn = started.elapsed();
    let line = next_line(Duration::from_secs(600)).await?.ok_or("the Python reader printed no counts")?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    let counts: serde_json::Value = serde_json::from_str(&line)?;
    let deltas = counts["deltas"].as_u64().unwrap_or(0);
    let seconds = counts["seconds"].as_f64().unwrap_or(0.0);
    println!(
        "python grpcio reader during a {DELTAS}-delta turn: {deltas} / {DELTAS} deltas, completion {}, chat message {}, {} re-syncs (target: all, yes, 0); read in {:.1} s = {:.0} deltas/s, {:.1}× the turn's {} at the SDK{}",
        if counts["completed"].as_bool() == Some(true) { "yes" } else { "no" },
        if counts["chat"].as_u64().unwrap_or(0) > 0 { "yes" } else { "no" },
        counts["resyncs"].as_u64().unwrap_or(0),
        seconds,
        deltas as f64 / seconds.max(1e-9),
        seconds / turn.as_secs_f64(),
        ms(turn),
        match counts["error"].as_str() {
            Some(error) => format!(" (stream error: {error}; exit {status})"),
            None => String::new(),
        },
    );
    session.end().await?;
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
