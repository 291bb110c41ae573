//! Reaching Core: connect to its socket (or start it detached and wait), then
//! forward calls over one `CoreRelay.Relay` stream.
//!
//! A unary gRPC call costs an HTTP/2 stream (HEADERS, DATA, trailers) on both
//! sides; the relay stream carries every call as one DATA frame each way, which
//! is what lets pipelined frames from the browser keep up. Subscriptions keep
//! their own `Core.Subscribe` (or `Core.WatchSession`) streams on the same
//! connection.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use pedelec_client::PedelecError;
use pedelec_client::grpc::GrpcTransport;
use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply, Transport};
use pedelec_protocol::ErrorCode;
use pedelec_protocol::backoff::Backoff;
use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb::{self, core_relay_client::CoreRelayClient, native_frame::Body};
use tokio::sync::{mpsc, oneshot, watch};

/// How long the host waits for a Core it started.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);
/// How often it looks for that Core's socket meanwhile: often, since a user
/// waits on the first call; `START_TIMEOUT` ends it.
const START_POLL: Backoff = Backoff::constant(Duration::from_millis(10), u32::MAX);

/// The Core binary: `$PEDELEC_CORE_BIN`, else next to this host, else `PATH`.
pub fn core_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("PEDELEC_CORE_BIN") {
        return PathBuf::from(bin);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("pedelec-core")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("pedelec-core"))
}

/// Connects to Core on `socket`; if nobody answers, starts `pedelec-core
/// serve` in its own process group (so it outlives this host) and retries
/// until [`START_TIMEOUT`].
/// `core` names the binary; it is only looked up when Core must be started.
pub async fn connect_or_start(socket: &Path, core: impl FnOnce() -> PathBuf) -> Option<CoreLink> {
    if let Ok(link) = CoreLink::connect(socket).await {
        return Some(link);
    }
    let core = core();
    tracing::info!(core = %core.display(), socket = %socket.display(), "starting Core");
    let mut command = Command::new(&core);
    command.arg("serve").arg("--socket").arg(socket).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    if let Err(error) = spawn_detached(&mut command) {
        tracing::warn!(%error, "could not start Core");
        return None;
    }
    let started = Instant::now();
    for wait in START_POLL.delays() {
        if let Ok(link) = CoreLink::connect(socket).await {
            return Some(link);
        }
        if started.elapsed() >= START_TIMEOUT {
            break;
        }
        tokio::time::sleep(wait).await;
    }
    None
}

/// Core outlives this host: its own process group on Unix (the browser
/// signals the host's); on Windows no console, and out of the job Chrome
/// puts its native hosts in (Chrome's own advice for hosts that start a
/// longer-lived process; a job that forbids leaving is stayed in).
#[cfg(unix)]
fn spawn_detached(command: &mut Command) -> std::io::Result<std::process::Child> {
    std::os::unix::process::CommandExt::process_group(command, 0).spawn()
}

#[cfg(windows)]
fn spawn_detached(command: &mut Command) -> std::io::Result<std::process::Child> {
    use std::os::windows::process::CommandExt;
    const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
    const DETACHED_PROCESS: u32 = 0x0000_0008;
    const CREATE_BREAKAWAY_FROM_JOB: u32 = 0x0100_0000;
    let detached = CREATE_NEW_PROCESS_GROUP | DETACHED_PROCESS;
    command
        .creation_flags(detached | CREATE_BREAKAWAY_FROM_JOB)
        .spawn()
        .or_else(|_| command.creation_flags(detached).spawn())
}

type Waiter = oneshot::Sender<Result<Reply, PedelecError>>;

/// Calls waiting for their answer on the relay stream, by relay id. `None`
/// once the stream has ended: later calls fail at once.
struct Pending {
    waiters: Option<HashMap<u32, Waiter>>,
    next_id: u32,
}

/// One connection to Core: unary calls over the relay stream, subscriptions
/// over `Core.Subscribe`.
pub struct CoreLink {
    grpc: GrpcTransport,
    requests: mpsc::UnboundedSender<pb::NativeFrame>,
    pending: Arc<Mutex<Pending>>,
    lost: watch::Receiver<bool>,
}

