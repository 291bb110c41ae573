//! The tool broker: frontend tool calls of the running turn, the
//! application's answers and timeouts.

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, OperationId, SessionStatus, ToolRequestId, limits};

use super::*;

impl SessionState {
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
            .as_mut()
            .filter(|a| turn_running && a.phase == Phase::Running && operation.is_none_or(|wanted| a.id == *wanted))
        else {
            return Err(pb::Error::new(ErrorCode::SessionBusy, "no turn is active to call a tool from"));
        };
        if active.cancelled {
            return Err(operation::cancelled_error());
        }
        active.called_out = true;
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
        let body = ToolCall {
            operation_id: operation.as_str().into(),
            tool_request_id: request.as_str().into(),
            tool: tool.into(),
            args: args_json.as_str().into(),
        };
        let entry = body.encode();
        let event =
            pb::ToolCall { tool_request_id: request.to_string(), tool: tool.to_owned(), args_json, deadline_at_ms };
        self.emit(operation.as_str(), Kind::ToolCall(event), now, out);
        self.append_encoded(entry, now, out);
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
        let (result, error) = match &answer {
            Ok(json) => (Some(json.as_str().into()), None),
            Err(e) => (None, Some(e.code.as_str().into())),
        };
        let body =
            ToolResult { operation_id: operation.as_str().into(), tool_request_id: id.as_str().into(), result, error };
        let body = body.encode();
        out.push(Effect::AnswerTool { request: id.clone(), answer });
        self.settle_tool(&operation, id, "", Some(body), now, out);
        Ok(())
    }

    /// A tool call's own timeout ran out before the application answered.
    pub fn tool_timed_out(&mut self, request: &ToolRequestId, now: Now, out: &mut Vec<Effect>) {
        self.withdraw_tool(request, ErrorCode::ToolTimeout, "the application did not answer in time", now, out);
    }

    /// The agent stopped waiting for a call (its tool client closed the
    /// connection, or the request was dropped): the call is settled now, so
    /// the session does not wait on an answer nobody will read.
    pub fn tool_abandoned(&mut self, request: &ToolRequestId, now: Now, out: &mut Vec<Effect>) {
        self.withdraw_tool(request, ErrorCode::ToolCallAbandoned, "the agent stopped waiting for the call", now, out);
    }

    /// Settles a pending call that no answer came for, with `code`; nothing
    /// when it is no longer pending.
    fn withdraw_tool(&mut self, request: &ToolRequestId, code: ErrorCode, why: &str, now: Now, out: &mut Vec<Effect>) {
        let Some(index) = self.pending.iter().position(|p| p.call.tool_request_id == request.as_str()) else {
            return;
        };
        let pending = self.pending.remove(index);
        out.push(Effect::AnswerTool { request: request.clone(), answer: Err(pb::Error::new(code, why)) });
        self.settle_tool(&pending.operation, request.clone(), code.as_str(), None, now, out);
    }

    /// Announces a settled tool call (recording `entry`, the application's
    /// answer, with that event's seq) and resumes the turn when it was the last.
    fn settle_tool(
        &mut self,
        operation: &OperationId,
        request: ToolRequestId,
        code: &str,
        entry: Option<(EntryKind, EntryBody)>,
        now: Now,
        out: &mut Vec<Effect>,
    ) {
        let settled = pb::ToolCallSettled { tool_request_id: request.into_string(), code: code.to_owned() };
        self.emit(operation.as_str(), Kind::ToolCallSettled(settled), now, out);
        if let Some(entry) = entry {
            self.append_encoded(entry, now, out);
        }
        if self.pending.is_empty() && self.status == SessionStatus::WaitingToolResult {
            self.set_status(SessionStatus::Running, operation.as_str(), now, out);
        }
    }
}
