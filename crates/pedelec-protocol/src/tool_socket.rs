//! The tool socket's rules: where it is, what its environment variables are
//! called, and how a frame is laid out (`ToolSocketRequest` /
//! `ToolSocketResponse` in `core.proto`). Core serves it; the MCP bridge and
//! the `pedelec-tool` client speak it. No I/O here: each side reads and
//! writes its own way and calls these to agree on the bytes.
//!
//! Why a second endpoint: an agent that runs a shell command per tool call
//! pays for the client's start every time, and a gRPC client (HTTP/2, an
//! async runtime, a 17 MB binary) costs milliseconds before its first byte.
//! A length-prefixed protobuf frame over the same kind of local socket needs
//! nothing but the standard library.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::pb;
//! use pedelec_protocol::tool_socket::{decode_body, encode_frame, frame_len};
//!
//! let request = pb::ToolSocketRequest {
//!     id: 7,
//!     call: Some(pb::tool_socket_request::Call::CallTool(pb::CallToolRequest {
//!         tool_token: "t".repeat(64),
//!         tool: "update_counter".into(),
//!         args_json: r#"{"delta":1}"#.into(),
//!     })),
//! };
//! let bytes = encode_frame(&request);
//! let len = frame_len(bytes[..4].try_into().unwrap()).unwrap();
//! let back: pb::ToolSocketRequest = decode_body(&bytes[4..4 + len]).unwrap();
//! assert_eq!(back, request);
//! ```

use std::path::{Path, PathBuf};

use crate::discovery::Platform;

/// The environment variable that carries the session's tool token to an
/// agent's tool client (never a command-line argument: those are visible to
/// every user of the machine).
pub const TOKEN_ENV: &str = "PEDELEC_TOOL_TOKEN";
/// The environment variable that carries Core's gRPC endpoint.
pub const CORE_ENDPOINT_ENV: &str = "PEDELEC_CORE_SOCKET";
/// The environment variable that carries the tool socket's endpoint. When it
/// is unset a client derives it from [`CORE_ENDPOINT_ENV`] with [`endpoint_for`].
pub const ENDPOINT_ENV: &str = "PEDELEC_TOOL_ENDPOINT";

/// The length prefix: 4 bytes, little-endian.
pub const HEADER_LEN: usize = 4;
/// The largest frame body either side accepts: the gRPC message limit, so a
/// call that fits one transport fits the other.
pub const MAX_FRAME: usize = crate::limits::GRPC_MESSAGE_MAX;

/// A frame that cannot be read. Either side ends the connection on it: after
/// a bad length the byte stream has no next frame to find.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is over [`MAX_FRAME`].
    #[error("a tool-socket frame of {0} bytes is over the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// The body is not the message it should be.
    #[error("a tool-socket frame does not decode: {0}")]
    Malformed(String),
}

/// The tool socket that goes with Core's gRPC endpoint `core`: the socket's
/// path with `.tools` appended, or on Windows the pipe's name with `-tools`.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::Platform;
/// use pedelec_protocol::tool_socket::endpoint_for;
///
/// assert_eq!(
///     endpoint_for(Platform::Linux, Path::new("/run/user/1000/pedelec/core.sock")),
///     Path::new("/run/user/1000/pedelec/core.sock.tools")
/// );
/// assert_eq!(
///     endpoint_for(Platform::Windows, Path::new(r"\\.\pipe\pedelec-ada-core")),
///     Path::new(r"\\.\pipe\pedelec-ada-core-tools")
/// );
/// ```
pub fn endpoint_for(platform: Platform, core: &Path) -> PathBuf {
    let mut name = core.as_os_str().to_owned();
    name.push(if platform.uses_named_pipes() { "-tools" } else { ".tools" });
    PathBuf::from(name)
}

