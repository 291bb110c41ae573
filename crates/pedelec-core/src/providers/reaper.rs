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

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// How long a left-over group gets between SIGTERM and SIGKILL.
const LEFTOVER_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);

/// The leader's start time (clock ticks after boot, field 22 of /proc/PID/stat).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// An agent's process group: its id (the leader's pid) and the leader's
/// start time when Core started it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group {
    pub pgid: i32,
    started: Option<u64>,
}

impl Group {
    /// The group `pgid` leads now.
    pub fn of(pgid: i32) -> Self {
        Group { pgid, started: start_time(pgid) }
    }

    /// Whether the id can still be ours (see the module docs): its leader
    /// is gone, or alive with the start time we saw. A leader alive with
    /// another start time means the id was reused by someone else's group.
    fn still_ours(&self) -> bool {
        self.pgid > 1 && start_time(self.pgid).is_none_or(|now| Some(now) == self.started)
    }

    /// Signals the whole group while it can still be ours; whether the
    /// signal was delivered (false: no such group any more, or not ours).
    pub fn signal(&self, signal: Signal) -> bool {
        self.still_ours() && killpg(Pid::from_raw(self.pgid), signal).is_ok()
    }

    /// Whether the group still has a member (signal 0 checks, sends nothing).
    fn alive(&self) -> bool {
        self.still_ours() && killpg(Pid::from_raw(self.pgid), None).is_ok()
    }
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
        let group = Group { pgid, started: recorded };
        if group.alive() {
            ended += 1;
            leftovers.push(group);
        }
        let _ = std::fs::remove_file(&path);
    }
    if !leftovers.is_empty() {
        // They had SIGTERM when the old Core died (see `process::die_with_core`)
        // and may be saving their sessions for the resume that is about to
        // come: a grace first, SIGKILL after, off the start-up path. The
        // SIGKILL checks again that each id is still ours.
        std::thread::spawn(move || {
            for group in &leftovers {
                group.signal(Signal::SIGTERM);
            }
            std::thread::sleep(LEFTOVER_GRACE);
            for group in leftovers {
                if group.signal(Signal::SIGKILL) {
                    tracing::info!(pgid = group.pgid, "ended an agent process group a previous Core left running");
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

    #[test]
    fn a_delayed_signal_reaches_the_group_only_while_its_id_is_still_ours() {
        let mut child = sleeper();
        let pgid = child.id() as i32;
        // The id as another group would hold it after ours was gone and the
        // pid came round again: a live leader with another start time.
        let reused = Group { pgid, started: start_time(pgid).map(|t| t + 1) };
        assert!(!reused.signal(Signal::SIGKILL), "not ours: nothing is sent");
        assert!(alive(&mut child), "the group that holds the id now lives on");
        let ours = Group::of(pgid);
        assert!(ours.signal(Signal::SIGKILL));
        let _ = child.wait();
        assert!(!ours.signal(Signal::SIGKILL), "a group that is gone is not signalled");
    }
}
