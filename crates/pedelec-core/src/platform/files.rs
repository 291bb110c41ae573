//! Private directories and files, and the open-file limit.
//!
//! On Unix, Core's dirs are 0700 and its socket and secrets 0600. On
//! Windows, `%LOCALAPPDATA%` is already readable by its user alone (the
//! profile's inherited ACL), so nothing is changed there.

use std::path::Path;

use crate::error::{CoreError, CoreResult};

/// Creates `dir` (and its parents) and makes it private to the user.
pub fn ensure_private_dir(dir: &Path) -> CoreResult<()> {
    std::fs::create_dir_all(dir).map_err(|e| CoreError::io(format!("creating {}", dir.display()), e))?;
    restrict_dir(dir).map_err(|e| CoreError::io(format!("restricting {}", dir.display()), e))
}

#[cfg(unix)]
fn restrict_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(windows)]
fn restrict_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Makes an existing file readable and writable by its owner only.
#[cfg(unix)]
pub fn restrict_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Makes an existing file readable and writable by its owner only.
#[cfg(windows)]
pub fn restrict_file(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Opens `path` for writing (created or truncated), private from the start.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// A file's permission bits (`0o777` of its mode); `None` where the OS
/// has no such bits.
pub fn mode(meta: &std::fs::Metadata) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        Some(meta.permissions().mode() & 0o777)
    }
    #[cfg(windows)]
    {
        let _ = meta;
        None
    }
}

/// Whether Core runs as root (Unix); never on Windows.
pub fn is_superuser() -> bool {
    #[cfg(unix)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    return unsafe { libc::geteuid() } == 0;
    #[cfg(windows)]
    return false;
}

/// Raises the soft limit on open files to the hard one. Every connection,
/// subscription, agent pipe and SQLite file is a descriptor; the default
/// soft limit (1 024 on most systems) is what a thousand idle connections
/// exhaust, locking out new clients. Failing to raise it is not fatal.
/// Windows has no such per-process limit on handles.
pub fn raise_open_file_limit() {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max {
                return;
            }
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                tracing::warn!(soft = limit.rlim_cur, hard = limit.rlim_max, "could not raise the open-file limit");
            }
        }
    }
}
