//! Agent process groups a dead Core left behind, ended by the next Core.
//!
//! Core ends an agent's whole process group itself (SIGTERM, SIGKILL after a
//! grace), and on Linux an agent's leader dies with Core. But a Core that
//! dies — `kill -9`, or stopped right after `end()` — sends neither signal,
//! and an agent's children can outlive their leader (codex-acp's node shim
//! dies with Core; the native binary it started was seen living on). So
//! Core records each group it starts as a file `agents/<pgid>` in its state
//! dir, holding the leader's start time, removes it once the group has had
//! its SIGKILL, and at start-up ends every group still recorded (SIGTERM,
//! then SIGKILL after a grace, in the background).
//!
//! A recorded group is only signalled while it can still be ours: a live
//! leader must have the recorded start time (a reused pid is someone
//! else's); with the leader gone, the group id cannot have been reused while
//! any member lives, so signalling it reaches only our leftovers.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// How long a left-over group gets between SIGTERM and SIGKILL.
const LEFTOVER_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);

/// The leader's start time (clock ticks after boot, field 22 of /proc/PID/stat).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Ends the groups a previous Core recorded in `state_dir/agents`, then
/// records this Core's groups there. Returns how many groups were still
/// there (they are ended in the background: SIGTERM, then SIGKILL).
pub fn init(state_dir: &Path) -> usize {
    let dir = state_dir.join("agents");
    let mut ended = 0;
    let mut leftovers = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Some(pgid) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let recorded = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<u64>().ok());
        let ours = match start_time(pgid) {
            Some(now) => Some(now) == recorded,
            None => true,
        };
        // SAFETY: kill(2) on a negative pid signals a process group; signal 0 only asks whether it exists.
        if pgid > 1 && ours && unsafe { libc::kill(-pgid, 0) } == 0 {
            ended += 1;
            leftovers.push(pgid);
        }
        let _ = std::fs::remove_file(&path);
    }
    if !leftovers.is_empty() {
        // They had SIGTERM when the old Core died (see `process::die_with_core`)
        // and may be saving their sessions for the resume that is about to
        // come: a grace first, SIGKILL after, off the start-up path.
        std::thread::spawn(move || {
            for &pgid in &leftovers {
                // SAFETY: as above.
                unsafe { libc::kill(-pgid, libc::SIGTERM) };
            }
            std::thread::sleep(LEFTOVER_GRACE);
            for pgid in leftovers {
                // SAFETY: as above.
                if unsafe { libc::kill(-pgid, libc::SIGKILL) } == 0 {
                    tracing::info!(pgid, "ended an agent process group a previous Core left running");
                }
            }
        });
    }
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = DIR.set(dir);
    }
    ended
}

/// Remembers a group this Core started (no-op before [`init`], e.g. in tests of parsers).
pub(crate) fn record(pgid: i32) {
    if let (Some(dir), Some(started)) = (DIR.get(), start_time(pgid)) {
        let _ = std::fs::write(dir.join(pgid.to_string()), started.to_string());
    }
}

/// The group has had its SIGKILL: nothing is left to end.
pub(crate) fn forget(pgid: i32) {
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_file(dir.join(pgid.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep").arg("60").process_group(0).spawn().expect("sleep starts")
    }

    fn alive(child: &mut std::process::Child) -> bool {
        // Reaped by try_wait once it died; zombies do not count.
        child.try_wait().expect("try_wait").is_none()
    }

    #[test]
    fn recorded_groups_are_ended_and_reused_pids_are_left_alone() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("agents");
        std::fs::create_dir_all(&dir).unwrap();
        let mut ours = sleeper();
        let mut stranger = sleeper();
        let ours_pid = ours.id() as i32;
        let stranger_pid = stranger.id() as i32;
        std::fs::write(dir.join(ours_pid.to_string()), start_time(ours_pid).unwrap().to_string()).unwrap();
        // Same pid, another start time: a recycled pid that is not ours.
        std::fs::write(dir.join(stranger_pid.to_string()), (start_time(stranger_pid).unwrap() + 1).to_string())
            .unwrap();
        std::fs::write(dir.join("not-a-pid"), "1").unwrap();

        assert_eq!(init(state.path()), 1);
        // SIGTERM ends `sleep` at once; the SIGKILL after the grace is for those that linger.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!alive(&mut ours), "the recorded group was ended");
        assert!(alive(&mut stranger), "a pid with another start time is not ours");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, ["not-a-pid"], "every record was consumed; what is not one is left alone");
        let _ = stranger.kill();
        let _ = stranger.wait();
    }
}
