//! The seed's JavaScript API (`Pedelec`, `PedelecSession`) as wasm-bindgen
//! classes. Each method is a thin shim over the Rust [`crate::Pedelec`] and
//! [`crate::PedelecSession`]: the session logic is the same code as natively.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Array, Function, Object, Promise};
use pedelec_protocol::{ErrorCode, pb};
use wasm_bindgen::prelude::*;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::future_to_promise;

use super::js::{self, get, get_string, set};
use super::local::Local;
use super::port::{Channel, Link, PortTransport};
use crate::client::SessionOptions;
use crate::error::PedelecError;
use crate::tool::{ToolHandlerFn, ToolSpec};

type Session = crate::PedelecSession<String>;

fn reject(error: PedelecError) -> JsValue {
    js::error(&error)
}

fn invalid(message: impl Into<String>) -> JsValue {
    js::error_value(ErrorCode::InvalidArgument, message)
}

/// A JS tool handler as the SDK's erased handler: sync or async, a throw or
/// rejection becomes the handler failure the session submits as `TOOL_HANDLER_ERROR`.
fn tool_handler(f: Function) -> ToolHandlerFn {
    let f = Local(f);
    Arc::new(move |args, ctx| {
        let f = f.0.clone();
        Box::pin(Local(async move {
            let out = js::call_handler(&f, &[js::json_to_js(&args), js::tool_context(&ctx)]).await?;
            js::js_to_json(&out)
        }))
    })
}

fn tool_specs(tools: &JsValue) -> Result<Vec<ToolSpec<String>>, JsValue> {
    if tools.is_undefined() || tools.is_null() {
        return Ok(Vec::new());
    }
    let tools: &Array = tools.dyn_ref().ok_or_else(|| invalid("tools must be an array"))?;
    tools
        .iter()
        .map(|tool| {
            let name = get_string(&tool, "name").ok_or_else(|| invalid("every tool needs a name"))?;
            let schema = get(&tool, "inputSchema");
            let schema = if schema.is_undefined() {
                serde_json::json!({ "type": "object" })
            } else {
                js::js_to_json(&schema).map_err(invalid)?
            };
            let mut spec = ToolSpec::new(name, get_string(&tool, "description").unwrap_or_default(), schema);
            if let Some(ms) = get(&tool, "timeoutMs").as_f64() {
                spec = spec.timeout_ms(ms as u32);
            }
            // WebMCP's annotations: `readOnlyHint` reaches Core (shown in the
            // user's activity log); `true` only, as the draft spells it.
            if get(&get(&tool, "annotations"), "readOnlyHint").as_bool() == Some(true) {
                spec = spec.read_only();
            }
            // `execute` is a WebMCP tool descriptor's handler (document.modelContext's shape).
            let handler = get(&tool, "handler");
            let handler = if handler.is_undefined() { get(&tool, "execute") } else { handler };
            if let Some(handler) = handler.dyn_ref::<Function>() {
                spec = spec.with_handler(tool_handler(handler.clone()));
            }
            Ok(spec)
        })
        .collect()
}

fn session_options(options: &JsValue) -> Result<SessionOptions<String>, JsValue> {
    let mut out = SessionOptions::<String>::default();
    if options.is_undefined() || options.is_null() {
        return Ok(out);
    }
    out.provider = get_string(options, "provider");
    out.model = get_string(options, "model");
    if let Some(effort) = get_string(options, "effortLevel") {
        out.effort_level = Some(
            pb::EffortLevel::parse_seed(&effort).ok_or_else(|| invalid(format!("unknown effortLevel {effort:?}")))?,
        );
    }
    let skills = get(options, "skills");
    out.guidance = get_string(&skills, "guidance").or_else(|| get_string(options, "guidance")).unwrap_or_default();
    // `skills.tools` per the design; a top-level `tools` array as the seed's type inference uses.
    let mut tools = tool_specs(&get(&skills, "tools"))?;
    tools.extend(tool_specs(&get(options, "tools"))?);
    out.tools = tools;
    out.workspace_path = get_string(&get(options, "workspace"), "path").map(Into::into);
    // A folder the user picked (`pickWorkspace()`): Core resolves the handle.
    out.workspace_handle = get_string(&get(options, "workspace"), "handle");
    if let Some(auto) = get(options, "autoEndOnDisconnect").as_bool() {
        out.auto_end_on_disconnect = auto;
    }
    out.permission_mode = match get_string(options, "permissions").as_deref() {
        None | Some("policy") => pb::PermissionMode::Policy,
        Some("app") => pb::PermissionMode::App,
        Some(other) => return Err(invalid(format!("permissions must be \"policy\" or \"app\", not {other:?}"))),
    };
    Ok(out)
}

