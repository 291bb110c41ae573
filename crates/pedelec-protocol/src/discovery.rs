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

use std::path::{Path, PathBuf};

/// The operating systems whose conventions the rules below follow.
///
/// Every rule takes the platform as a value, so each OS's answer is
/// checked by tests on any OS; programs pass [`Platform::current`].
///
/// # Examples
///
/// ```
/// use pedelec_protocol::discovery::Platform;
///
/// #[cfg(target_os = "linux")]
/// assert_eq!(Platform::current(), Platform::Linux);
/// assert!(Platform::Windows.uses_named_pipes());
/// assert!(!Platform::MacOs.uses_named_pipes());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Linux and the other Unixes: the XDG base directories.
    Linux,
    /// `~/Library/Application Support/Pedelec`.
    MacOs,
    /// `%LOCALAPPDATA%\Pedelec`, and a named pipe instead of a socket.
    Windows,
}

impl Platform {
    /// The platform this was built for.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::discovery::Platform;
    ///
    /// assert_eq!(Platform::current().uses_named_pipes(), cfg!(windows));
    /// ```
    pub const fn current() -> Self {
        if cfg!(windows) {
            Platform::Windows
        } else if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Linux
        }
    }

    /// Whether Core listens on a named pipe (Windows) rather than a Unix socket.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::discovery::Platform;
    ///
    /// assert!(Platform::Windows.uses_named_pipes());
    /// assert!(!Platform::Linux.uses_named_pipes());
    /// ```
    pub const fn uses_named_pipes(self) -> bool {
        matches!(self, Platform::Windows)
    }
}

/// Why the rules read environment values rather than asking the OS (as the
/// `dirs` crate does through `SHGetKnownFolderPath` on Windows): Core and
/// every client must reach the same answer from the same inputs, the rule
/// must stay free of I/O to be shared and tested per platform, and a user
/// overrides each location through the environment. `%LOCALAPPDATA%` and
/// `$HOME` are set in every user session of their OS.
fn set(env: &impl Fn(&str) -> Option<String>, key: &str) -> Option<String> {
    env(key).filter(|v| !v.is_empty())
}

/// The user's home directory on `platform`: `$HOME`; on Windows
/// `%USERPROFILE%` first (`HOME` there is only set by some shells).
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, home_dir_for};
///
/// let env = |k: &str| match k {
///     "HOME" => Some("/home/ada".to_owned()),
///     "USERPROFILE" => Some(r"C:\Users\ada".to_owned()),
///     _ => None,
/// };
/// assert_eq!(home_dir_for(Platform::Linux, env).as_deref(), Some(Path::new("/home/ada")));
/// assert_eq!(home_dir_for(Platform::Windows, env).as_deref(), Some(Path::new(r"C:\Users\ada")));
/// assert_eq!(home_dir_for(Platform::MacOs, |_| None), None);
/// ```
pub fn home_dir_for(platform: Platform, env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let home = if platform == Platform::Windows {
        set(&env, "USERPROFILE").or_else(|| set(&env, "HOME"))
    } else {
        set(&env, "HOME")
    };
    home.map(PathBuf::from)
}

/// [`home_dir_for`], else the temporary directory's root.
fn home(platform: Platform, env: &impl Fn(&str) -> Option<String>) -> PathBuf {
    let fallback = if platform == Platform::Windows { "C:\\" } else { "/tmp" };
    home_dir_for(platform, env).unwrap_or_else(|| fallback.into())
}

