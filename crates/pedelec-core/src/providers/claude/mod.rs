//! `claude`: Claude Code, one `claude -p --input-format stream-json`
//! process per session runtime, kept across turns (`live`): each turn is a
//! user message on its stdin, a steer another one while it runs, a cancel
//! its `interrupt` control request.
//!
//! Command line (messages on stdin):
//! `claude -p --output-format stream-json --verbose --include-partial-messages --input-format stream-json --replay-user-messages
//!  --mcp-config <runtime>/.pedelec-mcp.json --strict-mcp-config --allowedTools mcp__pedelec
//!  [--disallowedTools Read(//<state>/**) Edit(//<state>/**) …] [--model MODEL] [--effort low|high] [--resume <session id> [--fork-session]]`
//!
//! The MCP config (with the tool token in the bridge's `env`) is a 0600 file
//! in the session's runtime directory, not inline JSON, so the token never
//! appears on a command line. `system/init` and `result` carry the session
//! id (re-read every turn: a resumed or forked process may name a new id). Deltas come from
//! `stream_event` text deltas; `assistant` messages are the complete
//! messages (subagent messages, with a `parent_tool_use_id`, are activity,
//! not chat). Usage: each turn's `result.usage` counts only that turn, so the
//! session total adds every turn's input + cache + output tokens.

use std::io::Write;
use std::path::PathBuf;

use pedelec_protocol::{ErrorCode, pb};
use serde_json::Value;

mod live;

use super::cli_turn::{self, LineParser, skipped, str_field as text};
use super::events::content_text;
use super::{
    AgentEvent, BoxFuture, MCP_SERVER_NAME, Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup,
    TurnRequest, TurnSink, effort_name, with_guidance,
};

pub struct Claude {
    config: ProviderConfig,
}

impl Claude {
    pub fn new(config: ProviderConfig) -> Self {
        Claude { config }
    }
}

impl Provider for Claude {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Stream-json input while a turn runs (see [`steer_message`]).
    fn steers(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    /// `--resume PARENT --fork-session` at the fork's first run.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        let mcp_config = write_mcp_config(&setup)?;
        Ok(Box::new(ClaudeSession {
            config: self.config.clone(),
            session_id: setup.provider_session_id.clone(),
            total: setup.usage_total.unwrap_or(0),
            setup,
            mcp_config,
            live: None,
            fresh: false,
        }))
    }
}

/// The `--mcp-config` file: the bridge as a stdio server, readable only by us.
/// When the application answers permissions, the bridge also serves the
/// permission-prompt tool (`--permission-prompt-tool`).
fn write_mcp_config(setup: &ProviderSetup) -> Result<PathBuf, ProviderFailure> {
    let mut env: serde_json::Map<String, Value> =
        setup.bridge.env().into_iter().map(|(k, v)| (k, Value::from(v))).collect();
    if setup.permissions.is_some() {
        env.insert(super::PERMISSION_PROMPT_ENV.to_owned(), Value::from("1"));
    }
    let timeout_ms = setup.longest_tool_timeout().as_millis() as u64;
    let body = serde_json::json!({ "mcpServers": { MCP_SERVER_NAME: {
        "type": "stdio",
        "command": setup.bridge.command.display().to_string(),
        "args": ["mcp"],
        "env": env,
        "timeout": timeout_ms + 5_000,
    }}});
    let path = setup.runtime_dir.join(".pedelec-mcp.json");
    // Through a handle on the runtime directory: a link the agent planted
    // there cannot send the token-bearing file elsewhere.
    let write = || -> std::io::Result<()> {
        let dir = crate::workspace::open_runtime(&setup.workspace, &setup.runtime_dir, true)?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        cap_std::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = dir.open_with(".pedelec-mcp.json", &options)?;
        file.write_all(body.to_string().as_bytes())
    };
    write().map_err(|e| {
        ProviderFailure::coded(ErrorCode::ProviderUnavailable, format!("cannot write the MCP config: {e}"), true)
    })?;
    Ok(path)
}

