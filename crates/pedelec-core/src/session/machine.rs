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
//! Two-step operations model the waits the shell does in between:
//! [`SessionState::begin`] records an operation, the shell makes it durable,
//! then [`SessionState::announce`] (or [`SessionState::announce_failed`]);
//! [`SessionState::finish`] settles a turn, the shell commits the completion,
//! then [`SessionState::completion_committed`] announces it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::prepare::PrepareStart;
use pedelec_protocol::{ErrorCode, OperationId, SessionId, SessionStatus, ToolRequestId, TurnId, limits};

use super::outcome::{completed, completion_entry, outcome, outcome_from_entry, turn_error};
use crate::error::CoreError;
use crate::providers::ProviderFailure;
use crate::store::{SessionRecord, TranscriptEntry};

/// How far ahead of the emitted `seq` the stored ceiling is moved, so that
/// numbering survives a crash without a disk write per event.
pub const SEQ_RESERVATION: u64 = 4096;

/// The most hidden preparation text kept for the acknowledgement check; an
/// acknowledgement is at most [`pedelec_protocol::prepare::MAX_ANSWER_CHARS`].
const MAX_HIDDEN_BYTES: usize = 16 * 1024;

/// The time an input happens at: a monotonic instant for durations and the
/// wall clock for the `*_at_ms` fields.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub instant: Instant,
    pub epoch_ms: i64,
}

impl Now {
    pub fn current() -> Now {
        Now { instant: Instant::now(), epoch_ms: super::now_ms() }
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
    pub tool_token: String,
}

/// Where the active operation is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Recorded; not yet durable, not announced.
    Recorded,
    /// Announced: its turn runs.
    Running,
    /// Its turn ended with this outcome, which is being committed; it is
    /// announced ([`SessionState::completion_committed`]) only once durable.
    Finishing(pb::OperationOutcome),
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
    usage: Option<u64>,
    prepared: bool,
    provider_session_id: Option<String>,
    /// How the last operations ended, oldest first (`Snapshot.recent_outcomes`).
    outcomes: VecDeque<pb::OperationOutcome>,
    /// Bumped whenever a subscriber arrives or a disconnect timer is armed,
    /// so a timer that fires knows whether it is still the latest.
    disconnect_epoch: u64,
}

impl SessionState {
    /// A new, idle session.
    pub fn new(identity: Identity) -> Self {
        SessionState {
            identity,
            status: SessionStatus::Idle,
            seq: 0,
            seq_ceiling: 0,
            active: None,
            pending: Vec::new(),
            usage: None,
            prepared: false,
            provider_session_id: None,
            outcomes: VecDeque::new(),
            disconnect_epoch: 0,
        }
    }

