//! One long-lived `claude -p --input-format stream-json` process per
//! session runtime, kept across turns: each turn is one user message
//! written to its stdin, and ends at the `result` line the CLI prints for
//! it. The process starts at the runtime's first turn (`--resume` of the
//! session's conversation when it has one, `--fork-session` for a fork's
//! first), so a second turn pays no start-up.
//!
//! A steer is one more user message written while the turn runs (see
//! [`Live::turn`] for how its end is then told).
//!
//! A cancel is the CLI's own control request (`interrupt`), not a signal:
//! the CLI stops the model and its tools, answers the request, and ends the
//! turn with a `result`; the process lives on for the next turn. One that
//! does not end the turn within [`INTERRUPT_WAIT`] is ended and the next
//! turn starts a new one, resuming the conversation.
//!
//! Lines are read by a task of their own into a bounded channel: between
//! turns they wait there (a turn drops what an earlier one left), and a
//! reader that stops taking them stops the CLI at its pipe.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

use super::super::process::{AgentProcess, CommandLine, Line, LineReader, MAX_LINE_BYTES};
use super::super::{AgentEvent, ProviderFailure, STEER_QUEUE, SteerInbox, SteerInput, TurnOutcome, TurnSink};
use super::{ClaudeParser, steer_message};
use crate::providers::cli_turn::LineParser;

/// How long an interrupted turn may take to end before the process is ended.
pub const INTERRUPT_WAIT: Duration = Duration::from_millis(1500);
/// How long a closed CLI gets to save its conversation and exit.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// Lines read ahead of the turn that takes them.
const LINE_BUFFER: usize = 256;

/// A running CLI and the lines it printed that no turn took yet.
pub struct Live {
    process: AgentProcess,
    /// `None` once closed ([`Live::close`]).
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Line>,
    reader: tokio::task::JoinHandle<()>,
    /// Control requests sent so far (their ids).
    requests: u64,
}

/// What reaches a running turn besides the CLI's lines.
pub struct Controls<'a> {
    pub cancel: &'a tokio_util::sync::CancellationToken,
    pub steering: SteerInbox,
}

/// How a turn on a live process ended.
pub enum Ended {
    /// The CLI answered it with a `result`; the process goes on.
    Answered(Result<(), ProviderFailure>),
    /// Interrupted by a cancel, and the CLI ended the turn.
    Cancelled,
    /// The process is gone or no longer trusted: the runtime drops it.
    Lost(ProviderFailure),
}

