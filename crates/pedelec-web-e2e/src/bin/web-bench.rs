//! `cargo xtask web-bench`: the browser path, measured in the demo page.
//!
//! Each figure is the median of three rounds in one browser, with its floor
//! measured in the same rounds:
//! - the frontend tool round trip: the scripted agent calls the page's `echo`
//!   tool in turns of N/8 calls (`/tools N/8 echo {...}`) and times each call
//!   from its side — Core → native host → extension → page (wasm SDK → JS
//!   handler) → back; the round's p50 is the median of its turns' p50s;
//! - its floor, the bare request round trip timed in the page, N/8 requests
//!   after each of those turns (so both are measured through the same stretch
//!   of a noisy machine): `getApprovalStatus` of an approved origin is page →
//!   extension, a `Ping` extension → host → Core, and back; the tool figure
//!   is printed as a ratio to it, paired chunk by chunk (each chunk's tool
//!   p50 over its floor requests' p50; a round's ratio is the median of its
//!   chunks'), and as the ratio of the rounds' two medians;
//! - chat deltas of one 100 000-delta turn (`/deltas 100000`) per second, from
//!   `sendText` to its settling, counted by the page's `onChatDelta`;
//! - the native-messaging messages the extension received per tool call of
//!   that turn (about one: the call, with the previous call's status and,
//!   in `acks`, its answer's success);
//! - the native-messaging messages the extension received per 1 000 of those
//!   deltas (a batching figure that does not depend on the machine's speed);
//! - page memory (V8 heap after a collection, plus the SDK's wasm memory)
//!   before the first delta turn and after the last;
//! - the control center's first listing of 1 000 live sessions (its first
//!   page of rows), in ms from navigation (median of three opens);
//! - a page that is slow but live (its handler blocks 50 ms per 1 000
//!   deltas): how many deltas of a 100 000-delta turn it still receives.
//!
//! To find where the time goes: `PEDELEC_WEB_BENCH_PROFILE=FILE` writes CPU
//! profiles of the page and the extension's worker, `PEDELEC_WEB_BENCH_TRACE=FILE`
//! a Chrome trace of every process, each of one run of
//! `PEDELEC_WEB_BENCH_PROFILE_PROMPT` (a prompt, or `floor` for 400 bare
//! requests, to compare with).

use std::time::Duration;

use pedelec_web_e2e::page::Page;
use pedelec_web_e2e::server::StaticServer;
use pedelec_web_e2e::{E2eError, EXTENSION_ID, Rig, parse_round_trip, web_dir};
use serde_json::{Value, json};

const ROUNDS: usize = 3;
/// Live sessions the control center lists for its first-paint figure.
const CONTROL_SESSIONS: usize = 1000;
const DELTAS: u64 = 100_000;
/// A round's tool calls and floor requests are measured in this many
/// alternating chunks.
const CHUNKS: u32 = 8;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

struct Round {
    tool_p50: f64,
    tool_p99: f64,
    bare_p50: f64,
    bare_p99: f64,
    /// The median of the chunks' paired ratios, tool p50 ÷ floor p50.
    ratio: f64,
    deltas_per_s: f64,
    messages_per_1000: f64,
    messages_per_tool_call: f64,
}

