//! `pedelec-core doctor`: one screen of what a user needs to know when
//! something does not work — Core's socket and whether it answers, the
//! state dir, the settings file, each provider's availability and why not,
//! and the native host's registration per browser (manifest, allowed
//! extensions, the binary it points to and whether that exists).
//!
//! It only reads: it starts nothing, writes nothing, and asks a running Core
//! (Ping, and the owner call ListAgents) with a short timeout. The agents it
//! lists come from `providers::detect`, the same detection the extension's
//! Agents view reads through ListAgents.

/// The caller origin doctor's owner call (ListAgents) names.
const DOCTOR_ORIGIN: &str = "app:pedelec-doctor";

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use pedelec_protocol::pb::{self, core_client::CoreClient};
use pedelec_protocol::registration::{Browser, Layout, manifest_path};

use crate::CoreConfig;
use crate::providers::Providers;
use crate::settings::Settings;

/// How long a running Core gets to answer each question.
const ASK: Duration = Duration::from_secs(2);

/// The report, as printed.
pub async fn report(config: &CoreConfig, layout: &Layout) -> String {
    let mut out = String::from("Pedelec doctor\n\nCore\n");
    let core = ask_core(&config.socket).await;
    let _ = match &core {
        Ok((ping, took, _)) => writeln!(
            out,
            "  ✓ socket     {} answers: Core {}, pid {}, in {:.1} ms",
            config.socket.display(),
            ping.version,
            ping.pid,
            took.as_secs_f64() * 1e3
        ),
        Err(why) => writeln!(out, "  ✗ socket     {}: {why}", config.socket.display()),
    };
    // A stock grpcio client fails every call without this (see
    // `pedelec_protocol::grpc::CLIENT_AUTHORITY` for why Core cannot accept it).
    let _ = writeln!(
        out,
        "  · clients    :authority must be a host name; Python: {}",
        pedelec_protocol::grpc::grpcio_channel(&config.socket)
    );
    let _ = writeln!(out, "  {} state dir  {}", mark(config.state_dir.is_dir()), describe_dir(&config.state_dir));
    let settings_file = Settings::file_in(&config.config_dir);
    let settings = Settings::load(&config.config_dir);
    let _ = match (&settings, settings_file.is_file()) {
        (Ok(_), true) => writeln!(out, "  ✓ settings   {}", settings_file.display()),
        (Ok(_), false) => writeln!(out, "  ✓ settings   {} (absent: the defaults)", settings_file.display()),
        (Err(error), _) => writeln!(out, "  ✗ settings   {error}"),
    };

    out.push_str("\nProviders");
    let agents = match core {
        Ok((_, _, agents)) => {
            out.push_str(" (as the running Core sees them)\n");
            agents
        }
        Err(_) => {
            out.push_str(" (from the settings; Core is not answering)\n");
            match settings
                .as_ref()
                .map_err(|e| e.to_string())
                .and_then(|s| Providers::from_settings(s).map_err(|e| e.to_string()))
            {
                Ok(providers) => providers.agents(),
                Err(why) => {
                    let _ = writeln!(out, "  ✗ {why}");
                    pb::ListAgentsResponse::default()
                }
            }
        }
    };
    for agent in &agents.agents {
        let _ = writeln!(out, "{}", agent_line(agent, &agents.default_provider));
    }

    out.push_str("\nNative host\n");
    for browser in Browser::EACH {
        let name = browser.name();
        let path = manifest_path(layout, browser);
        let manifest = std::fs::read_to_string(&path).ok().map(|t| serde_json::from_str::<serde_json::Value>(&t));
        let manifest = match manifest {
            None => {
                let _ = writeln!(out, "  - {name:<9} not registered ({})", path.display());
                continue;
            }
            Some(Err(error)) => {
                let _ = writeln!(out, "  ✗ {name:<9} {} is not JSON: {error}", path.display());
                continue;
            }
            Some(Ok(manifest)) => manifest,
        };
        let binary = manifest["path"].as_str().unwrap_or_default();
        let exists = Path::new(binary).is_file();
        let allowed = manifest.get("allowed_origins").or(manifest.get("allowed_extensions"));
        let allowed = allowed.map(|a| a.to_string()).unwrap_or_else(|| "nothing".into());
        let _ = writeln!(
            out,
            "  {} {name:<9} {} → {binary}{} · allows {allowed}",
            mark(exists),
            path.display(),
            if exists { "" } else { " (MISSING: register again)" },
        );
    }
    out
}

