//! A vendor API of our own: the model server the real agents talk to in tests.
//!
//! Real agent programs (codex, claude, their ACP adapters, opencode, gemini)
//! need a model behind them; the vendor's API is the one network edge we do
//! not cross in tests. This server stands in for it on 127.0.0.1 and speaks,
//! with streaming SSE framed as the vendors frame it:
//!
//! | path | API |
//! | --- | --- |
//! | `POST …/responses` | OpenAI Responses (codex) |
//! | `POST …/chat/completions` | OpenAI Chat Completions (opencode, `openai` provider) |
//! | `POST …/messages` | Anthropic Messages (claude, claude-agent-acp) |
//! | `POST …/messages/count_tokens` | Anthropic token counting |
//! | `POST …/models/{model}:streamGenerateContent` | Gemini |
//! | `GET …/models` | a model list in the OpenAI shape |
//!
//! Any other path is recorded and answered 404, so a test sees what an agent
//! asked for without the server guessing.
//!
//! Each request is normalised into a [`ModelRequest`] (tools offered, tool
//! results carried, the last user text, history length) and handed to the
//! test's [`Script`], which returns an [`Answer`]: text (streamed as several
//! deltas), a tool call, an HTTP error, or a stream cut half-way. Every
//! request is recorded with the time it arrived and the time its answer was
//! sent, so a test asserts what the agent sent and measures the round trips
//! the agent made.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};

/// Which vendor API a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Responses,
    ChatCompletions,
    Messages,
    CountTokens,
    Gemini,
    Models,
    Unknown,
}

impl Api {
    fn of(method: &hyper::Method, path: &str) -> Api {
        if method == hyper::Method::GET && path.ends_with("/models") {
            return Api::Models;
        }
        if method != hyper::Method::POST {
            return Api::Unknown;
        }
        if path.ends_with("/responses") {
            Api::Responses
        } else if path.ends_with("/chat/completions") {
            Api::ChatCompletions
        } else if path.ends_with("/messages/count_tokens") {
            Api::CountTokens
        } else if path.ends_with("/messages") {
            Api::Messages
        } else if path.contains(":streamGenerateContent") || path.contains(":generateContent") {
            Api::Gemini
        } else {
            Api::Unknown
        }
    }

    /// A request a model answers (as opposed to start-up chatter).
    pub fn is_generation(self) -> bool {
        matches!(self, Api::Responses | Api::ChatCompletions | Api::Messages | Api::Gemini)
    }
}

/// One request as the agent sent it, and what the server made of it.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub api: Api,
    pub path: String,
    pub body: Value,
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