fn main() -> Result<(), E2eError> {
    let calls: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(400);
    let rig = Rig::start(Duration::from_millis(500))?;
    // Cross-origin isolated, so the page's own timings have 5 µs resolution.
    let site = StaticServer::start_isolated(&web_dir())?;
    let page = rig.open_demo(&site)?;
    if page.eval("crossOriginIsolated")? != json!(true) {
        return Err(E2eError::Setup("the benchmark page is not cross-origin isolated".into()));
    }
    let started = page.eval_later("demo.attempt(() => demo.start())")?;
    rig.answer_approval(&site.origin(), "#approve")?;
    let started = started.wait(Duration::from_secs(30))?;
    if started["result"]["value"]["ok"] != json!(true) {
        return Err(E2eError::Setup(format!("createSession failed: {started}")));
    }
    // The approval tab took the front; a background tab's renderer runs at low priority.
    rig.browser.call("Page.bringToFront", json!({}), Some(&page.session))?;
    let worker_url = format!("chrome-extension://{EXTENSION_ID}/background.js");
    let worker = rig.browser.wait_for_target("the extension's service worker", |t| {
        t["type"] == json!("service_worker") && t["url"].as_str() == Some(worker_url.as_str())
    })?;
    let worker = Page::attach(&rig.browser, worker["targetId"].as_str().unwrap_or_default())?;
    // One warm-up turn of each kind, so the first measured one does not pay for JIT and connection setup.
    page.eval("demo.attempt(() => demo.send('/tools 20 echo {\"n\": 1}'))")?;
    page.eval_for("demo.attempt(() => demo.send('/deltas 10000'))", Duration::from_secs(120))?;
    let before = page_memory(&rig, &page)?;

    // PEDELEC_WEB_BENCH_PROFILE=FILE: a CPU profile of the page during one
    // turn (a .cpuprofile for DevTools), to find where the time goes; the
    // turn is a delta turn unless PEDELEC_WEB_BENCH_PROFILE_PROMPT says another.
    if let Some(path) = std::env::var_os("PEDELEC_WEB_BENCH_PROFILE") {
        let (prompt, send) = profiled_run()?;
        // The extension's worker too (FILE.worker.cpuprofile): it relays every message.
        for target in [&page, &worker] {
            rig.browser.call("Profiler.enable", json!({}), Some(&target.session))?;
            rig.browser.call("Profiler.setSamplingInterval", json!({ "interval": 100 }), Some(&target.session))?;
            rig.browser.call("Profiler.start", json!({}), Some(&target.session))?;
        }
        page.eval_for(&send, Duration::from_secs(600))?;
        let mut worker_path = path.clone();
        worker_path.push(".worker.cpuprofile");
        for (target, path) in [(&page, &path), (&worker, &worker_path)] {
            let profile = rig.browser.call("Profiler.stop", json!({}), Some(&target.session))?;
            std::fs::write(path, serde_json::to_vec(&profile["profile"])?)?;
            println!("profile of `{prompt}` written to {}", std::path::Path::new(path).display());
        }
    }

    // PEDELEC_WEB_BENCH_TRACE=FILE: a Chrome trace (chrome://tracing, Perfetto)
    // of one turn of PEDELEC_WEB_BENCH_PROFILE_PROMPT (as above): what the
    // processes' threads do between the JS a profile sees — IPC, task
    // scheduling, rendering.
    if let Some(path) = std::env::var_os("PEDELEC_WEB_BENCH_TRACE") {
        let (prompt, send) = profiled_run()?;
        let categories =
            ["toplevel", "blink", "ipc", "mojom", "v8", "devtools.timeline", "extensions", "renderer.scheduler"];
        rig.browser.call(
            "Tracing.start",
            json!({ "transferMode": "ReportEvents", "traceConfig": { "includedCategories": categories } }),
            None,
        )?;
        page.eval_for(&send, Duration::from_secs(600))?;
        rig.browser.call("Tracing.end", json!({}), None)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let events = loop {
            let events = rig.browser.events();
            if events.iter().any(|e| e["method"] == "Tracing.tracingComplete") {
                break events;
            }
            if std::time::Instant::now() > deadline {
                return Err(E2eError::Timeout("the trace did not complete".into()));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let trace: Vec<&Value> = events
            .iter()
            .filter(|e| e["method"] == "Tracing.dataCollected")
            .flat_map(|e| e["params"]["value"].as_array().into_iter().flatten())
            .collect();
        std::fs::write(&path, serde_json::to_vec(&json!({ "traceEvents": trace }))?)?;
        println!("trace of `{prompt}` ({} events) written to {}", trace.len(), std::path::Path::new(&path).display());
    }

    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push(round(&page, &worker, calls)?);
    }
    // What the page holds on to is what an application keeps (its chat log);
    // the SDK's share must not grow with the turns it streamed.
    page.eval("demo.state.deltas = ''")?;
    let after = page_memory(&rig, &page)?;
    let slow = slow_page_turn(&page)?;

    let m = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let (tool, bare) = (m(|r| r.tool_p50), m(|r| r.bare_p50));
    println!("browser path, median of {ROUNDS} rounds:");
    println!(
        "  frontend tool round trip (agent → page handler → agent), {calls} calls: p50 {tool:.0} µs, p99 {:.0} µs",
        m(|r| r.tool_p99)
    );
    println!(
        "  floor: bare request round trip (page → extension → host → Core Ping), {calls} calls: p50 {bare:.0} µs, p99 {:.0} µs",
        m(|r| r.bare_p99)
    );
    println!(
        "  tool round trip ÷ floor: {:.2}× (target ≤ 1.20×; each round's median of its {CHUNKS} chunks' ratios, \
         the median of the rounds; the rounds' medians above give {:.2}×)",
        m(|r| r.ratio),
        tool / bare
    );
    println!("  chat deltas of one {DELTAS}-delta turn: {:.0}/s (target ≥ 150 000/s)", m(|r| r.deltas_per_s));
    println!("  native-messaging messages per 1 000 deltas: {:.1}", m(|r| r.messages_per_1000));
    println!("  native-messaging messages (host → extension) per tool call: {:.2}", m(|r| r.messages_per_tool_call));
    let total = |(heap, wasm): (f64, f64)| mib(heap + wasm);
    println!(
        "  page memory (V8 heap + wasm): before {:.2} MiB, after {ROUNDS} delta turns {:.2} MiB ({:+.2} MiB; target ≤ +2); \
         wasm {:.2} → {:.2} MiB",
        total(before),
        total(after),
        total(after) - total(before),
        mib(before.1),
        mib(after.1)
    );
    println!(
        "  a page whose handler blocks 50 ms per 1 000 deltas: {} / {DELTAS} deltas of one turn, turn settled {}, \
         {} blocks, {:.1} s (target: every delta; Core's log holds what the page has not read)",
        slow["n"],
        slow["ok"],
        slow["blocked"],
        slow["ms"].as_f64().unwrap_or(f64::NAN) / 1000.0
    );
    let listed = control_center_first_listing(&rig)?;
    println!(
        "  control center, first listing of {CONTROL_SESSIONS} live sessions (page 1 of 50 rows): {:.0} ms after navigation \
         (target < 200 ms; median of {ROUNDS} opens: {})",
        median(listed.clone()),
        listed.iter().map(|ms| format!("{ms:.0}")).collect::<Vec<_>>().join(" / ")
    );
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "  round {}: tool p50 {:.0} µs, floor p50 {:.0} µs, paired ratio {:.2}×, {:.0} deltas/s, {:.1} messages per 1 000 deltas",
            i + 1,
            r.tool_p50,
            r.bare_p50,
            r.ratio,
            r.deltas_per_s,
            r.messages_per_1000
        );
    }
    Ok(())
}

