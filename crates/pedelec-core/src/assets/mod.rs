//! Session assets: the files under `<ws>/.pedelec-runtime/assets/`, named by public
//! paths, listed by the seed's rules, and moved over Core's 127.0.0.1
//! transfer server with single-use tickets — never through gRPC bodies. On
//! Unix the same tickets can instead be redeemed on the hand-off socket
//! (`handoff`), where a local client passes an open file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use pedelec_protocol::origin::is_web_origin;
use pedelec_protocol::{AssetPath, ErrorCode, limits, pb};

use crate::clock::now_ms;
use crate::error::{CoreError, CoreResult};

pub(crate) mod area;
#[cfg(unix)]
mod handoff;
pub mod server_limits;

use area::{Area, Landing, modified_ms};
pub use server_limits::AssetLimits;

/// No upload progress for this long aborts the upload.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Prefix of Core's own files; hidden from listings at every level.
const RESERVED_PREFIX: &str = ".pedelec-";

type Body = BoxBody<Bytes, std::io::Error>;

#[derive(Debug, Clone)]
enum TicketKind {
    Upload { target: AssetPath, size: u64 },
    Download { path: AssetPath },
}

#[derive(Debug, Clone)]
struct Ticket {
    token: String,
    kind: TicketKind,
    session_id: String,
    origin: String,
    /// The session's workspace: its asset folder is opened from here, level
    /// by level, at every use (`area`), never kept as a path below it.
    workspace: PathBuf,
    /// The bytes the asset folder may hold (`asset_bytes_per_session`).
    max_bytes: u64,
    expires: Instant,
}

/// One upload slot per session: the token of the ticket whose upload is
/// running. A ticket takes the slot when its upload starts, not when it is
/// issued, so an unused ticket blocks nobody.
type Slots = HashMap<String, String>;

/// The loopback transfer server and its tickets.
pub struct AssetServer {
    pub addr: std::net::SocketAddr,
    /// How long a ticket stays valid (default `limits::ASSET_TICKET_TTL`).
    ticket_ttl: Duration,
    /// config.toml's bounds on the folder and the server.
    limits: AssetLimits,
    tickets: Mutex<HashMap<String, Ticket>>,
    slots: Mutex<Slots>,
    /// The hand-off socket, once it serves (`serve_handoff`, Unix): tickets
    /// name it so local clients can hand over files instead.
    local_socket: std::sync::OnceLock<String>,
}

/// `bytes` random bytes from the thread's CSPRNG, as hex.
fn random_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

fn coded(code: ErrorCode, message: impl Into<String>) -> CoreError {
    CoreError::new(code, message)
}

fn parse_path(text: &str) -> CoreResult<AssetPath> {
    let path = AssetPath::parse(text).map_err(|e| {
        CoreError::with_details(
            ErrorCode::AssetPathInvalid,
            format!("{text:?}: {e}"),
            serde_json::json!({ "path": text }),
        )
    })?;
    if path.is_reserved() {
        return Err(coded(ErrorCode::AssetPathInvalid, format!("{text:?} uses the reserved prefix {RESERVED_PREFIX}")));
    }
    Ok(path)
}

/// A file of the session's assets sent with a text: the path rules of the
/// seed (no symlinks, regular files only), and images within
/// [`limits::MAX_IMAGE_ATTACHMENT_BYTES`] (they travel inline).
pub fn attachment(workspace: &Path, text: &str) -> CoreResult<crate::providers::Attachment> {
    let path = parse_path(text)?;
    let (opened, meta) = Area::open_existing(workspace, &path)?.open_file(&path)?;
    let file = Area::display_path(workspace, &path);
    let mime = mime_for(path.file_name()).to_owned();
    let image = if pedelec_protocol::asset_path::is_attachable_image(&mime) {
        if meta.len() > limits::MAX_IMAGE_ATTACHMENT_BYTES {
            return Err(coded(
                ErrorCode::AssetTooLarge,
                format!("the image {path} is over the 20 MiB attachment limit"),
            ));
        }
        // Read now, from the descriptor just checked: the provider sends
        // these bytes, never whatever the path names by then.
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(opened, meta.len()), &mut bytes)
            .map_err(|e| CoreError::io(format!("reading the attachment {path}"), e))?;
        Some(crate::providers::ImageBytes(bytes.into()))
    } else {
        None
    };
    Ok(crate::providers::Attachment { path: path.to_string(), file, mime, size: meta.len(), image })
}

