//! `openai`: any OpenAI-compatible `/chat/completions` endpoint (Ollama,
//! llama.cpp, vLLM, LM Studio), with our own bounded agent loop.
//!
//! Each turn streams a completion (`stream: true`,
//! `stream_options.include_usage`) with the session's frontend tools as
//! functions; requested tool calls go straight to Core's tool broker and
//! their results (or `{"error":{code,message}}`) go back as `tool`
//! messages, for at most `max_rounds` rounds. The conversation lives in the
//! runtime and in `<runtime>/.pedelec-openai-history.json`, so a resumed
//! session (or a restarted Core) continues it. Usage adds each request's
//! `total_tokens`. The API key is read from `api_key_env` at request time
//! (never logged, never in argv or `ListProviders`). Endpoints on this
//! machine (local model servers) are probed for `ListProviders`; others
//! (hosted services, see the presets) are not: they are available once
//! their key is set. `https://` endpoints speak TLS (`tls`: the system's
//! roots plus `ca_file`).
//!
//! Only a whole answer counts: a stream that ends without a finish reason
//! or `[DONE]`, a chunk that is not JSON, an answer with neither text nor a
//! tool call, or a stream silent for `stream_idle_timeout_secs` (default
//! 60; `PROVIDER_TIMEOUT`) fails the turn — what streamed stays in the
//! transcript as interrupted, and the stored conversation does not take the
//! failed exchange. HTTP 429/503 before anything streamed are retried up to
//! three times, waiting as `Retry-After` says (at most 10 s each).
//!
//! Requests go through one `reqwest` client per provider: a connection pool
//! (a session's rounds and the provider's sessions reuse connections),
//! HTTP/2 where the server offers it over TLS, and the proxy the standard
//! variables name (`HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`), except for a
//! loopback endpoint: a model server on this machine is never reached
//! through a proxy.

mod stream;
mod tls;

use std::net::ToSocketAddrs;
use std::time::Duration;

use pedelec_protocol::backoff::Backoff;
use pedelec_protocol::{ErrorCode, pb};
use serde_json::{Value, json};

use super::{
    AgentEvent, BoxFuture, Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup, TurnOutcome,
    TurnRequest, TurnSink,
};
pub use stream::{Completion, RequestedCall, SseDecoder};

pub struct OpenAi {
    config: ProviderConfig,
    /// Built at the first https session (reading the system's roots takes milliseconds).
    tls: std::sync::OnceLock<Result<std::sync::Arc<tokio_rustls::rustls::ClientConfig>, String>>,
    /// Built at the first session; its pool serves every session of the provider.
    client: std::sync::OnceLock<Result<reqwest::Client, String>>,
}

impl OpenAi {
    pub fn new(config: ProviderConfig) -> Self {
        OpenAi { config, tls: std::sync::OnceLock::new(), client: std::sync::OnceLock::new() }
    }

    fn tls(&self) -> Result<std::sync::Arc<tokio_rustls::rustls::ClientConfig>, String> {
        self.tls.get_or_init(|| tls::client_config(self.config.ca_file.as_deref())).clone()
    }

    /// The provider's client. Its base URL is fixed for Core's lifetime
    /// (config.toml or the environment at start), so one client fits it.
    fn client(&self, endpoint: &Endpoint) -> Result<reqwest::Client, String> {
        self.client
            .get_or_init(|| {
                let mut builder = reqwest::Client::builder()
                    .tcp_nodelay(true)
                    .connect_timeout(CONNECT_TIMEOUT)
                    .pool_idle_timeout(POOL_IDLE_TIMEOUT);
                if endpoint.tls {
                    builder = builder.use_preconfigured_tls(self.tls()?.as_ref().clone());
                }
                if endpoint.is_loopback() {
                    builder = builder.no_proxy();
                }
                builder.build().map_err(|e| format!("cannot set up the HTTP client: {e}"))
            })
            .clone()
    }

    /// The key's variable, when it names one that is not set.
    fn missing_key(&self) -> Option<&str> {
        self.config.api_key_env.as_deref().filter(|name| std::env::var_os(name).is_none_or(|v| v.is_empty()))
    }

    fn base_url(&self) -> Option<String> {
        let from_env = || std::env::var(format!("{}_BASE_URL", self.config.code.to_uppercase().replace('-', "_"))).ok();
        self.config.base_url.clone().or_else(from_env).filter(|u| !u.is_empty())
    }
}

