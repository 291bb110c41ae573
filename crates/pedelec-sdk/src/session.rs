//! `PedelecSession<T>`: the application's handle on one Core session. It
//! feeds the [`SessionMachine`] and carries out its effects: handlers,
//! promise settlement, tool submission. All I/O goes through the transport.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus};
//!
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! let _off = session.on_chat(|text, _ctx| println!("{text}"));
//! session.send_text("Analyze the current page.").await?;
//! session.end().await?;
//! assert_eq!(session.get_status(), SessionStatus::Ended);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use futures::FutureExt;
use futures::StreamExt;
use futures::channel::oneshot;
use futures::future::Shared;
use pedelec_protocol::prepare::PrepareStart;
use pedelec_protocol::{ErrorCode, OperationId, SessionStatus, pb};
use serde::{Serialize, de::DeserializeOwned};

use crate::context::{EventContext, SessionMeta, StatusContext, ToolCallContext, now_ms};
use crate::error::PedelecError;
use crate::machine::{Accepted, HandleEffect, SessionMachine, ToolRequest};
use crate::tool::{GenericToolHandlerFn, ToolHandlerFn, ToolName, handler, sync_handler};
use crate::transport::{BoxFuture, Call, Reply, Transport, unexpected};

pub use pedelec_protocol::history::HistoryQuery;

type ChatFn = Arc<dyn Fn(&str, &EventContext) + Send + Sync>;
type StatusFn = Arc<dyn Fn(SessionStatus, &StatusContext) + Send + Sync>;
type ErrorFn = Arc<dyn Fn(&PedelecError, &EventContext) + Send + Sync>;
type EndedFn = Arc<dyn Fn(&EventContext) + Send + Sync>;
type UsageFn = Arc<dyn Fn(u64) + Send + Sync>;
type ActivityFn = Arc<dyn Fn(&pb::Activity, &EventContext) + Send + Sync>;
/// A permission handler: the chosen option id, or `None` to reject.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pedelec_sdk::pb::{PermissionOption, PermissionRequest};
/// use pedelec_sdk::session::PermissionFn;
///
/// // What `on_permission` makes of a closure: here, always the first option.
/// let first: PermissionFn =
///     Arc::new(|request, _ctx| Box::pin(async move { request.options.first().map(|o| o.option_id.clone()) }));
/// let request = PermissionRequest {
///     options: vec![PermissionOption { option_id: "allow".into(), ..Default::default() }],
///     ..Default::default()
/// };
/// let ctx = pedelec_sdk::context::SessionMeta::default().core(pedelec_sdk::context::EventKind::PermissionRequested, None, 0, None);
/// assert_eq!(futures::executor::block_on(first(request, ctx)), Some("allow".to_string()));
/// ```
pub type PermissionFn =
    Arc<dyn Fn(pb::PermissionRequest, EventContext) -> BoxFuture<'static, Option<String>> + Send + Sync>;
type SharedOutcome = Shared<BoxFuture<'static, Result<(), PedelecError>>>;

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

/// Returned by every `on_*`: call [`Disposer::dispose`] to unregister.
/// Dropping it keeps the handler registered; disposing never cancels running work.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::{Pedelec, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let off = session.on_chat_delta(|delta, _ctx| print!("{delta}"));
/// session.send_text("Stream this answer.").await?;
/// // Later turns run without the handler.
/// off.dispose();
/// session.send_text("Not streamed.").await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "keep the disposer to unregister the handler later"]
pub struct Disposer(Option<Box<dyn FnOnce() + Send>>);

