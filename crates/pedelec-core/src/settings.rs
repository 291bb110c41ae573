//! Core's settings file: `<config dir>/config.toml`.
//!
//! ```toml
//! default_provider = "codex"          # used when a request names none
//! turn_timeout_secs = 600             # a turn running longer (tool waits not counted) fails with PROVIDER_TIMEOUT
//! permission_timeout_secs = 60        # an unanswered permission request (permission mode "app") is rejected
//! ended_session_retention_days = 30   # ended sessions are deleted (with their transcript) this long after they end, and activity log entries this long after they were made; 0 keeps them
//! allowed_workspace_roots = ["~/projects"]  # where local ("app:") programs may open explicit workspaces; none by default
//! asset_bytes_per_session = 1073741824  # bytes a session's asset folder may hold (1 GiB); an upload over it is QUOTA_EXCEEDED
//! asset_server_connections = 64       # connections the loopback asset server holds at once; more are closed
//! asset_header_timeout_secs = 10      # a connection to it that sends no complete request head in this long is closed
//! max_live_sessions_per_origin = 8    # sessions not yet ended per web (http/https) origin; local "app:" programs are not counted
//! max_agent_processes = 16            # agent processes Core runs at once, all sessions together
//! max_transcript_bytes = 268435456    # stored transcript per session (256 MiB); a turn starting past it is refused
//! event_log_session_mib = 128         # unread events kept per session for slow subscribers (a 200 000-delta turn)
//! event_log_total_mib = 512           # the same across all sessions
//! agent_idle_timeout_secs = 600       # a session's agent process idle this long is ended (the next turn starts it again); 0 keeps it
//! warm_idle_timeout_secs = 600        # a warm agent process no session took for this long is ended; 0 keeps it
//! warm_max_rss_mib = 1024             # a warm agent process larger than this is ended, not kept
//!
//! [providers.codex]                   # override a built-in provider…
//! command = ["/opt/codex/bin/codex"]
//! model = "gpt-5.1"
//!
//! [providers.gemini]
//! warm = true                         # keep one started for the next session (default: the default provider only)
//!
//! [providers.my-agent]                # …or add one of your own
//! kind = "acp"                        # acp | codex | claude | openai
//! command = ["my-agent", "--acp"]
//! env = { MY_AGENT_MODE = "fast" }
//!
//! [providers.lmstudio]
//! kind = "openai"
//! base_url = "http://127.0.0.1:1234/v1"
//! api_key_env = "LMSTUDIO_KEY"        # the key itself never lives in this file
//! model = "qwen3-coder"
//! max_rounds = 8                      # tool-calling rounds per turn
//! stream_idle_timeout_secs = 60       # a stream silent this long fails the turn (PROVIDER_TIMEOUT)
//!
//! [providers.gateway]                 # an https endpoint behind a company CA
//! kind = "openai"
//! base_url = "https://llm.internal.example/v1"
//! api_key_env = "GATEWAY_KEY"
//! ca_file = "/etc/ssl/company-ca.pem"  # trusted besides the system's roots
//! ```
//!
//! Hosted OpenAI-compatible services are presets (`openai`, `openrouter`,
//! `groq`, `mistral`, `deepseek`, `together`): set the key's variable
//! (`OPENAI_API_KEY`, …) and pass a model.
//!
//! A missing file means defaults; an unreadable or invalid one stops Core
//! from starting (`CONFIG_INVALID`), because silently ignoring a typo would
//! run the wrong agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pedelec_protocol::ErrorCode;
use serde::Deserialize;

use crate::error::{CoreError, CoreResult};

/// The adapter family a provider uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Scripted,
    Acp,
    Codex,
    Claude,
    Openai,
}

/// What the user changes from the control center (`Core.SetSettings`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsChange {
    /// `default_provider`, when given.
    pub default_provider: Option<String>,
    /// Provider code → its default model (`providers.<code>.model`);
    /// `None` removes the setting (back to the preset's).
    pub models: BTreeMap<String, Option<String>>,
}

