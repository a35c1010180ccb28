//! What an accept loop does when `accept` fails, mostly because the process is out of file
//! descriptors (EMFILE, ENFILE): shed what waits in the listen backlog instead of leaving
//! clients hanging, back off instead of spinning, and say so in the log once in a while.
//!
//! One descriptor is kept in reserve (libev's and libuv's way): out of descriptors, the loop
//! frees it, accepts each waiting connection and closes it at once (the client sees a reset
//! and may try elsewhere, rather than waiting for a timeout), then takes the reserve again.
//! Established connections are untouched, and accepting resumes as soon as descriptors free up.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tracing::warn;

/// How long a loop waits after a failed accept before it tries again.
const BACKOFF: Duration = Duration::from_millis(50);
/// How often repeated accept failures are logged.
const REPORT_EVERY: Duration = Duration::from_secs(10);
/// The most connections shed in one go; the rest wait for the next failure.
const SHED_AT_MOST: usize = 1024;

/// The spare descriptor; `None` until the first listener starts, or while it is in use.
static RESERVE: Mutex<Option<File>> = Mutex::new(None);

/// Takes the spare descriptor if it is not held yet; every accept loop calls this as it starts,
/// while descriptors are still to be had.
pub fn keep_reserve() {
    let mut reserve = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
    if reserve.is_none() {
        *reserve = File::open("/dev/null").ok();
    }
}

/// Handles a failed accept on `listener` (its name for the log): sheds the backlog when out of
/// descriptors, logs at most once per 10 s, and waits 50 ms.
pub async fn accept_error(name: &str, listener: SockRef<'_>, e: io::Error) {
    let shed = if is_out_of_descriptors(&e) {
        shed_backlog(listener)
    } else {
        0
    };
    report(name, &e, shed);
    tokio::time::sleep(BACKOFF).await;
}

/// EMFILE (this process) or ENFILE (the whole system).
fn is_out_of_descriptors(e: &io::Error) -> bool {
    let out = [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE];
    e.raw_os_error()
        .is_some_and(|code| out.iter().any(|o| o.raw_os_error() == code))
}

/// Frees the reserve, accepts and resets every waiting connection (up to [`SHED_AT_MOST`]),
/// and takes the reserve back; returns how many were shed.
fn shed_backlog(listener: SockRef<'_>) -> usize {
    let mut reserve = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
    if reserve.take().is_none() {
        return 0;
    }
    let mut shed = 0;
    // The listener is non-blocking: accept says WouldBlock once the backlog is empty.
    while shed < SHED_AT_MOST {
        let Ok((conn, _)) = listener.accept() else {
            break;
        };
        // A reset, not a FIN: nothing lingers in TIME_WAIT, and the client learns at once.
        let _ = conn.set_linger(Some(Duration::ZERO));
        drop(conn);
        shed += 1;
    }
    *reserve = File::open("/dev/null").ok();
    shed
}

/// Logs the failure at the first one and then at most once per [`REPORT_EVERY`], with how many
/// failures and shed connections there were since the last line.
fn report(name: &str, e: &io::Error, shed: usize) {
    static FAILED: AtomicU64 = AtomicU64::new(0);
    static SHED: AtomicU64 = AtomicU64::new(0);
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let failed = FAILED.fetch_add(1, Ordering::Relaxed) + 1;
    let shed = SHED.fetch_add(shed as u64, Ordering::Relaxed) + shed as u64;
    let now_ms = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
    let last = LAST_MS.load(Ordering::Relaxed);
    let every_ms = u64::try_from(REPORT_EVERY.as_millis()).unwrap_or(u64::MAX);
    let due = last == 0 || now_ms.saturating_sub(last) >= every_ms;
    // One of several loops failing at once wins the line.
    let won = due
        && LAST_MS
            .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
    if won {
        FAILED.store(0, Ordering::Relaxed);
        SHED.store(0, Ordering::Relaxed);
        warn!(listener = name, error = %e, failed, shed, "accept failed; connections waiting were reset, retrying every 50 ms");
    }
}

/// The instant reports are timed from (the first failure).
fn epoch() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}
