//! Warm agent processes: per provider, one process already started and
//! initialised (as far as it goes without a workspace), which the next
//! session's first turn takes instead of paying the agent's start-up.
//!
//! **Which.** A provider whose kind can take its session's workspace after
//! start ([`can_warm`]: ACP, where `session/new` names the cwd) and that
//! config.toml marks `warm = true`, or the default provider when it says
//! nothing.
//!
//! **Life.** [`WarmPool::refill`] starts one in the background when none is
//! ready or starting: at Core start, and [`REFILL_DELAY`] after a session
//! started a runtime (taking the warm one, or starting cold because there
//! was none).
//! A start that fails leaves the pool `FAILED` with the reason, and nothing
//! retries until the next session asks. A ready process is ended after
//! `warm_idle_timeout_secs` without a taker (`REAPED`), and is not kept at
//! all when its resident memory is over `warm_max_rss_mib`. One found dead
//! when taken is dropped and the session starts cold.
//!
//! **Room.** A warm process holds a place under `max_agent_processes` like
//! any agent process, so it is only started while two places are free, and
//! a session's process that finds none free ends a warm one first
//! ([`evict_one`]): a warm process never refuses a session.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pedelec_protocol::pb;

use super::BoxFuture;
use crate::settings::ProviderKind;

/// How warm processes are kept (config.toml's `warm_*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmLimits {
    /// A ready process nobody took for this long is ended; `None`: never.
    pub idle: Option<Duration>,
    /// Resident bytes above which a started process is not kept.
    pub max_rss: u64,
}

impl Default for WarmLimits {
    fn default() -> Self {
        WarmLimits { idle: Some(Duration::from_secs(600)), max_rss: 1 << 30 }
    }
}

/// Whether a provider of this kind can be kept warm: its process must take
/// the session's workspace, tools and identity after it started. An ACP
/// agent does (`session/new` carries cwd and MCP servers), and so does
/// codex app-server (`thread/start` carries cwd and the MCP server with
/// its environment). The claude CLI takes them on its command line;
/// scripted and openai start nothing.
pub fn can_warm(kind: ProviderKind) -> bool {
    matches!(kind, ProviderKind::Acp | ProviderKind::Codex)
}

/// A new, private, empty folder for a shared or warm agent process to run
/// in: the agent works where each session says (`session/new`,
/// `thread/start`), so its process cwd is never a folder of the user's, nor
/// one session's workspace another session could reach through it. A
/// fresh random name, never one another user could have made first, mode
/// 0700 where the system has modes. It goes when the process's owner drops
/// it (if the agent left nothing there).
#[derive(Debug)]
pub struct PrivateFolder(std::path::PathBuf);

impl PrivateFolder {
    pub fn new(code: &str) -> std::io::Result<PrivateFolder> {
        let folder = std::env::temp_dir().join(format!("pedelec-agent-{code}-{}", uuid::Uuid::new_v4().simple()));
        #[cfg(unix)]
        let builder = {
            let mut builder = std::fs::DirBuilder::new();
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder
        };
        // Elsewhere the folder inherits the temp folder's access (the user's own on Windows).
        #[cfg(not(unix))]
        let builder = std::fs::DirBuilder::new();
        builder.create(&folder)?;
        Ok(PrivateFolder(folder))
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// The refusal of an agent that cannot get one.
    pub fn failure(error: std::io::Error) -> super::ProviderFailure {
        super::ProviderFailure::crashed(format!("cannot make the agent's private folder: {error}"))
    }
}

impl Drop for PrivateFolder {
    fn drop(&mut self) {
        // Only if empty: what an agent wrote there stays for the user to see.
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// How long a warm agent may take to start and initialise.
pub const START_WAIT: Duration = Duration::from_secs(60);

/// How long after a session took the ready process (or started cold) the
/// next one starts: an agent's start-up is seconds of CPU, which on a small
/// machine would otherwise slow the very turn the warm process was for.
pub const REFILL_DELAY: Duration = Duration::from_secs(2);

/// A process a pool keeps.
pub trait Warmable: Send + 'static {
    fn pid(&self) -> Option<u32>;
    /// Whether it still runs (it may have exited while it waited).
    fn alive(&mut self) -> bool;
}

type Start<T> = Box<dyn Fn() -> BoxFuture<'static, Result<T, String>> + Send + Sync>;

/// One provider's warm process.
pub struct WarmPool<T: Warmable> {
    limits: WarmLimits,
    start: Start<T>,
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    ready: Option<T>,
    starting: bool,
    /// Counts processes made ready, so a reaper only ends its own.
    generation: u64,
    status: pb::WarmProcess,
}

impl<T: Warmable> WarmPool<T> {
    /// A pool that starts processes with `start`; it starts none until asked.
    pub fn new(
        limits: WarmLimits,
        start: impl Fn() -> BoxFuture<'static, Result<T, String>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        let pool = Arc::new(WarmPool {
            limits,
            start: Box::new(start),
            inner: Mutex::new(Inner {
                ready: None,
                starting: false,
                generation: 0,
                status: pb::WarmProcess { state: pb::WarmState::Idle as i32, ..Default::default() },
            }),
        });
        let evictable: Weak<dyn Evict> = Arc::downgrade(&(pool.clone() as Arc<dyn Evict>));
        let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|p| p.strong_count() > 0);
        pools.push(evictable);
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the pool holds now, for `ListAgents` and `doctor`.
    pub fn status(&self) -> pb::WarmProcess {
        self.lock().status.clone()
    }

