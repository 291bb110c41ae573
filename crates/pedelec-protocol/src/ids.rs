//! Ids as types: a session, an operation, a turn and a frontend tool request
//! each have their own, so one cannot be passed where another is meant.
//!
//! On the wire every id is a string (the proto's `*_id` fields); these
//! newtypes wrap that string unchanged. Core makes them (`sess-…`, `op-…`,
//! `turn-…`, `tool-…`); clients treat them as opaque.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::{OperationId, SessionId};
//!
//! let session = SessionId::new("sess-1");
//! let operation = OperationId::new("op-1");
//! // Each still compares with the wire string it wraps.
//! assert_eq!(session, "sess-1");
//! assert_eq!(operation.as_str(), "op-1");
//! ```

macro_rules! id {
    ($(#[$doc:meta])* $name:ident, $example:literal) => {
        $(#[$doc])*
        ///
        /// # Examples
        ///
        /// ```
        #[doc = concat!("use pedelec_protocol::ids::", stringify!($name), ";")]
        /// use std::collections::HashMap;
        ///
        #[doc = concat!("let id = ", stringify!($name), "::new(\"", $example, "\");")]
        #[doc = concat!("assert_eq!(id.to_string(), \"", $example, "\");")]
        /// // A map keyed by ids is looked up by the wire string.
        /// let map = HashMap::from([(id, 1)]);
        #[doc = concat!("assert_eq!(map.get(\"", $example, "\"), Some(&1));")]
        /// ```
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an id received or made elsewhere.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = concat!("use pedelec_protocol::ids::", stringify!($name), ";")]
            #[doc = concat!("let id = ", stringify!($name), "::new(\"", $example, "\");")]
            #[doc = concat!("assert_eq!(id, \"", $example, "\");")]
            /// ```
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }
            /// The wire string.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = concat!("use pedelec_protocol::ids::", stringify!($name), ";")]
            #[doc = concat!("let id = ", stringify!($name), "::from(\"", $example, "\");")]
            #[doc = concat!("assert_eq!(id.as_str(), \"", $example, "\");")]
            /// ```
            pub fn as_str(&self) -> &str {
                &self.0
            }
            /// The wire string, without copying it.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = concat!("use pedelec_protocol::ids::", stringify!($name), ";")]
            #[doc = concat!("let id = ", stringify!($name), "::new(\"", $example, "\");")]
            /// let wire: String = id.into_string();
            #[doc = concat!("assert_eq!(wire, \"", $example, "\");")]
            /// ```
            pub fn into_string(self) -> String {
                self.0
            }
            /// The empty id: "none" where a proto field is left unset.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = concat!("use pedelec_protocol::ids::", stringify!($name), ";")]
            #[doc = concat!("assert!(", stringify!($name), "::default().is_empty());")]
            #[doc = concat!("assert!(!", stringify!($name), "::new(\"", $example, "\").is_empty());")]
            /// ```
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id!(
    /// A session (`SessionInfo.session_id`).
    SessionId,
    "sess-1"
);
id!(
    /// An operation: one preparation or one `SendText` (`OperationAccepted.operation_id`).
    OperationId,
    "op-1"
);
id!(
    /// One turn of the agent (`TurnInfo.turn_id`).
    TurnId,
    "turn-1"
);
id!(
    /// One frontend tool call awaiting the application (`ToolCall.tool_request_id`).
    ToolRequestId,
    "tool-1"
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn ids_compare_with_their_wire_strings_and_look_up_by_them() {
        let id = OperationId::new("op-1");
        assert_eq!(id, "op-1");
        assert_eq!(id.to_string(), "op-1");
        let mut map = HashMap::new();
        map.insert(ToolRequestId::from("tool-7"), 7);
        assert_eq!(map.get("tool-7"), Some(&7));
        assert!(OperationId::default().is_empty());
        assert_eq!(String::from(SessionId::new("sess-x")), "sess-x");
    }
}
