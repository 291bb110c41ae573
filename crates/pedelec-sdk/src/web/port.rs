//! The browser transport: a `chrome.runtime.connect(extensionId)` port to the
//! Pedelec extension, carrying the same `NativeFrame`s the native host speaks
//! (as `{ type: "frame", frame }` messages; see `extension/README.md`).
//!
//! Requests pair with responses by `requestId`, events arrive tagged with
//! their Subscribe's id, and chunked frames are reassembled with the protocol
//! crate's [`ChunkAssembler`] — the same rules as [`crate::native`]. When the
//! port drops (the extension's service worker restarted, or the extension was
//! reloaded) pending requests fail with `TRANSPORT_DETACHED` and live
//! subscriptions are re-sent on a fresh port, so the session machine receives
//! a new snapshot and carries on.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use futures::StreamExt;
use futures::channel::{mpsc, oneshot};
use js_sys::{Function, JSON, Object};
use pedelec_protocol::event_batch::{BatchHeader, batch_events, batch_events_base64};
use pedelec_protocol::native::{ChunkAssembler, NativeFrameError, decode_native_frame};
use pedelec_protocol::pb::{self, native_frame::Body};
use pedelec_protocol::{ErrorCode, json, limits};
use wasm_bindgen::prelude::*;
use wasm_bindgen::{JsCast, JsValue};

use super::js;
use super::local::Local;
use crate::delivery::{Waiting, decoded_batch, request_frame};
use crate::error::PedelecError;
use crate::transport::{BoxFuture, Call, EventStream, Reply, Transport};

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

