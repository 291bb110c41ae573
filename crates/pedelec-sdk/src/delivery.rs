//! What a transport that relays frames (the native host's, the browser
//! port's) does with a batch of events, written once.

use pedelec_protocol::native::NativeFrameError;
use pedelec_protocol::pb;

use crate::error::PedelecError;

/// A batch's events, or the error its subscription ends with: a batch that
/// could not be decoded lost events, so the subscription cannot go on as if
/// not.
pub(crate) fn decoded_batch(
    events: Result<Vec<pb::SessionEvent>, NativeFrameError>,
) -> Result<Vec<pb::SessionEvent>, PedelecError> {
    events.map_err(|error| {
        tracing::warn!(%error, "a batch of events could not be decoded");
        PedelecError::new(error.code(), error.to_string())
    })
}

/// A request waiting for its answer. `ack` is the reply an acknowledgement
/// (`NativeFrame.acks`) stands for, when the request was sent with
/// `defer_ack`: the host then answers its success that way instead of with
/// a response frame.
pub(crate) struct Waiting {
    tx: futures::channel::oneshot::Sender<Result<crate::transport::Reply, PedelecError>>,
    ack: Option<crate::transport::Reply>,
}

/// A request's frame and what waits for its answer, as both relaying
/// transports send one: a request whose success carries nothing (a tool
/// result) asks for `defer_ack`, so that success can ride on the host's next
/// frame instead of a message of its own.
pub(crate) fn request_frame(
    request_id: u32,
    call: crate::transport::Call,
    tx: futures::channel::oneshot::Sender<Result<crate::transport::Reply, PedelecError>>,
) -> (pb::NativeFrame, Waiting) {
    let ack = pedelec_protocol::native::acknowledged_reply(&call);
    let defer_ack = ack.is_some();
    let body = Some(pb::native_frame::Body::Request(pb::NativeRequest { call: Some(call) }));
    (pb::NativeFrame { request_id, body, defer_ack, ..Default::default() }, Waiting { tx, ack })
}

impl Waiting {
    pub(crate) fn new(
        tx: futures::channel::oneshot::Sender<Result<crate::transport::Reply, PedelecError>>,
        ack: Option<crate::transport::Reply>,
    ) -> Self {
        Waiting { tx, ack }
    }

    pub(crate) fn answer(self, result: Result<crate::transport::Reply, PedelecError>) {
        let _ = self.tx.send(result);
    }

    /// Settled by an acknowledgement. One for a request that did not ask
    /// for it is the host's mistake; it still settles, as an error, so
    /// nothing waits for a response that will not come.
    pub(crate) fn acknowledged(self) {
        let result = self.ack.ok_or_else(|| {
            PedelecError::new(
                pedelec_protocol::ErrorCode::TransportError,
                "the native host acknowledged a request that needs a response",
            )
        });
        let _ = self.tx.send(result);
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::oneshot;
    use pedelec_protocol::native::acknowledged_reply;
    use pedelec_protocol::{ErrorCode, pb};

    use super::Waiting;
    use crate::transport::{Call, Reply};

    #[test]
    fn an_acknowledgement_settles_with_the_reply_it_stands_for_and_never_leaves_a_request_waiting() {
        let submit = Call::SubmitToolResult(pb::SubmitToolResultRequest::default());
        let (tx, mut rx) = oneshot::channel();
        Waiting::new(tx, acknowledged_reply(&submit)).acknowledged();
        let settled = rx.try_recv().unwrap().expect("settled");
        assert_eq!(settled.unwrap(), Reply::SubmitToolResult(pb::SubmitToolResultResponse {}));
        // A request that needs its response, acknowledged by a host that
        // got it wrong: settled all the same, as a transport error.
        let (tx, mut rx) = oneshot::channel();
        Waiting::new(tx, acknowledged_reply(&Call::Ping(pb::PingRequest {}))).acknowledged();
        let settled = rx.try_recv().unwrap().expect("settled");
        assert_eq!(settled.unwrap_err().code, ErrorCode::TransportError.as_str());
    }
}
