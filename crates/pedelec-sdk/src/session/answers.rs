//! What the handle answers Core with: a tool handler's result (tried again
//! when it may not have arrived) and a permission handler's choice.

use std::sync::Arc;

use pedelec_protocol::{ErrorCode, pb};

use super::SessionShell;
use crate::context::{EventContext, ToolCallContext};
use crate::error::PedelecError;
use crate::machine::ToolRequest;
use crate::transport::Call;
use pedelec_protocol::backoff::Backoff;
use std::time::Duration;

/// How a tool result is tried again before its failure is reported: four
/// retries after the first try, from 100 ms doubling.
const SUBMIT_RETRIES: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 4);

/// Whether an error means the request may not have reached Core (worth
/// another try), not that Core refused it.
fn is_delivery_failure(error: &PedelecError) -> bool {
    matches!(
        ErrorCode::parse(&error.code),
        Some(ErrorCode::TransportError | ErrorCode::TransportDetached | ErrorCode::CoreRuntimeUnavailable)
    )
}

impl SessionShell {
    /// Runs the newest permission handler (the policy's option without one)
    /// and sends its answer. An answer Core no longer wants (another handle
    /// answered first, the request was settled) is dropped.
    pub(super) fn ask_permission(self: &Arc<Self>, request: pb::PermissionRequest, ctx: EventContext) {
        let handler = self.lock().handlers.permission.last().map(|(_, f)| f.clone());
        let shell = self.clone();
        self.transport.spawn(Box::pin(async move {
            let permission_id = request.permission_id.clone();
            let option_id = match handler {
                Some(handler) => {
                    let answer = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(handler(request, ctx)));
                    // A panicking handler rejects.
                    answer.await.unwrap_or_default().unwrap_or_default()
                }
                None => request.policy_option_id,
            };
            let answer = pb::AnswerPermissionRequest {
                session_id: shell.session_id.clone(),
                caller_origin: shell.origin.clone(),
                permission_id,
                option_id,
            };
            if let Err(error) = shell.transport.call(Call::AnswerPermission(answer)).await {
                tracing::debug!(%error, "a permission answer was not taken");
            }
        }));
    }

    /// Submits a tool result, again after a failure to deliver it (the
    /// transport failed, Core restarted): a handler's answer is not lost to
    /// one bad moment and the turn does not wait for `TOOL_TIMEOUT`. Core's
    /// own refusals (the request is settled, the answer is malformed) are
    /// final. Retried as [`SUBMIT_RETRIES`] says.
    async fn submit_with_retries(&self, submit: pb::SubmitToolResultRequest) -> Result<(), PedelecError> {
        let mut retry = 0;
        loop {
            match self.transport.call(Call::SubmitToolResult(submit.clone())).await {
                Ok(_) => return Ok(()),
                Err(error)
                    if is_delivery_failure(&error)
                        && let Some(wait) = SUBMIT_RETRIES.delay(retry) =>
                {
                    tracing::debug!(%error, retry, "retrying a tool result");
                    crate::transport::sleep(&*self.transport, wait).await;
                    retry += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    pub(super) fn invoke_tool(self: &Arc<Self>, request: ToolRequest, ctx: ToolCallContext) {
        let handler = self.lock().handlers.tool(&request.tool);
        let shell = self.clone();
        self.transport.spawn(Box::pin(async move {
            use pb::submit_tool_result_request::Outcome;
            let outcome = match (handler, serde_json::from_str::<serde_json::Value>(&request.args_json)) {
                // A handler that panics fails its call, like one that
                // returns an error, instead of leaving the agent waiting.
                (Some(h), Ok(args)) => futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(h(args, ctx)))
                    .await
                    .unwrap_or_else(|panic| {
                        let reason = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        Err(format!("the tool handler panicked: {reason}"))
                    }),
                (None, _) => Err(format!("no handler for tool {:?}", request.tool)),
                (_, Err(e)) => Err(format!("tool arguments are not JSON: {e}")),
            };
            let outcome = match outcome {
                Ok(value) => Outcome::ResultJson(value.to_string()),
                Err(message) => Outcome::Error(pb::Error::new(ErrorCode::ToolHandlerError, message)),
            };
            let submit = pb::SubmitToolResultRequest {
                session_id: shell.session_id.clone(),
                caller_origin: shell.origin.clone(),
                tool_request_id: request.tool_request_id.to_string(),
                outcome: Some(outcome),
            };
            if let Err(error) = shell.submit_with_retries(submit).await {
                let mut wrapped = PedelecError::new(
                    ErrorCode::SubmitToolResultFailed,
                    format!("could not submit the result of {}: {}", request.tool, error.message),
                );
                wrapped.details =
                    Some(serde_json::json!({ "cause": error.code, "toolRequestId": request.tool_request_id }));
                shell.step(|state| vec![state.machine.sdk_error(wrapped)]);
            }
        }));
    }
}
