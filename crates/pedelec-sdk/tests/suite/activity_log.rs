//! The activity log (issue 42): what a session did — started, its frontend
//! tool calls (read-only ones tagged), a command, an edit, a permission
//! answer, its end — is read back by the user (`Owner::activity`, Core's
//! `ListActivity`) and exported as JSON lines, over both transports. A web
//! origin is refused, and a bad query is refused with the field it names
//! and reads nothing.

use std::sync::{Arc, Mutex};

use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb;
use pedelec_sdk::{SessionOptions, ToolSpec, sync_handler};
use serde_json::json;

use super::{Harness, ORIGIN, OWNER, Via, counter_tool, schema_object};

const SITE: &str = "https://activity.example";

fn kind(entry: &pb::ActivityLogEntry) -> pb::ActivityLogKind {
    pb::ActivityLogKind::try_from(entry.kind).unwrap_or_default()
}

async fn a_sessions_work_is_in_the_activity_log(via: Via) {
    let h = Harness::start_via(via);
    let client = h.client().await;
    let read_page = ToolSpec::new("read_page".to_string(), "Reads the page's title", schema_object())
        .read_only()
        .with_handler(sync_handler(|_: serde_json::Value, _| Ok::<_, String>(json!({ "title": "Home" }))));
    let before = pedelec_sdk::context::now_ms();
    let session = client
        .create_session::<String>(SessionOptions {
            tools: vec![read_page, counter_tool(Arc::new(Mutex::new(0)))],
            permission_mode: pb::PermissionMode::App,
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let _off = session.on_permission(|_, _| async { Some("allow".to_owned()) });
    let prompt = "/tool read_page {}\n/tool update_counter {\"delta\":2}\n/command cargo test\n\
                  /write notes.txt hello\n/permission rm -rf build";
    session.send_text(prompt).await.unwrap();
    session.end().await.unwrap();

    let owner = h.client_for(OWNER).await.owner().unwrap();
    let page = owner.activity(Some(ORIGIN), "", 0).await.unwrap();
    assert!(!page.has_more && page.next_cursor.is_empty(), "{page:?}");
    let mut entries = page.entries.clone();
    entries.reverse();
    let seen: Vec<(pb::ActivityLogKind, &str, bool)> =
        entries.iter().map(|e| (kind(e), e.summary.as_str(), e.read_only)).collect();
    use pb::ActivityLogKind as K;
    let expected = [
        (K::ToolCalled, "called read_page", true),
        (K::ToolCalled, "called update_counter", false),
        (K::CommandRun, "ran cargo test (completed)", false),
        (K::FileEdited, "edited notes.txt (completed)", false),
        (K::PermissionAnswered, "permission granted (allow): rm -rf build", false),
        (K::SessionEnded, "ended (requested)", false),
    ];
    assert_eq!(seen[0].0, K::SessionStarted, "{seen:?}");
    assert!(seen[0].1.starts_with("started scripted"), "{seen:?}");
    assert_eq!(&seen[1..], &expected[..], "{seen:?}");
    for entry in &entries {
        assert_eq!((entry.origin.as_str(), entry.session_id.as_str()), (ORIGIN, session.session_id()));
        assert!(entry.at_ms >= before && entry.at_ms <= pedelec_sdk::context::now_ms(), "{entry:?}");
        let detail: serde_json::Value = serde_json::from_str(&entry.detail_json).expect("detail is JSON");
        assert!(detail.is_object(), "{entry:?}");
    }
    let permission: serde_json::Value = serde_json::from_str(&entries[5].detail_json).unwrap();
    assert_eq!((permission["granted"].as_bool(), permission["optionId"].as_str()), (Some(true), Some("allow")));

    // Another origin's filter sees none of it; every origin's sees it all.
    assert!(owner.activity(Some(SITE), "", 0).await.unwrap().entries.is_empty());
    assert_eq!(owner.activity(None, "", 0).await.unwrap().entries, page.entries);

    // The export holds the same entries, one canonical JSON object per line.
    let export = owner.export_activity(Some(ORIGIN), "", 0).await.unwrap();
    assert_eq!((export.entries as usize, export.has_more), (page.entries.len(), false));
    assert!(export.jsonl.ends_with('\n'));
    let lines: Vec<pb::ActivityLogEntry> =
        export.jsonl.lines().map(|line| pedelec_protocol::json::from_json(line).expect("a line is an entry")).collect();
    assert_eq!(lines, page.entries);
    assert!(export.jsonl.lines().next().unwrap().contains("\"sessionId\""), "lowerCamelCase names");
}

super::over_both_transports!(a_sessions_work_is_in_the_activity_log);

fn refusal(status: &tonic::Status) -> (String, serde_json::Value) {
    let error = error_from_status(status);
    let details = serde_json::from_str(&error.details_json).unwrap_or(serde_json::Value::Null);
    (error.code, details)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_cannot_read_the_activity_log_and_bad_queries_read_nothing() {
    let mut h = Harness::start();
    h.approve(SITE, &[]).await;
    let mut raw = h.raw().await;
    let managed = pb::CreateSessionRequest {
        caller_origin: SITE.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    };
    for _ in 0..3 {
        raw.create_session(managed.clone()).await.unwrap();
    }
    let list = |caller: &str, origin: &str, cursor: &str, limit: u32| pb::ListActivityRequest {
        caller_origin: caller.into(),
        origin: origin.into(),
        cursor: cursor.into(),
        limit,
    };
    let export = |caller: &str, origin: &str, cursor: &str, limit: u32| pb::ExportActivityRequest {
        caller_origin: caller.into(),
        origin: origin.into(),
        cursor: cursor.into(),
        limit,
    };

    for caller in [SITE, "http://localhost:8080", "https://other.example", ""] {
        let (code, details) = refusal(&raw.list_activity(list(caller, "", "", 0)).await.unwrap_err());
        assert_eq!(
            (code.as_str(), details["reason"].as_str()),
            ("ORIGIN_NOT_ALLOWED", Some("owner_only")),
            "{caller:?}"
        );
        let (code, _) = refusal(&raw.export_activity(export(caller, "", "", 0)).await.unwrap_err());
        assert_eq!(code, "ORIGIN_NOT_ALLOWED", "{caller:?}");
    }

    let long_origin = format!("https://{}.example", "a".repeat(600));
    for (origin, cursor, limit, field) in [
        ("", "", 1001, "limit"),
        ("", "", u32::MAX, "limit"),
        ("", "not-a-cursor", 0, "cursor"),
        ("", "act-0", 0, "cursor"),
        ("", "act-1; DROP TABLE activity", 0, "cursor"),
        ("not an origin", "", 0, "origin"),
        ("https://a.example\u{0}", "", 0, "origin"),
        (long_origin.as_str(), "", 0, "origin"),
    ] {
        let (code, details) = refusal(&raw.list_activity(list(OWNER, origin, cursor, limit)).await.unwrap_err());
        assert_eq!(
            (code.as_str(), details["field"].as_str()),
            ("INVALID_ARGUMENT", Some(field)),
            "{origin:?} {cursor:?}"
        );
        let limit = if field == "limit" { limit.max(5001) } else { limit };
        let (code, details) = refusal(&raw.export_activity(export(OWNER, origin, cursor, limit)).await.unwrap_err());
        assert_eq!(
            (code.as_str(), details["field"].as_str()),
            ("INVALID_ARGUMENT", Some(field)),
            "{origin:?} {cursor:?}"
        );
    }
    assert!(raw.export_activity(export(OWNER, "", "", 5000)).await.is_ok(), "5000 is the export's bound");

    // Nothing above changed the log: three sessions started, paged newest first.
    let first = raw.list_activity(list(OWNER, SITE, "", 2)).await.unwrap().into_inner();
    assert_eq!(first.entries.len(), 2);
    assert!(first.has_more && !first.next_cursor.is_empty());
    assert!(first.entries[0].id > first.entries[1].id, "newest first");
    let rest = raw.list_activity(list(OWNER, SITE, &first.next_cursor, 2)).await.unwrap().into_inner();
    assert_eq!(rest.entries.len(), 1);
    assert!(!rest.has_more && rest.next_cursor.is_empty());
    let all: Vec<_> = first.entries.iter().chain(&rest.entries).collect();
    assert!(all.iter().all(|e| kind(e) == pb::ActivityLogKind::SessionStarted && e.origin == SITE), "{all:?}");
    let parts = raw.export_activity(export(OWNER, SITE, "", 2)).await.unwrap().into_inner();
    assert_eq!((parts.entries, parts.has_more, parts.jsonl.lines().count()), (2, true, 2));
    assert_eq!(parts.next_cursor, first.next_cursor, "the export pages as the list does");

    // The log is Core's durable record: a restart keeps it, and cursors still hold.
    h.crash_and_restart();
    let mut raw = h.raw().await;
    let again = raw.list_activity(list(OWNER, SITE, "", 2)).await.unwrap().into_inner();
    assert_eq!(again.entries, first.entries);
    let rest_again = raw.list_activity(list(OWNER, SITE, &first.next_cursor, 2)).await.unwrap().into_inner();
    assert_eq!(rest_again.entries, rest.entries);
}
