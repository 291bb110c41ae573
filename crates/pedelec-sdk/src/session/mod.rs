//! `PedelecSession<T>`: the application's handle on one Core session. It
//! feeds the [`SessionMachine`] and carries out its effects: handlers,
//! promise settlement, tool submission. All I/O goes through the transport.
//!
//! The handle's state — the machine, the handlers, the effects queue, where
//! each waiting caller's answer goes — is one [`State`] behind one mutex
//! ([`SessionShell::lock`]), held only for short steps and never while a
//! handler or a transport call runs. Its modules: [`handle`] (the public
//! calls), [`handlers`] (registration), [`dispatch`] (the effects queue),
//! [`subscription`] (following Core's events), [`operations`] (starting
//! `send_text`/`prepare` and awaiting them), [`answers`] (tool results and
//! permission choices sent back to Core), [`assets`] and [`history`].
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

mod answers;
mod assets;
mod dispatch;
mod handle;
mod handlers;
mod history;
mod operations;
mod subscription;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use futures::channel::oneshot;
use futures::future::{AbortHandle, Shared};
use pedelec_protocol::OperationId;

use crate::error::PedelecError;
use crate::machine::{SessionMachine, WaiterId};
use crate::transport::{BoxFuture, Transport};

#[cfg(all(feature = "web", target_arch = "wasm32"))]
pub(crate) use assets::{asset_json, asset_text};
pub use handle::{PedelecSession, PedelecSessionUsage, SendOptions};
pub use handlers::{Disposer, PermissionFn};
pub use pedelec_protocol::history::HistoryQuery;

use dispatch::Dispatch;
use handlers::Handlers;

/// A `prepare()` or `resume()` under way, which concurrent calls join.
type SharedOutcome = Shared<BoxFuture<'static, Result<(), PedelecError>>>;

/// The client's sessions by id, so it hands out one handle per session. It
/// has its own lock (it spans every session of the client), never taken
/// while a session's [`State`] is locked.
pub(crate) type Registry = Arc<Mutex<HashMap<String, Weak<SessionShell>>>>;

/// One session handle's shell: what never changes, and its [`State`].
pub(crate) struct SessionShell {
    pub(crate) session_id: String,
    origin: String,
    transport: Arc<dyn Transport>,
    registry: Registry,
    state: Mutex<State>,
}

/// Everything of a handle that changes, behind the one lock.
struct State {
    machine: SessionMachine,
    handlers: Handlers,
    /// Effects waiting to run, in the order the machine produced them.
    dispatch: Dispatch,
    /// Where each awaited operation's outcome goes (`HandleEffect::Settle`).
    operations: HashMap<OperationId, oneshot::Sender<Result<(), PedelecError>>>,
    /// Where each waiting caller's wake-up goes (`HandleEffect::Wake`).
    waiters: HashMap<WaiterId, oneshot::Sender<()>>,
    prepare: Option<SharedOutcome>,
    resume: Option<SharedOutcome>,
    /// Counts subscriptions: events of a replaced one are not fed.
    generation: u64,
    /// The task following the current subscription.
    event_loop: Option<AbortHandle>,
}

impl SessionShell {
    fn new(
        transport: Arc<dyn Transport>,
        registry: Registry,
        origin: String,
        machine: SessionMachine,
        handlers: Handlers,
    ) -> Self {
        SessionShell {
            session_id: machine.meta().session_id.clone(),
            origin,
            transport,
            registry,
            state: Mutex::new(State {
                machine,
                handlers,
                dispatch: Dispatch::default(),
                operations: HashMap::new(),
                waiters: HashMap::new(),
                prepare: None,
                resume: None,
                generation: 0,
                event_loop: None,
            }),
        }
    }

    /// The handle's state. Handlers run with the lock released, so a
    /// panicking handler never poisons it; were a step to panic, later
    /// calls take the state as that step left it rather than all failing.
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Registers a caller the machine wakes with `HandleEffect::Wake`;
    /// `None` when `f` finds nothing to wait for.
    fn wait(&self, f: impl FnOnce(&mut SessionMachine) -> Option<WaiterId>) -> Option<oneshot::Receiver<()>> {
        let mut state = self.lock();
        let waiter = f(&mut state.machine)?;
        let (tx, rx) = oneshot::channel();
        state.waiters.insert(waiter, tx);
        Some(rx)
    }

    /// Adds this handle to the client's sessions.
    fn register_in_client(self: &Arc<Self>) {
        lock(&self.registry).insert(self.session_id.clone(), Arc::downgrade(self));
    }

    /// Removes this handle from the client's sessions.
    fn leave_client(&self) {
        lock(&self.registry).remove(&self.session_id);
    }
}

impl Drop for SessionShell {
    fn drop(&mut self) {
        // The last handle is gone: stop listening so Core sees the subscriber leave.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = state.event_loop.take() {
            handle.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