/// A safe basename from an uploaded file's name.
fn sanitize_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    let cleaned = cleaned.trim().trim_start_matches(RESERVED_PREFIX).to_owned();
    if cleaned.is_empty() || cleaned == "." || cleaned == ".." { "upload".into() } else { cleaned }
}

/// The MIME type for a file name, by its extension (`mime_guess`'s table);
/// `application/octet-stream` when it has none or an unknown one.
pub fn mime_for(name: &str) -> &'static str {
    mime_guess::from_path(name).first_raw().unwrap_or("application/octet-stream")
}

/// Every asset of the workspace's folder (`Area::list`); none when the
/// folder does not exist yet, `ASSET_PATH_INVALID` when a level of it is a
/// symlink.
pub fn list(workspace: &Path) -> CoreResult<Vec<pb::Asset>> {
    Ok(Area::open(workspace, false)?.map(|area| area.list()).unwrap_or_default())
}

/// Refuses an upload of `size` bytes to `target` that would take the folder
/// over `max` bytes: what is there, less the file `target` replaces.
fn check_quota(area: &Area, target: &AssetPath, size: u64, max: u64) -> CoreResult<()> {
    let after = area.used_bytes().saturating_sub(area.size_of(target)).saturating_add(size);
    if after > max {
        return Err(CoreError::with_details(
            ErrorCode::QuotaExceeded,
            format!("{size} more bytes would take the session's assets to {after}, over the {max}-byte limit"),
            serde_json::json!({ "limit": server_limits::BYTES_KEY, "max": max }),
        ));
    }
    Ok(())
}

