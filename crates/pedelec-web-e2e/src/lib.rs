//! The browser path end to end, in real headless Chromium: the demo page
//! (served on 127.0.0.1) runs the wasm build of pedelec-sdk, which talks to
//! the Pedelec extension, which relays to a real `pedelec-native-host`, which
//! talks to a real `pedelec-core` on a temporary socket.
//!
//! [`Rig`] sets all of that up; [`cdp`] drives Chromium over
//! `--remote-debugging-pipe`; [`page`] is one tab; [`server`] serves files.
//! Needs `cargo xtask web` (the package in `target/web`) and Chromium
//! (`/usr/lib/chromium/chromium`, or `$PEDELEC_CHROMIUM`).

pub mod bidi;
pub mod cdp;
pub mod page;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::native::find_host_binary;

use crate::cdp::Browser;
use crate::page::Page;
use crate::server::StaticServer;

/// The id the extension's manifest key fixes (extension/README.md).
pub const EXTENSION_ID: &str = "ighbaanpnpjegfpbhfnaekbncchadgfe";

/// The rig's Core config.toml: the defaults, and a comment the control
/// center's settings must keep when it writes the file.
pub const CORE_CONFIG: &str = "# The browser tests' Core (pedelec-web-e2e).\nturn_timeout_secs = 600 # the default\n";

#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("CDP {method} failed: {message}")]
    Cdp { method: String, message: String },
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("script `{expression}` threw: {message}")]
    Script { expression: String, message: String },
    #[error("unexpected CDP answer: {0}")]
    Protocol(String),
    #[error("setup: {0}")]
    Setup(String),
    #[error("sdk: {0}")]
    Sdk(#[from] pedelec_sdk::PedelecError),
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("crates/<name> sits in the workspace").to_path_buf()
}

/// `target/web` as `cargo xtask web` writes it.
pub fn web_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("web")
}

/// The Chromium binary (the real one, not the `/usr/bin` wrapper script).
pub fn chromium() -> PathBuf {
    std::env::var_os("PEDELEC_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/lib/chromium/chromium".into())
}

/// What is missing to run the browser test, if anything.
pub fn missing_prerequisite() -> Option<String> {
    if !chromium().is_file() {
        return Some(format!(
            "Chromium not found at {} (apt-get install -y chromium, or set PEDELEC_CHROMIUM)",
            chromium().display()
        ));
    }
    missing_web_build()
}

/// Whether `cargo xtask web` has laid out what the browser tests load.
pub fn missing_web_build() -> Option<String> {
    let built = ["pkg/pedelec_sdk_bg.wasm", "demo/index.html", "bundled/index.html"];
    if !built.iter().all(|file| web_dir().join(file).is_file()) {
        return Some(format!("no web package in {} (run `cargo xtask web`)", web_dir().display()));
    }
    None
}

/// Core, a registered native host, two page origins and Chromium with the extension.
pub struct Rig {
    // Field order is drop order: the browser goes before Core and the files.
    pub browser: Browser,
    pub core: CoreProcess,
    /// The origin the tests approve.
    pub site: StaticServer,
    /// A second origin (another port) that is never approved.
    pub other_site: StaticServer,
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub fn start(disconnect_grace: Duration) -> Result<Rig, E2eError> {
        Rig::start_with(disconnect_grace, "")
    }