/// Scheme, host, port and path prefix of a base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Endpoint {
    pub fn parse(base: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(base).map_err(|e| format!("{base:?} is not a URL: {e}"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(format!("{base:?} is not an http:// or https:// URL")),
        };
        // A key in the URL would end up in logs and ListProviders: api_key_env carries it.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("{base:?} carries user info; put the key in api_key_env instead"));
        }
        if url.query().is_some() {
            return Err(format!("{base:?} has a query; a base URL is scheme, host, port and path"));
        }
        // An IPv6 literal keeps its brackets in the URL, not in the host.
        let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
        if host.is_empty() {
            return Err(format!("no host in {base:?}"));
        }
        let port = url.port_or_known_default().ok_or_else(|| format!("no port for {base:?}"))?;
        Ok(Endpoint { tls, host, port, path: url.path().trim_end_matches('/').to_owned() })
    }

    /// Whether the endpoint is this machine (never reached through a proxy).
    fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback())
    }

    fn chat_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority(), self.chat_path())
    }

    /// The `Host` header: the port only when it is not the scheme's default.
    fn authority(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        match (self.tls, self.port) {
            (true, 443) | (false, 80) => host,
            _ => format!("{host}:{}", self.port),
        }
    }

    fn chat_path(&self) -> String {
        format!("{}/chat/completions", self.path.trim_end_matches('/'))
    }

    /// Whether something listens there (a short connect, no request).
    fn reachable(&self) -> Result<(), String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("cannot resolve {}", self.host))?;
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300))
            .map(drop)
            .map_err(|e| format!("endpoint {}:{} unreachable: {e}", self.host, self.port))
    }
}

impl Provider for OpenAi {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn info(&self) -> pb::ProviderInfo {
        let check = self
            .base_url()
            .ok_or_else(|| "no base_url configured".to_owned())
            .and_then(|url| Endpoint::parse(&url))
            .and_then(|endpoint| {
                // A server on this machine is probed, and may need no key
                // at all. One elsewhere is not: looking a remote host up can
                // take seconds, it may be reached only through a proxy, and
                // its answer says nothing of the key.
                if endpoint.is_loopback() && !endpoint.tls {
                    return endpoint.reachable();
                }
                if let Some(name) = self.missing_key() {
                    return Err(format!("set {name} to the API key"));
                }
                if endpoint.tls { self.tls().map(drop) } else { Ok(()) }
            });
        let (available, reason) = match check {
            Ok(()) => (true, String::new()),
            Err(reason) => (false, reason),
        };
        pb::ProviderInfo { name: self.config.name.clone(), code: self.config.code.clone(), available, reason }
    }

    fn requires_model(&self) -> bool {
        true
    }

    /// From the copy of the parent's conversation in the fork's runtime directory.
    fn forks(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(true))
    }

    fn start(&self, setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        if setup.model.is_empty() {
            return Err(ProviderFailure::coded(ErrorCode::ModelRequired, "this provider needs a model", true));
        }
        let unavailable = |m: String| ProviderFailure::coded(ErrorCode::ProviderUnavailable, m, true);
        let base = self.base_url().ok_or_else(|| unavailable("no base_url configured".into()))?;
        let endpoint = Endpoint::parse(&base).map_err(unavailable)?;
        let client = self.client(&endpoint).map_err(unavailable)?;
        // A fork's conversation is the copy of its parent's that Core put
        // in its runtime directory (`Workspace::adopt_runtime_files`, or the
        // managed workspace's copy).
        let history = match setup.provider_session_id.as_ref().or(setup.fork_from.as_ref()) {
            Some(_) => crate::workspace::open_runtime(&setup.workspace, &setup.runtime_dir, false)
                .ok()
                .flatten()
                .and_then(|dir| dir.read(HISTORY_FILE).ok())
                .and_then(|bytes| serde_json::from_slice::<Vec<Value>>(&bytes).ok())
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let identity = setup.provider_session_id.clone().unwrap_or_else(|| format!("openai-{}", uuid::Uuid::new_v4()));
        let api_key = self.config.api_key_env.as_ref().and_then(|name| std::env::var(name).ok());
        Ok(Box::new(OpenAiSession {
            endpoint,
            client,
            api_key,
            max_rounds: self.config.max_rounds,
            idle_timeout: self.config.stream_idle_timeout,
            total: setup.usage_total.unwrap_or(0),
            identity,
            history,
            setup,
        }))
    }
}

