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
/// // `channel` dials Core's endpoint: `pedelec_ipc::local_channel`.
/// # async fn example(channel: tonic::transport::Channel) -> Result<(), Box<dyn std::error::Error>> {
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
