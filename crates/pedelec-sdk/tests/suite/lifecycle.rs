//! Seed: end, resume, resumeSession, auto-end, workspaces, origin binding.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_protocol::pb;
use pedelec_sdk::{ErrorCode, SessionOptions, SessionStatus};

use super::*;

async fn end_marks_ended_once_removes_from_registry_and_is_idempotent(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    assert_eq!(client.session_ids(), vec![session.session_id().to_string()]);
    let log = Recorder::attach(&session);
    session.end().await.unwrap();
    assert_eq!(session.get_status(), SessionStatus::Ended);
    assert!(client.session_ids().is_empty(), "removed from the client registry");
    session.end().await.unwrap();
    assert_eq!(log.count("ended"), 1, "duplicate ends do not run onEnded again");
    assert!(session.send_text("x").await.unwrap_err().is(ErrorCode::SessionEnded));
    assert!(session.prepare().await.unwrap_err().is(ErrorCode::SessionEnded));
}

async fn a_failed_end_emits_an_sdk_error_and_does_not_claim_success(via: Via) {
    let mut h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    h.core.kill();
    eventually("detached", || session.is_detached()).await;
    assert!(session.end().await.is_err());
    assert_ne!(session.get_status(), SessionStatus::Ended);
    assert!(log.lines().iter().any(|l| l.starts_with("error") && l.ends_with("[sdk/sdk_error]")));
    assert_eq!(log.count("ended"), 0);
}

async fn resume_reactivates_the_same_handle_with_its_state(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let (session, counter) = counter_session(&client).await;
    let log = Recorder::attach(&session);
    session.prepare().await.unwrap();
    session.send_text("/tool update_counter {\"delta\": 1}").await.unwrap();
    let usage = session.usage();
    let id = session.session_id().to_string();
    session.end().await.unwrap();
    session.resume().await.unwrap();
    assert_eq!(session.get_status(), SessionStatus::Idle, "idle at the await boundary");
    assert_eq!(session.session_id(), id);
    assert_eq!(session.usage(), usage, "usage preserved");
    assert_eq!(session.provider(), "scripted");
    assert_eq!(client.session_ids(), vec![id.clone()], "registered again");
    session.prepare().await.unwrap();
    assert_eq!(log.count("status idle→running"), 2, "prepared state preserved: no new preparation");
    session.send_text("/tool update_counter {\"delta\": 1}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2, "inline handlers preserved");
    session.end().await.unwrap();
    assert_eq!(log.count("ended"), 2, "a new lifecycle transition runs onEnded again");
    assert!(
        log.lines().iter().any(|l| l == "status ended→idle [core/status_changed]"),
        "resume never sets idle optimistically"
    );
}

async fn resume_on_an_active_handle_resolves_and_concurrent_calls_share_one_request(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    session.resume().await.unwrap();
    session.end().await.unwrap();
    let idles = Arc::new(Mutex::new(0));
    let i = idles.clone();
    let _off = session.on_status(move |s, _| {
        if s == SessionStatus::Idle {
            *i.lock().unwrap() += 1;
        }
    });
    let (a, b) = tokio::join!(session.resume(), session.resume());
    a.unwrap();
    b.unwrap();
    assert_eq!(*idles.lock().unwrap(), 1);
}

async fn resume_session_only_reattaches_and_an_ended_thread_stays_ended(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    session.send_text("/usage 77").await.unwrap();
    session.end().await.unwrap();
    let other = h.client().await;
    let again = other.resume_session::<String>(session.session_id()).await.unwrap();
    assert_eq!(again.get_status(), SessionStatus::Ended);
    assert_eq!(again.usage().total_tokens, Some(77), "usage hydrated from the snapshot");
    assert!(again.send_text("x").await.unwrap_err().is(ErrorCode::SessionEnded));
    again.resume().await.unwrap();
    assert_eq!(again.get_status(), SessionStatus::Idle);
}

async fn resume_fails_with_thread_not_found_and_workspace_open_failed(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let err = client.resume_session::<String>("sess-missing").await.unwrap_err();
    assert!(err.is(ErrorCode::ThreadNotFound), "{err}");
    let mut raw = h.raw().await;
    let status = raw
        .resume(pb::ResumeRequest { session_id: "sess-missing".into(), caller_origin: ORIGIN.into() })
        .await
        .unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&status).code, "THREAD_NOT_FOUND");

    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path().join("project");
    std::fs::create_dir(&root).unwrap();
    let session = client
        .create_session::<String>(SessionOptions { workspace_path: Some(root.clone()), ..Default::default() })
        .await
        .unwrap();
    session.end().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    let err = session.resume().await.unwrap_err();
    assert!(err.is(ErrorCode::WorkspaceOpenFailed), "{err}");
    assert_eq!(session.get_status(), SessionStatus::Ended);
    // The manifest file is not read back (Core keeps its own copy of the
    // session's tools): the folder back, without it, resumes.
    std::fs::create_dir(&root).unwrap();
    session.resume().await.expect("the stored manifest needs no file");
    assert_eq!(session.get_status(), SessionStatus::Idle);
}

