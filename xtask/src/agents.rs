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
    let source = root.join("agents");
    let target = root.join("target/agents");
    let lock = std::fs::read(source.join("package-lock.json")).context("reading agents/package-lock.json")?;
    let installed_lock = target.join("package-lock.json");
    let done = target.join("node_modules/.package-lock.json");
    if done.exists() && std::fs::read(&installed_lock).is_ok_and(|l| l == lock) {
        return Ok(target);
    }
    std::fs::create_dir_all(&target)?;
    std::fs::copy(source.join("package.json"), target.join("package.json"))?;
    std::fs::write(&installed_lock, &lock)?;
    eprintln!("$ npm ci (agents → {})", target.display());
    // Bounded: an unreachable registry must not hang CI.
    let status = Command::new("timeout")
        .args(["900", "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&target)
        .status()
        .context("running npm ci (is Node.js installed?)")?;
    if !status.success() {
        // A half-finished install must not pass for a finished one next time.
        let _ = std::fs::remove_file(&installed_lock);
        bail!("npm ci for the real agents failed ({status})");
    }
    Ok(target)
}
