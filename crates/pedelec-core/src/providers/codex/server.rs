//! One `codex app-server` process and its stdio, shared by the threads of
//! several sessions: one site's sessions on one codex configuration (at
//! most [`MAX_THREADS`] at once).
//!
//! **Why per site.** A thread's events flow back at its reader's pace: when
//! a session's subscribers fall behind, its channel fills and Core stops
//! reading codex's stdout, which stalls every thread of that process. Sharing
//! within one site keeps that stall, and a crash, among that site's own
//! sessions; another site's never wait for it.
//!
//! **Routing.** Three tasks: a writer of our lines; a reader that routes each
//! message — a response by its request id to the runtime that asked, a
//! notification or server request by its `threadId` to that thread's runtime
//! (one arriving before its thread is known, such as an MCP server's start-up
//! status, waits among a few [`ORPHANS`] until the thread registers); and a
//! waiter that owns the process and publishes its exit. When the reader
//! ends (codex exited or closed stdout) every route is dropped, so every
//! runtime's next read says codex went away.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::wire::{self, Incoming};
use crate::providers::process::{
    AgentProcess, CommandLine, ExitReport, Line, LineReader, MAX_LINE_BYTES, OwnedProcess,
};
use crate::providers::warm::PrivateFolder;
use crate::providers::{ProviderFailure, cli_turn::str_field};

/// Messages for a thread not yet registered, kept until it is (the oldest go).
const ORPHANS: usize = 64;

pub struct Connection {
    process: OwnedProcess,
    outgoing: mpsc::UnboundedSender<String>,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicI64,
    tasks: [tokio::task::JoinHandle<()>; 2],
    /// Its cwd (each thread works in its own session's workspace).
    _folder: PrivateFolder,
}

#[derive(Default)]
struct Routes {
    threads: HashMap<String, mpsc::Sender<Incoming>>,
    pending: HashMap<i64, mpsc::Sender<Incoming>>,
    orphans: VecDeque<(String, Incoming)>,
    /// The reader ended: nothing more will be routed.
    closed: bool,
}

