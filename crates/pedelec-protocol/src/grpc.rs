//! How a [`pb::Error`] crosses gRPC: as a `tonic::Status` whose details carry
//! the encoded error, so the SDK recovers the exact code and details.

use prost::Message;

use crate::error_code::ErrorCode;
use crate::pb;

/// The `tonic::Status` for a protocol error, clipped ([`pb::Error::bounded`])
/// so that message and details together stay far below the 8 KiB of
/// metadata gRPC clients accept.
pub fn status_from_error(error: &pb::Error) -> tonic::Status {
    use tonic::Code;
    let error = &error.clone().bounded();
    let code = match error.error_code() {
        Some(ErrorCode::ThreadNotFound | ErrorCode::AssetNotFound | ErrorCode::ToolRequestNotFound) => Code::NotFound,
        Some(ErrorCode::ThreadAccessDenied | ErrorCode::ToolTokenInvalid | ErrorCode::OriginNotAllowed) => {
            Code::PermissionDenied
        }
        Some(ErrorCode::SessionBusy | ErrorCode::SessionEnded | ErrorCode::SessionError) => Code::FailedPrecondition,
        Some(
            ErrorCode::InvalidArgument
            | ErrorCode::TextTooLarge
            | ErrorCode::ToolsManifestInvalid
            | ErrorCode::WorkspaceInvalid
            | ErrorCode::AssetPathInvalid
            | ErrorCode::ProviderNotFound,
        ) => Code::InvalidArgument,
        Some(ErrorCode::CoreRuntimeUnavailable | ErrorCode::ProviderUnavailable) => Code::Unavailable,
        _ => Code::Internal,
    };
    tonic::Status::with_details(code, error.message.clone(), error.encode_to_vec().into())
}

/// The protocol error a `tonic::Status` carries; a status without our details
/// (a transport failure) becomes `TRANSPORT_ERROR`.
pub fn error_from_status(status: &tonic::Status) -> pb::Error {
    if let Ok(error) = pb::Error::decode(status.details())
        && !error.code.is_empty()
    {
        return error;
    }
    pb::Error::new(ErrorCode::TransportError, format!("{:?}: {}", status.code(), status.message()))
}

/// Applies [`crate::limits::GRPC_MESSAGE_MAX`] both ways to a generated tonic
/// client or server (they share no trait for it), so every end of a Pedelec
/// gRPC connection allows the same sizes.
#[macro_export]
macro_rules! with_message_limits {
    ($service:expr) => {
        $service
            .max_decoding_message_size($crate::limits::GRPC_MESSAGE_MAX)
            .max_encoding_message_size($crate::limits::GRPC_MESSAGE_MAX)
    };
}

/// A tonic channel to a gRPC server on a Unix socket (Core's, or any for tests).
#[cfg(unix)]
pub async fn uds_channel(socket: &std::path::Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://pedelec-core.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_survive_the_status_round_trip() {
        let error = pb::Error::with_details(ErrorCode::ToolsManifestInvalid, "bad", &serde_json::json!({"tool": "x"}));
        let status = status_from_error(&error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(error_from_status(&status), error);
        let plain = tonic::Status::unavailable("socket closed");
        assert_eq!(error_from_status(&plain).code, "TRANSPORT_ERROR");
    }
}
