//! What a transport provides: request/response calls, event subscriptions and
//! a way to run background work. The request vocabulary is the native
//! envelope's `Call`/`Result`, so every transport speaks the same messages.
//!
//! # Examples
//!
//! ```
//! use pedelec_client::PedelecError;
//! use pedelec_client::transport::{Call, Reply, Transport, unexpected};
//! use pedelec_protocol::pb;
//!
//! /// Core's version, over whichever transport the program has.
//! async fn core_version(transport: &dyn Transport) -> Result<String, PedelecError> {
//!     match transport.call(Call::Ping(pb::PingRequest {})).await? {
//!         Reply::Ping(pong) => Ok(pong.version),
//!         other => Err(unexpected(&other)),
//!     }
//! }
//! ```

use std::pin::Pin;

use futures::Stream;
use pedelec_protocol::pb;

use crate::error::PedelecError;

/// A boxed, `Send` future: what [`Transport`]'s methods return, so the trait
/// stays object-safe (`dyn Transport`).
///
/// # Examples
///
/// ```
/// use pedelec_client::transport::BoxFuture;
///
/// let answer: BoxFuture<'static, u32> = Box::pin(async { 6 * 7 });
/// assert_eq!(futures::executor::block_on(answer), 42);
/// ```
pub use futures::future::BoxFuture;

