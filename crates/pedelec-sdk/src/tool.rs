//! Frontend tools: typed names, definitions with optional inline handlers,
//! and the handler function types (sync or async, typed through serde).

use std::future::Future;
use std::sync::Arc;

use serde::{Serialize, de::DeserializeOwned};

use crate::context::ToolCallContext;
use crate::transport::BoxFuture;

/// A tool name type. `String` accepts any name; an enum of the session's
/// tools makes named handlers accept only those (the seed's `TToolName`).
pub trait ToolName: Clone + Send + Sync + 'static {
    fn as_str(&self) -> &str;
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
pub type ToolOutcome = Result<serde_json::Value, String>;

/// A handler for one tool, erased to JSON.
pub type ToolHandlerFn =
    Arc<dyn Fn(serde_json::Value, ToolCallContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync>;

/// The generic fallback handler, which also receives the tool name.
pub type GenericToolHandlerFn<T> =
    Arc<dyn Fn(T, serde_json::Value, ToolCallContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync>;

/// Wraps a typed async handler: arguments are deserialised into `A` (a
/// mismatch is a handler failure), the result serialised from `R`.
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
#[derive(Clone)]
pub struct ToolSpec<T: ToolName = String> {
    pub name: T,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: serde_json::Value,
    pub timeout_ms: Option<u32>,
    pub handler: Option<ToolHandlerFn>,
}

impl<T: ToolName> ToolSpec<T> {
    pub fn new(name: T, description: impl Into<String>, input_schema: serde_json::Value) -> Self {
        ToolSpec { name, description: description.into(), input_schema, timeout_ms: None, handler: None }
    }

    pub fn timeout_ms(mut self, timeout_ms: u32) -> Self {
        self.timeout_ms = Some(timeout_ms);
        self
    }

    /// The inline handler (overridden by a named `on_tool`).
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
        }
    }
}
