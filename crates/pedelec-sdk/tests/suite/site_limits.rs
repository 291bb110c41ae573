//! The user's window over sites (issue 42): the Recent list of ended
//! sessions (`ListLiveSessions` with `include_ended`), and each site's own
//! limits in its consent — the agents it may use and how many live
//! sessions it may hold — enforced by Core before anything is made, and
//! kept across a restart.

use pedelec_protocol::grpc::error_from_status;

use super::*;

const SITE: &str = "https://limited.example";
const OTHER: &str = "https://other.example";
/// A second built-in agent, so a site can be limited to one of two that work.
const TWO_AGENTS: &str = "[providers.scripted2]\nkind = \"scripted\"\n";

type Raw = CoreClient<tonic::transport::Channel>;

fn create(origin: &str, provider: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        caller_origin: origin.into(),
        provider: provider.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    }
}

/// The refusal's code and details.
fn refusal(status: &tonic::Status) -> (String, serde_json::Value) {
    let error = error_from_status(status);
    (error.code, serde_json::from_str(&error.details_json).unwrap_or_default())
}

async fn created(raw: &mut Raw, origin: &str, provider: &str) -> String {
    raw.create_session(create(origin, provider)).await.expect("created").into_inner().session.unwrap().session_id
}

async fn end(raw: &mut Raw, origin: &str, id: &str) {
    let request = pb::EndRequest { session_id: id.into(), caller_origin: origin.into() };
    assert!(raw.end(request).await.unwrap().into_inner().ended_now);
}

fn listing(origin: &str, include_ended: bool, ended_limit: u32) -> pb::ListLiveSessionsRequest {
    pb::ListLiveSessionsRequest { caller_origin: OWNER.into(), origin: origin.into(), include_ended, ended_limit }
}

/// (session id, status) of each listed session, in the listed order.
async fn listed(raw: &mut Raw, request: pb::ListLiveSessionsRequest) -> Vec<(String, pb::SessionStatus)> {
    let sessions = raw.list_live_sessions(request).await.expect("listed").into_inner().sessions;
    sessions
        .iter()
        .map(|l| {
            let summary = l.summary.as_ref().unwrap();
            let status = pb::SessionStatus::try_from(summary.status).unwrap();
            (summary.session.as_ref().unwrap().session_id.clone(), status)
        })
        .collect()
}

/// How many sessions `origin` has, ended ones included.
async fn sessions_of(raw: &mut Raw, origin: &str) -> usize {
    let request = pb::ListSessionsRequest { caller_origin: origin.into(), limit: 1000, ..Default::default() };
    raw.list_sessions(request).await.unwrap().into_inner().sessions.len()
}

async fn consent_of(raw: &mut Raw, origin: &str) -> pb::OriginConsent {
    let request = pb::GetConsentRequest { caller_origin: OWNER.into(), origin: origin.into() };
    raw.get_consent(request).await.unwrap().into_inner().origins.into_iter().next().expect("stored consent")
}

fn limited(origin: &str, providers: &[&str], max_live_sessions: u32) -> pb::OriginConsent {
    pb::OriginConsent {
        origin: origin.into(),
        approved: true,
        providers: providers.iter().map(|p| p.to_string()).collect(),
        max_live_sessions,
        ..Default::default()
    }
}

