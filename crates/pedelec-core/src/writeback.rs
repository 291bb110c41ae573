//! Writeback of a file while it is still being written, so the `fsync` that
//! ends an upload finds little left to do: without it, the kernel holds the
//! whole upload dirty in memory and the final `fsync` writes all of it while
//! the client waits.
//!
//! Every [`WINDOW`] bytes, the window just filled is handed to the disk
//! (`sync_file_range(WRITE)`, which does not wait), so the disk works while
//! the network does. Measured here writing 100 MiB in 400 KiB chunks then
//! fsync: 440–500 MB/s without, 600–620 MB/s with 2 MiB windows, 560 MB/s
//! with 8 MiB ones, and no better when each window also waits for the one
//! before. Elsewhere than Linux this does nothing and the final `fsync` does
//! all of the work.

use std::fs::File;

/// Bytes handed to the disk at a time.
pub const WINDOW: u64 = 2 << 20;

/// Tracks how far a file written front to back has been handed to the disk.
#[derive(Debug, Default)]
pub struct Writeback {
    written: u64,
    started: u64,
}

impl Writeback {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `len` more bytes written at the end of `file` and starts
    /// writeback of every full window since the last call. Errors are
    /// ignored: this only moves work earlier, the final `fsync` reports
    /// what failed.
    pub fn wrote(&mut self, file: &File, len: usize) {
        self.written += len as u64;
        while self.written - self.started >= WINDOW {
            start(file, self.started, WINDOW);
            self.started += WINDOW;
        }
    }
}

#[cfg(target_os = "linux")]
fn start(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor `file` owns for the call; it
    // reads no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start(_: &File, _: u64, _: u64) {}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn windows_start_as_they_fill_and_the_file_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut file = File::create(&path).unwrap();
        let mut writeback = Writeback::new();
        let chunk = vec![7u8; 3 << 20];
        for _ in 0..7 {
            file.write_all(&chunk).unwrap();
            writeback.wrote(&file, chunk.len());
        }
        // 21 MiB written: ten full windows handed over, the rest left to fsync.
        assert_eq!(writeback.started, 10 * WINDOW);
        assert_eq!(writeback.written, 21 << 20);
        file.sync_all().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 21 << 20);
    }
}
