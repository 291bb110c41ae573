//! Tool manifest rules that need no JSON Schema engine: names and sizes.
//! (Core additionally compiles each schema.)
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::pb::ToolDefinition;
//! use pedelec_protocol::tools::{ManifestRule, check_manifest};
//!
//! let tool = |name: &str| ToolDefinition {
//!     name: name.into(),
//!     description: "Adds delta to the page's counter".into(),
//!     input_schema_json: r#"{"type":"object"}"#.into(),
//!     timeout_ms: 0,
//!     read_only_hint: false,
//! };
//! assert!(check_manifest(&[tool("update_counter")]).is_empty());
//! // Every broken rule is reported, so an application can fix them at once.
//! assert_eq!(
//!     check_manifest(&[tool("9lives"), tool("a"), tool("a")]),
//!     [ManifestRule::BadName("9lives".into()), ManifestRule::DuplicateName("a".into())],
//! );
//! ```

use crate::limits::{MAX_TOOL_NAME_LEN, MAX_TOOL_SCHEMA_BYTES, MAX_TOOLS};
use crate::pb;

/// One broken manifest rule, naming the tool.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::tools::ManifestRule;
///
/// let rule = ManifestRule::EmptyDescription("update_counter".into());
/// assert_eq!(rule.to_string(), r#"tool "update_counter" has an empty description"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestRule {
    #[error("tool name {0:?} must match ^[A-Za-z][A-Za-z0-9_.-]*$ and be at most {MAX_TOOL_NAME_LEN} characters")]
    BadName(String),
    #[error("tool name {0:?} appears more than once")]
    DuplicateName(String),
    #[error("tool {0:?} has an empty description")]
    EmptyDescription(String),
    #[error("tool {0:?} has a description or schema over {MAX_TOOL_SCHEMA_BYTES} bytes")]
    TooLarge(String),
    #[error("tool {0:?} has a timeout over the maximum")]
    TimeoutTooLong(String),
    #[error("tool {name:?} has an invalid input schema: {reason}")]
    BadSchema { name: String, reason: String },
    #[error("more than {MAX_TOOLS} tools")]
    TooMany,
    #[error("tool name {0:?} is reserved for Pedelec")]
    Reserved(String),
}

/// The MCP tool the bridge serves as claude's permission prompt
/// (`PERMISSION_MODE_APP`); no manifest may use the name.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::{ManifestRule, PERMISSION_PROMPT_TOOL, check_manifest};
///
/// let tool = ToolDefinition {
///     name: PERMISSION_PROMPT_TOOL.into(),
///     description: "mine".into(),
///     input_schema_json: "{}".into(),
///     timeout_ms: 0,
///     read_only_hint: false,
/// };
/// assert_eq!(check_manifest(&[tool]), [ManifestRule::Reserved("pedelec_permission".into())]);
/// ```
pub const PERMISSION_PROMPT_TOOL: &str = "pedelec_permission";

impl ManifestRule {
    /// The tool the rule is about, if one.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::tools::ManifestRule;
    ///
    /// let rule = ManifestRule::BadSchema { name: "search".into(), reason: "not JSON".into() };
    /// assert_eq!(rule.tool(), Some("search"));
    /// assert_eq!(ManifestRule::TooMany.tool(), None);
    /// ```
    pub fn tool(&self) -> Option<&str> {
        match self {
            ManifestRule::BadName(n)
            | ManifestRule::DuplicateName(n)
            | ManifestRule::EmptyDescription(n)
            | ManifestRule::TooLarge(n)
            | ManifestRule::TimeoutTooLong(n)
            | ManifestRule::Reserved(n) => Some(n),
            ManifestRule::BadSchema { name, .. } => Some(name),
            ManifestRule::TooMany => None,
        }
    }
}

