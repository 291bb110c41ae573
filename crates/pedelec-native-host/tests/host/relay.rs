//! What the relay must do for a well-behaved browser.

use std::time::Duration;

use pedelec_protocol::pb::{self, native_frame::Body, native_request::Call, native_response::Result as R};

use super::*;

#[test]
fn pings_pair_by_request_id_and_the_host_exits_when_stdin_closes() {
    let env = Env::with_core();
    let mut host = env.host();
    for id in [7, 3, 9] {
        host.send(&request(id, Call::Ping(pb::PingRequest {})));
    }
    let ids: Vec<u32> = (0..3).map(|_| host.recv().unwrap().request_id).collect();
    assert_eq!(ids, vec![7, 3, 9], "replies keep request order");
    host.close_stdin();
    let status = host.wait_exit(Duration::from_secs(2)).expect("the host exits promptly");
    assert!(status.success());
}

#[test]
fn a_session_runs_through_the_host_with_its_events_in_order() {
    let env = Env::with_core();
    let mut host = env.host();
    let session = create(&mut host, 1, ORIGIN);
    let Body::Response(pb::NativeResponse { result: Some(R::Subscribe(snapshot)) }) = host
        .call(2, Call::Subscribe(pb::SubscribeRequest { session_id: session.clone(), caller_origin: ORIGIN.into() }))
    else {
        panic!("subscribe answers with the snapshot")
    };
    assert!(matches!(snapshot.kind, Some(pb::session_event::Kind::Snapshot(_))));
    host.send(&request(
        3,
        Call::SendText(pb::SendTextRequest {
            session_id: session.clone(),
            caller_origin: ORIGIN.into(),
            text: "/deltas 50".into(),
            ..Default::default()
        }),
    ));
    let mut seqs = Vec::new();
    loop {
        let frame = host.recv().unwrap();
        if let Some(Body::Event(e)) = frame.body {
            assert_eq!(frame.request_id, 2, "events carry their subscription's id");
            seqs.push(e.seq);
            if matches!(e.kind, Some(pb::session_event::Kind::OperationCompleted(_))) {
                break;
            }
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "per-session order, no gap: {seqs:?}");
    assert!(seqs.len() > 50);
    // Core emits the 50 deltas at once: the host had them ready together.
    assert!(host.batches > 0, "events ready together travel as batches");
    assert!(host.raw_sizes.len() < seqs.len(), "{} frames for {} events", host.raw_sizes.len(), seqs.len());
}

/// The user's event monitor through the host (the control center's own
/// host): WatchSession answers with the snapshot, then each event is a
/// frame of its own (the page reads JSON and has no decoder for a batch's
/// protobuf), tagged with the watch's request id; Unsubscribe stops it. A
/// page's origin is refused.
#[test]
fn the_owner_watches_a_session_through_the_host_one_event_frame_each() {
    let env = Env::with_core();
    let mut host = env.host();
    let session = create(&mut host, 1, ORIGIN);
    let watch = |caller: &str| {
        Call::WatchSession(pb::WatchSessionRequest { caller_origin: caller.into(), session_id: session.clone() })
    };
    assert_eq!(error_code(&host.call(2, watch(ORIGIN))), "ORIGIN_NOT_ALLOWED");
    let Body::Response(pb::NativeResponse { result: Some(R::WatchSession(snapshot)) }) = host.call(3, watch(OWNER))
    else {
        panic!("WatchSession answers with the snapshot")
    };
    assert!(matches!(snapshot.kind, Some(pb::session_event::Kind::Snapshot(_))));
    let frames_before = host.raw_sizes.len();
    host.send(&request(
        4,
        Call::SendText(pb::SendTextRequest {
            session_id: session.clone(),
            caller_origin: ORIGIN.into(),
            text: "/deltas 50".into(),
            ..Default::default()
        }),
    ));
    let mut seqs = Vec::new();
    loop {
        let frame = host.recv().unwrap();
        if let Some(Body::Event(e)) = frame.body {
            assert_eq!(frame.request_id, 3, "events carry their watch's id");
            seqs.push(e.seq);
            if matches!(e.kind, Some(pb::session_event::Kind::OperationCompleted(_))) {
                break;
            }
        }
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "per-session order, no gap: {seqs:?}");
    assert!(seqs.len() > 50);
    assert_eq!(host.batches, 0, "a watch's events never travel as a batch");
    assert!(host.raw_sizes.len() - frames_before > seqs.len(), "one frame per event, and the SendText answer");
    // Unsubscribed, the next turn's events do not come.
    let stop = pb::UnsubscribeRequest { session_id: session.clone(), subscription_id: 3 };
    assert!(matches!(host.call(5, Call::Unsubscribe(stop)), Body::Response(_)));
    let send = pb::SendTextRequest {
        session_id: session,
        caller_origin: ORIGIN.into(),
        text: "again".into(),
        ..Default::default()
    };
    host.send(&request(6, Call::SendText(send)));
    // The scripted turn is over well within this; its events would be out first.
    std::thread::sleep(Duration::from_millis(500));
    host.send(&request(7, Call::Ping(pb::PingRequest {})));
    loop {
        let frame = host.recv().unwrap();
        assert!(!matches!(frame.body, Some(Body::Event(_))), "an event after Unsubscribe: {frame:?}");
        if frame.request_id == 7 {
            break;
        }
    }
}

/// A tool loop over the host: the scripted agent calls `echo` three times
/// and the answers go with `defer_ack`, as the SDKs send them.
#[test]
fn a_deferred_tool_answer_rides_on_the_next_frame_and_failures_answer_at_once() {
    let env = Env::with_core();
    let mut host = env.host();
    let mut other = env.host();
    let echo = pb::ToolDefinition {
        name: "echo".into(),
        description: "echo".into(),
        input_schema_json: r#"{"type":"object"}"#.into(),
        timeout_ms: 0,
        read_only_hint: false,
    };
    let create = pb::CreateSessionRequest {
        skills: Some(pb::Skills { guidance: String::new(), tools: vec![echo] }),
        caller_origin: ORIGIN.into(),
        ..Default::default()
    };
    let Body::Response(pb::NativeResponse { result: Some(R::CreateSession(created)) }) =
        host.call(1, Call::CreateSession(create))
    else {
        panic!("the session is created")
    };
    let session = created.session.unwrap().session_id;
    let subscribe = pb::SubscribeRequest { session_id: session.clone(), caller_origin: ORIGIN.into() };
    assert!(matches!(host.call(2, Call::Subscribe(subscribe)), Body::Response(_)));
    let text = "/tools 3 echo {}".into();
    let send =
        pb::SendTextRequest { session_id: session.clone(), caller_origin: ORIGIN.into(), text, ..Default::default() };
    host.send(&request(3, Call::SendText(send)));
    let submit = |id: u32, tool_request_id: String| pb::NativeFrame {
        request_id: id,
        body: Some(Body::Request(pb::NativeRequest {
            call: Some(Call::SubmitToolResult(pb::SubmitToolResultRequest {
                session_id: session.clone(),
                caller_origin: ORIGIN.into(),
                tool_request_id,
                outcome: Some(pb::submit_tool_result_request::Outcome::ResultJson("{}".into())),
            })),
        })),
        defer_ack: true,
        ..Default::default()
    };
    let mut answered = Vec::new();
    let mut next_id = 10;
    loop {
        let frame = host.recv().unwrap();
        assert!(
            !answered.contains(&frame.request_id),
            "a deferred success has no response frame of its own: {frame:?}"
        );
        let Some(Body::Event(event)) = frame.body else { continue };
        match event.kind {
            Some(pb::session_event::Kind::ToolCall(call)) if answered.len() < 2 => {
                host.send(&submit(next_id, call.tool_request_id));
                answered.push(next_id);
                next_id += 1;
            }
            // The last answer goes through another host, which has no
            // events to put it on: it goes alone, a moment later.
            Some(pb::session_event::Kind::ToolCall(call)) => {
                let started = std::time::Instant::now();
                other.send(&submit(99, call.tool_request_id));
                assert_eq!(other.recv_acks(), vec![(99, false)], "a frame of acks alone");
                assert!(started.elapsed() < Duration::from_secs(5));
            }
            Some(pb::session_event::Kind::OperationCompleted(_)) => break,
            _ => {}
        }
    }
    // Each of the first two answers rode on a frame that carried events.
    assert_eq!(host.acks, vec![(10, true), (11, true)], "acks ride on later frames, in order");
    // A deferred request that fails is an error frame at once, and a
    // request whose success carries data ignores the flag.
    let mut refused = submit(20, "tool-unknown".into());
    refused.request_id = 20;
    host.send(&refused);
    assert_eq!(error_code(&host.reply(20)), "TOOL_REQUEST_NOT_FOUND");
    let ping = pb::NativeFrame { defer_ack: true, ..request(21, Call::Ping(pb::PingRequest {})) };
    host.send(&ping);
    assert!(matches!(host.reply(21), Body::Response(pb::NativeResponse { result: Some(R::Ping(_)) })));
}

#[test]
fn a_large_event_travels_as_chunks_no_frame_over_one_mebibyte() {
    let env = Env::with_core();
    let mut host = env.host();
    let session = create(&mut host, 1, ORIGIN);
    host.call(2, Call::Subscribe(pb::SubscribeRequest { session_id: session.clone(), caller_origin: ORIGIN.into() }));
    // Within the 1 MiB text limit, but control characters are escaped six-fold
    // in JSON, so the echoed chat event is about 5 MiB of JSON. It is also
    // over a batch's budget, so it always travels alone, as chunks.
    let text = "\u{1}".repeat(800 * 1024);
    host.send(&request(
        3,
        Call::SendText(pb::SendTextRequest {
            session_id: session,
            caller_origin: ORIGIN.into(),
            text: text.clone(),
            ..Default::default()
        }),
    ));
    let chat = loop {
        if let Some(Body::Event(pb::SessionEvent { kind: Some(pb::session_event::Kind::Chat(c)), .. })) =
            host.recv().unwrap().body
        {
            break c.text;
        }
    };
    assert_eq!(chat, format!("You said: {text}"), "never truncated");
    assert!(host.raw_sizes.iter().all(|&n| n <= limits::NATIVE_HOST_TO_BROWSER_MAX));
    assert!(host.raw_sizes.iter().filter(|&&n| n > 900_000).count() >= 3, "it was chunked");
}

#[test]
fn the_host_starts_core_when_it_is_not_running() {
    let mut env = Env::without_core();
    let mut host = env.host();
    match host.call(1, Call::Ping(pb::PingRequest {})) {
        Body::Response(pb::NativeResponse { result: Some(R::Ping(p)) }) => {
            assert!(p.pid > 0);
            // Core outlives the host: stop it here.
            unsafe_kill(p.pid);
        }
        other => panic!("{other:?}"),
    }
    env.core = None;
}

#[test]
fn without_a_startable_core_requests_get_core_runtime_unavailable() {
    let env = Env::without_core();
    let mut host =
        env.host_with(&[format!("chrome-extension://{ID}/")], &[("PEDELEC_CORE_BIN", "/nonexistent/pedelec-core")]);
    assert_eq!(error_code(&host.call(1, Call::Ping(pb::PingRequest {}))), "CORE_RUNTIME_UNAVAILABLE");
}

#[test]
fn a_disallowed_extension_is_refused() {
    let env = Env::with_core();
    let other = "abcdefghijklmnopabcdefghijklmnop";
    let mut host = env.host_with(&[format!("chrome-extension://{other}/")], &[]);
    let frame = host.recv().expect("an explanation frame");
    assert!(matches!(&frame.body, Some(Body::Error(e)) if e.code == "ORIGIN_NOT_ALLOWED"));
    assert!(!host.wait_exit(Duration::from_secs(2)).unwrap().success());
    let mut malformed = env.host_with(&["chrome-extension://nope/".into()], &[]);
    assert!(matches!(malformed.recv().unwrap().body, Some(Body::Error(e)) if e.code == "ORIGIN_NOT_ALLOWED"));
}

#[test]
fn core_killed_mid_stream_is_reported_on_every_subscription_and_the_host_exits() {
    let mut env = Env::with_core();
    let mut host = env.host();
    let a = create(&mut host, 1, ORIGIN);
    let b = create(&mut host, 2, ORIGIN);
    host.call(3, Call::Subscribe(pb::SubscribeRequest { session_id: a, caller_origin: ORIGIN.into() }));
    host.call(4, Call::Subscribe(pb::SubscribeRequest { session_id: b, caller_origin: ORIGIN.into() }));
    env.core.as_mut().unwrap().kill();
    let mut reported = Vec::new();
    while let Some(frame) = host.recv() {
        if let Some(Body::Error(e)) = frame.body {
            assert_eq!(e.code, "CORE_RUNTIME_UNAVAILABLE");
            reported.push(frame.request_id);
        }
    }
    reported.sort();
    assert_eq!(reported, vec![3, 4]);
    assert!(host.wait_exit(Duration::from_secs(2)).is_some());
}

#[test]
fn unsubscribing_ends_the_core_subscription_so_auto_end_applies() {
    let env = Env::with_core();
    let mut host = env.host();
    let session = create(&mut host, 1, ORIGIN);
    host.call(2, Call::Subscribe(pb::SubscribeRequest { session_id: session.clone(), caller_origin: ORIGIN.into() }));
    host.call(3, Call::Unsubscribe(pb::UnsubscribeRequest { session_id: session.clone(), subscription_id: 2 }));
    std::thread::sleep(Duration::from_millis(700));
    let Body::Response(pb::NativeResponse { result: Some(R::Subscribe(snapshot)) }) =
        host.call(4, Call::Subscribe(pb::SubscribeRequest { session_id: session, caller_origin: ORIGIN.into() }))
    else {
        panic!()
    };
    let Some(pb::session_event::Kind::Snapshot(s)) = snapshot.kind else { panic!() };
    assert_eq!(s.status, pb::SessionStatus::Ended as i32);
}

fn unsafe_kill(pid: u32) {
    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
}