    /// [`Rig::start`] with `extra` appended to Core's config.toml.
    pub fn start_with(disconnect_grace: Duration, extra: &str) -> Result<Rig, E2eError> {
        if let Some(missing) = missing_prerequisite() {
            return Err(E2eError::Setup(missing));
        }
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("run/core.sock");
        let state = dir.path().join("state");
        // Core's own config directory: the control center writes its
        // settings there, never into the developer's.
        let core_config = dir.path().join("core-config");
        std::fs::create_dir_all(&core_config)?;
        std::fs::write(core_config.join("config.toml"), format!("{CORE_CONFIG}{extra}"))?;
        let core_config = core_config.to_str().ok_or_else(|| E2eError::Setup("a temp dir that is not UTF-8".into()))?;
        let core = CoreProcess::spawn_with_args(
            &pedelec_sdk::daemon::find_core_binary(),
            &socket,
            &state,
            disconnect_grace,
            &["--config-dir", core_config],
        )?;
        let profile = dir.path().join("profile");
        let config = dir.path().join("config");
        std::fs::create_dir_all(&profile)?;
        let host = std::fs::canonicalize(find_host_binary())
            .map_err(|e| E2eError::Setup(format!("pedelec-native-host not built ({e}); cargo build --bins")))?;
        // XDG_CONFIG_HOME keeps the allowed-ids file `install` writes inside the temp dir.
        let status = Command::new(&host)
            .args(["install", "--extension-id", EXTENSION_ID, "--browser", "chromium", "--profile"])
            .arg(&profile)
            .arg("--host-path")
            .arg(&host)
            .env("XDG_CONFIG_HOME", &config)
            .status()?;
        if !status.success() {
            return Err(E2eError::Setup(format!("pedelec-native-host install failed ({status})")));
        }
        let site = StaticServer::start(&web_dir())?;
        let other_site = StaticServer::start(&web_dir())?;
        let extension = workspace_root().join("extension");
        // The host inherits Chromium's environment: this is how it finds our Core.
        let envs: [(&str, &Path); 3] =
            [("PEDELEC_CORE_SOCKET", &socket), ("PEDELEC_STATE_DIR", &state), ("XDG_CONFIG_HOME", &config)];
        let browser = Browser::launch(&chromium(), &profile, &extension, &envs)?;
        let worker = format!("chrome-extension://{EXTENSION_ID}/background.js");
        browser.wait_for_target("the extension's service worker (wrong manifest key?)", |t| {
            t["url"].as_str() == Some(worker.as_str())
        })?;
        Ok(Rig { browser, core, site, other_site, dir })
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/core.sock")
    }

