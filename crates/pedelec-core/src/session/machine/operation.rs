//! Operations: the two-step start (`begin` → commit → `announce`), what a
//! running turn reports, and the two-step completion (`finish` → commit →
//! `completion_committed`).

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, OperationId, SessionStatus, ToolRequestId, TurnId, activity, limits};

use super::*;

/// The transcript body of an activity: its kind and summary (what older
/// readers show), and the whole activity.
fn activity_entry<'a>(operation: &'a OperationId, current: &'a pb::Activity) -> AgentActivity<'a> {
    AgentActivity {
        operation_id: operation.as_str().into(),
        kind: activity::kind_name(current.kind).into(),
        summary: activity::summary(current),
        activity: Some(std::borrow::Cow::Borrowed(current)),
    }
}

/// The error a cancelled operation completes with.
pub(crate) fn cancelled_error() -> pb::Error {
    pb::Error::new(ErrorCode::OperationCancelled, "the operation was cancelled")
}

/// `TEXT_TOO_LARGE` for a user's text over the limit (a turn's or a steer's).
pub fn check_text_size(text: &str) -> Result<(), CoreError> {
    if text.len() > limits::MAX_TEXT_BYTES {
        return Err(CoreError::with_details(
            ErrorCode::TextTooLarge,
            format!("text of {} bytes exceeds the {}-byte limit", text.len(), limits::MAX_TEXT_BYTES),
            serde_json::json!({ "limit": limits::MAX_TEXT_BYTES }),
        ));
    }
    Ok(())
}