/// One `[providers.<code>]` table; every field is optional over the preset.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderOverride {
    pub kind: Option<ProviderKind>,
    pub name: Option<String>,
    /// Program and leading arguments.
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Tool-calling rounds the openai agent loop may take in one turn.
    pub max_rounds: Option<u32>,
    /// Seconds an openai stream may go without a chunk (default 60).
    pub stream_idle_timeout_secs: Option<u64>,
    /// A PEM file of CA certificates to trust besides the system's (https endpoints).
    pub ca_file: Option<String>,
    /// Keep one agent process started and initialised for the next session
    /// (agents that can take a session's workspace after start: ACP). Unset:
    /// on for the default provider, off for the others.
    pub warm: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub default_provider: Option<String>,
    pub turn_timeout_secs: Option<u64>,
    /// How long a permission request waits for the application (`PERMISSION_MODE_APP`).
    pub permission_timeout_secs: Option<u64>,
    /// Days an ended session stays stored (resumable, in `ListSessions`), and
    /// an activity log entry after it was made; 0: for ever.
    pub ended_session_retention_days: Option<u32>,
    /// Where `app:` origins may open explicit workspaces (absolute or `~/…`).
    #[serde(default)]
    pub allowed_workspace_roots: Vec<String>,
    /// Assets (`assets::AssetLimits`, whose defaults apply when unset): the
    /// bytes one session's asset folder may hold, and the loopback transfer
    /// server's connection cap and request-head timeout.
    pub asset_bytes_per_session: Option<u64>,
    pub asset_server_connections: Option<u32>,
    pub asset_header_timeout_secs: Option<u64>,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderOverride>,
    /// Quotas (`quota.rs`); each refusal is `QUOTA_EXCEEDED` naming its key.
    pub max_live_sessions_per_origin: Option<usize>,
    pub max_agent_processes: Option<usize>,
    pub max_transcript_bytes: Option<u64>,
    // The event log subscribers read at their own pace (`session::log`):
    // MiB of unread events kept per session, and across all sessions. A
    // reader further behind is re-synchronised from a snapshot.
    pub event_log_session_mib: Option<u64>,
    pub event_log_total_mib: Option<u64>,
    /// The warm agent processes (`providers::warm`): how long one waits
    /// for a session before it is ended (0: for ever), and the resident
    /// memory above which one is not kept.
    pub warm_idle_timeout_secs: Option<u64>,
    pub warm_max_rss_mib: Option<u64>,
    /// Seconds a session's agent process may sit idle before it is ended
    /// (the next turn starts it again); 0: kept until the session ends.
    pub agent_idle_timeout_secs: Option<u64>,
}

/// Ten minutes, like the warm processes: a session paused this long pays
/// one agent start-up at its next turn, and holds no process meanwhile.
pub const DEFAULT_AGENT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// A permission request nobody answers is rejected after this.
pub const DEFAULT_PERMISSION_TIMEOUT: Duration = Duration::from_secs(60);

/// Ten minutes: long enough for real agent turns with tool use.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(600);
/// How long an ended session stays stored when config.toml says nothing.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;

impl Settings {
    /// `--config-dir`, else the shared rule: `$PEDELEC_CONFIG_DIR`, else on
    /// Linux `$XDG_CONFIG_HOME/pedelec`, else `~/.config/pedelec`; each OS's
    /// own place elsewhere (`pedelec_protocol::discovery::config_dir_for`).
    pub fn default_dir() -> PathBuf {
        use pedelec_protocol::discovery::{Platform, config_dir_for};
        config_dir_for(Platform::current(), |k| std::env::var(k).ok())
    }

    pub fn file_in(dir: &Path) -> PathBuf {
        dir.join("config.toml")
    }

    /// Reads `config.toml` from `dir`; a missing file is the defaults.
    pub fn load(dir: &Path) -> CoreResult<Self> {
        let path = Self::file_in(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
            Err(e) => {
                return Err(CoreError::new(ErrorCode::ConfigInvalid, format!("cannot read {}: {e}", path.display())));
            }
        };
        Self::parse(&text)
            .map_err(|message| CoreError::new(ErrorCode::ConfigInvalid, format!("{}: {message}", path.display())))
    }

