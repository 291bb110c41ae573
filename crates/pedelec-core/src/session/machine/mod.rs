//! The session machine: every rule of one session, and no I/O.
//!
//! [`SessionState`] is fed what happens — a client starts or ends an
//! operation, a provider reports text, usage or a tool call, the application
//! answers a tool, a write became durable, a timer fired — together with the
//! time ([`Now`]), and answers with [`Effect`]s for the shell to carry out:
//! events to fan out, transcript entries and records to write, tool answers
//! to deliver, a turn to stop, a timer to arm. It never waits, sleeps or
//! touches a socket, a file or a runtime, so its rules are unit-tested
//! directly (`session::tests`), the way the SDK's `machine` is.
//!
//! The rules are split by what they govern: `operation` (starting,
//! running and completing preparations and user turns), `broker` (frontend
//! tool calls) and `lifecycle` (restore, end, resume, auto-end); this module
//! holds the state, its record and snapshot, and event numbering.
//!
//! Two-step operations model the waits the shell does in between:
//! [`SessionState::begin`] records an operation, the shell makes it durable,
//! then [`SessionState::announce`] (or [`SessionState::announce_failed`]);
//! [`SessionState::finish`] settles a turn, the shell commits the completion,
//! then [`SessionState::completion_committed`] announces it.

mod broker;
mod lifecycle;
mod operation;
mod permission;

pub use operation::check_text_size;
pub use permission::Answerer;

use crate::providers::PermissionAnswer;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::prepare::PrepareStart;
use pedelec_protocol::{OperationId, SessionId, SessionStatus, ToolRequestId, limits};

use super::outcome::{completed, outcome, turn_error};
use crate::error::CoreError;
use crate::providers::ProviderFailure;
use crate::store::SessionRecord;
use crate::transcript::{
    AgentActivity, Body, Chat, Completion, Ended, EntryBody, EntryKind, Prepare, Resumed, ToolCall, ToolFailed,
    ToolResult, TranscriptEntry, UserText,
};

/// How far ahead of the emitted `seq` the stored ceiling is moved, so that
/// numbering survives a crash without a disk write per event.
pub const SEQ_RESERVATION: u64 = 4096;

/// The most hidden preparation text kept for the acknowledgement check; an
/// acknowledgement is at most [`pedelec_protocol::prepare::MAX_ANSWER_CHARS`].
const MAX_HIDDEN_BYTES: usize = 16 * 1024;

/// The most streamed text kept for an interrupted message (the same bound
/// as one user text).
const MAX_STREAMED_BYTES: usize = limits::MAX_TEXT_BYTES;

/// The time an input happens at: a monotonic instant for durations and the
/// wall clock for the `*_at_ms` fields.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub instant: Instant,
    pub epoch_ms: i64,
}

impl Now {
    pub fn current() -> Now {
        Now { instant: Instant::now(), epoch_ms: crate::clock::now_ms() }
    }

    /// The same clock `by` later.
    pub fn later(self, by: Duration) -> Now {
        Now { instant: self.instant + by, epoch_ms: self.epoch_ms + by.as_millis() as i64 }
    }
}

/// What the shell must do, in order.
#[derive(Debug)]
pub enum Effect {
    /// Send a numbered event to every subscriber.
    Emit(pb::SessionEvent),
    /// Append a transcript entry (queued; durable with the next commit).
    Append(TranscriptEntry),
    /// Write the session's record (queued).
    Save(SessionRecord),
    /// Deliver the answer to a tool call's waiting agent.
    AnswerTool { request: ToolRequestId, answer: Result<String, pb::Error> },
    /// Stop the task running this operation's turn.
    StopTurn(OperationId),
    /// Ask this operation's turn to stop (its provider winds down: ACP
    /// `session/cancel`, a CLI's process ended, a stream dropped); the turn
    /// then finishes as usual and its outcome is `OPERATION_CANCELLED`.
    CancelTurn(OperationId),
    /// Deliver the answer to a permission request's waiting agent.
    AnswerPermission { permission_id: String, answer: PermissionAnswer },
    /// End the session unless someone subscribes before the grace runs out
    /// ([`SessionState::disconnect_due`] with this epoch decides).
    ArmDisconnectTimer { epoch: u64 },
}

/// What never changes for a session.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: SessionId,
    pub origin: String,
    pub info: pb::SessionInfo,
    pub workspace: String,
    pub managed_workspace: bool,
    pub tool_token_digest: crate::tool_token::ToolTokenDigest,
    /// The parent's provider conversation a forked session continues a
    /// copy of (`SessionRecord::fork_of`).
    pub fork_of: Option<String>,
}

/// Where the active operation is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Recorded; not yet durable, not announced.
    Recorded,
    /// Announced: its turn runs.
    Running,
    /// Its turn ended with this outcome, which is being committed; it is
    /// announced ([`SessionState::completion_committed`]) only once durable,
    /// together with the status the session then moves to. Until then the
    /// status stays as the turn left it: a client told `idle` must find the
    /// operation released, so the status may not change before it is.
    Finishing(pb::OperationOutcome, SessionStatus),
}

