//! An agent's whole process tree: started so Core can end all of it, and
//! ended on `end()`, a timeout, or Core's exit.
//!
//! - **Unix**: the agent leads its own process group. Ending it is SIGTERM
//!   to the group, SIGKILL after a grace. On Linux the leader also gets
//!   SIGTERM when Core dies, and the next Core ends groups a dead one left
//!   ([`crate::providers::reaper`]).
//! - **Windows**: the agent is put in a Job Object of its own that kills
//!   every process in it when its last handle closes, so Core's exit, even
//!   a killed Core, takes the tree with it. Windows has no SIGTERM for a
//!   process without a console, so ending it is at once. The agent is
//!   created suspended and only resumed once it is in its job, so not even
//!   a child it starts at once can escape.

use std::process::ExitStatus;

#[cfg(unix)]
pub use unix::{Tree, adopt, prepare};
#[cfg(windows)]
pub use windows::{Tree, adopt, prepare};

/// Ends the agent trees a previous Core left running (Unix: its recorded
/// process groups); how many there were. On Windows a dead Core's jobs
/// already took their trees with them.
pub fn end_leftovers(state_dir: &std::path::Path) -> usize {
    #[cfg(unix)]
    return crate::providers::reaper::init(state_dir);
    #[cfg(windows)]
    {
        let _ = state_dir;
        0
    }
}

/// The signal that ended a process, where the OS has signals.
pub fn exit_signal(status: &ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    return std::os::unix::process::ExitStatusExt::signal(status);
    #[cfg(windows)]
    {
        let _ = status;
        None
    }
}

#[cfg(unix)]
mod unix {
    use std::time::Duration;

    use nix::sys::signal::Signal;

    use crate::providers::reaper::{self, Group};

    /// How long a process group gets between SIGTERM and SIGKILL.
    const KILL_GRACE: Duration = Duration::from_millis(1500);

    /// An agent's process group.
    pub struct Tree(Group);

    /// Linux: the agent's leader gets SIGTERM when Core dies. Ending a session
    /// signals the agent's group a moment later (and SIGKILLs it after a grace),
    /// from Core; if Core dies first — stopped right after `end()`, or `kill -9`
    /// — those signals never come, and ACP agents (codex-acp, claude-agent-acp,
    /// gemini) were seen living on. SIGTERM, not SIGKILL: an agent that saves its
    /// session on the way out (claude-agent-acp) must still be resumable by the
    /// next Core, which also ends whatever is left ([`reaper`]). The
    /// signal follows the spawning thread; Core spawns agents from its runtime's
    /// worker threads, which live as long as Core.
    #[cfg(target_os = "linux")]
    fn die_with_core(cmd: &mut tokio::process::Command) {
        let core = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec only async-signal-safe calls are made
        // (prctl, getppid, _exit), with no allocation.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Core died between fork and prctl: the signal will never come.
                if libc::getppid() != core {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }

    /// macOS has no parent-death signal; the next Core's reaper is what is left.
    #[cfg(not(target_os = "linux"))]
    fn die_with_core(_cmd: &mut tokio::process::Command) {}

    /// The agent leads a process group of its own.
    pub fn prepare(cmd: &mut tokio::process::Command) {
        cmd.process_group(0);
        die_with_core(cmd);
    }

    /// The started agent's group, recorded for the next Core's reaper.
    pub fn adopt(child: &tokio::process::Child) -> Option<Tree> {
        let group = Group::of(child.id()? as i32);
        reaper::record(group.pgid);
        Some(Tree(group))
    }

    impl Tree {
        /// SIGTERM now, SIGKILL after [`KILL_GRACE`]; the SIGKILL only while the
        /// group id is still ours, so it never reaches a group that reused the id
        /// after ours was gone ([`Group`]).
        pub fn terminate(self) {
            let group = self.0;
            group.signal(Signal::SIGTERM);
            std::thread::spawn(move || {
                std::thread::sleep(KILL_GRACE);
                group.signal(Signal::SIGKILL);
                reaper::forget(group.pgid);
            });
        }
    }
}

#[cfg(windows)]
mod windows {
    use std::ffi::c_void;
    use std::ptr::null;

    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, INVALID_HANDLE_VALUE};
    use windows_sys::Win32::System::Diagnostics::ToolHelp::{
        CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
    };
    use windows_sys::Win32::System::JobObjects::{
        AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
        JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectExtendedLimitInformation, SetInformationJobObject,
        TerminateJobObject,
    };
    use windows_sys::Win32::System::Threading::{
        CREATE_NO_WINDOW, CREATE_SUSPENDED, OpenThread, ResumeThread, THREAD_SUSPEND_RESUME,
    };