    /// `text` (a config.toml) with `change` made, every other line and
    /// comment kept as written; `Err` for a file that is not TOML. The
    /// result is checked by [`Settings::parse`] like any config.toml.
    pub fn edited(text: &str, change: &SettingsChange) -> Result<String, String> {
        use toml_edit::{DocumentMut, Item, Table, value};
        let mut document: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
        if let Some(default) = &change.default_provider {
            document["default_provider"] = value(default.as_str());
        }
        if !change.models.is_empty() {
            if !document.contains_key("providers") {
                let mut providers = Table::new();
                providers.set_implicit(true);
                document.insert("providers", Item::Table(providers));
            }
            let providers = document["providers"].as_table_mut().ok_or("`providers` in config.toml is not a table")?;
            for (code, model) in &change.models {
                if !providers.contains_key(code) {
                    providers.insert(code, Item::Table(Table::new()));
                }
                let table = providers[code.as_str()]
                    .as_table_like_mut()
                    .ok_or_else(|| format!("providers.{code} in config.toml is not a table"))?;
                match model {
                    Some(model) => {
                        table.insert("model", value(model.as_str()));
                    }
                    None => {
                        table.remove("model");
                    }
                }
            }
        }
        Ok(document.to_string())
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let settings: Settings = toml::from_str(text).map_err(|e| e.to_string())?;
        for (code, provider) in &settings.providers {
            if code.is_empty() || !code.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(format!("provider code {code:?} may hold only letters, digits, '-' and '_'"));
            }
            if provider.command.as_ref().is_some_and(|c| c.is_empty() || c[0].is_empty()) {
                return Err(format!("providers.{code}.command needs a program"));
            }
        }
        if settings.turn_timeout_secs == Some(0) {
            return Err("turn_timeout_secs must be at least 1".into());
        }
        if settings.permission_timeout_secs == Some(0) {
            return Err("permission_timeout_secs must be at least 1".into());
        }
        // A transfer server that accepts no connection, or closes every one
        // before its head can arrive, cannot work.
        if settings.asset_server_connections == Some(0) {
            return Err("asset_server_connections must be at least 1".into());
        }
        if settings.asset_header_timeout_secs == Some(0) {
            return Err("asset_header_timeout_secs must be at least 1".into());
        }
        if settings.event_log_session_mib == Some(0) || settings.event_log_total_mib == Some(0) {
            return Err("event_log_session_mib and event_log_total_mib must be at least 1".into());
        }
        if settings.warm_max_rss_mib == Some(0) {
            return Err("warm_max_rss_mib must be at least 1".into());
        }
        Ok(settings)
    }

    pub fn turn_timeout(&self) -> Duration {
        self.turn_timeout_secs.map(Duration::from_secs).unwrap_or(DEFAULT_TURN_TIMEOUT)
    }

    /// How long an ended session stays stored; `None`: for ever.
    pub fn ended_retention(&self) -> Option<Duration> {
        match self.ended_session_retention_days.unwrap_or(DEFAULT_RETENTION_DAYS) {
            0 => None,
            days => Some(Duration::from_secs(u64::from(days) * 86_400)),
        }
    }

    /// The asset limits config.toml sets, defaults for what it leaves out.
    pub fn asset_limits(&self) -> crate::assets::server_limits::AssetLimits {
        let defaults = crate::assets::server_limits::AssetLimits::default();
        crate::assets::server_limits::AssetLimits {
            max_bytes: self.asset_bytes_per_session.unwrap_or(defaults.max_bytes),
            max_connections: self.asset_server_connections.map_or(defaults.max_connections, |n| n as usize),
            header_timeout: self.asset_header_timeout_secs.map_or(defaults.header_timeout, Duration::from_secs),
        }
    }

    /// The configured quotas, each its default where config.toml says nothing.
    pub fn quotas(&self) -> crate::quota::Quotas {
        let defaults = crate::quota::Quotas::default();
        crate::quota::Quotas {
            max_live_sessions_per_origin: self
                .max_live_sessions_per_origin
                .unwrap_or(defaults.max_live_sessions_per_origin),
            max_agent_processes: self.max_agent_processes.unwrap_or(defaults.max_agent_processes),
            max_transcript_bytes: self.max_transcript_bytes.unwrap_or(defaults.max_transcript_bytes),
        }
    }

    /// Bytes of unread events kept per session, and across all sessions.
    pub fn event_log_bytes(&self) -> (usize, usize) {
        let mib = |v: Option<u64>, default: usize| {
            v.map_or(default, |m| usize::try_from(m.saturating_mul(1 << 20)).unwrap_or(usize::MAX))
        };
        (
            mib(self.event_log_session_mib, crate::session::log::DEFAULT_SESSION_BYTES),
            mib(self.event_log_total_mib, crate::session::log::DEFAULT_TOTAL_BYTES),
        )
    }

    /// How long a session's agent process may be idle; `None`: for ever.
    pub fn agent_idle_timeout(&self) -> Option<Duration> {
        match self.agent_idle_timeout_secs {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => Some(DEFAULT_AGENT_IDLE_TIMEOUT),
        }
    }

    pub fn permission_timeout(&self) -> Duration {
        self.permission_timeout_secs.map(Duration::from_secs).unwrap_or(DEFAULT_PERMISSION_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's config.toml blocks are valid settings, as Core reads them.
    #[test]
    fn the_readmes_config_blocks_parse() {
        let readme = include_str!("../../../README.md");
        let blocks: Vec<&str> = readme.split("```toml\n").skip(1).filter_map(|b| b.split("```").next()).collect();
        assert!(!blocks.is_empty(), "the README shows config.toml");
        for block in blocks {
            let settings = Settings::parse(block).unwrap_or_else(|e| panic!("{e}:\n{block}"));
            crate::providers::catalog::resolve(&settings).unwrap_or_else(|e| panic!("{e:?}:\n{block}"));
        }
    }

    #[test]
    fn parses_overrides_and_custom_providers() {
        let s = Settings::parse(
            r#"
            default_provider = "mine"
            turn_timeout_secs = 5
            [providers.mine]
            kind = "acp"
            command = ["agent", "--acp"]
            env = { A = "1" }
            "#,
        )
        .unwrap();
        assert_eq!(s.default_provider.as_deref(), Some("mine"));
        assert_eq!(s.turn_timeout(), Duration::from_secs(5));
        let mine = &s.providers["mine"];
        assert_eq!(mine.kind, Some(ProviderKind::Acp));
        assert_eq!(mine.command.as_deref(), Some(&["agent".to_owned(), "--acp".to_owned()][..]));
        assert_eq!(mine.env["A"], "1");
    }

    #[test]
    fn rejects_typos_bad_codes_and_empty_commands() {
        assert!(Settings::parse("default_providr = \"x\"").unwrap_err().contains("unknown field"));
        assert!(Settings::parse("[providers.\"a b\"]\nkind = \"acp\"").unwrap_err().contains("provider code"));
        assert!(Settings::parse("[providers.x]\ncommand = []").unwrap_err().contains("needs a program"));
        assert!(Settings::parse("[providers.x]\nkind = \"telepathy\"").is_err());
        assert!(Settings::parse("turn_timeout_secs = 0").is_err());
    }

    #[test]
    fn quotas_default_and_can_be_set() {
        assert_eq!(Settings::default().quotas(), crate::quota::Quotas::default());
        let s =
            Settings::parse("max_live_sessions_per_origin = 2\nmax_agent_processes = 3\nmax_transcript_bytes = 4096\n")
                .unwrap();
        let q = s.quotas();
        assert_eq!((q.max_live_sessions_per_origin, q.max_agent_processes, q.max_transcript_bytes), (2, 3, 4096));
    }

    #[test]
    fn a_missing_file_is_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::load(dir.path()).unwrap();
        assert!(s.providers.is_empty());
        std::fs::write(dir.path().join("config.toml"), "nonsense = [").unwrap();
        let e = Settings::load(dir.path()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::ConfigInvalid);
    }
}
