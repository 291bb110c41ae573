//! `Pedelec`: the client that creates and re-attaches sessions.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
//! use pedelec_sdk::{Pedelec, SessionOptions};
//!
//! let pedelec = Pedelec::discover("app:my-tool").await?;
//! let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
//! session.send_text("Hello").await?;
//! // Later, or from another process of the same origin.
//! let again = pedelec.resume_session::<String>(session.session_id()).await?;
//! again.end().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
#[cfg(feature = "grpc")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pedelec_protocol::{ErrorCode, pb};

use crate::context::{SessionMeta, now_ms};
use crate::error::PedelecError;
use crate::session::{PedelecSession, Registry};
use crate::tool::{ToolName, ToolSpec};
use crate::transport::{Call, Reply, Transport, unexpected};

/// Options of `create_session`.
///
/// # Examples
///
/// ```
/// use pedelec_sdk::pb::PermissionMode;
/// use pedelec_sdk::{EffortLevel, SessionOptions, ToolSpec};
///
/// let options = SessionOptions {
///     provider: Some("scripted".into()),
///     effort_level: Some(EffortLevel::Low),
///     guidance: "Answer in one sentence.".into(),
///     tools: vec![ToolSpec::new("read_page".to_string(), "Returns the page's text", serde_json::json!({}))],
///     ..Default::default()
/// };
/// // By default Core ends the session when its last subscriber leaves, and
/// // its own policy answers permission requests.
/// assert!(options.auto_end_on_disconnect);
/// assert_eq!(options.permission_mode, PermissionMode::Policy);
/// ```
pub struct SessionOptions<T: ToolName = String> {
    /// Provider code; `None` selects Core's default.
    pub provider: Option<String>,
    pub model: Option<String>,
    pub effort_level: Option<pb::EffortLevel>,
    /// Skill guidance for the agent.
    pub guidance: String,
    pub tools: Vec<ToolSpec<T>>,
    /// Application-managed absolute workspace; `None` lets Core manage one.
    pub workspace_path: Option<PathBuf>,
    /// An opaque workspace handle the user gave this origin by picking a
    /// folder (Core's `PickFolder`; `pedelec.pickWorkspace()` in a page):
    /// the session opens in that folder. Exclusive with `workspace_path`.
    pub workspace_handle: Option<String>,
    /// Core ends the session when its last subscriber leaves (default true).
    pub auto_end_on_disconnect: bool,
    /// Who answers the agent's permission requests: Core's policy (the
    /// default) or the application (`PermissionMode::App`, through
    /// [`crate::PedelecSession::on_permission`]).
    pub permission_mode: pb::PermissionMode,
}

impl<T: ToolName> Default for SessionOptions<T> {
    fn default() -> Self {
        SessionOptions {
            provider: None,
            model: None,
            effort_level: None,
            guidance: String::new(),
            tools: Vec::new(),
            workspace_path: None,
            workspace_handle: None,
            auto_end_on_disconnect: true,
            permission_mode: pb::PermissionMode::Policy,
        }
    }
}

/// The Pedelec client. Sessions it creates are bound to its origin.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
/// use pedelec_sdk::{Pedelec, SessionOptions};
///
/// let pedelec = Pedelec::discover("app:my-tool").await?;
/// for provider in pedelec.list_providers().await? {
///     println!("{} available: {}", provider.code, provider.available);
/// }
/// let session = pedelec.create_session::<String>(SessionOptions::default()).await?;
/// let _off = session.on_chat(|text, _ctx| println!("{text}"));
/// session.send_text("Analyze the current page.").await?;
/// session.end().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Pedelec {
    pub(crate) transport: Arc<dyn Transport>,
    origin: String,
    registry: Registry,
}

