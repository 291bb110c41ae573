//! The relay: native-messaging frames on one side, Core on the other.
//!
//! Requests are forwarded concurrently (at most [`MAX_IN_FLIGHT`] at a time;
//! reading pauses beyond that, so memory stays bounded) and their responses
//! are written in request order. A Subscribe is answered with its snapshot,
//! then its events follow as frames tagged with the Subscribe's request id,
//! in Core's order; events that are ready together share one batch frame.
//! The owner's WatchSession is relayed the same way, except that each event
//! is a frame of its own: the extension's pages read them as JSON and have
//! no decoder for a batch's protobuf.
//! Every frame written is ≤ 1 MiB; larger ones become chunks. The success of
//! a request sent with `defer_ack` (a tool result, a permission answer) is
//! not a frame of its own: it rides in `acks` on the next frame written — in
//! a tool loop, the batch with the agent's next call — or, when nothing else
//! is written within `NATIVE_ACK_DELAY`, in a frame of acks alone.
//!
//! When Core goes away, every live subscription gets an error frame
//! (`CORE_RUNTIME_UNAVAILABLE`) and the relay ends, so the host exits and the
//! extension reconnects (starting a fresh host, which finds or starts Core).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{AbortHandle, Abortable, Shared};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use pedelec_client::PedelecError;
use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply, Transport};
use pedelec_protocol::event_batch::EventBatcher;
use pedelec_protocol::native::{
    ChunkAssembler, FrameDecoder, NativeFrameError, acknowledged_reply, decode_native_frame, encode_native_frame,
    error_frame, request_call,
};
use pedelec_protocol::pb::{self, native_frame::Body};
use pedelec_protocol::{ErrorCode, limits};

use crate::core_link::CoreLink;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Requests forwarded at once before the relay stops reading.
pub const MAX_IN_FLIGHT: usize = 256;
/// Frames queued for stdout before producers wait. A frame can be a batch
/// of up to `NATIVE_BATCH_MAX_EVENTS` events and 704 KiB, so this bounds the
/// host's memory (≈ 22 MiB at worst) and how far it reads ahead of a browser
/// that stopped reading: past it, the host stops reading Core, whose event
/// log keeps the events for the subscriber (re-synchronising it only if it
/// falls out of the log) instead of the host queueing a whole turn.
const OUTGOING_QUEUE: usize = 32;

/// Why the relay stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// stdin closed: the browser port went away.
    InputClosed,
    /// The input cannot be read any further (truncated or oversized frame).
    BadInput(ErrorCode),
    /// Core went away.
    CoreLost,
    /// stdout is gone.
    OutputClosed,
}

/// A request's outcome, and whether its success may be acknowledged later.
type Outcome = (u32, bool, Result<(Reply, Option<Events>), PedelecError>);

/// A subscription's live events, and how they travel.
struct Events {
    stream: EventStream,
    framing: Framing,
}

/// How a subscription's events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Events ready at once share one batch frame (Subscribe).
    Batched,
    /// One `event` frame per event (WatchSession).
    EachAlone,
}

/// What goes to stdout, in order.
// Frames are what the queue mostly holds, as it did before acks went in
// beside them; boxing each would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Outgoing {
    Frame(pb::NativeFrame),
    /// The success of a `defer_ack` request: rides on the next frame.
    Ack(u32),
}

impl From<pb::NativeFrame> for Outgoing {
    fn from(frame: pb::NativeFrame) -> Self {
        Outgoing::Frame(frame)
    }
}