#[derive(Debug)]
struct Active {
    id: OperationId,
    kind: pb::OperationKind,
    turn: pb::TurnInfo,
    phase: Phase,
    /// Time spent in `waiting_tool_result`, which the turn timeout does not
    /// count (a tool's own timeout may be longer).
    tool_wait: Duration,
    /// Since when the turn waits for a tool result, while it does.
    waiting_since: Option<Instant>,
    /// A preparation's text, kept for the acknowledgement check and never emitted.
    hidden: String,
    /// `Cancel` asked this operation to stop.
    cancelled: bool,
    /// A user turn's text streamed since its last complete message (at most
    /// [`MAX_STREAMED_BYTES`]): kept as an interrupted message if the turn
    /// is cancelled before the message completes.
    streamed: String,
    /// The turn's agent activities, oldest first, each with whether it is
    /// in the transcript yet.
    activities: Vec<(pb::Activity, bool)>,
    /// A turn with an output schema: its last complete message so far
    /// (what Core reads as the answer). `None` for a plain turn.
    answer: Option<String>,
    /// The answer as JSON once it matched the schema, for the completion.
    output: Option<String>,
    /// The agent called a frontend tool or asked permission in this turn.
    called_out: bool,
}

#[derive(Debug)]
struct Pending {
    call: pb::PendingToolCall,
    operation: OperationId,
}

/// An operation that [`SessionState::begin`] recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Begun {
    pub operation: OperationId,
    pub kind: pb::OperationKind,
    pub turn_kind: pb::TurnKind,
    pub text: String,
}

/// What a start request gets.
#[derive(Debug, PartialEq)]
pub enum Start {
    /// A new operation: make it durable, then [`SessionState::announce`] it.
    New(Begun),
    /// Nothing new to run: the answer as is (a preparation already under way
    /// or already done).
    Existing(pb::OperationAccepted),
}

/// A frontend tool call the machine registered.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallStarted {
    pub request: ToolRequestId,
    pub operation: OperationId,
    pub timeout: Duration,
}

pub fn accepted(operation: &OperationId, kind: pb::OperationKind, already_done: bool) -> pb::OperationAccepted {
    pb::OperationAccepted { operation_id: operation.to_string(), kind: kind as i32, already_done }
}

/// One session's state.
#[derive(Debug)]
pub struct SessionState {
    identity: Identity,
    status: SessionStatus,
    seq: u64,
    seq_ceiling: u64,
    active: Option<Active>,
    pending: Vec<Pending>,
    /// Permission requests awaiting the application.
    permissions: Vec<permission::PendingPermission>,
    usage: Option<u64>,
    prepared: bool,
    provider_session_id: Option<String>,
    /// How the last operations ended, oldest first (`Snapshot.recent_outcomes`).
    outcomes: VecDeque<pb::OperationOutcome>,
    /// Bumped whenever a subscriber arrives or a disconnect timer is armed,
    /// so a timer that fires knows whether it is still the latest.
    disconnect_epoch: u64,
    /// When the newest event was emitted (the creation time before any).
    last_event_at_ms: i64,
}

impl SessionState {
    /// A new, idle session.
    pub fn new(identity: Identity) -> Self {
        SessionState {
            last_event_at_ms: identity.info.created_at_ms,
            identity,
            status: SessionStatus::Idle,
            seq: 0,
            seq_ceiling: 0,
            active: None,
            pending: Vec::new(),
            permissions: Vec::new(),
            usage: None,
            prepared: false,
            provider_session_id: None,
            outcomes: VecDeque::new(),
            disconnect_epoch: 0,
        }
    }

    pub fn id(&self) -> &SessionId {
        &self.identity.id
    }

    pub fn status(&self) -> SessionStatus {
        self.status
    }

    pub fn usage(&self) -> Option<u64> {
        self.usage
    }

    pub fn prepared(&self) -> bool {
        self.prepared
    }

    pub fn provider_session_id(&self) -> Option<&str> {
        self.provider_session_id.as_deref()
    }

    pub fn last_seq(&self) -> u64 {
        self.seq
    }

    /// What `ListSessions` shows of this session.
    pub fn summary(&self) -> pb::SessionSummary {
        pb::SessionSummary {
            session: Some(self.identity.info.clone()),
            status: self.status.to_pb() as i32,
            last_activity_at_ms: self.last_event_at_ms,
        }
    }

    /// Whether `Cancel` asked `operation` to stop (the shell checks when it
    /// registers the turn's cancellation, which may come after the request).
    pub fn cancel_requested(&self, operation: &OperationId) -> bool {
        self.active.as_ref().is_some_and(|a| a.id == *operation && a.cancelled)
    }

