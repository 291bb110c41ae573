//! Frame routing for the transports that relay `NativeFrame`s (the native
//! host's pipes, [`crate::native`]; the browser extension's port,
//! `web::port`), written once and sans-IO: fed the frames that arrive, it
//! settles waiting requests and says which subscription gets which events.
//! The transports only move bytes and carry [`Delivery`]s out, each with its
//! own queues (bounded natively, where the reader waits; unbounded in a page).
//!
//! The rules:
//! - A frame's `acks` settle their requests before its body, so answers keep
//!   request order.
//! - A response or an error answers the request of its `requestId`; an error
//!   for no request ends the subscription of that id (Core went away).
//! - A batch's events reach their subscription together, in order; a batch
//!   that does not decode lost events, so it ends its subscription.
//! - A subscription re-sent on a fresh connection ([`FrameRouter::resubscribe`])
//!   gets its snapshot reply as an event.

use std::collections::{HashMap, HashSet};

use futures::channel::oneshot;
use pedelec_protocol::ErrorCode;
use pedelec_protocol::event_batch::batch_events;
use pedelec_protocol::native::NativeFrameError;
use pedelec_protocol::pb::{self, native_frame::Body};

use crate::error::PedelecError;
use crate::transport::{Call, Reply};

/// What a transport hands to one of its subscriptions (`S`, the sending
/// side of that subscription's queue).
#[derive(Debug)]
// Moved once, straight into a queue; boxing the event would allocate once
// per streamed delta.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Delivery<S> {
    /// One event.
    Event(S, pb::SessionEvent),
    /// A batch's events, in order.
    Events(S, Vec<pb::SessionEvent>),
    /// The subscription ends with this error, the last thing its stream
    /// yields; it is routed no more.
    Fail(S, PedelecError),
}

/// A request waiting for its answer. `ack` is the reply an acknowledgement
/// (`NativeFrame.acks`) stands for, when the request was sent with
/// `defer_ack`: the host then answers its success that way instead of with
/// a response frame.
pub(crate) struct Waiting {
    tx: oneshot::Sender<Result<Reply, PedelecError>>,
    ack: Option<Reply>,
}

impl Waiting {
    pub(crate) fn new(tx: oneshot::Sender<Result<Reply, PedelecError>>, ack: Option<Reply>) -> Self {
        Waiting { tx, ack }
    }

    fn answer(self, result: Result<Reply, PedelecError>) {
        let _ = self.tx.send(result);
    }

    /// Settled by an acknowledgement. One for a request that did not ask
    /// for it is the host's mistake; it still settles, as an error, so
    /// nothing waits for a response that will not come.
    fn acknowledged(self) {
        let result = self.ack.ok_or_else(|| {
            PedelecError::new(ErrorCode::TransportError, "the native host acknowledged a request that needs a response")
        });
        let _ = self.tx.send(result);
    }
}

/// A request's frame and what waits for its answer: a request whose success
/// carries nothing (a tool result) asks for `defer_ack`, so that success can
/// ride on the host's next frame instead of a message of its own.
pub(crate) fn request_frame(
    request_id: u32,
    call: Call,
    tx: oneshot::Sender<Result<Reply, PedelecError>>,
) -> (pb::NativeFrame, Waiting) {
    let ack = pedelec_protocol::native::acknowledged_reply(&call);
    let defer_ack = ack.is_some();
    let body = Some(Body::Request(pb::NativeRequest { call: Some(call) }));
    (pb::NativeFrame { request_id, body, defer_ack, ..Default::default() }, Waiting { tx, ack })
}

/// The frame of a Subscribe. Its reply is awaited like any request's: it is
/// registered with [`FrameRouter::subscribe`], and never asks for `defer_ack`.
pub(crate) fn subscribe_frame(request_id: u32, request: pb::SubscribeRequest) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id,
        body: Some(Body::Request(pb::NativeRequest { call: Some(Call::Subscribe(request)) })),
        ..Default::default()
    }
}

/// The last request id of ours: ids from 2^31 up belong to the extension
/// (extension/README.md).
const LAST_OWN_ID: u32 = 0x7fff_ffff;

