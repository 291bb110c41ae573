//! `GetHistory`: the transcript page by page, and what a re-synchronised
//! subscriber missed, recovered by seq.

use std::time::Duration;

use pedelec_protocol::pb::{self, history_entry::Kind};
use pedelec_sdk::{ErrorCode, HistoryQuery, PedelecSession, SessionOptions};

use super::{Harness, ORIGIN, Via, counter_session};

/// One line per entry: what it is, without ids and times.
fn describe(entry: &pb::HistoryEntry) -> String {
    match entry.kind.as_ref().expect("every entry has a kind") {
        Kind::UserText(t) => format!("user_text {:?}", t.text),
        Kind::AssistantMessage(t) => format!("assistant_message {:?}", t.text),
        Kind::ToolCall(c) => format!("tool_call {} {}", c.tool, c.args_json),
        Kind::ToolResult(r) => match &r.outcome {
            Some(pb::history_tool_result::Outcome::ResultJson(json)) => format!("tool_result {json}"),
            Some(pb::history_tool_result::Outcome::ErrorCode(code)) => format!("tool_result error {code}"),
            None => "tool_result ?".into(),
        },
        Kind::Activity(a) => format!("activity {} {}", a.kind, a.summary),
        Kind::ToolFailed(f) => format!("tool_failed {} {}", f.tool, f.reason),
        Kind::OperationCompleted(o) => {
            format!("operation_completed {}", o.error.as_ref().map_or("ok", |e| e.code.as_str()))
        }
        Kind::Ended(e) => format!("ended {}", e.reason),
        Kind::Resumed(_) => "resumed".into(),
        Kind::ModelChanged(m) => format!("model_changed {} {}", m.model, m.effort_level),
    }
}

async fn all(session: &PedelecSession) -> Vec<pb::HistoryEntry> {
    session.history(HistoryQuery::default()).await.expect("history").entries
}

async fn a_tool_turn_reads_back_in_order(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let (session, _) = counter_session(&client).await;
    let prepared = session.prepare().await;
    prepared.expect("prepares");
    session.send_text("/tool update_counter {\"delta\": 2}").await.expect("the turn");
    session.end().await.expect("ends");
    let entries = all(&session).await;
    let lines: Vec<String> = entries.iter().map(describe).collect();
    assert_eq!(
        lines,
        [
            "operation_completed ok",
            "user_text \"/tool update_counter {\\\"delta\\\": 2}\"",
            "tool_call update_counter {\"delta\": 2}",
            "tool_result {\"value\":2}",
            "assistant_message \"Tool update_counter returned {\\\"value\\\":2}.\"",
            "operation_completed ok",
            "ended requested",
        ],
        "the preparation's prompt is not part of the history"
    );
    assert!(entries.windows(2).all(|w| w[0].id < w[1].id && w[0].seq <= w[1].seq), "ordered by id and seq");
    let turn = &entries[1].operation_id;
    assert!(!turn.is_empty());
    assert!(entries[1..6].iter().all(|e| &e.operation_id == turn), "the turn's entries name its operation");
    assert!(entries[6].operation_id.is_empty(), "ending is session-level");
}

async fn pages_go_back_with_before_id(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    for n in 0..4 {
        session.send_text(format!("turn {n}")).await.unwrap();
    }
    let whole = all(&session).await;
    assert_eq!(
        whole.len(),
        12,
        "a user text, a message and an outcome per turn: {:#?}",
        whole.iter().map(describe).collect::<Vec<_>>()
    );
    let mut pages = Vec::new();
    let mut before_id = 0;
    loop {
        let page = session.history(HistoryQuery { before_id, limit: 5, ..Default::default() }).await.unwrap();
        assert!(page.entries.len() <= 5);
        before_id = page.entries.first().map_or(0, |e| e.id);
        pages.insert(0, page.entries);
        if !page.has_more {
            break;
        }
    }
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 5, 5], "the newest page first, then older ones");
    assert_eq!(pages.concat(), whole, "the pages together are the whole history");
    let newest = session.history(HistoryQuery { limit: 1, ..Default::default() }).await.unwrap();
    assert_eq!(describe(&newest.entries[0]), "operation_completed ok");
    assert!(newest.has_more);
}

