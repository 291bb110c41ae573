//! The fallback for a codex without `app-server`: one `codex exec --json`
//! process per turn.
//!
//! Command line (prompt on stdin, so it never shows in `ps`):
//! `codex exec --json --skip-git-repo-check --sandbox workspace-write --cd <workspace>
//!  -c mcp_servers.pedelec.command="<pedelec-core>" -c mcp_servers.pedelec.args=["mcp"]
//!  -c mcp_servers.pedelec.env_vars=["PEDELEC_TOOL_TOKEN","PEDELEC_CORE_SOCKET"]
//!  -c mcp_servers.pedelec.default_tools_approval_mode="approve"
//!  -c sandbox_workspace_write.exclude_slash_tmp=true
//!  -c sandbox_workspace_write.exclude_tmpdir_env_var=true …
//!  [-m MODEL] [-c model_reasoning_effort="low|high"] [resume <thread id>] -`
//!
//! `exec --json` prints only completed items: no text deltas, so such a
//! session streams no `chat_delta`s, only whole messages. A cancel is
//! SIGTERM to the process group (`cli_turn`). There is no approval channel:
//! approval policy `never`, so our MCP tools must be pre-approved. The
//! thread id from `thread.started` is the session's provider identity;
//! later turns continue it with `resume`. Usage is the `turn.completed`
//! total (input + output tokens; cached input is a part of input), which
//! codex reports as the thread's running total.

use pedelec_protocol::pb;
use serde_json::Value;

use crate::providers::cli_turn::{self, LineParser, skipped, str_field as text};
use crate::providers::{
    AgentEvent, Attachment, BoxFuture, MCP_SERVER_NAME, ProviderConfig, ProviderFailure, ProviderSession,
    ProviderSetup, SOCKET_ENV, TOOL_TOKEN_ENV, TurnRequest, TurnSink, effort_name, with_attachment_paths,
    with_guidance,
};

/// A session on `codex exec`: the thread id is all that lives between turns.
pub(super) struct ExecSession {
    pub(super) config: ProviderConfig,
    pub(super) setup: ProviderSetup,
    pub(super) thread_id: Option<String>,
}

fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// The argv (after the program) for one turn.
pub fn turn_args(
    config: &ProviderConfig,
    setup: &ProviderSetup,
    thread_id: Option<&str>,
    images: &[&std::path::Path],
) -> Vec<String> {
    let mut args: Vec<String> = config.command[1..].to_vec();
    let server = format!("mcp_servers.{MCP_SERVER_NAME}");
    let tool_timeout = setup.longest_tool_timeout().as_secs();
    args.extend(
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--sandbox",
            "workspace-write",
            "--cd",
            &setup.workspace.display().to_string(),
            "-c",
            &format!("{server}.command={}", toml_string(&setup.bridge.command.display().to_string())),
            "-c",
            &format!("{server}.args=[\"mcp\"]"),
            "-c",
            &format!("{server}.env_vars=[\"{TOOL_TOKEN_ENV}\",\"{SOCKET_ENV}\"]"),
            "-c",
            &format!("{server}.tool_timeout_sec={}", tool_timeout + 5),
            // codex asks approval for every MCP tool without annotations, and
            // `exec` has no approval channel: under approval policy `never`
            // the call fails ("requires approval, but approval policy is
            // never"). Our own tools are validated by Core and decided by the
            // application's handler, so the session pre-approves them.
            "-c",
            &format!("{server}.default_tools_approval_mode=\"approve\""),
            // `workspace-write` also makes /tmp and $TMPDIR writable by
            // default: a session's agent could then write outside its
            // workspace (and into other sessions' files there). Only the
            // workspace is the session's.
            "-c",
            "sandbox_workspace_write.exclude_slash_tmp=true",
            "-c",
            "sandbox_workspace_write.exclude_tmpdir_env_var=true",
        ]
        .map(str::to_owned),
    );
    if !setup.model.is_empty() {
        args.extend(["-m".to_owned(), setup.model.clone()]);
    }
    if let Some(effort) = effort_name(setup.effort_level) {
        args.extend(["-c".to_owned(), format!("model_reasoning_effort={}", toml_string(effort))]);
    }
    if let Some(thread) = thread_id {
        args.extend(["resume".to_owned(), thread.to_owned()]);
    }
    // Images as codex's own image input (`--image`, after the subcommand).
    for image in images {
        args.extend(["--image".to_owned(), image.display().to_string()]);
    }
    args.push("-".to_owned());
    args
}

