//! The `openai` adapter against a fake OpenAI-compatible server (hyper on
//! loopback) that streams SSE chunks and asks for a frontend tool call.

use std::convert::Infallible;

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use pedelec_sdk::SessionOptions;
use serde_json::Value;

use super::*;

/// A fake `/v1/chat/completions`: records every request body and answers by the conversation.
struct FakeModel {
    base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

fn sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null})
}

fn usage(total: u64) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
           "usage": {"prompt_tokens": total - 5, "completion_tokens": 5, "total_tokens": total}})
}

fn answer(request: &Value) -> String {
    let messages = request["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    let text = last["content"].as_str().unwrap_or_default();
    let stubborn = messages.iter().any(|m| m["content"].as_str().is_some_and(|c| c.contains("loop forever")));
    if last["role"] == "tool" && !stubborn {
        return sse(&[
            chunk(json!({"role": "assistant", "content": "Counter "}), None),
            chunk(json!({"content": format!("is now {}", text)}), Some("stop")),
            usage(40),
        ]);
    }
    if request.pointer("/response_format/json_schema/schema").is_some() {
        return sse(&[chunk(json!({"role": "assistant", "content": "{\"title\": \"fake\"}"}), Some("stop")), usage(9)]);
    }
    if text.contains("PEDELEC_PREPARED") {
        return sse(&[chunk(json!({"role": "assistant", "content": "PEDELEC_PREPARED"}), Some("stop")), usage(10)]);
    }
    if stubborn || text.contains("raise") {
        return sse(&[
            chunk(
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call_{}", messages.len()),
                "type": "function", "function": {"name": "update_counter", "arguments": ""}}]}),
                None,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"delta\":"}}]}), None),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "2}"}}]}), None),
            chunk(json!({}), Some("tool_calls")),
            usage(30),
        ]);
    }
    sse(&[chunk(json!({"role": "assistant", "content": format!("echo: {text}")}), Some("stop")), usage(12)])
}

/// How the fake deviates from a well-behaved server, by the user's text.
enum Misbehaviour {
    Sse(String),
    Busy {
        status: u16,
        retry_after: &'static str,
    },
    /// One chunk, then silence with the connection open.
    Stall(String),
}

fn last_user_text(request: &Value) -> String {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.iter().rev().find(|m| m["role"] == "user").cloned().unwrap_or_default();
    last["content"].as_str().unwrap_or_default().to_owned()
}

/// `cut` streams text and stops with neither a finish reason nor `[DONE]`;
/// `garbage` sends a chunk that is not JSON; `empty` answers no choice at
/// all; `busy N` answers 429 (Retry-After 0) N times, then well; `stall`
/// sends one chunk and goes quiet.
fn misbehave(text: &str, earlier: usize) -> Option<Misbehaviour> {
    let partial = chunk(json!({"role": "assistant", "content": "half an ans"}), None);
    match text {
        "cut" => Some(Misbehaviour::Sse(format!("data: {partial}\n\n"))),
        "garbage" => Some(Misbehaviour::Sse(format!("data: {partial}\n\ndata: {{not json\n\ndata: [DONE]\n\n"))),
        "empty" => Some(Misbehaviour::Sse(sse(&[usage(30)]))),
        "stall" => Some(Misbehaviour::Stall(format!("data: {partial}\n\n"))),
        _ => {
            let times: usize = text.strip_prefix("busy ")?.parse().ok()?;
            (earlier < times).then_some(Misbehaviour::Busy { status: 429, retry_after: "0" })
        }
    }
}

