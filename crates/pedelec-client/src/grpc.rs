//! The gRPC transport: tonic over Core's Unix socket.
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), pedelec_client::PedelecError> {
//! use pedelec_client::grpc::GrpcTransport;
//! use pedelec_client::transport::{Call, Reply, Transport, unexpected};
//! use pedelec_protocol::discovery::{default_socket, default_state_dir};
//! use pedelec_protocol::pb;
//!
//! // Where Core listens unless the environment says otherwise.
//! let env = |name: &str| std::env::var(name).ok();
//! let transport = GrpcTransport::connect(default_socket(env, &default_state_dir(env))).await?;
//! match transport.call(Call::Ping(pb::PingRequest {})).await? {
//!     Reply::Ping(pong) => println!("Core {} (pid {})", pong.version, pong.pid),
//!     other => return Err(unexpected(&other)),
//! }
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use futures::StreamExt;
use pedelec_protocol::ErrorCode;
use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb::{self, core_client::CoreClient};
use tonic::transport::Channel;

use crate::error::PedelecError;
use crate::transport::{BoxFuture, Call, EventStream, Reply, Transport};

/// A [`Transport`] to Core over its Unix socket, with the message limits
/// both ends use. Clones share one connection.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_client::PedelecError> {
/// use std::sync::Arc;
///
/// use pedelec_client::grpc::GrpcTransport;
/// use pedelec_client::transport::{Call, Reply, Transport};
/// use pedelec_protocol::pb;
///
/// let transport: Arc<dyn Transport> = Arc::new(GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?);
/// let reply = transport.call(Call::ListProviders(pb::ListProvidersRequest {})).await?;
/// if let Reply::ListProviders(list) = reply {
///     for provider in list.providers {
///         println!("{} ({})", provider.name, provider.code);
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GrpcTransport {
    client: CoreClient<Channel>,
    channel: Channel,
    socket: PathBuf,
}

impl GrpcTransport {
    /// Connects to Core's socket.
    ///
    /// Fails with `CORE_RUNTIME_UNAVAILABLE` when nothing listens there; it
    /// does not start Core.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_client::PedelecError> {
    /// use pedelec_client::grpc::GrpcTransport;
    ///
    /// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
    /// assert_eq!(transport.socket().file_name().unwrap(), "core.sock");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Without Core:
    ///
    /// ```
    /// use pedelec_client::grpc::GrpcTransport;
    /// use pedelec_protocol::ErrorCode;
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// let refused = runtime.block_on(GrpcTransport::connect("/nonexistent/pedelec/core.sock")).err().unwrap();
    /// assert_eq!(refused.error_code(), Some(ErrorCode::CoreRuntimeUnavailable));
    /// assert!(refused.message.contains("/nonexistent/pedelec/core.sock"));
    /// ```
    pub async fn connect(socket: impl AsRef<Path>) -> Result<Self, PedelecError> {
        let socket = socket.as_ref().to_path_buf();
        let channel = local_channel(&socket).await.map_err(|e| {
            PedelecError::new(
                ErrorCode::CoreRuntimeUnavailable,
                format!("cannot reach Core at {}: {e}", socket.display()),
            )
        })?;
        let client = pedelec_protocol::with_message_limits!(CoreClient::new(channel.clone()));
        Ok(GrpcTransport { client, channel, socket })
    }

    /// The socket this transport connected to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_client::PedelecError> {
    /// use std::path::Path;
    ///
    /// use pedelec_client::grpc::GrpcTransport;
    ///
    /// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
    /// assert_eq!(transport.socket(), Path::new("/run/user/1000/pedelec/core.sock"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The connection, for other services Core serves on the same socket.
    ///
    /// Its HTTP/2 flow-control window is shared by every stream on it: a
    /// stream opened here and never read holds its part of the window, and
    /// a few such streams (three `Subscribe` streams during a busy turn,
    /// measured) stall every call on the connection, this transport's own
    /// included. Read what you open here, drop it, or open a channel of your
    /// own ([`local_channel`]) for streams you may leave unread.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use pedelec_client::grpc::GrpcTransport;
    /// use pedelec_protocol::pb::{PingRequest, core_client::CoreClient};
    ///
    /// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
    /// // A generated client on the transport's connection, with the same limits.
    /// let mut core = pedelec_protocol::with_message_limits!(CoreClient::new(transport.channel()));
    /// let pong = core.ping(PingRequest {}).await?.into_inner();
    /// println!("Core {} (pid {})", pong.version, pong.pid);
    /// # Ok(())
    /// # }
    /// ```
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The owner call `Core.WatchSession`: the events of a session of any
    /// origin, as [`Transport::subscribe`] yields them (a snapshot first).
    /// Core refuses a web or empty `caller_origin` (`ORIGIN_NOT_ALLOWED`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), pedelec_client::PedelecError> {
    /// use futures::StreamExt;
    /// use pedelec_client::grpc::GrpcTransport;
    /// use pedelec_protocol::pb;
    ///
    /// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
    /// let request = pb::WatchSessionRequest { caller_origin: "app:my-window".into(), session_id: "sess-1".into() };
    /// let mut events = transport.watch_session(request).await?;
    /// while let Some(event) = events.next().await {
    ///     println!("event {}", event?.seq);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch_session(
        &self,
        request: pb::WatchSessionRequest,
    ) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        let mut c = self.client.clone();
        Box::pin(async move {
            let stream = c.watch_session(request).await.map_err(status)?.into_inner();
            Ok(Box::pin(stream.map(|item| item.map_err(status))) as EventStream)
        })
    }
}

