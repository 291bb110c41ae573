//! The session registry: creation, lookup with origin binding, restore after
//! a restart, and shutdown.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use pedelec_protocol::{ErrorCode, SessionStatus, limits, pb};

use crate::error::{CoreError, CoreResult};
use crate::session::{NewSession, Session, Shared, new_id, now_ms};
use crate::store::SessionRecord;
use crate::tools::ToolSet;
use crate::workspace::{self, Workspace};

pub struct Registry {
    pub shared: Arc<Shared>,
    managed_root: PathBuf,
    sessions: RwLock<HashMap<String, Arc<Session>>>,
    tokens: RwLock<HashMap<String, String>>,
}

/// Checks a client-supplied identifier before it is used as a key.
pub fn check_id(what: &str, id: &str) -> CoreResult<()> {
    if id.is_empty() || id.len() > limits::MAX_ID_LEN || id.chars().any(|c| c.is_control()) {
        return Err(CoreError::new(
            ErrorCode::InvalidArgument,
            format!("{what} {id:?} is empty, too long or malformed"),
        ));
    }
    Ok(())
}

fn check_origin(origin: &str) -> CoreResult<()> {
    if origin.is_empty() || origin.len() > limits::MAX_ORIGIN_LEN || origin.chars().any(|c| c.is_control()) {
        return Err(CoreError::new(ErrorCode::InvalidArgument, "caller_origin is empty, too long or malformed"));
    }
    Ok(())
}

fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Registry {
    pub fn new(shared: Arc<Shared>, managed_root: PathBuf) -> Self {
        Registry { shared, managed_root, sessions: RwLock::default(), tokens: RwLock::default() }
    }

    fn insert(&self, session: Arc<Session>) {
        self.tokens.write().expect("tokens lock").insert(session.tool_token.clone(), session.id.clone());
        self.sessions.write().expect("sessions lock").insert(session.id.clone(), session);
    }

    /// The session, if `origin` may use it.
    pub fn get(&self, id: &str, origin: &str) -> CoreResult<Arc<Session>> {
        check_id("session id", id)?;
        let session = self.sessions.read().expect("sessions lock").get(id).cloned().ok_or_else(|| {
            CoreError::with_details(
                ErrorCode::ThreadNotFound,
                format!("no session {id:?}"),
                serde_json::json!({ "sessionId": id }),
            )
        })?;
        if session.origin != origin {
            return Err(CoreError::new(ErrorCode::ThreadAccessDenied, "the session belongs to another origin"));
        }
        Ok(session)
    }

    /// The session a tool token belongs to.
    pub fn by_token(&self, token: &str) -> CoreResult<Arc<Session>> {
        let refused = || CoreError::new(ErrorCode::ToolTokenInvalid, "unknown tool token");
        if token.len() != 64 {
            return Err(refused());
        }
        let id = self.tokens.read().expect("tokens lock").get(token).cloned().ok_or_else(refused)?;
        let session = self.sessions.read().expect("sessions lock").get(&id).cloned().ok_or_else(refused)?;
        if session.status() == SessionStatus::Ended {
            return Err(CoreError::new(ErrorCode::ToolTokenInvalid, "the tool token's session has ended"));
        }
        Ok(session)
    }

    pub async fn create(&self, request: pb::CreateSessionRequest) -> CoreResult<pb::SessionInfo> {
        check_origin(&request.caller_origin)?;
        let provider_code =
            if request.provider.is_empty() { self.shared.providers.default_code() } else { request.provider.clone() };
        let provider = self.shared.providers.get(&provider_code).ok_or_else(|| {
            CoreError::with_details(
                ErrorCode::ProviderNotFound,
                format!("no provider {provider_code:?}"),
                serde_json::json!({ "provider": provider_code }),
            )
        })?;
        let info = provider.info();
        if !info.available {
            return Err(CoreError::new(ErrorCode::ProviderUnavailable, info.reason));
        }
        if pb::PermissionMode::try_from(request.permission_mode).is_err() {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "unknown permission mode"));
        }
        if pb::EffortLevel::try_from(request.effort_level).is_err() {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "unknown effort level"));
        }
        if request.model.len() > limits::MAX_ID_LEN {
            return Err(CoreError::new(ErrorCode::InvalidArgument, "model name is too long"));
        }
        let model = if request.model.is_empty() { provider.default_model() } else { request.model };
        if model.is_empty() && provider.requires_model() {
            return Err(CoreError::with_details(
                ErrorCode::ModelRequired,
                format!("provider {provider_code:?} needs a model: pass one or set providers.{provider_code}.model"),
                serde_json::json!({ "provider": provider_code }),
            ));
        }
        let skills = request.skills.unwrap_or_default();
        if skills.guidance.len() > limits::MAX_GUIDANCE_BYTES {
            return Err(CoreError::new(ErrorCode::ToolsManifestInvalid, "skill guidance exceeds the size limit"));
        }
        let tools = ToolSet::compile(skills.tools.clone())?;
        let id = new_id("sess");
        let workspace = Workspace::resolve(request.workspace.as_ref(), &self.managed_root, &id)?;
        if let Err(error) = workspace.write_manifest(&skills) {
            workspace.remove_if_managed();
            return Err(error);
        }
        let info = pb::SessionInfo {
            session_id: id.clone(),
            provider: provider_code,
            model,
            effort_level: request.effort_level,
            created_at_ms: now_ms(),
            workspace_path: workspace.root.display().to_string(),
            managed_workspace: workspace.managed,
            auto_end_on_disconnect: request.auto_end_on_disconnect.unwrap_or(true),
            permission_mode: request.permission_mode,
        };
        let session = Session::new(
            self.shared.clone(),
            NewSession {
                id: id.clone(),
                origin: request.caller_origin,
                info: info.clone(),
                workspace,
                tool_token: random_token(),
                skills,
                tools,
            },
        );
        self.shared.store.save_durably(session.initial_record()).await?;
        tracing::info!(session = %id, provider = %info.provider, "session created");
        self.insert(session);
        Ok(info)
    }

    /// Restores stored sessions and removes managed workspaces no live session owns.
    pub fn restore(&self, records: Vec<SessionRecord>) {
        let mut keep = HashSet::new();
        for record in records {
            let workspace = Workspace::recorded(&record.workspace, record.managed_workspace, &record.id);
            let ended = record.status == SessionStatus::Ended.as_str();
            // Managed workspaces of sessions that may still be resumed survive a
            // restart; those of ended sessions are leftovers to remove.
            if record.managed_workspace && !ended && workspace.root.is_dir() {
                keep.insert(record.id.clone());
            }
            // A manifest that no longer loads leaves the session without tools; resume reports it.
            let skills = workspace.load_manifest().unwrap_or_default();
            let tools = ToolSet::compile(skills.tools.clone())
                .unwrap_or_else(|_| ToolSet::compile(Vec::new()).expect("an empty manifest compiles"));
            let info = pb::SessionInfo {
                session_id: record.id.clone(),
                provider: record.provider.clone(),
                model: record.model.clone(),
                effort_level: record.effort_level,
                created_at_ms: record.created_at_ms,
                workspace_path: record.workspace.clone(),
                managed_workspace: record.managed_workspace,
                auto_end_on_disconnect: record.auto_end_on_disconnect,
                permission_mode: record.permission_mode,
            };
            let new = NewSession {
                id: record.id.clone(),
                origin: record.origin.clone(),
                info,
                workspace,
                tool_token: record.tool_token.clone(),
                skills,
                tools,
            };
            let session = Session::restore(self.shared.clone(), new, &record);
            if !ended {
                session.arm_after_restore();
            }
            self.insert(session);
        }
        workspace::remove_stale_managed(&self.managed_root, &keep);
    }

    /// `origin`'s sessions, newest created first (ties by id); never another origin's.
    pub fn list(&self, origin: &str) -> CoreResult<Vec<pb::SessionSummary>> {
        check_origin(origin)?;
        let mine: Vec<Arc<Session>> =
            self.sessions.read().expect("sessions lock").values().filter(|s| s.origin == origin).cloned().collect();
        let mut summaries: Vec<pb::SessionSummary> = mine.iter().map(|s| s.summary()).collect();
        let key = |s: &pb::SessionSummary| s.session.as_ref().map(|i| (i.created_at_ms, i.session_id.clone()));
        summaries.sort_by_key(|s| std::cmp::Reverse(key(s)));
        Ok(summaries)
    }

    pub fn len(&self) -> usize {
        self.sessions.read().expect("sessions lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Normal exit: end every session, persist, remove managed workspaces.
    pub async fn shutdown(&self) {
        let sessions: Vec<Arc<Session>> = self.sessions.read().expect("sessions lock").values().cloned().collect();
        for session in &sessions {
            if let Err(error) = session.end("core_shutdown").await {
                tracing::warn!(session = %session.id, %error, "could not end a session at shutdown");
            }
            session.workspace.remove_if_managed();
            session.close_subscribers();
        }
        let _ = self.shared.store.flush().await;
    }
}