impl AssetServer {
    /// Binds 127.0.0.1 on an ephemeral port and serves transfers.
    pub async fn start(ticket_ttl: Duration, limits: AssetLimits) -> CoreResult<Arc<Self>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CoreError::io("binding the asset server", e))?;
        let addr = listener.local_addr().map_err(|e| CoreError::io("asset server address", e))?;
        let server = Arc::new(AssetServer {
            addr,
            ticket_ttl,
            limits,
            tickets: Mutex::default(),
            slots: Mutex::default(),
            local_socket: std::sync::OnceLock::new(),
        });
        let serving = server.clone();
        let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                // Over the cap, the connection is closed at once rather than
                // left in the backlog: any local process (or page) can open
                // connections, and each held one costs a task and buffers.
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::debug!("the asset server is at its connection cap; closing a new connection");
                    drop(stream);
                    continue;
                };
                // Nagle's algorithm costs ~40 ms per request on a reused connection.
                let _ = stream.set_nodelay(true);
                let server = serving.clone();
                tokio::spawn(async move {
                    let header_timeout = server.limits.header_timeout;
                    let service = hyper::service::service_fn(move |req| {
                        let server = server.clone();
                        async move { Ok::<_, std::convert::Infallible>(server.handle(req).await) }
                    });
                    // A client that connects and never finishes its request
                    // head is cut off, so silent connections cannot hold the
                    // cap. (Bodies have their own stall timeout.)
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(header_timeout)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                    drop(permit);
                });
            }
        });
        Ok(server)
    }

    fn lock_tickets(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ticket>> {
        self.tickets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn issue(&self, ticket: Ticket, asset: Option<pb::Asset>, path: &AssetPath) -> pb::AssetTicket {
        let id = random_hex(16);
        let reply = pb::AssetTicket {
            url: format!("http://{}/transfer/{id}", self.addr),
            token: ticket.token.clone(),
            expires_at_ms: now_ms() + self.ticket_ttl.as_millis() as i64,
            path: path.to_string(),
            asset,
            // A web page cannot pass a descriptor, and the socket's path
            // would tell it where Core lives (a home directory, a user name).
            local_socket: if is_web_origin(&ticket.origin) {
                String::new()
            } else {
                self.local_socket.get().cloned().unwrap_or_default()
            },
        };
        let mut tickets = self.lock_tickets();
        let now = Instant::now();
        tickets.retain(|_, t| t.expires > now);
        tickets.insert(id, ticket);
        reply
    }

    /// A ticket to upload one file (`CreateAssetUpload`).
    pub fn create_upload(
        &self,
        session_id: &str,
        origin: &str,
        workspace: &Path,
        request: &pb::CreateAssetUploadRequest,
    ) -> CoreResult<pb::AssetTicket> {
        if request.size > limits::MAX_ASSET_BYTES {
            return Err(CoreError::with_details(
                ErrorCode::AssetTooLarge,
                format!("{} bytes exceeds the {}-byte limit", request.size, limits::MAX_ASSET_BYTES),
                serde_json::json!({ "limit": limits::MAX_ASSET_BYTES }),
            ));
        }
        let area = Area::open(workspace, true)?
            .ok_or_else(|| coded(ErrorCode::AssetUploadFailed, "the asset folder vanished while being made"))?;
        let target = if request.target_path.is_empty() {
            self.derive_path(&area, &request.file_name)?
        } else {
            parse_path(&request.target_path)?
        };
        // Checked here for a clear early answer, and again when the bytes
        // come (another upload may have landed meanwhile).
        check_quota(&area, &target, request.size, self.limits.max_bytes)?;
        let ticket_id_token = random_hex(32);
        if self.lock_slots().contains_key(session_id) {
            return Err(coded(ErrorCode::SessionBusy, "another upload is running for this session"));
        }
        let ticket = Ticket {
            token: ticket_id_token,
            kind: TicketKind::Upload { target: target.clone(), size: request.size },
            session_id: session_id.to_owned(),
            origin: origin.to_owned(),
            workspace: workspace.to_owned(),
            max_bytes: self.limits.max_bytes,
            expires: Instant::now() + self.ticket_ttl,
        };
        Ok(self.issue(ticket, None, &target))
    }

    fn derive_path(&self, area: &Area, file_name: &str) -> CoreResult<AssetPath> {
        let name = sanitize_name(file_name);
        let (stem, ext) = match name.rsplit_once('.') {
            Some((s, e)) if !s.is_empty() => (s.to_owned(), format!(".{e}")),
            _ => (name.clone(), String::new()),
        };
        for n in 0..1000 {
            let candidate = if n == 0 { name.clone() } else { format!("{stem} ({n}){ext}") };
            let path = parse_path(&format!("/{candidate}"))?;
            if !area.occupied(&path) {
                return Ok(path);
            }
        }
        Err(coded(ErrorCode::AssetPathInvalid, format!("no free name for {file_name:?}")))
    }

    /// A ticket to download one file (`CreateAssetDownload`).
    pub fn create_download(
        &self,
        session_id: &str,
        origin: &str,
        workspace: &Path,
        path: &str,
    ) -> CoreResult<pb::AssetTicket> {
        let path = parse_path(path)?;
        let (_, meta) = Area::open_existing(workspace, &path)?.open_file(&path)?;
        if meta.len() > limits::MAX_ASSET_BYTES {
            return Err(coded(ErrorCode::AssetTooLarge, format!("{path} is over the 100 MiB read limit")));
        }
        let asset = pb::Asset {
            name: path.file_name().to_owned(),
            path: path.to_string(),
            size: meta.len(),
            modified_at_ms: modified_ms(meta.modified().ok()),
            mime_type: mime_for(path.file_name()).into(),
        };
        let ticket = Ticket {
            token: random_hex(32),
            kind: TicketKind::Download { path: path.clone() },
            session_id: session_id.to_owned(),
            origin: origin.to_owned(),
            workspace: workspace.to_owned(),
            max_bytes: self.limits.max_bytes,
            expires: Instant::now() + self.ticket_ttl,
        };
        Ok(self.issue(ticket, Some(asset), &path))
    }

    /// The session ended: its unused tickets are void (the seed: an ended
    /// session cannot upload or read assets). A transfer already under way
    /// runs to its end (and then frees the upload slot).
    pub fn revoke_session(&self, session_id: &str) {
        self.lock_tickets().retain(|_, t| t.session_id != session_id);
    }

    fn release_slot(&self, session_id: &str, token: &str) {
        let mut slots = self.lock_slots();
        if slots.get(session_id).is_some_and(|t| t == token) {
            slots.remove(session_id);
        }
    }

    /// Takes the session's upload slot for `token`'s upload; `false` when
    /// another upload of the session is running.
    fn take_slot(&self, session_id: &str, token: &str) -> bool {
        let mut slots = self.lock_slots();
        match slots.get(session_id) {
            Some(running) => running == token,
            None => {
                slots.insert(session_id.to_owned(), token.to_owned());
                true
            }
        }
    }

    /// Takes the session's upload slot for a redeemed upload `ticket`. When
    /// another upload of the session is running, the ticket goes back under
    /// `id` — unused, so still good once that upload is over — and the
    /// answer is `SESSION_BUSY`.
    fn claim_slot(&self, id: &str, ticket: Ticket) -> Result<Ticket, Failure> {
        if self.take_slot(&ticket.session_id, &ticket.token) {
            return Ok(ticket);
        }
        self.lock_tickets().insert(id.to_owned(), ticket);
        Err((StatusCode::CONFLICT, ErrorCode::SessionBusy, "another upload is running for this session".into()))
    }

    /// Takes ticket `id` out for a transfer that proved its `token`: single
    /// use, so only such a request takes it; an expired one is dropped.
    fn redeem(&self, id: &str, token: &str) -> Result<Ticket, Failure> {
        let mut tickets = self.lock_tickets();
        match tickets.get(id) {
            Some(t) if t.expires <= Instant::now() => {
                let t = tickets.remove(id).expect("present");
                drop(tickets);
                self.release_slot(&t.session_id, &t.token);
                Err((StatusCode::GONE, ErrorCode::AssetTicketInvalid, "ticket expired".into()))
            }
            // Without an early exit: the time must not tell how much of a guess was right.
            Some(t) if bool::from(subtle::ConstantTimeEq::ct_eq(t.token.as_bytes(), token.as_bytes())) => {
                Ok(tickets.remove(id).expect("present"))
            }
            _ => Err((StatusCode::UNAUTHORIZED, ErrorCode::AssetTicketInvalid, "unknown ticket or wrong token".into())),
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        // A page on a name that resolves to 127.0.0.1 (DNS rebinding) sends
        // its own name: only this server's loopback authority is served.
        let host = request.headers().get(hyper::header::HOST).and_then(|v| v.to_str().ok());
        if !server_limits::is_own_host(host, self.addr.port()) {
            return error_response(
                StatusCode::MISDIRECTED_REQUEST,
                ErrorCode::InvalidArgument,
                "this server answers only to its own loopback address",
                None,
            );
        }
        // The same reading of a ticket's url as the hand-off socket's.
        let id = pedelec_protocol::handoff::ticket_id(request.uri().path()).unwrap_or_default().to_owned();
        let origin_header =
            request.headers().get(hyper::header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let ticket_origin = self.lock_tickets().get(&id).map(|t| t.origin.clone());
        let cors = ticket_origin.and_then(cors_origin);
        if request.method() == Method::OPTIONS {
            return with_cors(Response::builder().status(StatusCode::NO_CONTENT), cors.as_deref())
                .header("Access-Control-Allow-Methods", "GET, PUT")
                .header("Access-Control-Allow-Headers", "Authorization, Content-Type")
                .header("Access-Control-Max-Age", "60")
                .body(empty())
                .expect("static response");
        }
        if let (Some(sent), Some(allowed)) = (&origin_header, &cors)
            && sent != allowed
        {
            return error_response(StatusCode::FORBIDDEN, ErrorCode::OriginNotAllowed, "origin not allowed", None);
        }
        let token = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_owned();
        let ticket = match self.redeem(&id, &token) {
            Ok(ticket) => ticket,
            Err((status, code, message)) => return error_response(status, code, &message, cors.as_deref()),
        };
        let response = match (ticket.kind.clone(), request.method()) {
            (TicketKind::Upload { target, size }, &Method::PUT) => {
                let ticket = match self.claim_slot(&id, ticket) {
                    Ok(ticket) => ticket,
                    Err((status, code, message)) => return error_response(status, code, &message, cors.as_deref()),
                };
                // Freed however the upload ends, also when hyper drops this
                // future because the client went away; declared before the
                // upload so its temporary file is gone first.
                let _slot = SlotGuard { server: self, session_id: &ticket.session_id, token: &ticket.token };
                let result = receive(request, &ticket, &target, size).await;
                match result {
                    Ok(()) => Response::builder()
                        .status(StatusCode::CREATED)
                        .header("Content-Type", "application/json")
                        .body(full(serde_json::json!({ "path": target.as_str() }).to_string()))
                        .expect("static response"),
                    Err((status, code, message)) => error_response(status, code, &message, None),
                }
            }
            (TicketKind::Download { path }, &Method::GET) => send(&ticket, &path).await,
            _ => {
                if matches!(ticket.kind, TicketKind::Upload { .. }) {
                    self.release_slot(&ticket.session_id, &ticket.token);
                }
                error_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::InvalidArgument,
                    "wrong method for this ticket",
                    None,
                )
            }
        };
        let (mut parts, body) = response.into_parts();
        if let Some(origin) = &cors
            && let Ok(value) = origin.parse()
        {
            parts.headers.insert("Access-Control-Allow-Origin", value);
            parts.headers.insert("Vary", hyper::header::HeaderValue::from_static("Origin"));
        }
        Response::from_parts(parts, body)
    }
}

type Failure = (StatusCode, ErrorCode, String);

/// Streams the body into a temporary file and renames it into place only
/// when exactly `size` bytes arrived (fsync first).
async fn receive(request: Request<Incoming>, ticket: &Ticket, target: &AssetPath, size: u64) -> Result<(), Failure> {
    let upload_failed = |m: String| (StatusCode::BAD_REQUEST, ErrorCode::AssetUploadFailed, m);
    if let Some(declared) =
        request.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && declared != size
    {
        return Err(upload_failed(format!("Content-Length {declared} does not match the ticket's {size} bytes")));
    }
    // Removed unless it lands, whichever way this future ends (dropped
    // mid-upload included).
    let (staged, file) = Staged::create(ticket, target, size)?;
    // Disk writes run on a thread of their own, fed through a short queue:
    // the network side never waits on the disk per chunk, and memory stays bounded.
    let (chunks, mut queue) = tokio::sync::mpsc::channel::<Bytes>(16);
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::Write;
        // hyper's chunks are already large (up to its ~400 KiB read
        // buffer); written as they come, they skip a copy into a BufWriter.
        let mut out = file;
        let mut writeback = crate::writeback::Writeback::new();
        while let Some(chunk) = queue.blocking_recv() {
            out.write_all(&chunk)?;
            writeback.wrote(&out, chunk.len());
        }
        out.sync_all()
    });
    let mut body = request.into_body();
    let mut received = 0u64;
    let streamed = async {
        loop {
            let frame = match tokio::time::timeout(STALL_TIMEOUT, body.frame()).await {
                Err(_) => return Err(upload_failed("the upload stalled".into())),
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(upload_failed(format!("the upload was interrupted: {e}"))),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                received += data.len() as u64;
                if received > size {
                    let message = format!("more than the declared {size} bytes");
                    return Err((StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::AssetUploadFailed, message));
                }
                if chunks.send(data).await.is_err() {
                    return Err(upload_failed("writing the upload failed".into()));
                }
            }
        }
    }
    .await;
    drop(chunks);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| upload_failed(e.to_string()))?
        .map_err(|_| upload_failed("the upload writer failed".into()))?;
    streamed?;
    written.map_err(|e| upload_failed(e.to_string()))?;
    if received != size {
        return Err(upload_failed(format!("{received} of the declared {size} bytes arrived")));
    }
    staged.land(target)
}