/// Writes frames in order, chunking anything over Chrome's 1 MiB limit.
/// Acknowledgements are held until the next frame, which carries them (its
/// receiver settles them before its body, so the order of answers holds);
/// none is held longer than `NATIVE_ACK_DELAY`, nor more than
/// `NATIVE_MAX_HELD_ACKS` at once, and the last ones go out before the
/// writer ends.
async fn write_frames<W: AsyncWrite + Unpin>(mut output: W, mut queue: mpsc::Receiver<Outgoing>) {
    let mut message_id = 0u32;
    let mut bytes = Vec::new();
    let mut acks: Vec<u32> = Vec::new();
    // When the oldest held acknowledgement is due.
    let mut due = tokio::time::Instant::now();
    loop {
        let first = if acks.is_empty() {
            queue.recv().await
        } else {
            match tokio::time::timeout_at(due, queue.recv()).await {
                Ok(item) => item,
                // Nothing to ride on: the acknowledgements go alone.
                Err(_) => Some(Outgoing::Frame(pb::NativeFrame::default())),
            }
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(item) = next.take() {
            let frame = match item {
                Outgoing::Ack(request_id) => {
                    if acks.is_empty() {
                        due = tokio::time::Instant::now() + limits::NATIVE_ACK_DELAY;
                    }
                    acks.push(request_id);
                    (acks.len() >= limits::NATIVE_MAX_HELD_ACKS).then(pb::NativeFrame::default)
                }
                Outgoing::Frame(frame) => Some(frame),
            };
            if let Some(mut frame) = frame {
                frame.acks = std::mem::take(&mut acks);
                encode_into(&mut bytes, &frame, &mut message_id);
            }
            if bytes.len() < 256 * 1024 {
                next = queue.try_recv().ok();
            }
        }
        if !bytes.is_empty() && (output.write_all(&bytes).await.is_err() || output.flush().await.is_err()) {
            return;
        }
        bytes.clear();
    }
    if !acks.is_empty() {
        encode_into(&mut bytes, &pb::NativeFrame { acks, ..Default::default() }, &mut message_id);
        let _ = output.write_all(&bytes).await;
        let _ = output.flush().await;
    }
}

/// Appends one frame's bytes (its chunks, when it is over 1 MiB).
fn encode_into(bytes: &mut Vec<u8>, frame: &pb::NativeFrame, message_id: &mut u32) {
    *message_id = message_id.wrapping_add(1);
    for piece in encode_native_frame(frame, limits::NATIVE_HOST_TO_BROWSER_MAX, *message_id) {
        bytes.extend_from_slice(&piece);
    }
}

/// Core as the relay sees it: a connection being made (the relay reads and
/// decodes the browser's first frames meanwhile), then made or failed.
/// `None` means Core could not be reached: every request is then answered
/// `CORE_RUNTIME_UNAVAILABLE`.
pub type CoreFuture = Shared<BoxFuture<'static, Option<Arc<CoreLink>>>>;

/// A [`CoreFuture`] that is already settled.
pub fn settled(core: Option<Arc<CoreLink>>) -> CoreFuture {
    futures::future::ready(core).boxed().shared()
}

/// Runs the relay until the input closes, the input breaks, or Core goes away.
pub async fn run<R, W>(mut input: R, output: W, core: CoreFuture) -> Exit
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, frames) = mpsc::channel::<Outgoing>(OUTGOING_QUEUE);
    let writer = tokio::spawn(write_frames(output, frames));
    let subscriptions: Arc<Mutex<HashMap<u32, AbortHandle>>> = Arc::default();
    let (lost_tx, mut lost_rx) = mpsc::channel::<()>(1);
    let mut decoder = FrameDecoder::new(limits::NATIVE_BROWSER_TO_HOST_MAX);
    let mut assembler = ChunkAssembler::new(limits::NATIVE_BROWSER_TO_HOST_MAX);
    let mut in_flight: FuturesOrdered<BoxFuture<'static, Outcome>> = FuturesOrdered::new();
    let mut buf = vec![0u8; 64 * 1024];
    let link_lost = async {
        match core.clone().await {
            Some(link) => link.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(link_lost);

    let exit = loop {
        tokio::select! {
            biased;
            _ = lost_rx.recv() => break Exit::CoreLost,
            () = &mut link_lost => break Exit::CoreLost,
            Some((request_id, defer_ack, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                let item = match outcome {
                    Ok(_) if defer_ack => Outgoing::Ack(request_id),
                    Ok((reply, stream)) => {
                        if let Some(events) = stream {
                            start_forwarding(request_id, events, out.clone(), subscriptions.clone(), lost_tx.clone());
                        }
                        let body = Some(Body::Response(pb::NativeResponse { result: Some(reply) }));
                        pb::NativeFrame { request_id, body, ..Default::default() }.into()
                    }
                    Err(error) => pb::NativeFrame { request_id, body: Some(Body::Error(error.to_pb())), ..Default::default() }.into(),
                };
                if out.send(item).await.is_err() {
                    break Exit::OutputClosed;
                }
            }
            read = input.read(&mut buf), if in_flight.len() < MAX_IN_FLIGHT => {
                let n = match read {
                    Ok(0) | Err(_) => {
                        if let Err(e) = decoder.finish() {
                            tracing::warn!(error = %e, "input ended inside a frame");
                        }
                        // The browser is gone; nobody reads the remaining answers.
                        break Exit::InputClosed;
                    }
                    Ok(n) => n,
                };
                decoder.push(&buf[..n]);
                let mut fatal = None;
                while let Some(next) = decoder.next_frame() {
                    let reply = match next {
                        Err(error @ NativeFrameError::TooLarge { .. }) => {
                            fatal = Some(error.code());
                            Some(error_frame(0, error.code(), error.to_string()))
                        }
                        Err(error) => Some(error_frame(0, error.code(), error.to_string())),
                        Ok(text) => match decode_native_frame(&text).and_then(|f| assembler.accept(f)) {
                            Err(error) => Some(error_frame(request_id_of(&text), error.code(), error.to_string())),
                            Ok(None) => None,
                            Ok(Some(frame)) => match accept(frame, &core, &subscriptions) {
                                Ok(future) => {
                                    in_flight.push_back(future);
                                    None
                                }
                                Err(frame) => Some(*frame),
                            },
                        },
                    };
                    if let Some(frame) = reply
                        && out.send(frame.into()).await.is_err() {
                            fatal = Some(ErrorCode::TransportError);
                        }
                    if fatal.is_some() {
                        break;
                    }
                }
                if let Some(code) = fatal {
                    break Exit::BadInput(code);
                }
            }
        }
    };
    let remaining: Vec<(u32, AbortHandle)> = subscriptions.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
    for (request_id, handle) in remaining {
        handle.abort();
        if exit == Exit::CoreLost {
            // Every affected subscription hears about it, not only the first to notice.
            let _ = out
                .send(
                    error_frame(request_id, ErrorCode::CoreRuntimeUnavailable, "the connection to Core was lost")
                        .into(),
                )
                .await;
        }
    }
    drop(in_flight);
    drop(out);
    let _ = writer.await;
    exit
}

/// Best effort: the `requestId` of a frame that did not decode, so the error can pair.
fn request_id_of(text: &str) -> u32 {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("requestId").and_then(|id| id.as_u64()))
        .and_then(|id| u32::try_from(id).ok())
        .unwrap_or(0)
}

/// Turns one decoded frame into the future that answers it, or an immediate error frame.
fn accept(
    frame: pb::NativeFrame,
    core: &CoreFuture,
    subscriptions: &Arc<Mutex<HashMap<u32, AbortHandle>>>,
) -> Result<BoxFuture<'static, Outcome>, Box<pb::NativeFrame>> {
    let asks_defer = frame.defer_ack;
    let (request_id, call) = request_call(frame)?;
    // Only a request whose success carries nothing is acknowledged later.
    let defer_ack = asks_defer && acknowledged_reply(&call).is_some();
    if let Call::Unsubscribe(unsubscribe) = &call {
        let handle = subscriptions.lock().unwrap_or_else(|p| p.into_inner()).remove(&unsubscribe.subscription_id);
        if let Some(handle) = handle {
            handle.abort();
        }
        let reply = Ok((Reply::Unsubscribe(pb::UnsubscribeResponse {}), None));
        return Ok(Box::pin(async move { (request_id, false, reply) }));
    }
    // While Core is still being reached, the answer waits for the connection.
    let core = core.clone();
    let future = async move {
        let Some(core) = core.await else {
            let message = "Core is not running and could not be started";
            return Err(PedelecError::new(ErrorCode::CoreRuntimeUnavailable, message));
        };
        match call {
            Call::Subscribe(subscribe) => {
                let stream = core.subscribe(subscribe).await?;
                first_of(stream, Framing::Batched, Reply::Subscribe).await
            }
            Call::WatchSession(watch) => {
                let stream = core.watch_session(watch).await?;
                first_of(stream, Framing::EachAlone, Reply::WatchSession).await
            }
            call => core.call(call).await.map(|reply| (reply, None)),
        }
    };
    Ok(Box::pin(future.map(move |outcome| (request_id, defer_ack, outcome))))
}

