//! The asset hand-off socket's rules (`AssetHandoffRequest` in `core.proto`):
//! where it is, how big a frame may be, how long each side waits. The
//! exchange itself (a frame with an open file descriptor beside it) is
//! `pedelec_ipc::handoff`.
//!
//! Why a hand-off: over the loopback transfer server a 100 MiB upload is
//! copied four times (file → client buffer → socket → Core's buffer → file)
//! where `cp` copies once inside the kernel. Handing Core the open file lets
//! it copy from file to file with `copy_file_range` and start the disk's
//! writeback as it goes, which a streamed upload cannot do any faster than
//! its bytes arrive. A download the other way: the client copies from
//! Core's file.
//!
//! # Examples
//!
//! ```
//! use std::path::Path;
//! use pedelec_protocol::handoff::endpoint_for;
//!
//! assert_eq!(
//!     endpoint_for(Path::new("/run/user/1000/pedelec/core.sock")),
//!     Path::new("/run/user/1000/pedelec/core.sock.assets")
//! );
//! ```

use std::path::{Path, PathBuf};

/// The largest request frame body Core reads: a ticket's url and token are
/// well under it.
pub const MAX_REQUEST: usize = 4096;
/// The largest response frame body a client reads: an error's message and
/// details are bounded well under it (`limits::MAX_ERROR_MESSAGE_CHARS`,
/// `limits::MAX_ERROR_DETAILS_BYTES`).
pub const MAX_RESPONSE: usize = 16 * 1024;
/// How long either side waits for the other's frame. A transfer's copy runs
/// before the response, so a client waits for the response longer: see
/// [`RESPONSE_TIMEOUT`].
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a client waits for Core's response: the copy and fsync of up to
/// 100 MiB happen before it, on a disk that may be slow.
pub const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The hand-off socket that goes with Core's gRPC socket `core`: its path
/// with `.assets` appended (Unix only; Windows has no descriptor passing).
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use pedelec_protocol::handoff::endpoint_for;
///
/// assert_eq!(endpoint_for(Path::new("/tmp/x/core.sock")), Path::new("/tmp/x/core.sock.assets"));
/// ```
pub fn endpoint_for(core: &Path) -> PathBuf {
    let mut name = core.as_os_str().to_owned();
    name.push(".assets");
    PathBuf::from(name)
}

/// The ticket id in a ticket's url: what follows `/transfer/` in its path,
/// which is how Core issues it (`http://127.0.0.1:<port>/transfer/<id>`).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::handoff::ticket_id;
///
/// assert_eq!(ticket_id("http://127.0.0.1:4000/transfer/ab12"), Some("ab12"));
/// assert_eq!(ticket_id("http://127.0.0.1:4000/elsewhere/ab12"), None);
/// assert_eq!(ticket_id("http://127.0.0.1:4000/transfer/"), None);
/// ```
pub fn ticket_id(url: &str) -> Option<&str> {
    let (_, id) = url.split_once("/transfer/")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(id)
}