struct ClaudeSession {
    config: ProviderConfig,
    setup: ProviderSetup,
    session_id: Option<String>,
    total: u64,
    mcp_config: PathBuf,
    /// The session's CLI, kept across turns (started at the first).
    live: Option<live::Live>,
    /// The live CLI began a new conversation and has not been sent a
    /// message yet: the first carries the guidance.
    fresh: bool,
}

/// The argv (after the program) for one turn.
/// Deny rules keeping claude's own file tools out of Core's directories:
/// `Read(//abs/path/**)` and `Edit(//abs/path/**)` (`//` marks an absolute
/// path in claude's rule syntax). A deny rule wins over any allow and over
/// the permission prompt. Claude's shell tool is not allowed at all
/// (`--allowedTools` names only the session's own tools), so these are
/// the tools that could reach the files. Paths that are not absolute Unix
/// paths (Windows drive paths) have no such rule form and are left out.
fn keep_out_rules(dirs: &[PathBuf]) -> Vec<String> {
    dirs.iter()
        .filter_map(|dir| dir.to_str().filter(|d| d.starts_with('/')).map(|d| d.trim_end_matches('/').to_owned()))
        .flat_map(|dir| [format!("Read(/{dir}/**)"), format!("Edit(/{dir}/**)")])
        .collect()
}

/// How many project folders [`conversation_file`] looks through at most.
const MAX_PROJECTS: usize = 10_000;

/// The file where Claude Code keeps conversation `id`:
/// `<config dir>/projects/<project>/<id>.jsonl`, the config dir being
/// `CLAUDE_CONFIG_DIR` or `~/.claude` as the agent's environment (the
/// provider's `env`, else Core's) says. Claude looks a conversation up by
/// id only in the project of its working directory, so a fork working in a
/// copy of its parent's folder resumes from this file (`--resume FILE`,
/// which Claude Code also takes) instead. The project is found by listing
/// them rather than by rebuilding Claude's folder name for a path. `None`
/// for an id that is not a UUID (it came from the agent) or no such file.
pub fn conversation_file(config: &ProviderConfig, id: &str) -> Option<PathBuf> {
    uuid::Uuid::parse_str(id).ok()?;
    let file = format!("{id}.jsonl");
    std::fs::read_dir(projects_dir(config)?)
        .ok()?
        .take(MAX_PROJECTS)
        .flatten()
        .map(|project| project.path().join(&file))
        .find(|path| path.symlink_metadata().is_ok_and(|m| m.is_file()))
}

/// How long [`settled_conversation_file`] waits for the file at most.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// A conversation file unchanged this long counts as written.
const SETTLE_QUIET: std::time::Duration = std::time::Duration::from_millis(150);

/// How long after a CLI of this Core answered in a conversation its file
/// may still be being written.
const WRITING: std::time::Duration = std::time::Duration::from_secs(30);

/// Conversations a CLI of this Core answered in lately, and when.
static ANSWERED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>> =
    std::sync::LazyLock::new(Default::default);

/// A CLI (claude's, or Claude Code under claude-agent-acp) answered a turn
/// of conversation `id` (see [`settled_conversation_file`]).
pub(crate) fn answered(id: &str) {
    let mut answered = ANSWERED.lock().unwrap_or_else(|p| p.into_inner());
    answered.retain(|_, at| at.elapsed() < WRITING);
    answered.insert(id.to_owned(), std::time::Instant::now());
}

/// [`conversation_file`], once it exists and its size stopped changing
/// (bounded by [`SETTLE_WAIT`]) when a CLI of this Core answered in it
/// lately: a CLI writes its conversation shortly after it answers, and one
/// resumed or forked before that would miss it (or its last turn). Any
/// other conversation is looked up once, without waiting.
pub async fn settled_conversation_file(config: &ProviderConfig, id: &str) -> Option<PathBuf> {
    let recent = ANSWERED.lock().unwrap_or_else(|p| p.into_inner()).get(id).is_some_and(|at| at.elapsed() < WRITING);
    if !recent {
        return conversation_file(config, id);
    }
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    let mut last: Option<(PathBuf, u64)> = None;
    loop {
        let found = conversation_file(config, id).and_then(|f| Some((f.clone(), f.metadata().ok()?.len())));
        match (&last, found) {
            (Some(seen), Some(now)) if *seen == now => return Some(now.0),
            (_, found) => last = found,
        }
        if tokio::time::Instant::now() >= deadline {
            return last.map(|(file, _)| file);
        }
        tokio::time::sleep(SETTLE_QUIET).await;
    }
}

