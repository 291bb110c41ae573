//! Handing memory back when Core goes quiet.
//!
//! Most of an idle Core's RSS is not its data: it is the clean file pages of
//! its own binary (and libc) that start-up and the last burst of work ran
//! through. The kernel maps 64 KiB around every page a fault touches
//! ("fault-around"), and a fat-LTO binary scatters what one request runs
//! over its 13 MB of text, so a Core that served a few requests keeps
//! ~6 MiB of code mapped for as long as it lives (measured: 5.5 MiB of text
//! and 1.4 MiB of rodata right after start, of 10.2 MiB RSS). Those pages
//! are in the page cache either way; what Core holds is the page-table
//! entries that count them as its own.
//!
//! When Core has been quiet for a tick ([`QuietTrim`]), it drops those
//! entries for its read-only private file mappings (`MADV_DONTNEED`) and
//! returns the allocator's free heap (`malloc_trim`). Code it runs again
//! comes back at a minor fault from the page cache (~100 faults for a
//! whole request path), no disk read and no copy. A mapping with any
//! anonymous page — a RELRO segment the loader relocated, anything a
//! write made private — is never touched: dropping it would bring back the
//! file's bytes in place of ours.
//!
//! Other systems: a no-op; the decision logic is the same everywhere.

use std::time::Duration;

/// How often Core asks whether it has been quiet, by default
/// (`serve --trim-after-quiet-ms`).
pub const QUIET_TICK: Duration = Duration::from_secs(1);

/// At most this much CPU time in one tick counts as quiet (1 % of the
/// default tick): the idle loop's own timers and a keep-alive ping stay far
/// below it.
pub const QUIET_CPU: Duration = Duration::from_millis(10);

/// Page faults since the last trim below which there is nothing worth
/// handing back: an idle Core's own ticks fault in a handful of pages.
pub const REFAULTS_WORTH_A_TRIM: u64 = 64;

/// The decision, free of IO: fed the process's CPU time and fault count
/// once per [`QUIET_TICK`], it says when to trim — once per quiet spell,
/// after work mapped pages again.
#[derive(Debug, Default)]
pub struct QuietTrim {
    last_cpu: Option<Duration>,
    faults_at_trim: u64,
}

impl QuietTrim {
    /// `cpu` and `faults` are the process's totals so far.
    pub fn tick(&mut self, cpu: Duration, faults: u64) -> bool {
        let busy = self.last_cpu.is_none_or(|last| cpu.saturating_sub(last) > QUIET_CPU);
        self.last_cpu = Some(cpu);
        !busy && faults.saturating_sub(self.faults_at_trim) >= REFAULTS_WORTH_A_TRIM
    }

    /// Records a trim: `cpu` and `faults` are the totals after it.
    pub fn trimmed(&mut self, cpu: Duration, faults: u64) {
        self.faults_at_trim = faults;
        // The trim's own work is not a sign of activity.
        self.last_cpu = Some(cpu);
    }
}

/// The process's CPU time (user + system) and its page faults so far.
pub fn usage() -> (Duration, u64) {
    #[cfg(unix)]
    {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes one rusage into the buffer it is given.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0 {
            // SAFETY: initialised by the successful call above.
            let usage = unsafe { usage.assume_init() };
            let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
            return (time(usage.ru_utime) + time(usage.ru_stime), (usage.ru_minflt + usage.ru_majflt) as u64);
        }
    }
    (Duration::ZERO, 0)
}

