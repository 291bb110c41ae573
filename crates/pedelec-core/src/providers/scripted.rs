//! The built-in `scripted` provider: deterministic, no network.
//!
//! It replies `You said: <text>`, streamed as word deltas, then the complete
//! message, and reports a token total (words in + words out, cumulative).
//! It answers the preparation prompt with `PEDELEC_PREPARED`. Lines of the
//! prompt that start with `/` are directives, run in order:
//!
//! | directive | effect |
//! | --- | --- |
//! | `/tool NAME JSON` | call frontend tool NAME with JSON args; the reply reports the result |
//! | `/tools N NAME JSON` | call it N times; the reply reports round-trip p50/p99 in µs |
//! | `/deltas N` | stream N one-character deltas, then one message of them |
//! | `/slow MS` | wait MS between deltas (a turn to cancel midway) |
//! | `/sleep MS` | wait MS before going on |
//! | `/write PATH TEXT` | write TEXT (`\n` for a line break) to the file PATH inside the workspace, as an agent's edit (`getChanges` shows it; reported as a completed file-edit activity); a path leaving the workspace, through `..`, a link or into `.pedelec-runtime`, is refused and the reply says so |
//! | `/wait-steer MS` | wait up to MS for text the user adds to the turn (`steer`); the reply repeats each (`You added: TEXT.`) |
//! | `/usage N` | report N as the total |
//! | `/command TEXT` | report a shell command TEXT as an activity, in progress then completed (nothing runs) |
//! | `/plan A; B; C` | report a plan of those entries, the first in progress |
//! | `/permission TEXT` | ask permission to run the command TEXT (options allow, deny); the reply says the answer. With permission mode `app` the application answers (a web page only where the user let its site approve commands: else the user does); else the policy rejects |
//! | `/edit PATH` | ask permission to edit the file PATH, the same way; a web page answers it when PATH lies inside the workspace |
//! | `/answer TEXT` | reply TEXT alone (`\n` for a line break), nothing else: a typed turn's answer |
//! | `/answer-next TEXT` | reply TEXT alone to the next turn, whatever it says (the answer to Core's second ask) |
//! | `/fail MESSAGE` | fail the turn (session stays usable) |
//! | `/crash` | the runtime dies (session moves to `error`) |
//! | `/panic` | the provider's code panics mid-turn (Core's fault path: the turn fails, the session stays usable) |
//!
//! Text steered into a turn is taken at a `/wait-steer` or when the
//! directives are done (before the reply streams); steered later, the turn
//! has ended for it (`TURN_NOT_RUNNING`).
//!
//! Attachments are acknowledged in the reply (`Attachments: PATH (TYPE, N bytes).`);
//! model `scripted-text-only` takes no images (`ATTACHMENT_UNSUPPORTED`).
//!
//! Model `scripted-unprepared` answers the preparation prompt wrongly;
//! model `scripted-slow` takes two seconds to prepare.

use std::time::{Duration, Instant};

use pedelec_protocol::pb;

use crate::providers::PermissionAnswer;

use super::{
    BoxFuture, PREPARED_ACK, Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup, TurnRequest,
    TurnSink,
};

pub struct Scripted {
    config: ProviderConfig,
}

impl Scripted {
    pub fn new(config: ProviderConfig) -> Self {
        Scripted { config }
    }
}

impl Provider for Scripted {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Built in: always available.
    fn info(&self) -> pb::ProviderInfo {
        let config = &self.config;
        pb::ProviderInfo {
            name: config.name.clone(),
            code: config.code.clone(),
            available: true,
            reason: String::new(),
        }
    }

    fn steers(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    /// Its turns keep no conversation: a fork is a new identity.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        let identity =
            setup.provider_session_id.clone().unwrap_or_else(|| format!("scripted-{}", uuid::Uuid::new_v4()));
        Ok(Box::new(ScriptedSession {
            workspace: setup.workspace.clone(),
            model: setup.model,
            identity,
            total: setup.usage_total.unwrap_or(0),
            crashed: false,
            next_answer: None,
            permissions: setup.permissions,
        }))
    }
}

