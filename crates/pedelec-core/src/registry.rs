//! The session registry: creation, lookup with origin binding, restore after
//! a restart, eviction of ended sessions, retention, and shutdown.
//!
//! Only sessions that may still do something live in memory. An ended
//! session leaves memory once nothing holds it (no subscriber, no request
//! in flight) and is read back from the store when a request names it
//! (resume, subscribe, history, …); a restart reads only live ones. So
//! memory and start-up time follow the live sessions, not every session
//! ever stored.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pedelec_protocol::{ErrorCode, SessionId, SessionStatus, limits, pb};

use crate::clock::now_ms;
use crate::error::{CoreError, CoreResult};
use crate::session::{NewSession, Session, Shared, new_id};
use crate::store::SessionRecord;
use crate::tool_token::{ToolToken, ToolTokenDigest};
use crate::tools::ToolSet;
use crate::workspace::{self, Workspace};
use crate::workspace_policy::{Refusal, WorkspacePolicy};

/// The most session ids one `EndSessions` may name.
const MAX_ENDED_AT_ONCE: usize = 1024;

pub struct Registry {
    pub shared: Arc<Shared>,
    managed_root: PathBuf,
    /// Which explicit workspaces a caller may open.
    policy: WorkspacePolicy,
    sessions: RwLock<HashMap<SessionId, Arc<Session>>>,
    /// Session ids by the digest of their tool token: a presented token is
    /// digested and looked up, so no plain token is a key anywhere.
    tokens: RwLock<HashMap<ToolTokenDigest, SessionId>>,
    /// Creates and resumes under way, per origin, not yet in `sessions`:
    /// counted with the live ones so that concurrent requests cannot all
    /// pass the per-origin check at once.
    admitting: std::sync::Mutex<HashMap<String, usize>>,
    /// Held while `SetSettings` rewrites config.toml: one writer at a time.
    pub settings_writer: tokio::sync::Mutex<()>,
    /// Tests only (`serve --tool-token-witness`): where each minted token is
    /// written, since the store no longer holds one a test could read.
    token_witness: Option<PathBuf>,
    /// Where managed workspaces were made before they left the state
    /// directory: leftovers there are swept too.
    legacy_managed_root: Option<PathBuf>,
    /// Bumped by every eviction: a store read begun before one may be
    /// older than what the evicted session last wrote, so it is read again.
    evictions: AtomicU64,
}

/// How often ended sessions nobody holds leave memory.
pub const EVICTION_INTERVAL: Duration = Duration::from_secs(5);
/// How often ended sessions past their retention are deleted.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(3600);

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

impl Registry {
    pub fn new(shared: Arc<Shared>, managed_root: PathBuf, policy: WorkspacePolicy) -> Self {
        Registry {
            shared,
            managed_root,
            policy,
            sessions: RwLock::default(),
            tokens: RwLock::default(),
            admitting: std::sync::Mutex::default(),
            settings_writer: tokio::sync::Mutex::default(),
            token_witness: None,
            legacy_managed_root: None,
            evictions: AtomicU64::new(0),
        }
    }

    /// Writes every tool token this registry mints to `file` (tests only:
    /// they play the agent, and the token is nowhere else they may read).
    pub fn with_token_witness(mut self, file: Option<PathBuf>) -> Self {
        self.token_witness = file;
        self
    }

    pub fn with_legacy_managed_root(mut self, root: PathBuf) -> Self {
        self.legacy_managed_root = Some(root);
        self
    }

    /// A fresh tool token for session `id`. Minted at creation and again
    /// whenever a stored session comes back into memory (restart, a
    /// resume of an ended one): only the digest was stored.
    fn mint_token(&self, id: &str) -> ToolToken {
        let token = ToolToken::mint();
        if let Some(file) = &self.token_witness {
            witness(file, id, &token);
        }
        token
    }

