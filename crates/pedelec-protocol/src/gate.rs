//! The per-session event gate: which Core events a client adopts.
//!
//! Rules (the client must drop duplicate and out-of-order events, since a
//! re-subscribe or a snapshot can repeat what it already saw):
//! - an event whose `seq` is not newer than the last one seen is stale;
//! - an operation-scoped event (non-empty `operation_id`) is accepted only
//!   while that operation is the active one; `OperationStarted` makes its
//!   operation active and `OperationCompleted` ends it;
//! - a snapshot resets the gate to its `last_seq` and adopts its status and
//!   active operation.
//!
//! Core emits events in `seq` order through this same vocabulary, and the SDK
//! feeds every received event through [`EventGate::admit`] before acting on it.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::gate::{EventGate, Verdict, build};
//! use pedelec_protocol::pb::{self, session_event::Kind};
//!
//! let mut gate = EventGate::new();
//! let started = Kind::OperationStarted(pb::OperationStarted::default());
//! let chat = |text: &str| Kind::Chat(pb::Chat { text: text.into() });
//! assert_eq!(gate.admit(&build::event("s", 1, "op-1", started)), Verdict::Accept);
//! assert_eq!(gate.admit(&build::event("s", 2, "op-1", chat("hello"))), Verdict::Accept);
//! // A re-delivered event, and one of an operation that is not running, are ignored.
//! assert_eq!(gate.admit(&build::event("s", 2, "op-1", chat("hello"))), Verdict::Stale);
//! assert_eq!(gate.admit(&build::event("s", 3, "op-0", chat("late"))), Verdict::ForeignOperation);
//! ```

use crate::pb::{self, session_event::Kind};
use crate::status::SessionStatus;

/// What the gate decided about one event.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::gate::{EventGate, Verdict, build};
/// use pedelec_protocol::SessionStatus::{Idle, Running};
///
/// let mut gate = EventGate::new();
/// let event = build::event("s", 1, "", build::status(Running, Idle));
/// assert_eq!(gate.admit(&event), Verdict::Accept);
/// assert_eq!(gate.admit(&event), Verdict::Stale);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Adopt the event.
    Accept,
    /// `seq` is not newer than the last seen: ignore.
    Stale,
    /// Scoped to an operation that is not the active one: ignore.
    ForeignOperation,
}

/// The gate state for one session.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::gate::{EventGate, build};
/// use pedelec_protocol::SessionStatus::{Idle, Running};
///
/// let mut gate = EventGate::new();
/// gate.admit(&build::event("s", 4, "", build::status(Running, Idle)));
/// assert_eq!(gate.last_seq(), 4);
/// assert_eq!(gate.core_status(), Some(Running));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventGate {
    last_seq: u64,
    active_operation: Option<String>,
    status: Option<SessionStatus>,
}

impl EventGate {
    /// A gate that has seen nothing yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::EventGate;
    ///
    /// let gate = EventGate::new();
    /// assert_eq!(gate.last_seq(), 0);
    /// assert_eq!(gate.active_operation(), None);
    /// assert_eq!(gate.core_status(), None);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Newest accepted sequence number.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::{EventGate, build};
    /// use pedelec_protocol::SessionStatus::{Idle, Running};
    ///
    /// let mut gate = EventGate::new();
    /// gate.admit(&build::event("s", 7, "", build::status(Running, Idle)));
    /// // A stale event does not move it back.
    /// gate.admit(&build::event("s", 3, "", build::status(Idle, Running)));
    /// assert_eq!(gate.last_seq(), 7);
    /// ```
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The operation currently active, as far as the stream says.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::{EventGate, build};
    /// use pedelec_protocol::pb::{self, session_event::Kind};
    ///
    /// let mut gate = EventGate::new();
    /// gate.admit(&build::event("s", 1, "op-1", Kind::OperationStarted(pb::OperationStarted::default())));
    /// assert_eq!(gate.active_operation(), Some("op-1"));
    /// gate.admit(&build::event("s", 2, "op-1", Kind::OperationCompleted(pb::OperationCompleted::default())));
    /// assert_eq!(gate.active_operation(), None);
    /// ```
    pub fn active_operation(&self) -> Option<&str> {
        self.active_operation.as_deref()
    }

    /// Core's status as last adopted from a snapshot or status event.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::{EventGate, build};
    /// use pedelec_protocol::pb::{self, session_event::Kind};
    /// use pedelec_protocol::SessionStatus;
    ///
    /// let mut gate = EventGate::new();
    /// gate.admit(&build::event("s", 1, "", Kind::Ended(pb::Ended { reason: "requested".into() })));
    /// assert_eq!(gate.core_status(), Some(SessionStatus::Ended));
    /// ```
    pub fn core_status(&self) -> Option<SessionStatus> {
        self.status
    }

