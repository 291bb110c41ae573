//! codex `app-server`'s JSON-RPC lines, sans IO: a line in, a message out;
//! a turn's notifications in, normalised events out. Shapes are those of the
//! schema codex 0.171 generates (`codex app-server generate-json-schema`);
//! fields are read tolerantly (a missing one is empty), so a newer codex
//! that adds fields or item types still maps what it shares with 0.171.

use pedelec_protocol::pb;
use serde_json::{Value, json};

use crate::providers::cli_turn::{self, LineParser, str_field as text};
use crate::providers::{AgentEvent, MCP_SERVER_NAME};

/// A JSON-RPC error object (`{code, message, data}`).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

/// One line from the app-server.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The answer to one of our requests.
    Response {
        id: i64,
        outcome: Result<Value, RpcError>,
    },
    /// A request of the server's (approvals): it waits for our answer.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// Not a JSON-RPC message we can read; skipped.
    Invalid(String),
}

/// Reads one line. codex omits `"jsonrpc"`, so it is not required.
pub fn parse_line(line: &str) -> Incoming {
    let mut value: Value = match serde_json::from_str(line) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => return Incoming::Invalid("not a JSON object".into()),
        Err(e) => return Incoming::Invalid(format!("not JSON ({e})")),
    };
    let object = value.as_object_mut().expect("matched an object");
    let method = object.get("method").and_then(Value::as_str).map(str::to_owned);
    let params = object.remove("params").unwrap_or(Value::Null);
    match (method, object.remove("id")) {
        (Some(method), Some(id)) if !id.is_null() => Incoming::Request { id, method, params },
        (Some(method), _) => Incoming::Notification { method, params },
        (None, Some(id)) => {
            let Some(id) = id.as_i64() else { return Incoming::Invalid(format!("a response to an id not ours: {id}")) };
            let outcome = match (object.remove("result"), object.remove("error")) {
                (_, Some(error)) if !error.is_null() => Err(RpcError {
                    code: error.get("code").and_then(Value::as_i64).unwrap_or_default(),
                    message: text(&error, "message"),
                }),
                (result, _) => Ok(result.unwrap_or(Value::Null)),
            };
            Incoming::Response { id, outcome }
        }
        (None, None) => Incoming::Invalid("neither a request, a response nor a notification".into()),
    }
}

/// A request line of ours.
pub fn request(id: i64, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

/// A notification line of ours.
pub fn notification(method: &str) -> String {
    json!({ "jsonrpc": "2.0", "method": method }).to_string()
}

/// Our answer to a server request.
pub fn response(id: &Value, result: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
}

/// Our refusal of a server request we do not serve.
pub fn error_response(id: &Value, code: i64, message: &str) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } }).to_string()
}

/// How a turn ended (`turn/completed`'s `turn.status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    Completed,
    /// Ended by `turn/interrupt` (ours, or another client's).
    Interrupted,
    Failed(String),
}

/// A turn's notifications → events. Notifications of another thread, or of
/// another turn once this one's id is known, are not this turn's.
#[derive(Debug, Default)]
pub struct TurnMapper {
    thread_id: Option<String>,
    turn_id: Option<String>,
    /// The last `error` notification's message: a failed turn without an
    /// error of its own reports it.
    last_error: Option<String>,
    /// Set by `turn/completed`.
    pub ended: Option<TurnEnd>,
}

fn clip(text: &str) -> String {
    cli_turn::clip(text, 300)
}

fn item_status(status: &str, completed: bool) -> pb::ActivityStatus {
    match status {
        "completed" => pb::ActivityStatus::Completed,
        "failed" | "declined" => pb::ActivityStatus::Failed,
        "inProgress" => pb::ActivityStatus::InProgress,
        _ if completed => pb::ActivityStatus::Completed,
        _ => pb::ActivityStatus::InProgress,
    }
}

/// The strings of an array field, e.g. a reasoning item's `summary`.
fn strings(value: &Value, key: &str) -> Vec<String> {
    let items = value.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
}

impl TurnMapper {
    /// A mapper for the turns of `thread_id`; `None` takes every thread's
    /// (recorded transcripts).
    pub fn new(thread_id: Option<String>) -> Self {
        TurnMapper { thread_id, ..TurnMapper::default() }
    }