struct Subscription {
    events: EventSender,
    request: pb::SubscribeRequest,
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
    pending: RefCell<HashMap<u32, Waiting>>,
    subscriptions: RefCell<HashMap<u32, Subscription>>,
    /// Subscriptions re-sent on a fresh port: their snapshot reply is an event.
    resubscribing: RefCell<HashSet<u32>>,
    status_waiters: RefCell<Vec<oneshot::Sender<ExtensionStatus>>>,
    assembler: RefCell<ChunkAssembler>,
    next_id: Cell<u32>,
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
            pending: RefCell::default(),
            subscriptions: RefCell::default(),
            resubscribing: RefCell::default(),
            status_waiters: RefCell::default(),
            assembler: RefCell::new(ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX)),
            next_id: Cell::new(1),
        })
    }

    fn next_id(&self) -> u32 {
        // Ids from 2^31 up belong to the extension (extension/README.md).
        let id = self.next_id.get();
        self.next_id.set(if id >= 0x7fff_ffff { 1 } else { id + 1 });
        id
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
                    // Requests the host answered by acknowledgement (in a
                    // tool loop, the previous tool result), settled before
                    // the body as `route` does for decoded frames.
                    let acks = js::get(&frame, "acks");
                    if let Some(acks) = acks.dyn_ref::<js_sys::Array>() {
                        self.acknowledge(acks.iter().filter_map(|id| id.as_f64()).map(|id| id as u32));
                    }
                    let request_id = js::get(&frame, "requestId").as_f64().unwrap_or(0.0);
                    let events = js::get_string(&batch, "events").unwrap_or_default();
                    let shared = batch_shared(&batch);
                    self.route_batch(request_id as u32, shared.and_then(|s| batch_events_base64(s, &events)));
                    return;
                }
                let text = JSON::stringify(&frame).ok().and_then(|t| t.as_string());
                let Some(text) = text else { return };
                let frame = decode_native_frame(&text).and_then(|f| self.assembler.borrow_mut().accept(f));
                match frame {
                    Ok(Some(frame)) => self.route(frame),
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
            // Revocation: the extension has ended this origin's sessions and
            // closes the port next, so Core's `Ended` may not get through.
            // Each subscription ends here as ended (not detached), and none
            // is re-sent on a fresh port: that would ask for approval again
            // with no action of the page's.
            Some("approval") if js::get_string(message, "state").as_deref() == Some("revoked") => {
                let subscriptions: Vec<Subscription> =
                    self.subscriptions.borrow_mut().drain().map(|(_, s)| s).collect();
                for sub in subscriptions {
                    let _ = sub.events.unbounded_send(Err(revoked()));
                }
            }
            // Other approval progress notices need no action here: the gated
            // requests themselves complete or fail.
            _ => {}
        }
    }

    /// Applies a batch in one pass: its events enter the subscription's
    /// queue together, in order. A batch that does not decode lost events,
    /// so its subscription fails rather than going on with a gap.
    fn route_batch(&self, id: u32, events: Result<Vec<pb::SessionEvent>, NativeFrameError>) {
        let mut subscriptions = self.subscriptions.borrow_mut();
        match decoded_batch(events) {
            Ok(events) => {
                if let Some(sub) = subscriptions.get(&id) {
                    events.into_iter().for_each(|event| drop(sub.events.unbounded_send(Ok(event))));
                }
            }
            Err(error) => {
                if let Some(sub) = subscriptions.remove(&id) {
                    let _ = sub.events.unbounded_send(Err(error));
                }
            }
        }
    }

    /// Settles requests the host answered by acknowledgement.
    fn acknowledge(&self, ids: impl Iterator<Item = u32>) {
        for id in ids {
            let waiting = self.pending.borrow_mut().remove(&id);
            if let Some(waiting) = waiting {
                waiting.acknowledged();
            }
        }
    }

    fn route(&self, frame: pb::NativeFrame) {
        let id = frame.request_id;
        self.acknowledge(frame.acks.iter().copied());
        match frame.body {
            Some(Body::Event(event)) => {
                if let Some(sub) = self.subscriptions.borrow().get(&id) {
                    let _ = sub.events.unbounded_send(Ok(event));
                }
            }
            Some(Body::Batch(batch)) => self.route_batch(id, batch_events(&batch)),
            Some(Body::Response(response)) => {
                let Some(result) = response.result else { return };
                if self.resubscribing.borrow_mut().remove(&id) {
                    if let (Reply::Subscribe(snapshot), Some(sub)) = (result, self.subscriptions.borrow().get(&id)) {
                        let _ = sub.events.unbounded_send(Ok(snapshot));
                    }
                } else if let Some(waiting) = self.pending.borrow_mut().remove(&id) {
                    waiting.answer(Ok(result));
                }
            }
            Some(Body::Error(error)) => {
                self.resubscribing.borrow_mut().remove(&id);
                if let Some(waiting) = self.pending.borrow_mut().remove(&id) {
                    waiting.answer(Err(error.into()));
                } else if let Some(sub) = self.subscriptions.borrow_mut().remove(&id) {
                    let _ = sub.events.unbounded_send(Err(error.into()));
                }
            }
            // A frame of acknowledgements only.
            None if !frame.acks.is_empty() => {}
            _ => tracing::warn!(request_id = id, "unexpected frame from the extension"),
        }
    }

    fn disconnected(self: &Rc<Self>) {
        // The closures of this port are running now; drop them once this callback returns.
        let old = self.connection.borrow_mut().take();
        wasm_bindgen_futures::spawn_local(async move { drop(old) });
        *self.assembler.borrow_mut() = ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX);
        let pending: Vec<Waiting> = self.pending.borrow_mut().drain().map(|(_, waiting)| waiting).collect();
        let heard = self.heard.get();
        for waiting in pending {
            let error = if heard {
                detached("the port to the extension closed")
            } else {
                not_installed("no extension with this id answered (not installed, disabled, or a wrong id)")
            };
            waiting.answer(Err(error));
        }
        for waiter in self.status_waiters.borrow_mut().drain(..) {
            let _ = waiter.send(ExtensionStatus::default());
        }
        self.resubscribing.borrow_mut().clear();
        if !self.subscriptions.borrow().is_empty() {
            let link = self.clone();
            wasm_bindgen_futures::spawn_local(async move { link.resubscribe().await });
        }
    }

    /// Re-sends every live Subscribe on a fresh port (backoff 100 ms … 3.2 s);
    /// when the extension stays away the subscriptions fail and the handles detach.
    async fn resubscribe(self: Rc<Self>) {
        for attempt in 0..6 {
            sleep(100 << attempt).await;
            if self.subscriptions.borrow().is_empty() {
                return;
            }
            if self.ensure_connected().is_err() {
                continue;
            }
            let requests: Vec<(u32, pb::SubscribeRequest)> =
                self.subscriptions.borrow().iter().map(|(id, s)| (*id, s.request.clone())).collect();
            let mut sent = true;
            for (id, request) in requests {
                self.resubscribing.borrow_mut().insert(id);
                let frame = subscribe_frame(id, request);
                if self.post_frame(&frame).is_err() {
                    sent = false;
                    break;
                }
            }
            if sent {
                return;
            }
        }
        let subscriptions: Vec<Subscription> = self.subscriptions.borrow_mut().drain().map(|(_, s)| s).collect();
        for sub in subscriptions {
            let _ = sub.events.unbounded_send(Err(detached("the extension did not come back")));
        }
    }

    pub(crate) async fn request(self: Rc<Self>, call: Call) -> Result<Reply, PedelecError> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        let (frame, waiting) = request_frame(id, call, tx);
        self.pending.borrow_mut().insert(id, waiting);
        if let Err(error) = self.post_frame(&frame) {
            self.pending.borrow_mut().remove(&id);
            return Err(error);
        }
        rx.await.unwrap_or_else(|_| Err(detached("the request was dropped")))
    }

    async fn subscribe(self: Rc<Self>, request: pb::SubscribeRequest) -> Result<EventStream, PedelecError> {
        let id = self.next_id();
        let (events, rx) = mpsc::unbounded();
        // Registered before the request goes out, so no event can slip past.
        self.subscriptions.borrow_mut().insert(id, Subscription { events, request: request.clone() });
        let (reply_tx, reply_rx) = oneshot::channel();
        self.pending.borrow_mut().insert(id, Waiting::new(reply_tx, None));
        let session_id = request.session_id.clone();
        if let Err(error) = self.post_frame(&subscribe_frame(id, request)) {
            self.pending.borrow_mut().remove(&id);
            self.subscriptions.borrow_mut().remove(&id);
            return Err(error);
        }
        let guard = Local(Unsubscribe { link: self.clone(), id, session_id });
        let snapshot = match reply_rx.await.unwrap_or_else(|_| Err(detached("the subscription was dropped"))) {
            Ok(Reply::Subscribe(snapshot)) => snapshot,
            Ok(other) => return Err(crate::transport::unexpected(&other)),
            Err(error) => {
                self.subscriptions.borrow_mut().remove(&id);
                return Err(error);
            }
        };
        let live = rx.map(move |item| {
            let _ = &guard;
            item
        });
        Ok(Box::pin(futures::stream::once(async move { Ok(snapshot) }).chain(live)) as EventStream)
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

/// A batch's shared fields, read from its JS object (the turn, a few fields,
/// through its JSON).
fn batch_shared(batch: &JsValue) -> Result<BatchHeader, NativeFrameError> {
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

fn subscribe_frame(id: u32, request: pb::SubscribeRequest) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id: id,
        body: Some(Body::Request(pb::NativeRequest { call: Some(Call::Subscribe(request)) })),
        ..Default::default()
    }
}

/// Stops the extension forwarding a subscription when the SDK drops its stream.
struct Unsubscribe {
    link: Rc<Link>,
    id: u32,
    session_id: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if self.link.subscriptions.borrow_mut().remove(&self.id).is_some() {
            let call = Call::Unsubscribe(pb::UnsubscribeRequest {
                session_id: std::mem::take(&mut self.session_id),
                subscription_id: self.id,
            });
            let frame = pb::NativeFrame {
                request_id: self.link.next_id(),
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
