//! Where Core keeps its socket, database and managed workspaces.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Resolved daemon configuration.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Core's endpoint: a Unix socket path, or on Windows a named pipe's name.
    pub socket: PathBuf,
    /// Database, discovery file and lock live here.
    pub state_dir: PathBuf,
    /// Managed workspaces live here, outside `state_dir` (see [`workspaces_dir`]).
    pub workspaces_dir: PathBuf,
    /// How long a session with `auto_end_on_disconnect` survives without subscribers.
    pub disconnect_grace: Duration,
    /// How long an asset transfer ticket stays valid.
    pub asset_ticket_ttl: Duration,
    /// Where `config.toml` (the settings) lives.
    pub config_dir: PathBuf,
    /// How many connections at once, and how long a silent one may stay.
    pub connections: crate::connections::Limits,
    /// How long Core must be quiet before it hands back the memory its
    /// work left mapped (`platform::memory`); `None` never does.
    pub trim_after_quiet: Option<Duration>,
    /// Tests only: a file each minted tool token is appended to (see
    /// `Registry::with_token_witness`); `None` in normal use.
    pub tool_token_witness: Option<PathBuf>,
}

impl CoreConfig {
    /// Defaults by the shared rule of `pedelec_protocol::discovery`: on Linux
    /// `$XDG_RUNTIME_DIR/pedelec/core.sock` (else `<state>/core.sock`) and
    /// `$XDG_STATE_HOME/pedelec` (else `~/.local/state/pedelec`); each OS's
    /// own places elsewhere.
    pub fn resolve(socket: Option<PathBuf>, state_dir: Option<PathBuf>, disconnect_grace: Duration) -> Self {
        let workspaces_dir = workspaces_dir(state_dir.as_deref(), |k| std::env::var(k).ok());
        let state_dir = state_dir.unwrap_or_else(default_state_dir);
        let socket = socket.unwrap_or_else(|| default_socket(&state_dir));
        CoreConfig {
            socket,
            state_dir,
            workspaces_dir,
            disconnect_grace,
            asset_ticket_ttl: pedelec_protocol::limits::ASSET_TICKET_TTL,
            config_dir: crate::settings::Settings::default_dir(),
            connections: crate::connections::Limits::default(),
            trim_after_quiet: Some(crate::platform::memory::QUIET_TICK),
            tool_token_witness: None,
        }
    }

    pub fn database(&self) -> PathBuf {
        self.state_dir.join("sessions.sqlite3")
    }

    /// Root of Core-managed workspaces; explicit workspaces may not overlap it.
    pub fn managed_root(&self) -> PathBuf {
        self.workspaces_dir.clone()
    }

    /// Where managed workspaces were made before they left the state
    /// directory. Sessions recorded there keep their paths; Core still
    /// sweeps leftovers there.
    pub fn legacy_managed_root(&self) -> PathBuf {
        self.state_dir.join("workspaces")
    }

    /// The discovery file, `{"pid":…, "socket":…}`, by the shared rule:
    /// next to the socket, or in the state dir beside a named pipe.
    pub fn discovery_file(&self) -> PathBuf {
        use pedelec_protocol::discovery::{Platform, discovery_file_for};
        discovery_file_for(Platform::current(), &self.socket, &self.state_dir)
    }
}

/// Where managed workspaces go: `$PEDELEC_WORKSPACES_DIR`; else, beside an
/// explicitly chosen state directory, `<state dir>-workspaces` (so a Core
/// run on its own state — a test, a second profile — keeps its workspaces
/// with it instead of in the user's); else the platform's default
/// (`pedelec_protocol::discovery::workspaces_dir_for`). Never inside the
/// state directory.
pub fn workspaces_dir(explicit_state_dir: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    use pedelec_protocol::discovery::{Platform, workspaces_dir_for};
    if let Some(dir) = env("PEDELEC_WORKSPACES_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(state) = explicit_state_dir
        && let Some(name) = state.file_name()
    {
        let mut sibling = name.to_os_string();
        sibling.push("-workspaces");
        return state.with_file_name(sibling);
    }
    workspaces_dir_for(Platform::current(), env)
}

pub fn default_state_dir() -> PathBuf {
    pedelec_protocol::discovery::default_state_dir(|k| std::env::var(k).ok())
}

/// The socket path for a state dir, by the shared rule.
pub fn default_socket(state_dir: &Path) -> PathBuf {
    pedelec_protocol::discovery::default_socket(|k| std::env::var(k).ok(), state_dir)
}
