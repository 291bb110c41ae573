//! The browser path in real headless Chromium, one scenario per step of the
//! issue: approve through the extension's page, create, send with streamed
//! deltas, a tool call answered by the page, an asset round trip, end and
//! resume, a screenshot, an unapproved origin refused, revoke, and closing
//! the page ending the session in Core.

use std::time::{Duration, Instant};

use pedelec_protocol::pb;
use pedelec_sdk::SessionStatus;
use pedelec_sdk::grpc::GrpcTransport;
use pedelec_sdk::transport::{Call, Reply, Transport};
use pedelec_web_e2e::page::Page;
use pedelec_web_e2e::{
    EXTENSION_ID, RAW_FRAMES_JS, Rig, assert_forged_refused, encode_component, forged_frames, missing_prerequisite,
    native_host_pids, workspace_root,
};
use serde_json::{Value, json};

/// Core's auto-end grace: long enough for a restarted extension worker to re-subscribe.
const GRACE: Duration = Duration::from_millis(1500);
const TURN: Duration = Duration::from_secs(30);

/// Without Chromium or the web package the test skips locally, but CI must
/// run it, so there it fails instead.
fn prerequisites_or_skip() -> bool {
    let Some(missing) = missing_prerequisite() else { return true };
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("the browser test cannot run in CI: {missing}");
    }
    eprintln!("SKIPPED browser end-to-end test: {missing}");
    false
}

/// Core's own view of a session, from a fresh gRPC client of the same
/// origin: its listing, which needs no approval (a revoked origin's ended
/// sessions are still listed; Resume would be refused).
/// The activity log's entries for `origin`, newest first (the owner's `ListActivity`).
fn activity_of(rig: &Rig, origin: &str) -> Vec<pb::ActivityLogEntry> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let request = pb::ListActivityRequest {
        caller_origin: "app:pedelec-extension".into(),
        origin: origin.to_owned(),
        cursor: String::new(),
        limit: 1000,
    };
    match runtime.block_on(transport.call(Call::ListActivity(request))) {
        Ok(Reply::ListActivity(page)) => page.entries,
        other => panic!("Core lists the activity log: {other:?}"),
    }
}

fn core_status(rig: &Rig, origin: &str, session_id: &str) -> SessionStatus {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let mut before = String::new();
    loop {
        let request = pb::ListSessionsRequest {
            caller_origin: origin.to_owned(),
            limit: 1000,
            before_session_id: before.clone(),
        };
        let Ok(Reply::ListSessions(page)) = runtime.block_on(transport.call(Call::ListSessions(request))) else {
            panic!("Core lists the origin's sessions");
        };
        for summary in &page.sessions {
            if summary.session.as_ref().is_some_and(|s| s.session_id == session_id) {
                return SessionStatus::from_pb(summary.status).expect("a known status");
            }
        }
        match page.sessions.last() {
            Some(last) if page.has_more => before = last.session.as_ref().unwrap().session_id.clone(),
            _ => panic!("Core does not list {session_id}"),
        }
    }
}