/// What a profiled or traced run does (`PEDELEC_WEB_BENCH_PROFILE_PROMPT`,
/// a delta turn by default), and the page's script for it: the prompt sent
/// as a turn, or for `floor` 400 of the floor's bare requests.
fn profiled_run() -> Result<(String, String), E2eError> {
    let prompt = std::env::var("PEDELEC_WEB_BENCH_PROFILE_PROMPT").unwrap_or(format!("/deltas {DELTAS}"));
    let script = if prompt == "floor" {
        "(async () => { for (let i = 0; i < 400; i++) await demo.pedelec.getApprovalStatus(); })()".into()
    } else {
        format!("demo.attempt(() => demo.send({}))", serde_json::to_string(&prompt)?)
    };
    Ok((prompt, script))
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn round(page: &Page<'_>, worker: &Page<'_>, calls: u32) -> Result<Round, E2eError> {
    let host_messages =
        || -> Result<f64, E2eError> { Ok(worker.eval("pedelecStats.hostMessages")?.as_f64().unwrap_or(f64::NAN)) };
    // The tool calls and their floor alternate in chunks, so both are
    // measured through the same stretch of a noisy machine rather than one
    // after the other.
    let per_chunk = (calls / CHUNKS).max(1);
    let (mut chunk_p50s, mut chunk_p99s, mut floor_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut chunk_ratios = Vec::new();
    let mut tool_messages = 0.0;
    for _ in 0..CHUNKS {
        let prompt = format!("/tools {per_chunk} echo {{\"n\": 1}}");
        let before = host_messages()?;
        let result = page.eval_for(
            &format!("demo.attempt(() => demo.send({}))", serde_json::to_string(&prompt)?),
            Duration::from_secs(300),
        )?;
        if result["ok"] != json!(true) {
            return Err(E2eError::Setup(format!("the benchmark turn failed: {result}")));
        }
        tool_messages += host_messages()? - before;
        let reply = page.eval("demo.state.chats.at(-1)")?;
        let reply = reply.as_str().unwrap_or_default();
        let (p50, p99) =
            parse_round_trip(reply).ok_or_else(|| E2eError::Protocol(format!("no p50/p99 in {reply:?}")))?;
        chunk_p50s.push(p50 as f64);
        chunk_p99s.push(p99 as f64);
        let times = page.eval_for(
            &format!(
                "(async () => {{ const t = []; for (let i = 0; i < {per_chunk}; i++) {{ const s = performance.now(); \
                 await demo.pedelec.getApprovalStatus(); t.push(performance.now() - s); }} return t; }})()"
            ),
            Duration::from_secs(300),
        )?;
        let mut chunk_floor: Vec<f64> = times.as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
        if chunk_floor.is_empty() {
            return Err(E2eError::Protocol("no floor timings".into()));
        }
        chunk_floor.sort_by(f64::total_cmp);
        chunk_ratios.push(p50 as f64 / (chunk_floor[chunk_floor.len() / 2] * 1000.0));
        floor_ms.extend(chunk_floor);
    }
    floor_ms.sort_by(f64::total_cmp);
    let (bare_p50, bare_p99) = (floor_ms[floor_ms.len() / 2] * 1000.0, floor_ms[floor_ms.len() * 99 / 100] * 1000.0);
    // The agent reports each chunk's p50 and p99: the round's tool figures
    // are the median of the p50s and the worst p99.
    let tool_p50 = median(chunk_p50s);
    // Each chunk's tool p50 over the p50 of the floor requests right after
    // it: the machine's speed drifts between chunks far more than within
    // one, and a ratio of two medians taken across the round keeps that drift.
    let ratio = median(chunk_ratios);
    let tool_p99 = chunk_p99s.iter().copied().fold(0.0, f64::max);
    let calls = per_chunk * CHUNKS;

    let messages_before = host_messages()?;
    let turn = page.eval_for(
        &format!(
            "(async () => {{ const before = demo.state.deltas.length; const t0 = performance.now(); \
             const r = await demo.attempt(() => demo.send('/deltas {DELTAS}')); \
             return {{ ok: r.ok, n: demo.state.deltas.length - before, ms: performance.now() - t0 }}; }})()"
        ),
        Duration::from_secs(600),
    )?;
    let messages = host_messages()? - messages_before;
    if turn["ok"] != json!(true) || turn["n"].as_u64() != Some(DELTAS) {
        return Err(E2eError::Protocol(format!("the delta turn did not deliver {DELTAS} deltas: {turn}")));
    }
    let ms = turn["ms"].as_f64().unwrap_or(f64::NAN);
    Ok(Round {
        tool_p50,
        tool_p99,
        bare_p50,
        bare_p99,
        ratio,
        deltas_per_s: DELTAS as f64 / (ms / 1000.0),
        messages_per_1000: messages / (DELTAS as f64 / 1000.0),
        messages_per_tool_call: tool_messages / f64::from(calls),
    })
}

/// One `/deltas` turn to a page that is slow but live: a second delta
/// handler blocks the page's thread for 50 ms every 1 000 deltas (5 s over
/// the turn), far slower than Core writes. Counts the deltas it saw; a reader
/// cut off and re-synchronised would miss some (a snapshot replays none).
fn slow_page_turn(page: &Page<'_>) -> Result<Value, E2eError> {
    let turn = page.eval_for(
        &format!(
            "(async () => {{ let n = 0, blocked = 0; \
             const off = demo.session().onChatDelta(() => {{ n++; if (n % 1000 === 0) {{ \
               const end = performance.now() + 50; while (performance.now() < end) {{}} blocked++; }} }}); \
             const t0 = performance.now(); const r = await demo.attempt(() => demo.send('/deltas {DELTAS}')); \
             off(); return {{ ok: r.ok, n, blocked, ms: performance.now() - t0 }}; }})()"
        ),
        Duration::from_secs(600),
    )?;
    page.eval("demo.state.deltas = ''")?;
    Ok(turn)
}

/// The page's V8 heap in use after a full collection, and the wasm memory.
fn page_memory(rig: &Rig, page: &Page<'_>) -> Result<(f64, f64), E2eError> {
    rig.browser.call("HeapProfiler.collectGarbage", json!({}), Some(&page.session))?;
    let heap = rig.browser.call("Runtime.getHeapUsage", json!({}), Some(&page.session))?;
    let wasm = page.eval("demo.wasmMemoryBytes()")?;
    Ok((heap["usedSize"].as_f64().unwrap_or(f64::NAN), wasm.as_f64().unwrap_or(f64::NAN)))
}

/// The control center's first listing with [`CONTROL_SESSIONS`] live
/// sessions in Core: ms from the page's navigation to its
/// `pedelec-sessions-listed` mark (the first page of rows rendered), for
/// each of [`ROUNDS`] fresh opens.
fn control_center_first_listing(rig: &Rig) -> Result<Vec<f64>, E2eError> {
    use pedelec_sdk::grpc::GrpcTransport;
    use pedelec_sdk::transport::{Call, Transport};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| E2eError::Setup(format!("a runtime: {e}")))?;
    let core = runtime.block_on(GrpcTransport::connect(rig.socket())).map_err(|e| E2eError::Setup(e.to_string()))?;
    let created = runtime.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..CONTROL_SESSIONS {
            // A local app's origin: the per-site quota is for web origins.
            let request = pedelec_protocol::pb::CreateSessionRequest {
                caller_origin: "app:pedelec-web-bench".into(),
                auto_end_on_disconnect: Some(false),
                ..Default::default()
            };
            let core = core.clone();
            calls.spawn(async move { core.call(Call::CreateSession(request)).await });
        }
        calls.join_all().await
    });
    if let Some(Err(error)) = created.into_iter().find(Result::is_err) {
        return Err(E2eError::Setup(format!("creating the sessions: {}", error.message)));
    }
    let url = format!("chrome-extension://{EXTENSION_ID}/control.html");
    let mut listed = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let control = Page::open(&rig.browser, &url)?;
        control.wait_until("document.querySelectorAll('#sessions tbody tr').length === 50", Duration::from_secs(30))?;
        control
            .wait_until("performance.getEntriesByName('pedelec-sessions-listed').length > 0", Duration::from_secs(5))?;
        let at = control.eval("performance.getEntriesByName('pedelec-sessions-listed')[0].startTime")?;
        listed.push(at.as_f64().unwrap_or(f64::NAN));
        control.close()?;
    }
    Ok(listed)
}