    /// Admits one more live session of `origin`, or refuses with
    /// `QUOTA_EXCEEDED` (the origin's own `max_live_sessions` when the user
    /// set one, else `max_live_sessions_per_origin`). The place is held
    /// until the returned guard drops: by then the session is in `sessions`
    /// (and counted there) or was never made.
    pub fn admit(&self, origin: &str) -> CoreResult<Option<Admission<'_>>> {
        if !crate::quota::limits_sessions_of(origin) {
            return Ok(None);
        }
        let limit = crate::quota::live_session_limit(
            self.shared.quotas.max_live_sessions_per_origin,
            self.shared.consent.max_live_sessions(origin),
        );
        let max = limit.max;
        let mut admitting = self.admitting.lock().expect("admitting lock");
        let pending = admitting.get(origin).copied().unwrap_or(0);
        let live = self
            .sessions
            .read()
            .expect("sessions lock")
            .values()
            .filter(|s| s.origin == origin && s.status() != SessionStatus::Ended)
            .count();
        if live + pending >= max {
            tracing::debug!(%origin, live, max, per_site = limit.per_site, "session refused: live session limit reached");
            return Err(limit.exceeded(origin).into());
        }
        *admitting.entry(origin.to_owned()).or_default() += 1;
        Ok(Some(Admission { registry: self, origin: origin.to_owned(), settled: false }))
    }

    fn in_memory(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.read().expect("sessions lock").get(id).cloned()
    }

    fn insert(&self, session: Arc<Session>) {
        self.tokens.write().expect("tokens lock").insert(session.tool_token.digest(), session.id.clone());
        self.sessions.write().expect("sessions lock").insert(session.id.clone(), session);
    }

    /// The session, if `origin` may use it; an ended one is read back from
    /// the store.
    pub async fn get(&self, id: &str, origin: &str) -> CoreResult<Arc<Session>> {
        check_id("session id", id)?;
        let session = match self.in_memory(id) {
            Some(session) => session,
            None => self.load(id).await?,
        };
        if session.origin != origin {
            return Err(CoreError::new(ErrorCode::ThreadAccessDenied, "the session belongs to another origin"));
        }
        Ok(session)
    }

    /// `get`, for a call that works in the session's workspace: the origin
    /// must still be approved and, for an explicit workspace, still hold a
    /// folder around it (the user may have withdrawn either since).
    pub async fn get_for_work(&self, id: &str, origin: &str) -> CoreResult<Arc<Session>> {
        let session = self.get(id, origin).await?;
        let consent = &self.shared.consent;
        consent.check_approved(origin)?;
        consent.check_workspace(origin, &session.workspace.root, session.workspace.managed)?;
        Ok(session)
    }

    /// Stores `consent` (checked and resolved first; see `Core.SetConsent`).
    pub async fn set_consent(&self, consent: &pb::OriginConsent) -> CoreResult<pb::OriginConsent> {
        let providers = self.shared.providers.now();
        let prepared = self.shared.consent.prepare(consent, &self.policy, |code| providers.get(code).is_some())?;
        self.shared.store.save_consent(prepared.clone()).await?;
        self.shared.consent.apply(&prepared);
        tracing::info!(
            origin = %prepared.origin,
            approved = prepared.approved,
            folders = prepared.folders.len(),
            providers = ?prepared.providers,
            max_live_sessions = prepared.max_live_sessions,
            "consent set"
        );
        Ok(prepared)
    }

    /// `Core.PickFolder`: grants `path` to `origin` (checked as SetConsent
    /// checks a folder) and answers the folder's workspace handle and name.
    pub async fn pick_folder(&self, origin: &str, path: &str) -> CoreResult<pb::PickFolderResponse> {
        let (prepared, handle, picked) = self.shared.consent.prepare_pick(origin, path, &self.policy)?;
        self.shared.store.save_consent(prepared.clone()).await?;
        self.shared.consent.apply(&prepared);
        let grant = prepared.folders.iter().find(|f| f.handle == handle).cloned();
        tracing::info!(origin, folder = %picked.display(), "folder picked");
        Ok(pb::PickFolderResponse { handle, name: crate::folder_picker::base_name(&picked), grant })
    }

    /// `Core.ListFolders` for the user's picker page.
    pub async fn list_folders(&self, path: String, include_hidden: bool) -> CoreResult<pb::ListFoldersResponse> {
        let policy = self.policy.clone();
        tokio::task::spawn_blocking(move || crate::folder_picker::list(&policy, &path, include_hidden))
            .await
            .map_err(|e| CoreError::new(ErrorCode::Internal, format!("listing a folder failed: {e}")))?
    }

    /// Forgets `origin`'s consent, then ends every live session of it.
    /// Forgotten first, so no new session of the origin can start while
    /// the others are ending.
    pub async fn revoke_origin(&self, origin: &str) -> CoreResult<u32> {
        check_origin(origin)?;
        let forgotten = pb::OriginConsent { origin: origin.to_owned(), ..Default::default() };
        self.shared.store.save_consent(forgotten).await?;
        self.shared.consent.forget(origin);
        let count = self.end_all(self.live_of(|s| s.origin == origin), "revoked").await;
        tracing::info!(origin, sessions_ended = count, "origin revoked");
        Ok(count)
    }

    /// The live sessions `keep` accepts. Live sessions are all in memory
    /// (the store holds only ended ones beyond it).
    fn live_of(&self, keep: impl Fn(&Session) -> bool) -> Vec<Arc<Session>> {
        let sessions = self.sessions.read().expect("sessions lock");
        sessions.values().filter(|s| s.status() != SessionStatus::Ended && keep(s)).cloned().collect()
    }

    /// Ends `sessions` at once (each as `End` does) and lets them leave
    /// memory; returns how many this ended.
    async fn end_all(&self, sessions: Vec<Arc<Session>>, reason: &str) -> u32 {
        let ended = futures::future::join_all(sessions.iter().map(|session| session.end(reason))).await;
        let mut count = 0;
        for (session, result) in sessions.iter().zip(ended) {
            match result {
                Ok(true) => count += 1,
                Ok(false) => {}
                Err(error) => tracing::warn!(session = %session.id, %error, reason, "could not end a session"),
            }
        }
        for session in &sessions {
            self.evict(session.id.as_str());
        }
        count
    }

    /// `Core.ListLiveSessions`: every live session (or `origin`'s), then,
    /// when `ended_limit` is `Some`, that many of the most recently ended
    /// ones, newest ended first (owner calls only: it names every origin).
    pub async fn live_and_ended_sessions(
        &self,
        origin: &str,
        ended_limit: Option<u32>,
    ) -> CoreResult<Vec<pb::LiveSession>> {
        let mut listed = self.live_sessions(origin);
        let Some(limit) = ended_limit else {
            return Ok(listed);
        };
        // Live sessions the store still holds as ended (a resume it has not
        // written yet) are read too, then left out: memory is the truth.
        let live_ids: HashSet<String> =
            listed.iter().filter_map(|l| l.summary.as_ref()?.session.as_ref()).map(|i| i.session_id.clone()).collect();
        let records = self.shared.store.ended(origin, limit.saturating_add(live_ids.len() as u32)).await?;
        let ended = records
            .iter()
            .filter(|record| !live_ids.contains(record.id.as_str()))
            .filter(|record| self.in_memory(record.id.as_str()).is_none_or(|s| s.status() == SessionStatus::Ended))
            .take(limit as usize)
            .map(|record| pb::LiveSession {
                origin: record.origin.clone(),
                workspace_path: record.workspace.clone(),
                total_tokens: match self.in_memory(record.id.as_str()) {
                    Some(session) => session.usage_total().unwrap_or(0),
                    None => record.usage_total.unwrap_or(0),
                },
                summary: Some(self.summary_of(record)),
            });
        listed.extend(ended);
        Ok(listed)
    }

    /// Every live session, or `origin`'s when it is not empty, oldest
    /// created first (owner calls only: it names every origin).
    pub fn live_sessions(&self, origin: &str) -> Vec<pb::LiveSession> {
        let mut live: Vec<pb::LiveSession> = self
            .live_of(|s| origin.is_empty() || s.origin == origin)
            .iter()
            .map(|session| pb::LiveSession {
                origin: session.origin.clone(),
                workspace_path: session.workspace.root.display().to_string(),
                total_tokens: session.usage_total().unwrap_or(0),
                summary: Some(session.summary()),
            })
            .collect();
        live.sort_by_key(|l| {
            let info = l.summary.as_ref().and_then(|s| s.session.as_ref());
            info.map(|i| (i.created_at_ms, i.session_id.clone())).unwrap_or_default()
        });
        live
    }

    /// Ends the sessions `ids` (any origin's) and, when `origin` is set,
    /// every live session of it (owner calls only). Every id is checked
    /// before anything ends: an unknown one is `THREAD_NOT_FOUND`.
    pub async fn end_sessions(&self, ids: &[String], origin: &str) -> CoreResult<u32> {
        if ids.len() > MAX_ENDED_AT_ONCE {
            return Err(CoreError::new(
                ErrorCode::InvalidArgument,
                format!("at most {MAX_ENDED_AT_ONCE} sessions are ended by one call"),
            ));
        }
        if !origin.is_empty() {
            check_origin(origin)?;
        }
        let mut named = Vec::with_capacity(ids.len());
        for id in ids {
            named.push(self.get_as_owner(id).await?);
        }
        let mut sessions = self.live_of(|s| !origin.is_empty() && s.origin == origin);
        for session in named {
            if !sessions.iter().any(|s| s.id == session.id) {
                sessions.push(session);
            }
        }
        let count = self.end_all(sessions, "stopped by the user").await;
        tracing::info!(origin, sessions_ended = count, "sessions stopped by the user");
        Ok(count)
    }

    /// Every live session's requests waiting for the user, oldest first.
    pub fn user_permissions(&self) -> Vec<pb::UserPermission> {
        let sessions: Vec<Arc<Session>> = self.sessions.read().expect("sessions lock").values().cloned().collect();
        let mut waiting: Vec<pb::UserPermission> = sessions
            .iter()
            .flat_map(|session| {
                session.user_permissions().into_iter().map(|request| pb::UserPermission {
                    origin: session.origin.clone(),
                    session_id: session.id.as_str().to_owned(),
                    provider: session.info.provider.clone(),
                    workspace_path: session.workspace.root.display().to_string(),
                    request: Some(request),
                })
            })
            .collect();
        waiting.sort_by_key(|p| p.request.as_ref().map_or(0, |r| r.deadline_at_ms));
        waiting
    }

    /// The session `id` whatever its origin: for owner calls only.
    pub async fn get_as_owner(&self, id: &str) -> CoreResult<Arc<Session>> {
        check_id("session id", id)?;
        match self.in_memory(id) {
            Some(session) => Ok(session),
            None => self.load(id).await,
        }
    }

    /// Brings a stored session (ended: live ones are all in memory) back into memory.
    async fn load(&self, id: &str) -> CoreResult<Arc<Session>> {
        loop {
            let generation = self.evictions.load(Ordering::SeqCst);
            let record = self.shared.store.load(&SessionId::new(id)).await?.ok_or_else(|| {
                CoreError::with_details(
                    ErrorCode::ThreadNotFound,
                    format!("no session {id:?}"),
                    serde_json::json!({ "sessionId": id }),
                )
            })?;
            let mut sessions = self.sessions.write().expect("sessions lock");
            // Another request brought it back meanwhile: that one is the session.
            if let Some(session) = sessions.get(id) {
                return Ok(session.clone());
            }
            if self.evictions.load(Ordering::SeqCst) != generation {
                continue;
            }
            let session = self.session_of(&record);
            self.tokens.write().expect("tokens lock").insert(session.tool_token.digest(), session.id.clone());
            sessions.insert(session.id.clone(), session.clone());
            return Ok(session);
        }
    }

    /// Ended sessions nobody else holds leave memory (see the module docs);
    /// returns how many did. Under the write lock no new holder can appear,
    /// and an `Arc` held only by the map is held by no request, subscriber
    /// or task.
    pub fn evict_ended(&self) -> usize {
        let mut sessions = self.sessions.write().expect("sessions lock");
        let gone: Vec<SessionId> =
            sessions.iter().filter(|(_, s)| unheld_and_ended(s)).map(|(id, _)| id.clone()).collect();
        self.remove(&mut sessions, &gone)
    }

    /// `id` leaves memory if it has ended and nobody holds it.
    pub fn evict(&self, id: &str) -> bool {
        let mut sessions = self.sessions.write().expect("sessions lock");
        let gone: Vec<SessionId> =
            sessions.get(id).filter(|s| unheld_and_ended(s)).map(|s| s.id.clone()).into_iter().collect();
        self.remove(&mut sessions, &gone) == 1
    }

    fn remove(&self, sessions: &mut HashMap<SessionId, Arc<Session>>, gone: &[SessionId]) -> usize {
        if gone.is_empty() {
            return 0;
        }
        self.evictions.fetch_add(1, Ordering::SeqCst);
        let mut tokens = self.tokens.write().expect("tokens lock");
        for id in gone {
            if let Some(session) = sessions.remove(id) {
                tokens.remove(&session.tool_token.digest());
            }
        }
        // A burst of sessions leaves the maps sized for it: give that back.
        if sessions.capacity() > 64 && sessions.len() < sessions.capacity() / 4 {
            let keep = sessions.len() * 2;
            sessions.shrink_to(keep);
            tokens.shrink_to(keep);
        }
        gone.len()
    }

    /// Deletes ended sessions last written longer than `retention` ago
    /// (record, transcript and any managed workspace left); returns how many.
    pub async fn purge_expired(&self, retention: Duration) -> CoreResult<usize> {
        let cutoff = now_ms().saturating_sub(retention.as_millis().min(i64::MAX as u128) as i64);
        let keep: Vec<SessionId> = self.sessions.read().expect("sessions lock").keys().cloned().collect();
        let deleted = self.shared.store.purge_ended(cutoff, keep).await?;
        for record in &deleted {
            Workspace::recorded(&record.workspace, record.managed_workspace, record.id.as_str()).remove_if_managed();
        }
        // The activity log is kept as long as an ended session's history.
        let forgotten = self.shared.store.purge_activity(cutoff).await?;
        if forgotten > 0 {
            tracing::info!(entries = forgotten, "deleted activity log entries past their retention");
        }
        Ok(deleted.len())
    }

    /// The session a tool token belongs to.
    pub fn by_token(&self, token: &str) -> CoreResult<Arc<Session>> {
        let refused = || CoreError::new(ErrorCode::ToolTokenInvalid, "unknown tool token");
        if token.len() != 64 {
            return Err(refused());
        }
        let presented = ToolTokenDigest::of(token);
        let id = self.tokens.read().expect("tokens lock").get(&presented).cloned().ok_or_else(refused)?;
        let session = self.sessions.read().expect("sessions lock").get(&id).cloned().ok_or_else(refused)?;
        if !session.tool_token.digest().matches(&presented) {
            return Err(refused());
        }
        if session.status() == SessionStatus::Ended {
            return Err(CoreError::new(ErrorCode::ToolTokenInvalid, "the tool token's session has ended"));
        }
        Ok(session)
    }

    pub async fn create(&self, request: pb::CreateSessionRequest) -> CoreResult<pb::SessionInfo> {
        check_origin(&request.caller_origin)?;
        let providers = self.shared.providers.now();
        let provider_code =
            if request.provider.is_empty() { providers.default_code() } else { request.provider.clone() };
        // The site's own consent may name the agents it uses: refused
        // before anything is counted, looked up, made or started.
        self.shared.consent.check_provider(&request.caller_origin, &provider_code)?;
        let admission = self.admit(&request.caller_origin)?;
        let provider = providers.get(&provider_code).ok_or_else(|| {
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
        // Empty picks the provider's default; anything else reaches the
        // agent's command line and is checked as SetModel checks it.
        if let Some(problem) = (!request.model.is_empty()).then(|| limits::model_name_problem(&request.model)).flatten()
        {
            return Err(CoreError::new(ErrorCode::InvalidArgument, problem));
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
        let origin = &request.caller_origin;
        // Only what the user granted, as Core holds it: no request can carry a grant.
        self.shared.consent.check_approved(origin)?;
        let workspace = self.resolve_workspace(request.workspace.as_ref(), origin, &id, false)?;
        // The asset folder exists from the start, made through handles as
        // the manifest is, so a link planted there is refused at once.
        let prepared = workspace
            .write_manifest(&skills)
            .and_then(|()| crate::assets::area::Area::open(&workspace.root, true).map(drop));
        if let Err(error) = prepared {
            workspace.remove_if_managed();
            return Err(error);
        }
        let info = pb::SessionInfo {
            session_id: id.clone(),
            provider: provider_code,
            model,
            effort_level: request.effort_level,
            created_at_ms: now_ms(),
            workspace_path: self.shown_workspace(origin, &workspace.root, workspace.managed),
            managed_workspace: workspace.managed,
            auto_end_on_disconnect: request.auto_end_on_disconnect.unwrap_or(true),
            permission_mode: request.permission_mode,
            forked_from: String::new(),
        };
        let skills_json = pedelec_protocol::json::to_json(&skills);
        let session = Session::new(
            self.shared.clone(),
            NewSession {
                id: SessionId::new(id.clone()),
                origin: request.caller_origin,
                info: info.clone(),
                workspace,
                tool_token: self.mint_token(&id),
                skills,
                tools,
                fork_of: None,
            },
        );
        self.register(session, skills_json, admission).await?;
        tracing::info!(session = %id, provider = %info.provider, "session created");
        Ok(info)
    }

    /// Stores a new session (created or forked) durably with Core's copy of
    /// its skills, logs its start for the user, and makes it live. A
    /// session that cannot be stored leaves no managed workspace behind.
    async fn register(
        &self,
        session: Arc<Session>,
        skills_json: String,
        admission: Option<Admission<'_>>,
    ) -> CoreResult<()> {
        let mut record = session.initial_record();
        record.skills_json = Some(skills_json);
        if let Err(error) = self.shared.store.save_durably(record).await {
            session.workspace.remove_if_managed();
            return Err(error);
        }
        let workspace = session.workspace.root.display().to_string();
        let started = crate::activity_log::session_started(&session.origin, &session.info, &workspace);
        self.shared.store.append_activity(started);
        session.read_workspace_ahead();
        match admission {
            Some(admission) => admission.settle(|| self.insert(session)),
            None => self.insert(session),
        }
        Ok(())
    }

    /// A new session's workspace as `spec` asks for it (a managed one when
    /// it names no path), judged by the workspace policy against what the
    /// user granted `origin`.
    ///
    /// A spec naming a handle (`WorkspaceSpec.handle`) opens the folder the
    /// user picked for `origin`; its refusals, like those of a `quiet` call
    /// (a web origin's fork), name no path.
    fn resolve_workspace(
        &self,
        spec: Option<&pb::WorkspaceSpec>,
        origin: &str,
        id: &str,
        quiet: bool,
    ) -> CoreResult<Workspace> {
        let picked;
        let (spec, quiet) = match spec {
            Some(spec) if !spec.handle.is_empty() => {
                if !spec.path.is_empty() {
                    return Err(CoreError::with_details(
                        ErrorCode::InvalidArgument,
                        "a workspace names a path or a handle, not both",
                        serde_json::json!({ "field": "workspace.handle" }),
                    ));
                }
                let path = self.shared.consent.resolve_handle(origin, &spec.handle).ok_or_else(|| {
                    CoreError::with_details(
                        ErrorCode::WorkspaceNotAllowed,
                        format!("no folder was picked for {origin} under this handle (pick one again)"),
                        serde_json::json!({ "reason": "unknown_handle" }),
                    )
                })?;
                picked = pb::WorkspaceSpec { path: path.display().to_string(), ..Default::default() };
                (Some(&picked), true)
            }
            other => (other, quiet),
        };
        let resolved = self.resolve_workspace_path(spec, origin, id);
        match resolved {
            Err(error) if quiet => Err(CoreError::with_details(
                error.code(),
                "the picked folder cannot be opened now (pick one again)",
                serde_json::json!({ "reason": "picked_folder_unavailable" }),
            )),
            other => other,
        }
    }

    /// `resolve_workspace` for a spec naming a path (or nothing).
    fn resolve_workspace_path(
        &self,
        spec: Option<&pb::WorkspaceSpec>,
        origin: &str,
        id: &str,
    ) -> CoreResult<Workspace> {
        let granted = self.shared.consent.granted_roots(origin);
        let granted = granted.as_slice();
        Workspace::resolve(spec, &self.managed_root, id, |path| {
            self.policy.check(path, origin, granted).map_err(|refusal| {
                let message = match &refusal {
                    Refusal::Forbidden(what) => {
                        format!("workspace {} is never allowed: it is, holds or lies in {what}", path.display())
                    }
                    Refusal::NotGranted if origin.starts_with("app:") => format!(
                        "workspace {} is not under Core's allowed_workspace_roots (config.toml)",
                        path.display()
                    ),
                    Refusal::NotGranted => {
                        format!("workspace {} is not granted to {origin} (grant it in the extension)", path.display())
                    }
                };
                CoreError::with_details(
                    ErrorCode::WorkspaceNotAllowed,
                    message,
                    serde_json::json!({ "path": path.display().to_string(), "reason": refusal.reason() }),
                )
            })
        })
    }

    /// `Fork` (see core.proto): a new session continuing a copy of
    /// `request.session_id`'s conversation, in the same folder or a copy of
    /// its managed workspace.
    pub async fn fork(&self, request: pb::ForkRequest) -> CoreResult<pb::SessionInfo> {
        let parent = self.get(&request.session_id, &request.caller_origin).await?;
        let origin = request.caller_origin.as_str();
        let point = parent.fork_point()?;
        // Before the provider is asked whether it forks (that may run it).
        self.shared.consent.check_provider(origin, &point.info.provider)?;
        let provider = self.shared.providers.now().get(&point.info.provider).ok_or_else(|| {
            CoreError::new(ErrorCode::ProviderNotFound, format!("no provider {:?}", point.info.provider))
        })?;
        if !provider.forks().await {
            return Err(CoreError::with_details(
                ErrorCode::ForkUnsupported,
                format!("{} cannot fork a conversation", point.info.provider),
                serde_json::json!({ "provider": point.info.provider }),
            ));
        }
        let admission = self.admit(origin)?;
        self.shared.consent.check_approved(origin)?;
        let id = new_id("sess");
        let workspace = if parent.workspace.managed {
            let from = parent.workspace.root.clone();
            let to = self.managed_root.join(&id);
            let copied = tokio::task::spawn_blocking(move || Workspace::copy_managed(&from, &to))
                .await
                .map_err(|e| CoreError::new(ErrorCode::Internal, format!("the workspace copy failed: {e}")))?;
            let workspace = Workspace::recorded(&self.managed_root.join(&id).display().to_string(), true, &id);
            if let Err(error) = copied {
                workspace.remove_if_managed();
                return Err(error);
            }
            workspace
        } else {
            // The user may have withdrawn the folder since the parent began.
            let spec = pb::WorkspaceSpec { path: parent.workspace.root.display().to_string(), ..Default::default() };
            let quiet = pedelec_protocol::origin::is_web_origin(origin);
            let workspace = self.resolve_workspace(Some(&spec), origin, &id, quiet)?;
            workspace.adopt_runtime_files(&parent.workspace)?;
            workspace
        };
        let skills = parent.skills();
        if let Err(error) = workspace
            .write_manifest(&skills)
            .and_then(|()| crate::assets::area::Area::open(&workspace.root, true).map(drop))
        {
            workspace.remove_if_managed();
            return Err(error);
        }
        let info = pb::SessionInfo {
            session_id: id.clone(),
            created_at_ms: now_ms(),
            workspace_path: self.shown_workspace(origin, &workspace.root, workspace.managed),
            managed_workspace: workspace.managed,
            auto_end_on_disconnect: request.auto_end_on_disconnect.unwrap_or(point.info.auto_end_on_disconnect),
            forked_from: parent.id.as_str().to_owned(),
            ..point.info
        };
        let tools = ToolSet::compile(skills.tools.clone())?;
        let skills_json = pedelec_protocol::json::to_json(&skills);
        let session = Session::new(
            self.shared.clone(),
            NewSession {
                id: SessionId::new(id.clone()),
                origin: origin.to_owned(),
                info: info.clone(),
                workspace,
                tool_token: self.mint_token(&id),
                skills,
                tools,
                fork_of: point.provider_session_id,
            },
        );
        self.register(session, skills_json, admission).await?;
        tracing::info!(session = %id, parent = %parent.id, provider = %info.provider, "session forked");
        Ok(info)
    }

    /// The in-memory session for a stored record.
    fn session_of(&self, record: &SessionRecord) -> Arc<Session> {
        let workspace = Workspace::recorded(&record.workspace, record.managed_workspace, record.id.as_str());
        // Core's stored copy: the manifest file sits in the workspace, where
        // the agent may rewrite it. Only a row from before the copy was
        // kept falls back to the file (and gets no tools if it no longer loads).
        let skills = match &record.skills_json {
            Some(stored) => pedelec_protocol::json::from_json(stored).unwrap_or_else(|error| {
                tracing::warn!(session = %record.id, %error, "the stored skills do not load");
                pb::Skills::default()
            }),
            None => {
                let skills = workspace.load_manifest().unwrap_or_default();
                // Read from the file this once: from now on Core's copy holds.
                self.shared.store.adopt_skills(&record.id, pedelec_protocol::json::to_json(&skills));
                skills
            }
        };
        let tools = ToolSet::compile(skills.tools.clone())
            .unwrap_or_else(|_| ToolSet::compile(Vec::new()).expect("an empty manifest compiles"));
        let new = NewSession {
            id: record.id.clone(),
            origin: record.origin.clone(),
            info: self.info_of(record),
            workspace,
            tool_token: self.mint_token(record.id.as_str()),
            skills,
            tools,
            fork_of: record.fork_of.clone(),
        };
        Session::restore(self.shared.clone(), new, record)
    }

    /// Restores the stored live sessions (the store returns no ended ones)
    /// and removes managed workspaces no live session owns.
    pub fn restore(&self, records: Vec<SessionRecord>) {
        let mut keep = HashSet::new();
        for record in records {
            if record.status == SessionStatus::Ended {
                continue;
            }
            // Managed workspaces of sessions that may still be resumed survive a
            // restart; those of ended sessions are leftovers to remove.
            if record.managed_workspace
                && Workspace::recorded(&record.workspace, true, record.id.as_str()).root.is_dir()
            {
                keep.insert(record.id.as_str().to_owned());
            }
            let session = self.session_of(&record);
            session.arm_after_restore();
            self.insert(session);
        }
        workspace::remove_stale_managed(&self.managed_root, &keep);
        if let Some(legacy) = &self.legacy_managed_root {
            workspace::remove_stale_managed(legacy, &keep);
        }
    }

    /// A page of `origin`'s sessions, newest created first (ties by id),
    /// ended ones included; never another origin's. Returns whether older
    /// ones follow.
    pub async fn list(&self, request: &pb::ListSessionsRequest) -> CoreResult<(Vec<pb::SessionSummary>, bool)> {
        check_origin(&request.caller_origin)?;
        let limit = match request.limit {
            0 => limits::DEFAULT_LISTED_SESSIONS,
            n => n.min(limits::MAX_LISTED_SESSIONS),
        };
        let before = if request.before_session_id.is_empty() {
            None
        } else {
            check_id("before_session_id", &request.before_session_id)?;
            // Only its place in the order is needed: read, never brought into memory.
            let cursor = match self.in_memory(&request.before_session_id) {
                Some(session) => (session.origin.clone(), session.info.created_at_ms),
                None => {
                    let record =
                        self.shared.store.load(&SessionId::new(request.before_session_id.as_str())).await?.ok_or_else(
                            || CoreError::new(ErrorCode::ThreadNotFound, "no session to page from (before_session_id)"),
                        )?;
                    (record.origin, record.created_at_ms)
                }
            };
            if cursor.0 != request.caller_origin {
                return Err(CoreError::new(ErrorCode::ThreadAccessDenied, "the session belongs to another origin"));
            }
            Some((cursor.1, request.before_session_id.clone()))
        };
        let mut records = self.shared.store.list(&request.caller_origin, before, limit + 1).await?;
        let more = records.len() > limit as usize;
        records.truncate(limit as usize);
        let summaries = records.iter().map(|record| self.summary_of(record)).collect();
        Ok((summaries, more))
    }

    /// A stored session's summary as a listing shows it. Memory is the
    /// truth for a session in it (the store may lag behind its status).
    fn summary_of(&self, record: &SessionRecord) -> pb::SessionSummary {
        match self.in_memory(record.id.as_str()) {
            Some(session) => session.summary(),
            None => pb::SessionSummary {
                session: Some(self.info_of(record)),
                status: record.status.to_pb() as i32,
                last_activity_at_ms: record.updated_at_ms.max(record.created_at_ms),
            },
        }
    }

    /// Sessions in memory (live ones and ended ones still held).
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

/// A place under `max_live_sessions_per_origin` held for a create or a
/// resume under way (see [`Registry::admit`]).
pub struct Admission<'a> {
    registry: &'a Registry,
    origin: String,
    /// The place was given back by `settle`.
    settled: bool,
}

impl Admission<'_> {
    /// Runs `insert` (which puts the admitted session in `sessions`) and
    /// gives the place back in one step under the admitting lock, so that
    /// no check in between counts the session twice.
    fn settle(mut self, insert: impl FnOnce()) {
        let registry = self.registry;
        let mut admitting = registry.admitting.lock().unwrap_or_else(|p| p.into_inner());
        insert();
        release(&mut admitting, &self.origin);
        self.settled = true;
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let mut admitting = self.registry.admitting.lock().unwrap_or_else(|p| p.into_inner());
            release(&mut admitting, &self.origin);
        }
    }
}