/// Claude Code's `projects` folder, as the agent's environment names its
/// config dir (`CLAUDE_CONFIG_DIR`, else `~/.claude`).
fn projects_dir(config: &ProviderConfig) -> Option<PathBuf> {
    let var = |name: &str| config.env.get(name).cloned().or_else(|| std::env::var(name).ok());
    let root = match var("CLAUDE_CONFIG_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(var("HOME")?).join(".claude"),
    };
    Some(root.join("projects"))
}

/// Which conversation a `claude -p` run continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation<'a> {
    New,
    /// `--resume ID`: the session's own.
    Resume(&'a str),
    /// `--resume ID --fork-session`: a copy of a parent's, under a new id
    /// (a forked session's first run); `ID` may be the parent's
    /// [`conversation_file`].
    Fork(&'a str),
}

pub fn turn_args(
    config: &ProviderConfig,
    setup: &ProviderSetup,
    mcp_config: &str,
    conversation: Conversation<'_>,
) -> Vec<String> {
    let mut args: Vec<String> = config.command[1..].to_vec();
    args.extend(
        [
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--mcp-config",
            mcp_config,
            "--strict-mcp-config",
            "--allowedTools",
            &format!("mcp__{MCP_SERVER_NAME}"),
        ]
        .map(str::to_owned),
    );
    let denied = keep_out_rules(&setup.private_dirs);
    if !denied.is_empty() {
        args.push("--disallowedTools".to_owned());
        args.extend(denied);
    }
    if !setup.model.is_empty() {
        args.extend(["--model".to_owned(), setup.model.clone()]);
    }
    if let Some(effort) = effort_name(setup.effort_level) {
        args.extend(["--effort".to_owned(), effort.to_owned()]);
    }
    match conversation {
        Conversation::New => {}
        Conversation::Resume(id) => args.extend(["--resume".to_owned(), id.to_owned()]),
        Conversation::Fork(id) => args.extend(["--resume".to_owned(), id.to_owned(), "--fork-session".to_owned()]),
    }
    if setup.permissions.is_some() {
        let tool = format!("mcp__{MCP_SERVER_NAME}__{}", pedelec_protocol::tools::PERMISSION_PROMPT_TOOL);
        args.extend(["--permission-prompt-tool".to_owned(), tool]);
    }
    args
}

/// One `--input-format stream-json` user message: the text, then each image
/// as a base64 image block; a line of JSON ending the input.
async fn stream_json_prompt(text: &str, images: &[&super::Attachment]) -> Result<String, ProviderFailure> {
    let mut content = vec![serde_json::json!({ "type": "text", "text": text })];
    for image in images {
        let data = image.image_base64()?;
        content.push(serde_json::json!({
            "type": "image",
            "source": { "type": "base64", "media_type": image.mime, "data": data },
        }));
    }
    Ok(format!("{}\n", user_message(content.into())))
}

/// A stream-json user message with this content.
fn user_message(content: Value) -> Value {
    serde_json::json!({ "type": "user", "message": { "role": "user", "content": content } })
}

/// A user message steered into a running turn, and the uuid the CLI echoes
/// when it takes it. Priority `next`: Claude Code hands it to the model at
/// the turn's next tool round ("The user sent a new message while you were
/// working"); a turn with no tool round left takes it as a turn of its own
/// right after, which [`live::Live::turn`] keeps inside the same operation.
fn steer_message(text: &str) -> (String, String) {
    let uuid = uuid::Uuid::new_v4().to_string();
    let mut message = user_message(serde_json::json!([{ "type": "text", "text": text }]));
    message["priority"] = "next".into();
    message["uuid"] = uuid.clone().into();
    (uuid, format!("{message}\n"))
}

/// The claude permission prompt (`AgentTools.RequestPermission`, from the
/// bridge's permission-prompt tool): the tool claude wants to run and its
/// input, asked of the application as a permission request with the
/// options allow and deny. Core's policy for claude allows only the
/// session's own tools (`--allowedTools`), which claude never asks about:
/// it would deny, so an SDK without a handler denies.
pub async fn ask_permission(
    asker: &dyn crate::providers::PermissionAsker,
    mode: pb::PermissionMode,
    tool: &str,
    input_json: &str,
) -> pb::AgentPermissionResponse {
    use crate::providers::PermissionAnswer;
    let deny = |message: String| pb::AgentPermissionResponse { allowed: false, message };
    if mode != pb::PermissionMode::App {
        return deny("this session's permissions follow Core's policy".into());
    }
    if tool.len() > pedelec_protocol::limits::MAX_ID_LEN
        || input_json.len() > pedelec_protocol::limits::MAX_TOOL_JSON_BYTES
    {
        return deny("the permission request is too large".into());
    }
    let input: Value = serde_json::from_str(input_json).unwrap_or(Value::Null);
    let mut activity = tool_activity(String::new(), tool, &input);
    activity.status = pb::ActivityStatus::Pending as i32;
    let option = |id: &str, name: &str, kind: pb::PermissionOptionKind| pb::PermissionOption {
        option_id: id.into(),
        name: name.into(),
        kind: kind as i32,
    };
    let request = pb::PermissionRequest {
        activity: Some(pedelec_protocol::activity::bounded(activity)),
        options: vec![
            option("allow", "Allow", pb::PermissionOptionKind::AllowOnce),
            option("deny", "Deny", pb::PermissionOptionKind::RejectOnce),
        ],
        ..Default::default()
    };
    match asker.ask(request).await {
        Ok(PermissionAnswer::Selected(option)) if option == "allow" => {
            pb::AgentPermissionResponse { allowed: true, message: String::new() }
        }
        Ok(PermissionAnswer::Selected(_) | PermissionAnswer::Rejected) => {
            deny("the application did not allow this".into())
        }
        Ok(PermissionAnswer::Cancelled) => deny("the operation ended".into()),
        Err(error) => deny(format!("{}: {}", error.code, error.message)),
    }
}

impl ClaudeSession {
    /// Starts the session's CLI: resuming its conversation, forking the
    /// parent's for a fork's first runtime, or a new one.
    async fn start(&mut self, sink: &dyn TurnSink) -> Result<(), ProviderFailure> {
        let mcp_config = self.mcp_config.display().to_string();
        // The CLI that last held the conversation (this runtime's previous
        // one, or the parent's, still running) writes it to disk a moment
        // after it answered: wait for the file to settle first.
        let continued = self.session_id.as_ref().or(self.setup.fork_from.as_ref());
        let file = match continued {
            Some(id) => settled_conversation_file(&self.config, id).await,
            None => None,
        };
        // A CLI killed before it wrote the conversation left nothing to
        // resume: where Claude's projects folder can be read and holds no
        // such conversation, a new one starts (said in the transcript)
        // rather than every turn failing on `--resume`.
        if let Some(id) = self.session_id.clone().filter(|_| file.is_none())
            && projects_dir(&self.config).is_some_and(|dir| dir.is_dir())
        {
            tracing::warn!(session = %self.setup.session_id, conversation = %id, "claude's conversation is not on disk");
            sink.activity(crate::providers::note(format!(
                "claude's conversation {id} was not saved (its CLI ended first); starting a new conversation"
            )));
            self.session_id = None;
        }
        let parent_file = match (&self.session_id, &self.setup.fork_from) {
            (None, Some(_)) => file.map(|f| f.display().to_string()),
            _ => None,
        };
        let conversation = match (&self.session_id, &self.setup.fork_from) {
            (Some(id), _) => Conversation::Resume(id),
            (None, Some(parent)) => Conversation::Fork(parent_file.as_deref().unwrap_or(parent)),
            (None, None) => Conversation::New,
        };
        let mut args = turn_args(&self.config, &self.setup, &mcp_config, conversation);
        // Echoes each user message as the CLI takes it: how a steered
        // message is known to have reached the conversation.
        args.extend(["--input-format", "stream-json", "--replay-user-messages"].map(str::to_owned));
        let command = cli_turn::agent_command(&self.config, args, &self.setup.bridge);
        self.live = Some(live::Live::spawn(&command, &self.setup.workspace)?);
        // A resumed or forked conversation already has the guidance.
        self.fresh = conversation == Conversation::New;
        Ok(())
    }
}

impl ProviderSession for ClaudeSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(async move {
            if self.live.is_none() {
                self.start(sink).await?;
            }
            // Other files as paths in the workspace (Claude Code reads them);
            // images as image content of the message.
            let (images, files): (Vec<&super::Attachment>, Vec<&super::Attachment>) =
                turn.attachments.iter().partition(|a| a.is_image());
            let text = super::with_attachment_paths(&turn.text, &files);
            let text = if self.fresh { with_guidance(&self.setup.guidance, &text) } else { text };
            let message = stream_json_prompt(&text, &images).await?;
            self.fresh = false;
            let mut parser = ClaudeParser::new(self.total);
            let live = self.live.as_mut().expect("started above");
            let mut controls = live::Controls { cancel: &turn.cancel, steering: turn.steering };
            let ended = live.turn(&message, &mut parser, sink, &mut controls).await;
            if let Some(id) = parser.session_id {
                answered(&id);
                self.session_id = Some(id);
            }
            self.total = parser.total;
            match ended {
                live::Ended::Answered(result) => result,
                live::Ended::Cancelled => Err(ProviderFailure::cancelled()),
                live::Ended::Lost(failure) => {
                    // The next turn starts a new process that resumes the conversation.
                    self.live = None;
                    Err(failure)
                }
            }
        })
    }

    fn shutdown(&mut self) {
        // Closed in the background: the runtime restarts at once, and its
        // new CLI waits for the conversation file to settle.
        if let Some(live) = self.live.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(live.close());
        }
        let _ = std::fs::remove_file(&self.mcp_config);
    }

    /// The conversation has an id: a new CLI continues it with `--resume`.
    fn idle_process_resumable(&self) -> bool {
        self.live.is_some() && self.session_id.is_some()
    }
}

