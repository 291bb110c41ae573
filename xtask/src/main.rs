//! `cargo xtask …`: every developer workflow as plain Rust.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Pedelec developer workflows")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt --check, clippy -D warnings, every test, and the wasm32 build of pedelec-protocol.
    Ci,
    /// Run a real session against a fresh Core (scripted provider unless told otherwise).
    Demo {
        /// Provider code.
        #[arg(long, default_value = "scripted")]
        provider: String,
    },
    /// Print the benchmark figures (release build).
    Bench,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Ci => ci(),
        Task::Demo { provider } => demo(&provider),
        Task::Bench => bench(),
    }
}

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo).args(args).status().with_context(|| format!("running cargo {args:?}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn has_nextest() -> bool {
    Command::new("cargo").args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}

fn has_wasm_target() -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == "wasm32-unknown-unknown"))
}

fn ci() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    if has_wasm_target()
        || Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]).status().is_ok_and(|s| s.success())
    {
        cargo(&["build", "-p", "pedelec-protocol", "--target", "wasm32-unknown-unknown", "--no-default-features"])?;
    } else {
        eprintln!("warning: wasm32-unknown-unknown target unavailable; skipping the wasm build of pedelec-protocol");
    }
    // The SDK's tests start the real Core and native-host binaries.
    cargo(&["build", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    if has_nextest() {
        cargo(&["nextest", "run", "--workspace", "--no-fail-fast"])
    } else {
        cargo(&["test", "--workspace", "--no-fail-fast"])
    }
}

fn demo(provider: &str) -> Result<()> {
    cargo(&["build", "--quiet", "-p", "pedelec-core", "--bin", "pedelec-core"])?;
    cargo(&["run", "--quiet", "-p", "pedelec-sdk", "--example", "demo", "--", "--provider", provider])
}

fn bench() -> Result<()> {
    cargo(&["build", "--release", "--quiet", "-p", "pedelec-core", "--bin", "pedelec-core"])?;
    cargo(&["run", "--release", "--quiet", "-p", "pedelec-sdk", "--example", "bench"])
}
