//! The session's events as a `Stream`, and a turn as a handle that streams
//! that turn's events and resolves with its outcome — the Rust shape of the
//! callbacks (`on_chat`, `on_status`, …), which they are built on.
//!
//! Tool calls and permission requests are not in the stream: they need an
//! answer, so they stay with `on_tool` and `on_permission`.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use futures::StreamExt;
//! use pedelec_sdk::{Pedelec, SessionEvent, SessionOptions};
//!
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! let mut turn = session.send_text_turn("Summarise the workspace.");
//! while let Some(event) = turn.next().await {
//!     if let SessionEvent::ChatDelta { text, .. } = event {
//!         print!("{text}");
//!     }
//! }
//! turn.outcome().await?;
//! # Ok(())
//! # }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::channel::{mpsc, oneshot};
use futures::{FutureExt, Stream, StreamExt};
use pedelec_protocol::{SessionStatus, pb};

use crate::context::{EventContext, StatusContext};
use crate::error::PedelecError;
use crate::session::{Disposer, PedelecSession};
use crate::tool::ToolName;

/// One thing that happened to a session.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::SessionEvent;
///
/// fn describe(event: &SessionEvent) -> String {
///     match event {
///         SessionEvent::Chat { text, .. } => format!("message: {text}"),
///         SessionEvent::Status { status, context } => format!("{} → {status}", context.previous_status),
///         SessionEvent::Usage { total_tokens } => format!("{total_tokens} tokens"),
///         other => format!("{other:?}"),
///     }
/// }
/// assert_eq!(describe(&SessionEvent::Usage { total_tokens: 120 }), "120 tokens");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// A piece of the assistant's text as it streams.
    ChatDelta { text: String, context: EventContext },
    /// A complete assistant message.
    Chat { text: String, context: EventContext },
    /// The session's status changed.
    Status { status: SessionStatus, context: StatusContext },
    /// An agent activity (a command, a plan, a file edit) began or changed.
    Activity { activity: pb::Activity, context: EventContext },
    /// The session's token total grew.
    Usage { total_tokens: u64 },
    /// An error the session reported.
    Error { error: PedelecError, context: EventContext },
    /// The session ended.
    Ended { context: EventContext },
}

/// [`PedelecSession::events`]: a `Stream` of [`SessionEvent`]s. Dropping it
/// unregisters its handlers. Events wait in memory until polled.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use futures::StreamExt;
/// use pedelec_sdk::{Pedelec, SessionEvent, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let mut events = session.events();
/// session.send_text("Hello").await?;
/// session.end().await?;
/// // Everything up to the end was kept for the stream.
/// while let Some(event) = events.next().await {
///     if let SessionEvent::Ended { .. } = event {
///         break;
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct SessionEvents {
    events: mpsc::UnboundedReceiver<SessionEvent>,
    disposers: Vec<Disposer>,
}

impl Stream for SessionEvents {
    type Item = SessionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SessionEvent>> {
        self.events.poll_next_unpin(cx)
    }
}

impl Drop for SessionEvents {
    fn drop(&mut self) {
        for disposer in self.disposers.drain(..) {
            disposer.dispose();
        }
    }
}

/// One turn: a `Stream` of the events from its start to its end, then
/// [`Turn::outcome`] says how it ended.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use futures::StreamExt;
/// use pedelec_sdk::{Pedelec, SessionEvent, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let turn = session.send_text_turn("List the files.");
/// let messages: Vec<String> = turn
///     .filter_map(|event| async move {
///         match event {
///             SessionEvent::Chat { text, .. } => Some(text),
///             _ => None,
///         }
///     })
///     .collect()
///     .await;
/// println!("{} messages", messages.len());
/// # Ok(())
/// # }
/// ```
pub struct Turn {
    events: SessionEvents,
    outcome: oneshot::Receiver<Result<(), PedelecError>>,
    /// The outcome, once it arrived while events were still being read.
    settled: Option<Result<(), PedelecError>>,
}

