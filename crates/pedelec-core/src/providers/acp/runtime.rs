//! One agent process and the ACP connection over its stdio.
//!
//! We spawn the process ourselves ([`AgentProcess`]: its own process group,
//! stderr tail kept, the group killed on drop) rather than through the
//! crate's `AcpAgent`, and hand the crate a [`Lines`] transport over the
//! child's pipes. That keeps one owner for the process tree — `end()` kills
//! the agent *and* what it started (the MCP bridge, shells) — and lets every
//! adapter report exits the same way. Incoming lines go through
//! [`LineReader`], so an over-long or non-UTF-8 line is skipped instead of
//! growing a buffer without bound.
//!
//! The crate runs a connection inside a future (`connect_with`); it lives in
//! a task of its own for as long as the runtime, and turns use a clone of its
//! [`ConnectionTo`]. Handlers run in the crate's dispatch loop, in arrival
//! order: they only forward into a channel (and answer permission requests
//! at once), so a prompt's response is routed only after every update sent
//! before it is in the channel.

use std::path::Path;
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{CancelNotification, RequestPermissionRequest, SessionId};
use agent_client_protocol::{Agent, Client, JsonRpcRequest, Lines, UntypedMessage};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::permission::{self, PermissionPolicy};
use super::updates::Inbound;
use crate::providers::process::{AgentProcess, CommandLine, Line, LineReader, MAX_LINE_BYTES};
use crate::providers::{ProviderFailure, TurnSink};

/// How long a process that closed its stdout gets to exit before we end it.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// How long `session/cancel` gets to reach the agent before the group is signalled.
const CANCEL_FLUSH: Duration = Duration::from_millis(200);

/// Either the agent answered (possibly with a JSON-RPC error), or it is gone.
pub type Answer<T> = Result<Result<T, agent_client_protocol::Error>, ProviderFailure>;

pub struct Runtime {
    process: AgentProcess,
    cx: ConnectionTo<Agent>,
    inbound: mpsc::UnboundedReceiver<Routed>,
    /// Ends the connection future (which closes the agent's stdin).
    stop: Option<oneshot::Sender<()>>,
    driver: tokio::task::JoinHandle<()>,
    binding: Binding,
}

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
    updates: mpsc::UnboundedSender<Routed>,
) -> impl futures::Stream<Item = std::io::Result<String>> + Send {
    let reader = LineReader::new(stdout, MAX_LINE_BYTES);
    let room = std::sync::Arc::new(tokio::sync::Semaphore::new(QUEUED_UPDATES));
    futures::stream::unfold((reader, updates, room), |(mut reader, updates, room)| async move {
        loop {
            match reader.next_line().await {
                Ok(Some(Line::Text(text))) if text.trim().is_empty() => continue,
                Ok(Some(Line::Text(text))) => match session_update(&text) {
                    Some(update) => {
                        let Ok(permit) = room.clone().acquire_owned().await else { return None };
                        let _ = updates.send((update, Some(permit)));
                    }
                    None => return Some((Ok(text), (reader, updates, room))),
                },
                Ok(Some(Line::TooLong(len))) => tracing::warn!(len, "skipped an over-long line from the ACP agent"),
                Ok(Some(Line::NotUtf8)) => tracing::warn!("skipped a non-UTF-8 line from the ACP agent"),
                Ok(None) => return None,
                Err(error) => return Some((Err(error), (reader, updates, room))),
            }
        }
    })
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

impl Runtime {
    /// Starts the agent in `cwd` and connects to it (no ACP traffic yet).
    pub async fn spawn(
        command: &CommandLine,
        cwd: &Path,
        policy: PermissionPolicy,
        asker: Option<std::sync::Arc<dyn crate::providers::PermissionAsker>>,
    ) -> Result<Self, ProviderFailure> {
        let binding: Binding = std::sync::Arc::new(std::sync::RwLock::new((policy, asker)));
        let mut process = AgentProcess::spawn(command, cwd)?;
        let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
            return Err(ProviderFailure::crashed("the ACP agent's stdio could not be piped"));
        };
        let outgoing = Box::pin(futures::sink::unfold(stdin, async |mut stdin, line: String| {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await?;
            Ok::<_, std::io::Error>(stdin)
        }));
        let (tx, inbound) = mpsc::unbounded_channel();
        let transport = Lines::new(outgoing, Box::pin(incoming(stdout, tx.clone())));

        let (cx_tx, cx_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let updates = tx.clone();
        let decisions = tx;
        let bound = binding.clone();
        let driver = tokio::spawn(async move {
            let result = Client
                .v1()
                .name("pedelec-core")
                // Untyped on purpose: a typed `SessionNotification` handler
                // would drop, unseen, any update variant newer than the schema.
                .on_receive_notification(
                    async move |message: UntypedMessage, _cx| {
                        if message.method() == "session/update" {
                            let _ = updates.send((Inbound::Update(message.params().clone()), None));
                        } else {
                            tracing::debug!(method = message.method(), "ignored an ACP notification");
                        }
                        Ok(())
                    },
                    agent_client_protocol::on_receive_notification!(),
                )
                .on_receive_request(
                    async move |request: RequestPermissionRequest, responder, cx| {
                        let (decision, asker) = {
                            let bound = bound.read().unwrap_or_else(|p| p.into_inner());
                            (bound.0.decide(&request), bound.1.clone())
                        };
                        let Some(asker) = asker else {
                            tracing::info!(title = %decision.title, outcome = %decision.outcome, "answered an ACP permission request");
                            let _ = decisions.send((Inbound::Permission { title: decision.title, outcome: decision.outcome }, None));
                            return responder.respond(decision.response);
                        };
                        // The application answers: off the dispatch loop, so
                        // other traffic (the cancel among it) flows meanwhile.
                        let ask = permission::to_app(&request, &decision);
                        let decisions = decisions.clone();
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
        let cx = match cx_rx.await {
            Ok(cx) => cx,
            Err(_) => {
                let report = process.wait().await;
                return Err(report.crashed("the ACP connection did not start"));
            }
        };
        Ok(Runtime { process, cx, inbound, stop: Some(stop), driver, binding })
    }

    /// Answers permission requests for `policy` and `asker` from now on.
    pub fn bind(&self, policy: PermissionPolicy, asker: Option<std::sync::Arc<dyn crate::providers::PermissionAsker>>) {
        *self.binding.write().unwrap_or_else(|p| p.into_inner()) = (policy, asker);
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Whether the agent still runs.
    pub fn running(&mut self) -> bool {
        self.process.running() && !self.driver.is_finished()
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
        let response = self.cx.send_request(request).block_task();
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
                _ = self.cx.incoming_closed() => break None,
                report = self.process.wait() => break Some(report),
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
        if let Err(error) = self.cx.send_notification(notification) {
            tracing::debug!(%error, "could not send an ACP notification");
        }
    }

    async fn exit_report(&mut self, context: &str) -> ProviderFailure {
        let report = match tokio::time::timeout(EXIT_WAIT, self.process.wait()).await {
            Ok(report) => report,
            Err(_) => {
                // Its stdout closed but it lives on: it can no longer speak ACP.
                self.process.terminate_group();
                self.process.wait().await
            }
        };
        report.crashed(context)
    }

    /// Closes the connection, then ends the process group after a moment for
    /// whatever was just sent (e.g. `session/cancel`) to reach the agent.
    pub fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
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

impl Drop for Runtime {
    fn drop(&mut self) {
        // AgentProcess's own drop signals the group; the connection task
        // would otherwise linger on a dead pipe.
        self.process.terminate_group();
        self.driver.abort();
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