    /// The ready process, if there is one that still runs; a new one is
    /// started in the background either way, [`REFILL_DELAY`] later.
    pub fn take(self: &Arc<Self>) -> Option<T> {
        let taken = {
            let mut inner = self.lock();
            let taken = inner.ready.take();
            if taken.is_some() {
                inner.status = pb::WarmProcess { state: pb::WarmState::Idle as i32, ..Default::default() };
            }
            taken
        };
        let taken = taken.and_then(|mut process| {
            if process.alive() {
                Some(process)
            } else {
                tracing::info!("the warm agent process had exited; this session starts one");
                None
            }
        });
        self.refill_after(REFILL_DELAY);
        taken
    }

    /// [`WarmPool::refill`] once `delay` has passed (and the pool is still there).
    fn refill_after(self: &Arc<Self>, delay: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(pool) = pool.upgrade() {
                pool.refill();
            }
        });
    }

    /// Starts a process in the background unless one is ready or starting.
    pub fn refill(self: &Arc<Self>) {
        {
            let mut inner = self.lock();
            if inner.starting || inner.ready.is_some() {
                return;
            }
            if !crate::quota::AGENT_PROCESSES.has_room_for_warm() {
                inner.status = failed("max_agent_processes leaves no room for a warm process");
                return;
            }
            inner.starting = true;
            inner.status = pb::WarmProcess { state: pb::WarmState::Starting as i32, ..Default::default() };
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lock().starting = false;
            return;
        };
        let started = (self.start)();
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            let result = started.await;
            // The provider went (settings replaced): its process goes too.
            let Some(pool) = pool.upgrade() else { return };
            pool.settle(result);
        });
    }

    fn settle(self: &Arc<Self>, result: Result<T, String>) {
        let mut process = match result {
            Ok(process) => process,
            Err(reason) => {
                tracing::info!(%reason, "no warm agent process");
                let mut inner = self.lock();
                inner.starting = false;
                inner.status = failed(&reason);
                return;
            }
        };
        let pid = process.pid();
        let rss = pid.and_then(resident_bytes);
        if let Some(rss) = rss.filter(|rss| *rss > self.limits.max_rss) {
            let reason = format!(
                "its resident memory, {} MiB, is over warm_max_rss_mib ({} MiB)",
                rss >> 20,
                self.limits.max_rss >> 20
            );
            tracing::info!(%reason, "a warm agent process was not kept");
            drop(process);
            let mut inner = self.lock();
            inner.starting = false;
            inner.status = failed(&reason);
            return;
        }
        if !process.alive() {
            let mut inner = self.lock();
            inner.starting = false;
            inner.status = failed("it exited right after it started");
            return;
        }
        let generation = {
            let mut inner = self.lock();
            inner.starting = false;
            inner.generation += 1;
            inner.ready = Some(process);
            inner.status = pb::WarmProcess {
                state: pb::WarmState::Ready as i32,
                pid: pid.unwrap_or_default(),
                rss_bytes: rss.unwrap_or_default(),
                ready_since_ms: crate::clock::now_ms(),
                reason: String::new(),
            };
            inner.generation
        };
        tracing::info!(?pid, ?rss, "a warm agent process is ready");
        if let Some(idle) = self.limits.idle {
            let pool = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(idle).await;
                let Some(pool) = pool.upgrade() else { return };
                let reaped = {
                    let mut inner = pool.lock();
                    if inner.generation != generation || inner.ready.is_none() {
                        return;
                    }
                    inner.status = pb::WarmProcess {
                        state: pb::WarmState::Reaped as i32,
                        reason: format!("no session took it for {} s (warm_idle_timeout_secs)", idle.as_secs()),
                        ..Default::default()
                    };
                    inner.ready.take()
                };
                tracing::info!("ended the warm agent process: idle");
                drop(reaped);
            });
        }
    }
}

