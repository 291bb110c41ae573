//! The public calls of [`PedelecSession`]: its identity and what it knows,
//! starting, cancelling, ending and resuming the session.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::FutureExt;
use pedelec_protocol::prepare::PrepareStart;
use pedelec_protocol::{ErrorCode, SessionStatus, pb};

use super::handlers::Handlers;
use super::{Registry, SessionShell};
use crate::context::SessionMeta;
use crate::error::PedelecError;
use crate::machine::SessionMachine;
use crate::tool::{ToolHandlerFn, ToolName};
use crate::transport::{BoxFuture, Call, Reply, Transport, unexpected};

/// Cumulative token usage; `total_tokens` is `None` until a provider reports a valid total.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::PedelecSessionUsage;
///
/// // What a fresh handle reports before any provider counted tokens.
/// let usage = PedelecSessionUsage::default();
/// assert_eq!(usage.total_tokens, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PedelecSessionUsage {
    pub total_tokens: Option<u64>,
}

/// One Core agent session. Cheap to clone; clones share the handle.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::{Pedelec, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let _off = session.on_chat(|text, _ctx| println!("{text}"));
/// // A clone is the same handle, e.g. for another task.
/// let background = session.clone();
/// background.send_text("Hello").await?;
/// assert_eq!(session.last_seq(), background.last_seq());
/// session.end().await?;
/// # Ok(())
/// # }
/// ```
pub struct PedelecSession<T: ToolName = String> {
    pub(super) shell: Arc<SessionShell>,
    _names: PhantomData<fn() -> T>,
}

impl<T: ToolName> Clone for PedelecSession<T> {
    fn clone(&self) -> Self {
        PedelecSession { shell: self.shell.clone(), _names: PhantomData }
    }
}

impl<T: ToolName> std::fmt::Debug for PedelecSession<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PedelecSession").field("session_id", &self.shell.session_id).finish()
    }
}

