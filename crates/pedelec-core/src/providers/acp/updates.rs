//! What an ACP turn's traffic means: `session/update` notifications (and
//! our own permission answers) in, [`AgentEvent`]s out. Sans-IO, so recorded
//! notification sequences are tested without an agent.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, PlanEntryStatus, PromptResponse, SessionNotification, SessionUpdate, StopReason,
    ToolCallStatus, ToolKind,
};
use pedelec_protocol::pb;
use serde_json::Value;

use crate::providers::events::content_text;
use crate::providers::{AgentEvent, MCP_SERVER_NAME, activity};

/// Longest summary an activity keeps (thoughts can be long).
const SUMMARY_CHARS: usize = 300;

/// Something the connection received during a turn, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// The params of a `session/update` notification, as the agent sent them.
    Update(Value),
    /// A `session/update` that is an `agent_message_chunk` or an
    /// `agent_thought_chunk` of text, read by [`read_text_chunk`] without a
    /// JSON tree: most of a turn's traffic.
    TextChunk { session_id: String, kind: ChunkKind, message_id: Option<String>, text: String },
    /// How we answered a `session/request_permission` (see `permission`).
    Permission { title: String, outcome: String },
}

/// Which text a [`Inbound::TextChunk`] adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    /// The agent's reply (`agent_message_chunk`).
    Message,
    /// The agent's reasoning (`agent_thought_chunk`); its `messageId` is not used.
    Thought,
}

fn another_session(id: &str) -> AgentEvent {
    AgentEvent::Skipped { reason: format!("session/update for another session {id}") }
}

