//! Seed: `uploadAsset()`, `listAssets()`, `readAsset()`; bytes over Core's loopback server.

use std::time::{Duration, SystemTime};

use pedelec_protocol::grpc::error_from_status;
use pedelec_protocol::{limits, pb};
use pedelec_sdk::assets::UploadSource;
use pedelec_sdk::{ErrorCode, PedelecSession, SessionOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

pub(super) async fn session(h: &Harness) -> PedelecSession {
    h.client().await.create_session::<String>(SessionOptions::default()).await.unwrap()
}

pub(super) fn assets_dir(h: &Harness, s: &PedelecSession) -> std::path::PathBuf {
    h.workspaces().join(s.session_id()).join(".pedelec-runtime/assets")
}

pub(super) fn bytes(name: &str, data: &[u8]) -> UploadSource {
    UploadSource::from_bytes(name, "application/octet-stream", data.to_vec())
}

async fn upload_and_read_back_as_text_json_and_file(via: Via) {
    let h = Harness::start_via(via);
    let s = session(&h).await;
    assert_eq!(s.upload_asset(bytes("a.txt", b"hello"), Some("/notes/a.txt")).await.unwrap(), "/notes/a.txt");
    assert_eq!(s.read_asset_text("/notes/a.txt").await.unwrap(), "hello");
    s.upload_asset(bytes("r.json", br#"{"ok":true}"#), Some("/results/r.json")).await.unwrap();
    let value: serde_json::Value = s.read_asset_json("/results/r.json").await.unwrap();
    assert_eq!(value, serde_json::json!({"ok": true}));
    let file = s.read_asset_file("/results/r.json").await.unwrap();
    assert_eq!(
        (file.name.as_str(), file.mime_type.as_str(), file.bytes.as_slice()),
        ("r.json", "application/json", &br#"{"ok":true}"#[..])
    );
    assert!(file.modified_at > 0);
    s.upload_asset(bytes("bad.txt", &[0xff, 0xfe]), Some("/bad.txt")).await.unwrap();
    assert!(s.read_asset_text("/bad.txt").await.unwrap_err().is(ErrorCode::AssetTextDecodeFailed));
    s.upload_asset(bytes("bad.json", b"{nope"), Some("/bad.json")).await.unwrap();
    assert!(s.read_asset_json::<serde_json::Value>("/bad.json").await.unwrap_err().is(ErrorCode::AssetInvalidJson));
    assert!(s.read_asset_text("/missing.txt").await.unwrap_err().is(ErrorCode::AssetNotFound));
}

async fn listing_follows_every_seed_rule(via: Via) {
    let h = Harness::start_via(via);
    let s = session(&h).await;
    let root = assets_dir(&h, &s);
    let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let write = |rel: &str, secs: u64| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, rel).unwrap();
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(at(secs)).unwrap();
    };
    // Files "the agent wrote", straight into the directory.
    write("old.txt", 1_000);
    write("b.txt", 2_000);
    write("a.txt", 2_000);
    write("deep/er/nested.json", 3_000);
    write(".env", 1_500);
    write(".dotdir/inside.txt", 1_200);
    write(".pedelec-hidden", 4_000);
    write("deep/.pedelec-x/secret.txt", 4_000);
    std::fs::create_dir_all(root.join("empty-dir")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("linked-dir")).unwrap();
    let listed = s.list_assets().await.unwrap();
    let paths: Vec<&str> = listed.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, vec!["/deep/er/nested.json", "/a.txt", "/b.txt", "/.env", "/.dotdir/inside.txt", "/old.txt"]);
    let nested = &listed[0];
    assert_eq!((nested.name.as_str(), nested.size, nested.modified_at_ms), ("nested.json", 19, 3_000_000));
}

async fn target_paths_replace_files_and_refuse_directories_and_symlinks(via: Via) {
    let h = Harness::start_via(via);
    let s = session(&h).await;
    s.upload_asset(bytes("x", b"one"), Some("/dir/file.txt")).await.unwrap();
    s.upload_asset(bytes("x", b"two"), Some("/dir/file.txt")).await.unwrap();
    assert_eq!(s.read_asset_text("/dir/file.txt").await.unwrap(), "two", "an existing regular file is replaced");
    let err = s.upload_asset(bytes("x", b"three"), Some("/dir")).await.unwrap_err();
    assert!(err.is(ErrorCode::AssetPathInvalid), "{err}");
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), assets_dir(&h, &s).join("escape")).unwrap();
    assert!(s.upload_asset(bytes("x", b"evil"), Some("/escape/owned.txt")).await.is_err());
    assert!(!outside.path().join("owned.txt").exists(), "never follows a symlinked parent out of the root");
    assert!(s.read_asset_text("/escape/owned.txt").await.is_err());
    for bad in ["relative.txt", "/a//b", "/../x", "/./x", "/a\\b", "/.pedelec-upload"] {
        assert!(
            s.upload_asset(bytes("x", b"x"), Some(bad)).await.unwrap_err().is(ErrorCode::AssetPathInvalid),
            "{bad}"
        );
    }
    assert!(s.read_asset_text("/a/../b").await.unwrap_err().is(ErrorCode::AssetPathInvalid));
    // Without a target, a unique path is derived from the file name.
    assert_eq!(s.upload_asset(bytes("report.txt", b"1"), None).await.unwrap(), "/report.txt");
    assert_eq!(s.upload_asset(bytes("report.txt", b"2"), None).await.unwrap(), "/report (1).txt");
    assert_eq!(s.upload_asset(bytes("../../etc/passwd", b"3"), None).await.unwrap(), "/passwd");
}