struct OpenAiSession {
    endpoint: Endpoint,
    client: reqwest::Client,
    api_key: Option<String>,
    max_rounds: u32,
    idle_timeout: std::time::Duration,
    total: u64,
    identity: String,
    history: Vec<Value>,
    setup: ProviderSetup,
}

/// The conversation so far, kept in the session's runtime directory.
const HISTORY_FILE: &str = ".pedelec-openai-history.json";
/// Retries of a request the endpoint answers 429 or 503, before it fails:
/// three, waiting as `Retry-After` says or else from 500 ms doubling, and
/// never more than 10 s, whatever `Retry-After` says.
const BUSY_RETRIES: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10), 3);
/// How long a connection (and its TLS handshake) may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an unused pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// `Retry-After` in seconds (the HTTP-date form is not worth a date parser here).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).map(Duration::from_secs_f64)
}

/// Whether `error` is rustls's, directly or inside I/O errors (whose
/// `source` skips the error they wrap, so they are opened by `get_ref`).
fn is_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.is::<tokio_rustls::rustls::Error>() {
        return true;
    }
    let inner = error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
    inner.is_some_and(|inner| is_tls(inner))
}

/// A failed request in words: every cause in its chain, and whether TLS
/// refused the server (an unknown issuer: set ca_file; an expired
/// certificate; a name that does not match) or it could not be reached.
fn request_failed(error: &reqwest::Error, endpoint: &Endpoint) -> String {
    let mut causes: Vec<String> = Vec::new();
    let mut tls = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = next {
        tls |= is_tls(cause);
        let text = cause.to_string();
        // Wrappers often repeat their source's words: keep each once.
        if !causes.iter().any(|seen| seen.contains(&text)) {
            causes.push(text);
        }
        next = cause.source();
    }
    let (host, port) = (&endpoint.host, endpoint.port);
    let causes = causes.join(": ");
    if tls {
        format!("TLS with {host}:{port} failed: {causes}")
    } else if error.is_connect() {
        format!("cannot reach {host}:{port}: {causes}")
    } else {
        format!("the request to {host}:{port} failed: {causes}")
    }
}

/// The user message: plain text, or with attachments a content array —
/// images as `image_url` data URLs, other files as their paths in the text.
async fn user_message(text: &str, attachments: &[super::Attachment]) -> Result<Value, ProviderFailure> {
    if attachments.is_empty() {
        return Ok(json!({ "role": "user", "content": text }));
    }
    let (images, files): (Vec<&super::Attachment>, Vec<&super::Attachment>) =
        attachments.iter().partition(|a| a.is_image());
    let mut content = vec![json!({ "type": "text", "text": super::with_attachment_paths(text, &files) })];
    for image in images {
        let data = image.image_base64()?;
        content
            .push(json!({ "type": "image_url", "image_url": { "url": format!("data:{};base64,{data}", image.mime) } }));
    }
    Ok(json!({ "role": "user", "content": content }))
}

fn tool_functions(tools: &[pb::ToolDefinition]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            let schema: Value = serde_json::from_str(&t.input_schema_json).unwrap_or_else(|_| json!({"type":"object"}));
            json!({ "type": "function", "function": { "name": t.name, "description": t.description, "parameters": schema } })
        })
        .collect()
}

