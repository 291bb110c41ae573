//! The asset hand-off socket's exchange (Unix): a frame with an open file
//! descriptor passed beside it (`SCM_RIGHTS`), and the copy from such a
//! file. Core and its clients call the same functions, so both agree on the
//! bytes and on what is refused; the rules (where the socket is, how big a
//! frame may be, how long each side waits) are `pedelec_protocol::handoff`.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use pedelec_protocol::tool_socket::{HEADER_LEN, decode_body, encode_frame};

/// Why an exchange on the hand-off socket failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("the hand-off socket failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("a hand-off frame of {len} bytes is over the {limit}-byte limit")]
    TooLong { len: usize, limit: usize },
    #[error("the hand-off connection closed before a whole frame arrived")]
    Closed,
    #[error("a hand-off frame does not decode: {0}")]
    Malformed(String),
    #[error("more file descriptors came with a hand-off frame than it may carry")]
    TooManyFiles,
}

/// Received descriptors are close-on-exec from the start where the
/// kernel can do it (Linux): Core starts agent processes, which must not
/// inherit a client's file. Elsewhere [`receive`] sets it right after.
#[cfg(target_os = "linux")]
const RECV_FLAGS: MsgFlags = MsgFlags::MSG_CMSG_CLOEXEC;
#[cfg(not(target_os = "linux"))]
const RECV_FLAGS: MsgFlags = MsgFlags::empty();
/// A peer that went away is an error, not a SIGPIPE (Rust programs
/// ignore SIGPIPE anyway; a library must not rely on it where it can
/// say so per call).
#[cfg(target_os = "linux")]
const SEND_FLAGS: MsgFlags = MsgFlags::MSG_NOSIGNAL;
#[cfg(not(target_os = "linux"))]
const SEND_FLAGS: MsgFlags = MsgFlags::empty();

fn errno(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// Sends `message` as one frame, with `file` passed beside its first
/// byte. One `sendmsg` sends it all unless the socket buffer is full,
/// when the rest follows without the descriptor.
pub fn send(socket: &UnixStream, message: &impl prost::Message, file: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let bytes = encode_frame(message);
    let fds: Vec<RawFd> = file.iter().map(|f| f.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let mut sent = loop {
        match sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(&bytes)], cmsgs, SEND_FLAGS, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(errno)?,
        }
    };
    while sent < bytes.len() {
        match sendmsg::<()>(socket.as_raw_fd(), &[IoSlice::new(&bytes[sent..])], &[], SEND_FLAGS, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(())
}

/// Reads one frame of at most `limit` bytes and the descriptors that came
/// with it, at most `max_files` of them: more is [`HandoffError::TooManyFiles`]
/// (every descriptor received is closed on any error). The socket's read
/// timeout bounds each wait.
pub fn receive<M: prost::Message + Default>(
    socket: &UnixStream,
    limit: usize,
    max_files: usize,
) -> Result<(M, Vec<OwnedFd>), HandoffError> {
    let mut files = Vec::new();
    let mut truncated = false;
    let mut buffer = vec![0u8; HEADER_LEN + limit];
    let mut filled = 0;
    let mut want = HEADER_LEN;
    while filled < want {
        // Room for a few descriptors, so a frame carrying too many is
        // told apart from one carrying the allowed number; the kernel
        // closes whatever does not fit (MSG_CTRUNC).
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let (bytes, flags) = {
            let mut iov = [IoSliceMut::new(&mut buffer[filled..want])];
            let message = match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), RECV_FLAGS) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => other.map_err(errno)?,
            };
            for cmsg in message.cmsgs().map_err(errno)? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    // SAFETY: the kernel just installed these descriptors
                    // in this process for us; nothing else owns them.
                    #[cfg(not(target_os = "linux"))]
                    let first_new = files.len();
                    files.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    #[cfg(not(target_os = "linux"))]
                    for file in &files[first_new..] {
                        use nix::fcntl::{F_SETFD, FdFlag, fcntl};
                        fcntl(file, F_SETFD(FdFlag::FD_CLOEXEC)).map_err(errno)?;
                    }
                }
            }
            (message.bytes, message.flags)
        };
        truncated |= flags.contains(MsgFlags::MSG_CTRUNC);
        if bytes == 0 {
            return Err(HandoffError::Closed);
        }
        filled += bytes;
        if want == HEADER_LEN && filled == HEADER_LEN {
            let len = u32::from_le_bytes(buffer[..HEADER_LEN].try_into().expect("4 bytes")) as usize;
            if len > limit {
                return Err(HandoffError::TooLong { len, limit });
            }
            want = HEADER_LEN + len;
        }
    }
    if truncated || files.len() > max_files {
        return Err(HandoffError::TooManyFiles);
    }
    let message = decode_body(&buffer[HEADER_LEN..want]).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    Ok((message, files))
}

