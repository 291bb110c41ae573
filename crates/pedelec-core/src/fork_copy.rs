//! The files a forked session takes from its parent (`Registry::fork`): a
//! copy of a managed workspace, or of the parent's own runtime directory
//! (the provider state Core keeps there, like the openai conversation) in a
//! shared workspace.
//!
//! The parent's agent can write anywhere in its workspace, so every name is
//! hostile: folders are opened through handles without following a link
//! (`nofollow::open_level`), files are opened with `O_NOFOLLOW`, and
//! symlinks, sockets and devices are not copied at all. A copy is bounded
//! (entries and bytes) so a fork cannot fill the disk on the parent's
//! behalf; over a bound, the copy is removed and the fork refused.

use std::io::{Read, Write};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};

use crate::nofollow::{LevelError, open_level};

/// At most this many files and folders in a copied managed workspace.
pub const MAX_COPY_ENTRIES: usize = 20_000;
/// At most this many bytes of file content in a copied managed workspace.
pub const MAX_COPY_BYTES: u64 = 256 * 1024 * 1024;
/// Folders nested deeper than this are not copied.
const MAX_DEPTH: usize = 64;

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the workspace has more than {MAX_COPY_ENTRIES} files and folders")]
    TooManyEntries,
    #[error("the workspace holds more than {} MiB", MAX_COPY_BYTES / (1024 * 1024))]
    TooLarge,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What a copy took, and what it left out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub files: usize,
    pub folders: usize,
    pub bytes: u64,
    /// Symlinks, special files and too-deep folders, not copied.
    pub skipped: usize,
}

/// Copies the tree below `from` into `to` (which exists, empty), within
/// [`MAX_COPY_ENTRIES`] and [`MAX_COPY_BYTES`].
pub fn copy_tree(from: &Dir, to: &Dir) -> Result<Copied, CopyError> {
    let mut copied = Copied::default();
    copy_level(from, to, 0, &mut copied)?;
    Ok(copied)
}

fn copy_level(from: &Dir, to: &Dir, depth: usize, copied: &mut Copied) -> Result<(), CopyError> {
    for entry in from.entries()? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            copied.skipped += 1;
            continue;
        };
        if copied.files + copied.folders >= MAX_COPY_ENTRIES {
            return Err(CopyError::TooManyEntries);
        }
        let meta = match from.symlink_metadata(&name) {
            Ok(meta) => meta,
            // Gone since it was listed: the agent is still at work.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        if meta.is_dir() {
            if depth >= MAX_DEPTH {
                copied.skipped += 1;
                continue;
            }
            let (source, target) = match (open_level(from, &name, false), open_level(to, &name, true)) {
                (Ok(Some(source)), Ok(Some(target))) => (source, target),
                // Swapped for a link (or removed) since it was listed.
                (Err(LevelError::Refused) | Ok(None), _) => {
                    copied.skipped += 1;
                    continue;
                }
                (Err(LevelError::Io(e)), _) | (_, Err(LevelError::Io(e))) => return Err(e.into()),
                (_, Err(LevelError::Refused) | Ok(None)) => {
                    return Err(std::io::Error::other(format!("cannot make folder {name} in the copy")).into());
                }
            };
            copied.folders += 1;
            copy_level(&source, &target, depth + 1, copied)?;
        } else if meta.is_file() {
            copied.files += 1;
            copy_file(from, to, &name, copied)?;
        } else {
            copied.skipped += 1;
        }
    }
    Ok(())
}

/// Copies the regular file `name`, never through a link, counting its
/// bytes against [`MAX_COPY_BYTES`] as they are read (a file growing while
/// it is copied cannot slip past the bound).
fn copy_file(from: &Dir, to: &Dir, name: &str, copied: &mut Copied) -> Result<(), CopyError> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    let mut source = match from.open_with(name, &options) {
        Ok(file) => file,
        // Swapped for a link or removed since it was listed.
        Err(_) => {
            copied.skipped += 1;
            return Ok(());
        }
    };
    if !source.metadata()?.is_file() {
        copied.skipped += 1;
        return Ok(());
    }
    let mut create = OpenOptions::new();
    create.write(true).create_new(true).follow(FollowSymlinks::No);
    let mut target = to.open_with(name, &create)?;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = source.read(&mut buffer)?;
        if read == 0 {
            return Ok(());
        }
        copied.bytes += read as u64;
        if copied.bytes > MAX_COPY_BYTES {
            return Err(CopyError::TooLarge);
        }
        target.write_all(&buffer[..read])?;
    }
}

/// Copies the regular files directly in `from` (not its folders) into
/// `to`: a parent's runtime directory in a shared workspace holds Core's
/// per-session files (the manifest, which the fork rewrites, the openai
/// conversation), each small.
pub fn copy_files(from: &Dir, to: &Dir) -> Result<Copied, CopyError> {
    let mut copied = Copied::default();
    for entry in from.entries()? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        if copied.files >= MAX_COPY_ENTRIES {
            return Err(CopyError::TooManyEntries);
        }
        match from.symlink_metadata(&name) {
            Ok(meta) if meta.is_file() => {
                copied.files += 1;
                copy_file(from, to, &name, &mut copied)?;
            }
            Ok(_) => copied.skipped += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(copied)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn dir(path: &std::path::Path) -> Dir {
        Dir::open_ambient_dir(path, cap_std::ambient_authority()).unwrap()
    }

    #[test]
    fn copies_files_and_folders_but_no_link() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "outside").unwrap();
        std::fs::create_dir_all(from.path().join("src/deep")).unwrap();
        std::fs::write(from.path().join("src/deep/a.txt"), "alpha").unwrap();
        std::fs::write(from.path().join("top.txt"), "top").unwrap();
        // The agent's links: to a file outside, and to a folder outside.
        std::os::unix::fs::symlink(outside.path().join("secret"), from.path().join("leak")).unwrap();
        std::os::unix::fs::symlink(outside.path(), from.path().join("src/away")).unwrap();
        let copied = copy_tree(&dir(from.path()), &dir(to.path())).unwrap();
        assert_eq!(std::fs::read_to_string(to.path().join("src/deep/a.txt")).unwrap(), "alpha");
        assert_eq!(std::fs::read_to_string(to.path().join("top.txt")).unwrap(), "top");
        assert!(to.path().join("leak").symlink_metadata().is_err(), "no link copied, nor what it points at");
        assert!(to.path().join("src/away").symlink_metadata().is_err());
        assert_eq!(copied, Copied { files: 2, folders: 2, bytes: 8, skipped: 2 });
    }

    #[test]
    fn a_copy_over_the_entry_bound_is_refused() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        for i in 0..=MAX_COPY_ENTRIES {
            std::fs::File::create(from.path().join(format!("f{i}"))).unwrap();
        }
        assert!(matches!(copy_tree(&dir(from.path()), &dir(to.path())), Err(CopyError::TooManyEntries)));
    }

    #[test]
    fn runtime_files_copy_takes_files_only() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        std::fs::write(from.path().join("openai-history.json"), "[]").unwrap();
        std::fs::create_dir(from.path().join("folder")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", from.path().join("link")).unwrap();
        let copied = copy_files(&dir(from.path()), &dir(to.path())).unwrap();
        assert_eq!(copied.files, 1);
        assert_eq!(std::fs::read_to_string(to.path().join("openai-history.json")).unwrap(), "[]");
        assert!(!to.path().join("folder").exists() && to.path().join("link").symlink_metadata().is_err());
    }
}