    /// Opens the demo page on `site` and waits until its SDK is loaded.
    pub fn open_demo(&self, site: &StaticServer) -> Result<Page<'_>, E2eError> {
        let page = Page::open(&self.browser, &format!("{}/demo/index.html", site.origin()))?;
        page.wait_until("window.demo", Duration::from_secs(20))?;
        Ok(page)
    }

    /// Finds the approval tab the extension opened for `origin` and clicks `button`.
    pub fn answer_approval(&self, origin: &str, button: &str) -> Result<(), E2eError> {
        // The request section shows once the worker confirmed the origin is pending.
        self.answer_prompt(&format!("origin={}", encode_component(origin)), "request", button)
    }

    /// Finds the workspace prompt the extension opened for `origin` and
    /// `path` and clicks `button` (`#grant`, `#grant-parent`, `#refuse-grant`).
    pub fn answer_grant(&self, origin: &str, path: &str, button: &str) -> Result<(), E2eError> {
        let query = format!("origin={}&path={}", encode_component(origin), encode_component(path));
        self.answer_prompt(&query, "grant-request", button)
    }

    /// Clicks `button` on the approval page opened with `query`, once its
    /// `section` shows (the worker confirmed the request is pending).
    fn answer_prompt(&self, query: &str, section: &str, button: &str) -> Result<(), E2eError> {
        let url = format!("chrome-extension://{EXTENSION_ID}/approve.html?{query}");
        let target = self.browser.wait_for_target(&format!("approval page {query}"), |t| {
            t["type"].as_str() == Some("page") && t["url"].as_str() == Some(url.as_str())
        })?;
        let page = Page::attach(&self.browser, target["targetId"].as_str().unwrap_or_default())?;
        page.wait_until(&format!("!document.getElementById('{section}').hidden"), Duration::from_secs(10))?;
        // The buttons arm only once the tab has been in front and focused for a while.
        self.browser.call("Page.bringToFront", serde_json::json!({}), Some(&page.session))?;
        let selector = serde_json::to_string(button)?;
        page.wait_until(&format!("!document.querySelector({selector}).disabled"), Duration::from_secs(10))?;
        page.click(button)
    }

    /// Finds the prompt the extension opened for an agent's request only
    /// the user may answer, and clicks the option `option_id` ("" rejects).
    /// Returns what the prompt showed: `{ origin, agent, folder, command }`.
    pub fn answer_user_permission(&self, option_id: &str) -> Result<serde_json::Value, E2eError> {
        let prefix = format!("chrome-extension://{EXTENSION_ID}/approve.html?permission=");
        let target = self.browser.wait_for_target("the user's permission prompt", |t| {
            t["type"].as_str() == Some("page") && t["url"].as_str().is_some_and(|u| u.starts_with(&prefix))
        })?;
        let page = Page::attach(&self.browser, target["targetId"].as_str().unwrap_or_default())?;
        page.wait_until("!document.getElementById('permission-request').hidden", Duration::from_secs(10))?;
        let shown = page.eval(
            r#"({ origin: document.getElementById("permission-origin").textContent,
                 agent: document.getElementById("permission-agent").textContent,
                 folder: document.getElementById("permission-folder").textContent,
                 command: document.getElementById("permission-command").textContent })"#,
        )?;
        self.browser.call("Page.bringToFront", serde_json::json!({}), Some(&page.session))?;
        let selector = serde_json::to_string(&format!("button.permission-option[data-option=\"{option_id}\"]"))?;
        page.wait_until(&format!("!document.querySelector({selector}).disabled"), Duration::from_secs(10))?;
        page.click(&format!("button.permission-option[data-option=\"{option_id}\"]"))?;
        Ok(shown)
    }

    /// Opens the extension's approval page in manage mode (the list with revoke buttons).
    pub fn open_manager(&self) -> Result<Page<'_>, E2eError> {
        let page = Page::open(&self.browser, &format!("chrome-extension://{EXTENSION_ID}/approve.html"))?;
        page.wait_until("document.readyState === 'complete'", Duration::from_secs(10))?;
        Ok(page)
    }
}

/// A page script (a function of `frames` and `waitMs`) that sends raw
/// `NativeFrame`s to the extension through its content-script relay, as a
/// page that bypasses the SDK would, and resolves to `{ replies, approvals }`:
/// the reply frame to each request in order (`null` when none came within
/// `waitMs`) and the `approval` messages the extension sent meanwhile. The
/// relay exists in Chromium and Firefox alike, so both tests use it.
pub const RAW_FRAMES_JS: &str = r#"(async (frames, waitMs) => {
  const port = 1000000 + Math.floor(Math.random() * 1000000);
  const replies = {};
  const approvals = [];
  const post = (type, message) =>
    window.postMessage({ channel: "pedelec:page", port, type, message }, location.origin);
  const connected = new Promise((resolve, reject) => {
    window.addEventListener("message", (event) => {
      const d = event.data;
      if (event.source !== window || !d || d.channel !== "pedelec:extension" || d.port !== port) return;
      if (d.type === "connected") resolve();
      if (d.type !== "message") return;
      if (d.message.type === "frame" && d.message.frame.requestId) replies[d.message.frame.requestId] = d.message.frame;
      if (d.message.type === "approval") approvals.push(d.message);
    });
    setTimeout(() => reject(new Error("the relay did not connect")), 3000);
  });
  post("connect");
  await connected;
  for (const frame of frames) post("message", { type: "frame", frame });
  const deadline = Date.now() + waitMs;
  while (Date.now() < deadline && frames.some((f) => !replies[f.requestId])) {
    await new Promise((r) => setTimeout(r, 20));
  }
  post("disconnect");
  return { replies: frames.map((f) => replies[f.requestId] ?? null), approvals };
})"#;