fn release(admitting: &mut HashMap<String, usize>, origin: &str) {
    if let Some(pending) = admitting.get_mut(origin) {
        *pending -= 1;
        if *pending == 0 {
            admitting.remove(origin);
        }
    }
}

/// Appends `<session id> <token>` to the witness file (created 0600).
fn witness(file: &Path, id: &str, token: &ToolToken) {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    if let Err(error) = options.open(file).and_then(|mut f| writeln!(f, "{id} {}", token.expose())) {
        tracing::warn!(%error, file = %file.display(), "cannot write the tool token witness");
    }
}

fn unheld_and_ended(session: &Arc<Session>) -> bool {
    Arc::strong_count(session) == 1 && session.status() == SessionStatus::Ended
}

impl Registry {
    /// The workspace path a caller is told: a web page is not told where
    /// Core keeps a managed workspace, since that path names the user's
    /// home and account; nor what lies above a folder the user picked for
    /// it (the path starts at that folder's name); any other explicit
    /// workspace is the path the page itself chose.
    fn shown_workspace(&self, origin: &str, path: &std::path::Path, managed: bool) -> String {
        if !pedelec_protocol::origin::is_web_origin(origin) {
            return path.display().to_string();
        }
        if managed {
            return String::new();
        }
        match self.shared.consent.picked_root(origin, path) {
            Some(root) => {
                let name = std::path::Path::new(&crate::folder_picker::base_name(&root)).to_path_buf();
                match path.strip_prefix(&root) {
                    Ok(below) if !below.as_os_str().is_empty() => name.join(below).display().to_string(),
                    _ => name.display().to_string(),
                }
            }
            None => path.display().to_string(),
        }
    }

