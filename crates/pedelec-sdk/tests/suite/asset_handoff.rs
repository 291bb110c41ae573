//! The asset hand-off socket (`AssetHandoffRequest` in core.proto): the same
//! tickets redeemed by passing an open file instead of streaming bytes. The
//! SDK takes it for files on this machine and falls back to the url where
//! the socket cannot be reached; Core refuses every malformed exchange with
//! a code and writes nothing.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use pedelec_ipc::handoff as exchange;
use pedelec_protocol::pb::asset_handoff_response::Result as Answer;
use pedelec_protocol::{handoff, limits, pb};
use pedelec_sdk::assets::UploadSource;

use super::assets::{assets_dir, download_ticket, finish_upload, session, start_upload, upload_ticket};
use super::*;

/// One exchange as a third-party client makes it: a request frame with
/// `files` passed beside it, then Core's answer and the files that came back.
fn exchange(ticket: &pb::AssetTicket, token: &str, files: &[BorrowedFd<'_>]) -> (Answer, Vec<OwnedFd>) {
    let socket = UnixStream::connect(&ticket.local_socket).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = pb::AssetHandoffRequest { url: ticket.url.clone(), token: token.into() };
    send_with(&socket, &pedelec_protocol::tool_socket::encode_frame(&request), files);
    let (response, back) = exchange::receive::<pb::AssetHandoffResponse>(&socket, handoff::MAX_RESPONSE, 1).unwrap();
    (response.result.expect("an answer"), back)
}

/// Sends raw bytes with any number of descriptors beside them.
fn send_with(socket: &UnixStream, bytes: &[u8], files: &[BorrowedFd<'_>]) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let sent =
        sendmsg::<()>(socket.as_raw_fd(), &[std::io::IoSlice::new(bytes)], cmsgs, MsgFlags::empty(), None).unwrap();
    assert_eq!(sent, bytes.len());
}

fn code(answer: &Answer) -> &str {
    match answer {
        Answer::Error(e) => e.code.as_str(),
        _ => "",
    }
}

fn file_of(data: &[u8]) -> std::fs::File {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(data).unwrap();
    file
}

fn pattern(len: u32) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect()
}

/// Upload temporaries left in the assets directory (where uploads are staged).
fn leftovers(h: &Harness, s: &pedelec_sdk::PedelecSession) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(assets_dir(h, s))
        .map(|d| {
            d.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with(".pedelec-upload")).collect()
        })
        .unwrap_or_default()
}

/// A ticket whose url leads nowhere: only the hand-off can redeem it.
fn without_url(mut ticket: pb::AssetTicket) -> pb::AssetTicket {
    let id = handoff::ticket_id(&ticket.url).unwrap().to_owned();
    ticket.url = format!("http://127.0.0.1:1/transfer/{id}");
    ticket
}