/// A refusal of Core's as a transfer's failure.
fn failure(status: StatusCode, error: &CoreError) -> Failure {
    (status, error.code(), error.to_string())
}

/// An upload's temporary file, streamed or handed over: in the asset
/// folder, created and renamed through its handle (`Area::stage`), so the
/// rename into place is atomic and nothing lands outside the folder however
/// the workspace changes meanwhile. Removed on drop unless it landed.
struct Staged {
    area: Area,
    name: String,
    landed: bool,
}

impl Staged {
    /// Creates the temporary file for `ticket`'s upload of `size` bytes to
    /// `target`, once the folder has room for them.
    fn create(ticket: &Ticket, target: &AssetPath, size: u64) -> Result<(Staged, std::fs::File), Failure> {
        let area =
            Area::open(&ticket.workspace, true).map_err(|e| failure(StatusCode::CONFLICT, &e))?.ok_or_else(|| {
                (StatusCode::CONFLICT, ErrorCode::AssetUploadFailed, "the asset folder vanished".to_owned())
            })?;
        check_quota(&area, target, size, ticket.max_bytes).map_err(|e| failure(StatusCode::PAYLOAD_TOO_LARGE, &e))?;
        let (name, file) =
            area.stage().map_err(|e| (StatusCode::BAD_REQUEST, ErrorCode::AssetUploadFailed, e.to_string()))?;
        Ok((Staged { area, name, landed: false }, file))
    }

