//! The browser path in real headless Firefox: the same extension folder
//! (installed as a temporary add-on over WebDriver BiDi), its content-script
//! relay (Firefox has no `externally_connectable`), the native host
//! registered in Firefox's per-user place under a temporary HOME, and Core.
//! Approval, a tool turn, the control center following the session live, and
//! an asset round trip through the demo page.
//!
//! Skips without Firefox unless `CI=true`, where it fails instead.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::native::find_host_binary;
use pedelec_web_e2e::bidi::{Firefox, firefox};
use pedelec_web_e2e::server::StaticServer;
use pedelec_web_e2e::{
    RAW_FRAMES_JS, assert_forged_refused, forged_frames, missing_web_build, web_dir, workspace_root,
};
use serde_json::json;

/// The add-on id in the manifest's `browser_specific_settings.gecko.id`.
const ADDON_ID: &str = "extension@pedelec.dev";
const TURN: Duration = Duration::from_secs(60);

#[test]
fn firefox_end_to_end() {
    let missing =
        if firefox().is_file() { missing_web_build() } else { Some(format!("no Firefox at {}", firefox().display())) };
    if let Some(missing) = missing {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("the Firefox test cannot run under CI=true: {missing} (apt-get install -y firefox-esr)");
        }
        eprintln!("skipping the Firefox test: {missing}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (home, config, profile) = (dir.path().join("home"), dir.path().join("config"), dir.path().join("profile"));
    for d in [&home, &profile] {
        std::fs::create_dir_all(d).unwrap();
    }
    let socket = dir.path().join("run/core.sock");
    let state = dir.path().join("state");
    let _core = CoreProcess::spawn(&socket, &state, Duration::from_millis(500)).expect("Core starts");
    // Firefox reads host manifests from ~/.mozilla/native-messaging-hosts: HOME is the temp dir.
    let host = std::fs::canonicalize(find_host_binary()).expect("pedelec-native-host is built");
    let status = Command::new(&host)
        .args(["install", "--browser", "firefox", "--firefox-addon-id", ADDON_ID, "--host-path"])
        .arg(&host)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &config)
        .status()
        .unwrap();
    assert!(status.success(), "registering the host for Firefox");
    assert!(home.join(".mozilla/native-messaging-hosts/dev.pedelec.host.json").is_file());
    let site = StaticServer::start(&web_dir()).unwrap();
    let origin = site.origin();
    let envs: [(&str, &Path); 4] = [
        ("HOME", &home),
        ("XDG_CONFIG_HOME", &config),
        ("PEDELEC_CORE_SOCKET", &socket),
        ("PEDELEC_STATE_DIR", &state),
    ];
    let mut ff = Firefox::launch(&profile, &envs).expect("Firefox starts with BiDi");
    let installed = ff
        .call(
            "webExtension.install",
            json!({ "extensionData": { "type": "path", "path": workspace_root().join("extension") } }),
            TURN,
        )
        .expect("the extension folder installs as a temporary add-on");
    assert_eq!(installed["extension"], json!(ADDON_ID));

    let (page, _) = ff.contexts().unwrap().into_iter().next().expect("a tab");
    ff.call(
        "browsingContext.navigate",
        json!({ "context": page, "url": format!("{origin}/demo/index.html"), "wait": "complete" }),
        TURN,
    )
    .unwrap();
    ff.wait_until(&page, "!!window.demo", Duration::from_secs(20)).expect("the demo page loads the wasm SDK");

    // The page reaches the extension through its content script: installed, not yet approved.
    let status = ff.eval(&page, "demo.pedelec.getApprovalStatus()").unwrap();
    assert_eq!(
        (status["installed"].clone(), status["approved"].clone(), status["origin"].clone()),
        (json!(true), json!(false), json!(origin)),
        "{status}"
    );

    // createSession waits on the approval tab the extension opens.
    let started = ff.eval_later(&page, "demo.attempt(() => demo.start())").unwrap();
    let approval = ff.wait_for_context("the approval page", |url| url.contains("/approve.html?origin=")).unwrap();
    // The control center, in a background tab opened from an extension page
    // (WebDriver may not navigate to a moz-extension: URL itself).
    let opened = ff
        .eval(
            &approval,
            "chrome.tabs.create({ url: 'control.html', active: false }).then(() => true, (e) => String(e))",
        )
        .unwrap();
    assert_eq!(opened, json!(true), "the control center's tab opens");
    ff.wait_until(&approval, "!document.getElementById('request').hidden", Duration::from_secs(10))
        .expect("the approval page shows the request");
    // Its buttons arm once the tab has been visible and focused for a while.
    ff.wait_until(&approval, "!document.getElementById('approve').disabled", Duration::from_secs(10))
        .expect("the approval page's buttons arm");
    ff.eval(&approval, "(document.querySelector('#approve').click(), true)").unwrap();
    let started = ff.value(started, TURN).unwrap();
    assert_eq!(started["ok"], json!(true), "{started}");
    assert!(started["value"].as_str().is_some_and(|id| id.starts_with("sess-")), "{started}");
    let status = ff.eval(&page, "demo.pedelec.getApprovalStatus()").unwrap();
    assert_eq!((status["approved"].clone(), status["appConnected"].clone()), (json!(true), json!(true)), "{status}");

    // Forged frames from the approved page (issue 38): the proto spelling
    // of the call or of the grants, an unlisted call, another origin. Each
    // refused by the extension naming the field; no session, no prompt.
    let area = tempfile::tempdir().unwrap();
    let folder = area.path().canonicalize().unwrap().display().to_string();
    let forged = forged_frames(&folder);
    let frames = serde_json::Value::Array(forged.iter().map(|(f, _)| f.clone()).collect());
    let sent = ff.eval(&page, &format!("({RAW_FRAMES_JS})({frames}, 3000)")).expect("the page sends raw frames");
    assert_forged_refused(&sent, &forged);
    let listed = ff
        .eval(&page, &format!("({RAW_FRAMES_JS})([{{ requestId: 9100, request: {{ listSessions: {{}} }} }}], 10000)"))
        .unwrap();
    let sessions = listed["replies"][0]["response"]["listSessions"]["sessions"].as_array().cloned().unwrap_or_default();
    assert_eq!(sessions.len(), 1, "only the session the page started: {listed}");
    assert!(!area.path().join(".pedelec-runtime").exists(), "nothing opened in the forged folder");
    std::thread::sleep(Duration::from_millis(300));
    let prompts: Vec<String> =
        ff.contexts().unwrap().into_iter().map(|(_, url)| url).filter(|u| u.contains("/approve.html")).collect();
    assert!(prompts.is_empty(), "no prompt opened: {prompts:?}");

    // A frontend tool call answered by the page.
    let turn = ff.eval(&page, r#"demo.attempt(() => demo.send('/tool update_counter {"delta": 3}'))"#).unwrap();
    assert_eq!(turn["ok"], json!(true), "{turn}");
    let state = ff.eval(&page, "demo.state").unwrap();
    assert_eq!((state["counter"].clone(), state["toolCalls"].clone()), (json!(3), json!(1)), "{state}");
    assert_eq!(state["chats"], json!([r#"Tool update_counter returned {"value":3}."#]), "{state}");

    // The control center lists the session and follows a turn of it live
    // (owner calls on a native host of the page's own, WatchSession's events unbatched).
    let session_id = started["value"].as_str().unwrap().to_owned();
    let control = ff.wait_for_context("the control center", |url| url.contains("/control.html")).unwrap();
    // In front: a hidden control center reads nothing until it shows
    // (headless Firefox reports a background tab visible; a headed one does not).
    ff.call("browsingContext.activate", json!({ "context": control }), TURN).unwrap();
    ff.wait_until(&control, "document.visibilityState === 'visible'", Duration::from_secs(5))
        .expect("the control center shows");
    let follow = format!("document.querySelector('button.follow[data-session=\"{session_id}\"]')");
    ff.wait_until(&control, &format!("!!{follow}"), Duration::from_secs(10))
        .expect("the control center lists the session");
    ff.eval(&control, &format!("({follow}.click(), true)")).unwrap();
    ff.wait_until(&control, "!document.getElementById('monitor').hidden", Duration::from_secs(5)).unwrap();
    // The history shows the tool turn before the watch began.
    ff.wait_until(
        &control,
        "!!document.querySelector('#monitor-log li[data-kind=\"tool-call\"]')",
        Duration::from_secs(10),
    )
    .expect("the transcript so far shows in the monitor");
    let turn = ff.eval(&page, "demo.attempt(() => demo.send('hello from firefox'))").unwrap();
    assert_eq!(turn["ok"], json!(true), "{turn}");
    let chat = "[...document.querySelectorAll('#monitor-log li[data-kind=\"chat\"] pre')].map((p) => p.textContent)";
    ff.wait_until(&control, &format!("{chat}.includes('You said: hello from firefox')"), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the live chat shows in Firefox: {e} {:?}", ff.eval(&control, chat)));
    // The Activity view lists the session's frontend tool call (ListActivity).
    ff.eval(&control, "(document.getElementById('tab-activity').click(), true)").unwrap();
    let called = format!(
        "[...document.querySelectorAll('#activity tr[data-kind=\"tool_called\"][data-session-id=\"{session_id}\"]')]\
         .map((r) => r.children[4].textContent)"
    );
    ff.wait_until(&control, &format!("{called}.includes('called update_counter')"), Duration::from_secs(10))
        .unwrap_or_else(|e| {
            panic!("the activity log shows the tool call in Firefox: {e} {:?}", ff.eval(&control, &called))
        });

    // The Recent list (issue 42): a session the page ended is listed under
    // the live ones and opens into the monitor, which reads its history.
    let ended = ff
        .eval(
            &page,
            "demo.attempt(async () => { const s = await demo.pedelec.createSession({ provider: 'scripted', \
             autoEndOnDisconnect: false }); await s.sendText('goodbye from firefox'); await s.end(); return s.sessionId; })",
        )
        .unwrap();
    assert_eq!(ended["ok"], json!(true), "{ended}");
    let ended_id = ended["value"].as_str().unwrap_or_default().to_owned();
    ff.eval(&control, "(document.getElementById('tab-sessions').click(), true)").unwrap();
    let open = format!("document.querySelector('#recent button.open-recent[data-session=\"{ended_id}\"]')");
    ff.wait_until(&control, &format!("!!{open}"), Duration::from_secs(10))
        .expect("the ended session is listed as recent");
    ff.eval(&control, &format!("({open}.click(), true)")).unwrap();
    ff.wait_until(
        &control,
        &format!(
            "document.getElementById('monitor-session').textContent === '{ended_id}' \
             && document.getElementById('monitor-status').textContent === 'ended'"
        ),
        Duration::from_secs(10),
    )
    .expect("the monitor opens the ended session");
    let log = "[...document.querySelectorAll('#monitor-log li')].map((li) => li.textContent)";
    ff.wait_until(
        &control,
        &format!("{log}.some((t) => t.includes('You said: goodbye from firefox'))"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("the ended session's history shows in Firefox: {e} {:?}", ff.eval(&control, log)));

    // The Sites view: limited to the built-in agent, the page is refused another; then every agent again.
    ff.eval(&control, "(document.getElementById('tab-sites').click(), true)").unwrap();
    let site = format!("#consents li[data-origin=\"{origin}\"]");
    let scripted = format!("document.querySelector('{site} input.site-agent[data-code=\"scripted\"]')");
    let save = format!("document.querySelector('{site} button.save-limits')");
    ff.wait_until(&control, &format!("!!{scripted}"), Duration::from_secs(10)).expect("the site's agents are offered");
    ff.eval(&control, &format!("({scripted}.click(), {save}.click(), true)")).unwrap();
    ff.wait_until(
        &control,
        &format!("document.getElementById('sites-outcome').textContent === '{origin} may use scripted, with the default session limit.'"),
        Duration::from_secs(10),
    )
    .expect("the restriction is saved");
    let refused = ff
        .eval(
            &page,
            "demo.attempt(() => demo.pedelec.createSession({ provider: 'cursor', autoEndOnDisconnect: false }))",
        )
        .unwrap();
    assert_eq!(
        (refused["code"].clone(), refused["details"]["reason"].clone()),
        (json!("ORIGIN_NOT_ALLOWED"), json!("agent_not_allowed")),
        "{refused}"
    );
    ff.wait_until(&control, &format!("{scripted}.checked"), Duration::from_secs(10))
        .expect("the box shows Core's copy");
    ff.eval(&control, &format!("({scripted}.click(), {save}.click(), true)")).unwrap();
    ff.wait_until(
        &control,
        &format!("document.getElementById('sites-outcome').textContent === '{origin} may use every agent, with the default session limit.'"),
        Duration::from_secs(10),
    )
    .expect("every agent again");
    ff.call("browsingContext.close", json!({ "context": control }), TURN).unwrap();

    // An asset uploaded from the page and read back (Core's loopback server, CORS for this origin).
    // The folder picker (issue 42) in Firefox: the page's pickWorkspace()
    // opens picker.html, the user opens a typed folder and picks it, and a
    // session created with the handle works there.
    let picked_area = tempfile::tempdir().unwrap();
    let project = picked_area.path().canonicalize().unwrap().join("picked");
    std::fs::create_dir_all(&project).unwrap();
    let picking = ff.eval_later(&page, "demo.attempt(() => demo.pedelec.pickWorkspace())").unwrap();
    let picker = ff.wait_for_context("the folder picker", |url| url.contains("/picker.html?pick=")).unwrap();
    ff.wait_until(&picker, "document.getElementById('origin').textContent !== '…'", Duration::from_secs(10))
        .expect("the picker is ready");
    let path = json!(project.display().to_string());
    ff.eval(
        &picker,
        &format!(
            "(document.getElementById('path').value = {path}, document.getElementById('go-button').click(), true)"
        ),
    )
    .unwrap();
    ff.wait_until(
        &picker,
        &format!("document.getElementById('path').value === {path} && !document.getElementById('pick').disabled"),
        Duration::from_secs(10),
    )
    .expect("the typed folder is open and pickable");
    ff.eval(&picker, "(document.getElementById('pick').click(), true)").unwrap();
    let picked = ff.value(picking, TURN).unwrap();
    assert_eq!((picked["ok"].clone(), picked["value"]["name"].clone()), (json!(true), json!("picked")), "{picked}");
    let handle = picked["value"]["handle"].as_str().unwrap_or_default().to_owned();
    assert!(handle.starts_with("wsh-"), "{picked}");
    let written = ff
        .eval(
            &page,
            &format!(
                "demo.attempt(async () => {{ const s = await demo.pedelec.createSession({{ provider: 'scripted', \
                 workspace: {{ handle: '{handle}' }}, autoEndOnDisconnect: false }}); \
                 await s.sendText('/write from-firefox.txt picked in firefox'); return s.sessionId; }})"
            ),
        )
        .unwrap();
    assert_eq!(written["ok"], json!(true), "{written}");
    assert_eq!(std::fs::read_to_string(project.join("from-firefox.txt")).unwrap(), "picked in firefox");

    let asset = ff
        .eval(
            &page,
            "demo.attempt(async () => { const s = demo.session(); \
             const file = new File(['hello from firefox'], 'hi.txt', { type: 'text/plain' }); \
             const path = await s.uploadAsset(file, '/notes/hi.txt'); \
             return { path, text: await s.readAsset('/notes/hi.txt', 'text'), listed: (await s.listAssets()).map((a) => a.path) }; })",
        )
        .unwrap();
    assert_eq!(
        asset,
        json!({ "ok": true, "value": { "path": "/notes/hi.txt", "text": "hello from firefox", "listed": ["/notes/hi.txt"] } })
    );

    let ended = ff.eval(&page, "demo.attempt(() => demo.session().end())").unwrap();
    assert_eq!(ended["ok"], json!(true), "{ended}");
    assert_eq!(ff.eval(&page, "demo.session().getStatus()").unwrap(), json!("ended"));
}
