//! Keeps a frontend tool call that reaches Core over the MCP bridge behind
//! the agent's own report of that call.
//!
//! Some agents report each call of a tool in their output stream before they
//! make it (codex app-server's `item/started` for an MCP call). The report and
//! the call travel on different pipes: the call can reach Core first and
//! overtake the text the agent streamed before it, so a reader would see the
//! session wait for a tool before the sentence that announced the call. While
//! a turn is *armed*, a bridged call waits for its report, bounded so that an
//! agent that never reports a call still gets it served.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// How long a call waits for the agent's report of it before it is served
/// anyway: far above the pipe's lag, far below any tool's timeout.
pub const REPORT_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct ToolFence {
    state: Mutex<State>,
    reported: Notify,
}

#[derive(Default)]
struct State {
    armed: bool,
    /// Reports not yet matched by a call, per tool name.
    unmatched: HashMap<String, u32>,
}

impl ToolFence {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A turn whose agent reports every call before making it begins;
    /// reports left over from an earlier turn no longer count.
    pub fn arm(&self) {
        let mut state = self.state();
        state.armed = true;
        state.unmatched.clear();
    }

    /// The agent's stream reported a call of `tool`; everything it streamed
    /// before has been applied to the session.
    pub fn report(&self, tool: &str) {
        let mut state = self.state();
        if state.armed {
            *state.unmatched.entry(tool.to_owned()).or_default() += 1;
            drop(state);
            self.reported.notify_waiters();
        }
    }

    /// Waits until the call of `tool` may go on: at once when the turn is
    /// not armed or its report is in (which it then consumes), otherwise
    /// at its report or after `within`.
    pub async fn pass(&self, tool: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let reported = self.reported.notified();
            tokio::pin!(reported);
            // Registered before the check, so a report between the two wakes it.
            reported.as_mut().enable();
            {
                let mut state = self.state();
                if !state.armed {
                    return;
                }
                if let Some(count) = state.unmatched.get_mut(tool).filter(|c| **c > 0) {
                    *count -= 1;
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                tracing::debug!(tool, "the agent did not report its tool call; serving it anyway");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_unarmed_fence_lets_calls_through_at_once() {
        let fence = ToolFence::default();
        let started = tokio::time::Instant::now();
        fence.pass("explode", REPORT_WAIT).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_arrives_first_waits_for_its_report() {
        let fence = Arc::new(ToolFence::default());
        fence.arm();
        let call = tokio::spawn({
            let fence = fence.clone();
            async move { fence.pass("explode", REPORT_WAIT).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!call.is_finished(), "the call waits while its report is missing");
        // A report of another tool does not release it.
        fence.report("update_counter");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!call.is_finished());
        let before = tokio::time::Instant::now();
        fence.report("explode");
        call.await.unwrap();
        assert_eq!(before.elapsed(), Duration::ZERO, "released by the report, not the bound");
        // The other tool's report is still there for its own call.
        let started = tokio::time::Instant::now();
        fence.pass("update_counter", REPORT_WAIT).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn each_report_releases_one_call() {
        let fence = ToolFence::default();
        fence.arm();
        fence.report("explode");
        fence.pass("explode", REPORT_WAIT).await;
        let started = tokio::time::Instant::now();
        fence.pass("explode", REPORT_WAIT).await;
        assert_eq!(started.elapsed(), REPORT_WAIT, "a second call without a report waits out the bound");
    }

    #[tokio::test(start_paused = true)]
    async fn arming_a_new_turn_forgets_the_old_reports() {
        let fence = ToolFence::default();
        fence.arm();
        fence.report("explode");
        fence.arm();
        let started = tokio::time::Instant::now();
        fence.pass("explode", Duration::from_millis(300)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(300));
    }
}
