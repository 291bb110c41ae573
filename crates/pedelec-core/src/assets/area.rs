//! A workspace's asset folder, `<ws>/.pedelec-runtime/assets`, reached only
//! through directory handles.
//!
//! The agent can write anywhere in its workspace, so any name below the
//! workspace may be swapped for a symlink at any moment — `.pedelec-runtime`
//! and `assets` themselves included. Checking a joined path and then using
//! it again would follow a link planted in between. So each level is opened
//! relative to the handle of the level above, refusing a symlink there (not
//! following it), and every file below is created, opened, renamed, removed
//! and listed relative to a handle, never through a path string. What is
//! checked is then the very thing used: a download serves the descriptor
//! whose `fstat` was checked.

use std::path::{Path, PathBuf};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use pedelec_protocol::{AssetPath, ErrorCode, limits, pb};

use super::{RESERVED_PREFIX, mime_for, random_hex};
use crate::error::{CoreError, CoreResult};
use crate::nofollow::{LevelError, open_level};
use crate::workspace::{ASSETS_DIR, RUNTIME_DIR};

/// The asset folder of one workspace, open.
pub struct Area {
    dir: Dir,
}

/// A level of the folder's own path that Core will not go through: a symlink
/// (to anywhere), or something that is not a directory.
fn refused(workspace: &Path, name: &str) -> CoreError {
    CoreError::with_details(
        ErrorCode::AssetPathInvalid,
        format!("{name} in the workspace is a symlink or not a directory; Core does not follow it"),
        serde_json::json!({ "workspace": workspace.display().to_string(), "entry": name }),
    )
}

fn not_found(path: &AssetPath) -> CoreError {
    CoreError::with_details(
        ErrorCode::AssetNotFound,
        format!("no asset at {path}"),
        serde_json::json!({ "path": path.as_str() }),
    )
}

impl Area {
    /// Opens `<workspace>/.pedelec-runtime/assets`, each level relative to
    /// the one above and never through a symlink. `create` makes missing
    /// levels (an upload); without it a missing folder is `None`. A
    /// symlinked or non-directory level is `ASSET_PATH_INVALID`.
    pub fn open(workspace: &Path, create: bool) -> CoreResult<Option<Area>> {
        // The workspace's own path was resolved when the session was created;
        // what the agent controls is what lies below it.
        let root = match Dir::open_ambient_dir(workspace, cap_std::ambient_authority()) {
            Ok(root) => root,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(CoreError::io(format!("opening the workspace {}", workspace.display()), e)),
        };
        let mut dir = root;
        for name in [RUNTIME_DIR, ASSETS_DIR] {
            dir = match open_level(&dir, name, create) {
                Ok(Some(next)) => next,
                Ok(None) => return Ok(None),
                Err(LevelError::Refused) => {
                    tracing::warn!(workspace = %workspace.display(), name, "refused a symlinked asset folder level");
                    return Err(refused(workspace, name));
                }
                Err(LevelError::Io(e)) => {
                    return Err(CoreError::io(format!("opening {name} in {}", workspace.display()), e));
                }
            };
        }
        Ok(Some(Area { dir }))
    }

    /// Like [`Area::open`] for a reader: a missing folder holds no asset at `path`.
    pub fn open_existing(workspace: &Path, path: &AssetPath) -> CoreResult<Area> {
        Self::open(workspace, false)?.ok_or_else(|| not_found(path))
    }

    /// The directory holding `path`'s last segment, every parent opened
    /// without following a symlink; `create` makes missing parents.
    fn parent_of(&self, path: &AssetPath, create: bool) -> Result<Option<Dir>, LevelError> {
        let segments: Vec<&str> = path.segments().collect();
        let mut dir = self.dir.try_clone()?;
        for segment in &segments[..segments.len().saturating_sub(1)] {
            dir = match open_level(&dir, segment, create)? {
                Some(next) => next,
                None => return Ok(None),
            };
        }
        Ok(Some(dir))
    }

    /// Opens the regular file at `path` for reading: no symlink at any
    /// level, and its metadata from the open descriptor (`fstat`), so what
    /// was checked is what is read.
    pub fn open_file(&self, path: &AssetPath) -> CoreResult<(std::fs::File, std::fs::Metadata)> {
        let parent = self.parent_of(path, false).ok().flatten().ok_or_else(|| not_found(path))?;
        let mut options = OpenOptions::new();
        options.read(true).follow(FollowSymlinks::No);
        // A FIFO planted under the name would block the open until a
        // writer came; non-blocking, it opens and fails the check below.
        #[cfg(unix)]
        cap_std::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
        let file = parent.open_with(path.file_name(), &options).map_err(|_| not_found(path))?.into_std();
        let meta = file.metadata().map_err(|_| not_found(path))?;
        if !meta.is_file() {
            return Err(not_found(path));
        }
        Ok((file, meta))
    }