impl ModelRequest {
    /// Tool names the agent offered the model.
    pub fn tool_names(&self) -> Vec<String> {
        let tools = self.tool_definitions();
        let mut names = Vec::new();
        for tool in &tools {
            // Responses API namespaces (codex groups each MCP server's tools in one): `ns__tool`.
            if tool.get("type").and_then(Value::as_str) == Some("namespace") {
                let ns = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                for inner in tool.get("tools").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(name) = inner.get("name").and_then(Value::as_str) {
                        names.push(format!("{ns}__{name}"));
                    }
                }
            } else if let Some(name) = tool.get("name").and_then(Value::as_str) {
                names.push(name.to_owned());
            } else if let Some(name) = tool.pointer("/function/name").and_then(Value::as_str) {
                names.push(name.to_owned());
            } else if let Some(decls) = tool.get("functionDeclarations").and_then(Value::as_array) {
                names.extend(decls.iter().filter_map(|d| d.get("name").and_then(Value::as_str)).map(str::to_owned));
            }
        }
        names
    }

    /// Every tool definition the model can call now: the request's `tools`, and
    /// (Responses API) the tools earlier `tool_search` calls loaded, which
    /// codex sends back as `tool_search_output` items in `input`.
    fn tool_definitions(&self) -> Vec<Value> {
        let mut tools = self.body.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
        for item in self.body.get("input").and_then(Value::as_array).into_iter().flatten() {
            if item.get("type").and_then(Value::as_str) == Some("tool_search_output") {
                tools.extend(item.get("tools").and_then(Value::as_array).into_iter().flatten().cloned());
            }
        }
        tools
    }

    /// Whether the offered tool `name` has the parameter `parameter`.
    pub fn tool_takes(&self, name: &str, parameter: &str) -> bool {
        self.tool_definitions().iter().any(|t| {
            t.get("name").and_then(Value::as_str) == Some(name)
                && t.pointer(&format!("/parameters/properties/{parameter}")).is_some()
        })
    }

    /// Whether the agent offers a client-side `tool_search` (codex defers MCP tools behind it).
    pub fn offers_tool_search(&self) -> bool {
        let tools = self.body.get("tools").and_then(Value::as_array);
        tools.into_iter().flatten().any(|t| t.get("type").and_then(Value::as_str) == Some("tool_search"))
    }

    /// The conversation as (role, kind, text) entries: role `user`/`assistant`/
    /// `system`, kind `text`, `tool_call` or `tool_result`.
    pub fn history(&self) -> Vec<(String, &'static str, String)> {
        let mut out = Vec::new();
        match self.api {
            Api::Responses => {
                for item in self.body.get("input").and_then(Value::as_array).into_iter().flatten() {
                    match item.get("type").and_then(Value::as_str).unwrap_or("message") {
                        "message" => {
                            let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                            out.push((role.to_owned(), "text", text_of(&item["content"])));
                        }
                        "tool_search_call" => out.push(("assistant".into(), "tool_search", String::new())),
                        "tool_search_output" => out.push(("user".into(), "tool_search", String::new())),
                        "function_call" | "custom_tool_call" => {
                            out.push(("assistant".into(), "tool_call", item["name"].as_str().unwrap_or("").into()))
                        }
                        "function_call_output" | "custom_tool_call_output" => {
                            let output = &item["output"];
                            let text = match output {
                                Value::String(s) => s.clone(),
                                Value::Object(_) => text_of(&output["content"]),
                                other => text_of(other),
                            };
                            out.push(("user".into(), "tool_result", text));
                        }
                        _ => {}
                    }
                }
            }
            Api::ChatCompletions => {
                for m in self.body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                    let role = m["role"].as_str().unwrap_or_default();
                    if role == "tool" {
                        out.push(("user".into(), "tool_result", text_of(&m["content"])));
                        continue;
                    }
                    if m.get("tool_calls").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
                        out.push((role.into(), "tool_call", String::new()));
                    }
                    let text = text_of(&m["content"]);
                    if !text.is_empty() {
                        out.push((role.into(), "text", text));
                    }
                }
            }
            Api::Messages | Api::CountTokens => {
                for m in self.body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                    let role = m["role"].as_str().unwrap_or_default().to_owned();
                    match &m["content"] {
                        Value::String(s) => out.push((role, "text", s.clone())),
                        Value::Array(blocks) => {
                            for b in blocks {
                                match b["type"].as_str().unwrap_or_default() {
                                    "text" => out.push((role.clone(), "text", b["text"].as_str().unwrap_or("").into())),
                                    "tool_use" => {
                                        out.push((role.clone(), "tool_call", b["name"].as_str().unwrap_or("").into()))
                                    }
                                    "tool_result" => out.push((role.clone(), "tool_result", text_of(&b["content"]))),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            Api::Gemini => {
                for c in self.body.get("contents").and_then(Value::as_array).into_iter().flatten() {
                    let role = if c["role"] == "model" { "assistant" } else { "user" };
                    for p in c.get("parts").and_then(Value::as_array).into_iter().flatten() {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            out.push((role.into(), "text", t.to_owned()));
                        } else if let Some(f) = p.get("functionCall") {
                            out.push((role.into(), "tool_call", f["name"].as_str().unwrap_or("").into()));
                        } else if let Some(r) = p.get("functionResponse") {
                            out.push((role.into(), "tool_result", r["response"].to_string()));
                        }
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// The text of the last user message (not a tool result).
    pub fn last_user_text(&self) -> String {
        self.history()
            .into_iter()
            .rev()
            .find(|(role, kind, _)| role == "user" && *kind == "text")
            .map(|(_, _, text)| text)
            .unwrap_or_default()
    }

    /// The tool result this request answers: its last entry, or the last
    /// tool result followed only by system text (claude hands the model
    /// what the user steered into the turn as a system reminder beside the
    /// result). A user's text after a result is a turn of its own: an
    /// agent that stops at a refused call sends the next turn's text so.
    pub fn answered_tool_result(&self) -> Option<String> {
        let history = self.history();
        let last = history
            .iter()
            .rev()
            .filter(|(_, kind, text)| *kind != "text" || !text.is_empty())
            .find(|(role, kind, _)| !(role == "system" && *kind == "text"))?;
        (last.1 == "tool_result").then(|| last.2.clone())
    }

    /// Every tool result carried in this request.
    pub fn tool_results(&self) -> Vec<String> {
        self.history().into_iter().filter(|(_, kind, _)| *kind == "tool_result").map(|(_, _, t)| t).collect()
    }

    /// The offered tool whose name ends with `suffix` (agents prefix MCP tools with their server name).
    pub fn tool_named(&self, suffix: &str) -> Option<String> {
        self.tool_names().into_iter().find(|n| n == suffix || n.ends_with(&format!("_{suffix}")))
    }

    /// `(namespace, tool)` when `name` (as [`tool_names`](Self::tool_names) lists it) is a namespaced tool.
    fn namespace_of(&self, name: &str) -> Option<(String, String)> {
        let tools = self.tool_definitions();
        tools.iter().filter(|t| t.get("type").and_then(Value::as_str) == Some("namespace")).find_map(|t| {
            let ns = t.get("name").and_then(Value::as_str)?;
            let tool = name.strip_prefix(ns)?.strip_prefix("__")?;
            let inner = t.get("tools").and_then(Value::as_array)?;
            inner
                .iter()
                .any(|i| i.get("name").and_then(Value::as_str) == Some(tool))
                .then(|| (ns.to_owned(), tool.to_owned()))
        })
    }

    /// The JSON Schema the agent asked the answer to follow, if it asked for
    /// structured output (agents do for routing, titles and checks: Gemini's
    /// `responseJsonSchema`/`responseSchema`, OpenAI's `text.format` and
    /// `response_format`).
    pub fn json_schema(&self) -> Option<&Value> {
        let body = &self.body;
        body.pointer("/generationConfig/responseJsonSchema")
            .or_else(|| body.pointer("/generationConfig/responseSchema"))
            .or_else(|| body.pointer("/text/format/schema"))
            .or_else(|| body.pointer("/response_format/json_schema/schema"))
    }

    /// Whether the agent asked for a streamed answer (Gemini: by path).
    fn streamed(&self) -> bool {
        match self.api {
            Api::Gemini => self.path.contains(":streamGenerateContent"),
            _ => self.body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        }
    }

    /// The model the request names: its body's `model`, or for Gemini the
    /// path's `models/<model>:…`.
    pub fn model(&self) -> String {
        if self.api == Api::Gemini
            && let Some(rest) = self.path.split("models/").nth(1)
        {
            return rest.split(':').next().unwrap_or_default().to_owned();
        }
        self.body.get("model").and_then(Value::as_str).unwrap_or("pedelec-test-model").to_owned()
    }
}

/// What the model does for one request.
#[derive(Debug, Clone)]
pub enum ModelReply {
    /// Assistant text, streamed in `chunks` deltas (at least one).
    Text { text: String, chunks: usize },
    /// A call of the tool `name` (the full name the agent offered) with these
    /// arguments, after `preamble` text in the same answer when there is one.
    ToolCall { name: String, arguments: Value, preamble: Option<String> },
    /// A client-side `tool_search` for `query` (Responses API): the agent loads
    /// the matching deferred tools and asks again.
    ToolSearch { query: String },
    /// An HTTP error status with the vendor's error JSON.
    Status { status: u16, message: String },
    /// Starts streaming `text`, then drops the connection before the stream's end.
    Cut { text: String },
}

/// A reply with its token figures and an optional delay before the first byte.
#[derive(Debug, Clone)]
pub struct Answer {
    pub reply: ModelReply,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub delay: Duration,
}

impl Answer {
    pub fn text(text: impl Into<String>) -> Self {
        Answer::new(ModelReply::Text { text: text.into(), chunks: 3 })
    }

    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Answer::new(ModelReply::ToolCall { name: name.into(), arguments, preamble: None })
    }

    pub fn new(reply: ModelReply) -> Self {
        Answer { reply, input_tokens: 100, output_tokens: 10, delay: Duration::ZERO }
    }

    /// Text the model says before its tool call (no-op for other replies).
    pub fn with_preamble(mut self, text: impl Into<String>) -> Self {
        if let ModelReply::ToolCall { preamble, .. } = &mut self.reply {
            *preamble = Some(text.into());
        }
        self
    }

    pub fn usage(mut self, input: u64, output: u64) -> Self {
        self.input_tokens = input;
        self.output_tokens = output;
        self
    }

    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// The test's model: a pure function of the request.
pub type Script = Arc<dyn Fn(&ModelRequest) -> Answer + Send + Sync>;

/// One request as recorded, with when it arrived and when its answer had been written.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub request: ModelRequest,
    pub answer: Option<Answer>,
    pub received: Instant,
    /// When the answer's last byte was handed to the connection.
    pub answered: Instant,
}

/// A running model server on 127.0.0.1.
pub struct ModelServer {
    pub addr: std::net::SocketAddr,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    /// The last user text of each generation request whose body arrived,
    /// answered or not.
    arrived: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

impl ModelServer {
    pub async fn start(script: Script) -> std::io::Result<ModelServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let recorded: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let arrived: Arc<Mutex<Vec<String>>> = Arc::default();
        let (seen, counted) = (recorded.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let _ = stream.set_nodelay(true);
                let (seen, counted, script) = (seen.clone(), counted.clone(), script.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (seen, counted, script) = (seen.clone(), counted.clone(), script.clone());
                        async move { Ok::<_, Infallible>(handle(request, &script, &seen, &counted).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Ok(ModelServer { addr, recorded, arrived, task })
    }

    /// `http://127.0.0.1:PORT` (no path; agents add their own `/v1`).
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }

    /// The last user text of each generation request that arrived so far,
    /// including those still being answered (a `slow` one, say).
    pub fn arrived_user_texts(&self) -> Vec<String> {
        self.arrived.lock().unwrap().clone()
    }

    /// Generation requests only (no model lists, token counts or unknown paths).
    pub fn generations(&self) -> Vec<Recorded> {
        self.recorded().into_iter().filter(|r| r.request.api.is_generation()).collect()
    }
}

async fn handle(
    request: hyper::Request<hyper::body::Incoming>,
    script: &Script,
    seen: &Mutex<Vec<Recorded>>,
    arrived: &Mutex<Vec<String>>,
) -> hyper::Response<Body> {
    let received = Instant::now();
    let api = Api::of(request.method(), request.uri().path());
    let path = request.uri().path().to_owned();
    let bytes = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return plain(400, "unreadable body".into()),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let request = ModelRequest { api, path, body };
    if api.is_generation() {
        arrived.lock().unwrap().push(request.last_user_text());
    }
    let answer = match api {
        // Structured output is the agent's own plumbing, not the conversation: answered here.
        Api::Responses | Api::ChatCompletions | Api::Messages | Api::Gemini => match request.json_schema() {
            Some(schema) => Some(Answer::text(example_for(schema).to_string()).usage(20, 5)),
            None => Some(script(&request)),
        },
        _ => None,
    };
    let response = match (api, &answer) {
        (Api::Models, _) => json_response(
            200,
            json!({"object": "list", "data": [{"id": "pedelec-test-model", "object": "model", "owned_by": "pedelec"}]}),
        ),
        (Api::CountTokens, _) => json_response(200, json!({"input_tokens": 100})),
        (_, Some(answer)) => {
            if !answer.delay.is_zero() {
                tokio::time::sleep(answer.delay).await;
            }
            generate(&request, answer)
        }
        _ => plain(404, format!("no such endpoint: {}", request.path)),
    };
    seen.lock().unwrap().push(Recorded { request, answer, received, answered: Instant::now() });
    response
}

fn plain(status: u16, text: String) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(full(text))
        .expect("a valid response")
}

fn full(text: String) -> Body {
    http_body_util::Full::new(Bytes::from(text)).map_err(|never| match never {}).boxed()
}

fn json_response(status: u16, value: Value) -> hyper::Response<Body> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(value.to_string()))
        .expect("a valid response")
}

/// Splits `text` into `n` pieces on char boundaries (the last takes the rest).
fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let n = n.clamp(1, chars.len().max(1));
    let size = chars.len().div_ceil(n).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// The SSE frames of a streamed answer, as the vendor frames them (a cut
/// answer keeps only its first frames; the caller then fails the body).
pub fn sse_frames(request: &ModelRequest, answer: &Answer) -> Vec<String> {
    if let (Api::ChatCompletions, ModelReply::Text { text, chunks }) = (request.api, &answer.reply) {
        return chat_text_frames(request, answer, text, *chunks);
    }
    let events = match request.api {
        Api::Responses => responses_events(request, answer),
        Api::ChatCompletions => chat_events(request, answer),
        Api::Messages => messages_events(request, answer),
        Api::Gemini => gemini_events(answer),
        _ => return Vec::new(),
    };
    let mut frames: Vec<String> = events.into_iter().map(|(name, data)| sse(request.api, name, &data)).collect();
    if request.api == Api::ChatCompletions {
        frames.push("data: [DONE]\n\n".into());
    }
    if matches!(answer.reply, ModelReply::Cut { .. }) {
        // Keep the first text delta or two, then fail the body mid-stream.
        frames.truncate(frames.len().min(3));
    }
    frames
}

/// A chat-completions text answer's frames, each delta's written from a
/// template: the frames of a one-delta answer whose delta is a marker, split
/// at the marker. Building and serialising a JSON tree per delta cost this
/// server about 6 µs a delta, more than the client under test spent on it.
fn chat_text_frames(request: &ModelRequest, answer: &Answer, text: &str, chunks: usize) -> Vec<String> {
    const MARKER: &str = "\u{1}pedelec-delta\u{1}";
    let template = Answer { reply: ModelReply::Text { text: MARKER.into(), chunks: 1 }, ..answer.clone() };
    let mut frames: Vec<String> =
        chat_events(request, &template).into_iter().map(|(name, data)| sse(request.api, name, &data)).collect();
    frames.push("data: [DONE]\n\n".into());
    let marker = serde_json::to_string(MARKER).expect("a string serialises");
    let at = frames.iter().position(|f| f.contains(&marker)).expect("the template has its delta");
    let delta = frames[at].clone();
    let (head, tail) = delta.split_once(&marker).expect("the marker is in the delta");
    let deltas = pieces(text, chunks).into_iter().map(|piece| {
        let piece = serde_json::to_string(&piece).expect("a string serialises");
        [head, piece.as_str(), tail].concat()
    });
    frames.splice(at..=at, deltas);
    frames
}

/// SSE frames joined into writes of up to 16 KiB, as a fast server's
/// frames reach a reader that is slower than it. One HTTP chunk per frame
/// made this server, not the client under test, the slowest part of a
/// 100 000-delta stream (about 10 µs a frame).
fn writes(frames: Vec<String>) -> Vec<String> {
    const WRITE: usize = 16 * 1024;
    let mut writes = Vec::new();
    let mut current = String::new();
    for frame in frames {
        if !current.is_empty() && current.len() + frame.len() > WRITE {
            writes.push(std::mem::take(&mut current));
        }
        current.push_str(&frame);
    }
    if !current.is_empty() {
        writes.push(current);
    }
    writes
}

fn generate(request: &ModelRequest, answer: &Answer) -> hyper::Response<Body> {
    let cut = match &answer.reply {
        ModelReply::Status { status, message } => return error_response(request.api, *status, message),
        ModelReply::Cut { .. } => true,
        ModelReply::Text { .. } | ModelReply::ToolCall { .. } | ModelReply::ToolSearch { .. } => false,
    };
    if !request.streamed() {
        return json_response(200, non_streamed(request, answer));
    }
    // A cut answer keeps a write per frame: hyper may drop what it still
    // buffers when the body fails, and the frames before the cut must arrive.
    let frames = if cut { sse_frames(request, answer) } else { writes(sse_frames(request, answer)) };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(frames.len() + 1);
    tokio::spawn(async move {
        for frame in frames {
            if tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_err() {
                return;
            }
        }
        if cut {
            let _ = tx.send(Err(std::io::Error::other("stream cut by the test"))).await;
        }
    });
    let stream = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    hyper::Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(BodyExt::boxed(stream))
        .expect("a valid response")
}

fn sse(api: Api, name: &str, data: &Value) -> String {
    match api {
        // Chat completions and Gemini send data-only events.
        Api::ChatCompletions | Api::Gemini => format!("data: {data}\n\n"),
        _ => format!("event: {name}\ndata: {data}\n\n"),
    }
}

fn error_response(api: Api, status: u16, message: &str) -> hyper::Response<Body> {
    let body = match api {
        Api::Messages => json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        Api::Gemini => json!({"error": {"code": status, "message": message, "status": "INTERNAL"}}),
        _ => json!({"error": {"message": message, "type": "server_error", "code": null}}),
    };
    json_response(status, body)
}

fn arguments_text(arguments: &Value) -> String {
    arguments.to_string()
}

fn call_id(request: &ModelRequest) -> String {
    format!("call_{}", request.history().len())
}

fn responses_events(request: &ModelRequest, answer: &Answer) -> Vec<(&'static str, Value)> {
    let id = format!("resp_{}", request.history().len());
    let base = json!({"id": id, "object": "response", "status": "in_progress", "model": request.model(), "output": []});
    let mut events = vec![("response.created", json!({"type": "response.created", "response": base}))];
    let mut output = Vec::new();
    let mut text_item = |events: &mut Vec<(&'static str, Value)>, text: &str, n: usize| {
        let index = output.len();
        let item_id = format!("msg_{}_{index}", request.history().len());
        events.push((
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": index,
                   "item": {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}}),
        ));
        for piece in pieces(text, n) {
            events.push((
                "response.output_text.delta",
                json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": index,
                       "content_index": 0, "delta": piece}),
            ));
        }
        let item = json!({"type": "message", "id": item_id, "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]});
        events.push((
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        ));
        output.push(item);
    };
    match &answer.reply {
        ModelReply::Text { text, chunks } => text_item(&mut events, text, *chunks),
        ModelReply::Cut { text } => text_item(&mut events, text, 3),
        ModelReply::ToolCall { name, arguments, preamble } => {
            if let Some(preamble) = preamble {
                text_item(&mut events, preamble, 2);
            }
            let index = output.len();
            let mut item = json!({"type": "function_call", "id": format!("fc_{}", request.history().len()),
                              "call_id": call_id(request), "name": name, "arguments": arguments_text(arguments),
                              "status": "completed"});
            // A tool offered inside a namespace is called by its own name, with the namespace beside it.
            if let Some((ns, tool)) = request.namespace_of(name) {
                item["namespace"] = json!(ns);
                item["name"] = json!(tool);
            }
            events.push((
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": index, "item": item}),
            ));
            events.push((
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": index, "item": item}),
            ));
            output.push(item);
        }
        ModelReply::ToolSearch { query } => {
            let item = json!({"type": "tool_search_call", "id": format!("ts_{}", request.history().len()),
                              "call_id": call_id(request), "execution": "client", "status": "completed",
                              "arguments": {"query": query, "limit": 8}});
            events.push((
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ));
            events.push((
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ));
            output.push(item);
        }
        ModelReply::Status { .. } => {}
    }
    let usage = json!({"input_tokens": answer.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                       "output_tokens": answer.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                       "total_tokens": answer.input_tokens + answer.output_tokens});
    events.push((
        "response.completed",
        json!({"type": "response.completed",
               "response": {"id": id, "object": "response", "status": "completed", "model": request.model(),
                            "output": output, "usage": usage}}),
    ));
    events
}

fn chat_events(request: &ModelRequest, answer: &Answer) -> Vec<(&'static str, Value)> {
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "chatcmpl-pedelec", "object": "chat.completion.chunk", "created": 0, "model": request.model(),
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = Vec::new();
    match &answer.reply {
        ModelReply::Text { text, chunks } => {
            events.push(("", chunk(json!({"role": "assistant", "content": ""}), None)));
            for piece in pieces(text, *chunks) {
                events.push(("", chunk(json!({"content": piece}), None)));
            }
            events.push(("", chunk(json!({}), Some("stop"))));
        }
        ModelReply::Cut { text } => {
            for piece in pieces(text, 3) {
                events.push(("", chunk(json!({"role": "assistant", "content": piece}), None)));
            }
        }
        ModelReply::ToolCall { name, arguments, preamble } => {
            if let Some(preamble) = preamble {
                events.push(("", chunk(json!({"role": "assistant", "content": preamble}), None)));
            }
            let args = arguments_text(arguments);
            let (head, tail) = args.split_at(args.len() / 2);
            events.push((
                "",
                chunk(
                    json!({"role": "assistant", "tool_calls": [{"index": 0, "id": call_id(request), "type": "function",
                           "function": {"name": name, "arguments": head}}]}),
                    None,
                ),
            ));
            events.push(("", chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": tail}}]}), None)));
            events.push(("", chunk(json!({}), Some("tool_calls"))));
        }
        ModelReply::Status { .. } | ModelReply::ToolSearch { .. } => {}
    }
    events.push((
        "",
        json!({"id": "chatcmpl-pedelec", "object": "chat.completion.chunk", "created": 0, "model": request.model(),
               "choices": [], "usage": {"prompt_tokens": answer.input_tokens, "completion_tokens": answer.output_tokens,
                                        "total_tokens": answer.input_tokens + answer.output_tokens}}),
    ));
    events
}

fn messages_events(request: &ModelRequest, answer: &Answer) -> Vec<(&'static str, Value)> {
    let id = format!("msg_pedelec_{}", request.history().len());
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
               "model": request.model(), "content": [], "stop_reason": null, "stop_sequence": null,
               "usage": {"input_tokens": answer.input_tokens, "output_tokens": 1,
                         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
    )];
    // One text content block at `index`: start, a delta per piece, and (unless cut) stop.
    let text_block = |events: &mut Vec<(&'static str, Value)>, index: usize, parts: Vec<String>, stop: bool| {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in parts {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        if stop {
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
        }
    };
    let stop = match &answer.reply {
        ModelReply::Text { text, chunks } => {
            text_block(&mut events, 0, pieces(text, *chunks), true);
            "end_turn"
        }
        ModelReply::Cut { text } => {
            text_block(&mut events, 0, vec![text.clone()], false);
            "end_turn"
        }
        ModelReply::ToolCall { name, arguments, preamble } => {
            let mut index = 0;
            if let Some(preamble) = preamble {
                text_block(&mut events, 0, vec![preamble.clone()], true);
                index = 1;
            }
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": format!("toolu_{}", call_id(request)), "name": name, "input": {}}}),
            ));
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": arguments_text(arguments)}}),
            ));
            events.push(("content_block_stop", json!({"type": "content_block_stop", "index": index})));
            "tool_use"
        }
        ModelReply::Status { .. } | ModelReply::ToolSearch { .. } => "end_turn",
    };
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": answer.output_tokens}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

