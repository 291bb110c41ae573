//! How a command name becomes a program file: `PATH`, and on Windows
//! `PATHEXT` too (npm installs an agent as `codex.cmd`, which `codex` must
//! find, as a shell there would).

use std::path::{Path, PathBuf};

/// `PATHEXT` when Windows does not say: the shell's own default.
const DEFAULT_PATHEXT: &str = ".COM;.EXE;.BAT;.CMD";

/// The file names `program` may stand for, in the order a shell tries them:
/// itself when it has an extension, then with each of `pathext`'s
/// extensions (Windows; pass `None` elsewhere).
pub fn candidates(program: &Path, pathext: Option<&str>) -> Vec<PathBuf> {
    let Some(pathext) = pathext else {
        return vec![program.to_path_buf()];
    };
    let mut names = Vec::new();
    if program.extension().is_some() {
        names.push(program.to_path_buf());
    }
    for ext in pathext.split(';').map(str::trim).filter(|e| e.starts_with('.') && e.len() > 1) {
        let mut name = program.as_os_str().to_owned();
        name.push(ext.to_ascii_lowercase());
        names.push(PathBuf::from(name));
    }
    names
}

/// This OS's `PATHEXT`, or `None` where commands carry no extension.
fn pathext() -> Option<String> {
    cfg!(windows).then(|| std::env::var("PATHEXT").ok().filter(|v| !v.is_empty()).unwrap_or(DEFAULT_PATHEXT.into()))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Windows marks no file executable; the extension is what runs it.
#[cfg(windows)]
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Where `program` resolves, on `PATH` for a bare name, or why it does not.
pub fn resolve(program: &str) -> Result<PathBuf, String> {
    let pathext = pathext();
    let candidate = Path::new(program);
    if candidate.components().count() > 1 {
        return candidates(candidate, pathext.as_deref())
            .into_iter()
            .find(|p| is_executable(p))
            .ok_or_else(|| format!("{program} is not an executable file"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| candidates(&dir.join(program), pathext.as_deref()))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("{program} is not on PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_tries_each_pathext_extension_in_order() {
        let names = candidates(Path::new("C:/npm/codex"), Some(".COM;.EXE;;.CMD; bad"));
        assert_eq!(
            names,
            [Path::new("C:/npm/codex.com"), Path::new("C:/npm/codex.exe"), Path::new("C:/npm/codex.cmd")]
        );
        // A name with an extension is tried as given first.
        let names = candidates(Path::new("agent.js"), Some(".EXE"));
        assert_eq!(names, [Path::new("agent.js"), Path::new("agent.js.exe")]);
        // Elsewhere, only the name itself.
        assert_eq!(candidates(Path::new("/usr/bin/codex"), None), [Path::new("/usr/bin/codex")]);
    }

    #[cfg(unix)]
    #[test]
    fn a_file_without_execute_bits_is_no_program() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        assert!(resolve(plain.to_str().unwrap()).unwrap_err().contains("not an executable file"));
    }
}
