//! Event batches: several events of one subscription in one native-messaging
//! message (`EventBatch` in `native.proto`).
//!
//! The native host builds them with [`EventBatcher`] from what its
//! subscription stream already has ready — never waiting for more — and
//! every receiver (the wasm SDK behind the extension, the Rust
//! `NativeMessagingTransport`) takes them apart with [`batch_events`], which
//! holds the rules: at least two events, at most
//! [`limits::NATIVE_BATCH_MAX_EVENTS`], all of the batch's session.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::event_batch::{EventBatcher, batch_events};
//! use pedelec_protocol::pb::{self, native_frame::Body, session_event::Kind};
//!
//! let delta = |seq, text: &str| pb::SessionEvent {
//!     session_id: "sess-1".into(),
//!     seq,
//!     kind: Some(Kind::ChatDelta(pb::ChatDelta { text: text.into() })),
//!     ..Default::default()
//! };
//! // The host: everything its stream has ready goes into one frame.
//! let mut batcher = EventBatcher::new(7);
//! for (seq, text) in [(1, "Hel"), (2, "lo"), (3, "!")] {
//!     assert!(batcher.push(delta(seq, text)).is_none());
//! }
//! let frame = batcher.finish().unwrap();
//! // A receiver: the same events, each with its session again.
//! let Some(Body::Batch(batch)) = &frame.body else { panic!("three events make a batch") };
//! assert_eq!(batch_events(batch).unwrap(), [delta(1, "Hel"), delta(2, "lo"), delta(3, "!")]);
//! ```

use base64::Engine;
use prost::Message;

use crate::limits;
use crate::native::NativeFrameError;
use crate::pb::{self, native_frame::Body};

/// Collects the events of one subscription that are ready now into frames.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::event_batch::EventBatcher;
/// use pedelec_protocol::pb::{self, native_frame::Body};
///
/// let event = pb::SessionEvent { session_id: "s".into(), seq: 1, ..Default::default() };
/// let mut batcher = EventBatcher::new(3);
/// batcher.push(event.clone());
/// // A lone event is not worth a batch: it goes as an ordinary event frame.
/// let frame = batcher.finish().unwrap();
/// assert_eq!(frame, pb::NativeFrame { request_id: 3, body: Some(Body::Event(event)), ..Default::default() });
/// ```
#[derive(Debug)]
pub struct EventBatcher {
    request_id: u32,
    /// The first event, kept whole: alone it travels as an `event` frame.
    first: Option<pb::SessionEvent>,
    /// What every event of the batch shares, left out of each one.
    header: BatchHeader,
    /// The EventList encoding so far, started when a second event arrives.
    bytes: Vec<u8>,
    count: usize,
}

impl EventBatcher {
    /// A batcher for the subscription whose Subscribe had `request_id`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::event_batch::EventBatcher;
    ///
    /// let mut batcher = EventBatcher::new(42);
    /// assert!(batcher.is_empty());
    /// assert_eq!(batcher.finish(), None);
    /// ```
    pub fn new(request_id: u32) -> Self {
        EventBatcher { request_id, first: None, header: BatchHeader::default(), bytes: Vec::new(), count: 0 }
    }