/// Where Core keeps its database, managed workspaces and lock on `platform`:
/// `$PEDELEC_STATE_DIR`; else on Linux `$XDG_STATE_HOME/pedelec`, else
/// `$HOME/.local/state/pedelec`; on macOS `$HOME/Library/Application
/// Support/Pedelec`; on Windows `%LOCALAPPDATA%\Pedelec`, else
/// `%USERPROFILE%\AppData\Local\Pedelec`.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, state_dir_for};
///
/// let env = |k: &str| match k {
///     "HOME" => Some("/Users/ada".to_owned()),
///     "LOCALAPPDATA" => Some("C:\\Users\\ada\\AppData\\Local".to_owned()),
///     _ => None,
/// };
/// assert_eq!(state_dir_for(Platform::MacOs, env), Path::new("/Users/ada/Library/Application Support/Pedelec"));
/// assert_eq!(state_dir_for(Platform::Linux, env), Path::new("/Users/ada/.local/state/pedelec"));
/// assert_eq!(
///     state_dir_for(Platform::Windows, env),
///     Path::new("C:\\Users\\ada\\AppData\\Local").join("Pedelec"),
/// );
/// ```
pub fn state_dir_for(platform: Platform, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = set(&env, "PEDELEC_STATE_DIR") {
        return PathBuf::from(dir);
    }
    match platform {
        Platform::Linux => match set(&env, "XDG_STATE_HOME") {
            Some(dir) => PathBuf::from(dir).join("pedelec"),
            None => home(platform, &env).join(".local/state/pedelec"),
        },
        Platform::MacOs => home(platform, &env).join("Library/Application Support/Pedelec"),
        Platform::Windows => match set(&env, "LOCALAPPDATA") {
            Some(dir) => PathBuf::from(dir).join("Pedelec"),
            None => home(platform, &env).join("AppData").join("Local").join("Pedelec"),
        },
    }
}

/// Where Core creates managed workspaces (for sessions that name none) on
/// `platform`: `$PEDELEC_WORKSPACES_DIR`; else on Linux
/// `$XDG_DATA_HOME/pedelec/workspaces`, else
/// `$HOME/.local/share/pedelec/workspaces`; on macOS `$HOME/Library/Application
/// Support/Pedelec Workspaces`; on Windows `%LOCALAPPDATA%\Pedelec Workspaces`.
///
/// Never inside the state directory ([`state_dir_for`]): an agent reads and
/// writes its workspace, and the state directory holds Core's database.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, workspaces_dir_for};
///
/// let env = |k: &str| (k == "HOME").then(|| "/home/ada".to_owned());
/// assert_eq!(workspaces_dir_for(Platform::Linux, env), Path::new("/home/ada/.local/share/pedelec/workspaces"));
/// let xdg = |k: &str| (k == "XDG_DATA_HOME").then(|| "/data".to_owned());
/// assert_eq!(workspaces_dir_for(Platform::Linux, xdg), Path::new("/data/pedelec/workspaces"));
/// ```
pub fn workspaces_dir_for(platform: Platform, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = set(&env, "PEDELEC_WORKSPACES_DIR") {
        return PathBuf::from(dir);
    }
    match platform {
        Platform::Linux => match set(&env, "XDG_DATA_HOME") {
            Some(dir) => PathBuf::from(dir).join("pedelec").join("workspaces"),
            None => home(platform, &env).join(".local/share/pedelec/workspaces"),
        },
        Platform::MacOs => home(platform, &env).join("Library/Application Support/Pedelec Workspaces"),
        Platform::Windows => match set(&env, "LOCALAPPDATA") {
            Some(dir) => PathBuf::from(dir).join("Pedelec Workspaces"),
            None => home(platform, &env).join("AppData").join("Local").join("Pedelec Workspaces"),
        },
    }
}

/// Where Core reads `config.toml` on `platform`: `$PEDELEC_CONFIG_DIR`; else on
/// Linux `$XDG_CONFIG_HOME/pedelec`, else `$HOME/.config/pedelec`; on macOS and
/// Windows the state directory's place ([`state_dir_for`] without
/// `$PEDELEC_STATE_DIR`), as each OS keeps an application's files together.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, config_dir_for};
///
/// let env = |k: &str| (k == "HOME").then(|| "/home/ada".to_owned());
/// assert_eq!(config_dir_for(Platform::Linux, env), Path::new("/home/ada/.config/pedelec"));
/// let xdg = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "/etc/xdg".to_owned());
/// assert_eq!(config_dir_for(Platform::Linux, xdg), Path::new("/etc/xdg/pedelec"));
/// ```
pub fn config_dir_for(platform: Platform, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(dir) = set(&env, "PEDELEC_CONFIG_DIR") {
        return PathBuf::from(dir);
    }
    match platform {
        Platform::Linux => match set(&env, "XDG_CONFIG_HOME") {
            Some(dir) => PathBuf::from(dir).join("pedelec"),
            None => home(platform, &env).join(".config/pedelec"),
        },
        Platform::MacOs | Platform::Windows => {
            state_dir_for(platform, |k| if k == "PEDELEC_STATE_DIR" { None } else { env(k) })
        }
    }
}

