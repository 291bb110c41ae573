//! What Core detects of each configured provider — availability and the
//! reason when unavailable, version where it can be read without running the
//! agent, default model, and for a missing agent the command that installs
//! it. One function, [`agents`], answers both the `ListAgents` owner call
//! (the extension's Agents view) and `pedelec-core doctor`, so the two never
//! disagree.
//!
//! Nothing here starts an agent: a version comes from the npm package that
//! holds the resolved program (`node_modules/<package>/package.json`), which
//! is where `cargo xtask agents` and `npm install -g` put every agent Core
//! knows of; any other installation reports no version.

use std::path::{Component, Path};

use pedelec_protocol::pb;

use super::catalog::ProviderConfig;
use super::{Provider, Providers};
use crate::settings::ProviderKind;

/// The npm package of each preset's program, as `agents/package.json`
/// (the conformance matrix's pins) names them. `opencode` is the wrapper
/// package (the matrix pins its linux-x64 build, whose lock npm can check).
/// Cursor's agent is not on npm, so it has no entry.
const NPM_PACKAGES: &[(&str, &str)] = &[
    ("gemini", "@google/gemini-cli"),
    ("opencode", "opencode-ai"),
    ("claude-agent-acp", "@zed-industries/claude-agent-acp"),
    ("codex-acp", "@zed-industries/codex-acp"),
    ("codex", "@openai/codex"),
    ("claude", "@anthropic-ai/claude-code"),
];

/// How many directories above the program a `package.json` is looked for
/// (`node_modules/@scope/name/bin/program.js` is three).
const PACKAGE_DEPTH: usize = 4;

/// Every configured provider as the user's window and `doctor` show it, in
/// `ListProviders`' order, and the default provider. Blocking (it stats
/// programs and may probe a loopback endpoint): run it off the async workers.
pub fn agents(providers: &Providers) -> pb::ListAgentsResponse {
    pb::ListAgentsResponse {
        agents: providers.all.iter().map(|p| agent(p.as_ref())).collect(),
        default_provider: providers.default_code(),
    }
}

fn agent(provider: &dyn Provider) -> pb::AgentInfo {
    let info = provider.info();
    let config = provider.config();
    let program = config.command.first().map(String::as_str).unwrap_or_default();
    let resolved = match config.kind {
        ProviderKind::Scripted | ProviderKind::Openai => None,
        _ => super::process::resolve_program(program).ok(),
    };
    let version = match config.kind {
        ProviderKind::Scripted => env!("CARGO_PKG_VERSION").to_owned(),
        ProviderKind::Openai => String::new(),
        _ => resolved.as_deref().and_then(npm_version).unwrap_or_default(),
    };
    let missing = !program.is_empty() && resolved.is_none() && !matches!(config.kind, ProviderKind::Openai);
    pb::AgentInfo {
        install_command: if missing { install_command(config).unwrap_or_default() } else { String::new() },
        provider: Some(info),
        version,
        default_model: provider.default_model(),
        warm: Some(provider.warm()),
    }
}

/// `npm install -g <package>` for a provider whose program Core knows the
/// package of (by the program's file name, so a configured path to the same
/// program counts); `None` otherwise.
pub fn install_command(config: &ProviderConfig) -> Option<String> {
    let program = Path::new(config.command.first()?).file_stem()?.to_str()?;
    let (_, package) = NPM_PACKAGES.iter().find(|(name, _)| *name == program)?;
    Some(format!("npm install -g {package}"))
}

/// The version in the `package.json` of the npm package holding `program`
/// (its real path: `node_modules/.bin/x` is a link into the package).
fn npm_version(program: &Path) -> Option<String> {
    let real = std::fs::canonicalize(program).ok()?;
    let inside_node_modules = real.components().any(|c| c == Component::Normal("node_modules".as_ref()));
    if !inside_node_modules {
        return None;
    }
    for dir in real.ancestors().skip(1).take(PACKAGE_DEPTH) {
        if dir.file_name().is_some_and(|n| n == "node_modules") {
            return None;
        }
        let Ok(text) = std::fs::read_to_string(dir.join("package.json")) else { continue };
        let manifest: serde_json::Value = serde_json::from_str(&text).ok()?;
        return manifest["version"].as_str().map(str::to_owned);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    #[test]
    fn every_package_is_one_the_matrix_pins() {
        let pins = include_str!("../../../../agents/package.json");
        let pins: serde_json::Value = serde_json::from_str(pins).unwrap();
        for (_, package) in NPM_PACKAGES {
            let pinned = pins["dependencies"].get(*package).is_some() || *package == "opencode-ai";
            assert!(pinned, "{package} is not in agents/package.json");
        }
    }

    #[test]
    fn a_missing_agent_gets_its_install_command_and_the_builtin_its_version() {
        let toml = r#"
            default_provider = "codex"
            [providers.codex]
            command = ["/nowhere/bin/codex"]
            model = "gpt-test"
        "#;
        let settings: Settings = toml::from_str(toml).unwrap();
        let listed = agents(&Providers::from_settings(&settings).unwrap());
        assert_eq!(listed.default_provider, "codex");
        let codex = listed.agents.iter().find(|a| a.provider.as_ref().unwrap().code == "codex").unwrap();
        assert!(!codex.provider.as_ref().unwrap().available);
        assert_eq!(codex.install_command, "npm install -g @openai/codex");
        assert_eq!((codex.version.as_str(), codex.default_model.as_str()), ("", "gpt-test"));
        let scripted = listed.agents.iter().find(|a| a.provider.as_ref().unwrap().code == "scripted").unwrap();
        assert_eq!(scripted.version, env!("CARGO_PKG_VERSION"));
        assert_eq!((scripted.default_model.as_str(), scripted.install_command.as_str()), ("scripted-1", ""));
        let openai = listed.agents.iter().find(|a| a.provider.as_ref().unwrap().code == "openai").unwrap();
        assert_eq!(openai.install_command, "", "an endpoint is not installed");
    }

    #[test]
    fn an_npm_agents_version_is_its_packages() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("node_modules/@openai/codex");
        std::fs::create_dir_all(package.join("bin")).unwrap();
        std::fs::write(package.join("package.json"), r#"{"name":"@openai/codex","version":"0.171.0"}"#).unwrap();
        std::fs::write(package.join("bin/codex.js"), "").unwrap();
        assert_eq!(npm_version(&package.join("bin/codex.js")).as_deref(), Some("0.171.0"));
        let loose = dir.path().join("codex");
        std::fs::write(&loose, "").unwrap();
        assert_eq!(npm_version(&loose), None, "not installed from npm");
    }
}