/// A JSON-RPC 2.0 `session/update` notification whose update is an
/// `agent_message_chunk` or `agent_thought_chunk` with a text block, read
/// borrowing from the line.
/// Reading it into a `serde_json::Value` first, then into the ACP crate's
/// types, cost more of Core's CPU than everything else a delta does. Any
/// other line (another update, another block type, a field of another type,
/// an `id` member) is `None`, and takes the full reading; the crate ignores
/// the fields this skips (`annotations`, `_meta`) when they do not read.
pub fn read_text_chunk(line: &str) -> Option<Inbound> {
    use std::borrow::Cow;
    #[derive(serde::Deserialize)]
    struct Notification<'a> {
        #[serde(borrow)]
        jsonrpc: Cow<'a, str>,
        #[serde(borrow)]
        method: Cow<'a, str>,
        // A request (any `id`, `null` too) is never a notification.
        #[serde(default, deserialize_with = "present")]
        id: bool,
        #[serde(borrow)]
        params: Params<'a>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params<'a> {
        #[serde(borrow)]
        session_id: Cow<'a, str>,
        #[serde(borrow)]
        update: Update<'a>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Update<'a> {
        #[serde(borrow)]
        session_update: Cow<'a, str>,
        #[serde(borrow)]
        content: Block<'a>,
        #[serde(default, borrow)]
        message_id: Option<Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct Block<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
        #[serde(borrow)]
        text: Cow<'a, str>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(value).map(|_| true)
    }
    use serde::Deserialize;
    let message: Notification<'_> = serde_json::from_str(line).ok()?;
    let update = message.params.update;
    let kind = match update.session_update.as_ref() {
        "agent_message_chunk" => ChunkKind::Message,
        "agent_thought_chunk" => ChunkKind::Thought,
        _ => return None,
    };
    let ours = message.jsonrpc == "2.0" && message.method == "session/update" && !message.id;
    (ours && update.content.kind == "text").then(|| Inbound::TextChunk {
        session_id: message.params.session_id.into_owned(),
        kind,
        message_id: update.message_id.map(Cow::into_owned),
        text: update.content.text.into_owned(),
    })
}

/// The tokens one prompt turn used: `PromptResponse.usage.totalTokens` (the
/// unstable field claude-agent-acp fills), else gemini-cli's
/// `_meta.quota.token_count` (`input_tokens + output_tokens`; gemini 0.61
/// sends no `usage`). Neither counts the agent's own side requests (gemini's
/// model-routing classifier), so neither does the session total.
fn turn_tokens(response: &PromptResponse) -> Option<u64> {
    if let Some(usage) = &response.usage {
        return Some(usage.total_tokens);
    }
    let count = response.meta.as_ref()?.get("quota")?.get("token_count")?;
    let field = |name: &str| count.get(name).and_then(Value::as_u64);
    Some(field("input_tokens")? + field("output_tokens")?)
}

/// Folds one turn's inbound traffic into events.
///
/// Text chunks stream as deltas and are also collected: the turn ends with
/// one complete message per `messageId`; when the agent sends no ids, a
/// message ends at each tool call and at the end of the turn. Thoughts become one `thinking`
/// activity per run of thought chunks. Tool calls are activities when they
/// start and when they complete or fail. `usage_update` is context
/// occupancy (`used`/`size`), not a token total, so it yields nothing; a
/// total only comes from `PromptResponse.usage`.
pub struct TurnMapper {
    session_id: String,
    message: String,
    message_id: Option<String>,
    thought: String,
    /// Thoughts so far (each run of thought chunks is one activity).
    thoughts: usize,
    /// Permission rounds so far (each is one activity).
    permissions: usize,
    tool_titles: HashMap<String, String>,
    /// The session's frontend tool names, to recognise a failed call of ours.
    tools: Vec<String>,
}

/// ACP's tool kinds as activity kinds.
pub(super) fn activity_kind(kind: ToolKind) -> pb::ActivityKind {
    match kind {
        ToolKind::Execute => pb::ActivityKind::Command,
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => pb::ActivityKind::FileEdit,
        ToolKind::Read => pb::ActivityKind::FileRead,
        ToolKind::Search => pb::ActivityKind::Search,
        ToolKind::Fetch => pb::ActivityKind::Fetch,
        ToolKind::Think => pb::ActivityKind::Thinking,
        _ => pb::ActivityKind::ToolCall,
    }
}

fn activity_status(status: ToolCallStatus) -> pb::ActivityStatus {
    match status {
        ToolCallStatus::Pending => pb::ActivityStatus::Pending,
        ToolCallStatus::InProgress => pb::ActivityStatus::InProgress,
        ToolCallStatus::Completed => pb::ActivityStatus::Completed,
        ToolCallStatus::Failed => pb::ActivityStatus::Failed,
        _ => pb::ActivityStatus::Unspecified,
    }
}

/// The command of an execute call: `raw_input.command` as a string or argv.
pub(super) fn command_of(raw_input: Option<&Value>) -> String {
    match raw_input.and_then(|input| input.get("command")) {
        Some(Value::String(command)) => command.clone(),
        Some(Value::Array(argv)) => argv.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "),
        _ => String::new(),
    }
}

fn truncate(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= SUMMARY_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(SUMMARY_CHARS).collect();
    cut.push('…');
    cut
}

fn snake(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "other".into())
}

fn block_kind(block: &ContentBlock) -> &'static str {
    match block {
        ContentBlock::Text(_) => "text",
        ContentBlock::Image(_) => "image",
        ContentBlock::Audio(_) => "audio",
        ContentBlock::ResourceLink(_) => "resource_link",
        ContentBlock::Resource(_) => "resource",
        _ => "content",
    }
}

impl TurnMapper {
    pub fn new(session_id: impl Into<String>) -> Self {
        TurnMapper {
            session_id: session_id.into(),
            message: String::new(),
            message_id: None,
            thought: String::new(),
            thoughts: 0,
            permissions: 0,
            tool_titles: HashMap::new(),
            tools: Vec::new(),
        }
    }

    /// Recognise failed calls of these frontend tools (see [`AgentEvent::ToolFailed`]).
    pub fn with_tools(mut self, tools: Vec<String>) -> Self {
        self.tools = tools;
        self
    }

