//! The session state machine, sans-IO: fed Core events and local actions, it
//! returns [`HandleEffect`]s for the shell ([`crate::PedelecSession`]) to carry out.
//!
//! It owns the browser-side status (with de-duplication), the event gate from
//! `pedelec-protocol`, operation settlement, usage, the prepared flag, the
//! queue of frontend tool calls that wait for a handler, and which of the
//! shell's callers wait for a start's answer or an event seq
//! ([`WaiterId`]). It never blocks, sleeps or spawns, so its tests are exact
//! and the same code runs in wasm.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::gate::build::{event, status};
//! use pedelec_sdk::context::SessionMeta;
//! use pedelec_sdk::machine::{Accepted, HandleEffect, SessionMachine};
//! use pedelec_sdk::pb::{self, session_event::Kind};
//! use pedelec_sdk::SessionStatus::{Idle, Running};
//!
//! let mut machine = SessionMachine::new(SessionMeta::default());
//! let no_handlers = &|_: &str| false;
//! // `send_text`: the handle is `running` at once, before Core answers.
//! machine.begin_local(pb::OperationKind::SendText).unwrap();
//! let accepted = pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() };
//! assert_eq!(machine.operation_accepted(&accepted).0, Accepted::Pending);
//! // Core's events for that operation, as the subscription delivers them.
//! let started = Kind::OperationStarted(pb::OperationStarted::default());
//! let chat = Kind::Chat(pb::Chat { text: "You said: hi".into() });
//! let completed = Kind::OperationCompleted(pb::OperationCompleted::default());
//! let mut effects = Vec::new();
//! let stream = [(1, "op-1", started), (2, "op-1", chat), (3, "", status(Idle, Running)), (4, "op-1", completed)];
//! for (seq, op, kind) in stream {
//!     effects.extend(machine.on_event(&event("s", seq, op, kind), 0, no_handlers));
//! }
//! // The shell runs the chat handlers, the status handlers, then settles `send_text`.
//! assert!(matches!(&effects[..], [
//!     HandleEffect::Chat { .. },
//!     HandleEffect::Status { status: Idle, .. },
//!     HandleEffect::Settle { outcome: Ok(()), .. },
//! ]));
//! ```

use std::collections::{HashMap, HashSet, VecDeque};

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, EventGate, OperationId, SessionStatus, ToolRequestId, Verdict};

use crate::context::{EventContext, EventKind, SessionMeta, Source, StatusContext, ToolCallContext};
use crate::error::PedelecError;

/// Completions that arrived before their operation id was known, kept briefly.
const EARLY_COMPLETIONS: usize = 32;

/// A frontend tool call to hand to a handler.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::gate::build::event;
/// use pedelec_sdk::context::SessionMeta;
/// use pedelec_sdk::machine::SessionMachine;
/// use pedelec_sdk::pb::{self, session_event::Kind};
///
/// let mut machine = SessionMachine::new(SessionMeta::default());
/// let no_handlers = &|_: &str| false;
/// let started = Kind::OperationStarted(pb::OperationStarted::default());
/// machine.on_event(&event("s", 1, "op-1", started), 0, no_handlers);
/// let call = pb::ToolCall { tool_request_id: "tool-1".into(), tool: "add".into(), ..Default::default() };
/// machine.on_event(&event("s", 2, "op-1", Kind::ToolCall(call)), 0, no_handlers);
/// let waiting: Vec<_> = machine.queued_tools().collect();
/// assert_eq!((waiting[0].tool_request_id.as_str(), waiting[0].tool.as_str()), ("tool-1", "add"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tool_request_id: ToolRequestId,
    pub tool: String,
    pub args_json: String,
}

/// What the shell must do.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::SessionMeta;
/// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
/// use pedelec_sdk::{SessionStatus, pb};
///
/// let mut machine = SessionMachine::new(SessionMeta::default());
/// for effect in machine.begin_local(pb::OperationKind::SendText).unwrap() {
///     match effect {
///         HandleEffect::Status { status, ctx } => {
///             assert_eq!((ctx.previous_status, status), (SessionStatus::Idle, SessionStatus::Running))
///         }
///         other => panic!("only a status change, not {other:?}"),
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum HandleEffect {
    /// Run status handlers (the value changed).
    Status {
        status: SessionStatus,
        ctx: StatusContext,
    },
    Chat {
        text: String,
        ctx: EventContext,
    },
    ChatDelta {
        text: String,
        ctx: EventContext,
    },
    Error {
        error: PedelecError,
        ctx: EventContext,
    },
    /// Run ended handlers (one transition into ended).
    Ended {
        ctx: EventContext,
    },
    /// Usage total grew.
    Usage {
        total_tokens: u64,
    },
    /// Ask the permission handler (or answer the policy's option without one).
    AskPermission {
        request: pb::PermissionRequest,
        ctx: EventContext,
    },
    /// An agent activity started or changed (its whole current state).
    Activity {
        activity: pb::Activity,
        ctx: EventContext,
    },
    /// Call the tool's handler and submit its result.
    InvokeTool {
        request: ToolRequest,
        ctx: ToolCallContext,
    },
    /// Settle the promise of an operation.
    Settle {
        operation_id: OperationId,
        outcome: Result<(), PedelecError>,
    },
    /// Wake a caller: what it waited for happened, or cannot any more.
    Wake {
        waiter: WaiterId,
    },
}

/// A caller of the shell waiting for the machine to reach a point: its
/// handle's start answered ([`SessionMachine::wait_for_start`]) or an event
/// seq handled ([`SessionMachine::wait_for_seq`]). [`HandleEffect::Wake`]
/// names it once it has.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::SessionMeta;
/// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
///
/// let mut machine = SessionMachine::new(SessionMeta::default());
/// let waiter = machine.wait_for_seq(7).expect("seq 7 is not handled yet");
/// // Detaching wakes it: no event will come through this transport.
/// assert!(machine.detached().contains(&HandleEffect::Wake { waiter }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(u64);

/// What became of an accepted operation at the time its id was learnt.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::SessionMeta;
/// use pedelec_sdk::pb;
/// use pedelec_sdk::machine::{Accepted, SessionMachine};
///
/// let mut machine = SessionMachine::new(SessionMeta::default());
/// machine.begin_local(pb::OperationKind::Prepare).unwrap();
/// // Core says the session was prepared before: nothing to wait for.
/// let done = pb::OperationAccepted { already_done: true, ..Default::default() };
/// assert_eq!(machine.operation_accepted(&done).0, Accepted::Settled(Ok(())));
/// assert!(machine.prepared());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// Wait for [`HandleEffect::Settle`].
    Pending,
    /// Already settled.
    Settled(Result<(), PedelecError>),
}

/// One session handle's state: everything but I/O (see the module docs).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::context::SessionMeta;
/// use pedelec_sdk::machine::SessionMachine;
///
/// let mut machine = SessionMachine::new(SessionMeta::default());
/// assert_eq!(machine.status(), pedelec_sdk::SessionStatus::Idle);
/// ```
pub struct SessionMachine {
    meta: SessionMeta,
    gate: EventGate,
    status: SessionStatus,
    usage: Option<u64>,
    prepared: bool,
    /// Operation started locally whose id Core has not returned yet.
    local_operation: Option<pb::OperationKind>,
    awaiting: HashMap<OperationId, pb::OperationKind>,
    completed_early: VecDeque<(OperationId, Result<(), PedelecError>)>,
    /// Outcomes of the session's recent operations (see [`SessionMachine::outcome`]).
    known_outcomes: VecDeque<(OperationId, Result<(), PedelecError>)>,
    /// Typed answers of recent operations (`OperationCompleted.output_json`),
    /// until the caller awaiting each takes it ([`SessionMachine::take_output`]).
    outputs: VecDeque<(OperationId, String)>,
    queued_tools: Vec<(ToolRequest, ToolCallContext)>,
    handling: HashSet<ToolRequestId>,
    /// The running turn's activities, latest state each, with their context.
    activities: Vec<(pb::Activity, EventContext)>,
    /// Permission requests handed to the shell and not settled yet.
    asking: HashSet<String>,
    /// The transport was lost; a fresh subscription's snapshot ends that.
    detached: bool,
    next_waiter: u64,
    /// Callers waiting until this handle's start request is answered.
    start_waiters: Vec<WaiterId>,
    /// Callers waiting until an event seq is handled.
    seq_waiters: Vec<(u64, WaiterId)>,
}

/// Whether a handler exists for a tool name.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::machine::HasHandler;
///
/// let only_add: HasHandler = &|tool| tool == "add";
/// assert!(only_add("add") && !only_add("delete"));
/// ```
pub type HasHandler<'a> = &'a dyn Fn(&str) -> bool;

