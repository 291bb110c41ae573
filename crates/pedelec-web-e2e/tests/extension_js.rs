//! The extension's pure JavaScript (`extension/requests.js`: the request
//! allowlist, the site rule, the roots never granted), unit-tested by
//! `node --test` over `js/*.test.mjs`. Skips without Node unless `CI=true`,
//! where it fails instead.

use std::process::Command;

#[test]
fn extension_requests_js_unit_tests() {
    let js = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("js");
    let out = match Command::new("node").arg("--test").arg(&js).output() {
        Ok(out) => out,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("node is needed for the extension's unit tests in CI: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED the extension's JavaScript unit tests: no node ({e})");
            return;
        }
    };
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "node --test failed:\n{report}\n{}", String::from_utf8_lossy(&out.stderr));
    // node --test passes with no test files at all: make sure ours ran.
    let passed = report.lines().find_map(|l| l.strip_prefix("# pass ")).and_then(|n| n.trim().parse::<u32>().ok());
    assert!(passed.is_some_and(|n| n > 0), "no unit test ran:\n{report}");
}
