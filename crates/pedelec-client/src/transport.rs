//! What a transport provides: request/response calls, event subscriptions and
//! a way to run background work. The request vocabulary is the native
//! envelope's `Call`/`Result`, so every transport speaks the same messages.

use std::future::Future;
use std::pin::Pin;

use futures::Stream;
use pedelec_protocol::pb;

use crate::error::PedelecError;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, PedelecError>> + Send>>;

pub use pb::native_request::Call;
pub use pb::native_response::Result as Reply;

pub trait Transport: Send + Sync + 'static {
    /// One request and its response.
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>>;
    /// A session's events: a snapshot first, then live events.
    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>>;
    /// Runs background work (event loops, tool handlers).
    fn spawn(&self, task: BoxFuture<'static, ()>);
    /// Resolves after `duration` on the transport's own clock (tokio
    /// natively, `setTimeout` in the browser): retries back off with it.
    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()>;
}

/// [`Transport::sleep`] through a trait object.
pub fn sleep(transport: &dyn Transport, duration: std::time::Duration) -> BoxFuture<'static, ()> {
    transport.sleep(duration)
}

/// A reply of the wrong kind for its call.
pub fn unexpected(reply: &Reply) -> PedelecError {
    PedelecError::new(pedelec_protocol::ErrorCode::TransportError, format!("unexpected reply {reply:?}"))
}