/// A session's events as [`Transport::subscribe`] yields them; an `Err` item
/// reports a broken subscription.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use pedelec_client::PedelecError;
/// use pedelec_client::transport::EventStream;
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let events: EventStream = Box::pin(futures::stream::iter([
///     Ok(pb::SessionEvent { session_id: "sess-1".into(), seq: 1, ..Default::default() }),
///     Err(PedelecError::new(ErrorCode::CoreRestarted, "Core restarted")),
/// ]));
/// let items: Vec<_> = futures::executor::block_on(events.collect());
/// assert_eq!(items[0].as_ref().unwrap().seq, 1);
/// assert!(items[1].as_ref().unwrap_err().is(ErrorCode::CoreRestarted));
/// ```
pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, PedelecError>> + Send>>;

/// A request to Core: the native envelope's `NativeRequest.call`, one variant
/// per Core method. Send it with [`Transport::call`], except `Subscribe`
/// ([`Transport::subscribe`]) and `Unsubscribe`, which belong to the
/// native-messaging relay.
///
/// # Examples
///
/// ```
/// use pedelec_client::transport::Call;
/// use pedelec_protocol::pb;
///
/// let call = Call::End(pb::EndRequest { session_id: "sess-1".into(), ..Default::default() });
/// // The same value travels in the native-messaging envelope.
/// let request = pb::NativeRequest { call: Some(call.clone()) };
/// assert_eq!(request.call, Some(call));
/// ```
pub use pb::native_request::Call;
/// Core's answer to a [`Call`]: the native envelope's `NativeResponse.result`,
/// the variant named like the call's.
///
/// # Examples
///
/// ```
/// use pedelec_client::transport::{Reply, unexpected};
/// use pedelec_protocol::pb;
///
/// let reply = Reply::Ping(pb::PingResponse { version: "0.1.0".into(), pid: 4242 });
/// let pid = match reply {
///     Reply::Ping(pong) => pong.pid,
///     other => panic!("{}", unexpected(&other)),
/// };
/// assert_eq!(pid, 4242);
/// ```
pub use pb::native_response::Result as Reply;

/// How the SDK reaches Core: gRPC natively, native messaging or the
/// browser's port. Sessions are built on `Arc<dyn Transport>`, so one
/// implementation serves them all.
///
/// # Examples
///
/// A transport that answers `Ping` itself, runs work on threads and sleeps
/// on a thread, enough for tests that need no Core:
///
/// ```
/// use std::time::Duration;
///
/// use futures::executor::block_on;
/// use pedelec_client::PedelecError;
/// use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply, Transport};
/// use pedelec_protocol::{ErrorCode, pb};
///
/// struct Loopback;
///
/// impl Transport for Loopback {
///     fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
///         Box::pin(async move {
///             match call {
///                 Call::Ping(_) => {
///                     Ok(Reply::Ping(pb::PingResponse { version: "0.1.0".into(), pid: std::process::id() }))
///                 }
///                 _ => Err(PedelecError::new(ErrorCode::InvalidArgument, "Loopback only answers Ping")),
///             }
///         })
///     }
///
///     fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
///         // The snapshot, then no live events.
///         let snapshot = pb::SessionEvent { session_id: request.session_id, ..Default::default() };
///         Box::pin(async move { Ok(Box::pin(futures::stream::iter([Ok(snapshot)])) as EventStream) })
///     }
///
///     fn spawn(&self, task: BoxFuture<'static, ()>) {
///         std::thread::spawn(move || block_on(task));
///     }
///
///     fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
///         let (wake, woken) = futures::channel::oneshot::channel::<()>();
///         std::thread::spawn(move || {
///             std::thread::sleep(duration);
///             let _ = wake.send(());
///         });
///         Box::pin(async move {
///             let _ = woken.await;
///         })
///     }
/// }
///
/// let transport: std::sync::Arc<dyn Transport> = std::sync::Arc::new(Loopback);
/// let reply = block_on(transport.call(Call::Ping(pb::PingRequest {}))).unwrap();
/// assert!(matches!(reply, Reply::Ping(pong) if pong.version == "0.1.0"));
/// let refused = block_on(transport.call(Call::ListSessions(Default::default()))).err().unwrap();
/// assert!(refused.is(ErrorCode::InvalidArgument));
/// ```
pub trait Transport: Send + Sync + 'static {
    /// One request and its response.
    ///
    /// A failed call is the error Core sent (its code and details intact) or
    /// a transport's own (`TRANSPORT_ERROR`, `CORE_RUNTIME_UNAVAILABLE`, …).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use pedelec_client::PedelecError;
    /// use pedelec_client::transport::{Call, Reply, Transport, unexpected};
    /// use pedelec_protocol::pb;
    /// # use pedelec_client::transport::{BoxFuture, EventStream};
    /// # struct Loopback;
    /// # impl Transport for Loopback {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
    /// #         Box::pin(async { Ok(Reply::Ping(pb::PingResponse { version: "0.1.0".into(), pid: 1 })) })
    /// #     }
    /// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         unimplemented!()
    /// #     }
    /// #     fn spawn(&self, _: BoxFuture<'static, ()>) { unimplemented!() }
    /// #     fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> { unimplemented!() }
    /// # }
    ///
    /// async fn core_version(transport: &dyn Transport) -> Result<String, PedelecError> {
    ///     match transport.call(Call::Ping(pb::PingRequest {})).await? {
    ///         Reply::Ping(pong) => Ok(pong.version),
    ///         other => Err(unexpected(&other)),
    ///     }
    /// }
    ///
    /// // `Loopback` is the in-memory transport of the `Transport` example.
    /// assert_eq!(block_on(core_version(&Loopback)).unwrap(), "0.1.0");
    /// ```
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>>;
    /// A session's events: a snapshot first, then live events.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use futures::executor::block_on;
    /// use pedelec_client::transport::Transport;
    /// use pedelec_protocol::pb;
    /// # use pedelec_client::PedelecError;
    /// # use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply};
    /// # struct Loopback;
    /// # impl Transport for Loopback {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
    /// #     fn subscribe(
    /// #         &self,
    /// #         request: pb::SubscribeRequest,
    /// #     ) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         let snapshot = pb::SessionEvent { session_id: request.session_id, ..Default::default() };
    /// #         Box::pin(async move { Ok(Box::pin(futures::stream::iter([Ok(snapshot)])) as EventStream) })
    /// #     }
    /// #     fn spawn(&self, _: BoxFuture<'static, ()>) { unimplemented!() }
    /// #     fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> { unimplemented!() }
    /// # }
    ///
    /// // `Loopback` is the in-memory transport of the `Transport` example.
    /// let transport = Loopback;
    /// let request = pb::SubscribeRequest { session_id: "sess-1".into(), caller_origin: "app:my-tool".into() };
    /// let mut events = block_on(transport.subscribe(request)).unwrap();
    /// let snapshot = block_on(events.next()).unwrap().unwrap();
    /// assert_eq!(snapshot.session_id, "sess-1");
    /// ```
    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>>;
    /// Runs background work (event loops, tool handlers).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::executor::block_on;
    /// use pedelec_client::transport::Transport;
    /// # use pedelec_client::PedelecError;
    /// # use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply};
    /// # use pedelec_protocol::pb;
    /// # struct Loopback;
    /// # impl Transport for Loopback {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
    /// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         unimplemented!()
    /// #     }
    /// #     fn spawn(&self, task: BoxFuture<'static, ()>) { std::thread::spawn(move || block_on(task)); }
    /// #     fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> { unimplemented!() }
    /// # }
    ///
    /// // `Loopback` is the in-memory transport of the `Transport` example.
    /// let transport = Loopback;
    /// let (done, result) = futures::channel::oneshot::channel();
    /// transport.spawn(Box::pin(async move {
    ///     let _ = done.send(6 * 7);
    /// }));
    /// assert_eq!(block_on(result), Ok(42));
    /// ```
    fn spawn(&self, task: BoxFuture<'static, ()>);
    /// Resolves after `duration` on the transport's own clock (tokio
    /// natively, `setTimeout` in the browser): retries back off with it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    ///
    /// use futures::executor::block_on;
    /// use pedelec_client::transport::Transport;
    /// # use pedelec_client::PedelecError;
    /// # use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply};
    /// # use pedelec_protocol::pb;
    /// # struct Loopback;
    /// # impl Transport for Loopback {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
    /// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         unimplemented!()
    /// #     }
    /// #     fn spawn(&self, _: BoxFuture<'static, ()>) { unimplemented!() }
    /// #     fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
    /// #         Box::pin(async move { std::thread::sleep(duration) })
    /// #     }
    /// # }
    ///
    /// // `Loopback` is the in-memory transport of the `Transport` example.
    /// let transport = Loopback;
    /// let started = Instant::now();
    /// block_on(transport.sleep(Duration::from_millis(20)));
    /// assert!(started.elapsed() >= Duration::from_millis(20));
    /// ```
    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()>;
}

/// [`Transport::sleep`] through a trait object.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
///
/// use pedelec_client::transport::{Transport, sleep};
/// # use pedelec_client::PedelecError;
/// # use pedelec_client::transport::{BoxFuture, Call, EventStream, Reply};
/// # use pedelec_protocol::pb;
/// # struct Loopback;
/// # impl Transport for Loopback {
/// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
/// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
/// #         unimplemented!()
/// #     }
/// #     fn spawn(&self, _: BoxFuture<'static, ()>) { unimplemented!() }
/// #     fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
/// #         Box::pin(async move { std::thread::sleep(duration) })
/// #     }
/// # }
///
/// // `Loopback` is the in-memory transport of the `Transport` example.
/// let transport: Arc<dyn Transport> = Arc::new(Loopback);
/// let started = Instant::now();
/// futures::executor::block_on(sleep(&*transport, Duration::from_millis(20)));
/// assert!(started.elapsed() >= Duration::from_millis(20));
/// ```
pub fn sleep(transport: &dyn Transport, duration: std::time::Duration) -> BoxFuture<'static, ()> {
    transport.sleep(duration)
}

/// A reply of the wrong kind for its call.
///
/// The error is `TRANSPORT_ERROR`, its message naming the reply.
///
/// # Examples
///
/// ```
/// use pedelec_client::transport::{Reply, unexpected};
/// use pedelec_protocol::{ErrorCode, pb};
///
/// // Say a `Ping` call was answered with an `End` reply.
/// let error = unexpected(&Reply::End(pb::EndResponse { ended_now: true }));
/// assert_eq!(error.error_code(), Some(ErrorCode::TransportError));
/// assert!(error.message.starts_with("unexpected reply End("));
/// ```
pub fn unexpected(reply: &Reply) -> PedelecError {
    PedelecError::new(pedelec_protocol::ErrorCode::TransportError, format!("unexpected reply {reply:?}"))
}
