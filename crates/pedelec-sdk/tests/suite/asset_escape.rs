//! Issue 38's attacks on the asset folder: an agent that can write in its
//! workspace swaps `.pedelec-runtime`, `assets` or a directory below them
//! for a symlink out of the workspace, and the page's `uploadAsset`,
//! `listAssets` and `readAsset` must never follow it. Also the asset bytes
//! quota, and the transfer server's own defences (its `Host`, its
//! connection cap, its request-head timeout), over raw TCP.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pedelec_protocol::pb;
use pedelec_sdk::{ErrorCode, PedelecError, PedelecSession};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::assets::{assets_dir, bytes, download_ticket, session, upload_ticket};
use super::*;

/// Every file and folder below `dir`, with the files' bytes: what "nothing
/// written outside" is checked against.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap().flatten() {
            let path = entry.path();
            let meta = path.symlink_metadata().unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
                out.push((path, None));
            } else {
                out.push((path.clone(), Some(std::fs::read(&path).unwrap_or_default())));
            }
        }
    }
    out.sort();
    out
}

const KEY: &[u8] = b"-----BEGIN OPENSSH PRIVATE KEY-----";

/// A folder outside the workspace standing for the user's home: a shell rc
/// file, a private key and a `before.txt`, at its top and again under an
/// `assets` folder of its own (what a symlinked `.pedelec-runtime` leads to).
fn home_like() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    for base in [home.path().to_path_buf(), home.path().join("assets")] {
        std::fs::create_dir_all(base.join(".ssh")).unwrap();
        std::fs::write(base.join(".bashrc"), "export PATH=/usr/bin\n").unwrap();
        std::fs::write(base.join(".ssh/id_ed25519"), KEY).unwrap();
        std::fs::write(base.join("before.txt"), KEY).unwrap();
    }
    home
}

/// Which level of the asset folder's own path the agent replaces with a link.
#[derive(Debug, Clone, Copy)]
enum Link {
    Runtime,
    Assets,
}

/// What the agent does: removes the level and puts a symlink to `home` there.
fn plant(h: &Harness, s: &PedelecSession, link: Link, home: &Path) {
    let assets = assets_dir(h, s);
    let level = match link {
        Link::Runtime => assets.parent().unwrap().to_path_buf(),
        Link::Assets => assets,
    };
    std::fs::remove_dir_all(&level).unwrap();
    std::os::unix::fs::symlink(home, &level).unwrap();
}

fn assert_invalid(what: &str, result: Result<impl std::fmt::Debug, PedelecError>) {
    match result {
        Err(e) if e.is(ErrorCode::AssetPathInvalid) => {}
        other => panic!("{what}: expected ASSET_PATH_INVALID, got {other:?}"),
    }
}