impl Disposer {
    /// Unregisters the handler; a call it is running finishes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let off = session.on_status(|status, ctx| println!("{} → {status}", ctx.previous_status));
    /// session.send_text("Hello").await?;
    /// off.dispose();
    /// # Ok(())
    /// # }
    /// ```
    pub fn dispose(mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

#[derive(Default)]
struct Handlers {
    next: u64,
    chat: Vec<(u64, ChatFn)>,
    delta: Vec<(u64, ChatFn)>,
    status: Vec<(u64, StatusFn)>,
    error: Vec<(u64, ErrorFn)>,
    ended: Vec<(u64, EndedFn)>,
    usage: Vec<(u64, UsageFn)>,
    activity: Vec<(u64, ActivityFn)>,
    permission: Vec<(u64, PermissionFn)>,
    named: Vec<(u64, String, ToolHandlerFn)>,
    inline: HashMap<String, ToolHandlerFn>,
    generic: Vec<(u64, GenericToolHandlerFn<String>)>,
}

impl Handlers {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn has_tool(&self, tool: &str) -> bool {
        self.named.iter().any(|(_, n, _)| n == tool) || self.inline.contains_key(tool) || !self.generic.is_empty()
    }

    /// Named > inline > generic; the newest registration of a kind wins.
    fn tool(&self, tool: &str) -> Option<ToolHandlerFn> {
        if let Some((_, _, h)) = self.named.iter().rev().find(|(_, n, _)| n == tool) {
            return Some(h.clone());
        }
        if let Some(h) = self.inline.get(tool) {
            return Some(h.clone());
        }
        self.generic.last().map(|(_, g)| {
            let g = g.clone();
            let name = tool.to_owned();
            Arc::new(move |args, ctx| g(name.clone(), args, ctx)) as ToolHandlerFn
        })
    }
}

/// Removes a session from its client's registry.
pub(crate) type Registry = Arc<Mutex<HashMap<String, Weak<Inner>>>>;

pub(crate) struct Inner {
    pub(crate) session_id: String,
    origin: String,
    transport: Arc<dyn Transport>,
    registry: Registry,
    machine: Mutex<SessionMachine>,
    /// Effects waiting to run, in the order the machine produced them.
    dispatch: Mutex<Dispatch>,
    handlers: Mutex<Handlers>,
    waiters: Mutex<HashMap<OperationId, oneshot::Sender<Result<(), PedelecError>>>>,
    prepare: Mutex<Option<SharedOutcome>>,
    resume: Mutex<Option<SharedOutcome>>,
    detached: AtomicBool,
    generation: AtomicU64,
    event_loop: Mutex<Option<futures::future::AbortHandle>>,
    /// `cancel()` calls waiting until the stream has handled a seq (their
    /// operation's `OperationCompleted`); dropped, so woken, on detach.
    seq_waiters: Mutex<Vec<(u64, oneshot::Sender<()>)>>,
    /// `cancel()` calls waiting for this handle's start request to be
    /// answered (so the operation they cancel is the one it started).
    start_waiters: Mutex<Vec<oneshot::Sender<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle is gone: stop listening so Core sees the subscriber leave.
        if let Some(handle) = lock(&self.event_loop).take() {
            handle.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    inner: Arc<Inner>,
    _names: PhantomData<fn() -> T>,
}

impl<T: ToolName> Clone for PedelecSession<T> {
    fn clone(&self) -> Self {
        PedelecSession { inner: self.inner.clone(), _names: PhantomData }
    }
}

impl<T: ToolName> std::fmt::Debug for PedelecSession<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PedelecSession").field("session_id", &self.inner.session_id).finish()
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
        let handlers = Handlers { inline, ..Handlers::default() };
        let inner = Arc::new(Inner {
            session_id: meta.session_id.clone(),
            origin,
            transport,
            registry,
            machine: Mutex::new(SessionMachine::new(meta)),
            dispatch: Mutex::default(),
            handlers: Mutex::new(handlers),
            waiters: Mutex::default(),
            prepare: Mutex::default(),
            resume: Mutex::default(),
            detached: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            event_loop: Mutex::default(),
            seq_waiters: Mutex::default(),
            start_waiters: Mutex::default(),
        });
        PedelecSession { inner, _names: PhantomData }
    }

    /// Subscribes, adopts the first snapshot, then follows live events in the background.
    pub(crate) async fn attach(&self) -> Result<(), PedelecError> {
        Inner::attach(&self.inner).await?;
        lock(&self.inner.registry).insert(self.inner.session_id.clone(), Arc::downgrade(&self.inner));
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
        &self.inner.session_id
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
        lock(&self.inner.machine).meta().provider.clone()
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
        lock(&self.inner.machine).meta().effort_level
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
        lock(&self.inner.machine).meta().session_created_at
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
        PedelecSessionUsage { total_tokens: lock(&self.inner.machine).usage() }
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
        lock(&self.inner.machine).status()
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
        lock(&self.inner.machine).last_seq()
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
        lock(&self.inner.machine).outcome(operation_id)
    }

    /// Runs background work on the handle's transport (its runtime).
    pub(crate) fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.inner.transport.spawn(task);
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
        self.inner.detached.load(Ordering::SeqCst)
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
        self.send_text_with(text, SendOptions::default()).await
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
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SendOptions, assets::UploadSource};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let path = session.upload_asset(UploadSource::from_path("page.png").await?, Some("/screens/page.png")).await?;
    /// session.send_text_with("What is on this page?", SendOptions { attachments: vec![path] }).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send_text_with(&self, text: impl Into<String>, options: SendOptions) -> Result<(), PedelecError> {
        if let Err((code, message)) = pedelec_protocol::asset_path::check_attachments(&options.attachments) {
            return Err(PedelecError::new(code, message));
        }
        let request = pb::SendTextRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
            text: text.into(),
            attachments: options.attachments,
        };
        Inner::run_operation(&self.inner, pb::OperationKind::SendText, Call::SendText(request)).await
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
            let mut slot = lock(&self.inner.prepare);
            // The seed: prepare() rejects with SESSION_ENDED after end, even
            // on a handle that was prepared before.
            if self.get_status() == SessionStatus::Ended {
                return Err(PedelecError::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            let prepared = lock(&self.inner.machine).prepared();
            match (pedelec_protocol::prepare::start(prepared, slot.is_some()), slot.as_ref()) {
                (PrepareStart::Join, Some(shared)) => shared.clone(),
                (PrepareStart::AlreadyDone, _) => return Ok(()),
                _ => {
                    let inner = self.inner.clone();
                    let request = pb::PrepareRequest {
                        session_id: inner.session_id.clone(),
                        caller_origin: inner.origin.clone(),
                    };
                    let fut: BoxFuture<'static, Result<(), PedelecError>> = Box::pin(async move {
                        let out =
                            Inner::run_operation(&inner, pb::OperationKind::Prepare, Call::Prepare(request)).await;
                        *lock(&inner.prepare) = None;
                        out
                    });
                    let shared = fut.shared();
                    *slot = Some(shared.clone());
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
            pb::EndRequest { session_id: self.inner.session_id.clone(), caller_origin: self.inner.origin.clone() };
        match self.inner.transport.call(Call::End(request)).await {
            Ok(Reply::End(_)) => {
                // `on_ended` has run when `end()` resolves, even when another
                // task is draining this session's effects right now.
                let flushed = self.inner.step_flushed(SessionMachine::local_ended);
                lock(&self.inner.registry).remove(&self.inner.session_id);
                let _ = flushed.await;
                Ok(())
            }
            Ok(other) => Err(self.inner.fail_end(unexpected(&other))),
            Err(error) => Err(self.inner.fail_end(error)),
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
        let answered = {
            let mut waiters = lock(&self.inner.start_waiters);
            lock(&self.inner.machine).is_starting().then(|| {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                rx
            })
        };
        if let Some(answered) = answered {
            let _ = answered.await;
        }
        let request = pb::CancelRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
            operation_id: String::new(),
        };
        let settled_seq = match self.inner.transport.call(Call::Cancel(request)).await? {
            Reply::Cancel(response) => response.settled_seq,
            other => return Err(unexpected(&other)),
        };
        let seen = {
            let mut waiters = lock(&self.inner.seq_waiters);
            if settled_seq == 0 || self.last_seq() >= settled_seq || self.is_detached() {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            waiters.push((settled_seq, tx));
            rx
        };
        // Woken by the event, a re-sync's snapshot past it, or detaching.
        let _ = seen.await;
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
            let mut slot = lock(&self.inner.resume);
            match slot.as_ref() {
                Some(shared) => shared.clone(),
                None => {
                    let inner = self.inner.clone();
                    let fut: BoxFuture<'static, Result<(), PedelecError>> = Box::pin(async move {
                        let out = Inner::resume(&inner).await;
                        *lock(&inner.resume) = None;
                        out
                    });
                    let shared = fut.shared();
                    *slot = Some(shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    fn register<F>(&self, add: impl FnOnce(&mut Handlers, u64) -> F, remove: fn(&mut Handlers, u64)) -> Disposer {
        let id = {
            let mut h = lock(&self.inner.handlers);
            let id = h.id();
            add(&mut h, id);
            id
        };
        let weak = Arc::downgrade(&self.inner);
        Disposer(Some(Box::new(move || {
            if let Some(inner) = weak.upgrade() {
                remove(&mut lock(&inner.handlers), id);
            }
        })))
    }

    /// The agent's own work — tool calls, commands, file edits, plans,
    /// thinking — each call the whole current state of one activity
    /// (`activity_id` says which; statuses pending → in progress →
    /// completed/failed). A frontend tool call the agent could not make
    /// shows here as failed, with its reason in `output`. A handler
    /// registered mid-turn is first told the turn's activities so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::activity::{kind_name, summary};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_activity(|a, _ctx| println!("{} {}", kind_name(a.kind), summary(a)));
    /// session.send_text("Run the tests.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_activity(&self, f: impl Fn(&pb::Activity, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ActivityFn = Arc::new(f);
        // Registered, and the running turn's activities queued, under the
        // machine's lock: they run before any later update. Handlers that
        // were there already hear them again — the same whole states.
        let machine = lock(&self.inner.machine);
        let disposer =
            self.register(move |h, id| h.activity.push((id, f)), |h, id| h.activity.retain(|(i, _)| *i != id));
        let so_far: Vec<HandleEffect> = machine
            .running_activities()
            .iter()
            .map(|(activity, ctx)| HandleEffect::Activity { activity: activity.clone(), ctx: ctx.clone() })
            .collect();
        self.inner.enqueue(so_far);
        drop(machine);
        self.inner.drain();
        disposer
    }

    /// Answers the agent's permission requests (sessions created with
    /// `permission_mode: PermissionMode::App`): `f` gets the request — what
    /// it is about as an activity (kind, title, command, paths), the agent's
    /// options — and returns the chosen option id, or `None` to reject. The
    /// newest handler answers. Without a handler the request gets the option
    /// Core's policy would choose (`policy_option_id`); without an answer by
    /// its deadline Core rejects it. The first answer from any handle of the
    /// origin wins. A request only the user may answer
    /// (`PermissionRequest.user_only`: a web page's agent asking to run a
    /// command or to leave its workspace) never reaches `f`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::pb::{PermissionMode, PermissionOptionKind};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let options = SessionOptions { permission_mode: PermissionMode::App, ..Default::default() };
    /// let session = pedelec.create_session::<String>(options).await?;
    /// let _off = session.on_permission(|request, _ctx| async move {
    ///     let once = request.options.iter().find(|o| o.kind == PermissionOptionKind::AllowOnce as i32);
    ///     once.map(|o| o.option_id.clone())
    /// });
    /// session.send_text("Deploy the site.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_permission<F, Fut>(&self, f: F) -> Disposer
    where
        F: Fn(pb::PermissionRequest, EventContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Option<String>> + Send + 'static,
    {
        let f: PermissionFn = Arc::new(move |request, ctx| Box::pin(f(request, ctx)));
        self.register(move |h, id| h.permission.push((id, f)), |h, id| h.permission.retain(|(i, _)| *i != id))
    }

    /// Completed assistant messages.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_chat(|text, ctx| println!("[{}] {text}", ctx.session_id));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_chat(&self, f: impl Fn(&str, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ChatFn = Arc::new(f);
        self.register(move |h, id| h.chat.push((id, f)), |h, id| h.chat.retain(|(i, _)| *i != id))
    }

    /// Best-effort incremental assistant text.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let live = Arc::new(Mutex::new(String::new()));
    /// let sink = live.clone();
    /// let _off = session.on_chat_delta(move |delta, _ctx| sink.lock().unwrap().push_str(delta));
    /// session.send_text("Hello").await?;
    /// println!("streamed: {}", live.lock().unwrap());
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_chat_delta(&self, f: impl Fn(&str, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ChatFn = Arc::new(f);
        self.register(move |h, id| h.delta.push((id, f)), |h, id| h.delta.retain(|(i, _)| *i != id))
    }

    /// Status changes (only when the value changes; never the initial value).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_status(|status, ctx| {
    ///     println!("{} → {status} ({})", ctx.previous_status, ctx.source.as_str());
    /// });
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_status(&self, f: impl Fn(SessionStatus, &StatusContext) + Send + Sync + 'static) -> Disposer {
        let f: StatusFn = Arc::new(f);
        self.register(move |h, id| h.status.push((id, f)), |h, id| h.status.retain(|(i, _)| *i != id))
    }

    /// Core and SDK errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_error(|error, ctx| eprintln!("{} ({}): {}", error.code, ctx.kind, error.message));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_error(&self, f: impl Fn(&PedelecError, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ErrorFn = Arc::new(f);
        self.register(move |h, id| h.error.push((id, f)), |h, id| h.error.retain(|(i, _)| *i != id))
    }

    /// Each transition into ended.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_ended(|ctx| println!("session {} ended ({})", ctx.session_id, ctx.kind));
    /// session.end().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_ended(&self, f: impl Fn(&EventContext) + Send + Sync + 'static) -> Disposer {
        let f: EndedFn = Arc::new(f);
        self.register(move |h, id| h.ended.push((id, f)), |h, id| h.ended.retain(|(i, _)| *i != id))
    }

    /// Usage growth (never runs chat, status or error handlers).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_usage(|total| println!("{total} tokens"));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_usage(&self, f: impl Fn(u64) + Send + Sync + 'static) -> Disposer {
        let f: UsageFn = Arc::new(f);
        self.register(move |h, id| h.usage.push((id, f)), |h, id| h.usage.retain(|(i, _)| *i != id))
    }

    /// Named async handler for one tool (overrides an inline handler).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// #[derive(serde::Deserialize)]
    /// struct Delta {
    ///     delta: i64,
    /// }
    ///
    /// let _off = session.on_tool("update_counter".to_string(), |args: Delta, _ctx| async move {
    ///     Ok::<_, String>(serde_json::json!({ "value": 41 + args.delta }))
    /// });
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool<A, R, E, F, Fut>(&self, tool: T, f: F) -> Disposer
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        E: std::fmt::Display + 'static,
        F: Fn(A, ToolCallContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<R, E>> + Send + 'static,
    {
        self.on_tool_fn(tool, handler(f))
    }

    /// Named synchronous handler for one tool.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// let _off = session.on_tool_sync("update_counter".to_string(), |args: serde_json::Value, ctx| {
    ///     println!("call {} asks for {args}", ctx.tool_request_id);
    ///     Ok::<_, String>(serde_json::json!({ "value": 1 }))
    /// });
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool_sync<A, R, E, F>(&self, tool: T, f: F) -> Disposer
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: Fn(A, ToolCallContext) -> Result<R, E> + Send + Sync + 'static,
    {
        self.on_tool_fn(tool, sync_handler(f))
    }

    /// Named handler from an erased function.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    /// use pedelec_sdk::sync_handler;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// // A handler built once and registered for several sessions.
    /// let counter = sync_handler(|_: serde_json::Value, _ctx| Ok::<_, String>(serde_json::json!({ "value": 1 })));
    /// let _off = session.on_tool_fn("update_counter".to_string(), counter);
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool_fn(&self, tool: T, f: ToolHandlerFn) -> Disposer {
        let name = tool.as_str().to_owned();
        let disposer =
            self.register(move |h, id| h.named.push((id, name, f)), |h, id| h.named.retain(|(i, _, _)| *i != id));
        self.release_queued();
        disposer
    }

    /// Generic fallback for every tool without a named or inline handler.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// let _off = session.on_any_tool(|tool: String, args, _ctx| async move {
    ///     Err::<serde_json::Value, _>(format!("{tool} is not available here (got {args})"))
    /// });
    /// session.send_text("Use any tool you like.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_any_tool<F, Fut>(&self, f: F) -> Disposer
    where
        F: Fn(T, serde_json::Value, ToolCallContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<serde_json::Value, String>> + Send + 'static,
    {
        let f = Arc::new(f);
        let g: GenericToolHandlerFn<String> = Arc::new(move |name: String, args, ctx| {
            let f = f.clone();
            Box::pin(async move {
                let name =
                    T::from_name(&name).ok_or_else(|| format!("tool {name:?} is not one of this session's tools"))?;
                f(name, args, ctx).await
            })
        });
        let disposer = self.register(move |h, id| h.generic.push((id, g)), |h, id| h.generic.retain(|(i, _)| *i != id));
        self.release_queued();
        disposer
    }

    fn release_queued(&self) {
        let inner = &self.inner;
        inner.step(|machine| {
            let handlers = lock(&inner.handlers);
            machine.handler_registered(&|tool| handlers.has_tool(tool))
        });
    }
}

/// One entry of a session's effects queue.
// Nearly every entry is an effect; boxing them to shrink the rare marker
// would allocate once per streamed delta.
#[allow(clippy::large_enum_variant)]
enum Queued {
    HandleEffect(HandleEffect),
    /// Wakes a caller once every effect queued before it has run.
    Flushed(oneshot::Sender<()>),
}

/// The effects queue of one session (see [`Inner::drain`]).
#[derive(Default)]
struct Dispatch {
    queue: Vec<Queued>,
    /// Whether a task is running queued effects now.
    draining: bool,
}

/// What a detached handle answers to calls that need Core.
fn detached_error() -> PedelecError {
    PedelecError::new(ErrorCode::TransportDetached, "this handle lost its transport; use Pedelec::resume_session")
}

/// How often a tool result is tried before its failure is reported.
const SUBMIT_ATTEMPTS: u32 = 5;

/// Whether an error means the request may not have reached Core (worth
/// another try), not that Core refused it.
fn is_delivery_failure(error: &PedelecError) -> bool {
    matches!(
        ErrorCode::parse(&error.code),
        Some(ErrorCode::TransportError | ErrorCode::TransportDetached | ErrorCode::CoreRuntimeUnavailable)
    )
}

/// Wakes `cancel()` calls once the start's answer has reached the machine
/// (dropped right after it did, or on any early return before).
struct StartAnswered<'a>(&'a Inner);

impl Drop for StartAnswered<'_> {
    fn drop(&mut self) {
        self.0.start_answered();
    }
}

