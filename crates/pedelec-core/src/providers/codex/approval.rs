//! codex's server requests (approvals and the rest), sans IO: what the
//! application is asked, what the policy answers, and the JSON answer.
//!
//! The thread runs in the `workspace-write` sandbox with approval policy
//! `never` (no asker: Core's policy) or `on-request` (the application
//! answers): codex then asks only for what the sandbox would not allow — a
//! command the model wants run outside it, a file change it cannot make in
//! place. So the policy, like the ACP adapter's, declines every command
//! escalation and allows a file change only when every path it names is in
//! the workspace. Our MCP tools never ask (`default_tools_approval_mode =
//! "approve"`). Requests Pedelec does not serve (user input for a tool,
//! dynamic tools, ChatGPT token refresh, attestation) are refused with a
//! JSON-RPC error, so codex never waits on one.

use std::path::Path;

use pedelec_protocol::pb;
use serde_json::{Value, json};

use crate::providers::PermissionAnswer;
use crate::providers::cli_turn::{clip, str_field as text};

/// "Method not found": a server request Pedelec does not serve.
pub const NOT_SERVED: i64 = -32601;

/// What a server request needs from us.
#[derive(Debug, Clone, PartialEq)]
pub enum Handling {
    /// A permission question: the application's (when it answers) or the policy's.
    Ask(Ask),
    /// Answered at once, whoever answers permissions.
    Answer(Value),
    /// Refused: not served by Pedelec.
    Refuse(String),
}

/// An approval request as a permission question.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// What it is about (a command, a file change), as a pending activity.
    pub activity: pb::Activity,
    /// The decisions offered: (codex's decision, its label, its kind).
    pub options: Vec<(String, String, pb::PermissionOptionKind)>,
    /// The decision Core's policy takes.
    pub policy: String,
}

/// The decisions a request offers (`availableDecisions`, sent by 0.171 though
/// not in its schema), as far as they are plain strings; else `default`.
fn offered(params: &Value, default: &[&str]) -> Vec<String> {
    match params.get("availableDecisions").and_then(Value::as_array) {
        Some(listed) => listed.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        None => default.iter().map(|d| (*d).to_owned()).collect(),
    }
}

/// The options the application sees: the offered decisions it can pick,
/// and always `decline` (every approval takes it, offered or not).
fn options(decisions: &[String]) -> Vec<(String, String, pb::PermissionOptionKind)> {
    use pb::PermissionOptionKind as K;
    let mut out: Vec<_> = decisions
        .iter()
        .filter_map(|d| match d.as_str() {
            "accept" => Some((d.clone(), "Allow once".to_owned(), K::AllowOnce)),
            "acceptForSession" => Some((d.clone(), "Allow for this session".to_owned(), K::AllowAlways)),
            _ => None,
        })
        .collect();
    out.push(("decline".into(), "Decline".into(), K::RejectOnce));
    out
}

/// How a server request is handled. `paths` are the file paths of the item
/// the request is about, as its `item/started` named them.
pub fn handling(method: &str, params: &Value, workspace: &Path, paths: &[String]) -> Handling {
    let item_id = text(params, "itemId");
    match method {
        "item/commandExecution/requestApproval" => {
            let command_line = text(params, "command");
            let reason = text(params, "reason");
            let title = if command_line.is_empty() { reason.clone() } else { clip(&command_line, 300) };
            let mut activity = crate::providers::activity(item_id, pb::ActivityKind::Command, title);
            activity.status = pb::ActivityStatus::Pending as i32;
            activity.command = command_line;
            activity.output = reason;
            let decisions = offered(params, &["accept", "acceptForSession", "decline"]);
            Handling::Ask(Ask { activity, options: options(&decisions), policy: "decline".into() })
        }
        "item/fileChange/requestApproval" => {
            let grant_root = text(params, "grantRoot");
            let mut activity = crate::providers::activity(item_id, pb::ActivityKind::FileEdit, "File changes");
            activity.status = pb::ActivityStatus::Pending as i32;
            activity.paths = paths.to_vec();
            if !grant_root.is_empty() {
                activity.paths.push(grant_root.clone());
            }
            activity.output = text(params, "reason");
            let confined = grant_root.is_empty()
                && !paths.is_empty()
                && paths.iter().all(|p| crate::workspace::resolves_inside(workspace, p));
            let policy = if confined { "accept" } else { "decline" };
            let decisions = offered(params, &["accept", "acceptForSession", "decline"]);
            Handling::Ask(Ask { activity, options: options(&decisions), policy: policy.into() })
        }
        // More sandbox (network, paths) for the rest of a turn: granted
        // nothing; the sandbox is the session's.
        "item/permissions/requestApproval" => Handling::Answer(json!({ "permissions": {}, "scope": "turn" })),
        // An MCP server asking the user something: no one to ask.
        "mcpServer/elicitation/request" => {
            Handling::Answer(json!({ "action": "decline", "content": null, "_meta": null }))
        }
        other => Handling::Refuse(format!("{other} is not served by Pedelec")),
    }
}

