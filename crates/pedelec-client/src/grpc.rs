//! The gRPC transport: tonic over Core's Unix socket.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use pedelec_protocol::ErrorCode;
use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::pb::{self, core_client::CoreClient};
use tonic::transport::Channel;

use crate::error::PedelecError;
use crate::transport::{BoxFuture, Call, EventStream, Reply, Transport};

#[derive(Clone)]
pub struct GrpcTransport {
    client: CoreClient<Channel>,
    channel: Channel,
    socket: PathBuf,
}

impl GrpcTransport {
    /// Connects to Core's socket.
    pub async fn connect(socket: impl AsRef<Path>) -> Result<Self, PedelecError> {
        let socket = socket.as_ref().to_path_buf();
        let channel = uds_channel(&socket).await.map_err(|e| {
            PedelecError::new(
                ErrorCode::CoreRuntimeUnavailable,
                format!("cannot reach Core at {}: {e}", socket.display()),
            )
        })?;
        let client = pedelec_protocol::with_message_limits!(CoreClient::new(channel.clone()));
        Ok(GrpcTransport { client, channel, socket })
    }

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
    /// own ([`uds_channel`]) for streams you may leave unread.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}

pub use pedelec_protocol::grpc::uds_channel;

fn status(e: tonic::Status) -> PedelecError {
    error_from_status(&e).into()
}

impl Transport for GrpcTransport {
    fn call(&self, call: Call) -> BoxFuture<'static, Result<Reply, PedelecError>> {
        let mut c = self.client.clone();
        Box::pin(async move {
            Ok(match call {
                Call::Ping(r) => Reply::Ping(c.ping(r).await.map_err(status)?.into_inner()),
                Call::ListProviders(r) => Reply::ListProviders(c.list_providers(r).await.map_err(status)?.into_inner()),
                Call::GetSettings(r) => Reply::GetSettings(c.get_settings(r).await.map_err(status)?.into_inner()),
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
                Call::ListSessions(r) => Reply::ListSessions(c.list_sessions(r).await.map_err(status)?.into_inner()),
                Call::AnswerPermission(r) => {
                    Reply::AnswerPermission(c.answer_permission(r).await.map_err(status)?.into_inner())
                }
                Call::Subscribe(_) | Call::Unsubscribe(_) => {
                    return Err(PedelecError::new(ErrorCode::InvalidArgument, "use Transport::subscribe"));
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
