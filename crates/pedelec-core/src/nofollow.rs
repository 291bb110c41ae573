//! Directories opened level by level through handles, never through a
//! symlink. The agent can write anywhere in its workspace, so any name
//! below it may be swapped for a link at any moment; each level is opened
//! relative to the handle of the level above, refusing a link there.

use std::path::Path;

use cap_fs_ext::DirExt;
use cap_std::fs::Dir;

/// Why a directory level could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LevelError {
    /// A symlink (to anywhere) or not a directory: never gone through.
    #[error("a symlink or not a directory")]
    Refused,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Opens the directory `name` below `parent` without following a symlink;
/// `None` when it does not exist (and `create` is off).
pub fn open_level(parent: &Dir, name: &str, create: bool) -> Result<Option<Dir>, LevelError> {
    if create {
        // mkdirat never follows a symlink at its last component: a planted
        // link makes it fail with "exists", and the check below refuses it.
        match parent.create_dir(name) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
    }
    match parent.symlink_metadata(name) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
        Ok(meta) if meta.file_type().is_symlink() || !meta.is_dir() => return Err(LevelError::Refused),
        Ok(_) => {}
    }
    // Checked above for a clear answer; refused here too should the name
    // have been swapped for a link since (the open fails on a link).
    parent.open_dir_nofollow(name).map(Some).map_err(|_| LevelError::Refused)
}

/// Opens the directory `levels` below `root` (a resolved workspace), each
/// level relative to the one above and never through a symlink, creating
/// missing levels when `create`; `Ok(None)` when one is missing. A level
/// that is a symlink (to anywhere) or not a directory is an error of kind
/// `InvalidInput`. For Core's own files in the runtime directory, which the
/// agent could otherwise redirect by planting a link.
pub fn open_below(root: &Path, levels: &[&str], create: bool) -> std::io::Result<Option<Dir>> {
    let mut dir = match Dir::open_ambient_dir(root, cap_std::ambient_authority()) {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
        Err(e) => return Err(e),
    };
    for name in levels {
        dir = match open_level(&dir, name, create) {
            Ok(Some(next)) => next,
            Ok(None) => return Ok(None),
            Err(LevelError::Refused) => {
                tracing::warn!(workspace = %root.display(), name, "refused a symlinked runtime directory level");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{name} in {} is a symlink or not a directory; Core does not follow it", root.display()),
                ));
            }
            Err(LevelError::Io(e)) => return Err(e),
        };
    }
    Ok(Some(dir))
}
