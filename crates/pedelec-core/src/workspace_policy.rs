//! Which explicit workspaces a caller may open.
//!
//! Approving an origin must not hand it the user's whole disk: an agent
//! reads (and, under the permission policy, edits) everything inside its
//! workspace. So a path is checked after symlinks and `..` are resolved:
//!
//! - never allowed, whatever is granted: a directory that is, contains or
//!   lies inside a secret store (`~/.ssh`, `~/.gnupg`, `~/.aws`, browser
//!   profiles, …), the home directory or anything containing it (`/`), and
//!   Core's own state and config directories (its database holds every
//!   session's tool token);
//! - a web origin: inside a root the user granted it (the extension sends
//!   its grants with each request);
//! - an `app:` origin (a local program): inside one of `config.toml`'s
//!   `allowed_workspace_roots` (none by default).

use std::path::{Path, PathBuf};

/// Directories under the home directory that hold secrets or a browser's
/// profile (cookies, saved passwords): a workspace may neither be one, nor
/// lie inside one, nor contain one.
const SECRET_STORES: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".password-store",
    ".netrc",
    ".git-credentials",
    ".local/share/keyrings",
    ".mozilla",
    ".thunderbird",
    ".config/gh",
    ".config/gcloud",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    ".var/app",
    "snap",
    "Library/Keychains",
    "Library/Application Support/Google/Chrome",
    "Library/Application Support/Firefox",
    "Library/Application Support/BraveSoftware",
    "Library/Application Support/Microsoft Edge",
    "AppData",
];

/// Why a path is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Never allowed: names what it is, contains or lies in.
    Forbidden(String),
    /// Not inside any root granted to (or configured for) the caller.
    NotGranted,
}

impl Refusal {
    /// `details.reason` of the `WORKSPACE_NOT_ALLOWED` error.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Forbidden(_) => "forbidden",
            Refusal::NotGranted => "not_granted",
        }
    }
}

/// The rule, with the directories it protects resolved once at start.
#[derive(Debug, Clone, Default)]
pub struct WorkspacePolicy {
    /// Never a workspace, nor inside or around one.
    protected: Vec<PathBuf>,
    /// Never a workspace nor around one (inside it is where projects live).
    home: Option<PathBuf>,
    /// Where `app:` origins may open workspaces.
    app_roots: Vec<PathBuf>,
}

/// `path` with symlinks resolved where it exists (a protected directory
/// that does not exist yet is protected under its plain name).
fn resolved(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Expands a leading `~/` against `home`.
fn expand(root: &str, home: Option<&Path>) -> PathBuf {
    match (root.strip_prefix("~/"), home) {
        (Some(rest), Some(home)) => home.join(rest),
        _ if root == "~" => home.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(root)),
        _ => PathBuf::from(root),
    }
}

impl WorkspacePolicy {
    /// `home` is the user's home directory, `app_roots` the configured
    /// `allowed_workspace_roots` (absolute or `~/…`), `core_dirs` Core's
    /// own state and config directories.
    pub fn new(home: Option<&Path>, app_roots: &[String], core_dirs: &[&Path]) -> Self {
        let mut protected: Vec<PathBuf> = core_dirs.iter().map(|d| resolved(d)).collect();
        if let Some(home) = home {
            protected.extend(SECRET_STORES.iter().map(|store| resolved(&home.join(store))));
        }
        let app_roots = app_roots.iter().map(|r| resolved(&expand(r, home))).filter(|r| r.is_absolute()).collect();
        WorkspacePolicy { protected, home: home.map(resolved), app_roots }
    }

    /// Checks a resolved (canonical) workspace path for `origin`, a web
    /// origin bringing `granted` roots or an `app:` origin.
    pub fn check(&self, canonical: &Path, origin: &str, granted: &[String]) -> Result<(), Refusal> {
        if let Some(what) = self.never(canonical) {
            return Err(Refusal::Forbidden(what));
        }
        let allowed = if origin.starts_with("app:") {
            self.app_roots.iter().any(|root| canonical.starts_with(root))
        } else {
            // A grant that does not resolve (gone, relative) grants nothing.
            granted
                .iter()
                .map(Path::new)
                .filter(|g| g.is_absolute())
                .filter_map(|g| g.canonicalize().ok())
                .any(|root| canonical.starts_with(root))
        };
        if allowed { Ok(()) } else { Err(Refusal::NotGranted) }
    }

    /// What makes a resolved path never a workspace, whatever is granted:
    /// the protected directory it is, holds or lies in, or the home
    /// directory it is or holds.
    pub fn never(&self, canonical: &Path) -> Option<String> {
        for protected in &self.protected {
            // Inside a protected directory, or around one (so that it would
            // be inside the workspace).
            if canonical.starts_with(protected) || protected.starts_with(canonical) {
                return Some(protected.display().to_string());
            }
        }
        // The home directory itself, `/` and whatever else holds it.
        match &self.home {
            Some(home) if home.starts_with(canonical) => Some(format!("the home directory {}", home.display())),
            _ => None,
        }
    }

