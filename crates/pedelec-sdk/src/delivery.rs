//! Handing a subscription's events to its stream, the same way for every
//! transport that relays frames (the native host's, the browser port's).

use futures::channel::mpsc;
use pedelec_protocol::native::FrameError;
use pedelec_protocol::pb;

use crate::error::PedelecError;

/// Where a subscription's events go.
pub(crate) type EventSender = mpsc::UnboundedSender<Result<pb::SessionEvent, PedelecError>>;

/// Delivers a decoded batch to its subscription. A batch that could not be
/// decoded lost events, so the subscription cannot go on as if not: it gets
/// the error and `false` says to forget it.
pub(crate) fn deliver_batch(to: &EventSender, events: Result<Vec<pb::SessionEvent>, FrameError>) -> bool {
    match events {
        Ok(events) => {
            events.into_iter().for_each(|event| drop(to.unbounded_send(Ok(event))));
            true
        }
        Err(error) => {
            tracing::warn!(%error, "a batch of events could not be decoded");
            let _ = to.unbounded_send(Err(PedelecError::new(error.code(), error.to_string())));
            false
        }
    }
}