fn gemini_events(answer: &Answer) -> Vec<(&'static str, Value)> {
    let usage = json!({"promptTokenCount": answer.input_tokens, "candidatesTokenCount": answer.output_tokens,
                       "totalTokenCount": answer.input_tokens + answer.output_tokens});
    let candidate = |parts: Value, finish: Option<&str>| {
        let mut c = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        c
    };
    match &answer.reply {
        ModelReply::Text { text, chunks } => {
            let all = pieces(text, *chunks);
            let last = all.len() - 1;
            all.into_iter()
                .enumerate()
                .map(|(i, piece)| {
                    let mut event =
                        json!({"candidates": [candidate(json!([{"text": piece}]), (i == last).then_some("STOP"))]});
                    if i == last {
                        event["usageMetadata"] = usage.clone();
                    }
                    ("", event)
                })
                .collect()
        }
        ModelReply::Cut { text } => vec![("", json!({"candidates": [candidate(json!([{"text": text}]), None)]}))],
        ModelReply::ToolCall { name, arguments, preamble } => {
            let mut parts = Vec::new();
            if let Some(preamble) = preamble {
                parts.push(json!({"text": preamble}));
            }
            parts.push(json!({"functionCall": {"name": name, "args": arguments}}));
            vec![("", json!({"candidates": [candidate(Value::Array(parts), Some("STOP"))], "usageMetadata": usage}))]
        }
        ModelReply::Status { .. } | ModelReply::ToolSearch { .. } => Vec::new(),
    }
}

