//! A session's recent events as a log, and each subscriber as a cursor in it
//! (every reader at its own pace).
//!
//! Sans-IO: no tasks, locks or clocks. The shell appends every emitted event
//! under the session's lock and wakes readers; each reader takes what lies
//! after its cursor. The rules:
//!
//! - **The provider never waits on a reader.** [`EventLog::push`] always
//!   succeeds at once; nothing here can hold a turn back.
//! - **A reader behind but inside the log loses nothing.** An event stays
//!   until every cursor has passed it, within the bounds below.
//! - **Only a reader that falls out of the log is re-synchronised.** When
//!   the log must drop events to stay inside its bounds, a cursor left before
//!   the first kept event is out: its next read says [`Read::Resync`] and the
//!   shell sends a fresh snapshot (as today), then [`EventLog::resync`]. How
//!   long a reader was silent is no reason on its own.
//! - **Memory is bounded and released.** Events every cursor has passed are
//!   dropped at once (a new subscriber starts from a snapshot, never from the
//!   log), so a log whose readers keep up holds next to nothing, and one whose
//!   readers caught up after a turn is empty and gives its buffer back. The
//!   events kept are bounded in bytes per session ([`Bounds::session_bytes`])
//!   and across all sessions ([`Budget`]); the session that pushes past the
//!   global bound drops its own oldest events, since it is the one growing,
//!   down to a floor ([`Bounds::floor_bytes`]) every session may keep.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pedelec_protocol::pb;
use prost::Message as _;

/// What one kept event is counted as: its encoded size plus what holding it
/// costs beyond that (the decoded struct, its `Arc`, the deque slot), so the
/// bound is close to the memory it protects.
pub fn cost(event: &pb::SessionEvent) -> usize {
    event.encoded_len() + std::mem::size_of::<pb::SessionEvent>() + 2 * std::mem::size_of::<usize>() + 16
}

/// The bounds of one session's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Bytes of unread events one session keeps (counted by [`cost`]).
    pub session_bytes: usize,
    /// What a session may keep even while all logs together are over the
    /// bound across sessions: otherwise one session's stalled reader holding
    /// that budget would cut every other session's readers off a few events
    /// behind. The bound across sessions is exceeded by at most this much per
    /// session with readers.
    pub floor_bytes: usize,
}

/// Per session unless configured: holds a 200 000-delta turn for a reader
/// that reads none of it until the turn ends (see the unit test that fills
/// it with such a turn's deltas).
pub const DEFAULT_SESSION_BYTES: usize = 128 << 20;
/// What a session keeps whatever the others hold (see [`Bounds::floor_bytes`]).
pub const DEFAULT_FLOOR_BYTES: usize = 1 << 20;
/// Across all sessions unless configured: four sessions' worth.
pub const DEFAULT_TOTAL_BYTES: usize = 4 * DEFAULT_SESSION_BYTES;

impl Default for Bounds {
    fn default() -> Self {
        Bounds { session_bytes: DEFAULT_SESSION_BYTES, floor_bytes: DEFAULT_FLOOR_BYTES }
    }
}

/// The bytes every session's log keeps, against the bound across them.
/// Shared by the sessions (an atomic count, not I/O).
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Budget { used: AtomicUsize::new(0), limit })
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.limit
    }
}

/// Slots an emptied log keeps allocated.
const KEPT_CAPACITY: usize = 256;

/// One reader's position: the seq of the next event it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    next: u64,
    /// A subscriber of the session's own (`Subscribe`), as opposed to the
    /// user watching it (`WatchSession`): only subscribers keep a session
    /// with `auto_end_on_disconnect` alive.
    subscriber: bool,
}

/// What a reader gets from [`EventLog::read`].
#[derive(Debug, PartialEq)]
pub enum Read {
    /// The next events after its cursor, oldest first (at most `max`).
    Events(Vec<Arc<pb::SessionEvent>>),
    /// Nothing new yet: wait for the next push.
    Empty,
    /// Its next event was dropped: re-synchronise it from a snapshot.
    Resync,
    /// No such reader.
    Gone,
}