    /// The events one inbound item yields now.
    pub fn apply(&mut self, inbound: Inbound) -> Vec<AgentEvent> {
        match inbound {
            Inbound::Update(params) => self.update(params),
            Inbound::TextChunk { session_id, .. } if session_id != self.session_id => {
                vec![another_session(&session_id)]
            }
            Inbound::TextChunk { kind: ChunkKind::Thought, text, .. } => {
                self.thought.push_str(&text);
                Vec::new()
            }
            Inbound::TextChunk { kind: ChunkKind::Message, message_id, text, .. } => {
                let mut events = self.flush_thought();
                events.extend(self.message_text(message_id, text));
                events
            }
            Inbound::Permission { title, outcome } => {
                let mut events = self.flush_thought();
                // A permission round is a tool call too: the text before it is a message of its own.
                if self.message_id.is_none() {
                    events.extend(self.flush_message());
                }
                let refused = !outcome.starts_with("allow");
                if let (true, Some(tool)) = (refused, our_tool(&title, None, &self.tools)) {
                    let reason = format!("the agent's permission request was answered {outcome}");
                    events.push(AgentEvent::ToolFailed { tool, reason });
                }
                self.permissions += 1;
                let mut answered =
                    activity(format!("permission-{}", self.permissions), pb::ActivityKind::Permission, title);
                answered.status =
                    if refused { pb::ActivityStatus::Failed } else { pb::ActivityStatus::Completed } as i32;
                answered.output = outcome;
                events.push(AgentEvent::Activity(answered));
                events
            }
        }
    }

    fn update(&mut self, params: Value) -> Vec<AgentEvent> {
        let notification: SessionNotification = match serde_json::from_value(params.clone()) {
            Ok(n) => n,
            Err(error) => {
                // Tolerant by design: agents run ahead of the schema (unstable
                // variants, new fields); one odd update must not end a turn.
                let variant = params.pointer("/update/sessionUpdate").and_then(Value::as_str).unwrap_or("?");
                let error: String = error.to_string().chars().take(100).collect();
                return vec![AgentEvent::Skipped {
                    reason: format!("session/update {variant} not understood: {error}"),
                }];
            }
        };
        if notification.session_id.0.as_ref() != self.session_id {
            return vec![another_session(&notification.session_id.0)];
        }
        let mut events = Vec::new();
        if !matches!(notification.update, SessionUpdate::AgentThoughtChunk(_)) {
            events.extend(self.flush_thought());
        }
        match notification.update {
            SessionUpdate::AgentMessageChunk(chunk) => events.extend(self.message_chunk(chunk)),
            SessionUpdate::AgentThoughtChunk(ContentChunk { content: ContentBlock::Text(text), .. }) => {
                self.thought.push_str(&text.text);
            }
            SessionUpdate::ToolCall(call) => {
                // Without message ids, a tool call is the only boundary an agent
                // gives: the text before it and the text after it are two
                // messages (claude-agent-acp 0.23 and codex-acp 0.16 send no ids).
                if self.message_id.is_none() {
                    events.extend(self.flush_message());
                }
                let id = call.tool_call_id.0.to_string();
                let title = if call.title.is_empty() { id.clone() } else { call.title.clone() };
                self.tool_titles.insert(id.clone(), title.clone());
                let mut started = activity(id, activity_kind(call.kind), title);
                started.status = activity_status(call.status) as i32;
                if call.kind == ToolKind::Execute {
                    started.command = command_of(call.raw_input.as_ref());
                }
                started.paths = call.locations.iter().map(|l| l.path.display().to_string()).collect();
                let content = serde_json::to_value(&call.content).unwrap_or_default();
                started.output = content_text(&content).unwrap_or_default();
                events.push(AgentEvent::Activity(started));
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.0.to_string();
                if let Some(title) = &update.fields.title {
                    self.tool_titles.insert(id.clone(), title.clone());
                }
                if let Some(ToolCallStatus::Failed) = update.fields.status {
                    let title = self.tool_titles.get(&id).cloned().unwrap_or_else(|| id.clone());
                    if let Some(tool) = our_tool(&title, update.fields.raw_input.as_ref(), &self.tools) {
                        let content = serde_json::to_value(&update.fields.content).unwrap_or_default();
                        let reason = content_text(&content).unwrap_or_else(|| "the call failed".to_owned());
                        events.push(AgentEvent::ToolFailed { tool, reason });
                    }
                }
                // Only what the update sets: Core merges it into the call.
                let fields = &update.fields;
                let mut changed = activity(id, fields.kind.map_or(pb::ActivityKind::Unspecified, activity_kind), "");
                changed.title = fields.title.clone().unwrap_or_default();
                changed.status = fields.status.map_or(pb::ActivityStatus::Unspecified, activity_status) as i32;
                if fields.kind == Some(ToolKind::Execute) {
                    changed.command = command_of(fields.raw_input.as_ref());
                }
                changed.paths = fields.locations.iter().flatten().map(|l| l.path.display().to_string()).collect();
                if let Some(content) = &fields.content {
                    let content = serde_json::to_value(content).unwrap_or_default();
                    changed.output = content_text(&content).unwrap_or_default();
                }
                events.push(AgentEvent::Activity(changed));
            }
            SessionUpdate::Plan(plan) => {
                let entries: Vec<pb::PlanEntry> = plan
                    .entries
                    .iter()
                    .map(|e| pb::PlanEntry {
                        content: e.content.clone(),
                        status: match e.status {
                            PlanEntryStatus::Completed => pb::ActivityStatus::Completed,
                            PlanEntryStatus::InProgress => pb::ActivityStatus::InProgress,
                            _ => pb::ActivityStatus::Pending,
                        } as i32,
                    })
                    .collect();
                // ACP sends the whole plan each time: one activity per turn.
                let mut current = activity("plan", pb::ActivityKind::Plan, "Plan");
                let done = entries.iter().all(|e| e.status == pb::ActivityStatus::Completed as i32);
                current.status =
                    if done { pb::ActivityStatus::Completed } else { pb::ActivityStatus::InProgress } as i32;
                current.plan = entries;
                events.push(AgentEvent::Activity(current));
            }
            // Context occupancy, not a cumulative total: never a usage figure.
            SessionUpdate::UsageUpdate(_) => {}
            // Echoes of the prompt, command lists, modes, titles: nothing the
            // session reports.
            _ => {}
        }
        events
    }