    /// The turn this mapper serves, once `turn/start` answered.
    pub fn serve_turn(&mut self, turn_id: &str) {
        self.turn_id = Some(turn_id.to_owned());
    }

    fn ours(&self, params: &Value) -> bool {
        let field = |key: &str| params.get(key).and_then(Value::as_str);
        let thread_ok = match (&self.thread_id, field("threadId")) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => true,
        };
        let turn = field("turnId").or_else(|| params.pointer("/turn/id").and_then(Value::as_str));
        let turn_ok = match (&self.turn_id, turn) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => true,
        };
        thread_ok && turn_ok
    }

    pub fn notification(&mut self, method: &str, params: &Value) -> Vec<AgentEvent> {
        if !self.ours(params) {
            return Vec::new();
        }
        match method {
            "item/agentMessage/delta" => {
                let delta = text(params, "delta");
                if delta.is_empty() { Vec::new() } else { vec![AgentEvent::Delta { text: delta }] }
            }
            "item/started" | "item/completed" => match params.get("item") {
                Some(item) => self.item(method == "item/completed", item),
                None => vec![AgentEvent::Skipped { reason: format!("{method} without an item") }],
            },
            "turn/plan/updated" => vec![AgentEvent::Activity(plan(params))],
            // Without our MCP server the session's tools are missing: the transcript says why.
            "mcpServer/startupStatus/updated"
                if text(params, "name") == MCP_SERVER_NAME && text(params, "status") == "failed" =>
            {
                let why = params.pointer("/error").map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned));
                vec![AgentEvent::Activity(crate::providers::note(format!(
                    "codex could not start the {MCP_SERVER_NAME} MCP server: {}",
                    why.unwrap_or_default()
                )))]
            }
            "warning" | "configWarning" | "deprecationNotice" => {
                let message = [text(params, "message"), text(params, "summary")].concat();
                vec![AgentEvent::Notice { message }]
            }
            "thread/tokenUsage/updated" => {
                // The thread's running total, as `exec`'s `turn.completed` reported it.
                let total = params.pointer("/tokenUsage/total");
                let count = |key: &str| total.and_then(|t| t.get(key)).and_then(Value::as_u64);
                match (count("inputTokens"), count("outputTokens")) {
                    (Some(input), Some(output)) => vec![AgentEvent::Usage { total_tokens: input + output }],
                    _ => Vec::new(),
                }
            }
            "error" => {
                let message = params.pointer("/error/message").and_then(Value::as_str).unwrap_or_default().to_owned();
                let retrying = params.get("willRetry").and_then(Value::as_bool).unwrap_or(false);
                if !retrying {
                    self.last_error = Some(message.clone());
                }
                vec![AgentEvent::Notice { message }]
            }
            "turn/completed" => {
                let turn = params.get("turn").cloned().unwrap_or(Value::Null);
                let end = match text(&turn, "status").as_str() {
                    "completed" => TurnEnd::Completed,
                    "interrupted" => TurnEnd::Interrupted,
                    status => {
                        let own = turn.pointer("/error/message").and_then(Value::as_str).filter(|m| !m.is_empty());
                        let message = own.map(str::to_owned).or(self.last_error.take());
                        TurnEnd::Failed(message.unwrap_or_else(|| format!("the turn ended {status:?}")))
                    }
                };
                let events = match &end {
                    TurnEnd::Completed => vec![AgentEvent::TurnDone],
                    TurnEnd::Interrupted => Vec::new(),
                    TurnEnd::Failed(message) => vec![AgentEvent::Failed { message: message.clone() }],
                };
                self.ended = Some(end);
                events
            }
            _ => Vec::new(),
        }
    }

    fn item(&self, completed: bool, item: &Value) -> Vec<AgentEvent> {
        use pb::ActivityKind as K;
        let kind = text(item, "type");
        let status = item_status(&text(item, "status"), completed);
        let id = text(item, "id");
        let activity = |kind: K, title: String| {
            let mut a = crate::providers::activity(id.clone(), kind, title);
            a.status = status as i32;
            a
        };
        match kind.as_str() {
            "agentMessage" if completed => vec![AgentEvent::Message { text: text(item, "text") }],
            "reasoning" if completed => {
                let said: Vec<String> = [strings(item, "summary"), strings(item, "content")].concat();
                if said.is_empty() {
                    return Vec::new();
                }
                let mut thinking = activity(K::Thinking, "Thinking".into());
                thinking.status = 0;
                thinking.output = said.join("\n\n");
                vec![AgentEvent::Activity(thinking)]
            }
            "commandExecution" => {
                let command_line = text(item, "command");
                let mut command = activity(K::Command, clip(&command_line));
                command.command = command_line;
                command.output = text(item, "aggregatedOutput");
                if item.get("exitCode").and_then(Value::as_i64).is_some_and(|code| code != 0) {
                    command.status = pb::ActivityStatus::Failed as i32;
                }
                vec![AgentEvent::Activity(command)]
            }
            "mcpToolCall" => {
                let error = item.pointer("/error/message").and_then(Value::as_str);
                let mut call = activity(K::ToolCall, format!("{}.{}", text(item, "server"), text(item, "tool")));
                if let Some(error) = error {
                    call.status = pb::ActivityStatus::Failed as i32;
                    call.output = error.to_owned();
                } else if let Some(content) = item.pointer("/result/content").filter(|c| !c.is_null()) {
                    call.output =
                        crate::providers::events::content_text(content).unwrap_or_else(|| content.to_string());
                }
                let ours = text(item, "server") == MCP_SERVER_NAME;
                let mut events = Vec::new();
                // codex reports the call before it makes it: the fence in
                // Core holds the bridged call until this arrives.
                if ours && !completed {
                    events.push(AgentEvent::ToolCalling { tool: text(item, "tool") });
                }
                events.push(AgentEvent::Activity(call));
                // A call of ours codex failed itself (e.g. "requires approval"):
                // an error our MCP server answered is in `result`, not `error`.
                if let (true, true, Some(reason)) = (completed, ours, error) {
                    events.push(AgentEvent::ToolFailed { tool: text(item, "tool"), reason: reason.to_owned() });
                }
                events
            }
            "fileChange" => {
                let changes = item.get("changes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
                let mut edit = activity(K::FileEdit, "File changes".into());
                edit.paths = changes.iter().map(|c| text(c, "path")).collect();
                edit.output = changes
                    .iter()
                    .map(|c| {
                        format!(
                            "{} {}",
                            c.pointer("/kind/type").and_then(Value::as_str).unwrap_or("?"),
                            text(c, "path")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                vec![AgentEvent::Activity(edit)]
            }
            "webSearch" => vec![AgentEvent::Activity(activity(K::Search, clip(&text(item, "query"))))],
            _ => Vec::new(),
        }
    }
}

/// `turn/plan/updated` as the turn's plan activity (one per turn, updated in place).
fn plan(params: &Value) -> pb::Activity {
    let steps = params.get("plan").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut plan =
        crate::providers::activity(format!("plan-{}", text(params, "turnId")), pb::ActivityKind::Plan, "Plan");
    plan.status = pb::ActivityStatus::InProgress as i32;
    plan.output = text(params, "explanation");
    plan.plan = steps
        .iter()
        .map(|step| pb::PlanEntry {
            content: text(step, "step"),
            status: match text(step, "status").as_str() {
                "completed" => pb::ActivityStatus::Completed,
                "inProgress" => pb::ActivityStatus::InProgress,
                _ => pb::ActivityStatus::Pending,
            } as i32,
        })
        .collect();
    plan
}

/// A recorded app-server transcript (the server's lines) read as a turn's
/// events, for transcript tests and the parser benchmark: every thread and
/// turn is taken; requests and responses are not turn content.
#[derive(Default)]
pub struct TranscriptParser {
    mapper: TurnMapper,
}

impl LineParser for TranscriptParser {
    fn line(&mut self, line: &str) -> Vec<AgentEvent> {
        match parse_line(line) {
            Incoming::Notification { method, params } => self.mapper.notification(&method, &params),
            Incoming::Invalid(why) => vec![cli_turn::skipped(line, why)],
            Incoming::Request { .. } | Incoming::Response { .. } => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_told_apart() {
        assert_eq!(
            parse_line(r#"{"id":3,"result":{"turn":{"id":"t"}}}"#),
            Incoming::Response { id: 3, outcome: Ok(json!({"turn": {"id": "t"}})) }
        );
        assert_eq!(
            parse_line(r#"{"id":4,"error":{"code":-32600,"message":"no such thread"}}"#),
            Incoming::Response { id: 4, outcome: Err(RpcError { code: -32600, message: "no such thread".into() }) }
        );
        assert_eq!(
            parse_line(r#"{"method":"item/commandExecution/requestApproval","id":0,"params":{"itemId":"c"}}"#),
            Incoming::Request {
                id: json!(0),
                method: "item/commandExecution/requestApproval".into(),
                params: json!({"itemId": "c"})
            }
        );
        assert_eq!(
            parse_line(r#"{"method":"turn/started","params":{"threadId":"a"}}"#),
            Incoming::Notification { method: "turn/started".into(), params: json!({"threadId": "a"}) }
        );
        for odd in ["[1]", "nope", r#"{"id":"x","result":{}}"#, r#"{"result":{}}"#] {
            assert!(matches!(parse_line(odd), Incoming::Invalid(_)), "{odd}");
        }
    }

    #[test]
    fn another_turns_notifications_are_not_this_turns() {
        let mut mapper = TurnMapper::new(Some("th".into()));
        mapper.serve_turn("t2");
        let delta = |thread: &str, turn: &str| json!({"threadId": thread, "turnId": turn, "itemId": "m", "delta": "x"});
        assert!(mapper.notification("item/agentMessage/delta", &delta("th", "t1")).is_empty());
        assert!(mapper.notification("item/agentMessage/delta", &delta("other", "t2")).is_empty());
        assert_eq!(
            mapper.notification("item/agentMessage/delta", &delta("th", "t2")),
            [AgentEvent::Delta { text: "x".into() }]
        );
        let stale = json!({"threadId": "th", "turn": {"id": "t1", "status": "completed"}});
        assert!(mapper.notification("turn/completed", &stale).is_empty());
        assert_eq!(mapper.ended, None);
    }

    #[test]
    fn our_mcp_server_failing_to_start_is_a_note() {
        let mut mapper = TurnMapper::default();
        let failed = json!({"threadId": "th", "name": "pedelec", "status": "failed", "error": "spawn failed"});
        let events = mapper.notification("mcpServer/startupStatus/updated", &failed);
        let [AgentEvent::Activity(note)] = events.as_slice() else { panic!("one note") };
        assert_eq!(note.title, "codex could not start the pedelec MCP server: spawn failed");
        let theirs = json!({"threadId": "th", "name": "github", "status": "failed", "error": "x"});
        assert!(mapper.notification("mcpServer/startupStatus/updated", &theirs).is_empty());
        let ready = json!({"threadId": "th", "name": "pedelec", "status": "ready", "error": null});
        assert!(mapper.notification("mcpServer/startupStatus/updated", &ready).is_empty());
    }

    #[test]
    fn a_failed_turn_says_why() {
        let mut mapper = TurnMapper::default();
        mapper.notification("error", &json!({"error": {"message": "retrying"}, "willRetry": true}));
        mapper.notification("error", &json!({"error": {"message": "the model refused"}, "willRetry": false}));
        let events =
            mapper.notification("turn/completed", &json!({"turn": {"id": "t", "status": "failed", "error": null}}));
        assert_eq!(events, [AgentEvent::Failed { message: "the model refused".into() }]);
        let events = mapper.notification(
            "turn/completed",
            &json!({"turn": {"id": "t", "status": "failed", "error": {"message": "its own"}}}),
        );
        assert_eq!(events, [AgentEvent::Failed { message: "its own".into() }]);
        assert!(mapper.notification("turn/completed", &json!({"turn": {"status": "interrupted"}})).is_empty());
        assert_eq!(mapper.ended, Some(TurnEnd::Interrupted));
    }
}