/// Undoes a local start whose request future was dropped before its answer.
struct StartGuard {
    inner: Arc<Inner>,
    armed: bool,
}

impl StartGuard {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if self.armed {
            self.inner.step(SessionMachine::operation_failed_to_start);
            self.inner.start_answered();
        }
    }
}

impl Inner {
    async fn attach(self: &Arc<Self>) -> Result<(), PedelecError> {
        let request = pb::SubscribeRequest { session_id: self.session_id.clone(), caller_origin: self.origin.clone() };
        let mut stream = self.transport.subscribe(request).await?;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        match stream.next().await {
            Some(Ok(first)) => self.feed(&first),
            Some(Err(error)) => return Err(error),
            None => {
                return Err(PedelecError::new(
                    ErrorCode::TransportError,
                    "the subscription closed before its snapshot",
                ));
            }
        }
        self.detached.store(false, Ordering::SeqCst);
        let weak = Arc::downgrade(self);
        let (abort, registration) = futures::future::AbortHandle::new_pair();
        if let Some(previous) = lock(&self.event_loop).replace(abort) {
            previous.abort();
        }
        let event_loop = futures::future::Abortable::new(
            async move {
                while let Some(item) = stream.next().await {
                    let Some(inner) = weak.upgrade() else { return };
                    if inner.generation.load(Ordering::SeqCst) != generation {
                        return;
                    }
                    match item {
                        Ok(event) => inner.feed(&event),
                        // The transport knows the session was ended where
                        // this stream cannot carry it (the origin revoked).
                        Err(error) if error.code == ErrorCode::SessionEnded.as_str() => {
                            inner.step(SessionMachine::ended_elsewhere);
                            lock(&inner.registry).remove(&inner.session_id);
                            return;
                        }
                        Err(error) => {
                            tracing::debug!(%error, "subscription failed");
                            break;
                        }
                    }
                }
                if let Some(inner) = weak.upgrade()
                    && inner.generation.load(Ordering::SeqCst) == generation
                {
                    inner.detach();
                }
            },
            registration,
        );
        self.transport.spawn(Box::pin(async move {
            let _ = event_loop.await;
        }));
        Ok(())
    }

