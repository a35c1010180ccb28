//! [`Tally`]: counts events that could flood the log (a full disk, refused requests, refused
//! registrations) and says when to report them: at the first, then at most once per interval,
//! with how many happened since the last report.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated event is reported by default.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// Events since the last report, and when that was.
#[derive(Debug)]
pub struct Tally {
    interval: Duration,
    count: u64,
    last: Option<Instant>,
}

impl Tally {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            count: 0,
            last: None,
        }
    }

    /// Records `n` events at `now`; `Some(events since the last report)` when one is due.
    pub fn record(&mut self, n: u64, now: Instant) -> Option<u64> {
        self.count += n;
        if self.last.is_some_and(|last| now - last < self.interval) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// A [`Tally`] shared by the tasks that see the events.
#[derive(Debug)]
pub struct SharedTally(Mutex<Tally>);

impl SharedTally {
    /// Reports at most once per [`REPORT_INTERVAL`].
    pub fn new() -> Self {
        Self(Mutex::new(Tally::new(REPORT_INTERVAL)))
    }

    /// Records one event now; `Some(events since the last report)` when one is due.
    pub fn record(&self) -> Option<u64> {
        // The count stays consistent across a panic elsewhere: a poisoned lock is usable.
        let mut tally = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tally.record(1, Instant::now())
    }
}

impl Default for SharedTally {
    fn default() -> Self {
        Self::new()
    }
}

/// One [`Tally`] per kind of event (a refusal's status), so that one kind's flood does not
/// hide the first of another.
#[derive(Debug)]
pub struct TallyByKind<K>(Mutex<HashMap<K, Tally>>);

impl<K: Hash + Eq> TallyByKind<K> {
    /// Reports each kind at most once per [`REPORT_INTERVAL`].
    pub fn new() -> Self {
        Self(Mutex::new(HashMap::new()))
    }

    /// Records one event of `kind` now; `Some(events of that kind since its last report)`
    /// when one is due.
    pub fn record(&self, kind: K) -> Option<u64> {
        let mut tallies = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let tally = tallies
            .entry(kind)
            .or_insert_with(|| Tally::new(REPORT_INTERVAL));
        tally.record(1, Instant::now())
    }
}

impl<K: Hash + Eq> Default for TallyByKind<K> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_at_first_then_once_per_interval_with_the_count() {
        let start = Instant::now();
        let mut tally = Tally::new(Duration::from_secs(10));
        assert_eq!(tally.record(1, start), Some(1));
        for i in 1..100 {
            assert_eq!(tally.record(2, start + Duration::from_millis(i * 50)), None);
        }
        assert_eq!(tally.record(1, start + Duration::from_secs(10)), Some(199));
        assert_eq!(tally.record(1, start + Duration::from_secs(11)), None);
    }
}