impl SessionMachine {
    /// A new handle: `idle` locally until Core says otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let machine = SessionMachine::new(SessionMeta { session_id: "sess-1".into(), ..Default::default() });
    /// assert_eq!(machine.status(), pedelec_sdk::SessionStatus::Idle);
    /// assert_eq!((machine.usage(), machine.last_seq()), (None, 0));
    /// ```
    pub fn new(meta: SessionMeta) -> Self {
        SessionMachine {
            meta,
            gate: EventGate::new(),
            status: SessionStatus::Idle,
            usage: None,
            prepared: false,
            local_operation: None,
            awaiting: HashMap::new(),
            completed_early: VecDeque::new(),
            outputs: VecDeque::new(),
            known_outcomes: VecDeque::new(),
            queued_tools: Vec::new(),
            handling: HashSet::new(),
            activities: Vec::new(),
            asking: HashSet::new(),
            detached: false,
            next_waiter: 0,
            start_waiters: Vec::new(),
            seq_waiters: Vec::new(),
        }
    }

    /// The handle's status, as its handlers last heard it.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::{SessionStatus, pb};
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// assert_eq!(machine.status(), SessionStatus::Running);
    /// ```
    pub fn status(&self) -> SessionStatus {
        self.status
    }
    /// The cumulative token total, once a provider reported one.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let update = pb::UsageUpdated { usage: Some(pb::Usage { total_tokens: Some(120) }) };
    /// machine.on_event(&event("s", 1, "", Kind::UsageUpdated(update)), 0, no_handlers);
    /// assert_eq!(machine.usage(), Some(120));
    /// ```
    pub fn usage(&self) -> Option<u64> {
        self.usage
    }
    /// Whether the session's preparation succeeded.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let snapshot = pb::Snapshot { prepared: true, status: pb::SessionStatus::Idle as i32, ..Default::default() };
    /// machine.on_event(&event("s", 1, "", Kind::Snapshot(snapshot)), 0, no_handlers);
    /// assert!(machine.prepared());
    /// ```
    pub fn prepared(&self) -> bool {
        self.prepared
    }
    /// What every context of this handle repeats.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let machine = SessionMachine::new(SessionMeta { session_id: "sess-1".into(), ..Default::default() });
    /// assert_eq!(machine.meta().session_id, "sess-1");
    /// ```
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }
    /// The metadata, to fill in what was learnt later (a resumed handle's provider).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::{EventKind, SessionMeta};
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.meta_mut().provider = "scripted".into();
    /// // Every context made from now on names it.
    /// assert_eq!(machine.meta().sdk(EventKind::SdkError, None).provider, "scripted");
    /// ```
    pub fn meta_mut(&mut self) -> &mut SessionMeta {
        &mut self.meta
    }
    /// The newest event `seq` the gate adopted.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let delta = Kind::UsageUpdated(pb::UsageUpdated::default());
    /// machine.on_event(&event("s", 5, "", delta.clone()), 0, no_handlers);
    /// // An older event is ignored and does not move it back.
    /// machine.on_event(&event("s", 2, "", delta), 0, no_handlers);
    /// assert_eq!(machine.last_seq(), 5);
    /// ```
    pub fn last_seq(&self) -> u64 {
        self.gate.last_seq()
    }
    /// Whether a local operation or an awaited one is in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::pb;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// assert!(machine.has_operation_in_flight());
    /// // So a second `send_text` is refused before it reaches Core.
    /// assert!(machine.begin_local(pb::OperationKind::SendText).unwrap_err().is(pedelec_sdk::ErrorCode::SessionBusy));
    /// ```
    pub fn has_operation_in_flight(&self) -> bool {
        self.local_operation.is_some() || !self.awaiting.is_empty()
    }
    /// The running turn's activities as last reported (what a handler
    /// registered mid-turn is told first).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let started = Kind::OperationStarted(pb::OperationStarted::default());
    /// machine.on_event(&event("s", 1, "op-1", started), 0, no_handlers);
    /// let activity = pb::Activity { activity_id: "call-1".into(), title: "Run tests".into(), ..Default::default() };
    /// let update = pb::ActivityUpdated { activity: Some(activity) };
    /// machine.on_event(&event("s", 2, "op-1", Kind::ActivityUpdated(update)), 0, no_handlers);
    /// assert_eq!(machine.running_activities()[0].0.title, "Run tests");
    /// ```
    pub fn running_activities(&self) -> &[(pb::Activity, EventContext)] {
        &self.activities
    }

    /// Hands a permission request to the shell once (a re-sync's snapshot
    /// repeats the pending ones).
    fn ask_permission(&mut self, request: &pb::PermissionRequest, ctx: EventContext, out: &mut Vec<HandleEffect>) {
        // Only the user answers it (in the extension); Core would refuse ours.
        if request.user_only {
            return;
        }
        if self.asking.insert(request.permission_id.clone()) {
            out.push(HandleEffect::AskPermission { request: request.clone(), ctx });
        }
    }

    /// Keeps the latest state of an activity of the running turn (bounded like Core's).
    fn remember_activity(&mut self, activity: &pb::Activity, ctx: &EventContext) {
        let count = self.activities.len();
        match self.activities.iter_mut().find(|(a, _)| a.activity_id == activity.activity_id) {
            Some(known) => *known = (activity.clone(), ctx.clone()),
            None if count < pedelec_protocol::activity::MAX_TURN_ACTIVITIES => {
                self.activities.push((activity.clone(), ctx.clone()))
            }
            None => {}
        }
    }

    /// Whether a `send_text`/`prepare` of this handle was sent and Core's
    /// answer is not in yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::pb;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// assert!(machine.is_starting());
    /// machine.operation_accepted(&pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() });
    /// assert!(!machine.is_starting());
    /// ```
    pub fn is_starting(&self) -> bool {
        self.local_operation.is_some()
    }

    /// A waiter woken once this handle's start request is answered (accepted
    /// or failed), so a `cancel()` cancels the operation that start begins;
    /// `None` when no start is on its way.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::pb;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// assert_eq!(machine.wait_for_start(), None);
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// let waiter = machine.wait_for_start().unwrap();
    /// let accepted = pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() };
    /// let (_, effects) = machine.operation_accepted(&accepted);
    /// assert_eq!(effects, vec![HandleEffect::Wake { waiter }]);
    /// ```
    pub fn wait_for_start(&mut self) -> Option<WaiterId> {
        if !self.is_starting() {
            return None;
        }
        let waiter = self.waiter();
        self.start_waiters.push(waiter);
        Some(waiter)
    }

    /// A waiter woken once the event `seq` is handled (or a re-sync's
    /// snapshot passed it, or the handle detached); `None` when there is
    /// nothing to wait for: `seq` 0, handled already, or detached.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let waiter = machine.wait_for_seq(2).unwrap();
    /// let usage = Kind::UsageUpdated(pb::UsageUpdated::default());
    /// assert!(machine.on_event(&event("s", 1, "", usage.clone()), 0, no_handlers).is_empty());
    /// assert_eq!(machine.on_event(&event("s", 2, "", usage), 0, no_handlers), vec![HandleEffect::Wake { waiter }]);
    /// assert_eq!(machine.wait_for_seq(2), None, "handled already");
    /// ```
    pub fn wait_for_seq(&mut self, seq: u64) -> Option<WaiterId> {
        if seq == 0 || self.last_seq() >= seq || self.detached {
            return None;
        }
        let waiter = self.waiter();
        self.seq_waiters.push((seq, waiter));
        Some(waiter)
    }

    /// Whether the transport was lost (see [`SessionMachine::detached`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.detached();
    /// assert!(machine.is_detached());
    /// machine.attached();
    /// assert!(!machine.is_detached());
    /// ```
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// A subscription delivered its snapshot: the handle hears Core again.
    pub fn attached(&mut self) {
        self.detached = false;
    }

    fn waiter(&mut self) -> WaiterId {
        self.next_waiter += 1;
        WaiterId(self.next_waiter)
    }

    fn wake_start_waiters(&mut self, out: &mut Vec<HandleEffect>) {
        out.extend(self.start_waiters.drain(..).map(|waiter| HandleEffect::Wake { waiter }));
    }

    /// Wakes the callers waiting for a seq up to `handled`.
    fn wake_seq_waiters(&mut self, handled: u64, out: &mut Vec<HandleEffect>) {
        if self.seq_waiters.is_empty() {
            return;
        }
        for (_, waiter) in self.seq_waiters.extract_if(.., |(seq, _)| *seq <= handled) {
            out.push(HandleEffect::Wake { waiter });
        }
    }
    /// Tool requests waiting for a handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let started = Kind::OperationStarted(pb::OperationStarted::default());
    /// machine.on_event(&event("s", 1, "op-1", started), 0, no_handlers);
    /// let call = pb::ToolCall { tool_request_id: "tool-1".into(), tool: "add".into(), ..Default::default() };
    /// machine.on_event(&event("s", 2, "op-1", Kind::ToolCall(call)), 0, no_handlers);
    /// // Nobody handles `add` yet: the call waits instead of failing.
    /// assert_eq!(machine.queued_tools().count(), 1);
    /// ```
    pub fn queued_tools(&self) -> impl Iterator<Item = &ToolRequest> {
        self.queued_tools.iter().map(|(r, _)| r)
    }

    fn change_status(&mut self, next: SessionStatus, ctx: EventContext, out: &mut Vec<HandleEffect>) {
        if next == self.status {
            return;
        }
        let previous = self.status;
        self.status = next;
        let ended_ctx = EventContext {
            kind: if ctx.source == Source::Core { EventKind::Ended } else { EventKind::SdkEnded },
            ..ctx.clone()
        };
        out.push(HandleEffect::Status { status: next, ctx: StatusContext { base: ctx, previous_status: previous } });
        if next == SessionStatus::Ended {
            out.push(HandleEffect::Ended { ctx: ended_ctx });
            self.reject_all(ErrorCode::SessionEnded, "the session ended", out);
            self.queued_tools.clear();
            self.handling.clear();
        }
    }

    fn reject_all(&mut self, code: ErrorCode, message: &str, out: &mut Vec<HandleEffect>) {
        let mut ids: Vec<OperationId> = self.awaiting.drain().map(|(id, _)| id).collect();
        ids.sort();
        for operation_id in ids {
            out.push(HandleEffect::Settle { operation_id, outcome: Err(PedelecError::new(code, message)) });
        }
    }

    fn status_ctx(
        &self,
        source: Source,
        turn: Option<&pb::TurnInfo>,
        emitted: i64,
        received: Option<i64>,
    ) -> EventContext {
        match source {
            Source::Sdk => self.meta.sdk(EventKind::SdkStatusChanged, turn),
            Source::Core => self.meta.core(EventKind::StatusChanged, turn, emitted, received),
        }
    }

    /// `sendText()`/`prepare()` begin: local checks, then `running` locally.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::{ErrorCode, pb};
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let effects = machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// assert_eq!(effects.len(), 1, "one status change to running");
    /// machine.local_ended();
    /// // An ended session refuses without asking Core.
    /// let refused = machine.begin_local(pb::OperationKind::SendText).unwrap_err();
    /// assert!(refused.is(ErrorCode::SessionEnded));
    /// ```
    pub fn begin_local(&mut self, kind: pb::OperationKind) -> Result<Vec<HandleEffect>, PedelecError> {
        if let Some((code, message)) = self.status.refuse_start(self.has_operation_in_flight()) {
            return Err(PedelecError::new(code, message));
        }
        self.local_operation = Some(kind);
        let mut out = Vec::new();
        let ctx = self.status_ctx(Source::Sdk, None, 0, None);
        self.change_status(SessionStatus::Running, ctx, &mut out);
        Ok(out)
    }

    /// Core returned the operation id (or said a preparation was already done).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::pb;
    /// use pedelec_sdk::machine::{Accepted, SessionMachine};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// let accepted = pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() };
    /// let (accepted, effects) = machine.operation_accepted(&accepted);
    /// // Settled later by the operation's `OperationCompleted`.
    /// assert_eq!(accepted, Accepted::Pending);
    /// assert!(effects.is_empty());
    /// ```
    pub fn operation_accepted(&mut self, accepted: &pb::OperationAccepted) -> (Accepted, Vec<HandleEffect>) {
        let kind =
            self.local_operation.take().unwrap_or(pb::OperationKind::try_from(accepted.kind).unwrap_or_default());
        let mut out = Vec::new();
        let state = self.accept(accepted, kind, &mut out);
        // After the acceptance's own effects: a `cancel()` that waited for
        // this start then finds its operation known.
        self.wake_start_waiters(&mut out);
        (state, out)
    }

    fn accept(
        &mut self,
        accepted: &pb::OperationAccepted,
        kind: pb::OperationKind,
        out: &mut Vec<HandleEffect>,
    ) -> Accepted {
        if accepted.already_done {
            self.prepared = true;
            self.revert_local_running(out);
            return Accepted::Settled(Ok(()));
        }
        if let Some(index) = self.completed_early.iter().position(|(id, _)| id == &accepted.operation_id) {
            let (_, outcome) = self.completed_early.remove(index).expect("index from position");
            return Accepted::Settled(outcome);
        }
        if self.status == SessionStatus::Ended {
            return Accepted::Settled(Err(PedelecError::new(ErrorCode::SessionEnded, "the session ended")));
        }
        self.awaiting.insert(OperationId::new(accepted.operation_id.clone()), kind);
        Accepted::Pending
    }

    /// The start request failed: undo the optimistic `running`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::{SessionStatus, pb};
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// machine.operation_failed_to_start();
    /// assert_eq!(machine.status(), SessionStatus::Idle);
    /// assert!(!machine.has_operation_in_flight());
    /// ```
    pub fn operation_failed_to_start(&mut self) -> Vec<HandleEffect> {
        self.local_operation = None;
        let mut out = Vec::new();
        self.revert_local_running(&mut out);
        self.wake_start_waiters(&mut out);
        out
    }

    /// Undoes the optimistic `running` of a start that did not happen, back
    /// to what Core last said — unless Core itself says a turn runs, or an
    /// operation of this handle is under way. Core's word is its status, not
    /// whether an operation is still active: an operation that is committing
    /// its completion is active while Core's status already says idle, and a
    /// start refused in that moment must not leave the handle running for
    /// ever (the completion that follows changes no status).
    fn revert_local_running(&mut self, out: &mut Vec<HandleEffect>) {
        let core_runs =
            self.gate.core_status() == Some(SessionStatus::Running) && self.gate.active_operation().is_some();
        if self.status == SessionStatus::Running
            && !core_runs
            && self.local_operation.is_none()
            && self.awaiting.is_empty()
        {
            let back = self.gate.core_status().filter(|s| *s != SessionStatus::Running).unwrap_or(SessionStatus::Idle);
            let ctx = self.status_ctx(Source::Sdk, None, 0, None);
            self.change_status(back, ctx, out);
        }
    }

    /// A successful local `end()`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let effects = machine.local_ended();
    /// assert!(matches!(&effects[..], [HandleEffect::Status { .. }, HandleEffect::Ended { .. }]));
    /// assert_eq!(machine.status(), pedelec_sdk::SessionStatus::Ended);
    /// ```
    pub fn local_ended(&mut self) -> Vec<HandleEffect> {
        let mut out = Vec::new();
        let ctx = self.status_ctx(Source::Sdk, None, 0, None);
        self.change_status(SessionStatus::Ended, ctx, &mut out);
        out
    }

    /// The transport is gone: nothing in flight can complete through it.
    /// Every awaited operation rejects with `TRANSPORT_DETACHED`, its id in
    /// `details.operationId`: how it really ended is not lost — a handle
    /// from `Pedelec::resume_session` reports it
    /// ([`SessionMachine::outcome`]), `CORE_RESTARTED` if Core crashed.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::{ErrorCode, pb};
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// machine.operation_accepted(&pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() });
    /// let effects = machine.detached();
    /// let [HandleEffect::Settle { operation_id, outcome: Err(error) }] = &effects[..] else { panic!() };
    /// assert!(error.is(ErrorCode::TransportDetached));
    /// // The error names the operation, for `resume_session` to look up.
    /// assert_eq!(error.details.as_ref().unwrap()["operationId"], operation_id.as_str());
    /// ```
    pub fn detached(&mut self) -> Vec<HandleEffect> {
        self.detached = true;
        let mut out = Vec::new();
        // Nothing more arrives through this transport.
        self.wake_seq_waiters(u64::MAX, &mut out);
        self.settle_all(ErrorCode::TransportDetached, "the connection to Core was lost", &mut out);
        out
    }

    /// The session was ended where this handle cannot hear it: the
    /// extension revoked this origin, ended its sessions and closed the
    /// port, so Core's `Ended` may never arrive. Every awaited operation
    /// rejects with `SESSION_ENDED` and the handle is ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::{SessionStatus, pb};
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// machine.begin_local(pb::OperationKind::SendText).unwrap();
    /// machine.operation_accepted(&pb::OperationAccepted { operation_id: "op-1".into(), ..Default::default() });
    /// machine.ended_elsewhere();
    /// assert_eq!(machine.status(), SessionStatus::Ended);
    /// assert!(!machine.has_operation_in_flight());
    /// ```
    pub fn ended_elsewhere(&mut self) -> Vec<HandleEffect> {
        let mut out = Vec::new();
        if self.status == SessionStatus::Ended {
            return out;
        }
        self.settle_all(ErrorCode::SessionEnded, "the session was ended (the origin was revoked)", &mut out);
        let ctx = self.status_ctx(Source::Sdk, None, 0, None);
        self.change_status(SessionStatus::Ended, ctx, &mut out);
        out
    }

    fn settle_all(&mut self, code: ErrorCode, message: &str, out: &mut Vec<HandleEffect>) {
        self.local_operation = None;
        let mut ids: Vec<OperationId> = self.awaiting.drain().map(|(id, _)| id).collect();
        ids.sort();
        for operation_id in ids {
            let mut error = PedelecError::new(code, message);
            error.details = Some(serde_json::json!({ "operationId": operation_id }));
            out.push(HandleEffect::Settle { operation_id, outcome: Err(error) });
        }
    }

    /// How a recent operation of this session ended, if this handle knows:
    /// from a completion it received or the snapshot's `recent_outcomes`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let failed = pb::Error::new(pedelec_sdk::ErrorCode::CoreRestarted, "Core restarted");
    /// let snapshot = pb::Snapshot {
    ///     status: pb::SessionStatus::Idle as i32,
    ///     recent_outcomes: vec![pb::OperationOutcome { operation_id: "op-1".into(), kind: 2, error: Some(failed), ..Default::default() }],
    ///     ..Default::default()
    /// };
    /// machine.on_event(&event("s", 9, "", Kind::Snapshot(snapshot)), 0, no_handlers);
    /// assert_eq!(machine.outcome("op-1").unwrap().unwrap_err().code, "CORE_RESTARTED");
    /// assert_eq!(machine.outcome("op-2"), None);
    /// ```
    pub fn outcome(&self, operation_id: &str) -> Option<Result<(), PedelecError>> {
        self.known_outcomes.iter().rev().find(|(id, _)| id == operation_id).map(|(_, outcome)| outcome.clone())
    }

    /// The typed answer (JSON text) of an operation that had an output
    /// schema, once: kept from its completion until taken.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::SessionMachine;
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// assert_eq!(machine.take_output("op-1"), None);
    /// ```
    pub fn take_output(&mut self, operation_id: &str) -> Option<String> {
        let index = self.outputs.iter().position(|(id, _)| id == operation_id)?;
        self.outputs.remove(index).map(|(_, json)| json)
    }

    /// Keeps a completion's typed answer for [`SessionMachine::take_output`] (bounded).
    fn keep_output(&mut self, operation_id: &str, json: &str) {
        if json.is_empty() || self.outputs.iter().any(|(id, _)| id == operation_id) {
            return;
        }
        if self.outputs.len() == pedelec_protocol::limits::RECENT_OUTCOMES {
            self.outputs.pop_front();
        }
        self.outputs.push_back((OperationId::new(operation_id.to_owned()), json.to_owned()));
    }

    /// Remembers how an operation ended (bounded, newest last).
    fn know(&mut self, operation_id: &OperationId, outcome: &Result<(), PedelecError>) {
        if self.known_outcomes.iter().any(|(id, _)| id == operation_id) {
            return;
        }
        if self.known_outcomes.len() == pedelec_protocol::limits::RECENT_OUTCOMES {
            self.known_outcomes.pop_front();
        }
        self.known_outcomes.push_back((operation_id.clone(), outcome.clone()));
    }

    /// An SDK-originated error for `onError`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let error = pedelec_sdk::PedelecError::new(pedelec_sdk::ErrorCode::SubmitToolResultFailed, "Core is gone");
    /// let HandleEffect::Error { ctx, .. } = machine.sdk_error(error) else { panic!() };
    /// assert_eq!(ctx.kind, pedelec_sdk::context::EventKind::SdkError);
    /// ```
    pub fn sdk_error(&self, error: PedelecError) -> HandleEffect {
        HandleEffect::Error { error, ctx: self.meta.sdk(EventKind::SdkError, None) }
    }

    /// A handler was registered: queued requests it can answer are released.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let started = Kind::OperationStarted(pb::OperationStarted::default());
    /// machine.on_event(&event("s", 1, "op-1", started), 0, no_handlers);
    /// let call = pb::ToolCall { tool_request_id: "tool-1".into(), tool: "add".into(), ..Default::default() };
    /// machine.on_event(&event("s", 2, "op-1", Kind::ToolCall(call)), 0, no_handlers);
    /// let effects = machine.handler_registered(&|tool| tool == "add");
    /// assert!(matches!(&effects[..], [HandleEffect::InvokeTool { request, .. }] if request.tool == "add"));
    /// assert_eq!(machine.queued_tools().count(), 0);
    /// ```
    pub fn handler_registered(&mut self, has_handler: HasHandler<'_>) -> Vec<HandleEffect> {
        let mut out = Vec::new();
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.queued_tools).into_iter().partition(|(r, _)| has_handler(&r.tool));
        self.queued_tools = waiting;
        for (request, ctx) in ready {
            self.handling.insert(request.tool_request_id.clone());
            out.push(HandleEffect::InvokeTool { request, ctx });
        }
        out
    }

    fn dispatch_tool(
        &mut self,
        request: ToolRequest,
        ctx: ToolCallContext,
        has_handler: HasHandler<'_>,
        out: &mut Vec<HandleEffect>,
    ) {
        let id = &request.tool_request_id;
        if self.handling.contains(id) || self.queued_tools.iter().any(|(r, _)| &r.tool_request_id == id) {
            return;
        }
        if self.status != SessionStatus::WaitingToolResult && self.status.is_active_turn() {
            let sdk = self.status_ctx(Source::Sdk, None, 0, None);
            self.change_status(SessionStatus::WaitingToolResult, sdk, out);
        }
        if has_handler(&request.tool) {
            self.handling.insert(id.clone());
            out.push(HandleEffect::InvokeTool { request, ctx });
        } else {
            self.queued_tools.push((request, ctx));
        }
    }

    /// Feeds one Core event.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::gate::build::event;
    /// use pedelec_sdk::context::SessionMeta;
    /// use pedelec_sdk::machine::{HandleEffect, SessionMachine};
    /// use pedelec_sdk::pb::{self, session_event::Kind};
    ///
    /// let mut machine = SessionMachine::new(SessionMeta::default());
    /// let no_handlers = &|_: &str| false;
    /// let started = Kind::OperationStarted(pb::OperationStarted::default());
    /// machine.on_event(&event("s", 1, "op-1", started), 0, no_handlers);
    /// let delta = event("s", 2, "op-1", Kind::ChatDelta(pb::ChatDelta { text: "Hel".into() }));
    /// let effects = machine.on_event(&delta, 1_000, no_handlers);
    /// let [HandleEffect::ChatDelta { text, ctx }] = &effects[..] else { panic!("one delta") };
    /// assert_eq!((text.as_str(), ctx.event_received_at), ("Hel", Some(1_000)));
    /// // The same event again (a re-sync overlapping the stream) changes nothing.
    /// assert!(machine.on_event(&delta, 1_001, no_handlers).is_empty());
    /// ```
    pub fn on_event(
        &mut self,
        event: &pb::SessionEvent,
        received_at: i64,
        has_handler: HasHandler<'_>,
    ) -> Vec<HandleEffect> {
        let verdict = self.gate.admit(event);
        if verdict != Verdict::Accept {
            tracing::trace!(seq = event.seq, ?verdict, "event ignored by the gate");
            return Vec::new();
        }
        let mut out = Vec::new();
        self.apply(event, received_at, has_handler, &mut out);
        let handled = self.gate.last_seq();
        self.wake_seq_waiters(handled, &mut out);
        out
    }

    /// What one admitted event changes.
    fn apply(
        &mut self,
        event: &pb::SessionEvent,
        received_at: i64,
        has_handler: HasHandler<'_>,
        out: &mut Vec<HandleEffect>,
    ) {
        let turn = event.turn.as_ref();
        let emitted = event.emitted_at_ms;
        let received = Some(received_at);
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::Snapshot(snapshot) => self.adopt_snapshot(snapshot, emitted, received, has_handler, out),
            Kind::StatusChanged(change) => {
                if let Some(status) = SessionStatus::from_pb(change.status) {
                    let ctx = self.status_ctx(Source::Core, turn, emitted, received);
                    self.change_status(status, ctx, out);
                }
            }
            Kind::OperationStarted(_) => {}
            Kind::Chat(chat) if !is_prepare(turn) => out.push(HandleEffect::Chat {
                text: chat.text.clone(),
                ctx: self.meta.core(EventKind::Chat, turn, emitted, received),
            }),
            Kind::ChatDelta(delta) if !is_prepare(turn) => out.push(HandleEffect::ChatDelta {
                text: delta.text.clone(),
                ctx: self.meta.core(EventKind::ChatDelta, turn, emitted, received),
            }),
            Kind::Chat(_) | Kind::ChatDelta(_) => {}
            Kind::ActivityUpdated(updated) if !is_prepare(turn) => {
                if let Some(activity) = &updated.activity {
                    let ctx = self.meta.core(EventKind::Activity, turn, emitted, received);
                    self.remember_activity(activity, &ctx);
                    out.push(HandleEffect::Activity { activity: activity.clone(), ctx });
                }
            }
            Kind::ActivityUpdated(_) => {}
            Kind::PermissionRequested(request) => {
                let ctx = self.meta.core(EventKind::PermissionRequested, turn, emitted, received);
                self.ask_permission(request, ctx, out);
            }
            Kind::PermissionSettled(settled) => {
                self.asking.remove(&settled.permission_id);
            }
            Kind::ToolCall(call) => {
                let request = ToolRequest {
                    tool_request_id: ToolRequestId::new(call.tool_request_id.clone()),
                    tool: call.tool.clone(),
                    args_json: call.args_json.clone(),
                };
                let ctx = self.tool_ctx(&request, turn, emitted, received);
                self.dispatch_tool(request, ctx, has_handler, out);
            }
            Kind::ToolCallSettled(settled) => {
                self.queued_tools.retain(|(r, _)| r.tool_request_id != settled.tool_request_id);
                self.handling.remove(settled.tool_request_id.as_str());
            }
            Kind::UsageUpdated(update) => {
                if let Some(total) = update.usage.and_then(|u| u.total_tokens) {
                    self.grow_usage(total, out);
                }
            }
            Kind::Error(raised) => {
                if let Some(error) = &raised.error {
                    out.push(HandleEffect::Error {
                        error: error.into(),
                        ctx: self.meta.core(EventKind::Error, turn, emitted, received),
                    });
                }
            }
            Kind::OperationCompleted(done) => {
                self.activities.clear();
                // An optimistic `running` left by a start refused while this
                // operation finished ends with it.
                self.revert_local_running(out);
                let outcome = operation_outcome(done.error.as_ref());
                self.keep_output(&event.operation_id, &done.output_json);
                if done.kind == pb::OperationKind::Prepare as i32 && outcome.is_ok() {
                    self.prepared = true;
                }
                self.know(&OperationId::new(event.operation_id.clone()), &outcome);
                if self.awaiting.remove(event.operation_id.as_str()).is_some() {
                    out.push(HandleEffect::Settle {
                        operation_id: OperationId::new(event.operation_id.clone()),
                        outcome,
                    });
                } else {
                    self.complete_early(OperationId::new(event.operation_id.clone()), outcome);
                }
            }
            Kind::Ended(_) => {
                let ctx = self.status_ctx(Source::Core, turn, emitted, received);
                self.change_status(SessionStatus::Ended, ctx, out);
            }
            // Every later event's context names the new effort level.
            Kind::ModelChanged(changed) => {
                self.meta.effort_level = SessionMeta::effort(changed.effort_level).or(self.meta.effort_level);
            }
        }
    }

    fn grow_usage(&mut self, total: u64, out: &mut Vec<HandleEffect>) {
        if pedelec_protocol::usage::grows(self.usage, total) {
            self.usage = Some(total);
            out.push(HandleEffect::Usage { total_tokens: total });
        }
    }

    fn tool_ctx(
        &self,
        request: &ToolRequest,
        turn: Option<&pb::TurnInfo>,
        emitted: i64,
        received: Option<i64>,
    ) -> ToolCallContext {
        ToolCallContext {
            base: self.meta.core(EventKind::ToolCall, turn, emitted, received),
            tool_request_id: request.tool_request_id.to_string(),
            tool: request.tool.clone(),
        }
    }

    /// Keeps the outcome of an operation whose acceptance is still to come (bounded).
    fn complete_early(&mut self, operation_id: OperationId, outcome: Result<(), PedelecError>) {
        if self.completed_early.len() == EARLY_COMPLETIONS {
            self.completed_early.pop_front();
        }
        self.completed_early.push_back((operation_id, outcome));
    }

    fn adopt_snapshot(
        &mut self,
        snapshot: &pb::Snapshot,
        emitted: i64,
        received: Option<i64>,
        has_handler: HasHandler<'_>,
        out: &mut Vec<HandleEffect>,
    ) {
        if self.meta.provider.is_empty() {
            self.meta.provider = snapshot.provider.clone();
        }
        if self.meta.effort_level.is_none() {
            self.meta.effort_level = SessionMeta::effort(snapshot.effort_level);
        }
        self.prepared = snapshot.prepared;
        if let Some(total) = snapshot.usage.and_then(|u| u.total_tokens) {
            self.grow_usage(total, out);
        }
        // What the running turn is doing, for a handle that arrives (or
        // re-synchronises) mid-turn; each carries its whole state, so seeing
        // one again is harmless.
        let pending: HashSet<&str> = snapshot.pending_permissions.iter().map(|p| p.permission_id.as_str()).collect();
        self.asking.retain(|id| pending.contains(id.as_str()));
        for request in &snapshot.pending_permissions {
            let ctx = self.meta.core(EventKind::PermissionRequested, snapshot.turn.as_ref(), emitted, received);
            self.ask_permission(request, ctx, out);
        }
        self.activities.clear();
        if !is_prepare(snapshot.turn.as_ref()) {
            for activity in &snapshot.activities {
                let ctx = self.meta.core(EventKind::Activity, snapshot.turn.as_ref(), emitted, received);
                self.remember_activity(activity, &ctx);
                out.push(HandleEffect::Activity { activity: activity.clone(), ctx });
            }
        }
        // Operations we wait for that Core no longer runs finished while we
        // were not listening: settled from their recorded outcome (a Core
        // restart's CORE_RESTARTED among them); one Core has no outcome for
        // any more is reported as lost.
        let active = snapshot.active_operation.as_ref().map(|a| a.operation_id.as_str());
        let missed: Vec<OperationId> = self.awaiting.keys().filter(|id| Some(id.as_str()) != active).cloned().collect();
        for recorded in &snapshot.recent_outcomes {
            self.keep_output(&recorded.operation_id, &recorded.output_json);
        }
        for operation_id in missed {
            self.awaiting.remove(&operation_id);
            let recorded = snapshot.recent_outcomes.iter().find(|o| operation_id == o.operation_id);
            let outcome = recorded.map(|o| operation_outcome(o.error.as_ref())).unwrap_or_else(|| {
                Err(PedelecError::new(
                    ErrorCode::TransportError,
                    "the operation finished while the subscription was being re-established",
                ))
            });
            out.push(HandleEffect::Settle { operation_id, outcome });
        }
        // An operation whose acceptance we have not processed yet may already
        // be over: keep its outcome for `operation_accepted`.
        for recorded in &snapshot.recent_outcomes {
            let id = OperationId::new(recorded.operation_id.clone());
            self.know(&id, &operation_outcome(recorded.error.as_ref()));
            if !self.completed_early.iter().any(|(id, _)| id == &recorded.operation_id) {
                let id = OperationId::new(recorded.operation_id.clone());
                self.complete_early(id, operation_outcome(recorded.error.as_ref()));
            }
        }
        if let Some(status) = SessionStatus::from_pb(snapshot.status) {
            let ctx = self.status_ctx(Source::Core, snapshot.turn.as_ref(), emitted, received);
            self.change_status(status, ctx, out);
        }
        let pending: HashSet<&str> = snapshot.pending_tools.iter().map(|p| p.tool_request_id.as_str()).collect();
        self.queued_tools.retain(|(r, _)| pending.contains(r.tool_request_id.as_str()));
        self.handling.retain(|id| pending.contains(id.as_str()));
        for call in &snapshot.pending_tools {
            let request = ToolRequest {
                tool_request_id: ToolRequestId::new(call.tool_request_id.clone()),
                tool: call.tool.clone(),
                args_json: call.args_json.clone(),
            };
            let ctx = self.tool_ctx(&request, snapshot.turn.as_ref(), emitted, received);
            self.dispatch_tool(request, ctx, has_handler, out);
        }
    }
}

