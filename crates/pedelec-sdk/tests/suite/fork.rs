//! `fork()`: a new session continuing a copy of a session's conversation,
//! in a copy of its managed workspace or the same folder, answering with the
//! same handlers, and going on independently of it; refusals create nothing.

use pedelec_protocol::pb;
use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, Via};

/// The session's info as Core lists it.
async fn listed(client: &Pedelec, session_id: &str) -> pb::SessionInfo {
    let listed = client.list_sessions().await.unwrap();
    listed
        .into_iter()
        .find_map(|s| s.session.filter(|i| i.session_id == session_id))
        .unwrap_or_else(|| panic!("{session_id} is listed"))
}

/// A fork of a session with a managed workspace: its own id and a copy of
/// the workspace, the parent's tool handler answering its calls, and each
/// session's turns and end its own.
async fn a_fork_goes_on_from_the_same_point_on_its_own(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let counter = std::sync::Arc::new(std::sync::Mutex::new(0));
    let parent = client
        .create_session(SessionOptions {
            tools: vec![super::counter_tool(counter.clone())],
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    parent.send_text("/write notes.txt from the parent").await.unwrap();
    let fork = parent.fork().await.expect("fork");
    assert_ne!(fork.session_id(), parent.session_id());
    assert_eq!(fork.get_status(), SessionStatus::Idle);

    let (was, now) = (listed(&client, parent.session_id()).await, listed(&client, fork.session_id()).await);
    assert_eq!(now.forked_from, parent.session_id());
    assert!(was.forked_from.is_empty());
    assert_eq!((now.provider.as_str(), now.model.as_str()), (was.provider.as_str(), was.model.as_str()));
    assert!(now.managed_workspace && now.workspace_path != was.workspace_path, "{now:?}");
    let in_fork = std::path::Path::new(&now.workspace_path).join("notes.txt");
    let in_parent = std::path::Path::new(&was.workspace_path).join("notes.txt");
    assert_eq!(std::fs::read_to_string(&in_fork).unwrap(), "from the parent", "the workspace is copied");

    // The parent's tool handler answers the fork's calls.
    fork.send_text(r#"/tool update_counter {"delta": 2}"#).await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2);
    // Each writes its own copy.
    fork.send_text("/write notes.txt from the fork").await.unwrap();
    assert_eq!(std::fs::read_to_string(&in_fork).unwrap(), "from the fork");
    assert_eq!(std::fs::read_to_string(&in_parent).unwrap(), "from the parent");

    // Each history is its own from the fork on.
    parent.send_text("only the parent").await.unwrap();
    assert_eq!(super::user_texts(&parent).await, ["/write notes.txt from the parent", "only the parent"]);
    assert_eq!(
        super::user_texts(&fork).await,
        [r#"/tool update_counter {"delta": 2}"#, "/write notes.txt from the fork"]
    );

    // Ending one leaves the other.
    parent.end().await.unwrap();
    assert_eq!(fork.get_status(), SessionStatus::Idle);
    fork.send_text("still here").await.expect("the fork goes on after its parent ended");
    // A fork can be forked in turn.
    let grandchild = fork.fork().await.expect("a fork of a fork");
    assert_eq!(listed(&client, grandchild.session_id()).await.forked_from, fork.session_id());
    // The user's activity log says where the fork came from.
    let owner = h.client_for(super::OWNER).await.owner().unwrap();
    let log = owner.activity(Some(ORIGIN), "", 0).await.unwrap().entries;
    let started = log
        .iter()
        .find(|e| e.session_id == fork.session_id() && e.kind() == pb::ActivityLogKind::SessionStarted)
        .expect("the fork's start is logged");
    assert!(started.summary.ends_with(&format!(", forked from {}", parent.session_id())), "{started:?}");
    fork.end().await.unwrap();
    grandchild.end().await.unwrap();
}

/// A fork of a session in a folder works in the same folder.
async fn a_fork_of_a_folder_session_works_in_the_same_folder(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let folder = tempfile::tempdir().unwrap();
    let parent = client
        .create_session::<String>(SessionOptions {
            workspace_path: Some(folder.path().to_path_buf()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let fork = parent.fork().await.expect("fork");
    let (was, now) = (listed(&client, parent.session_id()).await, listed(&client, fork.session_id()).await);
    assert!(!now.managed_workspace);
    assert_eq!(now.workspace_path, was.workspace_path);
    fork.send_text("/write shared.txt from the fork").await.unwrap();
    assert_eq!(std::fs::read_to_string(folder.path().join("shared.txt")).unwrap(), "from the fork");
    // The fork's auto-end follows its parent's when the request says nothing.
    assert!(!now.auto_end_on_disconnect);
    fork.end().await.unwrap();
    parent.end().await.unwrap();
}

/// Another origin, a malformed or unknown id, a running turn and an ended
/// session are refused, each before anything is created.
async fn forks_are_refused_and_create_nothing(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = super::kept_session(&client).await;
    let count = || async { client.list_sessions().await.unwrap().len() };
    let before = count().await;

    let mut raw = h.raw().await;
    let request = |id: &str, origin: &str| pb::ForkRequest {
        session_id: id.into(),
        caller_origin: origin.into(),
        auto_end_on_disconnect: None,
    };
    let code = |status: tonic::Status| pedelec_protocol::grpc::error_from_status(&status).code;
    let denied = raw.fork(request(session.session_id(), "https://evil.example")).await.unwrap_err();
    assert_eq!(code(denied), "THREAD_ACCESS_DENIED");
    assert_eq!(code(raw.fork(request("../sess", ORIGIN)).await.unwrap_err()), "THREAD_NOT_FOUND");
    assert_eq!(code(raw.fork(request("sess-nobody", ORIGIN)).await.unwrap_err()), "THREAD_NOT_FOUND");

    // During a turn.
    let running = super::a_turn_waiting_for_steer(&session).await;
    assert_eq!(session.fork().await.unwrap_err().code, "SESSION_BUSY");
    session.steer("go on").await.unwrap();
    running.await.unwrap().unwrap();

    session.end().await.unwrap();
    assert_eq!(session.fork().await.unwrap_err().code, "SESSION_ENDED");
    assert_eq!(count().await, before, "no refused fork made a session");
}

/// A fork is a new session as far as consent goes: once the user withdrew
/// the folder, a fork of a session there is refused like a new session in
/// it, and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_cannot_outlive_a_withdrawn_folder_grant() {
    const SITE: &str = "https://fork.example";
    let h = Harness::start();
    let area = tempfile::tempdir().unwrap();
    let project = area.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let project = project.canonicalize().unwrap();
    // (client_for approves the origin with no folder: grant after it.)
    let site = h.client_for(SITE).await;
    h.approve(SITE, &[&project]).await;
    let session = site
        .create_session::<String>(SessionOptions {
            workspace_path: Some(project.clone()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let count = || async { site.list_sessions().await.unwrap().len() };
    let before = count().await;
    h.approve(SITE, &[]).await;
    let error = session.fork().await.expect_err("the folder is no longer granted");
    assert_eq!(error.code, "WORKSPACE_NOT_ALLOWED", "{error:?}");
    assert_eq!(count().await, before, "no fork was made");
    h.approve(SITE, &[&project]).await;
    session.fork().await.expect("granted again, the fork is made");
}

super::over_both_transports!(
    a_fork_goes_on_from_the_same_point_on_its_own,
    a_fork_of_a_folder_session_works_in_the_same_folder,
    forks_are_refused_and_create_nothing,
);
