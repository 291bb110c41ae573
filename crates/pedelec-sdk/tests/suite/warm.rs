//! Warm agent processes (issue 41): Core keeps an ACP agent started and
//! initialised for the next session, hands it to that session's first turn
//! (which opens its ACP session in the session's own workspace), starts the
//! next one, ends one nobody took after `warm_idle_timeout_secs`, and gives
//! a warm one's place under `max_agent_processes` to a session that needs
//! it. Against `pedelec-fake-acp`, which logs each start with its pid and cwd.

use std::path::PathBuf;
use std::time::Duration;

use pedelec_sdk::SessionOptions;
use serde_json::Value;

use super::*;

struct Rig {
    dir: tempfile::TempDir,
    harness: Harness,
}

impl Rig {
    /// Core with `fake` (kept warm) and `cold` (not), both the fake agent.
    fn start(extra: &str) -> Rig {
        Rig::start_with(extra, true)
    }

    /// The same, with `fake` kept warm or not.
    fn start_with(extra: &str, warm: bool) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let bin = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
        let log = dir.path().join("fake-acp.log");
        let provider = |code: &str, warm: bool| {
            format!(
                "[providers.{code}]\nkind = \"acp\"\ncommand = [\"{}\", \"--acp\"]\nwarm = {warm}\n\
                 env = {{ PEDELEC_FAKE_ACP_LOG = \"{}\" }}\n",
                bin.display(),
                log.display()
            )
        };
        let settings = format!("{extra}{}{}", provider("fake", warm), provider("cold", false));
        Rig { dir, harness: Harness::with_config(Via::Grpc, &settings) }
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("fake-acp.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == kind)
            .collect()
    }

    async fn warm(&self, code: &str) -> pb::WarmProcess {
        let mut raw = self.harness.raw().await;
        let listed = raw.list_agents(pb::ListAgentsRequest { caller_origin: OWNER.into() }).await.unwrap().into_inner();
        let agent = listed.agents.into_iter().find(|a| a.provider.as_ref().is_some_and(|p| p.code == code));
        agent.and_then(|a| a.warm).expect("every agent says whether it is warm")
    }