/// Hands back what a quiet Core does not need mapped: freed heap and the
/// page-table entries of its clean code and read-only data. Returns the
/// KiB of mapped file pages it let go of.
pub fn trim() -> u64 {
    return_freed_memory();
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
        let mut released = 0;
        for mapping in mappings(&smaps).filter(Mapping::droppable) {
            // SAFETY: the range is one whole mapping of ours, page-aligned,
            // private, read-only and file-backed with no anonymous page, so
            // its contents after a re-fault are the file's, the same bytes.
            if unsafe { libc::madvise(mapping.start as *mut libc::c_void, mapping.len, libc::MADV_DONTNEED) } == 0 {
                released += mapping.rss_kib;
            }
        }
        released
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// Core's allocator on Linux, installed by the binary (`#[global_allocator]`
/// in `main.rs`, configured by [`configure_allocator`]): mimalloc. Core's
/// work is small allocations made on one thread and freed on another — a
/// provider's line parsed on a worker, its transcript row freed on the
/// store's writer, an event encoded on the connection's task. glibc's
/// malloc serialises those frees on its arena lock and consolidates on the
/// way; mimalloc does not (docs/performance.md has the figures). Elsewhere
/// Core keeps the system's allocator: the measurements were of glibc's, and
/// mimalloc's macOS build needs the SDK's CommonCrypto headers, which the
/// zig cross toolchain lacks.
#[cfg(target_os = "linux")]
pub type Allocator = mimalloc::MiMalloc;

/// mimalloc's `arena_eager_commit` (its option number in `mimalloc.h`).
#[cfg(target_os = "linux")]
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Sets the allocator's options before anything is allocated. By default
/// mimalloc commits its arenas eagerly where the system overcommits
/// (Linux), and what it purged stays resident: an idle Core held 13.2 MiB
/// instead of 3.1 MiB with glibc. Committed on demand, idle RSS is
/// 3.3–3.9 MiB (anonymous ~1.7 MiB, against ~1.1 MiB with glibc).
///
/// It must run before the first allocation reserves an arena — setting it
/// first thing in `main` is already too late (measured: no change), since
/// the runtime allocates before `main` — so the binary runs it as a
/// constructor (`ALLOCATOR_SETUP` in `main.rs`).
#[cfg(target_os = "linux")]
pub extern "C" fn configure_allocator() {
    // SAFETY: sets a plain option value, before any thread but the first
    // exists (mimalloc's options are not thread-safe).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

/// Hands memory freed by evictions back to the system: mimalloc's free
/// pages (on Linux, where it is the allocator: see `Allocator`) and glibc's
/// free heap (what was allocated before it, or everything where it is not). Without
/// this a burst of sessions that all ended stays in Core's RSS (measured
/// with glibc: +54 MiB after 10 000, +6 MiB with it).
pub fn return_freed_memory() {
    #[cfg(target_os = "linux")]
    // SAFETY: collects the calling thread's free pages and purges the
    // arenas' free memory; a no-op when mimalloc allocated nothing.
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(target_os = "linux")]
/// One mapping of `/proc/self/smaps`, as far as the trim needs it.
#[derive(Debug, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub start: usize,
    pub len: usize,
    pub perms: &'a str,
    pub path: &'a str,
    pub rss_kib: u64,
    pub anonymous_kib: u64,
}

#[cfg(target_os = "linux")]
impl Mapping<'_> {
    /// Whether its page-table entries can be dropped without changing a
    /// byte Core reads: readable, not writable, private, backed by a file
    /// (not `[vdso]`, `[stack]` or an anonymous region), resident, and with
    /// no page that a write or a relocation made private.
    pub fn droppable(&self) -> bool {
        let perms = self.perms.as_bytes();
        perms.len() == 4
            && perms[0] == b'r'
            && perms[1] == b'-'
            && perms[3] == b'p'
            && self.path.starts_with('/')
            && self.rss_kib > 0
            && self.anonymous_kib == 0
    }
}

#[cfg(target_os = "linux")]
/// The mappings of an smaps text. A mapping whose header or sizes do not
/// parse is left out (and so never dropped).
pub fn mappings(smaps: &str) -> impl Iterator<Item = Mapping<'_>> {
    let mut lines = smaps.lines().peekable();
    std::iter::from_fn(move || {
        loop {
            let header = lines.next()?;
            let Some(mut mapping) = header_of(header) else { continue };
            let (mut rss, mut anonymous) = (None, None);
            while let Some(line) = lines.next_if(|line| header_of(line).is_none()) {
                if let Some(kib) = field_kib(line, "Rss:") {
                    rss = Some(kib);
                } else if let Some(kib) = field_kib(line, "Anonymous:") {
                    anonymous = Some(kib);
                }
            }
            if let (Some(rss), Some(anonymous)) = (rss, anonymous) {
                (mapping.rss_kib, mapping.anonymous_kib) = (rss, anonymous);
                return Some(mapping);
            }
        }
    })
}

#[cfg(target_os = "linux")]
/// `start-end perms offset dev inode [path]`; the path may hold spaces.
fn header_of(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let (_offset, _dev, _inode) = (fields.next()?, fields.next()?, fields.next()?);
    let path = fields.next().unwrap_or("").trim_start();
    (end > start && perms.len() == 4).then_some(Mapping {
        start,
        len: end - start,
        perms,
        path,
        rss_kib: 0,
        anonymous_kib: 0,
    })
}