async fn an_ended_session_refuses_every_asset_call(via: Via) {
    let h = Harness::start_via(via);
    let s = session(&h).await;
    s.upload_asset(bytes("a", b"a"), Some("/a")).await.unwrap();
    s.end().await.unwrap();
    assert!(s.list_assets().await.unwrap_err().is(ErrorCode::SessionEnded));
    assert!(s.read_asset_text("/a").await.unwrap_err().is(ErrorCode::SessionEnded));
    assert!(s.upload_asset(bytes("a", b"a"), None).await.unwrap_err().is(ErrorCode::SessionEnded));
    let mut raw = h.raw().await;
    let status = raw
        .list_assets(pb::ListAssetsRequest { session_id: s.session_id().into(), caller_origin: ORIGIN.into() })
        .await
        .unwrap_err();
    assert_eq!(error_from_status(&status).code, "SESSION_ENDED", "Core refuses too");
}

/// A download to a file is whole or not at all: it replaces what was there
/// only once every byte arrived, and a failed one leaves no partial file.
async fn a_download_to_a_file_is_whole_or_not_at_all(via: Via) {
    let h = Harness::start_via(via);
    let s = session(&h).await;
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    s.upload_asset(bytes("big.bin", &data), Some("/big.bin")).await.unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("big.bin");
    std::fs::write(&dest, b"an older version").unwrap();
    assert_eq!(s.download_asset_to("/big.bin", &dest).await.unwrap(), data.len() as u64);
    assert!(std::fs::read(&dest).unwrap() == data, "the file holds exactly the asset's bytes");
    // A missing asset: refused before anything is written.
    let missing = s.download_asset_to("/nope.bin", &dest).await.unwrap_err();
    assert_eq!(missing.code, ErrorCode::AssetNotFound.as_str(), "{missing:?}");
    assert!(std::fs::read(&dest).unwrap() == data, "the earlier download is untouched");
    // A destination whose directory does not exist: a clear error.
    let nowhere = s.download_asset_to("/big.bin", &out.path().join("no/such/dir/x")).await.unwrap_err();
    assert_eq!(nowhere.code, ErrorCode::AssetDownloadFailed.as_str(), "{nowhere:?}");
    let left: Vec<_> = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("big.bin")], "no temporary file is left behind");
}

super::over_both_transports!(
    a_download_to_a_file_is_whole_or_not_at_all,
    upload_and_read_back_as_text_json_and_file,
    listing_follows_every_seed_rule,
    target_paths_replace_files_and_refuse_directories_and_symlinks,
    an_ended_session_refuses_every_asset_call,
);

