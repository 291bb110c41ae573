//! The folder picker's side in Core (issue 42): listing a folder's
//! sub-folders for the user's picker page (`Core.ListFolders`) and the
//! opaque workspace handles a pick mints (`Core.PickFolder`).
//!
//! The rules:
//! - only names are listed, sorted, at most [`MAX_LISTED`], hidden ones
//!   only when asked; a name that is not UTF-8 is left out (it could not
//!   be picked back);
//! - each entry says whether the workspace policy would ever allow it; a
//!   symbolic link is listed as a link and never followed, not even to see
//!   whether it names a folder, so a link planted in a listed folder can
//!   lead the picker nowhere;
//! - the inside of a protected directory (a secret store, Core's own) is
//!   never listed;
//! - a handle is 128 random bits, bound by the consent entry that holds it
//!   to one origin and one folder (`consent`).

use std::path::{Path, PathBuf};

use pedelec_protocol::{ErrorCode, limits, pb};

use crate::error::{CoreError, CoreResult};
use crate::workspace_policy::WorkspacePolicy;

/// The most entries one listing returns (`truncated` says when more).
pub const MAX_LISTED: usize = 1000;

/// The most directory entries one listing reads, so a folder with
/// millions of files answers in bounded time.
const MAX_SCANNED: usize = 100_000;

/// The prefix of every workspace handle.
pub const HANDLE_PREFIX: &str = "wsh-";

/// A new workspace handle: `wsh-` and 32 lowercase hex digits.
pub fn mint_handle() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HANDLE_PREFIX}{hex}")
}