    /// The protected directory a resolved path lies in (or is), if any:
    /// the folder picker never lists inside one. Holding one is fine
    /// there (the home directory is where browsing starts).
    pub fn inside_protected(&self, canonical: &Path) -> Option<&Path> {
        self.protected.iter().find(|p| canonical.starts_with(p)).map(PathBuf::as_path)
    }

    /// The user's home directory, resolved.
    pub fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        home: PathBuf,
        policy: WorkspacePolicy,
    }

    fn fixture(app_roots: &[&str]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home/u").canonicalize().unwrap_or_else(|_| {
            std::fs::create_dir_all(dir.path().join("home/u")).unwrap();
            dir.path().join("home/u").canonicalize().unwrap()
        });
        for sub in ["projects/app", "projects/other", ".ssh", ".config/pedelec", ".local/state/pedelec", "Downloads"] {
            std::fs::create_dir_all(home.join(sub)).unwrap();
        }
        let roots: Vec<String> = app_roots.iter().map(|r| r.to_string()).collect();
        let state = home.join(".local/state/pedelec");
        let config = home.join(".config/pedelec");
        let policy = WorkspacePolicy::new(Some(&home), &roots, &[&state, &config]);
        Fixture { _dir: dir, home, policy }
    }

    fn path(f: &Fixture, sub: &str) -> PathBuf {
        f.home.join(sub).canonicalize().unwrap()
    }

    const WEB: &str = "https://app.example";

    #[test]
    fn a_web_origin_opens_only_what_it_was_granted() {
        let f = fixture(&[]);
        let granted = vec![path(&f, "projects/app").display().to_string()];
        assert_eq!(f.policy.check(&path(&f, "projects/app"), WEB, &granted), Ok(()));
        std::fs::create_dir_all(f.home.join("projects/app/src")).unwrap();
        assert_eq!(f.policy.check(&path(&f, "projects/app/src"), WEB, &granted), Ok(()), "a granted root's child");
        assert_eq!(f.policy.check(&path(&f, "projects/other"), WEB, &granted), Err(Refusal::NotGranted), "a sibling");
        assert_eq!(f.policy.check(&path(&f, "projects"), WEB, &granted), Err(Refusal::NotGranted), "its parent");
        assert_eq!(f.policy.check(&path(&f, "projects/app"), WEB, &[]), Err(Refusal::NotGranted), "no grant");
        let relative = vec!["projects/app".to_owned()];
        assert_eq!(f.policy.check(&path(&f, "projects/app"), WEB, &relative), Err(Refusal::NotGranted));
    }

    #[test]
    fn never_the_home_directory_a_secret_store_or_cores_own_state_whatever_is_granted() {
        let f = fixture(&["~"]);
        let everything = vec!["/".to_owned(), f.home.display().to_string()];
        for sub in ["", ".ssh", ".config", ".config/pedelec", ".local/state/pedelec", ".local"] {
            let target = if sub.is_empty() { f.home.clone() } else { path(&f, sub) };
            for origin in [WEB, "app:tool"] {
                let refused = f.policy.check(&target, origin, &everything);
                assert!(matches!(refused, Err(Refusal::Forbidden(_))), "{sub:?} for {origin}: {refused:?}");
            }
        }
        assert!(matches!(f.policy.check(Path::new("/"), WEB, &everything), Err(Refusal::Forbidden(_))));
        // The parent of the home directory contains it.
        let parent = f.home.parent().unwrap();
        assert!(matches!(f.policy.check(parent, WEB, &everything), Err(Refusal::Forbidden(_))));
        // A granted directory elsewhere in the home is fine.
        assert_eq!(f.policy.check(&path(&f, "Downloads"), WEB, &everything), Ok(()));
    }

    #[test]
    fn app_origins_follow_the_configured_roots() {
        let none = fixture(&[]);
        let project = path(&none, "projects/app");
        assert_eq!(none.policy.check(&project, "app:tool", &[]), Err(Refusal::NotGranted), "none by default");
        let granted = vec![project.display().to_string()];
        assert_eq!(
            none.policy.check(&project, "app:tool", &granted),
            Err(Refusal::NotGranted),
            "grants are for web origins"
        );
        let some = fixture(&["~/projects"]);
        assert_eq!(some.policy.check(&path(&some, "projects/app"), "app:tool", &[]), Ok(()));
        assert_eq!(some.policy.check(&path(&some, "Downloads"), "app:tool", &[]), Err(Refusal::NotGranted));
    }

    #[test]
    fn a_symlink_is_judged_by_where_it_leads() {
        let f = fixture(&[]);
        let link = f.home.join("projects/app/keys");
        std::os::unix::fs::symlink(f.home.join(".ssh"), &link).unwrap();
        let granted = vec![path(&f, "projects/app").display().to_string()];
        // The caller resolves before checking; resolved, the link is the secret store.
        let refused = f.policy.check(&link.canonicalize().unwrap(), WEB, &granted);
        assert!(matches!(refused, Err(Refusal::Forbidden(_))), "{refused:?}");
    }
}
