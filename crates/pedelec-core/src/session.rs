//! One session: its status, operations, per-session `seq`, subscribers,
//! pending frontend tool calls (the tool broker) and provider runtime.
//!
//! All state sits behind one short-held mutex; every event is numbered and
//! fanned out to subscribers while that mutex is held, so a new subscriber's
//! snapshot and the live events after it never overlap or leave a gap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, SessionStatus, limits};
use tokio::sync::{mpsc, oneshot};

use crate::error::{CoreError, CoreResult};
use crate::providers::{
    BoxFuture, PREPARE_PROMPT, ProviderFailure, ProviderSession, ProviderSetup, Providers, ToolBridge, TurnRequest,
    TurnSink,
};
use crate::store::{SessionRecord, Store, TranscriptEntry};
use crate::tools::ToolSet;
use crate::workspace::Workspace;

/// How far ahead of the emitted `seq` the stored ceiling is moved, so that
/// numbering survives a crash without a disk write per event.
const SEQ_RESERVATION: u64 = 4096;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// What every session shares with Core.
pub struct Shared {
    pub store: Store,
    pub assets: Arc<crate::assets::AssetServer>,
    pub providers: Providers,
    pub disconnect_grace: Duration,
    /// A turn running longer fails with `PROVIDER_TIMEOUT` and its runtime is stopped.
    pub turn_timeout: Duration,
    /// What agent processes need to reach the MCP bridge: Core's executable and socket.
    pub core_exe: std::path::PathBuf,
    pub socket: std::path::PathBuf,
}

/// One subscriber's queue. Bounded: a provider waits while a queue is full
/// ([`Session::flow`]), and a subscriber that stays full is dropped and
/// re-synchronised with a fresh snapshot, so a stalled reader cannot grow
/// Core's memory without limit.
struct Subscriber {
    tx: mpsc::Sender<pb::SessionEvent>,
    lagged: Arc<AtomicBool>,
    /// When [`Session::flow`] first found this queue full (cleared once it has room).
    full_since: Option<std::time::Instant>,
}

struct ActiveOperation {
    id: String,
    kind: pb::OperationKind,
    turn: pb::TurnInfo,
    task: Option<tokio::task::AbortHandle>,
}

struct PendingTool {
    call: pb::PendingToolCall,
    operation_id: String,
    responder: oneshot::Sender<Result<String, pb::Error>>,
}

struct State {
    status: SessionStatus,
    seq: u64,
    seq_ceiling: u64,
    active: Option<ActiveOperation>,
    pending: Vec<PendingTool>,
    usage: Option<u64>,
    prepared: bool,
    provider_session_id: Option<String>,
    subscribers: HashMap<u64, Subscriber>,
    next_subscriber: u64,
    /// Bumped whenever a subscriber arrives, so a pending disconnect timer knows it lost.
    disconnect_epoch: u64,
    /// How the last operations ended, oldest first (`Snapshot.recent_outcomes`).
    outcomes: std::collections::VecDeque<pb::OperationOutcome>,
    /// Time the active operation spent in `waiting_tool_result`, which the
    /// turn timeout does not count (a tool's own timeout may be longer).
    tool_wait: Duration,
    /// Since when the session waits for a tool result, while it does.
    waiting_since: Option<std::time::Instant>,
}

impl State {
    /// The active operation's time in tool waits so far, the current one included.
    fn tool_wait_so_far(&self) -> Duration {
        self.tool_wait + self.waiting_since.map(|since| since.elapsed()).unwrap_or_default()
    }

    /// Remembers an operation's outcome for later snapshots (bounded).
    fn remember(&mut self, outcome: pb::OperationOutcome) {
        if self.outcomes.len() == limits::RECENT_OUTCOMES {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(outcome);
    }
}

/// The event that announces an operation's outcome.
fn completed(outcome: &pb::OperationOutcome) -> Kind {
    Kind::OperationCompleted(pb::OperationCompleted { kind: outcome.kind, error: outcome.error.clone() })
}

/// The transcript body of an `operation_completed` entry.
fn completion_entry(outcome: &pb::OperationOutcome) -> serde_json::Value {
    serde_json::json!({
        "operation_id": outcome.operation_id,
        "kind": outcome.kind,
        "error": outcome.error.as_ref().map(|e| e.code.clone()),
        "message": outcome.error.as_ref().map(|e| e.message.clone()),
    })
}

/// An outcome back from its transcript body. Entries written before kinds
/// and messages were recorded read as kind unspecified and an empty message.
fn outcome_from_entry(body: &serde_json::Value) -> Option<pb::OperationOutcome> {
    let operation_id = body.get("operation_id")?.as_str()?.to_owned();
    let kind = body.get("kind").and_then(serde_json::Value::as_i64).unwrap_or(0) as i32;
    let error = body.get("error").and_then(serde_json::Value::as_str).map(|code| pb::Error {
        code: code.to_owned(),
        message: body.get("message").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned(),
        details_json: String::new(),
    });
    Some(pb::OperationOutcome { operation_id, kind, error })
}

pub struct Session {
    pub id: String,
    pub origin: String,
    pub info: pb::SessionInfo,
    pub workspace: Workspace,
    pub tool_token: String,
    pub guidance: String,
    pub tools: Arc<ToolSet>,
    shared: Arc<Shared>,
    state: Mutex<State>,
    runtime: tokio::sync::Mutex<Option<Box<dyn ProviderSession>>>,
}

/// A registered subscriber's end: its snapshot (until sent), its queue, and
/// whether Core dropped it for falling behind.
struct Subscription {
    snapshot: Option<pb::SessionEvent>,
    events: mpsc::Receiver<pb::SessionEvent>,
    lagged: Arc<AtomicBool>,
    guard: SubscriberGuard,
}

/// Keeps a subscription registered; dropping it (the stream went away) unsubscribes.
struct SubscriberGuard {
    session: Arc<Session>,
    id: u64,
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.session.unsubscribe(self.id);
    }
}

