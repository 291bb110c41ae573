//! A session's subscribers and their queues.
//!
//! Flow control, lag and memory, per subscriber and judged all at once:
//!
//! - A provider awaits [`Fanout::pressure`]-driven flow control between the
//!   events it produces in bulk. It never runs more than
//!   [`limits::SUBSCRIBER_QUEUE_EVENTS`] (the *bound*) ahead of a reader
//!   that is reading, so a slow reader slows the agent; held back, it goes
//!   on once that reader has taken half of its queue ([`RESUME`]).
//! - A reader that has read nothing for [`STALL`] while it has a backlog is
//!   *stalled*: it no longer holds the provider back. Its queue may grow to
//!   [`HARD_BOUND_FACTOR`] times the bound; beyond that, or after
//!   [`limits::SUBSCRIBER_LAG_TIMEOUT`] over the bound, it is dropped and
//!   re-synchronised from a fresh snapshot (whose `recent_outcomes` settle
//!   what it missed; `GetHistory` recovers the messages). So a silent
//!   subscriber costs the turn at most one [`STALL`], and twenty of them
//!   cost no more than one does.
//! - Events emitted outside flow control (a completion, a status change)
//!   still fit: only a queue twice over the hard bound is dropped at once,
//!   so memory stays bounded in every case.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pedelec_protocol::{limits, pb};
use tokio::sync::{Notify, mpsc};

/// How far a stalled reader's queue may grow, in bounds.
pub const HARD_BOUND_FACTOR: usize = 4;

/// A reader that read nothing for this long is treated as stalled.
pub const STALL: Duration = Duration::from_millis(100);

const BOUND: usize = limits::SUBSCRIBER_QUEUE_EVENTS;
const HARD_BOUND: usize = BOUND * HARD_BOUND_FACTOR;

/// A provider held back by a full queue goes on once the queue is half
/// drained: going on below the bound itself woke it for every single event
/// the reader took, a thread switch per event while the reader was the
/// slower side.
const RESUME: usize = BOUND / 2;

/// What a subscriber's queue and its reader share.
#[derive(Default)]
pub struct Queue {
    /// Events sent and not yet received.
    depth: AtomicUsize,
    /// Events received so far (progress, for stall and lag judgement).
    reads: AtomicU64,
    /// Signalled when the depth falls below [`RESUME`].
    room: Notify,
    /// Set when Core dropped the subscriber for falling behind.
    lagged: AtomicBool,
}

impl Queue {
    fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    /// Resolves once the queue holds fewer than `limit` events.
    pub async fn below(&self, limit: usize) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.depth() < limit {
                return;
            }
            notified.await;
        }
    }

    pub fn lagged(&self) -> bool {
        self.lagged.load(Ordering::SeqCst)
    }
}

/// The reading end of one subscription.
pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Arc<pb::SessionEvent>>,
    pub queue: Arc<Queue>,
}

impl Receiver {
    /// The next event, owned: the last of its subscribers to take it gets
    /// it without a copy (most sessions have one), the others a copy each —
    /// and a reader that never reads costs no copy at all.
    pub async fn recv(&mut self) -> Option<pb::SessionEvent> {
        let event = Arc::unwrap_or_clone(self.rx.recv().await?);
        self.queue.reads.fetch_add(1, Ordering::Relaxed);
        let before = self.queue.depth.fetch_sub(1, Ordering::AcqRel);
        if before == RESUME {
            self.queue.room.notify_waiters();
        }
        Some(event)
    }
}

struct Subscriber {
    tx: mpsc::UnboundedSender<Arc<pb::SessionEvent>>,
    queue: Arc<Queue>,
    /// `queue.reads` when last judged, and the last sign of progress: that
    /// count changing, or a backlog beginning (a reader that had nothing to
    /// read is not silent). Judged by reads, not depth: a reader whose
    /// transport stopped taking events long ago counts as stalled the
    /// moment its queue reaches the bound, instead of holding the provider
    /// back for a stall of its own.
    reads_seen: u64,
    progress_at: Instant,
    /// Set when an event lands in an empty queue; the next judgement
    /// counts it as progress (cheaper than reading the clock per event).
    backlog_began: bool,
}

/// Every subscriber of one session.
#[derive(Default)]
pub struct Fanout {
    subscribers: HashMap<u64, Subscriber>,
    next: u64,
}

/// What holds the provider back: queues to wait for (each below its limit)
/// and the moment to look again (a live reader counting as stalled).
pub struct Pressure {
    pub waiting_for: Vec<(Arc<Queue>, usize)>,
    pub until: Instant,
}

impl Fanout {
    pub fn add(&mut self) -> (u64, Receiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(Queue::default());
        let id = self.next;
        self.next += 1;
        let subscriber =
            Subscriber { tx, queue: queue.clone(), reads_seen: 0, progress_at: Instant::now(), backlog_began: false };
        self.subscribers.insert(id, subscriber);
        (id, Receiver { rx, queue })
    }

    pub fn remove(&mut self, id: u64) {
        self.subscribers.remove(&id);
    }

    pub fn is_empty(&self) -> bool {
        self.subscribers.is_empty()
    }

    /// Drops every subscriber, ending their streams.
    pub fn clear(&mut self) {
        self.subscribers.clear();
    }

    /// Queues an event for every subscriber.
    pub fn deliver(&mut self, event: pb::SessionEvent) {
        let event = Arc::new(event);
        self.subscribers.retain(|_, subscriber| {
            if subscriber.queue.depth() >= 2 * HARD_BOUND {
                subscriber.queue.lagged.store(true, Ordering::SeqCst);
                return false;
            }
            if subscriber.queue.depth.fetch_add(1, Ordering::AcqRel) == 0 {
                subscriber.backlog_began = true;
            }
            subscriber.tx.send(Arc::clone(&event)).is_ok()
        });
    }

    /// Judges every subscriber at `now` (see the module docs): drops those
    /// that lagged too long or too far, and says which live readers the
    /// provider must wait for, if any.
    pub fn pressure(&mut self, now: Instant) -> Option<Pressure> {
        let mut waiting_for = Vec::new();
        let mut until: Option<Instant> = None;
        self.subscribers.retain(|_, s| {
            let reads = s.queue.reads.load(Ordering::Relaxed);
            if reads != s.reads_seen || std::mem::take(&mut s.backlog_began) {
                s.reads_seen = reads;
                s.progress_at = now;
            }
            let depth = s.queue.depth();
            let silent_for = now.saturating_duration_since(s.progress_at);
            let stalled = silent_for >= STALL;
            let lagged =
                (depth >= BOUND && silent_for >= limits::SUBSCRIBER_LAG_TIMEOUT) || (stalled && depth >= HARD_BOUND);
            if lagged {
                s.queue.lagged.store(true, Ordering::SeqCst);
                return false;
            }
            if !stalled && depth >= BOUND {
                waiting_for.push((s.queue.clone(), RESUME));
                // Look again when this reader would count as stalled.
                let at = s.progress_at + STALL;
                until = Some(until.map_or(at, |u| u.min(at)));
            }
            true
        });
        until.map(|until| Pressure { waiting_for, until })
    }
}