    /// Whether nothing is collected.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::event_batch::EventBatcher;
    /// use pedelec_protocol::pb;
    ///
    /// let mut batcher = EventBatcher::new(1);
    /// batcher.push(pb::SessionEvent { session_id: "s".into(), seq: 1, ..Default::default() });
    /// assert!(!batcher.is_empty());
    /// batcher.finish();
    /// assert!(batcher.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds an event. When it does not fit the batch collected so far (no
    /// room left, or another turn or operation), that batch comes back as a
    /// frame to send first, and the event starts the next one. A
    /// subscription carries one session, so every event is of the first
    /// one's session.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::event_batch::EventBatcher;
    /// use pedelec_protocol::pb;
    ///
    /// let event = |seq, operation_id: &str| pb::SessionEvent {
    ///     session_id: "s".into(),
    ///     seq,
    ///     operation_id: operation_id.into(),
    ///     ..Default::default()
    /// };
    /// let mut batcher = EventBatcher::new(1);
    /// assert!(batcher.push(event(1, "op-1")).is_none());
    /// assert!(batcher.push(event(2, "op-1")).is_none());
    /// // Another operation's event: op-1's batch is handed back to send first.
    /// let first = batcher.push(event(3, "op-2")).expect("op-1's batch");
    /// assert!(matches!(first.body, Some(pb::native_frame::Body::Batch(b)) if b.operation_id == "op-1"));
    /// ```
    pub fn push(&mut self, mut event: pb::SessionEvent) -> Option<pb::NativeFrame> {
        let full = self.count > 0
            && (self.count == limits::NATIVE_BATCH_MAX_EVENTS
                || self.encoded_len() + list_entry_len(&event) > limits::NATIVE_BATCH_BYTES_BUDGET
                || !self.shares(&event));
        let sent = if full { self.finish() } else { None };
        self.count += 1;
        if self.count == 1 {
            self.first = Some(event);
            return sent;
        }
        if self.count == 2
            && let Some(mut first) = self.first.take()
        {
            self.header = BatchHeader::take(&mut first);
            self.bytes.clear();
            encode_entry(&first, &mut self.bytes);
        }
        BatchHeader::take(&mut event);
        encode_entry(&event, &mut self.bytes);
        sent
    }

    /// Whether `event` has the batch's turn and operation.
    fn shares(&self, event: &pb::SessionEvent) -> bool {
        match &self.first {
            Some(first) => first.turn == event.turn && first.operation_id == event.operation_id,
            None => self.header.turn == event.turn && self.header.operation_id == event.operation_id,
        }
    }

    /// What the batch would encode to now.
    fn encoded_len(&self) -> usize {
        match &self.first {
            Some(first) => list_entry_len(first),
            None => self.bytes.len(),
        }
    }

    /// The frame of what was collected: a lone event as an `event` frame,
    /// several as a `batch`; `None` when empty. Empty again afterwards.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::event_batch::EventBatcher;
    /// use pedelec_protocol::pb::{self, native_frame::Body};
    ///
    /// let mut batcher = EventBatcher::new(5);
    /// for seq in 1..=2 {
    ///     batcher.push(pb::SessionEvent { session_id: "s".into(), seq, ..Default::default() });
    /// }
    /// let frame = batcher.finish().unwrap();
    /// assert_eq!(frame.request_id, 5);
    /// assert!(matches!(frame.body, Some(Body::Batch(b)) if b.session_id == "s"));
    /// assert_eq!(batcher.finish(), None);
    /// ```
    pub fn finish(&mut self) -> Option<pb::NativeFrame> {
        let count = std::mem::take(&mut self.count);
        let body = match count {
            0 => return None,
            1 => Body::Event(self.first.take()?),
            _ => {
                let BatchHeader { session_id, turn, operation_id } = std::mem::take(&mut self.header);
                Body::Batch(pb::EventBatch { session_id, events: std::mem::take(&mut self.bytes), turn, operation_id })
            }
        };
        Some(pb::NativeFrame { request_id: self.request_id, body: Some(body), ..Default::default() })
    }
}

/// The fields a batch says once for all its events.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::event_batch::{BatchHeader, batch_events_base64};
///
/// // What the browser SDK reads from a batch frame's JSON before decoding its events.
/// let header = BatchHeader { session_id: "sess-1".into(), ..Default::default() };
/// assert!(batch_events_base64(header, "not base64!").is_err());
/// ```
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BatchHeader {
    pub session_id: String,
    pub turn: Option<pb::TurnInfo>,
    pub operation_id: String,
}

