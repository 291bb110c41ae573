//! The proto3 canonical JSON mapping of the protocol messages (camelCase,
//! enums as strings, 64-bit integers as strings), via the pbjson-generated
//! serde implementations. This is the form native messaging carries.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::{json, pb};
//!
//! let request = pb::SubscribeRequest { session_id: "sess-1".into(), caller_origin: "app:demo".into() };
//! let text = json::to_json(&request);
//! // Field names are camelCase, as the extension and the browser SDK read them.
//! assert_eq!(text, r#"{"sessionId":"sess-1","callerOrigin":"app:demo"}"#);
//! assert_eq!(json::from_json::<pb::SubscribeRequest>(&text).unwrap(), request);
//! ```

use serde::{Serialize, de::DeserializeOwned};

/// Encodes a message as canonical JSON text.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::{ErrorCode, json, pb};
///
/// let error = pb::Error::new(ErrorCode::SessionBusy, "another turn is active");
/// // Default fields (the empty `details_json`) are left out.
/// assert_eq!(json::to_json(&error), r#"{"code":"SESSION_BUSY","message":"another turn is active"}"#);
/// ```
pub fn to_json<T: Serialize>(message: &T) -> String {
    // Generated serializers only fail on non-string map keys, which protos cannot have.
    serde_json::to_string(message).expect("protocol messages always serialize")
}

/// Decodes canonical JSON text into a message.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::{json, pb};
///
/// let status: pb::StatusChanged = json::from_json(r#"{"status":"SESSION_STATUS_RUNNING"}"#).unwrap();
/// // Enums travel as their names and decode to their numbers.
/// assert_eq!(status.status, pb::SessionStatus::Running as i32);
/// // Fields this build does not know are ignored, so newer Cores stay readable.
/// assert!(json::from_json::<pb::StatusChanged>(r#"{"status":"SESSION_STATUS_IDLE","newField":1}"#).is_ok());
/// assert!(json::from_json::<pb::StatusChanged>("not json").is_err());
/// ```
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(text)
}