impl OpenAiSession {
    fn request_body(&self, messages: &[Value], with_tools: bool, output_schema: Option<&Value>) -> Value {
        let mut body = json!({
            "model": self.setup.model,
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if with_tools && !self.setup.tools.is_empty() {
            body["tools"] = Value::Array(tool_functions(&self.setup.tools));
        }
        if let Some(effort) = super::effort_name(self.setup.effort_level) {
            body["reasoning_effort"] = Value::from(effort);
        }
        // A typed turn: the server constrains the final message to the schema.
        if let Some(schema) = output_schema {
            body["response_format"] =
                json!({ "type": "json_schema", "json_schema": { "name": "answer", "schema": schema } });
        }
        body
    }

    /// Sends one completion request (on a pooled connection where one is
    /// open); the response's head, its body still to stream.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, ProviderFailure> {
        let mut request = self
            .client
            .post(self.endpoint.chat_url())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(body.to_string());
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        request.send().await.map_err(|e| ProviderFailure::turn(request_failed(&e, &self.endpoint)))
    }

    /// One streamed completion; deltas reach `sink` as they arrive. A cancel
    /// stops reading (the connection is dropped) and returns what streamed
    /// so far, with `cancelled` set.
    async fn complete(
        &mut self,
        body: Value,
        sink: &dyn TurnSink,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<(Completion, bool), ProviderFailure> {
        let failed = |m: String| ProviderFailure::turn(m);
        let mut retries = 0;
        let mut response = loop {
            let response = self.send(&body).await?;
            let status = response.status();
            if status.is_success() {
                break response;
            }
            // Busy or rate-limited before anything streamed: wait as told
            // (Retry-After, bounded) and try again, a few times.
            let busy = matches!(status.as_u16(), 429 | 503);
            if busy && let Some(backoff) = BUSY_RETRIES.delay(retries) {
                let wait = retry_after(response.headers()).unwrap_or(backoff);
                retries += 1;
                tokio::select! {
                    () = tokio::time::sleep(wait.min(BUSY_RETRIES.max)) => continue,
                    () = cancel.cancelled() => return Ok((Completion::default(), true)),
                }
            }
            let bytes = response.bytes().await.unwrap_or_default();
            let text: String = String::from_utf8_lossy(&bytes).chars().take(500).collect();
            let after = if retries > 0 { format!(" (after {retries} retries)") } else { String::new() };
            let mut failure = failed(format!("the endpoint answered HTTP {status}{after}"));
            failure.details = json!({ "httpStatus": status.as_u16(), "body": text, "retries": retries });
            return Err(failure);
        };
        let mut decoder = SseDecoder::default();
        let mut completion = Completion::default();
        let mut outcome = TurnOutcome::default();
        while !completion.done {
            let frame = tokio::select! {
                chunk = tokio::time::timeout(self.idle_timeout, response.chunk()) => chunk,
                () = cancel.cancelled() => return Ok((completion, true)),
            };
            let Ok(frame) = frame else {
                let mut failure = ProviderFailure::coded(
                    ErrorCode::ProviderTimeout,
                    format!("the stream was idle for {} s", self.idle_timeout.as_secs()),
                    false,
                );
                failure.details = json!({ "idleTimeoutSecs": self.idle_timeout.as_secs() });
                return Err(failure);
            };
            let Some(data) =
                frame.map_err(|e| failed(format!("the stream broke: {}", request_failed(&e, &self.endpoint))))?
            else {
                break;
            };
            for payload in decoder.feed(&data).map_err(failed)? {
                for event in completion.apply(&payload) {
                    outcome.apply(sink, event);
                }
            }
            sink.ready().await;
        }
        if let Some(payload) = decoder.finish() {
            for event in completion.apply(&payload) {
                outcome.apply(sink, event);
            }
        }
        if let Some(message) = outcome.failure {
            return Err(failed(message));
        }
        // A stream cut short is not an answer (what streamed stays visible
        // as interrupted; the stored conversation does not take it).
        if !completion.done && completion.finish_reason.is_none() {
            return Err(failed("the stream ended before the model finished (no finish_reason, no [DONE])".into()));
        }
        if completion.content.is_empty() && completion.finished_calls().is_empty() {
            return Err(failed("the model answered nothing (no text and no tool call)".into()));
        }
        if let Some(tokens) = completion.total_tokens {
            self.total += tokens;
            sink.usage(self.total);
        }
        Ok((completion, false))
    }

    async fn turn(&mut self, turn: TurnRequest, sink: &dyn TurnSink) -> Result<(), ProviderFailure> {
        sink.provider_session(&self.identity);
        let prepare = turn.kind == pb::TurnKind::Prepare;
        let mut messages = self.history.clone();
        if messages.is_empty() && !self.setup.guidance.trim().is_empty() {
            messages.push(json!({ "role": "system", "content": self.setup.guidance }));
        }
        messages.push(user_message(&turn.text, &turn.attachments).await?);
        for _round in 0..self.max_rounds {
            let (completion, cancelled) = self
                .complete(self.request_body(&messages, !prepare, turn.output_schema.as_ref()), sink, &turn.cancel)
                .await?;
            if cancelled {
                // The conversation keeps the user's text and what streamed
                // before the cancel, so the next turn follows on from it.
                if !prepare {
                    messages.push(json!({ "role": "assistant", "content": completion.content }));
                    self.history = messages;
                    self.save_history();
                }
                return Err(ProviderFailure::cancelled());
            }
            let calls = completion.finished_calls();
            if !completion.content.is_empty() {
                sink.message(&completion.content);
            }
            if calls.is_empty() {
                messages.push(json!({ "role": "assistant", "content": completion.content }));
                // Preparation is a check, not part of the conversation.
                if !prepare {
                    self.history = messages;
                    self.save_history();
                }
                return Ok(());
            }
            let requested: Vec<Value> = calls
                .iter()
                .map(|c| json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } }))
                .collect();
            messages.push(json!({ "role": "assistant", "content": completion.content, "tool_calls": requested }));
            for call in calls {
                // The model's tool call as an activity of the turn (the
                // frontend call itself is the ToolCall event).
                let mut started = super::activity(call.id.clone(), pb::ActivityKind::ToolCall, call.name.clone());
                started.status = pb::ActivityStatus::InProgress as i32;
                sink.activity(started);
                let (content, status) = match sink.call_tool(&call.name, call.arguments.clone()).await {
                    Ok(result) => (result, pb::ActivityStatus::Completed),
                    Err(error) => (
                        json!({ "error": { "code": error.code, "message": error.message } }).to_string(),
                        pb::ActivityStatus::Failed,
                    ),
                };
                let mut done = super::activity(call.id.clone(), pb::ActivityKind::Unspecified, "");
                done.status = status as i32;
                done.output = content.clone();
                sink.activity(done);
                messages.push(json!({ "role": "tool", "tool_call_id": call.id, "content": content }));
            }
            if turn.cancel.is_cancelled() {
                // Every call of the round has its answer (the cancelled ones
                // an OPERATION_CANCELLED error), so the stored conversation
                // stays one the endpoint accepts.
                if !prepare {
                    self.history = messages;
                    self.save_history();
                }
                return Err(ProviderFailure::cancelled());
            }
        }
        Err(ProviderFailure::turn(format!("the model was still calling tools after {} rounds", self.max_rounds)))
    }

    fn save_history(&self) {
        // Through a handle on the runtime directory, never a planted link.
        let write = serde_json::to_vec(&self.history).map_err(std::io::Error::other).and_then(|bytes| {
            let dir = crate::workspace::open_runtime(&self.setup.workspace, &self.setup.runtime_dir, true)?
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
            let partial = format!("{HISTORY_FILE}.partial");
            dir.write(&partial, bytes)?;
            dir.rename(&partial, &dir, HISTORY_FILE)
        });
        if let Err(error) = write {
            tracing::warn!(%error, "could not save the openai conversation");
        }
    }
}

