//! Starting a Core daemon as a child process, for applications that bring
//! their own Core, and for the demo, benchmarks and tests.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use std::time::Duration;
//! use pedelec_sdk::daemon::CoreProcess;
//! use pedelec_sdk::{Pedelec, SessionOptions};
//!
//! let dir = std::env::temp_dir().join("pedelec-example");
//! let mut core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
//! let pedelec = Pedelec::connect(&core.socket, "app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! session.send_text("Hello").await?;
//! // A clean shutdown; dropping `core` would kill it instead.
//! assert!(core.terminate());
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pedelec_protocol::ErrorCode;

use crate::error::PedelecError;

/// A `pedelec-core serve` child process.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use std::time::Duration;
/// use pedelec_sdk::Pedelec;
/// use pedelec_sdk::daemon::CoreProcess;
///
/// let dir = std::env::temp_dir().join("pedelec-example");
/// let core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
/// let pedelec = Pedelec::connect(&core.socket, "app:my-tool").await?;
/// println!("Core {} answers", pedelec.ping().await?.version);
/// # Ok(())
/// # }
/// ```
pub struct CoreProcess {
    child: Option<Child>,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
}

/// Finds one of Pedelec's binaries: `$<env_var>`, next to this executable
/// (or up to two directories above it, as for cargo examples and tests), else `PATH`.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_sdk::daemon::find_binary;
///
/// // Not found anywhere: the bare name, for `PATH` to resolve.
/// let bin = find_binary("pedelec-no-such-tool", "PEDELEC_NO_SUCH_TOOL_BIN");
/// assert_eq!(bin, Path::new("pedelec-no-such-tool"));
/// ```
pub fn find_binary(name: &str, env_var: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env_var) {
        return PathBuf::from(bin);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(3) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from(name)
}

/// The `pedelec-core` binary (`$PEDELEC_CORE_BIN` overrides).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::daemon::find_core_binary;
///
/// let core = find_core_binary();
/// if std::env::var_os("PEDELEC_CORE_BIN").is_none() {
///     assert!(core.ends_with("pedelec-core"));
/// }
/// ```
pub fn find_core_binary() -> PathBuf {
    find_binary("pedelec-core", "PEDELEC_CORE_BIN")
}

