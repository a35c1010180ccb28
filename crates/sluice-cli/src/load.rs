//! `sluice demo --load`: an open-loop load from half to ten times the declared capacity.
//!
//! Open loop means requests are launched on a fixed schedule whether or not earlier ones have
//! finished, as real clients do; a closed loop (send the next request when one completes)
//! would slow down with the proxy and hide its queueing. Each step offers a multiple of the
//! declared capacity (sessions / work per request) for a fixed time, then waits for its
//! requests to finish and prints one table row. Latency is measured from each request's
//! scheduled start, so a lagging load generator cannot hide delay (coordinated omission).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice::config::DEFAULT_SLICE;
use sluice::ReverseCluster;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::demo_service::{Instance, WORK};

/// The steps: label and multiple of the declared capacity.
const STEPS: [(&str, f64); 5] = [
    ("0.5x", 0.5),
    ("1x", 1.0),
    ("2x", 2.0),
    ("5x", 5.0),
    ("10x", 10.0),
];
/// A request that takes longer than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// How one request ended.
#[derive(Debug, Clone)]
enum Outcome {
    /// A 2xx, with its latency from the scheduled start.
    Success(Duration),
    /// A 503: the admission queue was full or the wait expired.
    Unavailable,
    /// Anything else: another status, a transport error, a timeout; and why, in a few words.
    Failed(String),
}

/// What one step measured.
#[derive(Debug)]
struct Step {
    label: &'static str,
    offered: f64,
    seconds: f64,
    elapsed: f64,
    sent: usize,
    latencies: Vec<Duration>,
    unavailable: usize,
    failed: usize,
    /// Why requests failed, with how many for each reason.
    failures: std::collections::BTreeMap<String, usize>,
    max_in_flight: Vec<usize>,
    peak_queue: usize,
}

/// Runs every step against `listen`, printing a row per step and a summary at the end.
/// Fails if any instance ever worked on more requests than it declared sessions.
pub(crate) async fn run(
    listen: SocketAddr,
    cluster: &ReverseCluster,
    instances: &[Arc<Instance>],
    step: Duration,
) -> anyhow::Result<()> {
    let declared: usize = instances.iter().map(|i| i.sessions).sum();
    let capacity = declared as f64 / WORK.as_secs_f64();
    println!(
        "open-loop load: capacity = {declared} sessions / {WORK:?} per request = {capacity:.0} req/s; \
         {} steps of {step:?}",
        STEPS.len()
    );
    let uri: Uri = format!("http://{listen}/").parse()?;
    let client = client();
    print_header(instances);
    let mut exceeded = false;
    let mut failures = std::collections::BTreeMap::new();
    for (label, factor) in STEPS {
        let mut result = run_step(&client, &uri, cluster, instances, capacity * factor, step).await;
        result.label = label;
        print_row(&mut result, instances);
        exceeded |= result.exceeded(instances);
        for (why, n) in std::mem::take(&mut result.failures) {
            *failures.entry(why).or_insert(0) += n;
        }
    }
    explain(exceeded, &failures)
}

/// A pooled client that opens as many connections as the open loop needs.
fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Offers `rate` requests per second for `length`, then waits for them all.
async fn run_step(
    client: &HttpClient,
    uri: &Uri,
    cluster: &ReverseCluster,
    instances: &[Arc<Instance>],
    rate: f64,
    length: Duration,
) -> Step {
    for i in instances {
        i.take_max_in_flight();
    }
    let mut tasks = JoinSet::new();
    let start = Instant::now();
    let end = start + length;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut peak_queue = 0;
    let mut launched: u32 = 0;
    loop {
        // The timer is coarser than the interval at high rates: launch everything now due.
        let now = Instant::now();
        let mut next = start + interval * launched;
        while next <= now && next < end {
            tasks.spawn(send(client.clone(), uri.clone(), next));
            launched += 1;
            next = start + interval * launched;
        }
        peak_queue = peak_queue.max(cluster.queued(DEFAULT_SLICE));
        if next >= end {
            break;
        }
        tokio::time::sleep_until(next).await;
    }
    let mut step = Step::new(rate, length, launched as usize, peak_queue);
    while let Some(joined) = tasks.join_next().await {
        step.record(joined.unwrap_or_else(|e| Outcome::Failed(format!("task: {e}"))));
    }
    // Queued requests finish after the window; goodput counts them over the whole time.
    step.elapsed = start.elapsed().as_secs_f64();
    step.max_in_flight = instances.iter().map(|i| i.take_max_in_flight()).collect();
    step
}

/// Sends one GET and reads the whole response.
async fn send(client: HttpClient, uri: Uri, scheduled: Instant) -> Outcome {
    let exchange = async {
        let request = Request::get(uri).body(Empty::new())?;
        let response = client.request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        anyhow::Ok(status)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
        Ok(Ok(status)) if status.is_success() => Outcome::Success(scheduled.elapsed()),
        Ok(Ok(StatusCode::SERVICE_UNAVAILABLE)) => Outcome::Unavailable,
        Ok(Ok(status)) => Outcome::Failed(format!("status {status}")),
        // The innermost cause names it ("Too many open files", "Connection reset by peer").
        Ok(Err(e)) => Outcome::Failed(e.root_cause().to_string()),
        Err(_) => Outcome::Failed(format!("no answer within {REQUEST_TIMEOUT:?}")),
    }
}

