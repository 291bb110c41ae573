//! The browser transport: a `chrome.runtime.connect(extensionId)` port to the
//! Pedelec extension, carrying the same `NativeFrame`s the native host speaks
//! (as `{ type: "frame", frame }` messages; see `extension/README.md`).
//!
//! Which frame answers which request and feeds which subscription is
//! [`crate::router`]'s, as for [`crate::native`]; chunked frames are
//! reassembled with the protocol crate's [`ChunkAssembler`]. When the
//! port drops (the extension's service worker restarted, or the extension was
//! reloaded) pending requests fail with `TRANSPORT_DETACHED` and live
//! subscriptions are re-sent on a fresh port, so the session machine receives
//! a new snapshot and carries on.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures::StreamExt;
use futures::channel::{mpsc, oneshot};
use js_sys::{Function, JSON, Object};
use pedelec_protocol::event_batch::{BatchHeader, batch_events_base64};
use pedelec_protocol::native::{ChunkAssembler, NativeFrameError, decode_native_frame};
use pedelec_protocol::pb::{self, native_frame::Body};
use pedelec_protocol::{ErrorCode, json, limits};
use wasm_bindgen::prelude::*;
use wasm_bindgen::{JsCast, JsValue};

use super::js;
use super::local::Local;
use crate::error::PedelecError;
use crate::router::{Delivery, FrameRouter, Waiting, request_frame, subscribe_frame};
use crate::transport::{BoxFuture, Call, EventStream, Reply, Transport};

/// How a lost port is reconnected for live subscriptions: six tries, from
/// 100 ms doubling to 3.2 s (6.3 s in all) before they fail.
const RESUBSCRIBE: pedelec_protocol::backoff::Backoff = pedelec_protocol::backoff::Backoff::new(
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(3200),
    6,
);

#[wasm_bindgen]
extern "C" {
    /// A `chrome.runtime.Port`.
    pub type Port;
    #[wasm_bindgen(method, catch, js_name = postMessage)]
    fn post_message(this: &Port, message: &JsValue) -> Result<(), JsValue>;
    #[wasm_bindgen(method, getter, js_name = onMessage)]
    fn on_message(this: &Port) -> PortEvent;
    #[wasm_bindgen(method, getter, js_name = onDisconnect)]
    fn on_disconnect(this: &Port) -> PortEvent;

    pub type PortEvent;
    #[wasm_bindgen(method, js_name = addListener)]
    fn add_listener(this: &PortEvent, listener: &Function);

    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(callback: &Function, ms: i32) -> JsValue;
}

/// Resolves after `ms` milliseconds (pages and workers both have `setTimeout`).
pub async fn sleep(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        set_timeout(&resolve, ms);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

#[wasm_bindgen(inline_js = r#"
// A port to the extension through its content script (extension/relay.js),
// for browsers without `externally_connectable` (Firefox): the same
// postMessage / onMessage / onDisconnect as a `chrome.runtime.Port`, over
// window messages of this page's own origin. No answer from the content
// script within `timeoutMs` closes it, as a port to a missing extension does.
export function relayConnect(timeoutMs) {
  const id = 1 + Math.floor(Math.random() * 0x7ffffffe);
  const messageListeners = [], disconnectListeners = [];
  let open = true;
  const post = (type, message) =>
    window.postMessage({ channel: "pedelec:page", port: id, type, message }, location.origin);
  const close = () => {
    if (!open) return;
    open = false;
    window.removeEventListener("message", listener);
    clearTimeout(timer);
    for (const f of disconnectListeners) f(port);
  };
  const listener = (event) => {
    if (event.source !== window || event.origin !== location.origin) return;
    const data = event.data;
    if (!data || data.channel !== "pedelec:extension" || data.port !== id) return;
    if (data.type === "connected") clearTimeout(timer);
    else if (data.type === "message") for (const f of messageListeners) f(data.message, port);
    else if (data.type === "disconnect") close();
  };
  const port = {
    postMessage(message) {
      if (!open) throw new Error("the port to the extension is closed");
      post("message", message);
    },
    onMessage: { addListener: (f) => messageListeners.push(f) },
    onDisconnect: { addListener: (f) => disconnectListeners.push(f) },
  };
  window.addEventListener("message", listener);
  const timer = setTimeout(close, timeoutMs);
  post("connect");
  return port;
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = relayConnect)]
    fn relay_connect(timeout_ms: u32) -> Port;
}

