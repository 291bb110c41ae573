//! `pedelec-core serve`: socket, discovery file, single instance, clean exit.

use std::os::unix::fs::PermissionsExt;

use pedelec_sdk::daemon::find_core_binary;

use super::*;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_and_discovery_file_are_private_and_removed_at_exit() {
    let mut h = Harness::start();
    assert_eq!(mode(&h.socket()), 0o600);
    assert_eq!(mode(h.socket().parent().unwrap()), 0o700);
    let discovery = h.socket().with_file_name("core.json");
    eventually("the discovery file", || discovery.exists()).await;
    let body: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&discovery).unwrap()).unwrap();
    assert_eq!(body["pid"], h.core.pid().unwrap());
    assert_eq!(body["socket"], h.socket().display().to_string());
    let ping = h.client().await.ping().await.unwrap();
    assert_eq!(ping.pid, h.core.pid().unwrap());
    assert!(h.core.terminate());
    assert!(!h.socket().exists());
    assert!(!discovery.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_core_refuses_a_live_socket_and_takes_over_a_stale_one() {
    let mut h = Harness::start();
    let out = std::process::Command::new(find_core_binary())
        .args(["serve", "--socket"])
        .arg(h.socket())
        .arg("--state-dir")
        .arg(h.dir.path().join("other-state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already serving"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    h.client().await.ping().await.expect("the first Core is undisturbed");

    h.core.kill();
    assert!(h.socket().exists(), "a crash leaves the socket behind");
    h.restart();
    h.client().await.ping().await.expect("the stale socket was taken over");
}