impl FakeModel {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Over TLS with this server configuration (its URL is `https://127.0.0.1:…`).
    async fn start_with(tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base_url = format!("{scheme}://{}/v1", listener.local_addr().unwrap());
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let seen = seen.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let path = request.uri().path().to_owned();
                            let target = request.uri().to_string();
                            let auth = request.headers().get("authorization").map(|v| v.to_str().unwrap().to_owned());
                            let bytes = request.into_body().collect().await.unwrap().to_bytes();
                            let mut body: Value = serde_json::from_slice(&bytes).unwrap();
                            body["_path"] = json!(path);
                            // The request target as sent: absolute through a proxy.
                            body["_target"] = json!(target);
                            body["_auth"] = json!(auth);
                            let text = last_user_text(&body);
                            let earlier = seen.lock().unwrap().iter().filter(|b| last_user_text(b) == text).count();
                            let reply = misbehave(&text, earlier).unwrap_or_else(|| Misbehaviour::Sse(answer(&body)));
                            seen.lock().unwrap().push(body);
                            let response = hyper::Response::builder().header("content-type", "text/event-stream");
                            let response = match reply {
                                Misbehaviour::Sse(sse) => response.body(Full::new(Bytes::from(sse)).boxed()),
                                Misbehaviour::Busy { status, retry_after } => response
                                    .status(status)
                                    .header("retry-after", retry_after)
                                    .body(Full::new(Bytes::from("busy")).boxed()),
                                Misbehaviour::Stall(first) => {
                                    let first = futures::stream::once(async move {
                                        Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(first)))
                                    });
                                    let body = http_body_util::StreamBody::new(first.chain(futures::stream::pending()));
                                    response.body(BodyExt::boxed(body))
                                }
                            };
                            Ok::<_, Infallible>(response.unwrap())
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        None => {
                            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                        }
                        // A client that refuses the certificate ends here.
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
                            }
                        }
                    }
                });
            }
        });
        FakeModel { base_url, requests }
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_calls_frontend_tools_and_counts_usage() {
    let model = FakeModel::start().await;
    let settings =
        format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\napi_key_env = \"PATH\"\n", model.base_url);
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let counter = Arc::new(Mutex::new(0));
    let session = client
        .create_session(SessionOptions {
            provider: Some("ollama".into()),
            guidance: "You keep a counter.".into(),
            tools: vec![counter_tool(counter.clone())],
            ..Default::default()
        })
        .await
        .unwrap();
    let recorder = Recorder::attach(&session);
    session.prepare().await.unwrap();
    session.send_text("raise the counter").await.unwrap();
    assert_eq!(*counter.lock().unwrap(), 2);
    let lines = recorder.lines();
    assert!(lines.contains(&r#"chat "Counter is now {\"value\":2}" [user]"#.to_string()), "{lines:?}");
    assert!(lines.contains(&r#"delta "Counter ""#.to_string()), "deltas stream: {lines:?}");
    // 10 (prepare) + 30 (tool round) + 40 (answer).
    assert_eq!(session.usage().total_tokens, Some(80));

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let first_turn = &requests[1];
    assert_eq!(first_turn["_path"], "/v1/chat/completions");
    assert_eq!(first_turn["model"], "qwen3");
    assert_eq!(first_turn["stream"], true);
    assert_eq!(first_turn["stream_options"], json!({"include_usage": true}));
    assert_eq!(first_turn["tools"][0]["function"]["name"], "update_counter");
    assert_eq!(first_turn["tools"][0]["function"]["parameters"]["required"], json!(["delta"]));
    assert_eq!(first_turn["messages"][0], json!({"role": "system", "content": "You keep a counter."}));
    assert!(first_turn["_auth"].as_str().unwrap().starts_with("Bearer "), "the key comes from api_key_env");
    let tool_round = &requests[2];
    let messages = tool_round["messages"].as_array().unwrap();
    let tool_message = messages.last().unwrap();
    assert_eq!(tool_message["role"], "tool");
    assert_eq!(tool_message["tool_call_id"], messages[messages.len() - 2]["tool_calls"][0]["id"]);
    assert_eq!(serde_json::from_str::<Value>(tool_message["content"].as_str().unwrap()).unwrap(), json!({"value": 2}));
    assert!(requests[0].get("tools").is_none(), "preparation offers no tools");

    // The conversation continues across turns and across end + resume.
    session.send_text("hello").await.unwrap();
    session.end().await.unwrap();
    session.resume().await.unwrap();
    session.send_text("still there?").await.unwrap();
    let last = model.requests().last().unwrap().clone();
    let contents: Vec<&str> =
        last["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str()).collect();
    assert!(contents.contains(&"raise the counter") && contents.contains(&"echo: hello"), "{contents:?}");
}

/// Proxies from the environment: an endpoint elsewhere is reached through
/// `HTTP_PROXY` (here a name that cannot resolve, so only the proxy can
/// answer for it); a model server on this machine never is, so a proxy set
/// for the user's browsing does not take their local model away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_goes_through_the_environments_proxy_except_to_a_loopback_server() {
    let direct = FakeModel::start().await;
    // An HTTP proxy receives the absolute URL; this one answers as the model would.
    let proxy = FakeModel::start().await;
    let proxy_url = proxy.base_url.trim_end_matches("/v1").to_owned();
    let settings = format!(
        "[providers.remote]\nkind = \"openai\"\nbase_url = \"http://model.pedelec.invalid:8080/v1\"\nmodel = \"qwen3\"\n\
         [providers.local]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"qwen3\"\n",
        direct.base_url
    );
    let env = [("HTTP_PROXY", proxy_url.as_str()), ("http_proxy", &proxy_url), ("NO_PROXY", ""), ("no_proxy", "")];
    let h = Harness::with_config_env(Via::Grpc, &settings, &env);
    let client = h.client().await;
    let options = |provider: &str| SessionOptions::<String> { provider: Some(provider.into()), ..Default::default() };

    let remote = client.create_session(options("remote")).await.unwrap();
    remote.send_text("hello").await.expect("the proxy reaches the remote endpoint");
    let proxied = proxy.requests();
    assert_eq!(proxied.len(), 1, "{proxied:?}");
    assert_eq!(proxied[0]["_target"], json!("http://model.pedelec.invalid:8080/v1/chat/completions"));
    assert!(direct.requests().is_empty());

    let local = client.create_session(options("local")).await.unwrap();
    local.send_text("hello").await.expect("a loopback endpoint is reached directly");
    let direct_requests = direct.requests();
    assert_eq!(direct_requests.len(), 1);
    assert_eq!(direct_requests[0]["_target"], json!("/v1/chat/completions"), "not through the proxy");
    assert_eq!(proxy.requests().len(), 1, "the proxy saw nothing of the local session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_without_a_model_is_model_required_and_unreachable_endpoints_say_so() {
    let h = Harness::with_config(Via::Grpc, "[providers.openai]\nbase_url = \"http://127.0.0.1:9/v1\"\n");
    let client = h.client().await;
    let providers = client.list_providers().await.unwrap();
    let openai = providers.iter().find(|p| p.code == "openai").unwrap();
    assert!(!openai.available);
    assert!(openai.reason.contains("unreachable"), "{}", openai.reason);

    let model = FakeModel::start().await;
    let h = Harness::with_config(Via::Grpc, &format!("[providers.openai]\nbase_url = \"{}\"\n", model.base_url));
    let client = h.client().await;
    let error = client
        .create_session::<String>(SessionOptions { provider: Some("openai".into()), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(error.code, "MODEL_REQUIRED");
    assert!(model.requests().is_empty(), "nothing was sent");
    // A hosted endpoint without its key says which variable to set (and is not probed).
    let hosted = Harness::with_config(Via::Grpc, "[providers.openai]\napi_key_env = \"PEDELEC_NO_SUCH_KEY\"\n");
    let providers = hosted.client().await.list_providers().await.unwrap();
    let openai = providers.iter().find(|p| p.code == "openai").unwrap();
    assert!(!openai.available && openai.reason.contains("PEDELEC_NO_SUCH_KEY"), "{openai:?}");
    for preset in ["openrouter", "groq", "mistral", "deepseek", "together"] {
        assert!(providers.iter().any(|p| p.code == preset), "the {preset} preset exists");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_loop_is_bounded() {
    let model = FakeModel::start().await;
    let settings =
        format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\nmax_rounds = 3\n", model.base_url);
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let (session, counter) = {
        let counter = Arc::new(Mutex::new(0));
        let session = client
            .create_session(SessionOptions {
                provider: Some("ollama".into()),
                tools: vec![counter_tool(counter.clone())],
                ..Default::default()
            })
            .await
            .unwrap();
        (session, counter)
    };
    // This fake asks for the tool again after every result.
    let error = session.send_text("loop forever").await.unwrap_err();
    assert_eq!(error.code, "SEND_TEXT_FAILED");
    assert!(error.message.contains("after 3 rounds"), "{error:?}");
    assert_eq!(*counter.lock().unwrap(), 6, "three rounds ran, no more");
    assert_eq!(model.requests().len(), 3);
    assert_eq!(session.get_status(), pedelec_sdk::SessionStatus::Idle);
}

/// Cancel while the model's tool call waits for the app: the turn ends
/// `OPERATION_CANCELLED`, and the conversation the next turn sends is one an
/// endpoint accepts — the tool call has its answer (the cancel), then the new
/// user text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cancel_keeps_the_conversation_consistent() {
    let model = FakeModel::start().await;
    let settings = format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\n", model.base_url);
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let stall = ToolSpec::new(
        "update_counter".to_string(),
        "Never answers",
        json!({"type": "object", "properties": {"delta": {"type": "integer"}}}),
    )
    .with_handler(pedelec_sdk::handler(|_: Value, _| async {
        std::future::pending::<()>().await;
        Ok::<Value, String>(Value::Null)
    }));
    let session = client
        .create_session(SessionOptions { provider: Some("ollama".into()), tools: vec![stall], ..Default::default() })
        .await
        .unwrap();
    let waiting = session.clone();
    let turn = tokio::spawn(async move { waiting.send_text("raise the counter").await });
    eventually("the tool wait", || session.get_status() == pedelec_sdk::SessionStatus::WaitingToolResult).await;
    session.cancel().await.unwrap();
    assert_eq!(turn.await.unwrap().unwrap_err().code, "OPERATION_CANCELLED");

    session.send_text("hello").await.expect("the next turn");
    let last = model.requests().last().unwrap().clone();
    let messages = last["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user"], "{messages:?}");
    assert_eq!(messages[0]["content"], "raise the counter");
    assert_eq!(messages[2]["tool_call_id"], messages[1]["tool_calls"][0]["id"]);
    assert!(messages[2]["content"].as_str().unwrap().contains("OPERATION_CANCELLED"), "{messages:?}");
    assert_eq!(messages[3]["content"], "hello");
}

/// Attachments to an OpenAI-compatible endpoint: an image as an `image_url`
/// data URL, another file as its path in the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sends_images_as_data_urls_and_files_as_paths() {
    let model = FakeModel::start().await;
    let settings = format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\n", model.base_url);
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("ollama".into()), ..Default::default() })
        .await
        .unwrap();
    let png = pedelec_sdk::assets::UploadSource::from_bytes("p.png", "image/png", b"\x89PNG-bytes".to_vec());
    session.upload_asset(png, Some("/p.png")).await.unwrap();
    let notes = pedelec_sdk::assets::UploadSource::from_bytes("notes.txt", "text/plain", b"remember".to_vec());
    session.upload_asset(notes, Some("/notes.txt")).await.unwrap();
    let options =
        pedelec_sdk::SendOptions { attachments: vec!["/p.png".into(), "/notes.txt".into()], ..Default::default() };
    session.send_text_with("describe", options).await.unwrap();
    let last = model.requests().last().unwrap().clone();
    let content = last["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    let text = content[0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("describe\n\nAttached files:\n- /") && text.contains("notes.txt (text/plain, 8 bytes)"),
        "{text}"
    );
    let url = content[1]["image_url"]["url"].as_str().unwrap();
    use base64::Engine;
    let expected = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG-bytes");
    assert_eq!(url, format!("data:image/png;base64,{expected}"));
}

/// Streams that are not whole answers fail the turn with a clear message —
/// never a success with a damaged or empty answer — and what streamed stays
/// visible as an interrupted message; busy answers are retried as told;
/// a stalled stream fails after the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_that_are_not_whole_answers_fail_the_turn() {
    let model = FakeModel::start().await;
    let settings = format!(
        "[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\nstream_idle_timeout_secs = 1\n",
        model.base_url
    );
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("ollama".into()), ..Default::default() })
        .await
        .unwrap();
    let failure = |text: &'static str| {
        let session = session.clone();
        async move { session.send_text(text).await.expect_err(text) }
    };
    let cut = failure("cut").await;
    assert_eq!(cut.code, "SEND_TEXT_FAILED");
    assert!(cut.message.contains("ended before the model finished"), "{cut:?}");
    let garbage = failure("garbage").await;
    assert!(garbage.message.contains("not JSON"), "{garbage:?}");
    let empty = failure("empty").await;
    assert!(empty.message.contains("answered nothing"), "{empty:?}");
    let stall = failure("stall").await;
    assert_eq!(stall.details.as_ref().unwrap()["providerCode"], "PROVIDER_TIMEOUT", "{stall:?}");
    assert!(stall.message.contains("idle for 1 s"), "{stall:?}");

    session.send_text("busy 2").await.expect("two 429s, then an answer");
    let busy = failure("busy 9").await;
    assert!(busy.message.contains("HTTP 429") && busy.message.contains("after 3 retries"), "{busy:?}");
    assert_eq!(busy.details.as_ref().unwrap()["retries"], 3);

    // What streamed before each cut is in the transcript as interrupted; the
    // stored conversation holds only the whole exchanges.
    let page = session.history(pedelec_sdk::HistoryQuery::default()).await.unwrap();
    let interrupted = page
        .entries
        .iter()
        .filter(|e| matches!(&e.kind, Some(pedelec_sdk::pb::history_entry::Kind::AssistantMessage(m)) if m.interrupted && m.text == "half an ans"))
        .count();
    assert_eq!(interrupted, 3, "cut, garbage and stall: {:?}", page.entries);
    session.send_text("hello").await.unwrap();
    let last = model.requests().last().unwrap().clone();
    let texts: Vec<&str> = last["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(texts, ["busy 2", "echo: busy 2", "hello"], "failed turns left nothing in the conversation");
}

