//! `cargo xtask web` and `cargo xtask web-bench`: the browser package and its demo.
//!
//! Layout written under `target/web/`:
//! - `pkg/` — wasm-bindgen output (`--target web`): `pedelec_sdk.js`, `pedelec_sdk_bg.wasm`, `snippets/` (inline JS),
//!   the hand-written `pedelec.d.ts` and a `package.json` pointing at both;
//! - `demo/` — the demo page (chat box, status badge, tool-driven counter, assets).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, root};

const WASM_TARGET: &str = "wasm32-unknown-unknown";
const WEB_FEATURES: [&str; 6] = ["-p", "pedelec-sdk", "--target", WASM_TARGET, "--no-default-features", "--features"];

/// The `wasm-bindgen` version pinned in pedelec-sdk's Cargo.toml (`=x.y.z`):
/// the CLI must match the crate exactly, so the pin is the one source.
fn pinned_wasm_bindgen() -> Result<String> {
    let manifest = std::fs::read_to_string(root().join("crates/pedelec-sdk/Cargo.toml"))?;
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("wasm-bindgen ="))
        .context("pedelec-sdk's Cargo.toml has no wasm-bindgen dependency")?;
    let version = line.split("\"=").nth(1).and_then(|rest| rest.split('"').next());
    version.map(str::to_owned).with_context(|| format!("wasm-bindgen is not pinned with =x.y.z: {line}"))
}

fn installed_wasm_bindgen() -> Option<String> {
    let out = Command::new("wasm-bindgen").arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_owned)
}

/// Installs wasm-bindgen-cli at exactly the pinned version when it is missing or differs.
fn ensure_wasm_bindgen() -> Result<()> {
    let pinned = pinned_wasm_bindgen()?;
    if installed_wasm_bindgen().as_deref() == Some(pinned.as_str()) {
        return Ok(());
    }
    // Without --locked: the CLI's lockfile pins a webpki-roots the registry no longer has.
    cargo(&["install", "wasm-bindgen-cli", "--version", &format!("={pinned}")])?;
    match installed_wasm_bindgen() {
        Some(v) if v == pinned => Ok(()),
        other => bail!(
            "wasm-bindgen {pinned} was installed but `wasm-bindgen --version` says {other:?} (is ~/.cargo/bin on PATH?)"
        ),
    }
}

/// Where cargo puts what it builds: `$CARGO_TARGET_DIR`, else `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// Where `cargo xtask web` lays out the package and the demo.
pub fn web_dir() -> PathBuf {
    target_dir().join("web")
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest).with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

const PACKAGE_JSON: &str = r#"{
  "name": "pedelec",
  "version": "@VERSION@",
  "description": "Drive a local AI coding agent from a web page through the Pedelec extension",
  "type": "module",
  "main": "pedelec_sdk.js",
  "types": "pedelec.d.ts",
  "exports": {
    ".": { "types": "./pedelec.d.ts", "default": "./pedelec_sdk.js" },
    "./pedelec_sdk_bg.wasm": "./pedelec_sdk_bg.wasm",
    "./package.json": "./package.json"
  },
  "files": ["pedelec_sdk.js", "pedelec_sdk_bg.wasm", "pedelec.d.ts", "snippets"],
  "sideEffects": false
}
"#;