    /// Whether anything (a link included) is at `path`.
    pub fn occupied(&self, path: &AssetPath) -> bool {
        match self.parent_of(path, false) {
            Ok(Some(parent)) => parent.symlink_metadata(path.file_name()).is_ok(),
            Ok(None) => false,
            // Cannot be looked into: not a free name either.
            Err(_) => true,
        }
    }

    /// The size of the regular file at `path`, 0 when there is none.
    pub fn size_of(&self, path: &AssetPath) -> u64 {
        match self.parent_of(path, false) {
            Ok(Some(parent)) => {
                parent.symlink_metadata(path.file_name()).ok().filter(|m| m.is_file()).map_or(0, |m| m.len())
            }
            _ => 0,
        }
    }

    /// Every completed regular file, by the seed's rules: every level, no
    /// directories, symlinks neither returned nor followed, `.pedelec-`
    /// names hidden at every level, newest first then by name.
    pub fn list(&self) -> Vec<pb::Asset> {
        let mut out = Vec::new();
        walk(&self.dir, "", 0, Names::Public, &mut |name, path, meta| {
            let Ok(path) = AssetPath::parse(path) else { return };
            out.push(pb::Asset {
                mime_type: mime_for(name).into(),
                name: name.to_owned(),
                path: path.to_string(),
                size: meta.len(),
                modified_at_ms: modified_ms(meta.modified().ok().map(|t| t.into_std())),
            });
        });
        // The seed: newest first, then by name; the path only settles equal
        // names on different levels, so the order is total.
        out.sort_by(|a, b| {
            b.modified_at_ms.cmp(&a.modified_at_ms).then_with(|| a.name.cmp(&b.name)).then_with(|| a.path.cmp(&b.path))
        });
        out
    }

    /// The bytes of every regular file in the folder, Core's own unlanded
    /// uploads included (they are on the way in).
    pub fn used_bytes(&self) -> u64 {
        let mut total = 0u64;
        walk(&self.dir, "", 0, Names::All, &mut |_, _, meta| total = total.saturating_add(meta.len()));
        total
    }

    /// Creates an upload's temporary file in the folder: a reserved name, so
    /// no listing shows it and no asset path reaches it, and on the same
    /// filesystem as its destination, so landing it is one rename.
    pub fn stage(&self) -> std::io::Result<(String, std::fs::File)> {
        let name = format!("{RESERVED_PREFIX}upload-{}", random_hex(8));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).follow(FollowSymlinks::No);
        let file = self.dir.open_with(&name, &options)?.into_std();
        Ok((name, file))
    }

    /// Renames the staged file `temp` to `target`, creating missing parents
    /// and refusing symlinks and non-directories on the way; an existing
    /// regular file is replaced, a directory or a symlink is not.
    pub fn land(&self, temp: &str, target: &AssetPath) -> Result<(), Landing> {
        let parent = match self.parent_of(target, true) {
            Ok(Some(parent)) => parent,
            Ok(None) => return Err(Landing::Refused(format!("a parent of {target} vanished"))),
            Err(e) => return Err(Landing::Refused(format!("a parent of {target} is a symlink or a file: {e}"))),
        };
        match parent.symlink_metadata(target.file_name()) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Landing::Refused(format!("{target} is a symlink")));
            }
            Ok(meta) if meta.is_dir() => return Err(Landing::Refused(format!("{target} is a directory"))),
            _ => {}
        }
        // rename(2) replaces a name, never follows it: were `target` swapped
        // for a link since the check, the link itself would be replaced.
        self.dir.rename(temp, &parent, target.file_name()).map_err(Landing::Failed)
    }

    /// Removes a staged file that did not land.
    pub fn discard(&self, temp: &str) {
        if let Err(error) = self.dir.remove_file(temp)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(%error, temp, "could not remove an unlanded upload");
        }
    }

    /// Where `path` is on disk, for telling an agent (never for opening).
    pub fn display_path(workspace: &Path, path: &AssetPath) -> PathBuf {
        path.join_to(&workspace.join(RUNTIME_DIR).join(ASSETS_DIR))
    }
}

/// Why a staged upload did not land.
#[derive(Debug, thiserror::Error)]
pub enum Landing {
    /// The target or a parent is a symlink, a directory or a file in the way.
    #[error("{0}")]
    Refused(String),
    #[error("renaming the upload into place: {0}")]
    Failed(#[source] std::io::Error),
}

/// Which files a walk visits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    /// The public ones: `.pedelec-` names are skipped at every level.
    Public,
    /// Core's own too (its unlanded uploads).
    All,
}

