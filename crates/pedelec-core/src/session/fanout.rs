//! A session's subscribers and their queues.
//!
//! Each queue has a soft bound ([`limits::SUBSCRIBER_QUEUE_EVENTS`]):
//! providers await [`Fanout::full_queues`]-driven flow control between the
//! events they produce in bulk, so a slow reader slows the agent, and a
//! reader that stays over the bound for [`limits::SUBSCRIBER_LAG_TIMEOUT`]
//! is dropped and re-synchronised from a fresh snapshot. Events emitted
//! outside flow control (a completion, a status change) still fit: only a
//! queue [`HARD_BOUND_FACTOR`] times over the bound is dropped at once, so
//! memory stays bounded without cutting off a reader merely at the edge.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use pedelec_protocol::{limits, pb};
use tokio::sync::{Notify, mpsc};

/// A queue this many times over the soft bound is dropped without grace.
pub const HARD_BOUND_FACTOR: usize = 4;

/// What a subscriber's queue and its reader share.
#[derive(Default)]
pub struct Queue {
    /// Events sent and not yet received.
    depth: AtomicUsize,
    /// Signalled when the depth falls below the soft bound.
    room: Notify,
    /// Set when Core dropped the subscriber for falling behind.
    lagged: AtomicBool,
}

impl Queue {
    fn full(&self) -> bool {
        self.depth.load(Ordering::Acquire) >= limits::SUBSCRIBER_QUEUE_EVENTS
    }

    /// Resolves once the queue is below its soft bound.
    pub async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.full() {
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
    rx: mpsc::UnboundedReceiver<pb::SessionEvent>,
    pub queue: Arc<Queue>,
}

impl Receiver {
    pub async fn recv(&mut self) -> Option<pb::SessionEvent> {
        let event = self.rx.recv().await?;
        if self.queue.depth.fetch_sub(1, Ordering::AcqRel) == limits::SUBSCRIBER_QUEUE_EVENTS {
            self.queue.room.notify_waiters();
        }
        Some(event)
    }
}

struct Subscriber {
    tx: mpsc::UnboundedSender<pb::SessionEvent>,
    queue: Arc<Queue>,
    /// When flow control first found this queue full (cleared once it has room).
    full_since: Option<Instant>,
}

/// Every subscriber of one session.
#[derive(Default)]
pub struct Fanout {
    subscribers: HashMap<u64, Subscriber>,
    next: u64,
}

/// A full queue and the moment its grace runs out.
pub struct FullQueue {
    pub id: u64,
    pub queue: Arc<Queue>,
    pub deadline: Instant,
}

impl Fanout {
    pub fn add(&mut self) -> (u64, Receiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(Queue::default());
        let id = self.next;
        self.next += 1;
        self.subscribers.insert(id, Subscriber { tx, queue: queue.clone(), full_since: None });
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
    pub fn deliver(&mut self, event: &pb::SessionEvent) {
        let hard = limits::SUBSCRIBER_QUEUE_EVENTS * HARD_BOUND_FACTOR;
        self.subscribers.retain(|_, subscriber| {
            if subscriber.queue.depth.load(Ordering::Acquire) >= hard {
                subscriber.queue.lagged.store(true, Ordering::SeqCst);
                return false;
            }
            subscriber.queue.depth.fetch_add(1, Ordering::AcqRel);
            subscriber.tx.send(event.clone()).is_ok()
        });
    }

    /// Every full queue, each with the end of its grace (counted from when
    /// it was first found full); queues with room forget their grace.
    pub fn full_queues(&mut self, now: Instant) -> Vec<FullQueue> {
        self.subscribers
            .iter_mut()
            .filter_map(|(id, s)| {
                if !s.queue.full() {
                    s.full_since = None;
                    return None;
                }
                let since = *s.full_since.get_or_insert(now);
                Some(FullQueue { id: *id, queue: s.queue.clone(), deadline: since + limits::SUBSCRIBER_LAG_TIMEOUT })
            })
            .collect()
    }

    /// Drops the subscribers among `full` whose grace ran out and that are
    /// still full; their streams re-synchronise.
    pub fn drop_lagging(&mut self, full: &[FullQueue], now: Instant) {
        for f in full {
            if now >= f.deadline && f.queue.full() && self.subscribers.remove(&f.id).is_some() {
                f.queue.lagged.store(true, Ordering::SeqCst);
            }
        }
    }
}