/// The same answer as one JSON body, for agents that ask without `stream`.
fn non_streamed(request: &ModelRequest, answer: &Answer) -> Value {
    let text = match &answer.reply {
        ModelReply::Text { text, .. } | ModelReply::Cut { text } => Some(text.clone()),
        _ => None,
    };
    match request.api {
        Api::Messages => {
            let content = match &answer.reply {
                ModelReply::ToolCall { name, arguments, preamble } => {
                    let mut blocks: Vec<Value> = preamble.iter().map(|p| json!({"type": "text", "text": p})).collect();
                    blocks.push(json!({"type": "tool_use", "id": format!("toolu_{}", call_id(request)), "name": name, "input": arguments}));
                    Value::Array(blocks)
                }
                _ => json!([{"type": "text", "text": text.unwrap_or_default()}]),
            };
            let stop = if matches!(answer.reply, ModelReply::ToolCall { .. }) { "tool_use" } else { "end_turn" };
            json!({"id": "msg_pedelec", "type": "message", "role": "assistant", "model": request.model(),
                   "content": content, "stop_reason": stop, "stop_sequence": null,
                   "usage": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens}})
        }
        Api::ChatCompletions => {
            let message = match &answer.reply {
                ModelReply::ToolCall { name, arguments, preamble } => json!({"role": "assistant", "content": preamble,
                    "tool_calls": [{"id": call_id(request), "type": "function",
                                    "function": {"name": name, "arguments": arguments_text(arguments)}}]}),
                _ => json!({"role": "assistant", "content": text.unwrap_or_default()}),
            };
            json!({"id": "chatcmpl-pedelec", "object": "chat.completion", "created": 0, "model": request.model(),
                   "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": answer.input_tokens, "completion_tokens": answer.output_tokens,
                             "total_tokens": answer.input_tokens + answer.output_tokens}})
        }
        Api::Gemini => {
            // One candidate with the whole text, not the stream's last piece.
            let mut whole = answer.clone();
            if let ModelReply::Text { chunks, .. } = &mut whole.reply {
                *chunks = 1;
            }
            gemini_events(&whole).pop().map(|(_, v)| v).unwrap_or(Value::Null)
        }
        _ => {
            let mut events = responses_events(request, answer);
            events.pop().map(|(_, v)| v["response"].clone()).unwrap_or(Value::Null)
        }
    }
}

