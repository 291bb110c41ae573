//! `cargo xtask bench`: Core under load and under silent subscribers, the
//! figures of issue 13, against a real Core process (release build).
//!
//! 1. Load: 1 000 concurrent sessions over one connection of the Rust SDK,
//!    each running 5 turns that each make one frontend tool call; Core RSS
//!    peak and after. Two ways: closed loop (every session sends its next
//!    turn as soon as the last settles: the most turns/s, and by Little's
//!    law a latency of sessions ÷ throughput), then paced (the sessions'
//!    turns start at an aggregate 3 000 turns/s: p50/p99 turn latency,
//!    send → settled, at the target rate).
//! 2. Silent subscribers: a 50 000-delta turn with none, then with 20 raw
//!    gRPC subscriptions that never read; the turn time as a ratio of the
//!    time with none plus one lag grace.

mod common;

use common::{mib, status_kib};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pedelec_protocol::pb;
use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
use serde_json::json;

const SESSIONS: usize = 1000;
const TURNS: usize = 5;
const SILENT: usize = 20;
const DELTAS: u32 = 50_000;
/// The paced phase's aggregate rate of turn starts (issue 13's target).
const PACED_RATE: f64 = 3000.0;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("core.sock");
    let core = CoreProcess::spawn(&socket, &dir.path().join("state"), Duration::from_secs(3))?;
    let pid = core.pid().unwrap_or(0);
    let client = Pedelec::connect(&socket, "app:load-bench").await?;
    load(&client, pid).await?;
    silent_subscribers(&client, &socket).await?;
    Ok(())
}

async fn load(client: &Pedelec, pid: u32) -> Result<(), Box<dyn std::error::Error>> {
    let before = status_kib(pid, "VmRSS:");
    let created = Instant::now();
    let mut sessions = Vec::with_capacity(SESSIONS);
    let mut creating = tokio::task::JoinSet::new();
    for _ in 0..SESSIONS {
        let client = client.clone();
        creating.spawn(async move {
            let tool = ToolSpec::new("t".to_string(), "echo", json!({"type": "object"}));
            let options = SessionOptions { tools: vec![tool], auto_end_on_disconnect: false, ..Default::default() };
            client.create_session(options).await
        });
    }
    while let Some(session) = creating.join_next().await {
        sessions.push(session??);
    }
    let create_time = created.elapsed();

    let sessions: Vec<Arc<pedelec_sdk::PedelecSession<String>>> = sessions.into_iter().map(Arc::new).collect();
    let handlers: Vec<_> = sessions
        .iter()
        .map(|s| s.on_tool_sync("t".to_string(), |args: serde_json::Value, _| Ok::<_, String>(args)))
        .collect();

    // Closed loop.
    let (elapsed, mut closed) = run_turns(&sessions, None).await?;
    closed.sort();
    let closed_rate = closed.len() as f64 / elapsed.as_secs_f64();
    // Paced at the target rate: session i starts its turns at i/RATE, then every SESSIONS/RATE.
    let (paced_elapsed, mut latencies) = run_turns(&sessions, Some(PACED_RATE)).await?;
    let paced_rate = latencies.len() as f64 / paced_elapsed.as_secs_f64();
    drop(handlers);
    for session in &sessions {
        session.end().await?;
    }
    latencies.sort();
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "load: {SESSIONS} sessions × {TURNS} tool turns over one SDK connection: closed loop {closed_rate:.0} tool-turns/s (p50 {} p99 {}); paced at {PACED_RATE:.0}/s: achieved {paced_rate:.0}/s, turn latency p50 {} p99 {}; sessions created in {}; Core RSS before {}, peak {}, after {}",
        ms(percentile(&closed, 0.5)),
        ms(percentile(&closed, 0.99)),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(create_time),
        mib(before),
        mib(status_kib(pid, "VmHWM:")),
        mib(status_kib(pid, "VmRSS:")),
    );
    Ok(())
}

/// Runs TURNS tool turns on every session at once; each turn's latency is
/// send → settled. With `rate`, turn starts are paced to that many per
/// second in aggregate (a session whose turn is late sends the next at once).
async fn run_turns(
    sessions: &[Arc<pedelec_sdk::PedelecSession<String>>],
    rate: Option<f64>,
) -> Result<(Duration, Vec<Duration>), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for (index, session) in sessions.iter().enumerate() {
        let session = session.clone();
        running.spawn(async move {
            let mut latencies = Vec::with_capacity(TURNS);
            for turn in 0..TURNS {
                if let Some(rate) = rate {
                    let slot = (turn * SESSIONS + index) as f64 / rate;
                    tokio::time::sleep_until((started + Duration::from_secs_f64(slot)).into()).await;
                }
                let sent = Instant::now();
                session.send_text(format!("/tool t {{\"turn\": {turn}}}")).await?;
                latencies.push(sent.elapsed());
            }
            Ok::<_, pedelec_sdk::PedelecError>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(sessions.len() * TURNS);
    while let Some(done) = running.join_next().await {
        latencies.extend(done??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Ok((elapsed, latencies))
}

async fn deltas_turn(session: &pedelec_sdk::PedelecSession<String>) -> Result<Duration, pedelec_sdk::PedelecError> {
    let started = Instant::now();
    session.send_text(format!("/deltas {DELTAS}")).await?;
    Ok(started.elapsed())
}

async fn silent_subscribers(client: &Pedelec, socket: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let session = Arc::new(client.create_session::<String>(SessionOptions::default()).await?);
    deltas_turn(&session).await?; // warm-up
    let mut alone = Vec::new();
    for _ in 0..3 {
        alone.push(deltas_turn(&session).await?);
    }
    alone.sort();
    let alone = alone[1];
    let raw = pb::core_client::CoreClient::new(pedelec_sdk::grpc::local_channel(socket).await?);
    let request =
        pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: "app:load-bench".into() };
    let mut silent = Vec::new();
    for _ in 0..SILENT {
        silent.push(raw.clone().subscribe(request.clone()).await?.into_inner());
    }
    let with_silent = deltas_turn(&session).await?;
    let grace = pedelec_protocol::limits::SUBSCRIBER_LAG_TIMEOUT;
    println!(
        "{DELTAS}-delta turn: alone {} (median of 3), with {SILENT} silent subscribers {} = {:.2}× (alone + one {} grace); {:.2}× alone",
        ms(alone),
        ms(with_silent),
        with_silent.as_secs_f64() / (alone + grace).as_secs_f64(),
        ms(grace),
        with_silent.as_secs_f64() / alone.as_secs_f64(),
    );
    drop(silent);
    session.end().await?;
    Ok(())
}