/// `claude -p --output-format stream-json` lines → normalised events.
pub struct ClaudeParser {
    pub session_id: Option<String>,
    /// The session total so far, including this run once its result arrived.
    pub total: u64,
    /// `tool_use` ids of calls of our own tools → the manifest name, so a
    /// failed `tool_result` can say which frontend tool the agent failed.
    ours: std::collections::HashMap<String, String>,
    /// Activities without an id of their own (thinking, subagent text) so far.
    unnamed: usize,
    /// The uuids of the user messages the CLI echoed (`--replay-user-messages`)
    /// since [`ClaudeParser::take_replayed`] last took them: it echoes each
    /// message as it enters the conversation.
    replayed: Vec<String>,
}

/// A Claude Code tool's input as an activity: its kind, and the command or
/// paths it works on.
fn tool_activity(id: String, name: &str, input: &Value) -> pb::Activity {
    use pb::ActivityKind as K;
    let kind = match name {
        "Bash" | "BashOutput" | "KillShell" => K::Command,
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" => K::FileEdit,
        "Read" => K::FileRead,
        "Grep" | "Glob" | "WebSearch" => K::Search,
        "WebFetch" => K::Fetch,
        "TodoWrite" => K::Plan,
        _ => K::ToolCall,
    };
    let mut started = super::activity(id, kind, name);
    started.status = pb::ActivityStatus::InProgress as i32;
    if kind == K::Command {
        started.command = text(input, "command");
    }
    for key in ["file_path", "notebook_path", "path"] {
        let path = text(input, key);
        if !path.is_empty() {
            started.paths.push(path);
        }
    }
    if kind == K::Search || kind == K::Fetch {
        for key in ["pattern", "query", "url"] {
            let what = text(input, key);
            if !what.is_empty() {
                started.title = format!("{name} {what}");
            }
        }
    }
    if let Some(todos) = input.get("todos").and_then(Value::as_array) {
        started.plan = todos
            .iter()
            .map(|todo| pb::PlanEntry {
                content: text(todo, "content"),
                status: match text(todo, "status").as_str() {
                    "completed" => pb::ActivityStatus::Completed,
                    "in_progress" => pb::ActivityStatus::InProgress,
                    _ => pb::ActivityStatus::Pending,
                } as i32,
            })
            .collect();
    }
    started
}