/// Core's endpoint on `platform`: `$PEDELEC_CORE_SOCKET`; else on Windows the
/// named pipe `\\.\pipe\pedelec-<user>-core` (one per user; the pipe's ACL
/// admits only that user); elsewhere `$XDG_RUNTIME_DIR/pedelec/core.sock`
/// (Linux), else `<state_dir>/core.sock`.
///
/// The user's name in a pipe name keeps only ASCII letters, digits, `.`,
/// `_` and `-` (others become `_`), at most 64 of them.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, endpoint_for};
///
/// let state = Path::new("/state");
/// let env = |k: &str| (k == "USERNAME").then(|| "Ada Lovelace".to_owned());
/// assert_eq!(endpoint_for(Platform::Windows, env, state), Path::new(r"\\.\pipe\pedelec-Ada_Lovelace-core"));
/// assert_eq!(endpoint_for(Platform::MacOs, env, state), Path::new("/state/core.sock"));
/// ```
pub fn endpoint_for(platform: Platform, env: impl Fn(&str) -> Option<String>, state_dir: &Path) -> PathBuf {
    if let Some(socket) = set(&env, "PEDELEC_CORE_SOCKET") {
        return PathBuf::from(socket);
    }
    match platform {
        Platform::Windows => {
            let user: String = set(&env, "USERNAME")
                .unwrap_or_else(|| "user".into())
                .chars()
                .take(64)
                .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
                .collect();
            PathBuf::from(format!(r"\\.\pipe\pedelec-{user}-core"))
        }
        Platform::Linux => match set(&env, "XDG_RUNTIME_DIR") {
            Some(dir) => PathBuf::from(dir).join("pedelec/core.sock"),
            None => state_dir.join("core.sock"),
        },
        Platform::MacOs => state_dir.join("core.sock"),
    }
}

/// Where Core announces itself (`{"pid":…, "socket":…}`, written once it
/// serves): beside its socket, or in the state directory when the endpoint
/// is a named pipe (the pipe namespace holds no files).
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::{Platform, discovery_file_for};
///
/// let file = discovery_file_for(Platform::Linux, Path::new("/run/u/pedelec/core.sock"), Path::new("/s"));
/// assert_eq!(file, Path::new("/run/u/pedelec/core.json"));
/// let pipe = Path::new(r"\\.\pipe\pedelec-ada-core");
/// assert_eq!(discovery_file_for(Platform::Windows, pipe, Path::new("/s")), Path::new("/s/core.json"));
/// ```
pub fn discovery_file_for(platform: Platform, endpoint: &Path, state_dir: &Path) -> PathBuf {
    if platform.uses_named_pipes() { state_dir.join("core.json") } else { endpoint.with_file_name("core.json") }
}

/// [`state_dir_for`] on the platform this was built for.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::default_state_dir;
///
/// let xdg = |k: &str| (k == "XDG_STATE_HOME").then(|| "/var/state".to_owned());
/// #[cfg(target_os = "linux")]
/// assert_eq!(default_state_dir(xdg), Path::new("/var/state/pedelec"));
/// // An empty variable counts as unset.
/// let empty = |k: &str| Some(if k == "HOME" { "/home/ada" } else { "" }.to_owned());
/// #[cfg(target_os = "linux")]
/// assert_eq!(default_state_dir(empty), Path::new("/home/ada/.local/state/pedelec"));
/// ```
pub fn default_state_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    state_dir_for(Platform::current(), env)
}