    /// Decides about one event and, when accepted, updates the gate.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::{EventGate, Verdict, build};
    /// use pedelec_protocol::pb::{self, session_event::Kind};
    ///
    /// let mut gate = EventGate::new();
    /// let delta = Kind::ChatDelta(pb::ChatDelta { text: "Hel".into() });
    /// // Until its OperationStarted arrives, an operation's events are not adopted.
    /// assert_eq!(gate.admit(&build::event("s", 1, "op-1", delta.clone())), Verdict::ForeignOperation);
    /// gate.admit(&build::event("s", 2, "op-1", Kind::OperationStarted(pb::OperationStarted::default())));
    /// assert_eq!(gate.admit(&build::event("s", 3, "op-1", delta)), Verdict::Accept);
    /// ```
    pub fn admit(&mut self, event: &pb::SessionEvent) -> Verdict {
        if let Some(Kind::Snapshot(snapshot)) = &event.kind {
            self.reset(snapshot);
            return Verdict::Accept;
        }
        if event.seq <= self.last_seq {
            return Verdict::Stale;
        }
        self.last_seq = event.seq;
        let scoped = !event.operation_id.is_empty();
        match &event.kind {
            Some(Kind::OperationStarted(_)) if scoped => {
                self.active_operation = Some(event.operation_id.clone());
            }
            _ if scoped && self.active_operation.as_deref() != Some(event.operation_id.as_str()) => {
                return Verdict::ForeignOperation;
            }
            Some(Kind::OperationCompleted(_)) => self.active_operation = None,
            Some(Kind::Ended(_)) => {
                self.active_operation = None;
                self.status = Some(SessionStatus::Ended);
            }
            _ => {}
        }
        if let Some(Kind::StatusChanged(change)) = &event.kind
            && let Some(status) = SessionStatus::from_pb(change.status)
        {
            self.status = Some(status);
        }
        Verdict::Accept
    }

    /// Adopts a snapshot: its `last_seq`, status and active operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{EventGate, SessionStatus, pb};
    ///
    /// let mut gate = EventGate::new();
    /// gate.reset(&pb::Snapshot {
    ///     last_seq: 41,
    ///     status: pb::SessionStatus::Running as i32,
    ///     active_operation: Some(pb::ActiveOperation { operation_id: "op-9".into(), kind: 2 }),
    ///     ..Default::default()
    /// });
    /// assert_eq!(gate.last_seq(), 41);
    /// assert_eq!(gate.core_status(), Some(SessionStatus::Running));
    /// assert_eq!(gate.active_operation(), Some("op-9"));
    /// ```
    pub fn reset(&mut self, snapshot: &pb::Snapshot) {
        self.last_seq = snapshot.last_seq;
        self.status = SessionStatus::from_pb(snapshot.status);
        self.active_operation =
            snapshot.active_operation.as_ref().map(|op| op.operation_id.clone()).filter(|id| !id.is_empty());
    }
}

/// Builders for events, shared by Core and tests so both spell events alike.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::gate::build;
/// use pedelec_protocol::SessionStatus::{Idle, Running};
///
/// let event = build::event("sess-1", 3, "", build::status(Running, Idle));
/// assert_eq!((event.session_id.as_str(), event.seq), ("sess-1", 3));
/// ```
pub mod build {
    use crate::pb::{self, session_event::Kind};

    /// An event with no turn metadata.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build;
    /// use pedelec_protocol::pb::{self, session_event::Kind};
    ///
    /// let event = build::event("sess-1", 5, "op-1", Kind::Chat(pb::Chat { text: "Done.".into() }));
    /// assert_eq!(event.operation_id, "op-1");
    /// assert!(event.turn.is_none());
    /// ```
    pub fn event(session_id: &str, seq: u64, operation_id: &str, kind: Kind) -> pb::SessionEvent {
        pb::SessionEvent {
            session_id: session_id.to_owned(),
            seq,
            emitted_at_ms: 0,
            turn: None,
            operation_id: operation_id.to_owned(),
            kind: Some(kind),
        }
    }

    /// `StatusChanged` kind.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build;
    /// use pedelec_protocol::pb::{self, session_event::Kind};
    /// use pedelec_protocol::SessionStatus::{Idle, Running};
    ///
    /// let Kind::StatusChanged(change) = build::status(Running, Idle) else { unreachable!() };
    /// assert_eq!(change.status, pb::SessionStatus::Running as i32);
    /// assert_eq!(change.previous, pb::SessionStatus::Idle as i32);
    /// ```
    pub fn status(status: crate::SessionStatus, previous: crate::SessionStatus) -> Kind {
        Kind::StatusChanged(pb::StatusChanged { status: status.to_pb() as i32, previous: previous.to_pb() as i32 })
    }
}

#[cfg(test)]
mod tests {
    use super::build::{event, status};
    use super::*;
    use SessionStatus::*;