    /// Renames the complete, fsynced file into place at `target`.
    fn land(mut self, target: &AssetPath) -> Result<(), Failure> {
        self.area.land(&self.name, target).map_err(|e| match e {
            Landing::Refused(m) => (StatusCode::CONFLICT, ErrorCode::AssetPathInvalid, m),
            Landing::Failed(e) => (StatusCode::BAD_REQUEST, ErrorCode::AssetUploadFailed, e.to_string()),
        })?;
        self.landed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.landed {
            self.area.discard(&self.name);
        }
    }
}

/// The session's upload slot, held by a running upload until it ends.
struct SlotGuard<'a> {
    server: &'a AssetServer,
    session_id: &'a str,
    token: &'a str,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.server.release_slot(self.session_id, self.token);
    }
}

/// Opens a download ticket's file, by the seed's path rules and within the
/// read limit, with its metadata.
///
/// The file is opened once, through the folder's handle, and its metadata
/// read from that descriptor: the file served is the file checked, whatever
/// the agent swaps in meanwhile.
fn open_download(ticket: &Ticket, path: &AssetPath) -> Result<(std::fs::File, std::fs::Metadata), Failure> {
    let status = |e: &CoreError| match e.code() {
        ErrorCode::AssetNotFound => StatusCode::NOT_FOUND,
        ErrorCode::AssetPathInvalid => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let (file, meta) = Area::open_existing(&ticket.workspace, path)
        .and_then(|area| area.open_file(path))
        .map_err(|e| failure(status(&e), &e))?;
    // Checked again here, not only when the ticket was issued: the file may
    // have grown since (an agent writing it).
    if meta.len() > limits::MAX_ASSET_BYTES {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::AssetTooLarge,
            format!("{path} is larger than the {}-byte read limit", limits::MAX_ASSET_BYTES),
        ));
    }
    Ok((file, meta))
}

