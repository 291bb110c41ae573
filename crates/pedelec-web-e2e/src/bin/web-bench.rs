//! `cargo xtask web-bench`: the frontend tool-call round trip in the browser.
//!
//! The scripted agent calls the demo page's `echo` tool N times in one turn
//! (`/tools N echo {...}`) and times each call from its side: Core → native
//! host → extension → page (wasm SDK → JS handler) → back. It reports p50/p99;
//! compare with `cargo xtask bench`, which times the same loop from a native SDK.

use std::time::Duration;

use pedelec_web_e2e::{E2eError, Rig, parse_round_trip};
use serde_json::json;

fn main() -> Result<(), E2eError> {
    let calls: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let rig = Rig::start(Duration::from_millis(500))?;
    let page = rig.open_demo(&rig.site)?;
    let started = page.eval_later("demo.attempt(() => demo.start())")?;
    rig.answer_approval(&rig.site.origin(), "#approve")?;
    let started = started.wait(Duration::from_secs(30))?;
    if started["result"]["value"]["ok"] != json!(true) {
        return Err(E2eError::Setup(format!("createSession failed: {started}")));
    }
    // The approval tab took the front; a background tab's renderer runs at low priority.
    rig.browser.call("Page.bringToFront", json!({}), Some(&page.session))?;
    // One warm-up turn so the first measured call does not pay for JIT and connection setup.
    page.eval("demo.attempt(() => demo.send('/tools 20 echo {\"n\": 1}'))")?;
    let prompt = format!("/tools {calls} echo {{\"n\": 1}}");
    let result = page.eval_for(
        &format!("demo.attempt(() => demo.send({}))", serde_json::to_string(&prompt)?),
        Duration::from_secs(300),
    )?;
    if result["ok"] != json!(true) {
        return Err(E2eError::Setup(format!("the benchmark turn failed: {result}")));
    }
    let reply = page.eval("demo.state.chats.at(-1)")?;
    let reply = reply.as_str().unwrap_or_default();
    let (p50, p99) = parse_round_trip(reply).ok_or_else(|| E2eError::Protocol(format!("no p50/p99 in {reply:?}")))?;
    println!("browser tool-call round trip (agent → page handler → agent), {calls} calls: p50 {p50} µs, p99 {p99} µs");
    // For scale: the bare path with no session logic, timed in the page —
    // getApprovalStatus of an approved origin is page → extension, a Ping extension → host → Core, and back.
    let bare = page.eval_for(
        &format!(
            "(async () => {{ const t = []; for (let i = 0; i < {calls}; i++) {{ const s = performance.now(); \
             await demo.pedelec.getApprovalStatus(); t.push(performance.now() - s); }} \
             t.sort((a, b) => a - b); return [t[Math.floor(t.length / 2)], t[Math.floor(t.length * 0.99)]]; }})()"
        ),
        Duration::from_secs(300),
    )?;
    let ms = |v: &serde_json::Value| (v.as_f64().unwrap_or(f64::NAN) * 1000.0).round();
    println!(
        "browser request round trip (page → extension → host → Core Ping), {calls} calls: p50 {} µs, p99 {} µs",
        ms(&bare[0]),
        ms(&bare[1])
    );
    Ok(())
}