async fn bad_history_requests_are_refused(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let too_many = session.history(HistoryQuery { limit: 1001, ..Default::default() }).await.unwrap_err();
    assert_eq!(too_many.code, ErrorCode::InvalidArgument.as_str());
    let empty = session.history(HistoryQuery { after_seq: u64::MAX, ..Default::default() }).await.unwrap();
    assert!(empty.entries.is_empty() && !empty.has_more);
}

/// The SDK's own subscription lags (a handler blocks its reader while the
/// turn runs on) until it falls out of the session's event log (1 MiB here),
/// Core re-synchronises it, and the awaited turn still settles — from the
/// new snapshot's outcomes — as the success it was.
async fn an_awaited_turn_settles_through_a_resync(via: Via) {
    let h = Harness::with_config(via, "event_log_session_mib = 1\n");
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let blocked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deltas = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (once, seen) = (blocked.clone(), deltas.clone());
    let _slow = session.on_chat_delta(move |_, _| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(pedelec_protocol::limits::SUBSCRIBER_LAG_TIMEOUT + Duration::from_millis(500));
        }
    });
    let turn = tokio::time::timeout(Duration::from_secs(30), session.send_text("/deltas 300000"));
    turn.await.expect("the awaited turn settles").expect("as the success it was");
    let seen = deltas.load(std::sync::atomic::Ordering::SeqCst);
    // The blocked reader holds Core's stream back — over gRPC directly,
    // through the native host by the SDK's bounded queue filling, the host's
    // output pipe filling and the host no longer reading Core — and Core
    // re-synchronises it: deltas of the gap never reach the handler.
    assert!(seen < 300_000, "the reader was re-synchronised: {seen} of 300000 deltas reached it");
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle);
    session.send_text("and the next one runs").await.expect("the handle goes on");
}

super::over_both_transports!(
    a_tool_turn_reads_back_in_order,
    pages_go_back_with_before_id,
    bad_history_requests_are_refused,
    an_awaited_turn_settles_through_a_resync,
);

/// Another origin asking for a session's history is refused, as for every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_per_origin() {
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    session.send_text("secret").await.unwrap();
    let request = pb::GetHistoryRequest {
        session_id: session.session_id().into(),
        caller_origin: "app:someone-else".into(),
        ..Default::default()
    };
    let refused = h.raw().await.get_history(request).await.unwrap_err();
    let error = pedelec_protocol::grpc::error_from_status(&refused);
    assert_eq!(error.code, "THREAD_ACCESS_DENIED");
}

/// A subscriber that stops reading until it falls out of the session's
/// event log (1 MiB here; the default holds this whole turn) is
/// re-synchronised; the messages of the gap come back from the history after
/// the last seq it handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resynced_subscriber_recovers_the_messages_it_missed() {
    let h = Harness::with_config(Via::Grpc, "event_log_session_mib = 1\n");
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut stream = h.raw().await.subscribe(request).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let mut last_seen = first.seq;
    // The reader stalls through a long turn: it falls out of the log.
    session.send_text("/deltas 200000").await.unwrap();
    session.send_text("after the gap").await.unwrap();
    let snapshot = loop {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream goes on")
            .unwrap()
            .expect("the stream stays open");
        if let Some(pb::session_event::Kind::Snapshot(snapshot)) = event.kind {
            break snapshot;
        }
        last_seen = event.seq;
    };
    assert!(snapshot.last_seq > last_seen, "a gap: events {}..={} were not sent", last_seen + 1, snapshot.last_seq);
    let missed = session.history(HistoryQuery { after_seq: last_seen, ..Default::default() }).await.unwrap();
    let messages: Vec<String> =
        missed.entries.iter().filter(|e| matches!(e.kind, Some(Kind::AssistantMessage(_)))).map(describe).collect();
    assert_eq!(messages.len(), 2, "both turns' messages are recovered: {messages:?}");
    assert_eq!(messages[1], "assistant_message \"You said: after the gap\"");
    // Both outcomes are settled: in the snapshot (it may come while the
    // first turn still runs, the moment the reader fell out) or as
    // completions after it.
    let mut settled = snapshot.recent_outcomes.len();
    while settled < 2 {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream goes on")
            .unwrap()
            .expect("the stream stays open");
        match event.kind {
            Some(pb::session_event::Kind::OperationCompleted(_)) => settled += 1,
            Some(pb::session_event::Kind::Snapshot(snapshot)) => settled = snapshot.recent_outcomes.len(),
            _ => {}
        }
    }
}
