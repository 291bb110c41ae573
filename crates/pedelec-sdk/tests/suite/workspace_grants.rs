//! Attacks on the workspace rule and on who can reach Core (SECURITY.md):
//! an approved origin is not the user's whole disk, and another OS user is
//! not a client at all.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use pedelec_protocol::grpc::error_from_status;

use super::*;

const SITE: &str = "https://approved.example";

fn create(origin: &str, path: &Path, granted: &[&Path]) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        workspace: Some(pb::WorkspaceSpec {
            path: path.display().to_string(),
            granted_roots: granted.iter().map(|g| g.display().to_string()).collect(),
        }),
        caller_origin: origin.into(),
        auto_end_on_disconnect: Some(false),
        ..Default::default()
    }
}

/// The refusal's `details.reason`, or "created".
async fn attempt(raw: &mut CoreClient<tonic::transport::Channel>, request: pb::CreateSessionRequest) -> String {
    match raw.create_session(request).await {
        Ok(_) => "created".into(),
        Err(status) => {
            let error = error_from_status(&status);
            assert_eq!(error.code, "WORKSPACE_NOT_ALLOWED", "{error:?}");
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            let details: serde_json::Value = serde_json::from_str(&error.details_json).expect("JSON details");
            details["reason"].as_str().unwrap_or_default().to_owned()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_web_origin_opens_only_what_the_user_granted_it() {
    let h = Harness::start();
    let mut raw = h.raw().await;
    let area = tempfile::tempdir().unwrap();
    let project = area.path().join("project");
    let sibling = area.path().join("sibling");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    std::os::unix::fs::symlink(&home, project.join("home-link")).unwrap();

    assert_eq!(attempt(&mut raw, create(SITE, &project, &[&project])).await, "created");
    // Inside the grant only: not its sibling, not by `..`, not through a link.
    assert_eq!(attempt(&mut raw, create(SITE, &sibling, &[&project])).await, "not_granted");
    assert_eq!(attempt(&mut raw, create(SITE, &project.join("../sibling"), &[&project])).await, "not_granted");
    assert_eq!(attempt(&mut raw, create(SITE, &project.join("home-link"), &[&project])).await, "forbidden");
    // Never, whatever is granted: the home directory, `/`, a secret store, Core's own config.
    assert_eq!(attempt(&mut raw, create(SITE, &home, &[&home])).await, "forbidden");
    assert_eq!(attempt(&mut raw, create(SITE, Path::new("/"), &[Path::new("/")])).await, "forbidden");
    let ssh = home.join(".ssh");
    if ssh.is_dir() {
        assert_eq!(attempt(&mut raw, create(SITE, &ssh, &[&home])).await, "forbidden");
    }
    let config = h.dir.path().join("config");
    assert_eq!(attempt(&mut raw, create(SITE, &config, &[&config])).await, "forbidden");
    // Granted, then revoked (the extension sends no grant any more): refused again.
    assert_eq!(attempt(&mut raw, create(SITE, &project, &[&project])).await, "created");
    assert_eq!(attempt(&mut raw, create(SITE, &project, &[])).await, "not_granted");
    // Each refusal changed nothing: only the two sessions exist.
    let listed = raw
        .list_sessions(pb::ListSessionsRequest { caller_origin: SITE.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 2);
    assert!(!area.path().join("sibling/.pedelec-runtime").exists(), "nothing written in a refused workspace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_app_opens_only_the_configured_roots() {
    let area = tempfile::tempdir().unwrap();
    let allowed = area.path().join("allowed");
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(allowed.join("app")).unwrap();
    let settings = format!("allowed_workspace_roots = [{:?}]\n", allowed.display().to_string());
    let h = Harness::with_config(Via::Grpc, &settings);
    let mut raw = h.raw().await;
    assert_eq!(attempt(&mut raw, create(ORIGIN, &allowed.join("app"), &[])).await, "created");
    assert_eq!(attempt(&mut raw, create(ORIGIN, elsewhere.path(), &[])).await, "not_granted");
    // Grants are the extension's, for web origins: an app cannot grant itself a path.
    assert_eq!(attempt(&mut raw, create(ORIGIN, elsewhere.path(), &[elsewhere.path()])).await, "not_granted");
    // Without any configured root (Core's default) an app opens managed workspaces only.
    let bare = Harness::with_config(Via::Grpc, "allowed_workspace_roots = []\n");
    let mut raw = bare.raw().await;
    assert_eq!(attempt(&mut raw, create(ORIGIN, &allowed.join("app"), &[])).await, "not_granted");
}

/// Another OS user's process cannot connect to Core's socket, even where
/// everything above Core's own directory is open to it: the socket's
/// directory is 0700 and the socket 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_os_user_cannot_reach_core() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: needs root (to act as another user) and /usr/bin/python3");
        return;
    }
    let h = Harness::start();
    std::fs::set_permissions(h.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = h.socket();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    assert_eq!(mode(&socket), 0o600);
    let probe = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n    print('connected')\nexcept PermissionError:\n    print('denied')\n";
    let run_as = |uid: u32, socket: &Path| {
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", probe])
            .arg(socket)
            .uid(uid)
            .gid(uid)
            .output()
            .expect("python3 runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // The gRPC socket, and the tool and asset hand-off sockets beside it.
    let mut sockets = vec![socket.clone()];
    for suffix in [".tools", ".assets"] {
        let mut path = socket.clone().into_os_string();
        path.push(suffix);
        sockets.push(path.into());
    }
    for socket in &sockets {
        assert_eq!(mode(socket), 0o600, "{}", socket.display());
        assert_eq!(run_as(65534, socket), "denied", "user nobody must not reach {}", socket.display());
        assert_eq!(run_as(0, socket), "connected", "the probe itself works for Core's own user");
    }
    // Core still serves its user.
    h.raw().await.ping(pb::PingRequest {}).await.expect("ping");
}