impl Step {
    fn new(offered: f64, length: Duration, sent: usize, peak_queue: usize) -> Self {
        Self {
            label: "",
            offered,
            seconds: length.as_secs_f64(),
            elapsed: length.as_secs_f64(),
            sent,
            latencies: Vec::with_capacity(sent),
            unavailable: 0,
            failed: 0,
            failures: std::collections::BTreeMap::new(),
            max_in_flight: Vec::new(),
            peak_queue,
        }
    }

    fn record(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Success(latency) => self.latencies.push(latency),
            Outcome::Unavailable => self.unavailable += 1,
            Outcome::Failed(why) => {
                self.failed += 1;
                *self.failures.entry(why).or_insert(0) += 1;
            }
        }
    }

    /// The latency below which `p` (0.0 to 1.0) of the successes finished, in ms.
    fn percentile_ms(&mut self, p: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        self.latencies.sort_unstable();
        let rank = (p * self.latencies.len() as f64).ceil() as usize;
        let index = rank.clamp(1, self.latencies.len()) - 1;
        Some(self.latencies[index].as_secs_f64() * 1000.0)
    }

    fn exceeded(&self, instances: &[Arc<Instance>]) -> bool {
        self.max_in_flight
            .iter()
            .zip(instances)
            .any(|(max, i)| *max > i.sessions)
    }
}

/// What the errors were and what to do about them; `None` without errors.
fn failures_text(failures: &std::collections::BTreeMap<String, usize>) -> Option<String> {
    let total: usize = failures.values().sum();
    if total == 0 {
        return None;
    }
    let mut by_count: Vec<_> = failures.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let causes: Vec<String> = by_count
        .iter()
        .take(3)
        .map(|(why, n)| format!("{n} {why}"))
        .collect();
    let mut text = format!(
        "{total} requests failed without an answer from the proxy: {}.",
        causes.join(", ")
    );
    if failures
        .keys()
        .any(|why| why.contains("Too many open files"))
    {
        text.push_str(
            "\nThe load's client and the proxy share this process and ran out of file\n\
             descriptors (each connection holds two): raise the open files limit\n\
             (`ulimit -n`, its hard limit) and run again.",
        );
    }
    Some(text)
}

fn print_header(instances: &[Arc<Instance>]) {
    println!("columns: offered and sent req/s, goodput (2xx/s until the step's last answer),");
    println!("p50/p99 of 2xx in ms from the scheduled send, 503s,");
    println!("other errors, max in-flight inside each instance / its declared sessions,");
    println!("peak admission-queue depth");
    let mut header = format!(
        "{:>5} {:>9} {:>7} {:>9} {:>7} {:>7} {:>6} {:>6}",
        "step", "offered/s", "sent/s", "goodput/s", "p50ms", "p99ms", "503s", "errors"
    );
    for i in instances {
        header.push_str(&format!(" {:>7}", i.name));
    }
    header.push_str(&format!(" {:>6}", "queue"));
    println!("{header}");
}

fn print_row(step: &mut Step, instances: &[Arc<Instance>]) {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    let p50 = ms(step.percentile_ms(0.50));
    let p99 = ms(step.percentile_ms(0.99));
    let mut row = format!(
        "{:>5} {:>9.0} {:>7.0} {:>9.0} {:>7} {:>7} {:>6} {:>6}",
        step.label,
        step.offered,
        step.sent as f64 / step.seconds,
        step.latencies.len() as f64 / step.elapsed,
        p50,
        p99,
        step.unavailable,
        step.failed
    );
    for (max, i) in step.max_in_flight.iter().zip(instances) {
        row.push_str(&format!(" {:>7}", format!("{max}/{}", i.sessions)));
    }
    row.push_str(&format!(" {:>6}", step.peak_queue));
    println!("{row}");
}

/// The closing paragraph; an error if the one promise the demo shows was broken. Errors
/// (not the proxy's 503s) are said with their causes: they are the load generator's or the
/// machine's, and the goodput of their step counts until its last answer, a timeout's too.
fn explain(
    exceeded: bool,
    failures: &std::collections::BTreeMap<String, usize>,
) -> anyhow::Result<()> {
    println!();
    if exceeded {
        anyhow::bail!("an instance worked on more requests than it declared sessions: a bug");
    }
    if let Some(text) = failures_text(failures) {
        println!("{text}");
        println!();
    }
    println!(
        "In-flight never exceeded the declared sessions: each request leased one session\n\
         exclusively, so no instance ever worked on more requests than it registered sessions.\n\
         Below capacity requests went straight to an idle session. Above it goodput levelled\n\
         off near capacity and the excess waited in the admission queue (latency grows by the\n\
         wait) or, once the queue was full or the wait passed queue_timeout, got 503 with\n\
         Retry-After at once instead of piling onto the services."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors are named with their causes, the most frequent first, and running out of
    /// descriptors says how to fix it (issue 48, item 7).
    #[test]
    fn failures_are_said_with_their_causes() {
        assert_eq!(failures_text(&std::collections::BTreeMap::new()), None);
        let failures = [
            ("Too many open files (os error 24)".to_owned(), 178),
            ("no answer within 5s".to_owned(), 2),
        ]
        .into_iter()
        .collect();
        let text = failures_text(&failures).expect("errors");
        assert!(
            text.starts_with("180 requests failed without an answer from the proxy: 178 Too many open files (os error 24), 2 no answer within 5s."),
            "{text}"
        );
        assert!(text.contains("ulimit -n"), "{text}");
    }
}
