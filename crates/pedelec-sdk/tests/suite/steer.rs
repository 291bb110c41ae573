//! `steer()`: the user's text reaches the turn that runs, answered once the
//! agent took it, kept in the history as the user's; every refusal comes
//! before anything reaches the agent and changes nothing.

use std::time::Duration;

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::{HistoryQuery, PedelecSession, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, Recorder, Via, eventually};

/// The user texts of the history, with their operation ids.
async fn user_texts(session: &PedelecSession) -> Vec<(String, String)> {
    let entries = session.history(HistoryQuery::default()).await.unwrap().entries;
    entries
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(Kind::UserText(t)) => Some((e.operation_id, t.text)),
            _ => None,
        })
        .collect()
}

/// The steered text reaches the running turn (the scripted agent repeats
/// it), `steer()` resolves before the turn does, and the history keeps it
/// as the user's, in the same operation, after the turn's own text.
async fn steered_text_reaches_the_running_turn_and_the_history(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let recorder = Recorder::attach(&session);
    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/wait-steer 20000\nfirst words").await })
    };
    eventually("the turn runs", || session.get_status() == SessionStatus::Running).await;
    session.steer("and one more thing").await.expect("the agent takes the text");
    tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().expect("the turn succeeds");
    let chat = recorder.lines().into_iter().filter(|l| l.starts_with("chat ")).collect::<Vec<_>>();
    assert_eq!(chat.len(), 1, "{chat:?}");
    assert!(chat[0].contains("You said: first words You added: and one more thing."), "{chat:?}");

    let texts = user_texts(&session).await;
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert_eq!(texts[0].1, "/wait-steer 20000\nfirst words");
    assert_eq!(texts[1].1, "and one more thing");
    assert_eq!(texts[0].0, texts[1].0, "one operation");

    // The turn is over: nothing to steer, and nothing changes.
    let late = session.steer("too late").await.unwrap_err();
    assert_eq!(late.code, "TURN_NOT_RUNNING", "{late:?}");
    assert_eq!(user_texts(&session).await.len(), 2);
    assert_eq!(session.get_status(), SessionStatus::Idle);
    session.end().await.unwrap();
}

/// Empty, oversized, idle, another origin's, the wrong operation: each is
/// refused with its code, and the session, its turn and its history are as
/// they were.
async fn bad_steers_are_refused_and_change_nothing(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let idle = session.steer("nobody listens").await.unwrap_err();
    assert_eq!(idle.code, "TURN_NOT_RUNNING");

    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/wait-steer 20000\nwaiting").await })
    };
    eventually("the turn runs", || session.get_status() == SessionStatus::Running).await;
    for (text, code) in [
        (String::new(), "INVALID_ARGUMENT"),
        (" \n\t".to_owned(), "INVALID_ARGUMENT"),
        ("x".repeat(pedelec_protocol::limits::MAX_TEXT_BYTES + 1), "TEXT_TOO_LARGE"),
    ] {
        let error = session.steer(text).await.unwrap_err();
        assert_eq!(error.code, code, "{error:?}");
    }
    let mut raw = h.raw().await;
    let steer = |origin: &str, operation: &str| pb::SteerRequest {
        session_id: session.session_id().into(),
        caller_origin: origin.into(),
        text: "forged".into(),
        operation_id: operation.into(),
    };
    let foreign = raw.steer(steer("https://evil.example", "")).await.unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&foreign).code, "THREAD_ACCESS_DENIED");
    let wrong = raw.steer(steer(ORIGIN, "op-not-this-one")).await.unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&wrong).code, "TURN_NOT_RUNNING");
    let malformed = raw.steer(steer(ORIGIN, &"x".repeat(10_000))).await.unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&malformed).code, "INVALID_ARGUMENT");
    assert_eq!(session.get_status(), SessionStatus::Running, "the turn still waits, untouched");

    // The turn then takes a good text, and only that one.
    session.steer("the real one").await.expect("steer");
    tokio::time::timeout(Duration::from_secs(10), turn).await.expect("settles").unwrap().expect("turn");
    let texts: Vec<String> = user_texts(&session).await.into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, ["/wait-steer 20000\nwaiting", "the real one"]);
    session.end().await.unwrap();
}

super::over_both_transports!(
    steered_text_reaches_the_running_turn_and_the_history,
    bad_steers_are_refused_and_change_nothing,
);

/// An agent that takes no input mid-turn is refused up front, idle or
/// busy: `STEER_UNSUPPORTED` before any state check (an idle session
/// hears it, not `TURN_NOT_RUNNING`) and before anything is sent (an ACP
/// agent here, `pedelec-fake-acp`; no agent process is even started).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_be_steered_is_refused_before_anything_is_sent() {
    let agent = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    let settings = format!("[providers.plain]\nkind = \"acp\"\ncommand = [\"{}\", \"--acp\"]\n", agent.display());
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            provider: Some("plain".into()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .expect("create");
    let error = session.steer("faster, please").await.unwrap_err();
    assert_eq!(error.code, "STEER_UNSUPPORTED", "{error:?}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    assert!(user_texts(&session).await.is_empty(), "nothing recorded");
    session.end().await.unwrap();
}