/// The tool socket a client should use, from its environment:
/// [`ENDPOINT_ENV`] when set, else the one that goes with
/// [`CORE_ENDPOINT_ENV`]; `None` when neither is set.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::Platform;
/// use pedelec_protocol::tool_socket::endpoint_from_env;
///
/// let env = |k: &str| (k == "PEDELEC_CORE_SOCKET").then(|| "/tmp/core.sock".to_owned());
/// assert_eq!(endpoint_from_env(Platform::Linux, env).as_deref(), Some(Path::new("/tmp/core.sock.tools")));
/// assert_eq!(endpoint_from_env(Platform::Linux, |_| None), None);
/// ```
pub fn endpoint_from_env(platform: Platform, env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    set(ENDPOINT_ENV)
        .map(PathBuf::from)
        .or_else(|| set(CORE_ENDPOINT_ENV).map(|core| endpoint_for(platform, Path::new(&core))))
}

/// One message as a frame: its length prefix, then its bytes.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::pb;
/// use pedelec_protocol::tool_socket::encode_frame;
///
/// let bytes = encode_frame(&pb::ToolSocketResponse { id: 1, result: None });
/// assert_eq!(bytes, [2, 0, 0, 0, 0x08, 0x01]);
/// ```
pub fn encode_frame(message: &impl prost::Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut bytes = Vec::with_capacity(HEADER_LEN + len);
    // A message over 4 GiB cannot be built from the bounded inputs that
    // reach here; the receiver refuses anything over MAX_FRAME anyway.
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    message.encode(&mut bytes).expect("a Vec grows to fit");
    bytes
}

/// The body length a frame header announces, checked against [`MAX_FRAME`]
/// before a reader allocates for it.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::tool_socket::{FrameError, frame_len};
///
/// assert_eq!(frame_len([6, 0, 0, 0]), Ok(6));
/// assert_eq!(frame_len([0xff; 4]), Err(FrameError::TooLong(u32::MAX as usize)));
/// ```
pub fn frame_len(header: [u8; HEADER_LEN]) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME { Err(FrameError::TooLong(len)) } else { Ok(len) }
}

/// A frame's body as the message it should be.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::pb;
/// use pedelec_protocol::tool_socket::{FrameError, decode_body};
///
/// assert!(matches!(decode_body::<pb::ToolSocketRequest>(&[0xff]), Err(FrameError::Malformed(_))));
/// ```
pub fn decode_body<M: prost::Message + Default>(body: &[u8]) -> Result<M, FrameError> {
    M::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn the_env_names_the_endpoint_before_deriving_it() {
        let both = |k: &str| match k {
            ENDPOINT_ENV => Some("/a/tools".to_owned()),
            CORE_ENDPOINT_ENV => Some("/b/core.sock".to_owned()),
            _ => None,
        };
        assert_eq!(endpoint_from_env(Platform::Linux, both), Some(PathBuf::from("/a/tools")));
        let empty = |k: &str| (k == ENDPOINT_ENV).then(String::new);
        assert_eq!(endpoint_from_env(Platform::MacOs, empty), None);
        assert_eq!(
            endpoint_for(Platform::MacOs, Path::new("/Users/ada/Library/Application Support/Pedelec/core.sock")),
            Path::new("/Users/ada/Library/Application Support/Pedelec/core.sock.tools")
        );
    }

    #[test]
    fn every_response_round_trips_and_the_limit_is_the_grpc_one() {
        use pb::tool_socket_response::Result as R;
        let results = [
            R::ListTools(pb::ListToolsResponse { tools: vec![], guidance: "g".into() }),
            R::CallTool(pb::CallToolResponse {
                outcome: Some(pb::call_tool_response::Outcome::ResultJson("{}".into())),
            }),
            R::RequestPermission(pb::AgentPermissionResponse { allowed: false, message: "no".into() }),
            R::Error(pb::Error::new(crate::ErrorCode::ToolTokenInvalid, "unknown token")),
        ];
        for (id, result) in results.into_iter().enumerate() {
            let response = pb::ToolSocketResponse { id: id as u64, result: Some(result) };
            let bytes = encode_frame(&response);
            let len = frame_len(bytes[..HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!(len, bytes.len() - HEADER_LEN);
            assert_eq!(decode_body::<pb::ToolSocketResponse>(&bytes[HEADER_LEN..]).unwrap(), response);
        }
        assert_eq!(frame_len((MAX_FRAME as u32).to_le_bytes()), Ok(MAX_FRAME));
        assert_eq!(frame_len((MAX_FRAME as u32 + 1).to_le_bytes()), Err(FrameError::TooLong(MAX_FRAME + 1)));
    }
}