impl Turn {
    /// How the turn ended (what `send_text` resolves with). Events not read
    /// yet are dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{ErrorCode, Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// // Only the outcome matters here: the events are not read.
    /// match session.send_text_turn("Run the tests.").outcome().await {
    ///     Ok(()) => println!("done"),
    ///     Err(error) if error.is(ErrorCode::OperationCancelled) => println!("cancelled"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn outcome(mut self) -> Result<(), PedelecError> {
        if let Some(settled) = self.settled.take() {
            return settled;
        }
        (&mut self.outcome).await.unwrap_or_else(|_| Err(dropped()))
    }
}

fn dropped() -> PedelecError {
    PedelecError::new(pedelec_protocol::ErrorCode::TransportDetached, "the turn's task was dropped")
}

impl Stream for Turn {
    type Item = SessionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SessionEvent>> {
        if let Poll::Ready(Some(event)) = self.events.poll_next_unpin(cx) {
            return Poll::Ready(Some(event));
        }
        // The SDK hands a turn's events to its handlers before it settles the
        // turn, so once the outcome is in, nothing of this turn is still to come.
        if self.settled.is_none() {
            match self.outcome.poll_unpin(cx) {
                Poll::Ready(outcome) => self.settled = Some(outcome.unwrap_or_else(|_| Err(dropped()))),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(self.events.events.try_recv().ok())
    }
}

impl<T: ToolName> PedelecSession<T> {
    /// This session's events from now on, as a `Stream`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(session: pedelec_sdk::PedelecSession<String>) {
    /// use futures::StreamExt;
    /// use pedelec_sdk::SessionEvent;
    /// let mut events = session.events();
    /// while let Some(event) = events.next().await {
    ///     match event {
    ///         SessionEvent::ChatDelta { text, .. } => print!("{text}"),
    ///         SessionEvent::Ended { .. } => break,
    ///         _ => {}
    ///     }
    /// }
    /// # }
    /// ```
    pub fn events(&self) -> SessionEvents {
        let (tx, events) = mpsc::unbounded();
        let send = move |event: SessionEvent| {
            let _ = tx.unbounded_send(event);
        };
        let (a, b, c, d, e, f, g) =
            (send.clone(), send.clone(), send.clone(), send.clone(), send.clone(), send.clone(), send);
        let disposers = vec![
            self.on_chat_delta(move |text, ctx| a(SessionEvent::ChatDelta { text: text.into(), context: ctx.clone() })),
            self.on_chat(move |text, ctx| b(SessionEvent::Chat { text: text.into(), context: ctx.clone() })),
            self.on_status(move |status, ctx| c(SessionEvent::Status { status, context: ctx.clone() })),
            self.on_activity(move |activity, ctx| {
                d(SessionEvent::Activity { activity: activity.clone(), context: ctx.clone() })
            }),
            self.on_usage(move |total_tokens| e(SessionEvent::Usage { total_tokens })),
            self.on_error(move |error, ctx| f(SessionEvent::Error { error: error.clone(), context: ctx.clone() })),
            self.on_ended(move |ctx| g(SessionEvent::Ended { context: ctx.clone() })),
        ];
        SessionEvents { events, disposers }
    }

    /// Starts a turn like [`PedelecSession::send_text`] and returns it as a
    /// [`Turn`]: a `Stream` of the turn's deltas, messages, status changes
    /// and activities, ending when the turn does; then
    /// [`Turn::outcome`] resolves with what `send_text` would have.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(session: pedelec_sdk::PedelecSession<String>) -> Result<(), pedelec_sdk::PedelecError> {
    /// use futures::StreamExt;
    /// let mut turn = session.send_text_turn("Summarise the workspace");
    /// while let Some(event) = turn.next().await {
    ///     if let pedelec_sdk::SessionEvent::Chat { text, .. } = event {
    ///         println!("{text}");
    ///     }
    /// }
    /// turn.outcome().await
    /// # }
    /// ```
    pub fn send_text_turn(&self, text: impl Into<String>) -> Turn {
        // Listening before the turn starts, so none of its events is missed.
        let events = self.events();
        let (settle, outcome) = oneshot::channel();
        let session = self.clone();
        let text = text.into();
        self.spawn(
            async move {
                let _ = settle.send(session.send_text(text).await);
            }
            .boxed(),
        );
        Turn { events, outcome, settled: None }
    }
}
