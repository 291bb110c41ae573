//! Workspaces (managed vs application-managed) and the per-session runtime
//! directory `.pedelec-runtime/` holding assets and the skill/tool manifest.
//!
//! A managed workspace (no `workspace.path`) is `<workspaces dir>/<session>`
//! (`config::workspaces_dir`: outside the state directory, so an agent
//! working in it is nowhere near Core's database);
//! its runtime directory is `<ws>/.pedelec-runtime`. An explicit workspace may
//! be shared by several sessions, so each gets `<ws>/.pedelec-runtime/sessions/<session>`
//! for its own files (the manifest); the public assets are
//! `<ws>/.pedelec-runtime/assets/` for every session of the workspace.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use pedelec_protocol::{ErrorCode, json, limits, pb};

use crate::error::{CoreError, CoreResult};

pub const RUNTIME_DIR: &str = ".pedelec-runtime";
/// The folder below the runtime directory holding the public assets (`assets::area`).
pub const ASSETS_DIR: &str = "assets";
const MANIFEST: &str = ".pedelec-skills.json";

/// Opens a session's runtime directory `runtime` (below the workspace
/// `root`) through handles, never following a symlink at any level (see
/// `nofollow::open_below`); `create` makes missing levels. `Ok(None)`
/// when it does not exist. Core's own files there (the manifest, claude's
/// MCP config, the openai conversation) are written through the result.
pub fn open_runtime(root: &Path, runtime: &Path, create: bool) -> std::io::Result<Option<cap_std::fs::Dir>> {
    let relative = runtime.strip_prefix(root).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the runtime directory is not inside the workspace")
    })?;
    let levels: Vec<&str> = relative
        .components()
        .map(|c| match c {
            std::path::Component::Normal(name) => name.to_str().ok_or(std::io::ErrorKind::InvalidInput),
            _ => Err(std::io::ErrorKind::InvalidInput),
        })
        .collect::<Result<_, _>>()?;
    crate::nofollow::open_below(root, &levels, create)
}

/// A session's resolved workspace.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub root: PathBuf,
    pub managed: bool,
    pub runtime: PathBuf,
}

impl Workspace {
    fn new(root: PathBuf, managed: bool, session_id: &str) -> Self {
        let runtime =
            if managed { root.join(RUNTIME_DIR) } else { root.join(RUNTIME_DIR).join("sessions").join(session_id) };
        Workspace { root, managed, runtime }
    }

    /// The workspace of a stored session (nothing is created).
    pub fn recorded(root: &str, managed: bool, session_id: &str) -> Self {
        Self::new(PathBuf::from(root), managed, session_id)
    }

    /// The public assets: `<ws>/.pedelec-runtime/assets/`, shared by the
    /// sessions of an explicit workspace (the seed's layout).
    pub fn assets(&self) -> PathBuf {
        self.root.join(RUNTIME_DIR).join("assets")
    }

    /// Resolves a create request's workspace, creating a managed one when no
    /// path is given. An explicit path is resolved (symlinks, `..`) before
    /// `allowed` judges it, so a link cannot lead the check astray.
    pub fn resolve(
        spec: Option<&pb::WorkspaceSpec>,
        managed_root: &Path,
        session_id: &str,
        allowed: impl FnOnce(&Path) -> CoreResult<()>,
    ) -> CoreResult<Self> {
        let requested = spec.map(|s| s.path.as_str()).unwrap_or_default();
        if requested.is_empty() {
            let root = managed_root.join(session_id);
            std::fs::create_dir_all(&root).map_err(|e| CoreError::io("creating a managed workspace", e))?;
            return Ok(Self::new(root, true, session_id));
        }
        let invalid = |why: &str| {
            CoreError::with_details(
                ErrorCode::WorkspaceInvalid,
                format!("workspace path {requested:?} {why}"),
                serde_json::json!({ "path": requested }),
            )
        };
        if requested.len() > limits::MAX_WORKSPACE_PATH_BYTES || requested.contains('\0') {
            return Err(invalid("is too long or contains NUL"));
        }
        let path = Path::new(requested);
        if !path.is_absolute() {
            return Err(invalid("is not absolute"));
        }
        let canonical = path.canonicalize().map_err(|_| invalid("does not exist"))?;
        if !canonical.is_dir() {
            return Err(invalid("is not a directory"));
        }
        // The caller's rule first: for a path it may not open, that is the answer.
        allowed(&canonical)?;
        std::fs::create_dir_all(managed_root).map_err(|e| CoreError::io("creating the managed root", e))?;
        let managed = managed_root.canonicalize().map_err(|e| CoreError::io("resolving the managed root", e))?;
        if canonical.starts_with(&managed) || managed.starts_with(&canonical) {
            return Err(invalid("overlaps Core's managed workspace root"));
        }
        Ok(Self::new(canonical, false, session_id))
    }