    /// Waits until `code`'s warm process is in `state` (bounded).
    async fn warm_until(&self, code: &str, state: pb::WarmState) -> pb::WarmProcess {
        for _ in 0..300 {
            let warm = self.warm(code).await;
            if warm.state() == state {
                return warm;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{code}'s warm process never became {state:?}: {:?}", self.warm(code).await);
    }

    async fn session(&self, provider: &str) -> pedelec_sdk::PedelecSession {
        let client = self.harness.client().await;
        let options = SessionOptions { provider: Some(provider.into()), ..Default::default() };
        client.create_session(options).await.unwrap()
    }
}

fn is_gone(pid: u32) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    !proc.exists() || std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| s.contains(") Z "))
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_takes_the_warm_agent_the_next_starts_and_an_untaken_one_is_ended() {
    let rig = Rig::start("warm_idle_timeout_secs = 2\n");
    assert_eq!(rig.warm("cold").await.state(), pb::WarmState::Off, "only the providers marked warm");
    assert_eq!(rig.warm("scripted").await.state(), pb::WarmState::Off);
    let first = rig.warm_until("fake", pb::WarmState::Ready).await;
    assert!(first.pid > 0 && first.ready_since_ms > 0, "{first:?}");
    assert!(first.rss_bytes > 0, "Linux tells its resident memory: {first:?}");
    let started = rig.events("start");
    assert_eq!(started.len(), 1, "one agent started, before any session: {started:?}");
    let folder = PathBuf::from(started[0]["cwd"].as_str().unwrap());
    assert!(
        folder.file_name().unwrap().to_string_lossy().starts_with("pedelec-agent-fake-"),
        "it starts in an empty folder of its own, never one of the user's: {folder:?}"
    );
    assert_eq!(rig.events("initialize").len(), 1, "and is initialised");

    let session = rig.session("fake").await;
    let recorder = Recorder::attach(&session);
    session.send_text("hello").await.unwrap();
    assert!(recorder.lines().iter().any(|l| l.starts_with("chat ")), "the turn answered: {:?}", recorder.lines());
    let opened = rig.events("session_new");
    assert_eq!(opened.len(), 1, "{opened:?}");
    let mut raw = rig.harness.raw().await;
    let live = pb::ListLiveSessionsRequest { caller_origin: OWNER.into(), ..Default::default() };
    let listed = raw.list_live_sessions(live).await.unwrap().into_inner().sessions;
    let workspace = listed[0].workspace_path.clone();
    assert_eq!(opened[0]["cwd"], Value::from(workspace.clone()), "its ACP session works in the session's workspace");
    assert!(!is_gone(first.pid), "the warm agent serves the session");

    // The next one started when the first was taken; nobody takes it.
    let second = rig.warm_until("fake", pb::WarmState::Ready).await;
    assert_eq!(rig.events("initialize").len(), 2, "the session's turn did not initialise an agent of its own");
    assert_ne!(second.pid, first.pid);
    let reaped = rig.warm_until("fake", pb::WarmState::Reaped).await;
    assert!(reaped.reason.contains("warm_idle_timeout_secs"), "{reaped:?}");
    eventually("the idle warm agent ended", || is_gone(second.pid)).await;
    assert!(!is_gone(first.pid), "the session's agent lives on");

    // The site's next session shares its agent: nothing starts.
    let starts = rig.events("start").len();
    let same_site = rig.session("fake").await;
    same_site.send_text("hello too").await.unwrap();
    assert_eq!(rig.events("start").len(), starts, "the site's agent serves its second session");
    assert_eq!(rig.events("session_new").len(), 2, "in a session of its own");
    // Another program's session starts cold, and asks for the next warm one.
    let options: SessionOptions = SessionOptions { provider: Some("fake".into()), ..Default::default() };
    let other = rig.harness.client_for("app:another-program").await.create_session(options).await.unwrap();
    other.send_text("hello again").await.unwrap();
    assert!(rig.events("start").len() > starts, "another site never shares the agent");
    let third = rig.warm_until("fake", pb::WarmState::Ready).await;
    assert!(third.pid != first.pid && third.pid != second.pid);
    session.end().await.unwrap();
    assert!(!is_gone(first.pid), "the agent lives on for the site's other session");
    same_site.end().await.unwrap();
    other.end().await.unwrap();
    eventually("the site's agent ended with its last session", || is_gone(first.pid)).await;
}

/// The defence: a warm process never refuses a session. Without the
/// eviction, the third agent process here is QUOTA_EXCEEDED.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_agent_gives_its_place_to_a_session_that_needs_it() {
    let rig = Rig::start("max_agent_processes = 2\n");
    let warm = rig.warm_until("fake", pb::WarmState::Ready).await;
    let one = rig.session("cold").await;
    one.send_text("one").await.unwrap();
    // Another program's session: it shares no agent with the first.
    let options: SessionOptions = SessionOptions { provider: Some("cold".into()), ..Default::default() };
    let two = rig.harness.client_for("app:another-program").await.create_session(options).await.unwrap();
    two.send_text("two").await.expect("the warm agent made room");
    eventually("the warm agent ended", || is_gone(warm.pid)).await;
    let after = rig.warm("fake").await;
    assert_eq!(after.state(), pb::WarmState::Failed);
    assert!(after.reason.contains("ended to make room"), "{after:?}");
    one.end().await.unwrap();
    two.end().await.unwrap();
}

/// A warm agent that cannot start says why.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_agent_that_cannot_start_says_why() {
    // A program that is there but exits before it speaks ACP.
    let settings = "[providers.fake]\nkind = \"acp\"\ncommand = [\"sh\", \"-c\", \"exit 3\"]\nwarm = true\n";
    let rig = Rig { dir: tempfile::tempdir().unwrap(), harness: Harness::with_config(Via::Grpc, settings) };
    let failed = rig.warm_until("fake", pb::WarmState::Failed).await;
    assert!(!failed.reason.is_empty() && failed.pid == 0, "{failed:?}");
}