/// A value that satisfies `schema` (the subset agents use: objects with
/// properties, arrays, enums, scalars; type names in either case).
pub fn example_for(schema: &Value) -> Value {
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    if let Some(first) =
        schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array).and_then(|v| v.first())
    {
        return example_for(first);
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.to_ascii_lowercase(),
        Some(Value::Array(types)) => types.first().and_then(Value::as_str).unwrap_or("null").to_ascii_lowercase(),
        _ if schema.get("properties").is_some() => "object".into(),
        _ => "string".into(),
    };
    match kind.as_str() {
        "object" => {
            let mut out = serde_json::Map::new();
            for (name, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                out.insert(name.clone(), example_for(property));
            }
            Value::Object(out)
        }
        "array" => Value::Array(Vec::new()),
        "integer" | "number" => json!(1),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!("pedelec"),
    }
}

/// The conversation every matrix test uses: a small, predictable model.
///
/// - a request that answers a tool result → `Tool result: <result>`;
/// - the preparation prompt (asks for `PEDELEC_PREPARED`) → `PEDELEC_PREPARED`;
/// - `call NAME JSON` as the last user text → says `Calling NAME.` and calls the offered tool
///   ending in `NAME` (first searching for it with `tool_search` when the agent defers its tools);
/// - `write PATH` → asks the agent's own file-writing tool (`Write`, `write`, `write_file`, codex's
///   `shell`/`exec_command`, asking to run outside its sandbox where it can) to create PATH;
/// - `read PATH` → asks the agent's own file-reading tool (`Read`, `read`, `read_file`, or `cat`
///   through codex's shell) for PATH;
/// - `fail STATUS` → answers with that HTTP status;
/// - `long N` → `word1 word2 … wordN` in N deltas (a long answer, for streaming);
/// - `slow MS` → `Echo: slow`, its first byte after MS milliseconds (a model that hangs);
/// - a text ending in a request for JSON (`… JSON Schema:` and the schema, as Core asks for a
///   typed answer) → a value of that schema ([`example_for`]), as JSON in a ```json fence;
/// - anything else → `Echo: <text>` in three deltas.
pub fn standard_script() -> Script {
    Arc::new(|request: &ModelRequest| {
        if let Some(result) = request.answered_tool_result() {
            return Answer::text(format!("Tool result: {}", result.trim())).usage(200, 20);
        }
        let text = request.last_user_text();
        let command = text.trim().rsplit("\n\n").next().unwrap_or_default().trim().to_owned();
        if text.contains("PEDELEC_PREPARED") {
            return Answer::text("PEDELEC_PREPARED").usage(50, 5);
        }
        if let Some(rest) = command.strip_prefix("call ") {
            let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
            let arguments: Value = serde_json::from_str(args).unwrap_or(json!({}));
            // One search per user turn: a search that found nothing must not loop.
            let history = request.history();
            let turn_start = history.iter().rposition(|(role, kind, _)| role == "user" && *kind == "text");
            let searched = history[turn_start.unwrap_or(0)..].iter().any(|(_, kind, _)| *kind == "tool_search");
            return match request.tool_named(name) {
                Some(full) => {
                    Answer::tool_call(full, arguments).with_preamble(format!("Calling {name}.")).usage(150, 15)
                }
                // Deferred tools (codex with a model that supports tool search): find them first.
                None if request.offers_tool_search() && !searched => {
                    Answer::new(ModelReply::ToolSearch { query: name.to_owned() }).usage(120, 8)
                }
                None => Answer::text(format!("No tool {name} among {:?}", request.tool_names())),
            };
        }
        if let Some(path) = command.strip_prefix("write ") {
            return write_file_call(request, path.trim(), true);
        }
        // A file the agent may write where it is (its workspace): no escalation asked.
        if let Some(path) = command.strip_prefix("create ") {
            return write_file_call(request, path.trim(), false);
        }
        if let Some(path) = command.strip_prefix("read ") {
            return read_file_call(request, path.trim());
        }
        if let Some(ms) = command.strip_prefix("slow ").and_then(|ms| ms.trim().parse::<u64>().ok()) {
            return Answer::text("Echo: slow").delayed(Duration::from_millis(ms));
        }
        if let Some(n) = command.strip_prefix("long ").and_then(|n| n.trim().parse::<usize>().ok()) {
            let text = (1..=n.max(1)).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ");
            return Answer::new(ModelReply::Text { text, chunks: n.max(1) });
        }
        if let Some(status) = command.strip_prefix("fail ") {
            let status = status.trim().parse().unwrap_or(500);
            return Answer::new(ModelReply::Status { status, message: format!("scripted failure {status}") });
        }
        if let Some(schema) =
            text.rsplit_once("JSON Schema:\n").and_then(|(_, schema)| serde_json::from_str::<Value>(schema.trim()).ok())
        {
            return Answer::text(format!("```json\n{}\n```", example_for(&schema))).usage(60, 10);
        }
        let echoed = command.lines().last().unwrap_or_default();
        Answer::text(format!("Echo: {echoed}"))
    })
}