    fn info_of(&self, record: &SessionRecord) -> pb::SessionInfo {
        info_of(
            record,
            self.shown_workspace(&record.origin, std::path::Path::new(&record.workspace), record.managed_workspace),
        )
    }
}

fn info_of(record: &SessionRecord, workspace_path: String) -> pb::SessionInfo {
    pb::SessionInfo {
        session_id: record.id.as_str().to_owned(),
        provider: record.provider.clone(),
        model: record.model.clone(),
        effort_level: record.effort_level as i32,
        created_at_ms: record.created_at_ms,
        workspace_path,
        managed_workspace: record.managed_workspace,
        auto_end_on_disconnect: record.auto_end_on_disconnect,
        permission_mode: record.permission_mode as i32,
        forked_from: record.forked_from.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    const ORIGIN: &str = "https://app.example";

    async fn registry(state: &std::path::Path) -> Registry {
        let (store, records) = Store::open(&state.join("sessions.sqlite3")).unwrap();
        let shared = Shared::for_tests(store, state).await;
        shared.consent.apply(&pb::OriginConsent {
            origin: ORIGIN.into(),
            approved: true,
            approved_at_ms: 1,
            ..Default::default()
        });
        let registry = Registry::new(shared, state.join("workspaces"), WorkspacePolicy::default());
        registry.restore(records);
        registry
    }

    async fn create(registry: &Registry) -> String {
        let request = pb::CreateSessionRequest {
            caller_origin: ORIGIN.into(),
            provider: "scripted".into(),
            auto_end_on_disconnect: Some(false),
            ..Default::default()
        };
        registry.create(request).await.unwrap().session_id
    }

    async fn end(registry: &Registry, id: &str) {
        registry.get(id, ORIGIN).await.unwrap().end("requested").await.unwrap();
    }

    fn listing(origin: &str, limit: u32, before: &str) -> pb::ListSessionsRequest {
        pb::ListSessionsRequest { caller_origin: origin.into(), limit, before_session_id: before.into() }
    }

    #[tokio::test]
    async fn ended_sessions_leave_memory_and_come_back_when_named() {
        let dir = tempfile::tempdir().unwrap();
        let registry = registry(dir.path()).await;
        let live = create(&registry).await;
        let ended = create(&registry).await;
        end(&registry, &ended).await;
        assert_eq!(registry.len(), 2);

        // Held by a request (or a subscriber): it stays.
        let held = registry.get(&ended, ORIGIN).await.unwrap();
        assert_eq!(registry.evict_ended(), 0, "a held session is not evicted");
        drop(held);
        assert_eq!(registry.evict_ended(), 1);
        assert_eq!(registry.len(), 1, "only the live session is in memory");
        assert_eq!(registry.evict_ended(), 0, "a live session is never evicted");

        // Named again, it is read back as it ended, and can be resumed.
        let back = registry.get(&ended, ORIGIN).await.unwrap();
        assert_eq!(back.status(), SessionStatus::Ended);
        assert_eq!(registry.len(), 2);
        let other = registry.get(&ended, "https://other.example").await.err().unwrap();
        assert_eq!(other.code(), ErrorCode::ThreadAccessDenied);
        back.resume().await.unwrap();
        drop(back);
        assert_eq!(registry.evict_ended(), 0, "a resumed session is live again");
        assert_eq!(registry.get(&ended, ORIGIN).await.unwrap().status(), SessionStatus::Idle);
        assert!(!registry.evict(&live), "evict leaves a live session alone");
    }

    #[tokio::test]
    async fn listing_includes_ended_sessions_from_the_store_in_pages() {
        let dir = tempfile::tempdir().unwrap();
        let registry = registry(dir.path()).await;
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(create(&registry).await);
            // Distinct creation times keep the order independent of the ids.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for id in &ids[..3] {
            end(&registry, id).await;
        }
        registry.evict_ended();
        assert_eq!(registry.len(), 2);

        let (first, more) = registry.list(&listing(ORIGIN, 2, "")).await.unwrap();
        let id_of = |s: &pb::SessionSummary| s.session.as_ref().unwrap().session_id.clone();
        assert_eq!(first.iter().map(id_of).collect::<Vec<_>>(), vec![ids[4].clone(), ids[3].clone()]);
        assert!(more);
        let (rest, more) = registry.list(&listing(ORIGIN, 0, &ids[3])).await.unwrap();
        assert_eq!(rest.iter().map(id_of).collect::<Vec<_>>(), vec![ids[2].clone(), ids[1].clone(), ids[0].clone()]);
        assert!(!more);
        assert!(rest.iter().all(|s| s.status == pb::SessionStatus::Ended as i32), "{rest:?}");
        assert!(rest.iter().all(|s| s.last_activity_at_ms >= s.session.as_ref().unwrap().created_at_ms));
        let (last, _) = registry.list(&listing(ORIGIN, 0, &ids[1])).await.unwrap();
        assert_eq!(last.iter().map(id_of).collect::<Vec<_>>(), vec![ids[0].clone()], "an ended cursor pages on");
        assert_eq!(registry.len(), 2, "listing reads ended sessions (cursor included) without loading them");
        let (theirs, _) = registry.list(&listing("https://other.example", 0, "")).await.unwrap();
        assert!(theirs.is_empty(), "never another origin's sessions");
        let cursor = registry.list(&listing("https://other.example", 0, &ids[3])).await.err().unwrap();
        assert_eq!(cursor.code(), ErrorCode::ThreadAccessDenied, "a cursor is one of the caller's sessions");
    }

    #[tokio::test]
    async fn a_restart_loads_live_sessions_only_and_retention_deletes_expired_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (live, ended) = {
            let registry = registry(dir.path()).await;
            let live = create(&registry).await;
            let ended = create(&registry).await;
            end(&registry, &ended).await;
            registry.shared.store.flush().await.unwrap();
            (live, ended)
        };
        let registry = registry(dir.path()).await;
        assert_eq!(registry.len(), 1, "the restart loaded the live session only");
        assert_eq!(registry.get(&ended, ORIGIN).await.unwrap().status(), SessionStatus::Ended);

        // In memory (named above): kept, whatever its age.
        assert_eq!(registry.purge_expired(Duration::ZERO).await.unwrap(), 0);
        registry.evict_ended();
        assert_eq!(registry.purge_expired(Duration::from_secs(3600)).await.unwrap(), 0, "not yet expired");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(registry.purge_expired(Duration::ZERO).await.unwrap(), 1);
        let gone = registry.get(&ended, ORIGIN).await.err().unwrap();
        assert_eq!(gone.code(), ErrorCode::ThreadNotFound);
        let database = dir.path().join("sessions.sqlite3");
        assert!(crate::store::read_transcript(&database, &ended).unwrap().is_empty(), "its transcript went too");
        assert_eq!(registry.get(&live, ORIGIN).await.unwrap().status(), SessionStatus::Idle, "live ones never expire");
    }

    #[tokio::test]
    async fn the_activity_log_is_kept_for_the_retention_and_then_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let registry = registry(dir.path()).await;
        let session = create(&registry).await;
        end(&registry, &session).await;
        let everything = || crate::activity_log::Query { origin: None, before_id: None, limit: 100 };
        let (logged, _) = registry.shared.store.activity(everything()).await.unwrap();
        let kinds: Vec<i32> = logged.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![pb::ActivityLogKind::SessionEnded as i32, pb::ActivityLogKind::SessionStarted as i32],
            "{logged:?}"
        );
        assert!(logged.iter().all(|e| e.origin == ORIGIN && e.session_id == session));
        registry.purge_expired(Duration::from_secs(3600)).await.unwrap();
        assert_eq!(registry.shared.store.activity(everything()).await.unwrap().0.len(), 2, "not yet expired");
        tokio::time::sleep(Duration::from_millis(5)).await;
        registry.purge_expired(Duration::ZERO).await.unwrap();
        assert!(registry.shared.store.activity(everything()).await.unwrap().0.is_empty(), "past the retention: gone");
    }
}