/// One provider's line: availability, code, name, version, default model,
/// and when unavailable why (and how to install it when its program is missing).
fn agent_line(agent: &pb::AgentInfo, default_provider: &str) -> String {
    let provider = agent.provider.clone().unwrap_or_default();
    let mut line = format!("  {} {:<12} {}", mark(provider.available), provider.code, provider.name);
    if !agent.version.is_empty() {
        let _ = write!(line, " {}", agent.version);
    }
    if !agent.default_model.is_empty() {
        let _ = write!(line, " · model {}", agent.default_model);
    }
    if provider.code == default_provider {
        line.push_str(" · the default");
    }
    if !provider.available {
        let _ = write!(line, " — {}", provider.reason);
    }
    if !agent.install_command.is_empty() {
        let _ = write!(line, " (install: {})", agent.install_command);
    }
    if let Some(warm) = agent.warm.as_ref().and_then(warm_words) {
        let _ = write!(line, " · {warm}");
    }
    line
}

/// What the agent's warm process is doing, in words; `None` when it keeps none.
fn warm_words(warm: &pb::WarmProcess) -> Option<String> {
    use pb::WarmState;
    Some(match warm.state() {
        WarmState::Off | WarmState::Unspecified => return None,
        WarmState::Idle => "warm: none running yet".to_owned(),
        WarmState::Starting => "warm: starting".to_owned(),
        WarmState::Ready if warm.rss_bytes > 0 => {
            format!("warm: ready (pid {}, {} MiB)", warm.pid, warm.rss_bytes >> 20)
        }
        WarmState::Ready => format!("warm: ready (pid {})", warm.pid),
        WarmState::Reaped => format!("warm: ended — {}", warm.reason),
        WarmState::Failed => format!("warm: not kept — {}", warm.reason),
    })
}

fn mark(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗" }
}

fn describe_dir(dir: &Path) -> String {
    match std::fs::metadata(dir) {
        Ok(meta) => {
            let (mode, private) = match crate::platform::files::mode(&meta) {
                Some(mode) if mode & 0o077 != 0 => (format!("{mode:o}"), " (not private: others can read it)"),
                Some(mode) => (format!("{mode:o}"), ""),
                None => ("the profile's access list".to_owned(), ""),
            };
            let database = std::fs::metadata(dir.join("sessions.sqlite3"))
                .map(|m| format!(", database {:.1} MiB", m.len() as f64 / (1024.0 * 1024.0)))
                .unwrap_or_else(|_| ", no database yet".into());
            format!("{} ({mode}{private}{database})", dir.display())
        }
        Err(_) => format!("{} (absent: Core creates it at start)", dir.display()),
    }
}

/// Ping and ListAgents from a running Core, or why not.
async fn ask_core(socket: &Path) -> Result<(pb::PingResponse, Duration, pb::ListAgentsResponse), String> {
    if !socket.exists() {
        return Err("no socket: Core is not running (the SDK and the native host start it on demand)".into());
    }
    let started = Instant::now();
    let channel = tokio::time::timeout(ASK, pedelec_ipc::local_channel(socket))
        .await
        .map_err(|_| "no answer within 2 s".to_owned())?
        .map_err(|e| format!("cannot connect: {e} (a stale socket of a Core that died?)"))?;
    let mut client = CoreClient::new(channel);
    let ping = tokio::time::timeout(ASK, client.ping(pb::PingRequest {}))
        .await
        .map_err(|_| "no answer to Ping within 2 s".to_owned())?
        .map_err(|e| format!("Ping failed: {}", e.message()))?
        .into_inner();
    let took = started.elapsed();
    let agents = client.list_agents(pb::ListAgentsRequest { caller_origin: DOCTOR_ORIGIN.into() });
    let agents = tokio::time::timeout(ASK * 5, agents)
        .await
        .map_err(|_| "no answer to ListAgents within 10 s".to_owned())?
        .map_err(|e| format!("ListAgents failed: {}", e.message()))?
        .into_inner();
    Ok((ping, took, agents))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_line_says_what_is_kept_warm() {
        let agent = |warm: pb::WarmProcess| pb::AgentInfo {
            provider: Some(pb::ProviderInfo {
                code: "gemini".into(),
                name: "Gemini".into(),
                available: true,
                ..Default::default()
            }),
            warm: Some(warm),
            ..Default::default()
        };
        let ready =
            pb::WarmProcess { state: pb::WarmState::Ready as i32, pid: 42, rss_bytes: 215 << 20, ..Default::default() };
        assert!(agent_line(&agent(ready), "gemini").ends_with(" · the default · warm: ready (pid 42, 215 MiB)"));
        let reaped =
            pb::WarmProcess { state: pb::WarmState::Reaped as i32, reason: "idle".into(), ..Default::default() };
        assert!(agent_line(&agent(reaped), "x").ends_with("warm: ended — idle"));
        let off = pb::WarmProcess { state: pb::WarmState::Off as i32, ..Default::default() };
        assert!(!agent_line(&agent(off), "x").contains("warm"), "nothing said for an agent not kept warm");
    }
}
