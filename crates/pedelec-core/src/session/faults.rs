//! The shell under a store that fails on demand: whatever breaks, the
//! request or the awaited operation gets an answer and the session is left
//! `idle`, usable, never stuck with an operation that no task runs.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, SessionStatus};

use super::{NewSession, Session, Shared};
use crate::store::{Store, read_transcript};
use crate::tools::ToolSet;
use crate::workspace::Workspace;

struct Rig {
    _dir: tempfile::TempDir,
    database: std::path::PathBuf,
    store: Store,
    session: Arc<Session>,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("sessions.sqlite3");
    let (store, _) = Store::open(&database).unwrap();
    let shared = Shared::for_tests(store.clone(), dir.path()).await;
    let id = "sess-faults".to_owned();
    let workspace = Workspace::resolve(None, &dir.path().join("managed"), &id, |_| Ok(())).unwrap();
    let info = pb::SessionInfo {
        session_id: id.clone(),
        provider: "scripted".into(),
        workspace_path: workspace.root.display().to_string(),
        managed_workspace: true,
        auto_end_on_disconnect: false,
        ..Default::default()
    };
    let session = Session::new(
        shared,
        NewSession {
            id: id.into(),
            origin: "https://app.example".into(),
            info,
            workspace,
            tool_token: crate::tool_token::ToolToken::mint(),
            skills: pb::Skills::default(),
            tools: ToolSet::compile(Vec::new()).unwrap(),
            fork_of: None,
        },
    );
    store.save_durably(session.initial_record()).await.unwrap();
    Rig { _dir: dir, database, store, session }
}

/// The outcome of `operation`, read from the session's events.
async fn completion(
    events: &mut (impl futures::Stream<Item = pb::SessionEvent> + Unpin),
    operation: &str,
) -> pb::OperationCompleted {
    let wait = async {
        while let Some(event) = events.next().await {
            if event.operation_id == operation
                && let Some(Kind::OperationCompleted(done)) = event.kind
            {
                return done;
            }
        }
        panic!("the stream ended before {operation} completed");
    };
    tokio::time::timeout(Duration::from_secs(10), wait).await.expect("the operation settles")
}

#[tokio::test]
async fn a_start_that_cannot_be_stored_is_refused_and_leaves_the_session_free() {
    let rig = rig().await;
    rig.store.fail_next_jobs(1);
    let error = rig.session.send_text("hello".into(), Vec::new(), "").await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Internal);
    assert_eq!(rig.session.status(), SessionStatus::Idle);
    let mut events = Box::pin(rig.session.events());
    let Some(Kind::Snapshot(snapshot)) = events.next().await.unwrap().kind else { panic!("snapshot first") };
    assert!(snapshot.active_operation.is_none(), "no operation is left active");
    // The next one runs to completion.
    let accepted = rig.session.send_text("hello".into(), Vec::new(), "").await.expect("the store works again");
    assert_eq!(completion(&mut events, &accepted.operation_id).await.error, None);
}

#[tokio::test]
async fn a_completion_that_cannot_be_stored_still_settles_with_internal() {
    let rig = rig().await;
    let mut events = Box::pin(rig.session.events());
    events.next().await.unwrap();
    rig.store.fail_next_completions(1);
    let accepted = rig.session.send_text("hello".into(), Vec::new(), "").await.unwrap();
    let done = completion(&mut events, &accepted.operation_id).await;
    assert_eq!(done.error.map(|e| e.code), Some("INTERNAL".to_owned()));
    assert_eq!(rig.session.status(), SessionStatus::Idle);
    let accepted = rig.session.send_text("again".into(), Vec::new(), "").await.expect("the session stays usable");
    assert_eq!(completion(&mut events, &accepted.operation_id).await.error, None);
}

#[tokio::test]
async fn a_panicking_provider_fails_the_operation_and_the_next_one_runs() {
    let rig = rig().await;
    let mut events = Box::pin(rig.session.events());
    events.next().await.unwrap();
    let accepted = rig.session.send_text("/panic".into(), Vec::new(), "").await.unwrap();
    let done = completion(&mut events, &accepted.operation_id).await;
    let error = done.error.expect("a panic fails the operation");
    assert_eq!(error.code, "SEND_TEXT_FAILED");
    assert!(error.details_json.contains("INTERNAL"), "{}", error.details_json);
    let accepted = rig.session.send_text("hello".into(), Vec::new(), "").await.unwrap();
    assert_eq!(completion(&mut events, &accepted.operation_id).await.error, None);
}

#[tokio::test]
async fn an_announced_completion_is_in_the_database() {
    let rig = rig().await;
    let mut events = Box::pin(rig.session.events());
    events.next().await.unwrap();
    let accepted = rig.session.send_text("hello".into(), Vec::new(), "").await.unwrap();
    completion(&mut events, &accepted.operation_id).await;
    // Read by a connection of its own, right after the event: durable, not queued.
    let entries = read_transcript(&rig.database, "sess-faults").unwrap();
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"user_text"));
    assert_eq!(kinds.last(), Some(&"operation_completed"), "{kinds:?}");
}
