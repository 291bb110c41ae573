//! `cargo xtask …`: every developer workflow as plain Rust.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod agents;
mod chaos;
mod cross;
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
    /// Build release binaries into dist/ (binaries, manifest template, install notes) and an archive per
    /// platform: a tar.gz for Linux and macOS, a zip for Windows.
    Package {
        /// linux (this machine's), windows, macos-arm64, macos-x86_64 or all; repeatable.
        #[arg(long = "target", default_value = "linux")]
        targets: Vec<String>,
    },
    /// The Windows and macOS builds (clippy -D warnings, dev builds) and the Windows smoke test under wine.
    Cross,
    /// Build the browser package (wasm-bindgen, at the crate's pinned version) and the demo page into target/web.
    Web,
    /// The browser path in headless Chromium, median of 3 rounds: tool round trip and its floor (a bare
    /// request round trip), deltas per second of a 100 000-delta turn, messages per 1 000 deltas, page memory.
    WebBench {
        /// Tool calls per round.
        #[arg(long, default_value_t = 400)]
        calls: u32,
    },
    /// A PNG of each view of the control center (docs/screenshots/), made from the real pages in headless
    /// Chromium against a real Core given a few sites' sessions.
    Screenshots,
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
        Task::Package { targets } => package(&targets).map(|_| ()),
        Task::Cross => cross::check(),
        Task::Web => web::build().map(|_| ()),
        Task::WebBench { calls } => web::bench(calls),
        Task::Agents => agents_matrix(),
        Task::Screenshots => web::screenshots(),
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
        cargo(&["build", "-p", "pedelec-protocol", "--target", "wasm32-unknown-unknown"])?;
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
    // The SDK's tests start the real Core, native-host and tool-client
    // binaries, and the fake agents.
    cargo(&[
        "build",
        "-p",
        "pedelec-core",
        "-p",
        "pedelec-native-host",
        "-p",
        "pedelec-tool",
        "-p",
        "pedelec-test-agents",
        "--bins",
    ])?;
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
    package_crates()?;
    // The platform smoke test natively, then the Windows and macOS builds
    // (dev profile) and the Windows one under wine.
    cargo(&["run", "--quiet", "-p", "pedelec-sdk", "--example", "platform_smoke"])?;
    cross::check()?;
    // Once the tests showed each piece works: real faults against all of them together.
    chaos::run()
}

/// `cargo package` verifies each crate against its siblings' tarballs
/// through a local registry, and cargo takes a registry crate as immutable:
/// one unpacked and compiled by an earlier run (same version, older code)
/// is used again as it is, so a change to pedelec-protocol failed the SDK's
/// verification against the previous protocol. So verification gets a
/// target dir of its own, `target/package-verify` (where every artifact of
/// ours is such a registry copy), cleared of our crates first, and the
/// unpacked copies in `$CARGO_HOME/registry/src/-<hash>/` (the unnamed
/// local registries, never crates.io's) go too.
fn package_crates() -> Result<()> {
    const CRATES: [&str; 4] = ["pedelec-protocol", "pedelec-ipc", "pedelec-client", "pedelec-sdk"];
    let verify = root().join("target/package-verify");
    let verify = verify.to_str().context("a UTF-8 target path")?;
    let mut clean = vec!["clean", "--quiet", "--target-dir", verify];
    CRATES.iter().for_each(|c| clean.extend(["-p", c]));
    cargo(&clean)?;
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"));
    for kind in ["src", "cache"] {
        let Ok(registries) = std::fs::read_dir(home.join("registry").join(kind)) else { continue };
        for registry in registries.flatten().filter(|r| r.file_name().to_string_lossy().starts_with('-')) {
            for entry in std::fs::read_dir(registry.path())?.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if CRATES.iter().any(|c| name.starts_with(&format!("{c}-"))) {
                    let path = entry.path();
                    if path.is_dir() { std::fs::remove_dir_all(&path)? } else { std::fs::remove_file(&path)? }
                }
            }
        }
    }
    let mut package = vec!["package", "--allow-dirty", "--target-dir", verify];
    CRATES.iter().for_each(|c| package.extend(["-p", c]));
    cargo(&package)?;
    // A whole second build of the dependencies: CI's disk is bounded.
    if cross::in_ci() {
        std::fs::remove_dir_all(verify).context("removing target/package-verify")?;
    }
    Ok(())
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
    let tool = release_tool()?;
    let tool = tool.to_str().context("a UTF-8 target path")?;
    let envs = [("PEDELEC_NATIVE_HOST_BIN", host), ("PEDELEC_TOOL_BIN", tool)];
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "load_bench"], &envs)?;
    // Issue 40's figures; its Python reader is the interop client's venv
    // (`cargo xtask ci` installs it; without it that figure says skipped).
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "readers_bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-core", "--example", "provider_bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-core", "--example", "changes_bench"], &envs)?;
    cargo_with_env(&["run", "--release", "--quiet", "-p", "pedelec-native-host", "--example", "host_bench"], &envs)?;
    warm_agents()
}