/// Construction parameters.
pub struct NewSession {
    pub id: String,
    pub origin: String,
    pub info: pb::SessionInfo,
    pub workspace: Workspace,
    pub tool_token: String,
    pub skills: pb::Skills,
    pub tools: Arc<ToolSet>,
}

impl Session {
    pub fn new(shared: Arc<Shared>, new: NewSession) -> Arc<Self> {
        Self::with_state(shared, new, SessionStatus::Idle, 0, None, false, None)
    }

    fn with_state(
        shared: Arc<Shared>,
        new: NewSession,
        status: SessionStatus,
        seq: u64,
        usage: Option<u64>,
        prepared: bool,
        provider_session_id: Option<String>,
    ) -> Arc<Self> {
        Arc::new(Session {
            id: new.id,
            origin: new.origin,
            info: new.info,
            workspace: new.workspace,
            tool_token: new.tool_token,
            guidance: new.skills.guidance,
            tools: new.tools,
            shared,
            state: Mutex::new(State {
                status,
                seq,
                seq_ceiling: seq,
                active: None,
                pending: Vec::new(),
                usage,
                prepared,
                provider_session_id,
                subscribers: HashMap::new(),
                next_subscriber: 0,
                disconnect_epoch: 0,
                outcomes: std::collections::VecDeque::new(),
                tool_wait: Duration::ZERO,
                waiting_since: None,
            }),
            runtime: tokio::sync::Mutex::new(None),
        })
    }