async fn a_symlinked_asset_folder_is_refused(link: Link) {
    let h = Harness::start();
    let s = session(&h).await;
    s.upload_asset(bytes("before.txt", b"public"), Some("/before.txt")).await.unwrap();
    // Tickets taken while the folder was sound, redeemed after the swap,
    // over the url and over the hand-off socket.
    let mut raw = h.raw().await;
    let early_upload = upload_ticket(&mut raw, &s, "/.bashrc", 5).await.unwrap();
    let early_handoff_upload = upload_ticket(&mut raw, &s, "/.profile", 5).await.unwrap();
    let early_download = download_ticket(&mut raw, &s, "/before.txt").await;
    let early_handoff_download = download_ticket(&mut raw, &s, "/before.txt").await;
    let home = home_like();
    plant(&h, &s, link, home.path());
    let before = snapshot(home.path());

    assert_invalid("upload to a path", s.upload_asset(bytes("x", b"owned"), Some("/.bashrc")).await);
    assert_invalid("upload by name", s.upload_asset(bytes(".bashrc", b"owned"), None).await);
    assert_invalid("list", s.list_assets().await);
    assert_invalid("read", s.read_asset_text("/.ssh/id_ed25519").await);
    let attach = pedelec_sdk::SendOptions { attachments: vec!["/before.txt".into()], ..Default::default() };
    assert_invalid("attach", s.send_text_with("look", attach).await);
    let out = tempfile::tempdir().unwrap();
    assert_invalid("download to a file", s.download_asset_to("/before.txt", &out.path().join("k")).await);
    let mut http_only = early_upload.clone();
    http_only.local_socket.clear();
    assert_invalid("an earlier upload ticket", pedelec_sdk::assets::put(&http_only, bytes("x", b"owned")).await);
    let mut handed = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut handed, b"owned").unwrap();
    let source = pedelec_sdk::assets::UploadSource::from_path(handed.path()).await.unwrap();
    assert_invalid("an earlier hand-off upload", pedelec_sdk::assets::put(&early_handoff_upload, source).await);
    let mut http_only = early_download.clone();
    http_only.local_socket.clear();
    assert_invalid("an earlier download ticket", pedelec_sdk::assets::get(&http_only).await.map(|f| f.bytes));
    assert_invalid(
        "an earlier hand-off download",
        pedelec_sdk::assets::get(&early_handoff_download).await.map(|f| f.bytes),
    );
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none(), "nothing was downloaded");
    assert_eq!(snapshot(home.path()), before, "nothing written (or left) outside the workspace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_pedelec_runtime_is_refused_for_upload_list_and_download() {
    a_symlinked_asset_folder_is_refused(Link::Runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_assets_folder_is_refused_for_upload_list_and_download() {
    a_symlinked_asset_folder_is_refused(Link::Assets).await;
}

/// Between the check of a download and its serving the agent keeps swapping
/// a directory of the asset's path for a link to a same-sized secret: Core
/// must serve the public file or nothing, never the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_swapped_for_a_symlink_after_its_check_is_never_served() {
    let h = Harness::start();
    let s = session(&h).await;
    let public = b"public bytes, just as long as the key in home";
    let secret = b"SECRET BYTES, just as long as the key in home";
    assert_eq!(public.len(), secret.len());
    s.upload_asset(bytes("doc.txt", public), Some("/a/b/c/doc.txt")).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("a/b/c")).unwrap();
    std::fs::write(home.path().join("a/b/c/doc.txt"), secret).unwrap();
    let root = assets_dir(&h, &s);
    std::os::unix::fs::symlink(home.path().join("a"), root.join("a.link")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, root) = (stop.clone(), root.clone());
        std::thread::spawn(move || {
            let name = |n: &str| root.join(n);
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(name("a"), name("a.real")).unwrap();
                std::fs::rename(name("a.link"), name("a")).unwrap();
                std::thread::yield_now();
                std::fs::rename(name("a"), name("a.link")).unwrap();
                std::fs::rename(name("a.real"), name("a")).unwrap();
                std::thread::yield_now();
            }
        })
    };
    let mut raw = h.raw().await;
    let (mut served, mut leaked) = (0, 0);
    let started = Instant::now();
    for i in 0..4000 {
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
        let request = pb::CreateAssetDownloadRequest {
            session_id: s.session_id().into(),
            caller_origin: ORIGIN.into(),
            path: "/a/b/c/doc.txt".into(),
        };
        let Ok(ticket) = raw.create_asset_download(request).await else { continue };
        let mut ticket = ticket.into_inner();
        // Half over the url, half over the hand-off socket.
        if i % 2 == 0 {
            ticket.local_socket.clear();
        }
        if let Ok(file) = pedelec_sdk::assets::get(&ticket).await {
            served += 1;
            if file.bytes.as_slice() != public.as_slice() {
                leaked += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert_eq!(leaked, 0, "served something other than the public file ({served} served)");
    assert!(served > 0, "the test served nothing at all, so it proved nothing");
}

/// A flood of uploads runs into `asset_bytes_per_session`, refused with
/// `QUOTA_EXCEEDED` and nothing kept; another session uploads as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asset_bytes_flood_is_refused_while_another_session_still_uploads() {
    let h = Harness::with_config(Via::Grpc, "asset_bytes_per_session = 100000\n");
    let flooder = session(&h).await;
    let other = session(&h).await;
    flooder.upload_asset(bytes("a", &[1; 60_000]), Some("/a.bin")).await.unwrap();
    let refused = flooder.upload_asset(bytes("b", &[2; 60_000]), Some("/b.bin")).await.unwrap_err();
    assert!(refused.is(ErrorCode::QuotaExceeded), "{refused:?}");
    assert_eq!(refused.details, Some(serde_json::json!({ "limit": "asset_bytes_per_session", "max": 100000 })));
    // A file replaced only counts once.
    flooder.upload_asset(bytes("a", &[3; 90_000]), Some("/a.bin")).await.unwrap();
    // Two tickets that each fit but not together: the second is refused
    // when its bytes come, before anything is written.
    let mut raw = h.raw().await;
    let first = upload_ticket(&mut raw, &flooder, "/c.bin", 8_000).await.unwrap();
    let second = upload_ticket(&mut raw, &flooder, "/d.bin", 8_000).await.unwrap();
    pedelec_sdk::assets::put(&first, bytes("c", &[4; 8_000])).await.unwrap();
    let late = pedelec_sdk::assets::put(&second, bytes("d", &[5; 8_000])).await.unwrap_err();
    assert!(late.is(ErrorCode::QuotaExceeded), "{late:?}");
    let mut listed: Vec<(String, u64)> =
        flooder.list_assets().await.unwrap().into_iter().map(|a| (a.path, a.size)).collect();
    listed.sort();
    assert_eq!(listed, [("/a.bin".to_owned(), 90_000), ("/c.bin".to_owned(), 8_000)], "nothing refused was kept");
    let on_disk: Vec<_> =
        std::fs::read_dir(assets_dir(&h, &flooder)).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(on_disk.len(), 2, "no temporary file left: {on_disk:?}");
    other.upload_asset(bytes("big", &[6; 90_000]), Some("/big.bin")).await.unwrap();
    assert_eq!(other.read_asset_file("/big.bin").await.unwrap().bytes.len(), 90_000);
}

/// Sends `text` on a fresh connection to `addr` and returns the whole answer.
async fn exchange(addr: &str, text: String) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// DNS rebinding: a page on another name resolving to 127.0.0.1 sends its
/// own name as `Host`. Only the server's loopback authority is answered,
/// and a refused request does not use up the ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_server_answers_only_to_its_own_host() {
    let h = Harness::start();
    let s = session(&h).await;
    s.upload_asset(bytes("a.txt", b"hi"), Some("/a.txt")).await.unwrap();
    let mut raw = h.raw().await;
    let ticket = download_ticket(&mut raw, &s, "/a.txt").await;
    let rest = ticket.url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let port = addr.rsplit_once(':').unwrap().1;
    let get = |host: &str| {
        let host = if host.is_empty() { String::new() } else { format!("Host: {host}\r\n") };
        format!("GET /{path} HTTP/1.1\r\n{host}Authorization: Bearer {}\r\nConnection: close\r\n\r\n", ticket.token)
    };
    for host in [
        format!("evil.example:{port}"),
        format!("127.0.0.1.evil.example:{port}"),
        "127.0.0.1:1".to_owned(),
        "127.0.0.1".to_owned(),
        String::new(),
    ] {
        let answer = exchange(addr, get(&host)).await;
        assert!(answer.starts_with("HTTP/1.1 421"), "Host {host:?}: {answer}");
        assert!(!answer.ends_with("hi"), "Host {host:?} was served");
    }
    let answer = exchange(addr, get(&format!("localhost:{port}"))).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hi"), "the ticket is still good: {answer}");
}