fn page_origin() -> String {
    get_string(&get(&js_sys::global(), "location"), "origin").unwrap_or_default()
}

/// `new Pedelec({ extensionId })`.
#[wasm_bindgen(js_name = Pedelec)]
pub struct JsPedelec {
    client: crate::Pedelec,
    link: Rc<Link>,
    /// The sessions this client made or resumed, held until they end: a
    /// page that keeps no reference to a handle (a handler-only session)
    /// must not lose it to garbage collection, which would drop the
    /// subscription and let Core auto-end a live session.
    live: Held,
}

/// Live sessions by id, shared with each session's end handler (weakly).
type Held = Rc<std::cell::RefCell<HashMap<String, Session>>>;

/// Holds `session` in `live` until it ends.
fn hold(live: &Held, session: &Session) {
    let id = session.session_id().to_owned();
    live.borrow_mut().insert(id.clone(), session.clone());
    // Weak: the handler must not keep the client's map (and so every
    // session in it) alive on its own.
    let weak = Local(Rc::downgrade(live));
    let disposer = session.on_ended(move |_| {
        // The whole wrapper is captured (not just its field), so the closure is Send.
        let weak = &weak;
        if let Some(live) = weak.0.upgrade() {
            live.borrow_mut().remove(&id);
        }
    });
    std::mem::forget(disposer);
}

#[wasm_bindgen(module = "/src/web/model_context.js")]
extern "C" {
    #[wasm_bindgen(js_name = bridgeModelContext)]
    fn bridge_model_context_js(session: JsValue, options: JsValue) -> Promise;
}

#[wasm_bindgen(js_class = Pedelec)]
impl JsPedelec {
    /// `bridgeModelContext(session, { modelContext? })`: the page's WebMCP
    /// tools become the session's, following `toolchange` (model_context.js).
    #[wasm_bindgen(js_name = bridgeModelContext)]
    pub fn bridge_model_context(&self, session: JsValue, options: JsValue) -> Promise {
        bridge_model_context_js(session, options)
    }

    #[wasm_bindgen(constructor)]
    pub fn new(options: JsValue) -> Result<JsPedelec, JsValue> {
        let extension_id =
            get_string(&options, "extensionId").ok_or_else(|| invalid("new Pedelec({ extensionId }) needs an id"))?;
        let channel = match get_string(&options, "channel").as_deref() {
            None | Some("auto") => Channel::Auto,
            Some("relay") => Channel::Relay,
            Some(other) => return Err(invalid(format!("channel must be \"auto\" or \"relay\", not {other:?}"))),
        };
        let link = Link::new(extension_id, channel);
        // The extension overwrites the origin with the browser's sender origin;
        // this one only labels the client.
        let client = crate::Pedelec::with_transport(Arc::new(PortTransport::new(link.clone())), page_origin());
        Ok(JsPedelec { client, link, live: Rc::default() })
    }

    #[wasm_bindgen(js_name = createSession)]
    pub fn create_session(&self, options: JsValue) -> Promise {
        let client = self.client.clone();
        let options = session_options(&options);
        let live = Local(self.live.clone());
        future_to_promise(async move {
            let session = client.create_session(options?).await.map_err(reject)?;
            hold(&live.0, &session);
            Ok(JsPedelecSession { session, live: Local(Rc::downgrade(&live.0)) }.into())
        })
    }

    #[wasm_bindgen(js_name = resumeSession)]
    pub fn resume_session(&self, session_id: String) -> Promise {
        let client = self.client.clone();
        let live = Local(self.live.clone());
        future_to_promise(async move {
            let session = client.resume_session::<String>(&session_id).await.map_err(reject)?;
            hold(&live.0, &session);
            Ok(JsPedelecSession { session, live: Local(Rc::downgrade(&live.0)) }.into())
        })
    }

