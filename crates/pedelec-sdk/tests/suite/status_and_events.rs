//! Seed: "Session Status and Events".

use std::sync::{Arc, Mutex};

use pedelec_sdk::{ErrorCode, SessionOptions, SessionStatus, Source};

use super::*;

async fn a_turn_without_tools_follows_idle_running_idle(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    assert_eq!(session.get_status(), SessionStatus::Idle, "new handles begin idle");
    let log = Recorder::attach(&session);
    session.send_text("hello there").await.unwrap();
    assert_eq!(session.get_status(), SessionStatus::Idle);
    insta::assert_snapshot!(log.transcript());
}

async fn a_turn_with_a_frontend_tool_passes_through_waiting_tool_result(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let (session, counter) = counter_session(&client).await;
    let log = Recorder::attach(&session);
    session.send_text("/tool update_counter {\"delta\": 2}").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2);
    insta::assert_snapshot!(log.transcript());
}

async fn running_moves_to_error_when_the_runtime_fails(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    let err = session.send_text("/crash").await.unwrap_err();
    assert!(err.is(ErrorCode::SessionError), "{err}");
    assert_eq!(session.get_status(), SessionStatus::Error);
    assert!(session.send_text("again").await.unwrap_err().is(ErrorCode::SessionError), "error does not allow sendText");
    insta::assert_snapshot!(log.transcript());
}

/// Fault injection: a panic inside a provider's turn ends the operation with
/// an error (the awaited send rejects), the session returns to idle rather
/// than staying busy with no task behind it, and the next turn runs on a
/// fresh runtime.
async fn a_panic_in_the_provider_fails_the_turn_and_leaves_the_session_usable(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    let err = session.send_text("/panic").await.unwrap_err();
    assert!(err.is(ErrorCode::SendTextFailed), "{err}");
    assert_eq!(err.details.as_ref().and_then(|d| d["providerCode"].as_str()), Some("INTERNAL"), "{err:?}");
    assert_eq!(session.get_status(), SessionStatus::Idle);
    session.send_text("after the panic").await.expect("the session takes the next turn");
    assert!(log.lines().iter().any(|l| l == r#"chat "You said: after the panic" [user]"#), "{:?}", log.lines());
}

async fn running_moves_to_ended_and_the_pending_send_rejects_session_ended(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/sleep 10000").await });
    eventually("running", || session.get_status() == SessionStatus::Running).await;
    session.end().await.unwrap();
    let err = turn.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::SessionEnded), "{err}");
    assert_eq!(session.get_status(), SessionStatus::Ended);
    assert_eq!(log.count("ended"), 1);
}

async fn waiting_tool_result_moves_to_ended(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            tools: vec![super::counter_tool(Arc::default())],
            ..Default::default()
        })
        .await
        .unwrap();
    // A named handler that never answers keeps Core waiting.
    let _slow = session.on_tool("update_counter".to_string(), |_: serde_json::Value, _| async {
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        Ok::<_, String>(serde_json::json!(null))
    });
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/tool update_counter {\"delta\": 1}").await });
    eventually("waiting", || session.get_status() == SessionStatus::WaitingToolResult).await;
    session.end().await.unwrap();
    assert!(turn.await.unwrap().unwrap_err().is(ErrorCode::SessionEnded));
    assert_eq!(session.get_status(), SessionStatus::Ended);
}

async fn status_handlers_run_only_on_change_and_never_for_the_initial_value(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _off = session.on_status(move |status, ctx| s.lock().unwrap().push((status, ctx.source)));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(seen.lock().unwrap().is_empty(), "registering does not emit the current status");
    session.send_text("hi").await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(SessionStatus::Running, Source::Sdk), (SessionStatus::Idle, Source::Core)],
        "sdk running then core running is one callback"
    );
}

async fn contexts_carry_the_seed_fields(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions {
            effort_level: Some(pedelec_sdk::EffortLevel::Low),
            ..Default::default()
        })
        .await
        .unwrap();
    let chats = Arc::new(Mutex::new(Vec::new()));
    let c = chats.clone();
    let _off = session.on_chat(move |_, ctx| c.lock().unwrap().push(ctx.clone()));
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let s = statuses.clone();
    let _off2 = session.on_status(move |_, ctx| s.lock().unwrap().push(ctx.clone()));
    session.send_text("context please").await.unwrap();
    let ctx = chats.lock().unwrap()[0].clone();
    assert_eq!(ctx.kind.as_str(), "chat");
    assert_eq!(ctx.session_id, session.session_id());
    assert_eq!(ctx.provider, "scripted");
    assert_eq!(ctx.effort_level, Some(pedelec_sdk::EffortLevel::Low));
    assert_eq!(ctx.session_created_at, session.session_created_at());
    assert!(ctx.event_received_at.is_some(), "Core chat callbacks include the received time");
    assert!(ctx.event_emitted_at > 0);
    assert!(ctx.turn_id.is_some() && ctx.turn_started_at.is_some());
    assert_eq!(ctx.turn_kind, Some(pb::TurnKind::User));
    assert_eq!(ctx.source, Source::Core);
    let local = statuses.lock().unwrap()[0].clone();
    assert_eq!((local.kind.as_str(), local.source), ("sdk_status_changed", Source::Sdk));
    assert_eq!(local.event_received_at, None, "local status changes have no received time");
}