/// Whether `name` is a legal tool name.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::tools::is_valid_tool_name;
///
/// assert!(is_valid_tool_name("ns.update_counter-2"));
/// assert!(!is_valid_tool_name("_private"));
/// assert!(!is_valid_tool_name("has space"));
/// assert!(!is_valid_tool_name(&"a".repeat(65)));
/// ```
pub fn is_valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_TOOL_NAME_LEN
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Checks names, uniqueness, descriptions, sizes and timeouts, and that each
/// schema is a JSON object with `"type": "object"` (or no type). Returns every
/// broken rule, in manifest order.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::{ManifestRule, check_manifest};
///
/// let tool = ToolDefinition {
///     name: "lookup".into(),
///     description: "Looks a word up".into(),
///     input_schema_json: r#"{"type":"string"}"#.into(),
///     timeout_ms: 0,
///     read_only_hint: false,
/// };
/// let broken = check_manifest(&[tool]);
/// assert!(matches!(&broken[..], [ManifestRule::BadSchema { name, .. }] if name == "lookup"));
/// ```
pub fn check_manifest(tools: &[pb::ToolDefinition]) -> Vec<ManifestRule> {
    let mut broken = Vec::new();
    if tools.len() > MAX_TOOLS {
        broken.push(ManifestRule::TooMany);
    }
    let mut seen = std::collections::HashSet::new();
    for tool in tools {
        let name = tool.name.clone();
        if !is_valid_tool_name(&tool.name) {
            broken.push(ManifestRule::BadName(name.clone()));
        }
        if tool.name == PERMISSION_PROMPT_TOOL {
            broken.push(ManifestRule::Reserved(name.clone()));
        }
        if !seen.insert(tool.name.as_str()) {
            broken.push(ManifestRule::DuplicateName(name.clone()));
        }
        if tool.description.trim().is_empty() {
            broken.push(ManifestRule::EmptyDescription(name.clone()));
        }
        if tool.description.len() > MAX_TOOL_SCHEMA_BYTES || tool.input_schema_json.len() > MAX_TOOL_SCHEMA_BYTES {
            broken.push(ManifestRule::TooLarge(name.clone()));
        }
        if u64::from(tool.timeout_ms) > crate::limits::MAX_TOOL_TIMEOUT.as_millis() as u64 {
            broken.push(ManifestRule::TimeoutTooLong(name.clone()));
        }
        match serde_json::from_str::<serde_json::Value>(&tool.input_schema_json) {
            Ok(serde_json::Value::Object(map)) => match map.get("type") {
                None => {}
                Some(serde_json::Value::String(t)) if t == "object" => {}
                Some(other) => broken.push(ManifestRule::BadSchema {
                    name,
                    reason: format!("top-level type must be \"object\", found {other}"),
                }),
            },
            Ok(_) => broken.push(ManifestRule::BadSchema { name, reason: "schema must be a JSON object".into() }),
            Err(e) => broken.push(ManifestRule::BadSchema { name, reason: format!("not JSON: {e}") }),
        }
    }
    broken
}

/// The effective timeout of a tool.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pedelec_protocol::pb::ToolDefinition;
/// use pedelec_protocol::tools::tool_timeout;
///
/// let mut tool = ToolDefinition::default();
/// // No timeout set means the default of 60 s.
/// assert_eq!(tool_timeout(&tool), Duration::from_secs(60));
/// tool.timeout_ms = 1_500;
/// assert_eq!(tool_timeout(&tool), Duration::from_millis(1_500));
/// ```
pub fn tool_timeout(tool: &pb::ToolDefinition) -> std::time::Duration {
    if tool.timeout_ms == 0 {
        crate::limits::DEFAULT_TOOL_TIMEOUT
    } else {
        std::time::Duration::from_millis(u64::from(tool.timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, schema: &str) -> pb::ToolDefinition {
        pb::ToolDefinition {
            name: name.into(),
            description: description.into(),
            input_schema_json: schema.into(),
            timeout_ms: 0,
            read_only_hint: false,
        }
    }

    #[test]
    fn names_follow_the_pattern() {
        for ok in ["a", "update_counter", "ns.tool-2", "A9"] {
            assert!(is_valid_tool_name(ok), "{ok}");
        }
        for bad in ["", "9a", "_a", "a b", "a/b", "ä", &"a".repeat(65)] {
            assert!(!is_valid_tool_name(bad), "{bad}");
        }
    }

    #[test]
    fn each_rule_is_reported() {
        let obj = r#"{"type":"object"}"#;
        assert!(check_manifest(&[tool("a", "d", obj), tool("b", "d", "{}")]).is_empty());
        assert_eq!(check_manifest(&[tool("1x", "d", obj)]), vec![ManifestRule::BadName("1x".into())]);
        assert_eq!(
            check_manifest(&[tool("a", "d", obj), tool("a", "d", obj)]),
            vec![ManifestRule::DuplicateName("a".into())]
        );
        assert_eq!(check_manifest(&[tool("a", "  ", obj)]), vec![ManifestRule::EmptyDescription("a".into())]);
        assert!(matches!(&check_manifest(&[tool("a", "d", "[]")])[..], [ManifestRule::BadSchema { .. }]));
        assert!(matches!(&check_manifest(&[tool("a", "d", "{")])[..], [ManifestRule::BadSchema { .. }]));
        assert!(matches!(
            &check_manifest(&[tool("a", "d", r#"{"type":"string"}"#)])[..],
            [ManifestRule::BadSchema { .. }]
        ));
        let mut slow = tool("a", "d", obj);
        slow.timeout_ms = u32::MAX;
        assert_eq!(check_manifest(&[slow]), vec![ManifestRule::TimeoutTooLong("a".into())]);
    }

    #[test]
    fn default_timeout_is_sixty_seconds() {
        assert_eq!(tool_timeout(&tool("a", "d", "{}")), std::time::Duration::from_secs(60));
    }
}