impl ClaudeParser {
    pub fn new(total: u64) -> Self {
        ClaudeParser {
            session_id: None,
            total,
            ours: std::collections::HashMap::new(),
            unnamed: 0,
            replayed: Vec::new(),
        }
    }

    /// The uuids of the user messages the CLI took into its conversation
    /// since the last call.
    pub fn take_replayed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.replayed)
    }

    fn unnamed_id(&mut self, what: &str) -> String {
        self.unnamed += 1;
        format!("{what}-{}", self.unnamed)
    }

    fn identity(&mut self, id: &str) -> Option<AgentEvent> {
        if id.is_empty() || self.session_id.as_deref() == Some(id) {
            return None;
        }
        self.session_id = Some(id.to_owned());
        Some(AgentEvent::SessionId { id: id.to_owned() })
    }

    /// A `stream_event` line, read without building a JSON tree; `None` when
    /// the line is some other kind (or an odd shape), for the full reading.
    fn stream_event(&mut self, line: &str) -> Option<Vec<AgentEvent>> {
        let event: StreamLine<'_> = serde_json::from_str(line).ok()?;
        if event.kind != "stream_event" {
            return None;
        }
        let mut events: Vec<AgentEvent> =
            self.identity(event.session_id.as_deref().unwrap_or_default()).into_iter().collect();
        let top_level = event.parent_tool_use_id.is_none();
        if let Some(StreamInner { kind, delta: Some(Delta { kind: delta_kind, text: Some(fragment) }) }) = event.event
            && top_level
            && kind == "content_block_delta"
            && delta_kind == "text_delta"
            && !fragment.is_empty()
        {
            events.push(AgentEvent::Delta { text: fragment.into_owned() });
        }
        Some(events)
    }

    fn assistant(&mut self, value: &Value) -> Vec<AgentEvent> {
        let blocks = value.pointer("/message/content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let nested = value.get("parent_tool_use_id").is_some_and(|p| !p.is_null());
        let mut events = Vec::new();
        let mut said = Vec::new();
        for block in blocks {
            match block.get("type").and_then(Value::as_str).unwrap_or_default() {
                "text" => said.push(text(block, "text")),
                "tool_use" => {
                    let prefix = format!("mcp__{MCP_SERVER_NAME}__");
                    if let Some(tool) = text(block, "name").strip_prefix(&prefix) {
                        self.ours.insert(text(block, "id"), tool.to_owned());
                    }
                    let input = block.get("input").cloned().unwrap_or_default();
                    events.push(AgentEvent::Activity(tool_activity(text(block, "id"), &text(block, "name"), &input)));
                }
                "thinking" => {
                    let mut thinking =
                        super::activity(self.unnamed_id("thought"), pb::ActivityKind::Thinking, "Thinking");
                    thinking.output = text(block, "thinking");
                    events.push(AgentEvent::Activity(thinking));
                }
                _ => {}
            }
        }
        let said = said.concat();
        // A message with `error` is the CLI's synthetic error text, not the assistant speaking.
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            events.push(AgentEvent::Notice { message: format!("assistant error {error}: {said}") });
        } else if nested && !said.is_empty() {
            let mut subagent = super::activity(self.unnamed_id("subagent"), pb::ActivityKind::Note, "Subagent");
            subagent.output = said;
            events.push(AgentEvent::Activity(subagent));
        } else if !said.is_empty() {
            events.push(AgentEvent::Message { text: said });
        }
        events
    }

    fn result(&mut self, value: &Value) -> Vec<AgentEvent> {
        let mut events = Vec::new();
        if let Some(usage) = value.get("usage") {
            let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
            let run = count("input_tokens")
                + count("cache_creation_input_tokens")
                + count("cache_read_input_tokens")
                + count("output_tokens");
            if run > 0 {
                self.total += run;
                events.push(AgentEvent::Usage { total_tokens: self.total });
            }
        }
        let subtype = text(value, "subtype");
        let is_error = value.get("is_error").and_then(Value::as_bool).unwrap_or(false);
        if subtype != "success" || is_error {
            let errors: Vec<String> = value
                .get("errors")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default();
            let message = if !errors.is_empty() {
                errors.join("; ")
            } else if !text(value, "result").is_empty() {
                text(value, "result")
            } else {
                format!("claude reported {subtype}")
            };
            events.push(AgentEvent::Failed { message });
        } else {
            events.push(AgentEvent::TurnDone);
        }
        events
    }
}

