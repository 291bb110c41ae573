//! `cargo xtask chaos`: real faults against real processes — the dev builds
//! of `pedelec-core` and `pedelec-native-host` on a temporary socket — each
//! section asserting what Core, the SDK and the host promise when it happens:
//!
//! 1. kill -9 of Core mid-stream and mid-tool under 50 sessions, twice;
//! 2. silent subscribers beside a 100 000-delta turn;
//! 3. 10 000 subscribe/drop cycles on one session;
//! 4. random bytes and stalled HTTP/2 on the socket;
//! 5. several hundred silent connections (descriptor pressure);
//! 6. hostile native-messaging frames;
//! 7. eight Cores racing to start on one state dir.
//!
//! Every await is bounded: one that times out is counted as *unsettled*
//! instead of hanging the run. The run fails (non-zero exit) when a session
//! was lost, an await was left unsettled or any section's check failed.
//! `PEDELEC_CHAOS_SEED` replays the random bytes of an earlier run.

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use pedelec_protocol::native::{FrameDecoder, decode_native_frame};
use pedelec_protocol::pb::core_client::CoreClient;
use pedelec_protocol::pb::native_frame::Body;
use pedelec_protocol::{limits, pb};
use pedelec_sdk::daemon::{CoreProcess, find_core_binary};
use pedelec_sdk::native::find_host_binary;
use pedelec_sdk::{Pedelec, PedelecError, PedelecSession, SessionOptions, SessionStatus, ToolSpec};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::transport::Channel;

const ORIGIN: &str = "app:chaos";
/// The extension id the native host is told to allow (32 characters a–p).
const EXTENSION_ID: &str = "pedelecpedelecpedelecpedelecpede";
const GRACE: Duration = Duration::from_secs(3);

/// A request that should be answered at once (create, resume, a short turn).
const CALL: Duration = Duration::from_secs(10);
/// What "Core still answers" means: a fresh client's Ping within this.
const PING: Duration = Duration::from_secs(2);
/// How long a send_text pending across a kill -9 may take to settle.
const SETTLE: Duration = Duration::from_secs(15);
/// The 100 000-delta turn, in the dev profile with silent subscribers beside it.
const BURST_TURN: Duration = Duration::from_secs(90);
/// How long the host may take to react to a frame, or to exit.
const HOST_REACTION: Duration = Duration::from_secs(3);

