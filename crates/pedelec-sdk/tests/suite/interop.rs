//! The proto is a public contract: a stock Python grpcio client, its code
//! generated from `proto/` (`interop/python/client.py`), drives a whole
//! session against a real Core — tools, completion, history, errors decoded
//! with `grpc_status`, cancel, listing, end. `cargo xtask ci` installs the
//! client's virtualenv; without it the test skips locally and fails under CI.

use std::path::Path;

use super::Harness;

#[test]
fn a_python_grpcio_client_written_from_the_proto_runs_a_session() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join("target/interop-venv/bin/python");
    if !python.exists() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{} is missing under CI (cargo xtask ci installs it)", python.display());
        }
        eprintln!("skipping: {} is not installed (cargo xtask ci installs it)", python.display());
        return;
    }
    let h = Harness::start();
    let output = std::process::Command::new("timeout")
        .arg("120")
        .arg(&python)
        .arg(root.join("interop/python/client.py"))
        .arg(h.socket())
        .output()
        .expect("the Python client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("PYTHON_INTEROP_OK"),
        "the Python client failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}
