//! `install`, `uninstall`, `status` against a temporary HOME.

use std::path::Path;

use pedelec_native_host::registration::{self, Browser, Install, Layout, Os};

use super::ID;

fn layout(home: &Path, os: Os) -> Layout {
    Layout { home: home.into(), config_home: home.join(".config"), os }
}

/// A registration for every browser, Firefox included.
fn every_browser(host_path: &str) -> Install {
    Install {
        host_path: host_path.into(),
        extension_ids: vec![ID.into()],
        firefox_addon_ids: vec!["pedelec@example.org".into()],
        browser: Browser::All,
        profile: None,
    }
}

/// The written paths relative to the temporary home.
fn below(home: &Path, written: &[std::path::PathBuf]) -> Vec<String> {
    written.iter().map(|p| p.strip_prefix(home).unwrap().display().to_string()).collect()
}

fn normalised(home: &Path, path: &Path) -> String {
    std::fs::read_to_string(path).unwrap().replace(&home.display().to_string(), "$HOME")
}

#[test]
fn install_writes_each_browsers_manifest_and_uninstall_removes_them() {
    let home = tempfile::tempdir().unwrap();
    let l = layout(home.path(), Os::Linux);
    let request = every_browser("/opt/pedelec/pedelec-native-host");
    let written = registration::install(&l, &request).unwrap();
    let relative = below(home.path(), &written);
    insta::assert_debug_snapshot!("linux_locations", relative);
    insta::assert_snapshot!("chromium_manifest", normalised(home.path(), &written[0]));
    insta::assert_snapshot!("firefox_manifest", normalised(home.path(), written.last().unwrap()));
    assert!(registration::status(&l).iter().all(|r| r.contents.is_some()));
    let removed = registration::uninstall(&l, Browser::All, None);
    assert_eq!(removed.len(), 5);
    assert!(registration::status(&l).iter().all(|r| r.contents.is_none()));
}

#[test]
fn macos_locations_and_profile_registration() {
    let home = tempfile::tempdir().unwrap();
    let l = layout(home.path(), Os::MacOs);
    let mut request = Install {
        host_path: "/Applications/Pedelec/pedelec-native-host".into(),
        extension_ids: vec![ID.into()],
        firefox_addon_ids: vec![],
        browser: Browser::All,
        profile: None,
    };
    let written = registration::install(&l, &request).unwrap();
    let relative = below(home.path(), &written);
    insta::assert_debug_snapshot!("macos_locations", relative);
    request.profile = Some(home.path().join("profile"));
    let written = registration::install(&l, &request).unwrap();
    assert_eq!(written, vec![home.path().join("profile/NativeMessagingHosts/dev.pedelec.host.json")]);
}

#[test]
fn bad_registrations_are_refused() {
    let home = tempfile::tempdir().unwrap();
    let l = layout(home.path(), Os::Linux);
    let base = Install {
        host_path: "/opt/h".into(),
        extension_ids: vec![],
        firefox_addon_ids: vec![],
        browser: Browser::Chrome,
        profile: None,
    };
    for (ids, path) in [
        (vec!["short".to_string()], "/opt/h"),
        (vec!["ABCDEFGHIJKLMNOPABCDEFGHIJKLMNOP".into()], "/opt/h"),
        (vec![ID.into()], "relative/h"),
        (vec![], "/opt/h"),
    ] {
        let request = Install { extension_ids: ids, host_path: path.into(), ..base.clone() };
        assert!(registration::install(&l, &request).is_err());
    }
    assert!(!home.path().join(".config/google-chrome").exists(), "nothing written");
}

/// Windows browsers find a manifest through the registry, so each one gets
/// its own file below `%LOCALAPPDATA%\Pedelec` (Firefox's differs from the
/// Chromium family's); the keys themselves are written only by a Windows
/// build (the wine smoke test of `cargo xtask cross` checks them).
#[test]
fn windows_keeps_one_manifest_per_browser_below_local_app_data() {
    let home = tempfile::tempdir().unwrap();
    let local = home.path().join("AppData/Local");
    let env = |k: &str| match k {
        "USERPROFILE" => Some(home.path().display().to_string()),
        "LOCALAPPDATA" => Some(local.display().to_string()),
        _ => None,
    };
    let l = Layout::from_env_on(Os::Windows, env);
    assert_eq!(l.config_home, local);
    let request = every_browser("/opt/pedelec/pedelec-native-host.exe");
    let written = registration::install(&l, &request).unwrap();
    let relative = below(home.path(), &written);
    insta::assert_debug_snapshot!("windows_locations", relative);
    let firefox: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(written.last().unwrap()).unwrap()).unwrap();
    assert_eq!(firefox["allowed_extensions"], serde_json::json!(["pedelec@example.org"]));
    assert!(registration::status(&l).iter().all(|r| r.contents.is_some()));
    assert_eq!(registration::uninstall(&l, Browser::All, None).len(), 5);
}
