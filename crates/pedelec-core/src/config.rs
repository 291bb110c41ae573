//! Where Core keeps its socket, database and managed workspaces.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Resolved daemon configuration.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Core's endpoint: a Unix socket path, or on Windows a named pipe's name.
    pub socket: PathBuf,
    /// Database, discovery file and managed workspaces live here.
    pub state_dir: PathBuf,
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
}

impl CoreConfig {
    /// Defaults by the shared rule of `pedelec_protocol::discovery`: on Linux
    /// `$XDG_RUNTIME_DIR/pedelec/core.sock` (else `<state>/core.sock`) and
    /// `$XDG_STATE_HOME/pedelec` (else `~/.local/state/pedelec`); each OS's
    /// own places elsewhere.
    pub fn resolve(socket: Option<PathBuf>, state_dir: Option<PathBuf>, disconnect_grace: Duration) -> Self {
        let state_dir = state_dir.unwrap_or_else(default_state_dir);
        let socket = socket.unwrap_or_else(|| default_socket(&state_dir));
        CoreConfig {
            socket,
            state_dir,
            disconnect_grace,
            asset_ticket_ttl: pedelec_protocol::limits::ASSET_TICKET_TTL,
            config_dir: crate::settings::Settings::default_dir(),
            connections: crate::connections::Limits::default(),
            trim_after_quiet: Some(crate::platform::memory::QUIET_TICK),
        }
    }

    pub fn database(&self) -> PathBuf {
        self.state_dir.join("sessions.sqlite3")
    }

    /// Root of Core-managed workspaces; explicit workspaces may not overlap it.
    pub fn managed_root(&self) -> PathBuf {
        self.state_dir.join("workspaces")
    }

    /// The discovery file, `{"pid":…, "socket":…}`, by the shared rule:
    /// next to the socket, or in the state dir beside a named pipe.
    pub fn discovery_file(&self) -> PathBuf {
        use pedelec_protocol::discovery::{Platform, discovery_file_for};
        discovery_file_for(Platform::current(), &self.socket, &self.state_dir)
    }
}

pub fn default_state_dir() -> PathBuf {
    pedelec_protocol::discovery::default_state_dir(|k| std::env::var(k).ok())
}

/// The socket path for a state dir, by the shared rule.
pub fn default_socket(state_dir: &Path) -> PathBuf {
    pedelec_protocol::discovery::default_socket(|k| std::env::var(k).ok(), state_dir)
}
