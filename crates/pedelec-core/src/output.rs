//! Typed results (`SendText.output_schema_json`): the schema a turn's final
//! answer must satisfy, what the agent is told, and reading the answer.
//!
//! Every agent answers in text, so Core reads the turn's last message as
//! JSON: the message alone, or the one ```json fence in it (models wrap
//! JSON in a fence however they are asked). Agents with a native way to
//! constrain their answer (codex's output schema, an OpenAI-compatible
//! `response_format`) get the schema itself through `TurnRequest`; every
//! agent also gets [`OutputSchema::instruction`] after the user's text, so
//! one rule holds whatever the agent.

use std::sync::Arc;

use pedelec_protocol::{ErrorCode, limits};

use crate::error::{CoreError, CoreResult};

/// The answer text kept in `OUTPUT_INVALID`'s details.
const MAX_ANSWER_IN_DETAILS: usize = 4 * 1024;
/// Schema errors listed, at most.
const MAX_ERRORS: usize = 16;

/// A compiled output schema.
pub struct OutputSchema {
    pub schema: serde_json::Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSchema").field("schema", &self.schema).finish()
    }
}

impl OutputSchema {
    /// `None` for an empty schema (a plain turn); `INVALID_ARGUMENT` for
    /// one too large, not JSON, not an object, or that does not compile.
    pub fn compile(json: &str) -> CoreResult<Option<Arc<Self>>> {
        if json.is_empty() {
            return Ok(None);
        }
        let invalid = |why: String| CoreError::new(ErrorCode::InvalidArgument, format!("output schema: {why}"));
        if json.len() > limits::MAX_OUTPUT_SCHEMA_BYTES {
            return Err(invalid(format!("larger than {} bytes", limits::MAX_OUTPUT_SCHEMA_BYTES)));
        }
        let schema: serde_json::Value =
            pedelec_protocol::json::from_json(json).map_err(|e| invalid(format!("not JSON: {e}")))?;
        if !schema.is_object() {
            return Err(invalid("must be a JSON object".into()));
        }
        let validator = jsonschema::validator_for(&schema).map_err(|e| invalid(format!("does not compile: {e}")))?;
        Ok(Some(Arc::new(OutputSchema { schema, validator })))
    }

    /// Added after the user's text: what to answer, in words every agent reads.
    pub fn instruction(&self) -> String {
        format!("\n\nAnswer with JSON only: one JSON value, no other text, matching this JSON Schema:\n{}", self.schema)
    }

    /// The second ask, after an answer that did not fit.
    pub fn retry(&self, errors: &[String]) -> String {
        format!(
            "Your last answer did not match the JSON Schema ({}). Answer again with JSON only: one JSON value, \
             no other text, matching this JSON Schema:\n{}",
            errors.join("; "),
            self.schema
        )
    }

    /// The answer as a value valid against the schema, or what is wrong.
    pub fn check(&self, answer: &str) -> Result<serde_json::Value, Vec<String>> {
        let value = parse_answer(answer).ok_or_else(|| vec!["the answer is not JSON".to_owned()])?;
        let errors: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(MAX_ERRORS)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
            })
            .collect();
        if errors.is_empty() { Ok(value) } else { Err(errors) }
    }

    /// `OUTPUT_INVALID` for an answer that still does not fit.
    pub fn refusal(answer: &str, errors: Vec<String>) -> crate::providers::ProviderFailure {
        let mut cut = answer.len().min(MAX_ANSWER_IN_DETAILS);
        while !answer.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut failure = crate::providers::ProviderFailure::coded(
            ErrorCode::OutputInvalid,
            format!("the answer does not match the output schema: {}", errors.join("; ")),
            false,
        );
        failure.details = serde_json::json!({ "errors": errors, "answer": &answer[..cut] });
        failure
    }
}

/// The JSON in an answer: the whole text, else the inside of its one
/// ```json (or bare ```) fence.
fn parse_answer(answer: &str) -> Option<serde_json::Value> {
    let text = answer.trim();
    if let Ok(value) = serde_json::from_str(text) {
        return Some(value);
    }
    let start = text.find("```")?;
    let after = &text[start + 3..];
    let body = after.strip_prefix("json").unwrap_or(after);
    let end = body.find("```")?;
    // Only one fence: with two, which one is the answer is a guess.
    if body[end + 3..].contains("```") {
        return None;
    }
    serde_json::from_str(body[..end].trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Arc<OutputSchema> {
        let json = r#"{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}"#;
        OutputSchema::compile(json).unwrap().unwrap()
    }

    #[test]
    fn answers_are_read_alone_or_from_one_fence() {
        let s = schema();
        assert_eq!(s.check(r#" {"n": 3} "#), Ok(serde_json::json!({"n": 3})));
        assert_eq!(s.check("Here it is:\n```json\n{\"n\": 4}\n```\n"), Ok(serde_json::json!({"n": 4})));
        assert_eq!(s.check("```\n{\"n\": 5}\n```"), Ok(serde_json::json!({"n": 5})));
        assert!(s.check("```json\n{\"n\": 1}\n``` or ```json\n{\"n\": 2}\n```").is_err(), "two fences: no guess");
        assert_eq!(s.check("three"), Err(vec!["the answer is not JSON".to_owned()]));
        let errors = s.check(r#"{"n": "x"}"#).unwrap_err();
        assert!(errors[0].starts_with("/n: "), "{errors:?}");
    }

    #[test]
    fn bad_schemas_are_invalid_arguments() {
        assert!(OutputSchema::compile("").unwrap().is_none());
        for bad in ["not json", "[1]", r#"{"type": 12}"#, &format!("{{\"description\": \"{}\"}}", "x".repeat(70_000))] {
            let error = OutputSchema::compile(bad).unwrap_err();
            assert_eq!(error.code(), ErrorCode::InvalidArgument, "{bad:.40}");
        }
    }

    #[test]
    fn the_refusal_keeps_a_bounded_answer() {
        let failure = OutputSchema::refusal(&"é".repeat(5_000), vec!["e".into()]);
        assert_eq!(failure.code, ErrorCode::OutputInvalid);
        assert!(failure.details["answer"].as_str().unwrap().len() <= MAX_ANSWER_IN_DETAILS);
    }
}
