//! How `session/request_permission` is answered. Nobody sits at a terminal
//! to approve an ACP agent's actions, and the prompts come from a web page,
//! so the answer is a fixed policy (the counterpart of the codex adapter's
//! `workspace-write` sandbox and the claude adapter's `--allowedTools
//! mcp__pedelec`):
//!
//! 1. The session's own frontend tools (the `pedelec` MCP server): allowed —
//!    Core validates every call and the application's handler decides.
//! 2. Side-effect-free kinds (`think`, `switch_mode`): allowed.
//! 3. File kinds (`read`, `edit`, `delete`, `move`, `search`): allowed only
//!    when the call names at least one location and every location is inside
//!    the session's workspace (`workspace::resolves_inside`: `.`/`..` folded
//!    against the workspace, the agent's cwd, and symlinks resolved, so a
//!    link the agent made inside that points out is outside).
//! 4. Everything else — `execute`, `fetch`, `other`, anything unrecognised —
//!    is rejected: a command line or a URL cannot be confined to the workspace.
//!
//! Allowing picks `allow_once` (else `allow_always`); rejecting picks
//! `reject_once` (else `reject_always`); with no option of the wanted kind the
//! answer is `cancelled`. Options are chosen by kind, never by position.

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, ToolKind,
};

use pedelec_protocol::pb;

use super::updates::raw_server;
use crate::providers::MCP_SERVER_NAME;
use crate::providers::PermissionAnswer;

/// What the policy needs to know about the session.
#[derive(Debug, Clone)]
pub struct PermissionPolicy {
    pub workspace: PathBuf,
    /// The session's frontend tool names.
    pub tools: Vec<String>,
}

/// The decision and how it is reported in the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The chosen option's kind (`allow_once`, …) or `cancelled`.
    pub outcome: String,
    pub response: RequestPermissionResponse,
    /// What the request was about (its title, else its tool call id).
    pub title: String,
}

impl PermissionPolicy {
    fn inside_workspace(&self, path: &Path) -> bool {
        path.to_str().is_some_and(|path| crate::workspace::resolves_inside(&self.workspace, path))
    }

    /// Whether the call is one of the session's frontend tools. Agents name
    /// MCP tools in their own ways (`mcp__pedelec__t`, `t (pedelec MCP
    /// Server)`, `pedelec/t`, `Tool: pedelec/t`, or just `t`), so each
    /// spelling counts — a bare `t` only for a call of kind `other`, so a
    /// tool named like a shell command does not open the door to `execute`.
    /// codex-acp 0.16 titles its request `Approve MCP tool call` with no kind
    /// or name and says which server in `rawInput.server_name`; a request of
    /// kind `other` naming our server there is ours.
    fn is_frontend_tool(&self, names: &[&str], kind: ToolKind, raw_input: Option<&serde_json::Value>) -> bool {
        if kind == ToolKind::Other && raw_input.and_then(raw_server) == Some(MCP_SERVER_NAME) {
            return true;
        }
        names.iter().any(|name| {
            let lower = name.to_ascii_lowercase();
            let lower = lower.strip_prefix("tool: ").unwrap_or(&lower);
            lower.contains(&format!("mcp__{MCP_SERVER_NAME}__"))
                || lower.contains(&format!("({MCP_SERVER_NAME} mcp"))
                || lower.starts_with(&format!("{MCP_SERVER_NAME}/"))
                || (kind == ToolKind::Other && self.tools.iter().any(|t| name == t))
        })
    }

