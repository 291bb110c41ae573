//! Following Core's events: one subscription at a time, its first snapshot
//! adopted before `attach` returns, the rest fed to the machine in the
//! background until the subscription ends, which detaches the handle.

use std::sync::Arc;

use futures::StreamExt;
use pedelec_protocol::{ErrorCode, SessionStatus, pb};

use super::{SessionShell, State};
use crate::context::now_ms;
use crate::error::PedelecError;

impl SessionShell {
    /// Subscribes, adopts the first snapshot, then follows live events in
    /// the background; a previous subscription's task stops.
    pub(super) async fn attach(self: &Arc<Self>) -> Result<(), PedelecError> {
        let request = pb::SubscribeRequest { session_id: self.session_id.clone(), caller_origin: self.origin.clone() };
        let mut stream = self.transport.subscribe(request).await?;
        let generation = {
            let mut state = self.lock();
            state.generation += 1;
            state.generation
        };
        match stream.next().await {
            Some(Ok(first)) => {
                self.feed(generation, &first);
            }
            Some(Err(error)) => return Err(error),
            None => {
                return Err(PedelecError::new(
                    ErrorCode::TransportError,
                    "the subscription closed before its snapshot",
                ));
            }
        }
        let weak = Arc::downgrade(self);
        let (abort, registration) = futures::future::AbortHandle::new_pair();
        let previous = {
            let mut state = self.lock();
            state.machine.attached();
            state.event_loop.replace(abort)
        };
        if let Some(previous) = previous {
            previous.abort();
        }
        let event_loop = futures::future::Abortable::new(
            async move {
                while let Some(item) = stream.next().await {
                    let Some(shell) = weak.upgrade() else { return };
                    match item {
                        Ok(event) => {
                            if !shell.feed(generation, &event) {
                                return;
                            }
                        }
                        _ if !shell.is_current(generation) => return,
                        // The transport knows the session was ended where
                        // this stream cannot carry it (the origin revoked).
                        Err(error) if error.code == ErrorCode::SessionEnded.as_str() => {
                            shell.step(|state| state.machine.ended_elsewhere());
                            shell.leave_client();
                            return;
                        }
                        Err(error) => {
                            tracing::debug!(%error, "subscription failed");
                            break;
                        }
                    }
                }
                if let Some(shell) = weak.upgrade()
                    && shell.is_current(generation)
                {
                    shell.detach();
                }
            },
            registration,
        );
        self.transport.spawn(Box::pin(async move {
            let _ = event_loop.await;
        }));
        Ok(())
    }

    /// Whether subscription `generation` is the handle's current one.
    fn is_current(&self, generation: u64) -> bool {
        self.lock().generation == generation
    }

    /// The transport is gone: what was in flight settles, waiters wake.
    fn detach(self: &Arc<Self>) {
        self.step(|state| {
            let machine = &mut state.machine;
            let mut effects = machine.detached();
            // An ended session whose transport closes (Core stopping cleanly,
            // the app going away) lost nothing: that is not an error.
            if machine.status() != SessionStatus::Ended {
                let lost = PedelecError::new(ErrorCode::TransportDetached, "the connection to Core was lost");
                effects.push(machine.sdk_error(lost));
            }
            effects
        });
    }

    /// Feeds one event of subscription `generation`; `false`, feeding
    /// nothing, when a newer subscription replaced it.
    fn feed(self: &Arc<Self>, generation: u64, event: &pb::SessionEvent) -> bool {
        {
            let mut state = self.lock();
            if state.generation != generation {
                return false;
            }
            let State { machine, handlers, dispatch, .. } = &mut *state;
            let effects = machine.on_event(event, now_ms(), &|tool| handlers.has_tool(tool));
            dispatch.enqueue(effects);
        }
        self.drain();
        true
    }
}