    /// `listSessions()` → this origin's sessions (see `crate::history::sessions_json`).
    #[wasm_bindgen(js_name = listSessions)]
    pub fn list_sessions(&self) -> Promise {
        let client = self.client.clone();
        future_to_promise(async move {
            let sessions = client.list_sessions().await.map_err(reject)?;
            Ok(js::json_to_js(&crate::history::sessions_json(&sessions)))
        })
    }

    #[wasm_bindgen(js_name = listProviders)]
    pub fn list_providers(&self) -> Promise {
        let client = self.client.clone();
        future_to_promise(async move {
            let providers = client.list_providers().await.map_err(reject)?;
            let out = Array::new();
            for p in providers {
                let o = Object::new();
                set(&o, "name", p.name);
                set(&o, "code", p.code);
                set(&o, "available", p.available);
                if !p.reason.is_empty() {
                    set(&o, "reason", p.reason);
                }
                out.push(&o);
            }
            Ok(out.into())
        })
    }

    #[wasm_bindgen(js_name = getSettings)]
    pub fn get_settings(&self) -> Promise {
        let client = self.client.clone();
        future_to_promise(async move {
            let settings = client.get_settings().await.map_err(reject)?;
            let o = Object::new();
            set(&o, "defaultProvider", settings.default_provider);
            let models = Object::new();
            for (k, v) in settings.default_models {
                js::set_named(&models, &k, v);
            }
            set(&o, "defaultModels", models);
            Ok(o.into())
        })
    }

    /// `{ installed, approved, origin, appConnected }` — never opens a prompt.
    #[wasm_bindgen(js_name = getApprovalStatus)]
    pub fn get_approval_status(&self) -> Promise {
        let link = self.link.clone();
        future_to_promise(Local(async move {
            let status = link.status().await;
            let o = Object::new();
            set(&o, "installed", status.installed);
            set(&o, "approved", status.approved);
            set(&o, "origin", if status.installed { status.origin } else { page_origin() });
            set(&o, "appConnected", status.app_connected);
            set(&o, "pending", status.pending);
            Ok(o.into())
        }))
    }

    /// `pickWorkspace()` → `{ handle, name }`: the user picks a folder in the
    /// extension's picker; Core grants it to this origin. Rejects with
    /// `PICK_CANCELLED` when the user closes the picker without a pick.
    #[wasm_bindgen(js_name = pickWorkspace)]
    pub fn pick_workspace(&self) -> Promise {
        let link = self.link.clone();
        future_to_promise(Local(async move {
            let picked = link.pick_workspace().await.map_err(reject)?;
            let o = Object::new();
            set(&o, "handle", picked.handle);
            set(&o, "name", picked.name);
            Ok(o.into())
        }))
    }

    /// `{ available, reason? }`: the extension is installed, this origin is
    /// approved and Core answers. Never opens a prompt.
    #[wasm_bindgen(js_name = checkAvailability)]
    pub fn check_availability(&self) -> Promise {
        let link = self.link.clone();
        let client = self.client.clone();
        future_to_promise(Local(async move {
            let status = link.status().await;
            let o = Object::new();
            let reason = if !status.installed {
                Some("extension_not_installed")
            } else if !status.approved {
                Some("origin_not_approved")
            } else {
                match client.ping().await {
                    Ok(_) => None,
                    Err(_) => Some("app_not_connected"),
                }
            };
            set(&o, "available", reason.is_none());
            if let Some(reason) = reason {
                set(&o, "reason", reason);
            }
            Ok(o.into())
        }))
    }
}

/// One Core agent session (`PedelecSession<TToolName>`).
#[wasm_bindgen(js_name = PedelecSession)]
pub struct JsPedelecSession {
    session: Session,
    /// The client's live map, to hold the session again after `resume()`.
    live: Local<std::rc::Weak<std::cell::RefCell<HashMap<String, Session>>>>,
}

fn void(result: Result<(), PedelecError>) -> Result<JsValue, JsValue> {
    result.map(|()| JsValue::UNDEFINED).map_err(reject)
}

#[wasm_bindgen(js_class = PedelecSession)]
impl JsPedelecSession {
    #[wasm_bindgen(getter, js_name = sessionId)]
    pub fn session_id(&self) -> String {
        self.session.session_id().to_owned()
    }

    #[wasm_bindgen(getter)]
    pub fn provider(&self) -> String {
        self.session.provider()
    }

    #[wasm_bindgen(getter, js_name = effortLevel)]
    pub fn effort_level(&self) -> Option<String> {
        self.session.effort_level().and_then(|e| e.seed_str()).map(str::to_owned)
    }

