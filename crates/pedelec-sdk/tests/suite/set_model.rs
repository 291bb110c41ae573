//! `set_model()`: the model and effort of the turns from the next one, on
//! the same conversation; every subscriber's snapshot, the history and the
//! session list show it; bad names and ended sessions are refused and
//! change nothing.

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::assets::UploadSource;
use pedelec_sdk::{HistoryQuery, SendOptions, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, Via};

/// The scripted model `scripted-text-only` takes no images: a turn with one
/// shows which model the runtime now runs.
async fn the_next_turn_runs_the_new_model_on_the_same_conversation(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let png = UploadSource::from_bytes("page.png", "image/png", b"\x89PNG\r\n\x1a\n-pedelec-".to_vec());
    session.upload_asset(png, Some("/page.png")).await.unwrap();
    let with_image = || SendOptions { attachments: vec!["/page.png".to_owned()] };
    session.send_text_with("look", with_image()).await.expect("the default model takes images");
    let usage = session.usage().total_tokens.expect("usage");

    let info = session.set_model("scripted-text-only", Some(pb::EffortLevel::High)).await.expect("set_model");
    assert_eq!((info.model.as_str(), info.effort_level()), ("scripted-text-only", pb::EffortLevel::High));
    let refused = session.send_text_with("look again", with_image()).await.unwrap_err();
    assert_eq!(refused.code, "ATTACHMENT_UNSUPPORTED", "the new model runs: {refused:?}");
    session.send_text("and now?").await.expect("a text turn");
    assert!(session.usage().total_tokens.unwrap() > usage, "the same conversation's count goes on");

    // Another handle (another tab) sees the new model in its snapshot.
    let second = h.client().await.resume_session::<String>(session.session_id()).await.unwrap();
    assert_eq!(second.effort_level(), Some(pb::EffortLevel::High));
    let listed = client.list_sessions().await.unwrap();
    let mine = listed.iter().find_map(|s| s.session.as_ref().filter(|i| i.session_id == session.session_id()));
    assert_eq!(mine.map(|i| i.model.as_str()), Some("scripted-text-only"));
    let changes: Vec<(String, i32)> = session
        .history(HistoryQuery::default())
        .await
        .unwrap()
        .entries
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(Kind::ModelChanged(m)) => Some((m.model, m.effort_level)),
            _ => None,
        })
        .collect();
    assert_eq!(changes, [("scripted-text-only".to_owned(), pb::EffortLevel::High as i32)]);
    // The same model again changes nothing.
    let before = session.history(HistoryQuery::default()).await.unwrap().entries.len();
    session.set_model("scripted-text-only", None).await.unwrap();
    assert_eq!(session.history(HistoryQuery::default()).await.unwrap().entries.len(), before);
    session.end().await.unwrap();
}

/// Bad names, another origin, an unknown effort and an ended session are
/// refused; the model stays.
async fn bad_model_changes_are_refused_and_change_nothing(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    for bad in ["", "two words", "tab\tbed", "nul\0", &"m".repeat(129)] {
        let error = session.set_model(bad, None).await.unwrap_err();
        assert_eq!(error.code, "INVALID_ARGUMENT", "{bad:?}: {error:?}");
    }
    let mut raw = h.raw().await;
    let request = |origin: &str, effort: i32| pb::SetModelRequest {
        session_id: session.session_id().into(),
        caller_origin: origin.into(),
        model: "forged".into(),
        effort_level: effort,
    };
    let code = |status: tonic::Status| pedelec_protocol::grpc::error_from_status(&status).code;
    assert_eq!(code(raw.set_model(request("https://evil.example", 0)).await.unwrap_err()), "THREAD_ACCESS_DENIED");
    assert_eq!(code(raw.set_model(request(ORIGIN, 99)).await.unwrap_err()), "INVALID_ARGUMENT");
    let history = session.history(HistoryQuery::default()).await.unwrap().entries;
    assert!(!history.iter().any(|e| matches!(e.kind, Some(Kind::ModelChanged(_)))), "{history:?}");
    session.end().await.unwrap();
    let ended = session.set_model("scripted-text-only", None).await.unwrap_err();
    assert_eq!(ended.code, "SESSION_ENDED");
    assert_eq!(session.get_status(), SessionStatus::Ended);
    session.resume().await.unwrap();
    let info = session.set_model("scripted-text-only", None).await.expect("after resume");
    assert_eq!(info.model, "scripted-text-only");
}

super::over_both_transports!(
    the_next_turn_runs_the_new_model_on_the_same_conversation,
    bad_model_changes_are_refused_and_change_nothing,
);
