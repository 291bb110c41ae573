//! Handler registration: the `on_*` calls of [`PedelecSession`], the
//! [`Disposer`] each returns, and which handler answers which tool.

use std::collections::HashMap;
use std::sync::Arc;

use pedelec_protocol::{SessionStatus, pb};
use serde::{Serialize, de::DeserializeOwned};

use super::{PedelecSession, State};
use crate::context::{EventContext, StatusContext, ToolCallContext};
use crate::error::PedelecError;
use crate::machine::HandleEffect;
use crate::tool::{GenericToolHandlerFn, ToolHandlerFn, ToolName, handler, sync_handler};
use crate::transport::BoxFuture;

pub(super) type ChatFn = Arc<dyn Fn(&str, &EventContext) + Send + Sync>;
pub(super) type StatusFn = Arc<dyn Fn(SessionStatus, &StatusContext) + Send + Sync>;
pub(super) type ErrorFn = Arc<dyn Fn(&PedelecError, &EventContext) + Send + Sync>;
pub(super) type EndedFn = Arc<dyn Fn(&EventContext) + Send + Sync>;
pub(super) type UsageFn = Arc<dyn Fn(u64) + Send + Sync>;
pub(super) type ActivityFn = Arc<dyn Fn(&pb::Activity, &EventContext) + Send + Sync>;
/// A permission handler: the chosen option id, or `None` to reject.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pedelec_sdk::context::{EventKind, SessionMeta};
/// use pedelec_sdk::pb::{PermissionOption, PermissionRequest};
/// use pedelec_sdk::session::PermissionFn;
///
/// // What `on_permission` makes of a closure: here, always the first option.
/// let first: PermissionFn =
///     Arc::new(|request, _ctx| Box::pin(async move { request.options.first().map(|o| o.option_id.clone()) }));
/// let request = PermissionRequest {
///     options: vec![PermissionOption { option_id: "allow".into(), ..Default::default() }],
///     ..Default::default()
/// };
/// let ctx = SessionMeta::default().core(EventKind::PermissionRequested, None, 0, None);
/// assert_eq!(futures::executor::block_on(first(request, ctx)), Some("allow".to_string()));
/// ```
pub type PermissionFn =
    Arc<dyn Fn(pb::PermissionRequest, EventContext) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// Returned by every `on_*`: call [`Disposer::dispose`] to unregister.
/// Dropping it keeps the handler registered; disposing never cancels running work.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::{Pedelec, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let off = session.on_chat_delta(|delta, _ctx| print!("{delta}"));
/// session.send_text("Stream this answer.").await?;
/// // Later turns run without the handler.
/// off.dispose();
/// session.send_text("Not streamed.").await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "keep the disposer to unregister the handler later"]
pub struct Disposer(Option<Box<dyn FnOnce() + Send>>);