/// A ticket whose hand-off socket is not there: only the url can redeem it.
fn without_socket(mut ticket: pb::AssetTicket) -> pb::AssetTicket {
    ticket.local_socket = "/nonexistent/pedelec/core.sock.assets".into();
    ticket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_handed_over_where_the_socket_is_and_streamed_where_it_is_not() {
    let h = Harness::start();
    let s = session(&h).await;
    let mut raw = h.raw().await;
    let data = pattern(3 << 20);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();

    // The hand-off alone: the url is dead.
    let ticket = upload_ticket(&mut raw, &s, "/handed.bin", data.len() as u64).await.unwrap();
    assert_eq!(ticket.local_socket, h.socket().display().to_string() + ".assets");
    let source = UploadSource::from_path(&src).await.unwrap();
    pedelec_sdk::assets::put(&without_url(ticket), source).await.unwrap();
    let ticket = download_ticket(&mut raw, &s, "/handed.bin").await;
    let file = pedelec_sdk::assets::get(&without_url(ticket)).await.unwrap();
    assert!(file.bytes == data, "read back whole through the hand-off");
    assert_eq!((file.name.as_str(), file.mime_type.as_str()), ("handed.bin", "application/octet-stream"));
    let ticket = download_ticket(&mut raw, &s, "/handed.bin").await;
    let dest = dir.path().join("out.bin");
    assert_eq!(pedelec_sdk::assets::get_to_file(&without_url(ticket), &dest).await.unwrap(), data.len() as u64);
    assert!(std::fs::read(&dest).unwrap() == data, "copied whole into a file");

    // The url alone: no socket to reach, the ticket is still good for it.
    let ticket = upload_ticket(&mut raw, &s, "/streamed.bin", data.len() as u64).await.unwrap();
    let source = UploadSource::from_path(&src).await.unwrap();
    pedelec_sdk::assets::put(&without_socket(ticket), source).await.unwrap();
    let ticket = download_ticket(&mut raw, &s, "/streamed.bin").await;
    assert!(pedelec_sdk::assets::get(&without_socket(ticket)).await.unwrap().bytes == data);
    let ticket = download_ticket(&mut raw, &s, "/streamed.bin").await;
    std::fs::remove_file(&dest).unwrap();
    assert_eq!(pedelec_sdk::assets::get_to_file(&without_socket(ticket), &dest).await.unwrap(), data.len() as u64);
    assert!(std::fs::read(&dest).unwrap() == data);

    // A web page's tickets do not name the socket: a page cannot use it,
    // and its path would tell the page where Core lives.
    let page = h.client_for("https://app.example").await;
    let web = page.create_session::<String>(pedelec_sdk::SessionOptions::default()).await.unwrap();
    let ticket = raw
        .create_asset_upload(pb::CreateAssetUploadRequest {
            session_id: web.session_id().into(),
            caller_origin: "https://app.example".into(),
            target_path: "/w.bin".into(),
            file_name: String::new(),
            size: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ticket.url.starts_with("http://127.0.0.1:") && ticket.local_socket.is_empty(), "{ticket:?}");

    // The session's own calls take the hand-off for a file, and the listing
    // shows what landed, nothing else.
    assert_eq!(s.upload_asset(UploadSource::from_path(&src).await.unwrap(), Some("/s.bin")).await.unwrap(), "/s.bin");
    let mut listed: Vec<(String, u64)> = s.list_assets().await.unwrap().into_iter().map(|a| (a.path, a.size)).collect();
    listed.sort();
    let size = data.len() as u64;
    assert_eq!(listed, [("/handed.bin".into(), size), ("/s.bin".into(), size), ("/streamed.bin".into(), size)]);
    assert!(leftovers(&h, &s).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handoff_socket_refuses_every_bad_exchange_and_writes_nothing() {
    let h = Harness::start();
    let s = session(&h).await;
    let mut raw = h.raw().await;
    let good = file_of(b"abc");

    // A wrong token proves nothing: the ticket stays good.
    let ticket = upload_ticket(&mut raw, &s, "/t.txt", 3).await.unwrap();
    let (answer, _) = exchange(&ticket, &"0".repeat(64), &[good.as_fd()]);
    assert_eq!(code(&answer), "ASSET_TICKET_INVALID");
    // Two files with one upload: refused before the ticket is read, so it stays good too.
    let (answer, _) = exchange(&ticket, &ticket.token, &[good.as_fd(), good.as_fd()]);
    assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer:?}");
    let (answer, _) = exchange(&ticket, &ticket.token, &[good.as_fd()]);
    assert_eq!(answer, Answer::Path("/t.txt".into()));
    let (answer, _) = exchange(&ticket, &ticket.token, &[good.as_fd()]);
    assert_eq!(code(&answer), "ASSET_TICKET_INVALID", "single use");
    assert_eq!(s.read_asset_text("/t.txt").await.unwrap(), "abc");

    // A url that names no ticket.
    let mut nameless = ticket.clone();
    nameless.url = "http://127.0.0.1:1/elsewhere".into();
    assert_eq!(code(&exchange(&nameless, &ticket.token, &[]).0), "INVALID_ARGUMENT");

    // Files that are not the upload: each answered, the ticket used up, the
    // slot freed, nothing listed and no temporary left.
    let directory = std::fs::File::open(tempfile::tempdir().unwrap().path()).unwrap();
    let (pipe_read, _pipe_write) = nix::unistd::pipe().unwrap();
    let write_only =
        std::fs::OpenOptions::new().write(true).open(tempfile::NamedTempFile::new().unwrap().path()).unwrap();
    write_only.set_len(3).unwrap();
    let too_long = file_of(b"abcd");
    let cases: [(&str, Option<BorrowedFd<'_>>); 5] = [
        ("no file", None),
        ("a directory", Some(directory.as_fd())),
        ("a pipe", Some(pipe_read.as_fd())),
        ("a file open only for writing", Some(write_only.as_fd())),
        ("a file longer than declared", Some(too_long.as_fd())),
    ];
    for (what, file) in cases {
        let ticket = upload_ticket(&mut raw, &s, "/bad.bin", 3).await.unwrap();
        let (answer, back) = exchange(&ticket, &ticket.token, file.as_slice());
        let expected = if file.is_none() { "INVALID_ARGUMENT" } else { "ASSET_UPLOAD_FAILED" };
        assert_eq!(code(&answer), expected, "{what}: {answer:?}");
        assert!(back.is_empty(), "{what}: no file comes back");
        assert_eq!(code(&exchange(&ticket, &ticket.token, &[good.as_fd()]).0), "ASSET_TICKET_INVALID", "{what}");
    }
    assert!(s.list_assets().await.unwrap().iter().all(|a| a.path != "/bad.bin"), "nothing landed");
    assert!(leftovers(&h, &s).is_empty(), "no temporary file left: {:?}", leftovers(&h, &s));

    // A download hands over no file; a frame over the limit is not read.
    let download = download_ticket(&mut raw, &s, "/t.txt").await;
    assert_eq!(code(&exchange(&download, &download.token, &[good.as_fd()]).0), "INVALID_ARGUMENT");
    let socket = UnixStream::connect(&download.local_socket).unwrap();
    send_with(&socket, &(1u32 << 20).to_le_bytes(), &[]);
    let (response, _) = exchange::receive::<pb::AssetHandoffResponse>(&socket, handoff::MAX_RESPONSE, 1).unwrap();
    assert_eq!(code(&response.result.unwrap()), "INVALID_ARGUMENT");
    // A client that hangs up mid-frame leaves Core serving the next one.
    let socket = UnixStream::connect(&download.local_socket).unwrap();
    send_with(&socket, &[40, 0, 0, 0, 1], &[]);
    drop(socket);
    let download = download_ticket(&mut raw, &s, "/t.txt").await;
    let (answer, back) = exchange(&download, &download.token, &[]);
    assert_eq!(answer, Answer::Size(3));
    let mut bytes = [0u8; 3];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::from(back.into_iter().next().unwrap()), &mut bytes, 0)
        .unwrap();
    assert_eq!(&bytes, b"abc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_waits_its_turn_behind_a_running_upload_and_ends_with_the_session() {
    let h = Harness::start();
    let s = session(&h).await;
    let mut raw = h.raw().await;
    let file = file_of(b"xyz");
    let handed = upload_ticket(&mut raw, &s, "/handed.txt", 3).await.unwrap();
    let running = upload_ticket(&mut raw, &s, "/slow.bin", 10).await.unwrap();
    let held = start_upload(&running.url, &running.token, 10, b"12345").await;
    super::assets::eventually_busy(&mut raw, &s).await;
    let (answer, _) = exchange(&handed, &handed.token, &[file.as_fd()]);
    assert_eq!(code(&answer), "SESSION_BUSY");
    finish_upload(held, b"67890").await;
    let (answer, _) = exchange(&handed, &handed.token, &[file.as_fd()]);
    assert_eq!(answer, Answer::Path("/handed.txt".into()), "the ticket stayed good");

    // The read limit holds when the file is handed over, not only at ticket time.
    let download = download_ticket(&mut raw, &s, "/handed.txt").await;
    let grown = std::fs::OpenOptions::new().write(true).open(assets_dir(&h, &s).join("handed.txt")).unwrap();
    grown.set_len(limits::MAX_ASSET_BYTES + 1).unwrap();
    assert_eq!(code(&exchange(&download, &download.token, &[]).0), "ASSET_TOO_LARGE");
    grown.set_len(3).unwrap();

    // Tickets issued before end() are refused after it.
    let upload = upload_ticket(&mut raw, &s, "/late.txt", 3).await.unwrap();
    let download = download_ticket(&mut raw, &s, "/handed.txt").await;
    s.end().await.unwrap();
    assert_eq!(code(&exchange(&upload, &upload.token, &[file.as_fd()]).0), "ASSET_TICKET_INVALID");
    assert_eq!(code(&exchange(&download, &download.token, &[]).0), "ASSET_TICKET_INVALID");
}
