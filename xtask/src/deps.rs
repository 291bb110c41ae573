//! The dependency picture of ARCHITECTURE.md, checked: which workspace crate
//! may depend (normally, not as a dev-dependency) on which. A crate takes
//! only what its job needs; the native host in particular relays frames and
//! must not link the session SDK.

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Each workspace crate and the workspace crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("pedelec-protocol", &[]),
    ("pedelec-ipc", &["pedelec-protocol"]),
    ("pedelec-client", &["pedelec-protocol", "pedelec-ipc"]),
    ("pedelec-sdk", &["pedelec-protocol", "pedelec-client", "pedelec-ipc"]),
    ("pedelec-core", &["pedelec-protocol", "pedelec-tool", "pedelec-ipc"]),
    ("pedelec-tool", &["pedelec-protocol", "pedelec-ipc"]),
    ("pedelec-native-host", &["pedelec-protocol", "pedelec-client"]),
    ("pedelec-test-agents", &[]),
    ("pedelec-web-e2e", &["pedelec-protocol", "pedelec-sdk"]),
    ("xtask", &[]),
];

pub fn check() -> Result<()> {
    let output = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    let packages = metadata["packages"].as_array().context("cargo metadata lists packages")?;
    let ours: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut broken = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default();
        let Some((_, allowed)) = ALLOWED.iter().find(|(crate_name, _)| *crate_name == name) else {
            broken.push(format!("{name} is not in xtask's dependency picture (xtask/src/deps.rs, ARCHITECTURE.md)"));
            continue;
        };
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let target = dependency["name"].as_str().unwrap_or_default();
            let normal = dependency["kind"].is_null();
            if normal && ours.contains(&target) && !allowed.contains(&target) {
                broken.push(format!("{name} must not depend on {target}"));
            }
        }
    }
    if !broken.is_empty() {
        bail!("the crate dependency picture is broken:\n  {}", broken.join("\n  "));
    }
    eprintln!("crate dependencies match the picture ({} crates)", packages.len());
    Ok(())
}
