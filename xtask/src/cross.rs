//! The Windows and macOS builds, made on this Linux machine: Windows with
//! Debian's mingw-w64, macOS with `cargo-zigbuild` (zig from PyPI's
//! `ziglang` as the C compiler and linker), and the Windows build smoke
//! tested under Debian's wine.
//!
//! `cargo xtask ci` runs [`check`] (clippy -D warnings, dev builds, the wine
//! smoke test); `cargo xtask package --target …` makes the release archives.
//! Under `CI=true` a missing tool fails the run; elsewhere it is a warning
//! and that target is skipped, so a laptop without mingw still runs `ci`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, root};

/// A platform Pedelec ships for, besides the Linux it is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Windows,
    MacArm,
    MacIntel,
}

impl Target {
    pub const EACH: [Target; 3] = [Target::Windows, Target::MacArm, Target::MacIntel];

    pub fn triple(self) -> &'static str {
        match self {
            Target::Windows => "x86_64-pc-windows-gnu",
            Target::MacArm => "aarch64-apple-darwin",
            Target::MacIntel => "x86_64-apple-darwin",
        }
    }

    /// The archive's platform name.
    pub fn os_name(self) -> &'static str {
        match self {
            Target::Windows => "windows-x86_64",
            Target::MacArm => "macos-arm64",
            Target::MacIntel => "macos-x86_64",
        }
    }

    /// The `--target` name of `cargo xtask package`.
    pub fn parse(name: &str) -> Option<Target> {
        match name {
            "windows" => Some(Target::Windows),
            "macos-arm64" => Some(Target::MacArm),
            "macos-x86_64" => Some(Target::MacIntel),
            _ => None,
        }
    }

    pub fn exe(self, name: &str) -> String {
        if self == Target::Windows { format!("{name}.exe") } else { name.to_owned() }
    }

    /// Runs cargo's `subcommand` for it: plain cargo finds mingw's linker
    /// itself; macOS goes through cargo-zigbuild (`cargo zigbuild` builds,
    /// `cargo-zigbuild <subcommand>` wraps the others).
    fn run(self, subcommand: &str, args: &[&str]) -> Result<()> {
        let mut full = vec![subcommand, "--target", self.triple()];
        full.extend(args);
        match (self, subcommand) {
            (Target::Windows, _) => cargo(&full),
            (_, "build") => {
                full[0] = "zigbuild";
                cargo(&full)
            }
            _ => {
                eprintln!("$ cargo-zigbuild {}", full.join(" "));
                let status = Command::new("cargo-zigbuild").args(&full).status().context("running cargo-zigbuild")?;
                if !status.success() {
                    bail!("cargo-zigbuild {} failed ({status})", full.join(" "));
                }
                Ok(())
            }
        }
    }

    /// What building for it needs and lacks, if anything; the Rust target
    /// itself is added on the way when rustup can fetch it.
    fn missing(self) -> Option<String> {
        let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
        let has_target =
            installed.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == self.triple()));
        if !has_target
            && !Command::new("timeout")
                .args(["300", "rustup", "target", "add", self.triple()])
                .status()
                .is_ok_and(|s| s.success())
        {
            return Some(format!("the Rust target {} (rustup target add)", self.triple()));
        }
        match self {
            Target::Windows if !runs("x86_64-w64-mingw32-gcc", &["--version"]) => {
                Some("mingw-w64 (apt-get install -y mingw-w64)".into())
            }
            Target::MacArm | Target::MacIntel if !runs("cargo-zigbuild", &["--version"]) => {
                Some("cargo-zigbuild (cargo install --locked cargo-zigbuild)".into())
            }
            Target::MacArm | Target::MacIntel
                if !runs("zig", &["version"]) && !runs("python3", &["-m", "ziglang", "version"]) =>
            {
                Some("zig (pip install ziglang)".into())
            }
            _ => None,
        }
    }
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().is_ok_and(|o| o.status.success())
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The shipped crates, as each target builds them: the three binaries, the SDK
/// (with its Rust demo) and the smoke test the wine run executes.
const SHIPPED: [&str; 14] = [
    "-p",
    "pedelec-core",
    "-p",
    "pedelec-native-host",
    "-p",
    "pedelec-tool",
    "--bins",
    "-p",
    "pedelec-sdk",
    "--lib",
    "--example",
    "demo",
    "--example",
    "platform_smoke",
];