/// The control center's Recent list: the owner sees ended sessions after
/// the live ones, newest ended first, of one site or of all, bounded; a
/// resumed session is live again and leaves the list; a bad limit reads
/// nothing; a page cannot ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_lists_the_most_recently_ended_sessions_after_the_live_ones() {
    let h = Harness::start();
    h.approve(SITE, &[]).await;
    h.approve(OTHER, &[]).await;
    let mut raw = h.raw().await;
    let a = created(&mut raw, SITE, "").await;
    let b = created(&mut raw, SITE, "").await;
    let c = created(&mut raw, OTHER, "").await;
    let live = created(&mut raw, SITE, "").await;
    // Ended in this order, a few ms apart so each end has its own time.
    for (origin, id) in [(SITE, &a), (OTHER, &c), (SITE, &b)] {
        tokio::time::sleep(Duration::from_millis(20)).await;
        end(&mut raw, origin, id).await;
    }
    use pb::SessionStatus::{Ended, Idle};
    let everything = listed(&mut raw, listing("", true, 0)).await;
    assert_eq!(
        everything,
        [(live.clone(), Idle), (b.clone(), Ended), (c.clone(), Ended), (a.clone(), Ended)],
        "live first, then newest ended first"
    );
    let full = raw.list_live_sessions(listing("", true, 0)).await.unwrap().into_inner().sessions;
    let ended_c = full.iter().find(|l| l.summary.as_ref().unwrap().session.as_ref().unwrap().session_id == c).unwrap();
    assert_eq!(ended_c.origin, OTHER);
    assert!(!ended_c.workspace_path.is_empty(), "the user is told where it ran: {ended_c:?}");
    assert_eq!(ended_c.summary.as_ref().unwrap().session.as_ref().unwrap().provider, "scripted");

    // One site's; a bound on the ended ones only; without the flag, live only.
    assert_eq!(
        listed(&mut raw, listing(SITE, true, 0)).await,
        [(live.clone(), Idle), (b.clone(), Ended), (a.clone(), Ended)]
    );
    assert_eq!(listed(&mut raw, listing("", true, 1)).await, [(live.clone(), Idle), (b.clone(), Ended)]);
    assert_eq!(listed(&mut raw, listing("", false, 0)).await, [(live.clone(), Idle)]);
    // The Rust SDK's owner asks the same.
    let owner = h.client().await.owner().expect("an app: origin is the user");
    let ids = |sessions: Vec<pb::LiveSession>| -> Vec<String> {
        sessions.into_iter().map(|l| l.summary.unwrap().session.unwrap().session_id).collect()
    };
    assert_eq!(ids(owner.live_and_ended_sessions(Some(SITE), 1).await.unwrap()), [live.clone(), b.clone()]);
    assert_eq!(ids(owner.live_sessions(Some(SITE)).await.unwrap()), [live.as_str()]);

    // Resumed, it is live again and not also listed as ended.
    let resume = pb::ResumeRequest { session_id: a.clone(), caller_origin: SITE.into() };
    raw.resume(resume).await.unwrap();
    let now = listed(&mut raw, listing("", true, 0)).await;
    assert_eq!(now.iter().filter(|(id, _)| *id == a).count(), 1, "{now:?}");
    assert!(now.contains(&(a.clone(), Idle)), "{now:?}");

    // An ended_limit past 1000 is refused, with or without the flag.
    for include_ended in [true, false] {
        let refused = raw.list_live_sessions(listing("", include_ended, 1001)).await.unwrap_err();
        assert_eq!(refusal(&refused), ("INVALID_ARGUMENT".into(), json!({ "field": "ended_limit" })));
    }
    assert_eq!(listed(&mut raw, listing("", true, 1000)).await.len(), 4);
    // A page asking for every site's ended sessions is refused like any owner call.
    let mut forged = listing("", true, 0);
    forged.caller_origin = SITE.into();
    assert_eq!(refusal(&raw.list_live_sessions(forged).await.unwrap_err()).0, "ORIGIN_NOT_ALLOWED");
}