impl BatchHeader {
    /// Moves the shared fields out of `event`, leaving them empty there.
    fn take(event: &mut pb::SessionEvent) -> BatchHeader {
        BatchHeader {
            session_id: std::mem::take(&mut event.session_id),
            turn: event.turn.take(),
            operation_id: std::mem::take(&mut event.operation_id),
        }
    }

    /// The shared fields of a decoded batch.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::event_batch::BatchHeader;
    /// use pedelec_protocol::pb;
    ///
    /// let batch = pb::EventBatch { session_id: "sess-1".into(), operation_id: "op-1".into(), ..Default::default() };
    /// let header = BatchHeader::of(&batch);
    /// assert_eq!((header.session_id.as_str(), header.operation_id.as_str()), ("sess-1", "op-1"));
    /// assert_eq!(header.turn, None);
    /// ```
    pub fn of(batch: &pb::EventBatch) -> BatchHeader {
        BatchHeader {
            session_id: batch.session_id.clone(),
            turn: batch.turn.clone(),
            operation_id: batch.operation_id.clone(),
        }
    }
}

/// Appends `event` as one `EventList.events` entry.
fn encode_entry(event: &pb::SessionEvent, out: &mut Vec<u8>) {
    prost::encoding::message::encode(1, event, out);
}

fn list_entry_len(event: &pb::SessionEvent) -> usize {
    prost::encoding::message::encoded_len(1, event)
}

/// The events of a batch, in order, each with the batch's shared fields, or
/// why the batch is refused.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::event_batch::batch_events;
/// use pedelec_protocol::native::NativeFrameError;
/// use pedelec_protocol::pb;
///
/// // A batch of nothing is refused rather than taken as "no events".
/// let empty = pb::EventBatch { session_id: "s".into(), ..Default::default() };
/// assert!(matches!(batch_events(&empty), Err(NativeFrameError::BadBatch(_))));
/// ```
pub fn batch_events(batch: &pb::EventBatch) -> Result<Vec<pb::SessionEvent>, NativeFrameError> {
    decode_events(BatchHeader::of(batch), &batch.events)
}

/// [`batch_events`] for a batch read straight from its JSON fields, its
/// `events` still in base64 (the browser SDK reads them without decoding
/// the frame).
///
/// # Examples
///
/// ```
/// use base64::Engine;
/// use prost::Message;
/// use pedelec_protocol::event_batch::{BatchHeader, batch_events_base64};
/// use pedelec_protocol::pb;
///
/// let bare = |seq| pb::SessionEvent { seq, ..Default::default() };
/// let list = pb::EventList { events: vec![bare(1), bare(2)] }.encode_to_vec();
/// let text = base64::engine::general_purpose::STANDARD.encode(list);
/// let header = BatchHeader { session_id: "sess-1".into(), ..Default::default() };
/// let events = batch_events_base64(header, &text).unwrap();
/// assert!(events.iter().all(|e| e.session_id == "sess-1"));
/// assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
/// ```
pub fn batch_events_base64(header: BatchHeader, events: &str) -> Result<Vec<pb::SessionEvent>, NativeFrameError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(events)
        .map_err(|e| NativeFrameError::BadBatch(format!("events is not base64: {e}")))?;
    decode_events(header, &bytes)
}