/// The question as the application sees it (`PERMISSION_MODE_APP`).
pub fn to_app(ask: &Ask) -> pb::PermissionRequest {
    pb::PermissionRequest {
        permission_id: String::new(),
        activity: Some(pedelec_protocol::activity::bounded(ask.activity.clone())),
        options: ask
            .options
            .iter()
            .map(|(id, name, kind)| pb::PermissionOption {
                option_id: id.clone(),
                name: name.clone(),
                kind: *kind as i32,
            })
            .collect(),
        policy_option_id: ask.policy.clone(),
        deadline_at_ms: 0,
        // Core decides when it asks (Session::ask_permission).
        user_only: false,
    }
}

/// codex's decision from the application's answer: the chosen option; a
/// rejection `decline`; an operation that ended `cancel` (codex then ends
/// the turn); no turn to ask for, the policy.
pub fn decision(ask: &Ask, answer: Result<PermissionAnswer, pb::Error>) -> String {
    match answer {
        Err(_) => ask.policy.clone(),
        Ok(PermissionAnswer::Selected(id)) if ask.options.iter().any(|(option, _, _)| *option == id) => id,
        Ok(PermissionAnswer::Selected(_) | PermissionAnswer::Rejected) => "decline".into(),
        Ok(PermissionAnswer::Cancelled) => "cancel".into(),
    }
}

/// The answer to an approval request.
pub fn approval_result(decision: &str) -> Value {
    json!({ "decision": decision })
}

