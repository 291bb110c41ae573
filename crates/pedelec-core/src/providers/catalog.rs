//! The providers Core knows: built-in presets, merged with the settings file.

use std::collections::BTreeMap;

use pedelec_protocol::ErrorCode;

use crate::error::{CoreError, CoreResult};
use crate::settings::{ProviderKind, ProviderOverride, Settings};

/// Everything an adapter needs to know about one provider; never holds a secret.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub code: String,
    pub name: String,
    pub kind: ProviderKind,
    /// Program and leading arguments (process-based kinds).
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// The default model; `None` lets the agent pick (or, for `openai`, is `MODEL_REQUIRED`).
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The variable the API key is read from at request time.
    pub api_key_env: Option<String>,
    pub max_rounds: u32,
    /// How long an openai stream may go without a chunk before the turn fails.
    pub stream_idle_timeout: std::time::Duration,
    /// Extra CA certificates (PEM) an https endpoint's certificate may chain to.
    pub ca_file: Option<std::path::PathBuf>,
    /// Keep one process started for the next session (`providers::warm`),
    /// where the kind can; `None`: not kept.
    pub warm: Option<super::warm::WarmLimits>,
}

/// Tool-calling rounds per turn for the openai loop, unless configured.
pub const DEFAULT_MAX_ROUNDS: u32 = 8;
/// A model server silent this long mid-stream has stalled.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn preset(code: &str, name: &str, kind: ProviderKind, command: &[&str]) -> ProviderConfig {
    ProviderConfig {
        code: code.into(),
        name: name.into(),
        kind,
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        model: None,
        base_url: None,
        api_key_env: None,
        max_rounds: DEFAULT_MAX_ROUNDS,
        stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
        ca_file: None,
        warm: None,
    }
}

fn endpoint(code: &str, name: &str, base_url: Option<&str>, api_key_env: Option<&str>) -> ProviderConfig {
    let mut config = preset(code, name, ProviderKind::Openai, &[]);
    config.base_url = base_url.map(str::to_owned);
    config.api_key_env = api_key_env.map(str::to_owned);
    config
}

/// claude-agent-acp (0.23) fails `session/new` when run as root ("Query
/// closed before response received"): its Claude child refuses to start as
/// root in the configuration the adapter gives it unless `IS_SANDBOX=1` says
/// the machine is a sandbox. Root is what containers and CI machines run as,
/// so Core says so for it. The variable only lets the adapter offer the
/// bypass mode; the session's mode stays the default, and every permission
/// request still reaches Core's policy.
fn claude_acp() -> ProviderConfig {
    let mut config = preset("claude-acp", "Claude Code (ACP)", ProviderKind::Acp, &["claude-agent-acp"]);
    if crate::platform::files::is_superuser() {
        config.env.insert("IS_SANDBOX".into(), "1".into());
    }
    config
}

