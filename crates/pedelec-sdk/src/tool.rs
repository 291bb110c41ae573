//! Frontend tools: typed names, definitions with optional inline handlers,
//! and the handler function types (sync or async, typed through serde).
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use pedelec_sdk::{Pedelec, SessionOptions, ToolSpec, sync_handler};
//!
//! #[derive(serde::Deserialize)]
//! struct Delta {
//!     delta: i64,
//! }
//!
//! let counter = ToolSpec::new(
//!     "update_counter".to_string(),
//!     "Adds delta to the page's counter",
//!     serde_json::json!({ "type": "object", "properties": { "delta": { "type": "integer" } } }),
//! )
//! .with_handler(sync_handler(|args: Delta, _ctx| Ok::<_, String>(serde_json::json!({ "value": args.delta }))));
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session(SessionOptions { tools: vec![counter], ..Default::default() }).await?;
//! session.send_text("Add 2 to the counter.").await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use serde::{Serialize, de::DeserializeOwned};

use crate::context::ToolCallContext;
use crate::transport::BoxFuture;

/// A tool name type. `String` accepts any name; an enum of the session's
/// tools makes named handlers accept only those (the seed's `TToolName`).
///
/// # Examples
///
/// ```
/// use pedelec_sdk::ToolName;
///
/// #[derive(Clone, Debug, PartialEq)]
/// enum Tool {
///     UpdateCounter,
///     ReadPage,
/// }
///
/// impl ToolName for Tool {
///     fn as_str(&self) -> &str {
///         match self {
///             Tool::UpdateCounter => "update_counter",
///             Tool::ReadPage => "read_page",
///         }
///     }
///     fn from_name(name: &str) -> Option<Self> {
///         [Tool::UpdateCounter, Tool::ReadPage].into_iter().find(|t| t.as_str() == name)
///     }
/// }
///
/// assert_eq!(Tool::from_name("read_page"), Some(Tool::ReadPage));
/// // A call for a tool the application does not know has no typed name.
/// assert_eq!(Tool::from_name("rm_rf"), None);
/// ```
pub trait ToolName: Clone + Send + Sync + 'static {
    /// The name on the wire (`ToolDefinition.name`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::ToolName;
    ///
    /// assert_eq!(ToolName::as_str(&"update_counter".to_string()), "update_counter");
    /// ```
    fn as_str(&self) -> &str;
    /// The typed name of a wire name, `None` when it is not one of these tools.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::ToolName;
    ///
    /// // `String` names any tool.
    /// assert_eq!(String::from_name("anything"), Some("anything".to_string()));
    /// ```
    fn from_name(name: &str) -> Option<Self>;
}

impl ToolName for String {
    fn as_str(&self) -> &str {
        self
    }
    fn from_name(name: &str) -> Option<Self> {
        Some(name.to_owned())
    }
}

/// What a handler produced: a JSON value or a failure message.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::tool::ToolOutcome;
///
/// let answered: ToolOutcome = Ok(serde_json::json!({ "value": 3 }));
/// // A failure message reaches the agent as a TOOL_HANDLER_ERROR result.
/// let failed: ToolOutcome = Err("the page has no counter".into());
/// assert!(answered.is_ok() && failed.is_err());
/// ```
pub type ToolOutcome = Result<serde_json::Value, String>;

