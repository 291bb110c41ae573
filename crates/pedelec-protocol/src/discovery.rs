//! Where Core's socket is by default, computed from environment values the
//! caller supplies (so the rule stays free of I/O and is shared by Core and SDK).

use std::path::PathBuf;

/// `$XDG_STATE_HOME/pedelec`, else `$HOME/.local/state/pedelec`.
pub fn default_state_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(dir) = set("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("pedelec");
    }
    PathBuf::from(set("HOME").unwrap_or_else(|| "/tmp".into())).join(".local/state/pedelec")
}

/// `$PEDELEC_CORE_SOCKET`, else `$XDG_RUNTIME_DIR/pedelec/core.sock`, else `<state_dir>/core.sock`.
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
