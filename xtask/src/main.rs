//! `cargo xtask …`: every developer workflow as plain Rust.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod agents;
mod chaos;
mod deps;
mod interop;
mod web;

#[derive(Parser)]
#[command(about = "Pedelec developer workflows")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt --check, clippy -D warnings, every test, the wasm32 build of pedelec-protocol, doc tests, `cargo package`
    /// of the SDK's crates, and the chaos suite.
    Ci,
    /// Run a real session against a fresh Core (scripted provider unless told otherwise).
    Demo {
        /// Provider code.
        #[arg(long, default_value = "scripted")]
        provider: String,
    },
    /// Print the benchmark figures (release build).
    Bench,
    /// Check which workspace crate depends on which (ARCHITECTURE.md's picture).
    Deps,
    /// tsc --noEmit over a usage file that calls every method pedelec.d.ts declares.
    WebTypecheck,
    /// Mozilla's web-ext lint over extension/ (the extension as Firefox reads it).
    LintExtension,
    /// Real faults against real Core and native-host processes (dev build); fails if a session is lost or an
    /// awaited operation never settles.
    Chaos,
    /// Build release binaries into dist/ (binaries, manifest template, instructions) and a tar.gz.
    Package,
    /// Build the browser package (wasm-bindgen, at the crate's pinned version) and the demo page into target/web.
    Web,
    /// The browser path in headless Chromium, median of 3 rounds: tool round trip and its floor (a bare
    /// request round trip), deltas per second of a 100 000-delta turn, messages per 1 000 deltas, page memory.
    WebBench {
        /// Tool calls per round.
        #[arg(long, default_value_t = 400)]
        calls: u32,
    },
    /// The conformance matrix: install the pinned real agents (agents/package.json) into target/agents and run them
    /// through Core and the SDK against the test model server; prints each agent's figures.
    Agents,
    /// Register the packaged native host for the current user.
    Install {
        /// Chromium-family extension id (32 characters a-p).
        #[arg(long)]
        extension_id: String,
        /// chrome, chromium, edge, brave, firefox or all.
        #[arg(long, default_value = "all")]
        browser: String,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Ci => ci(),
        Task::Demo { provider } => demo(&provider),
        Task::Bench => bench(),
        Task::Deps => deps::check(),
        Task::WebTypecheck => web::typecheck(),
        Task::LintExtension => web::lint_extension(),
        Task::Chaos => chaos::run(),
        Task::Package => package().map(|_| ()),
        Task::Web => web::build().map(|_| ()),
        Task::WebBench { calls } => web::bench(calls),
        Task::Agents => agents_matrix(),
        Task::Install { extension_id, browser } => install(&extension_id, &browser),
    }
}

pub(crate) fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

pub(crate) fn cargo_with_env(args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ {}cargo {}", envs.iter().map(|(k, v)| format!("{k}={v} ")).collect::<String>(), args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .with_context(|| format!("running cargo {args:?}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn has_nextest() -> bool {
    Command::new("cargo").args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}

pub(crate) fn has_wasm_target() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == "wasm32-unknown-unknown"))
}

fn ci() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    deps::check()?;
    // A fresh machine may lack the target; adding it must not hang CI.
    if has_wasm_target()
        || Command::new("timeout")
            .args(["120", "rustup", "target", "add", "wasm32-unknown-unknown"])
            .status()
            .is_ok_and(|s| s.success())
    {
        cargo(&["build", "-p", "pedelec-protocol", "--target", "wasm32-unknown-unknown", "--no-default-features"])?;
    } else {
        eprintln!("warning: wasm32-unknown-unknown target unavailable; skipping the wasm build of pedelec-protocol");
    }
    web::clippy()?;
    web::typecheck()?;
    web::lint_extension()?;
    // The browser test (crates/pedelec-web-e2e) loads the package and demo from target/web.
    web::build()?;
    // The conformance matrix in the suite runs the real agents (it fails under CI=true without them).
    agents::install()?;
    // The Python client of the interop test (fails under CI=true without it).
    interop::install()?;
    // The SDK's tests start the real Core and native-host binaries, and the fake ACP agent.
    cargo(&["build", "-p", "pedelec-core", "-p", "pedelec-native-host", "-p", "pedelec-test-agents", "--bins"])?;
    if has_nextest() {
        cargo(&["nextest", "run", "--workspace", "--no-fail-fast"])?;
    } else {
        cargo(&["test", "--workspace", "--no-fail-fast"])?;
    }
    // nextest does not run doc tests: the examples in the API docs compile (and run) here.
    cargo(&["test", "--doc", "--workspace"])?;
    // The crates an application depends on package and build from their own
    // tarballs: metadata, README, and the .proto files (through
    // pedelec-protocol's `proto` symlink to the workspace's one copy).
    // --allow-dirty: a local run has uncommitted work; CI's clone is clean.
    cargo(&["package", "--allow-dirty", "-p", "pedelec-protocol", "-p", "pedelec-client", "-p", "pedelec-sdk"])?;
    // Once the tests showed each piece works: real faults against all of them together.
    chaos::run()
}

