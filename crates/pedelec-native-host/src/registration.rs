//! Registering the host with browsers: the host manifest in each browser's
//! per-user `NativeMessagingHosts` directory (or one profile's), and on
//! Windows the registry key that points at it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::caller::{allowed_file, is_valid_addon_id, is_valid_extension_id};

pub use pedelec_protocol::registration::{Browser, HOST_NAME, Layout, Os, manifest_path};

/// The layout of the user running this process.
pub fn current_layout() -> Layout {
    Layout::from_env(|k| std::env::var(k).ok())
}

/// The host's path as a manifest names it: absolute, and on Unix with its
/// symlinks resolved (the manifest keeps working when a link moves). Not
/// canonical on Windows, where that is a verbatim `\\?\C:\…` path that
/// browsers do not promise to start.
pub fn manifest_host_path(path: PathBuf) -> PathBuf {
    if cfg!(windows) { std::path::absolute(&path).unwrap_or(path) } else { path.canonicalize().unwrap_or(path) }
}

const DESCRIPTION: &str = "Pedelec: drive a local AI coding agent from web pages";

/// Parses `--browser` (a browser's name or `all`).
pub fn parse_browser(text: &str) -> Result<Browser, String> {
    Browser::parse(text)
        .ok_or_else(|| format!("unknown browser {text:?} (chrome, chromium, edge, brave, firefox, all)"))
}

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("extension id {0:?} is not 32 characters a-p")]
    BadExtensionId(String),
    #[error("Firefox add-on id {0:?} is not valid")]
    BadAddonId(String),
    #[error("host path {0} must be absolute")]
    RelativeHostPath(PathBuf),
    #[error("nothing to register: give --extension-id (and --firefox-addon-id for Firefox)")]
    NothingToRegister,
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RegistrationError {
    let context = context.into();
    move |source| RegistrationError::Io { context, source }
}

/// The Chromium-family manifest.
pub fn chromium_manifest(host_path: &Path, extension_ids: &[String]) -> Value {
    json!({
        "name": HOST_NAME,
        "description": DESCRIPTION,
        "path": host_path.display().to_string(),
        "type": "stdio",
        "allowed_origins": extension_ids.iter().map(|id| format!("chrome-extension://{id}/")).collect::<Vec<_>>(),
    })
}

/// The Firefox manifest (only `allowed_extensions`: old Firefox rejects `allowed_origins`).
pub fn firefox_manifest(host_path: &Path, addon_ids: &[String]) -> Value {
    json!({
        "name": HOST_NAME,
        "description": DESCRIPTION,
        "path": host_path.display().to_string(),
        "type": "stdio",
        "allowed_extensions": addon_ids,
    })
}

/// What to register.
#[derive(Debug, Clone)]
pub struct Install {
    pub host_path: PathBuf,
    pub extension_ids: Vec<String>,
    pub firefox_addon_ids: Vec<String>,
    pub browser: Browser,
    /// Register into this browser profile's own `NativeMessagingHosts/` instead.
    pub profile: Option<PathBuf>,
}