/// Whether `handle` is spelled as Core mints them (checked before any lookup).
pub fn well_formed_handle(handle: &str) -> bool {
    handle
        .strip_prefix(HANDLE_PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// `path` as a request names it: absolute, no NUL, bounded.
fn requested(path: &str) -> CoreResult<&Path> {
    let invalid = |why: &str| {
        CoreError::with_details(
            ErrorCode::InvalidArgument,
            format!("folder path {why}"),
            serde_json::json!({ "field": "path", "reason": why }),
        )
    };
    if path.len() > limits::MAX_WORKSPACE_PATH_BYTES {
        return Err(invalid("is too long"));
    }
    if path.contains('\0') {
        return Err(invalid("contains NUL"));
    }
    if !Path::new(path).is_absolute() {
        return Err(invalid("is not absolute"));
    }
    Ok(Path::new(path))
}

/// `path` resolved to an existing directory.
fn directory(path: &Path) -> CoreResult<PathBuf> {
    let invalid = |why: &str| {
        CoreError::with_details(
            ErrorCode::WorkspaceInvalid,
            format!("folder {} {why}", path.display()),
            serde_json::json!({ "path": path.display().to_string() }),
        )
    };
    let resolved = path.canonicalize().map_err(|_| invalid("does not exist"))?;
    if !resolved.is_dir() {
        return Err(invalid("is not a directory"));
    }
    Ok(resolved)
}

/// `Core.ListFolders`: the sub-folders of `path` (empty: the home directory).
pub fn list(policy: &WorkspacePolicy, path: &str, include_hidden: bool) -> CoreResult<pb::ListFoldersResponse> {
    let home = policy.home().map(Path::to_path_buf);
    let start = if path.is_empty() {
        home.clone().ok_or_else(|| {
            CoreError::with_details(
                ErrorCode::InvalidArgument,
                "Core knows no home directory: name a folder",
                serde_json::json!({ "field": "path", "reason": "no_home" }),
            )
        })?
    } else {
        requested(path)?.to_path_buf()
    };
    let folder = directory(&start)?;
    if let Some(protected) = policy.inside_protected(&folder) {
        return Err(CoreError::with_details(
            ErrorCode::WorkspaceNotAllowed,
            format!("{} is never listed: it lies in {}", folder.display(), protected.display()),
            serde_json::json!({ "path": folder.display().to_string(), "reason": "forbidden" }),
        ));
    }
    let reading = |e: std::io::Error| CoreError::io("listing a folder", e);
    let mut folders = Vec::new();
    let mut truncated = false;
    for (scanned, entry) in std::fs::read_dir(&folder).map_err(reading)?.enumerate() {
        if scanned >= MAX_SCANNED {
            truncated = true;
            break;
        }
        let Ok(entry) = entry else { continue };
        // The entry's own type: a link is not followed.
        let Ok(kind) = entry.file_type() else { continue };
        let Ok(name) = entry.file_name().into_string() else { continue };
        if !include_hidden && name.starts_with('.') {
            continue;
        }
        let listed = if kind.is_symlink() {
            pb::FolderEntry { name, link: true, pickable: false, reason: "link".into() }
        } else if kind.is_dir() {
            let forbidden = policy.never(&folder.join(&name)).is_some();
            let reason = if forbidden { "forbidden" } else { "" };
            pb::FolderEntry { name, link: false, pickable: !forbidden, reason: reason.into() }
        } else {
            continue;
        };
        folders.push(listed);
    }
    folders.sort_by(|a, b| a.name.cmp(&b.name));
    if folders.len() > MAX_LISTED {
        folders.truncate(MAX_LISTED);
        truncated = true;
    }
    let forbidden = policy.never(&folder).is_some();
    Ok(pb::ListFoldersResponse {
        parent: folder.parent().map(|p| p.display().to_string()).unwrap_or_default(),
        path: folder.display().to_string(),
        pickable: !forbidden,
        reason: if forbidden { "forbidden".into() } else { String::new() },
        folders,
        truncated,
        home: home.map(|h| h.display().to_string()).unwrap_or_default(),
    })
}

/// The name a site is told for a picked folder: its base name.
pub fn base_name(folder: &Path) -> String {
    folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (tempfile::TempDir, PathBuf, WorkspacePolicy) {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().canonicalize().unwrap().join("home");
        for sub in ["b-project", "a-project", ".hidden", ".ssh/keys", "state/pedelec"] {
            std::fs::create_dir_all(home.join(sub)).unwrap();
        }
        std::fs::write(home.join("notes.txt"), "not a folder").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(home.join(".ssh"), home.join("keys-link")).unwrap();
        let policy = WorkspacePolicy::new(Some(&home), &[], &[&home.join("state/pedelec")]);
        (dir, home, policy)
    }

    #[test]
    fn lists_sorted_sub_folders_marking_what_may_never_be_picked_and_links() {
        let (_dir, home, policy) = fixture();
        let listed = list(&policy, "", false).unwrap();
        assert_eq!(listed.path, home.display().to_string());
        assert_eq!(listed.home, listed.path);
        assert!(!listed.pickable, "the home directory itself");
        assert_eq!(listed.reason, "forbidden");
        let names: Vec<(&str, bool, bool, &str)> =
            listed.folders.iter().map(|f| (f.name.as_str(), f.link, f.pickable, f.reason.as_str())).collect();
        #[cfg(unix)]
        assert_eq!(
            names,
            [
                ("a-project", false, true, ""),
                ("b-project", false, true, ""),
                ("keys-link", true, false, "link"),
                ("state", false, false, "forbidden"),
            ]
        );
        let hidden = list(&policy, &home.display().to_string(), true).unwrap();
        let ssh = hidden.folders.iter().find(|f| f.name == ".ssh").unwrap();
        assert!(!ssh.pickable && ssh.reason == "forbidden");
        assert!(hidden.folders.iter().any(|f| f.name == ".hidden" && f.pickable));
        let project = list(&policy, &home.join("a-project").display().to_string(), false).unwrap();
        assert!(project.pickable && project.folders.is_empty());
        assert_eq!(project.parent, home.display().to_string());
    }

    #[test]
    fn bad_paths_are_refused_with_their_codes() {
        let (_dir, home, policy) = fixture();
        for bad in ["relative/dir", "/a\0b", &format!("/{}", "x".repeat(5000))] {
            assert_eq!(list(&policy, bad, false).unwrap_err().code(), ErrorCode::InvalidArgument, "{bad:?}");
        }
        for missing in [home.join("nope"), home.join("notes.txt")] {
            let code = list(&policy, &missing.display().to_string(), false).unwrap_err().code();
            assert_eq!(code, ErrorCode::WorkspaceInvalid, "{}", missing.display());
        }
        let inside = list(&policy, &home.join(".ssh").display().to_string(), true).unwrap_err();
        assert_eq!(inside.code(), ErrorCode::WorkspaceNotAllowed);
        let no_home = WorkspacePolicy::new(None, &[], &[]);
        assert_eq!(list(&no_home, "", false).unwrap_err().code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn a_listing_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for i in 0..MAX_LISTED + 5 {
            std::fs::create_dir(root.join(format!("d{i:05}"))).unwrap();
        }
        let policy = WorkspacePolicy::new(None, &[], &[]);
        let listed = list(&policy, &root.display().to_string(), false).unwrap();
        assert_eq!(listed.folders.len(), MAX_LISTED);
        assert!(listed.truncated);
        assert_eq!(listed.folders[0].name, "d00000");
    }

    #[test]
    fn handles_are_random_and_well_formed() {
        let (a, b) = (mint_handle(), mint_handle());
        assert_ne!(a, b);
        assert!(well_formed_handle(&a), "{a}");
        for bad in ["", "wsh-", "wsh-XYZ", "ws-0123456789abcdef0123456789abcdef", "/home/u/project"] {
            assert!(!well_formed_handle(bad), "{bad}");
        }
    }
}
