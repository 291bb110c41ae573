//! Quotas: the configured limits on what one caller (or all of them) may
//! make Core hold, and the `QUOTA_EXCEEDED` refusal each of them answers
//! with. A refused create, resume or turn start changes nothing: the check
//! runs before anything is created, spawned or written. The process limit
//! is met inside a turn (only there is it known whether the turn needs a
//! new process), so that turn is recorded and completes failed, with no
//! process started.
//!
//! Three limits live here; each is a key of `config.toml` (`settings.rs`):
//!
//! - `max_live_sessions_per_origin`: sessions not yet ended, per web origin
//!   (unless the user set that origin's own limit in its consent,
//!   `OriginConsent.max_live_sessions`: see [`live_session_limit`]).
//! - `max_agent_processes`: agent processes Core runs at once, in total.
//! - `max_transcript_bytes`: stored transcript per session.

use std::sync::atomic::{AtomicUsize, Ordering};

use pedelec_protocol::ErrorCode;

use crate::error::CoreError;

pub const DEFAULT_MAX_LIVE_SESSIONS_PER_ORIGIN: usize = 8;
pub const DEFAULT_MAX_AGENT_PROCESSES: usize = 16;
/// 256 MiB: far above any real conversation (a long codex session with
/// tool output stays in the tens of MiB), low enough that one session
/// cannot fill the disk Core's database lives on.
pub const DEFAULT_MAX_TRANSCRIPT_BYTES: u64 = 256 << 20;

/// The configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub max_live_sessions_per_origin: usize,
    pub max_agent_processes: usize,
    pub max_transcript_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_live_sessions_per_origin: DEFAULT_MAX_LIVE_SESSIONS_PER_ORIGIN,
            max_agent_processes: DEFAULT_MAX_AGENT_PROCESSES,
            max_transcript_bytes: DEFAULT_MAX_TRANSCRIPT_BYTES,
        }
    }
}

/// A refusal: `QUOTA_EXCEEDED` naming the limit's key and its value, so
/// the page (and the user reading its error) knows which setting to raise.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: at most {max} ({})", where_set(.key, .site.as_deref()))]
pub struct Exceeded {
    /// The config.toml key, or `max_live_sessions` for a site's own limit.
    pub key: &'static str,
    pub max: u64,
    pub what: &'static str,
    /// The origin whose own limit (its consent) this is; `None` for a
    /// config.toml limit.
    pub site: Option<String>,
}

fn where_set(key: &str, site: Option<&str>) -> String {
    match site {
        Some(origin) => format!("the limit you set for {origin} in the Pedelec extension"),
        None => format!("{key} in config.toml"),
    }
}

impl Exceeded {
    /// The error's details: `{"limit": "<key>", "max": <value>}`, and
    /// `"origin"` for a site's own limit.
    pub fn details(&self) -> serde_json::Value {
        match &self.site {
            Some(origin) => serde_json::json!({ "limit": self.key, "max": self.max, "origin": origin }),
            None => serde_json::json!({ "limit": self.key, "max": self.max }),
        }
    }
}

/// The live-session limit that holds for one web origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSessionLimit {
    pub max: usize,
    /// The user set it for this origin (its consent), rather than config.toml.
    pub per_site: bool,
}

impl LiveSessionLimit {
    /// The refusal of one more live session of `origin` under this limit.
    pub fn exceeded(self, origin: &str) -> Exceeded {
        Exceeded {
            key: if self.per_site { "max_live_sessions" } else { "max_live_sessions_per_origin" },
            max: self.max as u64,
            what: "this origin has too many live sessions",
            site: self.per_site.then(|| origin.to_owned()),
        }
    }
}

/// Which limit on live sessions holds for an origin: its own
/// (`OriginConsent.max_live_sessions`, `site_max`) when the user set one,
/// else config.toml's `max_live_sessions_per_origin` (`configured`). A site
/// limit may be above the default as well as below it: it is the user's
/// own choice for that site, bounded by `MAX_SITE_LIVE_SESSIONS` when set.
pub fn live_session_limit(configured: usize, site_max: u32) -> LiveSessionLimit {
    match site_max {
        0 => LiveSessionLimit { max: configured, per_site: false },
        n => LiveSessionLimit { max: n as usize, per_site: true },
    }
}