/// Issue 41's memory and warm-start figures: each real agent's warm process
/// and persistent process tree (RSS), and a new session's first delta warm
/// and cold, from the matrix's `real_agents::warm` tests (the agents and
/// their model server are set up there). Skipped without the agents.
fn warm_agents() -> Result<()> {
    if std::process::Command::new("npm").arg("--version").output().is_err() {
        eprintln!("warning: npm is missing: the agents' memory figures are skipped");
        return Ok(());
    }
    agents::install()?;
    cargo(&["build", "--quiet", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    let filter = "test(/real_agents::warm::/)";
    if has_nextest() {
        cargo(&["nextest", "run", "-p", "pedelec-sdk", "--no-fail-fast", "--no-capture", "-E", filter])
    } else {
        cargo(&["test", "-p", "pedelec-sdk", "--test", "all", "real_agents::warm::", "--", "--nocapture"])
    }
}

/// The release native host as shipped (see [`release_static`]).
fn release_host() -> Result<std::path::PathBuf> {
    release_static("pedelec-native-host")
}

/// The release tool client as shipped (see [`release_static`]): agents start
/// it once per tool call.
fn release_tool() -> Result<std::path::PathBuf> {
    release_static("pedelec-tool")
}

/// A release binary that is started per use, as shipped. On x86_64/aarch64
/// Linux it is a static musl binary: a browser starts one host per port, an
/// agent one tool client per call, so start-up is what counts. Loading
/// glibc's shared libraries took half of the host's start-up (spawn → first
/// reply 2.2 → 1.3 ms here); linked statically against glibc it still spent
/// ~150 µs more than with musl before `main`, in glibc's start-up (its CPU
/// feature and cache probing by `cpuid`, which traps on a VM, and ~7 500
/// relocations of a static PIE): spawn → first reply 765–844 µs against
/// 629–679 µs, `cat` 605–625 µs (three alternating pairs). musl's
/// allocator is slower per frame (pipelined frames ~370k → ~220k/s, the
/// target is 50k; a tool round trip through the host unchanged, 88–95 µs
/// against 91–107 µs); mimalloc in its place cost ~150 µs at start.
/// The musl target is added with rustup where it is missing; where rustup
/// cannot add it, the binary is linked statically against glibc instead.
fn release_static(package: &str) -> Result<std::path::PathBuf> {
    let triple = host_triple()?;
    if !(triple.ends_with("-linux-gnu") && (triple.starts_with("x86_64") || triple.starts_with("aarch64"))) {
        cargo(&["build", "--release", "-p", package, "--bin", package])?;
        return Ok(web::target_dir().join("release").join(package));
    }
    let musl = triple.replace("-linux-gnu", "-linux-musl");
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    let has_musl = installed.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == musl))
        || Command::new("timeout").args(["300", "rustup", "target", "add", &musl]).status().is_ok_and(|s| s.success());
    if has_musl {
        cargo(&["build", "--release", "--quiet", "--target", &musl, "-p", package, "--bin", package])?;
        return Ok(web::target_dir().join(&musl).join("release").join(package));
    }
    eprintln!(
        "warning: the Rust target {musl} is missing and rustup could not add it: {package} is linked against glibc"
    );
    // The target is named explicitly so the flag reaches only the binary's
    // own code and dependencies, not build scripts or proc-macros (which
    // cannot be static).
    let flags_var = format!("CARGO_TARGET_{}_RUSTFLAGS", triple.to_uppercase().replace('-', "_"));
    cargo_with_env(
        &["build", "--release", "--quiet", "--target", &triple, "-p", package, "--bin", package],
        &[(&flags_var, "-C target-feature=+crt-static")],
    )?;
    Ok(web::target_dir().join(&triple).join("release").join(package))
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

const INSTALL_LINUX: &str = "# Installing Pedelec on Linux

1. Put this folder somewhere permanent (e.g. ~/.local/share/pedelec).
2. Register the native host for your browser(s):

       bin/pedelec-native-host install --extension-id <your extension id> [--browser chrome|chromium|edge|brave|firefox|all]

   It writes each browser's manifest under ~/.config (Firefox: ~/.mozilla).
   (`--profile <user-data-dir>` registers into one browser profile instead;
   `bin/pedelec-native-host status` shows what is registered, `uninstall` removes it.)
3. The host starts `bin/pedelec-core serve` on demand; you can also run it yourself.
   Core listens on `$XDG_RUNTIME_DIR/pedelec/core.sock`, keeps its state in
   `$XDG_STATE_HOME/pedelec` (`~/.local/state/pedelec`) and reads its settings
   from `~/.config/pedelec/config.toml`.

`dev.pedelec.host.json.template` is the manifest the install command writes,
for registering by hand.
";

const INSTALL_MACOS: &str = "# Installing Pedelec on macOS

1. Put this folder somewhere permanent (e.g. ~/Applications/Pedelec). The
   binaries are not notarised: clear the quarantine flag a download sets,
   `xattr -dr com.apple.quarantine ~/Applications/Pedelec`.
2. Register the native host for your browser(s):

       bin/pedelec-native-host install --extension-id <your extension id> [--browser chrome|chromium|edge|brave|firefox|all]

   It writes each browser's manifest under ~/Library/Application Support
   (`<browser>/NativeMessagingHosts`). `status` shows what is registered,
   `uninstall` removes it.
3. The host starts `bin/pedelec-core serve` on demand. Core keeps its socket,
   state and `config.toml` in `~/Library/Application Support/Pedelec`.
   https model endpoints trust the roots in /etc/ssl/cert.pem; give a CA that
   lives only in your keychain to the provider as `ca_file`.

`dev.pedelec.host.json.template` is the manifest the install command writes,
for registering by hand.
";

const INSTALL_WINDOWS: &str = r"# Installing Pedelec on Windows

1. Put this folder somewhere permanent, e.g. `%LOCALAPPDATA%\Programs\Pedelec` (where per-user programs go).
2. Register the native host for your browser(s), in a terminal in that folder:

       bin\pedelec-native-host.exe install --extension-id <your extension id> [--browser chrome|chromium|edge|brave|firefox|all]

   It writes each browser's manifest under `%LOCALAPPDATA%\Pedelec\NativeMessagingHosts`
   and the per-user registry key the browser reads
   (`HKEY_CURRENT_USER\Software\<vendor>\NativeMessagingHosts\dev.pedelec.host`).
   `status` shows what is registered, `uninstall` removes both.
3. The host starts `bin\pedelec-core.exe serve` on demand. Core listens on the
   named pipe `\\.\pipe\pedelec-<user>-core`, which only your user may open,
   and keeps its state and `config.toml` in `%LOCALAPPDATA%\Pedelec`. Agents
   installed by npm (`codex.cmd`) are found on PATH through PATHEXT.
";

/// The platforms `cargo xtask package --target` names (`None`: this Linux machine's).
fn package_targets(names: &[String]) -> Result<Vec<Option<cross::Target>>> {
    let mut targets = Vec::new();
    for name in names {
        match name.as_str() {
            "all" => targets.extend(std::iter::once(None).chain(cross::Target::EACH.map(Some))),
            "linux" => targets.push(None),
            other => targets.push(Some(cross::Target::parse(other).with_context(|| {
                format!("unknown target {other:?} (linux, windows, macos-arm64, macos-x86_64, all)")
            })?)),
        }
    }
    targets.dedup();
    Ok(targets)
}

/// Builds release binaries and lays out dist/pedelec-<version>-<platform>/
/// plus its archive, for each target; the folders.
fn package(names: &[String]) -> Result<Vec<std::path::PathBuf>> {
    let mut folders = Vec::new();
    for target in package_targets(names)? {
        let (platform, bins, install) = match target {
            None => {
                cargo(&["build", "--release", "-p", "pedelec-core", "--bin", "pedelec-core"])?;
                let core = root().join("target/release/pedelec-core");
                let arch = host_triple()?.split('-').next().unwrap_or("x86_64").to_owned();
                let bins = vec![
                    ("pedelec-core".to_owned(), core),
                    ("pedelec-native-host".to_owned(), release_host()?),
                    ("pedelec-tool".to_owned(), release_tool()?),
                ];
                (format!("linux-{arch}"), bins, INSTALL_LINUX)
            }
            Some(target) => {
                let built = cross::release(target)?;
                let bins = ["pedelec-core", "pedelec-native-host", "pedelec-tool"]
                    .map(|b| (target.exe(b), built.join(target.exe(b))));
                let install = if target == cross::Target::Windows { INSTALL_WINDOWS } else { INSTALL_MACOS };
                (target.os_name().to_owned(), bins.to_vec(), install)
            }
        };
        folders.push(lay_out(&platform, &bins, install, target == Some(cross::Target::Windows))?);
    }
    Ok(folders)
}

/// dist/pedelec-<version>-<platform>/ with bin/, the install notes and the
/// manifest template, and its archive beside it (a zip for Windows).
fn lay_out(
    platform: &str,
    bins: &[(String, std::path::PathBuf)],
    install: &str,
    zip: bool,
) -> Result<std::path::PathBuf> {
    let name = format!("pedelec-{}-{platform}", env!("CARGO_PKG_VERSION"));
    let dist = root().join("dist");
    let folder = dist.join(&name);
    if folder.exists() {
        std::fs::remove_dir_all(&folder)?;
    }
    std::fs::create_dir_all(folder.join("bin"))?;
    for (bin, built) in bins {
        std::fs::copy(built, folder.join("bin").join(bin)).with_context(|| format!("copying {}", built.display()))?;
    }
    std::fs::write(folder.join("dev.pedelec.host.json.template"), MANIFEST_TEMPLATE)?;
    std::fs::write(folder.join("INSTALL.md"), install)?;
    let archive = dist.join(format!("{name}.{}", if zip { "zip" } else { "tar.gz" }));
    let _ = std::fs::remove_file(&archive);
    let status = if zip {
        // Python's zipfile: on every machine here, and Windows opens a zip itself.
        Command::new("python3").args(["-m", "zipfile", "-c"]).arg(&archive).arg(&name).current_dir(&dist).status()?
    } else {
        Command::new("tar").arg("-czf").arg(&archive).arg("-C").arg(&dist).arg(&name).status()?
    };
    if !status.success() {
        bail!("archiving {name} failed ({status})");
    }
    println!("packaged {} and {}", folder.display(), archive.display());
    Ok(folder)
}

fn install(extension_id: &str, browser: &str) -> Result<()> {
    let folder = package(&["linux".to_owned()])?.remove(0);
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
