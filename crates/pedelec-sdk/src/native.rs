//! The native-messaging transport: starts `pedelec-native-host` exactly as a
//! browser does (argv `chrome-extension://<id>/`, frames on stdio) and speaks
//! `NativeFrame`s with the protocol crate's codec. Which frame answers which
//! request and feeds which subscription is [`crate::router`]'s.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use std::sync::Arc;
//! use pedelec_sdk::native::{NativeMessagingTransport, find_host_binary};
//! use pedelec_sdk::{Pedelec, SessionOptions};
//!
//! // The host finds Core through the environment it is given, as from a browser.
//! let envs = [("PEDELEC_CORE_SOCKET", "/tmp/pedelec-test/core.sock")];
//! let extension = "chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/";
//! let host = NativeMessagingTransport::spawn(&find_host_binary(), extension, &envs)?;
//! let pedelec = Pedelec::with_transport(Arc::new(host), "https://app.example.com");
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! session.send_text("Hello").await?;
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use pedelec_protocol::native::{ChunkAssembler, FrameDecoder, decode_native_frame, encode_native_frame};
use pedelec_protocol::pb;
use pedelec_protocol::{ErrorCode, limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::PedelecError;
use crate::router::{Delivery, FrameRouter, Waiting, request_frame, subscribe_frame};
use crate::transport::{BoxFuture, Call, EventStream, Reply, Transport};

type EventSender = tokio::sync::mpsc::Sender<Result<pb::SessionEvent, PedelecError>>;

/// Events queued for one subscription the session has not taken yet. When a
/// subscription's queue is full the reader waits, and so does everything
/// behind it: the host's output pipe fills, the host stops reading Core, and
/// Core re-synchronises the lagging subscriber (as over gRPC) — memory stays
/// bounded whatever a slow handler does.
const SUBSCRIPTION_QUEUE: usize = 4096;

/// What the reader task and the transport's callers share.
struct HostLink {
    routes: Mutex<Routes>,
    outgoing: mpsc::UnboundedSender<pb::NativeFrame>,
}

/// The router, and whether the host's output ended, under one lock: a
/// request is either registered before the end (and failed by it) or sees it.
struct Routes {
    router: FrameRouter<EventSender>,
    /// Set once the host's output ended; nothing can be answered after that.
    closed: bool,
}

/// A transport through a `pedelec-native-host` child process.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use std::sync::Arc;
/// use pedelec_sdk::Pedelec;
/// use pedelec_sdk::native::{NativeMessagingTransport, find_host_binary};
///
/// let extension = "chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/";
/// let host = NativeMessagingTransport::spawn(&find_host_binary(), extension, &[])?;
/// let pedelec = Pedelec::with_transport(Arc::new(host), "https://app.example.com");
/// println!("Core {} via the native host", pedelec.ping().await?.version);
/// # Ok(())
/// # }
/// ```
pub struct NativeMessagingTransport {
    shared: Arc<HostLink>,
    child: Mutex<Option<tokio::process::Child>>,
}

/// The `pedelec-native-host` binary (`$PEDELEC_NATIVE_HOST_BIN` overrides).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::native::find_host_binary;
///
/// let host = find_host_binary();
/// if std::env::var_os("PEDELEC_NATIVE_HOST_BIN").is_none() {
///     assert!(host.ends_with("pedelec-native-host"));
/// }
/// ```
pub fn find_host_binary() -> PathBuf {
    crate::daemon::find_binary("pedelec-native-host", "PEDELEC_NATIVE_HOST_BIN")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn detached() -> PedelecError {
    PedelecError::new(ErrorCode::TransportDetached, "the native host exited")
}

impl NativeMessagingTransport {
    /// Starts the host with the extension's origin as its only argument, as
    /// Chrome does; `envs` are added to its environment (e.g. the Core socket).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::path::Path;
    /// use pedelec_sdk::native::NativeMessagingTransport;
    ///
    /// let host = Path::new("/opt/pedelec/bin/pedelec-native-host");
    /// let envs = [("PEDELEC_CORE_SOCKET", "/tmp/pedelec-test/core.sock")];
    /// let extension = "chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/";
    /// let transport = NativeMessagingTransport::spawn(host, extension, &envs)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn(host: &Path, extension_origin: &str, envs: &[(&str, &str)]) -> Result<Self, PedelecError> {
        let mut command = tokio::process::Command::new(host);
        command.arg(extension_origin).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // Chrome on Windows also passes the calling window's handle.
        #[cfg(windows)]
        command.arg("--parent-window=0");
        if let Some(dir) = host.parent().filter(|d| !d.as_os_str().is_empty()) {
            command.current_dir(dir);
        }
        for (k, v) in envs {
            command.env(k, v);
        }
        let mut child = command.kill_on_drop(true).spawn().map_err(|e| {
            PedelecError::new(ErrorCode::CoreRuntimeUnavailable, format!("cannot start {}: {e}", host.display()))
        })?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let (outgoing, mut frames) = mpsc::unbounded::<pb::NativeFrame>();
        let shared =
            Arc::new(HostLink { routes: Mutex::new(Routes { router: FrameRouter::new(), closed: false }), outgoing });

        tokio::spawn(async move {
            let mut message_id = 0u32;
            while let Some(frame) = frames.next().await {
                message_id = message_id.wrapping_add(1);
                let mut bytes = Vec::new();
                for piece in encode_native_frame(&frame, limits::NATIVE_BROWSER_TO_HOST_MAX, message_id) {
                    bytes.extend_from_slice(&piece);
                }
                // Coalesce whatever else is queued into one write.
                while let Ok(more) = frames.try_recv() {
                    message_id = message_id.wrapping_add(1);
                    for piece in encode_native_frame(&more, limits::NATIVE_BROWSER_TO_HOST_MAX, message_id) {
                        bytes.extend_from_slice(&piece);
                    }
                }
                if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });

        let reader = shared.clone();
        tokio::spawn(async move {
            let mut decoder = FrameDecoder::new(limits::NATIVE_HOST_TO_BROWSER_MAX);
            let mut assembler = ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX);
            let mut buf = vec![0u8; 64 * 1024];
            'read: loop {
                let n = match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                decoder.push(&buf[..n]);
                while let Some(frame) = decoder.next_frame() {
                    let Ok(text) = frame else { break 'read };
                    let frame = match decode_native_frame(&text).and_then(|f| assembler.accept(f)) {
                        Ok(Some(frame)) => frame,
                        Ok(None) => continue,
                        Err(error) => {
                            tracing::warn!(%error, "bad frame from the native host");
                            continue;
                        }
                    };
                    reader.route(frame).await;
                }
            }
            reader.close();
        });
        Ok(NativeMessagingTransport { shared, child: Mutex::new(Some(child)) })
    }

    /// The host's process id.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::native::{NativeMessagingTransport, find_host_binary};
    ///
    /// let extension = "chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/";
    /// let transport = NativeMessagingTransport::spawn(&find_host_binary(), extension, &[])?;
    /// println!("native host pid {:?}", transport.host_pid());
    /// # Ok(())
    /// # }
    /// ```
    pub fn host_pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().and_then(|c| c.id())
    }
}