/// How an operation ended, from its completion's error.
fn operation_outcome(error: Option<&pb::Error>) -> Result<(), PedelecError> {
    match error {
        Some(error) => Err(PedelecError::from(error)),
        None => Ok(()),
    }
}

fn is_prepare(turn: Option<&pb::TurnInfo>) -> bool {
    turn.is_some_and(|t| t.kind == pb::TurnKind::Prepare as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pedelec_protocol::gate::build;

    const NO_HANDLERS: &dyn Fn(&str) -> bool = &|_| false;
    const ALL_HANDLERS: &dyn Fn(&str) -> bool = &|_| true;

    fn machine() -> SessionMachine {
        SessionMachine::new(SessionMeta {
            session_id: "s".into(),
            provider: "scripted".into(),
            effort_level: Some(pb::EffortLevel::Low),
            session_created_at: 1,
        })
    }

    fn turn() -> Option<pb::TurnInfo> {
        Some(pb::TurnInfo { turn_id: "t1".into(), kind: pb::TurnKind::User as i32, started_at_ms: 5 })
    }

    fn ev(seq: u64, op: &str, kind: Kind) -> pb::SessionEvent {
        let mut e = build::event("s", seq, op, kind);
        e.emitted_at_ms = 100 + seq as i64;
        if !op.is_empty() {
            e.turn = turn();
        }
        e
    }

    fn status(seq: u64, op: &str, to: SessionStatus, from: SessionStatus) -> pb::SessionEvent {
        ev(seq, op, build::status(to, from))
    }

    fn started(seq: u64, op: &str) -> pb::SessionEvent {
        ev(seq, op, Kind::OperationStarted(pb::OperationStarted { kind: pb::OperationKind::SendText as i32 }))
    }

    fn completed(seq: u64, op: &str, error: Option<ErrorCode>) -> pb::SessionEvent {
        let error = error.map(|c| pb::Error::new(c, "failed"));
        ev(
            seq,
            op,
            Kind::OperationCompleted(pb::OperationCompleted {
                kind: pb::OperationKind::SendText as i32,
                error,
                ..Default::default()
            }),
        )
    }

    fn accepted(op: &str) -> pb::OperationAccepted {
        pb::OperationAccepted { operation_id: op.into(), kind: pb::OperationKind::SendText as i32, already_done: false }
    }

    fn snapshot(
        last_seq: u64,
        st: SessionStatus,
        op: Option<&str>,
        tools: Vec<pb::PendingToolCall>,
    ) -> pb::SessionEvent {
        ev(
            last_seq,
            "",
            Kind::Snapshot(pb::Snapshot {
                status: st.to_pb() as i32,
                last_seq,
                active_operation: op.map(|id| pb::ActiveOperation { operation_id: id.into(), kind: 2 }),
                pending_tools: tools,
                usage: Some(pb::Usage { total_tokens: None }),
                provider: "scripted".into(),
                ..Default::default()
            }),
        )
    }

    fn statuses(effects: &[HandleEffect]) -> Vec<(SessionStatus, &'static str, &'static str)> {
        effects
            .iter()
            .filter_map(|e| match e {
                HandleEffect::Status { status, ctx } => Some((*status, ctx.source.as_str(), ctx.kind.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Runs a whole send on the machine; returns every effect in order.
    fn feed(m: &mut SessionMachine, events: &[pb::SessionEvent], handlers: HasHandler<'_>) -> Vec<HandleEffect> {
        events.iter().flat_map(|e| m.on_event(e, 1_000, handlers)).collect()
    }

    #[test]
    fn new_handles_begin_idle() {
        assert_eq!(machine().status(), SessionStatus::Idle);
        assert_eq!(machine().usage(), None);
    }

    #[test]
    fn send_sets_running_locally_then_core_running_is_deduplicated() {
        let mut m = machine();
        let local = m.begin_local(pb::OperationKind::SendText).unwrap();
        assert_eq!(statuses(&local), vec![(SessionStatus::Running, "sdk", "sdk_status_changed")]);
        assert_eq!(m.operation_accepted(&accepted("op1")).0, Accepted::Pending);
        let effects = feed(
            &mut m,
            &[started(1, "op1"), status(2, "op1", SessionStatus::Running, SessionStatus::Idle)],
            NO_HANDLERS,
        );
        assert!(statuses(&effects).is_empty(), "core running after sdk running is not a change");
    }

    #[test]
    fn a_turn_resolves_only_on_its_operation_completion_not_on_idle() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = feed(
            &mut m,
            &[started(1, "op1"), status(2, "op1", SessionStatus::Idle, SessionStatus::Running)],
            NO_HANDLERS,
        );
        assert_eq!(statuses(&effects), vec![(SessionStatus::Idle, "core", "status_changed")]);
        assert!(!effects.iter().any(|e| matches!(e, HandleEffect::Settle { .. })), "idle alone settles nothing");
        let effects = feed(&mut m, &[completed(3, "op1", None)], NO_HANDLERS);
        assert_eq!(effects, vec![HandleEffect::Settle { operation_id: "op1".into(), outcome: Ok(()) }]);
    }

    #[test]
    fn a_failed_operation_rejects_with_its_error() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects =
            feed(&mut m, &[started(1, "op1"), completed(2, "op1", Some(ErrorCode::SendTextFailed))], NO_HANDLERS);
        match &effects[..] {
            [HandleEffect::Settle { outcome: Err(e), .. }] => assert!(e.is(ErrorCode::SendTextFailed)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_completion_that_arrives_before_the_operation_id_still_settles() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        feed(&mut m, &[started(1, "op1"), completed(2, "op1", None)], NO_HANDLERS);
        assert_eq!(m.operation_accepted(&accepted("op1")).0, Accepted::Settled(Ok(())));
    }

    #[test]
    fn send_text_is_refused_while_busy_ended_or_in_error() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        assert!(m.begin_local(pb::OperationKind::SendText).unwrap_err().is(ErrorCode::SessionBusy));
        assert!(m.begin_local(pb::OperationKind::Prepare).unwrap_err().is(ErrorCode::SessionBusy));
        let mut m = machine();
        m.local_ended();
        assert!(m.begin_local(pb::OperationKind::SendText).unwrap_err().is(ErrorCode::SessionEnded));
        let mut m = machine();
        feed(&mut m, &[status(1, "", SessionStatus::Error, SessionStatus::Idle)], NO_HANDLERS);
        assert!(m.begin_local(pb::OperationKind::SendText).unwrap_err().is(ErrorCode::SessionError));
    }

    #[test]
    fn a_failed_start_undoes_the_optimistic_running() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        let effects = m.operation_failed_to_start();
        assert_eq!(statuses(&effects), vec![(SessionStatus::Idle, "sdk", "sdk_status_changed")]);
    }

    #[test]
    fn stale_events_are_ignored() {
        let mut m = machine();
        feed(&mut m, &[status(5, "", SessionStatus::Error, SessionStatus::Idle)], NO_HANDLERS);
        let effects = feed(
            &mut m,
            &[
                status(5, "", SessionStatus::Idle, SessionStatus::Error),
                status(4, "", SessionStatus::Idle, SessionStatus::Error),
            ],
            NO_HANDLERS,
        );
        assert!(effects.is_empty());
        assert_eq!(m.status(), SessionStatus::Error);
    }

    #[test]
    fn events_of_another_operation_are_ignored() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = feed(
            &mut m,
            &[
                started(1, "op1"),
                ev(2, "op-other", Kind::Chat(pb::Chat { text: "not mine".into() })),
                completed(3, "op-other", None),
                ev(4, "op1", Kind::Chat(pb::Chat { text: "mine".into() })),
            ],
            NO_HANDLERS,
        );
        let chats: Vec<_> = effects
            .iter()
            .filter_map(|e| if let HandleEffect::Chat { text, .. } = e { Some(text.as_str()) } else { None })
            .collect();
        assert_eq!(chats, vec!["mine"]);
        assert!(!effects.iter().any(|e| matches!(e, HandleEffect::Settle { .. })));
    }

    #[test]
    fn chat_contexts_carry_core_source_received_time_and_turn() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = feed(
            &mut m,
            &[started(1, "op1"), ev(2, "op1", Kind::ChatDelta(pb::ChatDelta { text: "He".into() }))],
            NO_HANDLERS,
        );
        let HandleEffect::ChatDelta { text, ctx } = &effects[0] else { panic!("{effects:?}") };
        assert_eq!(text, "He");
        assert_eq!(ctx.kind, EventKind::ChatDelta);
        assert_eq!(ctx.source, Source::Core);
        assert_eq!(ctx.event_received_at, Some(1_000));
        assert_eq!(ctx.event_emitted_at, 102);
        assert_eq!(ctx.turn_id.as_deref(), Some("t1"));
        assert_eq!(ctx.turn_kind, Some(pb::TurnKind::User));
        assert_eq!(ctx.turn_started_at, Some(5));
        assert_eq!(ctx.effort_level, Some(pb::EffortLevel::Low));
        assert_eq!(ctx.provider, "scripted");
    }

    #[test]
    fn preparation_text_never_reaches_chat() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::Prepare).unwrap();
        let mut e = started(1, "p1");
        e.turn = Some(pb::TurnInfo { turn_id: "tp".into(), kind: pb::TurnKind::Prepare as i32, started_at_ms: 1 });
        let mut chat = ev(2, "p1", Kind::Chat(pb::Chat { text: "PEDELEC_PREPARED".into() }));
        chat.turn = e.turn.clone();
        let effects = feed(&mut m, &[e, chat], NO_HANDLERS);
        assert!(effects.iter().all(|e| !matches!(e, HandleEffect::Chat { .. } | HandleEffect::ChatDelta { .. })));
    }

    #[test]
    fn prepare_already_done_settles_at_once_and_restores_idle() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::Prepare).unwrap();
        let done = pb::OperationAccepted { operation_id: String::new(), kind: 1, already_done: true };
        let (state, effects) = m.operation_accepted(&done);
        assert_eq!(state, Accepted::Settled(Ok(())));
        assert_eq!(statuses(&effects), vec![(SessionStatus::Idle, "sdk", "sdk_status_changed")]);
        assert!(m.prepared());
    }

    #[test]
    fn ended_runs_once_per_transition_and_rejects_pending_operations() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = feed(
            &mut m,
            &[
                started(1, "op1"),
                status(2, "", SessionStatus::Ended, SessionStatus::Running),
                ev(3, "", Kind::Ended(pb::Ended { reason: "requested".into() })),
                ev(4, "", Kind::Ended(pb::Ended { reason: "again".into() })),
            ],
            NO_HANDLERS,
        );
        let ended = effects.iter().filter(|e| matches!(e, HandleEffect::Ended { .. })).count();
        assert_eq!(ended, 1);
        assert!(
            effects.iter().any(
                |e| matches!(e, HandleEffect::Settle { outcome: Err(err), .. } if err.is(ErrorCode::SessionEnded))
            )
        );
        assert!(m.local_ended().is_empty(), "already ended: no second callback");
        // resume: the snapshot says idle, a later end runs the callback again.
        let effects = feed(&mut m, &[snapshot(10, SessionStatus::Idle, None, vec![])], NO_HANDLERS);
        assert_eq!(statuses(&effects), vec![(SessionStatus::Idle, "core", "status_changed")]);
        let effects = m.local_ended();
        assert!(
            matches!(&effects[..], [HandleEffect::Status { .. }, HandleEffect::Ended { ctx }] if ctx.kind == EventKind::SdkEnded && ctx.source == Source::Sdk)
        );
    }

    #[test]
    fn a_snapshot_adopts_core_status_and_active_operation() {
        let mut m = machine();
        let effects = feed(&mut m, &[snapshot(40, SessionStatus::Running, Some("op9"), vec![])], NO_HANDLERS);
        assert_eq!(statuses(&effects), vec![(SessionStatus::Running, "core", "status_changed")]);
        assert_eq!(m.last_seq(), 40);
        let effects = feed(&mut m, &[ev(41, "op9", Kind::Chat(pb::Chat { text: "resumed".into() }))], NO_HANDLERS);
        assert!(matches!(&effects[..], [HandleEffect::Chat { .. }]));
    }

    fn snapshot_with_outcomes(last_seq: u64, outcomes: Vec<pb::OperationOutcome>) -> pb::SessionEvent {
        let mut event = snapshot(last_seq, SessionStatus::Idle, None, vec![]);
        if let Some(Kind::Snapshot(s)) = &mut event.kind {
            s.recent_outcomes = outcomes;
        }
        event
    }

    fn outcome(op: &str, error: Option<ErrorCode>) -> pb::OperationOutcome {
        pb::OperationOutcome {
            operation_id: op.into(),
            kind: pb::OperationKind::SendText as i32,
            error: error.map(|code| pb::Error::new(code, "x")),
            ..Default::default()
        }
    }

    fn settled(effects: &[HandleEffect]) -> Vec<(String, Result<(), &'static str>)> {
        effects
            .iter()
            .filter_map(|e| match e {
                HandleEffect::Settle { operation_id, outcome } => Some((
                    operation_id.to_string(),
                    outcome
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e| ErrorCode::parse(&e.code).map(|c| c.as_str()).unwrap_or("?")),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_detached_rejection_names_its_operation_and_a_later_snapshot_tells_its_outcome() {
        let mut m = machine();
        let _ = m.begin_local(pb::OperationKind::SendText).unwrap();
        let (state, _) = m.operation_accepted(&accepted("op1"));
        assert_eq!(state, Accepted::Pending);
        let effects = m.detached();
        let Some(HandleEffect::Settle { operation_id, outcome: Err(error) }) = effects.first() else {
            panic!("{effects:?}")
        };
        assert_eq!(operation_id, "op1");
        assert!(error.is(ErrorCode::TransportDetached));
        assert_eq!(error.details.as_ref().unwrap()["operationId"], "op1");
        assert_eq!(m.outcome("op1"), None, "not known yet");
        // A fresh handle's machine learns it from the snapshot it attaches with.
        let mut fresh = machine();
        let restarted = pb::OperationOutcome {
            operation_id: "op1".into(),
            kind: 0,
            error: Some(pb::Error::new(ErrorCode::CoreRestarted, "Core restarted")),
            ..Default::default()
        };
        feed(&mut fresh, &[snapshot_with_outcomes(9, vec![restarted])], NO_HANDLERS);
        assert!(fresh.outcome("op1").unwrap().unwrap_err().is(ErrorCode::CoreRestarted));
        assert_eq!(fresh.outcome("op2"), None);
    }

    #[test]
    fn a_session_ended_elsewhere_rejects_what_it_awaited_and_ends_the_handle() {
        let mut m = machine();
        let _ = m.begin_local(pb::OperationKind::SendText).unwrap();
        let _ = m.operation_accepted(&accepted("op1"));
        let effects = m.ended_elsewhere();
        let Some(HandleEffect::Settle { operation_id, outcome: Err(error) }) = effects.first() else {
            panic!("{effects:?}")
        };
        assert_eq!(operation_id, "op1");
        assert!(error.is(ErrorCode::SessionEnded));
        assert_eq!(m.status(), SessionStatus::Ended);
        assert!(m.begin_local(pb::OperationKind::SendText).is_err(), "an ended handle starts nothing");
        assert!(m.ended_elsewhere().is_empty(), "once ended, nothing more happens");
    }

    /// A re-synchronising snapshot settles awaited operations from their
    /// recorded outcomes: the Core restart's CORE_RESTARTED, a success, and
    /// only without a record the old "lost" TRANSPORT_ERROR.
    #[test]
    fn a_snapshot_settles_awaited_operations_from_their_outcomes() {
        let cases = [
            (vec![outcome("op0", None), outcome("op1", Some(ErrorCode::CoreRestarted))], Err("CORE_RESTARTED")),
            (vec![outcome("op1", None)], Ok(())),
            (vec![outcome("op0", None)], Err("TRANSPORT_ERROR")),
        ];
        for (outcomes, expected) in cases {
            let mut m = machine();
            m.begin_local(pb::OperationKind::SendText).unwrap();
            m.operation_accepted(&accepted("op1"));
            let effects = feed(&mut m, &[snapshot_with_outcomes(50, outcomes.clone())], NO_HANDLERS);
            assert_eq!(settled(&effects), vec![("op1".to_string(), expected)], "{outcomes:?}");
        }
    }

    /// An acceptance processed after a snapshot that already holds the
    /// operation's outcome settles at once instead of waiting forever.
    #[test]
    fn an_acceptance_after_a_snapshot_with_its_outcome_settles() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        feed(&mut m, &[snapshot_with_outcomes(50, vec![outcome("op7", Some(ErrorCode::SendTextFailed))])], NO_HANDLERS);
        let (accepted, _) = m.operation_accepted(&accepted("op7"));
        assert!(matches!(&accepted, Accepted::Settled(Err(e)) if e.code == "SEND_TEXT_FAILED"), "{accepted:?}");
    }

    fn tool_call(seq: u64, id: &str, tool: &str) -> pb::SessionEvent {
        ev(
            seq,
            "op1",
            Kind::ToolCall(pb::ToolCall {
                tool_request_id: id.into(),
                tool: tool.into(),
                args_json: "{}".into(),
                deadline_at_ms: 0,
            }),
        )
    }

    #[test]
    fn a_tool_event_sets_waiting_and_invokes_the_handler_once() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = feed(
            &mut m,
            &[started(1, "op1"), tool_call(2, "t1", "counter"), tool_call(3, "t1", "counter")],
            ALL_HANDLERS,
        );
        assert_eq!(statuses(&effects), vec![(SessionStatus::WaitingToolResult, "sdk", "sdk_status_changed")]);
        let invoked: Vec<_> = effects
            .iter()
            .filter_map(|e| if let HandleEffect::InvokeTool { ctx, .. } = e { Some(ctx) } else { None })
            .collect();
        assert_eq!(invoked.len(), 1);
        assert_eq!(invoked[0].kind, EventKind::ToolCall);
        assert_eq!(invoked[0].tool_request_id, "t1");
        assert_eq!(invoked[0].tool, "counter");
    }

    #[test]
    fn a_recovered_tool_call_without_handler_is_queued_until_one_registers() {
        let mut m = machine();
        let pending = pb::PendingToolCall {
            tool_request_id: "t7".into(),
            tool: "counter".into(),
            args_json: "{}".into(),
            ..Default::default()
        };
        let effects = feed(
            &mut m,
            &[snapshot(9, SessionStatus::WaitingToolResult, Some("op1"), vec![pending.clone()])],
            NO_HANDLERS,
        );
        assert!(!effects.iter().any(|e| matches!(e, HandleEffect::InvokeTool { .. })));
        assert_eq!(m.queued_tools().count(), 1);
        assert!(m.handler_registered(&|t| t == "other").is_empty());
        let effects = m.handler_registered(&|t| t == "counter");
        assert!(matches!(&effects[..], [HandleEffect::InvokeTool { request, .. }] if request.tool_request_id == "t7"));
        // The same request in a later snapshot is not invoked twice.
        let effects =
            feed(&mut m, &[snapshot(10, SessionStatus::WaitingToolResult, Some("op1"), vec![pending])], ALL_HANDLERS);
        assert!(!effects.iter().any(|e| matches!(e, HandleEffect::InvokeTool { .. })));
    }

    #[test]
    fn a_settled_tool_call_leaves_the_queue() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        feed(&mut m, &[started(1, "op1"), tool_call(2, "t1", "counter")], NO_HANDLERS);
        assert_eq!(m.queued_tools().count(), 1);
        feed(
            &mut m,
            &[ev(
                3,
                "op1",
                Kind::ToolCallSettled(pb::ToolCallSettled {
                    tool_request_id: "t1".into(),
                    code: "TOOL_TIMEOUT".into(),
                }),
            )],
            NO_HANDLERS,
        );
        assert_eq!(m.queued_tools().count(), 0);
    }

    #[test]
    fn usage_is_absent_until_reported_then_monotonic_and_silent() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let usage = |seq, total| {
            ev(seq, "op1", Kind::UsageUpdated(pb::UsageUpdated { usage: Some(pb::Usage { total_tokens: total }) }))
        };
        let effects = feed(&mut m, &[started(1, "op1"), usage(2, None)], NO_HANDLERS);
        assert!(effects.is_empty());
        assert_eq!(m.usage(), None);
        let effects = feed(&mut m, &[usage(3, Some(50)), usage(4, Some(20)), usage(5, Some(50))], NO_HANDLERS);
        assert_eq!(effects, vec![HandleEffect::Usage { total_tokens: 50 }], "only growth, and only usage effects");
        assert_eq!(m.usage(), Some(50));
        let effects = feed(&mut m, &[snapshot(6, SessionStatus::Running, Some("op1"), vec![])], NO_HANDLERS);
        assert!(effects.is_empty());
        assert_eq!(m.usage(), Some(50), "a snapshot without a total keeps the known one");
    }

    /// A start refused while Core's operation commits its completion (Core
    /// already idle, the operation still active) leaves the handle idle, not
    /// running for ever.
    #[test]
    fn a_start_refused_while_an_operation_finishes_does_not_stick_running() {
        let mut m = machine();
        m.on_event(&snapshot(0, SessionStatus::Idle, None, vec![]), 1, NO_HANDLERS);
        m.on_event(&started(1, "op-x"), 1, NO_HANDLERS);
        m.on_event(&status(2, "op-x", SessionStatus::Running, SessionStatus::Idle), 1, NO_HANDLERS);
        m.on_event(&status(3, "op-x", SessionStatus::Idle, SessionStatus::Running), 1, NO_HANDLERS);
        m.begin_local(pb::OperationKind::SendText).expect("idle as far as the handle knows");
        assert_eq!(m.status(), SessionStatus::Running);
        // Core refuses: op-x is still committing its completion.
        m.operation_failed_to_start();
        assert_eq!(m.status(), SessionStatus::Idle, "back to what Core said");
        m.on_event(&completed(4, "op-x", None), 1, NO_HANDLERS);
        assert_eq!(m.status(), SessionStatus::Idle);
        assert!(m.begin_local(pb::OperationKind::SendText).is_ok(), "the next start may go");
        // While Core's own turn runs, a refused start stays running until Core says otherwise.
        m.operation_failed_to_start();
        m.on_event(&started(5, "op-y"), 1, NO_HANDLERS);
        m.on_event(&status(6, "op-y", SessionStatus::Running, SessionStatus::Idle), 1, NO_HANDLERS);
        m.begin_local(pb::OperationKind::SendText).unwrap_err();
        assert_eq!(m.status(), SessionStatus::Running, "Core's turn runs");
    }

    #[test]
    fn errors_do_not_change_status() {
        let mut m = machine();
        let raised =
            ev(1, "", Kind::Error(pb::ErrorRaised { error: Some(pb::Error::new(ErrorCode::ProviderError, "x")) }));
        let effects = feed(&mut m, &[raised], NO_HANDLERS);
        assert!(
            matches!(&effects[..], [HandleEffect::Error { ctx, .. }] if ctx.kind == EventKind::Error && ctx.source == Source::Core)
        );
        assert_eq!(m.status(), SessionStatus::Idle);
        let HandleEffect::Error { ctx, .. } = m.sdk_error(PedelecError::new(ErrorCode::SubmitToolResultFailed, "x"))
        else {
            panic!()
        };
        assert_eq!((ctx.kind, ctx.source, ctx.event_received_at), (EventKind::SdkError, Source::Sdk, None));
    }

    #[test]
    fn detaching_rejects_what_is_in_flight() {
        let mut m = machine();
        m.begin_local(pb::OperationKind::SendText).unwrap();
        m.operation_accepted(&accepted("op1"));
        let effects = m.detached();
        assert!(
            matches!(&effects[..], [HandleEffect::Settle { outcome: Err(e), .. }] if e.is(ErrorCode::TransportDetached))
        );
    }

    #[test]
    fn a_seq_waiter_wakes_once_its_seq_is_handled_or_a_snapshot_passes_it() {
        let mut m = machine();
        let first = m.wait_for_seq(3).unwrap();
        let second = m.wait_for_seq(12).unwrap();
        let effects = feed(&mut m, &[started(1, "op1"), started(3, "op1")], NO_HANDLERS);
        assert_eq!(effects, vec![HandleEffect::Wake { waiter: first }]);
        let effects = feed(&mut m, &[snapshot(20, SessionStatus::Idle, None, vec![])], NO_HANDLERS);
        assert_eq!(effects.last(), Some(&HandleEffect::Wake { waiter: second }));
        assert_eq!(m.wait_for_seq(20), None, "handled already");
    }

    #[test]
    fn detaching_wakes_seq_waiters_and_refuses_new_ones_until_attached() {
        let mut m = machine();
        let waiter = m.wait_for_seq(5).unwrap();
        assert!(m.detached().contains(&HandleEffect::Wake { waiter }));
        assert_eq!(m.wait_for_seq(6), None, "detached: nothing will come");
        m.attached();
        assert!(m.wait_for_seq(6).is_some());
    }

    #[test]
    fn start_waiters_wake_after_the_answer_whatever_it_is() {
        let mut m = machine();
        assert_eq!(m.wait_for_start(), None, "nothing starting");
        m.begin_local(pb::OperationKind::SendText).unwrap();
        let waiter = m.wait_for_start().unwrap();
        let effects = m.operation_failed_to_start();
        assert_eq!(effects.last(), Some(&HandleEffect::Wake { waiter }));
        m.begin_local(pb::OperationKind::SendText).unwrap();
        let waiter = m.wait_for_start().unwrap();
        let (_, effects) = m.operation_accepted(&accepted("op1"));
        assert_eq!(effects, vec![HandleEffect::Wake { waiter }]);
    }
}