const SESSIONS: usize = 50;
const KILL_ROUNDS: usize = 2;
const SILENT_SUBSCRIBERS: usize = 8;
const BURST_DELTAS: usize = 100_000;
const CHURN_CYCLES: usize = 10_000;
const SILENT_CONNECTIONS: usize = 400;
const RACERS: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let seed = std::env::var("PEDELEC_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("chaos: seed {seed} (PEDELEC_CHAOS_SEED={seed} replays its random bytes)");
    let mut rng = Rng::new(seed);
    let mut rig = Rig::start()?;
    let mut totals = Totals::default();

    let mut s = Section::new("kill -9 mid-turn");
    let outcome = kill_mid_turn(&mut rig, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("silent subscribers");
    let outcome = silent_subscribers(&rig, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("subscribe/drop churn");
    let outcome = subscribe_churn(&rig, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("garbage on the socket");
    let outcome = garbage_on_the_socket(&rig, &mut rng, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("descriptor pressure");
    let outcome = descriptor_pressure(&rig, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("hostile native frames");
    let outcome = hostile_native_frames(&rig, &mut rng, &mut s).await;
    totals.add(s, outcome);
    let mut s = Section::new("racing Core starts");
    let outcome = racing_starts(&mut rig, &mut s).await;
    totals.add(s, outcome);

    println!(
        "chaos: faults survived {} · bad inputs tried {} · sessions lost {} · awaited operations left unsettled {} · {:.1} s",
        totals.faults_survived,
        totals.bad_inputs,
        totals.lost,
        totals.unsettled,
        started.elapsed().as_secs_f64()
    );
    if totals.lost > 0 || totals.unsettled > 0 || !totals.failed.is_empty() {
        return Err(format!("chaos failed: {}", totals.failed.join(", ")).into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. kill -9 mid-stream and mid-tool
// ---------------------------------------------------------------------------

/// A turn still streaming when Core dies: 2 000 words, 5 ms apart.
fn long_stream() -> String {
    format!("/slow 5\n{}", "word ".repeat(2000))
}

/// A turn in a frontend-tool loop when Core dies (it would run for minutes).
const TOOL_LOOP: &str = "/tools 1000000 t {\"n\":1}";

/// How one awaited send_text ended across the kill.
enum Interrupted {
    /// It completed before Core died: its outcome is known.
    Finished,
    /// It was rejected; the error names its operation (`details.operationId`).
    Rejected(PedelecError),
    /// It did not settle within [`SETTLE`].
    Unsettled,
}

/// 50 sessions (half streaming, half in a tool loop) when Core is killed
/// with -9 and restarted on the same socket and state: every awaited
/// send_text settles, and every session resumes through a fresh client with
/// its interrupted operation's outcome known and answers a new turn. Twice,
/// the second round on the handles the first one resumed.
async fn kill_mid_turn(rig: &mut Rig, s: &mut Section) -> Result<(), String> {
    let client = s.require(CALL, "connect", Pedelec::connect(rig.socket(), ORIGIN)).await?;
    let mut handles = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        let tool = ToolSpec::new("t".to_string(), "counts its calls", json!({"type": "object"}));
        let options = SessionOptions { auto_end_on_disconnect: false, tools: vec![tool], ..Default::default() };
        handles.push(s.require(CALL, "create_session", client.create_session::<String>(options)).await?);
    }
    let (mut running, mut in_tool) = (0, 0);
    let (mut rejected, mut finished, mut restarted, mut answered) = (0, 0, 0, 0);
    for round in 1..=KILL_ROUNDS {
        // Deltas and tool calls show that each turn is really under way.
        let progress: Vec<Arc<AtomicU64>> = (0..handles.len()).map(|_| Arc::default()).collect();
        handles.iter().zip(&progress).for_each(|(h, p)| count_progress(h, p));
        let turns: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let (h, text) = (h.clone(), if i % 2 == 0 { long_stream() } else { TOOL_LOOP.to_owned() });
                tokio::spawn(async move { h.send_text(text).await })
            })
            .collect();
        let under_way = eventually(CALL, || progress.iter().all(|p| p.load(Ordering::Relaxed) > 0)).await;
        let going = progress.iter().filter(|p| p.load(Ordering::Relaxed) > 0).count();
        s.check(under_way, || format!("round {round}: only {going} of {} turns got under way", progress.len()));
        running += handles.iter().filter(|h| h.get_status() == SessionStatus::Running).count();
        in_tool += handles.iter().filter(|h| h.get_status() == SessionStatus::WaitingToolResult).count();
        rig.crash_and_restart()?;
        s.faults += 1;

        // Every pending await settles: the handles lost their transport.
        let deadline = tokio::time::Instant::now() + SETTLE;
        let mut outcomes = Vec::with_capacity(turns.len());
        for turn in turns {
            let abort = turn.abort_handle();
            outcomes.push(match tokio::time::timeout_at(deadline, turn).await {
                Ok(Ok(Ok(()))) => Interrupted::Finished,
                Ok(Ok(Err(error))) => Interrupted::Rejected(error),
                Ok(Err(panicked)) => return Err(format!("a send_text task failed: {panicked}")),
                Err(_) => {
                    abort.abort();
                    Interrupted::Unsettled
                }
            });
        }
        let unsettled = outcomes.iter().filter(|o| matches!(o, Interrupted::Unsettled)).count();
        s.unsettled += unsettled as u64;
        s.check(unsettled == 0, || {
            format!("round {round}: {unsettled} send_text calls did not settle within {SETTLE:?}")
        });

        // A fresh client finds every session, knows how its operation
        // ended, and runs a new turn on it.
        let client = s.require(CALL, "connect after the restart", Pedelec::connect(rig.socket(), ORIGIN)).await?;
        let mut resumed = Vec::with_capacity(handles.len());
        for (handle, outcome) in handles.iter().zip(&outcomes) {
            let id = handle.session_id();
            let session = match s.bounded(CALL, "resume_session", client.resume_session::<String>(id)).await {
                Some(Ok(session)) => session,
                Some(Err(error)) => {
                    s.lose(format!("round {round}: {id} cannot be resumed: {error}"));
                    continue;
                }
                None => {
                    s.lose(format!("round {round}: resuming {id} did not settle"));
                    continue;
                }
            };
            let known = match outcome {
                Interrupted::Finished => {
                    finished += 1;
                    true
                }
                Interrupted::Rejected(error) => {
                    rejected += 1;
                    let operation = error.details.as_ref().and_then(|d| d["operationId"].as_str());
                    match operation.and_then(|op| session.operation_outcome(op)) {
                        Some(Err(e)) if e.code == "CORE_RESTARTED" => {
                            restarted += 1;
                            true
                        }
                        Some(_) => true,
                        None => {
                            s.lose(format!("round {round}: {id}: the outcome of the operation in {error} is unknown"));
                            false
                        }
                    }
                }
                Interrupted::Unsettled => {
                    s.lose(format!("round {round}: {id}: its send_text never settled, so its outcome is unknown"));
                    false
                }
            };
            match s.bounded(CALL, "send_text(hello) after the restart", session.send_text("hello")).await {
                Some(Ok(())) => answered += 1,
                Some(Err(error)) if known => s.lose(format!("round {round}: {id} refuses a new turn: {error}")),
                _ if known => s.lose(format!("round {round}: {id}: a new turn did not settle")),
                _ => {}
            }
            resumed.push(session);
        }
        handles = resumed;
    }
    s.detail = format!(
        "{KILL_ROUNDS} kills under {SESSIONS} sessions (at the kills {running} running, {in_tool} waiting on a tool) · \
         {rejected} awaits rejected, {finished} finished first · \
         {restarted} outcomes CORE_RESTARTED after the restart · {answered} new turns answered"
    );
    Ok(())
}

/// Counts a session's deltas and tool calls into `progress`, for the
/// handle's life (dropping a disposer keeps its handler).
fn count_progress(session: &PedelecSession, progress: &Arc<AtomicU64>) {
    let (deltas, calls) = (progress.clone(), progress.clone());
    let _ = session.on_chat_delta(move |_, _| {
        deltas.fetch_add(1, Ordering::Relaxed);
    });
    let _ = session.on_tool_sync("t".to_string(), move |_: serde_json::Value, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        Ok::<_, String>(json!({"ok": true}))
    });
}

// ---------------------------------------------------------------------------
// 2. silent subscribers
// ---------------------------------------------------------------------------

/// Subscribers that never read beside a 100 000-delta turn, each on its own
/// connection as separate clients would be (on the SDK's own connection,
/// three unread streams fill HTTP/2's connection window and stall its
/// reader too — the client's doing, not Core's): the turn completes, not
/// much slower than with none, the reading SDK loses no delta, and each
/// silent one, once it reads, is re-synchronised to the turn's outcome.
async fn silent_subscribers(rig: &Rig, s: &mut Section) -> Result<(), String> {
    let client = s.require(CALL, "connect", Pedelec::connect(rig.socket(), ORIGIN)).await?;
    let session = create_idle_session(&client, s).await?;
    let longest = Arc::new(AtomicUsize::new(0));
    let l = longest.clone();
    let _chat = session.on_chat(move |text, _| {
        l.fetch_max(text.len(), Ordering::Relaxed);
    });
    let burst = format!("/deltas {BURST_DELTAS}");
    let started = Instant::now();
    s.require(BURST_TURN, "the burst turn alone", session.send_text(burst.clone())).await?;
    let alone = started.elapsed();

    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut silent = Vec::with_capacity(SILENT_SUBSCRIBERS);
    for _ in 0..SILENT_SUBSCRIBERS {
        let mut raw = raw_client(rig.socket(), s).await?;
        let stream = s.require(CALL, "a silent Subscribe", raw.subscribe(request.clone())).await?.into_inner();
        silent.push((raw, stream));
    }
    s.faults += SILENT_SUBSCRIBERS as u64;
    longest.store(0, Ordering::Relaxed);
    let started = Instant::now();
    s.require(BURST_TURN, "the burst turn beside silent subscribers", session.send_text(burst)).await?;
    let beside = started.elapsed();
    let delivered = longest.load(Ordering::Relaxed);
    s.check(delivered == BURST_DELTAS, || format!("the reading SDK got a message of {delivered} deltas"));
    // Core promises a silent subscriber costs a turn at most one stall
    // (100 ms) and N cost no more than one; this leaves room for a busy machine.
    let allowed = alone * 2 + Duration::from_secs(3);
    s.check(beside <= allowed, || {
        format!("the turn took {beside:.1?} beside {SILENT_SUBSCRIBERS} silent subscribers, {alone:.1?} alone")
    });

    // Each raw client moves into its reader: its connection carries the stream.
    let readers = silent.into_iter().map(|(raw, stream)| async move {
        let _connection = raw;
        catch_up(stream).await
    });
    let caught_up = futures::future::join_all(readers).await;
    let resynced = caught_up.iter().filter(|c| c.as_ref().is_ok_and(|r| *r)).count();
    let behind: Vec<String> = caught_up.into_iter().filter_map(Result::err).collect();
    s.unsettled += behind.iter().filter(|e| e.contains("did not settle")).count() as u64;
    s.check(behind.is_empty(), || format!("silent subscribers not re-synchronised: {}", behind.join("; ")));
    s.detail = format!(
        "{BURST_DELTAS} deltas in {:.1} s alone, {:.1} s beside {SILENT_SUBSCRIBERS} silent subscribers · \
         all delivered to the reader · once reading, {resynced} silent ones re-synchronised from a fresh \
         snapshot, {} had kept every event",
        alone.as_secs_f64(),
        beside.as_secs_f64(),
        SILENT_SUBSCRIBERS - resynced - behind.len()
    );
    Ok(())
}

/// Reads a subscriber that was silent until it learns how the burst turn
/// ended: from a re-sync snapshot naming an outcome its first snapshot did
/// not know (`Ok(true)`: Core dropped it for lagging), or from the turn's
/// completion event (`Ok(false)`: it kept everything).
async fn catch_up(mut stream: tonic::Streaming<pb::SessionEvent>) -> Result<bool, String> {
    use pb::session_event::Kind;
    let reading = async {
        let mut known = None;
        while let Some(event) = stream.message().await.map_err(|e| format!("the stream failed: {e}"))? {
            match (event.kind, &known) {
                (Some(Kind::Snapshot(snapshot)), None) => {
                    known = Some(snapshot.recent_outcomes.into_iter().map(|o| o.operation_id).collect::<Vec<_>>());
                }
                (Some(Kind::Snapshot(snapshot)), Some(known))
                    if snapshot.recent_outcomes.iter().any(|o| !known.contains(&o.operation_id)) =>
                {
                    return Ok(true);
                }
                (Some(Kind::OperationCompleted(_)), Some(_)) => return Ok(false),
                _ => {}
            }
        }
        Err("the stream ended before the turn's outcome".to_owned())
    };
    tokio::time::timeout(Duration::from_secs(20), reading)
        .await
        .unwrap_or_else(|_| Err("reading a silent subscriber did not settle within 20 s".into()))
}

// ---------------------------------------------------------------------------
// 3. subscribe/drop churn
// ---------------------------------------------------------------------------

/// 10 000 Subscribe streams on one session, opened and dropped (half after
/// their snapshot, half before it): the session still answers a turn, Core
/// answers Ping, and its descriptors and memory come back down.
async fn subscribe_churn(rig: &Rig, s: &mut Section) -> Result<(), String> {
    let client = s.require(CALL, "connect", Pedelec::connect(rig.socket(), ORIGIN)).await?;
    let session = create_idle_session(&client, s).await?;
    let raw = raw_client(rig.socket(), s).await?;
    let pid = rig.core.pid().unwrap_or(0);
    let (fds_before, rss_before) = (steady_fd_count(pid).await, common::rss_kib(pid));
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    // One deadline for the whole churn, so even a Core that stopped
    // answering ends it in bounded time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let cycles = futures::stream::iter(0..CHURN_CYCLES)
        .map(|i| {
            let (mut raw, request) = (raw.clone(), request.clone());
            let limit = deadline.min(tokio::time::Instant::now() + Duration::from_secs(5));
            tokio::time::timeout_at(limit, async move {
                let mut events = raw.subscribe(request).await?.into_inner();
                if i % 2 == 0 {
                    events.message().await?;
                }
                Ok::<_, tonic::Status>(())
            })
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let unsettled = cycles.iter().filter(|c| c.is_err()).count();
    let refused: Vec<String> = cycles.into_iter().filter_map(|c| c.ok()?.err()).map(|e| e.to_string()).collect();
    s.faults += (CHURN_CYCLES - unsettled - refused.len()) as u64;
    s.unsettled += unsettled as u64;
    s.check(unsettled == 0, || format!("{unsettled} subscribe/drop cycles did not settle"));
    s.check(refused.is_empty(), || format!("{} Subscribe calls failed, e.g. {:?}", refused.len(), refused.first()));

    s.require(CALL, "a turn after the churn", session.send_text("after the churn")).await?;
    let started = Instant::now();
    s.require(PING, "Ping after the churn", ping(rig.socket())).await?;
    let answered_in = started.elapsed();
    drop(raw);
    let fds_settled = eventually(Duration::from_secs(5), || fd_count(pid) <= fds_before + 8).await;
    let (fds_after, rss_after) = (fd_count(pid), common::rss_kib(pid));
    s.check(fds_settled, || format!("Core holds {fds_after} descriptors after the churn, {fds_before} before"));
    let grown = rss_after.saturating_sub(rss_before);
    s.check(grown < 64 * 1024, || format!("Core's RSS grew by {} over the churn", common::mib(grown)));
    s.detail = format!(
        "{CHURN_CYCLES} cycles · a turn answered after them · Ping in {:.1} ms · Core RSS {} → {}, descriptors {fds_before} → {fds_after}",
        answered_in.as_secs_f64() * 1e3,
        common::mib(rss_before),
        common::mib(rss_after)
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. random bytes and stalled HTTP/2
// ---------------------------------------------------------------------------

const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const GARBAGE_CONNECTIONS: usize = 48;
const STALLED_CONNECTIONS: usize = 48;

/// Raw connections that write random bytes (Core must close each), or start
/// HTTP/2 — the preface, half of it, the preface and then garbage — and
/// stall: with all of them open, a fresh client's Ping answers promptly.
async fn garbage_on_the_socket(rig: &Rig, rng: &mut Rng, s: &mut Section) -> Result<(), String> {
    let mut garbage = Vec::with_capacity(GARBAGE_CONNECTIONS);
    for _ in 0..GARBAGE_CONNECTIONS {
        let mut bytes = rng.bytes(24..4096);
        // Never the preface's first byte, so no connection can be valid HTTP/2.
        if bytes[0] == HTTP2_PREFACE[0] {
            bytes[0] = 0;
        }
        garbage.push(write_raw(rig.socket(), &bytes, s).await?);
    }
    let mut stalled = Vec::with_capacity(STALLED_CONNECTIONS);
    for i in 0..STALLED_CONNECTIONS {
        let bytes = match i % 3 {
            0 => HTTP2_PREFACE.to_vec(),
            1 => HTTP2_PREFACE[..10].to_vec(),
            _ => [HTTP2_PREFACE, &rng.bytes(9..512)].concat(),
        };
        stalled.push(write_raw(rig.socket(), &bytes, s).await?);
    }
    s.faults += (GARBAGE_CONNECTIONS + STALLED_CONNECTIONS) as u64;
    s.bad_inputs += (GARBAGE_CONNECTIONS + STALLED_CONNECTIONS / 3) as u64;

    let started = Instant::now();
    s.require(PING, "Ping beside stalled connections", ping(rig.socket())).await?;
    let answered_in = started.elapsed();
    // Closing what cannot be HTTP/2 is what gives its descriptor back.
    let closed = futures::future::join_all(garbage.iter_mut().map(closed_by_peer)).await;
    let open = closed.iter().filter(|c| !**c).count();
    s.check(open == 0, || format!("{open} of {GARBAGE_CONNECTIONS} garbage connections were still open after 5 s"));
    drop(stalled);
    s.detail = format!(
        "{GARBAGE_CONNECTIONS} garbage connections ({} closed by Core), {STALLED_CONNECTIONS} stalled HTTP/2 · \
         fresh Ping in {:.1} ms",
        GARBAGE_CONNECTIONS - open,
        answered_in.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Connects to `socket` and writes `bytes` (Core may close it meanwhile).
async fn write_raw(socket: PathBuf, bytes: &[u8], s: &mut Section) -> Result<UnixStream, String> {
    let mut conn = s.require(CALL, "a raw connect", UnixStream::connect(socket)).await?;
    // A failed write means Core closed the connection already: fine.
    let _ = s.bounded(CALL, "a raw write", conn.write_all(bytes)).await;
    Ok(conn)
}

/// Whether the peer closes `conn` within 5 s (anything it sends is skipped).
async fn closed_by_peer(conn: &mut UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    let drained = async {
        while let Ok(n) = conn.read(&mut buf).await
            && n > 0
        {}
    };
    tokio::time::timeout(Duration::from_secs(5), drained).await.is_ok()
}

// ---------------------------------------------------------------------------
// 5. descriptor pressure
// ---------------------------------------------------------------------------

/// Several hundred silent connections at once. Under Core's default bounds
/// (4 096 connections) a fresh client still gets in at once, and Core gives
/// the descriptors back when they close. A Core started with
/// `--max-connections 64` refuses one more at once while they are open —
/// a clear refusal, not a hang — and lets the client in once their
/// handshake time is up, though they stay open on this side.
async fn descriptor_pressure(rig: &Rig, s: &mut Section) -> Result<(), String> {
    let pid = rig.core.pid().unwrap_or(0);
    let fds_before = steady_fd_count(pid).await;
    let silent = open_silent(rig.socket(), s).await?;
    s.faults += silent.len() as u64;
    let started = Instant::now();
    s.require(PING, "Ping beside silent connections", ping(rig.socket())).await?;
    let answered_in = started.elapsed();
    drop(silent);
    let released = eventually(Duration::from_secs(5), || fd_count(pid) <= fds_before + 8).await;
    let fds_after = fd_count(pid);
    s.check(released, || {
        format!("Core holds {fds_after} descriptors after the silent ones closed, {fds_before} before")
    });

    const HANDSHAKE: Duration = Duration::from_millis(1500);
    let root = rig.dir.path().join("limited");
    let handshake = HANDSHAKE.as_millis().to_string();
    let _limited = spawn_core(&root, &["--max-connections", "64", "--handshake-timeout-ms", &handshake])?;
    let socket = root.join("run/core.sock");
    let opened = Instant::now();
    let silent = open_silent(socket.clone(), s).await?;
    s.faults += silent.len() as u64;
    let beyond = s.bounded(PING, "a client beyond the limit", ping(socket.clone())).await;
    let refused = matches!(beyond, Some(Err(_)));
    s.check(refused, || format!("a client beyond 64 connections ({} silent open): {beyond:?}", silent.len()));
    let got_in = eventually_async(HANDSHAKE + Duration::from_secs(5), || {
        let socket = socket.clone();
        async move { tokio::time::timeout(PING, ping(socket)).await.is_ok_and(|r| r.is_ok()) }
    })
    .await;
    let waited = opened.elapsed();
    s.check(got_in, || format!("no client got in {waited:.1?} after the silent connections opened"));
    drop(silent);
    s.detail = format!(
        "{SILENT_CONNECTIONS} silent: Ping in {:.1} ms, descriptors {fds_before} → {fds_after} after · at a limit of 64: \
         {} at once, in after {:.1} s (handshake timeout {:.1} s)",
        answered_in.as_secs_f64() * 1e3,
        if refused { "refused" } else { "not refused" },
        waited.as_secs_f64(),
        HANDSHAKE.as_secs_f64()
    );
    Ok(())
}

/// [`SILENT_CONNECTIONS`] connections to `socket` that never send a byte.
async fn open_silent(socket: PathBuf, s: &mut Section) -> Result<Vec<UnixStream>, String> {
    let mut silent = Vec::with_capacity(SILENT_CONNECTIONS);
    for _ in 0..SILENT_CONNECTIONS {
        silent.push(s.require(CALL, "a silent connect", UnixStream::connect(&socket)).await?);
    }
    Ok(silent)
}

// ---------------------------------------------------------------------------
// 6. hostile native frames
// ---------------------------------------------------------------------------

/// How the host must react to one hostile input.
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    /// An error frame; the stream stays in sync, so a Ping after it is answered.
    Serves,
    /// An error frame, then the host exits by itself (the stream cannot resync).
    Refuses,
    /// Nothing to answer (a frame cut short): the host writes nothing and
    /// exits cleanly once its input ends.
    EndsAtEof,
    /// Anything: an error frame, or a clean exit once the input ends.
    Survives,
}

/// A native-messaging frame: little-endian length, then the bytes.
fn frame(body: &[u8]) -> Vec<u8> {
    [&(body.len() as u32).to_le_bytes()[..], body].concat()
}

fn hostile_inputs(rng: &mut Rng) -> Vec<(String, Vec<u8>, Expect)> {
    use Expect::*;
    let ping = br#"{"requestId":1,"request":{"ping":{}}}"#;
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let json_cases: [(&str, &[u8]); 16] = [
        ("invalid UTF-8", &[0xff, 0xfe, 0xfd]),
        ("invalid JSON", b"{not json"),
        ("an empty frame", b""),
        ("JSON null", b"null"),
        ("a JSON array", b"[1,2,3]"),
        ("a field of the wrong type", br#"{"requestId":5,"request":{"ping":"wrong type"}}"#),
        ("an unknown request", br#"{"requestId":6,"request":{"launchMissiles":{}}}"#),
        ("no request id", br#"{"request":{"ping":{}}}"#),
        ("a request id past u32", br#"{"requestId":4294967296,"request":{"ping":{}}}"#),
        ("an event sent to the host", br#"{"requestId":7,"event":{"sessionId":"x"}}"#),
        ("JSON nested 100 000 deep", nested.as_bytes()),
        ("a chunk past its count", br#"{"requestId":0,"chunk":{"messageId":1,"index":5,"count":2,"data":"x"}}"#),
        ("a chunk of an unstarted message", br#"{"requestId":0,"chunk":{"messageId":9,"index":1,"count":3,"data":"x"}}"#),
        (
            "a send to a session that does not exist",
            br#"{"requestId":8,"request":{"sendText":{"sessionId":"no-such-session","callerOrigin":"app:chaos","text":"hi"}}}"#,
        ),
        (
            "a subscribe with an empty origin",
            br#"{"requestId":9,"request":{"subscribe":{"sessionId":"x","callerOrigin":""}}}"#,
        ),
        (
            "a create with a malformed origin",
            br#"{"requestId":10,"request":{"createSession":{"callerOrigin":"\u0000not an origin"}}}"#,
        ),
    ];
    let mut cases: Vec<(String, Vec<u8>, Expect)> =
        json_cases.into_iter().map(|(name, body)| (name.to_owned(), frame(body), Serves)).collect();
    let chunks = [
        br#"{"requestId":0,"chunk":{"messageId":3,"index":0,"count":2,"data":"{not"}}"#.as_slice(),
        br#"{"requestId":0,"chunk":{"messageId":3,"index":1,"count":2,"data":" json"}}"#,
    ];
    cases.push(("chunks that reassemble to invalid JSON".into(), chunks.map(frame).concat(), Serves));
    let over = limits::NATIVE_BROWSER_TO_HOST_MAX as u32 + 1;
    cases.push(("a length over 64 MiB".into(), over.to_le_bytes().to_vec(), Refuses));
    cases.push(("a length of 4 GiB".into(), u32::MAX.to_le_bytes().to_vec(), Refuses));
    let short = [&10u32.to_le_bytes()[..], ping].concat();
    cases.push(("a length shorter than its frame".into(), short, Survives));
    let long = [&1000u32.to_le_bytes()[..], ping].concat();
    cases.push(("a length longer than its frame, then end of input".into(), long, EndsAtEof));
    let cut = [&100u32.to_le_bytes()[..], &ping[..20]].concat();
    cases.push(("a frame cut short, then end of input".into(), cut, EndsAtEof));
    cases.push(("half a length prefix, then end of input".into(), vec![9, 0], EndsAtEof));
    for _ in 0..8 {
        let bytes = rng.bytes(1..8192);
        cases.push((format!("{} random bytes", bytes.len()), bytes, Survives));
    }
    cases
}

/// A fresh host per hostile input: it answers with an error frame or exits
/// cleanly, never hangs, and writes only valid frames; Core is unaffected
/// and a fresh host afterwards answers a valid Ping.
async fn hostile_native_frames(rig: &Rig, rng: &mut Rng, s: &mut Section) -> Result<(), String> {
    let cases = hostile_inputs(rng);
    let mut errors = 0;
    for (name, bytes, expect) in &cases {
        s.bad_inputs += 1;
        let mut host = Host::spawn(rig)?;
        // A host that stopped reading (it exited) fails the write: that is its reaction.
        let _ = s.bounded(HOST_REACTION, "a write to the host", host.write(bytes)).await;
        let first =
            host.next(if *expect == Expect::EndsAtEof { Duration::from_millis(300) } else { HOST_REACTION }).await;
        let answered_error = matches!(&first, Seen::Frame(f) if matches!(f.body, Some(Body::Error(_))));
        errors += answered_error as u64;
        if let Seen::Garbled(why) = &first {
            s.fail(format!("{name}: the host wrote an invalid frame: {why}"));
        }
        match expect {
            Expect::Serves => {
                s.check(answered_error, || format!("{name}: expected an error frame, got {first:?}"));
                let answered = host.ping(4242).await;
                s.check(answered, || format!("{name}: the host no longer answers a Ping after it"));
            }
            Expect::Refuses => {
                s.check(answered_error, || format!("{name}: expected an error frame, got {first:?}"));
                let exited = host.exit(HOST_REACTION).await;
                s.check(exited.is_some(), || format!("{name}: the host did not exit by itself"));
            }
            Expect::EndsAtEof => {
                s.check(matches!(first, Seen::Nothing), || format!("{name}: expected no answer, got {first:?}"));
            }
            Expect::Survives => {}
        }
        host.close_stdin();
        let status = host.exit(HOST_REACTION).await;
        s.check(status.is_some(), || format!("{name}: the host did not exit within {HOST_REACTION:?} of end of input"));
        let clean = status.is_some_and(|st| st.success());
        match expect {
            Expect::EndsAtEof | Expect::Serves => {
                s.check(clean, || format!("{name}: the host exited with {status:?} at end of input"));
            }
            Expect::Survives => s.check(answered_error || clean, || {
                format!("{name}: neither an error frame nor a clean exit ({first:?}, {status:?})")
            }),
            Expect::Refuses => {}
        }
    }
    let started = Instant::now();
    s.require(PING, "Ping after the hostile frames", ping(rig.socket())).await?;
    let answered_in = started.elapsed();
    let mut fresh = Host::spawn(rig)?;
    let answered = fresh.ping(1).await;
    s.check(answered, || "a fresh host does not answer a Ping".into());
    fresh.close_stdin();
    s.check(fresh.exit(HOST_REACTION).await.is_some_and(|st| st.success()), || "a fresh host did not exit".into());
    s.detail = format!(
        "{} hostile inputs, each to a fresh host · {errors} answered with an error frame · Core Ping in {:.1} ms · \
         a fresh host answers Ping",
        cases.len(),
        answered_in.as_secs_f64() * 1e3
    );
    Ok(())
}

/// What the host wrote next.
#[derive(Debug)]
enum Seen {
    Frame(Box<pb::NativeFrame>),
    /// Bytes that are not a valid frame (a host bug).
    Garbled(String),
    /// Its output closed.
    Closed,
    /// Nothing within the wait.
    Nothing,
}

/// One `pedelec-native-host` process as a browser runs it: frames on its
/// stdin and stdout.
struct Host {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    frames: tokio::sync::mpsc::UnboundedReceiver<Result<pb::NativeFrame, String>>,
}

impl Host {
    fn spawn(rig: &Rig) -> Result<Host, String> {
        let mut child = tokio::process::Command::new(find_host_binary())
            .arg(format!("chrome-extension://{EXTENSION_ID}/"))
            .env("PEDELEC_CORE_SOCKET", rig.socket())
            .env("PEDELEC_STATE_DIR", rig.dir.path().join("state"))
            .env("PEDELEC_ALLOWED_EXTENSIONS", EXTENSION_ID)
            .env("PEDELEC_CORE_BIN", find_core_binary())
            .env("HOME", rig.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", find_host_binary().display()))?;
        let (stdin, mut stdout) = (child.stdin.take(), child.stdout.take().ok_or("the host has no stdout")?);
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut decoder = FrameDecoder::new(limits::NATIVE_HOST_TO_BROWSER_MAX);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                while let Some(next) = decoder.next_frame() {
                    let frame = next
                        .map_err(|e| e.to_string())
                        .and_then(|text| decode_native_frame(&text).map_err(|e| e.to_string()));
                    if tx.send(frame).is_err() {
                        return;
                    }
                }
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => decoder.push(&buf[..n]),
                }
            }
        });
        Ok(Host { child, stdin, frames })
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(bytes).await?;
        stdin.flush().await
    }

    async fn next(&mut self, limit: Duration) -> Seen {
        match tokio::time::timeout(limit, self.frames.recv()).await {
            Ok(Some(Ok(frame))) => Seen::Frame(Box::new(frame)),
            Ok(Some(Err(why))) => Seen::Garbled(why),
            Ok(None) => Seen::Closed,
            Err(_) => Seen::Nothing,
        }
    }

    /// Sends a valid Ping frame; whether its answer arrives in time (other
    /// frames, such as late errors, are skipped).
    async fn ping(&mut self, id: u32) -> bool {
        let ping = format!(r#"{{"requestId":{id},"request":{{"ping":{{}}}}}}"#);
        if tokio::time::timeout(HOST_REACTION, self.write(&frame(ping.as_bytes()))).await.is_err() {
            return false;
        }
        let deadline = Instant::now() + HOST_REACTION;
        while let Seen::Frame(frame) = self.next(deadline.saturating_duration_since(Instant::now())).await {
            if frame.request_id == id {
                return matches!(frame.body, Some(Body::Response(_)));
            }
        }
        false
    }

    /// Ends its input, as a browser closing the port does.
    fn close_stdin(&mut self) {
        self.stdin.take();
    }

    async fn exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait()).await.ok()?.ok()
    }
}

// ---------------------------------------------------------------------------
// 7. racing Core starts
// ---------------------------------------------------------------------------

/// With Core killed (its stale socket left behind), eight Cores start at the
/// same moment on its socket and state dir: exactly one serves, the others
/// exit non-zero promptly, and every session stored before is still there,
/// with its status, resumable through the winner.
async fn racing_starts(rig: &mut Rig, s: &mut Section) -> Result<(), String> {
    let client = s.require(CALL, "connect", Pedelec::connect(rig.socket(), ORIGIN)).await?;
    let before = s.require(CALL, "ListSessions before", client.list_sessions()).await?;
    drop(client);
    rig.core.kill();
    s.faults += 1;
    let mut racers = Racers(Vec::with_capacity(RACERS));
    for _ in 0..RACERS {
        let racer = std::process::Command::new(find_core_binary())
            .args(rig.serve_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting a racing Core: {e}"))?;
        racers.0.push(racer);
    }
    let started = Instant::now();
    let settled = eventually(CALL, || racers.exited() == RACERS - 1).await;
    let losers_took = started.elapsed();
    s.check(settled, || format!("{} of {} losing Cores exited within {CALL:?}", racers.exited(), RACERS - 1));
    let statuses: Vec<Option<ExitStatus>> = racers.0.iter_mut().map(|c| c.try_wait().ok().flatten()).collect();
    let running: Vec<usize> = (0..RACERS).filter(|&i| statuses[i].is_none()).collect();
    s.check(running.len() == 1, || format!("{} of {RACERS} racing Cores are running", running.len()));
    let zero = statuses.iter().flatten().filter(|st| st.success()).count();
    s.check(zero == 0, || format!("{zero} losing Cores exited with status 0"));
    s.faults += (RACERS - 1) as u64;
    let [winner] = running[..] else {
        return Err("no single winner to check".into());
    };

    let winner_pid = racers.0[winner].id();
    let client = s.require(CALL, "connect to the winner", eventually_connect(rig.socket())).await?;
    let pid = s.require(PING, "Ping the winner", client.ping()).await?.pid;
    s.check(pid == winner_pid, || format!("the socket is served by pid {pid}, not the running racer {winner_pid}"));
    let after = s.require(CALL, "ListSessions after", client.list_sessions()).await?;
    let status_of = |list: &[pb::SessionSummary], id: &str| {
        list.iter().find(|x| x.session.as_ref().is_some_and(|i| i.session_id == id)).map(|x| x.status)
    };
    let mut resumed = 0;
    for summary in &before {
        let Some(id) = summary.session.as_ref().map(|i| i.session_id.as_str()) else { continue };
        if status_of(&after, id) != Some(summary.status) {
            s.lose(format!("{id}: status {} before the race, {:?} after", summary.status, status_of(&after, id)));
            continue;
        }
        match s.bounded(CALL, "resume_session after the race", client.resume_session::<String>(id)).await {
            Some(Ok(session)) if session.get_status() == SessionStatus::Idle => {
                match s.bounded(CALL, "a turn after the race", session.send_text("hello")).await {
                    Some(Ok(())) => resumed += 1,
                    other => s.lose(format!("{id}: no new turn after the race: {other:?}")),
                }
            }
            Some(Ok(session)) => s.lose(format!("{id}: resumed as {} after the race", session.get_status())),
            Some(Err(error)) => s.lose(format!("{id} cannot be resumed after the race: {error}")),
            None => s.lose(format!("resuming {id} after the race did not settle")),
        }
    }
    s.detail = format!(
        "{RACERS} racers: 1 serves, {} exited in {:.0} ms · {resumed} of {} stored sessions resumed and answered",
        racers.exited(),
        losers_took.as_secs_f64() * 1e3,
        before.len()
    );
    Ok(())
}

/// The racing Core processes; whatever still runs is killed at the end.
struct Racers(Vec<std::process::Child>);

impl Racers {
    fn exited(&mut self) -> usize {
        self.0.iter_mut().filter_map(|c| c.try_wait().ok().flatten()).count()
    }
}

impl Drop for Racers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// The rig and helpers
// ---------------------------------------------------------------------------

/// Core on a temporary socket and state dir, with its own (empty) settings.
struct Rig {
    dir: tempfile::TempDir,
    core: CoreProcess,
}

impl Rig {
    fn start() -> Result<Rig, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let core = spawn_core(dir.path(), &[])?;
        Ok(Rig { dir, core })
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/core.sock")
    }

    /// `serve`'s arguments, as [`spawn_core`] passes them.
    fn serve_args(&self) -> Vec<std::ffi::OsString> {
        let root = self.dir.path();
        let mut args: Vec<std::ffi::OsString> = vec!["serve".into(), "--socket".into(), self.socket().into()];
        args.extend(["--state-dir".into(), root.join("state").into()]);
        args.extend(["--disconnect-grace-ms".into(), GRACE.as_millis().to_string().into()]);
        args.extend(["--config-dir".into(), root.join("config").into()]);
        args
    }

    /// kill -9, then a fresh Core on the same socket and state.
    fn crash_and_restart(&mut self) -> Result<(), String> {
        self.core.kill();
        self.core = spawn_core(self.dir.path(), &[])?;
        Ok(())
    }
}

/// Core under `root` (`run/core.sock`, `state/`, `config/`), waited for.
fn spawn_core(root: &Path, extra: &[&str]) -> Result<CoreProcess, String> {
    let config = root.join("config");
    std::fs::create_dir_all(&config)
        .and_then(|()| std::fs::write(config.join("config.toml"), ""))
        .map_err(|e| format!("writing {}: {e}", config.display()))?;
    let config = config.display().to_string();
    let args: Vec<&str> = ["--config-dir", &config].into_iter().chain(extra.iter().copied()).collect();
    // Waiting for Core blocks this thread; the runtime's other tasks
    // (awaits settling across a kill) go on meanwhile.
    tokio::task::block_in_place(|| {
        CoreProcess::spawn_with_args(
            &find_core_binary(),
            &root.join("run/core.sock"),
            &root.join("state"),
            GRACE,
            &args,
        )
    })
    .map_err(|e| format!("starting Core: {e}"))
}

async fn create_idle_session(client: &Pedelec, s: &mut Section) -> Result<PedelecSession, String> {
    let options = SessionOptions { auto_end_on_disconnect: false, ..Default::default() };
    s.require(CALL, "create_session", client.create_session::<String>(options)).await
}

/// A raw gRPC client on its own connection.
async fn raw_client(socket: PathBuf, s: &mut Section) -> Result<CoreClient<Channel>, String> {
    let channel = s.require(CALL, "a raw gRPC connect", pedelec_sdk::grpc::local_channel(&socket)).await?;
    Ok(pedelec_protocol::with_message_limits!(CoreClient::new(channel)))
}

/// A fresh client's Ping, connection included.
async fn ping(socket: PathBuf) -> Result<pb::PingResponse, PedelecError> {
    Pedelec::connect(socket, ORIGIN).await?.ping().await
}

/// A client, once Core accepts connections (it may still be starting).
async fn eventually_connect(socket: PathBuf) -> Result<Pedelec, PedelecError> {
    loop {
        match Pedelec::connect(&socket, ORIGIN).await {
            Ok(client) => return Ok(client),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Polls `ready` until it holds, for at most `limit`.
async fn eventually(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    eventually_async(limit, || std::future::ready(ready())).await
}

async fn eventually_async<F: Future<Output = bool>>(limit: Duration, mut ready: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if ready().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Open descriptors of a process.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Open descriptors of a process once the count holds still for 100 ms
/// (at most 2 s): connections an earlier section dropped may still be closing.
async fn steady_fd_count(pid: u32) -> usize {
    let mut count = fd_count(pid);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = fd_count(pid);
        if now == count {
            break;
        }
        count = now;
    }
    count
}

/// Garbage from a seeded generator, so a run can be replayed from its seed.
struct Rng(rand::rngs::StdRng);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }

    /// Random bytes, as many as a random length in `len`.
    fn bytes(&mut self, len: std::ops::Range<usize>) -> Vec<u8> {
        use rand::{Rng as _, RngCore as _};
        let mut bytes = vec![0; self.0.random_range(len)];
        self.0.fill_bytes(&mut bytes);
        bytes
    }
}

/// One section's counts and checks.
struct Section {
    name: &'static str,
    started: Instant,
    faults: u64,
    bad_inputs: u64,
    lost: u64,
    unsettled: u64,
    failures: Vec<String>,
    /// The section's own figures, for its line.
    detail: String,
}

impl Section {
    fn new(name: &'static str) -> Self {
        Section {
            name,
            started: Instant::now(),
            faults: 0,
            bad_inputs: 0,
            lost: 0,
            unsettled: 0,
            failures: Vec::new(),
            detail: String::new(),
        }
    }

    fn fail(&mut self, failure: String) {
        self.failures.push(failure);
    }

    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.fail(failure());
        }
    }

    fn lose(&mut self, why: String) {
        self.lost += 1;
        self.fail(why);
    }

    /// Awaits `fut` for at most `limit`; a timeout counts as unsettled.
    async fn bounded<F: Future>(&mut self, limit: Duration, what: &str, fut: F) -> Option<F::Output> {
        match tokio::time::timeout(limit, fut).await {
            Ok(output) => Some(output),
            Err(_) => {
                self.unsettled += 1;
                self.fail(format!("{what} did not settle within {limit:?}"));
                None
            }
        }
    }

    /// [`Section::bounded`] for a step the rest of the section needs.
    async fn require<T, E: std::fmt::Display>(
        &mut self,
        limit: Duration,
        what: &str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, String> {
        match self.bounded(limit, what, fut).await {
            Some(Ok(value)) => Ok(value),
            Some(Err(error)) => Err(format!("{what}: {error}")),
            None => Err(format!("{what} did not settle")),
        }
    }
}

/// The run's totals; faults count as survived in sections that passed.
#[derive(Default)]
struct Totals {
    faults_survived: u64,
    bad_inputs: u64,
    lost: u64,
    unsettled: u64,
    failed: Vec<&'static str>,
}

impl Totals {
    /// Prints the section's line (and its failures) and adds up its counts.
    fn add(&mut self, mut s: Section, outcome: Result<(), String>) {
        if let Err(stopped) = outcome {
            s.fail(format!("stopped: {stopped}"));
        }
        let passed = s.failures.is_empty();
        println!(
            "chaos {} {}: {} · faults {} · bad inputs {} · sessions lost {} · unsettled {} · {:.1} s",
            if passed { "ok  " } else { "FAIL" },
            s.name,
            if s.detail.is_empty() { "-" } else { &s.detail },
            s.faults,
            s.bad_inputs,
            s.lost,
            s.unsettled,
            s.started.elapsed().as_secs_f64()
        );
        for failure in &s.failures {
            println!("    ✗ {failure}");
        }
        if passed {
            self.faults_survived += s.faults;
        } else {
            self.failed.push(s.name);
        }
        self.bad_inputs += s.bad_inputs;
        self.lost += s.lost;
        self.unsettled += s.unsettled;
    }
}