fn decode_events(header: BatchHeader, bytes: &[u8]) -> Result<Vec<pb::SessionEvent>, NativeFrameError> {
    let list = pb::EventList::decode(bytes)
        .map_err(|e| NativeFrameError::BadBatch(format!("events is not an encoded EventList: {e}")))?;
    let mut events = list.events;
    if events.len() < 2 || events.len() > limits::NATIVE_BATCH_MAX_EVENTS {
        let max = limits::NATIVE_BATCH_MAX_EVENTS;
        return Err(NativeFrameError::BadBatch(format!("{} events; a batch holds 2 to {max}", events.len())));
    }
    if header.session_id.is_empty() {
        return Err(NativeFrameError::BadBatch("a batch needs its session id".into()));
    }
    for event in &mut events {
        if !event.session_id.is_empty() || event.turn.is_some() || !event.operation_id.is_empty() {
            return Err(NativeFrameError::BadBatch(format!(
                "event {} names its own session, turn or operation; in a batch the batch names them",
                event.seq
            )));
        }
        event.session_id.clone_from(&header.session_id);
        event.turn.clone_from(&header.turn);
        event.operation_id.clone_from(&header.operation_id);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;
    use crate::native::{ChunkAssembler, FrameDecoder, decode_native_frame, encode_native_frame};

    fn delta(session: &str, seq: u64, text: &str) -> pb::SessionEvent {
        pb::SessionEvent {
            session_id: session.into(),
            seq,
            kind: Some(pb::session_event::Kind::ChatDelta(pb::ChatDelta { text: text.into() })),
            ..Default::default()
        }
    }

    fn batch_of(frame: &pb::NativeFrame) -> &pb::EventBatch {
        match &frame.body {
            Some(Body::Batch(b)) => b,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// Pushes every event, returning the frames in the order they are sent.
    fn frames_of(events: impl IntoIterator<Item = pb::SessionEvent>) -> Vec<pb::NativeFrame> {
        let mut b = EventBatcher::new(1);
        let mut frames: Vec<_> = events.into_iter().filter_map(|e| b.push(e)).collect();
        frames.extend(b.finish());
        assert!(b.is_empty());
        frames
    }

    #[test]
    fn a_lone_event_stays_an_event_frame() {
        let mut b = EventBatcher::new(4);
        assert!(b.finish().is_none());
        assert!(b.push(delta("s", 1, "a")).is_none());
        let frame = b.finish().unwrap();
        assert_eq!(
            frame,
            pb::NativeFrame { request_id: 4, body: Some(Body::Event(delta("s", 1, "a"))), ..Default::default() }
        );
        assert!(b.is_empty() && b.finish().is_none());
    }

    #[test]
    fn several_events_travel_as_one_frame_and_come_back_in_order() {
        let mut b = EventBatcher::new(9);
        let events: Vec<_> = (1..=3).map(|seq| delta("s", seq, "x\"\\")).collect();
        for e in &events {
            assert!(b.push(e.clone()).is_none());
        }
        let frame = b.finish().unwrap();
        assert_eq!(frame.request_id, 9);
        let batch = batch_of(&frame);
        assert_eq!(batch.session_id, "s");
        assert_eq!(batch_events(batch).unwrap(), events);
        // The JSON form, as the extension and the browser SDK see it.
        let text = json::to_json(&frame);
        insta::assert_snapshot!(text);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events_b64 = value["batch"]["events"].as_str().unwrap();
        let header = BatchHeader { session_id: "s".into(), ..Default::default() };
        assert_eq!(batch_events_base64(header, events_b64).unwrap(), events);
        assert_eq!(decode_native_frame(&text).unwrap(), frame);
        // Reusable: the next batch starts afresh.
        assert!(b.push(delta("s", 4, "y")).is_none());
        assert!(matches!(b.finish().unwrap().body, Some(Body::Event(_))));
    }

    #[test]
    fn a_batch_says_its_turn_and_operation_once_and_breaks_where_they_change() {
        let in_turn = |seq, turn: &str, op: &str| pb::SessionEvent {
            turn: Some(pb::TurnInfo { turn_id: turn.into(), kind: pb::TurnKind::User as i32, started_at_ms: 7 }),
            operation_id: op.into(),
            ..delta("s", seq, "d")
        };
        let events = vec![
            in_turn(1, "t1", "op-1"),
            in_turn(2, "t1", "op-1"),
            in_turn(3, "t1", "op-1"),
            in_turn(4, "t2", "op-2"),
            in_turn(5, "t2", "op-2"),
            delta("s", 6, "no turn"),
        ];
        let frames = frames_of(events.clone());
        let mut back = Vec::new();
        for frame in &frames {
            match &frame.body {
                Some(Body::Batch(batch)) => {
                    assert!(!batch.operation_id.is_empty() && batch.turn.is_some());
                    back.extend(batch_events(batch).unwrap());
                }
                Some(Body::Event(event)) => back.push(event.clone()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(frames.len(), 3, "[1 2 3] [4 5] 6");
        assert_eq!(back, events);
        insta::assert_snapshot!(json::to_json(&frames[1]));
    }

    #[test]
    fn a_full_batch_is_sent_and_every_batch_fits_one_message() {
        let text = "\"\u{1}é".repeat(1000);
        let events: Vec<_> = (0..1000).map(|seq| delta("s", seq, &text)).collect();
        let frames = frames_of(events.clone());
        assert!(frames.len() > 1, "4 MB of events make several batches");
        let mut decoder = FrameDecoder::new(limits::NATIVE_HOST_TO_BROWSER_MAX);
        let mut assembler = ChunkAssembler::new(usize::MAX);
        let mut back = Vec::new();
        for frame in &frames {
            let pieces = encode_native_frame(frame, limits::NATIVE_HOST_TO_BROWSER_MAX, 1);
            assert_eq!(pieces.len(), 1, "a batch is never chunked");
            decoder.push(&pieces[0]);
            let decoded = assembler.accept(decode_native_frame(&decoder.next_frame().unwrap().unwrap()).unwrap());
            back.extend(batch_events(batch_of(&decoded.unwrap().unwrap())).unwrap());
        }
        assert_eq!(back, events);
    }

    #[test]
    fn an_event_too_large_for_a_batch_goes_alone() {
        let big = "z".repeat(limits::NATIVE_BATCH_BYTES_BUDGET);
        let frames = frames_of([delta("s", 1, "a"), delta("s", 2, &big), delta("s", 3, "b")]);
        let kinds: Vec<_> = frames.iter().map(|f| matches!(f.body, Some(Body::Event(_)))).collect();
        assert_eq!(kinds, [true, true, true], "each went alone, in order");
    }

    #[test]
    fn many_small_events_stop_at_the_event_limit() {
        let frames = frames_of((0..limits::NATIVE_BATCH_MAX_EVENTS as u64 + 1).map(|seq| delta("s", seq, "")));
        assert_eq!(frames.len(), 2);
        assert_eq!(batch_events(batch_of(&frames[0])).unwrap().len(), limits::NATIVE_BATCH_MAX_EVENTS);
        assert!(matches!(frames[1].body, Some(Body::Event(_))));
    }

    #[test]
    fn bad_batches_are_refused() {
        let list = |events: Vec<pb::SessionEvent>| pb::EventList { events }.encode_to_vec();
        let cases = [
            ("s", b"\xff\xff".to_vec()),
            ("s", Vec::new()),
            ("s", list(vec![delta("", 1, "a")])),
            ("s", list(vec![delta("", 1, "a"), delta("t", 2, "b")])),
            ("s", list(vec![delta("", 1, "a"), delta("s", 2, "b")])),
            ("s", list(vec![delta("", 1, "a"), pb::SessionEvent { operation_id: "op".into(), ..delta("", 2, "b") }])),
            ("", list(vec![delta("", 1, "a"), delta("", 2, "b")])),
            ("s", list((0..=limits::NATIVE_BATCH_MAX_EVENTS as u64).map(|n| delta("", n, "")).collect())),
        ];
        for (session_id, events) in cases {
            let batch = pb::EventBatch { session_id: session_id.into(), events, ..Default::default() };
            let error = batch_events(&batch).unwrap_err();
            assert!(matches!(error, NativeFrameError::BadBatch(_)), "{error}");
        }
        let header = BatchHeader { session_id: "s".into(), ..Default::default() };
        assert!(matches!(batch_events_base64(header, "not base64!"), Err(NativeFrameError::BadBatch(_))));
    }
}