    fn detach(self: &Arc<Self>) {
        self.detached.store(true, Ordering::SeqCst);
        lock(&self.seq_waiters).clear();
        self.step(|machine| {
            let mut e = machine.detached();
            // An ended session whose transport closes (Core stopping cleanly,
            // the app going away) lost nothing: that is not an error.
            if machine.status() != SessionStatus::Ended {
                let lost = PedelecError::new(ErrorCode::TransportDetached, "the connection to Core was lost");
                e.push(machine.sdk_error(lost));
            }
            e
        });
    }

    fn feed(self: &Arc<Self>, event: &pb::SessionEvent) {
        let mut handled = 0;
        self.step(|machine| {
            let handlers = lock(&self.handlers);
            let effects = machine.on_event(event, now_ms(), &|tool| handlers.has_tool(tool));
            handled = machine.last_seq();
            effects
        });
        let mut waiters = lock(&self.seq_waiters);
        if !waiters.is_empty() {
            for (_, waiter) in waiters.extract_if(.., |(seq, _)| *seq <= handled) {
                let _ = waiter.send(());
            }
        }
    }

    async fn run_operation(self: &Arc<Self>, kind: pb::OperationKind, call: Call) -> Result<(), PedelecError> {
        let mut refused = None;
        self.step(|machine| {
            machine.begin_local(kind).unwrap_or_else(|error| {
                refused = Some(error);
                Vec::new()
            })
        });
        if let Some(error) = refused {
            return Err(error);
        }
        // Cancellation safety: a caller that drops this future before Core's
        // answer is processed (a timeout around send_text) must not leave
        // the handle believing an operation is starting, refusing every
        // later one with SESSION_BUSY. What Core then runs, the events show.
        let starting = StartGuard { inner: self.clone(), armed: true };
        let reply = self.transport.call(call).await;
        starting.disarm();
        let accepted = match reply {
            Ok(Reply::SendText(a) | Reply::Prepare(a)) => a,
            Ok(other) => return Err(self.failed_to_start(unexpected(&other))),
            Err(error) => return Err(self.failed_to_start(error)),
        };
        let answered = StartAnswered(self);
        let receiver = {
            let mut machine = lock(&self.machine);
            let (state, effects) = machine.operation_accepted(&accepted);
            let receiver = match state {
                Accepted::Pending => {
                    // In place before the effects are queued, so no drainer
                    // can run this operation's settling before it.
                    let (tx, rx) = oneshot::channel();
                    lock(&self.waiters).insert(OperationId::new(accepted.operation_id.clone()), tx);
                    self.enqueue(effects);
                    Ok(rx)
                }
                Accepted::Settled(outcome) => {
                    // Settled already (its events came first): resolve once
                    // the handlers of those events have run.
                    self.enqueue(effects);
                    Err((outcome, self.flushed_marker()))
                }
            };
            drop(machine);
            self.drain();
            receiver
        };
        drop(answered);
        match receiver {
            Ok(rx) => {
                rx.await.unwrap_or_else(|_| Err(PedelecError::new(ErrorCode::TransportDetached, "handle dropped")))
            }
            Err((outcome, flushed)) => {
                let _ = flushed.await;
                outcome
            }
        }
    }

