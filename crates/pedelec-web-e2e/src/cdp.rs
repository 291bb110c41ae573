//! A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe`.
//!
//! Chromium reads commands from fd 3 and writes replies and events to fd 4,
//! each message a JSON text ending in a NUL byte. A reader thread routes
//! replies to their waiting callers by `id`; events are kept for
//! [`Browser::events`]. Sessions use the flat mode (`sessionId` on each
//! message), so one pipe drives every page.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::E2eError;

type Waiters = Arc<Mutex<HashMap<u64, Sender<Result<Value, String>>>>>;

/// A running headless Chromium and its CDP pipe.
pub struct Browser {
    child: Child,
    commands: Mutex<std::fs::File>,
    waiters: Waiters,
    events: Arc<Mutex<Vec<Value>>>,
    next_id: AtomicU64,
}

/// A reply that has not arrived yet.
pub struct PendingReply {
    method: String,
    rx: Receiver<Result<Value, String>>,
}

impl PendingReply {
    pub fn wait(self, timeout: Duration) -> Result<Value, E2eError> {
        match self.rx.recv_timeout(timeout) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(E2eError::Cdp { method: self.method, message }),
            Err(_) => Err(E2eError::Timeout(format!("CDP {} after {timeout:?}", self.method))),
        }
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by us alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Browser {
    /// Starts Chromium with the flags REFERENCE.md §7 found to work here.
    pub fn launch(
        chromium: &Path,
        profile: &Path,
        extension: &Path,
        envs: &[(&str, &Path)],
    ) -> Result<Browser, E2eError> {
        let (cmd_read, cmd_write) = pipe()?;
        let (reply_read, reply_write) = pipe()?;
        let mut command = Command::new(chromium);
        command
            .args(["--headless=new", "--no-sandbox", "--no-first-run", "--no-default-browser-check"])
            .args(["--remote-debugging-pipe", "--window-size=1100,760", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--load-extension={}", extension.display()))
            .arg(format!("--disable-extensions-except={}", extension.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
        let (child_in, child_out) = (cmd_read.as_raw_fd(), reply_write.as_raw_fd());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // Move both ends above 10 first, so dup2 onto 3/4 cannot clobber one with the other.
                let a = libc::fcntl(child_in, libc::F_DUPFD, 10);
                let b = libc::fcntl(child_out, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(a);
                libc::close(b);
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        drop(cmd_read);
        drop(reply_write);
        // Chromium's stderr is noisy; keep it in the test log only when asked.
        if let Some(stderr) = child.stderr.take() {
            std::thread::spawn(move || {
                let verbose = std::env::var_os("PEDELEC_E2E_BROWSER_LOG").is_some();
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if verbose {
                        eprintln!("[chromium] {line}");
                    }
                }
            });
        }
        let waiters: Waiters = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (w, e) = (waiters.clone(), events.clone());
        let reader = std::fs::File::from(reply_read);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut buf = Vec::new();
            while reader.read_until(0, &mut buf).is_ok_and(|n| n > 0) {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(message) = serde_json::from_slice::<Value>(&buf) {
                    route(&w, &e, message);
                }
                buf.clear();
            }
            // The browser is gone: fail every waiter instead of letting it time out.
            for (_, tx) in w.lock().unwrap_or_else(|p| p.into_inner()).drain() {
                let _ = tx.send(Err("the browser closed the pipe".into()));
            }
        });
        Ok(Browser {
            child,
            commands: Mutex::new(std::fs::File::from(cmd_write)),
            waiters,
            events,
            next_id: AtomicU64::new(1),
        })
    }

    /// Sends a command; the reply is waited for separately (so a long
    /// `Runtime.evaluate` can run while the test clicks elsewhere).
    pub fn send(&self, method: &str, params: Value, session: Option<&str>) -> Result<PendingReply, E2eError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let (tx, rx) = channel();
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        let mut bytes = serde_json::to_vec(&message)?;
        bytes.push(0);
        self.commands.lock().unwrap_or_else(|p| p.into_inner()).write_all(&bytes)?;
        Ok(PendingReply { method: method.to_owned(), rx })
    }

    pub fn call(&self, method: &str, params: Value, session: Option<&str>) -> Result<Value, E2eError> {
        self.send(method, params, session)?.wait(Duration::from_secs(30))
    }

    /// The browser process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Events received so far (e.g. `Runtime.exceptionThrown`).
    pub fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every target (pages, the extension's worker, extension pages).
    pub fn targets(&self) -> Result<Vec<Value>, E2eError> {
        let reply = self.call("Target.getTargets", json!({}), None)?;
        Ok(reply["targetInfos"].as_array().cloned().unwrap_or_default())
    }

    /// Polls the targets until one matches.
    pub fn wait_for_target(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Result<Value, E2eError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(t) = self.targets()?.into_iter().find(&matches) {
                return Ok(t);
            }
            if Instant::now() > deadline {
                return Err(E2eError::Timeout(format!("no target {what}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Attaches (flat mode) and returns the CDP session id.
    pub fn attach(&self, target_id: &str) -> Result<String, E2eError> {
        let reply = self.call("Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }), None)?;
        reply["sessionId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| E2eError::Protocol("attach gave no session".into()))
    }
}

fn route(waiters: &Waiters, events: &Arc<Mutex<Vec<Value>>>, message: Value) {
    if let Some(id) = message.get("id").and_then(Value::as_u64) {
        if let Some(tx) = waiters.lock().unwrap_or_else(|p| p.into_inner()).remove(&id) {
            let reply = match message.get("error") {
                Some(error) => Err(error.to_string()),
                None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
            };
            let _ = tx.send(reply);
        }
        return;
    }
    let mut events = events.lock().unwrap_or_else(|p| p.into_inner());
    // Bounded: a long benchmark must not grow without limit.
    if events.len() < 10_000 {
        events.push(message);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.send("Browser.close", json!({}), None).map(|r| r.wait(Duration::from_secs(3)));
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