impl Disposer {
    /// Unregisters the handler; a call it is running finishes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let off = session.on_status(|status, ctx| println!("{} → {status}", ctx.previous_status));
    /// session.send_text("Hello").await?;
    /// off.dispose();
    /// # Ok(())
    /// # }
    /// ```
    pub fn dispose(mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// The handlers of one handle, each kind newest last, with the id its
/// [`Disposer`] removes it by.
#[derive(Default)]
pub(super) struct Handlers {
    next: u64,
    pub(super) chat: Vec<(u64, ChatFn)>,
    pub(super) delta: Vec<(u64, ChatFn)>,
    pub(super) status: Vec<(u64, StatusFn)>,
    pub(super) error: Vec<(u64, ErrorFn)>,
    pub(super) ended: Vec<(u64, EndedFn)>,
    pub(super) usage: Vec<(u64, UsageFn)>,
    pub(super) activity: Vec<(u64, ActivityFn)>,
    pub(super) permission: Vec<(u64, PermissionFn)>,
    pub(super) named: Vec<(u64, String, ToolHandlerFn)>,
    pub(super) inline: HashMap<String, ToolHandlerFn>,
    pub(super) generic: Vec<(u64, GenericToolHandlerFn<String>)>,
}

impl Handlers {
    /// The handlers a session starts with: its tools' inline ones.
    pub(super) fn with_inline(inline: HashMap<String, ToolHandlerFn>) -> Self {
        Handlers { inline, ..Handlers::default() }
    }

    /// The handlers a fork of the session starts with: those that answer
    /// the agent (tools and permissions; the fork has the same tools), none
    /// of the listeners, which belong to this handle's caller.
    pub(super) fn for_fork(&self) -> Self {
        Handlers {
            next: self.next,
            permission: self.permission.clone(),
            named: self.named.clone(),
            inline: self.inline.clone(),
            generic: self.generic.clone(),
            ..Handlers::default()
        }
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub(super) fn has_tool(&self, tool: &str) -> bool {
        self.named.iter().any(|(_, n, _)| n == tool) || self.inline.contains_key(tool) || !self.generic.is_empty()
    }

    /// Named > inline > generic; the newest registration of a kind wins.
    pub(super) fn tool(&self, tool: &str) -> Option<ToolHandlerFn> {
        if let Some((_, _, h)) = self.named.iter().rev().find(|(_, n, _)| n == tool) {
            return Some(h.clone());
        }
        if let Some(h) = self.inline.get(tool) {
            return Some(h.clone());
        }
        self.generic.last().map(|(_, g)| {
            let g = g.clone();
            let name = tool.to_owned();
            Arc::new(move |args, ctx| g(name.clone(), args, ctx)) as ToolHandlerFn
        })
    }
}

impl<T: ToolName> PedelecSession<T> {
    fn register<F>(&self, add: impl FnOnce(&mut Handlers, u64) -> F, remove: fn(&mut Handlers, u64)) -> Disposer {
        let mut state = self.shell.lock();
        self.register_in(&mut state, add, remove)
    }

    /// Registers a handler with the handle's state already locked.
    fn register_in<F>(
        &self,
        state: &mut State,
        add: impl FnOnce(&mut Handlers, u64) -> F,
        remove: fn(&mut Handlers, u64),
    ) -> Disposer {
        let id = state.handlers.id();
        add(&mut state.handlers, id);
        let weak = Arc::downgrade(&self.shell);
        Disposer(Some(Box::new(move || {
            if let Some(shell) = weak.upgrade() {
                remove(&mut shell.lock().handlers, id);
            }
        })))
    }

    /// The agent's own work — tool calls, commands, file edits, plans,
    /// thinking — each call the whole current state of one activity
    /// (`activity_id` says which; statuses pending → in progress →
    /// completed/failed). A frontend tool call the agent could not make
    /// shows here as failed, with its reason in `output`. A handler
    /// registered mid-turn is first told the turn's activities so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::activity::{kind_name, summary};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_activity(|a, _ctx| println!("{} {}", kind_name(a.kind), summary(a)));
    /// session.send_text("Run the tests.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_activity(&self, f: impl Fn(&pb::Activity, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ActivityFn = Arc::new(f);
        // Registered, and the running turn's activities queued, under one
        // lock: they run before any later update. Handlers that were there
        // already hear them again — the same whole states.
        let disposer = {
            let mut state = self.shell.lock();
            let disposer = self.register_in(
                &mut state,
                move |h, id| h.activity.push((id, f)),
                |h, id| h.activity.retain(|(i, _)| *i != id),
            );
            let so_far: Vec<HandleEffect> = state
                .machine
                .running_activities()
                .iter()
                .map(|(activity, ctx)| HandleEffect::Activity { activity: activity.clone(), ctx: ctx.clone() })
                .collect();
            state.dispatch.enqueue(so_far);
            disposer
        };
        self.shell.drain();
        disposer
    }

    /// Answers the agent's permission requests (sessions created with
    /// `permission_mode: PermissionMode::App`): `f` gets the request — what
    /// it is about as an activity (kind, title, command, paths), the agent's
    /// options — and returns the chosen option id, or `None` to reject. The
    /// newest handler answers. Without a handler the request gets the option
    /// Core's policy would choose (`policy_option_id`); without an answer by
    /// its deadline Core rejects it. The first answer from any handle of the
    /// origin wins. A request only the user may answer
    /// (`PermissionRequest.user_only`: a web page's agent asking to run a
    /// command or to leave its workspace) never reaches `f`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use pedelec_sdk::pb::{PermissionMode, PermissionOptionKind};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let options = SessionOptions { permission_mode: PermissionMode::App, ..Default::default() };
    /// let session = pedelec.create_session::<String>(options).await?;
    /// let _off = session.on_permission(|request, _ctx| async move {
    ///     let once = request.options.iter().find(|o| o.kind == PermissionOptionKind::AllowOnce as i32);
    ///     once.map(|o| o.option_id.clone())
    /// });
    /// session.send_text("Deploy the site.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_permission<F, Fut>(&self, f: F) -> Disposer
    where
        F: Fn(pb::PermissionRequest, EventContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Option<String>> + Send + 'static,
    {
        let f: PermissionFn = Arc::new(move |request, ctx| Box::pin(f(request, ctx)));
        self.register(move |h, id| h.permission.push((id, f)), |h, id| h.permission.retain(|(i, _)| *i != id))
    }

    /// Completed assistant messages.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_chat(|text, ctx| println!("[{}] {text}", ctx.session_id));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_chat(&self, f: impl Fn(&str, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ChatFn = Arc::new(f);
        self.register(move |h, id| h.chat.push((id, f)), |h, id| h.chat.retain(|(i, _)| *i != id))
    }

    /// Best-effort incremental assistant text.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    /// use std::sync::{Arc, Mutex};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let live = Arc::new(Mutex::new(String::new()));
    /// let sink = live.clone();
    /// let _off = session.on_chat_delta(move |delta, _ctx| sink.lock().unwrap().push_str(delta));
    /// session.send_text("Hello").await?;
    /// println!("streamed: {}", live.lock().unwrap());
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_chat_delta(&self, f: impl Fn(&str, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ChatFn = Arc::new(f);
        self.register(move |h, id| h.delta.push((id, f)), |h, id| h.delta.retain(|(i, _)| *i != id))
    }

    /// Status changes (only when the value changes; never the initial value).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_status(|status, ctx| {
    ///     println!("{} → {status} ({})", ctx.previous_status, ctx.source.as_str());
    /// });
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_status(&self, f: impl Fn(SessionStatus, &StatusContext) + Send + Sync + 'static) -> Disposer {
        let f: StatusFn = Arc::new(f);
        self.register(move |h, id| h.status.push((id, f)), |h, id| h.status.retain(|(i, _)| *i != id))
    }

    /// Core and SDK errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_error(|error, ctx| eprintln!("{} ({}): {}", error.code, ctx.kind, error.message));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_error(&self, f: impl Fn(&PedelecError, &EventContext) + Send + Sync + 'static) -> Disposer {
        let f: ErrorFn = Arc::new(f);
        self.register(move |h, id| h.error.push((id, f)), |h, id| h.error.retain(|(i, _)| *i != id))
    }

    /// Each transition into ended.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_ended(|ctx| println!("session {} ended ({})", ctx.session_id, ctx.kind));
    /// session.end().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_ended(&self, f: impl Fn(&EventContext) + Send + Sync + 'static) -> Disposer {
        let f: EndedFn = Arc::new(f);
        self.register(move |h, id| h.ended.push((id, f)), |h, id| h.ended.retain(|(i, _)| *i != id))
    }

    /// Usage growth (never runs chat, status or error handlers).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
    /// let _off = session.on_usage(|total| println!("{total} tokens"));
    /// session.send_text("Hello").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_usage(&self, f: impl Fn(u64) + Send + Sync + 'static) -> Disposer {
        let f: UsageFn = Arc::new(f);
        self.register(move |h, id| h.usage.push((id, f)), |h, id| h.usage.retain(|(i, _)| *i != id))
    }

