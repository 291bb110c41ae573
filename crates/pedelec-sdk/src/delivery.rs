//! What a transport that relays frames (the native host's, the browser
//! port's) does with a batch of events, written once.

use pedelec_protocol::native::FrameError;
use pedelec_protocol::pb;

use crate::error::PedelecError;

/// A batch's events, or the error its subscription ends with: a batch that
/// could not be decoded lost events, so the subscription cannot go on as if
/// not.
pub(crate) fn decoded_batch(
    events: Result<Vec<pb::SessionEvent>, FrameError>,
) -> Result<Vec<pb::SessionEvent>, PedelecError> {
    events.map_err(|error| {
        tracing::warn!(%error, "a batch of events could not be decoded");
        PedelecError::new(error.code(), error.to_string())
    })
}