impl SessionState {
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
        self.begin_with(kind, text, &[], ids, now, out)
    }

    /// [`SessionState::begin`] for a text with attachments (public asset
    /// paths the shell has checked), recorded with the user text.
    pub fn begin_with(
        &mut self,
        kind: pb::OperationKind,
        text: String,
        attachments: &[String],
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
        } else {
            check_text_size(&text)?;
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
            cancelled: false,
            streamed: String::new(),
            activities: Vec::new(),
            answer: None,
            output: None,
            called_out: false,
        });
        let body = UserText {
            operation_id: operation.as_str().into(),
            text: text.as_str().into(),
            attachments: attachments.into(),
        };
        if kind == pb::OperationKind::Prepare {
            self.append(&Prepare(body), now, out);
        } else {
            self.append(&body, now, out);
        }
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
        self.append(&Completion::of(&outcome), now, out);
        self.remember(outcome);
        out.push(Effect::Save(self.record()));
    }

    /// Whether `operation`'s turn is the one running (the only one whose
    /// provider output counts).
    fn running(&self, operation: &OperationId) -> Option<&Active> {
        self.active.as_ref().filter(|a| a.id == *operation && a.phase == Phase::Running)
    }

    fn running_mut(&mut self, operation: &OperationId) -> Option<&mut Active> {
        self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Running)
    }

    /// `operation`'s running turn, unless it was cancelled: after a cancel
    /// the user sees nothing more of it (text and activities the agent
    /// produces while winding down are dropped).
    fn shown_mut(&mut self, operation: &OperationId) -> Option<&mut Active> {
        self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Running && !a.cancelled)
    }

    /// A fragment of assistant text. Never emitted for a preparation.
    pub fn delta(&mut self, operation: &OperationId, text: &str, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.shown_mut(operation) else { return };
        if active.kind == pb::OperationKind::Prepare {
            return;
        }
        if active.streamed.len() + text.len() <= MAX_STREAMED_BYTES {
            active.streamed.push_str(text);
        }
        self.emit(operation.as_str(), Kind::ChatDelta(pb::ChatDelta { text: text.to_owned() }), now, out);
    }

    /// A complete assistant message: emitted and kept in the transcript; a
    /// preparation's is kept aside for the acknowledgement check instead.
    /// Dropped once the operation is cancelled, like deltas.
    pub fn message(&mut self, operation: &OperationId, text: &str, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.shown_mut(operation) else { return };
        if active.kind == pb::OperationKind::Prepare {
            if active.hidden.len() + text.len() <= MAX_HIDDEN_BYTES {
                active.hidden.push_str(text);
            }
            return;
        }
        active.streamed.clear();
        if let Some(answer) = &mut active.answer {
            text.clone_into(answer);
        }
        // Recorded after its event, so the entry carries the event's seq
        // (what GetHistory's after_seq compares against).
        self.emit(operation.as_str(), Kind::Chat(pb::Chat { text: text.to_owned() }), now, out);
        // Serialised straight from the borrowed text (no JSON tree); the
        // same body as the interrupted entry's, less its flag.
        self.append(&Chat { operation_id: operation.as_str().into(), text: text.into(), interrupted: false }, now, out);
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

    /// Agent-side work, or an update of one (same `activity_id`): merged into
    /// what the turn knows of it ([`pedelec_protocol::activity::merge`]) and
    /// emitted whole; recorded in the transcript once, when it settles
    /// (completed, failed, or an activity without a status) or else when the
    /// turn finishes. Dropped after a cancel, and beyond
    /// [`activity::MAX_TURN_ACTIVITIES`] new ones per turn.
    pub fn activity(&mut self, operation: &OperationId, update: pb::Activity, now: Now, out: &mut Vec<Effect>) {
        let Some(active) = self.shown_mut(operation) else { return };
        let mut update = activity::bounded(update);
        if update.activity_id.is_empty() {
            update.activity_id = format!("activity-{}", active.activities.len() + 1);
        }
        let index = match active.activities.iter().position(|(a, _)| a.activity_id == update.activity_id) {
            Some(index) => {
                activity::merge(&mut active.activities[index].0, update);
                index
            }
            None if active.activities.len() < activity::MAX_TURN_ACTIVITIES => {
                active.activities.push((update, false));
                active.activities.len() - 1
            }
            None => return,
        };
        let (current, recorded) = &mut active.activities[index];
        let current = current.clone();
        let record =
            !*recorded && (activity::is_settled(&current) || current.status == pb::ActivityStatus::Unspecified as i32);
        *recorded |= record;
        let kind = Kind::ActivityUpdated(pb::ActivityUpdated { activity: Some(current.clone()) });
        self.emit(operation.as_str(), kind, now, out);
        if record {
            self.append(&activity_entry(operation, &current), now, out);
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
        let body = ToolFailed { operation_id: operation.as_str().into(), tool: tool.into(), reason: reason.into() };
        self.append(&body, now, out);
    }

    /// `operation`'s turn ended with `result`. Its abandoned tool calls are
    /// answered for the agent, an error is raised if it failed, and the
    /// completion is recorded with the status the session moves to (`idle`,
    /// or `error` when the failure is fatal). Returns the record to commit;
    /// only once it is durable does [`SessionState::completion_committed`]
    /// announce the status and the completion, so a client that saw them
    /// can rely on them across a crash.
    pub fn finish(
        &mut self,
        operation: &OperationId,
        result: Result<(), ProviderFailure>,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Option<SessionRecord> {
        let active = self.active.as_mut().filter(|a| a.id == *operation && a.phase == Phase::Running)?;
        let kind = active.kind;
        let cancelled = active.cancelled;
        let error = match result {
            // A cancelled turn ends as cancelled however its provider wound
            // down, unless its runtime died (then the session is in error).
            Err(failure) if cancelled && !failure.fatal => Some((cancelled_error(), false)),
            Ok(()) if cancelled => Some((cancelled_error(), false)),
            // Refused before the agent saw the turn: that code, as is.
            Err(failure) if failure.code == ErrorCode::AttachmentUnsupported && !failure.fatal => {
                Some((pb::Error::new(ErrorCode::AttachmentUnsupported, failure.message), false))
            }
            // The answer never matched the output schema: that code, with
            // the schema errors.
            Err(failure) if failure.code == ErrorCode::OutputInvalid && !failure.fatal => {
                Some((pb::Error::with_details(ErrorCode::OutputInvalid, failure.message, &failure.details), false))
            }
            // No agent process could be started (`max_agent_processes`): the
            // quota's own refusal, naming its key, so the page can tell it
            // from a failing agent.
            Err(failure) if failure.code == ErrorCode::QuotaExceeded && !failure.fatal => {
                Some((pb::Error::with_details(ErrorCode::QuotaExceeded, failure.message, &failure.details), false))
            }
            result => turn_error(kind, result, &active.hidden),
        };
        active.hidden = String::new();
        // Activities still open when the turn ends are kept as they stood.
        let open: Vec<pb::Activity> = std::mem::take(&mut active.activities)
            .into_iter()
            .filter(|(_, recorded)| !recorded)
            .map(|(a, _)| a)
            .collect();
        let interrupted = std::mem::take(&mut active.streamed);
        for open in &open {
            self.append(&activity_entry(operation, open), now, out);
        }
        if (cancelled || error.is_some()) && !interrupted.is_empty() {
            // What the user saw stream in stays in the transcript, marked cut
            // short: a cancel, or a turn that failed midway.
            let body =
                Chat { operation_id: operation.as_str().into(), text: interrupted.as_str().into(), interrupted: true };
            self.append(&body, now, out);
        }
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
        self.withdraw_permissions(Some(operation), now, out);
        if self.status == SessionStatus::WaitingToolResult {
            self.set_status(SessionStatus::Running, operation.as_str(), now, out);
        }
        let next = match &error {
            // A cancellation is the application's own doing: no error event,
            // its OperationCompleted says it.
            Some((_, false)) if cancelled => SessionStatus::Idle,
            Some((error, fatal)) => {
                self.emit("", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }), now, out);
                if *fatal { SessionStatus::Error } else { SessionStatus::Idle }
            }
            None => SessionStatus::Idle,
        };
        let mut outcome = outcome(operation, kind, error.map(|(e, _)| e));
        if outcome.error.is_none() {
            outcome.output_json = self.active.as_mut().and_then(|a| a.output.take()).unwrap_or_default();
        }
        self.append(&Completion::of(&outcome), now, out);
        if let Some(active) = self.active.as_mut() {
            active.phase = Phase::Finishing(outcome, next);
        }
        // What is committed is the state after the completion; the status
        // clients see moves only when it is announced.
        let mut record = self.record();
        record.status = next;
        Some(record)
    }

    /// `Cancel`: asks the active operation (`operation`, or whichever is
    /// active when `None`) to stop. Its pending tool calls are withdrawn at
    /// once — the agent is answered `OPERATION_CANCELLED`, the application
    /// sees them settle with that code — and its turn is told to wind down
    /// ([`Effect::CancelTurn`]); [`SessionState::finish`] then completes it
    /// as cancelled. Returns the operation whose completion the caller may
    /// await: `None` when nothing runs (idle, ended, another operation), a
    /// no-op. An operation already cancelled, or whose completion is being
    /// committed, is returned unchanged.
    /// `operation` expects an answer matching an output schema: its
    /// messages from now on are kept as the answer ([`SessionState::answer`]).
    pub fn expect_answer(&mut self, operation: &OperationId) {
        if let Some(active) = self.running_mut(operation) {
            active.answer = Some(String::new());
        }
    }

    /// The last complete message of a turn that expects an answer.
    pub fn answer(&self, operation: &OperationId) -> Option<String> {
        self.active.as_ref().filter(|a| a.id == *operation).and_then(|a| a.answer.clone())
    }

    /// The answer matched the schema: `json` goes with the completion.
    pub fn answered(&mut self, operation: &OperationId, json: String) {
        if let Some(active) = self.running_mut(operation) {
            active.output = Some(json);
        }
    }

    /// Whether the agent called a frontend tool or asked permission during
    /// `operation` (while it is the active one).
    pub fn agent_called_out(&self, operation: &OperationId) -> bool {
        self.active.as_ref().is_some_and(|a| a.id == *operation && a.called_out)
    }

    /// `Steer`: the user turn that may take more of the user's text
    /// (`operation`, or whichever runs): announced, not cancelled, not
    /// finishing. `TURN_NOT_RUNNING` otherwise (a preparation included).
    pub fn steerable(&self, operation: Option<&OperationId>) -> Result<OperationId, CoreError> {
        self.active
            .as_ref()
            .filter(|a| operation.is_none_or(|wanted| a.id == *wanted))
            .filter(|a| a.kind == pb::OperationKind::SendText && a.phase == Phase::Running && !a.cancelled)
            .map(|a| a.id.clone())
            .ok_or_else(|| CoreError::new(ErrorCode::TurnNotRunning, "no user turn is running to take the text"))
    }

    /// The agent took `text` into `operation`'s running turn: it is the
    /// user's, recorded in the transcript after what the turn said so far.
    pub fn steered(&mut self, operation: &OperationId, text: &str, now: Now, out: &mut Vec<Effect>) {
        if self.running(operation).is_some() {
            let body =
                UserText { operation_id: operation.as_str().into(), text: text.into(), attachments: [][..].into() };
            self.append(&body, now, out);
        }
    }

    /// What `operation`'s turn changed in the workspace, computed by the
    /// shell when the turn ended: recorded before its completion.
    pub fn turn_changes(
        &mut self,
        operation: &OperationId,
        changes: pb::GetChangesResponse,
        now: Now,
        out: &mut Vec<Effect>,
    ) {
        if self.running(operation).is_some() {
            self.append(&crate::transcript::TurnChanges(changes), now, out);
        }
    }

    /// `SetModel`: the model (and effort, unless `None`) of the turns from
    /// the next one; recorded, announced and saved. `true` when it changed.
    pub fn set_model(
        &mut self,
        model: &str,
        effort: Option<pb::EffortLevel>,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<bool, CoreError> {
        if self.status == SessionStatus::Ended {
            return Err(CoreError::new(ErrorCode::SessionEnded, "the session has ended"));
        }
        let info = &mut self.identity.info;
        let effort = effort.map_or(info.effort_level, |e| e as i32);
        if info.model == model && info.effort_level == effort {
            return Ok(false);
        }
        info.model = model.to_owned();
        info.effort_level = effort;
        let changed = pb::ModelChanged { model: model.to_owned(), effort_level: effort };
        self.append(&crate::transcript::ModelChanged(changed.clone()), now, out);
        self.emit("", Kind::ModelChanged(changed), now, out);
        out.push(Effect::Save(self.record()));
        Ok(true)
    }

    /// The session's info as it now stands (its model may have changed).
    pub fn info(&self) -> &pb::SessionInfo {
        &self.identity.info
    }

    /// The running user turn's operation and turn ids, if one runs.
    pub fn running_turn(&self) -> Option<(OperationId, String)> {
        self.active
            .as_ref()
            .filter(|a| a.kind == pb::OperationKind::SendText && a.phase == Phase::Running)
            .map(|a| (a.id.clone(), a.turn.turn_id.clone()))
    }

    pub fn cancel(&mut self, operation: Option<&OperationId>, now: Now, out: &mut Vec<Effect>) -> Option<OperationId> {
        let active = self.active.as_mut().filter(|a| operation.is_none_or(|wanted| a.id == *wanted))?;
        let id = active.id.clone();
        if active.cancelled || matches!(active.phase, Phase::Finishing(..)) {
            return Some(id);
        }
        active.cancelled = true;
        out.push(Effect::CancelTurn(id.clone()));
        let (mine, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.operation == id);
        self.pending = rest;
        for pending in mine {
            let request = ToolRequestId::new(pending.call.tool_request_id);
            out.push(Effect::AnswerTool { request: request.clone(), answer: Err(cancelled_error()) });
            let settled = pb::ToolCallSettled {
                tool_request_id: request.into_string(),
                code: ErrorCode::OperationCancelled.as_str().to_owned(),
            };
            self.emit(id.as_str(), Kind::ToolCallSettled(settled), now, out);
        }
        self.withdraw_permissions(Some(&id), now, out);
        if self.status == SessionStatus::WaitingToolResult && self.pending.is_empty() {
            self.set_status(SessionStatus::Running, id.as_str(), now, out);
        }
        Some(id)
    }

    /// The completion [`SessionState::finish`] recorded is durable: it is
    /// announced, and snapshots report it from now on.
    ///
    /// The status change, the completion and the release of the operation
    /// are one step, in the order the proto documents (`StatusChanged`, then
    /// `OperationCompleted`; the status event is scoped to the operation, so
    /// it must come while the operation is still active for the client's
    /// gate). Both are queued for subscribers under the session's lock with
    /// the operation already released, so a client that sends its next text
    /// on seeing `idle` is never refused `SESSION_BUSY`.
    pub fn completion_committed(&mut self, operation: &OperationId, now: Now, out: &mut Vec<Effect>) {
        let Some(Phase::Finishing(outcome, next)) =
            self.active.as_ref().filter(|a| a.id == *operation).map(|a| a.phase.clone())
        else {
            return;
        };
        self.set_status(next, operation.as_str(), now, out);
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
        let Phase::Finishing(outcome, _) = &mut active.phase else { return };
        let turn_error = outcome.error.as_ref().map(|e| e.code.clone());
        let error = pb::Error::with_details(
            ErrorCode::Internal,
            format!("the operation's completion could not be stored: {reason}"),
            &serde_json::json!({ "turnError": turn_error }),
        );
        outcome.error = Some(error.clone());
        let entry = Completion::of(outcome);
        self.emit("", Kind::Error(pb::ErrorRaised { error: Some(error) }), now, out);
        self.append(&entry, now, out);
        self.completion_committed(operation, now, out);
    }
}
