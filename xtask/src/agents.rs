//! The real agents of the conformance matrix: `agents/package.json` and its
//! lock pin them; `npm ci` installs them into `target/agents` (never
//! globally), and only again when the lock changed.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::root;

/// `target/agents`, installed from `agents/package-lock.json`.
pub fn install() -> Result<PathBuf> {
    let root = root();
    let target = root.join("target/agents");
    npm_ci(&root.join("agents"), &target, 900)?;
    Ok(target)
}

/// `npm ci` of `source`'s package.json and lock into `target`, redone only
/// when the lock changed; bounded by `timeout_secs`, so an unreachable
/// registry cannot hang CI.
pub fn npm_ci(source: &std::path::Path, target: &std::path::Path, timeout_secs: u32) -> Result<()> {
    let lock = std::fs::read(source.join("package-lock.json"))
        .with_context(|| format!("reading {}", source.join("package-lock.json").display()))?;
    let installed_lock = target.join("package-lock.json");
    let done = target.join("node_modules/.package-lock.json");
    if done.exists() && std::fs::read(&installed_lock).is_ok_and(|l| l == lock) {
        return Ok(());
    }
    std::fs::create_dir_all(target)?;
    std::fs::copy(source.join("package.json"), target.join("package.json"))?;
    std::fs::write(&installed_lock, &lock)?;
    eprintln!("$ npm ci ({} → {})", source.display(), target.display());
    let status = Command::new("timeout")
        .args([&timeout_secs.to_string(), "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(target)
        .status()
        .context("running npm ci (is Node.js installed?)")?;
    if !status.success() {
        // A half-finished install must not pass for a finished one next time.
        let _ = std::fs::remove_file(&installed_lock);
        bail!("npm ci in {} failed ({status})", target.display());
    }
    Ok(())
}
