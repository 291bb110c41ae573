//! Reaching Core: connect to its socket, or start it detached and wait.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pedelec_sdk::grpc::GrpcTransport;

/// How long the host waits for a Core it started.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// The Core binary: `$PEDELEC_CORE_BIN`, else next to this host, else `PATH`.
pub fn core_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("PEDELEC_CORE_BIN") {
        return PathBuf::from(bin);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("pedelec-core")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("pedelec-core"))
}

/// Connects to Core on `socket`; if nobody answers, starts `pedelec-core
/// serve` in its own process group (so it outlives this host) and retries
/// until [`START_TIMEOUT`].
pub async fn connect_or_start(socket: &Path, core: &Path) -> Option<GrpcTransport> {
    if std::os::unix::net::UnixStream::connect(socket).is_ok()
        && let Ok(t) = GrpcTransport::connect(socket).await
    {
        return Some(t);
    }
    tracing::info!(core = %core.display(), socket = %socket.display(), "starting Core");
    let mut command = Command::new(core);
    command.arg("serve").arg("--socket").arg(socket).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    if let Err(error) = command.spawn() {
        tracing::warn!(%error, "could not start Core");
        return None;
    }
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if std::os::unix::net::UnixStream::connect(socket).is_ok()
            && let Ok(t) = GrpcTransport::connect(socket).await
        {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
