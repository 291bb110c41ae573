//! One session. Its rules are the sans-IO [`machine`]; this module is the
//! shell that carries the machine's effects out: it appends events to the
//! log its subscribers read at their own pace ([`log`]), writes the store, runs the provider's turns
//! ([`sink`] is where a turn reports), delivers tool answers and arms timers.
//!
//! The machine, the subscribers, the waiting tool calls and the running turn
//! sit behind one short-held mutex; every event is numbered by the machine
//! and appended to the log while that mutex is held, so a new
//! subscriber's snapshot and the live events after it never overlap or
//! leave a gap.

#[cfg(test)]
mod faults;
mod fence;
pub mod log;
pub mod machine;
pub mod outcome;
mod sink;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pedelec_protocol::pb;
use pedelec_protocol::{ErrorCode, OperationId, SessionId, SessionStatus, ToolRequestId, TurnId};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::activity_log;
use crate::changes;
use crate::error::CoreResult;
use crate::output::OutputSchema;
use crate::providers::{
    PREPARE_PROMPT, PermissionAnswer, ProviderFailure, ProviderSession, ProviderSetup, SteerInbox, SteerInput,
    ToolBridge, TurnRequest,
};
use crate::store::{SessionRecord, Store};
use crate::tool_token::ToolToken;
use crate::tools::ToolSet;
use crate::workspace::Workspace;
use machine::{Begun, Effect, Identity, Now, SessionState, Start};

/// A fresh random (v4) id: `prefix-` and 32 hex digits.
pub fn new_id(prefix: &str) -> String {
    // From the thread's CSPRNG (rand's ChaCha, seeded from the OS), not the
    // OS's: `Uuid::new_v4` makes a getrandom syscall per id, one per tool call.
    let bytes: [u8; 16] = rand::random();
    format!("{prefix}-{}", uuid::Builder::from_random_bytes(bytes).into_uuid().simple())
}

/// A session's [`crate::providers::PermissionAsker`]: weak, so a runtime
/// holding it never keeps its session alive.
#[derive(Debug)]
struct SessionAsker(std::sync::Weak<Session>);

impl Session {
    /// Who a provider asks about its agent's permission requests: this
    /// session, for as long as it lives.
    pub fn asker(self: &Arc<Self>) -> Arc<dyn crate::providers::PermissionAsker> {
        Arc::new(SessionAsker(Arc::downgrade(self)))
    }
}

impl crate::providers::PermissionAsker for SessionAsker {
    fn ask(
        &self,
        request: pb::PermissionRequest,
    ) -> crate::providers::BoxFuture<'static, Result<PermissionAnswer, pb::Error>> {
        let session = self.0.upgrade();
        Box::pin(async move {
            match session {
                Some(session) => session.ask_permission(request).await,
                None => Err(pb::Error::new(ErrorCode::SessionEnded, "the session is gone")),
            }
        })
    }
}

/// What every session shares with Core.
pub struct Shared {
    pub store: Store,
    /// The user's consent per web origin: checked on create, resume and
    /// every call that works in a workspace, and by permission routing.
    pub consent: Arc<crate::consent::Consent>,
    pub assets: Arc<crate::assets::AssetServer>,
    pub providers: crate::providers::LiveProviders,
    /// Core's config.toml, which `SetSettings` rewrites; `None` where Core
    /// was started without one to write (tests).
    pub config_file: Option<std::path::PathBuf>,
    pub disconnect_grace: Duration,
    /// A turn running longer fails with `PROVIDER_TIMEOUT` and its runtime is stopped.
    pub turn_timeout: Duration,
    /// A permission request the application does not answer in this time is rejected.
    pub permission_timeout: Duration,
    /// A session's agent process idle (no turn) this long is ended; its
    /// next turn starts the agent again and continues its conversation.
    /// `None`: kept until the session ends.
    pub agent_idle_timeout: Option<Duration>,
    /// What agent processes need to reach the MCP bridge: Core's executable and socket.
    pub core_exe: std::path::PathBuf,
    pub socket: std::path::PathBuf,
    /// Ids of ended sessions whose last subscriber just left: the registry
    /// evicts them at once rather than at its next sweep, so a burst of
    /// ended sessions never piles up in memory.
    pub released: tokio::sync::mpsc::UnboundedSender<String>,
    /// The configured limits (`quota.rs`).
    pub quotas: crate::quota::Quotas,
    /// Core's state and config directories, for `ProviderSetup::private_dirs`.
    pub private_dirs: Vec<std::path::PathBuf>,
    /// How many bytes of unread events each session's log keeps, and the
    /// bound across all of them (see `log`).
    pub log_bounds: log::Bounds,
    pub log_budget: Arc<log::Budget>,
}

#[cfg(test)]
impl Shared {
    /// What a test needs: the scripted provider and the defaults, no bridge.
    pub async fn for_tests(store: Store, dir: &std::path::Path) -> Arc<Shared> {
        let settings = crate::settings::Settings::default();
        Arc::new(Shared {
            store,
            consent: Arc::default(),
            assets: crate::assets::AssetServer::start(Duration::from_secs(60), Default::default())
                .await
                .expect("asset server"),
            providers: crate::providers::LiveProviders::new(
                crate::providers::Providers::from_settings(&settings).expect("default providers"),
            ),
            config_file: None,
            disconnect_grace: Duration::from_secs(60),
            turn_timeout: Duration::from_secs(30),
            permission_timeout: Duration::from_secs(30),
            agent_idle_timeout: None,
            core_exe: "/nonexistent/pedelec-core".into(),
            socket: dir.join("core.sock"),
            released: tokio::sync::mpsc::unbounded_channel().0,
            quotas: crate::quota::Quotas::default(),
            private_dirs: Vec::new(),
            log_bounds: log::Bounds::default(),
            log_budget: log::Budget::new(log::DEFAULT_TOTAL_BYTES),
        })
    }
}

/// The session's state and the I/O handles its effects need.
struct Inner {
    machine: SessionState,
    /// The recent events and each subscriber's cursor in them.
    log: log::EventLog,
    /// Effects of the step under way; kept to reuse its allocation (a
    /// provider streaming deltas makes one step per delta).
    effects: Vec<Effect>,
    /// Where each waiting tool call's answer goes.
    responders: HashMap<ToolRequestId, oneshot::Sender<Result<String, pb::Error>>>,
    /// The task running the active operation's turn.
    task: Option<(OperationId, tokio::task::AbortHandle)>,
    /// How `Cancel` tells the active operation's turn to stop.
    cancel: Option<(OperationId, CancellationToken)>,
    /// How `Steer` hands the active operation's turn more of the user's text.
    steer: Option<(OperationId, mpsc::Sender<SteerInput>)>,
    /// `Cancel` requests waiting for their operation's `OperationCompleted`
    /// (answered with its seq when it is emitted).
    cancel_waiters: Vec<(OperationId, oneshot::Sender<u64>)>,
    /// Where each pending permission request's answer goes.
    permission_responders: HashMap<String, oneshot::Sender<PermissionAnswer>>,
    /// Each pending permission request as it was asked, for the activity
    /// log's entry when it settles (`activity_log::permission_settled`).
    asked_permissions: HashMap<String, pb::PermissionRequest>,
}