/// A live subscription: where its events go, and its request, to send again
/// on a fresh connection.
struct Subscription<S> {
    sink: S,
    // Only the browser's port reconnects, and re-sends its subscriptions.
    #[cfg_attr(not(all(feature = "web", target_arch = "wasm32")), allow(dead_code))]
    request: pb::SubscribeRequest,
}

/// The requests and subscriptions of one relaying transport (see the module docs).
pub(crate) struct FrameRouter<S> {
    pending: HashMap<u32, Waiting>,
    subscriptions: HashMap<u32, Subscription<S>>,
    /// Subscriptions re-sent on a fresh connection: their snapshot reply is an event.
    resubscribing: HashSet<u32>,
    next_id: u32,
}

impl<S: Clone> FrameRouter<S> {
    pub(crate) fn new() -> Self {
        FrameRouter {
            pending: HashMap::new(),
            subscriptions: HashMap::new(),
            resubscribing: HashSet::new(),
            next_id: 1,
        }
    }

    /// A fresh request id, wrapping below the extension's own.
    pub(crate) fn next_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = if id >= LAST_OWN_ID { 1 } else { id + 1 };
        id
    }

    /// Waits for the answer of request `id`.
    pub(crate) fn request(&mut self, id: u32, waiting: Waiting) {
        self.pending.insert(id, waiting);
    }

    /// Registers subscription `id` before its request goes out, so no event
    /// can slip past; `reply` waits for its snapshot.
    pub(crate) fn subscribe(&mut self, id: u32, sink: S, request: pb::SubscribeRequest, reply: Waiting) {
        self.subscriptions.insert(id, Subscription { sink, request });
        self.pending.insert(id, reply);
    }

    /// Forgets request `id`, and the subscription it opened if any (its
    /// request could not be sent, or its reply was an error).
    pub(crate) fn forget(&mut self, id: u32) {
        self.pending.remove(&id);
        self.subscriptions.remove(&id);
    }

    /// Stops routing subscription `id`; whether it was live (then the other
    /// end should be told).
    pub(crate) fn unsubscribe(&mut self, id: u32) -> bool {
        self.subscriptions.remove(&id).is_some()
    }

    /// Settles requests answered by acknowledgement.
    pub(crate) fn acknowledge(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            if let Some(waiting) = self.pending.remove(&id) {
                waiting.acknowledged();
            }
        }
    }

    /// Routes one whole (reassembled) frame.
    pub(crate) fn route(&mut self, frame: pb::NativeFrame) -> Option<Delivery<S>> {
        let id = frame.request_id;
        self.acknowledge(frame.acks.iter().copied());
        match frame.body {
            Some(Body::Event(event)) => self.subscriptions.get(&id).map(|sub| Delivery::Event(sub.sink.clone(), event)),
            Some(Body::Batch(batch)) => self.batch(id, batch_events(&batch)),
            Some(Body::Response(response)) => {
                let resubscribed = self.resubscribing.remove(&id);
                match response.result {
                    Some(Reply::Subscribe(snapshot)) if resubscribed => {
                        self.subscriptions.get(&id).map(|sub| Delivery::Event(sub.sink.clone(), snapshot))
                    }
                    _ if resubscribed => None,
                    Some(result) => {
                        if let Some(waiting) = self.pending.remove(&id) {
                            waiting.answer(Ok(result));
                        }
                        None
                    }
                    None => {
                        // Nothing will answer it now: the caller hears so.
                        tracing::warn!(request_id = id, "a response without a result");
                        self.pending.remove(&id);
                        None
                    }
                }
            }
            Some(Body::Error(error)) => {
                self.resubscribing.remove(&id);
                if let Some(waiting) = self.pending.remove(&id) {
                    waiting.answer(Err(error.into()));
                    None
                } else {
                    // A live subscription failed (e.g. Core went away).
                    self.fail(id, error.into())
                }
            }
            // A frame of acknowledgements only.
            None if !frame.acks.is_empty() => None,
            _ => {
                tracing::warn!(request_id = id, "an unexpected frame");
                None
            }
        }
    }

    /// Routes a batch's events to subscription `id` in one pass. A batch
    /// that does not decode lost events, so its subscription fails rather
    /// than going on with a gap.
    pub(crate) fn batch(
        &mut self,
        id: u32,
        events: Result<Vec<pb::SessionEvent>, NativeFrameError>,
    ) -> Option<Delivery<S>> {
        match events {
            Ok(events) => self.subscriptions.get(&id).map(|sub| Delivery::Events(sub.sink.clone(), events)),
            Err(error) => {
                tracing::warn!(%error, "a batch of events could not be decoded");
                self.fail(id, PedelecError::new(error.code(), error.to_string()))
            }
        }
    }

    fn fail(&mut self, id: u32, error: PedelecError) -> Option<Delivery<S>> {
        self.subscriptions.remove(&id).map(|sub| Delivery::Fail(sub.sink, error))
    }

    /// The connection closed: every waiting request fails with `error()`.
    /// Subscriptions stay, to be re-sent or ended by the transport.
    pub(crate) fn fail_pending(&mut self, error: impl Fn() -> PedelecError) {
        self.resubscribing.clear();
        for (_, waiting) in self.pending.drain() {
            waiting.answer(Err(error()));
        }
    }

    /// Ends every subscription; the transport sends each its last error.
    pub(crate) fn end_subscriptions(&mut self) -> Vec<S> {
        self.resubscribing.clear();
        self.subscriptions.drain().map(|(_, sub)| sub.sink).collect()
    }

    // Only the browser's port reconnects, and re-sends its subscriptions.
    #[cfg_attr(not(all(feature = "web", target_arch = "wasm32")), allow(dead_code))]
    pub(crate) fn has_subscriptions(&self) -> bool {
        !self.subscriptions.is_empty()
    }

    /// The Subscribe frames of every live subscription, to send on a fresh
    /// connection; their snapshot replies will be routed as events.
    #[cfg_attr(not(all(feature = "web", target_arch = "wasm32")), allow(dead_code))]
    pub(crate) fn resubscribe(&mut self) -> Vec<pb::NativeFrame> {
        let frames: Vec<pb::NativeFrame> =
            self.subscriptions.iter().map(|(id, sub)| subscribe_frame(*id, sub.request.clone())).collect();
        self.resubscribing.extend(frames.iter().map(|f| f.request_id));
        frames
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::oneshot;
    use pedelec_protocol::native::acknowledged_reply;
    use pedelec_protocol::{ErrorCode, pb};

    use super::*;

    type Router = FrameRouter<&'static str>;

    fn frame(request_id: u32, body: Body) -> pb::NativeFrame {
        pb::NativeFrame { request_id, body: Some(body), ..Default::default() }
    }

    fn event(seq: u64) -> pb::SessionEvent {
        pb::SessionEvent { session_id: "s".into(), seq, ..Default::default() }
    }

    fn subscribed(router: &mut Router, id: u32, sink: &'static str) -> oneshot::Receiver<Result<Reply, PedelecError>> {
        let (tx, rx) = oneshot::channel();
        router.subscribe(id, sink, pb::SubscribeRequest::default(), Waiting::new(tx, None));
        rx
    }

    #[test]
    fn an_acknowledgement_settles_with_the_reply_it_stands_for_and_never_leaves_a_request_waiting() {
        let submit = Call::SubmitToolResult(pb::SubmitToolResultRequest::default());
        let (tx, mut rx) = oneshot::channel();
        Waiting::new(tx, acknowledged_reply(&submit)).acknowledged();
        let settled = rx.try_recv().unwrap().expect("settled");
        assert_eq!(settled.unwrap(), Reply::SubmitToolResult(pb::SubmitToolResultResponse {}));
        // A request that needs its response, acknowledged by a host that
        // got it wrong: settled all the same, as a transport error.
        let (tx, mut rx) = oneshot::channel();
        Waiting::new(tx, acknowledged_reply(&Call::Ping(pb::PingRequest {}))).acknowledged();
        let settled = rx.try_recv().unwrap().expect("settled");
        assert_eq!(settled.unwrap_err().code, ErrorCode::TransportError.as_str());
    }

    #[test]
    fn acks_settle_before_the_body_and_events_reach_their_subscription() {
        let mut router = Router::new();
        let mut snapshot = subscribed(&mut router, 1, "sub-1");
        let (tx, mut submitted) = oneshot::channel();
        let submit = Call::SubmitToolResult(pb::SubmitToolResultRequest::default());
        let (_, waiting) = request_frame(2, submit, tx);
        router.request(2, waiting);
        let answer = pb::NativeResponse { result: Some(Reply::Subscribe(event(1))) };
        assert!(router.route(frame(1, Body::Response(answer))).is_none());
        assert_eq!(snapshot.try_recv().unwrap().unwrap().unwrap(), Reply::Subscribe(event(1)));
        let mut next = frame(1, Body::Event(event(2)));
        next.acks = vec![2];
        let delivery = router.route(next);
        assert!(submitted.try_recv().unwrap().unwrap().is_ok(), "settled by the ack");
        assert!(matches!(delivery, Some(Delivery::Event("sub-1", e)) if e.seq == 2));
        assert!(router.route(frame(9, Body::Event(event(3)))).is_none(), "no such subscription");
    }

    #[test]
    fn a_batch_that_does_not_decode_ends_its_subscription() {
        let mut router = Router::new();
        let _snapshot = subscribed(&mut router, 1, "sub-1");
        let broken = pb::EventBatch { session_id: "s".into(), events: b"garbage".to_vec(), ..Default::default() };
        let delivery = router.route(frame(1, Body::Batch(broken)));
        assert!(matches!(delivery, Some(Delivery::Fail("sub-1", _))), "{delivery:?}");
        assert!(!router.has_subscriptions());
    }

    #[test]
    fn an_error_answers_its_request_or_else_ends_its_subscription() {
        let mut router = Router::new();
        let mut reply = subscribed(&mut router, 1, "sub-1");
        let gone = || pb::Error::new(ErrorCode::CoreRuntimeUnavailable, "Core went away");
        assert!(router.route(frame(1, Body::Error(gone()))).is_none());
        assert!(reply.try_recv().unwrap().unwrap().is_err(), "the Subscribe itself failed");
        router.forget(1);
        let _snapshot = subscribed(&mut router, 3, "sub-3");
        router.route(frame(3, Body::Response(pb::NativeResponse { result: Some(Reply::Subscribe(event(1))) })));
        let delivery = router.route(frame(3, Body::Error(gone())));
        assert!(matches!(delivery, Some(Delivery::Fail("sub-3", e)) if e.code == "CORE_RUNTIME_UNAVAILABLE"));
    }

    #[test]
    fn a_resubscription_delivers_its_snapshot_as_an_event_and_a_closed_connection_fails_requests() {
        let mut router = Router::new();
        let _first = subscribed(&mut router, 1, "sub-1");
        router.route(frame(1, Body::Response(pb::NativeResponse { result: Some(Reply::Subscribe(event(1))) })));
        let (tx, mut ping) = oneshot::channel();
        router.request(2, Waiting::new(tx, None));
        router.fail_pending(|| PedelecError::new(ErrorCode::TransportDetached, "closed"));
        assert!(ping.try_recv().unwrap().unwrap().is_err());
        let frames = router.resubscribe();
        assert_eq!(frames.iter().map(|f| f.request_id).collect::<Vec<_>>(), [1]);
        let again = pb::NativeResponse { result: Some(Reply::Subscribe(event(7))) };
        let delivery = router.route(frame(1, Body::Response(again)));
        assert!(matches!(delivery, Some(Delivery::Event("sub-1", e)) if e.seq == 7));
        assert_eq!(router.end_subscriptions(), ["sub-1"]);
    }

    #[test]
    fn request_ids_stay_below_the_extensions_own() {
        let mut router = Router::new();
        router.next_id = LAST_OWN_ID;
        assert_eq!(router.next_id(), LAST_OWN_ID);
        assert_eq!(router.next_id(), 1);
    }
}