/// Frames a page on an approved origin might forge (issue 38), each with the
/// field the extension must name when it refuses it: the proto spelling of
/// the call and of the grants (the native host decodes both spellings),
/// the two mixed spellings, a call pages may not make (an owner-only one),
/// and a session bound to another origin. `folder` is a folder the user
/// never granted.
pub fn forged_frames(folder: &str) -> Vec<(serde_json::Value, &'static str)> {
    use serde_json::json;
    vec![
        (
            json!({ "requestId": 9001, "request": { "create_session": {
                "provider": "scripted", "workspace": { "path": folder, "granted_roots": ["/"] } } } }),
            "request.create_session",
        ),
        (
            json!({ "requestId": 9002, "request": { "createSession": {
                "provider": "scripted", "workspace": { "path": folder, "granted_roots": ["/"] } } } }),
            "request.createSession.workspace.granted_roots",
        ),
        (
            json!({ "requestId": 9003, "request": { "createSession": {
                "provider": "scripted", "workspace": { "path": folder, "grantedRoots": ["/"] } } } }),
            "request.createSession.workspace.grantedRoots",
        ),
        (
            json!({ "requestId": 9004, "request": { "revokeOrigin": { "origin": "https://example.com" } } }),
            "request.revokeOrigin",
        ),
        (
            json!({ "requestId": 9005, "request": { "createSession": {
                "provider": "scripted", "callerOrigin": "https://evil.example" } } }),
            "request.createSession.callerOrigin",
        ),
    ]
}

/// Checks what [`RAW_FRAMES_JS`] answered to [`forged_frames`]: each one
/// refused with INVALID_ARGUMENT naming its field, and no prompt opened.
pub fn assert_forged_refused(sent: &serde_json::Value, forged: &[(serde_json::Value, &str)]) {
    use serde_json::json;
    // Every frame is checked before failing, so a failure lists all that got through.
    let mut passed = Vec::new();
    for (i, (frame, field)) in forged.iter().enumerate() {
        let reply = &sent["replies"][i];
        let details: serde_json::Value =
            serde_json::from_str(reply["error"]["detailsJson"].as_str().unwrap_or("null")).unwrap_or_default();
        if reply["error"]["code"] != json!("INVALID_ARGUMENT") || details["field"] != json!(field) {
            passed.push(format!("{frame}\n  → {reply} (expected INVALID_ARGUMENT naming {field})"));
        }
    }
    assert!(passed.is_empty(), "forged frames not refused by the extension:\n{}", passed.join("\n"));
    assert_eq!(sent["approvals"], json!([]), "a refused frame opens no prompt: {sent}");
}

/// `encodeURIComponent` for an origin (`:` and `/` are the only characters that need it).
pub fn encode_component(text: &str) -> String {
    text.replace('%', "%25").replace(':', "%3A").replace('/', "%2F")
}

/// Pulls `p50=<n>us p99=<n>us` out of the scripted provider's `/tools` reply.
pub fn parse_round_trip(reply: &str) -> Option<(u64, u64)> {
    let number = |key: &str| -> Option<u64> {
        let rest = &reply[reply.find(key)? + key.len()..];
        rest[..rest.find("us")?].parse().ok()
    };
    Some((number("p50=")?, number("p99=")?))
}

fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; the fields after its closing ')' do not.
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// The `pedelec-native-host` processes Chromium (`browser_pid`) started for this rig.
pub fn native_host_pids(browser_pid: u32) -> Vec<u32> {
    let Ok(host) = std::fs::canonicalize(find_host_binary()) else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == host))
        .filter(|pid| {
            let mut current = *pid;
            (0..16).any(|_| match parent_pid(current) {
                Some(parent) if parent == browser_pid => true,
                Some(parent) if parent > 1 => {
                    current = parent;
                    false
                }
                _ => false,
            })
        })
        .collect()
}