    fn message_chunk(&mut self, chunk: ContentChunk) -> Vec<AgentEvent> {
        let id = chunk.message_id.map(|id| id.0.to_string());
        let ContentBlock::Text(text) = chunk.content else {
            let mut events = self.next_message(id);
            events.push(AgentEvent::Notice {
                message: format!(
                    "the agent sent content of type {}; only text reaches the chat",
                    block_kind(&chunk.content)
                ),
            });
            return events;
        };
        self.message_text(id, text.text)
    }

    /// Text of message `id` (`None`: the agent gives no ids).
    fn message_text(&mut self, id: Option<String>, text: String) -> Vec<AgentEvent> {
        let mut events = self.next_message(id);
        if !text.is_empty() {
            self.message.push_str(&text);
            events.push(AgentEvent::Delta { text });
        }
        events
    }

    /// A chunk of another message id ends the message before it.
    fn next_message(&mut self, id: Option<String>) -> Vec<AgentEvent> {
        if id.is_some() && id != self.message_id {
            self.message_id = id;
            return self.flush_message();
        }
        Vec::new()
    }

    fn flush_thought(&mut self) -> Vec<AgentEvent> {
        let thought = std::mem::take(&mut self.thought);
        if thought.trim().is_empty() {
            return Vec::new();
        }
        self.thoughts += 1;
        let mut thinking = activity(format!("thought-{}", self.thoughts), pb::ActivityKind::Thinking, "Thinking");
        thinking.output = truncate(&thought);
        vec![AgentEvent::Activity(thinking)]
    }

    fn flush_message(&mut self) -> Vec<AgentEvent> {
        let text = std::mem::take(&mut self.message);
        if text.is_empty() { Vec::new() } else { vec![AgentEvent::Message { text }] }
    }

    /// The events the prompt's response ends the turn with. `prior_total` is
    /// the session's token total before this turn: ACP's `usage` counts one
    /// turn, and the session reports a cumulative total.
    pub fn finish(&mut self, response: &PromptResponse, prior_total: Option<u64>) -> Vec<AgentEvent> {
        let mut events = self.flush_thought();
        events.extend(self.flush_message());
        if let Some(turn_total) = turn_tokens(response) {
            events.push(AgentEvent::Usage { total_tokens: prior_total.unwrap_or(0) + turn_total });
        }
        let stop = snake(&response.stop_reason);
        match response.stop_reason {
            StopReason::EndTurn => events.push(AgentEvent::TurnDone),
            StopReason::MaxTokens | StopReason::MaxTurnRequests => {
                // What was said stands; the agent just stopped early.
                events.push(AgentEvent::Notice { message: format!("the agent stopped early ({stop})") });
                events.push(AgentEvent::TurnDone);
            }
            StopReason::Refusal => {
                events.push(AgentEvent::Failed { message: "the agent refused to continue the turn".into() })
            }
            StopReason::Cancelled => events.push(AgentEvent::Failed { message: "the turn was cancelled".into() }),
            _ => events.push(AgentEvent::Failed { message: format!("the agent stopped: {stop}") }),
        }
        events
    }
}