/// One session's log and its readers' cursors.
#[derive(Debug)]
pub struct EventLog {
    /// Kept events with their cost; seqs are consecutive from `first`.
    events: VecDeque<(Arc<pb::SessionEvent>, usize)>,
    /// The seq of `events.front()`, or of the next event when empty.
    first: u64,
    bytes: usize,
    bounds: Bounds,
    budget: Arc<Budget>,
    cursors: HashMap<u64, Cursor>,
    next_reader: u64,
    /// Events dropped while some cursor still needed them (for the logs).
    dropped_unread: u64,
}

impl EventLog {
    /// An empty log whose next event has seq `last_seq + 1`.
    pub fn new(last_seq: u64, bounds: Bounds, budget: Arc<Budget>) -> Self {
        EventLog {
            events: VecDeque::new(),
            first: last_seq + 1,
            bytes: 0,
            bounds,
            budget,
            cursors: HashMap::new(),
            next_reader: 0,
            dropped_unread: 0,
        }
    }

    /// A new reader whose snapshot carried `last_seq` (taken under the same
    /// lock as the pushes, so the two never overlap or leave a gap).
    pub fn add_reader(&mut self, last_seq: u64) -> u64 {
        self.add_cursor(last_seq, true)
    }

    /// A reader that is not a subscriber (the user watching the session):
    /// it reads as any reader does but is not counted by [`Self::subscribers`].
    pub fn add_watcher(&mut self, last_seq: u64) -> u64 {
        self.add_cursor(last_seq, false)
    }

    fn add_cursor(&mut self, last_seq: u64, subscriber: bool) -> u64 {
        let id = self.next_reader;
        self.next_reader += 1;
        self.cursors.insert(id, Cursor { next: last_seq + 1, subscriber });
        id
    }

    pub fn remove_reader(&mut self, id: u64) {
        self.cursors.remove(&id);
        self.release();
    }

    /// Drops every reader: their next reads say [`Read::Gone`] (Core is
    /// stopping).
    pub fn close(&mut self) {
        self.cursors.clear();
        self.release();
    }

    pub fn readers(&self) -> usize {
        self.cursors.len()
    }

    /// Readers that are the session's subscribers (watchers left out).
    pub fn subscribers(&self) -> usize {
        self.cursors.values().filter(|c| c.subscriber).count()
    }

    /// Bytes kept (by [`cost`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Events dropped so far while a cursor still needed them.
    pub fn dropped_unread(&self) -> u64 {
        self.dropped_unread
    }

    /// Appends the next event (its seq follows the last one). Never waits:
    /// a log over a bound drops its oldest events instead, leaving the
    /// cursors before them out.
    pub fn push(&mut self, event: Arc<pb::SessionEvent>) {
        if self.cursors.is_empty() {
            // Nobody to read it: a later subscriber starts from a snapshot.
            self.first = event.seq + 1;
            return;
        }
        let seq = self.first + self.events.len() as u64;
        debug_assert_eq!(event.seq, seq, "events are pushed in seq order with no gap");
        let cost = cost(&event);
        self.events.push_back((event, cost));
        self.bytes += cost;
        self.budget.used.fetch_add(cost, Ordering::Relaxed);
        let floor = self.bounds.floor_bytes.min(self.bounds.session_bytes);
        while self.bytes > self.bounds.session_bytes || (self.budget.over() && self.bytes > floor) {
            self.drop_oldest();
        }
    }

    /// Up to `max` events after reader `id`'s cursor, which moves past them.
    pub fn read(&mut self, id: u64, max: usize) -> Read {
        let Some(cursor) = self.cursors.get(&id).copied() else { return Read::Gone };
        if cursor.next < self.first {
            return Read::Resync;
        }
        let start = (cursor.next - self.first) as usize;
        if start >= self.events.len() {
            return Read::Empty;
        }
        let taken: Vec<_> = self.events.range(start..).take(max).map(|(e, _)| Arc::clone(e)).collect();
        if let Some(c) = self.cursors.get_mut(&id) {
            c.next += taken.len() as u64;
        }
        self.release();
        Read::Events(taken)
    }