    /// Named async handler for one tool (overrides an inline handler).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// #[derive(serde::Deserialize)]
    /// struct Delta {
    ///     delta: i64,
    /// }
    ///
    /// let _off = session.on_tool("update_counter".to_string(), |args: Delta, _ctx| async move {
    ///     Ok::<_, String>(serde_json::json!({ "value": 41 + args.delta }))
    /// });
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool<A, R, E, F, Fut>(&self, tool: T, f: F) -> Disposer
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        E: std::fmt::Display + 'static,
        F: Fn(A, ToolCallContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<R, E>> + Send + 'static,
    {
        self.on_tool_fn(tool, handler(f))
    }

    /// Named synchronous handler for one tool.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// let _off = session.on_tool_sync("update_counter".to_string(), |args: serde_json::Value, ctx| {
    ///     println!("call {} asks for {args}", ctx.tool_request_id);
    ///     Ok::<_, String>(serde_json::json!({ "value": 1 }))
    /// });
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool_sync<A, R, E, F>(&self, tool: T, f: F) -> Disposer
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: Fn(A, ToolCallContext) -> Result<R, E> + Send + Sync + 'static,
    {
        self.on_tool_fn(tool, sync_handler(f))
    }

    /// Named handler from an erased function.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    /// use pedelec_sdk::sync_handler;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// // A handler built once and registered for several sessions.
    /// let counter = sync_handler(|_: serde_json::Value, _ctx| Ok::<_, String>(serde_json::json!({ "value": 1 })));
    /// let _off = session.on_tool_fn("update_counter".to_string(), counter);
    /// session.send_text("Add 1 to the counter.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_tool_fn(&self, tool: T, f: ToolHandlerFn) -> Disposer {
        let name = tool.as_str().to_owned();
        let disposer =
            self.register(move |h, id| h.named.push((id, name, f)), |h, id| h.named.retain(|(i, _, _)| *i != id));
        self.release_queued();
        disposer
    }

    /// Generic fallback for every tool without a named or inline handler.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}));
    /// let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
    /// let _off = session.on_any_tool(|tool: String, args, _ctx| async move {
    ///     Err::<serde_json::Value, _>(format!("{tool} is not available here (got {args})"))
    /// });
    /// session.send_text("Use any tool you like.").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_any_tool<F, Fut>(&self, f: F) -> Disposer
    where
        F: Fn(T, serde_json::Value, ToolCallContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<serde_json::Value, String>> + Send + 'static,
    {
        let f = Arc::new(f);
        let g: GenericToolHandlerFn<String> = Arc::new(move |name: String, args, ctx| {
            let f = f.clone();
            Box::pin(async move {
                let name =
                    T::from_name(&name).ok_or_else(|| format!("tool {name:?} is not one of this session's tools"))?;
                f(name, args, ctx).await
            })
        });
        let disposer = self.register(move |h, id| h.generic.push((id, g)), |h, id| h.generic.retain(|(i, _)| *i != id));
        self.release_queued();
        disposer
    }

    /// Hands the tool calls that waited for a handler to the ones there are now.
    fn release_queued(&self) {
        self.shell.step(|State { machine, handlers, .. }| machine.handler_registered(&|tool| handlers.has_tool(tool)));
    }
}