fn lost_error() -> PedelecError {
    PedelecError::new(ErrorCode::CoreRuntimeUnavailable, "the connection to Core was lost")
}

impl CoreLink {
    /// Connects and opens the relay stream (without waiting for Core's answer
    /// to it: the first call may travel with the stream's opening).
    pub async fn connect(socket: &Path) -> Result<CoreLink, PedelecError> {
        let grpc = GrpcTransport::connect(socket).await?;
        let (requests, outgoing) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(Pending { waiters: Some(HashMap::new()), next_id: 0 }));
        let (lost_tx, lost) = watch::channel(false);
        let client = pedelec_protocol::with_message_limits!(CoreRelayClient::new(grpc.channel()));
        tokio::spawn(read_answers(client, outgoing, pending.clone(), lost_tx));
        Ok(CoreLink { grpc, requests, pending, lost })
    }

    /// The owner call `Core.WatchSession` on its own stream, as Subscribe.
    pub fn watch_session(
        &self,
        request: pb::WatchSessionRequest,
    ) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        self.grpc.watch_session(request)
    }

    /// Resolves once the connection to Core is gone.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|gone| *gone).await;
    }

    fn forward(&self, call: Call) -> Result<oneshot::Receiver<Result<Reply, PedelecError>>, PedelecError> {
        let (tx, rx) = oneshot::channel();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Pending { waiters, next_id } = &mut *pending;
        let Some(waiters) = waiters else { return Err(lost_error()) };
        // Relay ids are the host's own, so a page reusing ids cannot collide.
        *next_id = next_id.checked_add(1).unwrap_or(1);
        let id = *next_id;
        waiters.insert(id, tx);
        let frame = pb::NativeFrame {
            request_id: id,
            body: Some(Body::Request(pb::NativeRequest { call: Some(call) })),
            ..Default::default()
        };
        if self.requests.send(frame).is_err() {
            waiters.remove(&id);
            return Err(lost_error());
        }
        Ok(rx)
    }
}

/// Opens the relay stream and hands each answer to its waiter. When the
/// stream ends, every waiter (and every later call) gets
/// `CORE_RUNTIME_UNAVAILABLE`, and `lost` is raised.
async fn read_answers(
    mut client: CoreRelayClient<tonic::transport::Channel>,
    outgoing: mpsc::UnboundedReceiver<pb::NativeFrame>,
    pending: Arc<Mutex<Pending>>,
    lost: watch::Sender<bool>,
) {
    let mut reason = None;
    match client.relay(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing)).await {
        Ok(response) => {
            let mut answers = response.into_inner();
            while let Some(Ok(frame)) = answers.next().await {
                let outcome = match frame.body {
                    Some(Body::Response(pb::NativeResponse { result: Some(reply) })) => Ok(reply),
                    Some(Body::Error(error)) => Err(error.into()),
                    other => Err(PedelecError::new(ErrorCode::TransportError, format!("unexpected answer {other:?}"))),
                };
                let waiter = pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .waiters
                    .as_mut()
                    .and_then(|w| w.remove(&frame.request_id));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(outcome);
                }
            }
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            // Host and Core ship together; an older Core left running is the likely cause.
            reason = Some("Core does not serve the relay stream: it is older than this host, restart it".to_owned());
        }
        Err(status) => reason = Some(format!("Core refused the relay stream: {}", error_from_status(&status).message)),
    }
    if let Some(reason) = &reason {
        tracing::warn!("{reason}");
    }
    let waiters = pending.lock().unwrap_or_else(|p| p.into_inner()).waiters.take();
    for (_, waiter) in waiters.into_iter().flatten() {
        let error = match &reason {
            Some(reason) => PedelecError::new(ErrorCode::CoreRuntimeUnavailable, reason.clone()),
            None => lost_error(),
        };
        let _ = waiter.send(Err(error));
    }
    let _ = lost.send(true);
}

impl Transport for CoreLink {
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        let answer = self.forward(call);
        Box::pin(async move { answer?.await.unwrap_or_else(|_| Err(lost_error())) })
    }

    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        self.grpc.subscribe(request)
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        tokio::spawn(task);
    }

    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