    /// Reader `id` was sent a fresh snapshot carrying `last_seq`.
    pub fn resync(&mut self, id: u64, last_seq: u64) {
        if let Some(c) = self.cursors.get_mut(&id) {
            c.next = last_seq + 1;
        }
        self.release();
    }

    /// Drops what every cursor has passed; an emptied log gives its buffer
    /// back (a 200 000-event turn leaves a multi-megabyte deque otherwise).
    fn release(&mut self) {
        let wanted = self.cursors.values().map(|c| c.next).min().unwrap_or(self.first + self.events.len() as u64);
        while self.first < wanted && !self.events.is_empty() {
            let (_, cost) = self.events.pop_front().expect("not empty");
            self.forget(cost);
        }
        if self.events.is_empty() {
            // Every cursor is at the end (or there are none). A small buffer
            // is kept: a reader that keeps up empties the log at every read.
            self.first = self.first.max(wanted);
            if self.events.capacity() > KEPT_CAPACITY {
                self.events = VecDeque::new();
            }
        }
    }

    fn drop_oldest(&mut self) {
        let seq = self.first;
        let Some((_, cost)) = self.events.pop_front() else { return };
        self.forget(cost);
        if self.cursors.values().any(|c| c.next <= seq) {
            self.dropped_unread += 1;
        }
    }

