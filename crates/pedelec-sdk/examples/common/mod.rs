//! What the bench examples share: Core's memory figures from `/proc`.

#![allow(dead_code)] // each example uses its own part

/// A `VmRSS`/`VmHWM`-style figure from `/proc/<pid>/status`, in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The anonymous part of RSS (heap, stacks): what sessions allocate, without
/// the binary's own pages that first use of a code path brings in.
pub fn rss_anon_kib(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:")
}

pub fn hwm_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
