//! Starting an operation (`send_text`, `prepare`) and awaiting its
//! settlement, and re-activating an ended session (`resume`).

use std::sync::Arc;

use futures::channel::oneshot;
use pedelec_protocol::{ErrorCode, OperationId, pb};

use super::SessionShell;
use crate::error::PedelecError;
use crate::machine::Accepted;
use crate::transport::{Call, Reply, unexpected};

/// Undoes a local start whose request future was dropped before its answer.
struct StartGuard {
    shell: Arc<SessionShell>,
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
            self.shell.step(|state| state.machine.operation_failed_to_start());
        }
    }
}

impl SessionShell {
    /// Starts an operation and resolves once the machine settles it (its
    /// `OperationCompleted`, a snapshot's outcome, the session ending, the
    /// transport lost), after the handlers of the events before that ran;
    /// with the typed answer of a `SendText` that had an output schema.
    pub(super) async fn run_operation(
        self: &Arc<Self>,
        kind: pb::OperationKind,
        call: Call,
    ) -> Result<Option<String>, PedelecError> {
        let mut refused = None;
        self.step(|state| {
            state.machine.begin_local(kind).unwrap_or_else(|error| {
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
        let starting = StartGuard { shell: self.clone(), armed: true };
        let reply = self.transport.call(call).await;
        starting.disarm();
        let accepted = match reply {
            Ok(Reply::SendText(a) | Reply::Prepare(a)) => a,
            Ok(other) => return Err(self.failed_to_start(unexpected(&other))),
            Err(error) => return Err(self.failed_to_start(error)),
        };
        let receiver = {
            let mut state = self.lock();
            let (accepted_as, effects) = state.machine.operation_accepted(&accepted);
            let receiver = match accepted_as {
                Accepted::Pending => {
                    // In place before the effects are queued, so no drainer
                    // can run this operation's settling before it.
                    let (tx, rx) = oneshot::channel();
                    state.operations.insert(OperationId::new(accepted.operation_id.clone()), tx);
                    state.dispatch.enqueue(effects);
                    Ok(rx)
                }
                Accepted::Settled(outcome) => {
                    // Settled already (its events came first): resolve once
                    // the handlers of those events have run.
                    state.dispatch.enqueue(effects);
                    Err((outcome, state.dispatch.flushed_marker()))
                }
            };
            drop(state);
            self.drain();
            receiver
        };
        match receiver {
            Ok(rx) => {
                rx.await.unwrap_or_else(|_| Err(PedelecError::new(ErrorCode::TransportDetached, "handle dropped")))?
            }
            Err((outcome, flushed)) => {
                let _ = flushed.await;
                outcome?
            }
        }
        Ok(self.lock().machine.take_output(&accepted.operation_id))
    }

    fn failed_to_start(self: &Arc<Self>, error: PedelecError) -> PedelecError {
        self.step(|state| state.machine.operation_failed_to_start());
        error
    }

    /// Reports a failed `end()` to the error handlers, and returns it.
    pub(super) fn fail_end(self: &Arc<Self>, error: PedelecError) -> PedelecError {
        self.step(|state| vec![state.machine.sdk_error(error.clone())]);
        error
    }

    /// `Core.Resume`, then a fresh subscription, whose snapshot is the
    /// authoritative idle.
    pub(super) async fn resume(self: &Arc<Self>) -> Result<(), PedelecError> {
        let request = pb::ResumeRequest { session_id: self.session_id.clone(), caller_origin: self.origin.clone() };
        match self.transport.call(Call::Resume(request)).await? {
            Reply::Resume(_) => {}
            other => return Err(unexpected(&other)),
        }
        self.attach().await?;
        self.register_in_client();
        Ok(())
    }
}
