//! Attachments: `send_text_with(text, SendOptions { attachments, ..Default::default() })` sends
//! the session's asset files with the text; the list and every file are
//! checked before anything starts, and a provider that cannot take an image
//! refuses with `ATTACHMENT_UNSUPPORTED`.

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::assets::UploadSource;
use pedelec_sdk::{HistoryQuery, PedelecSession, SendOptions, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, Recorder, Via};

/// The eight-byte PNG signature and a little more: an image by its name.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n-pedelec-";

async fn with_files(session: &PedelecSession) {
    let png = UploadSource::from_bytes("page.png", "image/png", PNG.to_vec());
    session.upload_asset(png, Some("/screens/page.png")).await.unwrap();
    let json = UploadSource::from_bytes("report.json", "application/json", br#"{"ok":true}"#.to_vec());
    session.upload_asset(json, Some("/data/report.json")).await.unwrap();
}

fn attach(paths: &[&str]) -> SendOptions {
    SendOptions { attachments: paths.iter().map(|p| p.to_string()).collect(), ..Default::default() }
}

async fn user_texts(session: &PedelecSession) -> Vec<pb::HistoryText> {
    let entries = session.history(HistoryQuery::default()).await.unwrap().entries;
    entries
        .into_iter()
        .filter_map(|e| match e.kind {
            Some(Kind::UserText(t)) => Some(t),
            _ => None,
        })
        .collect()
}

async fn files_reach_the_agent_and_the_history(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    with_files(&session).await;
    let recorder = Recorder::attach(&session);
    session.send_text_with("look", attach(&["/screens/page.png", "/data/report.json"])).await.unwrap();
    let chat = recorder.lines().into_iter().find(|l| l.starts_with("chat ")).unwrap();
    assert!(
        chat.contains(
            "Attachments: /screens/page.png (image/png, 17 bytes), /data/report.json (application/json, 11 bytes)."
        ),
        "{chat}"
    );
    let texts = user_texts(&session).await;
    assert_eq!(texts[0].attachments, ["/screens/page.png", "/data/report.json"]);
    session.end().await.unwrap();
}

/// Refused before anything starts, changing nothing: a malformed, repeated,
/// missing or surplus attachment (locally and by Core for a raw client).
async fn bad_attachment_lists_change_nothing(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    with_files(&session).await;
    let refused = |paths: &[&str]| {
        let session = session.clone();
        let options = attach(paths);
        async move { session.send_text_with("look", options).await.unwrap_err().code }
    };
    assert_eq!(refused(&["/../etc/passwd"]).await, "ASSET_PATH_INVALID");
    assert_eq!(refused(&["/screens/page.png", "/screens/page.png"]).await, "INVALID_ARGUMENT");
    let many: Vec<String> = (0..17).map(|i| format!("/f{i}.txt")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(refused(&many).await, "INVALID_ARGUMENT");
    assert_eq!(refused(&["/screens/missing.png"]).await, "ASSET_NOT_FOUND");
    assert_eq!(refused(&["/screens"]).await, "ASSET_NOT_FOUND", "a directory is not a file");
    let mut raw = h.raw().await;
    let sent = raw
        .send_text(pb::SendTextRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            text: "look".into(),
            attachments: vec!["relative.png".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&sent).code, "ASSET_PATH_INVALID");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    assert!(user_texts(&session).await.is_empty(), "no turn was recorded");
    session.send_text("still fine").await.unwrap();
}

/// A provider that takes no images refuses one with ATTACHMENT_UNSUPPORTED
/// (the agent never sees the turn); other files still go.
async fn a_provider_without_images_refuses_them(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let options = SessionOptions { model: Some("scripted-text-only".into()), ..Default::default() };
    let session = client.create_session::<String>(options).await.unwrap();
    with_files(&session).await;
    let error = session.send_text_with("look", attach(&["/screens/page.png"])).await.unwrap_err();
    assert_eq!(error.code, "ATTACHMENT_UNSUPPORTED", "{error:?}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    session.send_text_with("read it", attach(&["/data/report.json"])).await.expect("other files go");
}

super::over_both_transports!(
    files_reach_the_agent_and_the_history,
    bad_attachment_lists_change_nothing,
    a_provider_without_images_refuses_them,
);
