//! `changes()`: what a turn created, modified or deleted in its workspace,
//! with unified diffs, computed by Core for any agent; secrets listed
//! without content; the running turn's so far; and refusals that change
//! nothing. The scripted provider's `/write` stands in for an agent's edit,
//! confined to the workspace like everything a page can ask for.

use std::time::Duration;

use pedelec_protocol::pb::{self, ChangeKind};
use pedelec_sdk::{PedelecSession, SessionOptions, SessionStatus};

use super::{Harness, ORIGIN, Recorder, Via, eventually};

fn files(changes: &pb::GetChangesResponse) -> Vec<(String, ChangeKind)> {
    changes.files.iter().map(|f| (f.path.clone(), f.kind())).collect()
}

async fn session_in(client: &pedelec_sdk::Pedelec, workspace: &std::path::Path) -> PedelecSession {
    client
        .create_session(SessionOptions {
            workspace_path: Some(workspace.to_path_buf()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .expect("create")
}

/// Two turns: the first creates files, the second modifies and deletes;
/// each turn's changes stay readable by its id, the newest by default.
async fn each_turns_changes_come_back_with_diffs(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("old.txt"), "to be removed\n").unwrap();
    let session = session_in(&client, ws.path()).await;
    let none = session.changes(None).await.unwrap_err();
    assert_eq!(none.code, "CHANGES_NOT_FOUND", "no turn yet");

    session
        .send_text("/write notes.md first line\\nsecond line\n/write src/a.txt a\n/write .env API_KEY=hunter2")
        .await
        .unwrap();
    let first = session.changes(None).await.expect("changes");
    assert!(first.complete && !first.in_progress, "{first:?}");
    assert_eq!(
        files(&first),
        [
            (".env".to_owned(), ChangeKind::Created),
            ("notes.md".to_owned(), ChangeKind::Created),
            ("src/a.txt".to_owned(), ChangeKind::Created)
        ]
    );
    insta::assert_snapshot!(first.files[1].diff, @r"
    --- a/notes.md
    +++ b/notes.md
    @@ -0,0 +1,2 @@
    +first line
    +second line
    \ No newline at end of file
    ");
    let env = &first.files[0];
    assert!(env.secret && env.diff.is_empty(), "a secret is listed without content: {env:?}");
    assert!(!format!("{first:?}").contains("hunter2"));

    std::fs::remove_file(ws.path().join("old.txt")).unwrap_or_default();
    session.send_text("/write notes.md first line\\nchanged line").await.unwrap();
    let second = session.changes(None).await.unwrap();
    assert_ne!(second.turn_id, first.turn_id);
    assert_eq!(files(&second), [("notes.md".to_owned(), ChangeKind::Modified)], "{second:?}");
    let diff = &second.files[0].diff;
    assert!(diff.contains("\n-second line\n") && diff.contains("\n+changed line\n"), "{diff}");
    // The deletion happened between the turns (by the user): no turn's change.
    let again = session.changes(Some(&first.turn_id)).await.unwrap();
    assert_eq!(files(&again), files(&first), "the first turn's changes by its id");
    session.end().await.unwrap();
}

/// While a turn runs, its changes so far; then the recorded ones.
async fn a_running_turn_shows_its_changes_so_far(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let ws = tempfile::tempdir().unwrap();
    let session = session_in(&client, ws.path()).await;
    let recorder = Recorder::attach(&session);
    let turn = {
        let session = session.clone();
        tokio::spawn(async move { session.send_text("/write draft.txt v1\n/wait-steer 20000").await })
    };
    eventually("the turn runs", || session.get_status() == SessionStatus::Running).await;
    // The handle says running as it sends; Core's turn starts a moment later
    // (until then there is no turn to ask about), then writes the file.
    let mut so_far = None;
    for _ in 0..500 {
        match session.changes(None).await {
            Ok(changes) if !changes.files.is_empty() => {
                so_far = Some(changes);
                break;
            }
            Ok(changes) => assert!(changes.in_progress, "{changes:?}"),
            Err(error) => assert_eq!(error.code, "CHANGES_NOT_FOUND", "{error:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let so_far = so_far.expect("the write shows while the turn runs");
    assert!(so_far.in_progress, "{so_far:?}");
    assert_eq!(files(&so_far), [("draft.txt".to_owned(), ChangeKind::Created)]);
    session.steer("done").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), turn).await.unwrap().unwrap().unwrap();
    let recorded = session.changes(Some(&so_far.turn_id)).await.unwrap();
    assert!(!recorded.in_progress);
    assert_eq!(files(&recorded), files(&so_far));
    assert_eq!(recorder.count("error "), 0, "{:?}", recorder.lines());
    session.end().await.unwrap();
}

/// A page's prompt cannot make the scripted agent write outside its
/// workspace: not with `..`, an absolute path, into Core's runtime folder,
/// or through a link planted inside that points out. Nothing lands outside
/// and the turn's changes list nothing of it.
async fn writes_that_leave_the_workspace_are_refused(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
    let session = session_in(&client, ws.path()).await;
    let chat = Recorder::attach(&session);
    let escape = format!("/write {}/abs.txt x", outside.path().display());
    let attempts =
        ["/write ../up.txt x", escape.as_str(), "/write .pedelec-runtime/assets/x.txt y", "/write link/pwned.txt x"];
    session.send_text(attempts.join("\n")).await.unwrap();
    let refused = chat
        .lines()
        .iter()
        .filter(|l| l.starts_with("chat "))
        .map(|l| l.matches("Could not write").count())
        .sum::<usize>();
    assert_eq!(refused, if cfg!(unix) { 4 } else { 3 }, "{:?}", chat.lines());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing was written outside");
    assert!(!ws.path().parent().unwrap().join("up.txt").exists());
    assert!(!ws.path().join(".pedelec-runtime/assets/x.txt").exists());
    let changes = session.changes(None).await.unwrap();
    assert!(changes.files.is_empty(), "{changes:?}");

    // Another origin, a malformed or unknown turn id: refused, nothing changes.
    let mut raw = h.raw().await;
    let ask = |origin: &str, turn: &str| pb::GetChangesRequest {
        session_id: session.session_id().into(),
        caller_origin: origin.into(),
        turn_id: turn.into(),
    };
    let code = |status: tonic::Status| pedelec_protocol::grpc::error_from_status(&status).code;
    assert_eq!(code(raw.get_changes(ask("https://evil.example", "")).await.unwrap_err()), "THREAD_ACCESS_DENIED");
    assert_eq!(code(raw.get_changes(ask(ORIGIN, &"t".repeat(10_000))).await.unwrap_err()), "INVALID_ARGUMENT");
    assert_eq!(code(raw.get_changes(ask(ORIGIN, "turn-unknown")).await.unwrap_err()), "CHANGES_NOT_FOUND");
    session.end().await.unwrap();
}

super::over_both_transports!(
    each_turns_changes_come_back_with_diffs,
    a_running_turn_shows_its_changes_so_far,
    writes_that_leave_the_workspace_are_refused,
);