async fn send(ticket: &Ticket, path: &AssetPath) -> Response<Body> {
    let (file, meta) = match open_download(ticket, path) {
        Ok(opened) => opened,
        Err((status, code, message)) => return error_response(status, code, &message, None),
    };
    // A reader thread fills a few recycled 1 MiB buffers as the client
    // consumes them; the buffer pool is also the bound on memory.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(DOWNLOAD_BUFFERS);
    // Never more than the Content-Length announced, should the file grow meanwhile.
    let len = meta.len();
    std::thread::spawn(move || read_chunks(std::io::Read::take(file, len), tx));
    let chunks =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item.map(Frame::data), rx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header("Content-Type", mime_for(path.file_name()))
        .header("Content-Length", meta.len())
        .header("X-Pedelec-Modified-At", modified_ms(meta.modified().ok()))
        .header("X-Pedelec-Name", path.file_name().replace(|c: char| !c.is_ascii_graphic() && c != ' ', "_"))
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .expect("valid headers")
}

/// Buffers one download reads into; each is [`DOWNLOAD_CHUNK`] bytes.
const DOWNLOAD_BUFFERS: usize = 4;
const DOWNLOAD_CHUNK: usize = 1 << 20;

/// A filled buffer on its way to the socket; dropping it (once hyper has
/// written it, or the response was abandoned) hands the buffer back to its
/// reader. Fresh 1 MiB buffers per chunk cost a zeroing pass and, on a first
/// download, a page fault per 4 KiB.
struct Recycled {
    buffer: Vec<u8>,
    len: usize,
    home: std::sync::mpsc::Sender<Vec<u8>>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer[..self.len]
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let _ = self.home.send(std::mem::take(&mut self.buffer));
    }
}