    fn failed_to_start(self: &Arc<Self>, error: PedelecError) -> PedelecError {
        self.step(SessionMachine::operation_failed_to_start);
        self.start_answered();
        error
    }

    /// Wakes the `cancel()` calls that waited for the start's answer.
    fn start_answered(&self) {
        lock(&self.start_waiters).clear();
    }

    fn fail_end(self: &Arc<Self>, error: PedelecError) -> PedelecError {
        self.step(|machine| vec![machine.sdk_error(error.clone())]);
        error
    }

    async fn resume(self: &Arc<Self>) -> Result<(), PedelecError> {
        let request = pb::ResumeRequest { session_id: self.session_id.clone(), caller_origin: self.origin.clone() };
        match self.transport.call(Call::Resume(request)).await? {
            Reply::Resume(_) => {}
            other => return Err(unexpected(&other)),
        }
        // The fresh subscription's snapshot is the authoritative idle.
        self.attach().await?;
        lock(&self.registry).insert(self.session_id.clone(), Arc::downgrade(self));
        Ok(())
    }

    /// Feeds the machine and runs what it asks for. The effects are queued
    /// while the machine is still locked, so they run in the order the
    /// machine produced them whichever task feeds it.
    fn step(self: &Arc<Self>, f: impl FnOnce(&mut SessionMachine) -> Vec<HandleEffect>) {
        {
            let mut machine = lock(&self.machine);
            let effects = f(&mut machine);
            self.enqueue(effects);
        }
        self.drain();
    }

