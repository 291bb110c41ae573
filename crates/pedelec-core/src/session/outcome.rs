//! How operations end: the error a provider's result becomes and the event
//! that announces it (its transcript entry is `transcript::Completion`).

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, OperationId};

use crate::providers::ProviderFailure;

/// The event that announces an operation's outcome.
pub fn completed(outcome: &pb::OperationOutcome) -> Kind {
    Kind::OperationCompleted(pb::OperationCompleted {
        kind: outcome.kind,
        error: outcome.error.clone(),
        output_json: outcome.output_json.clone(),
    })
}

pub fn outcome(operation: &OperationId, kind: pb::OperationKind, error: Option<pb::Error>) -> pb::OperationOutcome {
    pb::OperationOutcome { operation_id: operation.to_string(), kind: kind as i32, error, output_json: String::new() }
}

/// What a finished turn means for its operation: `None` for success, else
/// the error and whether it is fatal (the session moves to `error`).
///
/// A preparation succeeds only when its hidden text acknowledges it
/// ([`pedelec_protocol::prepare::acknowledged`]). A provider failure becomes
/// `SESSION_ERROR` when fatal, else `PREPARE_FAILED`/`SEND_TEXT_FAILED`,
/// with the provider's own code in `details.providerCode`.
pub fn turn_error(
    kind: pb::OperationKind,
    result: Result<(), ProviderFailure>,
    hidden_text: &str,
) -> Option<(pb::Error, bool)> {
    match (kind, result) {
        (pb::OperationKind::Prepare, Ok(())) if pedelec_protocol::prepare::acknowledged(hidden_text) => None,
        (pb::OperationKind::Prepare, Ok(())) => Some((
            pb::Error::with_details(
                ErrorCode::PrepareFailed,
                "the provider did not acknowledge the preparation with PEDELEC_PREPARED",
                &serde_json::json!({ "answer": hidden_text.chars().take(200).collect::<String>() }),
            ),
            false,
        )),
        (_, Ok(())) => None,
        (kind, Err(failure)) => {
            let code = match (failure.fatal, kind) {
                (true, _) => ErrorCode::SessionError,
                (false, pb::OperationKind::Prepare) => ErrorCode::PrepareFailed,
                (false, _) => ErrorCode::SendTextFailed,
            };
            let mut details = serde_json::json!({ "providerCode": failure.code.as_str() });
            if let (Some(into), serde_json::Value::Object(extra)) = (details.as_object_mut(), failure.details) {
                into.extend(extra);
            }
            Some((pb::Error::with_details(code, failure.message, &details), failure.fatal))
        }
    }
}