    fn forget(&mut self, cost: usize) {
        self.first += 1;
        self.bytes -= cost;
        self.budget.used.fetch_sub(cost, Ordering::Relaxed);
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use pedelec_protocol::pb::session_event::Kind;

    use super::*;

    fn delta(seq: u64, text: &str) -> Arc<pb::SessionEvent> {
        Arc::new(pb::SessionEvent {
            session_id: "sess-0123456789abcdef0123".into(),
            seq,
            emitted_at_ms: 1_700_000_000_000,
            turn: Some(pb::TurnInfo { turn_id: "turn-0123456789abcdef0123".into(), ..Default::default() }),
            operation_id: "op-0123456789abcdef0123".into(),
            kind: Some(Kind::ChatDelta(pb::ChatDelta { text: text.into() })),
        })
    }

    fn log(bytes: usize) -> EventLog {
        EventLog::new(0, Bounds { session_bytes: bytes, floor_bytes: 0 }, Budget::new(usize::MAX))
    }

    fn seqs(read: Read) -> Vec<u64> {
        match read {
            Read::Events(events) => events.iter().map(|e| e.seq).collect(),
            other => panic!("not events: {other:?}"),
        }
    }

    #[test]
    fn a_reader_behind_but_inside_the_log_loses_nothing_and_the_writer_never_waits() {
        let mut log = log(usize::MAX);
        let fast = log.add_reader(0);
        let slow = log.add_reader(0);
        for seq in 1..=10_000 {
            log.push(delta(seq, "x"));
            assert_eq!(seqs(log.read(fast, 16)), [seq], "the fast reader keeps up");
        }
        let mut got = Vec::new();
        loop {
            match log.read(slow, 1_000) {
                Read::Events(events) => got.extend(events.iter().map(|e| e.seq)),
                Read::Empty => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, (1..=10_000).collect::<Vec<_>>(), "every event, in order, none twice");
        assert!(log.is_empty() && log.bytes() == 0, "both caught up: nothing kept");
    }

    #[test]
    fn only_a_reader_that_falls_out_of_the_log_is_resynchronised_however_long_it_was_silent() {
        // Seqs from 128 on take a byte more: bound by the larger.
        let one = cost(&delta(250, "x"));
        let mut log = log(100 * one);
        let silent = log.add_reader(0);
        for seq in 1..=100 {
            log.push(delta(seq, "x"));
        }
        // Silent for the whole turn, but the turn fits: it still gets all.
        assert_eq!(seqs(log.read(silent, 1_000)), (1..=100).collect::<Vec<_>>());
        for seq in 101..=250 {
            log.push(delta(seq, "x"));
        }
        assert_eq!(log.len(), 100, "bounded in bytes");
        assert_eq!(log.read(silent, 10), Read::Resync, "its next event (101) was dropped");
        assert_eq!(log.dropped_unread(), 50);
        log.resync(silent, 250);
        assert_eq!(log.read(silent, 10), Read::Empty, "after the snapshot it is at the end");
        assert!(log.is_empty(), "and the log holds nothing for it any more");
        log.push(delta(251, "x"));
        assert_eq!(seqs(log.read(silent, 10)), [251], "live again, on the same cursor");
    }

    #[test]
    fn a_reader_that_keeps_up_is_never_resynchronised_beside_one_that_fell_out() {
        let one = cost(&delta(1, "x"));
        let mut log = log(10 * one);
        let live = log.add_reader(0);
        let stalled = log.add_reader(0);
        for seq in 1..=1_000 {
            log.push(delta(seq, "x"));
            assert_eq!(seqs(log.read(live, 4)), [seq]);
        }
        assert_eq!(log.read(stalled, 4), Read::Resync);
        assert!(log.len() <= 10);
    }

    #[test]
    fn memory_is_released_when_readers_catch_up_or_leave() {
        let mut log = log(usize::MAX);
        let a = log.add_reader(0);
        for seq in 1..=1_000 {
            log.push(delta(seq, "some text"));
        }
        assert_eq!(log.len(), 1_000);
        let b = log.add_reader(1_000);
        assert_eq!(log.read(b, 10), Read::Empty, "a new reader starts after its snapshot, not in the log");
        assert_eq!(seqs(log.read(a, 400)).len(), 400);
        assert_eq!(log.len(), 600, "what every reader passed is dropped at once");
        log.remove_reader(a);
        assert!(log.is_empty() && log.bytes() == 0, "the last reader behind left");
        // With nobody reading, nothing is kept.
        log.remove_reader(b);
        log.push(delta(1_001, "x"));
        assert!(log.is_empty());
        let c = log.add_reader(1_001);
        log.push(delta(1_002, "x"));
        assert_eq!(seqs(log.read(c, 10)), [1_002]);
    }

    #[test]
    fn the_bound_across_sessions_is_kept_by_the_session_that_grows() {
        let one = cost(&delta(1_000, "x"));
        let budget = Budget::new(50 * one);
        let bounds = Bounds { session_bytes: usize::MAX, floor_bytes: 5 * one };
        let mut quiet = EventLog::new(0, bounds, budget.clone());
        let mut busy = EventLog::new(0, bounds, budget.clone());
        let (q, b) = (quiet.add_reader(0), busy.add_reader(0));
        for seq in 1..=20 {
            quiet.push(delta(seq, "x"));
        }
        for seq in 1..=1_000 {
            busy.push(delta(seq, "x"));
        }
        assert!(budget.used() <= 50 * one, "{} > {}", budget.used(), 50 * one);
        assert_eq!(quiet.len(), 20, "the quiet session keeps its reader's events");
        // A third session, pushing while the two hold the whole budget,
        // still keeps its floor for its readers.
        let mut third = EventLog::new(0, bounds, budget.clone());
        let t = third.add_reader(0);
        for seq in 1..=100 {
            third.push(delta(seq, "x"));
        }
        assert_eq!(third.len(), 5, "its floor: five events, not one");
        assert_eq!(third.read(t, 100), Read::Resync, "its reader, 95 events behind, fell out");
        let u = third.add_reader(100);
        third.push(delta(101, "x"));
        third.push(delta(102, "x"));
        assert_eq!(seqs(third.read(u, 100)), [101, 102], "a reader a few events behind does not");
        drop(third);
        assert_eq!(seqs(quiet.read(q, 100)), (1..=20).collect::<Vec<_>>());
        assert_eq!(busy.read(b, 10), Read::Resync);
        drop(busy);
        assert_eq!(budget.used(), 0, "a log gives its bytes back when it goes");
    }

    /// The default holds a 200 000-delta turn for a reader that reads none
    /// of it until the turn ends.
    #[test]
    fn the_default_bound_holds_a_200_000_delta_turn() {
        let per_delta = cost(&delta(u64::MAX / 2, "a word "));
        assert!(200_000 * per_delta <= DEFAULT_SESSION_BYTES, "{per_delta} B per delta");
    }
}