/// How long a cancelled turn's provider gets to wind down on its own (ACP
/// `session/cancel` answered, a CLI's process gone) before Core drops the
/// turn and restarts the runtime; the next turn then continues the provider
/// session from its recorded identity.
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);

pub struct Session {
    pub id: SessionId,
    pub origin: String,
    /// As created. Its model and effort level may have changed since
    /// (`SetModel`): the machine holds those ([`Session::current_info`]).
    pub info: pb::SessionInfo,
    pub workspace: Workspace,
    /// Given to the agent it starts; only its digest is stored.
    pub tool_token: ToolToken,
    pub guidance: String,
    /// The frontend tools calls are checked against (`SetTools` replaces them).
    tools: Mutex<Arc<ToolSet>>,
    shared: Arc<Shared>,
    inner: Mutex<Inner>,
    /// Woken when events are pushed to the log or its readers are closed.
    readable: tokio::sync::Notify,
    runtime: tokio::sync::Mutex<Option<Box<dyn ProviderSession>>>,
    /// Bytes of transcript bodies written so far, against `max_transcript_bytes`.
    transcript_bytes: std::sync::atomic::AtomicU64,
    /// Holds a bridged tool call behind the agent's report of it.
    fence: fence::ToolFence,
    /// Workspace snapshots for what turns change.
    changes: Mutex<TurnSnapshots>,
    /// `SetModel` or `SetTools` changed what the agent runs with: the next
    /// turn starts a fresh runtime.
    runtime_stale: std::sync::atomic::AtomicBool,
    /// Counts turns started, so an idle timer armed after one turn ends
    /// the runtime only if no turn ran since.
    turns_started: std::sync::atomic::AtomicU64,
    /// For a fork: the parent's provider conversation, which the first
    /// runtime continues a copy of (until the agent names its own).
    fork_of: Option<String>,
}

/// The running turn's start snapshot, and the last one taken (whose file
/// readings the next reuses where nothing changed).
#[derive(Default)]
struct TurnSnapshots {
    turn: Option<(OperationId, Arc<changes::Snapshot>)>,
    last: Option<Arc<changes::Snapshot>>,
}

/// A registered subscriber's end: its snapshot (until sent), the events it
/// took from the log and has not sent yet, and the guard that unsubscribes it.
struct Subscription {
    snapshot: Option<pb::SessionEvent>,
    taken: std::collections::VecDeque<Arc<pb::SessionEvent>>,
    guard: SubscriberGuard,
}

/// Events a reader takes from the log per lock of the session.
const READ_BATCH: usize = 256;

/// Keeps a subscription registered; dropping it (the stream went away) unsubscribes.
struct SubscriberGuard {
    session: Arc<Session>,
    id: u64,
    reader: Reader,
}

/// Who reads a session's events: one of its own subscribers (`Subscribe`),
/// or the user watching it (`WatchSession`), who is not counted as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    Subscriber,
    Watcher,
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.session.unsubscribe(self.id, self.reader);
    }
}

/// Where a fork starts: the parent's info as it stands (model, effort,
/// provider) and its provider conversation, if it has one yet.
pub struct ForkPoint {
    pub info: pb::SessionInfo,
    pub provider_session_id: Option<String>,
}

/// A turn to run: what `start` hands `run_operation`.
struct Turn {
    kind: pb::TurnKind,
    text: String,
    attachments: Vec<crate::providers::Attachment>,
    /// A `SendText` with an output schema.
    output: Option<Arc<OutputSchema>>,
}

/// Construction parameters.
pub struct NewSession {
    pub id: SessionId,
    pub origin: String,
    pub info: pb::SessionInfo,
    pub workspace: Workspace,
    pub tool_token: ToolToken,
    pub skills: pb::Skills,
    pub tools: Arc<ToolSet>,
    /// The parent's provider conversation, for a fork (`Registry::fork`).
    pub fork_of: Option<String>,
}

impl NewSession {
    fn identity(&self) -> Identity {
        Identity {
            id: self.id.clone(),
            origin: self.origin.clone(),
            info: self.info.clone(),
            workspace: self.workspace.root.display().to_string(),
            managed_workspace: self.workspace.managed,
            tool_token_digest: self.tool_token.digest(),
            fork_of: self.fork_of.clone(),
        }
    }
}

impl Session {
    pub fn new(shared: Arc<Shared>, new: NewSession) -> Arc<Self> {
        let machine = SessionState::new(new.identity());
        Self::with_machine(shared, new, machine)
    }