async fn send_text_neither_trims_nor_requires_text(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    session.send_text("").await.unwrap();
    session.send_text("  spaced  ").await.unwrap();
    let chats: Vec<String> = log.lines().into_iter().filter(|l| l.starts_with("chat")).collect();
    assert_eq!(chats, vec!["chat \"You said: \" [user]", "chat \"You said:   spaced  \" [user]"]);
}

async fn a_second_send_during_a_turn_is_session_busy(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let s = session.clone();
    let first = tokio::spawn(async move { s.send_text("/sleep 300\nfirst").await });
    eventually("running", || session.get_status() == SessionStatus::Running).await;
    assert!(session.send_text("second").await.unwrap_err().is(ErrorCode::SessionBusy));
    first.await.unwrap().unwrap();
}

async fn send_resolves_after_its_messages_and_rejects_when_the_turn_fails(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let log = Recorder::attach(&session);
    session.send_text("complete me").await.unwrap();
    assert!(
        log.lines().contains(&"chat \"You said: complete me\" [user]".to_string()),
        "completion comes after the chat"
    );
    let err = session.send_text("/fail model overloaded").await.unwrap_err();
    assert!(err.is(ErrorCode::SendTextFailed));
    assert_eq!(err.message, "model overloaded");
    assert_eq!(session.get_status(), SessionStatus::Idle, "a failed turn leaves the session usable");
    assert_eq!(log.count("error SEND_TEXT_FAILED [core/error]"), 1, "onError observes the Core error");
    session.send_text("still works").await.unwrap();
}

async fn usage_is_absent_until_reported_monotonic_and_silent(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    assert_eq!(session.usage().total_tokens, None);
    let log = Recorder::attach(&session);
    session.send_text("/usage 500").await.unwrap();
    assert_eq!(session.usage().total_tokens, Some(500));
    session.send_text("/usage 100").await.unwrap();
    assert_eq!(session.usage().total_tokens, Some(500), "monotonic per handle");
    let lines = log.lines();
    let usage_lines: Vec<&String> = lines.iter().filter(|l| l.starts_with("usage")).collect();
    assert_eq!(usage_lines, vec!["usage 500"]);
    assert_eq!(log.count("error"), 0);
}

async fn disposers_unregister_without_cancelling_work(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let count = Arc::new(Mutex::new(0));
    let c = count.clone();
    let off = session.on_chat(move |_, _| *c.lock().unwrap() += 1);
    session.send_text("one").await.unwrap();
    let s = session.clone();
    let turn = tokio::spawn(async move { s.send_text("/sleep 100\ntwo").await });
    off.dispose();
    turn.await.unwrap().expect("disposing a handler does not cancel the turn");
    assert_eq!(*count.lock().unwrap(), 1);
}

fn delta_counter(session: &PedelecSession) -> (Arc<std::sync::atomic::AtomicU64>, pedelec_sdk::Disposer) {
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = count.clone();
    let disposer = session.on_chat_delta(move |_, _| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    (count, disposer)
}

/// Core's per-subscriber queues are bounded; a reader that keeps up makes the
/// provider wait rather than lose anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_keeps_up_gets_every_delta_of_a_long_burst() {
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let (count, _d) = delta_counter(&session);
    session.send_text("/deltas 30000").await.unwrap();
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 30_000);
}

