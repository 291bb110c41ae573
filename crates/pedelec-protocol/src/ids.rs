//! Ids as types: a session, an operation, a turn and a frontend tool request
//! each have their own, so one cannot be passed where another is meant.
//!
//! On the wire every id is a string (the proto's `*_id` fields); these
//! newtypes wrap that string unchanged. Core makes them (`sess-…`, `op-…`,
//! `turn-…`, `tool-…`); clients treat them as opaque.

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an id received or made elsewhere.
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
            pub fn into_string(self) -> String {
                self.0
            }
            /// The empty id: "none" where a proto field is left unset.
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
    SessionId
);
id!(
    /// An operation: one preparation or one `SendText` (`OperationAccepted.operation_id`).
    OperationId
);
id!(
    /// One turn of the agent (`TurnInfo.turn_id`).
    TurnId
);
id!(
    /// One frontend tool call awaiting the application (`ToolCall.tool_request_id`).
    ToolRequestId
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