impl ProviderSession for ExecSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(async move {
            let (images, files): (Vec<&Attachment>, Vec<&Attachment>) =
                turn.attachments.iter().partition(|a| a.is_image());
            let image_paths: Vec<&std::path::Path> = images.iter().map(|a| a.file.as_path()).collect();
            let args = turn_args(&self.config, &self.setup, self.thread_id.as_deref(), &image_paths);
            let command = cli_turn::agent_command(&self.config, args, &self.setup.bridge);
            let text = with_attachment_paths(&turn.text, &files);
            let prompt = match self.thread_id {
                None => with_guidance(&self.setup.guidance, &text),
                Some(_) => text,
            };
            let mut parser = CodexParser::default();
            let outcome =
                cli_turn::run(&command, &self.setup.workspace, &prompt, &mut parser, sink, &turn.cancel).await;
            if let Some(thread) = parser.thread_id {
                self.thread_id = Some(thread);
            }
            outcome
        })
    }
}

/// `codex exec --json` lines → normalised events.
#[derive(Default)]
pub struct CodexParser {
    pub thread_id: Option<String>,
    last_error: Option<String>,
}

fn clip(text: &str) -> String {
    cli_turn::clip(text, 300)
}

impl CodexParser {
    fn item(&self, stage: &str, item: &Value) -> Vec<AgentEvent> {
        use pb::ActivityKind as K;
        let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
        let completed = stage == "item.completed";
        // codex's item status; an item without one is in progress until completed.
        let status = match text(item, "status").as_str() {
            "completed" => pb::ActivityStatus::Completed,
            "failed" | "declined" => pb::ActivityStatus::Failed,
            "in_progress" => pb::ActivityStatus::InProgress,
            _ if completed => pb::ActivityStatus::Completed,
            _ => pb::ActivityStatus::InProgress,
        };
        let id = text(item, "id");
        let activity = |kind: K, title: String| {
            let mut a = crate::providers::activity(id.clone(), kind, title);
            a.status = status as i32;
            a
        };
        match kind {
            "agent_message" if completed => vec![AgentEvent::Message { text: text(item, "text") }],
            "reasoning" if completed => {
                let mut thinking = activity(K::Thinking, "Thinking".into());
                thinking.status = 0;
                thinking.output = text(item, "text");
                vec![AgentEvent::Activity(thinking)]
            }
            "command_execution" => {
                let mut command = activity(K::Command, clip(&text(item, "command")));
                command.command = text(item, "command");
                command.output = text(item, "aggregated_output");
                if item.get("exit_code").and_then(Value::as_i64).is_some_and(|code| code != 0) {
                    command.status = pb::ActivityStatus::Failed as i32;
                }
                vec![AgentEvent::Activity(command)]
            }
            "mcp_tool_call" => {
                let error = item.pointer("/error/message").and_then(Value::as_str);
                let mut call = activity(K::ToolCall, format!("{}.{}", text(item, "server"), text(item, "tool")));
                if let Some(error) = error {
                    call.status = pb::ActivityStatus::Failed as i32;
                    call.output = error.to_owned();
                } else if let Some(result) = item.get("result").filter(|r| !r.is_null()) {
                    call.output = crate::providers::events::content_text(result).unwrap_or_else(|| result.to_string());
                }
                let mut events = vec![AgentEvent::Activity(call)];
                // A call of ours that codex itself failed (e.g. "requires approval"):
                // codex's own error is in `error`; an error result our MCP server
                // answered (the handler's TOOL_HANDLER_ERROR) is in `result`.
                if let (true, true, Some(reason)) = (completed, text(item, "server") == MCP_SERVER_NAME, error) {
                    events.push(AgentEvent::ToolFailed { tool: text(item, "tool"), reason: reason.to_owned() });
                }
                events
            }
            "file_change" => {
                let changes = item.get("changes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                let mut edit = activity(K::FileEdit, "File changes".into());
                edit.paths = changes.iter().map(|c| text(c, "path")).collect();
                edit.output = changes
                    .iter()
                    .map(|c| format!("{} {}", text(c, "kind"), text(c, "path")))
                    .collect::<Vec<_>>()
                    .join("\n");
                vec![AgentEvent::Activity(edit)]
            }
            "web_search" => vec![AgentEvent::Activity(activity(K::Search, clip(&text(item, "query"))))],
            "todo_list" => {
                let items = item.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                let mut plan = activity(K::Plan, "Plan".into());
                plan.plan = items
                    .iter()
                    .map(|i| pb::PlanEntry {
                        content: text(i, "text"),
                        status: if i.get("completed") == Some(&Value::Bool(true)) {
                            pb::ActivityStatus::Completed
                        } else {
                            pb::ActivityStatus::Pending
                        } as i32,
                    })
                    .collect();
                vec![AgentEvent::Activity(plan)]
            }
            "error" => vec![AgentEvent::Notice { message: text(item, "message") }],
            _ => Vec::new(),
        }
    }
}

/// The part of a completed `agent_message` item line a chat message needs,
/// borrowed from the line. In a long answer most lines are these, and
/// reading each into a `serde_json::Value` tree (every key and string
/// allocated, the keys hashed into a map) was most of the parser's time.
/// Unknown fields are skipped; any other line, or a field of another type,
/// fails this reading and takes the full one.
#[derive(serde::Deserialize)]
struct ItemLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    item: MessageItem<'a>,
}

