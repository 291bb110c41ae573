//! The user's decisions about web origins: which are approved, which
//! folders each may open workspaces in, where its pages may approve the
//! agent's commands, which agents it may use, and how many live sessions
//! it may hold.
//!
//! Core holds them so that nothing a page sends can widen them: the browser
//! extension once stamped grants into each request, and a second spelling
//! of that request skipped the stamp. Now a request carries no grant at
//! all; Core reads its own copy (in memory, written through to the store)
//! on every check. Only owner calls (`Core.SetConsent`, `RevokeOrigin`)
//! change it, and Core refuses those from web origins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use pedelec_protocol::origin::is_web_origin;
use pedelec_protocol::{ErrorCode, limits, pb};

use crate::error::{CoreError, CoreResult};
use crate::workspace::resolves_inside;
use crate::workspace_policy::{Refusal, WorkspacePolicy};

/// The caller origin the browser extension uses for its owner calls.
pub const EXTENSION_ORIGIN: &str = "app:pedelec-extension";

/// The most folders one origin may be granted.
const MAX_FOLDERS: usize = limits::MAX_WORKSPACE_GRANTS;

/// Refuses an owner call made with a web origin.
pub fn check_owner(caller_origin: &str) -> CoreResult<()> {
    if caller_origin.is_empty() || is_web_origin(caller_origin) {
        return Err(CoreError::with_details(
            ErrorCode::OriginNotAllowed,
            "only the user (the extension's own pages or a local program) may read or change consent",
            serde_json::json!({ "origin": caller_origin, "reason": "owner_only" }),
        ));
    }
    Ok(())
}

/// One folder granted to an origin, resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Folder {
    path: PathBuf,
    may_approve_commands: bool,
    /// The workspace handle a pick minted for it (`Core.PickFolder`); empty
    /// for a folder granted only by `SetConsent`.
    handle: String,
}

/// One origin's consent as Core checks it: folders already resolved.
#[derive(Debug, Clone, Default)]
struct Entry {
    approved_at_ms: i64,
    folders: Vec<Folder>,
    /// Provider codes the origin may use, sorted; empty: every one.
    providers: Vec<String>,
    /// The origin's own live-session limit; 0: config.toml's default.
    max_live_sessions: u32,
}

impl Entry {
    /// A stored consent as Core checks it. A stored folder that no longer
    /// resolves is kept under its recorded name: it grants nothing until it
    /// exists again.
    fn of(consent: &pb::OriginConsent) -> Self {
        Entry {
            approved_at_ms: if consent.approved { consent.approved_at_ms.max(1) } else { 0 },
            folders: consent
                .folders
                .iter()
                .map(|f| Folder {
                    path: PathBuf::from(&f.path),
                    may_approve_commands: f.may_approve_commands,
                    handle: f.handle.clone(),
                })
                .collect(),
            providers: consent.providers.clone(),
            max_live_sessions: consent.max_live_sessions,
        }
    }

    fn to_pb(&self, origin: &str) -> pb::OriginConsent {
        pb::OriginConsent {
            origin: origin.to_owned(),
            approved: self.approved_at_ms > 0,
            approved_at_ms: self.approved_at_ms,
            folders: self
                .folders
                .iter()
                .map(|f| pb::FolderGrant {
                    path: f.path.display().to_string(),
                    may_approve_commands: f.may_approve_commands,
                    handle: f.handle.clone(),
                })
                .collect(),
            providers: self.providers.clone(),
            max_live_sessions: self.max_live_sessions,
        }
    }
}

/// What a session's workspace is granted, for routing its permission requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceGrant {
    /// A managed workspace, or a local program's: not a user grant.
    NotApplicable,
    /// Inside a granted folder; `may_approve_commands` as the user set it.
    Granted { may_approve_commands: bool },
    /// No longer inside any folder granted to the origin (withdrawn).
    Withdrawn,
}

/// Every origin's consent.
#[derive(Debug, Default)]
pub struct Consent {
    origins: RwLock<HashMap<String, Entry>>,
}

