//! An open-loop HTTP/1.1 load generator: request `i` is due at `start + i / rate` whether or
//! not earlier ones were answered, and its latency runs from that due time, so a slow server
//! cannot slow the schedule down and hide its own queueing (no coordinated omission).
//!
//! A due request takes an idle keep-alive connection, else opens one while fewer than
//! `--max-conns` are open, else is counted as `not_sent`; the schedule never waits.
//!
//! Between due times the dispatcher sleeps on a `timerfd` (`timer.rs`), not on Tokio's
//! millisecond timer, and spins for the last `--spin-us`, since any lateness in sending shows
//! up as latency.

mod conn;
mod record;
mod timer;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::target::Target;
use conn::{Checkout, Conn, Pool};
pub use record::{Errors, Report};
use record::{Failure, Recorder};
use timer::Timer;

/// What to load, how hard and for how long.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// The URL to `GET`: `http://HOST:PORT/path` (plain HTTP only).
    #[arg(long, value_parser = Target::parse)]
    pub url: Target,
    /// The offered rate, requests per second.
    #[arg(long, value_parser = positive)]
    pub rate: f64,
    /// How long to measure, in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = positive)]
    pub duration: f64,
    /// The most connections open at once; a request due while all are busy is not sent.
    #[arg(long, value_name = "N", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_conns: u32,
    /// A request without a complete response this long after its due time is a timeout.
    #[arg(long, value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Wake this many microseconds before each due time and spin (yielding to the connection
    /// tasks) until it. The default only saves arming a timer for the next request at high
    /// rates; more means less lateness (a sleeping thread can take ~100 µs to wake up on a VM)
    /// but a thread that holds its CPU, so give it a CPU of its own; 0 never spins.
    #[arg(long, value_name = "US", default_value_t = 50)]
    pub spin_us: u64,
    /// Run at the rate this many seconds first and leave those requests out of the report.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = non_negative)]
    pub warmup: f64,
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number")),
    }
}

fn positive(s: &str) -> Result<f64, String> {
    match non_negative(s) {
        Ok(v) if v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// Dispatches in a row before yielding to the connection tasks, when behind schedule.
const BURST: u32 = 32;

/// What every request task shares.
#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    request: Bytes,
    timeout: Duration,
    pool: Pool,
    recorder: Recorder,
    /// The worst lateness of a measured request's start, in microseconds.
    max_lag_us: AtomicU64,
}

/// Runs the schedule, waits for the answers still due (each bounded by the timeout) and
/// reports. Fails only when the URL's host does not resolve or no timer can be created.
pub async fn run(config: &Config) -> io::Result<Report> {
    let warmup = (config.warmup * config.rate).round() as u64;
    let measured = (config.duration * config.rate).round() as u64;
    let shared = Arc::new(Shared {
        addr: config.url.resolve().await?,
        request: config.url.get_request("sluice-openloop"),
        timeout: Duration::from_millis(config.timeout_ms),
        pool: Pool::new(config.max_conns as usize),
        recorder: Recorder::with_capacity(usize::try_from(measured).unwrap_or(0)),
        max_lag_us: AtomicU64::new(0),
    });
    let (alive, mut ended) = mpsc::channel::<()>(1);
    let schedule = Schedule {
        rate: config.rate,
        warmup,
        total: warmup + measured,
        spin: Duration::from_micros(config.spin_us),
    };
    schedule.dispatch(&shared, &alive).await?;
    drop(alive);
    // Every task ends by its own deadline; the bound only guards against a stuck socket.
    let wait = tokio::time::timeout(shared.timeout + Duration::from_secs(1), async {
        while ended.recv().await.is_some() {}
    });
    let _ = wait.await;
    let mut report = shared
        .recorder
        .report(config.rate, config.duration, measured);
    (report.conns_opened, report.max_open_conns) = shared.pool.marks();
    report.max_lag_us = shared.max_lag_us.load(Ordering::Relaxed);
    Ok(report)
}

/// When each request is due: request `i` at `start + i / rate`, the first `warmup` unmeasured.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    rate: f64,
    warmup: u64,
    total: u64,
    /// How long before a due time to stop sleeping and spin.
    spin: Duration,
}

impl Schedule {
    /// Hands every request to a task of its own at its due time, sleeping on a [`Timer`] in
    /// between, and yielding now and then when behind so that the connections keep moving.
    async fn dispatch(self, shared: &Arc<Shared>, alive: &mpsc::Sender<()>) -> io::Result<()> {
        let timer = Timer::new()?;
        let start = Instant::now();
        let last = self.total.saturating_sub(1) as f64 / self.rate;
        shared
            .recorder
            .window_ends((start + Duration::from_secs_f64(last)).into_std());
        let mut burst = 0;
        for i in 0..self.total {
            let due = start + Duration::from_secs_f64(i as f64 / self.rate);
            if wait_until(&timer, due, self.spin).await? {
                burst = 0;
            } else if burst >= BURST {
                tokio::task::yield_now().await;
                burst = 0;
            }
            burst += 1;
            let measure = i >= self.warmup;
            if i == self.warmup {
                shared.pool.mark();
            }
            let conn = match shared.pool.checkout() {
                Checkout::Idle(conn) => Some(conn),
                Checkout::Open => None,
                Checkout::Full => {
                    if measure {
                        shared.recorder.not_sent();
                    }
                    continue;
                }
            };
            tokio::spawn(request(shared.clone(), conn, due, measure, alive.clone()));
        }
        Ok(())
    }
}

/// Waits for `due`: sleeps on `timer` until `spin` before it, then spins, yielding to the other
/// tasks. Returns whether it had to wait at all.
async fn wait_until(timer: &Timer, due: Instant, spin: Duration) -> io::Result<bool> {
    let Some(wait) = due.checked_duration_since(Instant::now()) else {
        return Ok(false);
    };
    if let Some(sleep) = wait.checked_sub(spin).filter(|d| !d.is_zero()) {
        timer.sleep(sleep).await?;
    }
    while Instant::now() < due {
        tokio::task::yield_now().await;
    }
    Ok(true)
}

/// Sends one request on `conn` (or a new connection) and records how it went; `_alive` tells
/// `run` the task is still going.
async fn request(
    shared: Arc<Shared>,
    conn: Option<Conn>,
    due: Instant,
    measure: bool,
    _alive: mpsc::Sender<()>,
) {
    if measure {
        let lag = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
        shared.max_lag_us.fetch_max(lag, Ordering::Relaxed);
    }
    let attempt = async {
        let mut conn = match conn {
            Some(conn) => conn,
            None => Conn::connect(shared.addr)
                .await
                .map_err(|_| Failure::Connect)?,
        };
        let done = conn
            .request(&shared.request)
            .await
            .map_err(|_| Failure::Io)?;
        Ok((conn, done))
    };
    let outcome = tokio::time::timeout_at(due + shared.timeout, attempt).await;
    let latency = due.elapsed();
    let failure = match outcome {
        Ok(Ok((conn, done))) => {
            if done.close {
                shared.pool.closed();
            } else {
                shared.pool.put(conn);
            }
            if measure {
                shared
                    .recorder
                    .response(done.status, latency, Instant::now().into_std());
            }
            return;
        }
        Ok(Err(failure)) => failure,
        Err(_) => Failure::Timeout,
    };
    shared.pool.closed();
    if measure {
        shared.recorder.failure(failure);
    }
}