    pub fn decide(&self, request: &RequestPermissionRequest) -> Decision {
        let fields = &request.tool_call.fields;
        let title = fields.title.clone().unwrap_or_else(|| request.tool_call.tool_call_id.0.to_string());
        let names: Vec<&str> = [fields.title.as_deref(), fields.name.as_deref()].into_iter().flatten().collect();
        let locations: Vec<&Path> = fields.locations.iter().flatten().map(|l| l.path.as_path()).collect();
        let kind = fields.kind.unwrap_or(ToolKind::Other);
        let allowed = if self.is_frontend_tool(&names, kind, fields.raw_input.as_ref()) {
            true
        } else {
            match kind {
                ToolKind::Think | ToolKind::SwitchMode => true,
                ToolKind::Read | ToolKind::Edit | ToolKind::Delete | ToolKind::Move | ToolKind::Search => {
                    !locations.is_empty() && locations.iter().all(|p| self.inside_workspace(p))
                }
                _ => false,
            }
        };
        let preference: &[PermissionOptionKind] = if allowed {
            &[PermissionOptionKind::AllowOnce, PermissionOptionKind::AllowAlways]
        } else {
            &[PermissionOptionKind::RejectOnce, PermissionOptionKind::RejectAlways]
        };
        let chosen = preference
            .iter()
            .find_map(|kind| request.options.iter().find(|o| o.kind == *kind).map(|o| (kind, o.option_id.clone())));
        let (outcome, response) = match chosen {
            Some((kind, id)) => (
                serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                RequestPermissionResponse::new(RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))),
            ),
            None => ("cancelled".to_owned(), RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)),
        };
        Decision { allowed, outcome, response, title }
    }
}

/// The answer to a request for no session of ours: a rejection where the
/// agent offers one, else cancelled.
pub fn refuse_all(request: &RequestPermissionRequest) -> RequestPermissionResponse {
    let reject = [PermissionOptionKind::RejectOnce, PermissionOptionKind::RejectAlways]
        .iter()
        .find_map(|kind| request.options.iter().find(|o| o.kind == *kind).map(|o| o.option_id.clone()));
    match reject {
        Some(id) => {
            RequestPermissionResponse::new(RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)))
        }
        None => RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled),
    }
}

/// The request as the application sees it (`PERMISSION_MODE_APP`): what it
/// is about as an activity, the agent's options, and the option this policy
/// would choose (what an SDK without a handler answers).
pub fn to_app(request: &RequestPermissionRequest, decision: &Decision) -> pb::PermissionRequest {
    let fields = &request.tool_call.fields;
    let kind = fields.kind.unwrap_or(ToolKind::Other);
    let mut activity = crate::providers::activity(
        request.tool_call.tool_call_id.0.to_string(),
        super::updates::activity_kind(kind),
        decision.title.clone(),
    );
    activity.status = pb::ActivityStatus::Pending as i32;
    if kind == ToolKind::Execute {
        activity.command = super::updates::command_of(fields.raw_input.as_ref());
    }
    activity.paths = fields.locations.iter().flatten().map(|l| l.path.display().to_string()).collect();
    let options = request
        .options
        .iter()
        .map(|o| pb::PermissionOption {
            option_id: o.option_id.0.to_string(),
            name: o.name.clone(),
            kind: match o.kind {
                PermissionOptionKind::AllowOnce => pb::PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways => pb::PermissionOptionKind::AllowAlways,
                PermissionOptionKind::RejectOnce => pb::PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways => pb::PermissionOptionKind::RejectAlways,
                _ => pb::PermissionOptionKind::Unspecified,
            } as i32,
        })
        .collect();
    let policy_option_id = match &decision.response.outcome {
        RequestPermissionOutcome::Selected(selected) => selected.option_id.0.to_string(),
        _ => String::new(),
    };
    pb::PermissionRequest {
        permission_id: String::new(),
        activity: Some(pedelec_protocol::activity::bounded(activity)),
        options,
        policy_option_id,
        deadline_at_ms: 0,
        // Core decides when it asks (Session::ask_permission).
        user_only: false,
    }
}

