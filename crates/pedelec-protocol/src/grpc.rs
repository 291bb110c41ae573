//! How a [`pb::Error`] crosses gRPC: gRPC's rich error model. A failed
//! call's `grpc-status-details-bin` is a `google.rpc.Status` whose `details`
//! hold the `pedelec.v1.Error` packed in an `Any`, so stock tooling
//! (`grpc_status.rpc_status.from_call` in Python, `status.FromError` in Go)
//! decodes it, and the SDK recovers the exact code and JSON details.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::grpc::{error_from_status, status_from_error};
//! use pedelec_protocol::{ErrorCode, pb};
//!
//! let error = pb::Error::with_details(ErrorCode::SessionBusy, "busy", &serde_json::json!({ "n": 1 }));
//! let status = status_from_error(&error);
//! assert_eq!(status.code(), tonic::Code::FailedPrecondition);
//! // The exact error, details included, survives the trip.
//! assert_eq!(error_from_status(&status), error);
//! ```

use prost::Message;

/// `google.rpc.Status` (google/rpc/status.proto), the rich error model's envelope.
///
/// # Examples
///
/// ```
/// use prost::Message;
/// use pedelec_protocol::grpc::{ERROR_TYPE_URL, RpcStatus, status_from_error};
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let status = status_from_error(&pb::Error::new(ErrorCode::ThreadNotFound, "no such session"));
/// // What a stock gRPC client finds in `grpc-status-details-bin`.
/// let rich = RpcStatus::decode(status.details()).unwrap();
/// assert_eq!(rich.code, tonic::Code::NotFound as i32);
/// assert_eq!(rich.details[0].type_url, ERROR_TYPE_URL);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<RpcAny>,
}

/// `google.protobuf.Any`.
///
/// # Examples
///
/// ```
/// use prost::Message;
/// use pedelec_protocol::grpc::{ERROR_TYPE_URL, RpcAny};
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let error = pb::Error::new(ErrorCode::Internal, "oops");
/// let packed = RpcAny { type_url: ERROR_TYPE_URL.into(), value: error.encode_to_vec() };
/// assert_eq!(pb::Error::decode(&*packed.value).unwrap(), error);
/// ```
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// The `Any` type URL of a packed `pedelec.v1.Error`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::grpc::ERROR_TYPE_URL;
///
/// assert!(ERROR_TYPE_URL.ends_with("/pedelec.v1.Error"));
/// ```
pub const ERROR_TYPE_URL: &str = "type.googleapis.com/pedelec.v1.Error";

use crate::error_code::ErrorCode;
use crate::pb;

/// The coarse gRPC class of an error code (the proto's header lists it; a
/// test keeps the two the same).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::ErrorCode;
/// use pedelec_protocol::grpc::grpc_code;
///
/// assert_eq!(grpc_code(ErrorCode::ThreadAccessDenied), tonic::Code::PermissionDenied);
/// assert_eq!(grpc_code(ErrorCode::CoreRuntimeUnavailable), tonic::Code::Unavailable);
/// // Codes with no closer class are INTERNAL.
/// assert_eq!(grpc_code(ErrorCode::ProviderCrashed), tonic::Code::Internal);
/// ```
pub fn grpc_code(code: ErrorCode) -> tonic::Code {
    use tonic::Code;
    match code {
        ErrorCode::ThreadNotFound
        | ErrorCode::AssetNotFound
        | ErrorCode::ToolRequestNotFound
        | ErrorCode::PermissionRequestNotFound => Code::NotFound,
        ErrorCode::ThreadAccessDenied
        | ErrorCode::ToolTokenInvalid
        | ErrorCode::OriginNotAllowed
        | ErrorCode::WorkspaceNotAllowed => Code::PermissionDenied,
        ErrorCode::SessionBusy | ErrorCode::SessionEnded | ErrorCode::SessionError => Code::FailedPrecondition,
        ErrorCode::InvalidArgument
        | ErrorCode::TextTooLarge
        | ErrorCode::ToolsManifestInvalid
        | ErrorCode::WorkspaceInvalid
        | ErrorCode::AssetPathInvalid
        | ErrorCode::AssetTooLarge
        | ErrorCode::ProviderNotFound => Code::InvalidArgument,
        ErrorCode::CoreRuntimeUnavailable | ErrorCode::ProviderUnavailable => Code::Unavailable,
        ErrorCode::QuotaExceeded => Code::ResourceExhausted,
        _ => Code::Internal,
    }
}