impl HostLink {
    /// Hands one frame on; waits while the subscription it is for has a full queue.
    async fn route(&self, frame: pb::NativeFrame) {
        let delivery = lock(&self.routes).router.route(frame);
        match delivery {
            Some(Delivery::Event(tx, event)) => {
                let _ = tx.send(Ok(event)).await;
            }
            Some(Delivery::Events(tx, events)) => {
                for event in events {
                    if tx.send(Ok(event)).await.is_err() {
                        break;
                    }
                }
            }
            Some(Delivery::Fail(tx, error)) => {
                let _ = tx.send(Err(error)).await;
            }
            None => {}
        }
    }

    fn close(&self) {
        let subscriptions = {
            let mut routes = lock(&self.routes);
            routes.closed = true;
            routes.router.fail_pending(detached);
            routes.router.end_subscriptions()
        };
        // A full queue cannot take the error; its stream still ends when
        // the sender goes, which the session reads as detached all the same.
        for tx in subscriptions {
            let _ = tx.try_send(Err(detached()));
        }
    }

    fn request(self: &Arc<Self>, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        let (tx, rx) = oneshot::channel();
        let frame = {
            let mut routes = lock(&self.routes);
            if routes.closed {
                return Box::pin(async { Err(detached()) });
            }
            let id = routes.router.next_id();
            let (frame, waiting) = request_frame(id, call, tx);
            routes.router.request(id, waiting);
            frame
        };
        let id = frame.request_id;
        if self.outgoing.unbounded_send(frame).is_err() {
            lock(&self.routes).router.forget(id);
            return Box::pin(async { Err(detached()) });
        }
        Box::pin(async move { rx.await.unwrap_or_else(|_| Err(detached())) })
    }
}

/// Ends the host-side subscription when the SDK drops its stream.
struct Unsubscribe {
    shared: Arc<HostLink>,
    id: u32,
    session_id: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if lock(&self.shared.routes).router.unsubscribe(self.id) {
            let call = Call::Unsubscribe(pb::UnsubscribeRequest {
                session_id: std::mem::take(&mut self.session_id),
                subscription_id: self.id,
            });
            drop(self.shared.request(call));
        }
    }
}

impl Transport for NativeMessagingTransport {
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        self.shared.request(call)
    }

    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        let shared = self.shared.clone();
        Box::pin(async move {
            let session_id = request.session_id.clone();
            let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIPTION_QUEUE);
            let (reply_tx, reply_rx) = oneshot::channel();
            let id = {
                let mut routes = lock(&shared.routes);
                if routes.closed {
                    return Err(detached());
                }
                let id = routes.router.next_id();
                // Registered before the request goes out, so no event can slip past.
                routes.router.subscribe(id, tx, request.clone(), Waiting::new(reply_tx, None));
                id
            };
            let frame = subscribe_frame(id, request);
            let guard = Unsubscribe { shared: shared.clone(), id, session_id };
            let mut outgoing = shared.outgoing.clone();
            outgoing.send(frame).await.map_err(|_| detached())?;
            let snapshot = match reply_rx.await.unwrap_or_else(|_| Err(detached())) {
                Ok(Reply::Subscribe(snapshot)) => snapshot,
                Ok(other) => return Err(crate::transport::unexpected(&other)),
                Err(error) => {
                    lock(&shared.routes).router.forget(id);
                    return Err(error);
                }
            };
            let live = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |item| {
                let _ = &guard;
                item
            });
            Ok(Box::pin(futures::stream::once(async move { Ok(snapshot) }).chain(live)) as EventStream)
        })
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        tokio::spawn(task);
    }

    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
