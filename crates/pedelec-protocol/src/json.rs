//! The proto3 canonical JSON mapping of the protocol messages (camelCase,
//! enums as strings, 64-bit integers as strings), via the pbjson-generated
//! serde implementations. This is the form native messaging carries.

use serde::{Serialize, de::DeserializeOwned};

/// Encodes a message as canonical JSON text.
pub fn to_json<T: Serialize>(message: &T) -> String {
    // Generated serializers only fail on non-string map keys, which protos cannot have.
    serde_json::to_string(message).expect("protocol messages always serialize")
}

/// Decodes canonical JSON text into a message.
pub fn from_json<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str(text)
}