/// The `tonic::Status` for a protocol error, clipped ([`pb::Error::bounded`])
/// so that message and details together stay far below the 8 KiB of
/// metadata gRPC clients accept.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::grpc::status_from_error;
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let status = status_from_error(&pb::Error::new(ErrorCode::TextTooLarge, "x".repeat(100_000)));
/// assert_eq!(status.code(), tonic::Code::InvalidArgument);
/// assert!(status.message().chars().count() <= pedelec_protocol::limits::MAX_ERROR_MESSAGE_CHARS);
/// ```
pub fn status_from_error(error: &pb::Error) -> tonic::Status {
    use tonic::Code;
    let error = &error.clone().bounded();
    let code = error.error_code().map_or(Code::Internal, grpc_code);
    let details = RpcStatus {
        code: code as i32,
        message: error.message.clone(),
        details: vec![RpcAny { type_url: ERROR_TYPE_URL.to_owned(), value: error.encode_to_vec() }],
    };
    tonic::Status::with_details(code, error.message.clone(), details.encode_to_vec().into())
}

/// The protocol error a `tonic::Status` carries; a status without our details
/// (a transport failure) becomes `TRANSPORT_ERROR`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::ErrorCode;
/// use pedelec_protocol::grpc::error_from_status;
///
/// let error = error_from_status(&tonic::Status::unavailable("socket closed"));
/// assert_eq!(error.error_code(), Some(ErrorCode::TransportError));
/// assert_eq!(error.message, "Unavailable: socket closed");
/// ```
pub fn error_from_status(status: &tonic::Status) -> pb::Error {
    let packed = RpcStatus::decode(status.details()).ok().and_then(|rich| {
        rich.details
            .into_iter()
            .find(|any| any.type_url == ERROR_TYPE_URL)
            .and_then(|any| pb::Error::decode(&*any.value).ok())
    });
    if let Some(error) = packed.filter(|e| !e.code.is_empty()) {
        return error;
    }
    pb::Error::new(ErrorCode::TransportError, format!("{:?}: {}", status.code(), status.message()))
}

/// Applies [`crate::limits::GRPC_MESSAGE_MAX`] both ways to a generated tonic
/// client or server (they share no trait for it), so every end of a Pedelec
/// gRPC connection allows the same sizes.
///
/// # Examples
///
/// ```no_run
/// use pedelec_protocol::pb::core_client::CoreClient;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = pedelec_protocol::grpc::local_channel("/run/user/1000/pedelec/core.sock".as_ref()).await?;
/// let mut core = pedelec_protocol::with_message_limits!(CoreClient::new(channel));
/// let pong = core.ping(pedelec_protocol::pb::PingRequest {}).await?.into_inner();
/// println!("Core {} (pid {})", pong.version, pong.pid);
/// # Ok(())
/// # }
/// ```
#[macro_export]
macro_rules! with_message_limits {
    ($service:expr) => {
        $service
            .max_decoding_message_size($crate::limits::GRPC_MESSAGE_MAX)
            .max_encoding_message_size($crate::limits::GRPC_MESSAGE_MAX)
    };
}

/// A tonic channel to Core's local endpoint (or any gRPC server on one, for
/// tests): a Unix socket path, or on Windows a named pipe name such as
/// `\\.\pipe\pedelec-ada-core` ([`crate::discovery::endpoint_for`]).
///
/// # Examples
///
/// ```no_run
/// use pedelec_protocol::discovery::{default_socket, default_state_dir};
/// use pedelec_protocol::grpc::local_channel;
/// use pedelec_protocol::pb::{PingRequest, core_client::CoreClient};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let env = |k: &str| std::env::var(k).ok();
/// let channel = local_channel(&default_socket(env, &default_state_dir(env))).await?;
/// let pong = CoreClient::new(channel).ping(PingRequest {}).await?.into_inner();
/// assert!(pong.pid > 0);
/// # Ok(())
/// # }
/// ```
pub async fn local_channel(endpoint: &std::path::Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = endpoint.to_path_buf();
    tonic::transport::Endpoint::from_static("http://pedelec-core.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(connect_local(&path).await?)) }
        }))
        .await
}

/// The `:authority` a client must give Core's endpoint: any plain host name
/// does; this is the one Core's docs name.
///
/// Core cannot accept a socket path there. Its HTTP/2 server (h2, under
/// hyper and tonic) parses `:authority` while it decodes a request's HEADERS
/// and resets the stream (`PROTOCOL_ERROR`) when it is not a valid URI
/// authority, before any service, tower layer or hyper option sees the
/// request, and h2 has no setting to relax it. Rewriting it on the way in
/// would mean decoding and re-encoding every request's HPACK block (with the
/// client's dynamic table) in front of h2: a second header codec on every
/// connection, which one channel option on the client makes unnecessary.
pub const CLIENT_AUTHORITY: &str = "localhost";