/// A test CA, and certificates for 127.0.0.1 that it (or another CA) signs.
struct TestPki {
    dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestPki {
    fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
        TestPki { dir: tempfile::tempdir().unwrap(), ca }
    }

    /// The CA certificate as a PEM file (what `ca_file` names).
    fn ca_file(&self) -> String {
        let path = self.dir.path().join("ca.pem");
        std::fs::write(&path, self.ca.pem()).unwrap();
        path.display().to_string()
    }

    /// A server configuration with a leaf for 127.0.0.1; `expired` dates it in 2001.
    fn server(&self, expired: bool) -> Arc<tokio_rustls::rustls::ServerConfig> {
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &self.ca).unwrap();
        let key = rustls_pki_types_key(&key);
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        Arc::new(config)
    }
}

fn rustls_pki_types_key(key: &rcgen::KeyPair) -> tokio_rustls::rustls::pki_types::PrivateKeyDer<'static> {
    tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into()
}

fn gateway(code: &str, model: &FakeModel, ca_file: &str) -> String {
    format!(
        "[providers.{code}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"qwen3\"\napi_key_env = \"PATH\"\nca_file = \"{ca_file}\"\n",
        model.base_url
    )
}

/// https: a whole tool turn against a server whose certificate a test CA
/// signs (trusted through `ca_file`); a server whose CA is not trusted, and
/// one whose certificate expired, are refused with errors that say so, and
/// nothing reaches them. The key is never in `ListProviders`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_over_https_trusts_its_ca_file_and_refuses_an_unknown_ca_or_an_expired_certificate() {
    let pki = TestPki::new("Pedelec test CA");
    let stranger = TestPki::new("Some other CA");
    let good = FakeModel::start_with(Some(pki.server(false))).await;
    let expired = FakeModel::start_with(Some(pki.server(true))).await;
    let settings = [
        gateway("gateway", &good, &pki.ca_file()),
        gateway("untrusted", &good, &stranger.ca_file()),
        gateway("stale", &expired, &pki.ca_file()),
    ]
    .concat();
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let providers = client.list_providers().await.unwrap();
    let gateway = providers.iter().find(|p| p.code == "gateway").unwrap();
    assert!(gateway.available, "{gateway:?}");
    let key = std::env::var("PATH").unwrap();
    assert!(!format!("{providers:?}").contains(&key), "the key never appears in ListProviders");

    let counter = Arc::new(Mutex::new(0));
    let options = |provider: &str| SessionOptions {
        provider: Some(provider.into()),
        tools: vec![counter_tool(counter.clone())],
        ..Default::default()
    };
    let session = client.create_session(options("gateway")).await.unwrap();
    session.send_text("raise the counter").await.expect("a tool turn over https");
    assert_eq!(*counter.lock().unwrap(), 2);
    assert_eq!(good.requests().len(), 2, "the tool round and the answer went over TLS");
    assert_eq!(good.requests()[0]["_auth"], json!(format!("Bearer {key}")));

    for (provider, model, cause) in [("untrusted", &good, "UnknownIssuer"), ("stale", &expired, "certificate expired")]
    {
        let before = model.requests().len();
        let session = client.create_session(options(provider)).await.unwrap();
        let error = session.send_text("raise the counter").await.expect_err("an untrusted server is refused");
        assert!(error.message.contains("TLS") && error.message.contains(cause), "{provider}: {error:?}");
        assert_eq!(model.requests().len(), before, "{provider}: nothing was sent");
    }
    assert_eq!(*counter.lock().unwrap(), 2);
}

