//! A minimal WebDriver BiDi client for headless Firefox: Firefox's own
//! remote protocol (`--remote-debugging-port`), no geckodriver. Commands
//! and their answers pair by `id`; events are not subscribed to. One
//! connection, used from one thread; every read is bounded.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

use crate::E2eError;

/// The Firefox binary (Debian's `firefox-esr` unless `PEDELEC_FIREFOX` says another).
pub fn firefox() -> std::path::PathBuf {
    std::env::var_os("PEDELEC_FIREFOX").map(Into::into).unwrap_or_else(|| "/usr/bin/firefox-esr".into())
}

/// A running headless Firefox and its BiDi session.
pub struct Firefox {
    child: Child,
    socket: WebSocket<TcpStream>,
    next_id: u64,
    /// Answers read while waiting for another one.
    early: HashMap<u64, Value>,
}

impl Firefox {
    /// Starts Firefox on `profile` with `envs` and opens a BiDi session.
    pub fn launch(profile: &Path, envs: &[(&str, &Path)]) -> Result<Firefox, E2eError> {
        let mut child = Command::new(firefox())
            .args(["--headless", "--no-remote", "--remote-debugging-port", "0", "--profile"])
            .arg(profile)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // Firefox prints where BiDi listens on stderr; the rest of stderr is
        // drained by a thread so Firefox never blocks on a full pipe.
        let stderr = child.stderr.take().ok_or_else(|| E2eError::Setup("no stderr".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(at) = line.find("WebDriver BiDi listening on ") {
                    let _ = tx.send(line[at + "WebDriver BiDi listening on ".len()..].trim().to_owned());
                    sent = true;
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                return Err(E2eError::Timeout("Firefox did not announce its BiDi port".into()));
            }
        };
        let address = url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
        let stream = TcpStream::connect(&address)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        // Firefox refuses a handshake that carries an Origin header; tungstenite sends none.
        let (socket, _) = tungstenite::client::client(format!("ws://{address}/session"), stream)
            .map_err(|e| E2eError::Setup(format!("BiDi handshake: {e}")))?;
        let mut firefox = Firefox { child, socket, next_id: 0, early: HashMap::new() };
        firefox.call("session.new", json!({ "capabilities": {} }), Duration::from_secs(30))?;
        Ok(firefox)
    }

    /// Sends a command; returns its id for [`Firefox::wait`].
    pub fn send(&mut self, method: &str, params: Value) -> Result<u64, E2eError> {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket
            .send(Message::text(text))
            .map_err(|e| E2eError::Cdp { method: method.into(), message: e.to_string() })?;
        Ok(id)
    }

    /// Waits for the answer to command `id`: its `result`, or the error it got.
    pub fn wait(&mut self, id: u64, timeout: Duration) -> Result<Value, E2eError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(answer) = self.early.remove(&id) {
                return match answer["type"].as_str() {
                    Some("success") => Ok(answer["result"].clone()),
                    _ => Err(E2eError::Cdp { method: format!("BiDi command {id}"), message: answer.to_string() }),
                };
            }
            if Instant::now() > deadline {
                return Err(E2eError::Timeout(format!("BiDi command {id} after {timeout:?}")));
            }
            match self.socket.read() {
                Ok(Message::Text(text)) => {
                    let message: Value = serde_json::from_str(&text)?;
                    if let Some(answered) = message["id"].as_u64() {
                        self.early.insert(answered, message);
                    }
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(E2eError::Protocol(format!("BiDi connection: {e}"))),
            }
        }
    }

    pub fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, E2eError> {
        let id = self.send(method, params)?;
        self.wait(id, timeout)
    }

    /// Starts evaluating `expression` (awaited if a promise) in `context`;
    /// [`Firefox::value`] reads its JSON value.
    pub fn eval_later(&mut self, context: &str, expression: &str) -> Result<u64, E2eError> {
        // JSON.stringify in the page: BiDi's own value serialisation is not JSON.
        let wrapped = format!("(async () => JSON.stringify(await ({expression})))()");
        self.send(
            "script.evaluate",
            json!({ "expression": wrapped, "target": { "context": context }, "awaitPromise": true }),
        )
    }

    /// The JSON value of an [`Firefox::eval_later`] evaluation.
    pub fn value(&mut self, id: u64, timeout: Duration) -> Result<Value, E2eError> {
        let result = self.wait(id, timeout)?;
        match (result["type"].as_str(), result["result"]["value"].as_str()) {
            (Some("success"), Some(text)) => Ok(serde_json::from_str(text)?),
            (Some("success"), None) => Ok(Value::Null),
            _ => Err(E2eError::Script {
                expression: format!("evaluation {id}"),
                message: result["exceptionDetails"]["text"].as_str().unwrap_or("threw").to_owned(),
            }),
        }
    }

    pub fn eval(&mut self, context: &str, expression: &str) -> Result<Value, E2eError> {
        let id = self.eval_later(context, expression)?;
        self.value(id, Duration::from_secs(60))
    }

    /// Polls `expression` until it is `true`.
    pub fn wait_until(&mut self, context: &str, expression: &str, timeout: Duration) -> Result<(), E2eError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.eval(context, expression).is_ok_and(|v| v == json!(true)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(E2eError::Timeout(format!("`{expression}` after {timeout:?}")))
    }

    /// The top-level browsing contexts as (id, url).
    pub fn contexts(&mut self) -> Result<Vec<(String, String)>, E2eError> {
        let tree = self.call("browsingContext.getTree", json!({}), Duration::from_secs(10))?;
        Ok(tree["contexts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (c["context"].as_str().unwrap_or_default().to_owned(), c["url"].as_str().unwrap_or_default().to_owned())
            })
            .collect())
    }

    /// Waits for a top-level context whose url satisfies `matches`.
    pub fn wait_for_context(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> Result<String, E2eError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some((id, _)) = self.contexts()?.into_iter().find(|(_, url)| matches(url)) {
                return Ok(id);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(E2eError::Timeout(format!("no {what} opened")))
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
