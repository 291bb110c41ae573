//! `cargo xtask chaos`: `pedelec-sdk`'s `chaos` example — real faults (kill -9
//! mid-turn, silent subscribers, subscribe churn, garbage and stalled
//! connections, descriptor pressure, hostile native frames, racing starts)
//! against the dev builds of Core and the native host.

use anyhow::{Context, Result};

use crate::{cargo, cargo_with_env, root};

pub fn run() -> Result<()> {
    cargo(&["build", "--quiet", "-p", "pedelec-core", "-p", "pedelec-native-host", "--bins"])?;
    // Named explicitly, so a PEDELEC_*_BIN set for something else never
    // puts other binaries under test.
    let debug = root().join("target/debug");
    let core = debug.join("pedelec-core");
    let host = debug.join("pedelec-native-host");
    let envs = [
        ("PEDELEC_CORE_BIN", core.to_str().context("a UTF-8 target path")?),
        ("PEDELEC_NATIVE_HOST_BIN", host.to_str().context("a UTF-8 target path")?),
    ];
    cargo_with_env(&["run", "--quiet", "-p", "pedelec-sdk", "--example", "chaos"], &envs)
}