/// gemini-cli (0.61) ignores the MCP servers a client passes in
/// `session/new` for a folder it does not trust, so the session's frontend
/// tools never reach the model and nothing says why. The workspace is one
/// Core made (managed) or the application chose (explicit), never a folder
/// the user happened to open, so Core tells gemini to trust it.
fn gemini() -> ProviderConfig {
    let mut config = preset("gemini", "Gemini CLI (ACP)", ProviderKind::Acp, &["gemini", "--acp"]);
    config.env.insert("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into());
    config
}

/// The presets, in the order `ListProviders` reports them.
pub fn presets() -> Vec<ProviderConfig> {
    use ProviderKind::*;
    let mut scripted = preset("scripted", "Scripted", Scripted, &[]);
    scripted.model = Some("scripted-1".into());
    vec![
        scripted,
        gemini(),
        preset("cursor", "Cursor agent (ACP)", Acp, &["cursor-agent", "acp"]),
        preset("opencode", "OpenCode (ACP)", Acp, &["opencode", "acp"]),
        claude_acp(),
        preset("codex-acp", "Codex (ACP)", Acp, &["codex-acp"]),
        preset("codex", "Codex CLI", Codex, &["codex"]),
        preset("claude", "Claude Code CLI", Claude, &["claude"]),
        endpoint("openai", "OpenAI", Some("https://api.openai.com/v1"), Some("OPENAI_API_KEY")),
        endpoint("openrouter", "OpenRouter", Some("https://openrouter.ai/api/v1"), Some("OPENROUTER_API_KEY")),
        endpoint("groq", "Groq", Some("https://api.groq.com/openai/v1"), Some("GROQ_API_KEY")),
        endpoint("mistral", "Mistral", Some("https://api.mistral.ai/v1"), Some("MISTRAL_API_KEY")),
        endpoint("deepseek", "DeepSeek", Some("https://api.deepseek.com/v1"), Some("DEEPSEEK_API_KEY")),
        endpoint("together", "Together AI", Some("https://api.together.xyz/v1"), Some("TOGETHER_API_KEY")),
        endpoint("ollama", "Ollama", Some("http://127.0.0.1:11434/v1"), None),
        endpoint("llamacpp", "llama.cpp server", Some("http://127.0.0.1:8080/v1"), None),
    ]
}

/// Presets with the settings file's overrides and additions applied.
pub fn resolve(settings: &Settings) -> CoreResult<Vec<ProviderConfig>> {
    let mut all = presets();
    for (code, over) in &settings.providers {
        let index = match all.iter().position(|p| &p.code == code) {
            Some(index) => index,
            None => {
                let kind = over.kind.ok_or_else(|| {
                    CoreError::new(
                        ErrorCode::ConfigInvalid,
                        format!("providers.{code} is not a built-in provider, so it needs `kind`"),
                    )
                })?;
                all.push(preset(code, code, kind, &[]));
                all.len() - 1
            }
        };
        apply(&mut all[index], over)?;
    }
    if let Some(default) = &settings.default_provider
        && !all.iter().any(|p| &p.code == default)
    {
        return Err(CoreError::new(
            ErrorCode::ConfigInvalid,
            format!("default_provider {default:?} is not a provider"),
        ));
    }
    // Warm: as configured, else the default provider alone.
    let default = settings.default_provider.as_deref().unwrap_or("scripted");
    for config in &mut all {
        let asked = settings.providers.get(&config.code).and_then(|over| over.warm);
        if asked.unwrap_or(config.code == default) && super::warm::can_warm(config.kind) {
            config.warm = Some(warm_limits(settings));
        }
    }
    Ok(all)
}

/// How warm agent processes are kept: config.toml's `warm_*` keys, the
/// defaults where it says nothing.
fn warm_limits(settings: &Settings) -> super::warm::WarmLimits {
    let defaults = super::warm::WarmLimits::default();
    super::warm::WarmLimits {
        idle: match settings.warm_idle_timeout_secs {
            Some(0) => None,
            Some(secs) => Some(std::time::Duration::from_secs(secs)),
            None => defaults.idle,
        },
        max_rss: settings.warm_max_rss_mib.map_or(defaults.max_rss, |mib| mib.saturating_mul(1 << 20)),
    }
}

fn apply(config: &mut ProviderConfig, over: &ProviderOverride) -> CoreResult<()> {
    if let Some(kind) = over.kind
        && kind != config.kind
    {
        return Err(CoreError::new(
            ErrorCode::ConfigInvalid,
            format!("providers.{} is built in as {:?}; its kind cannot change", config.code, config.kind),
        ));
    }
    if let Some(name) = &over.name {
        config.name = name.clone();
    }
    if let Some(command) = &over.command {
        config.command = command.clone();
    }
    config.env.extend(over.env.clone());
    if over.model.is_some() {
        config.model = over.model.clone();
    }
    if over.base_url.is_some() {
        config.base_url = over.base_url.clone();
    }
    if over.api_key_env.is_some() {
        config.api_key_env = over.api_key_env.clone();
    }
    if let Some(rounds) = over.max_rounds {
        config.max_rounds = rounds.max(1);
    }
    if let Some(file) = &over.ca_file {
        config.ca_file = Some(std::path::PathBuf::from(file));
    }
    if let Some(secs) = over.stream_idle_timeout_secs {
        config.stream_idle_timeout = std::time::Duration::from_secs(secs.max(1));
    }
    let needs_command = matches!(config.kind, ProviderKind::Acp | ProviderKind::Codex | ProviderKind::Claude);
    if needs_command && config.command.is_empty() {
        return Err(CoreError::new(ErrorCode::ConfigInvalid, format!("providers.{} needs `command`", config.code)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_override_presets_and_add_providers() {
        let settings = Settings::parse(
            r#"
            default_provider = "mine"
            [providers.codex]
            command = ["/opt/codex"]
            model = "gpt-5.1"
            [providers.mine]
            kind = "openai"
            base_url = "http://127.0.0.1:1/v1"
            "#,
        )
        .unwrap();
        let all = resolve(&settings).unwrap();
        let codex = all.iter().find(|p| p.code == "codex").unwrap();
        assert_eq!(codex.command, vec!["/opt/codex"]);
        assert_eq!(codex.model.as_deref(), Some("gpt-5.1"));
        let mine = all.iter().find(|p| p.code == "mine").unwrap();
        assert_eq!(mine.kind, ProviderKind::Openai);
        assert_eq!(all.iter().filter(|p| p.code == "codex").count(), 1);
    }

    #[test]
    fn the_default_agent_is_kept_warm_unless_told_otherwise() {
        let warm = |text: &str| -> Vec<String> {
            let all = resolve(&Settings::parse(text).unwrap()).unwrap();
            all.into_iter().filter(|p| p.warm.is_some()).map(|p| p.code).collect()
        };
        assert!(warm("").is_empty(), "scripted, the default, starts nothing");
        assert_eq!(warm("default_provider = \"gemini\""), ["gemini"]);
        assert!(warm("default_provider = \"gemini\"\n[providers.gemini]\nwarm = false").is_empty());
        assert_eq!(
            warm("[providers.opencode]\nwarm = true\n[providers.claude]\nwarm = true"),
            ["opencode"],
            "the claude CLI cannot be"
        );
        let limits = resolve(
            &Settings::parse("default_provider = \"gemini\"\nwarm_idle_timeout_secs = 0\nwarm_max_rss_mib = 5")
                .unwrap(),
        )
        .unwrap()
        .into_iter()
        .find_map(|p| p.warm)
        .unwrap();
        assert_eq!(limits, crate::providers::warm::WarmLimits { idle: None, max_rss: 5 << 20 });
        assert!(Settings::parse("warm_max_rss_mib = 0").is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        for text in [
            "[providers.mine]\nmodel = \"x\"",
            "[providers.codex]\nkind = \"openai\"",
            "[providers.mine]\nkind = \"acp\"",
            "default_provider = \"nobody\"",
        ] {
            let settings = Settings::parse(text).unwrap();
            let error = resolve(&settings).unwrap_err();
            assert_eq!(error.code(), ErrorCode::ConfigInvalid, "{text}");
        }
    }
}