/// A raw HTTP/1.1 request to the transfer server; returns the status code.
async fn raw_http(
    url: &str,
    method: &str,
    token: &str,
    content_length: Option<u64>,
    body: &[u8],
    close_early: bool,
) -> u16 {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} /{path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n");
    if let Some(len) = content_length {
        head.push_str(&format!("Content-Length: {len}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    if close_early {
        return 0;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// A PUT of `size` bytes of which only `first` are sent yet: the upload runs.
pub(super) async fn start_upload(url: &str, token: &str, size: u64, first: &[u8]) -> tokio::net::TcpStream {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /{path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first).await.unwrap();
    stream
}

/// Sends the rest of a started upload and expects 201.
pub(super) async fn finish_upload(mut stream: tokio::net::TcpStream, rest: &[u8]) {
    stream.write_all(rest).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    assert!(String::from_utf8_lossy(&response).starts_with("HTTP/1.1 201"), "{}", String::from_utf8_lossy(&response));
}

/// Waits (bounded) until Core refuses a new upload ticket as busy.
pub(super) async fn eventually_busy(
    raw: &mut pb::core_client::CoreClient<tonic::transport::Channel>,
    s: &PedelecSession,
) {
    for _ in 0..200 {
        if upload_ticket(raw, s, "/probe.txt", 1).await.is_err_and(|code| code == "SESSION_BUSY") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a running upload never made the session busy");
}

async fn raw_http_chunked(url: &str, token: &str, body: &[u8]) -> u16 {
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /{path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

pub(super) async fn upload_ticket(
    raw: &mut pb::core_client::CoreClient<tonic::transport::Channel>,
    s: &PedelecSession,
    target: &str,
    size: u64,
) -> Result<pb::AssetTicket, String> {
    raw.create_asset_upload(pb::CreateAssetUploadRequest {
        session_id: s.session_id().into(),
        caller_origin: ORIGIN.into(),
        target_path: target.into(),
        file_name: String::new(),
        size,
    })
    .await
    .map(|r| r.into_inner())
    .map_err(|status| error_from_status(&status).code)
}

pub(super) async fn download_ticket(
    raw: &mut pb::core_client::CoreClient<tonic::transport::Channel>,
    s: &PedelecSession,
    path: &str,
) -> pb::AssetTicket {
    let request = pb::CreateAssetDownloadRequest {
        session_id: s.session_id().into(),
        caller_origin: ORIGIN.into(),
        path: path.into(),
    };
    raw.create_asset_download(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_are_single_use_secret_and_one_upload_runs_at_a_time() {
    let h = Harness::start();
    let s = session(&h).await;
    let mut raw = h.raw().await;
    let ticket = upload_ticket(&mut raw, &s, "/t.txt", 3).await.unwrap();
    assert!(ticket.url.starts_with("http://127.0.0.1:"));
    assert_eq!(ticket.token.len(), 64, "256-bit token");
    // An unused ticket holds nothing: a second one may be issued.
    let other = upload_ticket(&mut raw, &s, "/other.txt", 3).await.expect("an unused ticket blocks nobody");
    // One upload runs at a time: while one is under way, a new ticket and
    // the other ticket's upload are refused (that ticket stays usable).
    let running = upload_ticket(&mut raw, &s, "/slow.bin", 10).await.unwrap();
    let held = start_upload(&running.url, &running.token, 10, b"12345").await;
    eventually_busy(&mut raw, &s).await;
    assert_eq!(raw_http(&other.url, "PUT", &other.token, Some(3), b"xyz", false).await, 409, "another upload runs");
    finish_upload(held, b"67890").await;
    assert_eq!(s.read_asset_text("/slow.bin").await.unwrap(), "1234567890");
    assert_eq!(raw_http(&other.url, "PUT", &other.token, Some(3), b"xyz", false).await, 201, "the ticket stayed good");
    assert_eq!(raw_http(&ticket.url, "PUT", &"0".repeat(64), Some(3), b"abc", false).await, 401, "wrong token");
    assert_eq!(raw_http(&ticket.url, "PUT", &ticket.token, Some(3), b"abc", false).await, 201);
    assert_eq!(
        raw_http(&ticket.url, "PUT", &ticket.token, Some(3), b"abc", false).await,
        401,
        "a ticket is single-use"
    );
    assert_eq!(s.read_asset_text("/t.txt").await.unwrap(), "abc");
    assert!(upload_ticket(&mut raw, &s, "/next.txt", 1).await.is_ok(), "the slot was freed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_mismatches_and_dropped_uploads_leave_no_partial_file() {
    let h = Harness::start();
    let s = session(&h).await;
    let mut raw = h.raw().await;
    let short = upload_ticket(&mut raw, &s, "/short.bin", 10).await.unwrap();
    assert_eq!(
        raw_http(&short.url, "PUT", &short.token, Some(5), b"12345", false).await,
        400,
        "declared length differs"
    );
    let long = upload_ticket(&mut raw, &s, "/long.bin", 3).await.unwrap();
    assert_eq!(
        raw_http(&long.url, "PUT", &long.token, Some(6), b"123456", false).await,
        400,
        "declared length differs"
    );
    let chunked = upload_ticket(&mut raw, &s, "/chunked.bin", 3).await.unwrap();
    let body = b"6\r\n123456\r\n0\r\n\r\n";
    assert_eq!(raw_http_chunked(&chunked.url, &chunked.token, body).await, 413, "more bytes than the ticket declared");
    let dropped = upload_ticket(&mut raw, &s, "/dropped.bin", 1000).await.unwrap();
    raw_http(&dropped.url, "PUT", &dropped.token, Some(1000), &[7u8; 100], true).await;
    let mut freed = false;
    for _ in 0..100 {
        if upload_ticket(&mut raw, &s, "/after.bin", 1).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "a dropped connection frees the upload slot");
    // Uploads are staged in the asset folder itself (under a reserved name).
    let root = assets_dir(&h, &s);
    assert!(s.list_assets().await.unwrap().is_empty(), "no visible partial file");
    // On a loaded machine the server may take up the dropped request only
    // after the slot check above passed: its temporary file must go too.
    let leftovers = || -> Vec<_> {
        std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".pedelec-upload"))
            .map(|e| e.file_name())
            .collect()
    };
    for _ in 0..250 {
        if leftovers().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leftovers().is_empty(), "temporary files were removed: {:?}", leftovers());
    assert_eq!(
        upload_ticket(&mut raw, &s, "/x", pedelec_protocol::limits::MAX_ASSET_BYTES + 1).await.unwrap_err(),
        "ASSET_TOO_LARGE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_mebibyte_file_round_trips_intact() {
    let h = Harness::start();
    let s = session(&h).await;
    let data: Vec<u8> = (0..100u32 * 1024 * 1024).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    s.upload_asset(UploadSource::from_bytes("big.bin", "application/octet-stream", data.clone()), Some("/big.bin"))
        .await
        .unwrap();
    let back = s.read_asset_file("/big.bin").await.unwrap();
    assert!(back.bytes == data, "bytes compared equal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_admits_only_the_sessions_origin() {
    let h = Harness::start();
    let page = "https://app.example";
    let client = h.client_for(page).await;
    let s = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    s.upload_asset(bytes("a.txt", b"hi"), Some("/a.txt")).await.unwrap();
    let mut raw = h.raw().await;
    let download = |origin: &str| pb::CreateAssetDownloadRequest {
        session_id: s.session_id().into(),
        caller_origin: origin.into(),
        path: "/a.txt".into(),
    };
    let ticket = raw.create_asset_download(download(page)).await.unwrap().into_inner();
    let rest = ticket.url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let request = |extra: &str, method: &str| {
        format!("{method} /{path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n")
    };
    let send = |text: String| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(text.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).to_lowercase()
    };
    let preflight =
        send(request(&format!("Origin: {page}\r\nAccess-Control-Request-Method: GET\r\n"), "OPTIONS")).await;
    assert!(preflight.contains(&format!("access-control-allow-origin: {page}")), "{preflight}");
    let foreign =
        send(request(&format!("Origin: https://evil.example\r\nAuthorization: Bearer {}\r\n", ticket.token), "GET"))
            .await;
    assert!(foreign.starts_with("http/1.1 403"), "{foreign}");
    let ok = send(request(&format!("Origin: {page}\r\nAuthorization: Bearer {}\r\n", ticket.token), "GET")).await;
    assert!(ok.starts_with("http/1.1 200") && ok.contains(&format!("access-control-allow-origin: {page}")), "{ok}");
    assert!(ok.ends_with("\r\n\r\nhi"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_ticket_is_refused_and_frees_the_upload_slot() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("core.sock");
    let _core = pedelec_sdk::daemon::CoreProcess::spawn_with_args(
        &pedelec_sdk::daemon::find_core_binary(),
        &socket,
        &dir.path().join("state"),
        Duration::from_secs(3),
        &["--asset-ticket-ttl-ms", "200"],
    )
    .unwrap();
    let client = pedelec_sdk::Pedelec::connect(&socket, ORIGIN).await.unwrap();
    let s = client.create_session::<String>(SessionOptions::default()).await.unwrap();
    s.upload_asset(bytes("a", b"a"), Some("/a")).await.unwrap();
    let mut raw = pb::core_client::CoreClient::new(pedelec_sdk::grpc::local_channel(&socket).await.unwrap());
    let ticket = upload_ticket(&mut raw, &s, "/late.txt", 1).await.unwrap();
    let download = download_ticket(&mut raw, &s, "/a").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(raw_http(&ticket.url, "PUT", &ticket.token, Some(1), b"x", false).await, 410);
    assert_eq!(raw_http(&download.url, "GET", &download.token, None, b"", false).await, 410);
    assert!(upload_ticket(&mut raw, &s, "/next.txt", 1).await.is_ok(), "an expired ticket holds nothing");
    assert!(s.list_assets().await.unwrap().iter().all(|a| a.path != "/late.txt"));
}

fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().parse().unwrap_or(0))))
        .unwrap_or(0)
}

/// A client that reads a little of a large download and hangs up: the reader
/// behind it stops (its buffers come back as the response is dropped), and the
/// next download of the same file is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_download_stops_its_reader_and_the_file_still_downloads_whole() {
    let h = Harness::start();
    let pid = h.core.pid().unwrap();
    let s = session(&h).await;
    let data: Vec<u8> = (0..24u32 * 1024 * 1024).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    s.upload_asset(UploadSource::from_bytes("big.bin", "application/octet-stream", data.clone()), Some("/big.bin"))
        .await
        .unwrap();
    let idle_threads = threads(pid);
    let mut raw = h.raw().await;
    for _ in 0..3 {
        let ticket = download_ticket(&mut raw, &s, "/big.bin").await;
        let rest = ticket.url.strip_prefix("http://").unwrap();
        let (addr, path) = rest.split_once('/').unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET /{path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            ticket.token
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut first = vec![0u8; 64 * 1024];
        stream.read_exact(&mut first).await.unwrap();
        assert!(first.starts_with(b"HTTP/1.1 200"));
        drop(stream);
    }
    eventually("the abandoned downloads' readers to stop", || threads(pid) <= idle_threads).await;
    assert!(s.read_asset_file("/big.bin").await.unwrap().bytes == data, "bytes compared equal");
}

/// The seed: an ended session cannot upload or read assets — tickets issued
/// before `end()` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_issued_before_end_are_refused_after_it() {
    let h = Harness::start();
    let s = session(&h).await;
    s.upload_asset(bytes("a", b"a"), Some("/a")).await.unwrap();
    let mut raw = h.raw().await;
    let upload = upload_ticket(&mut raw, &s, "/late.txt", 1).await.unwrap();
    let download = download_ticket(&mut raw, &s, "/a").await;
    s.end().await.unwrap();
    assert_eq!(raw_http(&upload.url, "PUT", &upload.token, Some(1), b"x", false).await, 401, "upload refused");
    assert_eq!(raw_http(&download.url, "GET", &download.token, None, b"", false).await, 401, "download refused");
}

/// The read limit is checked when the bytes are served too: a file that
/// grew past it after its ticket was issued is refused, not streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_grew_past_the_read_limit_after_its_ticket_is_refused() {
    let h = Harness::start();
    let s = session(&h).await;
    s.upload_asset(bytes("big", b"small for now"), Some("/big.bin")).await.unwrap();
    let mut raw = h.raw().await;
    let ticket = download_ticket(&mut raw, &s, "/big.bin").await;
    // The agent (or anything) grows it: sparse, so the test writes nothing.
    let file = std::fs::OpenOptions::new().write(true).open(assets_dir(&h, &s).join("big.bin")).unwrap();
    file.set_len(limits::MAX_ASSET_BYTES + 1).unwrap();
    assert_eq!(raw_http(&ticket.url, "GET", &ticket.token, None, b"", false).await, 413);
}

/// The seed's layout: an explicit workspace keeps its public assets in
/// `<ws>/.pedelec-runtime/assets/`, shared by the sessions working there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_workspace_shares_its_assets_between_sessions() {
    let h = Harness::start();
    let client = h.client().await;
    let ws = tempfile::tempdir().unwrap();
    let options = || SessionOptions { workspace_path: Some(ws.path().to_path_buf()), ..Default::default() };
    let first = client.create_session::<String>(options()).await.unwrap();
    let second = client.create_session::<String>(options()).await.unwrap();
    first.upload_asset(bytes("notes.txt", b"shared"), Some("/docs/notes.txt")).await.unwrap();
    let on_disk = ws.path().join(".pedelec-runtime/assets/docs/notes.txt");
    assert_eq!(std::fs::read_to_string(&on_disk).unwrap(), "shared", "the seed's path");
    assert_eq!(second.read_asset_text("/docs/notes.txt").await.unwrap(), "shared");
    let listed: Vec<String> = second.list_assets().await.unwrap().into_iter().map(|a| a.path).collect();
    assert_eq!(listed, ["/docs/notes.txt"]);
    let leftovers: Vec<_> = std::fs::read_dir(ws.path().join(".pedelec-runtime/assets"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".pedelec-upload"))
        .collect();
    assert!(leftovers.is_empty(), "no upload temp file left: {leftovers:?}");
}