/// clippy -D warnings and a dev build of the shipped crates for every
/// target, then the Windows build's smoke test under wine.
pub fn check() -> Result<()> {
    for target in Target::EACH {
        if let Some(missing) = target.missing() {
            if in_ci() {
                bail!("the {} build needs {missing}", target.triple());
            }
            eprintln!("warning: skipping the {} build: it needs {missing}", target.triple());
            continue;
        }
        let mut clippy = SHIPPED.to_vec();
        clippy.extend(["--", "-D", "warnings"]);
        target.run("clippy", &clippy)?;
        target.run("build", &SHIPPED)?;
        if target == Target::Windows {
            wine_smoke()?;
        }
        // CI's fresh machine has a bounded disk and three targets' dev
        // builds are several GB each; a laptop keeps them warm.
        if in_ci() {
            remove_dir(&root().join("target").join(target.triple()))?;
        }
    }
    Ok(())
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// wine64 from Debian's wine64 package (it is not on PATH there).
fn wine64() -> Option<PathBuf> {
    ["/usr/lib/wine/wine64", "/usr/bin/wine64"].into_iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Runs `platform_smoke.exe` against the Windows `pedelec-core.exe` and
/// `pedelec-native-host.exe` under wine, in a wine prefix of its own.
pub fn wine_smoke() -> Result<()> {
    let Some(wine) = wine64() else {
        if in_ci() {
            bail!("the wine smoke test needs wine64 (apt-get install -y wine64)");
        }
        eprintln!("warning: skipping the wine smoke test: wine64 is not installed");
        return Ok(());
    };
    let root = root();
    let debug = root.join("target").join(Target::Windows.triple()).join("debug");
    // Wine 8 lacks Windows 10's bcryptprimitives.dll, which Rust's std
    // loads; the stand-in goes beside each executable (the loader looks
    // there first). See xtask/wine/bcryptprimitives.c.
    let dll = root.join("target/wine/bcryptprimitives.dll");
    std::fs::create_dir_all(dll.parent().expect("a parent"))?;
    let source = root.join("xtask/wine/bcryptprimitives.c");
    let status = Command::new("x86_64-w64-mingw32-gcc")
        .args(["-shared", "-O2", "-o"])
        .arg(&dll)
        .arg(&source)
        .arg("-ladvapi32")
        .status()
        .context("running x86_64-w64-mingw32-gcc")?;
    if !status.success() {
        bail!("building the bcryptprimitives stand-in failed ({status})");
    }
    for dir in [debug.clone(), debug.join("examples")] {
        std::fs::copy(&dll, dir.join("bcryptprimitives.dll"))?;
    }
    let windows_path = |p: &Path| format!("Z:{}", p.display().to_string().replace('/', "\\"));
    let prefix = root.join("target/wine/prefix");
    eprintln!("$ wine64 platform_smoke.exe (WINEPREFIX={})", prefix.display());
    let status = Command::new("timeout")
        .arg("300")
        .arg(&wine)
        .arg(debug.join("examples/platform_smoke.exe"))
        .arg("--core")
        .arg(windows_path(&debug.join("pedelec-core.exe")))
        .arg("--host")
        .arg(windows_path(&debug.join("pedelec-native-host.exe")))
        .env("WINEPREFIX", &prefix)
        .env("WINEDEBUG", "-all")
        // No display here: wine must not try to open windows.
        .env_remove("DISPLAY")
        .status()
        .context("running wine64")?;
    // The prefix's wineserver outlives the run otherwise.
    let _ = Command::new(wine.with_file_name("wineserver")).arg("-k").env("WINEPREFIX", &prefix).status();
    if !status.success() {
        bail!("the Windows smoke test under wine failed ({status})");
    }
    Ok(())
}

/// Release binaries for `target`, with fat LTO as the workspace's release
/// profile says; where they are.
pub fn release(target: Target) -> Result<PathBuf> {
    if let Some(missing) = target.missing() {
        bail!("the {} build needs {missing}", target.triple());
    }
    // The windows-gnu target links libgcc and winpthread in itself: the
    // binaries need no MinGW DLL (the wine run has none).
    target.run(
        "build",
        &["--release", "-p", "pedelec-core", "-p", "pedelec-native-host", "-p", "pedelec-tool", "--bins"],
    )?;
    Ok(root().join("target").join(target.triple()).join("release"))
}
