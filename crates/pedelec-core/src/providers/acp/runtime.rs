//! One agent process and the ACP connection over its stdio ([`Connection`],
//! shared by the sessions of one site), and each session's view of it
//! ([`Runtime`]: its own channel of routed updates and its permission
//! binding).
//!
//! We spawn the process ourselves ([`AgentProcess`], owned by an
//! [`OwnedProcess`]: its own process group, stderr tail kept, the group
//! ended when the connection goes) rather than through the crate's
//! `AcpAgent`, and hand the crate a [`Lines`] transport over the child's
//! pipes. That keeps one owner for the process tree — the agent *and* what
//! it started (MCP bridges, shells) end together — and lets every adapter
//! report exits the same way. Incoming lines go through
//! [`LineReader`], so an over-long or non-UTF-8 line is skipped instead of
//! growing a buffer without bound.
//!
//! The crate runs a connection inside a future (`connect_with`); it lives in
//! a task of its own for as long as the connection, and turns use its
//! [`ConnectionTo`]. Handlers run in the crate's dispatch loop, in arrival
//! order: they only route into a session's channel (and answer permission
//! requests at once), so a prompt's response is routed only after every
//! update sent before it is in the channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{CancelNotification, InitializeResponse, RequestPermissionRequest, SessionId};
use agent_client_protocol::{Agent, Client, JsonRpcRequest, Lines, UntypedMessage};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::permission::{self, PermissionPolicy};
use super::updates::Inbound;
use crate::providers::process::{AgentProcess, CommandLine, Line, LineReader, MAX_LINE_BYTES, OwnedProcess};
use crate::providers::warm::PrivateFolder;
use crate::providers::{ProviderFailure, TurnSink};

/// How long a process that closed its stdout gets to exit before we end it.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// How long `session/cancel` gets to reach the agent before the group is signalled.
const CANCEL_FLUSH: Duration = Duration::from_millis(200);

/// Either the agent answered (possibly with a JSON-RPC error), or it is gone.
pub type Answer<T> = Result<Result<T, agent_client_protocol::Error>, ProviderFailure>;

/// One agent process and its ACP connection, shared by the ACP sessions of
/// one site (see `share`): updates and permission requests are routed to
/// each session's [`Runtime`] by their `sessionId`.
pub struct Connection {
    process: OwnedProcess,
    cx: ConnectionTo<Agent>,
    routes: Arc<Mutex<Routes>>,
    /// Ends the connection future (which closes the agent's stdin).
    stop: Mutex<Option<oneshot::Sender<()>>>,
    driver: tokio::task::JoinHandle<()>,
    /// The agent's `initialize` answer, once it gave it.
    pub init: std::sync::OnceLock<InitializeResponse>,
    /// Its cwd (each session works in the workspace its `session/new` names).
    _folder: PrivateFolder,
    /// The ACP sessions ever opened on it: a session's later runtime (after
    /// a restart, a model or tool change) gets a fresh process, where its
    /// `session/load` is a real load, not one of a session still open here.
    opened: Mutex<std::collections::HashSet<String>>,
    /// Takes no more sessions (one of its turns ignored a cancel: its state is unknown).
    retired: std::sync::atomic::AtomicBool,
}

/// Where each ACP session's traffic goes.
#[derive(Default)]
struct Routes {
    sessions: HashMap<String, Route>,
    /// Sessions opened on this process and not yet closed (routed or not).
    users: usize,
}

struct Route {
    to: mpsc::UnboundedSender<Routed>,
    binding: Binding,
}

/// A session's view of a [`Connection`]: its own inbound channel and permission binding.
pub struct Runtime {
    conn: Arc<Connection>,
    inbound: mpsc::UnboundedReceiver<Routed>,
    to: mpsc::UnboundedSender<Routed>,
    binding: Binding,
    /// The ACP session routed here, once opened.
    session: Option<String>,
    /// No longer counted among the agent's users (closed).
    released: bool,
}

/// ACP sessions one agent process opens in its life. ACP v1 cannot close a
/// session, so an agent keeps every session opened on it until it exits: past
/// this many, a site's next session gets a fresh process and this one ends
/// with its last session.
const MAX_OPENED: usize = 64;

