//! The effects queue: every step of the machine queues its effects under the
//! handle's lock, and one task at a time runs them, in order, outside it.
//!
//! Wake-ups (`HandleEffect::Wake`) skip the queue: the caller woken (a
//! `cancel()` whose start was answered, or whose seq was handled) needs only
//! the machine's state, which its step already changed, so it must not wait
//! for another task's slow handlers. The task that made the step wakes it
//! once its own turn at the queue is over.

use std::sync::Arc;

use futures::channel::oneshot;

use super::handlers::{ActivityFn, ChatFn, EndedFn, ErrorFn, StatusFn, UsageFn};
use super::{SessionShell, State};
use crate::machine::{HandleEffect, WaiterId};

/// One entry of a session's effects queue.
// Nearly every entry is an effect; boxing them to shrink the rare marker
// would allocate once per streamed delta.
#[allow(clippy::large_enum_variant)]
enum Queued {
    Effect(HandleEffect),
    /// Wakes a caller once every effect queued before it has run.
    Flushed(oneshot::Sender<()>),
}

/// The effects queue of one session (see [`SessionShell::drain`]).
#[derive(Default)]
pub(super) struct Dispatch {
    queue: Vec<Queued>,
    /// Whether a task is running queued effects now.
    draining: bool,
    /// Callers to wake once the step's task is done with the queue.
    wakes: Vec<WaiterId>,
}

impl Dispatch {
    /// Queues effects after those queued before.
    pub(super) fn enqueue(&mut self, effects: Vec<HandleEffect>) {
        for effect in effects {
            match effect {
                HandleEffect::Wake { waiter } => self.wakes.push(waiter),
                effect => self.queue.push(Queued::Effect(effect)),
            }
        }
    }

    /// Queues a marker after everything queued so far; its receiver
    /// resolves once those effects have run.
    pub(super) fn flushed_marker(&mut self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.queue.push(Queued::Flushed(tx));
        rx
    }
}

impl SessionShell {
    /// Feeds the machine and runs what it asks for. The effects are queued
    /// under the same lock as the step, so they run in the order the
    /// machine produced them whichever task feeds it.
    pub(super) fn step(self: &Arc<Self>, f: impl FnOnce(&mut State) -> Vec<HandleEffect>) {
        {
            let mut state = self.lock();
            let effects = f(&mut state);
            state.dispatch.enqueue(effects);
        }
        self.drain();
    }

    /// [`SessionShell::step`], and a receiver that resolves once the effects
    /// it produced have run. `drain` returns at once when another task is
    /// draining, so without it an awaited call could resolve before its
    /// handlers ran. Await it outside any handler: a handler's own effects
    /// run only after it returns.
    pub(super) fn step_flushed(
        self: &Arc<Self>,
        f: impl FnOnce(&mut State) -> Vec<HandleEffect>,
    ) -> oneshot::Receiver<()> {
        let flushed = {
            let mut state = self.lock();
            let effects = f(&mut state);
            state.dispatch.enqueue(effects);
            state.dispatch.flushed_marker()
        };
        self.drain();
        flushed
    }

    /// Runs queued effects, one drainer at a time: on a multi-thread runtime
    /// two tasks feeding the machine would otherwise run their handlers
    /// interleaved (an `on_status` for `idle` before the one for `running`).
    /// A handler that feeds the machine itself only queues; the drainer runs
    /// those effects right after it returns.
    pub(super) fn drain(self: &Arc<Self>) {
        self.run_queue();
        self.wake_waiters();
    }

    fn run_queue(self: &Arc<Self>) {
        let mut batch = {
            let mut state = self.lock();
            if state.dispatch.draining || state.dispatch.queue.is_empty() {
                return;
            }
            state.dispatch.draining = true;
            std::mem::take(&mut state.dispatch.queue)
        };
        // A handler that panics must not leave the queue marked as drained
        // by someone: later effects would never run.
        struct Draining<'a>(&'a SessionShell);
        impl Drop for Draining<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.lock().dispatch.draining = false;
                }
            }
        }
        let _draining = Draining(self);
        loop {
            self.run_effects(batch);
            let mut state = self.lock();
            if state.dispatch.queue.is_empty() {
                state.dispatch.draining = false;
                return;
            }
            batch = std::mem::take(&mut state.dispatch.queue);
        }
    }

    /// Wakes the callers the machine's steps named.
    fn wake_waiters(&self) {
        let woken: Vec<oneshot::Sender<()>> = {
            let mut state = self.lock();
            let State { dispatch, waiters, .. } = &mut *state;
            dispatch.wakes.drain(..).filter_map(|waiter| waiters.remove(&waiter)).collect()
        };
        for tx in woken {
            let _ = tx.send(());
        }
    }

    /// Runs effects with the lock released: a handler may call the handle.
    fn run_effects(self: &Arc<Self>, queued: Vec<Queued>) {
        for entry in queued {
            let effect = match entry {
                Queued::Effect(effect) => effect,
                Queued::Flushed(tx) => {
                    let _ = tx.send(());
                    continue;
                }
            };
            match effect {
                HandleEffect::Status { status, ctx } => {
                    let list: Vec<StatusFn> = self.lock().handlers.status.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(status, &ctx));
                }
                HandleEffect::Chat { text, ctx } => {
                    let list: Vec<ChatFn> = self.lock().handlers.chat.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&text, &ctx));
                }
                HandleEffect::ChatDelta { text, ctx } => {
                    let list: Vec<ChatFn> = self.lock().handlers.delta.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&text, &ctx));
                }
                HandleEffect::Error { error, ctx } => {
                    let list: Vec<ErrorFn> = self.lock().handlers.error.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&error, &ctx));
                }
                HandleEffect::Ended { ctx } => {
                    let list: Vec<EndedFn> = self.lock().handlers.ended.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&ctx));
                    self.leave_client();
                }
                HandleEffect::Usage { total_tokens } => {
                    let list: Vec<UsageFn> = self.lock().handlers.usage.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(total_tokens));
                }
                HandleEffect::AskPermission { request, ctx } => self.ask_permission(request, ctx),
                HandleEffect::Activity { activity, ctx } => {
                    let list: Vec<ActivityFn> = self.lock().handlers.activity.iter().map(|(_, f)| f.clone()).collect();
                    list.iter().for_each(|f| f(&activity, &ctx));
                }
                HandleEffect::Settle { operation_id, outcome } => {
                    let waiting = self.lock().operations.remove(&operation_id);
                    if let Some(tx) = waiting {
                        let _ = tx.send(outcome);
                    }
                }
                // Never queued (see `Dispatch::enqueue`).
                HandleEffect::Wake { .. } => {}
                HandleEffect::InvokeTool { request, ctx } => self.invoke_tool(request, ctx),
            }
        }
    }
}