/// A handler for one tool, erased to JSON.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pedelec_sdk::tool::ToolHandlerFn;
///
/// // What `handler` and `sync_handler` build; by hand it takes and gives JSON.
/// let echo: ToolHandlerFn = Arc::new(|args, _ctx| Box::pin(async move { Ok(args) }));
/// # let ctx = pedelec_sdk::ToolCallContext {
/// #     base: pedelec_sdk::context::SessionMeta::default().core(pedelec_sdk::context::EventKind::ToolCall, None, 0, None),
/// #     tool_request_id: "tool-1".into(),
/// #     tool: "add".into(),
/// # };
/// let out = futures::executor::block_on(echo(serde_json::json!([1, 2]), ctx));
/// assert_eq!(out, Ok(serde_json::json!([1, 2])));
/// ```
pub type ToolHandlerFn =
    Arc<dyn Fn(serde_json::Value, ToolCallContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync>;

/// The generic fallback handler, which also receives the tool name.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use pedelec_sdk::tool::GenericToolHandlerFn;
///
/// let any: GenericToolHandlerFn<String> =
///     Arc::new(|name, _args, _ctx| Box::pin(async move { Err(format!("{name} is not implemented")) }));
/// # let ctx = pedelec_sdk::ToolCallContext {
/// #     base: pedelec_sdk::context::SessionMeta::default().core(pedelec_sdk::context::EventKind::ToolCall, None, 0, None),
/// #     tool_request_id: "tool-1".into(),
/// #     tool: "add".into(),
/// # };
/// let out = futures::executor::block_on(any("add".into(), serde_json::json!({}), ctx));
/// assert_eq!(out, Err("add is not implemented".to_string()));
/// ```
pub type GenericToolHandlerFn<T> =
    Arc<dyn Fn(T, serde_json::Value, ToolCallContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync>;

/// Wraps a typed async handler: arguments are deserialised into `A` (a
/// mismatch is a handler failure), the result serialised from `R`.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::handler;
///
/// #[derive(serde::Deserialize)]
/// struct Add {
///     a: i64,
///     b: i64,
/// }
///
/// let add = handler(|args: Add, _ctx| async move { Ok::<_, String>(args.a + args.b) });
/// # let ctx = pedelec_sdk::ToolCallContext {
/// #     base: pedelec_sdk::context::SessionMeta::default().core(pedelec_sdk::context::EventKind::ToolCall, None, 0, None),
/// #     tool_request_id: "tool-1".into(),
/// #     tool: "add".into(),
/// # };
/// let sum = futures::executor::block_on(add(serde_json::json!({ "a": 40, "b": 2 }), ctx.clone()));
/// assert_eq!(sum, Ok(serde_json::json!(42)));
/// // Arguments of the wrong shape fail the call before the handler runs.
/// let wrong = futures::executor::block_on(add(serde_json::json!({ "a": "forty" }), ctx));
/// assert!(wrong.unwrap_err().starts_with("arguments do not fit the handler"));
/// ```
pub fn handler<A, R, E, F, Fut>(f: F) -> ToolHandlerFn
where
    A: DeserializeOwned + Send + 'static,
    R: Serialize + 'static,
    E: std::fmt::Display + 'static,
    F: Fn(A, ToolCallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |args, ctx| {
        let parsed = serde_json::from_value::<A>(args);
        let f = f.clone();
        Box::pin(async move {
            let args = parsed.map_err(|e| format!("arguments do not fit the handler: {e}"))?;
            let result = f(args, ctx).await.map_err(|e| e.to_string())?;
            serde_json::to_value(result).map_err(|e| format!("result is not JSON-compatible: {e}"))
        })
    })
}

/// Wraps a typed synchronous handler.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::sync_handler;
///
/// let shout = sync_handler(|text: String, _ctx| {
///     if text.is_empty() { Err("nothing to shout") } else { Ok(text.to_uppercase()) }
/// });
/// # let ctx = pedelec_sdk::ToolCallContext {
/// #     base: pedelec_sdk::context::SessionMeta::default().core(pedelec_sdk::context::EventKind::ToolCall, None, 0, None),
/// #     tool_request_id: "tool-1".into(),
/// #     tool: "add".into(),
/// # };
/// assert_eq!(futures::executor::block_on(shout("hi".into(), ctx.clone())), Ok("HI".into()));
/// // The handler's error becomes the failure message.
/// assert_eq!(futures::executor::block_on(shout("".into(), ctx)), Err("nothing to shout".into()));
/// ```
pub fn sync_handler<A, R, E, F>(f: F) -> ToolHandlerFn
where
    A: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    E: std::fmt::Display + Send + 'static,
    F: Fn(A, ToolCallContext) -> Result<R, E> + Send + Sync + 'static,
{
    let f = Arc::new(f);
    handler(move |args: A, ctx| {
        let out = f(args, ctx);
        async move { out }
    })
}

/// One tool of a session: its definition and, optionally, an inline handler.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::ToolSpec;
///
/// let schema = serde_json::json!({ "type": "object" });
/// let spec = ToolSpec::new("read_page".to_string(), "Returns the page's text", schema).timeout_ms(5_000);
/// assert_eq!(spec.timeout_ms, Some(5_000));
/// // Without an inline handler, `on_tool` or `on_any_tool` answers its calls.
/// assert!(spec.handler.is_none());
/// ```
#[derive(Clone)]
pub struct ToolSpec<T: ToolName = String> {
    pub name: T,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: serde_json::Value,
    pub timeout_ms: Option<u32>,
    pub handler: Option<ToolHandlerFn>,
    /// The tool only reads (WebMCP's `annotations.readOnlyHint`): shown to
    /// the user in the control center's activity log, never enforced.
    pub read_only_hint: bool,
}

impl<T: ToolName> ToolSpec<T> {
    /// A tool with no timeout of its own (Core's default, 60 s) and no inline handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::ToolSpec;
    ///
    /// let schema = serde_json::json!({ "type": "object", "properties": { "delta": { "type": "integer" } } });
    /// let spec = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", schema);
    /// assert_eq!(spec.name, "update_counter");
    /// assert_eq!(spec.timeout_ms, None);
    /// ```
    pub fn new(name: T, description: impl Into<String>, input_schema: serde_json::Value) -> Self {
        ToolSpec {
            name,
            description: description.into(),
            input_schema,
            timeout_ms: None,
            handler: None,
            read_only_hint: false,
        }
    }

    /// How long Core waits for this tool's result (at most an hour) before
    /// the call fails with `TOOL_TIMEOUT`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::ToolSpec;
    ///
    /// let spec = ToolSpec::new("ask_user".to_string(), "Asks the user", serde_json::json!({})).timeout_ms(300_000);
    /// assert_eq!(spec.timeout_ms, Some(300_000));
    /// ```
    pub fn timeout_ms(mut self, timeout_ms: u32) -> Self {
        self.timeout_ms = Some(timeout_ms);
        self
    }

    /// Marks the tool as one that only reads (`ToolDefinition.read_only_hint`,
    /// WebMCP's `annotations.readOnlyHint`): the user's activity log tags
    /// its calls "read-only". A hint for the user; Core enforces nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::ToolSpec;
    ///
    /// let spec = ToolSpec::new("read_page".to_string(), "Reads the page", serde_json::json!({})).read_only();
    /// assert!(spec.read_only_hint);
    /// ```
    pub fn read_only(mut self) -> Self {
        self.read_only_hint = true;
        self
    }

    /// The inline handler (overridden by a named `on_tool`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::{ToolSpec, sync_handler};
    ///
    /// let now = sync_handler(|_: serde_json::Value, _ctx| Ok::<_, String>(pedelec_sdk::context::now_ms()));
    /// let spec = ToolSpec::new("now".to_string(), "The time in ms", serde_json::json!({})).with_handler(now);
    /// assert!(spec.handler.is_some());
    /// ```
    pub fn with_handler(mut self, handler: ToolHandlerFn) -> Self {
        self.handler = Some(handler);
        self
    }

    pub(crate) fn definition(&self) -> pedelec_protocol::pb::ToolDefinition {
        pedelec_protocol::pb::ToolDefinition {
            name: self.name.as_str().to_owned(),
            description: self.description.clone(),
            input_schema_json: self.input_schema.to_string(),
            timeout_ms: self.timeout_ms.unwrap_or(0),
            read_only_hint: self.read_only_hint,
        }
    }
}
