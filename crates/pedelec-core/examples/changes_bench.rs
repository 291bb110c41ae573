//! What `GetChanges` costs in a large workspace: the turn-start snapshot of
//! a 50 000-file folder, and the end-of-turn snapshot plus comparison after
//! a turn that edited 1 000 of its files. The floor is a bare walk that only
//! reads each entry's metadata (what any snapshot must at least do), in the
//! same run. `cargo xtask bench` runs it in release.

use std::path::Path;
use std::time::{Duration, Instant};

use pedelec_core::changes::{Snapshot, compare};

const DIRS: usize = 500;
const FILES_PER_DIR: usize = 100;
const EDITED: usize = 1_000;
const ROUNDS: usize = 5;

fn populate(root: &Path) {
    for d in 0..DIRS {
        let dir = root.join(format!("pkg{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..FILES_PER_DIR {
            let body = format!("// file {d}/{f}\n{}", "fn item() -> u32 { 42 }\n".repeat(8));
            std::fs::write(dir.join(format!("mod{f:03}.rs")), body).unwrap();
        }
    }
}

fn edit(root: &Path, round: usize) {
    for i in 0..EDITED {
        let (d, f) = (i % DIRS, (i / DIRS * 7) % FILES_PER_DIR);
        let path = root.join(format!("pkg{d:03}/mod{f:03}.rs"));
        let mut body = std::fs::read_to_string(&path).unwrap();
        body.push_str(&format!("fn edited_{round}() {{}}\n"));
        std::fs::write(path, body).unwrap();
    }
}

/// The floor: every entry's metadata, nothing read.
fn bare_walk(dir: &Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.path().symlink_metadata().unwrap();
        count += if meta.is_dir() { bare_walk(&entry.path()) } else { 1 };
    }
    count
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    populate(root);
    let mut floors = Vec::new();
    let mut cold = Vec::new();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    let mut listed = 0;
    for round in 0..ROUNDS {
        let started = Instant::now();
        assert_eq!(bare_walk(root), DIRS * FILES_PER_DIR);
        floors.push(started.elapsed());
        // Read ahead when a session is created: every file.
        let started = Instant::now();
        let first = Snapshot::take(root);
        cold.push(started.elapsed());
        // Each turn's start reuses the last snapshot's readings.
        let started = Instant::now();
        let before = Snapshot::take_after(root, Some(&first));
        starts.push(started.elapsed());
        edit(root, round);
        let started = Instant::now();
        let after = Snapshot::take_after(root, Some(&before));
        let (changes, complete) = compare(&before, &after);
        ends.push(started.elapsed());
        assert!(complete);
        listed = changes.len();
    }
    assert_eq!(listed, EDITED, "every edited file is listed");
    let (floor, cold, start, end) = (median(floors), median(cold), median(starts), median(ends));
    let ratio = |d: Duration| d.as_secs_f64() / floor.as_secs_f64();
    println!(
        "changes ({} files, {EDITED} edited; median of {ROUNDS}): floor (metadata walk) {} ms; \
         first reading {} ms ({:.1}× floor; Core does it when the session is created), \
         turn-start snapshot {} ms ({:.1}×) [target < 200 ms]; \
         end-of-turn snapshot + compare {} ms ({:.1}×) [target < 500 ms]",
        DIRS * FILES_PER_DIR,
        floor.as_millis(),
        cold.as_millis(),
        ratio(cold),
        start.as_millis(),
        ratio(start),
        end.as_millis(),
        ratio(end),
    );
}