/// Writes the manifests and the allowed-id list; returns the manifest paths written.
pub fn install(layout: &Layout, request: &Install) -> Result<Vec<PathBuf>, RegistrationError> {
    for id in &request.extension_ids {
        if !is_valid_extension_id(id) {
            return Err(RegistrationError::BadExtensionId(id.clone()));
        }
    }
    for id in &request.firefox_addon_ids {
        if !is_valid_addon_id(id) {
            return Err(RegistrationError::BadAddonId(id.clone()));
        }
    }
    if !request.host_path.is_absolute() {
        return Err(RegistrationError::RelativeHostPath(request.host_path.clone()));
    }
    let mut targets: Vec<(Option<Browser>, PathBuf, Value)> = Vec::new();
    let chromium = chromium_manifest(&request.host_path, &request.extension_ids);
    match &request.profile {
        Some(profile) => targets.push((None, profile.join("NativeMessagingHosts"), chromium.clone())),
        None => {
            for browser in request.browser.expand() {
                let manifest = match browser {
                    Browser::Firefox if request.firefox_addon_ids.is_empty() => continue,
                    Browser::Firefox => firefox_manifest(&request.host_path, &request.firefox_addon_ids),
                    _ if request.extension_ids.is_empty() => continue,
                    _ => chromium.clone(),
                };
                targets.push((Some(browser), layout.manifest_dir(browser), manifest));
            }
        }
    }
    if targets.is_empty() {
        return Err(RegistrationError::NothingToRegister);
    }
    let mut written = Vec::new();
    for (browser, dir, manifest) in targets {
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let path = dir.join(format!("{HOST_NAME}.json"));
        let text = serde_json::to_string_pretty(&manifest).expect("JSON values serialize");
        std::fs::write(&path, text + "\n").map_err(io(format!("writing {}", path.display())))?;
        if let Some(browser) = browser {
            keys::register(browser, &path)?;
        }
        written.push(path);
    }
    let allowed: Vec<&String> = request.extension_ids.iter().chain(&request.firefox_addon_ids).collect();
    let file = allowed_file(&layout.config_home);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(io("creating the Pedelec config directory"))?;
    }
    std::fs::write(&file, json!({ "allowed": allowed }).to_string())
        .map_err(io("writing the allowed-extension list"))?;
    Ok(written)
}

/// Removes the manifests (and the allowed list); returns what was removed.
pub fn uninstall(layout: &Layout, browser: Browser, profile: Option<&Path>) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = match profile {
        Some(p) => vec![p.join("NativeMessagingHosts")],
        None => browser.expand().into_iter().map(|b| layout.manifest_dir(b)).collect(),
    };
    let mut removed = Vec::new();
    for dir in dirs {
        let path = dir.join(format!("{HOST_NAME}.json"));
        if std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    if profile.is_none() {
        browser.expand().into_iter().for_each(keys::unregister);
    }
    if profile.is_none() && browser == Browser::All {
        let _ = std::fs::remove_file(allowed_file(&layout.config_home));
    }
    removed
}

/// One browser's registration state.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub browser: Browser,
    pub manifest: PathBuf,
    /// The manifest's contents when present and readable.
    pub contents: Option<Value>,
}

pub fn status(layout: &Layout) -> Vec<Registered> {
    Browser::EACH
        .iter()
        .map(|&browser| {
            let manifest = keys::registered(browser).unwrap_or_else(|| manifest_path(layout, browser));
            let contents = std::fs::read_to_string(&manifest).ok().and_then(|t| serde_json::from_str(&t).ok());
            Registered { browser, manifest, contents }
        })
        .collect()
}

/// The registry keys that point Windows browsers at their manifests
/// (`HKEY_CURRENT_USER\\<registry_key>`, default value = the manifest's
/// path). Elsewhere browsers look in fixed directories, and these do nothing.
#[cfg(windows)]
mod keys {
    use super::*;
    use pedelec_protocol::registration::registry_key;
    use winreg::RegKey;
    use winreg::enums::HKEY_CURRENT_USER;

    pub fn register(browser: Browser, manifest: &Path) -> Result<(), RegistrationError> {
        let key = registry_key(browser);
        let (entry, _) =
            RegKey::predef(HKEY_CURRENT_USER).create_subkey(&key).map_err(io(format!("creating HKCU\\{key}")))?;
        entry.set_value("", &manifest.as_os_str()).map_err(io(format!("writing HKCU\\{key}")))
    }

    pub fn unregister(browser: Browser) {
        let _ = RegKey::predef(HKEY_CURRENT_USER).delete_subkey(registry_key(browser));
    }

    /// The manifest path the browser's key names, if it has one.
    pub fn registered(browser: Browser) -> Option<PathBuf> {
        let entry = RegKey::predef(HKEY_CURRENT_USER).open_subkey(registry_key(browser)).ok()?;
        entry.get_value::<std::ffi::OsString, _>("").ok().map(PathBuf::from)
    }
}

#[cfg(not(windows))]
mod keys {
    use super::*;

    pub fn register(_browser: Browser, _manifest: &Path) -> Result<(), RegistrationError> {
        Ok(())
    }

    pub fn unregister(_browser: Browser) {}

    pub fn registered(_browser: Browser) -> Option<PathBuf> {
        None
    }
}