    #[wasm_bindgen(getter, js_name = sessionCreatedAt)]
    pub fn session_created_at(&self) -> f64 {
        self.session.session_created_at() as f64
    }

    /// `{ totalTokens?: number }`.
    #[wasm_bindgen(getter)]
    pub fn usage(&self) -> JsValue {
        let o = Object::new();
        if let Some(total) = self.session.usage().total_tokens {
            set(&o, "totalTokens", total as f64);
        }
        o.into()
    }

    #[wasm_bindgen(js_name = getStatus)]
    pub fn get_status(&self) -> String {
        self.session.get_status().as_str().to_owned()
    }

    pub fn prepare(&self) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move { void(session.prepare().await) })
    }

    /// `sendText(text, { attachments?: string[], outputSchema?: object })`:
    /// resolves with the typed answer when `outputSchema` is given.
    #[wasm_bindgen(js_name = sendText)]
    pub fn send_text(&self, text: String, options: JsValue) -> Promise {
        let session = self.session.clone();
        let attachments = get(&options, "attachments");
        let attachments: Result<Vec<String>, JsValue> = if attachments.is_undefined() || attachments.is_null() {
            Ok(Vec::new())
        } else if let Some(list) = attachments.dyn_ref::<Array>() {
            list.iter()
                .map(|p| p.as_string().ok_or_else(|| invalid("attachments must be strings (asset paths)")))
                .collect()
        } else {
            Err(invalid("attachments must be an array of asset paths"))
        };
        let schema = get(&options, "outputSchema");
        let output_schema = if schema.is_undefined() || schema.is_null() {
            Ok(None)
        } else if schema.is_object() && !Array::is_array(&schema) {
            js::js_to_json(&schema).map(Some).map_err(invalid)
        } else {
            Err(invalid("outputSchema must be a JSON Schema object"))
        };
        future_to_promise(async move {
            let options = crate::SendOptions { attachments: attachments?, output_schema: output_schema? };
            match session.send_text_with(text, options).await.map_err(reject)? {
                Some(value) => Ok(js::json_to_js(&value)),
                None => Ok(JsValue::UNDEFINED),
            }
        })
    }

    /// `setTools(tools)`: a new frontend tool list between turns.
    #[wasm_bindgen(js_name = setTools)]
    pub fn set_tools(&self, tools: JsValue) -> Promise {
        let session = self.session.clone();
        let specs = tool_specs(&tools);
        future_to_promise(Local(async move { void(session.set_tools(specs?).await) }))
    }

    /// `fork()`: a new session continuing a copy of this one's conversation.
    pub fn fork(&self) -> Promise {
        let session = self.session.clone();
        let live = Local(self.live.0.clone());
        future_to_promise(async move {
            let fork = session.fork().await.map_err(reject)?;
            if let Some(map) = live.0.upgrade() {
                hold(&map, &fork);
            }
            Ok(JsPedelecSession { session: fork, live }.into())
        })
    }

    /// `setModel(model, { effortLevel })`: from the next turn.
    #[wasm_bindgen(js_name = setModel)]
    pub fn set_model(&self, model: String, options: JsValue) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move {
            let effort = match get_string(&options, "effortLevel") {
                None => None,
                Some(effort) => Some(
                    pb::EffortLevel::parse_seed(&effort)
                        .ok_or_else(|| invalid(format!("unknown effortLevel {effort:?}")))?,
                ),
            };
            let info = session.set_model(model, effort).await.map_err(reject)?;
            let out = Object::new();
            set(&out, "model", info.model);
            let effort = pb::EffortLevel::try_from(info.effort_level).ok().and_then(|e| e.seed_str());
            set(&out, "effortLevel", effort.map(str::to_owned));
            Ok(out.into())
        })
    }

    /// Adds text to the running turn; resolves once the agent took it.
    pub fn steer(&self, text: String) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move { void(session.steer(text).await) })
    }

    /// Stops the running operation; resolves once it settled here.
    pub fn cancel(&self) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move { void(session.cancel().await) })
    }

    pub fn end(&self) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move { void(session.end().await) })
    }

    pub fn resume(&self) -> Promise {
        let session = self.session.clone();
        let live = Local(self.live.0.clone());
        future_to_promise(async move {
            session.resume().await.map_err(reject)?;
            // Live again: held again until it next ends (the end handler
            // `hold` registered is still there).
            if let Some(live) = live.0.upgrade() {
                live.borrow_mut().insert(session.session_id().to_owned(), session.clone());
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    #[wasm_bindgen(js_name = onChat)]
    pub fn on_chat(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_chat(move |text, ctx| {
            if let Err(e) = f.0.call2(&JsValue::NULL, &JsValue::from_str(text), &js::event_context(ctx)) {
                js::report_handler_failure("onChat", &e);
            }
        }))
    }

    /// `onActivity((activity, ctx) => …)`; see `crate::history::activity_json` for the shape.
    #[wasm_bindgen(js_name = onActivity)]
    pub fn on_activity(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_activity(move |activity, ctx| {
            let value = js::json_to_js(&crate::history::activity_json(activity));
            if let Err(e) = f.0.call2(&JsValue::NULL, &value, &js::event_context(ctx)) {
                js::report_handler_failure("onActivity", &e);
            }
        }))
    }

    /// `onPermission((request, ctx) => optionId | null)` (maybe a Promise);
    /// see `crate::history::permission_json`. null, undefined or a throw rejects.
    #[wasm_bindgen(js_name = onPermission)]
    pub fn on_permission(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_permission(move |request, ctx| {
            let f = f.0.clone();
            Local(async move {
                let value = js::json_to_js(&crate::history::permission_json(&request));
                match js::call_handler(&f, &[value, js::event_context(&ctx)]).await {
                    Ok(answer) => answer.as_string(),
                    Err(message) => {
                        js::report_handler_failure("onPermission", &JsValue::from_str(&message));
                        None
                    }
                }
            })
        }))
    }

    #[wasm_bindgen(js_name = onChatDelta)]
    pub fn on_chat_delta(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_chat_delta(move |text, ctx| {
            if let Err(e) = f.0.call2(&JsValue::NULL, &JsValue::from_str(text), &js::event_context(ctx)) {
                js::report_handler_failure("onChatDelta", &e);
            }
        }))
    }

    #[wasm_bindgen(js_name = onStatus)]
    pub fn on_status(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_status(move |status, ctx| {
            if let Err(e) = f.0.call2(&JsValue::NULL, &JsValue::from_str(status.as_str()), &js::status_context(ctx)) {
                js::report_handler_failure("onStatus", &e);
            }
        }))
    }

    #[wasm_bindgen(js_name = onError)]
    pub fn on_error(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_error(move |error, ctx| {
            if let Err(e) = f.0.call2(&JsValue::NULL, &js::error(error), &js::event_context(ctx)) {
                js::report_handler_failure("onError", &e);
            }
        }))
    }

    #[wasm_bindgen(js_name = onEnded)]
    pub fn on_ended(&self, handler: Function) -> JsValue {
        let f = Local(handler);
        js::disposer(self.session.on_ended(move |ctx| {
            if let Err(e) = f.0.call1(&JsValue::NULL, &js::event_context(ctx)) {
                js::report_handler_failure("onEnded", &e);
            }
        }))
    }

    /// `onTool(handler)` (generic: `(tool, args, ctx)`) or `onTool(name, handler)` (named: `(args, ctx)`).
    #[wasm_bindgen(js_name = onTool)]
    pub fn on_tool(&self, first: JsValue, second: JsValue) -> Result<JsValue, JsValue> {
        if let Some(generic) = first.dyn_ref::<Function>() {
            let f = Local(generic.clone());
            let disposer = self.session.on_any_tool(move |name: String, args, ctx| {
                let f = f.0.clone();
                Local(async move {
                    let out = js::call_handler(
                        &f,
                        &[JsValue::from_str(&name), js::json_to_js(&args), js::tool_context(&ctx)],
                    )
                    .await?;
                    js::js_to_json(&out)
                })
            });
            return Ok(js::disposer(disposer));
        }
        let name = first.as_string().ok_or_else(|| invalid("onTool(name, handler) needs a tool name"))?;
        let handler = second.dyn_into::<Function>().map_err(|_| invalid("onTool needs a handler function"))?;
        Ok(js::disposer(self.session.on_tool_fn(name, tool_handler(handler))))
    }

    /// `uploadAsset(file, targetPath?)` → the asset's public path.
    #[wasm_bindgen(js_name = uploadAsset)]
    pub fn upload_asset(&self, file: web_sys::File, target_path: Option<String>) -> Promise {
        let session = self.session.clone();
        future_to_promise(Local(async move {
            let size = file.size() as u64;
            let ticket = session.upload_ticket(&file.name(), size, target_path.as_deref()).await.map_err(reject)?;
            super::assets::put(&ticket, &file).await.map_err(reject)?;
            Ok(JsValue::from_str(&ticket.path))
        }))
    }

    /// `[{ name, path, size, mimeType, modifiedAt }]`, newest first then by name.
    #[wasm_bindgen(js_name = listAssets)]
    pub fn list_assets(&self) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move {
            let assets = session.list_assets().await.map_err(reject)?;
            let out = Array::new();
            for a in assets {
                let o = Object::new();
                set(&o, "name", a.name);
                set(&o, "path", a.path);
                set(&o, "size", a.size as f64);
                set(&o, "mimeType", a.mime_type);
                set(&o, "modifiedAt", a.modified_at_ms as f64);
                out.push(&o);
            }
            Ok(out.into())
        })
    }

    /// `getHistory({ afterSeq?, beforeId?, limit? })` → `{ entries, hasMore }`
    /// (see `crate::history` for each entry's shape).
    #[wasm_bindgen(js_name = getHistory)]
    pub fn get_history(&self, options: JsValue) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move {
            let number = |key: &str| -> Result<u64, JsValue> {
                let value = if options.is_object() {
                    js_sys::Reflect::get(&options, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
                } else {
                    JsValue::UNDEFINED
                };
                if value.is_undefined() || value.is_null() {
                    return Ok(0);
                }
                match value.as_f64() {
                    Some(n) if n >= 0.0 && n.fract() == 0.0 && n <= 9_007_199_254_740_991.0 => Ok(n as u64),
                    _ => Err(invalid(format!("getHistory {key} must be a non-negative integer"))),
                }
            };
            let limit = number("limit")?;
            let query = crate::HistoryQuery {
                after_seq: number("afterSeq")?,
                before_id: number("beforeId")?,
                limit: u32::try_from(limit).map_err(|_| invalid("getHistory limit is at most 1000"))?,
            };
            let page = session.history(query).await.map_err(reject)?;
            Ok(js::json_to_js(&crate::history::page_json(&page)))
        })
    }

    /// `getChanges({ turnId? })`: what a turn changed in the workspace.
    #[wasm_bindgen(js_name = getChanges)]
    pub fn get_changes(&self, options: JsValue) -> Promise {
        let session = self.session.clone();
        future_to_promise(async move {
            let turn = if options.is_object() {
                js_sys::Reflect::get(&options, &JsValue::from_str("turnId")).unwrap_or(JsValue::UNDEFINED)
            } else {
                JsValue::UNDEFINED
            };
            let turn = match turn {
                t if t.is_undefined() || t.is_null() => None,
                t => Some(t.as_string().ok_or_else(|| invalid("getChanges turnId must be a string"))?),
            };
            let changes = session.changes(turn.as_deref()).await.map_err(reject)?;
            Ok(js::json_to_js(&crate::history::changes_json(&changes)))
        })
    }

    /// `readAsset(path, "text" | "json" | "file")`.
    #[wasm_bindgen(js_name = readAsset)]
    pub fn read_asset(&self, path: String, kind: String) -> Promise {
        let session = self.session.clone();
        future_to_promise(Local(async move {
            if !matches!(kind.as_str(), "text" | "json" | "file") {
                return Err(invalid(format!("readAsset type must be \"text\", \"json\" or \"file\", not {kind:?}")));
            }
            let ticket = session.download_ticket(&path).await.map_err(reject)?;
            let bytes = super::assets::get(&ticket).await.map_err(reject)?;
            match kind.as_str() {
                "file" => {
                    let asset = ticket.asset.clone().unwrap_or_default();
                    Ok(super::assets::to_file(&asset, &bytes).map_err(reject)?.into())
                }
                "text" => Ok(JsValue::from_str(&crate::session::asset_text(&path, bytes).map_err(reject)?)),
                _ => {
                    let text = crate::session::asset_text(&path, bytes).map_err(reject)?;
                    let value: serde_json::Value = crate::session::asset_json(&path, &text).map_err(reject)?;
                    Ok(js::json_to_js(&value))
                }
            }
        }))
    }
}
