//! [`Calm`]: how much work for nothing a client may make a connection do before it is told
//! ENHANCE_YOUR_CALM and closed. Streams it resets before their answer (rapid reset,
//! CVE-2023-44487), stream errors it provokes (MadeYouReset, CVE-2025-8671), and control
//! frames that bring no request (SETTINGS, PING, empty DATA, PRIORITY, window updates of
//! closed streams) each spend from a budget that refills with time and with every answer the
//! connection completes: a client doing real work never runs out, one that floods does in a
//! moment, whatever the flood is made of.

use sluice_h2::Reason;
use tokio::time::Instant;

/// The budget's size: a burst a client may make at once.
const BUDGET: u32 = 1_000;

/// How fast it refills on its own: a gRPC client's keepalive PINGs and its resets are well
/// within it.
const REFILL_PER_SECOND: u32 = 100;

/// A connection's budget for work that brings no answer.
#[derive(Debug)]
pub(super) struct Calm {
    left: u32,
    since: Instant,
}

impl Default for Calm {
    fn default() -> Self {
        Self {
            left: BUDGET,
            since: Instant::now(),
        }
    }
}

impl Calm {
    /// Spends `n`; `Err(ENHANCE_YOUR_CALM)` when the budget is gone.
    pub(super) fn spend(&mut self, n: u32) -> Result<(), Reason> {
        if self.left < n {
            self.refill();
        }
        match self.left.checked_sub(n) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(Reason::ENHANCE_YOUR_CALM),
        }
    }

    /// An answer completed: the client did real work.
    pub(super) fn answered(&mut self) {
        self.left = (self.left + 1).min(BUDGET);
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.since);
        let earned = elapsed.as_millis() * u128::from(REFILL_PER_SECOND) / 1000;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.left = self.left.saturating_add(earned).min(BUDGET);
            self.since = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_runs_out_and_time_and_answers_refill() {
        let mut calm = Calm::default();
        for _ in 0..BUDGET {
            assert_eq!(calm.spend(1), Ok(()));
        }
        assert_eq!(calm.spend(1), Err(Reason::ENHANCE_YOUR_CALM));
        calm.answered();
        assert_eq!(calm.spend(1), Ok(()));
        assert_eq!(calm.spend(1), Err(Reason::ENHANCE_YOUR_CALM));
        tokio::time::advance(Duration::from_millis(100)).await;
        for _ in 0..10 {
            assert_eq!(calm.spend(1), Ok(()));
        }
        assert_eq!(calm.spend(1), Err(Reason::ENHANCE_YOUR_CALM));
    }
}