impl Consent {
    /// Consent as stored.
    pub fn from_stored(stored: Vec<pb::OriginConsent>) -> Self {
        let origins = stored.into_iter().map(|c| (c.origin.clone(), Entry::of(&c))).collect();
        Consent { origins: RwLock::new(origins) }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.origins.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a web origin is approved (local programs always are).
    pub fn approved(&self, origin: &str) -> bool {
        !is_web_origin(origin) || self.read().get(origin).is_some_and(|e| e.approved_at_ms > 0)
    }

    /// Refuses a web origin the user has not approved.
    pub fn check_approved(&self, origin: &str) -> CoreResult<()> {
        if self.approved(origin) {
            return Ok(());
        }
        Err(CoreError::with_details(
            ErrorCode::OriginNotAllowed,
            format!("origin {origin} is not approved (approve it in the Pedelec extension)"),
            serde_json::json!({ "origin": origin, "reason": "not_approved" }),
        ))
    }

    /// Refuses a session of a web origin with a provider its consent does
    /// not list (`OriginConsent.providers`; empty lists every one).
    pub fn check_provider(&self, origin: &str, provider: &str) -> CoreResult<()> {
        if !is_web_origin(origin) {
            return Ok(());
        }
        let allowed = self.read().get(origin).is_none_or(|e| may_use(&e.providers, provider));
        if allowed {
            return Ok(());
        }
        tracing::debug!(%origin, provider, "session refused: the site may not use this agent");
        Err(CoreError::with_details(
            ErrorCode::OriginNotAllowed,
            format!("{origin} may not use the agent {provider:?} (the user chose its agents in the Pedelec extension)"),
            serde_json::json!({ "reason": "agent_not_allowed", "provider": provider }),
        ))
    }

    /// The origin's own live-session limit; 0 when it has none (the
    /// config.toml default holds).
    pub fn max_live_sessions(&self, origin: &str) -> u32 {
        self.read().get(origin).map_or(0, |e| e.max_live_sessions)
    }

    /// The folders granted to `origin`, as the workspace policy takes them.
    pub fn granted_roots(&self, origin: &str) -> Vec<String> {
        self.read()
            .get(origin)
            .map(|e| e.folders.iter().map(|f| f.path.display().to_string()).collect())
            .unwrap_or_default()
    }

    /// How `workspace` (resolved) of a session of `origin` stands now.
    pub fn workspace_grant(&self, origin: &str, workspace: &Path, managed: bool) -> WorkspaceGrant {
        if managed || !is_web_origin(origin) {
            return WorkspaceGrant::NotApplicable;
        }
        let origins = self.read();
        let Some(entry) = origins.get(origin).filter(|e| e.approved_at_ms > 0) else {
            return WorkspaceGrant::Withdrawn;
        };
        // The deepest folder holding the workspace decides: a narrower grant
        // may allow commands where a broader one does not, and the reverse.
        entry
            .folders
            .iter()
            .filter(|f| workspace.starts_with(&f.path))
            .max_by_key(|f| f.path.components().count())
            .map_or(WorkspaceGrant::Withdrawn, |f| WorkspaceGrant::Granted {
                may_approve_commands: f.may_approve_commands,
            })
    }

    /// The folder `handle` names for `origin`: one the user picked for
    /// that origin (`Core.PickFolder`) and still grants it. Another
    /// origin's handle, an unknown one, or one whose folder was removed
    /// names nothing.
    pub fn resolve_handle(&self, origin: &str, handle: &str) -> Option<PathBuf> {
        if !crate::folder_picker::well_formed_handle(handle) {
            return None;
        }
        let origins = self.read();
        let entry = origins.get(origin)?;
        entry.folders.iter().find(|f| f.handle == handle).map(|f| f.path.clone())
    }

    /// The deepest folder the user picked for `origin` that holds
    /// `workspace`: a page is shown its session's workspace from that
    /// folder's name down, never what lies above it.
    pub fn picked_root(&self, origin: &str, workspace: &Path) -> Option<PathBuf> {
        let origins = self.read();
        let entry = origins.get(origin)?;
        entry
            .folders
            .iter()
            .filter(|f| !f.handle.is_empty() && workspace.starts_with(&f.path))
            .max_by_key(|f| f.path.components().count())
            .map(|f| f.path.clone())
    }

    /// Checks and resolves the grant of `path` (see `Core.PickFolder`):
    /// the origin's consent with the folder added (or kept) and holding a
    /// handle, what to store, and that handle.
    pub fn prepare_pick(
        &self,
        origin: &str,
        path: &str,
        policy: &WorkspacePolicy,
    ) -> CoreResult<(pb::OriginConsent, String, PathBuf)> {
        check_consent_origin(origin)?;
        let picked = resolve_folder(path)?;
        let mut consent = self
            .read()
            .get(origin)
            .map(|e| e.to_pb(origin))
            .unwrap_or_else(|| pb::OriginConsent { origin: origin.to_owned(), ..Default::default() });
        if !consent.folders.iter().any(|f| Path::new(&f.path) == picked) {
            consent.folders.push(pb::FolderGrant {
                path: picked.display().to_string(),
                may_approve_commands: false,
                handle: String::new(),
            });
        }
        let prepared = self.prepare_minting(&consent, policy, Some(&picked))?;
        let handle = prepared
            .folders
            .iter()
            .find(|f| Path::new(&f.path) == picked)
            .map(|f| f.handle.clone())
            .unwrap_or_default();
        Ok((prepared, handle, picked))
    }

    /// Refuses work in an explicit workspace the origin no longer holds.
    pub fn check_workspace(&self, origin: &str, workspace: &Path, managed: bool) -> CoreResult<()> {
        if self.workspace_grant(origin, workspace, managed) != WorkspaceGrant::Withdrawn {
            return Ok(());
        }
        // No path: a page that opened a picked folder by its handle never
        // learns where it lies.
        Err(CoreError::with_details(
            ErrorCode::WorkspaceNotAllowed,
            format!("this session's workspace is no longer granted to {origin}"),
            serde_json::json!({ "reason": "not_granted" }),
        ))
    }

    /// Every origin's consent, or the one named, sorted by origin.
    pub fn list(&self, origin: &str) -> Vec<pb::OriginConsent> {
        let origins = self.read();
        let mut listed: Vec<pb::OriginConsent> = origins
            .iter()
            .filter(|(o, _)| origin.is_empty() || o.as_str() == origin)
            .map(|(o, e)| e.to_pb(o))
            .collect();
        listed.sort_by(|a, b| a.origin.cmp(&b.origin));
        listed
    }

    /// Checks and resolves `consent` (see `Core.SetConsent`); what to
    /// store. `is_provider` says whether a code names a configured provider.
    pub fn prepare(
        &self,
        consent: &pb::OriginConsent,
        policy: &WorkspacePolicy,
        is_provider: impl Fn(&str) -> bool,
    ) -> CoreResult<pb::OriginConsent> {
        check_site_limits(consent, is_provider)?;
        self.prepare_minting(consent, policy, None)
    }

    /// `prepare`, giving the folder `mint_for` a new handle if it has none.
    /// Handles are Core's: those `consent` carries are ignored, and a
    /// folder that stays granted keeps the one it had.
    fn prepare_minting(
        &self,
        consent: &pb::OriginConsent,
        policy: &WorkspacePolicy,
        mint_for: Option<&Path>,
    ) -> CoreResult<pb::OriginConsent> {
        check_consent_origin(&consent.origin)?;
        if consent.folders.len() > MAX_FOLDERS {
            return Err(CoreError::new(
                ErrorCode::InvalidArgument,
                format!("an origin may be granted at most {MAX_FOLDERS} folders"),
            ));
        }
        let previous: Vec<Folder> = self.read().get(&consent.origin).map(|e| e.folders.clone()).unwrap_or_default();
        let mut folders: Vec<Folder> = Vec::with_capacity(consent.folders.len());
        for folder in &consent.folders {
            let path = resolve_folder(&folder.path)?;
            if let Err(Refusal::Forbidden(what)) = policy.check(&path, &consent.origin, &[]) {
                return Err(CoreError::with_details(
                    ErrorCode::WorkspaceNotAllowed,
                    format!("{} can never be granted: it is, holds or lies in {what}", path.display()),
                    serde_json::json!({ "path": path.display().to_string(), "reason": "forbidden" }),
                ));
            }
            match folders.iter_mut().find(|f| f.path == path) {
                Some(f) => f.may_approve_commands |= folder.may_approve_commands,
                None => {
                    let handle = previous.iter().find(|f| f.path == path).map(|f| f.handle.clone()).unwrap_or_default();
                    folders.push(Folder { path, may_approve_commands: folder.may_approve_commands, handle })
                }
            }
        }
        if let Some(picked) = mint_for
            && let Some(folder) = folders.iter_mut().find(|f| f.path == picked && f.handle.is_empty())
        {
            folder.handle = crate::folder_picker::mint_handle();
        }
        folders.sort();
        let previous = self.read().get(&consent.origin).map_or(0, |e| e.approved_at_ms);
        let approved_at_ms = match (consent.approved, previous) {
            (false, _) => 0,
            (true, 0) => crate::clock::now_ms(),
            (true, at) => at,
        };
        let mut providers = consent.providers.clone();
        providers.sort();
        providers.dedup();
        let max_live_sessions = consent.max_live_sessions;
        Ok(Entry { approved_at_ms, folders, providers, max_live_sessions }.to_pb(&consent.origin))
    }

    /// Takes a stored (prepared) consent into memory; an unapproved origin
    /// with no folders is forgotten.
    pub fn apply(&self, consent: &pb::OriginConsent) {
        let mut origins = self.origins.write().unwrap_or_else(|p| p.into_inner());
        if !consent.approved && consent.folders.is_empty() {
            origins.remove(&consent.origin);
            return;
        }
        origins.insert(consent.origin.clone(), Entry::of(consent));
    }

    /// Forgets an origin.
    pub fn forget(&self, origin: &str) {
        self.origins.write().unwrap_or_else(|p| p.into_inner()).remove(origin);
    }
}

/// Whether an agent's request stays inside `workspace`: it reads or edits
/// files, names at least one, and every one lies inside (relative names
/// against the workspace, `..` folded, and the deepest existing ancestor
/// resolved, so a symlink inside pointing out counts as outside). Anything
/// else — a command, a fetch, a search, a tool, a request naming no file —
/// does not.
pub fn stays_in_workspace(activity: &pb::Activity, workspace: &Path) -> bool {
    let file_kind = matches!(
        pb::ActivityKind::try_from(activity.kind),
        Ok(pb::ActivityKind::FileEdit | pb::ActivityKind::FileRead)
    );
    file_kind && !activity.paths.is_empty() && activity.paths.iter().all(|path| resolves_inside(workspace, path))
}

/// Whether an origin whose consent lists `providers` may use `provider`.
fn may_use(providers: &[String], provider: &str) -> bool {
    providers.is_empty() || providers.iter().any(|p| p == provider)
}

/// Checks what the user set as a site's own limits (see `OriginConsent`):
/// known provider codes, few enough, and a session limit within bounds.
fn check_site_limits(consent: &pb::OriginConsent, is_provider: impl Fn(&str) -> bool) -> CoreResult<()> {
    let invalid = |message: String, details: serde_json::Value| {
        Err(CoreError::with_details(ErrorCode::InvalidArgument, message, details))
    };
    if consent.providers.len() > limits::MAX_SITE_PROVIDERS {
        return invalid(
            format!("a site may be limited to at most {} agents", limits::MAX_SITE_PROVIDERS),
            serde_json::json!({ "field": "providers" }),
        );
    }
    if let Some(unknown) = consent.providers.iter().find(|code| code.len() > limits::MAX_ID_LEN || !is_provider(code)) {
        let shown: String = unknown.chars().take(limits::MAX_ID_LEN).collect();
        return invalid(
            format!("no provider {shown:?} (ListProviders names them)"),
            serde_json::json!({ "field": "providers", "provider": shown }),
        );
    }
    if consent.max_live_sessions > limits::MAX_SITE_LIVE_SESSIONS {
        return invalid(
            format!("a site's own session limit is at most {}", limits::MAX_SITE_LIVE_SESSIONS),
            serde_json::json!({ "field": "max_live_sessions" }),
        );
    }
    Ok(())
}

/// Consent is for web origins only, written as the browser writes them.
fn check_consent_origin(origin: &str) -> CoreResult<()> {
    let well_formed = is_web_origin(origin)
        && origin.len() <= limits::MAX_ORIGIN_LEN
        && !origin.chars().any(|c| c.is_control() || c.is_whitespace())
        && !origin.trim_start_matches("https://").trim_start_matches("http://").contains('/');
    if well_formed {
        Ok(())
    } else {
        Err(CoreError::new(ErrorCode::InvalidArgument, "consent is for a web origin (scheme://host[:port])"))
    }
}

/// An absolute directory, symlinks and `..` resolved.
fn resolve_folder(path: &str) -> CoreResult<PathBuf> {
    let invalid = |why: &str| {
        CoreError::with_details(
            ErrorCode::WorkspaceInvalid,
            format!("folder {path:?} {why}"),
            serde_json::json!({ "path": path }),
        )
    };
    if path.len() > limits::MAX_WORKSPACE_PATH_BYTES || path.contains('\0') || !Path::new(path).is_absolute() {
        return Err(invalid("is not an absolute path"));
    }
    let resolved = Path::new(path).canonicalize().map_err(|_| invalid("does not exist"))?;
    if !resolved.is_dir() {
        return Err(invalid("is not a directory"));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Consent {
        /// `prepare` with every provider code known.
        fn prepare_any(&self, consent: &pb::OriginConsent, policy: &WorkspacePolicy) -> CoreResult<pb::OriginConsent> {
            self.prepare(consent, policy, |_| true)
        }
    }

    fn consent(origin: &str, approved: bool, folders: &[(&Path, bool)]) -> pb::OriginConsent {
        pb::OriginConsent {
            origin: origin.into(),
            approved,
            approved_at_ms: 0,
            providers: Vec::new(),
            max_live_sessions: 0,
            folders: folders
                .iter()
                .map(|(p, may)| pb::FolderGrant {
                    path: p.display().to_string(),
                    may_approve_commands: *may,
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn activity(kind: pb::ActivityKind, paths: &[&str]) -> pb::Activity {
        pb::Activity { kind: kind as i32, paths: paths.iter().map(|p| p.to_string()).collect(), ..Default::default() }
    }

    #[test]
    fn only_file_requests_inside_the_workspace_stay_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(workspace.join("src")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("outside"), workspace.join("link")).unwrap();
        let inside = workspace.join("src/a.rs").display().to_string();
        use pb::ActivityKind::*;
        assert!(stays_in_workspace(&activity(FileEdit, &["src/new.rs", &inside]), &workspace));
        assert!(stays_in_workspace(&activity(FileRead, &["./src/../src/a.rs"]), &workspace));
        assert!(!stays_in_workspace(&activity(FileEdit, &["../outside/x"]), &workspace));
        assert!(!stays_in_workspace(&activity(FileRead, &["/etc/passwd"]), &workspace));
        assert!(!stays_in_workspace(&activity(FileEdit, &["src/a.rs", "/etc/passwd"]), &workspace));
        #[cfg(unix)]
        assert!(!stays_in_workspace(&activity(FileEdit, &["link/new-file"]), &workspace));
        assert!(!stays_in_workspace(&activity(FileEdit, &[]), &workspace));
        assert!(!stays_in_workspace(&activity(Command, &["src/a.rs"]), &workspace));
        for kind in [Fetch, Search, ToolCall, Unspecified] {
            assert!(!stays_in_workspace(&activity(kind, &["src/a.rs"]), &workspace), "{kind:?}");
        }
    }

    #[test]
    fn owner_calls_are_refused_from_web_origins() {
        assert!(check_owner("https://evil.example").is_err());
        assert!(check_owner("http://localhost:8080").is_err());
        assert!(check_owner("").is_err());
        assert!(check_owner(EXTENSION_ORIGIN).is_ok());
        assert!(check_owner("app:my-tool").is_ok());
    }

    #[test]
    fn only_approved_web_origins_pass_and_local_programs_always_do() {
        let c = Consent::default();
        assert!(!c.approved("https://a.example"));
        assert!(c.approved("app:tool"));
        c.apply(&pb::OriginConsent {
            origin: "https://a.example".into(),
            approved: true,
            approved_at_ms: 5,
            ..Default::default()
        });
        assert!(c.approved("https://a.example"));
        assert!(!c.approved("https://b.example"));
        assert!(!c.approved("https://a.example.evil"));
        c.forget("https://a.example");
        assert!(!c.approved("https://a.example"));
    }

    #[test]
    fn the_deepest_grant_decides_commands_and_a_withdrawn_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let inner = root.join("inner");
        std::fs::create_dir(&inner).unwrap();
        let policy = WorkspacePolicy::default();
        let c = Consent::default();
        let prepared =
            c.prepare_any(&consent("https://a.example", true, &[(&root, false), (&inner, true)]), &policy).unwrap();
        c.apply(&prepared);
        let site = "https://a.example";
        assert_eq!(
            c.workspace_grant(site, &inner.join("x"), false),
            WorkspaceGrant::Granted { may_approve_commands: true }
        );
        assert_eq!(
            c.workspace_grant(site, &root.join("y"), false),
            WorkspaceGrant::Granted { may_approve_commands: false }
        );
        assert_eq!(c.workspace_grant(site, Path::new("/elsewhere"), false), WorkspaceGrant::Withdrawn);
        assert_eq!(c.workspace_grant(site, Path::new("/elsewhere"), true), WorkspaceGrant::NotApplicable);
        assert!(c.check_workspace("https://other.example", &inner, false).is_err());
        let narrowed = c.prepare_any(&consent(site, true, &[(&inner, false)]), &policy).unwrap();
        c.apply(&narrowed);
        assert!(c.check_workspace(site, &root.join("y"), false).is_err());
        assert!(c.check_workspace(site, &inner, false).is_ok());
    }

    #[test]
    fn malformed_origins_and_folders_are_refused() {
        let c = Consent::default();
        let policy = WorkspacePolicy::default();
        for origin in ["app:x", "https://a.example/path", "https://a .example", "ftp://a.example", ""] {
            assert!(c.prepare_any(&consent(origin, true, &[]), &policy).is_err(), "{origin}");
        }
        for folder in ["relative/dir", "/does/not/exist/at/all"] {
            let mut request = consent("https://a.example", true, &[]);
            request.folders.push(pb::FolderGrant {
                path: folder.into(),
                may_approve_commands: false,
                ..Default::default()
            });
            assert_eq!(c.prepare_any(&request, &policy).unwrap_err().code(), ErrorCode::WorkspaceInvalid, "{folder}");
        }
        let too_many = pb::OriginConsent {
            origin: "https://a.example".into(),
            approved: true,
            folders: vec![
                pb::FolderGrant { path: "/tmp".into(), may_approve_commands: false, ..Default::default() };
                MAX_FOLDERS + 1
            ],
            ..Default::default()
        };
        assert_eq!(c.prepare_any(&too_many, &policy).unwrap_err().code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn a_sites_agents_and_session_limit_are_checked_stored_and_enforced() {
        let c = Consent::default();
        let policy = WorkspacePolicy::default();
        let site = "https://a.example";
        let known = |code: &str| ["scripted", "codex"].contains(&code);
        let mut asked = consent(site, true, &[]);
        asked.providers = vec!["scripted".into(), "codex".into(), "scripted".into()];
        asked.max_live_sessions = 2;
        let prepared = c.prepare(&asked, &policy, known).unwrap();
        assert_eq!(prepared.providers, ["codex", "scripted"], "sorted, each once");
        assert_eq!(prepared.max_live_sessions, 2);
        c.apply(&prepared);
        assert!(c.check_provider(site, "scripted").is_ok());
        let refused = c.check_provider(site, "claude").unwrap_err().to_pb();
        assert_eq!(refused.code, "ORIGIN_NOT_ALLOWED");
        assert_eq!(refused.details_json, r#"{"reason":"agent_not_allowed","provider":"claude"}"#);
        assert!(c.check_provider("https://other.example", "claude").is_ok(), "no consent names no agent");
        assert!(c.check_provider("app:tool", "claude").is_ok(), "a local program is not limited");
        assert_eq!(c.max_live_sessions(site), 2);
        assert_eq!(c.max_live_sessions("https://other.example"), 0);
        // A pick keeps them.
        let dir = tempfile::tempdir().unwrap();
        let (picked, _, _) = c.prepare_pick(site, &dir.path().display().to_string(), &policy).unwrap();
        assert_eq!((picked.providers.clone(), picked.max_live_sessions), (prepared.providers.clone(), 2));

        let mut unknown = consent(site, true, &[]);
        unknown.providers = vec!["nope".into()];
        let error = c.prepare(&unknown, &policy, known).unwrap_err().to_pb();
        assert_eq!(
            (error.code.as_str(), error.details_json.as_str()),
            ("INVALID_ARGUMENT", r#"{"field":"providers","provider":"nope"}"#)
        );
        let mut too_high = consent(site, true, &[]);
        too_high.max_live_sessions = limits::MAX_SITE_LIVE_SESSIONS + 1;
        assert_eq!(c.prepare(&too_high, &policy, known).unwrap_err().code(), ErrorCode::InvalidArgument);
        too_high.max_live_sessions = limits::MAX_SITE_LIVE_SESSIONS;
        assert!(c.prepare(&too_high, &policy, known).is_ok());
    }

    #[test]
    fn the_home_directory_and_its_parents_can_never_be_granted() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home/u");
        std::fs::create_dir_all(home.join("project")).unwrap();
        let home = home.canonicalize().unwrap();
        let policy = WorkspacePolicy::new(Some(&home), &[], &[]);
        let c = Consent::default();
        for folder in [home.clone(), home.parent().unwrap().to_path_buf(), PathBuf::from("/")] {
            let error = c.prepare_any(&consent("https://a.example", true, &[(&folder, false)]), &policy).unwrap_err();
            assert_eq!(error.code(), ErrorCode::WorkspaceNotAllowed, "{}", folder.display());
        }
        assert!(c.prepare_any(&consent("https://a.example", true, &[(&home.join("project"), false)]), &policy).is_ok());
    }
}