impl From<Exceeded> for CoreError {
    fn from(exceeded: Exceeded) -> Self {
        CoreError::with_details(ErrorCode::QuotaExceeded, exceeded.to_string(), exceeded.details())
    }
}

/// Whether the per-origin session limit applies to `origin`.
///
/// Only web origins (`http:`/`https:`) are limited. A page is code the user
/// merely visited, and many tabs of one site must not be able to start
/// sessions without bound. A local `app:` origin is one of the user's own
/// programs (the SDK in a script, a bench, an editor plugin): it runs as
/// the user and could start agents itself, so a per-origin count would
/// stop nothing it could not do anyway, and would break legitimate
/// many-session programs (the load and chaos benches). Their agent
/// processes still count against `max_agent_processes`.
pub fn limits_sessions_of(origin: &str) -> bool {
    pedelec_protocol::origin::is_web_origin(origin)
}

/// Agent processes running now, against `max_agent_processes`. Process-wide
/// because every provider spawns through `AgentProcess::spawn`, far below
/// the session that asked; Core sets the limit once at start.
pub static AGENT_PROCESSES: ProcessSlots = ProcessSlots::new(DEFAULT_MAX_AGENT_PROCESSES);

#[derive(Debug)]
pub struct ProcessSlots {
    max: AtomicUsize,
    running: AtomicUsize,
}

/// One running agent process's place; dropping it gives the place back.
#[derive(Debug)]
pub struct ProcessSlot(&'static ProcessSlots);

impl ProcessSlots {
    pub const fn new(max: usize) -> Self {
        ProcessSlots { max: AtomicUsize::new(max), running: AtomicUsize::new(0) }
    }

    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::SeqCst);
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Whether a warm process (`providers::warm`) may take a place: it
    /// leaves at least one free for a session.
    pub fn has_room_for_warm(&self) -> bool {
        self.running() + 2 <= self.max.load(Ordering::SeqCst)
    }

    /// A place for one more process, or the refusal when all are taken.
    pub fn take(&'static self) -> Result<ProcessSlot, Exceeded> {
        let max = self.max.load(Ordering::SeqCst);
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .map(|_| ProcessSlot(self))
            .map_err(|_| Exceeded {
                key: "max_agent_processes",
                max: max as u64,
                what: "too many agent processes running",
                site: None,
            })
    }
}

impl Drop for ProcessSlot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_refuse_past_the_limit_and_come_back_when_dropped() {
        static SLOTS: ProcessSlots = ProcessSlots::new(2);
        let a = SLOTS.take().unwrap();
        let _b = SLOTS.take().unwrap();
        let refused = CoreError::from(SLOTS.take().unwrap_err());
        assert_eq!(refused.code(), ErrorCode::QuotaExceeded);
        assert_eq!(refused.to_pb().details_json, r#"{"limit":"max_agent_processes","max":2}"#);
        assert_eq!(SLOTS.running(), 2, "a refusal takes nothing");
        drop(a);
        assert!(SLOTS.take().is_ok());
    }

    #[test]
    fn a_sites_own_limit_replaces_the_default_and_says_whose_it_is() {
        assert_eq!(live_session_limit(8, 0), LiveSessionLimit { max: 8, per_site: false });
        assert_eq!(live_session_limit(8, 1), LiveSessionLimit { max: 1, per_site: true });
        assert_eq!(live_session_limit(8, 20), LiveSessionLimit { max: 20, per_site: true });
        let site = CoreError::from(live_session_limit(8, 1).exceeded("https://a.example")).to_pb();
        assert_eq!(site.details_json, r#"{"limit":"max_live_sessions","max":1,"origin":"https://a.example"}"#);
        assert!(site.message.contains("https://a.example"), "{}", site.message);
        let default = CoreError::from(live_session_limit(8, 0).exceeded("https://a.example")).to_pb();
        assert_eq!(default.details_json, r#"{"limit":"max_live_sessions_per_origin","max":8}"#);
        assert!(default.message.contains("max_live_sessions_per_origin in config.toml"), "{}", default.message);
    }

    #[test]
    fn only_web_origins_are_limited_per_origin() {
        assert!(limits_sessions_of("https://a.example"));
        assert!(limits_sessions_of("http://localhost:8080"));
        assert!(!limits_sessions_of("app:pedelec-tests"));
    }
}