impl<T: ToolName> PedelecSession<T> {
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        registry: Registry,
        origin: String,
        meta: SessionMeta,
        inline: HashMap<String, ToolHandlerFn>,
    ) -> Self {
        Self::with_handlers(transport, registry, origin, meta, Handlers::with_inline(inline))
    }

    fn with_handlers(
        transport: Arc<dyn Transport>,
        registry: Registry,
        origin: String,
        meta: SessionMeta,
        handlers: Handlers,
    ) -> Self {
        let shell = SessionShell::new(transport, registry, origin, SessionMachine::new(meta), handlers);
        PedelecSession { shell: Arc::new(shell), _names: PhantomData }
    }

    /// Subscribes, adopts the first snapshot, then follows live events in the background.
    pub(crate) async fn attach(&self) -> Result<(), PedelecError> {
        self.shell.attach().await?;
        self.shell.register_in_client();
        Ok(())
    }

    /// Core session/thread identifier.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// // The id is what re-attaches later, e.g. after a restart of the application.
    /// let id = session.session_id().to_owned();
    /// let again = pedelec.resume_session::<String>(&id).await?;
    /// assert_eq!(again.session_id(), id);
    /// # Ok(())
    /// # }
    /// ```
    pub fn session_id(&self) -> &str {
        &self.shell.session_id
    }

    /// Provider known to this handle (may be empty on a fresh resumed handle until its snapshot).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let options = SessionOptions { provider: Some("scripted".into()), ..Default::default() };
    /// let session = pedelec.create_session::<String>(options).await?;
    /// assert_eq!(session.provider(), "scripted");
    /// # Ok(())
    /// # }
    /// ```
    pub fn provider(&self) -> String {
        self.shell.lock().machine.meta().provider.clone()
    }

    /// The session's effort level, when known (never `Unspecified`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, EffortLevel};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let options = SessionOptions { effort_level: Some(EffortLevel::Low), ..Default::default() };
    /// let session = pedelec.create_session::<String>(options).await?;
    /// if let Some(effort) = session.effort_level() {
    ///     println!("effort: {}", effort.seed_str().unwrap_or_default());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn effort_level(&self) -> Option<pb::EffortLevel> {
        self.shell.lock().machine.meta().effort_level
    }

    /// When this handle was constructed (ms since epoch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// assert!(session.session_created_at() <= pedelec_sdk::context::now_ms());
    /// # Ok(())
    /// # }
    /// ```
    pub fn session_created_at(&self) -> i64 {
        self.shell.lock().machine.meta().session_created_at
    }

    /// Cumulative token usage as far as this handle has heard.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Hello").await?;
    /// match session.usage().total_tokens {
    ///     Some(total) => println!("{total} tokens so far"),
    ///     None => println!("this provider reports no usage"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn usage(&self) -> PedelecSessionUsage {
        PedelecSessionUsage { total_tokens: self.shell.lock().machine.usage() }
    }

    /// The current local status.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// assert_eq!(session.get_status(), SessionStatus::Idle);
    /// session.send_text("Hello").await?;
    /// // The turn is over once `send_text` resolves.
    /// assert_eq!(session.get_status(), SessionStatus::Idle);
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_status(&self) -> SessionStatus {
        self.shell.lock().machine.status()
    }

    /// Sequence number of the newest Core event this handle adopted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let before = session.last_seq();
    /// session.send_text("Hello").await?;
    /// assert!(session.last_seq() > before);
    /// # Ok(())
    /// # }
    /// ```
    pub fn last_seq(&self) -> u64 {
        self.shell.lock().machine.last_seq()
    }

    /// How one of the session's recent operations ended, if this handle
    /// knows: from a completion it received, or from the snapshot it
    /// attached with (Core keeps the last 32, across restarts). After a
    /// `TRANSPORT_DETACHED` rejection, whose `details.operationId` names the
    /// operation, a handle from `Pedelec::resume_session` tells how it
    /// really ended — `CORE_RESTARTED` when Core crashed during it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ErrorCode};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// if let Err(error) = session.send_text("Hello").await {
    ///     if error.is(ErrorCode::TransportDetached) {
    ///         let operation = error.details.as_ref().and_then(|d| d["operationId"].as_str()).unwrap_or_default();
    ///         let again = pedelec.resume_session::<String>(session.session_id()).await?;
    ///         println!("it ended as {:?}", again.operation_outcome(operation));
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn operation_outcome(&self, operation_id: &str) -> Option<Result<(), PedelecError>> {
        self.shell.lock().machine.outcome(operation_id)
    }

    /// Runs background work on the handle's transport (its runtime).
    pub(crate) fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.shell.transport.spawn(task);
    }

    /// Whether this handle lost its transport (use `Pedelec::resume_session`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let session = if session.is_detached() { pedelec.resume_session(session.session_id()).await? } else { session };
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_detached(&self) -> bool {
        self.shell.lock().machine.is_detached()
    }

    /// Starts one user turn; resolves on its `OperationCompleted`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_chat(|text, _ctx| println!("{text}"));
    /// session.send_text("Analyze the current page.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send_text(&self, text: impl Into<String>) -> Result<(), PedelecError> {
        self.send_text_with(text, SendOptions::default()).await.map(drop)
    }

    /// [`PedelecSession::send_text`] with options: `attachments` are public
    /// asset paths of this session's files (uploaded with `upload_asset`)
    /// sent to the agent with the text — images as image content where the
    /// provider takes them (else the turn is refused with
    /// `ATTACHMENT_UNSUPPORTED` before the agent sees it), other files as
    /// links or paths in the workspace. A malformed list is refused here
    /// (`ASSET_PATH_INVALID`, `INVALID_ARGUMENT`), a missing file by Core
    /// (`ASSET_NOT_FOUND`), before anything starts.
    ///
    /// With an `output_schema` (a JSON Schema object), the turn's final
    /// answer must be JSON valid against it: Core asks the agent for JSON,
    /// checks the answer, asks once more on a mismatch, and the call
    /// resolves with the value (`Some`); an answer that never fits is
    /// `OUTPUT_INVALID`, its `details.errors` saying why. Without a schema
    /// it resolves with `None`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SendOptions, assets::UploadSource};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let path = session.upload_asset(UploadSource::from_path("page.png").await?, Some("/screens/page.png")).await?;
    /// session.send_text_with("What is on this page?", SendOptions { attachments: vec![path], ..Default::default() }).await?;
    ///
    /// let schema = serde_json::json!({ "type": "object", "properties": { "title": { "type": "string" } } });
    /// let options = SendOptions { output_schema: Some(schema), ..Default::default() };
    /// let value = session.send_text_with("Name the page.", options).await?.expect("a typed answer");
    /// println!("{}", value["title"]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send_text_with(
        &self,
        text: impl Into<String>,
        options: SendOptions,
    ) -> Result<Option<serde_json::Value>, PedelecError> {
        if let Err((code, message)) = pedelec_protocol::asset_path::check_attachments(&options.attachments) {
            return Err(PedelecError::new(code, message));
        }
        let output_schema_json = match &options.output_schema {
            Some(schema) if !schema.is_object() => {
                return Err(PedelecError::new(ErrorCode::InvalidArgument, "output schema: must be a JSON object"));
            }
            Some(schema) => schema.to_string(),
            None => String::new(),
        };
        let request = pb::SendTextRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            text: text.into(),
            attachments: options.attachments,
            output_schema_json,
        };
        let output = self.shell.run_operation(pb::OperationKind::SendText, Call::SendText(request)).await?;
        output
            .map(|json| {
                serde_json::from_str(&json).map_err(|e| {
                    PedelecError::new(ErrorCode::OutputInvalid, format!("Core's typed answer is not JSON: {e}"))
                })
            })
            .transpose()
    }

    /// Optional preparation: idempotent after success; concurrent calls share one request.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// // Proves that the agent runs before the first real turn.
    /// session.prepare().await?;
    /// // Already prepared: resolves at once.
    /// session.prepare().await?;
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn prepare(&self) -> Result<(), PedelecError> {
        let shared = {
            let mut state = self.shell.lock();
            // The seed: prepare() rejects with SESSION_ENDED after end, even
            // on a handle that was prepared before.
            if state.machine.status() == SessionStatus::Ended {
                return Err(PedelecError::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            let prepared = state.machine.prepared();
            match (pedelec_protocol::prepare::start(prepared, state.prepare.is_some()), state.prepare.as_ref()) {
                (PrepareStart::Join, Some(shared)) => shared.clone(),
                (PrepareStart::AlreadyDone, _) => return Ok(()),
                _ => {
                    let shell = self.shell.clone();
                    let request = pb::PrepareRequest {
                        session_id: shell.session_id.clone(),
                        caller_origin: shell.origin.clone(),
                    };
                    let fut: BoxFuture<'static, Result<(), PedelecError>> = Box::pin(async move {
                        let out =
                            shell.run_operation(pb::OperationKind::Prepare, Call::Prepare(request)).await.map(drop);
                        shell.lock().prepare = None;
                        out
                    });
                    let shared = fut.shared();
                    state.prepare = Some(shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    /// Ends the Core session. Resolves at once when already ended.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.end().await?;
    /// assert_eq!(session.get_status(), SessionStatus::Ended);
    /// // Ending again is not an error.
    /// session.end().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn end(&self) -> Result<(), PedelecError> {
        if self.get_status() == SessionStatus::Ended {
            return Ok(());
        }
        let request =
            pb::EndRequest { session_id: self.shell.session_id.clone(), caller_origin: self.shell.origin.clone() };
        match self.shell.transport.call(Call::End(request)).await {
            Ok(Reply::End(_)) => {
                // `on_ended` has run when `end()` resolves, even when another
                // task is draining this session's effects right now.
                let flushed = self.shell.step_flushed(|state| state.machine.local_ended());
                self.shell.leave_client();
                let _ = flushed.await;
                Ok(())
            }
            Ok(other) => Err(self.shell.fail_end(unexpected(&other))),
            Err(error) => Err(self.shell.fail_end(error)),
        }
    }

    /// Stops the running operation (`Core.Cancel`): its awaited
    /// `send_text`/`prepare` rejects with `OPERATION_CANCELLED`, its pending
    /// tool calls are withdrawn, the status returns to idle, the text so far
    /// stays in the transcript and the next turn continues the same agent
    /// thread. Resolves once this handle has seen the operation settle (so
    /// [`PedelecSession::get_status`] is `idle` then). Works for an operation
    /// another handle or tab of the same origin started; nothing running
    /// (idle, ended) is a no-op.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ErrorCode, SessionStatus};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let (turn, cancelled) = futures::join!(session.send_text("Write a long essay."), session.cancel());
    /// cancelled?;
    /// if let Err(error) = turn {
    ///     assert!(error.is(ErrorCode::OperationCancelled));
    /// }
    /// assert_eq!(session.get_status(), SessionStatus::Idle);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cancel(&self) -> Result<(), PedelecError> {
        if self.get_status() == SessionStatus::Ended {
            return Ok(());
        }
        if self.is_detached() {
            return Err(detached_error());
        }
        // A start of this handle still on its way: its operation is the one
        // to cancel, so wait for Core's answer (bounded by the call itself).
        if let Some(answered) = self.shell.wait(SessionMachine::wait_for_start) {
            let _ = answered.await;
        }
        let request = pb::CancelRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            operation_id: String::new(),
        };
        let settled_seq = match self.shell.transport.call(Call::Cancel(request)).await? {
            Reply::Cancel(response) => response.settled_seq,
            other => return Err(unexpected(&other)),
        };
        // Woken by the event, a re-sync's snapshot past it, or detaching.
        if let Some(seen) = self.shell.wait(|machine| machine.wait_for_seq(settled_seq)) {
            let _ = seen.await;
        }
        Ok(())
    }

    /// Adds `text` to the turn that is running, where the agent can take
    /// input mid-turn (codex at once; claude at its next tool round or right
    /// after its answer; the built-in `scripted` provider). Resolves
    /// once the agent took it; the running `send_text` still resolves once,
    /// at the turn's end, and the text is the user's in the history.
    /// Refused without sending anything: `STEER_UNSUPPORTED` for an agent
    /// that cannot be steered, `TURN_NOT_RUNNING` when no turn runs (or it
    /// ends first), `INVALID_ARGUMENT` for empty text, `TEXT_TOO_LARGE`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ErrorCode};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let turn = session.send_text("Rename the module.");
    /// let steer = async {
    ///     match session.steer("Keep the old name as an alias.").await {
    ///         Err(error) if error.is(ErrorCode::SteerUnsupported) => println!("this agent takes no input mid-turn"),
    ///         other => other?,
    ///     }
    ///     Ok::<_, pedelec_sdk::PedelecError>(())
    /// };
    /// let (turn, steered) = futures::join!(turn, steer);
    /// turn?;
    /// steered?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn steer(&self, text: impl Into<String>) -> Result<(), PedelecError> {
        if self.is_detached() {
            return Err(detached_error());
        }
        // A start of this handle still on its way: its turn is the one to
        // steer, so wait for Core's answer (bounded by the call itself).
        if let Some(answered) = self.shell.wait(SessionMachine::wait_for_start) {
            let _ = answered.await;
        }
        let request = pb::SteerRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            text: text.into(),
            operation_id: String::new(),
        };
        match self.shell.transport.call(Call::Steer(request)).await? {
            Reply::Steer(_) => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// A new session that continues a copy of this one's conversation, with
    /// its own id; both go on independently. It has this session's
    /// provider, model, effort, tools and permission mode, and works in the
    /// same folder (or a copy of a managed workspace). The new handle
    /// answers the agent with this handle's tool and permission handlers;
    /// listeners (`on_chat`, …) are registered on it anew. Fork between
    /// turns: `SESSION_BUSY` while one runs, `SESSION_ENDED` once ended,
    /// `FORK_UNSUPPORTED` for an agent that cannot fork (nothing created).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Outline two ways to fix the bug.").await?;
    /// let other = session.fork().await?;
    /// session.send_text("Try the first way.").await?;
    /// other.send_text("Try the second way.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fork(&self) -> Result<PedelecSession<T>, PedelecError> {
        if self.is_detached() {
            return Err(detached_error());
        }
        let request = pb::ForkRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            auto_end_on_disconnect: None,
        };
        let info = match self.shell.transport.call(Call::Fork(request)).await? {
            Reply::Fork(pb::CreateSessionResponse { session: Some(info) }) => info,
            other => return Err(unexpected(&other)),
        };
        let meta = SessionMeta {
            session_id: info.session_id.clone(),
            provider: info.provider.clone(),
            effort_level: SessionMeta::effort(info.effort_level),
            session_created_at: crate::context::now_ms(),
        };
        let handlers = self.shell.lock().handlers.for_fork();
        let fork = Self::with_handlers(
            self.shell.transport.clone(),
            self.shell.registry.clone(),
            self.shell.origin.clone(),
            meta,
            handlers,
        );
        fork.attach().await?;
        Ok(fork)
    }

    /// Changes the model (and the effort level, unless `None`) the session's
    /// turns run with, from the next one; the agent goes on with the same
    /// conversation (Core restarts its runtime and resumes the thread with
    /// the new model). Resolves with the session's info as it now stands.
    /// `INVALID_ARGUMENT` for an empty or malformed model name,
    /// `SESSION_ENDED` once the session ended.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::pb::EffortLevel;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Sketch a plan.").await?;
    /// let info = session.set_model("gpt-5.1-codex", Some(EffortLevel::High)).await?;
    /// assert_eq!(info.model, "gpt-5.1-codex");
    /// session.send_text("Now carry it out.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_model(
        &self,
        model: impl Into<String>,
        effort_level: Option<pb::EffortLevel>,
    ) -> Result<pb::SessionInfo, PedelecError> {
        if self.is_detached() {
            return Err(detached_error());
        }
        let request = pb::SetModelRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            model: model.into(),
            effort_level: effort_level.unwrap_or_default() as i32,
        };
        match self.shell.transport.call(Call::SetModel(request)).await? {
            Reply::SetModel(response) => Ok(response.session.unwrap_or_default()),
            other => Err(unexpected(&other)),
        }
    }

    /// Replaces the session's frontend tools between turns: Core checks
    /// them as `create_session` does (`TOOLS_MANIFEST_INVALID`), every
    /// later call is checked against them, and the agent sees the new list
    /// from its next turn. The tools' inline handlers replace this handle's
    /// (a named `on_tool` still wins). `SESSION_BUSY` while a turn runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec, sync_handler};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let schema = serde_json::json!({ "type": "object" });
    /// let title = ToolSpec::new("page_title".to_string(), "The page's title", schema)
    ///     .with_handler(sync_handler(|_: serde_json::Value, _| Ok::<_, String>(serde_json::json!("Pedelec"))));
    /// session.set_tools(vec![title]).await?;
    /// session.send_text("What is the page called?").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_tools(&self, tools: Vec<crate::ToolSpec<T>>) -> Result<(), PedelecError> {
        if self.is_detached() {
            return Err(detached_error());
        }
        let request = pb::SetToolsRequest {
            session_id: self.shell.session_id.clone(),
            caller_origin: self.shell.origin.clone(),
            tools: tools.iter().map(|t| t.definition()).collect(),
        };
        match self.shell.transport.call(Call::SetTools(request)).await? {
            Reply::SetTools(_) => {}
            other => return Err(unexpected(&other)),
        }
        let inline = tools.into_iter().filter_map(|t| t.handler.map(|h| (t.name.as_str().to_owned(), h))).collect();
        self.shell.lock().handlers.inline = inline;
        Ok(())
    }

    /// Reactivates this handle after `end()` (ended → idle on the same thread).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Remember the number 7.").await?;
    /// session.end().await?;
    /// session.resume().await?;
    /// assert_eq!(session.get_status(), SessionStatus::Idle);
    /// // The agent's thread continues.
    /// session.send_text("Which number was it?").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn resume(&self) -> Result<(), PedelecError> {
        if self.is_detached() {
            return Err(detached_error());
        }
        if self.get_status() != SessionStatus::Ended {
            return Ok(());
        }
        let shared = {
            let mut state = self.shell.lock();
            match state.resume.as_ref() {
                Some(shared) => shared.clone(),
                None => {
                    let shell = self.shell.clone();
                    let fut: BoxFuture<'static, Result<(), PedelecError>> = Box::pin(async move {
                        let out = shell.resume().await;
                        shell.lock().resume = None;
                        out
                    });
                    let shared = fut.shared();
                    state.resume = Some(shared.clone());
                    shared
                }
            }
        };
        shared.await
    }
}

/// Options of one [`PedelecSession::send_text_with`].
///
/// # Examples
///
/// ```
/// use pedelec_sdk::SendOptions;
///
/// let options = SendOptions { attachments: vec!["/screens/page.png".into()], ..Default::default() };
/// // No attachments by default: `send_text_with(text, SendOptions::default())` is `send_text(text)`.
/// assert!(SendOptions::default().attachments.is_empty());
/// assert_eq!(options.attachments.len(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// Public asset paths, e.g. `"/screens/page.png"` (at most 16).
    pub attachments: Vec<String>,
    /// A JSON Schema object the turn's answer must satisfy: the call then
    /// resolves with the answer as a value.
    pub output_schema: Option<serde_json::Value>,
}

/// What a detached handle answers to calls that need Core.
pub(super) fn detached_error() -> PedelecError {
    PedelecError::new(ErrorCode::TransportDetached, "this handle lost its transport; use Pedelec::resume_session")
}