/// Issue 40: `idle` on the stream means a `SendText` will be accepted. A raw
/// client (no SDK gate or retry) sends its next text the moment it reads the
/// previous operation's `StatusChanged(IDLE)`: Core announces that status only
/// with the operation already released, so none of 1 000 sends is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_on_idle_as_seen_on_the_stream_is_never_refused() {
    use pb::session_event::Kind;
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let mut raw = h.raw().await;
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut events = raw.subscribe(request).await.unwrap().into_inner();
    let first = events.message().await.unwrap().expect("a snapshot first");
    assert!(matches!(first.kind, Some(Kind::Snapshot(_))), "{first:?}");
    let mut refused = Vec::new();
    for n in 0..1_000 {
        let send = pb::SendTextRequest {
            session_id: session.session_id().into(),
            caller_origin: ORIGIN.into(),
            text: format!("turn {n}"),
            attachments: Vec::new(),
            ..Default::default()
        };
        let operation = match raw.send_text(send).await {
            Ok(accepted) => accepted.into_inner().operation_id,
            Err(status) => {
                refused.push(format!("turn {n}: {}", status.message()));
                break;
            }
        };
        // Read up to this operation's idle, then send at once.
        loop {
            let event = events.message().await.unwrap().expect("the stream stays open");
            match event.kind {
                Some(Kind::StatusChanged(change))
                    if event.operation_id == operation && change.status == pb::SessionStatus::Idle as i32 =>
                {
                    break;
                }
                Some(Kind::Snapshot(_)) => panic!("a reader that keeps up is never re-synchronised (turn {n})"),
                _ => {}
            }
        }
    }
    assert!(refused.is_empty(), "a send on idle was refused: {refused:?}");
}

/// Reads `stream` up to the operation's completion: (deltas, snapshots after
/// the first, whether the completion arrived as an event).
async fn read_turn(stream: &mut tonic::Streaming<pb::SessionEvent>) -> (usize, usize, bool) {
    use pb::session_event::Kind;
    let (mut deltas, mut snapshots, mut last_seq) = (0, 0, 0u64);
    loop {
        let event = tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .expect("the subscriber is served")
            .expect("the stream stays open")
            .expect("the stream stays open");
        assert!(event.seq >= last_seq, "never older than what came before");
        last_seq = event.seq;
        match event.kind.unwrap() {
            Kind::Snapshot(snapshot) => {
                snapshots += 1;
                if snapshot.status == pb::SessionStatus::Idle as i32 && snapshots > 1 {
                    return (deltas, snapshots - 1, false);
                }
            }
            Kind::ChatDelta(_) => deltas += 1,
            Kind::OperationCompleted(_) => return (deltas, snapshots.saturating_sub(1), true),
            _ => {}
        }
    }
}

/// Issue 40: a subscriber that stops reading does not hold the turn, and
/// since the turn fits the session's event log, it loses nothing either:
/// when it reads again it gets every delta and the completion, with no
/// re-synchronisation. (Before, a reader silent past a grace was dropped and
/// re-synchronised from a snapshot, losing the events in between.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_inside_the_log_loses_nothing_and_does_not_hold_the_turn() {
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let (count, _d) = delta_counter(&session);
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut stalled = h.raw().await.subscribe(request).await.unwrap().into_inner();
    // More deltas than the HTTP/2 windows hold.
    let n = 100_000;
    session.send_text(format!("/deltas {n}")).await.expect("the turn finishes despite the stalled reader");
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), n, "the live reader lost nothing");
    let (deltas, resyncs, completed) = read_turn(&mut stalled).await;
    assert_eq!((deltas, resyncs, completed), (n as usize, 0, true), "the stalled reader lost nothing either");
}

/// Only a reader that falls out of the log is re-synchronised: with a 1 MiB
/// log, a stalled reader of a 100 000-delta turn continues from a fresh
/// snapshot whose recent_outcomes settle what it missed. (The provider never
/// waits, so with a log this small a live reader slower than the provider
/// may fall out too; the SDK's send still settles from the snapshot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_out_of_the_log_is_resynchronised_with_a_snapshot() {
    let h = Harness::with_config(Via::Grpc, "event_log_session_mib = 1\n");
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut stalled = h.raw().await.subscribe(request).await.unwrap().into_inner();
    let n = 100_000u64;
    session.send_text(format!("/deltas {n}")).await.expect("the turn finishes despite the stalled reader");

    // It fell out while the turn ran (its transport stopped taking events
    // once the HTTP/2 window was full): a later snapshot, then live again
    // up to the completion, or an idle snapshot taken after it.
    let (deltas, resyncs, _) = read_turn(&mut stalled).await;
    assert!(resyncs >= 1, "re-synchronised once it fell out of the log");
    assert!((deltas as u64) < n, "the dropped events are not replayed ({deltas})");
}

/// Silent subscribers do not hold a turn back (the provider never waits on a
/// reader), and each, reading at last, gets the whole turn: every delta and
/// the completion, no re-synchronisation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_subscribers_do_not_hold_a_turn_back_and_lose_nothing() {
    let h = Harness::start();
    let session = h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap();
    let request = pb::SubscribeRequest { session_id: session.session_id().into(), caller_origin: ORIGIN.into() };
    let mut silent = Vec::new();
    for _ in 0..6 {
        silent.push(h.raw().await.subscribe(request.clone()).await.unwrap().into_inner());
    }
    let n = 100_000;
    session.send_text(format!("/deltas {n}")).await.expect("the turn finishes despite six stalled readers");
    for stream in &mut silent {
        assert_eq!(read_turn(stream).await, (n, 0, true));
    }
}