/// Re-exported from [`pedelec_protocol::grpc`]: a connection of your own to
/// Core's socket, apart from a [`GrpcTransport`]'s (see
/// [`GrpcTransport::channel`]).
pub use pedelec_ipc::local_channel;

fn status(e: tonic::Status) -> PedelecError {
    error_from_status(&e).into()
}

/// Calls are Core's unary methods; `Call::Subscribe` and `Call::Unsubscribe`
/// are refused (`INVALID_ARGUMENT`: use [`Transport::subscribe`]), and so is
/// `Call::WatchSession` (use [`GrpcTransport::watch_session`]). Work runs
/// on tokio, so calls must be made inside a tokio runtime.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), pedelec_client::PedelecError> {
/// use futures::StreamExt;
/// use pedelec_client::grpc::GrpcTransport;
/// use pedelec_client::transport::{Call, Reply, Transport, unexpected};
/// use pedelec_protocol::pb;
///
/// let transport = GrpcTransport::connect("/run/user/1000/pedelec/core.sock").await?;
/// let request = pb::CreateSessionRequest { caller_origin: "app:my-tool".into(), ..Default::default() };
/// let session_id = match transport.call(Call::CreateSession(request)).await? {
///     Reply::CreateSession(created) => created.session.unwrap_or_default().session_id,
///     other => return Err(unexpected(&other)),
/// };
/// let request = pb::SubscribeRequest { session_id, caller_origin: "app:my-tool".into() };
/// let mut events = transport.subscribe(request).await?;
/// while let Some(event) = events.next().await {
///     println!("event {}", event?.seq);
/// }
/// # Ok(())
/// # }
/// ```
impl Transport for GrpcTransport {
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        let mut c = self.client.clone();
        Box::pin(async move {
            Ok(match call {
                Call::Ping(r) => Reply::Ping(c.ping(r).await.map_err(status)?.into_inner()),
                Call::ListProviders(r) => Reply::ListProviders(c.list_providers(r).await.map_err(status)?.into_inner()),
                Call::GetSettings(r) => Reply::GetSettings(c.get_settings(r).await.map_err(status)?.into_inner()),
                Call::SetSettings(r) => Reply::SetSettings(c.set_settings(r).await.map_err(status)?.into_inner()),
                Call::CreateSession(r) => Reply::CreateSession(c.create_session(r).await.map_err(status)?.into_inner()),
                Call::Prepare(r) => Reply::Prepare(c.prepare(r).await.map_err(status)?.into_inner()),
                Call::SendText(r) => Reply::SendText(c.send_text(r).await.map_err(status)?.into_inner()),
                Call::SubmitToolResult(r) => {
                    Reply::SubmitToolResult(c.submit_tool_result(r).await.map_err(status)?.into_inner())
                }
                Call::End(r) => Reply::End(c.end(r).await.map_err(status)?.into_inner()),
                Call::Resume(r) => Reply::Resume(c.resume(r).await.map_err(status)?.into_inner()),
                Call::CreateAssetUpload(r) => {
                    Reply::CreateAssetUpload(c.create_asset_upload(r).await.map_err(status)?.into_inner())
                }
                Call::CreateAssetDownload(r) => {
                    Reply::CreateAssetDownload(c.create_asset_download(r).await.map_err(status)?.into_inner())
                }
                Call::ListAssets(r) => Reply::ListAssets(c.list_assets(r).await.map_err(status)?.into_inner()),
                Call::GetHistory(r) => Reply::GetHistory(c.get_history(r).await.map_err(status)?.into_inner()),
                Call::Cancel(r) => Reply::Cancel(c.cancel(r).await.map_err(status)?.into_inner()),
                Call::Steer(r) => Reply::Steer(c.steer(r).await.map_err(status)?.into_inner()),
                Call::GetChanges(r) => Reply::GetChanges(c.get_changes(r).await.map_err(status)?.into_inner()),
                Call::SetModel(r) => Reply::SetModel(c.set_model(r).await.map_err(status)?.into_inner()),
                Call::SetTools(r) => Reply::SetTools(c.set_tools(r).await.map_err(status)?.into_inner()),
                Call::Fork(r) => Reply::Fork(c.fork(r).await.map_err(status)?.into_inner()),
                Call::ListSessions(r) => Reply::ListSessions(c.list_sessions(r).await.map_err(status)?.into_inner()),
                Call::AnswerPermission(r) => {
                    Reply::AnswerPermission(c.answer_permission(r).await.map_err(status)?.into_inner())
                }
                Call::GetConsent(r) => Reply::GetConsent(c.get_consent(r).await.map_err(status)?.into_inner()),
                Call::SetConsent(r) => Reply::SetConsent(c.set_consent(r).await.map_err(status)?.into_inner()),
                Call::RevokeOrigin(r) => Reply::RevokeOrigin(c.revoke_origin(r).await.map_err(status)?.into_inner()),
                Call::ListUserPermissions(r) => {
                    Reply::ListUserPermissions(c.list_user_permissions(r).await.map_err(status)?.into_inner())
                }
                Call::AnswerUserPermission(r) => {
                    Reply::AnswerUserPermission(c.answer_user_permission(r).await.map_err(status)?.into_inner())
                }
                Call::ListLiveSessions(r) => {
                    Reply::ListLiveSessions(c.list_live_sessions(r).await.map_err(status)?.into_inner())
                }
                Call::EndSessions(r) => Reply::EndSessions(c.end_sessions(r).await.map_err(status)?.into_inner()),
                Call::GetSessionHistory(r) => {
                    Reply::GetSessionHistory(c.get_session_history(r).await.map_err(status)?.into_inner())
                }
                Call::CancelTurn(r) => Reply::CancelTurn(c.cancel_turn(r).await.map_err(status)?.into_inner()),
                Call::ListAgents(r) => Reply::ListAgents(c.list_agents(r).await.map_err(status)?.into_inner()),
                Call::ListActivity(r) => Reply::ListActivity(c.list_activity(r).await.map_err(status)?.into_inner()),
                Call::ListFolders(r) => Reply::ListFolders(c.list_folders(r).await.map_err(status)?.into_inner()),
                Call::PickFolder(r) => Reply::PickFolder(c.pick_folder(r).await.map_err(status)?.into_inner()),
                Call::ExportActivity(r) => {
                    Reply::ExportActivity(c.export_activity(r).await.map_err(status)?.into_inner())
                }
                Call::Subscribe(_) | Call::Unsubscribe(_) => {
                    return Err(PedelecError::new(ErrorCode::InvalidArgument, "use Transport::subscribe"));
                }
                Call::WatchSession(_) => {
                    return Err(PedelecError::new(ErrorCode::InvalidArgument, "use GrpcTransport::watch_session"));
                }
            })
        })
    }

    fn subscribe(&self, request: pb::SubscribeRequest) -> BoxFuture<'static, Result<EventStream, PedelecError>> {
        let mut c = self.client.clone();
        Box::pin(async move {
            let stream = c.subscribe(request).await.map_err(status)?.into_inner();
            Ok(Box::pin(stream.map(|item| item.map_err(status))) as EventStream)
        })
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        tokio::spawn(task);
    }

    fn sleep(&self, duration: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
