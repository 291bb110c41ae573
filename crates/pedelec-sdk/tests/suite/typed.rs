//! Typed results: `send_text_with(.., SendOptions { output_schema })`
//! resolves with the agent's answer as a value valid against the schema;
//! Core asks once more on a mismatch, then fails with `OUTPUT_INVALID`;
//! a schema that does not compile starts nothing.

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::{HistoryQuery, PedelecSession, SendOptions, SessionStatus};
use serde_json::json;

use super::{Harness, ORIGIN, Recorder, Via};

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": { "title": { "type": "string" }, "words": { "type": "integer", "minimum": 0 } },
        "required": ["title", "words"],
        "additionalProperties": false,
    })
}

fn typed() -> SendOptions {
    SendOptions { output_schema: Some(schema()), ..Default::default() }
}

/// The completions' typed answers, as the history keeps them.
async fn outputs(session: &PedelecSession) -> Vec<String> {
    let history = session.history(HistoryQuery::default()).await.unwrap().entries;
    history
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(Kind::OperationCompleted(done)) => Some(done.output_json),
            _ => None,
        })
        .collect()
}

async fn an_answer_that_fits_resolves_with_its_value(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let answer = r#"/answer {"title": "Pedelec", "words": 3}"#;
    let value = session.send_text_with(answer, typed()).await.expect("a typed turn");
    assert_eq!(value, Some(json!({ "title": "Pedelec", "words": 3 })));
    // In a fence, as models often write it.
    let fenced = "/answer Here:\\n```json\\n{\"title\": \"fenced\", \"words\": 1}\\n```";
    let value = session.send_text_with(fenced, typed()).await.expect("a fenced answer");
    assert_eq!(value, Some(json!({ "title": "fenced", "words": 1 })));
    // A plain turn has no value.
    assert_eq!(session.send_text_with("hello", SendOptions::default()).await.unwrap(), None);
    // The history keeps each answer with its completion, and the user's
    // own words (not Core's request for JSON).
    let kept = outputs(&session).await;
    assert_eq!(kept.len(), 3);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&kept[0]).unwrap(), json!({ "title": "Pedelec", "words": 3 }));
    assert_eq!(kept[2], "", "no schema, no output");
    assert_eq!(super::user_texts(&session).await[0], answer);
    session.end().await.unwrap();
}

/// A first answer that does not fit: Core asks once more within the same
/// operation, and the second answer is the value. The events show both
/// answers as chat and one completion.
async fn a_mismatch_is_asked_again_once(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let log = Recorder::attach(&session);
    let text = "/answer {\"title\": \"x\", \"words\": -1}\n/answer-next {\"title\": \"second\", \"words\": 2}";
    let value = session.send_text_with(text, typed()).await.expect("the second answer fits");
    assert_eq!(value, Some(json!({ "title": "second", "words": 2 })));
    insta::assert_snapshot!(log.transcript());
    session.end().await.unwrap();
}

/// Answers that never fit fail the operation with `OUTPUT_INVALID`, whose
/// details say what is wrong; the session stays usable.
async fn an_answer_that_never_fits_is_output_invalid(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let error = session.send_text_with("/answer {\"title\": 7}", typed()).await.unwrap_err();
    assert_eq!(error.code, "OUTPUT_INVALID", "{error:?}");
    let details = error.details.clone().expect("details");
    let errors = details["errors"].as_array().expect("errors");
    // The second answer was the scripted echo of Core's request: not JSON.
    assert_eq!(errors, &[json!("the answer is not JSON")], "{details}");
    assert!(details["answer"].as_str().unwrap().starts_with("You said: Your last answer did not match"), "{details}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    assert_eq!(outputs(&session).await, [""]);
    session.send_text("still usable").await.unwrap();
    session.end().await.unwrap();
}

/// A schema that is not an object, does not compile or is too large is
/// refused before anything starts.
async fn bad_schemas_start_nothing(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let options = |schema| SendOptions { output_schema: Some(schema), ..Default::default() };
    // A `$ref` to elsewhere would have Core fetch it: it never resolves one.
    let remote = json!({ "$ref": "http://127.0.0.1:9/schema.json" });
    let file = json!({ "$ref": "file:///etc/passwd" });
    for bad in [
        json!([1, 2]),
        json!("string"),
        json!({ "type": 12 }),
        json!({ "description": "x".repeat(70_000) }),
        remote,
        file,
    ] {
        let error = session.send_text_with("/answer {}", options(bad.clone())).await.unwrap_err();
        assert_eq!(error.code, "INVALID_ARGUMENT", "{bad:.40}: {error:?}");
    }
    // Past the SDK's own check, Core refuses the same (a client of the proto).
    let mut raw = h.raw().await;
    for bad in ["not json", "[1]", r#"{"type": 12}"#] {
        let request = pb::SendTextRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            text: "/answer {}".into(),
            output_schema_json: bad.into(),
            ..Default::default()
        };
        let status = raw.send_text(request).await.unwrap_err();
        assert_eq!(pedelec_protocol::grpc::error_from_status(&status).code, "INVALID_ARGUMENT", "{bad}");
    }
    let history = session.history(HistoryQuery::default()).await.unwrap().entries;
    assert!(history.is_empty(), "nothing started: {history:?}");
    session.end().await.unwrap();
}

super::over_both_transports!(
    an_answer_that_fits_resolves_with_its_value,
    a_mismatch_is_asked_again_once,
    an_answer_that_never_fits_is_output_invalid,
    bad_schemas_start_nothing,
);
