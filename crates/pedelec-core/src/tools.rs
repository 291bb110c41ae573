//! A session's frontend tools: the manifest, validated and compiled at create.

use std::collections::HashMap;
use std::sync::Arc;

use pedelec_protocol::{ErrorCode, pb, tools::check_manifest};

use crate::error::{CoreError, CoreResult};

/// Tools with their compiled argument schemas.
pub struct ToolSet {
    pub definitions: Vec<pb::ToolDefinition>,
    validators: HashMap<String, (usize, jsonschema::Validator)>,
}

impl ToolSet {
    /// Checks every manifest rule and compiles each schema; all broken rules
    /// are reported together as `TOOLS_MANIFEST_INVALID`.
    pub fn compile(definitions: Vec<pb::ToolDefinition>) -> CoreResult<Arc<Self>> {
        let mut problems: Vec<serde_json::Value> = check_manifest(&definitions)
            .into_iter()
            .map(|rule| serde_json::json!({ "tool": rule.tool(), "problem": rule.to_string() }))
            .collect();
        let mut validators = HashMap::new();
        if problems.is_empty() {
            for (index, tool) in definitions.iter().enumerate() {
                let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
                match jsonschema::validator_for(&schema) {
                    Ok(v) => {
                        validators.insert(tool.name.clone(), (index, v));
                    }
                    Err(e) => problems.push(serde_json::json!({
                        "tool": tool.name,
                        "problem": format!("schema does not compile: {e}"),
                    })),
                }
            }
        }
        if !problems.is_empty() {
            let summary = problems.iter().filter_map(|p| p["problem"].as_str()).collect::<Vec<_>>().join("; ");
            return Err(CoreError::with_details(
                ErrorCode::ToolsManifestInvalid,
                format!("invalid tool manifest: {summary}"),
                serde_json::json!({ "problems": problems }),
            ));
        }
        Ok(Arc::new(ToolSet { definitions, validators }))
    }

    /// Validates a call: the tool exists and its arguments satisfy its schema.
    pub fn check_call(&self, tool: &str, args_json: &str) -> Result<&pb::ToolDefinition, pb::Error> {
        let Some((index, validator)) = self.validators.get(tool) else {
            return Err(pb::Error::new(ErrorCode::ToolNotFound, format!("no frontend tool named {tool:?}")));
        };
        let args: serde_json::Value = serde_json::from_str(args_json)
            .map_err(|e| pb::Error::new(ErrorCode::ToolArgsInvalid, format!("arguments are not JSON: {e}")))?;
        let errors: Vec<String> = validator.iter_errors(&args).map(|e| format!("{}: {e}", e.instance_path())).collect();
        if !errors.is_empty() {
            return Err(pb::Error::with_details(
                ErrorCode::ToolArgsInvalid,
                format!("arguments for {tool} do not match its schema: {}", errors.join("; ")),
                &serde_json::json!({ "errors": errors }),
            ));
        }
        Ok(&self.definitions[*index])
    }
}
