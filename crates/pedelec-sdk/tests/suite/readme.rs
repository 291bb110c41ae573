//! The README's Rust snippets, run against a real Core. Each test body holds
//! one snippet exactly as the README shows it (after a preamble that sets
//! up what the snippet assumes), and `the_readme_shows_the_snippets_run_here`
//! fails when a README snippet is not in this file, so they cannot drift.

use pedelec_sdk::{Pedelec, SessionOptions};

use super::Harness;

/// The README's ```rust blocks, each as its trimmed lines.
fn readme_snippets() -> Vec<Vec<String>> {
    let readme = include_str!("../../../../README.md");
    let mut snippets = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => snippets.extend(current.take()),
            (Some(lines), text) => lines.push(text.to_owned()),
            (None, _) => {}
        }
    }
    snippets
}

#[test]
fn the_readme_shows_the_snippets_run_here() {
    let here: Vec<String> = include_str!("readme.rs").lines().map(|l| l.trim().to_owned()).collect();
    let snippets = readme_snippets();
    assert!(snippets.len() >= 3, "the README's Rust snippets were found");
    for snippet in snippets {
        let found = here.windows(snippet.len()).any(|window| window == snippet.as_slice());
        assert!(found, "this README snippet is not run by a test here:\n{}", snippet.join("\n"));
    }
}