    fn started(seq: u64, op: &str) -> pb::SessionEvent {
        event("s", seq, op, Kind::OperationStarted(pb::OperationStarted { kind: 2 }))
    }
    fn chat(seq: u64, op: &str) -> pb::SessionEvent {
        event("s", seq, op, Kind::Chat(pb::Chat { text: "hi".into() }))
    }
    fn completed(seq: u64, op: &str) -> pb::SessionEvent {
        event(
            "s",
            seq,
            op,
            Kind::OperationCompleted(pb::OperationCompleted { kind: 2, error: None, ..Default::default() }),
        )
    }
    fn snapshot(last_seq: u64, st: SessionStatus, op: Option<&str>) -> pb::SessionEvent {
        let snap = pb::Snapshot {
            status: st.to_pb() as i32,
            last_seq,
            active_operation: op.map(|id| pb::ActiveOperation { operation_id: id.into(), kind: 2 }),
            ..Default::default()
        };
        event("s", last_seq, "", Kind::Snapshot(snap))
    }

    #[test]
    fn an_event_not_newer_than_the_last_seen_is_ignored() {
        let mut gate = EventGate::new();
        assert_eq!(gate.admit(&event("s", 5, "", status(Running, Idle))), Verdict::Accept);
        assert_eq!(gate.admit(&event("s", 5, "", status(Idle, Running))), Verdict::Stale);
        assert_eq!(gate.admit(&event("s", 3, "", status(Idle, Running))), Verdict::Stale);
        assert_eq!(gate.core_status(), Some(Running));
        assert_eq!(gate.admit(&event("s", 6, "", status(Idle, Running))), Verdict::Accept);
        assert_eq!(gate.last_seq(), 6);
    }

    #[test]
    fn operation_scoped_events_are_accepted_only_for_the_active_operation() {
        let mut gate = EventGate::new();
        assert_eq!(gate.admit(&chat(1, "op-a")), Verdict::ForeignOperation, "no operation active yet");
        assert_eq!(gate.admit(&started(2, "op-a")), Verdict::Accept);
        assert_eq!(gate.active_operation(), Some("op-a"));
        assert_eq!(gate.admit(&chat(3, "op-b")), Verdict::ForeignOperation);
        assert_eq!(gate.admit(&chat(4, "op-a")), Verdict::Accept);
        assert_eq!(gate.admit(&completed(5, "op-b")), Verdict::ForeignOperation);
        assert_eq!(gate.active_operation(), Some("op-a"), "a foreign completion changes nothing");
        assert_eq!(gate.admit(&completed(6, "op-a")), Verdict::Accept);
        assert_eq!(gate.active_operation(), None);
        assert_eq!(gate.admit(&chat(7, "op-a")), Verdict::ForeignOperation, "late event of a finished operation");
    }

    #[test]
    fn operation_less_events_pass_regardless_of_the_active_operation() {
        let mut gate = EventGate::new();
        gate.admit(&started(1, "op-a"));
        assert_eq!(gate.admit(&event("s", 2, "", status(Idle, Ended))), Verdict::Accept);
        assert_eq!(gate.active_operation(), Some("op-a"));
    }

    #[test]
    fn a_snapshot_resets_the_gate_and_adopts_status_and_operation() {
        let mut gate = EventGate::new();
        gate.admit(&started(10, "op-a"));
        assert_eq!(gate.admit(&snapshot(4, WaitingToolResult, Some("op-z"))), Verdict::Accept);
        assert_eq!(gate.last_seq(), 4);
        assert_eq!(gate.core_status(), Some(WaitingToolResult));
        assert_eq!(gate.active_operation(), Some("op-z"));
        assert_eq!(gate.admit(&chat(5, "op-z")), Verdict::Accept, "events after the snapshot flow again");
        assert_eq!(gate.admit(&chat(4, "op-z")), Verdict::Stale);
        gate.admit(&snapshot(9, Idle, None));
        assert_eq!(gate.active_operation(), None);
        assert_eq!(gate.admit(&chat(10, "op-z")), Verdict::ForeignOperation);
    }

    #[test]
    fn ended_clears_the_active_operation() {
        let mut gate = EventGate::new();
        gate.admit(&started(1, "op-a"));
        gate.admit(&event("s", 2, "", Kind::Ended(pb::Ended { reason: "requested".into() })));
        assert_eq!(gate.active_operation(), None);
        assert_eq!(gate.core_status(), Some(Ended));
    }

    #[test]
    fn stale_events_do_not_advance_or_change_anything() {
        let mut gate = EventGate::new();
        gate.admit(&started(3, "op-a"));
        let before = gate.clone();
        assert_eq!(gate.admit(&completed(2, "op-a")), Verdict::Stale);
        assert_eq!(gate, before);
    }
}
