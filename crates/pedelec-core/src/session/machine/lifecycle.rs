//! The session's life: restore after a restart, end, resume, and the
//! auto-end-on-disconnect epochs.

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, SessionStatus, ToolRequestId};

use super::*;

impl SessionState {
    /// A stored session brought back after Core stopped. An operation that
    /// was running then ends with `CORE_RESTARTED`: the error and the
    /// outcome are recorded (the outcome is in every later snapshot's
    /// `recent_outcomes`) and the session is idle again.
    pub fn restore(identity: Identity, record: &SessionRecord, now: Now) -> (Self, Vec<Effect>) {
        let mut st = SessionState::new(identity);
        st.status = record.status;
        st.seq = record.seq_ceiling;
        st.seq_ceiling = record.seq_ceiling;
        st.usage = record.usage_total;
        st.prepared = record.prepared;
        st.provider_session_id = record.provider_session_id.clone();
        // The record was last written by the session's last event (for an ended one, its end).
        st.last_event_at_ms = st.last_event_at_ms.max(record.updated_at_ms);
        for completion in &record.recent_outcomes {
            st.remember(completion.outcome());
        }
        let mut out = Vec::new();
        if let Some(op) = &record.active_operation {
            let error = pb::Error::new(ErrorCode::CoreRestarted, "Core restarted while this operation ran");
            st.emit("", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }), now, &mut out);
            // The kind of the interrupted operation is not recorded; the id is what clients match.
            let outcome = pb::OperationOutcome {
                operation_id: op.clone(),
                kind: 0,
                error: Some(error),
                output_json: String::new(),
            };
            st.append(&Completion::of(&outcome), now, &mut out);
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
        self.withdraw_permissions(None, now, out);
        if let Some((operation, kind, phase)) = self.active.as_ref().map(|a| (a.id.clone(), a.kind, a.phase.clone())) {
            let outcome = match phase {
                Phase::Finishing(outcome, next) => {
                    // The status the finished turn left, announced as its
                    // completion would have been: status, then completion.
                    self.set_status(next, operation.as_str(), now, out);
                    outcome
                }
                Phase::Recorded | Phase::Running => {
                    out.push(Effect::StopTurn(operation.clone()));
                    let error = pb::Error::new(ErrorCode::SessionEnded, "the session ended during this operation");
                    let outcome = outcome(&operation, kind, Some(error));
                    self.append(&Completion::of(&outcome), now, out);
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
        self.append(&Ended { reason: reason.into() }, now, out);
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
        self.append(&Resumed {}, now, out);
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
}