/// How many `session/update`s read from the agent may wait for a turn to
/// take them. Beyond that Core stops reading the agent's stdout, so an agent
/// that streams faster than the application reads (see
/// [`Runtime::request_cancellable`]'s `flow`) waits in its pipe instead of
/// in Core's memory.
const QUEUED_UPDATES: usize = 1024;

/// An inbound item, with the room it holds in [`QUEUED_UPDATES`] when it
/// came from [`incoming`] (freed once the item is taken).
type Routed = (Inbound, Option<tokio::sync::OwnedSemaphorePermit>);

/// The agent's stdout as lines for the crate: blank, over-long and
/// non-UTF-8 lines are dropped (logged), never buffered whole. A
/// `session/update` notification goes straight into `updates` instead: it
/// is most of a turn's traffic, and the crate's dispatch of each one costs
/// far more of Core's CPU than the one JSON parse here (docs/performance.md).
/// Order is kept: an update is in the channel before any later line (a
/// prompt's response among them) reaches the crate. Reading pauses while
/// [`QUEUED_UPDATES`] of them wait to be taken.
fn incoming(
    stdout: tokio::process::ChildStdout,
    routes: Arc<Mutex<Routes>>,
) -> impl futures::Stream<Item = std::io::Result<String>> + Send {
    let reader = LineReader::new(stdout, MAX_LINE_BYTES);
    let room = std::sync::Arc::new(tokio::sync::Semaphore::new(QUEUED_UPDATES));
    futures::stream::unfold((reader, routes, room), |(mut reader, routes, room)| async move {
        loop {
            match reader.next_line().await {
                Ok(Some(Line::Text(text))) if text.trim().is_empty() => continue,
                Ok(Some(Line::Text(text))) => match session_update(&text) {
                    Some(update) => {
                        let Ok(permit) = room.clone().acquire_owned().await else { return None };
                        route(&routes, update, Some(permit));
                    }
                    None => return Some((Ok(text), (reader, routes, room))),
                },
                Ok(Some(Line::TooLong(len))) => tracing::warn!(len, "skipped an over-long line from the ACP agent"),
                Ok(Some(Line::NotUtf8)) => tracing::warn!("skipped a non-UTF-8 line from the ACP agent"),
                Ok(None) => return None,
                Err(error) => return Some((Err(error), (reader, routes, room))),
            }
        }
    })
}

/// The ACP session an update is for.
fn session_of(update: &Inbound) -> String {
    match update {
        Inbound::TextChunk { session_id, .. } => session_id.clone(),
        Inbound::Update(params) => params.get("sessionId").and_then(serde_json::Value::as_str).unwrap_or("").to_owned(),
        Inbound::Permission { .. } => String::new(),
    }
}

/// Hands an update to its session's runtime; one for no open session (a
/// `session/new` announcing commands before its answer, a `session/load`
/// replay) is dropped.
fn route(routes: &Mutex<Routes>, update: Inbound, room: Option<tokio::sync::OwnedSemaphorePermit>) {
    let session = session_of(&update);
    let to = routes.lock().unwrap_or_else(|p| p.into_inner()).sessions.get(&session).map(|r| r.to.clone());
    match to {
        Some(to) => drop(to.send((update, room))),
        None => tracing::trace!(%session, "an ACP update for no open session"),
    }
}

/// A JSON-RPC 2.0 `session/update` notification (no `id` member), or
/// `None` for any other line, which the crate then reads.
fn session_update(line: &str) -> Option<Inbound> {
    // Most lines that are not updates are told apart without parsing.
    if !line.contains("\"session/update\"") {
        return None;
    }
    if let Some(text) = super::updates::read_text_chunk(line) {
        return Some(text);
    }
    let serde_json::Value::Object(mut message) = serde_json::from_str(line).ok()? else { return None };
    let notification = message.get("jsonrpc").and_then(serde_json::Value::as_str) == Some("2.0")
        && message.get("method").and_then(serde_json::Value::as_str) == Some("session/update")
        && !message.contains_key("id");
    if !notification {
        return None;
    }
    Some(Inbound::Update(message.remove("params").unwrap_or(serde_json::Value::Null)))
}

/// Who answers the agent's permission requests: the session's policy, and
/// its application when that answers them. Shared with the connection's
/// handler and replaced whole by [`Runtime::bind`]: a warm runtime is
/// started before the session that takes it exists.
type Binding = std::sync::Arc<
    std::sync::RwLock<(PermissionPolicy, Option<std::sync::Arc<dyn crate::providers::PermissionAsker>>)>,