/// The agent's answer from the application's: the chosen option; a
/// rejection picks the agent's reject option (`cancelled` without one); an
/// operation that ended answers `cancelled` (as ACP asks after
/// `session/cancel`); no turn to ask for falls back to the policy.
pub fn from_app(
    request: &RequestPermissionRequest,
    answer: Result<PermissionAnswer, pb::Error>,
    policy: Decision,
) -> Decision {
    let select = |id: agent_client_protocol::v1::schema::PermissionOptionId| {
        RequestPermissionResponse::new(RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)))
    };
    let label = |kind: PermissionOptionKind| {
        serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    };
    let cancelled = || RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled);
    let title = policy.title.clone();
    match answer {
        Err(_) => policy,
        Ok(PermissionAnswer::Selected(id)) => match request.options.iter().find(|o| o.option_id.0.as_ref() == id) {
            Some(option) => Decision {
                allowed: matches!(option.kind, PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways),
                outcome: label(option.kind),
                response: select(option.option_id.clone()),
                title,
            },
            None => Decision { allowed: false, outcome: "cancelled".into(), response: cancelled(), title },
        },
        Ok(PermissionAnswer::Rejected) => {
            let reject = [PermissionOptionKind::RejectOnce, PermissionOptionKind::RejectAlways]
                .iter()
                .find_map(|kind| request.options.iter().find(|o| o.kind == *kind));
            match reject {
                Some(option) => Decision {
                    allowed: false,
                    outcome: label(option.kind),
                    response: select(option.option_id.clone()),
                    title,
                },
                None => Decision { allowed: false, outcome: "cancelled".into(), response: cancelled(), title },
            }
        }
        Ok(PermissionAnswer::Cancelled) => {
            Decision { allowed: false, outcome: "cancelled".into(), response: cancelled(), title }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> PermissionPolicy {
        PermissionPolicy { workspace: PathBuf::from("/home/u/ws"), tools: vec!["update_counter".into()] }
    }

    fn ask(tool_call: serde_json::Value, options: &[&str]) -> Decision {
        let options: Vec<_> = options
            .iter()
            .enumerate()
            .map(|(i, kind)| json!({ "optionId": format!("o{i}"), "name": kind, "kind": kind }))
            .collect();
        let request: RequestPermissionRequest =
            serde_json::from_value(json!({ "sessionId": "s", "toolCall": tool_call, "options": options })).unwrap();
        policy().decide(&request)
    }

    const ALL: &[&str] = &["reject_once", "allow_always", "allow_once", "reject_always"];

    #[test]
    fn frontend_tools_are_allowed_once_whatever_the_spelling() {
        for title in
            ["mcp__pedelec__update_counter", "update_counter (pedelec MCP Server)", "pedelec/x", "update_counter"]
        {
            let d = ask(json!({ "toolCallId": "1", "title": title, "kind": "other" }), ALL);
            assert_eq!((d.allowed, d.outcome.as_str()), (true, "allow_once"), "{title}");
            assert_eq!(
                serde_json::to_value(&d.response).unwrap(),
                json!({ "outcome": { "outcome": "selected", "optionId": "o2" } }),
                "chosen by kind, not position"
            );
        }
    }

    #[test]
    fn codex_acp_approval_requests_for_our_server_are_allowed() {
        // The shape codex-acp 0.16.0 sends for an MCP tool of ours.
        let ours = json!({ "toolCallId": "call_1", "title": "Approve MCP tool call",
                           "rawInput": { "server_name": "pedelec", "tool_name": "update_counter" } });
        let d = ask(ours, ALL);
        assert_eq!((d.allowed, d.outcome.as_str()), (true, "allow_once"));
        let theirs = json!({ "toolCallId": "call_1", "title": "Approve MCP tool call",
                             "rawInput": { "server_name": "filesystem" } });
        assert!(!ask(theirs, ALL).allowed, "another MCP server is not ours");
        let as_command = json!({ "toolCallId": "call_1", "title": "x", "kind": "execute",
                                 "rawInput": { "server_name": "pedelec" } });
        assert!(!ask(as_command, ALL).allowed, "a command does not become ours by naming the server");
        let titled = json!({ "toolCallId": "call_1", "title": "Tool: pedelec/update_counter" });
        assert!(ask(titled, ALL).allowed);
    }

    #[test]
    fn commands_fetches_and_unknown_kinds_are_rejected() {
        for kind in ["execute", "fetch", "other"] {
            let d = ask(json!({ "toolCallId": "1", "title": "rm -rf ~", "kind": kind }), ALL);
            assert_eq!((d.allowed, d.outcome.as_str()), (false, "reject_once"), "{kind}");
        }
        let d = ask(json!({ "toolCallId": "1", "title": "curl x" }), ALL);
        assert!(!d.allowed, "no kind means other");
        let d = ask(json!({ "toolCallId": "1", "title": "update_counter", "kind": "execute" }), ALL);
        assert!(!d.allowed, "a bare frontend tool name does not vouch for a command");
    }

    #[test]
    fn file_work_is_allowed_inside_the_workspace_only() {
        let at = |kind: &str, path: &str| {
            ask(json!({ "toolCallId": "1", "title": "f", "kind": kind, "locations": [{ "path": path }] }), ALL).allowed
        };
        assert!(at("edit", "/home/u/ws/src/lib.rs"));
        assert!(at("read", "src/lib.rs"), "relative to the workspace");
        assert!(at("search", "/home/u/ws"));
        assert!(!at("edit", "/home/u/ws/../.ssh/id_ed25519"));
        assert!(!at("read", "../ws-other/secret"));
        assert!(!at("delete", "/etc/passwd"));
        assert!(!at("read", "/home/u/wsx/a"), "a sibling sharing the prefix is outside");
        let d = ask(json!({ "toolCallId": "1", "title": "read something", "kind": "read" }), ALL);
        assert!(!d.allowed, "a file kind without a location cannot be checked");
        assert!(ask(json!({ "toolCallId": "1", "title": "ponder", "kind": "think" }), ALL).allowed);
    }

    #[test]
    fn missing_options_fall_back_then_cancel() {
        let d = ask(json!({ "toolCallId": "1", "title": "pedelec/x" }), &["allow_always", "reject_once"]);
        assert_eq!(d.outcome, "allow_always");
        let d = ask(json!({ "toolCallId": "1", "title": "pedelec/x" }), &["reject_once"]);
        assert_eq!(d.outcome, "cancelled");
        assert_eq!(serde_json::to_value(&d.response).unwrap(), json!({ "outcome": { "outcome": "cancelled" } }));
        let d = ask(json!({ "toolCallId": "1", "title": "ls", "kind": "execute" }), &["allow_once"]);
        assert_eq!((d.allowed, d.outcome.as_str()), (false, "cancelled"));
    }

    /// A link the agent made inside its workspace that points out is
    /// outside: the policy resolves it (a lexical check would allow it).
    #[cfg(unix)]
    #[test]
    fn a_symlink_inside_the_workspace_that_points_out_is_outside() {
        let area = tempfile::tempdir().unwrap();
        let workspace = area.path().join("ws");
        std::fs::create_dir_all(workspace.join("src")).unwrap();
        std::fs::create_dir_all(area.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(area.path().join("outside"), workspace.join("escape")).unwrap();
        let policy = PermissionPolicy { workspace: workspace.clone(), tools: Vec::new() };
        let at = |path: &str| {
            let tool_call = json!({ "toolCallId": "1", "title": "f", "kind": "edit", "locations": [{ "path": path }] });
            let options: Vec<_> =
                ALL.iter().map(|kind| json!({ "optionId": kind, "name": kind, "kind": kind })).collect();
            let request: RequestPermissionRequest =
                serde_json::from_value(json!({ "sessionId": "s", "toolCall": tool_call, "options": options })).unwrap();
            policy.decide(&request).allowed
        };
        assert!(at("src/lib.rs"));
        assert!(at(&workspace.join("new/file.txt").display().to_string()), "a file not yet made, inside");
        assert!(!at("escape/authorized_keys"));
        assert!(!at(&workspace.join("escape/x").display().to_string()));
    }
}