/// Copies the first `len` bytes of `src` (from offset 0, whatever its
/// file offset) to the end of `dst`, and returns how many it copied:
/// fewer when `src` is shorter. `wrote` hears of each piece written, to
/// start its writeback. On Linux the kernel copies from file to file
/// (`copy_file_range`), elsewhere or where that is refused (another
/// filesystem on an old kernel, a filesystem without it) a 1 MiB
/// buffer does.
pub fn copy_range(src: &File, dst: &File, len: u64, mut wrote: impl FnMut(&File, usize)) -> std::io::Result<u64> {
    /// The piece copied at a time: small enough that writeback starts
    /// early, large enough that the calls cost nothing.
    const PIECE: u64 = 4 << 20;
    let mut copied = 0u64;
    #[cfg(target_os = "linux")]
    {
        let mut offset = 0i64;
        while copied < len {
            match nix::fcntl::copy_file_range(src, Some(&mut offset), dst, None, (len - copied).min(PIECE) as usize) {
                Ok(0) => return Ok(copied),
                Ok(n) => {
                    copied += n as u64;
                    wrote(dst, n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(
                    nix::errno::Errno::ENOSYS
                    | nix::errno::Errno::EXDEV
                    | nix::errno::Errno::EINVAL
                    | nix::errno::Errno::EOPNOTSUPP,
                ) if copied == 0 => break,
                Err(e) => return Err(errno(e)),
            }
        }
        if copied == len {
            return Ok(copied);
        }
    }
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let mut buffer = vec![0u8; PIECE.min(len.max(1)) as usize];
    let mut out = dst;
    while copied < len {
        let want = (len - copied).min(buffer.len() as u64) as usize;
        let n = match src.read_at(&mut buffer[..want], copied) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buffer[..n])?;
        copied += n as u64;
        wrote(dst, n);
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use pedelec_protocol::handoff::MAX_REQUEST;
    use pedelec_protocol::pb;

    use super::*;

    fn request() -> pb::AssetHandoffRequest {
        pb::AssetHandoffRequest { url: "http://127.0.0.1:1/transfer/ab".into(), token: "t".repeat(64) }
    }

    #[test]
    fn a_frame_and_its_file_arrive_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"hello").unwrap();
        send(&a, &request(), Some(file.as_fd())).unwrap();
        let (got, files) = receive::<pb::AssetHandoffRequest>(&b, MAX_REQUEST, 1).unwrap();
        assert_eq!(got, request());
        assert_eq!(files.len(), 1);
        let received = std::fs::File::from(files.into_iter().next().unwrap());
        let out = tempfile::tempfile().unwrap();
        assert_eq!(copy_range(&received, &out, 5, |_, _| {}).unwrap(), 5);
        let mut back = [0u8; 5];
        std::os::unix::fs::FileExt::read_exact_at(&out, &mut back, 0).unwrap();
        assert_eq!(&back, b"hello");
    }

    #[test]
    fn too_many_files_too_long_and_cut_short_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, &request(), None).unwrap();
        assert!(matches!(receive::<pb::AssetHandoffRequest>(&b, 10, 1), Err(HandoffError::TooLong { .. })));

        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        send(&a, &request(), Some(file.as_fd())).unwrap();
        assert!(matches!(receive::<pb::AssetHandoffRequest>(&b, MAX_REQUEST, 0), Err(HandoffError::TooManyFiles)));

        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(a);
        assert!(matches!(receive::<pb::AssetHandoffRequest>(&b, MAX_REQUEST, 1), Err(HandoffError::Closed)));

        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1, 0, 0, 0, 0xff]).unwrap();
        assert!(matches!(receive::<pb::AssetHandoffRequest>(&b, MAX_REQUEST, 1), Err(HandoffError::Malformed(_))));
    }

    #[test]
    fn a_copy_stops_at_the_length_or_the_end_of_the_source() {
        let mut src = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
        src.write_all(&data).unwrap();
        let dst = tempfile::tempfile().unwrap();
        let mut pieces = 0;
        assert_eq!(copy_range(&src, &dst, 5 << 20, |_, _| pieces += 1).unwrap(), 5 << 20);
        assert!(pieces >= 2, "copied in pieces, each reported");
        let dst2 = tempfile::tempfile().unwrap();
        assert_eq!(copy_range(&src, &dst2, 20 << 20, |_, _| {}).unwrap(), 9 << 20, "a short source ends the copy");
        use std::os::unix::fs::FileExt;
        let mut back = vec![0u8; 5 << 20];
        dst.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, data[..5 << 20]);
    }
}