    /// A stored session brought back after Core stopped. An operation that
    /// was running then ends with `CORE_RESTARTED`: the error and the
    /// outcome are recorded (the outcome is in every later snapshot's
    /// `recent_outcomes`) and the session is idle again.
    pub fn restore(identity: Identity, record: &SessionRecord, now: Now) -> (Self, Vec<Effect>) {
        let mut st = SessionState::new(identity);
        st.status = SessionStatus::parse(&record.status).unwrap_or(SessionStatus::Idle);
        st.seq = record.seq_ceiling;
        st.seq_ceiling = record.seq_ceiling;
        st.usage = record.usage_total;
        st.prepared = record.prepared;
        st.provider_session_id = record.provider_session_id.clone();
        for outcome in record.recent_outcomes.iter().filter_map(outcome_from_entry) {
            st.remember(outcome);
        }
        let mut out = Vec::new();
        if let Some(op) = &record.active_operation {
            let error = pb::Error::new(ErrorCode::CoreRestarted, "Core restarted while this operation ran");
            st.emit("", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }), now, &mut out);
            // The kind of the interrupted operation is not recorded; the id is what clients match.
            let outcome = pb::OperationOutcome { operation_id: op.clone(), kind: 0, error: Some(error) };
            st.append("operation_completed", completion_entry(&outcome), now, &mut out);
            st.remember(outcome);
            if st.status == SessionStatus::WaitingToolResult {
                st.set_status(SessionStatus::Running, "", now, &mut out);
            }
            if st.status == SessionStatus::Running {
                st.set_status(SessionStatus::Idle, "", now, &mut out);
            }
            out.push(Effect::Save(st.record()));
        }
        (st, out)
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

    /// The durable record of the current state. An operation whose
    /// completion is being committed is no longer active in it: its
    /// `operation_completed` entry was queued before.
    pub fn record(&self) -> SessionRecord {
        let id = &self.identity;
        SessionRecord {
            id: id.id.as_str().to_owned(),
            origin: id.origin.clone(),
            provider: id.info.provider.clone(),
            model: id.info.model.clone(),
            effort_level: id.info.effort_level,
            created_at_ms: id.info.created_at_ms,
            workspace: id.workspace.clone(),
            managed_workspace: id.managed_workspace,
            auto_end_on_disconnect: id.info.auto_end_on_disconnect,
            status: self.status.as_str().to_owned(),
            provider_session_id: self.provider_session_id.clone(),
            prepared: self.prepared,
            usage_total: self.usage,
            seq_ceiling: self.seq_ceiling.max(self.seq),
            tool_token: id.tool_token.clone(),
            active_operation: self
                .active
                .as_ref()
                .filter(|a| !matches!(a.phase, Phase::Finishing(_)))
                .map(|a| a.id.as_str().to_owned()),
            recent_outcomes: Vec::new(),
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
            usage: Some(pb::Usage { total_tokens: self.usage }),
            last_seq: self.seq,
            provider: info.provider.clone(),
            model: info.model.clone(),
            effort_level: info.effort_level,
            prepared: self.prepared,
            created_at_ms: info.created_at_ms,
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

    // ---- operations ------------------------------------------------------

    /// A client asks to start an operation: `SendText` with `text`, or
    /// `Prepare` (whose text is the preparation prompt). Refused with the
    /// seed's codes (`TEXT_TOO_LARGE`, `SESSION_ENDED`, `SESSION_ERROR`,
    /// `SESSION_BUSY`) without any change; a preparation is idempotent (the
    /// one under way is returned, or `already_done` once prepared). A new
    /// operation is recorded (transcript and record) but not announced.
    pub fn begin(
        &mut self,
        kind: pb::OperationKind,
        text: String,
        ids: (OperationId, TurnId),
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<Start, CoreError> {
        if kind == pb::OperationKind::Prepare {
            if self.status == SessionStatus::Ended {
                return Err(CoreError::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            let preparing = self.active.as_ref().filter(|a| a.kind == pb::OperationKind::Prepare);
            match pedelec_protocol::prepare::start(self.prepared, preparing.is_some()) {
                PrepareStart::Join => {
                    let id = preparing.map(|a| a.id.clone()).unwrap_or_default();
                    return Ok(Start::Existing(accepted(&id, pb::OperationKind::Prepare, false)));
                }
                PrepareStart::AlreadyDone => {
                    return Ok(Start::Existing(accepted(&OperationId::default(), pb::OperationKind::Prepare, true)));
                }
                PrepareStart::Start => {}
            }
        } else if text.len() > limits::MAX_TEXT_BYTES {
            return Err(CoreError::with_details(
                ErrorCode::TextTooLarge,
                format!("text of {} bytes exceeds the {}-byte limit", text.len(), limits::MAX_TEXT_BYTES),
                serde_json::json!({ "limit": limits::MAX_TEXT_BYTES }),
            ));
        }
        if let Some((code, message)) = self.status.refuse_start(self.active.is_some()) {
            return Err(CoreError::new(code, message));
        }
        let (operation, turn_id) = ids;
        let turn_kind = if kind == pb::OperationKind::Prepare { pb::TurnKind::Prepare } else { pb::TurnKind::User };
        let turn = pb::TurnInfo { turn_id: turn_id.into_string(), kind: turn_kind as i32, started_at_ms: now.epoch_ms };
        self.active = Some(Active {
            id: operation.clone(),
            kind,
            turn,
            phase: Phase::Recorded,
            tool_wait: Duration::ZERO,
            waiting_since: None,
            hidden: String::new(),
        });
        let entry = if kind == pb::OperationKind::Prepare { "prepare" } else { "user_text" };
        self.append(entry, serde_json::json!({ "operation_id": operation, "text": text }), now, out);
        out.push(Effect::Save(self.record()));
        Ok(Start::New(Begun { operation, kind, turn_kind, text }))
    }

    /// The recorded operation is durable: it is announced and its turn may
    /// run. `SESSION_ENDED` when the session ended in the meantime (which
    /// settled the operation).
    pub fn announce(&mut self, operation: &OperationId, now: Now, out: &mut Vec<Effect>) -> Result<(), CoreError> {
        let Some(active) = self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Recorded) else {
            return Err(CoreError::new(ErrorCode::SessionEnded, "the session ended"));
        };
        active.phase = Phase::Running;
        let kind = active.kind;
        self.emit(operation.as_str(), Kind::OperationStarted(pb::OperationStarted { kind: kind as i32 }), now, out);
        self.set_status(SessionStatus::Running, operation.as_str(), now, out);
        Ok(())
    }

    /// The recorded operation could not be made durable. It was never
    /// announced, so nobody awaits it (the start request fails with
    /// `error`); the session must not stay busy with an operation that no
    /// turn runs.
    pub fn announce_failed(&mut self, operation: &OperationId, error: pb::Error, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.active.take_if(|a| a.id == *operation && a.phase == Phase::Recorded) else {
            return;
        };
        let outcome = outcome(operation, active.kind, Some(error));
        self.append("operation_completed", completion_entry(&outcome), now, out);
        self.remember(outcome);
        out.push(Effect::Save(self.record()));
    }

    /// Whether `operation`'s turn is the one running (the only one whose
    /// provider output counts).
    fn running(&self, operation: &OperationId) -> Option<&Active> {
        self.active.as_ref().filter(|a| a.id == *operation && a.phase == Phase::Running)
    }

    /// A fragment of assistant text. Never emitted for a preparation.
    pub fn delta(&mut self, operation: &OperationId, text: &str, now: Now, out: &mut Vec<Effect>) {
        if self.running(operation).is_some_and(|a| a.kind != pb::OperationKind::Prepare) {
            self.emit(operation.as_str(), Kind::ChatDelta(pb::ChatDelta { text: text.to_owned() }), now, out);
        }
    }

    /// A complete assistant message: emitted and kept in the transcript; a
    /// preparation's is kept aside for the acknowledgement check instead.
    pub fn message(&mut self, operation: &OperationId, text: &str, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Running) else {
            return;
        };
        if active.kind == pb::OperationKind::Prepare {
            if active.hidden.len() + text.len() <= MAX_HIDDEN_BYTES {
                active.hidden.push_str(text);
            }
            return;
        }
        // Recorded after its event, so the entry carries the event's seq
        // (what GetHistory's after_seq compares against).
        self.emit(operation.as_str(), Kind::Chat(pb::Chat { text: text.to_owned() }), now, out);
        self.append("chat", serde_json::json!({ "operation_id": operation, "text": text }), now, out);
    }

    /// The provider's cumulative total; announced only when it grows.
    pub fn usage_reported(&mut self, operation: &OperationId, total: u64, now: Now, out: &mut Vec<Effect>) {
        if self.running(operation).is_some() && pedelec_protocol::usage::grows(self.usage, total) {
            self.usage = Some(total);
            let usage = Some(pb::Usage { total_tokens: Some(total) });
            self.emit(operation.as_str(), Kind::UsageUpdated(pb::UsageUpdated { usage }), now, out);
        }
    }

    /// The provider's own session identity, for continuing its thread later.
    pub fn provider_session(&mut self, operation: &OperationId, id: &str) {
        if self.running(operation).is_some() && self.provider_session_id.as_deref() != Some(id) {
            self.provider_session_id = Some(id.to_owned());
        }
    }

    /// Agent-side work (a command, an edit): kept in the transcript.
    pub fn activity(&mut self, operation: &OperationId, kind: &str, summary: &str, now: Now, out: &mut Vec<Effect>) {
        if self.running(operation).is_some() {
            let body = serde_json::json!({ "operation_id": operation, "kind": kind, "summary": summary });
            self.append("agent_activity", body, now, out);
        }
    }

    /// The agent could not call the frontend tool `tool`: the application
    /// hears of it as a `TOOL_CALL_FAILED` error (the reason clipped to 500 characters).
    pub fn tool_failed(&mut self, operation: &OperationId, tool: &str, reason: &str, now: Now, out: &mut Vec<Effect>) {
        if self.running(operation).is_none() {
            return;
        }
        let reason: String = reason.chars().take(500).collect();
        let details = serde_json::json!({ "tool": tool, "reason": reason });
        let error = pb::Error::with_details(
            ErrorCode::ToolCallFailed,
            format!("the agent could not call {tool}: {reason}"),
            &details,
        );
        self.emit(operation.as_str(), Kind::Error(pb::ErrorRaised { error: Some(error) }), now, out);
        let body = serde_json::json!({ "operation_id": operation, "tool": tool, "reason": reason });
        self.append("tool_failed", body, now, out);
    }

    // ---- the tool broker -------------------------------------------------

    /// The agent calls frontend tool `tool` during `operation` (`None`:
    /// whichever runs, as for external agents over the MCP bridge). `check`
    /// validates the call against the manifest and gives the tool's timeout.
    /// Only while a turn runs — not before it is announced (the client would
    /// drop a call of an operation it has not seen start) and not while its
    /// completion is committed.
    #[allow(clippy::too_many_arguments)]
    pub fn call_tool(
        &mut self,
        operation: Option<&OperationId>,
        tool: &str,
        args_json: String,
        check: impl FnOnce(&str, &str) -> Result<Duration, pb::Error>,
        request: ToolRequestId,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<ToolCallStarted, pb::Error> {
        if args_json.len() > limits::MAX_TOOL_JSON_BYTES {
            return Err(pb::Error::new(ErrorCode::ToolArgsInvalid, "tool arguments exceed the size limit"));
        }
        if self.status == SessionStatus::Ended {
            return Err(pb::Error::new(ErrorCode::SessionEnded, "the session has ended"));
        }
        let turn_running = self.status.is_active_turn();
        let Some(active) = self
            .active
            .as_ref()
            .filter(|a| turn_running && a.phase == Phase::Running && operation.is_none_or(|wanted| a.id == *wanted))
        else {
            return Err(pb::Error::new(ErrorCode::SessionBusy, "no turn is active to call a tool from"));
        };
        let timeout = check(tool, &args_json)?;
        let operation = active.id.clone();
        let deadline_at_ms = now.epoch_ms + timeout.as_millis() as i64;
        let call = pb::PendingToolCall {
            tool_request_id: request.to_string(),
            tool: tool.to_owned(),
            args_json: args_json.clone(),
            turn_id: active.turn.turn_id.clone(),
            deadline_at_ms,
        };
        self.pending.push(Pending { call, operation: operation.clone() });
        self.set_status(SessionStatus::WaitingToolResult, operation.as_str(), now, out);
        let body = serde_json::json!({
            "operation_id": operation, "tool_request_id": request, "tool": tool, "args": args_json,
        });
        let event =
            pb::ToolCall { tool_request_id: request.to_string(), tool: tool.to_owned(), args_json, deadline_at_ms };
        self.emit(operation.as_str(), Kind::ToolCall(event), now, out);
        self.append("tool_call", body, now, out);
        Ok(ToolCallStarted { request, operation, timeout })
    }

    /// The application's answer to a pending tool call. A malformed answer
    /// (too large, not JSON, an unknown error code, neither result nor
    /// error) is refused with `INVALID_ARGUMENT` and changes nothing; an
    /// unknown or already answered request is `TOOL_REQUEST_NOT_FOUND`.
    pub fn submit_tool_result(
        &mut self,
        request: pb::SubmitToolResultRequest,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        use pb::submit_tool_result_request::Outcome;
        let answer = match request.outcome {
            Some(Outcome::ResultJson(json)) => {
                if json.len() > limits::MAX_TOOL_JSON_BYTES {
                    return Err(CoreError::new(ErrorCode::InvalidArgument, "tool result exceeds the size limit"));
                }
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&json) {
                    return Err(CoreError::new(ErrorCode::InvalidArgument, format!("tool result is not JSON: {e}")));
                }
                Ok(json)
            }
            Some(Outcome::Error(error)) => {
                if ErrorCode::parse(&error.code).is_none() {
                    return Err(CoreError::new(
                        ErrorCode::InvalidArgument,
                        format!("unknown error code {:?}", error.code),
                    ));
                }
                Err(error)
            }
            None => {
                return Err(CoreError::new(ErrorCode::InvalidArgument, "a tool result needs a result or an error"));
            }
        };
        let Some(index) = self.pending.iter().position(|p| p.call.tool_request_id == request.tool_request_id) else {
            return Err(CoreError::with_details(
                ErrorCode::ToolRequestNotFound,
                format!("tool request {:?} is unknown or already answered", request.tool_request_id),
                serde_json::json!({ "toolRequestId": request.tool_request_id }),
            ));
        };
        let pending = self.pending.remove(index);
        let id = ToolRequestId::new(pending.call.tool_request_id);
        let operation = pending.operation;
        let body = match &answer {
            Ok(json) => serde_json::json!({ "operation_id": operation, "tool_request_id": id, "result": json }),
            Err(e) => serde_json::json!({ "operation_id": operation, "tool_request_id": id, "error": e.code }),
        };
        out.push(Effect::AnswerTool { request: id.clone(), answer });
        self.settle_tool(&operation, id, "", Some(body), now, out);
        Ok(())
    }

    /// A tool call's own timeout ran out before the application answered.
    pub fn tool_timed_out(&mut self, request: &ToolRequestId, now: Now, out: &mut Vec<Effect>) {
        let Some(index) = self.pending.iter().position(|p| p.call.tool_request_id == request.as_str()) else {
            return;
        };
        let pending = self.pending.remove(index);
        let error = pb::Error::new(ErrorCode::ToolTimeout, "the application did not answer in time");
        out.push(Effect::AnswerTool { request: request.clone(), answer: Err(error) });
        self.settle_tool(&pending.operation, request.clone(), ErrorCode::ToolTimeout.as_str(), None, now, out);
    }

    /// Announces a settled tool call (recording `entry`, the application's
    /// answer, with that event's seq) and resumes the turn when it was the last.
    fn settle_tool(
        &mut self,
        operation: &OperationId,
        request: ToolRequestId,
        code: &str,
        entry: Option<serde_json::Value>,
        now: Now,
        out: &mut Vec<Effect>,
    ) {
        let settled = pb::ToolCallSettled { tool_request_id: request.into_string(), code: code.to_owned() };
        self.emit(operation.as_str(), Kind::ToolCallSettled(settled), now, out);
        if let Some(entry) = entry {
            self.append("tool_result", entry, now, out);
        }
        if self.pending.is_empty() && self.status == SessionStatus::WaitingToolResult {
            self.set_status(SessionStatus::Running, operation.as_str(), now, out);
        }
    }

    // ---- completion ------------------------------------------------------

    /// `operation`'s turn ended with `result`. Its abandoned tool calls are
    /// answered for the agent, an error is raised if it failed, the status
    /// moves to `idle` (or `error` when the failure is fatal) and the
    /// completion is recorded. Returns the record to commit; only once it is
    /// durable does [`SessionState::completion_committed`] announce the
    /// completion, so a client that saw it can rely on it across a crash.
    pub fn finish(
        &mut self,
        operation: &OperationId,
        result: Result<(), ProviderFailure>,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Option<SessionRecord> {
        let active = self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Running)?;
        let kind = active.kind;
        let error = turn_error(kind, result, &active.hidden);
        active.hidden = String::new();
        if kind == pb::OperationKind::Prepare && error.is_none() {
            self.prepared = true;
        }
        let (mine, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.operation == *operation);
        self.pending = rest;
        for pending in mine {
            let answer = Err(pb::Error::new(ErrorCode::SessionBusy, "the turn finished"));
            out.push(Effect::AnswerTool { request: ToolRequestId::new(pending.call.tool_request_id), answer });
        }
        if self.status == SessionStatus::WaitingToolResult {
            self.set_status(SessionStatus::Running, operation.as_str(), now, out);
        }
        let next = match &error {
            Some((error, fatal)) => {
                self.emit("", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }), now, out);
                if *fatal { SessionStatus::Error } else { SessionStatus::Idle }
            }
            None => SessionStatus::Idle,
        };
        self.set_status(next, operation.as_str(), now, out);
        let outcome = outcome(operation, kind, error.map(|(e, _)| e));
        self.append("operation_completed", completion_entry(&outcome), now, out);
        if let Some(active) = self.active.as_mut() {
            active.phase = Phase::Finishing(outcome);
        }
        Some(self.record())
    }

    /// The completion [`SessionState::finish`] recorded is durable: it is
    /// announced, and snapshots report it from now on.
    pub fn completion_committed(&mut self, operation: &OperationId, now: Now, out: &mut Vec<Effect>) {
        let Some(Phase::Finishing(outcome)) =
            self.active.as_ref().filter(|a| a.id == *operation).map(|a| a.phase.clone())
        else {
            return;
        };
        self.emit(operation.as_str(), completed(&outcome), now, out);
        self.active = None;
        self.remember(outcome);
    }

    /// The completion [`SessionState::finish`] recorded could not be
    /// committed (the store failed). The client must not wait, and must not
    /// be told of a durable success: the operation ends with `INTERNAL`
    /// (its turn's own error code, if any, in `details.turnError`), raised
    /// and recorded again (best effort), then announced.
    pub fn completion_not_committed(&mut self, operation: &OperationId, reason: &str, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.active.as_mut().filter(|a| a.id == *operation) else { return };
        let Phase::Finishing(outcome) = &mut active.phase else { return };
        let turn_error = outcome.error.as_ref().map(|e| e.code.clone());
        let error = pb::Error::with_details(
            ErrorCode::Internal,
            format!("the operation's completion could not be stored: {reason}"),
            &serde_json::json!({ "turnError": turn_error }),
        );
        outcome.error = Some(error.clone());
        let entry = completion_entry(outcome);
        self.emit("", Kind::Error(pb::ErrorRaised { error: Some(error) }), now, out);
        self.append("operation_completed", entry, now, out);
        self.completion_committed(operation, now, out);
    }

    // ---- lifecycle -------------------------------------------------------

    /// Ends the session: pending tool calls are answered `SESSION_ENDED`, a
    /// running operation is stopped and completes with `SESSION_ENDED` (one
    /// whose completion was being committed completes with its own outcome),
    /// and `Ended` is emitted. Returns the record to commit, or `None` when
    /// the session had already ended.
    pub fn end(&mut self, reason: &str, now: Now, out: &mut Vec<Effect>) -> Option<SessionRecord> {
        if self.status == SessionStatus::Ended {
            return None;
        }
        for pending in std::mem::take(&mut self.pending) {
            let answer = Err(pb::Error::new(ErrorCode::SessionEnded, "the session ended"));
            out.push(Effect::AnswerTool { request: ToolRequestId::new(pending.call.tool_request_id), answer });
        }
        if let Some(active) = &self.active {
            let operation = active.id.clone();
            let outcome = match &active.phase {
                Phase::Finishing(outcome) => outcome.clone(),
                Phase::Recorded | Phase::Running => {
                    out.push(Effect::StopTurn(operation.clone()));
                    let error = pb::Error::new(ErrorCode::SessionEnded, "the session ended during this operation");
                    let outcome = outcome(&operation, active.kind, Some(error));
                    self.append("operation_completed", completion_entry(&outcome), now, out);
                    outcome
                }
            };
            self.emit(operation.as_str(), completed(&outcome), now, out);
            self.active = None;
            self.remember(outcome);
        }
        if self.status.can_transition_to(SessionStatus::Ended) {
            self.set_status(SessionStatus::Ended, "", now, out);
        }
        self.emit("", Kind::Ended(pb::Ended { reason: reason.to_owned() }), now, out);
        self.append("ended", serde_json::json!({ "reason": reason }), now, out);
        Some(self.record())
    }

    /// Whether `resume` has anything to do: `Ok(false)` when already idle
    /// (resume is idempotent), `Ok(true)` when ended; else refused.
    pub fn can_resume(&self) -> Result<bool, CoreError> {
        match self.status {
            SessionStatus::Idle => Ok(false),
            SessionStatus::Ended => Ok(true),
            SessionStatus::Error => Err(CoreError::new(ErrorCode::SessionError, "the session is in the error status")),
            _ => Err(CoreError::new(ErrorCode::SessionBusy, "the session is not ended")),
        }
    }

    /// Ended → idle on the same thread (after [`SessionState::can_resume`]
    /// said so). `unwatched`: nobody subscribes (arms the disconnect timer).
    /// Returns the record to commit.
    pub fn resume(&mut self, unwatched: bool, now: Now, out: &mut Vec<Effect>) -> Option<SessionRecord> {
        if self.status != SessionStatus::Ended {
            return None;
        }
        self.set_status(SessionStatus::Idle, "", now, out);
        self.append("resumed", serde_json::json!({}), now, out);
        if unwatched {
            self.unwatched(out);
        }
        Some(self.record())
    }

    /// A subscriber arrived: any disconnect timer armed before loses.
    pub fn watched(&mut self) {
        self.disconnect_epoch += 1;
    }

    /// The last subscriber left. With `auto_end_on_disconnect`, the session
    /// ends unless someone subscribes within the grace.
    pub fn unwatched(&mut self, out: &mut Vec<Effect>) {
        if self.identity.info.auto_end_on_disconnect && self.status != SessionStatus::Ended {
            self.disconnect_epoch += 1;
            out.push(Effect::ArmDisconnectTimer { epoch: self.disconnect_epoch });
        }
    }

    /// A disconnect timer armed at `epoch` fired: whether the session is
    /// still abandoned (nobody came since, and nobody watches).
    pub fn disconnect_due(&self, epoch: u64, unwatched: bool) -> bool {
        epoch == self.disconnect_epoch && unwatched && self.status != SessionStatus::Ended
    }

    // ---- helpers -----------------------------------------------------------

    /// Remembers an operation's outcome for later snapshots (bounded).
    fn remember(&mut self, outcome: pb::OperationOutcome) {
        if self.outcomes.len() == limits::RECENT_OUTCOMES {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(outcome);
    }

    fn append(&self, kind: &str, body: serde_json::Value, now: Now, out: &mut Vec<Effect>) {
        out.push(Effect::Append(TranscriptEntry { seq: self.seq, at_ms: now.epoch_ms, kind: kind.into(), body }));
    }

    /// Numbers an event for every subscriber; moves the stored ceiling ahead
    /// when numbering reaches it.
    fn emit(&mut self, operation: &str, kind: Kind, now: Now, out: &mut Vec<Effect>) {
        self.seq += 1;
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