fn agents_matrix() -> Result<()> {
    agents::install()?;
    cargo(&["build", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    // --no-capture so each agent's PEDELEC_AGENT_FIGURES line reaches the terminal.
    if has_nextest() {
        cargo(&["nextest", "run", "-p", "pedelec-sdk", "--no-fail-fast", "--no-capture", "-E", "test(/real_agents::/)"])
    } else {
        cargo(&["test", "-p", "pedelec-sdk", "--test", "all", "real_agents::", "--", "--nocapture"])
    }
}

fn demo(provider: &str) -> Result<()> {
    cargo(&["build", "--quiet", "-p", "pedelec-core", "--bin", "pedelec-core"])?;
    cargo(&["run", "--quiet", "-p", "pedelec-sdk", "--example", "demo", "--", "--provider", provider])
}

fn bench() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "--quiet",
        "-p",
        "pedelec-core",
        "-p",
        "pedelec-native-host",
        "-p",
        "pedelec-test-agents",
        "--bins",
    ])?;
    // The benches measure the host as it is shipped.
    let host = release_host()?;
    let host = host.to_str().context("a UTF-8 target path")?;
    let envs = [("PEDELEC_NATIVE_HOST_BIN", host)];
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "load_bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-core", "--example", "provider_bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-native-host", "--example", "host_bench"], &envs)
}

/// The release native host as shipped. On x86_64/aarch64 Linux with glibc it
/// is linked statically: a browser starts one host per port, and loading the
/// shared libraries took half of its start-up (spawn → first reply 2.2 → 1.3
/// ms here). The target is named explicitly so the flag reaches only the
/// host's own code and dependencies, not build scripts or proc-macros (which
/// cannot be static).
fn release_host() -> Result<std::path::PathBuf> {
    let root = root();
    let triple = host_triple()?;
    if !(triple.ends_with("-linux-gnu") && (triple.starts_with("x86_64") || triple.starts_with("aarch64"))) {
        cargo(&["build", "--release", "-p", "pedelec-native-host", "--bin", "pedelec-native-host"])?;
        return Ok(root.join("target/release/pedelec-native-host"));
    }
    let flags_var = format!("CARGO_TARGET_{}_RUSTFLAGS", triple.to_uppercase().replace('-', "_"));
    cargo_with_env(
        &[
            "build",
            "--release",
            "--quiet",
            "--target",
            &triple,
            "-p",
            "pedelec-native-host",
            "--bin",
            "pedelec-native-host",
        ],
        &[(&flags_var, "-C target-feature=+crt-static")],
    )?;
    Ok(root.join("target").join(&triple).join("release/pedelec-native-host"))
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

pub(crate) fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

const MANIFEST_TEMPLATE: &str = r#"{
  "name": "dev.pedelec.host",
  "description": "Pedelec: drive a local AI coding agent from web pages",
  "path": "@HOST_PATH@",
  "type": "stdio",
  "allowed_origins": ["chrome-extension://@EXTENSION_ID@/"]
}
"#;

const INSTALL_TEXT: &str = "# Installing Pedelec

1. Put this folder somewhere permanent (e.g. ~/.local/share/pedelec).
2. Register the native host for your browser(s):

       bin/pedelec-native-host install --extension-id <your extension id> [--browser chrome|chromium|edge|brave|firefox|all]

   (`--profile <user-data-dir>` registers into one browser profile instead;
   `bin/pedelec-native-host status` shows what is registered, `uninstall` removes it.)
3. The host starts `bin/pedelec-core serve` on demand; you can also run it yourself.

`dev.pedelec.host.json.template` is the manifest the install command writes,
for registering by hand.
";

/// Builds release binaries and lays out dist/pedelec-<version>/ plus a tar.gz.
fn package() -> Result<std::path::PathBuf> {
    cargo(&["build", "--release", "-p", "pedelec-core", "--bin", "pedelec-core"])?;
    let host = release_host()?;
    let root = root();
    let name = format!("pedelec-{}", env!("CARGO_PKG_VERSION"));
    let dist = root.join("dist");
    let folder = dist.join(&name);
    if folder.exists() {
        std::fs::remove_dir_all(&folder)?;
    }
    std::fs::create_dir_all(folder.join("bin"))?;
    for (bin, built) in [("pedelec-core", root.join("target/release/pedelec-core")), ("pedelec-native-host", host)] {
        std::fs::copy(&built, folder.join("bin").join(bin)).with_context(|| format!("copying {}", built.display()))?;
    }
    std::fs::write(folder.join("dev.pedelec.host.json.template"), MANIFEST_TEMPLATE)?;
    std::fs::write(folder.join("INSTALL.md"), INSTALL_TEXT)?;
    let tarball = dist.join(format!("{name}.tar.gz"));
    let status = Command::new("tar").arg("-czf").arg(&tarball).arg("-C").arg(&dist).arg(&name).status()?;
    if !status.success() {
        bail!("tar failed ({status})");
    }
    println!("packaged {} and {}", folder.display(), tarball.display());
    Ok(folder)
}

fn install(extension_id: &str, browser: &str) -> Result<()> {
    let folder = package()?;
    let host = folder.join("bin/pedelec-native-host");
    let status = Command::new(&host)
        .args(["install", "--extension-id", extension_id, "--browser", browser, "--host-path"])
        .arg(&host)
        .status()?;
    if !status.success() {
        bail!("registration failed ({status})");
    }
    Ok(())
}
