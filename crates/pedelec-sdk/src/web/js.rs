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

thread_local! {
    /// Property names as JS strings, each converted once: every frame from
    /// the extension is read by a handful of names, and turning each from
    /// UTF-8 into a JS string on every read was a tenth of the page's time
    /// per tool call. Only `&'static str` names enter, so it stays small.
    static KEYS: std::cell::RefCell<std::collections::HashMap<&'static str, JsValue>> =
        std::cell::RefCell::default();
}

fn key(name: &'static str) -> JsValue {
    KEYS.with(|keys| keys.borrow_mut().entry(name).or_insert_with(|| JsValue::from_str(name)).clone())
}

/// Sets one property; setting on a fresh plain object cannot fail.
pub fn set(object: &Object, name: &'static str, value: impl Into<JsValue>) {
    let _ = Reflect::set(object, &key(name), &value.into());
}

/// Sets one property whose name is data (not one of the SDK's own names).
pub fn set_named(object: &Object, name: &str, value: impl Into<JsValue>) {
    let _ = Reflect::set(object, &JsValue::from_str(name), &value.into());
}

pub fn get(value: &JsValue, name: &'static str) -> JsValue {
    Reflect::get(value, &key(name)).unwrap_or(JsValue::UNDEFINED)
}

pub fn get_string(value: &JsValue, name: &'static str) -> Option<String> {
    get(value, name).as_string()
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

#[wasm_bindgen(inline_js = r#"
export function eventContext(type, sessionId, provider, effortLevel, sessionCreatedAt, eventReceivedAt,
                             eventEmittedAt, turnId, turnStartedAt, turnKind, source) {
  const o = { type, sessionId, provider };
  if (effortLevel !== undefined) o.effortLevel = effortLevel;
  o.sessionCreatedAt = sessionCreatedAt;
  if (eventReceivedAt !== undefined) o.eventReceivedAt = eventReceivedAt;
  o.eventEmittedAt = eventEmittedAt;
  if (turnId !== undefined) o.turnId = turnId;
  if (turnStartedAt !== undefined) o.turnStartedAt = turnStartedAt;
  if (turnKind !== undefined) o.turnKind = turnKind;
  o.source = source;
  return o;
}
"#)]
extern "C" {
    /// Builds a context object in one call: property by property from Rust
    /// it cost a crossing and a string conversion per field, for every delta.
    #[wasm_bindgen(js_name = eventContext)]
    #[allow(clippy::too_many_arguments)]
    fn make_event_context(
        kind: &JsValue,
        session_id: &JsValue,
        provider: &JsValue,
        effort_level: &JsValue,
        session_created_at: f64,
        event_received_at: Option<f64>,
        event_emitted_at: f64,
        turn_id: &JsValue,
        turn_started_at: Option<f64>,
        turn_kind: &JsValue,
        source: &JsValue,
    ) -> Object;
}

/// Strings a session repeats in every context (its id, provider, turn id,
/// the kind names), kept as JS strings so each is converted once. Bounded:
/// the oldest entry makes room.
const STRING_CACHE: usize = 32;

thread_local! {
    static STRINGS: std::cell::RefCell<std::collections::VecDeque<(String, JsValue)>> =
        std::cell::RefCell::new(std::collections::VecDeque::with_capacity(STRING_CACHE));
}

/// `text` as a JS string, from the cache when it was seen recently.
pub fn cached_str(text: &str) -> JsValue {
    STRINGS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, value)) = cache.iter().find(|(t, _)| t == text) {
            return value.clone();
        }
        let value = JsValue::from_str(text);
        if cache.len() == STRING_CACHE {
            cache.pop_front();
        }
        cache.push_back((text.to_owned(), value.clone()));
        value
    })
}

fn cached_opt(text: Option<&str>) -> JsValue {
    text.map(cached_str).unwrap_or(JsValue::UNDEFINED)
}

fn base(ctx: &EventContext) -> Object {
    make_event_context(
        &cached_str(ctx.kind.as_str()),
        &cached_str(&ctx.session_id),
        &cached_str(&ctx.provider),
        &cached_opt(ctx.effort_level.and_then(|e| e.seed_str())),
        ctx.session_created_at as f64,
        ctx.event_received_at.map(|v| v as f64),
        ctx.event_emitted_at as f64,
        &cached_opt(ctx.turn_id.as_deref()),
        ctx.turn_started_at.map(|v| v as f64),
        &cached_opt(ctx.turn_kind.and_then(|k| k.seed_str())),
        &cached_str(ctx.source.as_str()),
    )
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