>;

impl Connection {
    /// Starts the agent in a private folder of its own and connects to it
    /// (no ACP traffic yet).
    pub async fn spawn(command: &CommandLine, code: &str) -> Result<Arc<Connection>, ProviderFailure> {
        let folder = PrivateFolder::new(code).map_err(PrivateFolder::failure)?;
        let mut process = AgentProcess::spawn(command, folder.path())?;
        let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
            return Err(ProviderFailure::crashed("the ACP agent's stdio could not be piped"));
        };
        let outgoing = Box::pin(futures::sink::unfold(stdin, async |mut stdin, line: String| {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await?;
            Ok::<_, std::io::Error>(stdin)
        }));
        let routes = Arc::new(Mutex::new(Routes::default()));
        let transport = Lines::new(outgoing, Box::pin(incoming(stdout, routes.clone())));

        let (cx_tx, cx_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let updates = routes.clone();
        let asked = routes.clone();
        let driver = tokio::spawn(async move {
            let result = Client
                .v1()
                .name("pedelec-core")
                // Untyped on purpose: a typed `SessionNotification` handler
                // would drop, unseen, any update variant newer than the schema.
                .on_receive_notification(
                    async move |message: UntypedMessage, _cx| {
                        if message.method() == "session/update" {
                            route(&updates, Inbound::Update(message.params().clone()), None);
                        } else {
                            tracing::debug!(method = message.method(), "ignored an ACP notification");
                        }
                        Ok(())
                    },
                    agent_client_protocol::on_receive_notification!(),
                )
                .on_receive_request(
                    async move |request: RequestPermissionRequest, responder, cx| {
                        let session = request.session_id.0.to_string();
                        let found = asked.lock().unwrap_or_else(|p| p.into_inner()).sessions.get(&session).map(|r| {
                            let bound = r.binding.read().unwrap_or_else(|p| p.into_inner());
                            (bound.0.decide(&request), bound.1.clone(), r.to.clone())
                        });
                        // A request for no open session of ours: nobody's policy allows it.
                        let Some((decision, asker, decisions)) = found else {
                            tracing::info!(%session, "refused an ACP permission request for no open session");
                            return responder.respond(permission::refuse_all(&request));
                        };
                        let Some(asker) = asker else {
                            tracing::info!(title = %decision.title, outcome = %decision.outcome, "answered an ACP permission request");
                            let _ = decisions.send((Inbound::Permission { title: decision.title, outcome: decision.outcome }, None));
                            return responder.respond(decision.response);
                        };
                        // The application answers: off the dispatch loop, so
                        // other traffic (the cancel among it) flows meanwhile.
                        let ask = permission::to_app(&request, &decision);
                        cx.spawn(async move {
                            let answer = asker.ask(ask).await;
                            let decision = permission::from_app(&request, answer, decision);
                            tracing::info!(title = %decision.title, outcome = %decision.outcome, "the application answered an ACP permission request");
                            let _ = decisions.send((Inbound::Permission { title: decision.title, outcome: decision.outcome }, None));
                            responder.respond(decision.response)
                        })
                    },
                    agent_client_protocol::on_receive_request!(),
                )
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    let _ = cx_tx.send(cx);
                    let _ = stopped.await;
                    Ok(())
                })
                .await;
            if let Err(error) = result {
                tracing::debug!(%error, "the ACP connection ended with an error");
            }
        });
        let process = OwnedProcess::new(process);
        let cx = match cx_rx.await {
            Ok(cx) => cx,
            Err(_) => {
                process.kill();
                return Err(process.exited().await.crashed("the ACP connection did not start"));
            }
        };
        let conn = Connection {
            process,
            cx,
            routes,
            stop: Mutex::new(Some(stop)),
            driver,
            init: std::sync::OnceLock::new(),
            _folder: folder,
            opened: Mutex::default(),
            retired: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(Arc::new(conn))
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the agent still runs and its connection is open.
    pub fn alive(&self) -> bool {
        !self.process.exited_yet() && !self.driver.is_finished()
    }

    /// Sessions open on it now.
    pub fn users(&self) -> usize {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).users
    }

    /// Takes no more sessions; it ends with the last it has.
    pub fn retire(&self) {
        self.retired.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Ends the agent (its whole process group) and the connection.
    pub fn kill(&self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        self.process.kill();
    }
}