    /// The durable record of the current state. An operation whose
    /// completion is being committed is no longer active in it: its
    /// `operation_completed` entry was queued before.
    pub fn record(&self) -> SessionRecord {
        let id = &self.identity;
        SessionRecord {
            id: id.id.clone(),
            origin: id.origin.clone(),
            provider: id.info.provider.clone(),
            model: id.info.model.clone(),
            effort_level: id.info.effort_level(),
            created_at_ms: id.info.created_at_ms,
            workspace: id.workspace.clone(),
            managed_workspace: id.managed_workspace,
            auto_end_on_disconnect: id.info.auto_end_on_disconnect,
            permission_mode: id.info.permission_mode(),
            status: self.status,
            provider_session_id: self.provider_session_id.clone(),
            prepared: self.prepared,
            usage_total: self.usage,
            seq_ceiling: self.seq_ceiling.max(self.seq),
            tool_token_digest: id.tool_token_digest.clone(),
            active_operation: self
                .active
                .as_ref()
                .filter(|a| !matches!(a.phase, Phase::Finishing(..)))
                .map(|a| a.id.as_str().to_owned()),
            skills_json: None,
            fork_of: id.fork_of.clone(),
            forked_from: id.info.forked_from.clone(),
            recent_outcomes: Vec::new(),
            transcript_bytes: 0,
            updated_at_ms: 0,
        }
    }

    /// The snapshot a new subscriber starts with, numbered with the last seq.
    pub fn snapshot(&self, now: Now) -> pb::SessionEvent {
        let info = &self.identity.info;
        let snapshot = pb::Snapshot {
            status: self.status.to_pb() as i32,
            active_operation: self
                .active
                .as_ref()
                .map(|a| pb::ActiveOperation { operation_id: a.id.as_str().to_owned(), kind: a.kind as i32 }),
            turn: self.active.as_ref().map(|a| a.turn.clone()),
            pending_tools: self.pending.iter().map(|p| p.call.clone()).collect(),
            pending_permissions: self.permissions.iter().map(|p| p.request.clone()).collect(),
            usage: Some(pb::Usage { total_tokens: self.usage }),
            last_seq: self.seq,
            provider: info.provider.clone(),
            model: info.model.clone(),
            effort_level: info.effort_level,
            prepared: self.prepared,
            created_at_ms: info.created_at_ms,
            activities: self
                .active
                .as_ref()
                .map(|a| a.activities.iter().map(|(activity, _)| activity.clone()).collect())
                .unwrap_or_default(),
            recent_outcomes: self.outcomes.iter().cloned().collect(),
        };
        pb::SessionEvent {
            session_id: self.identity.id.as_str().to_owned(),
            seq: self.seq,
            emitted_at_ms: now.epoch_ms,
            turn: snapshot.turn.clone(),
            operation_id: String::new(),
            kind: Some(Kind::Snapshot(snapshot)),
        }
    }

    /// The active operation's time in tool waits so far, the current one included.
    pub fn tool_wait_so_far(&self, now: Instant) -> Duration {
        self.active.as_ref().map_or(Duration::ZERO, |a| {
            a.tool_wait + a.waiting_since.map(|since| now.saturating_duration_since(since)).unwrap_or_default()
        })
    }

    // ---- helpers -----------------------------------------------------------

    /// Remembers an operation's outcome for later snapshots (bounded).
    fn remember(&mut self, outcome: pb::OperationOutcome) {
        if self.outcomes.len() == limits::RECENT_OUTCOMES {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(outcome);
    }

    fn append<B: Body>(&self, body: &B, now: Now, out: &mut Vec<Effect>) {
        self.append_encoded(body.encode(), now, out);
    }

    /// Appends an entry encoded before (while what it borrows was still there).
    fn append_encoded(&self, (kind, body): (EntryKind, EntryBody), now: Now, out: &mut Vec<Effect>) {
        out.push(Effect::Append(TranscriptEntry { seq: self.seq, at_ms: now.epoch_ms, kind, body }));
    }

    /// Numbers an event for every subscriber; moves the stored ceiling ahead
    /// when numbering reaches it.
    fn emit(&mut self, operation: &str, kind: Kind, now: Now, out: &mut Vec<Effect>) {
        self.seq += 1;
        self.last_event_at_ms = now.epoch_ms;
        if self.seq > self.seq_ceiling {
            self.seq_ceiling = self.seq + SEQ_RESERVATION;
            out.push(Effect::Save(self.record()));
        }
        out.push(Effect::Emit(pb::SessionEvent {
            session_id: self.identity.id.as_str().to_owned(),
            seq: self.seq,
            emitted_at_ms: now.epoch_ms,
            turn: self.active.as_ref().map(|a| a.turn.clone()),
            operation_id: operation.to_owned(),
            kind: Some(kind),
        }));
    }

    fn set_status(&mut self, next: SessionStatus, operation: &str, now: Now, out: &mut Vec<Effect>) {
        if self.status == next {
            return;
        }
        if let Err(illegal) = self.status.transition(next) {
            // Every caller above moves only along legal edges; a bug here
            // must not corrupt the status clients see.
            tracing::warn!(session = %self.identity.id, %illegal, "refusing a status change");
            return;
        }
        if let Some(active) = self.active.as_mut() {
            if next == SessionStatus::WaitingToolResult {
                active.waiting_since = Some(now.instant);
            } else if let Some(since) = active.waiting_since.take() {
                active.tool_wait += now.instant.saturating_duration_since(since);
            }
        }
        let previous = self.status;
        self.status = next;
        self.emit(operation, pedelec_protocol::gate::build::status(next, previous), now, out);
    }
}