/// Idle connections cannot hold the server: over the cap a connection is
/// closed at once, and one that sends no whole request head is closed
/// after the timeout — after which the server serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_server_caps_connections_and_closes_silent_ones() {
    let h = Harness::with_config(Via::Grpc, "asset_server_connections = 2\nasset_header_timeout_secs = 3\n");
    let s = session(&h).await;
    s.upload_asset(bytes("a.txt", b"hi"), Some("/a.txt")).await.unwrap();
    let mut raw = h.raw().await;
    let ticket = download_ticket(&mut raw, &s, "/a.txt").await;
    let rest = ticket.url.strip_prefix("http://").unwrap().to_owned();
    let (addr, path) = rest.split_once('/').unwrap();
    // The upload's own connection may still hold its place for a moment
    // after the upload answered (the server's task ends after the client
    // saw the response): until both places are ours, a try starts over.
    // A server without a cap never closes the third one, and fails below.
    let mut byte = [0u8; 1];
    let mut tries = 0;
    let (opened, mut silent, mut partial) = loop {
        tries += 1;
        let opened = Instant::now();
        let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
        partial.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {addr}\r\n").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_millis(1500), over.read(&mut byte)).await;
        if matches!(closed, Ok(Ok(0)) | Ok(Err(_))) {
            break (opened, silent, partial);
        }
        assert!(tries < 5, "a third connection over the cap of 2 is closed at once");
        drop((silent, partial, over));
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (what, stream) in [("silent", &mut silent), ("partial head", &mut partial)] {
        let closed = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "the {what} connection is closed");
    }
    let waited = opened.elapsed();
    assert!(waited >= Duration::from_millis(2500), "closed by the 3 s timeout, not before ({waited:?})");
    let get = format!(
        "GET /{path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        ticket.token
    );
    let answer = exchange(addr, get).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hi"), "served again once freed: {answer}");
}

/// A cloned repository (or an earlier session's agent) ships
/// `.pedelec-runtime` as a link out of the workspace: a new session there
/// must not write its manifest, its asset folder or its runtime files
/// through it. Refused with `WORKSPACE_INVALID`, nothing written outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_shipping_a_linked_runtime_directory_writes_nothing_through_it() {
    let area = tempfile::tempdir().unwrap();
    let workspace = area.path().join("cloned");
    std::fs::create_dir_all(&workspace).unwrap();
    let home = home_like();
    std::os::unix::fs::symlink(home.path(), workspace.join(".pedelec-runtime")).unwrap();
    let before = snapshot(home.path());
    let settings = format!("allowed_workspace_roots = [{:?}]\n", area.path().display().to_string());
    let h = Harness::with_config(Via::Grpc, &settings);
    let client = h.client().await;
    let options = SessionOptions::<String> { workspace_path: Some(workspace.clone()), ..Default::default() };
    match client.create_session(options).await {
        Err(e) if e.is(ErrorCode::WorkspaceInvalid) => {}
        other => panic!("expected WORKSPACE_INVALID, got {:?}", other.map(|s| s.session_id().to_owned())),
    }
    assert_eq!(snapshot(home.path()), before, "nothing was written through the link");
    // The link replaced by a real folder, the same workspace opens.
    std::fs::remove_file(workspace.join(".pedelec-runtime")).unwrap();
    let options = SessionOptions::<String> { workspace_path: Some(workspace.clone()), ..Default::default() };
    client.create_session(options).await.expect("a plain workspace opens");
}