impl crate::providers::share::Shareable for Connection {
    fn pid(&self) -> Option<u32> {
        Connection::pid(self)
    }
    fn alive(&self) -> bool {
        Connection::alive(self)
    }
    fn users(&self) -> usize {
        Connection::users(self)
    }
    fn takes(&self, session: Option<&str>) -> bool {
        let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        !self.retired.load(std::sync::atomic::Ordering::Acquire)
            && opened.len() < MAX_OPENED
            && session.is_none_or(|s| !opened.contains(s))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.kill();
        self.driver.abort();
    }
}

impl Runtime {
    /// A session's runtime on a running agent (its session not opened yet).
    pub fn on(
        conn: Arc<Connection>,
        policy: PermissionPolicy,
        asker: Option<Arc<dyn crate::providers::PermissionAsker>>,
    ) -> Runtime {
        let (to, inbound) = mpsc::unbounded_channel();
        conn.routes.lock().unwrap_or_else(|p| p.into_inner()).users += 1;
        let binding = Arc::new(std::sync::RwLock::new((policy, asker)));
        Runtime { conn, inbound, to, binding, session: None, released: false }
    }

    /// `session`'s updates and permission requests come to this runtime from now on.
    pub fn route(&mut self, session: &SessionId) {
        let id = session.0.to_string();
        let route = Route { to: self.to.clone(), binding: self.binding.clone() };
        self.conn.routes.lock().unwrap_or_else(|p| p.into_inner()).sessions.insert(id.clone(), route);
        self.conn.opened.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone());
        self.session = Some(id);
    }

    /// Its agent takes no more sessions (see [`Connection::retire`]).
    pub fn retire(&self) {
        self.conn.retire();
    }

    /// Whether the agent still runs.
    pub fn running(&self) -> bool {
        self.conn.alive()
    }

    /// Everything received and not yet taken.
    pub fn drain(&mut self) -> Vec<Inbound> {
        let mut out = Vec::new();
        while let Ok((item, _room)) = self.inbound.try_recv() {
            out.push(item);
        }
        out
    }

    /// Discards what arrives until nothing has for `quiet` (at most `limit`
    /// in all). The agent sends a `session/load` replay before its answer,
    /// but the connection hands notifications and answers over on separate
    /// paths, so the replay's tail can still be on its way once the answer
    /// is in; without this it became the next turn's output.
    pub async fn discard_until_quiet(&mut self, quiet: std::time::Duration, limit: std::time::Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        let mut discarded = self.drain().len();
        loop {
            let until = (tokio::time::Instant::now() + quiet).min(deadline);
            match tokio::time::timeout_at(until, self.inbound.recv()).await {
                Ok(Some(_)) if tokio::time::Instant::now() < deadline => discarded += 1,
                _ => return discarded,
            }
        }
    }

    /// Sends `request` and waits for its answer, handing every inbound item
    /// that arrives meanwhile (and those routed before the answer) to
    /// `on_inbound`. The agent exiting or closing its stdout is a fatal
    /// failure with its exit status and stderr tail.
    pub async fn request<Req: JsonRpcRequest>(
        &mut self,
        what: &str,
        request: Req,
        on_inbound: impl FnMut(Inbound),
    ) -> Answer<Req::Response> {
        self.request_cancellable(what, request, on_inbound, None, None).await
    }

    /// [`Runtime::request`] for `session/prompt`: once `cancel` trips,
    /// `session/cancel` for its session goes to the agent (once) and the
    /// wait goes on for the agent's answer (`stopReason: cancelled`). With
    /// `flow`, the next inbound item is taken only once the session's
    /// subscribers have room ([`TurnSink::ready`]): an agent that streams
    /// faster than the application reads waits in its stdout pipe instead
    /// of overrunning (and re-synchronising) the readers.
    pub async fn request_cancellable<Req: JsonRpcRequest>(
        &mut self,
        what: &str,
        request: Req,
        mut on_inbound: impl FnMut(Inbound),
        cancel: Option<(&tokio_util::sync::CancellationToken, &SessionId)>,
        flow: Option<&dyn TurnSink>,
    ) -> Answer<Req::Response> {
        let response = self.conn.cx.send_request(request).block_task();
        tokio::pin!(response);
        let mut cancel_sent = cancel.is_none();
        let mut room: Option<futures::future::BoxFuture<'_, ()>> = None;
        // One wait for the whole prompt, not a new one per inbound item.
        let cancelled = futures::future::OptionFuture::from(cancel.map(|(token, _)| token.cancelled()));
        tokio::pin!(cancelled);
        let gone = loop {
            tokio::select! {
                biased;
                _ = &mut cancelled, if !cancel_sent => {
                    cancel_sent = true;
                    let session = cancel.expect("checked above").1.clone();
                    self.notify(CancelNotification::new(session));
                }
                () = async { room.as_mut().expect("only while waiting").await }, if room.is_some() => room = None,
                result = &mut response, if room.is_none() => {
                    // Everything routed before the answer, still at the readers' pace.
                    while let Ok((item, _room)) = self.inbound.try_recv() {
                        on_inbound(item);
                        if let Some(sink) = flow {
                            sink.ready().await;
                        }
                    }
                    match result {
                        Err(error)
                            if agent_client_protocol::is_connection_terminated(&error)
                                || agent_client_protocol::is_incoming_transport_closed(&error) =>
                        {
                            break None;
                        }
                        answer => return Ok(answer),
                    }
                }
                Some((item, _room)) = self.inbound.recv(), if room.is_none() => {
                    on_inbound(item);
                    room = flow.map(TurnSink::ready);
                }
                _ = self.conn.cx.incoming_closed() => break None,
                report = self.conn.process.exited() => break Some(report),
            }
        };
        self.drain().into_iter().for_each(&mut on_inbound);
        let context = format!("the ACP agent went away during {what}");
        Err(match gone {
            Some(report) => report.crashed(&context),
            None => self.exit_report(&context).await,
        })
    }

    /// Sends a notification; the agent being gone is not an error here.
    pub fn notify(&self, notification: impl agent_client_protocol::JsonRpcNotification) {
        if let Err(error) = self.conn.cx.send_notification(notification) {
            tracing::debug!(%error, "could not send an ACP notification");
        }
    }

    async fn exit_report(&mut self, context: &str) -> ProviderFailure {
        // One whose stdout closed but lives on can no longer speak ACP: it is ended.
        self.conn.process.exit_report(EXIT_WAIT).await.crashed(context)
    }

    /// Leaves the agent after a moment for whatever was just sent (e.g.
    /// `session/cancel`) to reach it; the agent ends with its last session.
    pub fn close(mut self) {
        // No longer a user of the agent from now: only the flush waits.
        self.release();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    tokio::time::sleep(CANCEL_FLUSH).await;
                    drop(self);
                });
            }
            Err(_) => drop(self),
        }
    }
}

