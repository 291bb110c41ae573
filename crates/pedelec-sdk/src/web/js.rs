//! Conversions between the SDK's Rust values and the seed's JavaScript shapes:
//! error objects (`code`, `message`, `details`), context objects (the seed's
//! camelCase field names) and JSON values.

use js_sys::{Function, JSON, Object, Promise, Reflect};
use pedelec_protocol::ErrorCode;
use wasm_bindgen::prelude::*;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::context::{EventContext, StatusContext, ToolCallContext};
use crate::error::PedelecError;

/// Sets one property; setting on a fresh plain object cannot fail.
pub fn set(object: &Object, key: &str, value: impl Into<JsValue>) {
    let _ = Reflect::set(object, &JsValue::from_str(key), &value.into());
}

fn set_opt<V: Into<JsValue>>(object: &Object, key: &str, value: Option<V>) {
    if let Some(v) = value {
        set(object, key, v);
    }
}

pub fn get(value: &JsValue, key: &str) -> JsValue {
    Reflect::get(value, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

pub fn get_string(value: &JsValue, key: &str) -> Option<String> {
    get(value, key).as_string()
}

/// A JS `Error` carrying the SDK error's `code`, `message` and `details`.
pub fn error(error: &PedelecError) -> JsValue {
    let e = js_sys::Error::new(&error.message);
    e.set_name("PedelecError");
    let object: &Object = e.unchecked_ref();
    set(object, "code", error.code.as_str());
    set(object, "details", error.details.as_ref().map(json_to_js).unwrap_or(JsValue::UNDEFINED));
    e.into()
}

pub fn error_value(code: ErrorCode, message: impl Into<String>) -> JsValue {
    error(&PedelecError::new(code, message))
}

/// A thrown JS value as a message (an `Error`'s message, else its string form).
pub fn thrown_message(value: &JsValue) -> String {
    if let Some(e) = value.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    value.as_string().unwrap_or_else(|| String::from(JSON::stringify(value).unwrap_or_else(|_| "unknown".into())))
}

/// serde JSON → a JS value (through `JSON.parse`, which any JSON text satisfies).
pub fn json_to_js(value: &serde_json::Value) -> JsValue {
    JSON::parse(&value.to_string()).unwrap_or(JsValue::NULL)
}

/// A JS value → serde JSON; `undefined` becomes `null`, non-JSON values fail.
pub fn js_to_json(value: &JsValue) -> Result<serde_json::Value, String> {
    if value.is_undefined() {
        return Ok(serde_json::Value::Null);
    }
    let text =
        JSON::stringify(value).map_err(|e| format!("the value is not JSON-compatible: {}", thrown_message(&e)))?;
    let text = text.as_string().ok_or("the value is not JSON-compatible")?;
    serde_json::from_str(&text).map_err(|e| format!("the value is not JSON-compatible: {e}"))
}

/// Calls a JS handler and awaits it when it returns a promise (sync or async handlers).
pub async fn call_handler(f: &Function, args: &[JsValue]) -> Result<JsValue, String> {
    let array = args.iter().collect::<js_sys::Array>();
    let out = f.apply(&JsValue::NULL, &array).map_err(|e| thrown_message(&e))?;
    if out.has_type::<Promise>() || get(&out, "then").is_function() {
        JsFuture::from(Promise::resolve(&out)).await.map_err(|e| thrown_message(&e))
    } else {
        Ok(out)
    }
}

fn base(ctx: &EventContext) -> Object {
    let o = Object::new();
    set(&o, "type", ctx.kind);
    set(&o, "sessionId", ctx.session_id.as_str());
    set(&o, "provider", ctx.provider.as_str());
    set_opt(&o, "effortLevel", ctx.effort_level);
    set(&o, "sessionCreatedAt", ctx.session_created_at as f64);
    set_opt(&o, "eventReceivedAt", ctx.event_received_at.map(|v| v as f64));
    set(&o, "eventEmittedAt", ctx.event_emitted_at as f64);
    set_opt(&o, "turnId", ctx.turn_id.as_deref());
    set_opt(&o, "turnStartedAt", ctx.turn_started_at.map(|v| v as f64));
    set_opt(&o, "turnKind", ctx.turn_kind);
    set(&o, "source", ctx.source.as_str());
    o
}

pub fn event_context(ctx: &EventContext) -> JsValue {
    base(ctx).into()
}

pub fn status_context(ctx: &StatusContext) -> JsValue {
    let o = base(&ctx.base);
    set(&o, "previousStatus", ctx.previous_status.as_str());
    o.into()
}

pub fn tool_context(ctx: &ToolCallContext) -> JsValue {
    let o = base(&ctx.base);
    set(&o, "toolRequestId", ctx.tool_request_id.as_str());
    set(&o, "tool", ctx.tool.as_str());
    o.into()
}

/// Reports a handler that threw: a callback's failure must not stop the others.
pub fn report_handler_failure(what: &str, thrown: &JsValue) {
    web_sys::console::error_2(&JsValue::from_str(&format!("pedelec: {what} handler threw")), thrown);
}

/// A `() => void` disposer that may be called any number of times.
pub fn disposer(d: crate::Disposer) -> JsValue {
    let mut slot = Some(d);
    Closure::<dyn FnMut()>::new(move || {
        if let Some(d) = slot.take() {
            d.dispose();
        }
    })
    .into_js_value()
}