    /// Creates the runtime directory and the asset folder and writes the
    /// skill/tool manifest, every level through a handle that refuses a
    /// symlink: an agent of an earlier session may have planted one to send
    /// Core's writes out of the workspace (`WORKSPACE_INVALID`).
    pub fn write_manifest(&self, skills: &pb::Skills) -> CoreResult<()> {
        let refused = |e: std::io::Error| {
            CoreError::with_details(
                ErrorCode::WorkspaceInvalid,
                format!("cannot prepare the session's runtime directory: {e}"),
                serde_json::json!({ "path": self.root.display().to_string() }),
            )
        };
        let dir = open_runtime(&self.root, &self.runtime, true)
            .and_then(|dir| dir.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
            .map_err(refused)?;
        dir.write(MANIFEST, json::to_json(skills)).map_err(|e| CoreError::io("writing the tool manifest", e))
    }

    fn open_failed(&self, why: String) -> CoreError {
        CoreError::with_details(
            ErrorCode::WorkspaceOpenFailed,
            why,
            serde_json::json!({ "workspace": self.root.display().to_string() }),
        )
    }

    /// `WORKSPACE_OPEN_FAILED` unless the workspace is still a directory.
    pub fn check_present(&self) -> CoreResult<()> {
        if !self.root.is_dir() {
            return Err(self.open_failed(format!("workspace {} is missing or not a directory", self.root.display())));
        }
        Ok(())
    }

    /// Loads the manifest file; any failure is `WORKSPACE_OPEN_FAILED`.
    /// Only for sessions stored before Core kept its own copy of their
    /// skills (`SessionRecord::skills_json`): the file is in the agent's
    /// reach, so what it says is not trusted where the stored copy exists.
    pub fn load_manifest(&self) -> CoreResult<pb::Skills> {
        let failed = |why: String| self.open_failed(why);
        self.check_present()?;
        let text = open_runtime(&self.root, &self.runtime, false)
            .and_then(|dir| dir.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
            .and_then(|dir| dir.read_to_string(MANIFEST))
            .map_err(|e| failed(format!("cannot read the session's tool manifest: {e}")))?;
        json::from_json(&text).map_err(|e| failed(format!("the session's tool manifest does not load: {e}")))
    }

    /// Makes the managed workspace `to` a copy of the managed workspace
    /// `from` (a fork's; see `fork_copy` for what is copied and the bounds).
    /// Over a bound it is `WORKSPACE_INVALID`; the caller removes `to`.
    pub fn copy_managed(from: &Path, to: &Path) -> CoreResult<()> {
        std::fs::create_dir_all(to).map_err(|e| CoreError::io("creating a managed workspace", e))?;
        let open = |path: &Path| cap_std::fs::Dir::open_ambient_dir(path, cap_std::ambient_authority());
        let source = open(from).map_err(|e| CoreError::io("opening the workspace to copy", e))?;
        let target = open(to).map_err(|e| CoreError::io("opening the workspace copy", e))?;
        match crate::fork_copy::copy_tree(&source, &target) {
            Ok(copied) => {
                tracing::debug!(?copied, from = %from.display(), "copied a managed workspace");
                Ok(())
            }
            Err(crate::fork_copy::CopyError::Io(e)) => Err(CoreError::io("copying the workspace", e)),
            Err(bound) => Err(CoreError::with_details(
                ErrorCode::WorkspaceInvalid,
                format!("the managed workspace cannot be copied for a fork: {bound}"),
                serde_json::json!({ "maxEntries": crate::fork_copy::MAX_COPY_ENTRIES, "maxBytes": crate::fork_copy::MAX_COPY_BYTES }),
            )),
        }
    }

    /// Copies `parent`'s runtime files (provider state Core keeps per
    /// session, such as the openai conversation) into this session's
    /// runtime directory in the same workspace, for a fork. A parent with
    /// no runtime directory has nothing to give.
    pub fn adopt_runtime_files(&self, parent: &Workspace) -> CoreResult<()> {
        let refused = |e: std::io::Error| {
            CoreError::with_details(
                ErrorCode::WorkspaceInvalid,
                format!("cannot prepare the session's runtime directory: {e}"),
                serde_json::json!({ "path": self.root.display().to_string() }),
            )
        };
        let Some(from) = open_runtime(&parent.root, &parent.runtime, false).map_err(refused)? else {
            return Ok(());
        };
        let to = open_runtime(&self.root, &self.runtime, true)
            .and_then(|dir| dir.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
            .map_err(refused)?;
        match crate::fork_copy::copy_files(&from, &to) {
            Ok(_) => Ok(()),
            Err(crate::fork_copy::CopyError::Io(e)) => Err(CoreError::io("copying the parent's runtime files", e)),
            Err(bound) => Err(CoreError::new(ErrorCode::WorkspaceInvalid, format!("the runtime files: {bound}"))),
        }
    }

    /// Removes a managed workspace; explicit workspaces are never touched.
    pub fn remove_if_managed(&self) {
        if self.managed
            && let Err(error) = std::fs::remove_dir_all(&self.root)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(%error, path = %self.root.display(), "could not remove a managed workspace");
        }
    }
}

/// Removes managed workspaces left behind that no recoverable session owns.
pub fn remove_stale_managed(managed_root: &Path, keep: &HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(managed_root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // Only what Core made: the root may be a folder the user chose
        // (`PEDELEC_WORKSPACES_DIR`), with other things in it.
        if name.starts_with("sess-") && !keep.contains(&name) {
            tracing::info!(workspace = %name, "removing a stale managed workspace");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether `path` (relative to `workspace` unless absolute) is inside the
/// workspace once `.`/`..` are folded and the part of it that exists is
/// resolved: a symlink inside that points out counts as outside, since the
/// agent may have made it. A path that cannot be read is outside. One rule
/// for Core's policy on agents' file requests and for who answers them.
pub fn resolves_inside(workspace: &Path, path: &str) -> bool {
    let root = workspace.canonicalize().unwrap_or_else(|_| workspace.to_path_buf());
    resolve_within(workspace, path).is_some_and(|p| p.starts_with(&root))
}

/// `path` (relative to `base` unless absolute) with `.`/`..` folded and
/// its deepest existing ancestor resolved; `None` when it cannot be read.
fn resolve_within(base: &Path, path: &str) -> Option<PathBuf> {
    use std::path::Component;
    if path.is_empty() || path.contains('\0') {
        return None;
    }
    let joined = base.join(path);
    let mut folded = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                folded.pop();
            }
            Component::CurDir => {}
            other => folded.push(other),
        }
    }
    // The part that exists is resolved (symlinks); the rest cannot be a link yet.
    let mut existing = folded.clone();
    let mut rest = Vec::new();
    while existing.symlink_metadata().is_err() {
        rest.push(existing.file_name()?.to_owned());
        if !existing.pop() {
            return None;
        }
    }
    let mut resolved = existing.canonicalize().ok()?;
    resolved.extend(rest.iter().rev());
    Some(resolved)
}
