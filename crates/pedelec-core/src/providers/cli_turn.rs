//! One turn of a CLI agent that runs once per turn (`codex exec`): spawn,
//! feed the prompt on stdin, parse stdout line by line, judge the exit.

use std::path::Path;

use tokio::io::AsyncWriteExt;

use super::process::{AgentProcess, CommandLine, Line, LineReader, MAX_LINE_BYTES};
use super::{AgentEvent, ProviderConfig, ProviderFailure, ToolBridge, TurnOutcome, TurnSink};

/// A sans-IO parser of one CLI's JSON lines.
pub trait LineParser: Send {
    fn line(&mut self, line: &str) -> Vec<AgentEvent>;
}

/// Parses every line of `transcript` (for recorded-transcript tests and benchmarks).
pub fn parse_transcript(parser: &mut dyn LineParser, transcript: &str) -> Vec<AgentEvent> {
    transcript.lines().filter(|l| !l.trim().is_empty()).flat_map(|l| parser.line(l)).collect()
}

/// A string field of a JSON object, empty when absent.
pub fn str_field(value: &serde_json::Value, key: &str) -> String {
    value.get(key).and_then(serde_json::Value::as_str).unwrap_or_default().to_owned()
}

/// At most `max` characters of `text`, marked when cut (diagnostics stay small).
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// The per-turn command: the configured program with `args`, the configured
/// environment, and the bridge's variables (so `pedelec-core tool call` works too).
pub fn agent_command(config: &ProviderConfig, args: Vec<String>, bridge: &ToolBridge) -> CommandLine {
    let mut env: Vec<(String, String)> = config.env.clone().into_iter().collect();
    env.extend(bridge.env());
    CommandLine { program: config.command[0].clone(), args, env }
}

/// What an unparseable line becomes: skipped, never fatal.
pub fn skipped(line: &str, why: impl std::fmt::Display) -> AgentEvent {
    let start: String = line.chars().take(80).collect();
    AgentEvent::Skipped { reason: format!("{why}: {start:?}") }
}

/// How long a cancelled CLI gets to exit after SIGTERM (it saves its
/// session on the way out, which the next turn resumes) before the turn
/// returns anyway; the group gets SIGKILL after the process module's grace.
const CANCEL_EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);

/// One turn. `cancel` tripped: the process group gets SIGTERM and the turn
/// returns `OPERATION_CANCELLED` once it exited (bounded); the parser keeps
/// what it saw, so the CLI's session id is known for the next turn's resume.
pub async fn run(
    command: &CommandLine,
    cwd: &Path,
    prompt: &str,
    parser: &mut dyn LineParser,
    sink: &dyn TurnSink,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<(), ProviderFailure> {
    let mut process = AgentProcess::spawn(command, cwd)?;
    // Written concurrently: a child may start printing before it has read a large prompt.
    if let Some(mut stdin) = process.take_stdin() {
        let prompt = prompt.to_owned();
        tokio::spawn(async move {
            let _ = stdin.write_all(prompt.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
    let stdout = process.take_stdout().expect("stdout is piped");
    let mut reader = LineReader::new(stdout, MAX_LINE_BYTES);
    let mut outcome = TurnOutcome::default();
    // One wait for the whole turn: a new one per line registered and
    // unregistered a waiter on the token's lock for every delta.
    let cancelled = cancel.cancelled();
    tokio::pin!(cancelled);
    loop {
        let next = tokio::select! {
            next = reader.next_line() => next,
            () = &mut cancelled => {
                process.terminate_group();
                let _ = tokio::time::timeout(CANCEL_EXIT_WAIT, process.wait()).await;
                return Err(ProviderFailure::cancelled());
            }
        };
        let line = match next {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                outcome.apply(sink, AgentEvent::Skipped { reason: format!("reading agent output failed: {e}") });
                break;
            }
        };
        let events = match line {
            Line::Text(text) if text.trim().is_empty() => continue,
            Line::Text(text) => parser.line(&text),
            Line::TooLong(n) => vec![AgentEvent::Skipped { reason: format!("a {n}-byte line exceeds the line limit") }],
            Line::NotUtf8 => vec![AgentEvent::Skipped { reason: "a line is not UTF-8".into() }],
        };
        for event in events {
            outcome.apply(sink, event);
        }
        // Reading pauses (and the agent blocks on its pipe) while readers catch up.
        sink.ready().await;
    }
    let exit = process.wait().await;
    match (outcome.failure, outcome.done, exit.success) {
        (Some(message), _, _) => {
            let mut failure = ProviderFailure::turn(message);
            failure.details = serde_json::json!({ "exitCode": exit.code, "stderrTail": exit.stderr_tail });
            Err(failure)
        }
        (None, true, _) => Ok(()),
        (None, false, true) => {
            let mut failure = ProviderFailure::turn(format!("{} ended without finishing the turn", exit.program));
            failure.details = serde_json::json!({ "exitCode": exit.code, "stderrTail": exit.stderr_tail });
            Err(failure)
        }
        (None, false, false) => Err(exit.crashed("the agent stopped mid-turn")),
    }
}
