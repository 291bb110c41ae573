//! Where Core's socket is by default, computed from environment values the
//! caller supplies (so the rule stays free of I/O and is shared by Core and SDK).
//!
//! # Examples
//!
//! ```
//! use std::path::Path;
//! use pedelec_protocol::discovery::{default_socket, default_state_dir};
//!
//! // The real environment in a program: `|k| std::env::var(k).ok()`.
//! let env = |k: &str| (k == "HOME").then(|| "/home/ada".to_owned());
//! let socket = default_socket(env, &default_state_dir(env));
//! assert_eq!(socket, Path::new("/home/ada/.local/state/pedelec/core.sock"));
//! ```

use std::path::PathBuf;

/// `$XDG_STATE_HOME/pedelec`, else `$HOME/.local/state/pedelec`.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::default_state_dir;
///
/// let xdg = |k: &str| (k == "XDG_STATE_HOME").then(|| "/var/state".to_owned());
/// assert_eq!(default_state_dir(xdg), Path::new("/var/state/pedelec"));
/// // An empty variable counts as unset.
/// let empty = |k: &str| Some(if k == "HOME" { "/home/ada" } else { "" }.to_owned());
/// assert_eq!(default_state_dir(empty), Path::new("/home/ada/.local/state/pedelec"));
/// ```
pub fn default_state_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(dir) = set("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("pedelec");
    }
    PathBuf::from(set("HOME").unwrap_or_else(|| "/tmp".into())).join(".local/state/pedelec")
}

/// `$PEDELEC_CORE_SOCKET`, else `$XDG_RUNTIME_DIR/pedelec/core.sock`, else `<state_dir>/core.sock`.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::default_socket;
///
/// let state = Path::new("/home/ada/.local/state/pedelec");
/// let runtime = |k: &str| (k == "XDG_RUNTIME_DIR").then(|| "/run/user/1000".to_owned());
/// assert_eq!(default_socket(runtime, state), Path::new("/run/user/1000/pedelec/core.sock"));
/// // An explicit socket wins over everything else.
/// let explicit = |k: &str| (k == "PEDELEC_CORE_SOCKET").then(|| "/tmp/core.sock".to_owned());
/// assert_eq!(default_socket(explicit, state), Path::new("/tmp/core.sock"));
/// assert_eq!(default_socket(|_| None, state), state.join("core.sock"));
/// ```
pub fn default_socket(env: impl Fn(&str) -> Option<String>, state_dir: &std::path::Path) -> PathBuf {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(socket) = set("PEDELEC_CORE_SOCKET") {
        return PathBuf::from(socket);
    }
    match set("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("pedelec/core.sock"),
        None => state_dir.join("core.sock"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    fn socket(pairs: &[(&str, &str)]) -> PathBuf {
        default_socket(env(pairs), &default_state_dir(env(pairs)))
    }

    #[test]
    fn socket_resolution_order() {
        assert_eq!(socket(&[("PEDELEC_CORE_SOCKET", "/x.sock"), ("XDG_RUNTIME_DIR", "/r")]), PathBuf::from("/x.sock"));
        assert_eq!(socket(&[("XDG_RUNTIME_DIR", "/run/user/1")]), PathBuf::from("/run/user/1/pedelec/core.sock"));
        assert_eq!(socket(&[("HOME", "/home/u")]), PathBuf::from("/home/u/.local/state/pedelec/core.sock"));
        assert_eq!(socket(&[("XDG_STATE_HOME", "/s"), ("XDG_RUNTIME_DIR", "")]), PathBuf::from("/s/pedelec/core.sock"));
    }
}
