//! What a turn changed in its workspace: a snapshot of the files taken when
//! the turn starts, compared with the workspace when it ends. Core computes
//! it for every agent, so an application shows a review without reading a
//! file itself.
//!
//! The agent writes anywhere in its workspace and may plant links, so the
//! walk goes level by level through directory handles and never through a
//! symlink (a link is recorded as a link, by its target text), and files are
//! opened without following one. Everything is bounded: the files looked
//! at, the bytes kept to diff, each diff and the whole answer. Past a bound
//! the answer says it is incomplete rather than growing.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use pedelec_protocol::pb;

/// Directories never walked: Core's own runtime folder, version-control
/// internals and dependency or build trees (large, and not the agent's work).
const SKIPPED_DIRS: &[&str] = &[crate::workspace::RUNTIME_DIR, ".git", ".hg", ".svn", "node_modules", "target"];

/// Files looked at per snapshot; past it the snapshot is incomplete.
pub const MAX_FILES: usize = 100_000;
/// Directory depth walked.
const MAX_DEPTH: usize = 32;
/// A file's bytes are kept (to diff) up to this size; a larger one is
/// compared by size and modification time.
const MAX_KEPT_FILE: u64 = 256 * 1024;
/// Bytes kept across one snapshot.
const MAX_KEPT_TOTAL: u64 = 64 * 1024 * 1024;
/// One file's unified diff, at most.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;
/// All diffs of one answer, at most; later files are listed without one.
pub const MAX_DIFFS_TOTAL: usize = 1024 * 1024;
/// Files listed in one answer.
pub const MAX_LISTED: usize = 2_000;

/// One path's state in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A regular file; its bytes when kept (to diff).
    File {
        size: u64,
        modified: Option<SystemTime>,
        bytes: Option<Arc<Vec<u8>>>,
    },
    Link {
        target: String,
    },
}

impl Entry {
    /// Unchanged: the same bytes where both readings kept them, else the
    /// same size and modification time (nanoseconds where the system has them).
    fn same_as(&self, other: &Entry) -> bool {
        match (self, other) {
            (Entry::Link { target: a }, Entry::Link { target: b }) => a == b,
            (Entry::File { size: s1, modified: m1, bytes: b1 }, Entry::File { size: s2, modified: m2, bytes: b2 }) => {
                match (b1, b2) {
                    (Some(a), Some(b)) => a == b,
                    _ => s1 == s2 && m1 == m2 && m1.is_some(),
                }
            }
            _ => false,
        }
    }
}

/// The workspace's files at one moment, by `/`-separated relative path.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    entries: BTreeMap<String, Entry>,
    /// A bound was reached: some files were not looked at.
    incomplete: bool,
    kept: u64,
}

impl Snapshot {
    /// Walks `root` (blocking). A workspace that cannot be opened is an
    /// empty, incomplete snapshot: the turn goes on, its changes say so.
    pub fn take(root: &Path) -> Snapshot {
        Snapshot::take_after(root, None)
    }

    /// [`Snapshot::take`], reusing `previous`'s reading of every file whose
    /// size and modification time are unchanged, so a turn in a large
    /// folder reads only what changed since the last snapshot.
    pub fn take_after(root: &Path, previous: Option<&Snapshot>) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let previous = previous.map(|p| &p.entries);
        match Dir::open_ambient_dir(root, cap_std::ambient_authority()) {
            Ok(dir) => snapshot.walk(&dir, "", 0, previous),
            Err(error) => {
                tracing::warn!(%error, root = %root.display(), "the workspace could not be opened for its snapshot");
                snapshot.incomplete = true;
            }
        }
        snapshot
    }

    fn walk(&mut self, dir: &Dir, prefix: &str, depth: usize, previous: Option<&BTreeMap<String, Entry>>) {
        let Ok(entries) = dir.entries() else {
            self.incomplete = true;
            return;
        };
        let mut names: Vec<String> =
            entries.filter_map(Result::ok).filter_map(|e| e.file_name().into_string().ok()).collect();
        names.sort();
        for name in names {
            if self.entries.len() >= MAX_FILES {
                self.incomplete = true;
                return;
            }
            let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            let Ok(meta) = dir.symlink_metadata(&name) else { continue };
            if meta.file_type().is_symlink() {
                let target = dir.read_link_contents(&name).map(|t| t.display().to_string()).unwrap_or_default();
                self.entries.insert(path, Entry::Link { target });
            } else if meta.is_dir() {
                if SKIPPED_DIRS.contains(&name.as_str()) {
                    continue;
                }
                if depth + 1 >= MAX_DEPTH {
                    self.incomplete = true;
                    continue;
                }
                match crate::nofollow::open_level(dir, &name, false) {
                    Ok(Some(below)) => self.walk(&below, &path, depth + 1, previous),
                    // Swapped for a link since: not gone through.
                    _ => self.incomplete = true,
                }
            } else if meta.is_file() {
                let seen = previous.and_then(|p| p.get(&path));
                let entry = self.file(dir, &name, seen, meta.len(), meta.modified().ok().map(|t| t.into_std()));
                self.entries.insert(path, entry);
            }
        }
    }

    fn file(&mut self, dir: &Dir, name: &str, seen: Option<&Entry>, size: u64, modified: Option<SystemTime>) -> Entry {
        let unread = Entry::File { size, modified, bytes: None };
        // Unchanged since the last snapshot: its reading is reused, not repeated.
        if let Some(seen @ Entry::File { size: s, modified: m @ Some(_), bytes }) = seen
            && *s == size
            && *m == modified
        {
            let kept = bytes.as_ref().map_or(0, |b| b.len() as u64);
            if self.kept + kept <= MAX_KEPT_TOTAL {
                self.kept += kept;
                return seen.clone();
            }
        }
        if size > MAX_KEPT_FILE {
            return unread;
        }
        if self.kept + size > MAX_KEPT_TOTAL {
            // Out of budget: compared by size and time, listed without a diff.
            return unread;
        }
        let mut options = OpenOptions::new();
        options.read(true).follow(FollowSymlinks::No);
        let Ok(file) = dir.open_with(name, &options) else { return unread };
        let mut bytes = Vec::with_capacity(size as usize);
        // At most one byte past the limit: a file growing meanwhile stays bounded.
        if file.take(MAX_KEPT_FILE + 1).read_to_end(&mut bytes).is_err() || bytes.len() as u64 > MAX_KEPT_FILE {
            return unread;
        }
        self.kept += bytes.len() as u64;
        Entry::File { size: bytes.len() as u64, modified, bytes: Some(Arc::new(bytes)) }
    }
}

