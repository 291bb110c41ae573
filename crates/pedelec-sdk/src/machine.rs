//! The session state machine, sans-IO: fed Core events and local actions, it
//! returns [`Effect`]s for the shell ([`crate::PedelecSession`]) to carry out.
//!
//! It owns the browser-side status (with de-duplication), the event gate from
//! `pedelec-protocol`, operation settlement, usage, the prepared flag and the
//! queue of frontend tool calls that wait for a handler. It never blocks,
//! sleeps or spawns, so its tests are exact and the same code runs in wasm.

use std::collections::{HashMap, HashSet, VecDeque};

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, EventGate, SessionStatus, Verdict};

use crate::context::{EventContext, SessionMeta, Source, StatusContext, ToolCallContext};
use crate::error::PedelecError;

/// Completions that arrived before their operation id was known, kept briefly.
const EARLY_COMPLETIONS: usize = 32;

/// A frontend tool call to hand to a handler.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tool_request_id: String,
    pub tool: String,
    pub args_json: String,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
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
    /// Call the tool's handler and submit its result.
    InvokeTool {
        request: ToolRequest,
        ctx: ToolCallContext,
    },
    /// Settle the promise of an operation.
    Settle {
        operation_id: String,
        outcome: Result<(), PedelecError>,
    },
}

/// What became of an accepted operation at the time its id was learnt.
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// Wait for [`Effect::Settle`].
    Pending,
    /// Already settled.
    Settled(Result<(), PedelecError>),
}

pub struct SessionMachine {
    meta: SessionMeta,
    gate: EventGate,
    status: SessionStatus,
    usage: Option<u64>,
    prepared: bool,
    /// Operation started locally whose id Core has not returned yet.
    local_operation: Option<pb::OperationKind>,
    awaiting: HashMap<String, pb::OperationKind>,
    completed_early: VecDeque<(String, Result<(), PedelecError>)>,
    queued_tools: Vec<(ToolRequest, ToolCallContext)>,
    handling: HashSet<String>,
}

/// Whether a handler exists for a tool name.
pub type HasHandler<'a> = &'a dyn Fn(&str) -> bool;

