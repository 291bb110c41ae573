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
    let peak_silent = hwm_kib(pid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    println!(
        "{DELTAS}-delta turn: alone {} best, {} median of 3 (the floor); with {SILENT} silent subscribers {} best, {} median of 3 = {:.2}× best, {:.2}× median (target ≤ 1.2×)",
        ms(alone[0]),
        ms(alone[1]),
        ms(with_silent[0]),
        ms(with_silent[1]),
        with_silent[0].as_secs_f64() / alone[0].as_secs_f64(),
        with_silent[1].as_secs_f64() / alone[1].as_secs_f64(),
    );
    println!(
        "Core RSS during the {DELTAS}-delta turn: peak {} with {SILENT} silent subscribers (VmHWM), {} alone (VmHWM after the turns alone), {} before the turns (VmRSS); the log's part {} (peak with silent subscribers − peak alone: they hold the whole turn in the log); {} 500 ms after the silent subscribers left (VmRSS)",
        mib(peak_silent),
        mib(peak_alone),
        mib(before),
        mib(peak_silent.saturating_sub(peak_alone)),
        mib(after),
    );

    python_reader(&client, &socket).await?;
    session.end().await?;
    drop(core);
    Ok(())
}

/// One `/deltas 200000` turn, sent to its end (the SDK resolves on the
/// turn's OperationCompleted).
async fn turn(session: &PedelecSession<String>) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    session.send_text(format!("/deltas {DELTAS}")).await?;
    Ok(started.elapsed())
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