/// The transcript's record of how a question was answered.
pub fn answered(ask: &Ask, decision: &str) -> pb::Activity {
    let title = ask.activity.title.clone();
    let id = format!("permission-{}", ask.activity.activity_id);
    let mut activity = crate::providers::activity(id, pb::ActivityKind::Permission, title);
    let allowed = decision.starts_with("accept");
    activity.status = if allowed { pb::ActivityStatus::Completed } else { pb::ActivityStatus::Failed } as i32;
    activity.output = decision.to_owned();
    activity
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "/home/u/ws";

    fn ask(method: &str, params: Value, paths: &[&str]) -> Handling {
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        handling(method, &params, Path::new(WS), &paths)
    }

    /// The request codex 0.171 sent (approval policy `on-request`) for a
    /// model's `exec_command` with `sandbox_permissions: require_escalated`.
    fn recorded_command() -> Value {
        serde_json::from_str(r#"{"kind":"command","threadId":"01a24a68-4f8c-7c32-a30d-8c10953fe3ae","turnId":"01a24a68-4fad-76f3-9bcd-5be2eba3e8f8","itemId":"call_4","startedAtMs":1796544680011,"environmentId":"local","reason":"The user asked for this file.","command":"/bin/bash -lc \"printf '%s' 'written by the model server' > '/tmp/outside/onreq.txt'\"","cwd":"/tmp/rec/ws","commandActions":[{"type":"unknown","command":"printf '%s' 'written by the model server' > '/tmp/outside/onreq.txt'"}],"proposedExecpolicyAmendment":["/bin/bash","-lc","printf '%s' 'written by the model server' > '/tmp/outside/onreq.txt'"],"availableDecisions":["accept",{"acceptWithExecpolicyAmendment":{"execpolicy_amendment":["/bin/bash","-lc","printf '%s' 'written by the model server' > '/tmp/outside/onreq.txt'"]}},"cancel"]}"#).unwrap()
    }

    #[test]
    fn a_command_escalation_is_declined_by_the_policy_and_asked_of_the_app() {
        let Handling::Ask(ask) = ask("item/commandExecution/requestApproval", recorded_command(), &[]) else {
            panic!("a command approval is a question")
        };
        assert_eq!(ask.policy, "decline");
        assert!(ask.activity.command.contains("/tmp/outside/onreq.txt"));
        assert_eq!(ask.activity.output, "The user asked for this file.");
        let kinds: Vec<_> = ask.options.iter().map(|(id, _, kind)| (id.as_str(), *kind)).collect();
        assert_eq!(
            kinds,
            [("accept", pb::PermissionOptionKind::AllowOnce), ("decline", pb::PermissionOptionKind::RejectOnce)],
            "only plain offered decisions, and decline always"
        );
        let request = to_app(&ask);
        assert_eq!(request.policy_option_id, "decline");
        assert_eq!(request.activity.unwrap().status, pb::ActivityStatus::Pending as i32);
        assert_eq!(decision(&ask, Ok(PermissionAnswer::Selected("accept".into()))), "accept");
        assert_eq!(decision(&ask, Ok(PermissionAnswer::Selected("acceptForSession".into()))), "decline");
        assert_eq!(decision(&ask, Ok(PermissionAnswer::Rejected)), "decline");
        assert_eq!(decision(&ask, Ok(PermissionAnswer::Cancelled)), "cancel");
        assert_eq!(decision(&ask, Err(pb::Error::default())), "decline");
    }

    #[test]
    fn file_changes_are_allowed_by_the_policy_inside_the_workspace_only() {
        let policy = |paths: &[&str], params: Value| match ask("item/fileChange/requestApproval", params, paths) {
            Handling::Ask(ask) => ask.policy,
            other => panic!("{other:?}"),
        };
        let plain = json!({"threadId":"th","turnId":"tu","itemId":"p1"});
        assert_eq!(policy(&["/home/u/ws/src/lib.rs", "notes.md"], plain.clone()), "accept");
        assert_eq!(policy(&["/home/u/ws/../.ssh/id"], plain.clone()), "decline");
        assert_eq!(policy(&["/home/u/wsx/a"], plain.clone()), "decline");
        assert_eq!(policy(&[], plain), "decline", "no paths cannot be checked");
        let root = json!({"threadId":"th","turnId":"tu","itemId":"p1","grantRoot":"/"});
        assert_eq!(policy(&["/home/u/ws/a"], root), "decline", "a wider write root is not the workspace");
    }

    /// A link the agent made inside its workspace that points out is outside.
    #[cfg(unix)]
    #[test]
    fn a_file_change_through_a_symlink_out_of_the_workspace_is_declined() {
        let area = tempfile::tempdir().unwrap();
        let workspace = area.path().join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(area.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(area.path().join("outside"), workspace.join("escape")).unwrap();
        let plain = json!({"threadId":"th","turnId":"tu","itemId":"p1"});
        let policy = |path: &str| match handling("item/fileChange/requestApproval", &plain, &workspace, &[path.into()])
        {
            Handling::Ask(ask) => ask.policy,
            other => panic!("{other:?}"),
        };
        assert_eq!(policy("notes.md"), "accept");
        assert_eq!(policy("escape/authorized_keys"), "decline");
        assert_eq!(policy(&workspace.join("escape/x").display().to_string()), "decline");
    }

    #[test]
    fn requests_not_served_never_leave_codex_waiting() {
        assert!(matches!(ask("item/tool/requestUserInput", json!({}), &[]), Handling::Refuse(_)));
        assert!(matches!(ask("account/chatgptAuthTokens/refresh", json!({}), &[]), Handling::Refuse(_)));
        assert_eq!(
            ask("mcpServer/elicitation/request", json!({"serverName":"x"}), &[]),
            Handling::Answer(json!({"action": "decline", "content": null, "_meta": null}))
        );
        assert_eq!(
            ask("item/permissions/requestApproval", json!({}), &[]),
            Handling::Answer(json!({"permissions": {}, "scope": "turn"}))
        );
    }
}