/// Visits every regular file below `dir` (`prefix` is its asset path) with
/// its name, asset path and metadata; symlinks are neither visited nor
/// followed. Holds one descriptor per level, and goes no deeper than an
/// asset path can.
fn walk(
    dir: &Dir,
    prefix: &str,
    depth: usize,
    names: Names,
    visit: &mut dyn FnMut(&str, &str, &cap_std::fs::Metadata),
) {
    if depth >= limits::MAX_ASSET_PATH_SEGMENTS {
        return;
    }
    let Ok(entries) = dir.entries() else { return };
    let mut subdirs = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else { continue };
        if names == Names::Public && name.starts_with(RESERVED_PREFIX) {
            continue;
        }
        let Ok(file_type) = entry.file_type() else { continue };
        if file_type.is_symlink() {
            continue;
        }
        let path = format!("{prefix}/{name}");
        if file_type.is_dir() {
            // Opened after this directory's listing is done, so a walk never
            // holds more descriptors than levels.
            subdirs.push((name, path));
        } else if file_type.is_file()
            && let Ok(meta) = entry.metadata()
        {
            visit(&name, &path, &meta);
        }
    }
    for (name, path) in subdirs {
        if let Ok(Some(sub)) = open_level(dir, &name, false) {
            walk(&sub, &path, depth + 1, names, visit);
        }
    }
}

pub(super) fn modified_ms(modified: Option<std::time::SystemTime>) -> i64 {
    modified.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn path(text: &str) -> AssetPath {
        AssetPath::parse(text).unwrap()
    }

    fn code(result: CoreResult<Option<Area>>) -> Option<ErrorCode> {
        result.err().map(|e| e.code())
    }

    #[test]
    fn a_linked_level_of_the_folder_is_refused_wherever_it_points() {
        let ws = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        // Missing without `create`: no folder, no error; with it: made.
        assert!(Area::open(ws.path(), false).unwrap().is_none());
        assert!(Area::open(ws.path(), true).unwrap().is_some());
        let runtime = ws.path().join(RUNTIME_DIR);
        let assets = runtime.join(ASSETS_DIR);
        // A link inside the workspace is refused as much as one out of it.
        std::fs::remove_dir(&assets).unwrap();
        std::fs::create_dir(ws.path().join("inside")).unwrap();
        for target in [elsewhere.path().to_path_buf(), ws.path().join("inside")] {
            symlink(&target, &assets).unwrap();
            for create in [false, true] {
                assert_eq!(code(Area::open(ws.path(), create)), Some(ErrorCode::AssetPathInvalid), "{target:?}");
            }
            std::fs::remove_file(&assets).unwrap();
        }
        // A file in the folder's place is refused too.
        std::fs::write(&assets, "x").unwrap();
        assert_eq!(code(Area::open(ws.path(), true)), Some(ErrorCode::AssetPathInvalid));
        std::fs::remove_file(&assets).unwrap();
        std::fs::remove_dir_all(&runtime).unwrap();
        symlink(elsewhere.path(), &runtime).unwrap();
        assert_eq!(code(Area::open(ws.path(), true)), Some(ErrorCode::AssetPathInvalid));
        assert!(std::fs::read_dir(elsewhere.path()).unwrap().next().is_none(), "nothing made through the link");
    }

    #[test]
    fn files_are_reached_and_landed_without_following_links() {
        let ws = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("secret"), "key").unwrap();
        let area = Area::open(ws.path(), true).unwrap().unwrap();
        let root = ws.path().join(RUNTIME_DIR).join(ASSETS_DIR);
        symlink(elsewhere.path(), root.join("dir")).unwrap();
        symlink(elsewhere.path().join("secret"), root.join("file")).unwrap();
        for linked in ["/dir/secret", "/file"] {
            assert_eq!(area.open_file(&path(linked)).unwrap_err().code(), ErrorCode::AssetNotFound, "{linked}");
        }
        // Landing through a linked parent, or onto a link, is refused and
        // writes nothing outside.
        for target in ["/dir/owned", "/file"] {
            let (temp, _) = area.stage().unwrap();
            assert!(matches!(area.land(&temp, &path(target)), Err(Landing::Refused(_))), "{target}");
            area.discard(&temp);
        }
        assert_eq!(std::fs::read_to_string(elsewhere.path().join("secret")).unwrap(), "key");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 1);
        // A real upload lands, counts, lists; its temporary file counted
        // while it was there, and was never listed.
        let (temp, mut file) = area.stage().unwrap();
        std::io::Write::write_all(&mut file, b"12345").unwrap();
        assert_eq!(area.used_bytes(), 5, "an unlanded upload counts");
        assert!(area.list().is_empty(), "an unlanded upload is not listed");
        area.land(&temp, &path("/new/a.txt")).unwrap();
        assert_eq!(area.used_bytes(), 5);
        assert_eq!(area.size_of(&path("/new/a.txt")), 5);
        let listed: Vec<String> = area.list().into_iter().map(|a| a.path).collect();
        assert_eq!(listed, ["/new/a.txt"], "links neither listed nor followed");
        let (file, meta) = area.open_file(&path("/new/a.txt")).unwrap();
        assert_eq!((meta.len(), std::io::read_to_string(file).unwrap().as_str()), (5, "12345"));
        assert!(area.occupied(&path("/file")) && !area.occupied(&path("/free")));
    }
}
