//! Seed: `prepare()`.

use std::sync::{Arc, Mutex};

use pedelec_sdk::{ErrorCode, SessionOptions, SessionStatus};

use super::*;

async fn prepare_is_idempotent_hidden_and_not_required(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    session.prepare().await.unwrap();
    assert_eq!(log.count("chat") + log.count("delta"), 0, "preparation text never reaches chat handlers");
    let after_first = log.lines();
    session.prepare().await.unwrap();
    assert_eq!(log.lines(), after_first, "a second prepare does nothing");
    insta::assert_snapshot!(log.transcript());

    let unprepared = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    unprepared.send_text("no prepare needed").await.unwrap();
}

async fn concurrent_prepares_share_one_request(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let runs = Arc::new(Mutex::new(0));
    let r = runs.clone();
    let _off = session.on_status(move |s, _| {
        if s == SessionStatus::Running {
            *r.lock().unwrap() += 1;
        }
    });
    let (a, b) = tokio::join!(session.prepare(), session.prepare());
    a.unwrap();
    b.unwrap();
    assert_eq!(*runs.lock().unwrap(), 1);
}

async fn prepare_is_busy_during_a_user_turn_and_ended_after_end(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/sleep 300").await });
    eventually("running", || session.get_status() == SessionStatus::Running).await;
    assert!(session.prepare().await.unwrap_err().is(ErrorCode::SessionBusy));
    turn.await.unwrap().unwrap();
    session.end().await.unwrap();
    assert!(session.prepare().await.unwrap_err().is(ErrorCode::SessionEnded));
}

async fn prepare_rejects_unless_the_provider_answers_exactly_pedelec_prepared(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { model: Some("scripted-unprepared".into()), ..Default::default() })
        .await
        .unwrap();
    let err = session.prepare().await.unwrap_err();
    assert!(err.is(ErrorCode::PrepareFailed), "{err}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    session.send_text("sendText stays available").await.unwrap();
}

async fn pending_prepare_rejects_session_ended_when_the_session_ends(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { model: Some("scripted-slow".into()), ..Default::default() })
        .await
        .unwrap();
    let s = session.clone();
    let prep = tokio::spawn(async move { s.prepare().await });
    eventually("running", || session.get_status() == SessionStatus::Running).await;
    session.end().await.unwrap();
    assert!(prep.await.unwrap().unwrap_err().is(ErrorCode::SessionEnded));
}

super::over_both_transports!(
    prepare_is_idempotent_hidden_and_not_required,
    concurrent_prepares_share_one_request,
    prepare_is_busy_during_a_user_turn_and_ended_after_end,
    prepare_rejects_unless_the_provider_answers_exactly_pedelec_prepared,
    pending_prepare_rejects_session_ended_when_the_session_ends,
);
