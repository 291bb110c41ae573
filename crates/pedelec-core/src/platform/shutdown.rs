//! The requests to stop that Core answers with a clean shutdown.

use crate::error::{CoreError, CoreResult};

/// Installed before anything else, so a stop request at any later point is
/// a clean shutdown: SIGTERM and SIGINT on Unix; Ctrl-C, Ctrl-Break and the
/// console's close on Windows.
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(windows)]
    ctrl_c: tokio::signal::windows::CtrlC,
    #[cfg(windows)]
    ctrl_break: tokio::signal::windows::CtrlBreak,
    #[cfg(windows)]
    close: tokio::signal::windows::CtrlClose,
}

impl Signals {
    #[cfg(unix)]
    pub fn install() -> CoreResult<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).map_err(|e| CoreError::io("installing the SIGTERM handler", e))?;
        let int = signal(SignalKind::interrupt()).map_err(|e| CoreError::io("installing the SIGINT handler", e))?;
        Ok(Signals { term, int })
    }

    #[cfg(windows)]
    pub fn install() -> CoreResult<Self> {
        use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close};
        let installing = |e| CoreError::io("installing the console control handler", e);
        Ok(Signals {
            ctrl_c: ctrl_c().map_err(installing)?,
            ctrl_break: ctrl_break().map_err(installing)?,
            close: ctrl_close().map_err(installing)?,
        })
    }

    pub async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(windows)]
        tokio::select! {
            _ = self.ctrl_c.recv() => {}
            _ = self.ctrl_break.recv() => {}
            _ = self.close.recv() => {}
        }
    }
}
