//! Where the native host's manifest lives for each browser. The host
//! writes these files and Core's `doctor` reads them, so the rule has one
//! place. Pure: the environment comes in as a function.

use std::path::PathBuf;

/// The host's registered name (lowercase, dots; the manifest file is `<name>.json`).
pub const HOST_NAME: &str = "dev.pedelec.host";

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
    pub const EACH: [Browser; 5] =
        [Browser::Chrome, Browser::Chromium, Browser::Edge, Browser::Brave, Browser::Firefox];

    pub fn expand(self) -> Vec<Browser> {
        if self == Browser::All { Self::EACH.to_vec() } else { vec![self] }
    }

    /// A browser by its [`Browser::name`] (`all` included).
    pub fn parse(text: &str) -> Option<Browser> {
        Self::EACH.into_iter().chain([Browser::All]).find(|b| b.name() == text)
    }

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
}

/// Where manifests go for one user.
#[derive(Debug, Clone)]
pub struct Layout {
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME` (Linux), defaulting to `~/.config`.
    pub config_home: PathBuf,
    pub os: Os,
}

impl Layout {
    /// The layout for the user whose environment `env` reads (`HOME`,
    /// `XDG_CONFIG_HOME`), on the OS this was built for.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Self {
        let home = env("HOME").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
        let config_home =
            env("XDG_CONFIG_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| home.join(".config"));
        let os = if cfg!(target_os = "macos") { Os::MacOs } else { Os::Linux };
        Layout { home, config_home, os }
    }

    /// The per-user manifest directory of a browser.
    pub fn manifest_dir(&self, browser: Browser) -> PathBuf {
        match self.os {
            Os::Linux => match browser {
                Browser::Firefox => self.home.join(".mozilla/native-messaging-hosts"),
                Browser::Chrome => self.config_home.join("google-chrome/NativeMessagingHosts"),
                Browser::Chromium | Browser::All => self.config_home.join("chromium/NativeMessagingHosts"),
                Browser::Edge => self.config_home.join("microsoft-edge/NativeMessagingHosts"),
                Browser::Brave => self.config_home.join("BraveSoftware/Brave-Browser/NativeMessagingHosts"),
            },
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
pub fn manifest_path(layout: &Layout, browser: Browser) -> PathBuf {
    layout.manifest_dir(browser).join(format!("{HOST_NAME}.json"))
}