/// What a provider's pool (if it keeps one) is doing: OFF without one.
pub fn status_of<T: Warmable>(pool: Option<&Arc<WarmPool<T>>>) -> pb::WarmProcess {
    match pool {
        Some(pool) => pool.status(),
        None => pb::WarmProcess { state: pb::WarmState::Off as i32, ..Default::default() },
    }
}

/// Starts a provider's warm process, if it keeps one and its program is there.
pub fn warm_up<T: Warmable>(pool: Option<&Arc<WarmPool<T>>>, available: bool) {
    if let Some(pool) = pool
        && available
    {
        pool.refill();
    }
}

fn failed(reason: &str) -> pb::WarmProcess {
    pb::WarmProcess { state: pb::WarmState::Failed as i32, reason: reason.to_owned(), ..Default::default() }
}

/// A pool whose ready process can be ended to make room.
trait Evict: Send + Sync {
    fn evict(&self) -> bool;
}

impl<T: Warmable> Evict for WarmPool<T> {
    fn evict(&self) -> bool {
        let evicted = {
            let mut inner = self.lock();
            let evicted = inner.ready.take();
            if evicted.is_some() {
                inner.status = failed("ended to make room under max_agent_processes");
            }
            evicted
        };
        evicted.is_some()
    }
}

/// Every pool of this Core, for [`evict_one`].
static POOLS: Mutex<Vec<Weak<dyn Evict>>> = Mutex::new(Vec::new());

/// Ends one ready warm process, so a session's process gets its place
/// under `max_agent_processes`; false when none was ready.
pub fn evict_one() -> bool {
    let pools: Vec<Arc<dyn Evict>> =
        POOLS.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
    pools.iter().any(|pool| pool.evict())
}

/// The resident memory of process `pid`, where the system tells it.
fn resident_bytes(pid: u32) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages * u64::try_from(page).ok()?)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        alive: bool,
        dropped: Arc<AtomicUsize>,
    }

    impl Warmable for Fake {
        fn pid(&self) -> Option<u32> {
            None
        }
        fn alive(&mut self) -> bool {
            self.alive
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn pool(idle: Option<Duration>, alive: bool) -> (Arc<WarmPool<Fake>>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let started = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (s, d) = (started.clone(), dropped.clone());
        let pool = WarmPool::new(WarmLimits { idle, max_rss: u64::MAX }, move || {
            s.fetch_add(1, Ordering::SeqCst);
            let dropped = d.clone();
            Box::pin(async move { Ok(Fake { alive, dropped }) })
        });
        (pool, started, dropped)
    }

    async fn settled(pool: &WarmPool<Fake>) -> pb::WarmState {
        for _ in 0..100 {
            let state = pool.status().state();
            if state != pb::WarmState::Starting {
                return state;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the pool never settled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_taken_process_is_replaced_and_an_idle_one_reaped() {
        let (pool, started, dropped) = pool(Some(Duration::from_millis(100)), true);
        assert_eq!(pool.status().state(), pb::WarmState::Idle, "nothing starts until asked");
        pool.refill();
        assert_eq!(settled(&pool).await, pb::WarmState::Ready);
        let taken = pool.take().expect("the ready process");
        tokio::time::sleep(REFILL_DELAY / 2).await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "not while the taker's turn starts");
        tokio::time::sleep(REFILL_DELAY / 2 + Duration::from_millis(1)).await;
        assert_eq!(settled(&pool).await, pb::WarmState::Ready, "taking starts the next");
        assert_eq!(started.load(Ordering::SeqCst), 2);
        drop(taken);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(pool.status().state(), pb::WarmState::Reaped);
        assert_eq!(dropped.load(Ordering::SeqCst), 2, "the idle one was ended");
        assert!(pool.take().is_none(), "nothing ready after the reap");
    }

    #[tokio::test]
    async fn a_dead_process_is_not_handed_out() {
        let (pool, _, dropped) = pool(None, false);
        pool.refill();
        assert_eq!(settled(&pool).await, pb::WarmState::Failed);
        assert!(pool.take().is_none());
        assert!(dropped.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test]
    async fn a_failed_start_says_why_and_eviction_ends_a_ready_one() {
        let failing = WarmPool::<Fake>::new(WarmLimits::default(), || Box::pin(async { Err("no program".into()) }));
        failing.refill();
        assert_eq!(settled(&failing).await, pb::WarmState::Failed);
        assert_eq!(failing.status().reason, "no program");

        let (pool, _, dropped) = pool(None, true);
        pool.refill();
        assert_eq!(settled(&pool).await, pb::WarmState::Ready);
        assert!(pool.evict());
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert!(pool.take().is_none());
    }
}