/// Core on the default socket the snippets discover.
fn core_for_snippets() -> Harness {
    let h = Harness::start();
    // SAFETY: nextest runs each test in its own process; nothing else reads
    // the environment concurrently in this one.
    unsafe { std::env::set_var("PEDELEC_CORE_SOCKET", h.socket()) };
    h
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn using_the_sdk() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    use pedelec_sdk::{Pedelec, SessionOptions};

    let pedelec = Pedelec::discover("app:my-tool").await?;
    let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    let _off = session.on_chat(|text, _ctx| println!("{text}"));
    session.send_text("Analyze the current page.").await?;
    session.end().await?;
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Ended);
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_as_a_stream() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    use futures::StreamExt;
    use pedelec_sdk::SessionEvent;

    let mut turn = session.send_text_turn("Summarise the workspace.");
    while let Some(event) = turn.next().await {
        if let SessionEvent::ChatDelta { text, .. } = event {
            print!("{text}");
        }
    }
    turn.outcome().await?;
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    session.send_text("Analyze the current page.").await?;
    use pedelec_sdk::HistoryQuery;

    let page = session.history(HistoryQuery { limit: 50, ..Default::default() }).await?;
    for entry in &page.entries {
        println!("#{} {:?}", entry.seq, entry.kind);
    }
    assert_eq!(page.entries.len(), 3, "the user text, the reply and the outcome");
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_list() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let pedelec = Pedelec::discover("app:my-tool").await?;
    let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    let (turn, cancelled) = tokio::join!(session.send_text("/slow 50\nA long answer, please."), session.cancel());
    cancelled?;
    assert_eq!(turn.unwrap_err().code, "OPERATION_CANCELLED");
    for s in pedelec.list_sessions().await? { println!("{:?} status {}", s.session.map(|i| i.session_id), s.status); }
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle);
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    let replies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = replies.clone();
    let _chat = session.on_chat(move |text, _ctx| seen.lock().unwrap().push(text.to_owned()));
    let (turn, steered) = tokio::join!(session.send_text("/wait-steer 5000\nRename the module."), session.steer("Keep the old name as an alias."));
    steered?;
    turn?;
    assert_eq!(*replies.lock().unwrap(), ["You said: Rename the module. You added: Keep the old name as an alias."]);
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    session.send_text("/write notes.md Hello\\nWorld").await?;
    for file in session.changes(None).await?.files {
        println!("{} {:?}\n{}", file.path, file.kind(), file.diff);
    }
    let changes = session.changes(None).await?;
    assert_eq!(changes.files.len(), 1);
    assert!(changes.files[0].diff.ends_with("+Hello\n+World\n\\ No newline at end of file\n"), "{}", changes.files[0].diff);
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_model() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    let info = session.set_model("scripted-text-only", Some(pedelec_sdk::pb::EffortLevel::High)).await?;
    assert_eq!(info.model, "scripted-text-only");
    session.send_text("still here").await?;
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    let other = session.fork().await?;
    other.send_text("/write notes.txt another way").await?;
    session.send_text("/write notes.txt the first way").await?;
    assert_ne!(other.session_id(), session.session_id());
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    let schema = serde_json::json!({ "type": "object", "properties": { "title": { "type": "string" } }, "required": ["title"] });
    let options = pedelec_sdk::SendOptions { output_schema: Some(schema), ..Default::default() };
    let value = session.send_text_with(r#"/answer {"title": "Pedelec"}"#, options).await?;
    assert_eq!(value, Some(serde_json::json!({ "title": "Pedelec" })));
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let site = Pedelec::discover("app:my-tool").await?;
    let _session = site.create_session::<String>(SessionOptions { auto_end_on_disconnect: false, ..Default::default() }).await?;
    let owner = Pedelec::discover("app:my-tray").await?.owner()?;
    for live in owner.live_sessions(None).await? {
        println!("{} in {}", live.origin, live.workspace_path);
    }
    // The newest 50 entries of one origin's activity log.
    for entry in owner.activity(Some("app:my-tool"), "", 50).await?.entries {
        println!("{} {}", entry.session_id, entry.summary);
    }
    assert!(!owner.live_sessions(Some("app:my-tool")).await?.is_empty());
    assert!(!owner.activity(Some("app:my-tool"), "", 50).await?.entries.is_empty(), "its session's start");
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activities() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    use pedelec_sdk::activity::{kind_name, summary};

    let _activity = session.on_activity(|a, _ctx| println!("{} {}", kind_name(a.kind), summary(a)));
    session.send_text("/command cargo test").await?;
    let page = session.history(pedelec_sdk::HistoryQuery::default()).await?;
    assert!(page.entries.iter().any(|e| matches!(&e.kind, Some(pedelec_protocol::pb::history_entry::Kind::Activity(a)) if a.kind == "command")));
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let pedelec = Pedelec::discover("app:my-tool").await?;
    use pedelec_sdk::pb::{PermissionMode, PermissionOptionKind};

    let options = SessionOptions { permission_mode: PermissionMode::App, ..Default::default() };
    let session = pedelec.create_session::<String>(options).await?;
    let _off = session.on_permission(|request, _ctx| async move {
        let once = request.options.iter().find(|o| o.kind == PermissionOptionKind::AllowOnce as i32);
        once.map(|o| o.option_id.clone())
    });
    session.send_text("/permission make deploy").await?;
    let page = session.history(pedelec_sdk::HistoryQuery::default()).await?;
    assert!(page.entries.iter().any(|e| matches!(&e.kind, Some(pedelec_sdk::pb::history_entry::Kind::AssistantMessage(m)) if m.text.contains("answered allow"))));
    Ok(())
}

#[rustfmt::skip] // the snippet stays as the README shows it
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets() -> Result<(), Box<dyn std::error::Error>> {
    let _core = core_for_snippets();
    let session = Pedelec::discover("app:my-tool").await?.create_session::<String>(SessionOptions::default()).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("report.json"), r#"{"pages": 3}"#)?;
    std::env::set_current_dir(dir.path())?;
    use pedelec_sdk::assets::UploadSource;

    let path = session.upload_asset(UploadSource::from_path("report.json").await?, Some("/results/report.json")).await?;
    let report: serde_json::Value = session.read_asset_json(&path).await?;
    for asset in session.list_assets().await? { println!("{} {} bytes", asset.path, asset.size); }
    assert_eq!(report["pages"], 3);
    use pedelec_sdk::SendOptions;

    let attachments = vec!["/results/report.json".to_string()];
    session.send_text_with("Summarise the report.", SendOptions { attachments, ..Default::default() }).await?;
    let page = session.history(pedelec_sdk::HistoryQuery::default()).await?;
    assert!(page.entries.iter().any(|e| matches!(&e.kind, Some(pedelec_sdk::pb::history_entry::Kind::UserText(t)) if t.attachments == ["/results/report.json"])));
    Ok(())
}
