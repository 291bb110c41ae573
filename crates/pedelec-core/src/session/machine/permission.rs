//! Permission requests the application answers (`PERMISSION_MODE_APP`): an
//! agent asks, the application chooses one of the offered options, or the
//! deadline, a cancel or the turn's end settles the request for it.

use pedelec_protocol::pb::{self, session_event::Kind};
use pedelec_protocol::{ErrorCode, OperationId, SessionStatus};

use super::*;

/// Who answers a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer {
    /// The session's application (its origin's pages or program).
    App,
    /// The person at the keyboard, through an owner call.
    User,
}

#[derive(Debug)]
pub(super) struct PendingPermission {
    pub request: pb::PermissionRequest,
    pub operation: OperationId,
}

impl SessionState {
    /// An agent asks for permission during the running turn. The request
    /// (its id and deadline set by the shell) is announced and waits for
    /// [`SessionState::answer_permission`]; `SESSION_BUSY` when no turn runs
    /// (the provider then falls back to its policy).
    pub fn ask_permission(
        &mut self,
        request: pb::PermissionRequest,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<(), pb::Error> {
        if self.status == SessionStatus::Ended {
            return Err(pb::Error::new(ErrorCode::SessionEnded, "the session has ended"));
        }
        let turn_running = self.status.is_active_turn();
        let Some(active) = self.active.as_mut().filter(|a| a.phase == Phase::Running && !a.cancelled && turn_running)
        else {
            return Err(pb::Error::new(ErrorCode::SessionBusy, "no turn is active to ask for"));
        };
        active.called_out = true;
        let operation = active.id.clone();
        self.permissions.push(PendingPermission { request: request.clone(), operation: operation.clone() });
        self.emit(operation.as_str(), Kind::PermissionRequested(request), now, out);
        Ok(())
    }

    /// The application's answer: one of the offered option ids, or empty to
    /// reject. `PERMISSION_REQUEST_NOT_FOUND` for an unknown or settled
    /// request, `INVALID_ARGUMENT` for an option it did not offer; neither
    /// changes anything.
    pub fn answer_permission(
        &mut self,
        permission_id: &str,
        option_id: &str,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        self.answer_permission_as(Answerer::App, permission_id, option_id, now, out)
    }

    /// [`SessionState::answer_permission`] by `answerer`: a `user_only`
    /// request refuses the application's answer (`ORIGIN_NOT_ALLOWED`,
    /// reason `user_only`) and changes nothing.
    pub fn answer_permission_as(
        &mut self,
        answerer: Answerer,
        permission_id: &str,
        option_id: &str,
        now: Now,
        out: &mut Vec<Effect>,
    ) -> Result<(), CoreError> {
        let Some(index) = self.permissions.iter().position(|p| p.request.permission_id == permission_id) else {
            return Err(CoreError::with_details(
                ErrorCode::PermissionRequestNotFound,
                format!("permission request {permission_id:?} is unknown or already answered"),
                serde_json::json!({ "permissionId": permission_id }),
            ));
        };
        if self.permissions[index].request.user_only && answerer == Answerer::App {
            return Err(CoreError::with_details(
                ErrorCode::OriginNotAllowed,
                format!("only the user may answer permission request {permission_id:?} (in the Pedelec extension)"),
                serde_json::json!({ "permissionId": permission_id, "reason": "user_only" }),
            ));
        }
        let offered = &self.permissions[index].request.options;
        if !option_id.is_empty() && !offered.iter().any(|o| o.option_id == option_id) {
            let ids: Vec<&str> = offered.iter().map(|o| o.option_id.as_str()).collect();
            return Err(CoreError::with_details(
                ErrorCode::InvalidArgument,
                format!("option {option_id:?} is not one the request offers"),
                serde_json::json!({ "options": ids }),
            ));
        }
        let answer = if option_id.is_empty() {
            PermissionAnswer::Rejected
        } else {
            PermissionAnswer::Selected(option_id.to_owned())
        };
        self.settle_permission(index, answer, "answered", now, out);
        Ok(())
    }

    /// The requests waiting that only the user may answer, oldest first.
    pub fn user_permissions(&self) -> impl Iterator<Item = &pb::PermissionRequest> {
        self.permissions.iter().map(|p| &p.request).filter(|r| r.user_only)
    }

    /// The request's deadline passed unanswered: rejected.
    pub fn permission_timed_out(&mut self, permission_id: &str, now: Now, out: &mut Vec<Effect>) {
        if let Some(index) = self.permissions.iter().position(|p| p.request.permission_id == permission_id) {
            self.settle_permission(index, PermissionAnswer::Rejected, "timeout", now, out);
        }
    }

    /// Settles every request of `operation` as cancelled (a cancel, the
    /// turn's end); `None`: every request (the session ends).
    pub(super) fn withdraw_permissions(&mut self, operation: Option<&OperationId>, now: Now, out: &mut Vec<Effect>) {
        while let Some(index) = self.permissions.iter().position(|p| operation.is_none_or(|op| p.operation == *op)) {
            self.settle_permission(index, PermissionAnswer::Cancelled, "cancelled", now, out);
        }
    }

    fn settle_permission(
        &mut self,
        index: usize,
        answer: PermissionAnswer,
        reason: &str,
        now: Now,
        out: &mut Vec<Effect>,
    ) {
        let pending = self.permissions.remove(index);
        let id = pending.request.permission_id;
        let option_id = match &answer {
            PermissionAnswer::Selected(option) => option.clone(),
            _ => String::new(),
        };
        out.push(Effect::AnswerPermission { permission_id: id.clone(), answer });
        let settled = pb::PermissionSettled { permission_id: id, option_id, reason: reason.to_owned() };
        self.emit(pending.operation.as_str(), Kind::PermissionSettled(settled), now, out);
    }
}