/// A call of the agent's own file-writing tool, in the shape that agent's
/// tool takes; through a shell, `escalate` asks to leave the sandbox.
fn write_file_call(request: &ModelRequest, path: &str, escalate: bool) -> Answer {
    let names = request.tool_names();
    let has = |n: &str| names.iter().any(|t| t == n);
    let content = "written by the model server\n";
    if has("Write") {
        return Answer::tool_call("Write", json!({"file_path": path, "content": content}));
    }
    if has("write") {
        return Answer::tool_call("write", json!({"filePath": path, "content": content}));
    }
    if has("write_file") {
        return Answer::tool_call("write_file", json!({"file_path": path, "content": content}));
    }
    shell_call(request, format!("printf '%s' '{}' > '{}'", content.trim(), path), escalate)
}

/// `script` through the agent's shell tool (codex's `exec_command`, `shell`
/// or `shell_command`), for an agent with no file tool of its own. With
/// `escalate`, where the tool takes `sandbox_permissions` (codex), the call
/// asks to run outside the agent's sandbox, as a model does for a write
/// it knows the sandbox refuses.
fn shell_call(request: &ModelRequest, script: String, escalate: bool) -> Answer {
    let names = request.tool_names();
    let has = |n: &str| names.iter().any(|t| t == n);
    if has("exec_command") {
        if escalate && request.tool_takes("exec_command", "sandbox_permissions") {
            return Answer::tool_call(
                "exec_command",
                json!({"cmd": script, "sandbox_permissions": "require_escalated",
                       "justification": "The user asked for this file."}),
            );
        }
        return Answer::tool_call("exec_command", json!({"cmd": script}));
    }
    if has("shell") {
        return Answer::tool_call("shell", json!({"command": ["bash", "-lc", script]}));
    }
    if has("shell_command") {
        return Answer::tool_call("shell_command", json!({"command": script}));
    }
    Answer::text(format!("No file tool among {names:?}"))
}