#[cfg(target_os = "linux")]
fn field_kib(line: &str, name: &str) -> Option<u64> {
    line.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cut from a release Core's own smaps: text, rodata, a relocated RELRO
    /// segment (read-only now, but its pages are the loader's writes),
    /// .data, the heap, a shared SQLite index, the vdso, and a path with a
    /// space.
    #[cfg(target_os = "linux")]
    const SMAPS: &str = "\
5567aa000000-5567aa400000 r--p 00000000 fd:01 131 /opt/pedelec/bin/pedelec-core
Size:               4096 kB
Rss:                1352 kB
Anonymous:             0 kB
VmFlags: rd mr mw me dw sd
5567aa400000-5567ab200000 r-xp 00400000 fd:01 131 /opt/pedelec/bin/pedelec-core
Size:              14336 kB
Rss:                5516 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me dw sd
5567ab200000-5567ab270000 r--p 01200000 fd:01 131 /opt/pedelec/bin/pedelec-core
Size:                448 kB
Rss:                 448 kB
Anonymous:           448 kB
VmFlags: rd mr mw me dw ac sd
5567ab270000-5567ab272000 rw-p 01270000 fd:01 131 /opt/pedelec/bin/pedelec-core
Size:                  8 kB
Rss:                   8 kB
Anonymous:             8 kB
VmFlags: rd wr mr mw me dw ac sd
5567ac000000-5567ac054000 rw-p 00000000 00:00 0                          [heap]
Size:                336 kB
Rss:                 336 kB
Anonymous:           336 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000008000 rw-s 00000000 fd:01 77 /state/sessions.sqlite3-shm
Size:                 32 kB
Rss:                  32 kB
Anonymous:             0 kB
VmFlags: rd wr sh mr mw me ms sd
7f0000100000-7f0000280000 r-xp 00028000 fd:01 88 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1536 kB
Rss:                1004 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
7f0000300000-7f0000301000 r--p 00000000 fd:01 99 /home/a user/unused font.ttf
Size:                  4 kB
Rss:                   0 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Size:                  8 kB
Rss:                   4 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me de sd
";

    #[cfg(target_os = "linux")]
    #[test]
    fn only_clean_read_only_file_mappings_are_dropped() {
        let all: Vec<_> = mappings(SMAPS).collect();
        assert_eq!(all.len(), 9);
        assert_eq!(all[7].path, "/home/a user/unused font.ttf");
        assert_eq!((all[1].start, all[1].len, all[1].rss_kib), (0x5567aa400000, 14336 * 1024, 5516));
        let dropped: Vec<_> = all.iter().filter(|m| m.droppable()).map(|m| (m.perms, m.path, m.rss_kib)).collect();
        assert_eq!(
            dropped,
            [
                ("r--p", "/opt/pedelec/bin/pedelec-core", 1352),
                ("r-xp", "/opt/pedelec/bin/pedelec-core", 5516),
                ("r-xp", "/usr/lib/x86_64-linux-gnu/libc.so.6", 1004),
            ],
            "never the relocated RELRO segment, .data, the heap, a shared mapping, an unmapped file or the vdso"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapping_that_does_not_parse_is_left_alone() {
        let broken = "zz-5567aa400000 r-xp 0 fd:01 131 /bin/x\nRss: 4 kB\nAnonymous: 0 kB\n\
                      1000-2000 r-xp 0 fd:01 131 /bin/y\nRss: many kB\nAnonymous: 0 kB\n\
                      3000-4000 r-xp 0 fd:01 131 /bin/z\nRss: 4 kB\n";
        assert_eq!(mappings(broken).count(), 0, "no header, an unreadable Rss, no Anonymous line");
    }

    #[test]
    fn a_trim_comes_once_per_quiet_spell_after_work_mapped_pages_again() {
        let ms = Duration::from_millis;
        let mut quiet = QuietTrim::default();
        assert!(!quiet.tick(ms(50), 5_000), "the first tick has nothing to compare with");
        assert!(!quiet.tick(ms(300), 6_000), "busy: 250 ms of CPU in the tick");
        assert!(quiet.tick(ms(302), 6_010), "quiet, with pages faulted in since start");
        quiet.trimmed(ms(303), 6_020);
        assert!(!quiet.tick(ms(304), 6_030), "still quiet, but nothing was mapped again");
        assert!(!quiet.tick(ms(900), 7_000), "work again");
        assert!(quiet.tick(ms(901), 7_001), "quiet after it: trim again");
    }
}
