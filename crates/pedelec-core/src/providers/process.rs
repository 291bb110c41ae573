//! Agent child processes: spawned as a tree Core can end whole (a process
//! group, or a Job Object on Windows: `platform::process_tree`), read line by line with a bound on line length,
//! with the tail of stderr kept for error reports.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pedelec_protocol::ErrorCode;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::ProviderFailure;

/// Longest stdout line an adapter parses; longer ones are skipped whole.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// How much of stderr an error report carries.
const STDERR_TAIL_BYTES: usize = 4096;

/// A program and its leading arguments, plus environment additions.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl CommandLine {
    pub fn new(argv: &[String]) -> Self {
        CommandLine { program: argv[0].clone(), args: argv[1..].to_vec(), env: Vec::new() }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// Where `program` resolves on `PATH` (and `PATHEXT` on Windows), or why it does not.
pub fn resolve_program(program: &str) -> Result<PathBuf, String> {
    crate::platform::command::resolve(program)
}

/// One line of agent output.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// A line over [`MAX_LINE_BYTES`], skipped; its length so far.
    TooLong(usize),
    NotUtf8,
}

/// Reads lines of at most `max` bytes without ever buffering more than that.
pub struct LineReader<R> {
    inner: BufReader<R>,
    max: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader { inner: BufReader::with_capacity(64 * 1024, inner), max }
    }

    /// The next line without its newline; `None` at end of stream.
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        let mut line = Vec::new();
        let mut skipped = 0usize;
        loop {
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                if line.is_empty() && skipped == 0 {
                    return Ok(None);
                }
                break;
            }
            let (chunk, found) = match memchr(buf) {
                Some(i) => (&buf[..i], Some(i)),
                None => (buf, None),
            };
            if skipped > 0 || line.len() + chunk.len() > self.max {
                skipped += line.len() + chunk.len();
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
            let used = found.map_or(chunk.len(), |i| i + 1);
            self.inner.consume(used);
            if found.is_some() {
                break;
            }
        }
        if skipped > 0 {
            return Ok(Some(Line::TooLong(skipped)));
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Ok(Some(String::from_utf8(line).map_or(Line::NotUtf8, Line::Text)))
    }
}

fn memchr(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// A running agent process with its whole tree. Dropping it ends the tree.
pub struct AgentProcess {
    child: Child,
    tree: Option<crate::platform::process_tree::Tree>,
    stderr_tail: Arc<Mutex<VecDeque<u8>>>,
    program: String,
    /// Its place under `max_agent_processes`, held until the tree is ended
    /// (or by whoever took it: [`AgentProcess::take_slot`]).
    slot: Option<crate::quota::ProcessSlot>,
}

impl AgentProcess {
    /// Starts `command` in `cwd` with piped stdio.
    /// Refused with `QUOTA_EXCEEDED` (not fatal: the session stays usable)
    /// while `max_agent_processes` are running.
    pub fn spawn(command: &CommandLine, cwd: &Path) -> Result<Self, ProviderFailure> {
        // A warm process waiting for a session gives its place up first.
        let slot = crate::quota::AGENT_PROCESSES.take().or_else(|refused| {
            if super::warm::evict_one() { crate::quota::AGENT_PROCESSES.take() } else { Err(refused) }
        });
        let slot = slot.map_err(|refused| {
            tracing::debug!(program = %command.program, "agent process refused: max_agent_processes reached");
            let details = refused.details();
            ProviderFailure { code: ErrorCode::QuotaExceeded, message: refused.to_string(), fatal: false, details }
        })?;
        let program = resolve_program(&command.program).map_err(|reason| ProviderFailure {
            code: ErrorCode::ProviderUnavailable,
            message: reason,
            fatal: true,
            details: serde_json::json!({ "program": command.program }),
        })?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        crate::platform::process_tree::prepare(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| ProviderFailure {
            code: ErrorCode::ProviderUnavailable,
            message: format!("cannot start {}: {e}", program.display()),
            fatal: true,
            details: serde_json::json!({ "program": command.program }),
        })?;
        let tree = crate::platform::process_tree::adopt(&child);
        let stderr_tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL_BYTES)));
        if let Some(mut stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            let name = command.program.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tracing::debug!(program = %name, stderr = %String::from_utf8_lossy(&buf[..n]), "agent stderr");
                    let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                    tail.extend(&buf[..n]);
                    let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                    tail.drain(..excess);
                }
            });
        }
        Ok(AgentProcess { child, tree, stderr_tail, program: command.program.clone(), slot: Some(slot) })
    }

    /// Its place under `max_agent_processes`, for an owner that ends the
    /// process when it drops it (a shared agent's connection): the place is
    /// free the moment the owner lets go, not once the exit was reaped.
    pub fn take_slot(&mut self) -> Option<crate::quota::ProcessSlot> {
        self.slot.take()
    }

    /// Its process id, while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether it still runs (it has not been reaped as exited).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Writes `text` to stdin and closes it (one-shot prompts).
    pub async fn feed_stdin(&mut self, text: &str) -> std::io::Result<()> {
        if let Some(mut stdin) = self.child.stdin.take() {
            stdin.write_all(text.as_bytes()).await?;
            stdin.shutdown().await?;
        }
        Ok(())
    }

    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<_>>()).into_owned()
    }

    /// Waits for the exit; the report names the status and the stderr tail.
    pub async fn wait(&mut self) -> ExitReport {
        let status = self.child.wait().await.ok();
        // Let the stderr reader drain what the process wrote last.
        tokio::time::sleep(Duration::from_millis(20)).await;
        ExitReport {
            success: status.is_some_and(|s| s.success()),
            code: status.and_then(|s| s.code()),
            signal: status.as_ref().and_then(crate::platform::process_tree::exit_signal),
            stderr_tail: self.stderr_tail(),
            program: self.program.clone(),
        }
    }

    /// Ends the whole tree: SIGTERM to the group now, SIGKILL after a
    /// grace period (Unix); the job at once (Windows).
    pub fn terminate_group(&mut self) {
        if let Some(tree) = self.tree.take() {
            tree.terminate();
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.terminate_group();
    }
}