#[derive(serde::Deserialize)]
struct MessageItem<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
}

/// A completed `agent_message` line's text, or `None` for the full reading.
/// A line that does not name the type anywhere is not tried: every other
/// item line would otherwise be parsed twice (measured on a recorded tool
/// turn: 0.97 → 0.72 M lines/s without this check).
fn completed_message(line: &str) -> Option<String> {
    if !line.contains("\"agent_message\"") {
        return None;
    }
    let ItemLine { kind, item } = serde_json::from_str(line).ok()?;
    (kind == "item.completed" && item.kind == "agent_message").then(|| item.text.unwrap_or_default().into_owned())
}

impl LineParser for CodexParser {
    fn line(&mut self, line: &str) -> Vec<AgentEvent> {
        if let Some(text) = completed_message(line) {
            return vec![AgentEvent::Message { text }];
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(value @ Value::Object(_)) => value,
            Ok(_) => return vec![skipped(line, "not a JSON object")],
            Err(e) => return vec![skipped(line, format!("not JSON ({e})"))],
        };
        match value.get("type").and_then(Value::as_str).unwrap_or_default() {
            "thread.started" => {
                let id = text(&value, "thread_id");
                if id.is_empty() {
                    return vec![skipped(line, "thread.started without thread_id")];
                }
                self.thread_id = Some(id.clone());
                vec![AgentEvent::SessionId { id }]
            }
            stage @ ("item.started" | "item.updated" | "item.completed") => match value.get("item") {
                Some(item) => self.item(stage, item),
                None => vec![skipped(line, "an item event without item")],
            },
            "turn.completed" => {
                let usage = value.get("usage");
                let count = |key: &str| usage.and_then(|u| u.get(key)).and_then(Value::as_u64);
                let mut events = Vec::new();
                if let (Some(input), Some(output)) = (count("input_tokens"), count("output_tokens")) {
                    events.push(AgentEvent::Usage { total_tokens: input + output });
                }
                events.push(AgentEvent::TurnDone);
                events
            }
            "turn.failed" => {
                let message = value.pointer("/error/message").and_then(Value::as_str).map(str::to_owned);
                let message = message.filter(|m| !m.is_empty()).or(self.last_error.take());
                vec![AgentEvent::Failed { message: message.unwrap_or_else(|| "turn failed".into()) }]
            }
            // Informational unless turn.failed follows (newer codex keeps running).
            "error" => {
                let message = text(&value, "message");
                self.last_error = Some(message.clone());
                vec![AgentEvent::Notice { message }]
            }
            _ => Vec::new(),
        }
    }
}