/// Reads `file` into recycled buffers and queues them until the end, an error,
/// or the response going away.
fn read_chunks(mut file: impl std::io::Read, queue: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>) {
    let (home, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut fresh = DOWNLOAD_BUFFERS;
    loop {
        let mut buffer = if fresh > 0 {
            fresh -= 1;
            vec![0u8; DOWNLOAD_CHUNK]
        } else {
            // Every buffer is out; each comes back when hyper drops it, so this ends.
            match returned.recv() {
                Ok(buffer) => buffer,
                Err(_) => return,
            }
        };
        let item = match file.read(&mut buffer) {
            Ok(0) => return,
            Ok(len) => Ok(Bytes::from_owner(Recycled { buffer, len, home: home.clone() })),
            Err(e) => Err(e),
        };
        let failed = item.is_err();
        if queue.blocking_send(item).is_err() || failed {
            return;
        }
    }
}

fn empty() -> Body {
    full(String::new())
}

fn full(text: String) -> Body {
    Full::new(Bytes::from(text)).map_err(|never| match never {}).boxed()
}

/// The `Access-Control-Allow-Origin` a ticket's origin allows: web origins
/// only, and only one that is a valid header value (an origin with non-ASCII
/// characters cannot be one, and must not fail the response).
fn cors_origin(origin: String) -> Option<String> {
    (is_web_origin(&origin) && origin.is_ascii() && hyper::header::HeaderValue::from_str(&origin).is_ok())
        .then_some(origin)
}

fn with_cors(builder: hyper::http::response::Builder, origin: Option<&str>) -> hyper::http::response::Builder {
    match origin {
        Some(o) => builder.header("Access-Control-Allow-Origin", o).header("Vary", "Origin"),
        None => builder,
    }
}

fn error_response(status: StatusCode, code: ErrorCode, message: &str, cors: Option<&str>) -> Response<Body> {
    let body = pedelec_protocol::json::to_json(&pb::Error::new(code, message));
    with_cors(Response::builder().status(status), cors)
        .header("Content-Type", "application/json")
        .body(full(body))
        .expect("static response")
}

#[cfg(test)]
mod tests {

    #[test]
    fn listing_ties_are_broken_by_name_then_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(".pedelec-runtime/assets");
        let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for (sub, name) in [("b", "a.txt"), ("a", "z.txt"), ("c", "a.txt")] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
            let file = std::fs::File::create(root.join(sub).join(name)).unwrap();
            file.set_modified(at).unwrap();
        }
        let paths: Vec<String> = list(dir.path()).unwrap().into_iter().map(|a| a.path).collect();
        assert_eq!(paths, ["/b/a.txt", "/c/a.txt", "/a/z.txt"]);
    }

    #[test]
    fn only_web_origins_that_are_header_values_get_cors() {
        assert_eq!(cors_origin("https://app.example".into()).as_deref(), Some("https://app.example"));
        assert_eq!(cors_origin("app:desktop".into()), None, "not a web origin");
        assert_eq!(cors_origin("https://bücher.example".into()), None, "not a header value: no panic, no CORS");
        assert_eq!(cors_origin("https://a.example\r\nX: y".into()), None);
    }

    use super::*;

    #[test]
    fn mime_types_come_from_the_extension() {
        for (name, mime) in [
            ("chart.png", "image/png"),
            ("PHOTO.JPG", "image/jpeg"),
            ("data.json", "application/json"),
            ("scene.glb", "model/gltf-binary"),
            ("notes.txt", "text/plain"),
            ("app.wasm", "application/wasm"),
            ("archive.unknownext", "application/octet-stream"),
            ("no-extension", "application/octet-stream"),
        ] {
            assert_eq!(mime_for(name), mime, "{name}");
        }
    }

    #[test]
    fn names_are_sanitised() {
        assert_eq!(sanitize_name("../../etc/passwd"), "passwd");
        assert_eq!(sanitize_name("C:\\x\\report.pdf"), "report.pdf");
        assert_eq!(sanitize_name(".pedelec-secret"), "secret");
        assert_eq!(sanitize_name(".."), "upload");
        assert_eq!(sanitize_name(""), "upload");
    }
}