/// How an agent process ended.
#[derive(Debug, Clone)]
pub struct ExitReport {
    pub success: bool,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stderr_tail: String,
    pub program: String,
}

impl ExitReport {
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("{} exited with status {code}", self.program),
            (None, Some(signal)) => format!("{} was killed by signal {signal}", self.program),
            _ => format!("{} ended", self.program),
        }
    }

    /// A fatal failure carrying the exit status and stderr tail.
    pub fn crashed(&self, context: &str) -> ProviderFailure {
        let mut failure = ProviderFailure::crashed(format!("{context}: {}", self.describe()));
        failure.details = serde_json::json!({
            "exitCode": self.code,
            "signal": self.signal,
            "stderrTail": self.stderr_tail,
        });
        failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(line) = reader.next_line().await.unwrap() {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn over_long_and_invalid_lines_are_skipped_whole() {
        let mut input = b"first\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend(b"\n\xff\xfe\nlast");
        let got = lines(&input, 10).await;
        assert_eq!(got, vec![Line::Text("first".into()), Line::TooLong(100), Line::NotUtf8, Line::Text("last".into())]);
    }

    #[tokio::test]
    async fn a_line_longer_than_the_buffer_is_measured_not_kept() {
        let mut input = vec![b'y'; 300 * 1024];
        input.extend(b"\nok\n");
        let got = lines(&input, 1024).await;
        assert_eq!(got, vec![Line::TooLong(300 * 1024), Line::Text("ok".into())]);
    }

    #[test]
    fn resolve_program_reports_why() {
        assert!(resolve_program("sh").is_ok());
        assert!(resolve_program("pedelec-no-such-binary").unwrap_err().contains("not on PATH"));
        assert!(resolve_program("/nonexistent/x").unwrap_err().contains("not an executable"));
    }
}

/// An agent process given to a task of its own, for an owner several
/// sessions share (a shared ACP agent's or codex app-server's connection):
/// any of them can wait for its exit or end it, and dropping the owner ends
/// its whole group and gives its place under `max_agent_processes` back at
/// once.
#[derive(Debug)]
pub struct OwnedProcess {
    pid: Option<u32>,
    exit: tokio::sync::watch::Receiver<Option<ExitReport>>,
    kill: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    _slot: Option<crate::quota::ProcessSlot>,
}

impl OwnedProcess {
    pub fn new(mut process: AgentProcess) -> OwnedProcess {
        let pid = process.id();
        let slot = process.take_slot();
        let (exit_tx, exit) = tokio::sync::watch::channel(None);
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let report = tokio::select! {
                report = process.wait() => report,
                _ = killed => {
                    process.terminate_group();
                    process.wait().await
                }
            };
            process.terminate_group();
            let _ = exit_tx.send(Some(report));
        });
        OwnedProcess { pid, exit, kill: Mutex::new(Some(kill)), _slot: slot }
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether it exited (as far as its wait has seen).
    pub fn exited_yet(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Ends its whole group.
    pub fn kill(&self) {
        if let Some(kill) = self.kill.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = kill.send(());
        }
    }

    /// Resolves with the exit report once it exited.
    pub async fn exited(&self) -> ExitReport {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await.ok().and_then(|r| r.clone()) {
            Some(report) => report,
            // The waiter went without a report (the runtime is shutting down).
            None => std::future::pending().await,
        }
    }

    /// Its exit report; one that closed its pipes but lives on after
    /// `grace` is ended first (it can no longer speak to us).
    pub async fn exit_report(&self, grace: Duration) -> ExitReport {
        match tokio::time::timeout(grace, self.exited()).await {
            Ok(report) => report,
            Err(_) => {
                self.kill();
                self.exited().await
            }
        }
    }
}

impl Drop for OwnedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