    /// Brings a stored session back. An operation that was running when Core
    /// stopped is reported failed with `CORE_RESTARTED` and the session is idle again.
    pub fn restore(shared: Arc<Shared>, new: NewSession, record: &SessionRecord) -> Arc<Self> {
        let stored = SessionStatus::parse(&record.status).unwrap_or(SessionStatus::Idle);
        let session = Self::with_state(
            shared,
            new,
            stored,
            record.seq_ceiling,
            record.usage_total,
            record.prepared,
            record.provider_session_id.clone(),
        );
        {
            let mut st = session.lock();
            for outcome in record.recent_outcomes.iter().filter_map(outcome_from_entry) {
                st.remember(outcome);
            }
        }
        if let Some(op) = &record.active_operation {
            let mut st = session.lock();
            let error = pb::Error::new(ErrorCode::CoreRestarted, "Core restarted while this operation ran");
            session.emit(&mut st, "", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }));
            // The kind of the interrupted operation is not recorded; the id is what clients match.
            let outcome = pb::OperationOutcome { operation_id: op.clone(), kind: 0, error: Some(error) };
            session.append(&st, "operation_completed", completion_entry(&outcome));
            st.remember(outcome);
            if st.status.is_active_turn() {
                session.set_status(&mut st, SessionStatus::Running, "");
                session.set_status(&mut st, SessionStatus::Idle, "");
            }
            let record = session.record(&st);
            session.shared.store.save(record);
        }
        session
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn status(&self) -> SessionStatus {
        self.lock().status
    }

    /// The durable record of the current state.
    fn record(&self, st: &State) -> SessionRecord {
        SessionRecord {
            id: self.id.clone(),
            origin: self.origin.clone(),
            provider: self.info.provider.clone(),
            model: self.info.model.clone(),
            effort_level: self.info.effort_level,
            created_at_ms: self.info.created_at_ms,
            workspace: self.workspace.root.display().to_string(),
            managed_workspace: self.workspace.managed,
            auto_end_on_disconnect: self.info.auto_end_on_disconnect,
            status: st.status.as_str().to_owned(),
            provider_session_id: st.provider_session_id.clone(),
            prepared: st.prepared,
            usage_total: st.usage,
            seq_ceiling: st.seq_ceiling.max(st.seq),
            tool_token: self.tool_token.clone(),
            active_operation: st.active.as_ref().map(|a| a.id.clone()),
            recent_outcomes: Vec::new(),
        }
    }

    pub fn initial_record(&self) -> SessionRecord {
        self.record(&self.lock())
    }

    fn append(&self, st: &State, kind: &str, body: serde_json::Value) {
        self.shared.store.append(&self.id, TranscriptEntry { seq: st.seq, at_ms: now_ms(), kind: kind.into(), body });
    }

    /// Numbers an event and sends it to every subscriber.
    fn emit(&self, st: &mut State, operation_id: &str, kind: Kind) {
        st.seq += 1;
        if st.seq > st.seq_ceiling {
            st.seq_ceiling = st.seq + SEQ_RESERVATION;
            self.shared.store.save(self.record(st));
        }
        let event = pb::SessionEvent {
            session_id: self.id.clone(),
            seq: st.seq,
            emitted_at_ms: now_ms(),
            turn: st.active.as_ref().map(|a| a.turn.clone()),
            operation_id: operation_id.to_owned(),
            kind: Some(kind),
        };
        st.subscribers.retain(|_, subscriber| match subscriber.tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                subscriber.lagged.store(true, Ordering::SeqCst);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    fn set_status(&self, st: &mut State, next: SessionStatus, operation_id: &str) {
        if st.status == next {
            return;
        }
        match st.status.transition(next) {
            Ok(_) => {
                let previous = st.status;
                if next == SessionStatus::WaitingToolResult {
                    st.waiting_since = Some(std::time::Instant::now());
                } else if let Some(since) = st.waiting_since.take() {
                    st.tool_wait += since.elapsed();
                }
                st.status = next;
                self.emit(st, operation_id, pedelec_protocol::gate::build::status(next, previous));
            }
            Err(illegal) => {
                tracing::warn!(session = %self.id, %illegal, "refusing a status change")
            }
        }
    }

    fn snapshot(&self, st: &State) -> pb::SessionEvent {
        let snapshot = pb::Snapshot {
            status: st.status.to_pb() as i32,
            active_operation: st
                .active
                .as_ref()
                .map(|a| pb::ActiveOperation { operation_id: a.id.clone(), kind: a.kind as i32 }),
            turn: st.active.as_ref().map(|a| a.turn.clone()),
            pending_tools: st.pending.iter().map(|p| p.call.clone()).collect(),
            usage: Some(pb::Usage { total_tokens: st.usage }),
            last_seq: st.seq,
            provider: self.info.provider.clone(),
            model: self.info.model.clone(),
            effort_level: self.info.effort_level,
            prepared: st.prepared,
            created_at_ms: self.info.created_at_ms,
            recent_outcomes: st.outcomes.iter().cloned().collect(),
        };
        pb::SessionEvent {
            session_id: self.id.clone(),
            seq: st.seq,
            emitted_at_ms: now_ms(),
            turn: snapshot.turn.clone(),
            operation_id: String::new(),
            kind: Some(Kind::Snapshot(snapshot)),
        }
    }

    /// Registers a subscriber: its snapshot and the receiver of every later event.
    fn subscribe(self: &Arc<Self>) -> Subscription {
        let (tx, events) = mpsc::channel(limits::SUBSCRIBER_QUEUE_EVENTS);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut st = self.lock();
        let id = st.next_subscriber;
        st.next_subscriber += 1;
        st.disconnect_epoch += 1;
        st.subscribers.insert(id, Subscriber { tx, lagged: lagged.clone(), full_since: None });
        let snapshot = self.snapshot(&st);
        Subscription { snapshot: Some(snapshot), events, lagged, guard: SubscriberGuard { session: self.clone(), id } }
    }

    /// The session's events for one subscriber: a snapshot, then every later
    /// event. If the subscriber fell so far behind that it was dropped, it is
    /// re-registered and continues with a fresh snapshot (which resets the
    /// reader's gate) instead of ending. The stream ends when Core closes the
    /// session's subscriptions; dropping it unsubscribes.
    pub fn events(self: &Arc<Self>) -> impl futures::Stream<Item = pb::SessionEvent> + Send + 'static {
        futures::stream::unfold(self.subscribe(), |mut subscription| async move {
            if let Some(snapshot) = subscription.snapshot.take() {
                return Some((snapshot, subscription));
            }
            if let Some(event) = subscription.events.recv().await {
                return Some((event, subscription));
            }
            if !subscription.lagged.load(Ordering::SeqCst) {
                return None;
            }
            let session = &subscription.guard.session;
            tracing::info!(session = %session.id, "a subscriber fell behind; re-synchronising it with a snapshot");
            // Registered before the old guard drops, so the session never looks unwatched.
            let mut fresh = session.subscribe();
            let snapshot = fresh.snapshot.take()?;
            Some((snapshot, fresh))
        })
    }

    /// Waits while a subscriber's queue is full, so a provider produces no
    /// faster than its slowest reader; one that stays full for
    /// [`limits::SUBSCRIBER_LAG_TIMEOUT`] is dropped (it re-synchronises).
    pub async fn flow(&self) {
        loop {
            let now = std::time::Instant::now();
            // Every full queue, with the moment its grace runs out: judged per
            // subscriber and all at once, so N silent readers cost one grace,
            // not N of them one after another.
            let full: Vec<(u64, mpsc::Sender<pb::SessionEvent>, std::time::Instant)> = {
                let mut st = self.lock();
                st.subscribers
                    .iter_mut()
                    .filter_map(|(id, s)| {
                        if s.tx.capacity() > 0 {
                            s.full_since = None;
                            return None;
                        }
                        let since = *s.full_since.get_or_insert(now);
                        Some((*id, s.tx.clone(), since + limits::SUBSCRIBER_LAG_TIMEOUT))
                    })
                    .collect()
            };
            let Some(earliest) = full.iter().map(|(_, _, deadline)| *deadline).min() else { return };
            // Any queue getting room, or the first grace running out, is news.
            let room = futures::future::select_all(full.iter().map(|(_, tx, _)| Box::pin(tx.reserve())));
            let _ = tokio::time::timeout_at(earliest.into(), room).await;
            let now = std::time::Instant::now();
            let mut st = self.lock();
            for (id, _, deadline) in &full {
                if now >= *deadline
                    && st.subscribers.get(id).is_some_and(|s| s.tx.capacity() == 0)
                    && let Some(subscriber) = st.subscribers.remove(id)
                {
                    subscriber.lagged.store(true, Ordering::SeqCst);
                }
            }
        }
    }

    fn unsubscribe(self: &Arc<Self>, id: u64) {
        let mut st = self.lock();
        st.subscribers.remove(&id);
        if st.subscribers.is_empty() {
            self.arm_disconnect_timer(&mut st);
        }
    }

    /// With `auto_end_on_disconnect`, ends the session if nobody subscribes within the grace period.
    fn arm_disconnect_timer(self: &Arc<Self>, st: &mut State) {
        if !self.info.auto_end_on_disconnect || st.status == SessionStatus::Ended {
            return;
        }
        st.disconnect_epoch += 1;
        let epoch = st.disconnect_epoch;
        let session = self.clone();
        let grace = self.shared.disconnect_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let abandoned = {
                let st = session.lock();
                st.disconnect_epoch == epoch && st.subscribers.is_empty()
            };
            if abandoned {
                tracing::info!(session = %session.id, "last subscriber left; ending the session");
                let _ = session.end("disconnected").await;
            }
        });
    }

    /// Arms the disconnect timer for a session restored without subscribers.
    pub fn arm_after_restore(self: &Arc<Self>) {
        let mut st = self.lock();
        if st.subscribers.is_empty() {
            self.arm_disconnect_timer(&mut st);
        }
    }

    /// Drops every subscriber, ending their streams (Core is stopping).
    pub fn close_subscribers(&self) {
        self.lock().subscribers.clear();
    }

    pub async fn send_text(self: &Arc<Self>, text: String) -> CoreResult<pb::OperationAccepted> {
        if text.len() > limits::MAX_TEXT_BYTES {
            return Err(CoreError::with_details(
                ErrorCode::TextTooLarge,
                format!("text of {} bytes exceeds the {}-byte limit", text.len(), limits::MAX_TEXT_BYTES),
                serde_json::json!({ "limit": limits::MAX_TEXT_BYTES }),
            ));
        }
        let starting = {
            let mut st = self.lock();
            self.check_can_start(&st)?;
            self.start_operation(&mut st, pb::OperationKind::SendText, text)
        };
        self.announce(starting).await
    }

    pub async fn prepare(self: &Arc<Self>) -> CoreResult<pb::OperationAccepted> {
        let starting = {
            let mut st = self.lock();
            if st.status == SessionStatus::Ended {
                return Err(CoreError::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            if let Some(active) = &st.active
                && active.kind == pb::OperationKind::Prepare
            {
                return Ok(accepted(&active.id, pb::OperationKind::Prepare, false));
            }
            if st.prepared {
                return Ok(accepted("", pb::OperationKind::Prepare, true));
            }
            self.check_can_start(&st)?;
            self.start_operation(&mut st, pb::OperationKind::Prepare, PREPARE_PROMPT.to_owned())
        };
        self.announce(starting).await
    }

    fn check_can_start(&self, st: &State) -> CoreResult<()> {
        match st.status.refuse_start(st.active.is_some()) {
            Some((code, message)) => Err(CoreError::new(code, message)),
            None => Ok(()),
        }
    }

    /// Records a new operation as the active one (durably, see [`Session::announce`]).
    fn start_operation(&self, st: &mut State, kind: pb::OperationKind, text: String) -> StartingOperation {
        let operation_id = new_id("op");
        let turn_kind = if kind == pb::OperationKind::Prepare { pb::TurnKind::Prepare } else { pb::TurnKind::User };
        let turn = pb::TurnInfo { turn_id: new_id("turn"), kind: turn_kind as i32, started_at_ms: now_ms() };
        st.active = Some(ActiveOperation { id: operation_id.clone(), kind, turn, task: None });
        st.tool_wait = Duration::ZERO;
        let entry = if kind == pb::OperationKind::Prepare { "prepare" } else { "user_text" };
        self.append(st, entry, serde_json::json!({ "operation_id": operation_id, "text": text }));
        self.shared.store.save(self.record(st));
        StartingOperation { operation_id, kind, turn_kind, text }
    }

    /// Once the operation is committed, announces it and starts the turn, so
    /// that a client which saw it start can count on it across a crash.
    async fn announce(self: &Arc<Self>, starting: StartingOperation) -> CoreResult<pb::OperationAccepted> {
        let StartingOperation { operation_id, kind, turn_kind, text } = starting;
        if let Err(error) = self.shared.store.flush().await {
            // Never announced, so nobody awaits it: the session must not stay
            // busy with an operation that no task runs.
            let mut st = self.lock();
            if st.active.as_ref().is_some_and(|a| a.id == operation_id) {
                st.active = None;
                self.shared.store.save(self.record(&st));
            }
            return Err(error);
        }
        let mut st = self.lock();
        if st.active.as_ref().is_none_or(|a| a.id != operation_id) {
            // Ended in the meantime: end() already settled it.
            return Err(CoreError::new(ErrorCode::SessionEnded, "the session ended"));
        }
        self.emit(&mut st, &operation_id, Kind::OperationStarted(pb::OperationStarted { kind: kind as i32 }));
        self.set_status(&mut st, SessionStatus::Running, &operation_id);
        let session = self.clone();
        let op = operation_id.clone();
        let task = tokio::spawn(async move { session.run_operation(op, turn_kind, text).await });
        if let Some(active) = st.active.as_mut() {
            active.task = Some(task.abort_handle());
        }
        Ok(accepted(&operation_id, kind, false))
    }

    fn provider_setup(&self) -> ProviderSetup {
        let st = self.lock();
        ProviderSetup {
            session_id: self.id.clone(),
            model: self.info.model.clone(),
            effort_level: pb::EffortLevel::try_from(self.info.effort_level).unwrap_or_default(),
            workspace: self.workspace.root.clone(),
            runtime_dir: self.workspace.runtime.clone(),
            guidance: self.guidance.clone(),
            tools: self.tools.definitions.clone(),
            provider_session_id: st.provider_session_id.clone(),
            usage_total: st.usage,
            bridge: ToolBridge {
                command: self.shared.core_exe.clone(),
                socket: self.shared.socket.clone(),
                tool_token: self.tool_token.clone(),
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
        tokio::pin!(turn);
        loop {
            let waited = self.lock().tool_wait_so_far();
            match tokio::time::timeout_at(started + timeout + waited, &mut turn).await {
                Ok(output) => return Ok(output),
                Err(elapsed) if self.lock().tool_wait_so_far() <= waited => return Err(elapsed),
                Err(_) => continue,
            }
        }
    }

    async fn run_operation(self: Arc<Self>, operation_id: String, kind: pb::TurnKind, text: String) {
        let sink =
            OperationSink { session: self.clone(), operation_id: operation_id.clone(), kind, hidden: Mutex::default() };
        let outcome = {
            let mut runtime = self.runtime.lock().await;
            if runtime.is_none() {
                match self.shared.providers.get(&self.info.provider) {
                    Some(provider) => match provider.start(self.provider_setup()) {
                        Ok(started) => *runtime = Some(started),
                        Err(failure) => {
                            drop(runtime);
                            return self.finish_operation(&operation_id, Err(failure), String::new()).await;
                        }
                    },
                    None => {
                        drop(runtime);
                        let failure = ProviderFailure::coded(
                            ErrorCode::ProviderNotFound,
                            format!("provider {:?} is not available", self.info.provider),
                            true,
                        );
                        return self.finish_operation(&operation_id, Err(failure), String::new()).await;
                    }
                }
            }
            let provider = runtime.as_mut().expect("started above");
            let timeout = self.shared.turn_timeout;
            // A panic in a provider must end the operation, not leave it active
            // with no task behind it: it fails the turn like a hang does.
            let turn = std::panic::AssertUnwindSafe(provider.run_turn(TurnRequest { kind, text }, &sink));
            let turn = futures::FutureExt::catch_unwind(turn);
            let outcome = match self.within_turn_timeout(timeout, turn).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(panic)) => {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    tracing::error!(session = %self.id, %reason, "the provider panicked during a turn");
                    Err(ProviderFailure {
                        code: ErrorCode::Internal,
                        message: format!("the provider failed inside Pedelec: {reason}"),
                        fatal: false,
                        details: serde_json::Value::Null,
                    })
                }
                // The runtime's state is unknown after a hang: stop it; the next
                // turn starts a fresh one that continues the provider session.
                Err(_) => Err(ProviderFailure {
                    code: ErrorCode::ProviderTimeout,
                    message: format!("the provider did not finish the turn within {} ms", timeout.as_millis()),
                    fatal: false,
                    details: serde_json::json!({ "timeoutMs": timeout.as_millis() as u64 }),
                }),
            };
            let restart = match &outcome {
                Err(f) => f.fatal || matches!(f.code, ErrorCode::ProviderTimeout | ErrorCode::Internal),
                Ok(()) => false,
            };
            if restart && let Some(mut gone) = runtime.take() {
                gone.shutdown();
            }
            outcome
        };
        let hidden = std::mem::take(&mut *sink.hidden.lock().unwrap_or_else(|p| p.into_inner()));
        self.finish_operation(&operation_id, outcome, hidden).await;
    }

    async fn finish_operation(&self, operation_id: &str, outcome: Result<(), ProviderFailure>, hidden_text: String) {
        let record = {
            let mut st = self.lock();
            let Some(active) = st.active.as_ref().filter(|a| a.id == operation_id) else {
                return;
            };
            let kind = active.kind;
            let error = match (kind, outcome) {
                (pb::OperationKind::Prepare, Ok(())) if pedelec_protocol::prepare::acknowledged(&hidden_text) => {
                    st.prepared = true;
                    None
                }
                (pb::OperationKind::Prepare, Ok(())) => Some((
                    pb::Error::with_details(
                        ErrorCode::PrepareFailed,
                        "the provider did not acknowledge the preparation with PEDELEC_PREPARED",
                        &serde_json::json!({ "answer": hidden_text.chars().take(200).collect::<String>() }),
                    ),
                    false,
                )),
                (_, Ok(())) => None,
                (kind, Err(failure)) => {
                    let code = match (failure.fatal, kind) {
                        (true, _) => ErrorCode::SessionError,
                        (false, pb::OperationKind::Prepare) => ErrorCode::PrepareFailed,
                        (false, _) => ErrorCode::SendTextFailed,
                    };
                    let mut details = serde_json::json!({ "providerCode": failure.code.as_str() });
                    if let (Some(into), serde_json::Value::Object(extra)) = (details.as_object_mut(), failure.details) {
                        into.extend(extra);
                    }
                    Some((pb::Error::with_details(code, failure.message, &details), failure.fatal))
                }
            };
            // Abandoned tool calls of this operation get an answer for the agent.
            let abandoned: Vec<PendingTool> = {
                let (mine, rest) =
                    std::mem::take(&mut st.pending).into_iter().partition(|p| p.operation_id == operation_id);
                st.pending = rest;
                mine
            };
            for pending in abandoned {
                let _ = pending.responder.send(Err(pb::Error::new(ErrorCode::SessionBusy, "the turn finished")));
            }
            if let Some((error, fatal)) = &error {
                self.emit(&mut st, "", Kind::Error(pb::ErrorRaised { error: Some(error.clone()) }));
                let next = if *fatal { SessionStatus::Error } else { SessionStatus::Idle };
                self.set_status(&mut st, next, operation_id);
            } else {
                self.set_status(&mut st, SessionStatus::Idle, operation_id);
            }
            let error = error.map(|(e, _)| e);
            let outcome = pb::OperationOutcome { operation_id: operation_id.to_owned(), kind: kind as i32, error };
            self.append(&st, "operation_completed", completion_entry(&outcome));
            let mut record = self.record(&st);
            record.active_operation = None;
            (record, outcome)
        };
        let (record, outcome) = record;
        // The completion is announced only once it is durable, so a client
        // that saw it can rely on it across a Core crash.
        if let Err(error) = self.shared.store.save_durably(record).await {
            tracing::error!(session = %self.id, %error, "could not persist an operation's completion");
        }
        let mut st = self.lock();
        if st.active.as_ref().is_some_and(|a| a.id == operation_id) {
            self.emit(&mut st, operation_id, completed(&outcome));
            st.active = None;
            // Snapshots report it from now on, like the event: only once durable.
            st.remember(outcome);
        }
    }

    /// Ends the session. `Ok(false)` when it had already ended.
    pub async fn end(&self, reason: &str) -> CoreResult<bool> {
        let record = {
            let mut st = self.lock();
            if st.status == SessionStatus::Ended {
                return Ok(false);
            }
            for pending in std::mem::take(&mut st.pending) {
                let _ = pending.responder.send(Err(pb::Error::new(ErrorCode::SessionEnded, "the session ended")));
            }
            if let Some(active) = st.active.take() {
                if let Some(task) = &active.task {
                    task.abort();
                }
                let error = pb::Error::new(ErrorCode::SessionEnded, "the session ended during this operation");
                let outcome = pb::OperationOutcome {
                    operation_id: active.id.clone(),
                    kind: active.kind as i32,
                    error: Some(error),
                };
                st.active = Some(active);
                self.emit(&mut st, &outcome.operation_id, completed(&outcome));
                st.active = None;
                self.append(&st, "operation_completed", completion_entry(&outcome));
                st.remember(outcome);
            }
            if st.status.can_transition_to(SessionStatus::Ended) {
                self.set_status(&mut st, SessionStatus::Ended, "");
            }
            self.emit(&mut st, "", Kind::Ended(pb::Ended { reason: reason.to_owned() }));
            self.append(&st, "ended", serde_json::json!({ "reason": reason }));
            self.record(&st)
        };
        self.shared.store.save_durably(record).await?;
        let mut runtime = self.runtime.lock().await;
        if let Some(mut gone) = runtime.take() {
            gone.shutdown();
        }
        Ok(true)
    }

    /// Ended → idle on the same thread; idempotent when idle. Contacts no provider.
    pub async fn resume(self: &Arc<Self>) -> CoreResult<()> {
        let record = {
            let mut st = self.lock();
            match st.status {
                SessionStatus::Idle => return Ok(()),
                SessionStatus::Ended => {}
                SessionStatus::Error => {
                    return Err(CoreError::new(ErrorCode::SessionError, "the session is in the error status"));
                }
                _ => {
                    return Err(CoreError::new(ErrorCode::SessionBusy, "the session is not ended"));
                }
            }
            self.workspace.load_manifest()?;
            self.set_status(&mut st, SessionStatus::Idle, "");
            self.append(&st, "resumed", serde_json::json!({}));
            if st.subscribers.is_empty() {
                self.arm_disconnect_timer(&mut st);
            }
            self.record(&st)
        };
        self.shared.store.save_durably(record).await
    }

    /// The application's answer to a pending tool call.
    pub fn submit_tool_result(&self, request: pb::SubmitToolResultRequest) -> CoreResult<()> {
        use pb::submit_tool_result_request::Outcome;
        let outcome = match request.outcome {
            Some(Outcome::ResultJson(json)) => {
                if json.len() > limits::MAX_TOOL_JSON_BYTES {
                    return Err(CoreError::new(ErrorCode::InvalidArgument, "tool result exceeds the size limit"));
                }
                if let Err(e) = serde_json::from_str::<serde_json::Value>(&json) {
                    return Err(CoreError::new(ErrorCode::InvalidArgument, format!("tool result is not JSON: {e}")));
                }
                Ok(json)
            }
            Some(Outcome::Error(error)) => {
                if ErrorCode::parse(&error.code).is_none() {
                    return Err(CoreError::new(
                        ErrorCode::InvalidArgument,
                        format!("unknown error code {:?}", error.code),
                    ));
                }
                Err(error)
            }
            None => {
                return Err(CoreError::new(ErrorCode::InvalidArgument, "a tool result needs a result or an error"));
            }
        };
        let mut st = self.lock();
        let Some(index) = st.pending.iter().position(|p| p.call.tool_request_id == request.tool_request_id) else {
            return Err(CoreError::with_details(
                ErrorCode::ToolRequestNotFound,
                format!("tool request {:?} is unknown or already answered", request.tool_request_id),
                serde_json::json!({ "toolRequestId": request.tool_request_id }),
            ));
        };
        let pending = st.pending.remove(index);
        let body = match &outcome {
            Ok(json) => {
                serde_json::json!({ "tool_request_id": pending.call.tool_request_id, "result": json })
            }
            Err(e) => {
                serde_json::json!({ "tool_request_id": pending.call.tool_request_id, "error": e.code })
            }
        };
        self.append(&st, "tool_result", body);
        let _ = pending.responder.send(outcome);
        self.emit(
            &mut st,
            &pending.operation_id,
            Kind::ToolCallSettled(pb::ToolCallSettled {
                tool_request_id: pending.call.tool_request_id,
                code: String::new(),
            }),
        );
        if st.pending.is_empty() && st.status == SessionStatus::WaitingToolResult {
            self.set_status(&mut st, SessionStatus::Running, &pending.operation_id);
        }
        Ok(())
    }

    /// A tool call from the agent, during the active operation (`operation_id`
    /// empty: whichever is active, as for external agents over the MCP bridge).
    pub async fn call_tool(&self, operation_id: &str, tool: &str, args_json: String) -> Result<String, pb::Error> {
        if args_json.len() > limits::MAX_TOOL_JSON_BYTES {
            return Err(pb::Error::new(ErrorCode::ToolArgsInvalid, "tool arguments exceed the size limit"));
        }
        let (receiver, timeout, request_id, operation_id) = {
            let mut st = self.lock();
            if st.status == SessionStatus::Ended {
                return Err(pb::Error::new(ErrorCode::SessionEnded, "the session has ended"));
            }
            // Only while the turn runs: not before it is announced (the client
            // would drop a call of an operation it has not seen start) and not
            // while its completion is being made durable.
            let turn_running = matches!(st.status, SessionStatus::Running | SessionStatus::WaitingToolResult);
            let Some(active) =
                st.active.as_ref().filter(|a| turn_running && (operation_id.is_empty() || a.id == operation_id))
            else {
                return Err(pb::Error::new(ErrorCode::SessionBusy, "no turn is active to call a tool from"));
            };
            let operation_id = active.id.clone();
            let turn_id = active.turn.turn_id.clone();
            let definition = self.tools.check_call(tool, &args_json)?;
            let timeout = pedelec_protocol::tools::tool_timeout(definition);
            let request_id = new_id("tool");
            let deadline_at_ms = now_ms() + timeout.as_millis() as i64;
            let (tx, rx) = oneshot::channel();
            let call = pb::PendingToolCall {
                tool_request_id: request_id.clone(),
                tool: tool.to_owned(),
                args_json: args_json.clone(),
                turn_id,
                deadline_at_ms,
            };
            st.pending.push(PendingTool { call, operation_id: operation_id.clone(), responder: tx });
            self.set_status(&mut st, SessionStatus::WaitingToolResult, &operation_id);
            self.append(
                &st,
                "tool_call",
                serde_json::json!({ "tool_request_id": request_id, "tool": tool, "args": args_json }),
            );
            self.emit(
                &mut st,
                &operation_id,
                Kind::ToolCall(pb::ToolCall {
                    tool_request_id: request_id.clone(),
                    tool: tool.to_owned(),
                    args_json,
                    deadline_at_ms,
                }),
            );
            (rx, timeout, request_id, operation_id)
        };
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(pb::Error::new(ErrorCode::SessionEnded, "the session ended before the tool answered")),
            Err(_) => {
                let mut st = self.lock();
                if let Some(index) = st.pending.iter().position(|p| p.call.tool_request_id == request_id) {
                    st.pending.remove(index);
                    self.emit(
                        &mut st,
                        &operation_id,
                        Kind::ToolCallSettled(pb::ToolCallSettled {
                            tool_request_id: request_id,
                            code: ErrorCode::ToolTimeout.as_str().into(),
                        }),
                    );
                    if st.pending.is_empty() && st.status == SessionStatus::WaitingToolResult {
                        self.set_status(&mut st, SessionStatus::Running, &operation_id);
                    }
                }
                Err(pb::Error::new(
                    ErrorCode::ToolTimeout,
                    format!("{tool} did not answer within {} ms", timeout.as_millis()),
                ))
            }
        }
    }
}

