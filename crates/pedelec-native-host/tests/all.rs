//! The native host as a browser sees it: a real host process, real frames,
//! a real Core behind it.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pedelec_protocol::event_batch::batch_events;
use pedelec_protocol::native::{ChunkAssembler, FrameDecoder, decode_native_frame, encode_frame};
use pedelec_protocol::pb::{self, native_frame::Body, native_request::Call, native_response::Result as R};
use pedelec_protocol::{json, limits};
use pedelec_sdk::daemon::CoreProcess;

#[path = "host/bad_input.rs"]
mod bad_input;
#[path = "host/fuzz.rs"]
mod fuzz;
#[path = "host/registration.rs"]
mod registration;
#[path = "host/relay.rs"]
mod relay;

pub const ID: &str = "pedelecpedelecpedelecpedelecpede";
pub const ORIGIN: &str = "https://app.example";
/// The caller origin the extension's worker uses for owner calls.
pub const OWNER: &str = "app:pedelec-extension";

pub struct Env {
    pub dir: tempfile::TempDir,
    pub core: Option<CoreProcess>,
}

impl Env {
    pub fn with_core() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let core =
            CoreProcess::spawn(&dir.path().join("core.sock"), &dir.path().join("state"), Duration::from_millis(300))
                .unwrap();
        let env = Env { dir, core: Some(core) };
        env.approve(ORIGIN, &[]);
        env
    }

    /// What the user's approval in the extension does: an owner call
    /// through a host, as the extension's worker makes it.
    pub fn approve(&self, origin: &str, folders: &[&std::path::Path]) {
        let mut host = self.host();
        let consent = pb::OriginConsent {
            origin: origin.into(),
            approved: true,
            folders: folders
                .iter()
                .map(|f| pb::FolderGrant {
                    path: f.display().to_string(),
                    may_approve_commands: false,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let call = Call::SetConsent(pb::SetConsentRequest { caller_origin: OWNER.into(), consent: Some(consent) });
        assert!(matches!(host.call(1, call), Body::Response(_)), "consent set");
    }

    pub fn without_core() -> Self {
        Env { dir: tempfile::tempdir().unwrap(), core: None }
    }

    pub fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("core.sock")
    }

    pub fn host(&self) -> Host {
        self.host_with(&[format!("chrome-extension://{ID}/")], &[])
    }

    pub fn host_with(&self, args: &[String], extra_env: &[(&str, &str)]) -> Host {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pedelec-native-host"));
        cmd.args(args)
            .env("PEDELEC_CORE_SOCKET", self.socket())
            .env("PEDELEC_ALLOWED_EXTENSIONS", ID)
            .env("PEDELEC_CORE_BIN", pedelec_sdk::daemon::find_core_binary())
            .env("HOME", self.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("PEDELEC_TEST_HOST_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            let mut decoder = FrameDecoder::new(limits::NATIVE_HOST_TO_BROWSER_MAX);
            let mut buf = vec![0u8; 65536];
            loop {
                while let Some(next) = decoder.next_frame() {
                    if tx.send(next.expect("the host writes valid frames")).is_err() {
                        return;
                    }
                }
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => decoder.push(&buf[..n]),
                }
            }
        });
        Host {
            child,
            stdin,
            frames,
            assembler: ChunkAssembler::new(usize::MAX),
            raw_sizes: Vec::new(),
            unbatched: VecDeque::new(),
            batches: 0,
            acks: Vec::new(),
        }
    }
}

/// One host process and its stdio, speaking frames.
pub struct Host {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    frames: mpsc::Receiver<String>,
    assembler: ChunkAssembler,
    /// Sizes of every frame read, before reassembly.
    pub raw_sizes: Vec<usize>,
    /// Events of a batch frame not handed out yet: `recv` yields a batch's
    /// events as the `event` frames they stand for.
    unbatched: VecDeque<pb::NativeFrame>,
    /// Batch frames read.
    pub batches: usize,
    /// Every acknowledgement read (`NativeFrame.acks`), in order, with
    /// whether the frame carrying it had a body of its own.
    pub acks: Vec<(u32, bool)>,
}

pub fn request(id: u32, call: Call) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id: id,
        body: Some(Body::Request(pb::NativeRequest { call: Some(call) })),
        ..Default::default()
    }
}

impl Host {
    pub fn write_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, frame: &pb::NativeFrame) {
        let bytes = encode_frame(&json::to_json(frame), limits::NATIVE_BROWSER_TO_HOST_MAX).unwrap();
        self.write_raw(&bytes);
    }

    pub fn send_json(&mut self, text: &str) {
        self.write_raw(&encode_frame(text, usize::MAX).unwrap());
    }

    /// The next whole frame (chunks reassembled), or `None` at end of output.
    /// A host that says nothing for 20 s fails the test instead of hanging it.
    pub fn recv(&mut self) -> Option<pb::NativeFrame> {
        if let Some(frame) = self.unbatched.pop_front() {
            return Some(frame);
        }
        loop {
            let text = match self.frames.recv_timeout(Duration::from_secs(20)) {
                Ok(text) => text,
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("the host sent nothing for 20 s"),
            };
            self.raw_sizes.push(text.len());
            assert!(text.len() <= limits::NATIVE_HOST_TO_BROWSER_MAX, "a frame Chrome would reject");
            let Some(frame) =
                self.assembler.accept(decode_native_frame(&text).expect("valid JSON")).expect("valid chunks")
            else {
                continue;
            };
            self.acks.extend(frame.acks.iter().map(|id| (*id, frame.body.is_some())));
            if frame.body.is_none() {
                continue;
            }
            let Some(Body::Batch(batch)) = &frame.body else { return Some(frame) };
            self.batches += 1;
            let request_id = frame.request_id;
            let events = batch_events(batch).expect("a valid batch");
            self.unbatched.extend(events.into_iter().map(|e| pb::NativeFrame {
                request_id,
                body: Some(Body::Event(e)),
                ..Default::default()
            }));
            return self.unbatched.pop_front();
        }
    }

    /// Reads until an acknowledgement has come (a host that answers
    /// nothing else meanwhile); any frame with a body fails the test.
    pub fn recv_acks(&mut self) -> Vec<(u32, bool)> {
        while self.acks.is_empty() {
            let text = self.frames.recv_timeout(Duration::from_secs(20)).expect("an acknowledgement comes");
            let frame = decode_native_frame(&text).expect("valid JSON");
            assert!(frame.body.is_none(), "only an acknowledgement was due: {frame:?}");
            self.acks.extend(frame.acks.iter().map(|id| (*id, false)));
        }
        std::mem::take(&mut self.acks)
    }

    /// Sends a request and returns its response or error, skipping event frames.
    pub fn call(&mut self, id: u32, call: Call) -> Body {
        self.send(&request(id, call));
        self.reply(id)
    }

    pub fn reply(&mut self, id: u32) -> Body {
        loop {
            let frame = self.recv().expect("the host answers");
            if frame.request_id == id && !matches!(frame.body, Some(Body::Event(_))) {
                return frame.body.unwrap();
            }
        }
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn create(host: &mut Host, id: u32, origin: &str) -> String {
    let req = pb::CreateSessionRequest { caller_origin: origin.into(), ..Default::default() };
    match host.call(id, Call::CreateSession(req)) {
        Body::Response(pb::NativeResponse { result: Some(R::CreateSession(r)) }) => r.session.unwrap().session_id,
        other => panic!("{other:?}"),
    }
}

pub fn error_code(body: &Body) -> &str {
    match body {
        Body::Error(e) => &e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}