impl Pedelec {
    /// A client over any transport, acting for `origin` (a web origin, or `app:<name>`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use std::sync::Arc;
    /// use pedelec_sdk::Pedelec;
    /// use pedelec_sdk::native::{NativeMessagingTransport, find_host_binary};
    ///
    /// // Through the native host, exactly as the browser extension reaches Core.
    /// let extension = "chrome-extension://ighbaanpnpjegfpbhfnaekbncchadgfe/";
    /// let host = NativeMessagingTransport::spawn(&find_host_binary(), extension, &[])?;
    /// let pedelec = Pedelec::with_transport(Arc::new(host), "https://app.example.com");
    /// pedelec.ping().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_transport(transport: Arc<dyn Transport>, origin: impl Into<String>) -> Self {
        Pedelec { transport, origin: origin.into(), registry: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// Connects to Core on an explicit socket.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{ErrorCode, Pedelec};
    ///
    /// match Pedelec::connect("/tmp/pedelec-test/core.sock", "app:my-tool").await {
    ///     Ok(pedelec) => println!("Core {}", pedelec.ping().await?.version),
    ///     // Nothing listens on the socket.
    ///     Err(error) if error.is(ErrorCode::CoreRuntimeUnavailable) => eprintln!("{}", error.message),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "grpc")]
    pub async fn connect(socket: impl AsRef<Path>, origin: impl Into<String>) -> Result<Self, PedelecError> {
        let transport = crate::grpc::GrpcTransport::connect(socket).await?;
        Ok(Self::with_transport(Arc::new(transport), origin))
    }

    /// Connects to the running Core found through `PEDELEC_CORE_SOCKET` or the default socket path.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// println!("Core {} answers for {}", pedelec.ping().await?.version, pedelec.origin());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "grpc")]
    pub async fn discover(origin: impl Into<String>) -> Result<Self, PedelecError> {
        use pedelec_protocol::discovery::{default_socket, default_state_dir};
        let env = |k: &str| std::env::var(k).ok();
        let socket = default_socket(env, &default_state_dir(env));
        Self::connect(socket, origin).await
    }

    /// The origin every request of this client names.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::Pedelec;
    /// # use std::sync::Arc;
    /// # use pedelec_sdk::transport::{BoxFuture, Call, EventStream, Reply, Transport};
    /// # use pedelec_sdk::{PedelecError, pb};
    /// # struct Offline;
    /// # impl Transport for Offline {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
    /// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         unimplemented!()
    /// #     }
    /// #     fn spawn(&self, _: BoxFuture<'static, ()>) {}
    /// #     fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> { Box::pin(async {}) }
    /// # }
    ///
    /// let pedelec = Pedelec::with_transport(Arc::new(Offline), "app:my-tool");
    /// assert_eq!(pedelec.origin(), "app:my-tool");
    /// ```
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Session ids currently registered (created or re-attached, not ended).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_sdk::Pedelec;
    /// # use std::sync::Arc;
    /// # use pedelec_sdk::transport::{BoxFuture, Call, EventStream, Reply, Transport};
    /// # use pedelec_sdk::{PedelecError, pb};
    /// # struct Offline;
    /// # impl Transport for Offline {
    /// #     fn call(&self, _: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> { unimplemented!() }
    /// #     fn subscribe(&self, _: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
    /// #         unimplemented!()
    /// #     }
    /// #     fn spawn(&self, _: BoxFuture<'static, ()>) {}
    /// #     fn sleep(&self, _: std::time::Duration) -> BoxFuture<'static, ()> { Box::pin(async {}) }
    /// # }
    ///
    /// let pedelec = Pedelec::with_transport(Arc::new(Offline), "app:my-tool");
    /// // Only this client's handles count, not every session Core keeps.
    /// assert!(pedelec.session_ids().is_empty());
    /// ```
    pub fn session_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.registry.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Whether Core answers, with its version and process id.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let pong = pedelec.ping().await?;
    /// println!("Core {} (pid {})", pong.version, pong.pid);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ping(&self) -> Result<pb::PingResponse, PedelecError> {
        match self.transport.call(Call::Ping(pb::PingRequest {})).await? {
            Reply::Ping(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The providers Core knows, and whether each can run here (and why not).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// for provider in pedelec.list_providers().await? {
    ///     if !provider.available {
    ///         println!("{}: {}", provider.code, provider.reason);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_providers(&self) -> Result<Vec<pb::ProviderInfo>, PedelecError> {
        match self.transport.call(Call::ListProviders(pb::ListProvidersRequest {})).await? {
            Reply::ListProviders(r) => Ok(r.providers),
            other => Err(unexpected(&other)),
        }
    }

    /// Core's defaults: the provider a session gets when it names none, and
    /// each provider's default model.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let settings = pedelec.get_settings().await?;
    /// let model = settings.default_models.get(&settings.default_provider);
    /// println!("new sessions use {} ({model:?})", settings.default_provider);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get_settings(&self) -> Result<pb::GetSettingsResponse, PedelecError> {
        match self.transport.call(Call::GetSettings(pb::GetSettingsRequest {})).await? {
            Reply::GetSettings(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// This origin's sessions Core keeps (`Core.ListSessions`, every page),
    /// newest created first: id, provider, model, status, creation and last
    /// activity. Never another origin's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::Pedelec;
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// for summary in pedelec.list_sessions().await? {
    ///     let id = summary.session.map(|info| info.session_id).unwrap_or_default();
    ///     println!("{id} last active at {}", summary.last_activity_at_ms);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn list_sessions(&self) -> Result<Vec<pb::SessionSummary>, PedelecError> {
        let mut all = Vec::new();
        let mut before = String::new();
        loop {
            let request = pb::ListSessionsRequest {
                caller_origin: self.origin.clone(),
                limit: pedelec_protocol::limits::MAX_LISTED_SESSIONS,
                before_session_id: before,
            };
            let page = match self.transport.call(Call::ListSessions(request)).await? {
                Reply::ListSessions(r) => r,
                other => return Err(unexpected(&other)),
            };
            let last = page.sessions.last().and_then(|s| s.session.as_ref()).map(|i| i.session_id.clone());
            all.extend(page.sessions);
            match last {
                Some(last) if page.has_more => before = last,
                _ => return Ok(all),
            }
        }
    }

    /// Creates a Core session and subscribes to it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionOptions, SessionStatus, ToolSpec, sync_handler};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let one = sync_handler(|_: serde_json::Value, _ctx| Ok::<_, String>(serde_json::json!({ "value": 1 })));
    /// let counter = ToolSpec::new("update_counter".to_string(), "Adds delta to the counter", serde_json::json!({}))
    ///     .with_handler(one);
    /// let options = SessionOptions { provider: Some("scripted".into()), tools: vec![counter], ..Default::default() };
    /// let session = pedelec.create_session(options).await?;
    /// // Subscribed and synchronised with Core before it is returned.
    /// assert_eq!(session.get_status(), SessionStatus::Idle);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_session<T: ToolName>(
        &self,
        options: SessionOptions<T>,
    ) -> Result<PedelecSession<T>, PedelecError> {
        let path = match &options.workspace_path {
            Some(path) => Some(
                path.to_str()
                    .ok_or_else(|| PedelecError::new(ErrorCode::WorkspaceInvalid, "workspace path is not UTF-8"))?
                    .to_owned(),
            ),
            None => None,
        };
        let workspace = match (path, &options.workspace_handle) {
            (None, None) => None,
            (path, handle) => {
                Some(pb::WorkspaceSpec { path: path.unwrap_or_default(), handle: handle.clone().unwrap_or_default() })
            }
        };
        let request = pb::CreateSessionRequest {
            provider: options.provider.clone().unwrap_or_default(),
            model: options.model.clone().unwrap_or_default(),
            effort_level: options.effort_level.map(|e| e as i32).unwrap_or_default(),
            skills: Some(pb::Skills {
                guidance: options.guidance.clone(),
                tools: options.tools.iter().map(|t| t.definition()).collect(),
            }),
            workspace,
            auto_end_on_disconnect: Some(options.auto_end_on_disconnect),
            caller_origin: self.origin.clone(),
            permission_mode: options.permission_mode as i32,
        };
        let info = match self.transport.call(Call::CreateSession(request)).await? {
            Reply::CreateSession(pb::CreateSessionResponse { session: Some(info) }) => info,
            other => return Err(unexpected(&other)),
        };
        let inline =
            options.tools.into_iter().filter_map(|t| t.handler.map(|h| (t.name.as_str().to_owned(), h))).collect();
        let meta = SessionMeta {
            session_id: info.session_id.clone(),
            provider: info.provider.clone(),
            effort_level: SessionMeta::effort(info.effort_level),
            session_created_at: now_ms(),
        };
        let session =
            PedelecSession::new(self.transport.clone(), self.registry.clone(), self.origin.clone(), meta, inline);
        session.attach().await?;
        Ok(session)
    }

    /// Re-attaches to an existing session; the handle is synchronised from
    /// Core's snapshot before it is returned (an ended thread stays ended).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_sdk::PedelecError> {
    /// use pedelec_sdk::{Pedelec, SessionStatus};
    ///
    /// let pedelec = Pedelec::discover("app:my-tool").await?;
    /// let id = std::env::var("PEDELEC_SESSION").expect("a session id saved earlier");
    /// let session = pedelec.resume_session::<String>(&id).await?;
    /// if session.get_status() == SessionStatus::Ended {
    ///     session.resume().await?;
    /// }
    /// session.send_text("Where were we?").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn resume_session<T: ToolName>(&self, session_id: &str) -> Result<PedelecSession<T>, PedelecError> {
        let meta = SessionMeta {
            session_id: session_id.to_owned(),
            provider: String::new(),
            effort_level: None,
            session_created_at: now_ms(),
        };
        let session = PedelecSession::new(
            self.transport.clone(),
            self.registry.clone(),
            self.origin.clone(),
            meta,
            HashMap::new(),
        );
        session.attach().await?;
        Ok(session)
    }
}