/// How long the content-script relay may take to answer before the SDK
/// reports the extension missing. The script answers at once when it is
/// there; this only bounds how long a page without the extension waits to
/// hear so, and leaves room for a busy machine.
const RELAY_ANSWER_MS: u32 = 3000;

/// How a page reaches the extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// `chrome.runtime.connect(extensionId)` where the browser offers it
    /// (`externally_connectable`), the content-script relay elsewhere.
    Auto,
    /// Always the content-script relay (what Firefox uses).
    Relay,
}

// The page has no back-pressure to give: the extension's port delivers
// whatever arrives, so the queue a subscription's events wait in is unbounded.
type EventSender = mpsc::UnboundedSender<Result<pb::SessionEvent, PedelecError>>;

/// What the extension says about this page (`{ type: "status", ... }`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtensionStatus {
    pub installed: bool,
    pub approved: bool,
    pub origin: String,
    pub app_connected: bool,
    pub pending: bool,
}

struct Connection {
    port: Port,
    // Kept alive as long as the port; dropped only after the port is gone.
    _on_message: Closure<dyn FnMut(JsValue)>,
    _on_disconnect: Closure<dyn FnMut(JsValue)>,
}

pub(crate) struct Link {
    extension_id: String,
    channel: Channel,
    connection: RefCell<Option<Connection>>,
    /// Bumped per port so a stale port's disconnect is ignored.
    epoch: Cell<u32>,
    /// Whether the current port ever carried a message from the extension: a
    /// port that closes without one means no such extension answers here.
    heard: Cell<bool>,
    /// Requests and subscriptions; a borrow never spans a call into JS.
    router: RefCell<FrameRouter<EventSender>>,
    status_waiters: RefCell<Vec<oneshot::Sender<ExtensionStatus>>>,
    /// `pickWorkspace` calls waiting for the user's pick, by their id.
    pick_waiters: RefCell<std::collections::HashMap<u32, oneshot::Sender<Result<PickedWorkspace, PedelecError>>>>,
    next_pick: Cell<u32>,
    assembler: RefCell<ChunkAssembler>,
}

/// The folder the user picked for this page (`{ type: "picked", ... }`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PickedWorkspace {
    /// The opaque workspace handle (`createSession({ workspace: { handle } })`).
    pub handle: String,
    /// The folder's name: all the page learns of where it is.
    pub name: String,
}

fn detached(message: &str) -> PedelecError {
    PedelecError::new(ErrorCode::TransportDetached, message)
}

/// How a subscription ends when the extension revoked this origin.
fn revoked() -> PedelecError {
    let mut e = PedelecError::new(ErrorCode::SessionEnded, "the origin was revoked in the extension");
    e.details = Some(serde_json::json!({ "reason": "origin_revoked" }));
    e
}

/// No extension answers on this page (`chrome.runtime` absent or the id unknown).
fn not_installed(detail: &str) -> PedelecError {
    let mut e =
        PedelecError::new(ErrorCode::TransportError, format!("the Pedelec extension is not reachable: {detail}"));
    e.details = Some(serde_json::json!({ "reason": "extension_not_installed" }));
    e
}