    /// An agent's Job Object; dropping it (its only handle) kills the tree.
    pub struct Tree(HANDLE);

    // SAFETY: a job handle may be used and closed from any thread.
    unsafe impl Send for Tree {}
    unsafe impl Sync for Tree {}

    /// No console window for the agent (Core has none to share), and
    /// created suspended: nothing of it runs before [`adopt`] put it in
    /// its job.
    pub fn prepare(cmd: &mut tokio::process::Command) {
        cmd.creation_flags(CREATE_NO_WINDOW | CREATE_SUSPENDED);
    }

    /// A fresh kill-on-close job holding the started agent, which is then
    /// resumed (in every case: a process left suspended would hang its turn).
    pub fn adopt(child: &tokio::process::Child) -> Option<Tree> {
        let tree = child.raw_handle().and_then(|process| job_holding(process as HANDLE));
        if let Some(pid) = child.id() {
            resume(pid);
        }
        tree
    }

    /// Resumes the threads of process `pid` (one, for a process created
    /// suspended), found through a thread snapshot: std keeps the thread
    /// handle CreateProcess returned to itself.
    fn resume(pid: u32) {
        // SAFETY: the snapshot and each thread handle are owned here and
        // closed; the entry is a plain struct of the size it declares.
        unsafe {
            let snapshot = CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
            if snapshot == INVALID_HANDLE_VALUE {
                tracing::warn!(error = %std::io::Error::last_os_error(), pid, "cannot resume an agent");
                return;
            }
            let mut entry = THREADENTRY32 { dwSize: std::mem::size_of::<THREADENTRY32>() as u32, ..Default::default() };
            let mut more = Thread32First(snapshot, &mut entry) != 0;
            while more {
                if entry.th32OwnerProcessID == pid {
                    let thread = OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID);
                    if !thread.is_null() {
                        ResumeThread(thread);
                        CloseHandle(thread);
                    }
                }
                more = Thread32Next(snapshot, &mut entry) != 0;
            }
            CloseHandle(snapshot);
        }
    }

    fn job_holding(process: HANDLE) -> Option<Tree> {
        // SAFETY: plain Win32 calls on handles this function owns or borrows
        // for the call; the job is closed on every failure path.
        unsafe {
            let job = CreateJobObjectW(null(), null());
            if job.is_null() {
                tracing::warn!(error = %std::io::Error::last_os_error(), "cannot create a job for an agent");
                return None;
            }
            let tree = Tree(job);
            let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = std::mem::zeroed();
            limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
            let set = SetInformationJobObject(
                job,
                JobObjectExtendedLimitInformation,
                (&limits as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast::<c_void>(),
                std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
            );
            if set == 0 || AssignProcessToJobObject(job, process) == 0 {
                tracing::warn!(error = %std::io::Error::last_os_error(), "cannot put an agent in its job");
                return None;
            }
            Some(tree)
        }
    }

    impl Tree {
        /// Ends every process in the job now.
        pub fn terminate(self) {
            // SAFETY: the handle is this tree's own, closed by drop after.
            unsafe { TerminateJobObject(self.0, 1) };
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            // SAFETY: the handle came from CreateJobObjectW and is closed once.
            unsafe { CloseHandle(self.0) };
        }
    }
}