/// Builds the wasm package and the demo; returns `target/web`.
pub fn build() -> Result<PathBuf> {
    ensure_wasm_bindgen()?;
    // `--crate-type cdylib` here rather than in the manifest: natively the SDK
    // stays an rlib, so ordinary builds do not link a shared library too.
    let mut args = vec!["rustc", "--lib"];
    args.extend(WEB_FEATURES);
    args.extend(["web", "--release", "--crate-type", "cdylib"]);
    cargo(&args)?;
    let wasm = target_dir().join(WASM_TARGET).join("release/pedelec_sdk.wasm");
    let out = web_dir();
    let pkg = out.join("pkg");
    if pkg.exists() {
        std::fs::remove_dir_all(&pkg)?;
    }
    eprintln!("$ wasm-bindgen --target web --out-dir {} {}", pkg.display(), wasm.display());
    let status = Command::new("wasm-bindgen")
        .args(["--target", "web", "--no-typescript", "--out-name", "pedelec_sdk", "--out-dir"])
        .arg(&pkg)
        .arg(&wasm)
        .status()
        .context("running wasm-bindgen")?;
    if !status.success() {
        bail!("wasm-bindgen failed ({status})");
    }
    let sources = root().join("crates/pedelec-sdk/web");
    std::fs::copy(sources.join("pedelec.d.ts"), pkg.join("pedelec.d.ts"))?;
    std::fs::write(pkg.join("package.json"), PACKAGE_JSON.replace("@VERSION@", env!("CARGO_PKG_VERSION")))?;
    let demo = out.join("demo");
    if demo.exists() {
        std::fs::remove_dir_all(&demo)?;
    }
    copy_dir(&sources.join("demo"), &demo)?;
    let tarball = pack(&pkg, &out)?;
    let bundled = out.join("bundled");
    bundle(&sources.join("bundled"), &tarball, &bundled)?;
    println!(
        "web package: {}\nnpm tarball: {}\ndemo page:   {}\nbundled page: {}",
        pkg.display(),
        tarball.display(),
        demo.join("index.html").display(),
        bundled.join("index.html").display()
    );
    Ok(out)
}

