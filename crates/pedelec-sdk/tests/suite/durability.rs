//! Durability: a Core killed mid-turn loses no session. Records, transcript,
//! usage and provider identity are in SQLite, so a restarted Core resumes
//! them, and an operation the crash cut short is reported `CORE_RESTARTED`.

use pedelec_core::store::{read_record, read_transcript};
use pedelec_sdk::{ErrorCode, SessionOptions, SessionStatus};

use super::*;

async fn after_kill_9_and_a_restart_sessions_resume_with_transcript_usage_and_identity(via: Via) {
    let mut h = Harness::start_via(via);
    let client = h.client().await;
    let (session, _) = counter_session(&client).await;
    let id = session.session_id().to_string();
    session.prepare().await.unwrap();
    session.send_text("/tool update_counter {\"delta\": 3}\nremember this").await.unwrap();
    let usage = session.usage().total_tokens.expect("scripted reports usage");
    let seq_before = session.last_seq();
    let identity = read_record(&h.database(), &id).unwrap().unwrap().provider_session_id;
    assert!(identity.is_some());

    h.crash_and_restart();
    let client = h.client().await;
    let resumed = client.resume_session::<String>(&id).await.unwrap();
    assert_eq!(resumed.get_status(), SessionStatus::Idle);
    assert_eq!(resumed.usage().total_tokens, Some(usage));
    assert_eq!(resumed.provider(), "scripted");
    assert!(resumed.last_seq() >= seq_before, "sequence numbers keep increasing across the restart");
    let log = Recorder::attach(&resumed);
    resumed.prepare().await.unwrap();
    assert_eq!(log.count("status"), 0, "the prepared flag survived");
    let _h = resumed.on_tool_sync("update_counter".to_string(), |_: serde_json::Value, _| {
        Ok::<_, String>(serde_json::json!({"value": 4}))
    });
    resumed.send_text("/tool update_counter {\"delta\": 1}").await.unwrap();
    assert!(resumed.usage().total_tokens.unwrap() > usage);
    assert_eq!(
        read_record(&h.database(), &id).unwrap().unwrap().provider_session_id,
        identity,
        "provider identity kept"
    );

    let kinds: Vec<String> =
        read_transcript(&h.database(), &id).unwrap().into_iter().map(|e| e.kind.to_string()).collect();
    let first_turn: Vec<&str> = kinds.iter().map(String::as_str).take(8).collect();
    assert_eq!(
        first_turn,
        vec![
            "prepare",
            "operation_completed",
            "user_text",
            "tool_call",
            "tool_result",
            "chat",
            "turn_changes",
            "operation_completed"
        ]
    );
    assert!(kinds.len() > 8, "the new turn was appended: {kinds:?}");
}

async fn an_operation_interrupted_by_a_crash_is_reported_failed_and_the_session_accepts_a_new_prompt(via: Via) {
    let mut h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let id = session.session_id().to_string();
    let before = session.last_seq();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/sleep 30000").await });
    // Core announces an operation only once it is durable.
    eventually("Core to announce the operation", || session.last_seq() > before).await;
    h.crash_and_restart();
    let err = turn.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::TransportDetached), "{err}");
    let operation = err.details.as_ref().and_then(|d| d["operationId"].as_str()).expect("names its operation");

    let client = h.client().await;
    let resumed = client.resume_session::<String>(&id).await.unwrap();
    assert_eq!(resumed.get_status(), SessionStatus::Idle);
    // The awaited operation's real outcome is not lost: the new handle knows it.
    let outcome = resumed.operation_outcome(operation).expect("the outcome is known after the restart");
    assert!(outcome.unwrap_err().is(ErrorCode::CoreRestarted));
    resumed.send_text("after the crash").await.unwrap();
    let transcript = read_transcript(&h.database(), &id).unwrap();
    assert!(
        transcript
            .iter()
            .any(|e| e.kind.as_str() == "operation_completed" && e.body.json()["error"] == "CORE_RESTARTED"),
        "{transcript:?}"
    );

    // The outcome stays part of the protocol: a later subscriber (here after
    // a second restart) finds it, and the new turn's success, in its snapshot.
    h.crash_and_restart();
    let outcomes = snapshot_outcomes(&h, &id).await;
    let codes: Vec<Option<&str>> = outcomes.iter().map(|o| o.error.as_ref().map(|e| e.code.as_str())).collect();
    assert_eq!(codes, vec![Some("CORE_RESTARTED"), None], "{outcomes:?}");
    let interrupted = transcript.iter().find(|e| e.body.json()["error"] == "CORE_RESTARTED").unwrap();
    assert_eq!(interrupted.body.json()["operation_id"], outcomes[0].operation_id.as_str());
    assert_eq!(outcomes[1].kind, pb::OperationKind::SendText as i32);
}

/// The `recent_outcomes` of a fresh raw subscription's snapshot.
async fn snapshot_outcomes(h: &Harness, session_id: &str) -> Vec<pb::OperationOutcome> {
    let request = pb::SubscribeRequest { session_id: session_id.into(), caller_origin: ORIGIN.into() };
    let mut events = h.raw().await.subscribe(request).await.expect("subscribe").into_inner();
    match events.message().await.expect("a snapshot").and_then(|e| e.kind) {
        Some(pb::session_event::Kind::Snapshot(snapshot)) => snapshot.recent_outcomes,
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

async fn a_normal_restart_keeps_explicit_workspace_sessions_resumable(via: Via) {
    let mut h = Harness::start_via(via);
    let workspace = tempfile::tempdir().unwrap();
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            workspace_path: Some(workspace.path().into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = session.session_id().to_string();
    session.send_text("before").await.unwrap();
    assert!(h.core.terminate());
    h.restart();
    let client = h.client().await;
    let resumed = client.resume_session::<String>(&id).await.unwrap();
    assert_eq!(resumed.get_status(), SessionStatus::Ended, "a normal exit ends sessions");
    resumed.resume().await.unwrap();
    resumed.send_text("after").await.unwrap();
}

super::over_both_transports!(
    after_kill_9_and_a_restart_sessions_resume_with_transcript_usage_and_identity,
    an_operation_interrupted_by_a_crash_is_reported_failed_and_the_session_accepts_a_new_prompt,
    a_normal_restart_keeps_explicit_workspace_sessions_resumable,
);