    /// [`Inner::step`], and a receiver that resolves once the effects it
    /// produced have run. `drain` returns at once when another task is
    /// draining, so without it an awaited call could resolve before its
    /// handlers ran. Await it outside any handler: a handler's own effects
    /// run only after it returns.
    fn step_flushed(self: &Arc<Self>, f: impl FnOnce(&mut SessionMachine) -> Vec<HandleEffect>) -> oneshot::Receiver<()> {
        let flushed = {
            let mut machine = lock(&self.machine);
            let effects = f(&mut machine);
            self.enqueue(effects);
            self.flushed_marker()
        };
        self.drain();
        flushed
    }

    /// Queues a marker after everything queued so far; its receiver
    /// resolves once those effects have run. Call with the machine locked,
    /// like [`Inner::enqueue`].
    fn flushed_marker(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        lock(&self.dispatch).queue.push(Queued::Flushed(tx));
        rx
    }

    /// Queues effects; call with the machine locked (lock order: machine,
    /// then handlers, then the dispatch queue, which is never held while a
    /// handler runs).
    fn enqueue(&self, effects: Vec<HandleEffect>) {
        if !effects.is_empty() {
            lock(&self.dispatch).queue.extend(effects.into_iter().map(Queued::HandleEffect));
        }
    }

    /// Runs queued effects, one drainer at a time: on a multi-thread runtime
    /// two tasks feeding the machine would otherwise run their handlers
    /// interleaved (an `on_status` for `idle` before the one for `running`).
    /// A handler that feeds the machine itself only queues; the drainer runs
    /// those effects right after it returns.
    fn drain(self: &Arc<Self>) {
        let mut batch = {
            let mut dispatch = lock(&self.dispatch);
            if dispatch.draining || dispatch.queue.is_empty() {
                return;
            }
            dispatch.draining = true;
            std::mem::take(&mut dispatch.queue)
        };
        // A handler that panics must not leave the queue marked as drained
        // by someone: later effects would never run.
        struct Draining<'a>(&'a Mutex<Dispatch>);
        impl Drop for Draining<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    lock(self.0).draining = false;
                }
            }
        }
        let _draining = Draining(&self.dispatch);
        loop {
            self.run_effects(batch);
            let mut dispatch = lock(&self.dispatch);
            if dispatch.queue.is_empty() {
                dispatch.draining = false;
                return;
            }
            batch = std::mem::take(&mut dispatch.queue);
        }
    }

    fn run_effects(self: &Arc<Self>, queued: Vec<Queued>) {
        for entry in queued {
            let effect = match entry {
                Queued::HandleEffect(effect) => effect,
                Queued::Flushed(tx) => {
                    let _ = tx.send(());
                    continue;
                }
            };
            match effect {
                HandleEffect::Status { status, ctx } => {
                    let list: Vec<StatusFn> = lock(&self.handlers).status.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(status, &ctx));
                }
                HandleEffect::Chat { text, ctx } => {
                    let list: Vec<ChatFn> = lock(&self.handlers).chat.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&text, &ctx));
                }
                HandleEffect::ChatDelta { text, ctx } => {
                    let list: Vec<ChatFn> = lock(&self.handlers).delta.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&text, &ctx));
                }
                HandleEffect::Error { error, ctx } => {
                    let list: Vec<ErrorFn> = lock(&self.handlers).error.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&error, &ctx));
                }
                HandleEffect::Ended { ctx } => {
                    let list: Vec<EndedFn> = lock(&self.handlers).ended.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&ctx));
                    lock(&self.registry).remove(&self.session_id);
                }
                HandleEffect::Usage { total_tokens } => {
                    let list: Vec<UsageFn> = lock(&self.handlers).usage.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(total_tokens));
                }
                HandleEffect::AskPermission { request, ctx } => self.ask_permission(request, ctx),
                HandleEffect::Activity { activity, ctx } => {
                    let list: Vec<ActivityFn> = lock(&self.handlers).activity.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&activity, &ctx));
                }
                HandleEffect::Settle { operation_id, outcome } => {
                    if let Some(tx) = lock(&self.waiters).remove(&operation_id) {
                        let _ = tx.send(outcome);
                    }
                }
                HandleEffect::InvokeTool { request, ctx } => self.invoke_tool(request, ctx),
            }
        }
    }

    /// Runs the newest permission handler (the policy's option without one)
    /// and sends its answer. An answer Core no longer wants (another handle
    /// answered first, the request was settled) is dropped.
    fn ask_permission(self: &Arc<Self>, request: pb::PermissionRequest, ctx: EventContext) {
        let handler = lock(&self.handlers).permission.last().map(|(_, f)| f.clone());
        let inner = self.clone();
        self.transport.spawn(Box::pin(async move {
            let permission_id = request.permission_id.clone();
            let option_id = match handler {
                Some(handler) => {
                    let answer = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(handler(request, ctx)));
                    // A panicking handler rejects.
                    answer.await.unwrap_or_default().unwrap_or_default()
                }
                None => request.policy_option_id,
            };
            let answer = pb::AnswerPermissionRequest {
                session_id: inner.session_id.clone(),
                caller_origin: inner.origin.clone(),
                permission_id,
                option_id,
            };
            if let Err(error) = inner.transport.call(Call::AnswerPermission(answer)).await {
                tracing::debug!(%error, "a permission answer was not taken");
            }
        }));
    }

    /// Submits a tool result, again after a failure to deliver it (the
    /// transport failed, Core restarted): a handler's answer is not lost to
    /// one bad moment and the turn does not wait for `TOOL_TIMEOUT`. Core's
    /// own refusals (the request is settled, the answer is malformed) are
    /// final. At most [`SUBMIT_ATTEMPTS`] attempts, backing off.
    async fn submit_with_retries(&self, submit: pb::SubmitToolResultRequest) -> Result<(), PedelecError> {
        let mut wait = std::time::Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            match self.transport.call(Call::SubmitToolResult(submit.clone())).await {
                Ok(_) => return Ok(()),
                Err(error) if attempt < SUBMIT_ATTEMPTS && is_delivery_failure(&error) => {
                    tracing::debug!(%error, attempt, "retrying a tool result");
                    crate::transport::sleep(&*self.transport, wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn invoke_tool(self: &Arc<Self>, request: ToolRequest, ctx: ToolCallContext) {
        let handler = lock(&self.handlers).tool(&request.tool);
        let inner = self.clone();
        self.transport.spawn(Box::pin(async move {
            use pb::submit_tool_result_request::Outcome;
            let outcome = match (handler, serde_json::from_str::<serde_json::Value>(&request.args_json)) {
                // A handler that panics fails its call, like one that
                // returns an error, instead of leaving the agent waiting.
                (Some(h), Ok(args)) => futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(h(args, ctx)))
                    .await
                    .unwrap_or_else(|panic| {
                        let reason = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        Err(format!("the tool handler panicked: {reason}"))
                    }),
                (None, _) => Err(format!("no handler for tool {:?}", request.tool)),
                (_, Err(e)) => Err(format!("tool arguments are not JSON: {e}")),
            };
            let outcome = match outcome {
                Ok(value) => Outcome::ResultJson(value.to_string()),
                Err(message) => Outcome::Error(pb::Error::new(ErrorCode::ToolHandlerError, message)),
            };
            let submit = pb::SubmitToolResultRequest {
                session_id: inner.session_id.clone(),
                caller_origin: inner.origin.clone(),
                tool_request_id: request.tool_request_id.to_string(),
                outcome: Some(outcome),
            };
            if let Err(error) = inner.submit_with_retries(submit).await {
                let mut wrapped = PedelecError::new(
                    ErrorCode::SubmitToolResultFailed,
                    format!("could not submit the result of {}: {}", request.tool, error.message),
                );
                wrapped.details =
                    Some(serde_json::json!({ "cause": error.code, "toolRequestId": request.tool_request_id }));
                inner.step(|machine| vec![machine.sdk_error(wrapped)]);
            }
        }));
    }
}

/// Asset requests every transport shares: the usability check, the tickets
/// and the listing. Only moving the bytes differs (hyper natively, `fetch` in
/// the browser), so the rules here are written once.
impl<T: ToolName> PedelecSession<T> {
    pub(crate) fn check_assets_usable(&self) -> Result<(), PedelecError> {
        match self.get_status().refuse_assets() {
            Some((code, message)) => Err(PedelecError::new(code, message)),
            None => Ok(()),
        }
    }

    fn check_asset_path(path: &str) -> Result<(), PedelecError> {
        pedelec_protocol::AssetPath::parse(path)
            .map(|_| ())
            .map_err(|e| PedelecError::new(ErrorCode::AssetPathInvalid, format!("{path:?}: {e}")))
    }

    /// An upload ticket for a file of `size` bytes, after the path and size checks.
    pub(crate) async fn upload_ticket(
        &self,
        file_name: &str,
        size: u64,
        target_path: Option<&str>,
    ) -> Result<pb::AssetTicket, PedelecError> {
        self.check_assets_usable()?;
        if let Some(path) = target_path {
            Self::check_asset_path(path)?;
        }
        if size > pedelec_protocol::limits::MAX_ASSET_BYTES {
            return Err(PedelecError::new(ErrorCode::AssetTooLarge, "a file is limited to 100 MiB"));
        }
        let request = pb::CreateAssetUploadRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
            target_path: target_path.unwrap_or_default().to_owned(),
            file_name: file_name.to_owned(),
            size,
        };
        match self.inner.transport.call(Call::CreateAssetUpload(request)).await? {
            Reply::CreateAssetUpload(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// A download ticket for one public path.
    pub(crate) async fn download_ticket(&self, path: &str) -> Result<pb::AssetTicket, PedelecError> {
        self.check_assets_usable()?;
        Self::check_asset_path(path)?;
        let request = pb::CreateAssetDownloadRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
            path: path.to_owned(),
        };
        match self.inner.transport.call(Call::CreateAssetDownload(request)).await? {
            Reply::CreateAssetDownload(t) => Ok(t),
            other => Err(unexpected(&other)),
        }
    }

    /// Completed regular files from every level, newest first then by name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// for asset in session.list_assets().await? {
    ///     println!("{} {} bytes", asset.path, asset.size);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_assets(&self) -> Result<Vec<pb::Asset>, PedelecError> {
        self.check_assets_usable()?;
        let request = pb::ListAssetsRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
        };
        match self.inner.transport.call(Call::ListAssets(request)).await? {
            Reply::ListAssets(r) => Ok(r.assets),
            other => Err(unexpected(&other)),
        }
    }

    /// A page of the session's transcript (`Core.GetHistory`): the newest
    /// `query.limit` entries (0: 100) with seq > `after_seq` and id <
    /// `before_id` (0: no bound), oldest first, and whether older ones
    /// match too. Page back with `before_id` = the first entry's id; after a
    /// re-sync, `after_seq` = the last seq handled recovers what was missed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::HistoryQuery;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// session.send_text("Hello").await?;
    /// let page = session.history(HistoryQuery { limit: 50, ..Default::default() }).await?;
    /// for entry in &page.entries {
    ///     println!("#{} {:?}", entry.seq, entry.kind);
    /// }
    /// // Older entries, one page further back.
    /// if let (true, Some(first)) = (page.has_more, page.entries.first()) {
    ///     let older = session.history(HistoryQuery { before_id: first.id, ..Default::default() }).await?;
    ///     println!("{} older entries", older.entries.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn history(&self, query: HistoryQuery) -> Result<pb::GetHistoryResponse, PedelecError> {
        let request = pb::GetHistoryRequest {
            session_id: self.inner.session_id.clone(),
            caller_origin: self.inner.origin.clone(),
            after_seq: query.after_seq,
            before_id: query.before_id,
            limit: query.limit,
        };
        match self.inner.transport.call(Call::GetHistory(request)).await? {
            Reply::GetHistory(page) => Ok(page),
            other => Err(unexpected(&other)),
        }
    }
}

