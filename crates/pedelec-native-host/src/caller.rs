//! Who launched the host, and whether that extension may use it.

use std::path::{Path, PathBuf};

/// The calling extension, from the host's argv as the browser passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Chromium family: `argv[1]` is `chrome-extension://<id>/`.
    Chromium { extension_id: String },
    /// Firefox: `argv[1]` is the manifest path, `argv[2]` the add-on id.
    Firefox { addon_id: String },
}

/// Chrome extension ids are 32 characters `a`–`p`.
pub fn is_valid_extension_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| (b'a'..=b'p').contains(&b))
}

/// Firefox add-on ids: an email-like `name@domain` or a `{GUID}`, bounded.
pub fn is_valid_addon_id(id: &str) -> bool {
    id.len() <= 256
        && !id.is_empty()
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "@.-_{}+".contains(c))
        && (id.contains('@') || (id.starts_with('{') && id.ends_with('}')))
}

impl Caller {
    /// Reads the caller from the arguments after the program name.
    pub fn from_args(args: &[String]) -> Option<Caller> {
        let first = args.first()?;
        if let Some(rest) = first.strip_prefix("chrome-extension://") {
            let id = rest.strip_suffix('/').unwrap_or(rest);
            return is_valid_extension_id(id).then(|| Caller::Chromium { extension_id: id.to_owned() });
        }
        let addon = args.get(1)?;
        (first.ends_with(".json") && is_valid_addon_id(addon)).then(|| Caller::Firefox { addon_id: addon.clone() })
    }

    pub fn id(&self) -> &str {
        match self {
            Caller::Chromium { extension_id } => extension_id,
            Caller::Firefox { addon_id } => addon_id,
        }
    }
}

/// Where `install` records the extensions allowed to use the host.
pub fn allowed_file(config_home: &Path) -> PathBuf {
    config_home.join("pedelec/native-host.json")
}

/// The allowed extension/add-on ids: `$PEDELEC_ALLOWED_EXTENSIONS` (comma
/// separated) when set, else the file `install` wrote.
pub fn allowed_ids(env: impl Fn(&str) -> Option<String>, config_home: &Path) -> Vec<String> {
    if let Some(list) = env("PEDELEC_ALLOWED_EXTENSIONS") {
        return list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    }
    let Ok(text) = std::fs::read_to_string(allowed_file(config_home)) else { return Vec::new() };
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("allowed").cloned())
        .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "abcdefghijklmnopabcdefghijklmnop";

    #[test]
    fn chrome_and_firefox_argv_are_recognised() {
        let chrome = Caller::from_args(&[format!("chrome-extension://{ID}/")]).unwrap();
        assert_eq!(chrome, Caller::Chromium { extension_id: ID.into() });
        let windows = Caller::from_args(&[format!("chrome-extension://{ID}/"), "--parent-window=0".into()]);
        assert_eq!(windows, Some(chrome));
        let firefox = Caller::from_args(&[
            "/home/u/.mozilla/native-messaging-hosts/dev.pedelec.host.json".into(),
            "pedelec@example.org".into(),
        ]);
        assert_eq!(firefox, Some(Caller::Firefox { addon_id: "pedelec@example.org".into() }));
    }

    #[test]
    fn bad_ids_are_refused() {
        for bad in
            ["", "abc", "ABCDEFGHIJKLMNOPABCDEFGHIJKLMNOP", "qbcdefghijklmnopabcdefghijklmnop", &format!("{ID}a")]
        {
            assert!(!is_valid_extension_id(bad), "{bad}");
            assert_eq!(Caller::from_args(&[format!("chrome-extension://{bad}/")]), None);
        }
        assert!(is_valid_extension_id(ID));
        assert!(!is_valid_addon_id("no spaces@x"));
        assert!(is_valid_addon_id("{12345678-1234-1234-1234-123456789abc}"));
    }

    #[test]
    fn the_environment_overrides_the_installed_list() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pedelec")).unwrap();
        std::fs::write(allowed_file(dir.path()), r#"{"allowed":["from-file"]}"#).unwrap();
        assert_eq!(allowed_ids(|_| None, dir.path()), vec!["from-file"]);
        assert_eq!(
            allowed_ids(|k| (k == "PEDELEC_ALLOWED_EXTENSIONS").then(|| "a, b".into()), dir.path()),
            vec!["a", "b"]
        );
        assert!(allowed_ids(|_| None, &dir.path().join("missing")).is_empty());
    }
}
