//! Where the native host's manifest lives for each browser. The host
//! writes these files and Core's `doctor` reads them, so the rule has one
//! place. Pure: the environment comes in as a function.
//!
//! # Examples
//!
//! ```
//! use std::path::Path;
//! use pedelec_protocol::registration::{Browser, Layout, Os, manifest_path};
//!
//! let layout = Layout { home: "/home/ada".into(), config_home: "/home/ada/.config".into(), os: Os::Linux };
//! assert_eq!(
//!     manifest_path(&layout, Browser::Chromium),
//!     Path::new("/home/ada/.config/chromium/NativeMessagingHosts/dev.pedelec.host.json"),
//! );
//! ```

use std::path::PathBuf;

/// The host's registered name (lowercase, dots; the manifest file is `<name>.json`).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::registration::HOST_NAME;
///
/// // Chrome accepts only lowercase alphanumerics, `_` and `.` in a host name.
/// assert!(HOST_NAME.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_'));
/// ```
pub const HOST_NAME: &str = "dev.pedelec.host";

/// A browser the host registers with, or all of them.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::registration::Browser;
///
/// assert_eq!(Browser::parse("firefox"), Some(Browser::Firefox));
/// assert_eq!(Browser::Firefox.name(), "firefox");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Browser {
    Chrome,
    Chromium,
    Edge,
    Brave,
    Firefox,
    All,
}

impl Browser {
    /// Every single browser (all but [`Browser::All`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::registration::Browser;
    ///
    /// assert!(Browser::EACH.contains(&Browser::Brave));
    /// assert!(!Browser::EACH.contains(&Browser::All));
    /// ```
    pub const EACH: [Browser; 5] =
        [Browser::Chrome, Browser::Chromium, Browser::Edge, Browser::Brave, Browser::Firefox];

    /// The browsers this choice stands for: [`Browser::All`] is each of them.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::registration::Browser;
    ///
    /// assert_eq!(Browser::Edge.expand(), [Browser::Edge]);
    /// assert_eq!(Browser::All.expand(), Browser::EACH);
    /// ```
    pub fn expand(self) -> Vec<Browser> {
        if self == Browser::All { Self::EACH.to_vec() } else { vec![self] }
    }

    /// A browser by its [`Browser::name`] (`all` included).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::registration::Browser;
    ///
    /// assert_eq!(Browser::parse("all"), Some(Browser::All));
    /// assert_eq!(Browser::parse("Chrome"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Browser> {
        Self::EACH.into_iter().chain([Browser::All]).find(|b| b.name() == text)
    }

    /// The lowercase name a command line uses (`--browser chromium`).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::registration::Browser;
    ///
    /// let names: Vec<_> = Browser::EACH.iter().map(|b| b.name()).collect();
    /// assert_eq!(names, ["chrome", "chromium", "edge", "brave", "firefox"]);
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Browser::Chrome => "chrome",
            Browser::Chromium => "chromium",
            Browser::Edge => "edge",
            Browser::Brave => "brave",
            Browser::Firefox => "firefox",
            Browser::All => "all",
        }
    }
}

/// The operating systems whose manifest locations are known: the same
/// vocabulary as [`crate::discovery::Platform`].
///
/// # Examples
///
/// ```
/// use pedelec_protocol::registration::{Layout, Os};
///
/// let layout = Layout::from_env(|_| None);
/// assert_eq!(layout.os, Os::current());
/// ```
pub use crate::discovery::Platform as Os;

/// Where manifests go for one user.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::registration::{Browser, Layout, Os};
///
/// let layout = Layout { home: "/Users/ada".into(), config_home: "/Users/ada/.config".into(), os: Os::MacOs };
/// assert_eq!(
///     layout.manifest_dir(Browser::Firefox),
///     Path::new("/Users/ada/Library/Application Support/Mozilla/NativeMessagingHosts"),
/// );
/// ```
#[derive(Debug, Clone)]
pub struct Layout {
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME` (Linux, macOS), defaulting to `~/.config`;
    /// `%LOCALAPPDATA%` on Windows. The host's list of allowed extensions
    /// lives below it, and on Windows its manifests too.
    pub config_home: PathBuf,
    pub os: Os,
}

impl Layout {
    /// The layout for the user whose environment `env` reads (`HOME`,
    /// `XDG_CONFIG_HOME`; on Windows `USERPROFILE`, `LOCALAPPDATA`), on the
    /// OS this was built for.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::path::Path;
    /// use pedelec_protocol::registration::Layout;
    ///
    /// // In a program: `Layout::from_env(|k| std::env::var(k).ok())`.
    /// let layout = Layout::from_env(|k| (k == "HOME").then(|| "/home/ada".to_owned()));
    /// assert_eq!(layout.home, Path::new("/home/ada"));
    /// assert_eq!(layout.config_home, Path::new("/home/ada/.config"));
    /// ```
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Self {
        Self::from_env_on(Os::current(), env)
    }