impl ProviderSession for OpenAiSession {
    fn run_turn<'a>(
        &'a mut self,
        turn: TurnRequest,
        sink: &'a dyn TurnSink,
    ) -> BoxFuture<'a, Result<(), ProviderFailure>> {
        Box::pin(self.turn(turn, sink))
    }
}

/// Reads a recorded SSE body into the events a turn would report (for tests and benchmarks).
pub fn replay(body: &[u8]) -> (Vec<AgentEvent>, Completion) {
    let mut decoder = SseDecoder::default();
    let mut completion = Completion::default();
    let mut events = Vec::new();
    let payloads = match decoder.feed(body) {
        Ok(payloads) => payloads,
        Err(reason) => return (vec![AgentEvent::Skipped { reason }], completion),
    };
    for payload in payloads.into_iter().chain(decoder.finish()) {
        events.extend(completion.apply(&payload));
    }
    (events, completion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:11434/v1/").unwrap(),
            Endpoint { tls: false, host: "127.0.0.1".into(), port: 11434, path: "/v1".into() }
        );
        assert_eq!(Endpoint::parse("http://localhost").unwrap().chat_path(), "/chat/completions");
        let hosted = Endpoint::parse("https://api.openai.com/v1").unwrap();
        assert_eq!((hosted.tls, hosted.port, hosted.authority()), (true, 443, "api.openai.com".to_owned()));
        assert!(Endpoint::parse("https://user@evil.example/v1").is_err());
        assert!(Endpoint::parse("ftp://x").is_err());
        assert!(Endpoint::parse("http://:80/v1").is_err());
        assert!(Endpoint::parse("http://h:99999/v1").is_err());
        assert!(Endpoint::parse("https://api.example/v1?key=secret").is_err());
        let v6 = Endpoint::parse("http://[::1]:8080/v1").unwrap();
        assert_eq!((v6.host.as_str(), v6.authority()), ("::1", "[::1]:8080".to_owned()));
    }
}