/// An operation recorded but not yet announced.
struct StartingOperation {
    operation_id: String,
    kind: pb::OperationKind,
    turn_kind: pb::TurnKind,
    text: String,
}

fn accepted(operation_id: &str, kind: pb::OperationKind, already_done: bool) -> pb::OperationAccepted {
    pb::OperationAccepted { operation_id: operation_id.to_owned(), kind: kind as i32, already_done }
}

/// The sink a provider writes one operation's output to. Preparation text is
/// collected for the `PEDELEC_PREPARED` check and never reaches chat events.
struct OperationSink {
    session: Arc<Session>,
    operation_id: String,
    kind: pb::TurnKind,
    hidden: Mutex<String>,
}

impl OperationSink {
    fn with_active(&self, f: impl FnOnce(&Session, &mut State)) {
        let mut st = self.session.lock();
        if st.active.as_ref().is_some_and(|a| a.id == self.operation_id) {
            f(&self.session, &mut st);
        }
    }
}

impl TurnSink for OperationSink {
    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.session.flow())
    }

    fn delta(&self, text: &str) {
        if self.kind == pb::TurnKind::Prepare {
            return;
        }
        self.with_active(|s, st| {
            s.emit(st, &self.operation_id, Kind::ChatDelta(pb::ChatDelta { text: text.to_owned() }))
        });
    }

    fn message(&self, text: &str) {
        if self.kind == pb::TurnKind::Prepare {
            self.hidden.lock().unwrap_or_else(|p| p.into_inner()).push_str(text);
            return;
        }
        self.with_active(|s, st| {
            s.append(st, "chat", serde_json::json!({ "operation_id": self.operation_id, "text": text }));
            s.emit(st, &self.operation_id, Kind::Chat(pb::Chat { text: text.to_owned() }));
        });
    }

    fn usage(&self, total_tokens: u64) {
        self.with_active(|s, st| {
            // Monotonic: a lower or equal total is not news.
            if st.usage.is_none_or(|known| total_tokens > known) {
                st.usage = Some(total_tokens);
                let usage = Some(pb::Usage { total_tokens: Some(total_tokens) });
                s.emit(st, &self.operation_id, Kind::UsageUpdated(pb::UsageUpdated { usage }));
            }
        });
    }

    fn provider_session(&self, id: &str) {
        self.with_active(|_, st| {
            if st.provider_session_id.as_deref() != Some(id) {
                st.provider_session_id = Some(id.to_owned());
            }
        });
    }

    fn activity(&self, kind: &str, summary: &str) {
        self.with_active(|s, st| {
            s.append(
                st,
                "agent_activity",
                serde_json::json!({ "operation_id": self.operation_id, "kind": kind, "summary": summary }),
            );
        });
    }

    fn tool_failed(&self, tool: &str, reason: &str) {
        let reason: String = reason.chars().take(500).collect();
        self.with_active(|s, st| {
            let details = serde_json::json!({ "tool": tool, "reason": reason });
            s.append(
                st,
                "tool_failed",
                serde_json::json!({ "operation_id": self.operation_id, "tool": tool, "reason": reason }),
            );
            let error = pb::Error::with_details(
                ErrorCode::ToolCallFailed,
                format!("the agent could not call {tool}: {reason}"),
                &details,
            );
            s.emit(st, &self.operation_id, Kind::Error(pb::ErrorRaised { error: Some(error) }));
        });
    }

    fn call_tool<'a>(&'a self, tool: &'a str, args_json: String) -> BoxFuture<'a, Result<String, pb::Error>> {
        Box::pin(self.session.call_tool(&self.operation_id, tool, args_json))
    }
}