/// The one-line channel setting for a stock grpcio (Python) client, whose
/// default `:authority` for a `unix:` target is the socket path
/// (see [`CLIENT_AUTHORITY`] for why Core refuses it).
///
/// # Examples
///
/// ```
/// let line = pedelec_protocol::grpc::grpcio_channel("/run/user/1000/pedelec/core.sock".as_ref());
/// assert_eq!(
///     line,
///     r#"grpc.insecure_channel("unix:///run/user/1000/pedelec/core.sock", options=[("grpc.default_authority", "localhost")])"#
/// );
/// ```
pub fn grpcio_channel(endpoint: &std::path::Path) -> String {
    let target = endpoint.display().to_string();
    let target = target.strip_prefix('/').unwrap_or(&target);
    format!(r#"grpc.insecure_channel("unix:///{target}", options=[("grpc.default_authority", "{CLIENT_AUTHORITY}")])"#)
}

/// One connection to a local endpoint: a Unix socket.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// let stream = pedelec_protocol::grpc::connect_local("/run/user/1000/pedelec/core.sock".as_ref()).await?;
/// # drop(stream);
/// # Ok(())
/// # }
/// ```
#[cfg(unix)]
pub async fn connect_local(endpoint: &std::path::Path) -> std::io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(endpoint).await
}

/// One connection to a local endpoint: a named pipe client. A pipe whose
/// every instance is taken answers `ERROR_PIPE_BUSY` until the server
/// offers the next one (it does so as each connection is accepted), so
/// that is retried for up to 2 s; any other error is returned at once.
///
/// A pipe served by a process of another user is refused
/// (`PermissionDenied`) before anything is sent on it: see
/// [`crate::pipe_owner`].
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// let pipe = pedelec_protocol::grpc::connect_local(r"\\.\pipe\pedelec-ada-core".as_ref()).await?;
/// # drop(pipe);
/// # Ok(())
/// # }
/// ```
#[cfg(windows)]
pub async fn connect_local(
    endpoint: &std::path::Path,
) -> std::io::Result<tokio::net::windows::named_pipe::NamedPipeClient> {
    const ERROR_PIPE_BUSY: i32 = 231;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match tokio::net::windows::named_pipe::ClientOptions::new().open(endpoint) {
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Ok(pipe) => {
                use std::os::windows::io::AsRawHandle;
                crate::pipe_owner::check_server_is_current_user(pipe.as_raw_handle())?;
                return Ok(pipe);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proto's header documents each code's gRPC class: every code is
    /// listed there, under the class `grpc_code` gives it.
    #[test]
    fn the_proto_documents_every_codes_grpc_class() {
        let proto = include_str!("../../../proto/pedelec/v1/core.proto");
        let header: String = proto.lines().take_while(|l| l.starts_with("//")).collect::<Vec<_>>().join("\n");
        for &code in ErrorCode::ALL {
            let class = format!("{:?}", grpc_code(code));
            let class: String = class.chars().enumerate().fold(String::new(), |mut out, (i, c)| {
                if c.is_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_uppercase());
                out
            });
            let line = header
                .lines()
                .find(|l| l.contains(&format!("//   {class}:")))
                .unwrap_or_else(|| panic!("the proto header has no line for {class}"));
            let listed = line.contains(code.as_str())
                || header
                    .lines()
                    .skip_while(|l| *l != line)
                    .skip(1)
                    .take_while(|l| l.starts_with("//     "))
                    .any(|l| l.contains(code.as_str()));
            let internal_by_default = class == "INTERNAL";
            assert!(listed || internal_by_default, "{code} ({class}) is not listed under {class} in core.proto");
        }
    }

    #[test]
    fn errors_survive_the_status_round_trip() {
        let error = pb::Error::with_details(ErrorCode::ToolsManifestInvalid, "bad", &serde_json::json!({"tool": "x"}));
        let status = status_from_error(&error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(error_from_status(&status), error);
        let plain = tonic::Status::unavailable("socket closed");
        assert_eq!(error_from_status(&plain).code, "TRANSPORT_ERROR");
    }

    #[test]
    fn errors_travel_as_google_rpc_status_with_the_error_packed_in_an_any() {
        let error = pb::Error::with_details(ErrorCode::SessionBusy, "busy", &serde_json::json!({ "n": 1 }));
        let status = status_from_error(&error);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        // As a stock rich-error client reads it.
        let rich = RpcStatus::decode(status.details()).expect("a google.rpc.Status");
        assert_eq!(rich.code, tonic::Code::FailedPrecondition as i32);
        assert_eq!(rich.message, "busy");
        assert_eq!(rich.details.len(), 1);
        assert_eq!(rich.details[0].type_url, ERROR_TYPE_URL);
        assert_eq!(pb::Error::decode(&*rich.details[0].value).unwrap(), error);
        // And as the SDK does.
        assert_eq!(error_from_status(&status), error);
    }
}
