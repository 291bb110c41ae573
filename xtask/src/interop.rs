//! The third-party client of the interop test: a Python virtualenv in
//! `target/interop-venv` with the pinned grpcio packages of
//! `interop/python/requirements.txt` (installed once per requirements file).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::root;

pub fn install() -> Result<PathBuf> {
    let root = root();
    let requirements = root.join("interop/python/requirements.txt");
    let wanted = std::fs::read(&requirements).context("reading interop/python/requirements.txt")?;
    let venv = root.join("target/interop-venv");
    let stamp = venv.join("pedelec-requirements.txt");
    if std::fs::read(&stamp).is_ok_and(|installed| installed == wanted) {
        return Ok(venv);
    }
    eprintln!("$ python3 -m venv {} && pip install -r {}", venv.display(), requirements.display());
    let status =
        Command::new("python3").arg("-m").arg("venv").arg(&venv).status().context("running python3 -m venv")?;
    if !status.success() {
        bail!("python3 -m venv failed ({status}); install python3-venv");
    }
    // Bounded: an unreachable index must not hang CI.
    let status = Command::new("timeout")
        .arg("600")
        .arg(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&requirements)
        .status()
        .context("running pip install")?;
    if !status.success() {
        bail!("pip install of the interop client failed ({status})");
    }
    std::fs::write(&stamp, &wanted)?;
    Ok(venv)
}
