//! Model and effort through ACP session config options. ACP v1 has no
//! `session/set_model` (it is unstable and absent from the schema this crate
//! pins); the stable way is a `select` config option of category `model`
//! (and `thought_level` for reasoning effort), set with
//! `session/set_config_option`. Agents that offer neither keep their own
//! defaults, which is reported, not an error.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelectOption,
    SessionConfigSelectOptions,
};
use pedelec_protocol::pb;

/// One `session/set_config_option` to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub config_id: String,
    pub value: String,
    /// For the transcript: `model` or `effort`.
    pub what: &'static str,
}

fn values(kind: &SessionConfigKind) -> Option<(String, Vec<&SessionConfigSelectOption>)> {
    let SessionConfigKind::Select(select) = kind else { return None };
    let all = match &select.options {
        SessionConfigSelectOptions::Ungrouped(options) => options.iter().collect(),
        SessionConfigSelectOptions::Grouped(groups) => groups.iter().flat_map(|g| g.options.iter()).collect(),
        _ => Vec::new(),
    };
    Some((select.current_value.0.to_string(), all))
}

fn select_of<'a>(
    options: &'a [SessionConfigOption],
    category: &SessionConfigOptionCategory,
) -> Option<(&'a SessionConfigOption, String, Vec<&'a SessionConfigSelectOption>)> {
    options.iter().filter(|o| o.category.as_ref() == Some(category)).find_map(|o| {
        let (current, values) = values(&o.kind)?;
        Some((o, current, values))
    })
}

/// What to set so the session runs `model` at `effort`, and notes for what
/// cannot be honoured.
pub fn choices(options: &[SessionConfigOption], model: &str, effort: pb::EffortLevel) -> (Vec<Choice>, Vec<String>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    if !model.is_empty() {
        match select_of(options, &SessionConfigOptionCategory::Model) {
            Some((option, current, values)) => {
                let found = values
                    .iter()
                    .find(|v| v.value.0.as_ref() == model)
                    .or_else(|| values.iter().find(|v| v.name.eq_ignore_ascii_case(model)));
                match found {
                    Some(v) if v.value.0.as_ref() == current => {}
                    Some(v) => out.push(Choice {
                        config_id: option.id.0.to_string(),
                        value: v.value.0.to_string(),
                        what: "model",
                    }),
                    None => {
                        let offered: Vec<&str> = values.iter().map(|v| v.value.0.as_ref()).collect();
                        notes.push(format!(
                            "the agent offers no model {model:?} (it has {}); it keeps {current:?}",
                            offered.join(", ")
                        ));
                    }
                }
            }
            None => notes.push(format!("the agent has no model option; model {model:?} is not applied")),
        }
    }
    let wanted = match effort {
        pb::EffortLevel::Low => Some(["low", "minimal"]),
        pb::EffortLevel::High => Some(["high", "max"]),
        pb::EffortLevel::Default | pb::EffortLevel::Unspecified => None,
    };
    if let Some(words) = wanted {
        let found =
            select_of(options, &SessionConfigOptionCategory::ThoughtLevel).and_then(|(option, current, values)| {
                let value = words.iter().find_map(|word| {
                    values.iter().find(|v| {
                        v.value.0.to_ascii_lowercase().contains(word) || v.name.to_ascii_lowercase().contains(word)
                    })
                })?;
                Some((option, current, value.value.0.to_string()))
            });
        match found {
            Some((_, current, value)) if value == current => {}
            Some((option, _, value)) => out.push(Choice { config_id: option.id.0.to_string(), value, what: "effort" }),
            None => notes
                .push(format!("the agent has no matching thought-level option; effort {} is not applied", words[0])),
        }
    }
    (out, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options() -> Vec<SessionConfigOption> {
        serde_json::from_value(json!([
            { "id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "ask",
              "options": [{ "value": "ask", "name": "Ask" }] },
            { "id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "sonnet",
              "options": [{ "group": "anthropic", "name": "Anthropic", "options": [
                  { "value": "sonnet", "name": "Claude Sonnet" }, { "value": "opus", "name": "Claude Opus" }] }] },
            { "id": "reasoning", "name": "Reasoning", "category": "thought_level", "type": "select",
              "currentValue": "medium",
              "options": [{ "value": "low", "name": "Low" }, { "value": "medium", "name": "Medium" },
                          { "value": "high", "name": "High" }] }
        ]))
        .unwrap()
    }

    #[test]
    fn model_and_effort_map_onto_config_options() {
        let (set, notes) = choices(&options(), "Claude Opus", pb::EffortLevel::High);
        assert_eq!(
            set,
            vec![
                Choice { config_id: "model".into(), value: "opus".into(), what: "model" },
                Choice { config_id: "reasoning".into(), value: "high".into(), what: "effort" },
            ]
        );
        assert!(notes.is_empty());
    }

    #[test]
    fn current_values_and_defaults_send_nothing() {
        assert_eq!(choices(&options(), "sonnet", pb::EffortLevel::Default), (vec![], vec![]));
        assert_eq!(choices(&options(), "", pb::EffortLevel::Unspecified), (vec![], vec![]));
    }

    #[test]
    fn what_cannot_be_applied_is_a_note() {
        let (set, notes) = choices(&options(), "gpt-9", pb::EffortLevel::Low);
        assert_eq!(set, vec![Choice { config_id: "reasoning".into(), value: "low".into(), what: "effort" }]);
        assert_eq!(notes, vec!["the agent offers no model \"gpt-9\" (it has sonnet, opus); it keeps \"sonnet\""]);
        let (set, notes) = choices(&[], "m", pb::EffortLevel::High);
        assert!(set.is_empty());
        assert_eq!(notes.len(), 2, "{notes:?}");
    }
}