impl Live {
    pub fn spawn(command: &CommandLine, cwd: &std::path::Path) -> Result<Live, ProviderFailure> {
        let mut process = AgentProcess::spawn(command, cwd)?;
        let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
            return Err(ProviderFailure::crashed("claude's stdio could not be piped"));
        };
        let (tx, lines) = mpsc::channel(LINE_BUFFER);
        let reader = tokio::spawn(async move {
            let mut reader = LineReader::new(stdout, MAX_LINE_BYTES);
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).await.is_err() {
                    break;
                }
            }
        });
        Ok(Live { process, stdin: Some(stdin), lines, reader, requests: 0 })
    }

    /// Writes one JSON line to the CLI.
    async fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        stdin.write_all(line.as_bytes()).await?;
        if !line.ends_with('\n') {
            stdin.write_all(b"\n").await?;
        }
        stdin.flush().await
    }

    /// Ends the CLI the way it saves its conversation: its input closes and
    /// it exits on its own (a signal can cut the last turn from its
    /// transcript, which the next process would resume); ended after
    /// [`CLOSE_WAIT`] regardless.
    pub async fn close(mut self) {
        self.stdin.take();
        if tokio::time::timeout(CLOSE_WAIT, self.process.wait()).await.is_err() {
            tracing::debug!("claude did not exit after its input closed; ending it");
        }
    }

    /// Runs one turn: `message` (a stream-json user message line) in, the
    /// CLI's lines through `parser` to `sink` until its `result` — or, while
    /// a steered message is not yet taken, until the `result` after it.
    ///
    /// A steered message is written at once; the CLI echoes it (by the uuid
    /// we gave it) when it enters the conversation: at the turn's next tool
    /// round, or as a turn of its own right after this one's `result`. Each
    /// echo precedes the `result` of the turn that carries it, so the
    /// operation ends at a `result` with no steered message unechoed.
    pub async fn turn(
        &mut self,
        message: &str,
        parser: &mut ClaudeParser,
        sink: &dyn TurnSink,
        controls: &mut Controls<'_>,
    ) -> Ended {
        // What an abandoned turn left behind is not this turn's.
        while self.lines.try_recv().is_ok() {}
        if let Err(e) = self.send(message).await {
            return Ended::Lost(self.gone(&format!("claude did not take the message ({e})")).await);
        }
        let mut outcome = TurnOutcome::default();
        let mut interrupted: Option<tokio::time::Instant> = None;
        // Steered messages sent and not yet echoed, by uuid.
        let mut steered: HashMap<String, SteerInput> = HashMap::new();
        let cancelled = controls.cancel.cancelled();
        tokio::pin!(cancelled);
        loop {
            let deadline = interrupted.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
            let line = tokio::select! {
                line = self.lines.recv() => line,
                // At most STEER_QUEUE unechoed: more wait in the inbox, whose
                // bound refuses a flood with SESSION_BUSY.
                Some(steer) = controls.steering.recv(), if interrupted.is_none() && steered.len() < STEER_QUEUE => {
                    let (uuid, line) = steer_message(&steer.text);
                    if let Err(e) = self.send(&line).await {
                        return Ended::Lost(self.gone(&format!("claude did not take the steered text ({e})")).await);
                    }
                    steered.insert(uuid, steer);
                    continue;
                }
                () = &mut cancelled, if interrupted.is_none() => {
                    if self.interrupt().await.is_err() {
                        return Ended::Lost(ProviderFailure::cancelled());
                    }
                    interrupted = Some(tokio::time::Instant::now() + INTERRUPT_WAIT);
                    continue;
                }
                () = tokio::time::sleep_until(deadline), if interrupted.is_some() => {
                    tracing::debug!("claude did not end an interrupted turn in time; ending the process");
                    return Ended::Lost(ProviderFailure::cancelled());
                }
            };
            let Some(line) = line else {
                return Ended::Lost(self.gone("the agent stopped mid-turn").await);
            };
            let events = match line {
                Line::Text(text) if text.trim().is_empty() => continue,
                Line::Text(text) => {
                    tracing::trace!(line = %text, "claude");
                    parser.line(&text)
                }
                Line::TooLong(n) => {
                    vec![AgentEvent::Skipped { reason: format!("a {n}-byte line exceeds the line limit") }]
                }
                Line::NotUtf8 => vec![AgentEvent::Skipped { reason: "a line is not UTF-8".into() }],
            };
            for uuid in parser.take_replayed() {
                let Some(steer) = steered.remove(&uuid) else { continue };
                if interrupted.is_none() {
                    sink.steered(&steer.text);
                    let _ = steer.taken.send(Ok(()));
                } else if self.interrupt().await.is_err() {
                    // Taken after the cancel, as a turn of its own: that
                    // turn is stopped too (the steer hears the turn ended).
                    return Ended::Lost(ProviderFailure::cancelled());
                }
            }
            let mut ended = false;
            for event in events {
                ended |= matches!(event, AgentEvent::TurnDone | AgentEvent::Failed { .. });
                // After an interrupt only the end matters: what the CLI
                // says while it stops is not the user's.
                if interrupted.is_none() {
                    outcome.apply(sink, event);
                } else if let AgentEvent::SessionId { id } = event {
                    sink.provider_session(&id);
                }
            }
            if ended && steered.is_empty() {
                break;
            }
            sink.ready().await;
        }
        if interrupted.is_some() {
            return Ended::Cancelled;
        }
        Ended::Answered(match outcome.failure {
            Some(message) => Err(ProviderFailure::turn(message)),
            None => Ok(()),
        })
    }

    /// Sends the CLI's `interrupt` control request: it stops the model and
    /// its tools and ends the turn with a `result`.
    async fn interrupt(&mut self) -> std::io::Result<()> {
        self.requests += 1;
        let request = serde_json::json!({
            "type": "control_request",
            "request_id": format!("pedelec-{}", self.requests),
            "request": { "subtype": "interrupt" },
        });
        self.send(&request.to_string()).await
    }

    /// The process ended (or will not read): its exit status and stderr
    /// tail. Not fatal: the conversation is on disk, and the next turn
    /// starts a new CLI that resumes it.
    async fn gone(&mut self, context: &str) -> ProviderFailure {
        let exit = tokio::time::timeout(Duration::from_secs(2), self.process.wait()).await;
        let mut failure = match exit {
            Ok(exit) => exit.crashed(context),
            Err(_) => ProviderFailure::crashed(format!("{context}: claude stopped answering")),
        };
        failure.fatal = false;
        failure
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.reader.abort();
        self.process.terminate_group();
    }
}