struct ScriptedSession {
    workspace: std::path::PathBuf,
    model: String,
    identity: String,
    total: u64,
    crashed: bool,
    /// The whole reply of the next turn (`/answer-next`).
    next_answer: Option<String>,
    permissions: Option<std::sync::Arc<dyn super::PermissionAsker>>,
}

enum Directive<'a> {
    Tool {
        times: usize,
        name: &'a str,
        args: &'a str,
    },
    Deltas(usize),
    Slow(u64),
    Sleep(u64),
    WaitSteer(u64),
    Write {
        path: &'a str,
        text: &'a str,
    },
    Usage(u64),
    Command(&'a str),
    Plan(&'a str),
    /// A permission request about a command (`kind` COMMAND) or a file to edit (FILE_EDIT).
    Permission {
        kind: pb::ActivityKind,
        about: &'a str,
    },
    Fail(&'a str),
    Answer(&'a str),
    AnswerNext(&'a str),
    Crash,
    Panic,
}

fn parse(line: &str) -> Option<Result<Directive<'_>, String>> {
    let line = line.trim();
    let rest = line.strip_prefix('/')?;
    let (word, args) = rest.split_once(' ').unwrap_or((rest, ""));
    let args = args.trim();
    let number = |text: &str| text.parse::<u64>().map_err(|_| format!("/{word} needs a number, got {text:?}"));
    Some((|| {
        Ok(match word {
            "tool" => {
                let (name, json) = args.split_once(' ').unwrap_or((args, "{}"));
                Directive::Tool { times: 1, name, args: json.trim() }
            }
            "tools" => {
                let (n, rest) = args.split_once(' ').ok_or("/tools N NAME JSON")?;
                let (name, json) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "{}"));
                Directive::Tool { times: number(n)? as usize, name, args: json.trim() }
            }
            "deltas" => Directive::Deltas(number(args)? as usize),
            "slow" => Directive::Slow(number(args)?),
            "sleep" => Directive::Sleep(number(args)?),
            "wait-steer" => Directive::WaitSteer(number(args)?),
            "write" => {
                let (path, text) = args.split_once(' ').unwrap_or((args, ""));
                Directive::Write { path, text }
            }
            "usage" => Directive::Usage(number(args)?),
            "command" => Directive::Command(args),
            "plan" => Directive::Plan(args),
            "permission" => Directive::Permission { kind: pb::ActivityKind::Command, about: args },
            "edit" => Directive::Permission { kind: pb::ActivityKind::FileEdit, about: args },
            "fail" => Directive::Fail(args),
            "answer" => Directive::Answer(args),
            "answer-next" => Directive::AnswerNext(args),
            "crash" => Directive::Crash,
            "panic" => Directive::Panic,
            other => return Err(format!("unknown directive /{other}")),
        })
    })())
}

/// Writes `text` to `path` below the workspace `root`, creating folders.
/// The path comes from the prompt, which a page controls: it must be
/// relative, without `..`, outside `.pedelec-runtime`, and every open goes
/// through a handle of the workspace that no link can lead out of.
fn write_in_workspace(root: &std::path::Path, path: &str, text: &str) -> std::io::Result<usize> {
    use std::path::Component;
    let relative = std::path::Path::new(path);
    let mut parts = relative.components();
    let first = parts.next();
    let plain = matches!(first, Some(Component::Normal(_))) && parts.all(|c| matches!(c, Component::Normal(_)));
    let runtime = first.is_some_and(|c| c.as_os_str() == crate::workspace::RUNTIME_DIR);
    if !plain || runtime {
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "the path leaves the workspace"));
    }
    let dir = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
    if let Some(parent) = relative.parent().filter(|p| !p.as_os_str().is_empty()) {
        dir.create_dir_all(parent)?;
    }
    let text = text.replace("\\n", "\n");
    dir.write(relative, &text)?;
    Ok(text.len())
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn percentile(sorted: &[Duration], p: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_micros()
}