/// Waits until Core reports the session ended (its listing: a probing
/// Subscribe would itself be a subscriber and hold off auto-end-on-disconnect).
fn wait_for_core_end(rig: &Rig, origin: &str, session_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = core_status(rig, origin, session_id);
        if status == SessionStatus::Ended {
            break;
        }
        assert!(Instant::now() < deadline, "Core has not ended {session_id}: {status:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After a revocation: the page's handle is ended and refuses at once, and
/// no approval prompt opened by itself (the SDK did not re-subscribe).
fn assert_revoked_quietly(rig: &Rig, page: &Page<'_>, origin: &str) {
    let refused = attempt(page, "await demo.session().sendText('after revoke'); return 'sent';");
    assert_eq!(refused["code"], json!("SESSION_ENDED"), "{refused}");
    assert_eq!(page.eval("demo.session().getStatus()").unwrap(), json!("ended"));
    std::thread::sleep(Duration::from_millis(1500));
    let url = format!("approve.html?origin={}", pedelec_web_e2e::encode_component(origin));
    let prompts: Vec<Value> = rig
        .browser
        .targets()
        .unwrap()
        .into_iter()
        .filter(|t| t["url"].as_str().is_some_and(|u| u.contains(&url)))
        .collect();
    assert!(prompts.is_empty(), "a revoked page must not prompt until it asks: {prompts:?}");
}

/// The members `pedelec.d.ts` declares on `Pedelec` and `PedelecSession`
/// (methods and properties; not constructors), as a JSON object of lists.
fn declared_members(types: &str) -> Value {
    let mut out = serde_json::Map::new();
    for class in ["Pedelec", "PedelecSession"] {
        let start = types
            .find(&format!("export declare class {class} "))
            .or_else(|| types.find(&format!("export declare class {class}<")))
            .unwrap_or_else(|| panic!("pedelec.d.ts declares {class}"));
        let body = &types[start..start + types[start..].find("\n}").expect("the class ends")];
        let mut names: Vec<String> = body
            .lines()
            .skip(1)
            // Members sit at the class's own indentation; deeper lines are
            // the parameters of a signature that spans lines.
            .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
            .filter_map(|line| {
                let line = line.trim().trim_start_matches("readonly ");
                let name: String = line.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
                let declares = line[name.len()..].starts_with(['(', '<', ':', '?']);
                (declares && !name.is_empty() && name != "constructor").then_some(name)
            })
            .collect();
        names.sort();
        names.dedup();
        assert!(names.len() > 5, "{class}: {names:?}");
        out.insert(class.into(), json!(names));
    }
    Value::Object(out)
}

/// Runs `demo.attempt(...)` and returns its `{ ok, value | code }`.
fn attempt(page: &Page<'_>, body: &str) -> Value {
    page.eval_for(&format!("demo.attempt(async () => {{ {body} }})"), TURN).expect("the page evaluates")
}

/// The extension's service worker, for what only it sees (its message
/// counts, its notifications).
fn attach_worker(rig: &Rig) -> Page<'_> {
    let worker_url = format!("chrome-extension://{EXTENSION_ID}/background.js");
    let worker = rig
        .browser
        .wait_for_target("the service worker", |t| {
            t["type"] == json!("service_worker") && t["url"].as_str() == Some(worker_url.as_str())
        })
        .unwrap();
    Page::attach(&rig.browser, worker["targetId"].as_str().unwrap()).expect("attach to the worker")
}

fn ok_value(result: Value) -> Value {
    assert_eq!(result["ok"], json!(true), "the page action failed: {result}");
    result["value"].clone()
}

#[test]
fn browser_end_to_end() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("demo page loads the wasm SDK");

    // Before any request: the extension answers, the origin is not approved, no prompt opens.
    let status = page.eval("demo.pedelec.getApprovalStatus()").expect("status");
    assert_eq!(status["installed"], json!(true), "{status}");
    assert_eq!(status["approved"], json!(false), "{status}");
    assert_eq!(status["origin"], json!(origin), "{status}");

    // A wrong extension id: nothing answers, so the SDK reports it not installed.
    let absent =
        page.eval("new demo.pedelec.constructor({ extensionId: 'a'.repeat(32) }).getApprovalStatus()").unwrap();
    assert_eq!((absent["installed"].clone(), absent["approved"].clone()), (json!(false), json!(false)), "{absent}");
    let absent =
        attempt(&page, "return await new demo.pedelec.constructor({ extensionId: 'a'.repeat(32) }).listProviders()");
    assert_eq!(
        (absent["code"].clone(), absent["details"]["reason"].clone()),
        (json!("TRANSPORT_ERROR"), json!("extension_not_installed")),
        "{absent}"
    );

    // createSession waits on the approval the extension asks the user for.
    let created = page.eval_later("demo.attempt(() => demo.start())").expect("start");
    rig.answer_approval(&origin, "#approve").expect("click Approve on the extension's page");
    let created = created.wait(TURN).expect("createSession settles");
    let session_id = ok_value(created["result"]["value"].clone()).as_str().expect("a session id").to_owned();
    let status = page.eval("demo.pedelec.getApprovalStatus()").expect("status");
    assert_eq!((status["approved"].clone(), status["appConnected"].clone()), (json!(true), json!(true)), "{status}");
    assert_eq!(page.eval("demo.session().getStatus()").unwrap(), json!("idle"));

    // Send text: streamed deltas, then the complete message; the promise settles on completion.
    ok_value(attempt(&page, "await demo.send('hello from the browser')"));
    let state = page.eval("demo.state").unwrap();
    assert_eq!(state["chats"], json!(["You said: hello from the browser"]), "{state}");
    assert_eq!(state["deltas"], json!("You said: hello from the browser"), "deltas add up to the message: {state}");
    let statuses: Vec<String> = serde_json::from_value(state["statuses"].clone()).unwrap();
    assert_eq!(statuses.first().map(String::as_str), Some("sdk:running"), "{statuses:?}");
    assert_eq!(statuses.last().map(String::as_str), Some("core:idle"), "{statuses:?}");
    // The badge is painted on the next frame.
    page.wait_until("document.getElementById('status').textContent === 'idle'", Duration::from_secs(5))
        .expect("the status badge shows idle");

    // A frontend tool call answered by the page's async handler, visible in the DOM.
    ok_value(attempt(&page, r#"await demo.send('/tool update_counter {"delta": 3}')"#));
    let state = page.eval("demo.state").unwrap();
    assert_eq!((state["counter"].clone(), state["toolCalls"].clone()), (json!(3), json!(1)), "{state}");
    assert_eq!(state["chats"][1], json!(r#"Tool update_counter returned {"value":3}."#), "{state}");
    // Core's status event or the SDK's local one, whichever came first (they are de-duplicated).
    let waited =
        state["statuses"].as_array().unwrap().iter().filter(|s| s.as_str().unwrap().ends_with(":waiting_tool_result"));
    assert_eq!(waited.count(), 1, "{state}");
    assert_eq!(page.eval("document.getElementById('counter').textContent").unwrap(), json!("3"));

    // The npm package as an application ships it: a page bundled by vite
    // against the packed tarball (`cargo xtask web`) loads its wasm from the
    // bundle's assets and runs a tool turn on this approved origin.
    let bundled = Page::open(&rig.browser, &format!("{origin}/bundled/index.html")).expect("the bundled page opens");
    bundled.wait_until("window.bundled", Duration::from_secs(20)).expect("the bundled page loads the SDK from npm");
    let scripts = bundled.eval("[...document.scripts].map((s) => s.src)").unwrap();
    assert!(
        scripts
            .as_array()
            .is_some_and(|s| s.iter().all(|src| src.as_str().is_some_and(|u| u.contains("/bundled/assets/")))),
        "the page runs vite's bundle, not the package's own files: {scripts}"
    );
    let started = bundled.eval_for("bundled.start()", TURN).unwrap();
    assert_eq!(started["ok"], json!(true), "{started}");
    let turn = bundled.eval_for(r#"bundled.send('/tool update_counter {"delta": 5}')"#, TURN).unwrap();
    assert_eq!(turn["ok"], json!(true), "{turn}");
    let state = bundled.eval("bundled.state").unwrap();
    assert_eq!(state["counter"], json!(5), "{state}");
    assert_eq!(state["chats"], json!([r#"Tool update_counter returned {"value":5}."#]), "{state}");
    assert_eq!(bundled.eval("document.getElementById('counter').textContent").unwrap(), json!("5"));
    assert_eq!(bundled.eval_for("bundled.end()", TURN).unwrap()["ok"], json!(true));
    bundled.close().unwrap();

    // Through the content-script relay (what Firefox uses, forced here): the
    // same gate, the same session semantics.
    let relayed = Page::open(&rig.browser, &format!("{origin}/demo/index.html?channel=relay")).expect("relay page");
    relayed.wait_until("window.demo", Duration::from_secs(20)).expect("the relay page loads the SDK");
    let status = relayed.eval("demo.pedelec.getApprovalStatus()").unwrap();
    assert_eq!((status["installed"].clone(), status["approved"].clone()), (json!(true), json!(true)), "{status}");
    assert_eq!(status["origin"], json!(origin), "the origin is the browser's, through the relay: {status}");
    ok_value(attempt(&relayed, "return await demo.start()"));
    ok_value(attempt(&relayed, r#"await demo.send('/tool update_counter {"delta": 4}')"#));
    let state = relayed.eval("demo.state").unwrap();
    assert_eq!((state["counter"].clone(), state["toolCalls"].clone()), (json!(4), json!(1)), "{state}");
    assert_eq!(state["chats"][0], json!(r#"Tool update_counter returned {"value":4}."#), "{state}");
    ok_value(attempt(&relayed, "await demo.session().end()"));
    relayed.close().unwrap();

    // Usage arrives without touching chat or status handlers.
    assert!(page.eval("demo.session().usage.totalTokens").unwrap().as_u64().is_some_and(|n| n > 0));

    // prepare(): resolves, is idempotent, and its assistant text never reaches onChat.
    let prepared = ok_value(attempt(
        &page,
        r#"const s = demo.session(); const before = demo.state.chats.length;
           await Promise.all([s.prepare(), s.prepare()]); await s.prepare();
           return { chats: demo.state.chats.length - before, status: s.getStatus() };"#,
    ));
    assert_eq!(prepared, json!({ "chats": 0, "status": "idle" }));

    // Handler precedence and disposers: a named handler beats the inline one; a throw
    // becomes TOOL_HANDLER_ERROR for the agent; disposing restores the inline handler.
    let tools = ok_value(attempt(
        &page,
        r#"const s = demo.session();
           const off = s.onTool("echo", async () => { throw new Error("boom"); });
           await demo.send('/tool echo {"n": 1}');
           const failed = demo.state.chats.at(-1);
           off(); off();
           await demo.send('/tool echo {"n": 2}');
           return { failed, inline: demo.state.chats.at(-1) };"#,
    ));
    assert_eq!(
        tools,
        json!({ "failed": "Tool echo failed with TOOL_HANDLER_ERROR: boom.", "inline": r#"Tool echo returned {"n":2}."# })
    );

    // The client-level calls.
    let client = ok_value(attempt(
        &page,
        r#"const p = demo.pedelec;
           const providers = await p.listProviders();
           const settings = await p.getSettings();
           const availability = await p.checkAvailability();
           return { scripted: providers.some((x) => x.code === "scripted"), settings: typeof settings.defaultProvider,
                    availability };"#,
    ));
    assert_eq!(client, json!({ "scripted": true, "settings": "string", "availability": { "available": true } }));

    // Asset upload and read back (bytes over Core's loopback server, CORS for this origin).
    let assets = ok_value(attempt(
        &page,
        r#"const file = new File([JSON.stringify({ hello: "browser", n: 7 })], "report.json", { type: "application/json" });
           const path = await demo.upload(file, "/results/report.json");
           const s = demo.session();
           const asJson = await s.readAsset(path, "json");
           const asText = await s.readAsset(path, "text");
           const asFile = await s.readAsset(path, "file");
           const list = await s.listAssets();
           let bad = null;
           try { await s.readAsset("/../etc/passwd", "text"); } catch (e) { bad = e.code; }
           return { path, asJson, asText, fileName: asFile.name, fileType: asFile.type, fileSize: asFile.size,
                    list: list.map((a) => [a.path, a.name, a.size]), bad };"#,
    ));
    let body = r#"{"hello":"browser","n":7}"#;
    assert_eq!(assets["path"], json!("/results/report.json"), "{assets}");
    assert_eq!(assets["asJson"], json!({ "hello": "browser", "n": 7 }), "{assets}");
    assert_eq!(assets["asText"], json!(body), "{assets}");
    assert_eq!(assets["fileName"], json!("report.json"), "{assets}");
    assert_eq!(assets["fileSize"], json!(body.len()), "{assets}");
    assert_eq!(assets["list"], json!([["/results/report.json", "report.json", body.len()]]), "{assets}");
    assert_eq!(assets["bad"], json!("ASSET_PATH_INVALID"), "{assets}");

    // The uploaded file goes to the agent with a text; a bad attachment list is refused.
    let attached = ok_value(attempt(
        &page,
        r##"const s = demo.session();
           await s.sendText("summarise", { attachments: ["/results/report.json"] });
           let bad = null;
           try { await s.sendText("x", { attachments: ["/missing.json"] }); } catch (e) { bad = e.code; }
           let invalid = null;
           try { await s.sendText("x", { attachments: "/results/report.json" }); } catch (e) { invalid = e.code; }
           return { reply: demo.state.chats[demo.state.chats.length - 1], bad, invalid };"##,
    ));
    assert!(
        attached["reply"].as_str().unwrap_or_default().contains("Attachments: /results/report.json (application/json"),
        "{attached}"
    );
    assert_eq!(attached["bad"], json!("ASSET_NOT_FOUND"), "{attached}");
    assert_eq!(attached["invalid"], json!("INVALID_ARGUMENT"), "{attached}");

    // The transcript reads back in the page (the demo lists it page by page).
    let history = ok_value(attempt(
        &page,
        r##"const entries = await demo.loadHistory();
           const first = await demo.session().getHistory({ limit: 1 });
           let bad = null;
           try { await demo.session().getHistory({ limit: -1 }); } catch (e) { bad = e.code; }
           return { kinds: entries.map((e) => e.kind), ordered: entries.every((e, i) => i === 0 || entries[i - 1].id < e.id),
                    newest: first.entries.map((e) => e.kind), more: first.hasMore,
                    listed: document.querySelectorAll("#entries li").length, bad };"##,
    ));
    let kinds: Vec<&str> = history["kinds"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(kinds.contains(&"user_text") && kinds.contains(&"assistant_message"), "{history}");
    assert!(kinds.contains(&"tool_call") && kinds.contains(&"tool_result"), "{history}");
    assert_eq!(history["ordered"], json!(true), "{history}");
    assert_eq!(history["more"], json!(true), "{history}");
    assert_eq!(history["listed"], json!(kinds.len()), "{history}");
    assert_eq!(history["bad"], json!("INVALID_ARGUMENT"), "{history}");

    // The agent's activities reach onActivity (the demo lists them by id).
    let activity = ok_value(attempt(
        &page,
        r##"await demo.send("/plan look; report\n/command ls -la\nDone.");
           const all = Object.values(demo.state.activities);
           return { kinds: all.map((a) => a.kind), command: all.find((a) => a.kind === "command"),
                    items: document.querySelectorAll("#activities li").length };"##,
    ));
    assert_eq!(activity["kinds"], json!(["plan", "command"]), "{activity}");
    assert_eq!(activity["command"]["status"], json!("completed"), "{activity}");
    assert_eq!(activity["command"]["command"], json!("ls -la"), "{activity}");
    assert_eq!(activity["items"], json!(2), "{activity}");

    // The agent's request to edit a file of its workspace reaches the
    // page's onPermission, and the option the page chose reaches the agent.
    let permission = ok_value(attempt(
        &page,
        r##"demo.state.autoAnswer = "allow";
           await demo.send("/edit notes.md");
           const request = demo.state.permissions[demo.state.permissions.length - 1];
           delete demo.state.autoAnswer;
           return { reply: demo.state.chats[demo.state.chats.length - 1], paths: request.activity.paths,
                    options: request.options.map((o) => o.kind), policy: request.policyOptionId,
                    asked: demo.state.permissions.length };"##,
    ));
    assert_eq!(permission["reply"], json!("Permission to edit notes.md: answered allow."), "{permission}");
    assert_eq!(permission["paths"], json!(["notes.md"]), "{permission}");
    assert_eq!(permission["options"], json!(["allow_once", "reject_once"]), "{permission}");
    assert_eq!(permission["policy"], json!("deny"), "{permission}");
    // A command is not the page's to allow (issue 38): the page would say
    // yes, but the request goes to the user's prompt in the extension,
    // which names the site, the agent and the command.
    let asked = permission["asked"].clone();
    page.eval(r#"demo.state.autoAnswer = "allow"; window.commandTurn = demo.send("/permission rm -rf build"); true"#)
        .expect("send the command turn");
    let shown = rig.answer_user_permission("deny").expect("the user's prompt");
    assert_eq!(shown["origin"], json!(origin), "{shown}");
    assert_eq!(shown["agent"], json!("scripted"), "{shown}");
    assert_eq!(shown["command"], json!("rm -rf build"), "{shown}");
    let command = ok_value(attempt(
        &page,
        r##"await window.commandTurn;
           delete demo.state.autoAnswer;
           return { reply: demo.state.chats[demo.state.chats.length - 1], asked: demo.state.permissions.length };"##,
    ));
    assert_eq!(command["reply"], json!("Permission to run rm -rf build: answered deny."), "{command}");
    assert_eq!(command["asked"], asked, "the page was never asked about the command: {command}");

    // Cancel a slowly streaming turn from the page: the awaited sendText
    // rejects with OPERATION_CANCELLED, the status is idle when cancel()
    // resolves, the streamed text is kept as an interrupted message; and the
    // origin's sessions list holds this one.
    let cancel = ok_value(attempt(
        &page,
        r##"const s = demo.session();
           const turn = demo.sendInBackground("/slow 20\n" + "word ".repeat(100));
           while (!demo.state.deltas.includes("word")) await new Promise((r) => setTimeout(r, 5));
           await s.cancel();
           const status = s.getStatus();
           const outcome = await turn;
           const page = await s.getHistory({ limit: 5 });
           const interrupted = page.entries.filter((e) => e.kind === "assistant_message" && e.interrupted).length;
           await s.cancel();
           const sessions = await demo.listSessions();
           return { status, code: outcome.code, interrupted, afterIdle: s.getStatus(),
                    listed: sessions.some((x) => x.sessionId === s.sessionId && x.status === "idle"),
                    items: document.querySelectorAll("#session-list li").length };"##,
    ));
    assert_eq!(cancel["status"], json!("idle"), "{cancel}");
    assert_eq!(cancel["code"], json!("OPERATION_CANCELLED"), "{cancel}");
    assert_eq!(cancel["interrupted"], json!(1), "{cancel}");
    assert_eq!(cancel["afterIdle"], json!("idle"), "cancelling an idle session is a no-op: {cancel}");
    assert_eq!(cancel["listed"], json!(true), "{cancel}");
    assert!(cancel["items"].as_u64().unwrap_or(0) >= 1, "{cancel}");

    // Steer a running turn from the page, with the demo's Steer button: the
    // agent takes the text, the turn's one reply repeats it, and once the
    // turn is over steer() rejects with TURN_NOT_RUNNING.
    let steer = ok_value(attempt(
        &page,
        r##"const s = demo.session();
           const turn = demo.sendInBackground("/wait-steer 20000\nsteer me");
           while (document.getElementById("steer").disabled) await new Promise((r) => setTimeout(r, 5));
           document.getElementById("text").value = "and the otter";
           document.getElementById("steer").click();
           const outcome = await turn;
           let late = null;
           try { await s.steer("too late"); } catch (e) { late = e.code; }
           return { ok: outcome.ok, reply: demo.state.chats[demo.state.chats.length - 1], late };"##,
    ));
    assert_eq!(steer["ok"], json!(true), "{steer}");
    assert_eq!(steer["reply"], json!("You said: steer me You added: and the otter."), "{steer}");
    assert_eq!(steer["late"], json!("TURN_NOT_RUNNING"), "{steer}");

    // What a turn changed: the agent writes a file, the demo's Changes
    // button lists it with its diff; a secret-looking file shows no content.
    let changes = ok_value(attempt(
        &page,
        r##"await demo.sendInBackground("/write review/notes.md first\\nsecond\n/write .env TOKEN=hunter2");
           document.getElementById("changes").click();
           while (!document.querySelector("#change-list li")) await new Promise((r) => setTimeout(r, 5));
           const changes = await demo.session().getChanges();
           return { files: changes.files.map((f) => [f.kind, f.path, f.secret]), diff: changes.files[1].diff,
                    shown: document.getElementById("change-list").textContent, inProgress: changes.inProgress };"##,
    ));
    assert_eq!(
        changes["files"],
        json!([["created", ".env", true], ["created", "review/notes.md", false]]),
        "{changes}"
    );
    assert_eq!(
        changes["diff"],
        json!(
            "--- a/review/notes.md\n+++ b/review/notes.md\n@@ -0,0 +1,2 @@\n+first\n+second\n\\ No newline at end of file\n"
        ),
        "{changes}"
    );
    assert_eq!(changes["inProgress"], json!(false), "{changes}");

    // Another model from the next turn, set with the demo's Model field.
    let model = ok_value(attempt(
        &page,
        r##"document.getElementById("model").value = "scripted-text-only";
           document.getElementById("set-model").click();
           while (!document.getElementById("log").textContent.includes("model for the next turns: scripted-text-only"))
             await new Promise((r) => setTimeout(r, 5));
           const s = demo.session();
           let bad = null;
           try { await s.setModel("--yolo"); } catch (e) { bad = e.code; }
           await demo.sendInBackground("after the switch");
           const page = await s.getHistory({ limit: 20 });
           const changed = page.entries.filter((e) => e.kind === "model_changed").map((e) => e.model);
           return { bad, changed };"##,
    ));
    assert_eq!(model["bad"], json!("INVALID_ARGUMENT"), "{model}");
    assert_eq!(model["changed"], json!(["scripted-text-only"]), "{model}");
    assert!(!changes["shown"].as_str().unwrap_or_default().contains("hunter2"), "{changes}");

    // The demo's Fork button: the page drives a new session continuing the
    // old one, whose tool handler (the page's counter) answers its calls.
    let forked = ok_value(attempt(
        &page,
        r##"const parent = demo.session().sessionId;
           const counter = demo.state.counter;
           // The button follows the painted status, a frame behind the turn's end.
           while (document.getElementById("fork").disabled) await new Promise((r) => setTimeout(r, 5));
           document.getElementById("fork").click();
           while (demo.session().sessionId === parent) await new Promise((r) => setTimeout(r, 5));
           await demo.send('/tool update_counter {"delta": 3}');
           const listed = (await demo.pedelec.listSessions()).map((s) => s.sessionId);
           return { parent, fork: demo.session().sessionId, added: demo.state.counter - counter,
                    both: listed.includes(parent) && listed.includes(demo.session().sessionId) };"##,
    ));
    assert_ne!(forked["fork"], forked["parent"], "{forked}");
    // A typed turn through the demo's Send typed button: the value comes
    // back; an answer that never fits rejects with OUTPUT_INVALID.
    let typed = ok_value(attempt(
        &page,
        r##"document.getElementById("text").value = '/answer {"title": "Pedelec"}';
           while (document.getElementById("send-typed").disabled) await new Promise((r) => setTimeout(r, 5));
           document.getElementById("send-typed").click();
           while (!document.getElementById("log").textContent.includes('value: {"title":"Pedelec"}'))
             await new Promise((r) => setTimeout(r, 5));
           let invalid = null;
           try { await demo.sendTyped("/answer 42", { type: "object" }); } catch (e) { invalid = [e.code, e.details.errors]; }
           let bad = null;
           try { await demo.session().sendText("x", { outputSchema: [1] }); } catch (e) { bad = e.code; }
           // onError heard the failed turn too; later checks expect no errors.
           const heard = demo.state.errors.filter((e) => e === "core:OUTPUT_INVALID").length;
           demo.state.errors = demo.state.errors.filter((e) => e !== "core:OUTPUT_INVALID");
           return { invalid, bad, heard };"##,
    ));
    assert_eq!(typed["invalid"][0], json!("OUTPUT_INVALID"), "{typed}");
    assert!(typed["invalid"][1].as_array().is_some_and(|e| !e.is_empty()), "{typed}");
    assert_eq!(typed["bad"], json!("INVALID_ARGUMENT"), "{typed}");
    assert_eq!(typed["heard"], json!(1), "{typed}");
    assert_eq!(forked["added"], json!(3), "{forked}");
    assert_eq!(forked["both"], json!(true), "{forked}");

    // Events ready together travel as batches, and a batch changes nothing
    // the page sees: every delta once and in order, one onChat per message.
    let worker = attach_worker(&rig);
    let messages_before = worker.eval("pedelecStats.hostMessages").unwrap().as_u64().unwrap();
    let streamed = ok_value(attempt(
        &page,
        "const before = demo.state.deltas.length; const chats = demo.state.chats.length; \
         await demo.send('/deltas 5000'); \
         return { deltas: demo.state.deltas.slice(before), chats: demo.state.chats.slice(chats) }",
    ));
    let messages = worker.eval("pedelecStats.hostMessages").unwrap().as_u64().unwrap() - messages_before;
    worker.detach().expect("detach from the worker");
    let deltas = streamed["deltas"].as_str().unwrap().to_owned();
    assert_eq!(deltas.len(), 5000, "every delta arrived once");
    assert_eq!(streamed["chats"], json!([deltas]), "one onChat, the deltas in order add up to it");
    assert!(messages < 500, "5 000 deltas took {messages} native-messaging messages: they were not batched");

    // A tool given as a WebMCP descriptor (`execute`, `inputSchema`,
    // `annotations`) is a frontend tool like any other: the agent's call
    // reaches `execute` and its result comes back.
    let webmcp = ok_value(attempt(
        &page,
        r##"const s = await demo.pedelec.createSession({ provider: "scripted", tools: [{
             name: "page_title", description: "The page's title",
             inputSchema: { type: "object", properties: { upper: { type: "boolean" } } },
             annotations: { readOnlyHint: true },
             execute: async (args) => ({ title: args.upper ? document.title.toUpperCase() : document.title }),
           }] });
           let reply = null;
           s.onChat((text) => { reply = text; });
           await s.sendText('/tool page_title {"upper":true}');
           const first = reply;
           // Between turns the page swaps its tools (as after a WebMCP toolchange).
           await s.setTools([{ name: "page_url", description: "The page's address", execute: () => location.pathname }]);
           await s.sendText("/tool page_url {}");
           const swapped = reply;
           await s.sendText("/tool page_title {}");
           await s.end();
           return { reply: first, swapped, gone: reply, title: document.title, path: location.pathname };"##,
    ));
    let path = webmcp["path"].as_str().unwrap_or_default();
    assert_eq!(webmcp["swapped"], json!(format!("Tool page_url returned {}.", json!(path))), "{webmcp}");
    assert!(webmcp["gone"].as_str().unwrap_or_default().contains("TOOL_NOT_FOUND"), "{webmcp}");
    let title = webmcp["title"].as_str().unwrap_or_default().to_uppercase();
    assert_eq!(webmcp["reply"], json!(format!("Tool page_title returned {}.", json!({ "title": title }))), "{webmcp}");
    // `annotations.readOnlyHint` reached Core: the user's activity log tags
    // that tool's call read-only, and not the tool that replaced it.
    let calls: Vec<(String, bool)> = activity_of(&rig, &rig.site.origin())
        .into_iter()
        .filter(|e| e.kind == pb::ActivityLogKind::ToolCalled as i32)
        .map(|e| (e.summary, e.read_only))
        .collect();
    assert!(calls.contains(&("called page_title".to_owned(), true)), "{calls:?}");
    assert!(calls.contains(&("called page_url".to_owned(), false)), "{calls:?}");

    // bridgeModelContext: the tools the page registers with WebMCP (here
    // the draft's API, polyfilled) become the session's and follow its
    // toolchange events; a change during a turn lands when the turn ends.
    page.eval(include_str!("../js/webmcp-polyfill.js")).expect("the WebMCP polyfill installs");
    let first = ok_value(attempt(
        &page,
        r##"const mc = document.modelContext;
           let missing = null;
           try { await demo.pedelec.bridgeModelContext(demo.session(), { modelContext: {} }); } catch (e) { missing = e.code; }
           const s = await demo.pedelec.createSession({ provider: "scripted" });
           const b = (window.bridgeTest = { s, reply: null, pageTitle: new AbortController() });
           s.onChat((text) => { b.reply = text; });
           mc.registerTool({ name: "page_title", description: "The page's title", annotations: { readOnlyHint: true },
                             execute: async () => ({ title: document.title }) }, { signal: b.pageTitle.signal });
           b.bridge = await demo.pedelec.bridgeModelContext(s);
           await s.sendText("/tool page_title {}");
           return { missing, first: b.reply };"##,
    ));
    let mut bridged = ok_value(attempt(
        &page,
        r##"const mc = document.modelContext;
           const b = window.bridgeTest;
           const s = b.s;
           // Registered mid-turn: applied once the turn is over.
           const turn = s.sendText("/wait-steer 300\nwait");
           while (s.getStatus() !== "running") await new Promise((r) => setTimeout(r, 5));
           mc.registerTool({ name: "page_path", description: "The page's path", execute: () => location.pathname });
           await turn;
           await b.bridge.whenSynced();
           await s.sendText("/tool page_path {}");
           const added = b.reply;
           b.pageTitle.abort();
           await b.bridge.whenSynced();
           await s.sendText("/tool page_title {}");
           const removed = b.reply;
           b.bridge.stop();
           mc.registerTool({ name: "late", description: "After stop", execute: () => 1 });
           await b.bridge.whenSynced();
           await s.sendText("/tool late {}");
           const stopped = b.reply;
           await s.end();
           return { added, removed, stopped, title: document.title, path: location.pathname };"##,
    ));
    bridged["missing"] = first["missing"].clone();
    bridged["first"] = first["first"].clone();
    assert_eq!(bridged["missing"], json!("MODEL_CONTEXT_UNAVAILABLE"), "{bridged}");
    let title = bridged["title"].as_str().unwrap_or_default();
    assert_eq!(
        bridged["first"],
        json!(format!("Tool page_title returned {}.", json!({ "title": title }))),
        "{bridged}"
    );
    let path = bridged["path"].as_str().unwrap_or_default();
    assert_eq!(bridged["added"], json!(format!("Tool page_path returned {}.", json!(path))), "{bridged}");
    assert!(bridged["removed"].as_str().unwrap_or_default().contains("TOOL_NOT_FOUND"), "{bridged}");
    assert!(bridged["stopped"].as_str().unwrap_or_default().contains("TOOL_NOT_FOUND"), "{bridged}");

    // A session the page keeps no reference to (its handlers do the work)
    // survives garbage collection: the client holds it until it ends, so
    // its subscription stays and Core does not auto-end it.
    let unreferenced = ok_value(attempt(
        &page,
        r##"const s = await demo.pedelec.createSession({ provider: "scripted" });
           s.onChat(() => {});
           return s.sessionId;"##,
    ));
    let unreferenced = unreferenced.as_str().expect("a session id").to_owned();
    rig.browser.call("HeapProfiler.collectGarbage", json!({}), Some(&page.session)).expect("collect garbage");
    std::thread::sleep(GRACE + Duration::from_millis(1500));
    rig.browser.call("HeapProfiler.collectGarbage", json!({}), Some(&page.session)).expect("collect garbage");
    let still = ok_value(attempt(
        &page,
        &format!(
            r##"const all = await demo.pedelec.listSessions();
                    return all.find((x) => x.sessionId === "{unreferenced}")?.status ?? "gone";"##
        ),
    ));
    assert_eq!(still, json!("idle"), "an unreferenced live session is not lost to garbage collection");

    // The extension's service worker is stopped: the page's port and its host go
    // with it; the SDK reopens the port, the worker starts again (approval from
    // chrome.storage), re-subscribes, and the same handle keeps working.
    let worker = format!("chrome-extension://{EXTENSION_ID}/background.js");
    let is_worker = |t: &Value| t["type"] == json!("service_worker") && t["url"].as_str() == Some(worker.as_str());
    let before = rig.browser.wait_for_target("the service worker", is_worker).unwrap()["targetId"].clone();
    rig.browser.call("Target.closeTarget", json!({ "targetId": before }), None).expect("stop the worker");
    ok_value(attempt(&page, "await new Promise((r) => setTimeout(r, 300)); await demo.send('after the restart')"));
    let after = rig.browser.wait_for_target("the restarted worker", is_worker).unwrap()["targetId"].clone();
    assert_ne!(before, after, "the worker really restarted");
    let state = page.eval("demo.state").unwrap();
    assert_eq!(state["chats"].as_array().unwrap().last(), Some(&json!("You said: after the restart")), "{state}");
    assert_eq!(state["errors"], json!([]), "the handle never detached: {state}");

    // The native host dies (as when Core goes away): the extension reconnects
    // with backoff and re-subscribes; the page's handle keeps working.
    // The worker's own host for an owner call (reading consent at its
    // restart) lives only until Core answered; then the page's is the one.
    let mut hosts = native_host_pids(rig.browser.pid());
    for _ in 0..100 {
        if hosts.len() == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        hosts = native_host_pids(rig.browser.pid());
    }
    assert_eq!(hosts.len(), 1, "one host for the one open page: {hosts:?}");
    // SAFETY: plain kill(2) of a process this test's browser started.
    assert_eq!(unsafe { libc::kill(hosts[0] as i32, libc::SIGKILL) }, 0);
    ok_value(attempt(&page, "await new Promise((r) => setTimeout(r, 300)); await demo.send('after the host died')"));
    let replaced = native_host_pids(rig.browser.pid());
    assert!(replaced.len() == 1 && replaced[0] != hosts[0], "a fresh host: {hosts:?} → {replaced:?}");
    let state = page.eval("demo.state").unwrap();
    assert_eq!(state["chats"].as_array().unwrap().last(), Some(&json!("You said: after the host died")), "{state}");
    assert_eq!(state["errors"], json!([]), "the handle never detached: {state}");

    // End, then resume the same handle and use it again.
    let lifecycle = ok_value(attempt(
        &page,
        r#"const s = demo.session();
           await s.end();
           const afterEnd = s.getStatus();
           let refused = null;
           try { await s.sendText("too late"); } catch (e) { refused = e.code; }
           await s.resume();
           const afterResume = s.getStatus();
           await demo.send("back again");
           return { afterEnd, refused, afterResume, ended: demo.state.ended, last: demo.state.chats.at(-1) };"#,
    ));
    assert_eq!(
        lifecycle,
        json!({ "afterEnd": "ended", "refused": "SESSION_ENDED", "afterResume": "idle", "ended": 1,
                "last": "You said: back again" }),
    );

    let shot = workspace_root().join("target/web-e2e/demo.png");
    page.screenshot(&shot).expect("screenshot");
    assert!(std::fs::metadata(&shot).map(|m| m.len() > 1000).unwrap_or(false), "a real PNG at {}", shot.display());

    // Another origin (another port) is refused when the user rejects it, and gets no session.
    let other = rig.open_demo(&rig.other_site).expect("second origin loads");
    let refused = other.eval_later("demo.attempt(() => demo.start())").expect("start");
    rig.answer_approval(&rig.other_site.origin(), "#reject").expect("click Reject");
    let refused = refused.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(refused["ok"], json!(false), "{refused}");
    assert_eq!(refused["code"], json!("ORIGIN_NOT_ALLOWED"), "{refused}");
    assert_eq!(refused["details"]["reason"], json!("rejected"), "{refused}");
    // Later requests on that page are refused without reopening the prompt.
    let again = attempt(&other, "return await demo.pedelec.listProviders()");
    assert_eq!(again["code"], json!("ORIGIN_NOT_ALLOWED"), "{again}");
    // And the approved origin's session stays out of its reach even with the id.
    let stolen = attempt(&other, &format!("return (await demo.pedelec.resumeSession('{session_id}')).getStatus()"));
    assert_eq!(stolen["ok"], json!(false), "{stolen}");
    other.close().unwrap();

    // Nobody answers the prompt: it times out (shortened through the worker's storage) and
    // the request is refused with reason "timeout"; the prompt tab is closed.
    // The rejection's cooldown (shortened too) has to pass first.
    let worker_target = rig.browser.wait_for_target("the service worker", is_worker).unwrap();
    let worker_page = Page::attach(&rig.browser, worker_target["targetId"].as_str().unwrap()).unwrap();
    worker_page
        .eval("chrome.storage.local.set({ approvalTimeoutMs: 800, promptCooldownMs: 1000 })")
        .expect("shorten the approval timeout and the cooldown");
    std::thread::sleep(Duration::from_millis(1100));
    let other = rig.open_demo(&rig.other_site).expect("second origin, new page");
    let timed_out = attempt(&other, "return await demo.start()");
    assert_eq!(
        (timed_out["code"].clone(), timed_out["details"]["reason"].clone()),
        (json!("ORIGIN_NOT_ALLOWED"), json!("timeout")),
        "{timed_out}"
    );
    let prompt = format!("approve.html?origin={}", rig.other_site.origin().replace(':', "%3A").replace('/', "%2F"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while rig.browser.targets().unwrap().iter().any(|t| t["url"].as_str().is_some_and(|u| u.ends_with(&prompt))) {
        assert!(Instant::now() < deadline, "the timed-out prompt tab is still open");
        std::thread::sleep(Duration::from_millis(50));
    }
    other.close().unwrap();
    // The prompts below wait for their buttons to arm (750 ms): the usual timeout again.
    worker_page.eval("chrome.storage.local.remove('approvalTimeoutMs')").expect("restore the approval timeout");

    // Closing the page ends its session: auto end on disconnect, enforced and recorded by Core.
    assert_eq!(core_status(&rig, &origin, &session_id), SessionStatus::Idle);
    page.close().expect("close the demo tab");
    wait_for_core_end(&rig, &origin, &session_id);

    // Revoke: the approved origin is listed; revoking ends its live sessions and cuts its pages off.
    let page = rig.open_demo(&rig.site).expect("demo page again");
    // The README's browser snippet, as it stands there, on this approved page.
    let readme = include_str!("../../../README.md");
    let start = readme.find("```js\n").expect("the README has a js snippet") + "```js\n".len();
    let snippet = &readme[start..start + readme[start..].find("```").expect("the snippet ends")];
    let import = r#"import init, { Pedelec } from "./pkg/pedelec_sdk.js";"#;
    assert!(snippet.contains(import), "the snippet imports the package: {snippet}");
    let body = snippet.replace(import, r#"const { default: init, Pedelec } = await import("/pkg/pedelec_sdk.js");"#);
    // pedelec.d.ts's other half (tsc checks the first, `cargo xtask
    // web-typecheck`): every member it declares on the two classes exists on
    // the real objects the snippet made.
    let declared = declared_members(include_str!("../../pedelec-sdk/web/pedelec.d.ts"));
    let ran = attempt(
        &page,
        &format!(
            "let value = 0; const counter = {{ add: (d) => (value += d) }};
             const live = []; const transcript = {{ appendLive: (d) => live.push(d) }};
             {body}
             const declared = {declared};
             const missing = [
               ...declared.Pedelec.filter((n) => !(n in pedelec)).map((n) => `Pedelec.${{n}}`),
               ...declared.PedelecSession.filter((n) => !(n in session)).map((n) => `PedelecSession.${{n}}`),
             ];
             await session.end();
             return {{ live: live.join('').length > 0, missing }};"
        ),
    );
    assert_eq!(
        ran,
        json!({ "ok": true, "value": { "live": true, "missing": [] } }),
        "the README snippet runs, and every declared member exists: {ran}"
    );

    // Workspace grants: a folder the user has not granted this origin is
    // asked for (origin and path shown), granted or refused; a grant can
    // be revoked on the manager page, and then it is asked for again.
    let area = tempfile::tempdir().expect("tempdir");
    let project = area.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    let project = project.display().to_string();
    let in_folder = |path: &str| {
        format!(
            "demo.attempt(async () => {{ const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{path}' }} }}); await s.end(); return s.sessionId; }})"
        )
    };
    // The demo page's folder field: its session asks for the folder first.
    let from_demo = format!(
        "document.getElementById('folder').value = '{project}';
         demo.attempt(async () => {{ const id = await demo.start(); document.getElementById('folder').value = ''; return id; }})"
    );
    let asked = page.eval_later(&from_demo).unwrap();
    rig.answer_grant(&origin, &project, "#grant").expect("grant the folder");
    let granted = asked.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(granted["ok"], json!(true), "{granted}");
    ok_value(attempt(&page, "await demo.session().end(); return demo.state.ended;"));
    assert!(
        std::path::Path::new(&project).join(".pedelec-runtime").is_dir(),
        "the session worked in the granted folder"
    );
    // Inside the grant: no prompt. Its parent: asked, refused, nothing created.
    let inside = attempt(
        &page,
        &format!(
            "const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{project}/src' }} }}); await s.end(); return s.sessionId;"
        ),
    );
    assert_eq!(inside["ok"], json!(true), "{inside}");
    let parent = area.path().canonicalize().unwrap().display().to_string();
    let asked = page.eval_later(&in_folder(&parent)).unwrap();
    rig.answer_grant(&origin, &parent, "#refuse-grant").expect("refuse the parent");
    let refused = asked.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(refused["code"], json!("WORKSPACE_NOT_ALLOWED"), "{refused}");
    assert!(!area.path().join(".pedelec-runtime").exists(), "nothing written in a refused folder");
    // The home directory is never offered as a grant: the prompt can only refuse it.
    let home = std::env::var("HOME").expect("HOME");
    let asked = page.eval_later(&in_folder(&home)).unwrap();
    rig.answer_grant(&origin, &home, "#refuse-grant").expect("refuse the home directory");
    let never = asked.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(never["code"], json!("WORKSPACE_NOT_ALLOWED"), "{never}");
    // Revoked on the manager page: asked again.
    let manager = rig.open_manager().expect("manager page");
    let grant_button = format!("button.revoke-grant[data-root=\"{project}\"]");
    manager
        .wait_until(
            &format!("document.querySelector('{}')", grant_button.replace('\'', "\\'")),
            Duration::from_secs(10),
        )
        .expect("the grant is listed");
    manager.click(&grant_button).expect("revoke the grant");
    manager
        .wait_until(
            &format!("!document.querySelector('{}')", grant_button.replace('\'', "\\'")),
            Duration::from_secs(10),
        )
        .expect("the grant is gone");
    manager.close().unwrap();
    let asked = page.eval_later(&in_folder(&project)).unwrap();
    rig.answer_grant(&origin, &project, "#refuse-grant").expect("asked again after the revoke");
    let again = asked.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(again["code"], json!("WORKSPACE_NOT_ALLOWED"), "{again}");

    let second = ok_value(attempt(&page, "return await demo.start({ autoEndOnDisconnect: false })"));
    let second = second.as_str().expect("second session id").to_owned();
    // Another tab of the same origin re-attaches to it: the handle is synchronised from Core first.
    let twin = rig.open_demo(&rig.site).expect("a second tab of the approved origin");
    let reattached = ok_value(attempt(
        &twin,
        &format!(
            "const s = await demo.pedelec.resumeSession('{second}'); let chat = null; s.onChat((t) => {{ chat = t; }});
             await s.sendText('from the twin'); return {{ id: s.sessionId, status: s.getStatus(), chat }};"
        ),
    ));
    assert_eq!(reattached, json!({ "id": second, "status": "idle", "chat": "You said: from the twin" }));
    twin.close().unwrap();
    let manager = rig.open_manager().expect("approval page in manage mode");
    let listed = format!("document.querySelector('button.revoke[data-origin=\"{origin}\"]')");
    manager.wait_until(&listed, Duration::from_secs(10)).expect("the origin is listed as approved");
    manager.click(&format!("button.revoke[data-origin=\"{origin}\"]")).expect("click Revoke");
    page.wait_until("demo.state.ended === 2", Duration::from_secs(15)).expect("the page sees its session end");
    wait_for_core_end(&rig, &origin, &second);
    let status = page.eval("demo.pedelec.getApprovalStatus()").unwrap();
    assert_eq!(status["approved"], json!(false), "{status}");
    assert_revoked_quietly(&rig, &page, &origin);
    // Again, twice: approve, start a session, revoke. Every time the page
    // sees `ended`, its handle refuses at once, and nothing prompts.
    for round in 2..=3 {
        let pending = page.eval_later("demo.attempt(() => demo.start({ autoEndOnDisconnect: false }))").unwrap();
        rig.answer_approval(&origin, "#approve").expect("approve again");
        let id = ok_value(pending.wait(TURN).expect("start after re-approval")["result"]["value"].clone());
        let id = id.as_str().expect("session id").to_owned();
        let manager = rig.open_manager().expect("approval page in manage mode");
        manager.wait_until(&listed, Duration::from_secs(10)).expect("the origin is listed again");
        manager.click(&format!("button.revoke[data-origin=\"{origin}\"]")).expect("click Revoke");
        page.wait_until(&format!("demo.state.ended === {}", round + 1), Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("round {round}: the page sees its session end: {e}"));
        wait_for_core_end(&rig, &origin, &id);
        assert_revoked_quietly(&rig, &page, &origin);
    }

    // No script error escaped on the pages.
    let exceptions: Vec<Value> =
        rig.browser.events().into_iter().filter(|e| e["method"] == json!("Runtime.exceptionThrown")).collect();
    assert!(exceptions.is_empty(), "uncaught page exceptions: {exceptions:?}");
}

/// The ids of the sessions Core keeps for the page's origin, asked with a
/// raw `listSessions` frame (Core's own answer, not the SDK's).
fn listed_sessions(page: &Page<'_>) -> Vec<String> {
    let frames = json!([{ "requestId": 9100, "request": { "listSessions": {} } }]);
    let sent = page.eval_for(&format!("({RAW_FRAMES_JS})({frames}, 10000)"), TURN).expect("listSessions");
    let reply = &sent["replies"][0];
    let sessions = reply["response"]["listSessions"]["sessions"].as_array().unwrap_or_else(|| panic!("{reply}"));
    sessions.iter().map(|s| s["session"]["sessionId"].as_str().unwrap().to_owned()).collect()
}

/// Whether an approval tab whose url contains `query` is open.
fn prompt_open(rig: &Rig, query: &str) -> bool {
    rig.browser
        .targets()
        .unwrap()
        .iter()
        .any(|t| t["url"].as_str().is_some_and(|u| u.contains("/approve.html") && u.contains(query)))
}

/// Issue 38, "Consent that holds": a page on an approved origin cannot get
/// past the folder grant by spelling its request the proto way, nor send
/// a call or a field the extension does not list; a page cannot force the
/// user's hand with prompts (a rejected site cools down, a prompt's buttons
/// wait for the user's attention, a home or a root is never offered).
/// `demo.start(options)` on `page` of the rig's site, the user approving the
/// site when the extension asks: the new session's id.
fn started_after_approval(rig: &Rig, page: &Page, options: &str) -> Value {
    let created = page.eval_later(&format!("demo.attempt(() => demo.start({options}))")).expect("start");
    rig.answer_approval(&rig.site.origin(), "#approve").expect("click Approve on the extension's page");
    ok_value(created.wait(TURN).expect("createSession settles")["result"]["value"].clone())
}

#[test]
fn browser_refuses_forged_requests_and_forced_prompts() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("demo page loads the wasm SDK");
    started_after_approval(&rig, &page, "");

    // Forged frames from the approved page: each refused by the extension
    // with INVALID_ARGUMENT naming the field; no session, no prompt.
    let area = tempfile::tempdir().expect("tempdir");
    let folder = area.path().canonicalize().unwrap().display().to_string();
    let before = listed_sessions(&page);
    let forged = forged_frames(&folder);
    let frames = serde_json::Value::Array(forged.iter().map(|(f, _)| f.clone()).collect());
    let sent = page.eval_for(&format!("({RAW_FRAMES_JS})({frames}, 3000)"), TURN).expect("the page sends raw frames");
    assert_forged_refused(&sent, &forged);
    assert_eq!(listed_sessions(&page), before, "no session was created");
    assert!(!area.path().join(".pedelec-runtime").exists(), "nothing opened in the forged folder");
    assert!(!prompt_open(&rig, "path="), "no workspace prompt opened");

    // Prompts. The buttons wait for the tab to be in front and focused for
    // 750 ms; 2 s here, so that a loaded machine cannot make the early
    // click below come late.
    let worker = format!("chrome-extension://{EXTENSION_ID}/background.js");
    let worker = rig
        .browser
        .wait_for_target("the service worker", |t| {
            t["type"] == json!("service_worker") && t["url"].as_str() == Some(worker.as_str())
        })
        .unwrap();
    let worker = Page::attach(&rig.browser, worker["targetId"].as_str().unwrap()).unwrap();
    worker.eval("chrome.storage.local.set({ promptArmMs: 2000 })").expect("set the arming time");
    worker.detach().unwrap();
    let other_origin = rig.other_site.origin();
    let other = rig.open_demo(&rig.other_site).expect("second origin loads");
    let refused = other.eval_later("demo.attempt(() => demo.start())").expect("start");
    let url = format!("chrome-extension://{EXTENSION_ID}/approve.html?origin={}", encode_component(&other_origin));
    let target = rig.browser.wait_for_target("the approval page", |t| t["url"].as_str() == Some(url.as_str())).unwrap();
    let prompt = Page::attach(&rig.browser, target["targetId"].as_str().unwrap()).unwrap();
    prompt.wait_until("!document.getElementById('request').hidden", Duration::from_secs(10)).unwrap();
    // A click as soon as it shows (a double-click meant for the page) does nothing.
    prompt.click("#reject").expect("an early click");
    std::thread::sleep(Duration::from_millis(300));
    let early = prompt
        .eval(
            "(async () => ({ outcome: document.getElementById('outcome').textContent,
                disabled: document.getElementById('reject').disabled,
                pending: (await chrome.runtime.sendMessage({ type: 'list' })).pending }))()",
        )
        .unwrap_or_else(|e| panic!("the early click landed: the prompt is gone ({e})"));
    assert_eq!(early, json!({ "outcome": "", "disabled": true, "pending": [other_origin] }), "the early click landed");
    // One prompt at a time: a folder the approved page asks for meanwhile waits behind this one.
    let waiting_dir = tempfile::tempdir().expect("tempdir");
    let waiting_path = waiting_dir.path().canonicalize().unwrap().display().to_string();
    let waiting = page
        .eval_later(&format!(
            "demo.attempt(async () => {{ const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{waiting_path}' }} }}); await s.end(); return s.sessionId; }})"
        ))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!prompt_open(&rig, "path="), "a second prompt opened while one was open");
    // The attention must last: armed, then another tab in front disarms the
    // prompt, and back in front it waits the whole time again.
    let front = |tab: &Page<'_>| rig.browser.call("Page.bringToFront", json!({}), Some(&tab.session)).unwrap();
    let disabled = "document.getElementById('reject').disabled";
    front(&prompt);
    prompt.wait_until(&format!("!{disabled}"), Duration::from_secs(10)).expect("the prompt arms");
    front(&other);
    prompt.wait_until(disabled, Duration::from_secs(5)).expect("another tab in front disarms the prompt");
    front(&prompt);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(prompt.eval(disabled).unwrap(), json!(true), "back in front, the prompt armed before its time");
    // The same click once the prompt has had the user's attention long enough.
    rig.answer_approval(&other_origin, "#reject").expect("click Reject once armed");
    let refused = refused.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(
        (refused["code"].clone(), refused["details"]["reason"].clone()),
        (json!("ORIGIN_NOT_ALLOWED"), json!("rejected")),
        "{refused}"
    );
    other.close().unwrap();

    // The rejected origin cannot reopen the prompt at once, even from a fresh page.
    let again = rig.open_demo(&rig.other_site).expect("second origin, new page");
    let cooled = again
        .eval_for("demo.attempt(async () => { return await demo.start(); })", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no cooldown: the rejected origin's request waits on a new prompt ({e})"));
    assert_eq!(
        (cooled["code"].clone(), cooled["details"]["reason"].clone()),
        (json!("ORIGIN_NOT_ALLOWED"), json!("cooldown")),
        "{cooled}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(!prompt_open(&rig, &encode_component(&other_origin)), "no prompt during the cooldown");
    again.close().unwrap();
    // Nor can another origin of the same site (here another port of 127.0.0.1).
    let sibling = pedelec_web_e2e::server::StaticServer::start(&pedelec_web_e2e::web_dir()).unwrap();
    let cousin = rig.open_demo(&sibling).expect("a third origin of the same site loads");
    let cooled = cousin
        .eval_for("demo.attempt(async () => { return await demo.start(); })", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no cooldown for the site: the sibling origin waits on a new prompt ({e})"));
    assert_eq!(cooled["details"]["reason"], json!("cooldown"), "{cooled}");
    cousin.close().unwrap();

    // The folder request that waited opens its prompt once the first one closed.
    rig.answer_grant(&origin, &waiting_path, "#refuse-grant").expect("the waiting folder prompt opens");
    let waited = waiting.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(waited["code"], json!("WORKSPACE_NOT_ALLOWED"), "{waited}");

    // A folder in the home directory: its parent (the home) is not offered,
    // and the worker refuses it when asked anyway.
    let home = std::env::var("HOME").expect("HOME");
    let in_home = format!("{}/pedelec-issue-38", home.trim_end_matches('/'));
    let asked = page
        .eval_later(&format!(
            "demo.attempt(async () => {{ const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{in_home}' }} }}); await s.end(); return s.sessionId; }})"
        ))
        .unwrap();
    let query = format!("origin={}&path={}", encode_component(&origin), encode_component(&in_home));
    let url = format!("chrome-extension://{EXTENSION_ID}/approve.html?{query}");
    let target = rig.browser.wait_for_target("the folder prompt", |t| t["url"].as_str() == Some(url.as_str())).unwrap();
    let prompt = Page::attach(&rig.browser, target["targetId"].as_str().unwrap()).unwrap();
    prompt.wait_until("!document.getElementById('grant-request').hidden", Duration::from_secs(10)).unwrap();
    assert_eq!(
        prompt.eval("document.getElementById('grant-parent').hidden").unwrap(),
        json!(true),
        "the home is offered"
    );
    // A granted folder closes the prompt, so no answer at all means the worker granted it.
    let forced = prompt
        .eval_for(
            &format!(
                "chrome.runtime.sendMessage({{ type: 'grant', origin: {}, path: {}, root: {} }})",
                json!(origin),
                json!(in_home),
                json!(home)
            ),
            Duration::from_secs(5),
        )
        .unwrap_or_else(|e| panic!("the worker granted the home: the prompt closed ({e})"));
    assert_eq!(forced["ok"], json!(false), "the worker granted the home: {forced}");
    rig.answer_grant(&origin, &in_home, "#refuse-grant").expect("refuse the folder");
    let refused = asked.wait(TURN).expect("createSession settles")["result"]["value"].clone();
    assert_eq!(refused["code"], json!("WORKSPACE_NOT_ALLOWED"), "{refused}");
    assert_eq!(refused["details"]["reason"], json!("refused"), "{refused}");
}

/// The toolbar badge, read from the extension's worker: how many sessions run a turn.
fn badge(rig: &Rig) -> String {
    let worker = format!("chrome-extension://{EXTENSION_ID}/background.js");
    let target = rig
        .browser
        .wait_for_target("the service worker", |t| {
            t["type"] == json!("service_worker") && t["url"].as_str() == Some(worker.as_str())
        })
        .unwrap();
    let worker = Page::attach(&rig.browser, target["targetId"].as_str().unwrap()).unwrap();
    let text = worker.eval("chrome.action.getBadgeText({})").expect("the badge's text");
    worker.detach().unwrap();
    text.as_str().unwrap_or_default().to_owned()
}

/// The user's window (issue 42's toolbar): the badge counts the turns
/// running, the popup lists the current site's live sessions, *Stop* ends
/// one (its running turn settles) and *Stop all for this site* the rest;
/// stopping is not revoking, so the site starts again without a prompt.
#[test]
fn the_toolbar_popup_shows_a_sites_sessions_and_stops_them() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("demo page loads the wasm SDK");
    let first = started_after_approval(&rig, &page, "{ autoEndOnDisconnect: false }");
    let first = first.as_str().expect("session id").to_owned();
    // A turn that runs until it is stopped, in the first session.
    let turn = page.eval_later("demo.attempt(() => demo.session().sendText('/sleep 600000'))").expect("a long turn");
    let second = ok_value(attempt(&page, "return await demo.start({ autoEndOnDisconnect: false })"));
    let second = second.as_str().expect("second session id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    while badge(&rig) != "1" {
        assert!(Instant::now() < deadline, "the badge never counted the running turn: {:?}", badge(&rig));
        std::thread::sleep(Duration::from_millis(200));
    }

    let url = format!("chrome-extension://{EXTENSION_ID}/popup.html?site={}", encode_component(&origin));
    let popup = Page::open(&rig.browser, &url).expect("the popup page");
    let row = |id: &str| format!("document.querySelector('tr[data-session=\"{id}\"]')");
    for id in [&first, &second] {
        popup.wait_until(&row(id), Duration::from_secs(10)).expect("the session is listed");
    }
    assert_eq!(popup.eval("document.getElementById('site-approval').textContent").unwrap(), json!("is approved"));
    let status = popup.eval(&format!("{}.children[2].textContent", row(&first))).unwrap();
    assert_eq!(status, json!("running"), "the running turn shows");

    popup.click(&format!("button.stop[data-session=\"{first}\"]")).expect("click Stop");
    wait_for_core_end(&rig, &origin, &first);
    let settled = turn.wait(TURN).expect("the stopped session's turn settles")["result"]["value"].clone();
    assert_eq!(settled["ok"], json!(false), "a stopped turn does not succeed: {settled}");
    popup
        .wait_until(&format!("!{}", row(&first)), Duration::from_secs(10))
        .expect("the stopped session leaves the list");
    assert_ne!(core_status(&rig, &origin, &second), SessionStatus::Ended, "only the one session stopped");

    popup.click("#stop-site").expect("click Stop all for this site");
    wait_for_core_end(&rig, &origin, &second);
    popup.wait_until("!document.getElementById('no-sessions').hidden", Duration::from_secs(10)).expect("none left");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !badge(&rig).is_empty() {
        assert!(Instant::now() < deadline, "the badge still counts a stopped turn: {:?}", badge(&rig));
        std::thread::sleep(Duration::from_millis(200));
    }
    popup.close().unwrap();
    let again = attempt(&page, "return await demo.start({ autoEndOnDisconnect: false })");
    assert_eq!(again["ok"], json!(true), "stopping is not revoking: {again}");
    assert!(!prompt_open(&rig, "origin="), "no approval prompt opened");
}

/// The control center (issue 42's user's window): two pages of two origins
/// run sessions; the Sessions view lists both sites; following one shows its
/// live chat; *Cancel* stops one's running turn (the session stays); *End
/// all* stops the other site's sessions; a request only the user may answer
/// is answered in the Requests view; and a page cannot send the monitor's
/// owner calls, even naming the extension's origin.
#[test]
fn the_control_center_follows_cancels_and_stops_two_sites_sessions() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let (first_origin, second_origin) = (rig.site.origin(), rig.other_site.origin());
    let first = rig.open_demo(&rig.site).expect("first origin's page");
    let created = first.eval_later("demo.attempt(() => demo.start({ autoEndOnDisconnect: false }))").expect("start");
    rig.answer_approval(&first_origin, "#approve").expect("approve the first origin");
    let mine = ok_value(created.wait(TURN).expect("createSession settles")["result"]["value"].clone());
    let mine = mine.as_str().expect("session id").to_owned();
    let second = rig.open_demo(&rig.other_site).expect("second origin's page");
    let created = second.eval_later("demo.attempt(() => demo.start({ autoEndOnDisconnect: false }))").expect("start");
    rig.answer_approval(&second_origin, "#approve").expect("approve the second origin");
    let theirs = ok_value(created.wait(TURN).expect("createSession settles")["result"]["value"].clone());
    let theirs = [theirs.as_str().expect("session id").to_owned(), {
        let more = ok_value(attempt(&second, "return await demo.start({ autoEndOnDisconnect: false })"));
        more.as_str().expect("session id").to_owned()
    }];

    // Sessions: every site's live sessions, each site with End all.
    let url = format!("chrome-extension://{EXTENSION_ID}/control.html");
    let control = Page::open(&rig.browser, &url).expect("the control center");
    let row = |id: &str| format!("document.querySelector('#sessions tr[data-session=\"{id}\"]')");
    for id in [&mine, &theirs[0], &theirs[1]] {
        control.wait_until(&row(id), Duration::from_secs(10)).expect("the session is listed");
    }
    let cells = control.eval(&format!("[...{}.children].slice(0, 7).map((c) => c.textContent)", row(&mine))).unwrap();
    assert_eq!(cells[0], json!(first_origin), "{cells}");
    assert_eq!((cells[1].clone(), cells[4].clone()), (json!("scripted"), json!("idle")), "{cells}");
    assert!(cells[3].as_str().is_some_and(|folder| folder.starts_with('/')), "the real folder shows: {cells}");
    let sites = control.eval("[...document.querySelectorAll('#sites li')].map((li) => li.dataset.origin)").unwrap();
    let mut expected = vec![first_origin.clone(), second_origin.clone()];
    expected.sort();
    assert_eq!(sites, json!(expected));

    // Following the first site's session shows its turn live.
    control.click(&format!("button.follow[data-session=\"{mine}\"]")).expect("click Follow");
    control.wait_until("!document.getElementById('monitor').hidden", Duration::from_secs(5)).expect("the monitor");
    ok_value(attempt(&first, "await demo.send('hello from the first site')"));
    let chat = "[...document.querySelectorAll('#monitor-log li[data-kind=\"chat\"] pre')].map((p) => p.textContent)";
    control
        .wait_until(&format!("{chat}.includes('You said: hello from the first site')"), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the live chat shows: {e} {}", control.eval(chat).unwrap()));
    control
        .wait_until(
            "document.querySelector('#monitor-log li[data-kind=\"operation-completed\"]')",
            Duration::from_secs(5),
        )
        .expect("the turn's completion shows");

    // Cancel stops the running turn, not the session.
    first
        .eval(r#"window.slowTurn = demo.sendInBackground("/slow 50\n" + "word ".repeat(400)); true"#)
        .expect("a slow turn");
    control
        .wait_until(
            "document.getElementById('monitor-streaming').textContent.includes('word')",
            Duration::from_secs(10),
        )
        .expect("its deltas stream into the monitor");
    let cancel = format!("button.cancel[data-session=\"{mine}\"]");
    control
        .wait_until(&format!("!document.querySelector('{cancel}').disabled"), Duration::from_secs(10))
        .expect("Cancel is offered while the turn runs");
    control.click(&cancel).expect("click Cancel");
    let outcome = first.eval_for("window.slowTurn", TURN).expect("the turn settles");
    assert_eq!(outcome["code"], json!("OPERATION_CANCELLED"), "{outcome}");
    control
        .wait_until(
            "[...document.querySelectorAll('#monitor-log li[data-kind=\"operation-completed\"]')].some((li) => li.textContent.includes('OPERATION_CANCELLED'))",
            Duration::from_secs(10),
        )
        .expect("the monitor shows the turn cancelled");
    assert_eq!(core_status(&rig, &first_origin, &mine), SessionStatus::Idle, "cancelled, not ended");

    // End all for the second site ends its sessions only.
    control.click(&format!("button.end-site[data-origin=\"{second_origin}\"]")).expect("click End all");
    for id in &theirs {
        wait_for_core_end(&rig, &second_origin, id);
        control.wait_until(&format!("!{}", row(id)), Duration::from_secs(10)).expect("the ended session leaves");
    }
    assert_eq!(core_status(&rig, &first_origin, &mine), SessionStatus::Idle, "the first site's session stays");

    // Requests: the agent's command is the user's to allow; the page is never asked.
    first
        .eval(r#"demo.state.autoAnswer = "deny"; window.commandTurn = demo.sendInBackground("/permission make deploy"); true"#)
        .expect("a command turn");
    // The worker shows the request in a tab of its own, in front: the
    // control center, hidden behind it, reads nothing until it is in front
    // again (the click brings it there), so wait for that tab first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !prompt_open(&rig, "permission=") {
        assert!(Instant::now() < deadline, "the worker opens the request's tab");
        std::thread::sleep(Duration::from_millis(50));
    }
    // And a system notification names the site and the command.
    let worker = attach_worker(&rig);
    let notices = "chrome.notifications.getAll().then((all) => Object.keys(all))";
    // Created beside the tab, each on its own time: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let shown = loop {
        let shown = worker.eval(notices).unwrap();
        if shown.as_array().is_some_and(|n| !n.is_empty()) || Instant::now() > deadline {
            break shown;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        shown
            .as_array()
            .is_some_and(|n| n.len() == 1 && n[0].as_str().is_some_and(|id| id.starts_with("pedelec-permission-"))),
        "{shown}"
    );
    control.click("#tab-requests").expect("open Requests");
    let request = "document.querySelector('#requests li')";
    control.wait_until(request, Duration::from_secs(10)).expect("the request is listed");
    let shown = control
        .eval(&format!(
            "(() => {{ const li = {request}; const t = (c) => li.querySelector(c).textContent; \
             return {{ origin: t('.request-origin'), agent: t('.request-agent'), command: t('.request-command'), \
                      options: [...li.querySelectorAll('button.permission-option')].map((b) => b.dataset.option) }}; }})()"
        ))
        .unwrap();
    assert_eq!(shown["origin"], json!(first_origin), "{shown}");
    assert_eq!(
        (shown["agent"].clone(), shown["command"].clone()),
        (json!("scripted"), json!("make deploy")),
        "{shown}"
    );
    assert_eq!(shown["options"], json!(["allow", "deny", ""]), "{shown}");
    control.click("#requests button.permission-option[data-option=\"allow\"]").expect("click allow");
    let outcome = first.eval_for("window.commandTurn", TURN).expect("the command turn settles");
    assert_eq!(outcome["ok"], json!(true), "{outcome}");
    let reply = first.eval("demo.state.chats[demo.state.chats.length - 1]").unwrap();
    assert_eq!(reply, json!("Permission to run make deploy: answered allow."));
    control.wait_until(&format!("!{request}"), Duration::from_secs(10)).expect("the answered request leaves");
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.eval(notices).unwrap() != json!([]) {
        assert!(Instant::now() < deadline, "the answered request's notification goes");
        std::thread::sleep(Duration::from_millis(50));
    }
    worker.detach().expect("detach from the worker");
    // The watch saw the request and its answer too.
    control.click("#tab-sessions").expect("back to Sessions");
    control
        .wait_until(
            "document.querySelector('#monitor-log li[data-kind=\"permission-settled\"]')",
            Duration::from_secs(10),
        )
        .expect("the monitor shows the permission settled");

    // The tabs move with the arrow keys.
    let keyed = control
        .eval(
            "(() => { const tab = document.getElementById('tab-sessions'); tab.focus(); \
             tab.dispatchEvent(new KeyboardEvent('keydown', { key: 'ArrowRight', bubbles: true })); \
             return [document.activeElement.id, document.getElementById('view-requests').hidden]; })()",
        )
        .unwrap();
    assert_eq!(keyed, json!(["tab-requests", false]));

    // Activity: the first site's log shows its session, the command the
    // user allowed, and its turns; the site filter, the Older button and
    // the export are reachable, with labels.
    control.click("#tab-activity").expect("open Activity");
    let activity_row = |kind: &str| {
        format!("document.querySelector('#activity tr[data-kind=\"{kind}\"][data-session-id=\"{mine}\"]')")
    };
    control
        .wait_until(&activity_row("session_started"), Duration::from_secs(10))
        .expect("the session's start is logged");
    control
        .wait_until(&activity_row("permission_answered"), Duration::from_secs(10))
        .expect("the permission is logged");
    let shown = control
        .eval(&format!("[...{}.children].map((c) => c.textContent)", activity_row("permission_answered")))
        .unwrap();
    assert_eq!((shown[1].clone(), shown[3].clone()), (json!(first_origin), json!("permission answered")), "{shown}");
    assert_eq!(shown[4], json!("permission granted (allow): make deploy"), "{shown}");
    let second_row = format!(
        "document.querySelector('#activity tr[data-kind=\"session_ended\"][data-session-id=\"{}\"]')",
        theirs[0]
    );
    control.wait_until(&second_row, Duration::from_secs(10)).expect("every site's entries show unfiltered");
    let filtered = control
        .eval(&format!(
            "(async () => {{ const site = document.getElementById('activity-site'); \
             site.value = {}; site.dispatchEvent(new Event('change')); \
             for (let i = 0; i < 100 && document.querySelector('#activity tbody tr') && {second_row}; i++) \
               await new Promise((r) => setTimeout(r, 50)); \
             return [...document.querySelectorAll('#activity tbody tr')].map((r) => r.children[1].textContent); }})()",
            json!(first_origin)
        ))
        .unwrap();
    let filtered = filtered.as_array().expect("origins").clone();
    assert!(!filtered.is_empty() && filtered.iter().all(|o| *o == json!(first_origin)), "{filtered:?}");
    let labels = control
        .eval(
            "[document.querySelector('label[for=\"activity-site\"]').textContent, \
              document.getElementById('activity-older').disabled, document.getElementById('activity-export').textContent]",
        )
        .unwrap();
    assert_eq!(labels, json!(["Site", true, "Export JSON lines"]), "a few entries need no older page");
    // Export JSON lines saves the filtered site's entries, one per line.
    let exported = control
        .eval(
            "(async () => { let saved = null; const make = URL.createObjectURL; \
             URL.createObjectURL = (blob) => { saved = blob; return make(blob); }; \
             document.getElementById('activity-export').click(); \
             for (let i = 0; i < 200 && !saved; i++) await new Promise((r) => setTimeout(r, 50)); \
             URL.createObjectURL = make; \
             const lines = saved ? (await saved.text()).trim().split('\\n').map((l) => JSON.parse(l)) : []; \
             return { lines, said: document.getElementById('activity-outcome').textContent }; })()",
        )
        .unwrap();
    let lines = exported["lines"].as_array().expect("exported lines").clone();
    assert!(!lines.is_empty() && lines.iter().all(|l| l["origin"] == json!(first_origin)), "{exported}");
    assert!(
        lines
            .iter()
            .any(|l| l["kind"] == json!("ACTIVITY_LOG_KIND_PERMISSION_ANSWERED") && l["sessionId"] == json!(mine)),
        "{exported}"
    );
    let said = exported["said"].as_str().unwrap_or_default();
    assert!(said.starts_with(&format!("Exported {} entries as pedelec-activity-", lines.len())), "{exported}");
    assert!(said.ends_with(".jsonl."), "{exported}");

    // A page cannot watch, read or cancel as the user, even naming the extension's origin.
    let owner = json!({ "callerOrigin": "app:pedelec-extension", "sessionId": mine });
    let frames = json!([
        { "requestId": 9201, "request": { "watchSession": owner } },
        { "requestId": 9202, "request": { "getSessionHistory": owner } },
        { "requestId": 9203, "request": { "cancelTurn": owner } },
        { "requestId": 9204, "request": { "watch_session": owner } },
        { "requestId": 9205, "request": { "listActivity": { "callerOrigin": "app:pedelec-extension" } } },
        { "requestId": 9206, "request": { "exportActivity": { "callerOrigin": "app:pedelec-extension" } } },
    ]);
    let sent = first.eval_for(&format!("({RAW_FRAMES_JS})({frames}, 3000)"), TURN).expect("raw frames");
    let calls = ["watchSession", "getSessionHistory", "cancelTurn", "watch_session", "listActivity", "exportActivity"];
    for (i, call) in calls.iter().enumerate() {
        let reply = &sent["replies"][i];
        let details: Value = serde_json::from_str(reply["error"]["detailsJson"].as_str().unwrap_or("null")).unwrap();
        assert_eq!(reply["error"]["code"], json!("INVALID_ARGUMENT"), "{call}: {reply}");
        assert_eq!(details["field"], json!(format!("request.{call}")), "{call}: {reply}");
    }
}

/// The control center stays usable with 1 000 live sessions: it shows them
/// 50 to a page, pages with the keyboard-reachable buttons, filters by site,
/// and paints its first page soon after opening.
#[test]
fn the_control_center_pages_a_thousand_sessions() {
    if !prerequisites_or_skip() {
        return;
    }
    const SESSIONS: usize = 1000;
    // A local app's origin: the per-site quota is for web origins.
    const APP: &str = "app:pedelec-load";
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let created: Vec<_> = runtime.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..SESSIONS {
            let request = pb::CreateSessionRequest {
                caller_origin: APP.into(),
                auto_end_on_disconnect: Some(false),
                ..Default::default()
            };
            calls.spawn(transport.call(Call::CreateSession(request)));
        }
        calls.join_all().await
    });
    assert!(created.iter().all(Result::is_ok), "{:?}", created.iter().find(|r| r.is_err()));

    let url = format!("chrome-extension://{EXTENSION_ID}/control.html");
    let opened = Instant::now();
    let control = Page::open(&rig.browser, &url).expect("the control center");
    control
        .wait_until("document.querySelectorAll('#sessions tbody tr').length === 50", Duration::from_secs(20))
        .expect("the first page of sessions");
    let painted = opened.elapsed();
    eprintln!("the control center listed {SESSIONS} sessions {painted:?} after opening (tab and page load included)");
    assert_eq!(control.eval("document.getElementById('page-label').textContent").unwrap(), json!("1–50 of 1000"));
    let first_row = "document.querySelector('#sessions tbody tr').dataset.session";
    let before = control.eval(first_row).unwrap();
    control.click("#page-next").expect("Next page");
    control
        .wait_until("document.getElementById('page-label').textContent === '51–100 of 1000'", Duration::from_secs(5))
        .expect("the second page");
    assert_ne!(control.eval(first_row).unwrap(), before, "another page of sessions");
    assert_eq!(control.eval("document.querySelectorAll('#sessions tbody tr').length").unwrap(), json!(50));
    assert_eq!(control.eval("document.getElementById('page-prev').disabled").unwrap(), json!(false));
    let sites = control.eval("[...document.querySelectorAll('#sites li')].map((li) => li.textContent)").unwrap();
    assert_eq!(sites, json!([format!("{APP} 1000 sessions End all")]));
}

/// Core's consent for `origin`, read as the user (an owner call over gRPC).
fn owner_consent(rig: &Rig, origin: &str) -> Option<pb::OriginConsent> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let request = pb::GetConsentRequest { caller_origin: "app:pedelec-extension".into(), origin: origin.into() };
    let Ok(Reply::GetConsent(reply)) = runtime.block_on(transport.call(Call::GetConsent(request))) else {
        panic!("Core answers GetConsent");
    };
    reply.origins.into_iter().find(|c| c.origin == origin)
}

/// Waits until Core's consent for `origin` is what `holds` wants.
fn wait_for_consent(rig: &Rig, origin: &str, what: &str, holds: impl Fn(Option<&pb::OriginConsent>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let consent = owner_consent(rig, origin);
        if holds(consent.as_ref()) {
            return;
        }
        assert!(Instant::now() < deadline, "Core's consent never came to {what}: {consent:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Agents view shows what Core keeps warm (issue 41): an ACP agent
/// marked `warm` is ready with its pid, the built-in one starts nothing.
#[test]
fn the_agents_view_shows_what_is_kept_warm() {
    if !prerequisites_or_skip() {
        return;
    }
    let fake = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    let extra =
        format!("[providers.fake]\nkind = \"acp\"\ncommand = [\"{}\", \"--acp\"]\nwarm = true\n", fake.display());
    let rig = Rig::start_with(GRACE, &extra).expect("Core, native host, pages and Chromium start");
    let control = Page::open(&rig.browser, &format!("chrome-extension://{EXTENSION_ID}/control.html#agents"))
        .expect("the control center");
    let warm = "document.querySelector('#agents tr[data-code=\"fake\"] td.warm')";
    if control.wait_until(warm, Duration::from_secs(10)).is_err() {
        let rows = control.eval("[...document.querySelectorAll('#agents tr')].map((r) => r.dataset.code)");
        panic!("the fake agent is not listed: {rows:?}");
    }
    // The view reads what Core says when opened or asked again ("Detect again").
    let mut state = json!(null);
    for _ in 0..100 {
        state = control.eval(&format!("{warm}.dataset.state")).unwrap();
        if state == json!("ready") {
            break;
        }
        // Once the last listing settled (the button is enabled again).
        let _ = control.wait_until("!document.getElementById('agents-detect').disabled", Duration::from_secs(10));
        control.click("#agents-detect").expect("detect again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(state, json!("ready"), "the fake agent is kept warm");
    let words = control.eval(&format!("{warm}.textContent")).unwrap();
    assert!(words.as_str().is_some_and(|w| w.starts_with("ready (pid ")), "{words}");
    let off =
        control.eval("document.querySelector('#agents tr[data-code=\"scripted\"] td.warm').dataset.state").unwrap();
    assert_eq!(off, json!("off"), "the built-in agent starts nothing");
}

/// The control center's Sites and Agents views (issue 42): the user grants a
/// site a folder (typed, checked by Core as SetConsent checks it) and the
/// site opens a session there without being asked; lets it approve
/// commands there; removes the grant; revokes the site, which ends its
/// sessions; and sees the built-in agent available and the default. Every
/// control has a label, and the page reads nothing while it is hidden.
#[test]
fn the_control_center_grants_a_folder_revokes_a_site_and_lists_the_agents() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("the site's page");
    let first = started_after_approval(&rig, &page, "{ autoEndOnDisconnect: false }");
    let first = first.as_str().expect("session id").to_owned();
    let area = tempfile::tempdir().expect("tempdir");
    let folder = area.path().canonicalize().unwrap().join("project");
    std::fs::create_dir_all(&folder).unwrap();
    let folder = folder.display().to_string();

    let url = format!("chrome-extension://{EXTENSION_ID}/control.html#sites");
    let control = Page::open(&rig.browser, &url).expect("the control center");
    let site = format!("#consents li[data-origin=\"{origin}\"]");
    let in_site = |selector: &str| format!("document.querySelector('{site} {selector}')");
    control.wait_until(&in_site("button.revoke-site"), Duration::from_secs(10)).expect("the approved site is listed");
    let standing = control.eval(&format!("{}.textContent", in_site(".standing"))).unwrap();
    assert!(standing.as_str().is_some_and(|s| s.starts_with(" approved")), "{standing}");

    // A folder Core would never grant is refused, with Core's reason shown.
    let home = std::env::var("HOME").expect("HOME");
    let type_path = |path: &str| format!("({}.value = {}, true)", in_site("input.folder-path"), json!(path));
    control.eval(&type_path(&home)).unwrap();
    control.click(&format!("{site} button.add-folder-button")).expect("click Add folder");
    control
        .wait_until("document.getElementById('sites-outcome').textContent.startsWith('Not changed')", TURN)
        .expect("the home folder is refused");
    assert!(owner_consent(&rig, &origin).unwrap().folders.is_empty(), "nothing granted");

    // A typed folder is granted, and the site opens a session there unasked.
    control.eval(&type_path(&folder)).unwrap();
    control.click(&format!("{site} button.add-folder-button")).expect("click Add folder");
    let row = format!("{site} tr[data-path=\"{folder}\"]");
    control.wait_until(&format!("document.querySelector('{row}')"), Duration::from_secs(10)).expect("the grant shows");
    let grant = owner_consent(&rig, &origin).unwrap().folders;
    assert_eq!(
        grant,
        vec![pb::FolderGrant { path: folder.clone(), may_approve_commands: false, ..Default::default() }]
    );
    assert_eq!(control.eval(&format!("{}.value", in_site("input.folder-path"))).unwrap(), json!(""));
    let opened = ok_value(attempt(
        &page,
        &format!(
            "const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{folder}' }}, autoEndOnDisconnect: false }}); \
             await s.sendText('hello in the granted folder'); return s.sessionId;"
        ),
    ));
    assert!(opened.as_str().is_some_and(|id| id.starts_with("sess-")), "{opened}");
    assert!(std::path::Path::new(&folder).join(".pedelec-runtime").is_dir(), "the session works in the folder");
    let prompts: Vec<Value> = rig
        .browser
        .targets()
        .unwrap()
        .into_iter()
        .filter(|t| t["url"].as_str().is_some_and(|u| u.contains("approve.html?")))
        .collect();
    assert!(prompts.is_empty(), "the site was not asked about the folder: {prompts:?}");

    // May approve commands, then the grant removed.
    control.click(&format!("{row} input.may-approve")).expect("tick may approve commands");
    wait_for_consent(&rig, &origin, "may approve commands", |c| {
        c.is_some_and(|c| c.folders.iter().any(|f| f.path == folder && f.may_approve_commands))
    });
    control
        .wait_until(&format!("document.querySelector('{row} input.may-approve').checked"), Duration::from_secs(10))
        .expect("the box shows Core's copy");
    control.click(&format!("{row} button.remove-folder")).expect("click Remove");
    control.wait_until(&format!("!document.querySelector('{row}')"), Duration::from_secs(10)).expect("the row leaves");
    wait_for_consent(&rig, &origin, "no folder", |c| c.is_some_and(|c| c.approved && c.folders.is_empty()));

    // Revoke: the site is forgotten and its sessions end.
    control.click(&format!("{site} button.revoke-site")).expect("click Revoke");
    control
        .wait_until(&format!("!document.querySelector('{site}')"), Duration::from_secs(10))
        .expect("the site leaves");
    wait_for_consent(&rig, &origin, "forgotten", |c| c.is_none());
    for id in [first.as_str(), opened.as_str().unwrap()] {
        wait_for_core_end(&rig, &origin, id);
    }
    let said = control.eval("document.getElementById('sites-outcome').textContent").unwrap();
    assert_eq!(said, json!(format!("{origin} is revoked; 2 sessions ended.")));

    // Agents: the built-in agent is available and the default, with its model.
    control.click("#tab-agents").expect("open Agents");
    let scripted = "document.querySelector('#agents tr[data-code=\"scripted\"]')";
    control.wait_until(scripted, Duration::from_secs(10)).expect("the agents are listed");
    let cells = control.eval(&format!("[...{scripted}.children].map((c) => c.textContent)")).unwrap();
    assert_eq!(cells[0], json!("Scripted (default)"), "{cells}");
    assert_eq!((cells[1].clone(), cells[2].clone()), (json!("scripted"), json!("available")));
    let model = control.eval(&format!("{scripted}.querySelector('input.agent-model').value")).unwrap();
    assert_eq!(model, json!("scripted-1"));
    assert!(cells[3].as_str().is_some_and(|v| !v.is_empty()), "a version: {cells}");
    let default = control.eval("document.getElementById('default-agent').textContent").unwrap();
    assert_eq!(default, json!("The default is Scripted (scripted), model scripted-1."));
    let missing = control
        .eval("[...document.querySelectorAll('#agents tr[data-available=\"false\"]')].map((r) => r.querySelector('.why').textContent)")
        .unwrap();
    assert!(
        missing.as_array().is_some_and(|m| m.iter().all(|why| why.as_str().is_some_and(|w| !w.is_empty()))),
        "{missing}"
    );

    // Check: a one-turn probe on a throwaway session of the extension's own, then ended.
    control.click("#agents tr[data-code=\"scripted\"] button.check-agent").expect("click Check");
    let result = "document.querySelector('#agents tr[data-code=\"scripted\"] .check-result').textContent";
    control.wait_until(&format!("{result}.startsWith('works (')"), TURN).unwrap_or_else(|e| {
        panic!("the scripted agent works: {e} {:?}", control.eval(result));
    });
    control
        .wait_until(
            &format!("!document.querySelector('{}').disabled", "#agents tr[data-code=\"scripted\"] button.check-agent"),
            TURN,
        )
        .expect("Check is offered again once the probe ended");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let live = pb::ListLiveSessionsRequest { caller_origin: "app:pedelec-extension".into(), ..Default::default() };
    let Ok(Reply::ListLiveSessions(live)) = runtime.block_on(transport.call(Call::ListLiveSessions(live))) else {
        panic!("Core lists the live sessions");
    };
    assert!(live.sessions.is_empty(), "the probe's session ended: {:?}", live.sessions);
    let unavailable = "document.querySelector('#agents tr[data-available=\"false\"]')";
    if control.eval(&format!("!!{unavailable}")).unwrap() == json!(true) {
        control.eval(&format!("({unavailable}.querySelector('button.check-agent').click(), true)")).unwrap();
        let said = format!("{unavailable}.querySelector('.check-result').textContent");
        control.wait_until(&format!("{said}.startsWith('fails: ')"), TURN).unwrap_or_else(|e| {
            panic!("an unavailable agent's check fails: {e} {:?}", control.eval(&said));
        });
    }

    // Settings from the window: a default model and the default agent are
    // written into Core's config.toml (its comment kept) and take effect at once.
    let config_file = rig.dir.path().join("core-config/config.toml");
    control
        .eval(&format!(
            "(() => {{ const i = {scripted}.querySelector('input.agent-model'); i.value = 'scripted-text-only'; return true; }})()"
        ))
        .unwrap();
    control.click("#agents tr[data-code=\"scripted\"] button.save-model").expect("click Save");
    control
        .wait_until("document.getElementById('agents-outcome').textContent.endsWith('default model saved.')", TURN)
        .expect("the model is saved");
    let written = std::fs::read_to_string(&config_file).expect("config.toml");
    assert!(written.starts_with(pedelec_web_e2e::CORE_CONFIG), "the comment stays: {written}");
    assert!(written.contains("[providers.scripted]\nmodel = \"scripted-text-only\""), "{written}");
    let settings = |runtime: &tokio::runtime::Runtime, transport: &GrpcTransport| {
        let Ok(Reply::GetSettings(settings)) =
            runtime.block_on(transport.call(Call::GetSettings(pb::GetSettingsRequest {})))
        else {
            panic!("Core answers GetSettings");
        };
        settings
    };
    assert_eq!(settings(&runtime, &transport).default_models["scripted"], "scripted-text-only", "at once");
    let other = "document.querySelector('#agents tr:not([data-code=\"scripted\"]) button.make-default')";
    let other_code = control.eval(&format!("{other}.closest('tr').dataset.code")).unwrap();
    control.eval(&format!("({other}.click(), true)")).unwrap();
    control
        .wait_until("document.getElementById('agents-outcome').textContent.endsWith('is now the default agent.')", TURN)
        .expect("the default agent is saved");
    assert_eq!(json!(settings(&runtime, &transport).default_provider), other_code);
    let written = std::fs::read_to_string(&config_file).expect("config.toml");
    assert!(written.contains(&format!("default_provider = {other_code}")), "{written}");
    // And back: the scripted agent is the default again, with its own model.
    control
        .eval(&format!(
            "(() => {{ const i = {scripted}.querySelector('input.agent-model'); i.value = ''; return true; }})()"
        ))
        .unwrap();
    control.click("#agents tr[data-code=\"scripted\"] button.save-model").expect("click Save");
    // Once the Save re-drew the table: a click before it could land on the row it replaces.
    control
        .wait_until("document.getElementById('agents-outcome').textContent.endsWith('default model saved.')", TURN)
        .expect("the model is saved");
    control
        .wait_until(&format!("!!{scripted}.querySelector('button.make-default')"), TURN)
        .expect("offered as default");
    control.click("#agents tr[data-code=\"scripted\"] button.make-default").expect("make scripted the default");
    control.wait_until(&format!("!{scripted}.querySelector('button.make-default')"), TURN).expect("the default again");
    let settings = settings(&runtime, &transport);
    assert_eq!(
        (settings.default_provider.as_str(), settings.default_models["scripted"].as_str()),
        ("scripted", "scripted-1")
    );

    // Every control of the views has a name and is reachable by keyboard.
    let unlabelled = control
        .eval(
            "[...document.querySelectorAll('button, input, select, [role=tab]')].filter((e) => \
             e.tabIndex < 0 && e.getAttribute('role') !== 'tab' || \
             !((e.labels && e.labels.length) || e.getAttribute('aria-label') || e.textContent.trim())).map((e) => e.outerHTML)",
        )
        .unwrap();
    assert_eq!(unlabelled, json!([]));

    // Hidden (another tab in front), the page reads nothing; shown, it reads at once.
    control.click("#tab-sessions").expect("back to Sessions");
    let other = Page::open(&rig.browser, "about:blank").expect("another tab");
    control
        .wait_until("document.visibilityState === 'hidden'", Duration::from_secs(5))
        .expect("the control center is hidden");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let request = pb::CreateSessionRequest {
        caller_origin: "app:pedelec-hidden".into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    let Ok(Reply::CreateSession(made)) = runtime.block_on(transport.call(Call::CreateSession(request))) else {
        panic!("a session is created");
    };
    let made = made.session.unwrap().session_id;
    let listed = format!("document.querySelector('#sessions tr[data-session=\"{made}\"]')");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(control.eval(&format!("!!{listed}")).unwrap(), json!(false), "nothing read while hidden");
    control.bring_to_front().expect("the control center in front");
    control.wait_until(&listed, Duration::from_secs(5)).expect("read again once shown");
    other.close().unwrap();
}

/// The folder picker (issue 42, "A folder is picked and the session opens
/// there"): a page of an origin not yet approved calls `pickWorkspace()`; the
/// user approves the origin, then browses in the extension's picker (a typed
/// folder, then a sub-folder from Core's list) and picks one. The page gets an
/// opaque handle and the folder's name, never its path; a session created
/// with the handle works in that folder. Closing the picker with Cancel
/// rejects with `PICK_CANCELLED`.
#[test]
fn a_folder_is_picked_and_the_session_opens_there() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let area = tempfile::tempdir().expect("tempdir");
    let parent = area.path().canonicalize().unwrap();
    let folder = parent.join("project");
    std::fs::create_dir_all(folder.join("src")).unwrap();
    std::fs::create_dir_all(parent.join("other")).unwrap();

    let page = rig.open_demo(&rig.site).expect("the site's page");
    let picking = page.eval_later("demo.attempt(() => demo.pickFolder())").expect("pickWorkspace");
    // Not approved yet: the user is asked about the origin first.
    rig.answer_approval(&origin, "#approve").expect("approve the site");
    let picker = open_picker(&rig);
    picker
        .wait_until(&format!("document.getElementById('origin').textContent === {}", json!(origin)), TURN)
        .expect("the picker names the site");
    // Every control is labelled.
    let unlabelled = picker
        .eval(
            "[...document.querySelectorAll('input, button')].filter((c) => !(c.labels && c.labels.length) \
             && !c.getAttribute('aria-label') && !c.textContent.trim()).map((c) => c.id)",
        )
        .unwrap();
    assert_eq!(unlabelled, json!([]), "every control has a label");
    // A typed folder, then a sub-folder from Core's list.
    picker.eval(&format!("document.getElementById('path').value = {}", json!(parent.display().to_string()))).unwrap();
    picker.click("#go-button").expect("click Open");
    let entry = "#folders button[data-name=\"project\"]";
    picker.wait_until(&format!("document.querySelector('{entry}')"), TURN).expect("Core lists the folder");
    let listed =
        picker.eval("[...document.querySelectorAll('#folders button.folder')].map((b) => b.dataset.name)").unwrap();
    assert_eq!(listed, json!(["other", "project"]));
    picker.click(entry).expect("open project");
    let shown = json!(folder.display().to_string());
    picker
        .wait_until(
            &format!("document.getElementById('path').value === {shown} && !document.getElementById('pick').disabled"),
            TURN,
        )
        .expect("the project folder is open and pickable");
    picker.click("#pick").expect("click Pick this folder");

    let picked = ok_value(picking.wait(TURN).expect("pickWorkspace settles")["result"]["value"].clone());
    assert_eq!(picked["name"], json!("project"), "{picked}");
    let handle = picked["handle"].as_str().expect("a handle").to_owned();
    assert!(handle.starts_with("wsh-") && !handle.contains('/'), "opaque: {handle}");
    assert!(!picked.to_string().contains(&parent.display().to_string()), "no path reaches the page: {picked}");
    wait_for_consent(&rig, &origin, "the picked folder granted", |c| {
        c.is_some_and(|c| c.folders.iter().any(|f| f.path == folder.display().to_string() && f.handle == handle))
    });
    let closed =
        rig.browser.targets().unwrap().iter().all(|t| !t["url"].as_str().unwrap_or("").contains("/picker.html"));
    assert!(closed, "the picker closed once the folder was picked");

    // The session opens there, and its agent writes there.
    let written = ok_value(attempt(
        &page,
        &format!(
            "const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ handle: '{handle}' }}, \
             autoEndOnDisconnect: false }}); \
             await s.sendText('/write picked.txt written in the picked folder'); return s.sessionId;"
        ),
    ));
    assert!(written.as_str().is_some_and(|id| id.starts_with("sess-")), "{written}");
    assert_eq!(std::fs::read_to_string(folder.join("picked.txt")).unwrap(), "written in the picked folder");
    // What the site is told of the session's workspace: the folder's name.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let transport = runtime.block_on(GrpcTransport::connect(rig.socket())).expect("gRPC to Core");
    let request = pb::ListSessionsRequest { caller_origin: origin.clone(), ..Default::default() };
    let Ok(Reply::ListSessions(listed)) = runtime.block_on(transport.call(Call::ListSessions(request))) else {
        panic!("Core answers ListSessions");
    };
    let shown: Vec<String> =
        listed.sessions.iter().map(|s| s.session.clone().unwrap_or_default().workspace_path).collect();
    assert_eq!(shown, ["project"], "no path above the picked folder");

    // Cancel: the page is told the user closed the picker.
    let cancelled = page.eval_later("demo.attempt(() => demo.pedelec.pickWorkspace())").expect("pickWorkspace again");
    let picker = open_picker(&rig);
    picker.wait_until("document.getElementById('origin').textContent !== '…'", TURN).expect("the picker is ready");
    picker.click("#cancel").expect("click Cancel");
    let refused = cancelled.wait(TURN).expect("pickWorkspace settles")["result"]["value"].clone();
    assert_eq!((refused["ok"].clone(), refused["code"].clone()), (json!(false), json!("PICK_CANCELLED")), "{refused}");
    assert_eq!(refused["details"]["reason"], json!("cancelled"), "{refused}");
}

/// Attaches to the folder picker tab the extension opened.
fn open_picker(rig: &Rig) -> Page<'_> {
    let prefix = format!("chrome-extension://{EXTENSION_ID}/picker.html?pick=");
    let target = rig
        .browser
        .wait_for_target("the folder picker", |t| {
            t["type"].as_str() == Some("page") && t["url"].as_str().is_some_and(|u| u.starts_with(&prefix))
        })
        .expect("the extension opens its folder picker");
    Page::attach(&rig.browser, target["targetId"].as_str().unwrap_or_default()).expect("attach to the picker")
}

/// Every input and button in `view` of the control center has a label.
fn assert_labelled(control: &Page<'_>, view: &str) {
    let unlabelled = control
        .eval(&format!(
            "[...document.querySelectorAll('{view} input, {view} button, {view} select')]\
             .filter((c) => !(c.labels && c.labels.length) && !c.getAttribute('aria-label') && !c.textContent.trim())\
             .map((c) => c.id || c.className)"
        ))
        .unwrap();
    assert_eq!(unlabelled, json!([]), "every control of {view} has a label");
}

/// The control center's Recent list (issue 42): a session the site ended
/// is listed under the live ones, with its site and agent, and opens into
/// the monitor, which reads its history and shows it ended (nothing to
/// cancel or end).
#[test]
fn the_control_center_lists_a_recently_ended_session_and_opens_it() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("the site's page");
    let live = started_after_approval(&rig, &page, "{ autoEndOnDisconnect: false }");
    let ended = ok_value(attempt(
        &page,
        "const s = await demo.pedelec.createSession({ provider: 'scripted', autoEndOnDisconnect: false }); \
         await s.sendText('hello before the end'); await s.end(); return s.sessionId;",
    ));
    let ended = ended.as_str().expect("session id").to_owned();

    let control = Page::open(&rig.browser, &format!("chrome-extension://{EXTENSION_ID}/control.html"))
        .expect("the control center");
    let open = format!("#recent button.open-recent[data-session=\"{ended}\"]");
    control.wait_until(&format!("!!document.querySelector('{open}')"), Duration::from_secs(10)).expect("listed");
    let cells = control
        .eval(&format!(
            "[...document.querySelector('#recent tr[data-session=\"{ended}\"]').children].map((c) => c.textContent)"
        ))
        .unwrap();
    assert_eq!((cells[0].clone(), cells[1].clone()), (json!(origin), json!("scripted")), "{cells}");
    assert!(cells[5].as_str().is_some_and(|t| !t.is_empty()), "when it ended: {cells}");
    // The live one is listed live, not recent; the ended one not live.
    let live_rows =
        control.eval("[...document.querySelectorAll('#sessions tbody tr')].map((r) => r.dataset.session)").unwrap();
    assert_eq!(live_rows, json!([live]));
    let recent_rows =
        control.eval("[...document.querySelectorAll('#recent tbody tr')].map((r) => r.dataset.session)").unwrap();
    assert_eq!(recent_rows, json!([ended]));
    assert_labelled(&control, "#view-sessions");

    // It takes the keyboard's focus (a button in the tab order), then opens.
    control.eval(&format!("(document.querySelector('{open}').focus(), true)")).unwrap();
    assert_eq!(control.eval("document.activeElement.className").unwrap(), json!("open-recent"));
    control.eval("(document.activeElement.click(), true)").unwrap();
    control
        .wait_until("!document.getElementById('monitor').hidden", Duration::from_secs(5))
        .expect("the monitor opens");
    control
        .wait_until("document.getElementById('monitor-status').textContent === 'ended'", Duration::from_secs(10))
        .expect("the monitor shows the session ended");
    let said = "[...document.querySelectorAll('#monitor-log li')].map((li) => li.textContent)";
    control
        .wait_until(&format!("{said}.some((t) => t.includes('hello before the end'))"), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the monitor reads the ended session's history: {e} {:?}", control.eval(said)));
    control
        .wait_until(
            &format!("{said}.some((t) => t.includes('You said: hello before the end'))"),
            Duration::from_secs(10),
        )
        .expect("and the agent's answer");
    assert_eq!(control.eval("document.getElementById('monitor-session').textContent").unwrap(), json!(ended));
    assert_eq!(
        control
            .eval(
                "[document.getElementById('monitor-cancel').disabled, document.getElementById('monitor-end').disabled]"
            )
            .unwrap(),
        json!([true, true]),
        "an ended session has nothing to cancel or end"
    );
}

/// The control center's Sites view (issue 42): the user limits a site to
/// one agent and to two live sessions; Core then refuses the page a session
/// with another agent and a third live one. A folder is added through the
/// in-page folder browser (ListFolders, PickFolder) and the site opens a
/// session there; the pick keeps the site's limits. Clearing the limits
/// lets every agent again.
#[test]
fn the_control_center_limits_a_sites_agents_and_sessions_and_adds_a_browsed_folder() {
    if !prerequisites_or_skip() {
        return;
    }
    let rig = Rig::start(GRACE).expect("Core, native host, pages and Chromium start");
    let origin = rig.site.origin();
    let page = rig.open_demo(&rig.site).expect("the site's page");
    started_after_approval(&rig, &page, "{ autoEndOnDisconnect: false }");
    let area = tempfile::tempdir().expect("tempdir");
    let parent = area.path().canonicalize().unwrap();
    let folder = parent.join("project");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::create_dir_all(parent.join("other")).unwrap();
    let folder = folder.display().to_string();

    let control = Page::open(&rig.browser, &format!("chrome-extension://{EXTENSION_ID}/control.html#sites"))
        .expect("the control center");
    let site = format!("#consents li[data-origin=\"{origin}\"]");
    let agent = |code: &str| format!("{site} input.site-agent[data-code=\"{code}\"]");
    control
        .wait_until(&format!("!!document.querySelector('{}')", agent("scripted")), Duration::from_secs(10))
        .expect("agents offered");
    let offered = control
        .eval(&format!("[...document.querySelectorAll('{site} input.site-agent')].map((b) => b.dataset.code)"))
        .unwrap();
    assert!(
        offered.as_array().is_some_and(|o| o.len() > 1 && o.contains(&json!("cursor"))),
        "every configured agent: {offered}"
    );
    let now = control.eval(&format!("document.querySelector('{site} .site-agents-now').textContent")).unwrap();
    assert_eq!(now, json!("Every agent."));
    assert_labelled(&control, "#view-sites");

    // Only the built-in agent, two live sessions at most.
    control.click(&agent("scripted")).expect("tick scripted");
    control.eval(&format!("(document.querySelector('{site} input.site-max').value = '2', true)")).unwrap();
    control.click(&format!("{site} button.save-limits")).expect("click Save");
    wait_for_consent(&rig, &origin, "limited", |c| {
        c.is_some_and(|c| c.providers == ["scripted"] && c.max_live_sessions == 2 && c.approved)
    });
    control
        .wait_until(
            &format!("document.querySelector('{site} .site-agents-now').textContent === 'Only: scripted.'"),
            Duration::from_secs(10),
        )
        .expect("the view shows Core's copy");
    assert_eq!(control.eval(&format!("document.querySelector('{site} input.site-max').value")).unwrap(), json!("2"));
    let said = json!(format!("{origin} may use scripted, with at most 2 live sessions."));
    control
        .wait_until(
            &format!("document.getElementById('sites-outcome').textContent === {said}"),
            Duration::from_secs(10),
        )
        .expect("the view says what was saved");

    // The page: another agent is refused by the site's consent; a third live session by its limit.
    let other =
        attempt(&page, "return await demo.pedelec.createSession({ provider: 'cursor', autoEndOnDisconnect: false });");
    assert_eq!((other["ok"].clone(), other["code"].clone()), (json!(false), json!("ORIGIN_NOT_ALLOWED")), "{other}");
    assert_eq!(
        (other["details"]["reason"].clone(), other["details"]["provider"].clone()),
        (json!("agent_not_allowed"), json!("cursor")),
        "{other}"
    );
    let second = ok_value(attempt(
        &page,
        "window.second = await demo.pedelec.createSession({ provider: 'scripted', autoEndOnDisconnect: false }); return window.second.sessionId;",
    ));
    assert!(second.as_str().is_some_and(|id| id.starts_with("sess-")), "{second}");
    let third = attempt(&page, "return await demo.pedelec.createSession({ autoEndOnDisconnect: false });");
    assert_eq!(third["code"], json!("QUOTA_EXCEEDED"), "{third}");
    assert_eq!(third["details"], json!({ "limit": "max_live_sessions", "max": 2, "origin": origin }), "{third}");
    ok_value(attempt(&page, "await window.second.end(); return true;"));

    // Add folder…: browse to the folder and grant it.
    control.click(&format!("{site} button.pick-folder")).expect("click Add folder…");
    control
        .wait_until("!document.getElementById('folder-browser').hidden", Duration::from_secs(5))
        .expect("the browser opens");
    control
        .wait_until(
            &format!("document.getElementById('browser-origin').textContent === {}", json!(origin)),
            Duration::from_secs(5),
        )
        .expect("for the site");
    // The first listing (the home folder) is in before a path is typed, or it would replace it.
    control
        .wait_until("!['', 'Reading…'].includes(document.getElementById('browser-status').textContent)", TURN)
        .expect("the browser lists the home folder");
    assert_labelled(&control, "#folder-browser");
    control
        .eval(&format!(
            "(document.getElementById('browser-path').value = {}, true)",
            json!(parent.display().to_string())
        ))
        .unwrap();
    control.click("#browser-open").expect("click Open");
    let entry = "#browser-folders button[data-name=\"project\"]";
    control.wait_until(&format!("!!document.querySelector('{entry}')"), TURN).expect("Core lists the folder");
    let listed = control
        .eval("[...document.querySelectorAll('#browser-folders button.browse-folder')].map((b) => b.dataset.name)")
        .unwrap();
    assert_eq!(listed, json!(["other", "project"]));
    control.click(entry).expect("open project");
    control
        .wait_until(
            &format!("document.getElementById('browser-path').value === {} && !document.getElementById('browser-pick').disabled", json!(folder)),
            TURN,
        )
        .expect("the project folder is open and may be granted");
    control.click("#browser-pick").expect("click Grant this folder");
    wait_for_consent(&rig, &origin, "the browsed folder granted", |c| {
        c.is_some_and(|c| c.folders.iter().any(|f| f.path == folder && f.handle.starts_with("wsh-")))
    });
    control
        .wait_until(&format!("!!document.querySelector('{site} tr[data-path=\"{folder}\"]')"), Duration::from_secs(10))
        .expect("the grant shows");
    control
        .wait_until("document.getElementById('folder-browser').hidden", Duration::from_secs(5))
        .expect("the browser closes");
    let kept = owner_consent(&rig, &origin).unwrap();
    assert_eq!(
        (kept.providers.as_slice(), kept.max_live_sessions),
        (["scripted".to_owned()].as_slice(), 2),
        "the pick kept the limits"
    );
    let written = ok_value(attempt(
        &page,
        &format!(
            "const s = await demo.pedelec.createSession({{ provider: 'scripted', workspace: {{ path: '{folder}' }}, autoEndOnDisconnect: false }}); \
             await s.sendText('/write browsed.txt in the browsed folder'); await s.end(); return s.sessionId;"
        ),
    ));
    assert!(written.as_str().is_some_and(|id| id.starts_with("sess-")), "{written}");
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&folder).join("browsed.txt")).unwrap(),
        "in the browsed folder"
    );

    // A folder the page asks for and the user grants on the worker's prompt
    // (a SetConsent of the worker's own) keeps the site's limits.
    let other = parent.join("other").display().to_string();
    let asked = page
        .eval_later(&format!(
            "demo.attempt(async () => {{ const s = await demo.pedelec.createSession({{ provider: 'scripted', \
             workspace: {{ path: '{other}' }}, autoEndOnDisconnect: false }}); await s.end(); return s.sessionId; }})"
        ))
        .expect("a session in another folder");
    rig.answer_grant(&origin, &other, "#grant").expect("grant the other folder");
    ok_value(asked.wait(TURN).expect("createSession settles")["result"]["value"].clone());
    let kept = owner_consent(&rig, &origin).unwrap();
    assert!(kept.folders.iter().any(|f| f.path == other), "{kept:?}");
    assert_eq!(
        (kept.providers.as_slice(), kept.max_live_sessions),
        (["scripted".to_owned()].as_slice(), 2),
        "the worker's grant kept the limits"
    );

    // Cleared: every agent and the default limit again (the folders stay).
    control.click(&agent("scripted")).expect("untick scripted");
    control.eval(&format!("(document.querySelector('{site} input.site-max').value = '', true)")).unwrap();
    control.click(&format!("{site} button.save-limits")).expect("click Save");
    wait_for_consent(&rig, &origin, "no limits", |c| {
        c.is_some_and(|c| {
            c.providers.is_empty() && c.max_live_sessions == 0 && c.folders.iter().any(|f| f.path == folder)
        })
    });
    let other =
        attempt(&page, "return await demo.pedelec.createSession({ provider: 'cursor', autoEndOnDisconnect: false });");
    assert_ne!(other["code"], json!("ORIGIN_NOT_ALLOWED"), "the site may use every agent again: {other}");
}
