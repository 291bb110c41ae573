//! `set_model()`: the model and effort of the turns from the next one, on
//! the same conversation; every subscriber's snapshot, the history and the
//! session list show it; bad names and ended sessions are refused and
//! change nothing. And `set_tools()`: the frontend tools, between turns.

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::assets::UploadSource;
use pedelec_sdk::{HistoryQuery, SendOptions, SessionStatus};

use super::{Harness, ORIGIN, Via};

/// The scripted model `scripted-text-only` takes no images: a turn with one
/// shows which model the runtime now runs.
async fn the_next_turn_runs_the_new_model_on_the_same_conversation(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let png = UploadSource::from_bytes("page.png", "image/png", b"\x89PNG\r\n\x1a\n-pedelec-".to_vec());
    session.upload_asset(png, Some("/page.png")).await.unwrap();
    let with_image = || SendOptions { attachments: vec!["/page.png".to_owned()], ..Default::default() };
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
    let session = super::kept_session(&client).await;
    for bad in ["", "tab\tbed", "line\nbreak", "nul\0", &"m".repeat(129), "--dangerously-skip-permissions"] {
        let error = session.set_model(bad, None).await.unwrap_err();
        assert_eq!(error.code, "INVALID_ARGUMENT", "{bad:?}: {error:?}");
    }
    // A model name reaches the agent's command line (`--model NAME`): one
    // that would read as a flag is refused at creation too.
    let options = pedelec_sdk::SessionOptions::<String> {
        model: Some("--dangerously-skip-permissions".into()),
        ..Default::default()
    };
    let Err(flag) = client.create_session(options).await else { panic!("a flag for a model was accepted") };
    assert_eq!(flag.code, "INVALID_ARGUMENT", "{flag:?}");
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
    tools_change_between_turns,
);

/// `set_tools()` between turns: the next turn's calls reach the new tool's
/// handler, a removed tool is `TOOL_NOT_FOUND`, a bad manifest changes
/// nothing, and a turn in progress refuses the change.
async fn tools_change_between_turns(via: Via) {
    use pedelec_sdk::{ToolSpec, sync_handler};
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let chat = super::Recorder::attach(&session);
    let object = serde_json::json!({ "type": "object" });
    let title = ToolSpec::new("page_title".to_string(), "The page's title", object.clone())
        .with_handler(sync_handler(|_: serde_json::Value, _| Ok::<_, String>(serde_json::json!("Pedelec"))));
    session.set_tools(vec![title]).await.expect("set_tools");
    session.send_text("/tool page_title {}").await.unwrap();
    assert!(chat.lines().iter().any(|l| l.contains("Tool page_title returned \\\"Pedelec\\\".")), "{:?}", chat.lines());

    // A manifest Core refuses changes nothing: the tool still answers.
    let bad = ToolSpec::new("bad name!".to_string(), "x", object.clone());
    let refused = session.set_tools(vec![bad]).await.unwrap_err();
    assert_eq!(refused.code, "TOOLS_MANIFEST_INVALID");
    session.send_text("/tool page_title {}").await.unwrap();

    // During a turn: refused.
    let running = super::a_turn_waiting_for_steer(&session).await;
    let busy = session.set_tools(Vec::new()).await.unwrap_err();
    assert_eq!(busy.code, "SESSION_BUSY");
    session.steer("go on").await.unwrap();
    running.await.unwrap().unwrap();

    // None at all: the old tool is gone.
    session.set_tools(Vec::new()).await.unwrap();
    session.send_text("/tool page_title {}").await.unwrap();
    assert!(chat.lines().iter().any(|l| l.contains("TOOL_NOT_FOUND")), "{:?}", chat.lines());
    session.end().await.unwrap();
}