/// [`endpoint_for`] on the platform this was built for: the path of Core's
/// socket, or on Windows the name of its pipe.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::discovery::default_socket;
///
/// let state = Path::new("/home/ada/.local/state/pedelec");
/// let runtime = |k: &str| (k == "XDG_RUNTIME_DIR").then(|| "/run/user/1000".to_owned());
/// #[cfg(target_os = "linux")]
/// assert_eq!(default_socket(runtime, state), Path::new("/run/user/1000/pedelec/core.sock"));
/// // An explicit socket wins over everything else.
/// let explicit = |k: &str| (k == "PEDELEC_CORE_SOCKET").then(|| "/tmp/core.sock".to_owned());
/// assert_eq!(default_socket(explicit, state), Path::new("/tmp/core.sock"));
/// #[cfg(unix)]
/// assert_eq!(default_socket(|_| None, state), state.join("core.sock"));
/// ```
pub fn default_socket(env: impl Fn(&str) -> Option<String>, state_dir: &Path) -> PathBuf {
    endpoint_for(Platform::current(), env, state_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    fn socket(pairs: &[(&str, &str)]) -> PathBuf {
        endpoint_for(Platform::Linux, env(pairs), &state_dir_for(Platform::Linux, env(pairs)))
    }

    #[test]
    fn each_platform_keeps_its_conventional_places() {
        let windows = [("LOCALAPPDATA", r"C:\Users\a\AppData\Local"), ("USERNAME", "a"), ("HOME", "")];
        let state = state_dir_for(Platform::Windows, env(&windows));
        assert_eq!(state, Path::new(r"C:\Users\a\AppData\Local").join("Pedelec"));
        assert_eq!(config_dir_for(Platform::Windows, env(&windows)), state);
        assert_eq!(endpoint_for(Platform::Windows, env(&windows), &state), Path::new(r"\\.\pipe\pedelec-a-core"));
        // Without LOCALAPPDATA, the profile's own AppData\Local.
        let profile = state_dir_for(Platform::Windows, env(&[("USERPROFILE", r"C:\Users\a")]));
        assert_eq!(profile, Path::new(r"C:\Users\a").join("AppData").join("Local").join("Pedelec"));
        let mac = [("HOME", "/Users/a"), ("XDG_STATE_HOME", "/ignored"), ("XDG_RUNTIME_DIR", "/ignored")];
        let state = state_dir_for(Platform::MacOs, env(&mac));
        assert_eq!(state, Path::new("/Users/a/Library/Application Support/Pedelec"));
        assert_eq!(config_dir_for(Platform::MacOs, env(&mac)), state);
        assert_eq!(endpoint_for(Platform::MacOs, env(&mac), &state), state.join("core.sock"));
        // The overrides win on every platform; a state override moves no config.
        for platform in [Platform::Linux, Platform::MacOs, Platform::Windows] {
            let over = [("PEDELEC_STATE_DIR", "/s"), ("PEDELEC_CONFIG_DIR", "/c"), ("PEDELEC_CORE_SOCKET", "/e")];
            assert_eq!(state_dir_for(platform, env(&over)), Path::new("/s"));
            assert_eq!(config_dir_for(platform, env(&over)), Path::new("/c"));
            assert_eq!(endpoint_for(platform, env(&over), Path::new("/s")), Path::new("/e"));
            let state_only = [("PEDELEC_STATE_DIR", "/s"), ("HOME", "/h"), ("LOCALAPPDATA", "/l")];
            assert_ne!(config_dir_for(platform, env(&state_only)), Path::new("/s"));
        }
    }

    #[test]
    fn a_pipe_name_keeps_only_safe_characters_of_the_user_name() {
        let name = |user: &str| endpoint_for(Platform::Windows, env(&[("USERNAME", user)]), Path::new("/s"));
        assert_eq!(name(r"DOMAIN\ada"), Path::new(r"\\.\pipe\pedelec-DOMAIN_ada-core"));
        assert_eq!(name("ädä.x-y_z"), Path::new(r"\\.\pipe\pedelec-_d_.x-y_z-core"));
        let long = name(&"a".repeat(500));
        assert_eq!(long.as_os_str().len(), r"\\.\pipe\pedelec--core".len() + 64);
        assert_eq!(
            endpoint_for(Platform::Windows, |_| None, Path::new("/s")),
            Path::new(r"\\.\pipe\pedelec-user-core")
        );
    }

    #[test]
    fn socket_resolution_order() {
        assert_eq!(socket(&[("PEDELEC_CORE_SOCKET", "/x.sock"), ("XDG_RUNTIME_DIR", "/r")]), PathBuf::from("/x.sock"));
        assert_eq!(socket(&[("XDG_RUNTIME_DIR", "/run/user/1")]), PathBuf::from("/run/user/1/pedelec/core.sock"));
        assert_eq!(socket(&[("HOME", "/home/u")]), PathBuf::from("/home/u/.local/state/pedelec/core.sock"));
        assert_eq!(socket(&[("XDG_STATE_HOME", "/s"), ("XDG_RUNTIME_DIR", "")]), PathBuf::from("/s/pedelec/core.sock"));
    }
}