/// Options of one [`PedelecSession::send_text_with`].
///
/// # Examples
///
/// ```
/// use pedelec_sdk::SendOptions;
///
/// let options = SendOptions { attachments: vec!["/screens/page.png".into()] };
/// // No attachments by default: `send_text_with(text, SendOptions::default())` is `send_text(text)`.
/// assert!(SendOptions::default().attachments.is_empty());
/// assert_eq!(options.attachments.len(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// Public asset paths, e.g. `"/screens/page.png"` (at most 16).
    pub attachments: Vec<String>,
}

/// Strict UTF-8 for `readAsset(path, "text")`.
pub(crate) fn asset_text(path: &str, bytes: Vec<u8>) -> Result<String, PedelecError> {
    String::from_utf8(bytes)
        .map_err(|e| PedelecError::new(ErrorCode::AssetTextDecodeFailed, format!("{path} is not UTF-8: {e}")))
}

/// Strict JSON for `readAsset(path, "json")`.
pub(crate) fn asset_json<J: DeserializeOwned>(path: &str, text: &str) -> Result<J, PedelecError> {
    serde_json::from_str(text)
        .map_err(|e| PedelecError::new(ErrorCode::AssetInvalidJson, format!("{path} is not valid JSON: {e}")))
}

#[cfg(feature = "grpc")]
impl<T: ToolName> PedelecSession<T> {
    /// Uploads one file; returns its public path. `target_path` writes exactly
    /// there (creating parents, replacing a regular file).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::assets::UploadSource;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let source = UploadSource::from_bytes("report.json", "application/json", br#"{"ok":true}"#.to_vec());
    /// let path = session.upload_asset(source, Some("/results/report.json")).await?;
    /// assert_eq!(path, "/results/report.json");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn upload_asset(
        &self,
        source: crate::assets::UploadSource,
        target_path: Option<&str>,
    ) -> Result<String, PedelecError> {
        let ticket = self.upload_ticket(&source.name, source.size, target_path).await?;
        crate::assets::put(&ticket, source).await?;
        Ok(ticket.path)
    }

    /// Reads a file (`readAsset(path, "file")`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let file = session.read_asset_file("/results/report.json").await?;
    /// println!("{} is {} bytes of {}", file.name, file.bytes.len(), file.mime_type);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_file(&self, path: &str) -> Result<crate::assets::AssetFile, PedelecError> {
        let ticket = self.download_ticket(path).await?;
        crate::assets::get(&ticket).await
    }

    /// Downloads a file into `dest` on this machine and returns its size:
    /// whole or not at all (see [`crate::assets::get_to_file`]). Large
    /// assets are best read this way rather than into memory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let size = session.download_asset_to("/results/big.bin", std::path::Path::new("big.bin")).await?;
    /// println!("{size} bytes");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn download_asset_to(&self, path: &str, dest: &std::path::Path) -> Result<u64, PedelecError> {
        let ticket = self.download_ticket(path).await?;
        crate::assets::get_to_file(&ticket, dest).await
    }

    /// Reads a file as strict UTF-8 (`ASSET_TEXT_DECODE_FAILED` otherwise).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let notes = session.read_asset_text("/notes.md").await?;
    /// println!("{notes}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_text(&self, path: &str) -> Result<String, PedelecError> {
        asset_text(path, self.read_asset_file(path).await?.bytes)
    }

    /// Reads and parses JSON (`ASSET_INVALID_JSON` otherwise); `J` is typing only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// #[derive(serde::Deserialize)]
    /// struct Report {
    ///     passed: u32,
    ///     failed: u32,
    /// }
    ///
    /// let report: Report = session.read_asset_json("/results/report.json").await?;
    /// println!("{} passed, {} failed", report.passed, report.failed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_asset_json<J: DeserializeOwned>(&self, path: &str) -> Result<J, PedelecError> {
        asset_json(path, &self.read_asset_text(path).await?)
    }
}
