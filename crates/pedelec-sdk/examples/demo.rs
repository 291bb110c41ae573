//! The README's demo: a fresh Core in a temporary state directory, one
//! session, a streamed reply, a frontend tool call, usage, a cancelled turn,
//! the origin's sessions, end and resume, the history, and consent: a site
//! the user approves, whose agent's command only the user may allow.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use pedelec_sdk::daemon::CoreProcess;
use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec, sync_handler};
use serde_json::json;

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = flag("--provider").unwrap_or_else(|| "scripted".into());
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("core.sock");
    let mut core = CoreProcess::spawn(&socket, &dir.path().join("state"), Duration::from_secs(3))?;
    println!("▶ Core started (pid {}) on {}", core.pid().unwrap_or(0), socket.display());

    let pedelec = Pedelec::connect(&socket, "app:pedelec-demo").await?;
    for p in pedelec.list_providers().await? {
        println!("  provider {:<10} available={}", p.code, p.available);
    }

    let counter = Arc::new(AtomicI64::new(0));
    let c = counter.clone();
    let tool = ToolSpec::new(
        "update_counter".to_string(),
        "Add `delta` to the page's counter and return the new value",
        json!({"type": "object", "properties": {"delta": {"type": "integer"}}, "required": ["delta"]}),
    )
    .with_handler(sync_handler(move |args: serde_json::Value, ctx| {
        let delta = args["delta"].as_i64().unwrap_or(0);
        let value = c.fetch_add(delta, Ordering::SeqCst) + delta;
        println!("\n  🔧 tool {} ({}) args={args} → value={value}", ctx.tool, ctx.tool_request_id);
        Ok::<_, String>(json!({ "value": value }))
    }));
    let session = pedelec
        .create_session(SessionOptions {
            provider: Some(provider.clone()),
            guidance: "You drive a counter on the page.".into(),
            tools: vec![tool],
            // The agent's permission requests come to this program.
            permission_mode: pedelec_sdk::pb::PermissionMode::App,
            ..Default::default()
        })
        .await?;
    println!("▶ session {} on {}", session.session_id(), session.provider());

    let _status = session
        .on_status(|status, ctx| println!("\n  ● status {} → {status} ({})", ctx.previous_status, ctx.source.as_str()));
    let _delta = session.on_chat_delta(|text, _| {
        print!("{text}");
        let _ = std::io::stdout().flush();
    });
    let _chat = session.on_chat(|text, ctx| {
        println!("\n  💬 complete message (turn {}): {text}", ctx.turn_id.as_deref().unwrap_or("-"))
    });
    let _err = session.on_error(|e, ctx| println!("\n  ⚠ {} error {}: {}", ctx.source.as_str(), e.code, e.message));
    let _ended = session.on_ended(|ctx| println!("\n  ■ ended ({})", ctx.source.as_str()));
    let _permission = session.on_permission(|request, _| {
        let about = request.activity.clone().unwrap_or_default();
        println!("\n  🔐 the agent asks to run {:?}: allowing once", about.command);
        async move { request.options.first().map(|o| o.option_id.clone()) }
    });
    let _activity = session.on_activity(|a, _| {
        println!(
            "\n  ⚙ activity {} {}",
            pedelec_protocol::activity::kind_name(a.kind),
            pedelec_protocol::activity::summary(a)
        )
    });

    println!("▶ prepare()");
    session.prepare().await?;
    println!("  prepared");
    let prompt = if provider == "scripted" {
        "Please bump the counter.\n/slow 40\n/plan bump the counter; report\n/permission ./bump --by 2\n/command ./bump --by 2\n/tool update_counter {\"delta\": 2}\n/tool update_counter {\"delta\": 3}"
            .to_string()
    } else {
        "Call update_counter with delta 2, then tell me the new value.".to_string()
    };
    println!("▶ send_text({prompt:?})");
    session.send_text(prompt).await?;
    println!(
        "▶ turn completed; counter = {}; usage = {:?}",
        counter.load(Ordering::SeqCst),
        session.usage().total_tokens
    );

    // A file uploaded to the session's assets goes to the agent with a text.
    let report =
        pedelec_sdk::assets::UploadSource::from_bytes("report.json", "application/json", br#"{"counter": 5}"#.to_vec());
    let path = session.upload_asset(report, Some("/results/report.json")).await?;
    // And comes back into a file of ours, whole or not at all.
    let copy = std::env::temp_dir().join(format!("pedelec-demo-report-{}.json", std::process::id()));
    let size = session.download_asset_to(&path, &copy).await?;
    println!("▶ download_asset_to({path}) → {} ({size} bytes)", copy.display());
    let _ = std::fs::remove_file(&copy);
    println!("▶ send_text_with(…, attachments [{path}])");
    session
        .send_text_with(
            "Summarise the report.",
            pedelec_sdk::SendOptions { attachments: vec![path], ..Default::default() },
        )
        .await?;
    if provider == "scripted" {
        // A long, slow reply, cancelled midway: the turn rejects with
        // OPERATION_CANCELLED, what streamed stays in the transcript.
        println!("▶ send_text(a long reply), then cancel() after 300 ms");
        let running = session.clone();
        let turn = tokio::spawn(async move { running.send_text(format!("/slow 60\n{}", "word ".repeat(40))).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        session.cancel().await?;
        let outcome = turn.await?;
        println!(
            "\n  cancelled: status {}, the turn ended with {}",
            session.get_status(),
            outcome.err().map_or("success".to_owned(), |e| e.code)
        );
        // The user's words added to the turn while it runs.
        println!("▶ send_text(\"/wait-steer 5000 …\"), then steer(\"Keep the old name as an alias.\")");
        let (turn, steered) = tokio::join!(
            session.send_text("/wait-steer 5000\nRename the module."),
            session.steer("Keep the old name as an alias.")
        );
        steered?;
        turn?;
        println!("\n  steered: the agent took the text into the same turn");
        // Another model from the next turn, same conversation.
        println!("▶ set_model(\"scripted-text-only\", None)");
        let info = session.set_model("scripted-text-only", None).await?;
        println!("  model now {}", info.model);
        // Other frontend tools from the next turn.
        println!("▶ set_tools([page_title]), then send_text(\"/tool page_title {{}}\")");
        let title = pedelec_sdk::ToolSpec::new(
            "page_title".to_string(),
            "The page's title",
            serde_json::json!({ "type": "object" }),
        )
        .with_handler(pedelec_sdk::sync_handler(|_: serde_json::Value, _| {
            Ok::<_, String>(serde_json::json!("Pedelec demo"))
        }));
        session.set_tools(vec![title]).await?;
        session.send_text("/tool page_title {}").await?;
        // What a turn did to the workspace, as a review would show it.
        println!("▶ send_text(\"/write notes.md …\"), then changes(None)");
        session.send_text("/write notes.md Reviewed\\nby the demo").await?;
        for file in session.changes(None).await?.files {
            println!("\n  {:?} {}\n{}", file.kind(), file.path, file.diff.trim_end());
        }
        // An answer as a value: the agent's reply must match a JSON Schema.
        println!("▶ send_text_with(\"/answer …\", SendOptions {{ output_schema }})");
        let schema = serde_json::json!({ "type": "object", "properties": { "title": { "type": "string" } }, "required": ["title"] });
        let options = pedelec_sdk::SendOptions { output_schema: Some(schema), ..Default::default() };
        let value = session.send_text_with(r#"/answer {"title": "Pedelec demo"}"#, options).await?;
        println!("\n  value: {}", value.unwrap_or_default());
        // A second line of work from the same point, in a copy of the workspace.
        println!("▶ fork(), then send_text(\"/write notes.md …\") on the fork");
        let other = session.fork().await?;
        other.send_text("/write notes.md Another way").await?;
        println!("\n  fork {} goes on beside {}", other.session_id(), session.session_id());
        other.end().await?;
    }
    println!("▶ list_sessions() — this origin's sessions:");
    for s in pedelec.list_sessions().await? {
        let info = s.session.unwrap_or_default();
        let status = pedelec_sdk::SessionStatus::from_pb(s.status).map_or("?", |st| st.as_str());
        println!("  {} {} {status}", info.session_id, info.provider);
    }

    println!("▶ end()");
    session.end().await?;
    println!("  status: {}", session.get_status());
    println!("▶ resume()");
    session.resume().await?;
    println!("  status: {}", session.get_status());
    session.send_text("Thanks!").await?;
    println!("▶ usage total after resume: {:?}", session.usage().total_tokens);
    session.end().await?;
    println!("▶ history() — the transcript as a reloaded page would show it:");
    let page = session.history(pedelec_sdk::HistoryQuery::default()).await?;
    for entry in &page.entries {
        println!("  #{:<3} {}", entry.seq, describe(entry));
    }
    if provider == "scripted" {
        consent(&socket).await?;
    }
    let clean = core.terminate();
    println!("▶ Core stopped cleanly: {clean}");
    Ok(())
}

/// Consent, as the Pedelec extension keeps it for the user: a web site is
/// approved (an owner call, which no page can make), its page drives a
/// session, and when its agent asks to run a command the page cannot say
/// yes: the request waits for the user, who answers it.
async fn consent(socket: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use pedelec_protocol::pb;
    use pedelec_sdk::transport::{Call, Reply, Transport};
    const SITE: &str = "https://demo-site.example";
    const OWNER: &str = "app:pedelec-extension";
    let owner = pedelec_sdk::grpc::GrpcTransport::connect(socket).await?;
    let site = Pedelec::connect(socket, SITE).await?;
    let refused = site.create_session::<String>(SessionOptions::default()).await.err();
    println!("▶ a site the user has not approved: {}", refused.map_or("created?!".into(), |e| e.code));
    let consent = pb::OriginConsent { origin: SITE.into(), approved: true, ..Default::default() };
    owner.call(Call::SetConsent(pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) })).await?;
    println!("▶ the user approves {SITE} (SetConsent, an owner call)");
    let options = SessionOptions { permission_mode: pb::PermissionMode::App, ..Default::default() };
    let session = site.create_session::<String>(options).await?;
    let _page = session.on_permission(|_, _| async { Some("allow".to_string()) });
    let running = session.clone();
    let turn = tokio::spawn(async move { running.send_text("/permission rm -rf ~").await });
    let waiting = loop {
        let list = Call::ListUserPermissions(pb::ListUserPermissionsRequest { caller_origin: OWNER.into() });
        if let Reply::ListUserPermissions(list) = owner.call(list).await?
            && let Some(waiting) = list.permissions.into_iter().next()
        {
            break waiting;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let request = waiting.request.unwrap_or_default();
    println!(
        "  🔐 {} asks to run {:?}: the page would allow it, but only the user may answer",
        waiting.origin,
        request.activity.unwrap_or_default().command
    );
    let answer = pb::AnswerUserPermissionRequest {
        caller_origin: OWNER.into(),
        session_id: waiting.session_id,
        permission_id: request.permission_id,
        option_id: "deny".into(),
    };
    owner.call(Call::AnswerUserPermission(answer)).await?;
    turn.await??;
    println!(
        "  the user said no: {}",
        session
            .history(pedelec_sdk::HistoryQuery::default())
            .await?
            .entries
            .iter()
            .rev()
            .find_map(|e| match &e.kind {
                Some(pb::history_entry::Kind::AssistantMessage(m)) => Some(m.text.clone()),
                _ => None,
            })
            .unwrap_or_default()
    );
    // The user's window (the extension's toolbar popup) reads the same list.
    let live = pb::ListLiveSessionsRequest { caller_origin: OWNER.into(), ..Default::default() };
    if let Reply::ListLiveSessions(live) = owner.call(Call::ListLiveSessions(live)).await? {
        for l in &live.sessions {
            let summary = l.summary.clone().unwrap_or_default();
            let info = summary.session.unwrap_or_default();
            println!(
                "▶ the user's window: {} runs {} in {} ({}, {} tokens)",
                l.origin,
                info.provider,
                l.workspace_path,
                pedelec_protocol::SessionStatus::from_pb(summary.status).map_or("?", |s| s.as_str()),
                l.total_tokens
            );
        }
    }
    // The control center's monitor reads any site's transcript as the user.
    let read = pb::GetSessionHistoryRequest {
        caller_origin: OWNER.into(),
        session_id: session.session_id().to_owned(),
        ..Default::default()
    };
    if let Reply::GetSessionHistory(page) = owner.call(Call::GetSessionHistory(read)).await? {
        println!(
            "▶ the control center (chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/control.html, the extension's \
             options page) follows it live and reads its {} transcript entries",
            page.entries.len()
        );
    }
    let revoke = pb::RevokeOriginRequest { caller_origin: OWNER.into(), origin: SITE.into() };
    if let Reply::RevokeOrigin(revoked) = owner.call(Call::RevokeOrigin(revoke)).await? {
        println!("▶ the user revokes {SITE}: {} live session(s) ended", revoked.sessions_ended);
    }
    Ok(())
}

/// One history entry as a line of the demo's output.
fn describe(entry: &pedelec_protocol::pb::HistoryEntry) -> String {
    use pedelec_protocol::pb::history_entry::Kind;
    match &entry.kind {
        Some(Kind::UserText(t)) if !t.attachments.is_empty() => {
            format!("you: {} [attached {}]", t.text.replace('\n', " ⏎ "), t.attachments.join(", "))
        }
        Some(Kind::UserText(t)) => format!("you: {}", t.text.replace('\n', " ⏎ ")),
        Some(Kind::AssistantMessage(t)) if t.interrupted => format!("agent (cancelled): {}", t.text),
        Some(Kind::AssistantMessage(t)) => format!("agent: {}", t.text),
        Some(Kind::ToolCall(c)) => format!("tool call {} {}", c.tool, c.args_json),
        Some(Kind::ToolResult(r)) => format!("tool result {:?}", r.outcome),
        Some(Kind::Activity(a)) => format!("activity {}: {}", a.kind, a.summary),
        Some(Kind::ToolFailed(f)) => format!("tool failed {}: {}", f.tool, f.reason),
        Some(Kind::OperationCompleted(o)) => {
            format!("operation {}", o.error.as_ref().map_or("succeeded".to_owned(), |e| format!("failed: {}", e.code)))
        }
        Some(Kind::Ended(e)) => format!("ended ({})", e.reason),
        Some(Kind::Resumed(_)) => "resumed".to_owned(),
        Some(Kind::ModelChanged(m)) => format!("model → {}", m.model),
        None => "?".to_owned(),
    }
}