/// An idle session holds no agent process: after `agent_idle_timeout_secs`
/// without a turn its agent is ended, and the next turn starts the agent
/// again and continues the same ACP session (`session/load`). A session
/// that keeps working keeps its agent.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sessions_agent_is_ended_and_the_next_turn_continues() {
    let rig = Rig::start_with("agent_idle_timeout_secs = 2\n", false);
    let session = rig.session("cold").await;
    let recorder = Recorder::attach(&session);
    session.send_text("first").await.unwrap();
    let first = rig.events("start")[0]["pid"].as_u64().unwrap() as u32;
    // Turns closer together than the idle time keep the same agent.
    for text in ["second", "third"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        session.send_text(text).await.unwrap();
    }
    assert!(!is_gone(first), "busy: the agent stays");
    eventually("the idle agent ended", || is_gone(first)).await;
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle, "the session itself is untouched");

    session.send_text("after the pause").await.unwrap();
    let loaded = rig.events("session_load");
    assert_eq!(loaded.len(), 1, "the next turn continued the ACP session: {loaded:?}");
    assert_eq!(loaded[0]["sessionId"], rig.events("session_new")[0]["sessionId"]);
    assert!(recorder.lines().iter().filter(|l| l.starts_with("chat ")).count() >= 4, "{:?}", recorder.lines());
    assert_eq!(rig.events("start").len(), 2, "one agent for the three close turns, one after the pause");
    session.end().await.unwrap();
}

/// An agent that cannot load sessions keeps its process however long the
/// session is idle: ending it would lose the conversation.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_that_cannot_resume_keeps_its_process() {
    let dir = tempfile::tempdir().unwrap();
    let bin = pedelec_sdk::daemon::find_binary("pedelec-fake-acp", "PEDELEC_FAKE_ACP_BIN");
    let log = dir.path().join("fake-acp.log");
    let settings = format!(
        "agent_idle_timeout_secs = 1\n[providers.cold]\nkind = \"acp\"\ncommand = [\"{}\", \"--acp\"]\n\
         env = {{ PEDELEC_FAKE_ACP_LOG = \"{}\", PEDELEC_FAKE_ACP_NO_LOAD = \"1\" }}\n",
        bin.display(),
        log.display()
    );
    let rig = Rig { dir, harness: Harness::with_config(Via::Grpc, &settings) };
    let session = rig.session("cold").await;
    session.send_text("first").await.unwrap();
    let pid = rig.events("start")[0]["pid"].as_u64().unwrap() as u32;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!is_gone(pid), "the agent that cannot resume its session is kept");
    session.send_text("second").await.unwrap();
    assert_eq!(rig.events("start").len(), 1, "the same agent took the next turn");
    session.end().await.unwrap();
}

/// ACP cannot close a session, so a shared agent keeps every session
/// opened on it: after 64, the site's next session gets a fresh agent, and
/// the old one ends with its last session.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_agent_takes_a_bounded_number_of_sessions_in_its_life() {
    let rig = Rig::start_with("", false);
    let anchor = rig.session("cold").await;
    anchor.send_text("first").await.unwrap();
    let first = rig.events("start")[0]["pid"].as_u64().unwrap() as u32;
    for i in 1..64 {
        let session = rig.session("cold").await;
        session.send_text(&format!("session {i}")).await.unwrap();
        session.end().await.unwrap();
        assert_eq!(rig.events("start").len(), 1, "session {i} on the first agent");
    }
    assert_eq!(rig.events("start").len(), 1, "64 sessions, one after another, on one agent");
    let next = rig.session("cold").await;
    next.send_text("the 65th").await.unwrap();
    assert_eq!(rig.events("start").len(), 2, "the 65th gets a fresh agent");
    anchor.end().await.unwrap();
    eventually("the full agent ended with its last session", || is_gone(first)).await;
    next.send_text("still here").await.unwrap();
    next.end().await.unwrap();
}