/// Whether a file's name looks like it holds secrets (`.env`, keys,
/// credentials): it is listed, never its content.
pub fn looks_secret(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let exact =
        [".env", ".npmrc", ".netrc", ".pypirc", ".pgpass", "credentials", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"];
    let suffixes = [".pem", ".key", ".p12", ".pfx", ".keystore", ".jks", ".asc", ".gpg", ".kdbx"];
    exact.contains(&name.as_str())
        || name.starts_with(".env.")
        || name.starts_with("id_rsa")
        || name.starts_with("id_ed25519")
        || name.starts_with("credentials.")
        || suffixes.iter().any(|s| name.ends_with(s))
        || name.contains("secret")
}

fn is_binary(bytes: &[u8]) -> bool {
    bytes.iter().take(8192).any(|b| *b == 0) || std::str::from_utf8(bytes).is_err()
}

/// The files created, modified or deleted from `before` to `after`, each
/// with a unified diff where one can be shown, within the answer's bounds.
pub fn compare(before: &Snapshot, after: &Snapshot) -> (Vec<pb::FileChange>, bool) {
    use pb::ChangeKind as K;
    let mut changes = Vec::new();
    let mut complete = !before.incomplete && !after.incomplete;
    let mut diff_budget = MAX_DIFFS_TOTAL;
    let paths: std::collections::BTreeSet<&String> = before.entries.keys().chain(after.entries.keys()).collect();
    for path in paths {
        let (old, new) = (before.entries.get(path), after.entries.get(path));
        let kind = match (old, new) {
            (None, Some(_)) => K::Created,
            (Some(_), None) => K::Deleted,
            (Some(a), Some(b)) if !a.same_as(b) => K::Modified,
            _ => continue,
        };
        if changes.len() >= MAX_LISTED {
            complete = false;
            break;
        }
        let mut change = pb::FileChange { path: path.clone(), kind: kind as i32, ..Default::default() };
        let text = |entry: Option<&Entry>| -> Result<Option<String>, Shown> {
            match entry {
                None => Ok(None),
                Some(Entry::Link { target }) => Ok(Some(format!("→ {target}\n"))),
                Some(Entry::File { bytes: Some(bytes), .. }) if is_binary(bytes) => Err(Shown::Binary),
                Some(Entry::File { bytes: Some(bytes), .. }) => Ok(Some(String::from_utf8_lossy(bytes).into_owned())),
                Some(Entry::File { .. }) => Err(Shown::TooLarge),
            }
        };
        if let Some(Entry::File { size, .. }) = new {
            change.size = *size;
        }
        if looks_secret(path) {
            change.secret = true;
        } else {
            match (text(old), text(new)) {
                (Err(Shown::Binary), _) | (_, Err(Shown::Binary)) => change.binary = true,
                (Err(Shown::TooLarge), _) | (_, Err(Shown::TooLarge)) => change.diff_truncated = true,
                (Ok(a), Ok(b)) => {
                    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
                    let diff = similar::TextDiff::from_lines(&a, &b)
                        .unified_diff()
                        .context_radius(3)
                        .header(&format!("a/{path}"), &format!("b/{path}"))
                        .to_string();
                    if diff.len() > MAX_DIFF_BYTES.min(diff_budget) {
                        change.diff_truncated = true;
                        let mut cut = MAX_DIFF_BYTES.min(diff_budget);
                        while !diff.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        change.diff = diff[..cut].to_owned();
                    } else {
                        change.diff = diff;
                    }
                    diff_budget -= change.diff.len();
                }
            }
        }
        changes.push(change);
    }
    (changes, complete)
}

enum Shown {
    Binary,
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(changes: &[pb::FileChange]) -> Vec<(String, pb::ChangeKind)> {
        changes.iter().map(|c| (c.path.clone(), pb::ChangeKind::try_from(c.kind).unwrap())).collect()
    }

    #[test]
    fn created_modified_and_deleted_files_with_unified_diffs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "fn a() {}\nfn b() {}\n").unwrap();
        std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
        std::fs::write(root.join("same.txt"), "same\n").unwrap();
        let before = Snapshot::take(root);
        std::fs::write(root.join("src/lib.rs"), "fn a() {}\nfn c() {}\n").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::write(root.join("new.md"), "# hi\n").unwrap();
        let (changes, complete) = compare(&before, &Snapshot::take(root));
        assert!(complete);
        assert_eq!(
            kinds(&changes),
            [
                ("gone.txt".into(), pb::ChangeKind::Deleted),
                ("new.md".into(), pb::ChangeKind::Created),
                ("src/lib.rs".into(), pb::ChangeKind::Modified),
            ]
        );
        insta::assert_snapshot!(changes[2].diff, @r"
        --- a/src/lib.rs
        +++ b/src/lib.rs
        @@ -1,2 +1,2 @@
         fn a() {}
        -fn b() {}
        +fn c() {}
        ");
        assert_eq!(changes[1].diff, "--- a/new.md\n+++ b/new.md\n@@ -0,0 +1 @@\n+# hi\n");
        assert_eq!(changes[1].size, 5);
    }

    #[test]
    fn secrets_are_listed_without_content_and_binaries_without_a_diff() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = Snapshot::take(root);
        std::fs::write(root.join(".env"), "API_KEY=hunter2\n").unwrap();
        std::fs::write(root.join("server.pem"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
        std::fs::write(root.join("logo.png"), [0x89, b'P', b'N', b'G', 0, 0, 1]).unwrap();
        let (changes, _) = compare(&before, &Snapshot::take(root));
        let by_path: BTreeMap<&str, &pb::FileChange> = changes.iter().map(|c| (c.path.as_str(), c)).collect();
        for secret in [".env", "server.pem"] {
            assert!(by_path[secret].secret, "{secret}");
            assert!(by_path[secret].diff.is_empty(), "{secret}: no content");
        }
        assert!(!changes.iter().any(|c| c.diff.contains("hunter2")));
        assert!(by_path["logo.png"].binary && by_path["logo.png"].diff.is_empty());
    }

    /// A link the agent plants to a folder outside is recorded as a link and
    /// never walked: nothing outside the workspace is read into the answer.
    #[cfg(unix)]
    #[test]
    fn a_planted_link_is_listed_as_a_link_and_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("private.txt"), "outside secret\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = Snapshot::take(root);
        std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("private.txt"), root.join("file-link")).unwrap();
        let (changes, complete) = compare(&before, &Snapshot::take(root));
        assert!(complete);
        assert_eq!(kinds(&changes).len(), 2, "{changes:?}");
        assert!(changes.iter().all(|c| !c.diff.contains("outside secret")), "{changes:?}");
        assert!(changes.iter().any(|c| c.path == "escape" && c.diff.contains(&outside.path().display().to_string())));
    }

    #[test]
    fn skipped_trees_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let before = Snapshot::take(root);
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        std::fs::write(root.join("node_modules/x/index.js"), "1").unwrap();
        std::fs::create_dir_all(root.join(".pedelec-runtime")).unwrap();
        std::fs::write(root.join(".pedelec-runtime/asset"), "1").unwrap();
        let big = "line\n".repeat(MAX_DIFF_BYTES / 4);
        std::fs::write(root.join("big.txt"), &big).unwrap();
        let (changes, _) = compare(&before, &Snapshot::take(root));
        assert_eq!(kinds(&changes), [("big.txt".into(), pb::ChangeKind::Created)]);
        assert!(changes[0].diff_truncated && changes[0].diff.len() <= MAX_DIFF_BYTES);
    }

    #[test]
    fn secret_names() {
        for name in [
            ".env",
            ".env.local",
            "a/b/id_rsa",
            "id_ed25519.pub",
            "tls.key",
            "x.PEM",
            "credentials.json",
            "my_secret.txt",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["env.rs", "src/keyboard.rs", "README.md", "environment.md"] {
            assert!(!looks_secret(name), "{name}");
        }
    }
}