    /// As [`Layout::from_env`], for `os`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::path::Path;
    /// use pedelec_protocol::registration::{Layout, Os};
    ///
    /// let env = |k: &str| match k {
    ///     "USERPROFILE" => Some(r"C:\Users\ada".to_owned()),
    ///     "LOCALAPPDATA" => Some(r"C:\Users\ada\AppData\Local".to_owned()),
    ///     _ => None,
    /// };
    /// let layout = Layout::from_env_on(Os::Windows, env);
    /// assert_eq!(layout.home, Path::new(r"C:\Users\ada"));
    /// assert_eq!(layout.config_home, Path::new(r"C:\Users\ada\AppData\Local"));
    /// ```
    pub fn from_env_on(os: Os, env: impl Fn(&str) -> Option<String>) -> Self {
        let set = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let fallback = if os == Os::Windows { "C:\\" } else { "/" };
        let home = crate::discovery::home_dir_for(os, &env).unwrap_or_else(|| PathBuf::from(fallback));
        let config_home = match os {
            Os::Windows => set("LOCALAPPDATA").unwrap_or_else(|| home.join("AppData").join("Local")),
            Os::Linux | Os::MacOs => set("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config")),
        };
        Layout { home, config_home, os }
    }

    /// The per-user manifest directory of a browser.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::path::Path;
    /// use pedelec_protocol::registration::{Browser, Layout, Os};
    ///
    /// let layout = Layout { home: "/home/ada".into(), config_home: "/xdg".into(), os: Os::Linux };
    /// assert_eq!(layout.manifest_dir(Browser::Chrome), Path::new("/xdg/google-chrome/NativeMessagingHosts"));
    /// // Firefox looks below the home directory, not the config directory.
    /// assert_eq!(layout.manifest_dir(Browser::Firefox), Path::new("/home/ada/.mozilla/native-messaging-hosts"));
    /// ```
    pub fn manifest_dir(&self, browser: Browser) -> PathBuf {
        match self.os {
            Os::Linux => match browser {
                Browser::Firefox => self.home.join(".mozilla/native-messaging-hosts"),
                Browser::Chrome => self.config_home.join("google-chrome/NativeMessagingHosts"),
                Browser::Chromium | Browser::All => self.config_home.join("chromium/NativeMessagingHosts"),
                Browser::Edge => self.config_home.join("microsoft-edge/NativeMessagingHosts"),
                Browser::Brave => self.config_home.join("BraveSoftware/Brave-Browser/NativeMessagingHosts"),
            },
            // Windows browsers find a manifest through the registry
            // ([`registry_key`]); it may live anywhere, so each browser's
            // sits in a directory of its own below Pedelec's.
            Os::Windows => self.config_home.join("Pedelec").join("NativeMessagingHosts").join(browser.name()),
            Os::MacOs => {
                let support = self.home.join("Library/Application Support");
                match browser {
                    Browser::Firefox => support.join("Mozilla/NativeMessagingHosts"),
                    Browser::Chrome => support.join("Google/Chrome/NativeMessagingHosts"),
                    Browser::Chromium | Browser::All => support.join("Chromium/NativeMessagingHosts"),
                    Browser::Edge => support.join("Microsoft Edge/NativeMessagingHosts"),
                    Browser::Brave => support.join("BraveSoftware/Brave-Browser/NativeMessagingHosts"),
                }
            }
        }
    }
}

/// The manifest file of a browser in this layout.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::registration::{Browser, HOST_NAME, Layout, Os, manifest_path};
///
/// let layout = Layout { home: "/home/ada".into(), config_home: "/home/ada/.config".into(), os: Os::Linux };
/// let path = manifest_path(&layout, Browser::Edge);
/// assert_eq!(path.file_name().unwrap(), format!("{HOST_NAME}.json").as_str());
/// assert!(path.starts_with(layout.manifest_dir(Browser::Edge)));
/// ```
pub fn manifest_path(layout: &Layout, browser: Browser) -> PathBuf {
    layout.manifest_dir(browser).join(format!("{HOST_NAME}.json"))
}

/// The per-user registry key (below `HKEY_CURRENT_USER`) whose default value
/// Windows browsers read as the manifest's path; the host's name is its
/// last part.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::registration::{Browser, registry_key};
///
/// assert_eq!(registry_key(Browser::Edge), r"Software\Microsoft\Edge\NativeMessagingHosts\dev.pedelec.host");
/// assert_eq!(registry_key(Browser::Firefox), r"Software\Mozilla\NativeMessagingHosts\dev.pedelec.host");
/// ```
pub fn registry_key(browser: Browser) -> String {
    let vendor = match browser {
        Browser::Chrome => r"Google\Chrome",
        Browser::Chromium | Browser::All => "Chromium",
        Browser::Edge => r"Microsoft\Edge",
        Browser::Brave => r"BraveSoftware\Brave-Browser",
        Browser::Firefox => "Mozilla",
    };
    format!(r"Software\{vendor}\NativeMessagingHosts\{HOST_NAME}")
}