/// The MCP server a tool call's raw input names (codex-acp: `server_name`).
pub fn raw_server(raw: &serde_json::Value) -> Option<&str> {
    raw.get("server_name").or_else(|| raw.get("server")).and_then(|s| s.as_str())
}

/// The manifest name of the frontend tool a tool call's title (or raw input)
/// names, in any of the spellings `PermissionPolicy::is_frontend_tool` accepts, if it is one of
/// `tools`.
pub fn our_tool(title: &str, raw_input: Option<&serde_json::Value>, tools: &[String]) -> Option<String> {
    let known = |name: &str| tools.iter().find(|t| t.as_str() == name).cloned();
    if let Some(raw) = raw_input
        && raw_server(raw) == Some(MCP_SERVER_NAME)
        && let Some(name) = raw.get("tool_name").or_else(|| raw.get("tool")).and_then(|t| t.as_str())
    {
        return known(name);
    }
    let title = title.strip_prefix("Tool: ").unwrap_or(title);
    let spelled = title
        .strip_prefix(&format!("mcp__{MCP_SERVER_NAME}__"))
        .or_else(|| title.strip_prefix(&format!("{MCP_SERVER_NAME}/")))
        .or_else(|| title.strip_suffix(&format!(" ({MCP_SERVER_NAME} MCP Server)")))
        .unwrap_or(title);
    known(spelled.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(update: Value) -> Inbound {
        Inbound::Update(json!({ "sessionId": "sess_1", "update": update }))
    }

    fn run(inbound: Vec<Inbound>, response: Value, prior: Option<u64>) -> Vec<AgentEvent> {
        let mut mapper = TurnMapper::new("sess_1");
        let mut events: Vec<AgentEvent> = inbound.into_iter().flat_map(|i| mapper.apply(i)).collect();
        let response: PromptResponse = serde_json::from_value(response).expect("a PromptResponse");
        events.extend(mapper.finish(&response, prior));
        events
    }

    /// The borrowing reading of text chunks and the full one give the same
    /// events, and what the borrowing one does not take goes to the full one.
    #[test]
    fn text_chunks_read_alike_both_ways() {
        let line = |update: Value| {
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "sess_1", "update": update}})
                .to_string()
        };
        let text = |t: &str| json!({"type": "text", "text": t});
        let lines = [
            line(json!({"sessionUpdate": "agent_thought_chunk", "content": text("thinking")})),
            line(json!({"sessionUpdate": "agent_message_chunk", "content": text("plain, ")})),
            line(json!({"sessionUpdate": "agent_thought_chunk", "messageId": "t1", "content": text("more ")})),
            line(json!({"sessionUpdate": "agent_thought_chunk", "content": text("thought")})),
            line(json!({"sessionUpdate": "agent_message_chunk", "content": text("esc\"aped \u{e9}\n")})),
            line(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m1", "content": text("one")})),
            line(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m2", "_meta": {"x": 1},
                        "content": {"type": "text", "text": "two", "annotations": {"priority": 0.5}}})),
            line(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m2", "content": text("")})),
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "sess_other",
                   "update": {"sessionUpdate": "agent_message_chunk", "content": text("not ours")}}})
            .to_string(),
        ];
        let fast: Vec<Inbound> = lines.iter().filter_map(|l| read_text_chunk(l)).collect();
        assert_eq!(fast.len(), lines.len(), "every text chunk reads the borrowing way");
        let full = |l: &String| {
            let mut message: Value = serde_json::from_str(l).unwrap();
            Inbound::Update(message["params"].take())
        };
        let events = |inbound: Vec<Inbound>| {
            let mut mapper = TurnMapper::new("sess_1");
            let mut events: Vec<AgentEvent> = inbound.into_iter().flat_map(|i| mapper.apply(i)).collect();
            events.extend(mapper.finish(&PromptResponse::new(StopReason::EndTurn), None));
            events
        };
        let mixed = lines.iter().map(|l| read_text_chunk(l).unwrap_or_else(|| full(l))).collect();
        let slow = lines.iter().map(full).collect();
        let (mixed, slow) = (events(mixed), events(slow));
        assert_eq!(serde_json::to_value(&mixed).unwrap(), serde_json::to_value(&slow).unwrap());
        assert!(mixed.iter().any(|e| matches!(e, AgentEvent::Delta { text } if text == "esc\"aped é\n")), "{mixed:?}");
        let thinking = |e: &AgentEvent| matches!(e, AgentEvent::Activity(a) if a.output == "more thought");
        assert!(mixed.iter().any(thinking), "thought chunks join into one activity: {mixed:?}");
        // Non-text blocks, other field types and other updates are not taken.
        for other in [
            line(
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "data": "AA", "mimeType": "image/png"}}),
            ),
            line(json!({"sessionUpdate": "agent_message_chunk", "messageId": 7, "content": text("x")})),
            line(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 5}})),
            line(json!({"sessionUpdate": "user_message_chunk", "content": text("x")})),
            line(
                json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "image", "data": "AA", "mimeType": "image/png"}}),
            ),
        ] {
            assert_eq!(read_text_chunk(&other), None, "{other}");
        }
    }

    /// A turn as claude-agent-acp / gemini send it: thoughts, a plan, an MCP
    /// tool call with a permission round, progress, text chunks, context
    /// occupancy and a token total in the response.
    #[test]
    fn a_recorded_tool_turn() {
        let events = run(
            vec![
                update(json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "add 2"}})),
                update(
                    json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "The user wants "}}),
                ),
                update(
                    json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "the counter bumped."}}),
                ),
                update(json!({"sessionUpdate": "plan", "entries": [
                    {"content": "Call update_counter", "priority": "high", "status": "in_progress"},
                    {"content": "Report the value", "priority": "medium", "status": "pending"}
                ]})),
                update(
                    json!({"sessionUpdate": "tool_call", "toolCallId": "toolu_1", "title": "mcp__pedelec__update_counter",
                    "kind": "other", "status": "pending", "rawInput": {"delta": 2}}),
                ),
                Inbound::Permission { title: "mcp__pedelec__update_counter".into(), outcome: "allow_once".into() },
                update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "toolu_1", "status": "in_progress"})),
                update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "toolu_1", "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "{\"value\":2}"}}]})),
                update(json!({"sessionUpdate": "usage_update", "used": 53000, "size": 200000,
                    "cost": {"amount": 0.01, "currency": "USD"}})),
                update(
                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "The counter "}}),
                ),
                update(
                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "is now 2."}}),
                ),
                update(json!({"sessionUpdate": "available_commands_update", "availableCommands": []})),
            ],
            json!({"stopReason": "end_turn", "usage": {"totalTokens": 1200, "inputTokens": 1000, "outputTokens": 200}}),
            Some(300),
        );
        insta::assert_json_snapshot!(events);
    }

    /// Cursor-style: no usage anywhere, messages with ids, an image block,
    /// a failed edit, an unknown (future) update variant and a stray
    /// update for another session.
    #[test]
    fn message_ids_split_messages_and_odd_updates_are_skipped() {
        let events = run(
            vec![
                update(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m1",
                    "content": {"type": "text", "text": "Editing."}})),
                update(json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit src/lib.rs",
                    "kind": "edit", "status": "in_progress", "locations": [{"path": "/ws/src/lib.rs"}]})),
                update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"})),
                update(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m2",
                    "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"}})),
                update(json!({"sessionUpdate": "agent_message_chunk", "messageId": "m2",
                    "content": {"type": "text", "text": "The edit failed."}})),
                update(json!({"sessionUpdate": "subagent_teleport", "where": "mars"})),
                Inbound::Update(json!({"sessionId": "sess_other", "update":
                    {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "not ours"}}})),
                update(json!({"sessionUpdate": "usage_update", "used": 10, "size": 100})),
            ],
            json!({"stopReason": "end_turn"}),
            None,
        );
        insta::assert_json_snapshot!(events);
    }

    /// claude-agent-acp / codex-acp style: no message ids, text on both sides of a tool call.
    #[test]
    fn without_ids_a_tool_call_ends_a_message() {
        let text =
            |t: &str| update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": t}}));
        let events = run(
            vec![
                text("I'll update "),
                text("the counter."),
                update(
                    json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Tool: pedelec/update_counter",
                    "kind": "other", "status": "pending"}),
                ),
                update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"})),
                text("Counter is now 2"),
            ],
            json!({"stopReason": "end_turn"}),
            None,
        );
        let messages: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Message { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(messages, ["I'll update the counter.", "Counter is now 2"]);
    }

    #[test]
    fn failed_calls_of_our_tools_are_reported() {
        let inbound = vec![
            update(json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Tool: pedelec/update_counter",
                "kind": "other", "status": "pending"})),
            update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed",
                "content": [{"type": "content", "content": {"type": "text", "text": "MCP client closed"}}]})),
            update(json!({"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "rm -rf /", "kind": "execute"})),
            update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "failed"})),
            Inbound::Permission { title: "mcp__pedelec__update_counter".into(), outcome: "reject_once".into() },
            Inbound::Permission { title: "mcp__pedelec__update_counter".into(), outcome: "allow_once".into() },
        ];
        let mut mapper = TurnMapper::new("sess_1").with_tools(vec!["update_counter".into()]);
        let failed: Vec<AgentEvent> = inbound
            .into_iter()
            .flat_map(|i| mapper.apply(i))
            .filter(|e| matches!(e, AgentEvent::ToolFailed { .. }))
            .collect();
        assert_eq!(
            failed,
            [
                AgentEvent::ToolFailed { tool: "update_counter".into(), reason: "MCP client closed".into() },
                AgentEvent::ToolFailed {
                    tool: "update_counter".into(),
                    reason: "the agent's permission request was answered reject_once".into()
                },
            ]
        );
    }

    #[test]
    fn stop_reasons() {
        let stop =
            |reason: &str| run(vec![], json!({ "stopReason": reason }), None).last().cloned().expect("an ending event");
        assert_eq!(stop("end_turn"), AgentEvent::TurnDone);
        assert_eq!(stop("max_tokens"), AgentEvent::TurnDone);
        assert_eq!(stop("cancelled"), AgentEvent::Failed { message: "the turn was cancelled".into() });
        assert!(matches!(stop("refusal"), AgentEvent::Failed { .. }));
    }

    #[test]
    fn usage_accumulates_over_turns_and_occupancy_is_never_usage() {
        let events = run(
            vec![update(json!({"sessionUpdate": "usage_update", "used": 999, "size": 1000}))],
            json!({"stopReason": "end_turn"}),
            Some(10),
        );
        assert!(!events.iter().any(|e| matches!(e, AgentEvent::Usage { .. })), "{events:?}");
        let events = run(
            vec![],
            json!({"stopReason": "end_turn", "usage": {"totalTokens": 5, "inputTokens": 4, "outputTokens": 1}}),
            Some(10),
        );
        assert!(events.contains(&AgentEvent::Usage { total_tokens: 15 }));
    }

    #[test]
    fn gemini_reports_turn_tokens_in_meta() {
        let response = json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count":
            {"input_tokens": 100, "output_tokens": 10}, "model_usage": []}}});
        let events = run(vec![], response, Some(55));
        assert!(events.contains(&AgentEvent::Usage { total_tokens: 165 }), "{events:?}");
        let odd = json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": "many"}}}});
        assert!(!run(vec![], odd, None).iter().any(|e| matches!(e, AgentEvent::Usage { .. })));
    }

    #[test]
    fn long_thoughts_are_truncated() {
        let long = "x".repeat(1000);
        let events = run(
            vec![update(json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": long}}))],
            json!({"stopReason": "end_turn"}),
            None,
        );
        let AgentEvent::Activity(thinking) = &events[0] else { panic!("{events:?}") };
        assert_eq!(thinking.kind, pb::ActivityKind::Thinking as i32);
        assert_eq!(thinking.output.chars().count(), SUMMARY_CHARS + 1);
    }
}
