//! `on_activity`: the agent's own work as it happens — normalised kinds and
//! statuses, each update the whole activity, the running turn's activities
//! in the snapshot for a handle that attaches mid-turn, and the settled ones
//! in the history.

use std::sync::{Arc, Mutex};

use pedelec_protocol::activity::{kind_name, status_name};
use pedelec_protocol::pb::history_entry::Kind;
use pedelec_sdk::{HistoryQuery, PedelecSession, SessionOptions, SessionStatus};

use super::{Harness, Via, eventually};

/// Records each activity update as `id kind status title`.
fn record(session: &PedelecSession) -> Arc<Mutex<Vec<String>>> {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let into = seen.clone();
    std::mem::forget(session.on_activity(move |a, ctx| {
        assert_eq!(ctx.kind.as_str(), "activity");
        let status = status_name(a.status).unwrap_or("-");
        let plan: Vec<String> =
            a.plan.iter().map(|e| format!("{}={}", e.content, status_name(e.status).unwrap_or("-"))).collect();
        let mut line = format!("{} {} {status} {:?}", a.activity_id, kind_name(a.kind), a.title);
        if !a.command.is_empty() {
            line.push_str(&format!(" command={:?}", a.command));
        }
        if !a.output.is_empty() {
            line.push_str(&format!(" output={:?}", a.output));
        }
        if !plan.is_empty() {
            line.push_str(&format!(" plan=[{}]", plan.join(", ")));
        }
        into.lock().unwrap().push(line);
    }));
    seen
}

async fn activities_stream_and_settle_into_the_history(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let seen = record(&session);
    session.send_text("/plan read the notes; summarise them\n/command cat notes.txt\nDone.").await.unwrap();
    insta::assert_snapshot!("activities_of_a_turn", seen.lock().unwrap().join("\n"));

    let entries = session.history(HistoryQuery::default()).await.unwrap().entries;
    let recorded: Vec<(String, String)> = entries
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Activity(a)) => Some((a.summary.clone(), status_name(a.activity.clone()?.status)?.to_owned())),
            _ => None,
        })
        .collect();
    assert_eq!(
        recorded,
        [
            ("cat notes.txt (completed)".to_string(), "completed".to_string()),
            ("Plan (0/2 done) (in_progress)".to_string(), "in_progress".to_string()),
        ],
        "each activity once: the command when it settled, the open plan when the turn ended"
    );
    session.end().await.unwrap();
}

/// A handler registered mid-turn — on a second handle that attached while
/// the turn runs (another tab) — is first told what the turn is doing.
async fn a_handle_attaching_mid_turn_hears_the_running_activities(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() })
        .await
        .unwrap();
    let first = record(&session);
    let running = session.clone();
    let turn = tokio::spawn(async move { running.send_text("/slow 3000\n/command make test\n/deltas 1").await });
    eventually("the command runs", || first.lock().unwrap().iter().any(|l| l.contains("in_progress"))).await;
    let second = h.client().await.resume_session::<String>(session.session_id()).await.unwrap();
    let seen = record(&second);
    assert_eq!(
        seen.lock().unwrap().first().map(String::as_str),
        Some(r#"scripted-1 command in_progress "make test" command="make test""#),
        "told at registration, from the snapshot"
    );
    turn.await.unwrap().unwrap();
    eventually("the second handle saw the command settle", || {
        seen.lock().unwrap().iter().any(|l| l.starts_with("scripted-1 command completed"))
    })
    .await;
    // Once the second handle has seen the operation complete (the first one
    // had, when its send_text resolved), no turn runs: nothing to replay.
    let completed = session.last_seq();
    eventually("the second handle saw the completion", || second.last_seq() >= completed).await;
    assert_eq!(second.get_status(), SessionStatus::Idle);
    let late = record(&second);
    assert!(late.lock().unwrap().is_empty(), "nothing runs once the turn is over");
    session.end().await.unwrap();
}

super::over_both_transports!(
    activities_stream_and_settle_into_the_history,
    a_handle_attaching_mid_turn_hears_the_running_activities,
);