/// Runs `program args…` in `dir`, bounded by `timeout_secs` (an unreachable
/// registry must not hang CI); returns its stdout.
fn run_bounded(dir: &Path, timeout_secs: u32, program: &Path, args: &[&str]) -> Result<String> {
    let out = run_bounded_output(dir, timeout_secs, program, args)?;
    if !out.status.success() {
        bail!("{} {} failed ({})", program.display(), args.join(" "), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run_bounded`] whatever the exit status: stdout and the status.
fn run_bounded_output(dir: &Path, timeout_secs: u32, program: &Path, args: &[&str]) -> Result<std::process::Output> {
    eprintln!("$ {} {} (in {})", program.display(), args.join(" "), dir.display());
    Command::new("timeout")
        .arg(timeout_secs.to_string())
        .arg(program)
        .args(args)
        .current_dir(dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", program.display()))
}

/// `npm pack` of the package into `out`: the tarball a web developer's
/// `npm install` would unpack. Returns its path.
fn pack(pkg: &Path, out: &Path) -> Result<PathBuf> {
    let dest = out.to_str().context("target/web is not UTF-8")?;
    let stdout = run_bounded(pkg, 120, Path::new("npm"), &["pack", "--silent", "--pack-destination", dest])?;
    let name = stdout.lines().rev().find(|l| l.ends_with(".tgz")).context("npm pack named no tarball")?;
    Ok(out.join(name.trim()))
}

/// Builds `web/bundled` with vite (pinned by its lock) against the packed
/// tarball, as an application would: `npm ci` of vite, `npm install` of the
/// tarball, `vite build` into `dest`. The page's sources are copied next to
/// their `node_modules`, since a bundler resolves packages from there.
fn bundle(source: &Path, tarball: &Path, dest: &Path) -> Result<()> {
    let work = target_dir().join("web-bundled");
    crate::agents::npm_ci(source, &work, 600)?;
    for file in ["index.html", "main.js", "vite.config.js"] {
        std::fs::copy(source.join(file), work.join(file)).with_context(|| format!("copying {file}"))?;
    }
    let tarball = tarball.to_str().context("the tarball path is not UTF-8")?;
    // --no-save: the lock pins vite only; the tarball changes with every build.
    run_bounded(
        &work,
        300,
        Path::new("npm"),
        &["install", "--no-save", "--no-audit", "--no-fund", "--loglevel=error", tarball],
    )?;
    let vite = work.join("node_modules/.bin/vite");
    let dest_str = dest.to_str().context("target/web is not UTF-8")?;
    run_bounded(&work, 300, &vite, &["build", "--logLevel", "warn", "--outDir", dest_str, "--emptyOutDir"])?;
    Ok(())
}

/// `tsc --noEmit` over `web/typecheck/usage.ts`, which calls every method
/// `pedelec.d.ts` declares. TypeScript comes pinned from the npm registry
/// (`npm ci` into `target/web-typecheck`, redone only when the lock changes).
pub fn typecheck() -> Result<()> {
    let source = root().join("crates/pedelec-sdk/web/typecheck");
    let work = target_dir().join("web-typecheck");
    crate::agents::npm_ci(&source, &work, 600)?;
    let tsc = work.join("node_modules/.bin/tsc");
    eprintln!("$ tsc --noEmit -p {}", source.display());
    let status = Command::new(&tsc).arg("-p").arg(&source).status().context("running tsc")?;
    if !status.success() {
        bail!("pedelec.d.ts does not type-check against web/typecheck/usage.ts ({status})");
    }
    Ok(())
}

/// clippy `-D warnings` on the browser build as well.
pub fn clippy() -> Result<()> {
    let mut args = vec!["clippy"];
    args.extend(WEB_FEATURES);
    args.extend(["web", "--", "-D", "warnings"]);
    cargo(&args)
}

/// Runs the browser benchmark against a fresh Core, in release builds.
pub fn bench(calls: u32) -> Result<()> {
    build()?;
    cargo(&["build", "--release", "--quiet", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    cargo(&["run", "--release", "--quiet", "-p", "pedelec-web-e2e", "--bin", "web-bench", "--", &calls.to_string()])
}

/// `cargo xtask screenshots`: the extension's pages need Core and the native
/// host (dev builds), and Chromium.
pub fn screenshots() -> Result<()> {
    cargo(&["build", "--quiet", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    cargo(&["run", "--quiet", "-p", "pedelec-web-e2e", "--bin", "screenshots"])
}

/// Mozilla's `web-ext lint` (pinned by `xtask/npm/web-ext`'s lock, `npm ci`
/// into `target/web-ext`) over `extension/`: the manifest and scripts as
/// Firefox reads them. Any error fails, and so does any warning but the one
/// a manifest for both browsers must carry: Firefox ignores
/// `background.service_worker` (it runs `background.scripts`, which Chromium
/// ignores in turn).
pub fn lint_extension() -> Result<()> {
    let source = root().join("xtask/npm/web-ext");
    let work = target_dir().join("web-ext");
    crate::agents::npm_ci(&source, &work, 600)?;
    let web_ext = work.join("node_modules/.bin/web-ext");
    let extension = root().join("extension");
    let extension = extension.to_str().context("the extension path is not UTF-8")?;
    // Its exit status only says whether it found errors; the report says which.
    let out = run_bounded_output(&work, 300, &web_ext, &["lint", "--source-dir", extension, "--output", "json"])?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("web-ext lint printed no JSON report ({})", out.status))?;
    let expected = |m: &serde_json::Value| {
        m["code"] == "MANIFEST_FIELD_UNSUPPORTED" && m["message"].as_str().is_some_and(|t| t.contains("service_worker"))
    };
    let problems: Vec<String> = ["errors", "warnings"]
        .iter()
        .flat_map(|kind| report[*kind].as_array().cloned().unwrap_or_default().into_iter().map(move |m| (kind, m)))
        .filter(|(_, m)| !expected(m))
        .map(|(kind, m)| format!("{kind}: {} {} ({})", m["code"], m["message"], m["file"]))
        .collect();
    if !problems.is_empty() {
        bail!("web-ext lint found problems in extension/:\n{}", problems.join("\n"));
    }
    eprintln!("web-ext lint: extension/ is clean for Firefox ({})", report["summary"]);
    Ok(())
}