impl SessionMachine {
    /// A new handle: `idle` locally until Core says otherwise.
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
            queued_tools: Vec::new(),
            handling: HashSet::new(),
        }
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
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }
    pub fn meta_mut(&mut self) -> &mut SessionMeta {
        &mut self.meta
    }
    pub fn last_seq(&self) -> u64 {
        self.gate.last_seq()
    }
    /// Whether a local operation or an awaited one is in flight.
    pub fn has_operation_in_flight(&self) -> bool {
        self.local_operation.is_some() || !self.awaiting.is_empty()
    }
    /// Tool requests waiting for a handler.
    pub fn queued_tools(&self) -> impl Iterator<Item = &ToolRequest> {
        self.queued_tools.iter().map(|(r, _)| r)
    }

    fn change_status(&mut self, next: SessionStatus, ctx: EventContext, out: &mut Vec<Effect>) {
        if next == self.status {
            return;
        }
        let previous = self.status;
        self.status = next;
        let ended_ctx = EventContext {
            kind: if ctx.source == Source::Core {
                "ended"
            } else {
                "sdk_ended"
            },
            ..ctx.clone()
        };
        out.push(Effect::Status {
            status: next,
            ctx: StatusContext {
                base: ctx,
                previous_status: previous,
            },
        });
        if next == SessionStatus::Ended {
            out.push(Effect::Ended { ctx: ended_ctx });
            self.reject_all(ErrorCode::SessionEnded, "the session ended", out);
            self.queued_tools.clear();
            self.handling.clear();
        }
    }

    fn reject_all(&mut self, code: ErrorCode, message: &str, out: &mut Vec<Effect>) {
        let mut ids: Vec<String> = self.awaiting.drain().map(|(id, _)| id).collect();
        ids.sort();
        for operation_id in ids {
            out.push(Effect::Settle {
                operation_id,
                outcome: Err(PedelecError::new(code, message)),
            });
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
            Source::Sdk => self.meta.sdk("sdk_status_changed", turn),
            Source::Core => self.meta.core("status_changed", turn, emitted, received),
        }
    }

    /// `sendText()`/`prepare()` begin: local checks, then `running` locally.
    pub fn begin_local(&mut self, kind: pb::OperationKind) -> Result<Vec<Effect>, PedelecError> {
        match self.status {
            SessionStatus::Ended => {
                return Err(PedelecError::new(
                    ErrorCode::SessionEnded,
                    "the session has ended",
                ));
            }
            SessionStatus::Error => {
                return Err(PedelecError::new(
                    ErrorCode::SessionError,
                    "the session is in the error status",
                ));
            }
            _ if !self.status.can_send_text() || self.has_operation_in_flight() => {
                return Err(PedelecError::new(
                    ErrorCode::SessionBusy,
                    "another turn is active",
                ));
            }
            _ => {}
        }
        self.local_operation = Some(kind);
        let mut out = Vec::new();
        let ctx = self.status_ctx(Source::Sdk, None, 0, None);
        self.change_status(SessionStatus::Running, ctx, &mut out);
        Ok(out)
    }

    /// Core returned the operation id (or said a preparation was already done).
    pub fn operation_accepted(
        &mut self,
        accepted: &pb::OperationAccepted,
    ) -> (Accepted, Vec<Effect>) {
        let kind = self
            .local_operation
            .take()
            .unwrap_or(pb::OperationKind::try_from(accepted.kind).unwrap_or_default());
        let mut out = Vec::new();
        if accepted.already_done {
            self.prepared = true;
            self.revert_local_running(&mut out);
            return (Accepted::Settled(Ok(())), out);
        }
        if let Some(index) = self
            .completed_early
            .iter()
            .position(|(id, _)| id == &accepted.operation_id)
        {
            let (_, outcome) = self
                .completed_early
                .remove(index)
                .expect("index from position");
            return (Accepted::Settled(outcome), out);
        }
        if self.status == SessionStatus::Ended {
            return (
                Accepted::Settled(Err(PedelecError::new(
                    ErrorCode::SessionEnded,
                    "the session ended",
                ))),
                out,
            );
        }
        self.awaiting.insert(accepted.operation_id.clone(), kind);
        (Accepted::Pending, out)
    }

    /// The start request failed: undo the optimistic `running`.
    pub fn operation_failed_to_start(&mut self) -> Vec<Effect> {
        self.local_operation = None;
        let mut out = Vec::new();
        self.revert_local_running(&mut out);
        out
    }

    fn revert_local_running(&mut self, out: &mut Vec<Effect>) {
        if self.status == SessionStatus::Running
            && self.gate.active_operation().is_none()
            && self.awaiting.is_empty()
        {
            let back = self
                .gate
                .core_status()
                .filter(|s| *s != SessionStatus::Running)
                .unwrap_or(SessionStatus::Idle);
            let ctx = self.status_ctx(Source::Sdk, None, 0, None);
            self.change_status(back, ctx, out);
        }
    }

    /// A successful local `end()`.
    pub fn local_ended(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        let ctx = self.status_ctx(Source::Sdk, None, 0, None);
        self.change_status(SessionStatus::Ended, ctx, &mut out);
        out
    }

    /// The transport went away: nothing in flight can complete through it.
    pub fn detached(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        self.local_operation = None;
        self.reject_all(
            ErrorCode::TransportDetached,
            "the connection to Core was lost",
            &mut out,
        );
        out
    }

    /// An SDK-originated error for `onError`.
    pub fn sdk_error(&self, error: PedelecError) -> Effect {
        Effect::Error {
            error,
            ctx: self.meta.sdk("sdk_error", None),
        }
    }

    /// A handler was registered: queued requests it can answer are released.
    pub fn handler_registered(&mut self, has_handler: HasHandler<'_>) -> Vec<Effect> {
        let mut out = Vec::new();
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queued_tools)
            .into_iter()
            .partition(|(r, _)| has_handler(&r.tool));
        self.queued_tools = waiting;
        for (request, ctx) in ready {
            self.handling.insert(request.tool_request_id.clone());
            out.push(Effect::InvokeTool { request, ctx });
        }
        out
    }

    fn dispatch_tool(
        &mut self,
        request: ToolRequest,
        ctx: ToolCallContext,
        has_handler: HasHandler<'_>,
        out: &mut Vec<Effect>,
    ) {
        let id = &request.tool_request_id;
        if self.handling.contains(id)
            || self
                .queued_tools
                .iter()
                .any(|(r, _)| &r.tool_request_id == id)
        {
            return;
        }
        if self.status != SessionStatus::WaitingToolResult && self.status.is_active_turn() {
            let sdk = self.status_ctx(Source::Sdk, None, 0, None);
            self.change_status(SessionStatus::WaitingToolResult, sdk, out);
        }
        if has_handler(&request.tool) {
            self.handling.insert(id.clone());
            out.push(Effect::InvokeTool { request, ctx });
        } else {
            self.queued_tools.push((request, ctx));
        }
    }

    /// Feeds one Core event.
    pub fn on_event(
        &mut self,
        event: &pb::SessionEvent,
        received_at: i64,
        has_handler: HasHandler<'_>,
    ) -> Vec<Effect> {
        let verdict = self.gate.admit(event);
        if verdict != Verdict::Accept {
            tracing::trace!(seq = event.seq, ?verdict, "event ignored by the gate");
            return Vec::new();
        }
        let mut out = Vec::new();
        let turn = event.turn.as_ref();
        let emitted = event.emitted_at_ms;
        let received = Some(received_at);
        let Some(kind) = &event.kind else { return out };
        match kind {
            Kind::Snapshot(snapshot) => {
                self.adopt_snapshot(snapshot, emitted, received, has_handler, &mut out)
            }
            Kind::StatusChanged(change) => {
                if let Some(status) = SessionStatus::from_pb(change.status) {
                    let ctx = self.status_ctx(Source::Core, turn, emitted, received);
                    self.change_status(status, ctx, &mut out);
                }
            }
            Kind::OperationStarted(_) => {}
            Kind::Chat(chat) if !is_prepare(turn) => out.push(Effect::Chat {
                text: chat.text.clone(),
                ctx: self.meta.core("chat", turn, emitted, received),
            }),
            Kind::ChatDelta(delta) if !is_prepare(turn) => out.push(Effect::ChatDelta {
                text: delta.text.clone(),
                ctx: self.meta.core("chat_delta", turn, emitted, received),
            }),
            Kind::Chat(_) | Kind::ChatDelta(_) => {}
            Kind::ToolCall(call) => {
                let request = ToolRequest {
                    tool_request_id: call.tool_request_id.clone(),
                    tool: call.tool.clone(),
                    args_json: call.args_json.clone(),
                };
                let ctx = self.tool_ctx(&request, turn, emitted, received);
                self.dispatch_tool(request, ctx, has_handler, &mut out);
            }
            Kind::ToolCallSettled(settled) => {
                self.queued_tools
                    .retain(|(r, _)| r.tool_request_id != settled.tool_request_id);
                self.handling.remove(&settled.tool_request_id);
            }
            Kind::UsageUpdated(update) => {
                if let Some(total) = update.usage.and_then(|u| u.total_tokens) {
                    self.grow_usage(total, &mut out);
                }
            }
            Kind::Error(raised) => {
                if let Some(error) = &raised.error {
                    out.push(Effect::Error {
                        error: error.into(),
                        ctx: self.meta.core("error", turn, emitted, received),
                    });
                }
            }
            Kind::OperationCompleted(done) => {
                let outcome = match &done.error {
                    Some(error) => Err(PedelecError::from(error)),
                    None => Ok(()),
                };
                if done.kind == pb::OperationKind::Prepare as i32 && outcome.is_ok() {
                    self.prepared = true;
                }
                if self.awaiting.remove(&event.operation_id).is_some() {
                    out.push(Effect::Settle {
                        operation_id: event.operation_id.clone(),
                        outcome,
                    });
                } else {
                    if self.completed_early.len() == EARLY_COMPLETIONS {
                        self.completed_early.pop_front();
                    }
                    self.completed_early
                        .push_back((event.operation_id.clone(), outcome));
                }
            }
            Kind::Ended(_) => {
                let ctx = self.status_ctx(Source::Core, turn, emitted, received);
                self.change_status(SessionStatus::Ended, ctx, &mut out);
            }
        }
        out
    }

    fn grow_usage(&mut self, total: u64, out: &mut Vec<Effect>) {
        if self.usage.is_none_or(|known| total > known) {
            self.usage = Some(total);
            out.push(Effect::Usage {
                total_tokens: total,
            });
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
            base: self.meta.core("tool_call", turn, emitted, received),
            tool_request_id: request.tool_request_id.clone(),
            tool: request.tool.clone(),
        }
    }

    fn adopt_snapshot(
        &mut self,
        snapshot: &pb::Snapshot,
        emitted: i64,
        received: Option<i64>,
        has_handler: HasHandler<'_>,
        out: &mut Vec<Effect>,
    ) {
        if self.meta.provider.is_empty() {
            self.meta.provider = snapshot.provider.clone();
        }
        if self.meta.effort_level.is_none() {
            self.meta.effort_level = pb::EffortLevel::try_from(snapshot.effort_level)
                .ok()
                .and_then(|e| e.seed_str());
        }
        self.prepared = snapshot.prepared;
        if let Some(total) = snapshot.usage.and_then(|u| u.total_tokens) {
            self.grow_usage(total, out);
        }
        // Operations we wait for that Core no longer runs finished while we were not listening.
        let active = snapshot
            .active_operation
            .as_ref()
            .map(|a| a.operation_id.as_str());
        let missed: Vec<String> = self
            .awaiting
            .keys()
            .filter(|id| Some(id.as_str()) != active)
            .cloned()
            .collect();
        for operation_id in missed {
            self.awaiting.remove(&operation_id);
            out.push(Effect::Settle {
                operation_id,
                outcome: Err(PedelecError::new(
                    ErrorCode::TransportError,
                    "the operation finished while the subscription was being re-established",
                )),
            });
        }
        if let Some(status) = SessionStatus::from_pb(snapshot.status) {
            let ctx = self.status_ctx(Source::Core, snapshot.turn.as_ref(), emitted, received);
            self.change_status(status, ctx, out);
        }
        let pending: HashSet<&str> = snapshot
            .pending_tools
            .iter()
            .map(|p| p.tool_request_id.as_str())
            .collect();
        self.queued_tools
            .retain(|(r, _)| pending.contains(r.tool_request_id.as_str()));
        self.handling.retain(|id| pending.contains(id.as_str()));
        for call in &snapshot.pending_tools {
            let request = ToolRequest {
                tool_request_id: call.tool_request_id.clone(),
                tool: call.tool.clone(),
                args_json: call.args_json.clone(),
            };
            let ctx = self.tool_ctx(&request, snapshot.turn.as_ref(), emitted, received);
            self.dispatch_tool(request, ctx, has_handler, out);
        }
    }
}

fn is_prepare(turn: Option<&pb::TurnInfo>) -> bool {
    turn.is_some_and(|t| t.kind == pb::TurnKind::Prepare as i32)
}