/// The seed: prepare() rejects with SESSION_ENDED after end — also on a
/// handle that was prepared before it ended.
async fn prepare_after_end_rejects_even_when_prepared(via: Via) {
    let h = Harness::start_via(via);
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    session.prepare().await.unwrap();
    session.end().await.unwrap();
    assert!(session.prepare().await.unwrap_err().is(ErrorCode::SessionEnded));
}

/// A session that already ended loses nothing when its transport closes
/// (Core stopping cleanly): no TRANSPORT_DETACHED error is reported.
async fn an_ended_session_reports_no_error_when_core_stops(via: Via) {
    let mut h = Harness::start_via(via);
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    session.end().await.unwrap();
    assert!(h.core.terminate());
    eventually("detached", || session.is_detached()).await;
    assert_eq!(log.count("error"), 0, "{:?}", log.lines());
}

/// A send_text future dropped before Core answered (a timeout around it)
/// leaves the handle usable: once Core's turn is over, the next one runs.
async fn a_dropped_send_leaves_the_handle_usable(via: Via) {
    let h = Harness::start_via(via);
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_micros(1), session.send_text("/sleep 200")).await;
    assert!(dropped.is_err(), "the future was dropped before it finished");
    let mut next = Err(pedelec_sdk::PedelecError::new(ErrorCode::SessionBusy, "not tried"));
    // Bounded, but generous: under a loaded CI machine the first turn's
    // durable commit alone can take a while.
    for _ in 0..400 {
        next = session.send_text("next").await;
        if !next.as_ref().is_err_and(|e| e.is(ErrorCode::SessionBusy)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if next.is_err() {
        // Which side still thinks a turn runs: this handle, or Core.
        let mut raw = h.raw().await;
        let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
        let first = raw.subscribe(request).await.unwrap().into_inner().message().await.unwrap().unwrap();
        panic!(
            "the handle never ran the next turn: {next:?}; the handle says {} (last seq {}), Core's snapshot {:?}",
            session.get_status(),
            session.last_seq(),
            first.kind
        );
    }
}

async fn a_detached_handle_cannot_resume(via: Via) {
    let mut h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    h.core.kill();
    eventually("detached", || session.is_detached()).await;
    assert!(session.resume().await.unwrap_err().is(ErrorCode::TransportDetached));
}

async fn core_ends_a_session_when_its_last_subscriber_leaves_after_the_grace_period(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let auto = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let kept = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let quick = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let (auto_id, kept_id, quick_id) =
        (auto.session_id().to_string(), kept.session_id().to_string(), quick.session_id().to_string());
    drop((auto, kept, quick));
    // Re-attaching within the grace period keeps a session alive.
    let quick = client.resume_session::<String>(&quick_id).await.unwrap();
    tokio::time::sleep(h.grace + Duration::from_millis(300)).await;
    let observer = h.client().await;
    assert_eq!(observer.resume_session::<String>(&auto_id).await.unwrap().get_status(), SessionStatus::Ended);
    assert_eq!(observer.resume_session::<String>(&kept_id).await.unwrap().get_status(), SessionStatus::Idle);
    assert_eq!(quick.get_status(), SessionStatus::Idle);
}

async fn sessions_are_bound_to_their_origin(via: Via) {
    let h = Harness::start_via(via);
    let owner = h.client_for("https://app.example").await;
    let session = owner
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let stranger = h.client_for("https://evil.example").await;
    let err = stranger.resume_session::<String>(session.session_id()).await.unwrap_err();
    assert!(err.is(ErrorCode::ThreadAccessDenied), "{err}");
    let mut raw = h.raw().await;
    let denied = raw
        .send_text(pb::SendTextRequest {
            session_id: session.session_id().into(),
            caller_origin: "https://evil.example".into(),
            text: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(pedelec_protocol::grpc::error_from_status(&denied).code, "THREAD_ACCESS_DENIED");
    assert_eq!(session.get_status(), SessionStatus::Idle, "nothing changed");
}

async fn managed_and_explicit_workspaces(via: Via) {
    let mut h = Harness::start_via(via);
    let client = h.client().await;
    let managed = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let managed_dir = h.workspaces().join(managed.session_id());
    assert!(managed_dir.join(".pedelec-runtime/assets").is_dir());

    let shared = tempfile::tempdir().unwrap();
    let options =
        || SessionOptions::<String> { workspace_path: Some(shared.path().to_path_buf()), ..Default::default() };
    let a = client.create_session(options()).await.unwrap();
    let b = client.create_session(options()).await.unwrap();
    for s in [&a, &b] {
        assert!(
            shared.path().join(".pedelec-runtime/sessions").join(s.session_id()).join(".pedelec-skills.json").is_file(),
            "a per-session runtime dir for the session's own files"
        );
    }
    assert!(shared.path().join(".pedelec-runtime/assets").is_dir(), "the seed's shared assets dir");
    a.end().await.unwrap();
    assert!(shared.path().is_dir(), "end never deletes a workspace");
    assert!(managed_dir.is_dir(), "end does not delete a managed workspace either");
    assert!(h.core.terminate(), "Core exits cleanly");
    assert!(!managed_dir.exists(), "managed workspaces are removed at normal exit");
    assert!(shared.path().join(".pedelec-runtime").is_dir(), "explicit workspaces are never deleted");

    std::fs::create_dir_all(h.workspaces().join("sess-leftover")).unwrap();
    // Where managed workspaces were before they left the state dir.
    std::fs::create_dir_all(h.state().join("workspaces/sess-leftover")).unwrap();
    h.restart();
    assert!(!h.workspaces().join("sess-leftover").exists(), "leftovers are removed at the next start");
    assert!(!h.state().join("workspaces/sess-leftover").exists(), "in the old place too");
}

super::over_both_transports!(
    end_marks_ended_once_removes_from_registry_and_is_idempotent,
    a_failed_end_emits_an_sdk_error_and_does_not_claim_success,
    resume_reactivates_the_same_handle_with_its_state,
    resume_on_an_active_handle_resolves_and_concurrent_calls_share_one_request,
    resume_session_only_reattaches_and_an_ended_thread_stays_ended,
    resume_fails_with_thread_not_found_and_workspace_open_failed,
    a_detached_handle_cannot_resume,
    prepare_after_end_rejects_even_when_prepared,
    a_dropped_send_leaves_the_handle_usable,
    an_ended_session_reports_no_error_when_core_stops,
    core_ends_a_session_when_its_last_subscriber_leaves_after_the_grace_period,
    sessions_are_bound_to_their_origin,
    managed_and_explicit_workspaces,
);