impl CoreProcess {
    /// Starts Core on `socket` with `state_dir`, and waits until it accepts connections.
    ///
    /// `disconnect_grace` is how long a session with `auto_end_on_disconnect`
    /// waits for a subscriber to come back (`--disconnect-grace-ms`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::CoreProcess;
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
    /// assert!(core.pid().is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn(socket: &Path, state_dir: &Path, disconnect_grace: Duration) -> Result<Self, PedelecError> {
        Self::spawn_with(&find_core_binary(), socket, state_dir, disconnect_grace)
    }

    /// As [`CoreProcess::spawn`], with an explicit `pedelec-core` binary.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::path::Path;
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::CoreProcess;
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let binary = Path::new("/opt/pedelec/bin/pedelec-core");
    /// let core = CoreProcess::spawn_with(binary, &dir.join("core.sock"), &dir, Duration::from_secs(5))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn_with(
        binary: &Path,
        socket: &Path,
        state_dir: &Path,
        disconnect_grace: Duration,
    ) -> Result<Self, PedelecError> {
        Self::spawn_with_args(binary, socket, state_dir, disconnect_grace, &[])
    }

    /// As [`CoreProcess::spawn_with`], with extra `serve` arguments.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::{CoreProcess, find_core_binary};
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let extra = ["--max-connections", "64"];
    /// let grace = Duration::from_secs(5);
    /// let core = CoreProcess::spawn_with_args(&find_core_binary(), &dir.join("core.sock"), &dir, grace, &extra)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn_with_args(
        binary: &Path,
        socket: &Path,
        state_dir: &Path,
        disconnect_grace: Duration,
        extra: &[&str],
    ) -> Result<Self, PedelecError> {
        Self::spawn_with_env(binary, socket, state_dir, disconnect_grace, extra, &[])
    }

    /// As [`CoreProcess::spawn_with_args`], with variables set in Core's
    /// environment (beside this process's own): an agent's API key, a
    /// proxy (`HTTPS_PROXY`) for a provider's hosted endpoint.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::{CoreProcess, find_core_binary};
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let env = [("HTTPS_PROXY", "http://proxy.internal:3128")];
    /// let grace = Duration::from_secs(5);
    /// let core = CoreProcess::spawn_with_env(&find_core_binary(), &dir.join("core.sock"), &dir, grace, &[], &env)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn_with_env(
        binary: &Path,
        socket: &Path,
        state_dir: &Path,
        disconnect_grace: Duration,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, PedelecError> {
        let child = Command::new(binary)
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--disconnect-grace-ms")
            .arg(disconnect_grace.as_millis().to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                PedelecError::new(ErrorCode::CoreRuntimeUnavailable, format!("cannot start {}: {e}", binary.display()))
            })?;
        let mut process =
            CoreProcess { child: Some(child), socket: socket.to_owned(), state_dir: state_dir.to_owned() };
        process.wait_ready(Duration::from_secs(20))?;
        Ok(process)
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), PedelecError> {
        let started = Instant::now();
        // Core writes its discovery file (with its pid) once it has restored
        // its sessions and is about to serve.
        let discovery = pedelec_protocol::discovery::discovery_file_for(
            pedelec_protocol::discovery::Platform::current(),
            &self.socket,
            &self.state_dir,
        );
        let pid = self.pid().unwrap_or(0);
        while started.elapsed() < limit {
            let announced = std::fs::read_to_string(&discovery)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| v["pid"] == pid);
            if announced && endpoint_answers(&self.socket) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(PedelecError::new(
                    ErrorCode::CoreRuntimeUnavailable,
                    format!("Core exited early: {status}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(PedelecError::new(ErrorCode::CoreRuntimeUnavailable, "Core did not start listening in time"))
    }

    /// Core's process id, while this handle still owns the process.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::CoreProcess;
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
    /// let pid = core.pid().expect("running");
    /// println!("Core runs as {pid}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL: a crash, as far as Core can tell.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::CoreProcess;
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let mut core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
    /// core.kill();
    /// // The handle no longer owns a process.
    /// assert_eq!(core.pid(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: a normal shutdown. Returns whether Core exited
    /// successfully. On Windows, where no signal reaches a detached Core,
    /// it is ended instead (and this returns false).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::time::Duration;
    /// use pedelec_sdk::daemon::CoreProcess;
    ///
    /// let dir = std::env::temp_dir().join("pedelec-example");
    /// let mut core = CoreProcess::spawn(&dir.join("core.sock"), &dir, Duration::from_secs(5))?;
    /// assert!(core.terminate(), "Core shut down cleanly");
    /// // Only once: afterwards there is nothing to stop.
    /// assert!(!core.terminate());
    /// # Ok(())
    /// # }
    /// ```
    pub fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        ask_to_stop(&mut child);
        child.wait().map(|s| s.success()).unwrap_or(false)
    }
}

/// Whether something accepts connections on Core's endpoint.
#[cfg(unix)]
fn endpoint_answers(endpoint: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(endpoint).is_ok()
}

/// Whether a pipe of that name is served: a free instance opens, and a
/// busy pipe (`ERROR_PIPE_BUSY`, every instance taken) is served too.
#[cfg(windows)]
fn endpoint_answers(endpoint: &Path) -> bool {
    const ERROR_PIPE_BUSY: i32 = 231;
    match std::fs::OpenOptions::new().read(true).write(true).open(endpoint) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(ERROR_PIPE_BUSY),
    }
}

/// SIGTERM: Core ends its sessions and exits cleanly.
#[cfg(unix)]
fn ask_to_stop(child: &mut Child) {
    unsafe extern "C" {
        #[link_name = "kill"]
        fn libc_kill(pid: i32, signal: i32) -> i32;
    }
    // SAFETY: kill(2) with a pid we own; no memory is touched.
    unsafe { libc_kill(child.id() as i32, 15) };
}

/// Windows has no signal a detached Core could receive, so it is ended;
/// its agents' jobs end with it, and its sessions resume at the next start.
#[cfg(windows)]
fn ask_to_stop(child: &mut Child) {
    let _ = child.kill();
}

impl Drop for CoreProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