impl ScriptedSession {
    async fn stream(&self, sink: &dyn TurnSink, text: &str, pause: Option<Duration>) {
        for piece in text.split_inclusive(' ') {
            sink.ready().await;
            sink.delta(piece);
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        sink.message(text);
    }

    async fn user_turn(
        &mut self,
        text: &str,
        attachments: &[super::Attachment],
        steering: &mut super::SteerInbox,
        sink: &dyn TurnSink,
    ) -> Result<(), ProviderFailure> {
        let take = |steer: super::SteerInput, reply: &mut Vec<String>| {
            sink.steered(&steer.text);
            let stop = if steer.text.ends_with(['.', '!', '?']) { "" } else { "." };
            reply.push(format!("You added: {}{stop}", steer.text));
            let _ = steer.taken.send(Ok(()));
        };
        if let Some(answer) = self.next_answer.take() {
            self.stream(sink, &answer, None).await;
            return Ok(());
        }
        let mut answer = None;
        let mut reply = Vec::new();
        let mut pause = None;
        let mut plain = Vec::new();
        let mut streamed = false;
        let mut activities = 0;
        for line in text.lines() {
            let directive = match parse(line) {
                None => {
                    plain.push(line);
                    continue;
                }
                Some(Err(message)) => return Err(ProviderFailure::turn(message)),
                Some(Ok(d)) => d,
            };
            match directive {
                Directive::Tool { times, name, args } => {
                    let mut timings = Vec::with_capacity(times);
                    let mut last = Ok(String::new());
                    for _ in 0..times {
                        let started = Instant::now();
                        last = sink.call_tool(name, args.to_owned()).await;
                        timings.push(started.elapsed());
                    }
                    match last {
                        Ok(result) if times == 1 => reply.push(format!("Tool {name} returned {result}.")),
                        Ok(_) => {
                            timings.sort();
                            reply.push(format!(
                                "Tool {name} answered {times} calls: round trip p50={}us p99={}us.",
                                percentile(&timings, 0.5),
                                percentile(&timings, 0.99)
                            ));
                        }
                        Err(error) => reply.push(format!("Tool {name} failed with {}: {}.", error.code, error.message)),
                    }
                }
                Directive::Deltas(n) => {
                    for _ in 0..n {
                        sink.ready().await;
                        sink.delta("x");
                    }
                    sink.message(&"x".repeat(n));
                    streamed = true;
                }
                Directive::Slow(ms) => pause = Some(Duration::from_millis(ms)),
                Directive::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Directive::Write { path, text } => {
                    reply.push(match write_in_workspace(&self.workspace, path, text) {
                        Ok(bytes) => {
                            // Reported as an agent reports its edit (the activity log's "edited").
                            activities += 1;
                            let mut edit =
                                super::activity(format!("scripted-{activities}"), pb::ActivityKind::FileEdit, "Write");
                            edit.paths = vec![path.to_owned()];
                            edit.status = pb::ActivityStatus::Completed as i32;
                            sink.activity(edit);
                            format!("Wrote {path} ({bytes} bytes).")
                        }
                        Err(error) => format!("Could not write {path}: {error}."),
                    });
                }
                Directive::WaitSteer(ms) => {
                    if let Ok(Some(steer)) = tokio::time::timeout(Duration::from_millis(ms), steering.recv()).await {
                        take(steer, &mut reply);
                    }
                }
                Directive::Usage(n) => sink.usage(n),
                Directive::Command(command) => {
                    activities += 1;
                    let id = format!("scripted-{activities}");
                    let mut running = super::activity(id.clone(), pb::ActivityKind::Command, command);
                    running.command = command.to_owned();
                    running.status = pb::ActivityStatus::InProgress as i32;
                    sink.activity(running);
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                    let mut done = super::activity(id, pb::ActivityKind::Unspecified, "");
                    done.status = pb::ActivityStatus::Completed as i32;
                    done.output = "(scripted: nothing ran)".into();
                    sink.activity(done);
                }
                Directive::Permission { kind, about: what } => {
                    let answer = match &self.permissions {
                        Some(asker) => {
                            let mut about = super::activity("", kind, what);
                            if kind == pb::ActivityKind::Command {
                                about.command = what.to_owned();
                            } else {
                                about.paths = vec![what.to_owned()];
                            }
                            about.status = pb::ActivityStatus::Pending as i32;
                            let option = |id: &str, kind: pb::PermissionOptionKind| pb::PermissionOption {
                                option_id: id.into(),
                                name: id.into(),
                                kind: kind as i32,
                            };
                            let request = pb::PermissionRequest {
                                activity: Some(about),
                                options: vec![
                                    option("allow", pb::PermissionOptionKind::AllowOnce),
                                    option("deny", pb::PermissionOptionKind::RejectOnce),
                                ],
                                // Like Core's policy for commands: reject.
                                policy_option_id: "deny".into(),
                                ..Default::default()
                            };
                            match asker.ask(request).await {
                                Ok(PermissionAnswer::Selected(option)) => format!("answered {option}"),
                                Ok(PermissionAnswer::Rejected) => "rejected".to_owned(),
                                Ok(PermissionAnswer::Cancelled) => "cancelled".to_owned(),
                                Err(error) => format!("not asked ({})", error.code),
                            }
                        }
                        None => "rejected by the policy".to_owned(),
                    };
                    let verb = if kind == pb::ActivityKind::Command { "run" } else { "edit" };
                    reply.push(format!("Permission to {verb} {what}: {answer}."));
                }
                Directive::Plan(entries) => {
                    activities += 1;
                    let mut plan = super::activity(format!("scripted-{activities}"), pb::ActivityKind::Plan, "Plan");
                    plan.status = pb::ActivityStatus::InProgress as i32;
                    plan.plan = entries
                        .split(';')
                        .map(str::trim)
                        .filter(|e| !e.is_empty())
                        .enumerate()
                        .map(|(i, content)| pb::PlanEntry {
                            content: content.to_owned(),
                            status: if i == 0 { pb::ActivityStatus::InProgress } else { pb::ActivityStatus::Pending }
                                as i32,
                        })
                        .collect();
                    sink.activity(plan);
                }
                Directive::Fail(message) => {
                    let message = if message.is_empty() { "scripted failure" } else { message };
                    return Err(ProviderFailure::turn(message));
                }
                Directive::Answer(text) => answer = Some(text.replace("\\n", "\n")),
                Directive::AnswerNext(text) => self.next_answer = Some(text.replace("\\n", "\n")),
                Directive::Crash => {
                    self.crashed = true;
                    return Err(ProviderFailure::crashed("the scripted runtime crashed"));
                }
                Directive::Panic => panic!("the scripted provider panicked on purpose (/panic)"),
            }
        }
        while let Ok(steer) = steering.try_recv() {
            take(steer, &mut reply);
        }
        if !attachments.is_empty() {
            let listed: Vec<String> =
                attachments.iter().map(|a| format!("{} ({}, {} bytes)", a.path, a.mime, a.size)).collect();
            reply.push(format!("Attachments: {}.", listed.join(", ")));
        }
        let plain = plain.join("\n");
        if let Some(answer) = answer {
            reply = vec![answer];
        } else if !plain.trim().is_empty() || (reply.is_empty() && !streamed) {
            reply.insert(0, format!("You said: {plain}"));
        }
        if !reply.is_empty() {
            let reply = reply.join(" ");
            self.stream(sink, &reply, pause).await;
            self.total += words(text) + words(&reply);
            sink.usage(self.total);
        }
        Ok(())
    }
}

impl ProviderSession for ScriptedSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(async move {
            let mut steering = turn.steering;
            if self.crashed {
                return Err(ProviderFailure::crashed("the scripted runtime is gone"));
            }
            if self.model == "scripted-text-only"
                && let Some(image) = turn.attachments.iter().find(|a| a.is_image())
            {
                return Err(image.unsupported("model scripted-text-only"));
            }
            sink.provider_session(&self.identity);
            if turn.kind == pb::TurnKind::Prepare {
                if self.model == "scripted-slow" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let answer = if self.model == "scripted-unprepared" { "Not ready yet." } else { PREPARED_ACK };
                self.stream(sink, &format!("  {answer}\n"), None).await;
                return Ok(());
            }
            // Nothing outlives the turn here: stopping is dropping it.
            tokio::select! {
                biased;
                () = turn.cancel.cancelled() => Err(ProviderFailure::cancelled()),
                result = self.user_turn(&turn.text, &turn.attachments, &mut steering, sink) => result,
            }
        })
    }
}
