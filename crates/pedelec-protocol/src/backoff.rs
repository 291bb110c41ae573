//! How every retry loop waits: one policy type, so each loop states its
//! numbers in one place and they read alike.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use pedelec_protocol::backoff::Backoff;
//!
//! // 100 ms, doubling, at most 1 s apart, four retries after the first try.
//! let policy = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 4);
//! let waits: Vec<u64> = policy.delays().map(|d| d.as_millis() as u64).collect();
//! assert_eq!(waits, [100, 200, 400, 800]);
//! assert_eq!(policy.delay(4), None, "the retries are used up");
//! ```

use std::time::Duration;

/// A first wait that doubles after each retry, up to `max`, for at most
/// `retries` retries after the first try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub retries: u32,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration, retries: u32) -> Self {
        Backoff { first, max, retries }
    }

    /// The same wait every time: a poll.
    pub const fn constant(every: Duration, retries: u32) -> Self {
        Backoff { first: every, max: every, retries }
    }

    /// The wait before retry `retry` (0 for the first retry), or `None` when
    /// the retries are used up.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        (retry < self.retries).then(|| {
            let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
            self.first.saturating_mul(factor).min(self.max)
        })
    }

    /// Every wait in order.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + '_ {
        (0..self.retries).map_while(|retry| self.delay(retry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_stop_after_the_retries() {
        let policy = Backoff::new(Duration::from_millis(500), Duration::from_secs(10), 3);
        assert_eq!(policy.delays().collect::<Vec<_>>(), [500, 1000, 2000].map(Duration::from_millis));
        let capped = Backoff::new(Duration::from_secs(1), Duration::from_secs(3), 40);
        assert_eq!(capped.delay(39), Some(Duration::from_secs(3)), "no overflow far out");
        assert_eq!(Backoff::constant(Duration::from_millis(10), 2).delays().count(), 2);
        assert_eq!(Backoff::new(Duration::ZERO, Duration::ZERO, 0).delay(0), None);
    }
}