impl Link {
    pub(crate) fn new(extension_id: String, channel: Channel) -> Rc<Self> {
        Rc::new(Link {
            extension_id,
            channel,
            connection: RefCell::new(None),
            epoch: Cell::new(0),
            heard: Cell::new(false),
            router: RefCell::new(FrameRouter::new()),
            status_waiters: RefCell::default(),
            pick_waiters: RefCell::default(),
            next_pick: Cell::new(0),
            assembler: RefCell::new(ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX)),
        })
    }

    /// Opens the port when there is none.
    fn ensure_connected(self: &Rc<Self>) -> Result<(), PedelecError> {
        if self.connection.borrow().is_some() {
            return Ok(());
        }
        let global = js_sys::global();
        let runtime = js::get(&js::get(&global, "chrome"), "runtime");
        let connect = js::get(&runtime, "connect");
        let port: Port = match connect.dyn_ref::<Function>() {
            Some(connect) if self.channel == Channel::Auto => {
                let info = Object::new();
                js::set(&info, "name", "pedelec-sdk");
                let port = connect
                    .call2(&runtime, &JsValue::from_str(&self.extension_id), &info)
                    .map_err(|e| not_installed(&js::thrown_message(&e)))?;
                port.unchecked_into()
            }
            _ if js::get(&global, "window").is_object() => relay_connect(RELAY_ANSWER_MS),
            _ => return Err(not_installed("chrome.runtime.connect is unavailable here")),
        };
        let epoch = self.epoch.get().wrapping_add(1);
        self.epoch.set(epoch);
        self.heard.set(false);
        let weak = Rc::downgrade(self);
        let on_message = Closure::<dyn FnMut(JsValue)>::new(move |message: JsValue| {
            if let Some(link) = weak.upgrade() {
                link.receive(&message);
            }
        });
        let weak = Rc::downgrade(self);
        let on_disconnect = Closure::<dyn FnMut(JsValue)>::new(move |_port: JsValue| {
            if let Some(link) = weak.upgrade()
                && link.epoch.get() == epoch
            {
                link.disconnected();
            }
        });
        port.on_message().add_listener(on_message.as_ref().unchecked_ref());
        port.on_disconnect().add_listener(on_disconnect.as_ref().unchecked_ref());
        *self.connection.borrow_mut() =
            Some(Connection { port, _on_message: on_message, _on_disconnect: on_disconnect });
        Ok(())
    }

    fn post(&self, message: &JsValue) -> Result<(), PedelecError> {
        let connection = self.connection.borrow();
        let Some(connection) = connection.as_ref() else { return Err(detached("no port to the extension")) };
        connection.port.post_message(message).map_err(|e| detached(&js::thrown_message(&e)))
    }

    fn post_frame(self: &Rc<Self>, frame: &pb::NativeFrame) -> Result<(), PedelecError> {
        self.ensure_connected()?;
        let message = Object::new();
        js::set(&message, "type", "frame");
        let frame = JSON::parse(&json::to_json(frame))
            .map_err(|e| PedelecError::new(ErrorCode::Internal, js::thrown_message(&e)))?;
        js::set(&message, "frame", frame);
        self.post(&message.into())
    }

    fn receive(self: &Rc<Self>, message: &JsValue) {
        self.heard.set(true);
        match js::get_string(message, "type").as_deref() {
            Some("frame") => {
                let frame = js::get(message, "frame");
                // A batch's events are one base64 string: read it straight
                // from the message, without turning the frame back into text.
                let batch = js::get(&frame, "batch");
                if batch.is_object() {
                    let request_id = js::get(&frame, "requestId").as_f64().unwrap_or(0.0) as u32;
                    let events = js::get_string(&batch, "events").unwrap_or_default();
                    let events = batch_header(&batch).and_then(|header| batch_events_base64(header, &events));
                    let acks = js::get(&frame, "acks");
                    let delivery = {
                        let mut router = self.router.borrow_mut();
                        // Requests the host answered by acknowledgement (in a
                        // tool loop, the previous tool result), settled before
                        // the body as for decoded frames.
                        if let Some(acks) = acks.dyn_ref::<js_sys::Array>() {
                            router.acknowledge(acks.iter().filter_map(|id| id.as_f64()).map(|id| id as u32));
                        }
                        router.batch(request_id, events)
                    };
                    deliver(delivery);
                    return;
                }
                let text = JSON::stringify(&frame).ok().and_then(|t| t.as_string());
                let Some(text) = text else { return };
                let frame = decode_native_frame(&text).and_then(|f| self.assembler.borrow_mut().accept(f));
                match frame {
                    Ok(Some(frame)) => {
                        let delivery = self.router.borrow_mut().route(frame);
                        deliver(delivery);
                    }
                    Ok(None) => {}
                    Err(error) => tracing::warn!(%error, "bad frame from the extension"),
                }
            }
            Some("status") => {
                let status = ExtensionStatus {
                    installed: true,
                    approved: js::get(message, "approved").is_truthy(),
                    origin: js::get_string(message, "origin").unwrap_or_default(),
                    app_connected: js::get(message, "appConnected").is_truthy(),
                    pending: js::get(message, "pending").is_truthy(),
                };
                for waiter in self.status_waiters.borrow_mut().drain(..) {
                    let _ = waiter.send(status.clone());
                }
            }
            Some("picked") => {
                let id = js::get(message, "id").as_f64().unwrap_or(-1.0);
                let Some(waiter) = self.pick_waiters.borrow_mut().remove(&(id as u32)) else { return };
                let error = js::get(message, "error");
                let answer = if error.is_object() {
                    let code = js::get_string(&error, "code").unwrap_or_default();
                    let code = ErrorCode::parse(&code).unwrap_or(ErrorCode::PickCancelled);
                    let mut e = PedelecError::new(code, js::get_string(&error, "message").unwrap_or_default());
                    e.details = js::get_string(&error, "detailsJson").and_then(|d| serde_json::from_str(&d).ok());
                    Err(e)
                } else {
                    Ok(PickedWorkspace {
                        handle: js::get_string(message, "handle").unwrap_or_default(),
                        name: js::get_string(message, "name").unwrap_or_default(),
                    })
                };
                let _ = waiter.send(answer);
            }
            // Revocation: the extension has ended this origin's sessions and
            // closes the port next, so Core's `Ended` may not get through.
            // Each subscription ends here as ended (not detached), and none
            // is re-sent on a fresh port: that would ask for approval again
            // with no action of the page's.
            Some("approval") if js::get_string(message, "state").as_deref() == Some("revoked") => {
                let subscriptions = self.router.borrow_mut().end_subscriptions();
                for events in subscriptions {
                    let _ = events.unbounded_send(Err(revoked()));
                }
            }
            // Other approval progress notices need no action here: the gated
            // requests themselves complete or fail.
            _ => {}
        }
    }

    fn disconnected(self: &Rc<Self>) {
        // The closures of this port are running now; drop them once this callback returns.
        let old = self.connection.borrow_mut().take();
        wasm_bindgen_futures::spawn_local(async move { drop(old) });
        *self.assembler.borrow_mut() = ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX);
        let heard = self.heard.get();
        self.router.borrow_mut().fail_pending(|| {
            if heard {
                detached("the port to the extension closed")
            } else {
                not_installed("no extension with this id answered (not installed, disabled, or a wrong id)")
            }
        });
        for waiter in self.status_waiters.borrow_mut().drain(..) {
            let _ = waiter.send(ExtensionStatus::default());
        }
        for (_, waiter) in self.pick_waiters.borrow_mut().drain() {
            let _ = waiter.send(Err(detached("the port to the extension closed before a folder was picked")));
        }
        if self.router.borrow().has_subscriptions() {
            let link = self.clone();
            wasm_bindgen_futures::spawn_local(async move { link.resubscribe().await });
        }
    }

    /// Re-sends every live Subscribe on a fresh port (as [`RESUBSCRIBE`]
    /// says); when the extension stays away the subscriptions fail and the
    /// handles detach.
    async fn resubscribe(self: Rc<Self>) {
        for wait in RESUBSCRIBE.delays() {
            sleep(wait.as_millis() as i32).await;
            if !self.router.borrow().has_subscriptions() {
                return;
            }
            if self.ensure_connected().is_err() {
                continue;
            }
            let frames = self.router.borrow_mut().resubscribe();
            if frames.iter().all(|frame| self.post_frame(frame).is_ok()) {
                return;
            }
        }
        let subscriptions = self.router.borrow_mut().end_subscriptions();
        for events in subscriptions {
            let _ = events.unbounded_send(Err(detached("the extension did not come back")));
        }
    }

    pub(crate) async fn request(self: Rc<Self>, call: Call) -> Result<Reply, PedelecError> {
        let (tx, rx) = oneshot::channel();
        let frame = {
            let mut router = self.router.borrow_mut();
            let id = router.next_id();
            let (frame, waiting) = request_frame(id, call, tx);
            router.request(id, waiting);
            frame
        };
        if let Err(error) = self.post_frame(&frame) {
            self.router.borrow_mut().forget(frame.request_id);
            return Err(error);
        }
        rx.await.unwrap_or_else(|_| Err(detached("the request was dropped")))
    }

    async fn subscribe(self: Rc<Self>, request: pb::SubscribeRequest) -> Result<EventStream, PedelecError> {
        let (events, rx) = mpsc::unbounded();
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = {
            let mut router = self.router.borrow_mut();
            let id = router.next_id();
            // Registered before the request goes out, so no event can slip past.
            router.subscribe(id, events, request.clone(), Waiting::new(reply_tx, None));
            id
        };
        let session_id = request.session_id.clone();
        if let Err(error) = self.post_frame(&subscribe_frame(id, request)) {
            self.router.borrow_mut().forget(id);
            return Err(error);
        }
        let guard = Local(Unsubscribe { link: self.clone(), id, session_id });
        let snapshot = match reply_rx.await.unwrap_or_else(|_| Err(detached("the subscription was dropped"))) {
            Ok(Reply::Subscribe(snapshot)) => snapshot,
            Ok(other) => return Err(crate::transport::unexpected(&other)),
            Err(error) => {
                self.router.borrow_mut().forget(id);
                return Err(error);
            }
        };
        let live = rx.map(move |item| {
            let _ = &guard;
            item
        });
        Ok(Box::pin(futures::stream::once(async move { Ok(snapshot) }).chain(live)) as EventStream)
    }

    /// Asks the extension to let the user pick a folder for this page
    /// (approving the origin first if need be); waits as long as the user
    /// takes (the extension gives up after 10 minutes: `PICK_CANCELLED`).
    pub(crate) async fn pick_workspace(self: Rc<Self>) -> Result<PickedWorkspace, PedelecError> {
        self.ensure_connected()?;
        let id = self.next_pick.get().wrapping_add(1);
        self.next_pick.set(id);
        let (tx, rx) = oneshot::channel();
        self.pick_waiters.borrow_mut().insert(id, tx);
        let message = Object::new();
        js::set(&message, "type", "pickWorkspace");
        js::set(&message, "id", id);
        if let Err(error) = self.post(&message.into()) {
            self.pick_waiters.borrow_mut().remove(&id);
            return Err(error);
        }
        rx.await.unwrap_or_else(|_| Err(detached("the port to the extension closed before a folder was picked")))
    }

    /// Asks the extension about this page without ever prompting.
    pub(crate) async fn status(self: Rc<Self>) -> ExtensionStatus {
        if self.ensure_connected().is_err() {
            return ExtensionStatus::default();
        }
        let (tx, rx) = oneshot::channel();
        self.status_waiters.borrow_mut().push(tx);
        let message = Object::new();
        js::set(&message, "type", "status");
        if self.post(&message.into()).is_err() {
            return ExtensionStatus::default();
        }
        // An unknown extension id gives a port that closes at once; a missing
        // answer within the timeout means nothing is listening either.
        let timeout = Box::pin(sleep(3000));
        match futures::future::select(rx, timeout).await {
            futures::future::Either::Left((Ok(status), _)) => status,
            _ => ExtensionStatus::default(),
        }
    }
}

