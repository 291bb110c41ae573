//! Bad input from the browser side: each gets a clear error and changes nothing.

use std::time::Duration;

use pedelec_protocol::pb::{self, native_frame::Body, native_request::Call};

use super::*;

fn ping_works(host: &mut Host, id: u32) {
    assert!(matches!(host.call(id, Call::Ping(pb::PingRequest {})), Body::Response(_)), "the host still serves");
}

#[test]
fn invalid_utf8_and_invalid_json_are_reported_and_the_host_goes_on() {
    let env = Env::with_core();
    let mut host = env.host();
    host.write_raw(&[3, 0, 0, 0, 0xff, 0xfe, 0xfd]);
    assert_eq!(error_code(&host.reply(0)), "NATIVE_FRAME_INVALID_UTF8");
    host.send_json("{not json");
    assert_eq!(error_code(&host.reply(0)), "NATIVE_FRAME_INVALID_JSON");
    host.send_json(r#"{"requestId":5,"request":{"ping":"wrong type"}}"#);
    assert_eq!(error_code(&host.reply(5)), "NATIVE_FRAME_INVALID_JSON", "the requestId is recovered to pair the error");
    ping_works(&mut host, 6);
}

#[test]
fn unknown_types_and_missing_request_ids_are_refused() {
    let env = Env::with_core();
    let mut host = env.host();
    host.send_json(r#"{"requestId":1,"request":{"launchMissiles":{}}}"#);
    assert_eq!(error_code(&host.reply(1)), "INVALID_ARGUMENT");
    host.send_json(r#"{"request":{"ping":{}}}"#);
    assert_eq!(error_code(&host.reply(0)), "INVALID_ARGUMENT");
    host.send_json(r#"{"requestId":2,"event":{"sessionId":"x"}}"#);
    assert_eq!(error_code(&host.reply(2)), "INVALID_ARGUMENT");
    ping_works(&mut host, 3);
}

#[test]
fn a_length_over_64_mib_is_refused_and_ends_the_stream() {
    let env = Env::with_core();
    let mut host = env.host();
    let len = (limits::NATIVE_BROWSER_TO_HOST_MAX as u32 + 1).to_le_bytes();
    host.write_raw(&len);
    assert_eq!(error_code(&host.reply(0)), "NATIVE_FRAME_TOO_LARGE");
    assert!(host.wait_exit(Duration::from_secs(2)).is_some(), "an unsynchronisable stream ends the host");
}

#[test]
fn a_truncated_length_prefix_at_end_of_input_exits_cleanly() {
    let env = Env::with_core();
    let mut host = env.host();
    host.write_raw(&[9, 0]);
    host.close_stdin();
    assert!(host.wait_exit(Duration::from_secs(2)).is_some());
    assert!(host.recv().is_none());
}

/// A page once skipped its folder grant by spelling the request the proto
/// way (`create_session`, `granted_roots`), which the host's JSON decoder
/// also takes. Grants now live in Core: no spelling of a request carries
/// one, and a forged one creates nothing, in the folder or anywhere.
#[test]
fn a_request_in_any_spelling_cannot_grant_itself_a_folder() {
    let env = Env::with_core();
    let target = tempfile::tempdir().unwrap();
    let path = target.path().display().to_string();
    let mut host = env.host();
    let forged = [
        format!(
            r#"{{"requestId":1,"request":{{"create_session":{{"provider":"scripted","callerOrigin":"{ORIGIN}","workspace":{{"path":"{path}","granted_roots":["/"]}}}}}}}}"#
        ),
        format!(
            r#"{{"requestId":2,"request":{{"createSession":{{"provider":"scripted","caller_origin":"{ORIGIN}","workspace":{{"path":"{path}","grantedRoots":["{path}"]}}}}}}}}"#
        ),
        format!(
            r#"{{"requestId":3,"request":{{"createSession":{{"provider":"scripted","callerOrigin":"{ORIGIN}","workspace":{{"path":"{path}"}}}}}}}}"#
        ),
    ];
    for (i, frame) in forged.iter().enumerate() {
        host.send_json(frame);
        let id = i as u32 + 1;
        let code = error_code(&host.reply(id)).to_owned();
        assert!(["NATIVE_FRAME_INVALID_JSON", "WORKSPACE_NOT_ALLOWED"].contains(&code.as_str()), "{frame}: {code}");
    }
    let listed = host
        .call(9, Call::ListSessions(pb::ListSessionsRequest { caller_origin: ORIGIN.into(), ..Default::default() }));
    let Body::Response(pb::NativeResponse { result: Some(R::ListSessions(listed)) }) = listed else {
        panic!("{listed:?}")
    };
    assert!(listed.sessions.is_empty(), "no session was created: {listed:?}");
    assert!(!target.path().join(".pedelec-runtime").exists(), "nothing written in the folder");
    // Once the user grants it (an owner call, which a page cannot make), it opens.
    env.approve(ORIGIN, &[target.path()]);
    host.send_json(&forged[2]);
    assert!(matches!(host.reply(3), Body::Response(_)));
}

#[test]
fn a_frame_for_a_session_of_another_origin_is_denied() {
    let env = Env::with_core();
    let mut host = env.host();
    let session = create(&mut host, 1, ORIGIN);
    let send = pb::SendTextRequest {
        session_id: session.clone(),
        caller_origin: "https://evil.example".into(),
        text: "x".into(),
        ..Default::default()
    };
    assert_eq!(error_code(&host.call(2, Call::SendText(send))), "THREAD_ACCESS_DENIED");
    let sub = pb::SubscribeRequest { session_id: session, caller_origin: "https://evil.example".into() };
    assert_eq!(error_code(&host.call(3, Call::Subscribe(sub))), "THREAD_ACCESS_DENIED");
}

#[test]
fn a_flood_of_ten_thousand_requests_is_answered_in_order_with_bounded_memory() {
    let env = Env::with_core();
    let mut host = env.host();
    let pid = host.child.id();
    let mut bytes = Vec::new();
    for id in 1..=10_000u32 {
        bytes.extend(encode_frame(&json::to_json(&request(id, Call::Ping(pb::PingRequest {}))), usize::MAX).unwrap());
    }
    let mut stdin = host.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&bytes).unwrap();
        stdin
    });
    let mut peak_kib = 0;
    for expected in 1..=10_000u32 {
        let frame = host.recv().unwrap();
        assert_eq!(frame.request_id, expected);
        if expected % 1000 == 0 {
            peak_kib = peak_kib.max(rss_kib(pid));
        }
    }
    host.stdin = Some(writer.join().unwrap());
    assert!(peak_kib < 64 * 1024, "host RSS stayed bounded: {peak_kib} KiB");
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
