//! Agent processes shared by the sessions of one site: one process of a
//! provider serves up to [`MAX_SESSIONS`] of an origin's sessions at once
//! (codex app-server threads, ACP sessions); another origin's sessions
//! never share it. Within one site, a session whose reader falls behind
//! stalls the process it shares (Core stops reading its stdout), and a
//! crash ends every session's turn on it: both stay within the site.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::ProviderFailure;
use super::warm::{WarmPool, Warmable};

/// Sessions one process serves at once; one more starts another process.
pub const MAX_SESSIONS: usize = 16;

/// A process sessions can share.
pub trait Shareable: Send + Sync {
    fn pid(&self) -> Option<u32>;
    /// Whether it still runs and is read.
    fn alive(&self) -> bool;
    /// Sessions using it now.
    fn users(&self) -> usize;
    /// Whether it takes (another runtime of) `session`.
    fn takes(&self, _session: Option<&str>) -> bool {
        true
    }
}

/// A provider's running shared processes, per origin.
pub struct Shared<C>(Mutex<HashMap<String, Vec<Weak<C>>>>);

impl<C> Default for Shared<C> {
    fn default() -> Self {
        Shared(Mutex::default())
    }
}

impl<C: Shareable> Shared<C> {
    /// A running process of `origin` with room for one more session, that
    /// takes `session` (the agent's own id for it, when it has one).
    pub fn find(&self, origin: &str, session: Option<&str>) -> Option<Arc<C>> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let processes = all.get_mut(origin)?;
        processes.retain(|p| p.upgrade().is_some_and(|p| Shareable::alive(p.as_ref())));
        processes.iter().filter_map(Weak::upgrade).find(|p| p.users() < MAX_SESSIONS && p.takes(session))
    }

    /// `process` serves `origin`'s sessions from now on (while it lives).
    pub fn add(&self, origin: &str, process: &Arc<C>) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, processes| {
            processes.retain(|p| p.strong_count() > 0);
            !processes.is_empty()
        });
        all.entry(origin.to_owned()).or_default().push(Arc::downgrade(process));
    }
}

/// A shared process kept warm: it is one before any session uses it.
impl<C: Shareable + 'static> Warmable for Arc<C> {
    fn pid(&self) -> Option<u32> {
        Shareable::pid(&**self)
    }
    fn alive(&mut self) -> bool {
        Shareable::alive(&**self)
    }
}

/// The process a session of `origin` opens on: the site's running one that
/// takes `session`; else the provider's warm one; else one `start` makes
/// (either way the pool starts the next warm one shortly after, so the
/// next site does not wait).
/// A process taken or made serves the site from then on.
pub async fn process_for<C: Shareable + 'static>(
    shared: &Shared<C>,
    warm: Option<&Weak<WarmPool<Arc<C>>>>,
    origin: &str,
    session: Option<&str>,
    start: impl std::future::Future<Output = Result<Arc<C>, ProviderFailure>>,
) -> Result<Arc<C>, ProviderFailure> {
    if let Some(running) = shared.find(origin, session) {
        tracing::debug!(%origin, "a session on the site's running agent");
        return Ok(running);
    }
    let pool = warm.and_then(Weak::upgrade);
    let process = match pool.as_ref().and_then(|pool| pool.take()) {
        Some(process) => {
            tracing::debug!(%origin, "took the warm agent");
            process
        }
        // `take` already asked for the next warm one, a moment from now.
        None => start.await?,
    };
    shared.add(origin, &process);
    Ok(process)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[derive(Default)]
    struct Fake {
        dead: AtomicBool,
        users: AtomicUsize,
    }

    impl Shareable for Fake {
        fn pid(&self) -> Option<u32> {
            None
        }
        fn alive(&self) -> bool {
            !self.dead.load(Ordering::SeqCst)
        }
        fn users(&self) -> usize {
            self.users.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_site_finds_its_own_live_process_with_room() {
        let shared = Shared::<Fake>::default();
        let one = Arc::new(Fake::default());
        shared.add("https://a.example", &one);
        assert!(Arc::ptr_eq(&shared.find("https://a.example", None).unwrap(), &one));
        assert!(shared.find("https://b.example", None).is_none(), "never another site's");
        one.users.store(MAX_SESSIONS, Ordering::SeqCst);
        assert!(shared.find("https://a.example", None).is_none(), "full");
        one.users.store(1, Ordering::SeqCst);
        one.dead.store(true, Ordering::SeqCst);
        assert!(shared.find("https://a.example", None).is_none(), "dead");
        let two = Arc::new(Fake::default());
        shared.add("https://a.example", &two);
        drop(two);
        assert!(shared.find("https://a.example", None).is_none(), "gone with its last session");
    }
}