impl Runtime {
    /// Stops counting as a user of the agent and takes its session's route
    /// down (a later runtime of the same session may own the route: that one stays). Once.
    fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let mut routes = self.conn.routes.lock().unwrap_or_else(|p| p.into_inner());
        routes.users = routes.users.saturating_sub(1);
        if let Some(session) = &self.session
            && routes.sessions.get(session).is_some_and(|r| r.to.same_channel(&self.to))
        {
            routes.sessions.remove(session);
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::session_update;
    use crate::providers::acp::updates::{ChunkKind, Inbound};
    use serde_json::json;

    #[test]
    fn only_update_notifications_skip_the_crate() {
        let text = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}"#;
        let text_inbound = Inbound::TextChunk {
            session_id: "s".into(),
            kind: ChunkKind::Message,
            message_id: None,
            text: "hi".into(),
        };
        assert_eq!(session_update(text), Some(text_inbound));
        let plan = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}}"#;
        let Some(Inbound::Update(params)) = session_update(plan) else { panic!("a plan is an update") };
        assert_eq!(params["update"]["entries"], json!([]));
        for other in [
            // A request (it has an id) is the crate's to answer, even by this name.
            r#"{"jsonrpc":"2.0","id":1,"method":"session/update","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"session/update","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}"#,
            r#"{"jsonrpc":"1.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}"#,
            r#"{"method":"session/update","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"session/request_permission","params":{"note":"session/update"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{"text":"\"session/update\""}}"#,
            r#"["session/update"]"#,
            "not json \"session/update\"",
        ] {
            assert_eq!(session_update(other), None, "{other}");
        }
    }
}
