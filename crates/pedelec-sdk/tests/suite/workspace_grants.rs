//! Attacks on the workspace rule and on who can reach Core (SECURITY.md):
//! an approved origin is not the user's whole disk, and another OS user is
//! not a client at all.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use pedelec_protocol::grpc::error_from_status;

use super::*;

const SITE: &str = "https://approved.example";

fn create(origin: &str, path: &Path) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        workspace: Some(pb::WorkspaceSpec { path: path.display().to_string(), ..Default::default() }),
        caller_origin: origin.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    }
}

fn code(status: &tonic::Status) -> String {
    error_from_status(status).code
}

/// The refusal's `details.reason`, or "created".
async fn attempt(raw: &mut CoreClient<tonic::transport::Channel>, request: pb::CreateSessionRequest) -> String {
    match raw.create_session(request).await {
        Ok(_) => "created".into(),
        Err(status) => {
            let error = error_from_status(&status);
            assert_eq!(error.code, "WORKSPACE_NOT_ALLOWED", "{error:?}");
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            let details: serde_json::Value = serde_json::from_str(&error.details_json).expect("JSON details");
            details["reason"].as_str().unwrap_or_default().to_owned()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_web_origin_opens_only_what_the_user_granted_it() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let area = tempfile::tempdir().unwrap();
    let project = area.path().join("project");
    let sibling = area.path().join("sibling");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    std::os::unix::fs::symlink(&home, project.join("home-link")).unwrap();

    h.approve(SITE, &[&project]).await;
    assert_eq!(attempt(&mut raw, create(SITE, &project)).await, "created");
    // Inside the grant only: not its sibling, not by `..`, not through a link.
    assert_eq!(attempt(&mut raw, create(SITE, &sibling)).await, "not_granted");
    assert_eq!(attempt(&mut raw, create(SITE, &project.join("../sibling"))).await, "not_granted");
    assert_eq!(attempt(&mut raw, create(SITE, &project.join("home-link"))).await, "forbidden");
    // Never, whatever is asked: the home directory, `/`, a secret store, Core's own config.
    assert_eq!(attempt(&mut raw, create(SITE, &home)).await, "forbidden");
    assert_eq!(attempt(&mut raw, create(SITE, Path::new("/"))).await, "forbidden");
    let ssh = home.join(".ssh");
    if ssh.is_dir() {
        assert_eq!(attempt(&mut raw, create(SITE, &ssh)).await, "forbidden");
    }
    let config = h.dir.path().join("config");
    assert_eq!(attempt(&mut raw, create(SITE, &config)).await, "forbidden");
    // The grant withdrawn (the origin still approved): refused again.
    h.approve(SITE, &[]).await;
    assert_eq!(attempt(&mut raw, create(SITE, &project)).await, "not_granted");
    // Each refusal changed nothing: only the one session exists.
    let listed = raw
        .list_sessions(pb::ListSessionsRequest { caller_origin: SITE.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert!(!area.path().join("sibling/.pedelec-runtime").exists(), "nothing written in a refused workspace");
}

/// Attacks on consent itself: an origin the user never approved, a page
/// calling the owner calls, grants of the home directory or `/`, a grant
/// withdrawn under a live session, and consent surviving a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_lives_in_core_and_only_the_owner_changes_it() {
    let mut h = Harness::start();
    let mut raw = h.raw().await;
    let area = tempfile::tempdir().unwrap();
    let project = area.path().join("project");
    std::fs::create_dir_all(&project).unwrap();

    // Not approved: no session, managed or not.
    let managed = pb::CreateSessionRequest {
        caller_origin: SITE.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    assert_eq!(code(&raw.create_session(managed.clone()).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");
    assert_eq!(code(&raw.create_session(create(SITE, &project)).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");

    // A web origin cannot make an owner call, whatever it asks for.
    let forged = pb::OriginConsent {
        origin: SITE.into(),
        approved: true,
        folders: vec![pb::FolderGrant { path: "/".into(), may_approve_commands: true, ..Default::default() }],
        ..Default::default()
    };
    for caller in [SITE, "http://localhost:8080", ""] {
        let set = pb::SetConsentRequest { caller_origin: caller.into(), consent: Some(forged.clone()) };
        assert_eq!(code(&raw.set_consent(set).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let get = pb::GetConsentRequest { caller_origin: caller.into(), origin: String::new() };
        assert_eq!(code(&raw.get_consent(get).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let revoke = pb::RevokeOriginRequest { caller_origin: caller.into(), origin: "https://canary.example".into() };
        assert_eq!(code(&raw.revoke_origin(revoke).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let list = pb::ListUserPermissionsRequest { caller_origin: caller.into() };
        assert_eq!(code(&raw.list_user_permissions(list).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let live = pb::ListLiveSessionsRequest { caller_origin: caller.into(), ..Default::default() };
        assert_eq!(code(&raw.list_live_sessions(live).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let stop = pb::EndSessionsRequest {
            caller_origin: caller.into(),
            origin: "https://canary.example".into(),
            ..Default::default()
        };
        assert_eq!(code(&raw.end_sessions(stop).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
    }
    // Even the owner cannot grant what can never be a workspace.
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    for folder in [home.clone(), PathBuf::from("/"), h.state()] {
        let mut consent = forged.clone();
        consent.folders[0].path = folder.display().to_string();
        let set = pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) };
        let refused = raw.set_consent(set).await.unwrap_err();
        assert_eq!(code(&refused), "WORKSPACE_NOT_ALLOWED", "{}", folder.display());
    }
    let stored = raw
        .get_consent(pb::GetConsentRequest { caller_origin: OWNER.into(), origin: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert!(stored.origins.is_empty(), "nothing stored by the refusals: {stored:?}");

    // Approved and granted: a session works in the folder.
    let consent = h.approve(SITE, &[&project]).await;
    // Where Core keeps a managed workspace is not the page's to know (it names the home).
    let managed_info = raw.create_session(managed).await.unwrap().into_inner().session.unwrap();
    assert!(managed_info.managed_workspace && managed_info.workspace_path.is_empty(), "{managed_info:?}");
    assert!(consent.approved && consent.approved_at_ms > 0);
    assert_eq!(consent.folders[0].path, project.canonicalize().unwrap().display().to_string());
    let session = raw.create_session(create(SITE, &project)).await.unwrap().into_inner().session.unwrap().session_id;
    let send = |text: &str| pb::SendTextRequest {
        session_id: session.clone(),
        caller_origin: SITE.into(),
        text: text.into(),
        ..Default::default()
    };
    raw.send_text(send("hello")).await.unwrap();

    // Consent is Core's: it survives a crash and restart.
    h.crash_and_restart();
    let mut raw = h.raw().await;
    let kept = raw
        .get_consent(pb::GetConsentRequest { caller_origin: OWNER.into(), origin: SITE.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.origins, vec![consent.clone()]);

    // The folder withdrawn: the live session may no longer work there, nor resume.
    h.approve(SITE, &[]).await;
    eventually_idle(&mut raw, &session).await;
    assert_eq!(code(&raw.send_text(send("more")).await.unwrap_err()), "WORKSPACE_NOT_ALLOWED");
    let end = pb::EndRequest { session_id: session.clone(), caller_origin: SITE.into() };
    raw.end(end).await.unwrap();
    let resume = pb::ResumeRequest { session_id: session.clone(), caller_origin: SITE.into() };
    assert_eq!(code(&raw.resume(resume.clone()).await.unwrap_err()), "WORKSPACE_NOT_ALLOWED");
    // Granted again, it resumes; the origin revoked, it does not.
    h.approve(SITE, &[&project]).await;
    raw.resume(resume.clone()).await.unwrap();
    let revoke = pb::RevokeOriginRequest { caller_origin: OWNER.into(), origin: SITE.into() };
    // The resumed session and the managed one.
    assert_eq!(raw.revoke_origin(revoke).await.unwrap().into_inner().sessions_ended, 2);
    assert_eq!(code(&raw.resume(resume).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");
}

/// Waits until the session's running operation (if any) is over.
async fn eventually_idle(raw: &mut CoreClient<tonic::transport::Channel>, session: &str) {
    for _ in 0..200 {
        let listed = raw
            .list_sessions(pb::ListSessionsRequest { caller_origin: SITE.into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let idle = listed.sessions.iter().any(|s| {
            s.session.as_ref().is_some_and(|i| i.session_id == session) && s.status == pb::SessionStatus::Idle as i32
        });
        if idle {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("session {session} never became idle");
}

/// Revoking an origin ends every live session of it, however many (the
/// extension once remembered only the last 1 000), and no other origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_an_origin_ends_all_of_its_sessions() {
    const SESSIONS: usize = 2_000;
    // The per-origin quota lifted, so that one origin can hold them all.
    let h = Harness::with_config(Via::Grpc, "max_live_sessions_per_origin = 2001\n");
    h.approve(SITE, &[]).await;
    h.approve(CANARY, &[]).await;
    let raw = h.raw().await;
    let managed = |origin: &str| pb::CreateSessionRequest {
        caller_origin: origin.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    let created = futures::future::join_all((0..SESSIONS).map(|_| {
        let mut raw = raw.clone();
        let request = managed(SITE);
        async move { raw.create_session(request).await.map(|_| ()) }
    }))
    .await;
    assert!(created.iter().all(Result::is_ok), "{:?}", created.iter().find(|r| r.is_err()));
    let mut raw = raw.clone();
    let canary = raw.create_session(managed(CANARY)).await.unwrap().into_inner().session.unwrap().session_id;

    let revoke = pb::RevokeOriginRequest { caller_origin: OWNER.into(), origin: SITE.into() };
    assert_eq!(raw.revoke_origin(revoke).await.unwrap().into_inner().sessions_ended as usize, SESSIONS);
    // None of the origin's sessions is left running, on any page of the listing.
    let mut before = String::new();
    let mut seen = 0;
    loop {
        let page = raw
            .list_sessions(pb::ListSessionsRequest {
                caller_origin: SITE.into(),
                limit: 500,
                before_session_id: before,
            })
            .await
            .unwrap()
            .into_inner();
        for summary in &page.sessions {
            assert_eq!(summary.status, pb::SessionStatus::Ended as i32, "{summary:?}");
        }
        seen += page.sessions.len();
        match page.sessions.last() {
            Some(last) if page.has_more => before = last.session.as_ref().unwrap().session_id.clone(),
            _ => break,
        }
    }
    assert_eq!(seen, SESSIONS);
    // The other origin's session is untouched and still works.
    let send = pb::SendTextRequest {
        session_id: canary,
        caller_origin: CANARY.into(),
        text: "hi".into(),
        ..Default::default()
    };
    raw.send_text(send).await.unwrap();
    // The revoked origin starts nothing new.
    assert_eq!(code(&raw.create_session(managed(SITE)).await.unwrap_err()), "ORIGIN_NOT_ALLOWED");
}

const CANARY: &str = "https://canary.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_app_opens_only_the_configured_roots() {
    let area = tempfile::tempdir().unwrap();
    let allowed = area.path().join("allowed");
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(allowed.join("app")).unwrap();
    let settings = format!("allowed_workspace_roots = [{:?}]\n", allowed.display().to_string());
    let h = Harness::with_config(Via::Grpc, &settings);
    let mut raw = h.raw().await;
    assert_eq!(attempt(&mut raw, create(ORIGIN, &allowed.join("app"))).await, "created");
    assert_eq!(attempt(&mut raw, create(ORIGIN, elsewhere.path())).await, "not_granted");
    // Consent is for web origins: granting one nothing opens for an app.
    let refused = raw
        .set_consent(pb::SetConsentRequest {
            caller_origin: OWNER.into(),
            consent: Some(pb::OriginConsent { origin: ORIGIN.into(), approved: true, ..Default::default() }),
        })
        .await
        .unwrap_err();
    assert_eq!(code(&refused), "INVALID_ARGUMENT");
    // Without any configured root (Core's default) an app opens managed workspaces only.
    let bare = Harness::with_config(Via::Grpc, "allowed_workspace_roots = []\n");
    let mut raw = bare.raw().await;
    assert_eq!(attempt(&mut raw, create(ORIGIN, &allowed.join("app"))).await, "not_granted");
}

/// Another OS user's process cannot connect to Core's socket, even where
/// everything above Core's own directory is open to it: the socket's
/// directory is 0700 and the socket 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_os_user_cannot_reach_core() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs root (to act as another user) and /usr/bin/python3");
        return;
    }
    let h = Harness::start();
    std::fs::set_permissions(h.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = h.socket();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    assert_eq!(mode(&socket), 0o600);
    let probe = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n    print('connected')\nexcept PermissionError:\n    print('denied')\n";
    let run_as = |uid: u32, socket: &Path| {
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", probe])
            .arg(socket)
            .uid(uid)
            .gid(uid)
            .output()
            .expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // The gRPC socket, and the tool and asset hand-off sockets beside it.
    let mut sockets = vec![socket.clone()];
    for suffix in [".tools", ".assets"] {
        let mut path = socket.clone().into_os_string();
        path.push(suffix);
        sockets.push(path.into());
    }
    for socket in &sockets {
        assert_eq!(mode(socket), 0o600, "{}", socket.display());
        assert_eq!(run_as(65534, socket), "denied", "user nobody must not reach {}", socket.display());
        assert_eq!(run_as(0, socket), "connected", "the probe itself works for Core's own user");
    }
    // Core still serves its user.
    h.raw().await.ping(pb::PingRequest {}).await.expect("ping");
}

/// The user's window: the owner sees every origin's live sessions (with the
/// real workspace path a page is not told) and stops one, or all of a site,
/// without touching any site's consent; a page can do neither (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_sees_every_sites_sessions_and_stops_one_or_a_whole_site() {
    const OTHER: &str = "https://other.example";
    let h = Harness::start();
    h.approve(SITE, &[]).await;
    h.approve(OTHER, &[]).await;
    let mut raw = h.raw().await;
    let managed = |origin: &str| pb::CreateSessionRequest {
        caller_origin: origin.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for origin in [SITE, SITE, OTHER] {
        let created = raw.create_session(managed(origin)).await.unwrap().into_inner().session.unwrap();
        assert_eq!(created.workspace_path, "", "a page is not told where a managed workspace is");
        ids.push(created.session_id);
    }
    let live = |origin: &str| pb::ListLiveSessionsRequest {
        caller_origin: OWNER.into(),
        origin: origin.into(),
        ..Default::default()
    };
    let listed = raw.list_live_sessions(live("")).await.unwrap().into_inner().sessions;
    let shown: Vec<(String, String)> = listed
        .iter()
        .map(|l| (l.origin.clone(), l.summary.as_ref().unwrap().session.as_ref().unwrap().session_id.clone()))
        .collect();
    assert_eq!(shown, [(SITE.into(), ids[0].clone()), (SITE.into(), ids[1].clone()), (OTHER.into(), ids[2].clone())]);
    assert!(listed.iter().all(|l| Path::new(&l.workspace_path).is_dir()), "the user sees the real folder: {listed:?}");
    assert!(listed.iter().all(|l| l.summary.as_ref().unwrap().status == pb::SessionStatus::Idle as i32));
    assert_eq!(raw.list_live_sessions(live(OTHER)).await.unwrap().into_inner().sessions.len(), 1);

    // An unknown id ends nothing, not even the known ones named with it.
    let stop = |ids: Vec<String>, origin: &str| pb::EndSessionsRequest {
        caller_origin: OWNER.into(),
        session_ids: ids,
        origin: origin.into(),
    };
    let unknown = raw.end_sessions(stop(vec![ids[2].clone(), "sess-nobody".into()], "")).await.unwrap_err();
    assert_eq!(code(&unknown), "THREAD_NOT_FOUND");
    assert_eq!(raw.list_live_sessions(live("")).await.unwrap().into_inner().sessions.len(), 3);

    // One session of the other site, then the whole first site.
    assert_eq!(raw.end_sessions(stop(vec![ids[2].clone()], "")).await.unwrap().into_inner().ended, 1);
    assert_eq!(raw.end_sessions(stop(vec![ids[2].clone()], "")).await.unwrap().into_inner().ended, 0, "already ended");
    assert_eq!(raw.end_sessions(stop(Vec::new(), SITE)).await.unwrap().into_inner().ended, 2);
    assert!(raw.list_live_sessions(live("")).await.unwrap().into_inner().sessions.is_empty());
    let listing =
        |origin: &str| pb::ListSessionsRequest { caller_origin: origin.into(), limit: 10, ..Default::default() };
    for origin in [SITE, OTHER] {
        for summary in raw.list_sessions(listing(origin)).await.unwrap().into_inner().sessions {
            assert_eq!(summary.status, pb::SessionStatus::Ended as i32, "{summary:?}");
        }
    }
    // Stopping is not revoking: both sites may start again at once.
    for origin in [SITE, OTHER] {
        raw.create_session(managed(origin)).await.expect("the site's consent is untouched");
    }
}

/// The next event of `stream` within 10 s.
async fn next_event(stream: &mut tonic::Streaming<pb::SessionEvent>) -> pb::SessionEvent {
    match tokio::time::timeout(std::time::Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(event))) => event,
        other => panic!("no event within 10 s: {other:?}"),
    }
}

/// Events of `stream` up to and including the first that `last` accepts.
async fn events_until(
    stream: &mut tonic::Streaming<pb::SessionEvent>,
    last: impl Fn(&pb::session_event::Kind) -> bool,
) -> Vec<pb::session_event::Kind> {
    let mut seen = Vec::new();
    loop {
        let kind = next_event(stream).await.kind.expect("an event has a kind");
        let done = last(&kind);
        seen.push(kind);
        if done {
            return seen;
        }
    }
}

/// The user's event monitor: the owner follows another site's session live
/// (a snapshot, then its deltas, message and completion), reads its
/// history, and cancels its running turn; the site's own client sees the
/// cancel. A page (or an empty origin) can do none of it, not even for its
/// own session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_follows_any_sites_session_live_and_cancels_its_turn() {
    use pb::session_event::Kind;
    let h = Harness::start();
    h.approve(SITE, &[]).await;
    let mut raw = h.raw().await;
    let create = pb::CreateSessionRequest {
        caller_origin: SITE.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    let session = raw.create_session(create).await.unwrap().into_inner().session.unwrap().session_id;
    let watch = |caller: &str| pb::WatchSessionRequest { caller_origin: caller.into(), session_id: session.clone() };
    let history = |caller: &str| pb::GetSessionHistoryRequest {
        caller_origin: caller.into(),
        session_id: session.clone(),
        ..Default::default()
    };
    let cancel = |caller: &str| pb::CancelTurnRequest {
        caller_origin: caller.into(),
        session_id: session.clone(),
        ..Default::default()
    };

    // A page, another page, an empty origin: refused before the session is looked up.
    for caller in [SITE, "http://localhost:8080", "https://other.example", ""] {
        assert_eq!(code(&raw.watch_session(watch(caller)).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let read = raw.get_session_history(history(caller)).await.unwrap_err();
        assert_eq!(code(&read), "ORIGIN_NOT_ALLOWED", "{caller:?}");
        assert_eq!(code(&raw.cancel_turn(cancel(caller)).await.unwrap_err()), "ORIGIN_NOT_ALLOWED", "{caller:?}");
    }
    let unknown = pb::WatchSessionRequest { caller_origin: OWNER.into(), session_id: "sess-nobody".into() };
    assert_eq!(code(&raw.watch_session(unknown).await.unwrap_err()), "THREAD_NOT_FOUND");

    // The owner follows the site's turn live: snapshot, deltas, message, completion.
    let mut watched = raw.watch_session(watch(OWNER)).await.unwrap().into_inner();
    let snapshot = next_event(&mut watched).await;
    assert!(matches!(snapshot.kind, Some(Kind::Snapshot(ref s)) if s.status == pb::SessionStatus::Idle as i32));
    let send = |text: &str| pb::SendTextRequest {
        session_id: session.clone(),
        caller_origin: SITE.into(),
        text: text.into(),
        ..Default::default()
    };
    let first = raw.send_text(send("hello there")).await.unwrap().into_inner().operation_id;
    let turn = events_until(&mut watched, |k| matches!(k, Kind::OperationCompleted(_))).await;
    let streamed: String =
        turn.iter().filter_map(|k| if let Kind::ChatDelta(d) = k { Some(d.text.as_str()) } else { None }).collect();
    assert_eq!(streamed, "You said: hello there");
    assert!(turn.iter().any(|k| matches!(k, Kind::Chat(c) if c.text == "You said: hello there")), "{turn:?}");
    assert!(matches!(turn.last(), Some(Kind::OperationCompleted(c)) if c.error.is_none()), "{turn:?}");

    // It reads the transcript, as the site does with GetHistory.
    let entries = raw.get_session_history(history(OWNER)).await.unwrap().into_inner().entries;
    let texts: Vec<(&str, &str)> = entries
        .iter()
        .filter_map(|e| match e.kind.as_ref()? {
            pb::history_entry::Kind::UserText(t) => Some(("user", t.text.as_str())),
            pb::history_entry::Kind::AssistantMessage(t) => Some(("assistant", t.text.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(texts, [("user", "hello there"), ("assistant", "You said: hello there")]);
    assert!(entries.iter().any(|e| e.operation_id == first));

    // The user cancels the site's running turn; the site's own stream sees it end cancelled.
    let mut site_events = raw
        .subscribe(pb::SubscribeRequest { session_id: session.clone(), caller_origin: SITE.into() })
        .await
        .unwrap()
        .into_inner();
    next_event(&mut site_events).await;
    let slow = raw
        .send_text(send("/slow 200\none two three four five six seven eight nine ten eleven twelve"))
        .await
        .unwrap()
        .into_inner()
        .operation_id;
    events_until(&mut watched, |k| matches!(k, Kind::ChatDelta(_))).await;
    let cancelled = raw.cancel_turn(cancel(OWNER)).await.unwrap().into_inner();
    assert_eq!(cancelled.operation_id, slow);
    for stream in [&mut watched, &mut site_events] {
        let ended = events_until(stream, |k| matches!(k, Kind::OperationCompleted(_))).await;
        let Some(Kind::OperationCompleted(done)) = ended.last() else { unreachable!() };
        assert_eq!(done.error.as_ref().map(|e| e.code.as_str()), Some("OPERATION_CANCELLED"));
    }
    // Nothing running: a no-op, answered at once.
    assert_eq!(raw.cancel_turn(cancel(OWNER)).await.unwrap().into_inner().operation_id, "");
}

/// Watching is not subscribing: a session whose page left ends after the
/// disconnect grace although the user watches it, and the watcher sees it end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_session_still_ends_when_its_page_leaves() {
    use pb::session_event::Kind;
    let h = Harness::start();
    h.approve(SITE, &[]).await;
    let mut raw = h.raw().await;
    let create = pb::CreateSessionRequest { caller_origin: SITE.into(), ..Default::default() };
    let session = raw.create_session(create).await.unwrap().into_inner().session.unwrap().session_id;
    let page = raw
        .subscribe(pb::SubscribeRequest { session_id: session.clone(), caller_origin: SITE.into() })
        .await
        .unwrap()
        .into_inner();
    let watch = pb::WatchSessionRequest { caller_origin: OWNER.into(), session_id: session.clone() };
    let mut watched = raw.watch_session(watch).await.unwrap().into_inner();
    next_event(&mut watched).await;
    drop(page);
    let ended = events_until(&mut watched, |k| matches!(k, Kind::Ended(_))).await;
    assert!(matches!(ended.last(), Some(Kind::Ended(e)) if e.reason == "disconnected"), "{ended:?}");
}

/// The control center's Agents view (issue 42): the user lists what Core
/// detects of each provider — availability and why not, version where
/// known, default model, the install command of a missing agent, and the
/// default provider — while a page (or an empty origin) cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_lists_the_agents_core_detects_and_a_page_cannot() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let ask = |caller: &str| pb::ListAgentsRequest { caller_origin: caller.into() };
    for caller in [SITE, "http://localhost:8080", "https://other.example", ""] {
        let refused = raw.list_agents(ask(caller)).await.unwrap_err();
        let error = error_from_status(&refused);
        assert_eq!(error.code, "ORIGIN_NOT_ALLOWED", "{caller:?}");
        let details: serde_json::Value = serde_json::from_str(&error.details_json).unwrap();
        assert_eq!(details["reason"], "owner_only", "{caller:?}");
    }

    let listed = raw.list_agents(ask(OWNER)).await.unwrap().into_inner();
    assert_eq!(listed.default_provider, "scripted");
    let codes: Vec<_> = listed.agents.iter().map(|a| a.provider.clone().unwrap_or_default().code).collect();
    let providers: Vec<_> = raw.list_providers(pb::ListProvidersRequest {}).await.unwrap().into_inner().providers;
    assert_eq!(codes, providers.iter().map(|p| p.code.clone()).collect::<Vec<_>>(), "ListProviders' order");
    let agent = |code: &str| listed.agents.iter().find(|a| a.provider.as_ref().unwrap().code == code).unwrap();
    let scripted = agent("scripted");
    assert!(scripted.provider.as_ref().unwrap().available);
    assert_eq!((scripted.default_model.as_str(), scripted.install_command.as_str()), ("scripted-1", ""));
    assert!(!scripted.version.is_empty(), "the built-in agent's version is Core's");
    // Each agent either runs here, or says why; a missing npm agent says how to install it.
    for agent in &listed.agents {
        let provider = agent.provider.as_ref().unwrap();
        assert!(provider.available || !provider.reason.is_empty(), "{agent:?}");
        if provider.available {
            assert_eq!(agent.install_command, "", "{agent:?}");
        }
    }
    let codex = agent("codex");
    if !codex.provider.as_ref().unwrap().available {
        assert_eq!(codex.install_command, "npm install -g @openai/codex");
    }
    assert_eq!(agent("openai").install_command, "", "an endpoint is not installed");
}

/// The Rust SDK makes owner calls only through `Pedelec::owner()`, which a
/// client acting for a web origin cannot get; one acting for the user lists
/// a site's sessions, reads one's history, sees the agents and ends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_makes_owner_calls_only_when_it_asks_to_act_as_the_user() {
    let h = Harness::start();
    h.approve(SITE, &[]).await;
    let site = h.client_for(SITE).await;
    let refused = site.owner().err().expect("a page's client is never the user");
    assert_eq!(refused.code, "ORIGIN_NOT_ALLOWED");
    let session = site
        .create_session::<String>(pedelec_sdk::SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    session.send_text("hello").await.unwrap();

    let owner = h.client_for("app:pedelec-tray").await.owner().expect("a local program may act as the user");
    let live = owner.live_sessions(Some(SITE)).await.unwrap();
    let ids: Vec<String> =
        live.iter().map(|l| l.summary.as_ref().unwrap().session.as_ref().unwrap().session_id.clone()).collect();
    assert_eq!(ids, [session.session_id().to_owned()]);
    let history = owner.session_history(session.session_id(), pedelec_sdk::HistoryQuery::default()).await.unwrap();
    assert!(
        history
            .entries
            .iter()
            .any(|e| matches!(&e.kind, Some(pb::history_entry::Kind::UserText(t)) if t.text == "hello"))
    );
    let agents = owner.agents().await.unwrap();
    assert!(agents.agents.iter().any(|a| a.provider.as_ref().is_some_and(|p| p.code == "scripted")), "{agents:?}");
    assert!(owner.user_permissions().await.unwrap().is_empty());
    assert_eq!(owner.end_sessions(&[], Some(SITE)).await.unwrap(), 1);
    assert!(owner.live_sessions(None).await.unwrap().is_empty());
}