/// A site the user limited to one agent cannot create, resume or fork a
/// session of another (ORIGIN_NOT_ALLOWED, reason agent_not_allowed), and
/// nothing is made; the agent it may use works; a site with no list may
/// use any. An unknown agent in the consent is refused and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_limited_to_one_agent_is_refused_every_other_before_anything_is_made() {
    let h = Harness::with_config(Via::Grpc, TWO_AGENTS);
    h.approve(SITE, &[]).await;
    h.approve(OTHER, &[]).await;
    let mut raw = h.raw().await;
    // Made while the site could use any agent.
    let to_resume = created(&mut raw, SITE, "scripted2").await;
    end(&mut raw, SITE, &to_resume).await;
    let to_fork = created(&mut raw, SITE, "scripted2").await;

    let stored = h.set_consent(limited(SITE, &["scripted"], 0)).await;
    assert_eq!(stored.providers, ["scripted"]);
    let before = sessions_of(&mut raw, SITE).await;
    let workspaces = std::fs::read_dir(h.workspaces()).map(|d| d.count()).unwrap_or(0);
    let not_allowed =
        ("ORIGIN_NOT_ALLOWED".to_owned(), json!({ "reason": "agent_not_allowed", "provider": "scripted2" }));

    let create_refused = raw.create_session(create(SITE, "scripted2")).await.unwrap_err();
    assert_eq!(refusal(&create_refused), not_allowed);
    assert_eq!(create_refused.code(), tonic::Code::PermissionDenied);
    let resume = pb::ResumeRequest { session_id: to_resume.clone(), caller_origin: SITE.into() };
    assert_eq!(refusal(&raw.resume(resume).await.unwrap_err()), not_allowed);
    let fork =
        pb::ForkRequest { session_id: to_fork.clone(), caller_origin: SITE.into(), auto_end_on_disconnect: None };
    assert_eq!(refusal(&raw.fork(fork).await.unwrap_err()), not_allowed);

    // Nothing was made, and the ended session stayed ended.
    assert_eq!(sessions_of(&mut raw, SITE).await, before);
    assert_eq!(std::fs::read_dir(h.workspaces()).map(|d| d.count()).unwrap_or(0), workspaces, "no workspace made");
    let recent = listed(&mut raw, listing(SITE, true, 0)).await;
    assert!(recent.contains(&(to_resume.clone(), pb::SessionStatus::Ended)), "{recent:?}");

    // The allowed agent works, named or as the default; another site is unaffected.
    created(&mut raw, SITE, "scripted").await;
    created(&mut raw, SITE, "").await;
    created(&mut raw, OTHER, "scripted2").await;
    // Every agent again once the list is emptied.
    h.set_consent(limited(SITE, &[], 0)).await;
    created(&mut raw, SITE, "scripted2").await;

    // An unknown agent (or a limit past 1000) is refused and stores nothing.
    let set = |consent| pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) };
    let unknown = raw.set_consent(set(limited(SITE, &["scripted", "no-such-agent"], 0))).await.unwrap_err();
    assert_eq!(
        refusal(&unknown),
        ("INVALID_ARGUMENT".into(), json!({ "field": "providers", "provider": "no-such-agent" }))
    );
    let too_many = raw.set_consent(set(limited(SITE, &["scripted"], 1001))).await.unwrap_err();
    assert_eq!(refusal(&too_many), ("INVALID_ARGUMENT".into(), json!({ "field": "max_live_sessions" })));
    let kept = consent_of(&mut raw, SITE).await;
    assert!(kept.providers.is_empty() && kept.max_live_sessions == 0, "{kept:?}");
    assert_eq!(h.set_consent(limited(SITE, &[], 1000)).await.max_live_sessions, 1000);
}

/// A site's own session limit of 1 refuses its second live session
/// (QUOTA_EXCEEDED naming that limit and the site) while another site
/// keeps the default; both of a site's own limits survive a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sites_own_session_limit_holds_for_it_alone_and_survives_a_restart() {
    let mut h = Harness::with_config(Via::Grpc, TWO_AGENTS);
    h.approve(OTHER, &[]).await;
    h.set_consent(limited(SITE, &["scripted"], 1)).await;
    let mut raw = h.raw().await;
    let first = created(&mut raw, SITE, "").await;
    let site_quota = ("QUOTA_EXCEEDED".to_owned(), json!({ "limit": "max_live_sessions", "max": 1, "origin": SITE }));
    let refused = raw.create_session(create(SITE, "")).await.unwrap_err();
    assert_eq!(refusal(&refused), site_quota);
    assert_eq!(sessions_of(&mut raw, SITE).await, 1, "the refused create made nothing");
    // Another site has the default (8) and is not counted with it.
    for _ in 0..3 {
        created(&mut raw, OTHER, "").await;
    }

    h.crash_and_restart();
    let mut raw = h.raw().await;
    let kept = consent_of(&mut raw, SITE).await;
    assert_eq!((kept.providers.as_slice(), kept.max_live_sessions), (["scripted".to_owned()].as_slice(), 1));
    assert_eq!(refusal(&raw.create_session(create(SITE, "")).await.unwrap_err()), site_quota);
    assert_eq!(
        refusal(&raw.create_session(create(SITE, "scripted2")).await.unwrap_err()),
        ("ORIGIN_NOT_ALLOWED".to_owned(), json!({ "reason": "agent_not_allowed", "provider": "scripted2" }))
    );
    // Ending the live one admits exactly one more.
    end(&mut raw, SITE, &first).await;
    created(&mut raw, SITE, "").await;
    assert_eq!(refusal(&raw.create_session(create(SITE, "")).await.unwrap_err()), site_quota);
    // Resuming an ended session counts like a new one.
    let resume = pb::ResumeRequest { session_id: first, caller_origin: SITE.into() };
    assert_eq!(refusal(&raw.resume(resume).await.unwrap_err()), site_quota);
    // Back to the default (0): config.toml's limit and key.
    h.set_consent(limited(SITE, &["scripted"], 0)).await;
    created(&mut raw, SITE, "").await;
}