    fn with_machine(shared: Arc<Shared>, new: NewSession, machine: SessionState) -> Arc<Self> {
        let log = log::EventLog::new(machine.last_seq(), shared.log_bounds, shared.log_budget.clone());
        Arc::new(Session {
            fork_of: new.fork_of.clone(),
            id: new.id,
            origin: new.origin,
            info: new.info,
            workspace: new.workspace,
            tool_token: new.tool_token,
            guidance: new.skills.guidance,
            tools: Mutex::new(new.tools),
            shared,
            inner: Mutex::new(Inner {
                machine,
                log,
                effects: Vec::new(),
                responders: HashMap::new(),
                task: None,
                cancel: None,
                steer: None,
                cancel_waiters: Vec::new(),
                permission_responders: HashMap::new(),
                asked_permissions: HashMap::new(),
            }),
            readable: tokio::sync::Notify::new(),
            runtime: tokio::sync::Mutex::new(None),
            transcript_bytes: std::sync::atomic::AtomicU64::new(0),
            fence: fence::ToolFence::default(),
            changes: Mutex::default(),
            runtime_stale: std::sync::atomic::AtomicBool::new(false),
            turns_started: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Brings a stored session back. An operation that was running when Core
    /// stopped is reported failed with `CORE_RESTARTED` (in every later
    /// snapshot's `recent_outcomes`) and the session is idle again.
    pub fn restore(shared: Arc<Shared>, new: NewSession, record: &SessionRecord) -> Arc<Self> {
        let (machine, effects) = SessionState::restore(new.identity(), record, Now::current());
        let session = Self::with_machine(shared, new, machine);
        session.transcript_bytes.store(record.transcript_bytes, std::sync::atomic::Ordering::Relaxed);
        session.apply_locked(effects);
        session
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn status(&self) -> SessionStatus {
        self.lock().machine.status()
    }

    /// The provider's token total for the session, if it reported one.
    pub fn usage_total(&self) -> Option<u64> {
        self.lock().machine.usage()
    }

    pub fn initial_record(&self) -> SessionRecord {
        self.lock().machine.record()
    }

    /// Carries out the machine's effects; called with the lock held, so
    /// events reach subscribers in seq order.
    fn apply(self: &Arc<Self>, inner: &mut Inner, mut effects: Vec<Effect>) {
        let mut emitted = false;
        for effect in effects.drain(..) {
            match effect {
                Effect::Emit(event) => {
                    if !inner.cancel_waiters.is_empty()
                        && matches!(event.kind, Some(pb::session_event::Kind::OperationCompleted(_)))
                    {
                        let settled = |(op, _): &mut (OperationId, _)| op.as_str() == event.operation_id;
                        for (_, waiter) in inner.cancel_waiters.extract_if(.., settled) {
                            let _ = waiter.send(event.seq);
                        }
                    }
                    match &event.kind {
                        Some(pb::session_event::Kind::PermissionRequested(request)) => {
                            inner.asked_permissions.insert(request.permission_id.clone(), request.clone());
                        }
                        Some(pb::session_event::Kind::PermissionSettled(settled)) => {
                            let asked = inner.asked_permissions.remove(&settled.permission_id);
                            self.shared.store.append_activity(activity_log::permission_settled(
                                &self.origin,
                                self.id.as_str(),
                                event.emitted_at_ms,
                                asked.as_ref(),
                                settled,
                            ));
                        }
                        _ => {}
                    }
                    inner.log.push(Arc::new(event));
                    emitted = true;
                }
                Effect::Append(entry) => {
                    self.count_transcript(&entry);
                    self.log_activity(&entry);
                    self.shared.store.append(&self.id, entry)
                }
                Effect::Save(record) => self.shared.store.save(record),
                Effect::AnswerTool { request, answer } => {
                    if let Some(responder) = inner.responders.remove(&request) {
                        let _ = responder.send(answer);
                    }
                }
                Effect::StopTurn(operation) => {
                    if let Some((_, task)) = inner.task.take_if(|(running, _)| *running == operation) {
                        task.abort();
                    }
                }
                Effect::AnswerPermission { permission_id, answer } => {
                    if let Some(responder) = inner.permission_responders.remove(&permission_id) {
                        let _ = responder.send(answer);
                    }
                }
                Effect::CancelTurn(operation) => {
                    if let Some((_, token)) = inner.cancel.as_ref().filter(|(running, _)| *running == operation) {
                        token.cancel();
                    }
                }
                Effect::ArmDisconnectTimer { epoch } => self.arm_disconnect_timer(epoch),
            }
        }
        if emitted {
            self.readable.notify_waiters();
        }
        // The buffer is kept for the next step while a turn is active (a step
        // per delta, two per tool call); a session without one gives it back.
        // Effects are a few hundred bytes each, so a kept buffer was ~2.6 KB
        // per idle session, about 40 % of its live heap.
        let turn_active = matches!(inner.machine.status(), SessionStatus::Running | SessionStatus::WaitingToolResult);
        if !turn_active {
            inner.effects = Vec::new();
        } else if effects.capacity() > inner.effects.capacity() {
            inner.effects = effects;
        }
    }

    /// Appends the activity log entry a transcript entry makes, if any
    /// (`activity_log::of_transcript`).
    fn log_activity(&self, entry: &crate::transcript::TranscriptEntry) {
        let read_only = |tool: &str| self.tools().definitions.iter().any(|d| d.name == tool && d.read_only_hint);
        if let Some(logged) = activity_log::of_transcript(&self.origin, self.id.as_str(), entry, read_only) {
            self.shared.store.append_activity(logged);
        }
    }

    fn count_transcript(&self, entry: &crate::transcript::TranscriptEntry) {
        self.transcript_bytes.fetch_add(entry.body.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Refuses a new operation whose prompt would take the stored
    /// transcript past `max_transcript_bytes`. Checked when an operation
    /// starts, not per message: a turn that starts under the limit finishes
    /// (its output may pass it), and the next one is refused. Refusing
    /// mid-turn would leave a turn half recorded.
    fn check_transcript_quota(&self, prompt: &str) -> CoreResult<()> {
        let max = self.shared.quotas.max_transcript_bytes;
        let used = self.transcript_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if used.saturating_add(prompt.len() as u64) > max {
            tracing::debug!(session = %self.id, used, max, "turn refused: max_transcript_bytes reached");
            return Err(crate::quota::Exceeded {
                key: "max_transcript_bytes",
                max,
                what: "the session's transcript is full",
                site: None,
            }
            .into());
        }
        Ok(())
    }

    fn apply_locked(self: &Arc<Self>, effects: Vec<Effect>) {
        let mut inner = self.lock();
        self.apply(&mut inner, effects);
    }

    /// Runs one machine input under the lock and carries out its effects.
    fn step<T>(self: &Arc<Self>, f: impl FnOnce(&mut SessionState, Now, &mut Vec<Effect>) -> T) -> T {
        let mut inner = self.lock();
        let mut effects = std::mem::take(&mut inner.effects);
        let value = f(&mut inner.machine, Now::current(), &mut effects);
        self.apply(&mut inner, effects);
        value
    }

    /// Runs one machine input whose writes must be durable: its transcript
    /// entries and records go to the store as one job (all or nothing),
    /// queued under the lock so that no later write of this session
    /// overtakes it. The returned future resolves once it is committed.
    fn step_committed<T>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut SessionState, Now, &mut Vec<Effect>) -> T,
    ) -> (T, impl std::future::Future<Output = CoreResult<()>> + Send + 'static) {
        let mut inner = self.lock();
        let mut effects = Vec::new();
        let value = f(&mut inner.machine, Now::current(), &mut effects);
        let (mut entries, mut records) = (Vec::new(), Vec::new());
        let rest: Vec<Effect> = effects
            .into_iter()
            .filter_map(|effect| match effect {
                Effect::Append(entry) => {
                    self.count_transcript(&entry);
                    self.log_activity(&entry);
                    entries.push(entry);
                    None
                }
                Effect::Save(record) => {
                    records.push(record);
                    None
                }
                other => Some(other),
            })
            .collect();
        // An input that wrote nothing (a refused or idempotent start, a
        // finish that came too late) has nothing to wait for: no commit.
        let commit =
            (!entries.is_empty() || !records.is_empty()).then(|| self.shared.store.commit(&self.id, entries, records));
        self.apply(&mut inner, rest);
        (value, async move {
            match commit {
                Some(commit) => commit.await,
                None => Ok(()),
            }
        })
    }

    /// Registers a subscriber: its snapshot and a cursor in the log just
    /// after it (under the same lock, so the two never overlap or leave a gap).
    fn subscribe(self: &Arc<Self>, reader: Reader) -> Subscription {
        let mut inner = self.lock();
        let snapshot = inner.machine.snapshot(Now::current());
        let id = match reader {
            Reader::Subscriber => {
                inner.machine.watched();
                inner.log.add_reader(snapshot.seq)
            }
            Reader::Watcher => inner.log.add_watcher(snapshot.seq),
        };
        Subscription {
            snapshot: Some(snapshot),
            taken: std::collections::VecDeque::new(),
            guard: SubscriberGuard { session: self.clone(), id, reader },
        }
    }

    /// The session's events for the user watching it (`WatchSession`):
    /// exactly what [`Self::events`] yields, but the watcher is no
    /// subscriber, so it neither keeps an abandoned session alive nor
    /// touches its disconnect timer.
    pub fn watch(self: &Arc<Self>) -> impl futures::Stream<Item = pb::SessionEvent> + Send + 'static {
        self.read_events(Reader::Watcher)
    }

    /// The session's events for one subscriber: a snapshot, then every later
    /// event, read from the session's log at the subscriber's own pace (see
    /// `log`): a reader behind but inside the log loses nothing. One that
    /// fell out of it continues with a fresh snapshot (which resets the
    /// reader's gate; its `recent_outcomes` settle what the reader missed)
    /// instead of ending. The stream ends when Core closes the session's
    /// subscriptions; dropping it unsubscribes.
    pub fn events(self: &Arc<Self>) -> impl futures::Stream<Item = pb::SessionEvent> + Send + 'static {
        self.read_events(Reader::Subscriber)
    }

    fn read_events(self: &Arc<Self>, reader: Reader) -> impl futures::Stream<Item = pb::SessionEvent> + Send + 'static {
        futures::stream::unfold(self.subscribe(reader), |mut subscription| async move {
            if let Some(snapshot) = subscription.snapshot.take() {
                return Some((snapshot, subscription));
            }
            let session = subscription.guard.session.clone();
            let id = subscription.guard.id;
            loop {
                if let Some(event) = subscription.taken.pop_front() {
                    // The log let go of it once every cursor passed it: the
                    // last reader to take an event gets it without a copy.
                    return Some((Arc::unwrap_or_clone(event), subscription));
                }
                // Registered before looking, so a push after the look wakes it.
                let pushed = session.readable.notified();
                tokio::pin!(pushed);
                pushed.as_mut().enable();
                {
                    let mut inner = session.lock();
                    match inner.log.read(id, READ_BATCH) {
                        log::Read::Events(events) => {
                            subscription.taken.extend(events);
                            continue;
                        }
                        log::Read::Empty => {}
                        log::Read::Resync => {
                            tracing::info!(
                                session = %session.id,
                                "a subscriber fell out of the event log; re-synchronising it with a snapshot"
                            );
                            let snapshot = inner.machine.snapshot(Now::current());
                            inner.log.resync(id, snapshot.seq);
                            return Some((snapshot, subscription));
                        }
                        log::Read::Gone => return None,
                    }
                }
                pushed.await;
            }
        })
    }

    /// Where a provider would wait for its readers: it never does. Every
    /// reader reads the session's log at its own pace, and the log's bounds
    /// (not a reader) decide what is kept (see `log`).
    pub async fn flow(&self) {}

    fn unsubscribe(self: &Arc<Self>, id: u64, reader: Reader) {
        let mut inner = self.lock();
        inner.log.remove_reader(id);
        // A watcher leaving changes nothing for the session's subscribers.
        if reader == Reader::Subscriber {
            self.unwatched_if_nobody_subscribes(&mut inner);
        }
        if inner.log.readers() == 0 && inner.machine.status() == SessionStatus::Ended {
            let _ = self.shared.released.send(self.id.as_str().to_owned());
        }
    }

    /// Tells the machine when nobody watches (it may arm the disconnect timer).
    fn unwatched_if_nobody_subscribes(self: &Arc<Self>, inner: &mut Inner) {
        if inner.log.subscribers() == 0 {
            let mut effects = Vec::new();
            inner.machine.unwatched(&mut effects);
            self.apply(inner, effects);
        }
    }

    /// Ends the session if nobody subscribes within the grace period.
    fn arm_disconnect_timer(self: &Arc<Self>, epoch: u64) {
        let session = self.clone();
        let grace = self.shared.disconnect_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let abandoned = {
                let inner = session.lock();
                inner.machine.disconnect_due(epoch, inner.log.subscribers() == 0)
            };
            if abandoned {
                tracing::info!(session = %session.id, "last subscriber left; ending the session");
                let _ = session.end("disconnected").await;
            }
        });
    }

    /// Arms the disconnect timer for a session restored without subscribers.
    pub fn arm_after_restore(self: &Arc<Self>) {
        let mut inner = self.lock();
        self.unwatched_if_nobody_subscribes(&mut inner);
    }

    /// Drops every subscriber, ending their streams (Core is stopping).
    pub fn close_subscribers(&self) {
        self.lock().log.close();
        self.readable.notify_waiters();
    }

    /// A user turn with `text` and the session's asset files at the public
    /// paths `attachments`, checked before anything is recorded: a bad
    /// list (too long, a malformed, missing or oversized file) is refused
    /// and changes nothing.
    pub async fn send_text(
        self: &Arc<Self>,
        text: String,
        attachments: Vec<String>,
        output_schema_json: &str,
    ) -> CoreResult<pb::OperationAccepted> {
        if let Err((code, message)) = pedelec_protocol::asset_path::check_attachments(&attachments) {
            return Err(crate::error::CoreError::new(code, message));
        }
        let output = OutputSchema::compile(output_schema_json)?;
        self.check_transcript_quota(&text)?;
        // The files are looked at off the async workers — and only when
        // there are any: a plain text costs no blocking task.
        let files = if attachments.is_empty() {
            Vec::new()
        } else {
            let workspace = self.workspace.root.clone();
            tokio::task::spawn_blocking(move || {
                attachments
                    .iter()
                    .map(|path| crate::assets::attachment(&workspace, path))
                    .collect::<CoreResult<Vec<_>>>()
            })
            .await
            .map_err(|e| {
                crate::error::CoreError::new(ErrorCode::Internal, format!("checking attachments failed: {e}"))
            })??
        };
        self.detached(|session| async move { session.start(pb::OperationKind::SendText, text, files, output).await })
            .await
    }

    pub async fn prepare(self: &Arc<Self>) -> CoreResult<pb::OperationAccepted> {
        let prompt = PREPARE_PROMPT.to_owned();
        self.check_transcript_quota(&prompt)?;
        self.detached(
            |session| async move { session.start(pb::OperationKind::Prepare, prompt, Vec::new(), None).await },
        )
        .await
    }

    /// Runs a request's work as a task of its own, so that it completes even
    /// when the request is dropped halfway (a client cancelling its call
    /// drops the handler's future): a start that was recorded is then still
    /// announced or undone, an end still stops the agent. Never a session
    /// left busy with an operation that nothing will ever finish.
    async fn detached<T, F>(self: &Arc<Self>, work: impl FnOnce(Arc<Self>) -> F) -> CoreResult<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = CoreResult<T>> + Send + 'static,
    {
        tokio::spawn(work(self.clone())).await.unwrap_or_else(|failed| {
            Err(crate::error::CoreError::new(ErrorCode::Internal, format!("the request failed inside Core: {failed}")))
        })
    }

    /// Records a new operation, and once it is committed announces it and
    /// starts its turn, so that a client which saw it start can count on it
    /// across a crash.
    async fn start(
        self: &Arc<Self>,
        kind: pb::OperationKind,
        text: String,
        attachments: Vec<crate::providers::Attachment>,
        output: Option<Arc<OutputSchema>>,
    ) -> CoreResult<pb::OperationAccepted> {
        let ids = (OperationId::new(new_id("op")), TurnId::new(new_id("turn")));
        let paths: Vec<String> = attachments.iter().map(|a| a.path.clone()).collect();
        let (start, committed) = self.step_committed(|m, now, out| m.begin_with(kind, text, &paths, ids, now, out));
        let begun = match start? {
            Start::Existing(accepted) => return Ok(accepted),
            Start::New(begun) => begun,
        };
        let Begun { operation, kind, turn_kind, text } = begun;
        if let Err(error) = committed.await {
            let pb_error = error.to_pb();
            self.step(|m, now, out| m.announce_failed(&operation, pb_error, now, out));
            return Err(error);
        }
        let mut inner = self.lock();
        let mut effects = Vec::new();
        inner.machine.announce(&operation, Now::current(), &mut effects)?;
        self.apply(&mut inner, effects);
        let cancel = CancellationToken::new();
        // A Cancel that came while the start was being committed found no
        // token to trip; the machine remembers it.
        if inner.machine.cancel_requested(&operation) {
            cancel.cancel();
        }
        inner.cancel = Some((operation.clone(), cancel.clone()));
        let (steer, steering) = mpsc::channel(crate::providers::STEER_QUEUE);
        inner.steer = Some((operation.clone(), steer));
        let session = self.clone();
        let op = operation.clone();
        let controls = (cancel, steering);
        let task = tokio::spawn(async move {
            let turn = Turn { kind: turn_kind, text, attachments, output };
            session.run_operation(op, turn, controls).await
        });
        inner.task = Some((operation.clone(), task.abort_handle()));
        Ok(machine::accepted(&operation, kind, false))
    }

    fn provider_setup(self: &Arc<Self>) -> ProviderSetup {
        let inner = self.lock();
        ProviderSetup {
            session_id: self.id.as_str().to_owned(),
            origin: self.origin.clone(),
            model: inner.machine.info().model.clone(),
            effort_level: pb::EffortLevel::try_from(inner.machine.info().effort_level).unwrap_or_default(),
            workspace: self.workspace.root.clone(),
            runtime_dir: self.workspace.runtime.clone(),
            guidance: self.guidance.clone(),
            tools: self.tools().definitions.clone(),
            provider_session_id: inner.machine.provider_session_id().map(str::to_owned),
            fork_from: inner.machine.provider_session_id().is_none().then(|| self.fork_of.clone()).flatten(),
            usage_total: inner.machine.usage(),
            permissions: (self.info.permission_mode == pb::PermissionMode::App as i32).then(|| self.asker()),
            private_dirs: self.shared.private_dirs.clone(),
            bridge: ToolBridge {
                command: self.shared.core_exe.clone(),
                socket: self.shared.socket.clone(),
                tool_token: self.tool_token.expose().to_owned(),
            },
        }
    }

    /// Runs `turn` until it finishes or spends `timeout` outside tool waits:
    /// the time the turn waits for a frontend tool result extends its
    /// deadline, so a tool's own (possibly longer) timeout is not cut short.
    async fn within_turn_timeout<F: std::future::Future>(
        &self,
        timeout: Duration,
        turn: F,
    ) -> Result<F::Output, tokio::time::error::Elapsed> {
        let started = tokio::time::Instant::now();
        let waited_so_far = || self.lock().machine.tool_wait_so_far(std::time::Instant::now());
        tokio::pin!(turn);
        loop {
            let waited = waited_so_far();
            match tokio::time::timeout_at(started + timeout + waited, &mut turn).await {
                Ok(output) => return Ok(output),
                Err(elapsed) if waited_so_far() <= waited => return Err(elapsed),
                Err(_) => continue,
            }
        }
    }

    async fn run_operation(
        self: Arc<Self>,
        operation: OperationId,
        Turn { kind, text, attachments, output }: Turn,
        (cancel, steering): (CancellationToken, SteerInbox),
    ) {
        let sink = sink::OperationSink { session: self.clone(), operation: operation.clone() };
        let turn_number = self.turns_started.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        let result = {
            let mut runtime = self.runtime.lock().await;
            // A new model: the runtime restarts with it and resumes the agent's thread.
            if self.runtime_stale.swap(false, std::sync::atomic::Ordering::AcqRel)
                && let Some(mut old) = runtime.take()
            {
                old.shutdown();
            }
            if runtime.is_none() {
                let started = match self.shared.providers.now().get(&self.info.provider) {
                    Some(provider) => provider.start(self.provider_setup()),
                    None => Err(ProviderFailure::coded(
                        ErrorCode::ProviderNotFound,
                        format!("provider {:?} is not available", self.info.provider),
                        true,
                    )),
                };
                match started {
                    Ok(started) => *runtime = Some(started),
                    Err(failure) => {
                        drop(runtime);
                        return self.finish_operation(&operation, Err(failure)).await;
                    }
                }
            }
            let provider = runtime.as_mut().expect("started above");
            // What the turn changes is compared with the workspace as it starts.
            if kind == pb::TurnKind::User {
                self.snapshot_turn_start(&operation).await;
            }
            let timeout = self.shared.turn_timeout;
            // A panic in a provider must end the operation, not leave it active
            // with no task behind it: it fails the turn like a hang does.
            let text = match &output {
                Some(schema) => {
                    self.lock().machine.expect_answer(&operation);
                    text + &schema.instruction()
                }
                None => text,
            };
            let output_schema = output.as_ref().map(|o| o.schema.clone());
            let request = TurnRequest { kind, text, cancel: cancel.clone(), attachments, steering, output_schema };
            let turn = async {
                provider.run_turn(request, &sink).await?;
                match &output {
                    Some(schema) => self.typed_answer(&operation, schema, &mut **provider, &sink, &cancel).await,
                    None => Ok(()),
                }
            };
            let turn = std::panic::AssertUnwindSafe(turn);
            let turn = futures::FutureExt::catch_unwind(turn);
            // A cancelled turn whose provider does not wind down within the
            // grace is dropped, and its runtime restarted below.
            let overdue = async {
                cancel.cancelled().await;
                tokio::time::sleep(CANCEL_GRACE).await;
            };
            let outcome = tokio::select! {
                outcome = self.within_turn_timeout(timeout, turn) => Some(outcome),
                () = overdue => None,
            };
            // Dropped after the grace: the runtime's state is unknown. (A
            // provider that wound down itself keeps its runtime.)
            let forced = outcome.is_none();
            let result = match outcome {
                None => {
                    tracing::warn!(session = %self.id, "the provider did not stop a cancelled turn in time; restarting it");
                    Err(ProviderFailure::coded(
                        ErrorCode::OperationCancelled,
                        format!("the provider did not stop within {} ms of the cancel", CANCEL_GRACE.as_millis()),
                        false,
                    ))
                }
                Some(Ok(Ok(result))) => result,
                Some(Ok(Err(panic))) => {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    tracing::error!(session = %self.id, %reason, "the provider panicked during a turn");
                    Err(ProviderFailure::coded(
                        ErrorCode::Internal,
                        format!("the provider failed inside Pedelec: {reason}"),
                        false,
                    ))
                }
                // The runtime's state is unknown after a hang: stop it; the next
                // turn starts a fresh one that continues the provider session.
                Some(Err(_)) => Err(ProviderFailure {
                    code: ErrorCode::ProviderTimeout,
                    message: format!("the provider did not finish the turn within {} ms", timeout.as_millis()),
                    fatal: false,
                    details: serde_json::json!({ "timeoutMs": timeout.as_millis() as u64 }),
                }),
            };
            let restart = match &result {
                Err(f) => f.fatal || matches!(f.code, ErrorCode::ProviderTimeout | ErrorCode::Internal),
                Ok(()) => false,
            } || forced;
            if restart && let Some(mut gone) = runtime.take() {
                gone.shutdown();
            }
            result
        };
        if kind == pb::TurnKind::User {
            self.record_turn_changes(&operation).await;
        }
        self.finish_operation(&operation, result).await;
        self.end_runtime_when_idle(turn_number);
    }

    /// After `agent_idle_timeout` with no turn after turn `turn_number`,
    /// ends the session's runtime (its agent process) where that loses
    /// nothing (`ProviderSession::idle_process_resumable`): an idle session
    /// holds no process and no place under `max_agent_processes`. The next
    /// turn starts the agent again and continues its conversation, as after
    /// any restart.
    fn end_runtime_when_idle(self: &Arc<Self>, turn_number: u64) {
        let Some(idle) = self.shared.agent_idle_timeout else { return };
        let session = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(idle).await;
            let Some(session) = session.upgrade() else { return };
            if session.turns_started.load(std::sync::atomic::Ordering::Acquire) != turn_number {
                return;
            }
            // A turn holding the runtime is not idle (it also bumped the count).
            let Ok(mut runtime) = session.runtime.try_lock() else { return };
            if session.turns_started.load(std::sync::atomic::Ordering::Acquire) != turn_number {
                return;
            }
            if runtime.as_ref().is_some_and(|r| r.idle_process_resumable())
                && let Some(mut idle_runtime) = runtime.take()
            {
                tracing::info!(session = %session.id, idle_secs = idle.as_secs(), "ended an idle session's agent");
                idle_runtime.shutdown();
            }
        });
    }

    /// Reads a typed turn's answer against its schema; on a mismatch the
    /// agent is asked once more in the same operation (Core's words, kept
    /// out of the transcript; the second answer is), then `OUTPUT_INVALID`.
    async fn typed_answer(
        &self,
        operation: &OperationId,
        schema: &OutputSchema,
        provider: &mut dyn ProviderSession,
        sink: &sink::OperationSink,
        cancel: &CancellationToken,
    ) -> Result<(), ProviderFailure> {
        let answer = |session: &Self| session.lock().machine.answer(operation).unwrap_or_default();
        let errors = match schema.check(&answer(self)) {
            Ok(value) => {
                self.lock().machine.answered(operation, value.to_string());
                return Ok(());
            }
            // A cancelled turn completes as cancelled: nothing to ask again.
            Err(_) if cancel.is_cancelled() => return Ok(()),
            Err(errors) => errors,
        };
        tracing::debug!(session = %self.id, ?errors, "the answer does not match the output schema; asking once more");
        let (_, steering) = mpsc::channel(1);
        let again = TurnRequest {
            kind: pb::TurnKind::User,
            text: schema.retry(&errors),
            cancel: cancel.clone(),
            attachments: Vec::new(),
            steering,
            output_schema: Some(schema.schema.clone()),
        };
        provider.run_turn(again, sink).await?;
        let answer = answer(self);
        match schema.check(&answer) {
            Ok(value) => {
                self.lock().machine.answered(operation, value.to_string());
                Ok(())
            }
            Err(_) if cancel.is_cancelled() => Ok(()),
            Err(errors) => Err(OutputSchema::refusal(&answer, errors)),
        }
    }

    /// Reads the workspace once in the background when the session is
    /// created, so its first turn's start snapshot reuses those readings
    /// instead of reading every file while the user waits.
    pub fn read_workspace_ahead(self: &Arc<Self>) {
        let session = Arc::downgrade(self);
        let root = self.workspace.root.clone();
        tokio::task::spawn_blocking(move || {
            let snapshot = Arc::new(changes::Snapshot::take(&root));
            if let Some(session) = session.upgrade() {
                session.changes_state().last.get_or_insert(snapshot);
            }
        });
    }

    /// Snapshots the workspace for `operation`'s turn (off the async workers).
    async fn snapshot_turn_start(self: &Arc<Self>, operation: &OperationId) {
        let root = self.workspace.root.clone();
        let previous = self.changes_state().last.clone();
        let taken =
            tokio::task::spawn_blocking(move || Arc::new(changes::Snapshot::take_after(&root, previous.as_deref())))
                .await;
        if let Ok(snapshot) = taken {
            self.changes_state().turn = Some((operation.clone(), snapshot));
        }
    }

    /// The workspace now compared with the running turn's start snapshot,
    /// and the snapshot of now.
    async fn changes_so_far(
        self: &Arc<Self>,
        operation: &OperationId,
    ) -> Option<(pb::GetChangesResponse, Arc<changes::Snapshot>)> {
        let before = self.changes_state().turn.clone().filter(|(op, _)| op == operation)?.1;
        let root = self.workspace.root.clone();
        let (after, files, complete) = tokio::task::spawn_blocking(move || {
            let after = changes::Snapshot::take_after(&root, Some(&before));
            let (files, complete) = changes::compare(&before, &after);
            (Arc::new(after), files, complete)
        })
        .await
        .ok()?;
        let response = pb::GetChangesResponse {
            operation_id: operation.as_str().to_owned(),
            files,
            complete,
            ..Default::default()
        };
        Some((response, after))
    }

    /// Records what `operation`'s turn changed, before its completion is
    /// committed: a client that saw the turn complete finds its changes.
    async fn record_turn_changes(self: &Arc<Self>, operation: &OperationId) {
        let running = self.lock().machine.running_turn().filter(|(op, _)| op == operation);
        let found = match running {
            Some(_) => self.changes_so_far(operation).await,
            None => None,
        };
        let mut state = self.changes_state();
        state.turn = None;
        let (Some((_, turn_id)), Some((mut changes, after))) = (running, found) else { return };
        state.last = Some(after);
        drop(state);
        changes.turn_id = turn_id;
        self.step(|m, now, out| m.turn_changes(operation, changes, now, out));
    }

    /// `SetModel` (see core.proto): the model and effort of the turns from
    /// the next one; the session as it now stands.
    pub fn set_model(self: &Arc<Self>, model: &str, effort: Option<pb::EffortLevel>) -> CoreResult<pb::SessionInfo> {
        if let Some(problem) = pedelec_protocol::limits::model_name_problem(model) {
            return Err(crate::error::CoreError::new(ErrorCode::InvalidArgument, problem));
        }
        if self.step(|m, now, out| m.set_model(model, effort, now, out))? {
            self.runtime_stale.store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(self.current_info())
    }

    /// The frontend tools as they now stand.
    pub fn tools(&self) -> Arc<ToolSet> {
        self.tools.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// `SetTools` (see core.proto): a new frontend tool list between turns.
    pub async fn set_tools(self: &Arc<Self>, tools: Vec<pb::ToolDefinition>) -> CoreResult<()> {
        use crate::error::CoreError;
        let compiled = ToolSet::compile(tools.clone())?;
        {
            let inner = self.lock();
            let status = inner.machine.status();
            if status == SessionStatus::Ended {
                return Err(CoreError::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            if inner.task.is_some() || matches!(status, SessionStatus::Running | SessionStatus::WaitingToolResult) {
                return Err(CoreError::new(ErrorCode::SessionBusy, "tools change between turns"));
            }
        }
        let skills = pb::Skills { guidance: self.guidance.clone(), tools };
        self.workspace.write_manifest(&skills)?;
        self.shared.store.save_skills(&self.id, pedelec_protocol::json::to_json(&skills)).await?;
        *self.tools.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = compiled;
        self.runtime_stale.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// What a fork of this session starts from (`Registry::fork`):
    /// refused once the session ended (`SESSION_ENDED`) or while an
    /// operation runs (`SESSION_BUSY`: a turn's conversation is not settled
    /// until it ends).
    pub fn fork_point(&self) -> CoreResult<ForkPoint> {
        use crate::error::CoreError;
        // A session whose runtime broke (`error`) can still be forked: the
        // fork starts a runtime of its own from the stored conversation.
        let inner = self.lock();
        let status = inner.machine.status();
        if status == SessionStatus::Ended {
            return Err(CoreError::new(ErrorCode::SessionEnded, "the session has ended (resume it first)"));
        }
        if inner.task.is_some() || status.is_active_turn() {
            return Err(CoreError::new(ErrorCode::SessionBusy, "fork between turns"));
        }
        Ok(ForkPoint {
            info: inner.machine.info().clone(),
            provider_session_id: inner
                .machine
                .provider_session_id()
                .map(str::to_owned)
                .or_else(|| self.fork_of.clone()),
        })
    }

    /// The session's guidance and its current frontend tools.
    pub fn skills(&self) -> pb::Skills {
        pb::Skills { guidance: self.guidance.clone(), tools: self.tools().definitions.clone() }
    }

    /// The session's info with its current model and effort.
    pub fn current_info(&self) -> pb::SessionInfo {
        self.lock().machine.info().clone()
    }

    fn changes_state(&self) -> MutexGuard<'_, TurnSnapshots> {
        self.changes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `GetChanges` (see core.proto): the running turn's so far when
    /// `turn_id` names it (or is empty while one runs), else the recorded ones.
    pub async fn get_changes(self: &Arc<Self>, turn_id: &str) -> CoreResult<pb::GetChangesResponse> {
        let running = self.lock().machine.running_turn();
        if let Some((operation, turn)) = running.filter(|(_, turn)| turn_id.is_empty() || turn == turn_id) {
            // Before its start snapshot the agent has not been handed the turn: nothing changed yet.
            let (mut changes, _) = self.changes_so_far(&operation).await.unwrap_or_else(|| {
                let nothing = pb::GetChangesResponse {
                    operation_id: operation.as_str().to_owned(),
                    complete: true,
                    ..Default::default()
                };
                (nothing, Arc::default())
            });
            changes.turn_id = turn;
            changes.in_progress = true;
            return Ok(changes);
        }
        self.shared.store.turn_changes(&self.id, turn_id).await?.ok_or_else(|| {
            crate::error::CoreError::new(ErrorCode::ChangesNotFound, "no changes are recorded for that turn")
        })
    }

    /// Settles the operation, commits its completion, then announces it.
    async fn finish_operation(self: &Arc<Self>, operation: &OperationId, result: Result<(), ProviderFailure>) {
        let (finished, committed) = self.step_committed(|m, now, out| {
            let record = m.finish(operation, result, now, out);
            let finished = record.is_some();
            out.extend(record.map(Effect::Save));
            finished
        });
        if !finished {
            return;
        }
        // The completion is announced only once it is durable (with
        // synchronous=FULL), so a client that saw it can rely on it across a
        // Core crash. A store that fails must not leave the client waiting:
        // the operation then ends with an error.
        match committed.await {
            Ok(()) => self.step(|m, now, out| m.completion_committed(operation, now, out)),
            Err(error) => {
                tracing::error!(session = %self.id, %error, "could not persist an operation's completion");
                let reason = error.to_string();
                self.step(|m, now, out| m.completion_not_committed(operation, &reason, now, out));
            }
        }
        let mut inner = self.lock();
        inner.task.take_if(|(running, _)| running == operation);
        inner.cancel.take_if(|(running, _)| running == operation);
        inner.steer.take_if(|(running, _)| running == operation);
    }

    /// `Steer`: hands `text` to the running user turn (`operation`, or
    /// whichever runs) and answers once the agent took it; then it is the
    /// user's in the transcript. Refused before anything reaches the agent
    /// (see `Steer` in core.proto for the codes and their order).
    pub async fn steer(
        self: &Arc<Self>,
        operation: Option<OperationId>,
        text: String,
    ) -> CoreResult<pb::SteerResponse> {
        use crate::error::CoreError;
        if text.trim().is_empty() {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "the steered text is empty"));
        }
        machine::check_text_size(&text)?;
        self.check_transcript_quota(&text)?;
        let steers = match self.shared.providers.now().get(&self.info.provider) {
            Some(provider) => provider.steers().await,
            None => false,
        };
        if !steers {
            return Err(CoreError::new(
                ErrorCode::SteerUnsupported,
                format!("provider {:?} cannot take input while a turn runs", self.info.provider),
            ));
        }
        let not_running = || CoreError::new(ErrorCode::TurnNotRunning, "the turn ended before the agent took the text");
        let (target, taken) = {
            let inner = self.lock();
            let target = inner.machine.steerable(operation.as_ref())?;
            let sender = inner.steer.as_ref().filter(|(running, _)| *running == target).map(|(_, s)| s.clone());
            let sender = sender.ok_or_else(not_running)?;
            let (tx, rx) = oneshot::channel();
            match sender.try_send(SteerInput { text, taken: tx }) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(CoreError::new(ErrorCode::SessionBusy, "earlier steered texts are still on their way"));
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(not_running()),
            }
            (target, rx)
        };
        // Not bounded by a clock of its own: an agent takes a steered text
        // when its turn can (claude at its next tool round), and a text
        // given up on by a timeout here could still land afterwards. The
        // wait ends with the turn, which drops what it did not take.
        match taken.await {
            // The provider recorded it through its sink (`TurnSink::steered`).
            Ok(Ok(())) => Ok(pb::SteerResponse { operation_id: target.into_string() }),
            Ok(Err(refused)) => {
                Err(CoreError::new(refused.error_code().unwrap_or(ErrorCode::ProviderError), refused.message))
            }
            Err(_) => Err(not_running()),
        }
    }

    /// `Cancel`: stops the active operation (`operation`, or whichever is
    /// active) and answers once its `OperationCompleted` is emitted, with
    /// that event's seq. Nothing running is a no-op answered at once.
    pub async fn cancel(self: &Arc<Self>, operation: Option<OperationId>) -> CoreResult<pb::CancelResponse> {
        let waiting = {
            let mut inner = self.lock();
            let mut effects = Vec::new();
            let target = inner.machine.cancel(operation.as_ref(), Now::current(), &mut effects);
            self.apply(&mut inner, effects);
            target.map(|target| {
                let (tx, rx) = oneshot::channel();
                inner.cancel_waiters.push((target.clone(), tx));
                (target, rx)
            })
        };
        let Some((target, settled)) = waiting else {
            return Ok(pb::CancelResponse::default());
        };
        // Bounded twice over: the grace ends a provider that does not stop,
        // and this ends the wait should the completion's commit hang.
        let settled_seq = match tokio::time::timeout(CANCEL_GRACE * 3, settled).await {
            Ok(Ok(seq)) => seq,
            _ => {
                return Err(crate::error::CoreError::new(
                    ErrorCode::Internal,
                    format!("operation {target} did not complete after its cancel"),
                ));
            }
        };
        Ok(pb::CancelResponse { operation_id: target.into_string(), settled_seq })
    }

    /// Asks the application about an agent's permission request (see
    /// [`crate::providers::PermissionAsker`]): numbered, given its deadline,
    /// announced, and answered by [`Session::answer_permission`], the
    /// deadline (rejected) or the operation's end (cancelled).
    pub async fn ask_permission(
        self: &Arc<Self>,
        mut request: pb::PermissionRequest,
    ) -> Result<PermissionAnswer, pb::Error> {
        request.permission_id = new_id("perm");
        request.user_only = self.only_the_user_answers(&request);
        let timeout = self.shared.permission_timeout;
        let (receiver, id) = {
            let mut inner = self.lock();
            let now = Now::current();
            request.deadline_at_ms = now.epoch_ms + timeout.as_millis() as i64;
            let id = request.permission_id.clone();
            let mut effects = Vec::new();
            inner.machine.ask_permission(request, now, &mut effects)?;
            let (tx, rx) = oneshot::channel();
            inner.permission_responders.insert(id.clone(), tx);
            self.apply(&mut inner, effects);
            (rx, id)
        };
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Ok(PermissionAnswer::Cancelled),
            Err(_) => {
                self.step(|m, now, out| m.permission_timed_out(&id, now, out));
                self.lock().permission_responders.remove(&id);
                Ok(PermissionAnswer::Rejected)
            }
        }
    }

    /// The application's answer to a permission request.
    pub fn answer_permission(self: &Arc<Self>, permission_id: &str, option_id: &str) -> CoreResult<()> {
        self.step(|m, now, out| m.answer_permission(permission_id, option_id, now, out))
    }

    /// The user's answer (an owner call), to any request of this session.
    pub fn answer_user_permission(self: &Arc<Self>, permission_id: &str, option_id: &str) -> CoreResult<()> {
        self.step(|m, now, out| m.answer_permission_as(machine::Answerer::User, permission_id, option_id, now, out))
    }

    /// The requests waiting for the user.
    pub fn user_permissions(&self) -> Vec<pb::PermissionRequest> {
        self.lock().machine.user_permissions().cloned().collect()
    }

    /// Whether a web page may not answer `request` itself: the agent asks
    /// for more than its workspace's files (a command, a fetch, a path
    /// outside), and the user has not let this origin approve that in this
    /// folder. Approving a site must not be code execution as the user.
    fn only_the_user_answers(&self, request: &pb::PermissionRequest) -> bool {
        use crate::consent::{WorkspaceGrant, stays_in_workspace};
        use pedelec_protocol::origin::is_web_origin;
        if !is_web_origin(&self.origin) {
            return false;
        }
        if request.activity.as_ref().is_some_and(|a| stays_in_workspace(a, &self.workspace.root)) {
            return false;
        }
        let grant = self.shared.consent.workspace_grant(&self.origin, &self.workspace.root, self.workspace.managed);
        grant != WorkspaceGrant::Granted { may_approve_commands: true }
    }

    /// What `ListSessions` shows of this session.
    pub fn summary(&self) -> pb::SessionSummary {
        self.lock().machine.summary()
    }

    /// Ends the session. `Ok(false)` when it had already ended.
    pub async fn end(self: &Arc<Self>, reason: &str) -> CoreResult<bool> {
        let reason = reason.to_owned();
        self.detached(|session| async move { session.end_now(&reason).await }).await
    }

    async fn end_now(self: &Arc<Self>, reason: &str) -> CoreResult<bool> {
        let (ended, committed) = self.step_committed(|m, now, out| {
            let record = m.end(reason, now, out);
            let ended = record.is_some();
            out.extend(record.map(Effect::Save));
            ended
        });
        if !ended {
            return Ok(false);
        }
        self.shared.assets.revoke_session(self.id.as_str());
        committed.await?;
        let mut runtime = self.runtime.lock().await;
        if let Some(mut gone) = runtime.take() {
            gone.shutdown();
        }
        Ok(true)
    }

    /// Ended → idle on the same thread; idempotent when idle. Contacts no provider.
    pub async fn resume(self: &Arc<Self>) -> CoreResult<()> {
        if !self.lock().machine.can_resume()? {
            return Ok(());
        }
        self.workspace.check_present()?;
        // A subscriber arriving after this look is harmless: a timer
        // checks at its end whether anyone watches.
        let unwatched = self.lock().log.subscribers() == 0;
        let (_, committed) = self.step_committed(|m, now, out| {
            let record = m.resume(unwatched, now, out);
            out.extend(record.map(Effect::Save));
        });
        committed.await
    }

    /// The application's answer to a pending tool call.
    pub fn submit_tool_result(self: &Arc<Self>, request: pb::SubmitToolResultRequest) -> CoreResult<()> {
        self.step(|m, now, out| m.submit_tool_result(request, now, out))
    }

    /// A tool call from the agent, during the active operation (`operation`
    /// `None`: whichever is active, as for external agents over the MCP bridge).
    pub async fn call_tool(
        self: &Arc<Self>,
        operation: Option<&OperationId>,
        tool: &str,
        args_json: String,
    ) -> Result<String, pb::Error> {
        if operation.is_none() {
            self.fence.pass(tool, fence::REPORT_WAIT).await;
        }
        let request = ToolRequestId::new(new_id("tool"));
        let tools = self.tools();
        let check = |tool: &str, args: &str| tools.check_call(tool, args).map(pedelec_protocol::tools::tool_timeout);
        let (receiver, started) = {
            let mut inner = self.lock();
            let mut effects = Vec::new();
            let started =
                inner.machine.call_tool(operation, tool, args_json, check, request, Now::current(), &mut effects)?;
            let (tx, rx) = oneshot::channel();
            inner.responders.insert(started.request.clone(), tx);
            self.apply(&mut inner, effects);
            (rx, started)
        };
        // Dropped before an answer (the agent's request went away): the
        // call is withdrawn rather than left pending until the turn ends.
        let mut abandon = Abandon { session: self, request: Some(started.request.clone()) };
        let waited = tokio::time::timeout(started.timeout, receiver).await;
        abandon.disarm();
        match waited {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(pb::Error::new(ErrorCode::SessionEnded, "the session ended before the tool answered")),
            Err(_) => {
                self.step(|m, now, out| m.tool_timed_out(&started.request, now, out));
                Err(pb::Error::new(
                    ErrorCode::ToolTimeout,
                    format!("{tool} did not answer within {} ms", started.timeout.as_millis()),
                ))
            }
        }
    }
}

/// Withdraws a frontend tool call from the machine when the future waiting
/// for its answer is dropped before [`Abandon::disarm`].
struct Abandon<'a> {
    session: &'a Arc<Session>,
    request: Option<ToolRequestId>,
}

impl Abandon<'_> {
    fn disarm(&mut self) {
        self.request = None;
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(request) = self.request.take() {
            self.session.step(|m, now, out| m.tool_abandoned(&request, now, out));
        }
    }
}
