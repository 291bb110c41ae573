//! `cargo xtask screenshots`: a PNG of each view of the user's control
//! center, made from the real pages in headless Chromium against a real
//! Core, into `docs/screenshots/` (the README shows them).
//!
//! Core is given two sites' sessions on the built-in `scripted` agent (one
//! site approved with a folder), a turn with a command and a file edit, and
//! a command only the user may allow, so every view has something to show.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pedelec_protocol::pb;
use pedelec_sdk::grpc::GrpcTransport;
use pedelec_sdk::transport::{Call, Reply, Transport};
use pedelec_web_e2e::page::Page;
use pedelec_web_e2e::{E2eError, EXTENSION_ID, Rig};

const OWNER: &str = "app:pedelec-extension";
const SITES: [&str; 2] = ["https://docs.example", "https://shop.example"];
const WAIT: Duration = Duration::from_secs(20);

fn main() {
    if let Err(error) = run() {
        eprintln!("screenshots: {error}");
        std::process::exit(1);
    }
}

fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
}

fn run() -> Result<(), E2eError> {
    let rig = Rig::start(Duration::from_secs(5))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| E2eError::Setup(format!("a runtime: {e}")))?;
    let core = runtime.block_on(GrpcTransport::connect(rig.socket())).map_err(|e| E2eError::Setup(e.to_string()))?;
    let call = |request: Call| -> Result<Reply, E2eError> {
        runtime.block_on(core.call(request)).map_err(|e| E2eError::Protocol(format!("{}: {}", e.code, e.message)))
    };
    let folder = rig.dir.path().join("projects/handbook");
    std::fs::create_dir_all(&folder)?;
    let folder = folder.canonicalize()?.display().to_string();
    // The sites, as the user approved them: one with a folder, limited to
    // the built-in agent and four live sessions.
    for (site, folders, providers, max) in
        [(SITES[0], vec![folder.clone()], vec!["scripted".to_owned()], 4), (SITES[1], Vec::new(), Vec::new(), 0)]
    {
        let consent = pb::OriginConsent {
            origin: site.into(),
            approved: true,
            folders: folders.into_iter().map(|path| pb::FolderGrant { path, ..Default::default() }).collect(),
            providers,
            max_live_sessions: max,
            ..Default::default()
        };
        call(Call::SetConsent(pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) }))?;
    }
    // Their sessions, with some work done.
    let mut sessions = Vec::new();
    for (site, workspace) in [(SITES[0], Some(folder.clone())), (SITES[1], None), (SITES[1], None), (SITES[0], None)] {
        let request = pb::CreateSessionRequest {
            caller_origin: site.into(),
            auto_end_on_disconnect: Some(false),
            workspace: workspace.map(|path| pb::WorkspaceSpec { path, ..Default::default() }),
            permission_mode: pb::PermissionMode::App as i32,
            ..Default::default()
        };
        let Reply::CreateSession(pb::CreateSessionResponse { session: Some(info) }) =
            call(Call::CreateSession(request))?
        else {
            return Err(E2eError::Protocol("no session".into()));
        };
        sessions.push((site, info.session_id));
    }
    let send = |site: &str, id: &str, text: &str| {
        let request = pb::SendTextRequest {
            session_id: id.into(),
            caller_origin: site.into(),
            text: text.into(),
            ..Default::default()
        };
        call(Call::SendText(request))
    };
    let (site, first) = (sessions[0].0, sessions[0].1.clone());
    send(site, &first, "/plan read the handbook; fix the typo; report\n/command grep -rn recieve .")?;
    std::thread::sleep(Duration::from_millis(500));
    send(site, &first, "/write handbook.md Receive, not recieve.")?;
    std::thread::sleep(Duration::from_millis(500));
    // A command only the user may allow: it waits in Requests.
    send(sessions[1].0, &sessions[1].1, "/permission npm run deploy")?;
    // One that ended, for the Recent list.
    let (site, done) = (sessions[3].0, sessions[3].1.clone());
    send(site, &done, "summarise the handbook")?;
    std::thread::sleep(Duration::from_millis(300));
    call(Call::End(pb::EndRequest { session_id: done.clone(), caller_origin: site.into() }))?;

    let shoot = |page: &Page<'_>, name: &str| -> Result<(), E2eError> {
        std::thread::sleep(Duration::from_millis(300));
        let path = out_dir().join(format!("{name}.png"));
        page.screenshot(&path)?;
        println!("{}", path.display());
        Ok(())
    };
    let base = format!("chrome-extension://{EXTENSION_ID}/control.html");
    let control = Page::open(&rig.browser, &format!("{base}#sessions"))?;
    control.wait_until("document.readyState === 'complete'", WAIT)?;
    control.wait_until(&format!("document.querySelector('#sessions tr[data-session=\"{first}\"]')"), WAIT)?;
    control.wait_until(&format!("document.querySelector('#recent tr[data-session=\"{done}\"]')"), WAIT)?;
    shoot(&control, "control-sessions")?;
    control.click(&format!("button.follow[data-session=\"{first}\"]"))?;
    control.wait_until("document.querySelectorAll('#monitor-log li').length > 3", WAIT)?;
    shoot(&control, "control-monitor")?;
    control.click("#tab-requests")?;
    control.wait_until("document.querySelector('#requests li')", WAIT)?;
    shoot(&control, "control-requests")?;
    control.click("#tab-sites")?;
    control.wait_until("document.querySelector('#consents li')", WAIT)?;
    shoot(&control, "control-sites")?;
    control.click("#tab-agents")?;
    control.wait_until("document.querySelector('#agents tr[data-code=\"scripted\"]')", WAIT)?;
    shoot(&control, "control-agents")?;
    control.click("#tab-activity")?;
    control.wait_until("document.querySelectorAll('#activity tbody tr').length > 2", WAIT)?;
    shoot(&control, "control-activity")?;
    Ok(())
}