/// A call of the agent's own file-reading tool, in the shape that agent's tool takes.
fn read_file_call(request: &ModelRequest, path: &str) -> Answer {
    let names = request.tool_names();
    let has = |n: &str| names.iter().any(|t| t == n);
    if has("Read") {
        return Answer::tool_call("Read", json!({"file_path": path}));
    }
    if has("read") {
        return Answer::tool_call("read", json!({"filePath": path}));
    }
    if has("read_file") {
        return Answer::tool_call("read_file", json!({"file_path": path}));
    }
    shell_call(request, format!("cat '{path}'"), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_answers_follow_the_schema() {
        let schema = json!({"type": "OBJECT", "properties": {
            "complexity_reasoning": {"type": "STRING"}, "complexity_score": {"type": "INTEGER"},
            "choice": {"type": "string", "enum": ["flash", "pro"]}, "tags": {"type": "array"}}});
        assert_eq!(
            example_for(&schema),
            json!({"complexity_reasoning": "pedelec", "complexity_score": 1, "choice": "flash", "tags": []})
        );
    }

    /// The wire each API speaks for a tool call with a preamble and for plain
    /// text, as agents parse it (reviewed against the vendors' SSE docs).
    #[test]
    fn wire_formats() {
        let offered = json!([{"type": "function", "name": "mcp__pedelec__update_counter"},
                             {"type": "namespace", "name": "mcp__pedelec", "tools": [{"type": "function", "name": "explode"}]}]);
        let call = Answer::tool_call("mcp__pedelec__update_counter", json!({"delta": 2})).with_preamble("Calling.");
        let text = Answer::new(ModelReply::Text { text: "Hello there".into(), chunks: 2 }).usage(7, 3);
        let namespaced = Answer::tool_call("mcp__pedelec__explode", json!({}));
        let mut out = String::new();
        for (api, path) in [
            (Api::Responses, "/v1/responses"),
            (Api::ChatCompletions, "/v1/chat/completions"),
            (Api::Messages, "/v1/messages"),
            (Api::Gemini, "/v1beta/models/m:streamGenerateContent"),
        ] {
            let request = ModelRequest {
                api,
                path: path.into(),
                body: json!({"model": "m", "stream": true, "tools": offered, "input": [], "messages": []}),
            };
            for (label, answer) in [("tool call", &call), ("text", &text), ("namespaced call", &namespaced)] {
                if label == "namespaced call" && api != Api::Responses {
                    continue;
                }
                out.push_str(&format!("=== {api:?} {label}\n{}", sse_frames(&request, answer).concat()));
            }
        }
        insta::assert_snapshot!(out);
    }

    #[test]
    fn pieces_cover_the_text() {
        assert_eq!(pieces("abcdefg", 3).concat(), "abcdefg");
        assert_eq!(pieces("ab", 5), vec!["a", "b"]);
        assert_eq!(pieces("", 3), vec![""]);
    }

    #[test]
    fn responses_history_reads_tool_results() {
        let request = ModelRequest {
            api: Api::Responses,
            path: "/v1/responses".into(),
            body: json!({"input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "call update_counter {}"}]},
                {"type": "function_call", "name": "mcp__pedelec__update_counter", "call_id": "c1", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "{\"value\":2}"}
            ], "tools": [{"type": "function", "name": "mcp__pedelec__update_counter"}]}),
        };
        assert_eq!(request.answered_tool_result().as_deref(), Some("{\"value\":2}"));
        assert_eq!(request.tool_named("update_counter").as_deref(), Some("mcp__pedelec__update_counter"));
        assert_eq!(request.last_user_text(), "call update_counter {}");
    }

    #[test]
    fn messages_history_reads_blocks() {
        let request = ModelRequest {
            api: Api::Messages,
            path: "/v1/messages".into(),
            body: json!({"messages": [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "id": "t", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "42"}]}]}
            ]}),
        };
        assert_eq!(request.answered_tool_result().as_deref(), Some("42"));
        assert_eq!(request.last_user_text(), "hello");
    }
}