super::over_both_transports!(
    a_turn_without_tools_follows_idle_running_idle,
    events_stream_and_turn_handles,
    a_turn_with_a_frontend_tool_passes_through_waiting_tool_result,
    running_moves_to_error_when_the_runtime_fails,
    a_panic_in_the_provider_fails_the_turn_and_leaves_the_session_usable,
    running_moves_to_ended_and_the_pending_send_rejects_session_ended,
    waiting_tool_result_moves_to_ended,
    status_handlers_run_only_on_change_and_never_for_the_initial_value,
    contexts_carry_the_seed_fields,
    send_text_neither_trims_nor_requires_text,
    a_second_send_during_a_turn_is_session_busy,
    send_resolves_after_its_messages_and_rejects_when_the_turn_fails,
    usage_is_absent_until_reported_monotonic_and_silent,
    disposers_unregister_without_cancelling_work,
);

/// Handlers run in the order the machine produced their events, even when
/// two tasks feed the machine at once: here the event loop is inside a slow
/// `on_status` handler (for `waiting_tool_result`) when the caller's `end()`
/// produces `ended`. That handler must run after the slow one returns, not
/// beside it, so each change's `previous` is the status the app saw last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_handlers_run_in_order_when_two_tasks_feed_the_machine() {
    let h = Harness::start();
    let (session, _) = counter_session(&h.client().await).await;
    let seen = Arc::new(Mutex::new(vec![SessionStatus::Idle.to_string()]));
    let broken = Arc::new(Mutex::new(Vec::new()));
    let in_slow_handler = Arc::new(tokio::sync::Notify::new());
    let (s, b, slow) = (seen.clone(), broken.clone(), in_slow_handler.clone());
    let _off = session.on_status(move |status, ctx| {
        if status == SessionStatus::WaitingToolResult {
            slow.notify_one();
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut seen = s.lock().unwrap();
        if seen.last().map(String::as_str) != Some(ctx.previous_status.as_str()) {
            b.lock().unwrap().push(format!("saw {:?}, then {} → {status}", seen.last(), ctx.previous_status));
        }
        seen.push(status.to_string());
    });
    let turn = session.clone();
    let turn = tokio::spawn(async move { turn.send_text("/tool update_counter {\"delta\": 1}").await });
    in_slow_handler.notified().await;
    session.end().await.unwrap();
    let _ = turn.await.unwrap();
    assert!(broken.lock().unwrap().is_empty(), "handlers ran out of order: {:?}", broken.lock().unwrap());
    assert_eq!(seen.lock().unwrap().last().map(String::as_str), Some("ended"));
}

/// The Rust shapes of the callbacks: `events()` as a `Stream`, and a turn
/// handle that streams its own events and resolves with its outcome.
async fn events_stream_and_turn_handles(via: Via) {
    use futures::StreamExt;
    use pedelec_sdk::SessionEvent;
    let h = Harness::start_via(via);
    let client = h.client().await;
    let session = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    let mut events = session.events();
    session.send_text("hello").await.unwrap();
    let mut seen = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        let idle = matches!(event, SessionEvent::Status { status: pedelec_sdk::SessionStatus::Idle, .. });
        seen.push(event);
        if idle {
            break;
        }
    }
    let chats: Vec<&str> = seen
        .iter()
        .filter_map(|e| if let SessionEvent::Chat { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    assert_eq!(chats, ["You said: hello"], "{seen:?}");
    assert!(seen.iter().any(|e| matches!(e, SessionEvent::ChatDelta { .. })), "deltas stream: {seen:?}");
    assert!(
        matches!(seen.first(), Some(SessionEvent::Status { status: pedelec_sdk::SessionStatus::Running, .. })),
        "{seen:?}"
    );

    // A turn handle: its events, then its outcome; a failing turn says why.
    let mut turn = session.send_text_turn("again");
    let mut texts = Vec::new();
    while let Some(event) = turn.next().await {
        if let SessionEvent::Chat { text, .. } = event {
            texts.push(text);
        }
    }
    assert_eq!(texts, ["You said: again"]);
    turn.outcome().await.expect("the turn succeeded");
    let failing = session.send_text_turn("/fail boom");
    let error = failing.outcome().await.expect_err("the scripted failure");
    assert!(!error.code.is_empty(), "{error:?}");

    // Dropping the stream unregisters its handlers; the session goes on.
    drop(events);
    session.send_text("after").await.unwrap();
    session.end().await.unwrap();
}