/// Hands routed events to their subscription's queue.
fn deliver(delivery: Option<Delivery<EventSender>>) {
    match delivery {
        Some(Delivery::Event(sink, event)) => drop(sink.unbounded_send(Ok(event))),
        Some(Delivery::Events(sink, events)) => {
            events.into_iter().for_each(|event| drop(sink.unbounded_send(Ok(event))))
        }
        Some(Delivery::Fail(sink, error)) => drop(sink.unbounded_send(Err(error))),
        None => {}
    }
}

/// A batch's header fields, read from its JS object (the turn, a few fields,
/// through its JSON).
fn batch_header(batch: &JsValue) -> Result<BatchHeader, NativeFrameError> {
    let turn = js::get(batch, "turn");
    let turn = if turn.is_object() {
        let text = JSON::stringify(&turn).ok().and_then(|t| t.as_string()).unwrap_or_default();
        Some(json::from_json(&text).map_err(|e| NativeFrameError::BadBatch(format!("bad turn: {e}")))?)
    } else {
        None
    };
    Ok(BatchHeader {
        session_id: js::get_string(batch, "sessionId").unwrap_or_default(),
        turn,
        operation_id: js::get_string(batch, "operationId").unwrap_or_default(),
    })
}

/// Stops the extension forwarding a subscription when the SDK drops its stream.
struct Unsubscribe {
    link: Rc<Link>,
    id: u32,
    session_id: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if self.link.router.borrow_mut().unsubscribe(self.id) {
            let call = Call::Unsubscribe(pb::UnsubscribeRequest {
                session_id: std::mem::take(&mut self.session_id),
                subscription_id: self.id,
            });
            let frame = pb::NativeFrame {
                request_id: self.link.router.borrow_mut().next_id(),
                body: Some(Body::Request(pb::NativeRequest { call: Some(call) })),
                ..Default::default()
            };
            // Best effort: a closed port already ended the subscription.
            let _ = self.link.post_frame(&frame);
        }
    }
}

/// The [`Transport`] over the extension port.
pub struct PortTransport {
    link: Local<Rc<Link>>,
}

impl PortTransport {
    pub(crate) fn new(link: Rc<Link>) -> Self {
        PortTransport { link: Local(link) }
    }
}

impl Transport for PortTransport {
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        Box::pin(Local(self.link.0.clone().request(call)))
    }

    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        Box::pin(Local(self.link.0.clone().subscribe(request)))
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        wasm_bindgen_futures::spawn_local(task);
    }

    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(Local(sleep(duration.as_millis().min(i32::MAX as u128) as i32)))
    }
}
