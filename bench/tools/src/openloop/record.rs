//! [`Recorder`]: the outcome of every measured request, and the [`Report`] made of them.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::summary::Latency;

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection could not be opened.
    Connect,
    /// No complete response by the scheduled time plus `--timeout-ms`.
    Timeout,
    /// The connection failed or the response was not valid HTTP.
    Io,
}

/// Requests that got no response, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Errors {
    /// The connection could not be opened.
    pub connect: u64,
    /// No complete response within the timeout.
    pub timeout: u64,
    /// The connection failed or the response was not valid HTTP.
    pub io: u64,
}

/// What `openloop` prints: counts over the measured requests (the warmup is left out).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The offered rate, requests per second.
    pub rate: f64,
    /// The measured duration in seconds.
    pub duration_s: f64,
    /// Requests the schedule held.
    pub scheduled: u64,
    /// Requests handed to a connection.
    pub sent: u64,
    /// Requests dropped because `--max-conns` connections were busy (a generator limit).
    pub not_sent: u64,
    /// Requests answered with a complete response, whatever its status.
    pub completed: u64,
    /// Complete responses by status code.
    pub status: BTreeMap<u16, u64>,
    /// 2xx responses complete by the end of the measured window: their count over
    /// `duration_s` is the goodput (responses a queue held past the window are left out).
    pub ok_in_window: u64,
    /// Requests sent but not answered.
    pub errors: Errors,
    /// Latency from the scheduled time to the end of the body, 2xx responses only.
    pub latency_us_ok: Latency,
    /// The same over every complete response.
    pub latency_us_all: Latency,
    /// Connections opened.
    pub conns_opened: u64,
    /// The most connections open at once.
    pub max_open_conns: usize,
    /// The worst lateness in handing a request to a connection; when it nears the latencies,
    /// the generator itself was saturated.
    pub max_lag_us: u64,
}

#[derive(Debug, Default)]
struct Tally {
    not_sent: u64,
    status: BTreeMap<u16, u64>,
    errors: Errors,
    window_end: Option<Instant>,
    ok_in_window: u64,
    ok: Vec<u32>,
    all: Vec<u32>,
}

/// Collects outcomes from every request task.
#[derive(Debug, Default)]
pub(crate) struct Recorder(Mutex<Tally>);

impl Recorder {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self(Mutex::new(Tally {
            all: Vec::with_capacity(n),
            ok: Vec::with_capacity(n),
            ..Tally::default()
        }))
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn not_sent(&self) {
        self.tally().not_sent += 1;
    }

    /// Sets when the measured window ends (its last request's due time).
    pub(crate) fn window_ends(&self, at: Instant) {
        self.tally().window_end = Some(at);
    }

    /// A complete response with `status`, `latency` after its due time, finished `at`.
    pub(crate) fn response(&self, status: u16, latency: Duration, at: Instant) {
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let mut t = self.tally();
        *t.status.entry(status).or_default() += 1;
        t.all.push(us);
        if (200..300).contains(&status) {
            t.ok.push(us);
            if t.window_end.is_none_or(|end| at <= end) {
                t.ok_in_window += 1;
            }
        }
    }

    pub(crate) fn failure(&self, failure: Failure) {
        let mut t = self.tally();
        let counter = match failure {
            Failure::Connect => &mut t.errors.connect,
            Failure::Timeout => &mut t.errors.timeout,
            Failure::Io => &mut t.errors.io,
        };
        *counter += 1;
    }

    /// The report; `scheduled`, the connection counts and the lag come from the dispatcher.
    pub(crate) fn report(&self, rate: f64, duration_s: f64, scheduled: u64) -> Report {
        let mut t = self.tally();
        Report {
            rate,
            duration_s,
            scheduled,
            sent: scheduled - t.not_sent,
            not_sent: t.not_sent,
            completed: t.all.len() as u64,
            status: t.status.clone(),
            ok_in_window: t.ok_in_window,
            errors: t.errors,
            latency_us_ok: Latency::of(&mut t.ok),
            latency_us_all: Latency::of(&mut t.all),
            conns_opened: 0,
            max_open_conns: 0,
            max_lag_us: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_2xx_count_as_ok_and_status_keys_are_strings() {
        let r = Recorder::default();
        let now = Instant::now();
        r.window_ends(now);
        r.response(200, Duration::from_micros(100), now);
        r.response(
            200,
            Duration::from_micros(5000),
            now + Duration::from_millis(5),
        );
        r.response(503, Duration::from_micros(9), now);
        r.failure(Failure::Timeout);
        r.not_sent();
        let report = r.report(10.0, 1.0, 5);
        assert_eq!((report.sent, report.completed), (4, 3));
        assert_eq!(report.ok_in_window, 1, "the late 200 is outside the window");
        assert_eq!(report.latency_us_ok.max, 5000);
        assert_eq!(
            report.latency_us_all.p50, 100,
            "the 503 counts in `all`: 9, 100, 5000"
        );
        let json = serde_json::to_value(&report).expect("serializable");
        assert_eq!(json["status"]["503"], 1);
        assert_eq!(json["errors"]["timeout"], 1);
    }
}