impl Connection {
    /// Starts `codex app-server` in a private folder of its own.
    pub fn spawn(command: &CommandLine, code: &str) -> Result<Arc<Connection>, ProviderFailure> {
        let folder = PrivateFolder::new(code).map_err(PrivateFolder::failure)?;
        let mut process = AgentProcess::spawn(command, folder.path())?;
        let (Some(mut stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
            return Err(ProviderFailure::crashed("codex app-server's stdio could not be piped"));
        };
        let (outgoing, mut lines) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                let written = async {
                    stdin.write_all(line.as_bytes()).await?;
                    stdin.write_all(b"\n").await?;
                    stdin.flush().await
                };
                if let Err(error) = written.await {
                    tracing::debug!(%error, "codex app-server's stdin closed");
                    return;
                }
            }
        });
        let routes = Arc::new(Mutex::new(Routes::default()));
        let reader = tokio::spawn(read(stdout, routes.clone()));
        Ok(Arc::new(Connection {
            process: OwnedProcess::new(process),
            outgoing,
            routes,
            next_id: AtomicI64::new(0),
            tasks: [reader, writer],
            _folder: folder,
        }))
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether codex still runs and is read.
    pub fn alive(&self) -> bool {
        !self.process.exited_yet() && !self.lock().closed && !self.tasks[0].is_finished()
    }

    /// Threads it serves now.
    pub fn threads(&self) -> usize {
        self.lock().threads.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn send(&self, line: String) {
        // A closed writer means codex is gone; the reader says so next.
        let _ = self.outgoing.send(line);
    }

    pub fn outgoing(&self) -> mpsc::UnboundedSender<String> {
        self.outgoing.clone()
    }

    /// Sends a request whose answer goes to `to`; its id.
    pub fn request(&self, method: &str, params: Value, to: &mpsc::Sender<Incoming>) -> i64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().pending.insert(id, to.clone());
        self.send(wire::request(id, method, params));
        id
    }

    /// Routes `thread`'s messages to `to` from now on, with those that came first.
    pub fn register(&self, thread: &str, to: &mpsc::Sender<Incoming>) {
        let mut routes = self.lock();
        routes.threads.insert(thread.to_owned(), to.clone());
        let (early, rest): (VecDeque<_>, VecDeque<_>) = routes.orphans.drain(..).partition(|(t, _)| t == thread);
        routes.orphans = rest;
        for (_, message) in early {
            let _ = to.try_send(message);
        }
    }

    /// Stops routing `thread` to `to` (a later runtime of the same thread
    /// may have taken the route over: that one stays).
    pub fn unregister(&self, thread: &str, to: &mpsc::Sender<Incoming>) {
        let mut routes = self.lock();
        if routes.threads.get(thread).is_some_and(|route| route.same_channel(to)) {
            routes.threads.remove(thread);
        }
    }

    /// Ends codex (its whole process group).
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Why codex went away (see [`OwnedProcess::exit_report`]).
    pub async fn exit_report(&self, grace: Duration) -> ExitReport {
        self.process.exit_report(grace).await
    }

    /// Resolves once codex exited.
    pub async fn exited(&self) -> ExitReport {
        self.process.exited().await
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The process ends with `process`; the tasks would linger on dead pipes.
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// The reader: each line to where it belongs, until codex's stdout ends.
async fn read(stdout: tokio::process::ChildStdout, routes: Arc<Mutex<Routes>>) {
    let mut reader = LineReader::new(stdout, MAX_LINE_BYTES);
    loop {
        let message = match reader.next_line().await {
            Ok(Some(Line::Text(text))) if text.trim().is_empty() => continue,
            Ok(Some(Line::Text(text))) => wire::parse_line(&text),
            Ok(Some(Line::TooLong(len))) => Incoming::Invalid(format!("a {len}-byte line exceeds the line limit")),
            Ok(Some(Line::NotUtf8)) => Incoming::Invalid("a line is not UTF-8".into()),
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "reading codex app-server's stdout failed");
                break;
            }
        };
        let to = {
            let mut routes = routes.lock().unwrap_or_else(|p| p.into_inner());
            match &message {
                Incoming::Response { id, .. } => routes.pending.remove(id),
                Incoming::Request { params, .. } | Incoming::Notification { params, .. } => {
                    let thread = str_field(params, "threadId");
                    match routes.threads.get(&thread) {
                        Some(to) => Some(to.clone()),
                        None if !thread.is_empty() => {
                            if routes.orphans.len() == ORPHANS {
                                routes.orphans.pop_front();
                            }
                            routes.orphans.push_back((thread, message));
                            continue;
                        }
                        None => None,
                    }
                }
                Incoming::Invalid(_) => None,
            }
        };
        match to {
            // Full, this waits: codex then waits in its pipe (see the module doc).
            Some(to) => {
                let _ = to.send(message).await;
            }
            None => match message {
                Incoming::Notification { method, params } if method == "configWarning" => {
                    tracing::info!(summary = %str_field(&params, "summary"), "codex configuration warning");
                }
                other => tracing::trace!(?other, "a codex message for no thread of ours"),
            },
        }
    }
    let mut routes = routes.lock().unwrap_or_else(|p| p.into_inner());
    routes.closed = true;
    routes.threads.clear();
    routes.pending.clear();
    routes.orphans.clear();
}

impl crate::providers::share::Shareable for Connection {
    fn pid(&self) -> Option<u32> {
        Connection::pid(self)
    }
    fn alive(&self) -> bool {
        Connection::alive(self)
    }
    fn users(&self) -> usize {
        self.threads()
    }
}

/// The running app-servers of one codex provider, per site.
pub type Servers = crate::providers::share::Shared<Connection>;