/// `fork()` on the openai adapter: the fork's first request carries the
/// parent's conversation (copied with its workspace), even across a
/// `kill -9` of Core before that turn; afterwards neither sees the other's turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_fork_continues_a_copy_of_the_conversation() {
    let model = FakeModel::start().await;
    let settings = format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\n", model.base_url);
    let mut h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let parent = client
        .create_session::<String>(SessionOptions {
            provider: Some("ollama".into()),
            auto_end_on_disconnect: false,
            ..Default::default()
        })
        .await
        .unwrap();
    parent.send_text("remember the word heron").await.unwrap();
    let fork_id = parent.fork().await.expect("fork").session_id().to_owned();
    let parent_id = parent.session_id().to_owned();
    drop(parent);
    drop(client);
    // The fork has not run a turn yet: what it continues is stored.
    h.crash_and_restart();
    let client = h.client().await;
    let fork = client.resume_session::<String>(&fork_id).await.unwrap();
    fork.send_text("which word?").await.unwrap();
    let contents = |request: &Value| -> Vec<String> {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect()
    };
    let seen = contents(model.requests().last().unwrap());
    assert_eq!(seen, ["remember the word heron", "echo: remember the word heron", "which word?"], "{seen:?}");

    let parent = client.resume_session::<String>(&parent_id).await.unwrap();
    parent.send_text("only the parent").await.unwrap();
    let seen = contents(model.requests().last().unwrap());
    assert!(!seen.iter().any(|t| t == "which word?"), "the parent never sees the fork's turn: {seen:?}");
    fork.send_text("and now?").await.unwrap();
    let seen = contents(model.requests().last().unwrap());
    assert!(!seen.iter().any(|t| t == "only the parent"), "nor the fork the parent's: {seen:?}");
    assert!(seen.iter().any(|t| t == "which word?"), "{seen:?}");
}

/// A typed turn on the openai adapter: the request carries the schema as
/// `response_format` (the server constrains the answer), and the answer
/// comes back as the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_typed_turns_send_the_schema_as_response_format() {
    let model = FakeModel::start().await;
    let settings = format!("[providers.ollama]\nbase_url = \"{}\"\nmodel = \"qwen3\"\n", model.base_url);
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let session = client
        .create_session::<String>(SessionOptions { provider: Some("ollama".into()), ..Default::default() })
        .await
        .unwrap();
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]});
    let options = pedelec_sdk::SendOptions { output_schema: Some(schema.clone()), ..Default::default() };
    let value = session.send_text_with("name it", options).await.unwrap();
    assert_eq!(value, Some(json!({"title": "fake"})));
    let last = model.requests().last().unwrap().clone();
    assert_eq!(last["response_format"]["type"], "json_schema");
    assert_eq!(last["response_format"]["json_schema"]["schema"], schema);
    // A plain turn sends none.
    session.send_text("hello").await.unwrap();
    assert!(model.requests().last().unwrap().get("response_format").is_none());
}