/// A subscription's answer: its first event (the snapshot) as `reply`, and
/// the stream of the rest.
async fn first_of(
    mut stream: EventStream,
    framing: Framing,
    reply: fn(pb::SessionEvent) -> Reply,
) -> Result<(Reply, Option<Events>), PedelecError> {
    match stream.next().await {
        Some(Ok(snapshot)) => Ok((reply(snapshot), Some(Events { stream, framing }))),
        Some(Err(error)) => Err(error),
        None => Err(PedelecError::new(ErrorCode::CoreRuntimeUnavailable, "Core closed the subscription")),
    }
}

/// Forwards one subscription's live events, in order, tagged with its
/// request id: the events the stream has ready at once go as one batch frame
/// ([`Framing::Batched`]), or each as its own frame ([`Framing::EachAlone`]).
fn start_forwarding(
    request_id: u32,
    events: Events,
    out: mpsc::Sender<Outgoing>,
    subscriptions: Arc<Mutex<HashMap<u32, AbortHandle>>>,
    lost: mpsc::Sender<()>,
) {
    let Events { mut stream, framing } = events;
    let (handle, registration) = AbortHandle::new_pair();
    subscriptions.lock().unwrap_or_else(|p| p.into_inner()).insert(request_id, handle);
    let forward = async move {
        let mut batch = EventBatcher::new(request_id);
        let mut next = stream.next().await;
        'stream: loop {
            match next {
                Some(Ok(event)) if framing == Framing::EachAlone => {
                    let body = Some(Body::Event(event));
                    if out.send(pb::NativeFrame { request_id, body, ..Default::default() }.into()).await.is_err() {
                        return;
                    }
                }
                Some(Ok(event)) => {
                    if let Some(full) = batch.push(event)
                        && out.send(full.into()).await.is_err()
                    {
                        return;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "a subscription failed");
                    break 'stream;
                }
                None => break 'stream,
            }
            // What the stream already holds joins this frame; nothing waits
            // for more, so a lone event leaves at once.
            next = match stream.next().now_or_never() {
                Some(item) => item,
                None => {
                    if let Some(frame) = batch.finish()
                        && out.send(frame.into()).await.is_err()
                    {
                        return;
                    }
                    stream.next().await
                }
            };
        }
        if let Some(frame) = batch.finish()
            && out.send(frame.into()).await.is_err()
        {
            return;
        }
        let _ = out
            .send(error_frame(request_id, ErrorCode::CoreRuntimeUnavailable, "the connection to Core was lost").into())
            .await;
        subscriptions.lock().unwrap_or_else(|p| p.into_inner()).remove(&request_id);
        let _ = lost.try_send(());
    };
    tokio::spawn(Abortable::new(forward, registration));
}
