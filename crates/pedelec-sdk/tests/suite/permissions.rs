//! Permissions to the app: with `PermissionMode::App` an agent's permission
//! request reaches `on_permission` (what, which options, the policy's
//! choice) and the handler's answer reaches the agent; no handler answers
//! the policy's option, no answer by the deadline rejects, a cancel settles
//! it, and only the session's origin may answer. The scripted provider's
//! `/permission CMD` asks and says the answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_protocol::pb;
use pedelec_sdk::{PedelecSession, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, OWNER, Recorder, Via, eventually};

async fn app_session(h: &Harness) -> PedelecSession {
    h.client()
        .await
        .create_session::<String>(SessionOptions {
            permission_mode: pb::PermissionMode::App,
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap()
}

fn last_chat(recorder: &Recorder) -> String {
    recorder.lines().into_iter().rev().find(|l| l.starts_with("chat ")).unwrap_or_default()
}

async fn the_handler_decides(via: Via) {
    let h = Harness::start_via(via);
    let session = app_session(&h).await;
    let recorder = Recorder::attach(&session);
    let asked: Arc<Mutex<Vec<pb::PermissionRequest>>> = Arc::default();
    let seen = asked.clone();
    let _off = session.on_permission(move |request, ctx| {
        assert_eq!(ctx.kind.as_str(), "permission_requested");
        seen.lock().unwrap().push(request.clone());
        async move { request.options.iter().find(|o| o.option_id == "allow").map(|o| o.option_id.clone()) }
    });
    session.send_text("/permission rm -rf build").await.unwrap();
    assert!(last_chat(&recorder).contains("Permission to run rm -rf build: answered allow."), "{:?}", recorder.lines());
    let request = asked.lock().unwrap()[0].clone();
    let about = request.activity.unwrap();
    assert_eq!((about.kind, about.command.as_str()), (pb::ActivityKind::Command as i32, "rm -rf build"));
    let options: Vec<&str> = request.options.iter().map(|o| o.option_id.as_str()).collect();
    assert_eq!(options, ["allow", "deny"]);
    assert_eq!(request.policy_option_id, "deny");
    assert!(request.deadline_at_ms > session.session_created_at());
    session.end().await.unwrap();
}

async fn without_a_handler_the_policy_answers(via: Via) {
    let h = Harness::start_via(via);
    let session = app_session(&h).await;
    let recorder = Recorder::attach(&session);
    session.send_text("/permission curl evil.example").await.unwrap();
    assert!(last_chat(&recorder).contains("answered deny."), "{:?}", recorder.lines());

    // A session on Core's policy never asks the application.
    let policy = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let called = Arc::new(Mutex::new(false));
    let flag = called.clone();
    let _off = policy.on_permission(move |_, _| {
        *flag.lock().unwrap() = true;
        async { Some("allow".to_string()) }
    });
    let recorder = Recorder::attach(&policy);
    policy.send_text("/permission curl evil.example").await.unwrap();
    assert!(last_chat(&recorder).contains("rejected by the policy"), "{:?}", recorder.lines());
    assert!(!*called.lock().unwrap(), "the policy session asked nobody");
}

/// No answer by the deadline rejects; a cancel settles a pending request; a
/// foreign origin, an unknown request or an option not offered change nothing.
async fn unanswered_foreign_and_cancelled_requests(via: Via) {
    let h = Harness::with_config(via, "permission_timeout_secs = 1\n");
    let session = app_session(&h).await;
    let recorder = Recorder::attach(&session);
    let pending: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = pending.clone();
    let _off = session.on_permission(move |request, _| {
        seen.lock().unwrap().push(request.permission_id.clone());
        std::future::pending::<Option<String>>()
    });
    session.send_text("/permission make deploy").await.unwrap();
    assert!(last_chat(&recorder).contains("make deploy: rejected."), "{:?}", recorder.lines());

    let waiting = session.clone();
    let turn = tokio::spawn(async move { waiting.send_text("/permission make release").await });
    eventually("the second request", || pending.lock().unwrap().len() == 2).await;
    let id = pending.lock().unwrap()[1].clone();
    let mut raw = h.raw().await;
    let answer = |origin: &str, permission_id: &str, option_id: &str| pb::AnswerPermissionRequest {
        session_id: session.session_id().into(),
        caller_origin: origin.into(),
        permission_id: permission_id.into(),
        option_id: option_id.into(),
    };
    let code = |status: tonic::Status| pedelec_protocol::grpc::error_from_status(&status).code;
    let foreign = raw.answer_permission(answer("https://evil.example", &id, "allow")).await.unwrap_err();
    assert_eq!(code(foreign), "THREAD_ACCESS_DENIED");
    let unknown = raw.answer_permission(answer(ORIGIN, "perm-nope", "allow")).await.unwrap_err();
    assert_eq!(code(unknown), "PERMISSION_REQUEST_NOT_FOUND");
    let bad = raw.answer_permission(answer(ORIGIN, &id, "sudo")).await.unwrap_err();
    assert_eq!(code(bad), "INVALID_ARGUMENT");
    let huge = raw.answer_permission(answer(ORIGIN, &"p".repeat(100_000), "")).await.unwrap_err();
    assert_eq!(code(huge), "INVALID_ARGUMENT");

    session.cancel().await.unwrap();
    assert_eq!(turn.await.unwrap().unwrap_err().code, "OPERATION_CANCELLED");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    let late = raw.answer_permission(answer(ORIGIN, &id, "allow")).await.unwrap_err();
    assert_eq!(code(late), "PERMISSION_REQUEST_NOT_FOUND", "a cancel settled it");
    tokio::time::sleep(Duration::from_millis(50)).await;
    session.end().await.unwrap();
}

/// The requests waiting for the user, as the extension polls them (once
/// some are; empty after 10 s).
async fn waiting_for_the_user(
    raw: &mut pb::core_client::CoreClient<tonic::transport::Channel>,
) -> Vec<pb::UserPermission> {
    for _ in 0..400 {
        let list = pb::ListUserPermissionsRequest { caller_origin: OWNER.into() };
        let waiting = raw.list_user_permissions(list).await.unwrap().into_inner().permissions;
        if !waiting.is_empty() {
            return waiting;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Vec::new()
}

/// A web page in `PermissionMode::App` answers only what stays in its
/// workspace: its agent's command goes to the user (the extension's prompt,
/// here its owner call), never to the page, unless the user let the site
/// approve commands in that folder.
async fn a_page_cannot_approve_its_agents_commands_only_the_user_can(via: Via) {
    const SITE: &str = "https://page.example";
    let h = Harness::start_via(via);
    let area = tempfile::tempdir().unwrap();
    let trusted = area.path().join("trusted");
    std::fs::create_dir_all(&trusted).unwrap();
    let client = h.client_for(SITE).await;
    let session = client
        .create_session::<String>(SessionOptions {
            permission_mode: pb::PermissionMode::App,
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    // The page would allow anything; it is never asked.
    let asked = Arc::new(Mutex::new(0));
    let count = asked.clone();
    let _off = session.on_permission(move |_, _| {
        *count.lock().unwrap() += 1;
        async { Some("allow".to_string()) }
    });
    let turn = tokio::spawn({
        let session = session.clone();
        async move { session.send_text("/permission rm -rf ~").await }
    });
    let mut raw = h.raw().await;
    let waiting = waiting_for_the_user(&mut raw).await;
    assert_eq!(waiting.len(), 1, "the command waits for the user");
    let ask = &waiting[0];
    let request = ask.request.clone().unwrap();
    assert_eq!(
        (ask.origin.as_str(), ask.session_id.as_str(), ask.provider.as_str()),
        (SITE, session.session_id(), "scripted")
    );
    assert!(request.user_only);
    assert_eq!(request.activity.as_ref().unwrap().command, "rm -rf ~");
    // The page's own answer, sent straight to Core, is refused and changes nothing.
    let code = |status: tonic::Status| pedelec_protocol::grpc::error_from_status(&status).code;
    let page_answer = pb::AnswerPermissionRequest {
        session_id: session.session_id().into(),
        caller_origin: SITE.into(),
        permission_id: request.permission_id.clone(),
        option_id: "allow".into(),
    };
    assert_eq!(code(raw.answer_permission(page_answer).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");
    // Nor may a page answer as the user.
    let as_user = |caller: &str, option: &str| pb::AnswerUserPermissionRequest {
        caller_origin: caller.into(),
        session_id: session.session_id().into(),
        permission_id: request.permission_id.clone(),
        option_id: option.into(),
    };
    assert_eq!(code(raw.answer_user_permission(as_user(SITE, "allow")).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");
    raw.answer_user_permission(as_user(OWNER, "deny")).await.unwrap();
    turn.await.unwrap().unwrap();
    assert!(last_chat(&recorder).contains("Permission to run rm -rf ~: answered deny."), "{:?}", recorder.lines());
    assert_eq!(*asked.lock().unwrap(), 0, "the page was never asked");
    // A file of its own workspace is the page's to answer; one outside is not.
    session.send_text("/edit notes/today.md").await.unwrap();
    assert!(
        last_chat(&recorder).contains("Permission to edit notes/today.md: answered allow."),
        "{:?}",
        recorder.lines()
    );
    assert_eq!(*asked.lock().unwrap(), 1);
    let outside = tokio::spawn({
        let session = session.clone();
        async move { session.send_text("/edit ../../.bashrc").await }
    });
    let waiting = waiting_for_the_user(&mut raw).await;
    let id = waiting[0].request.as_ref().unwrap().permission_id.clone();
    let answer = pb::AnswerUserPermissionRequest {
        caller_origin: OWNER.into(),
        session_id: session.session_id().into(),
        permission_id: id,
        option_id: String::new(),
    };
    raw.answer_user_permission(answer).await.unwrap();
    outside.await.unwrap().unwrap();
    assert!(last_chat(&recorder).contains("Permission to edit ../../.bashrc: rejected."), "{:?}", recorder.lines());
    assert_eq!(*asked.lock().unwrap(), 1, "the page was not asked about a path outside");

    // Where the user let the site approve commands, the page answers.
    let grant =
        pb::FolderGrant { path: trusted.display().to_string(), may_approve_commands: true, ..Default::default() };
    h.set_consent(pb::OriginConsent {
        origin: SITE.into(),
        approved: true,
        folders: vec![grant],
        ..Default::default()
    })
    .await;
    let trusted_session = client
        .create_session::<String>(SessionOptions {
            permission_mode: pb::PermissionMode::App,
            workspace_path: Some(trusted.clone()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&trusted_session);
    let count = asked.clone();
    let _off = trusted_session.on_permission(move |_, _| {
        *count.lock().unwrap() += 1;
        async { Some("allow".to_string()) }
    });
    trusted_session.send_text("/permission make test").await.unwrap();
    assert!(last_chat(&recorder).contains("answered allow."), "{:?}", recorder.lines());
    assert_eq!(*asked.lock().unwrap(), 2);
}

super::over_both_transports!(
    a_page_cannot_approve_its_agents_commands_only_the_user_can,
    the_handler_decides,
    without_a_handler_the_policy_answers,
    unanswered_foreign_and_cancelled_requests,
);