/// The part of a `stream_event` line a text delta needs, borrowed from the
/// line. Most of a turn's lines are these, and reading each into a
/// `serde_json::Value` tree (every key and string allocated) cost most of
/// the parser's time. Unknown fields are skipped; a field of another type
/// fails this reading, and the full one then takes only the line's session
/// id from it.
#[derive(serde::Deserialize)]
struct StreamLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
    /// A string for a subagent's stream (not chat), null at top level.
    #[serde(default, borrow)]
    parent_tool_use_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    event: Option<StreamInner<'a>>,
}

#[derive(serde::Deserialize)]
struct StreamInner<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
}

#[derive(serde::Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
}

impl LineParser for ClaudeParser {
    fn line(&mut self, line: &str) -> Vec<AgentEvent> {
        if let Some(events) = self.stream_event(line) {
            return events;
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(value @ Value::Object(_)) => value,
            Ok(_) => return vec![skipped(line, "not a JSON object")],
            Err(e) => return vec![skipped(line, format!("not JSON ({e})"))],
        };
        let mut events: Vec<AgentEvent> = self.identity(&text(&value, "session_id")).into_iter().collect();
        match value.get("type").and_then(Value::as_str).unwrap_or_default() {
            // Text deltas are read by `stream_event` alone; a stream event
            // that fails that reading has a field of an unexpected type, so
            // it carries no text delta we could trust.
            "stream_event" => {}
            "assistant" => events.extend(self.assistant(&value)),
            "user" => {
                if value.get("isReplay").and_then(Value::as_bool) == Some(true) {
                    self.replayed.push(text(&value, "uuid"));
                }
                let blocks =
                    value.pointer("/message/content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                for block in blocks.iter().filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result")) {
                    let failed = block.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                    let mut done = super::activity(text(block, "tool_use_id"), pb::ActivityKind::Unspecified, "");
                    done.status =
                        if failed { pb::ActivityStatus::Failed } else { pb::ActivityStatus::Completed } as i32;
                    done.output = block.get("content").and_then(content_text).unwrap_or_default();
                    events.push(AgentEvent::Activity(done));
                    if let (true, Some(tool)) = (failed, self.ours.get(&text(block, "tool_use_id"))) {
                        let reason = block.get("content").and_then(content_text);
                        let reason = reason.unwrap_or_else(|| "the call failed".into());
                        events.push(AgentEvent::ToolFailed { tool: tool.clone(), reason });
                    }
                }
            }
            "result" => events.extend(self.result(&value)),
            "system" if text(&value, "subtype") == "api_retry" => {
                events.push(AgentEvent::Notice { message: format!("API retry {}", value["attempt"]) });
            }
            _ => {}
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_at(dir: &std::path::Path) -> ProviderConfig {
        let mut config =
            crate::providers::Providers::builtin().get("claude").expect("a claude preset").config().clone();
        config.env.insert("CLAUDE_CONFIG_DIR".into(), dir.display().to_string());
        config
    }

    #[test]
    fn a_conversation_file_is_found_by_its_uuid_only() {
        let dir = tempfile::tempdir().unwrap();
        let id = "8f1c2a3e-5b6d-4e7f-9a0b-1c2d3e4f5a6b";
        let project = dir.path().join("projects/-tmp-work");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join(format!("{id}.jsonl")), "{}\n").unwrap();
        std::fs::write(dir.path().join("secret.jsonl"), "{}\n").unwrap();
        let config = config_at(dir.path());
        assert_eq!(conversation_file(&config, id), Some(project.join(format!("{id}.jsonl"))));
        // The id comes from the agent's output: anything but a UUID finds nothing.
        for forged in ["../../secret", "../secret", "/etc/passwd", "", "8f1c2a3e"] {
            assert_eq!(conversation_file(&config, forged), None, "{forged:?}");
        }
    }
}
