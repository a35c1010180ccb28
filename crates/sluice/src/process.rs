//! [`ProcessCollector`]: the process's own CPU time, memory and file descriptors, under the
//! names every Prometheus client library uses (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), read from `/proc/self` at each scrape. Off Linux, or where
//! `/proc` cannot be read, the series are left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads `/proc/self` when scraped.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// What `/proc/self` says now.
#[derive(Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: f64,
    start_time_seconds: f64,
    open_fds: f64,
    max_fds: Option<f64>,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(s) = sample() else {
            return Ok(());
        };
        // Registered without the registry's prefix: these names are the standard's.
        let counter = ConstCounter::new(s.cpu_seconds);
        let metric = encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size, in bytes",
            s.resident_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds",
            s.start_time_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Open file descriptors",
            s.open_fds,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "The limit on open file descriptors",
                max,
            )?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

/// The clock ticks per second `/proc` counts CPU time and start times in (`getconf CLK_TCK`,
/// 100 on every Linux this runs on).
const TICKS: f64 = 100.0;

fn sample() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let page = 4096.0;
    let mut s = parse_stat(&stat, page)?;
    s.start_time_seconds += boot_time(&boot)?;
    s.open_fds = open_fds;
    s.max_fds = max_fds(&limits);
    Some(s)
}

/// CPU time, resident size and start time (since boot) from `/proc/self/stat`. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(stat: &str, page_size: f64) -> Option<Sample> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so field N is at index N - 3.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(Sample {
        cpu_seconds: (field(14)? + field(15)?) / TICKS,
        resident_bytes: field(24)? * page_size,
        start_time_seconds: field(22)? / TICKS,
        ..Sample::default()
    })
}

/// Boot time (seconds since the epoch) from `/proc/stat`'s `btime` line.
fn boot_time(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit on open files from `/proc/self/limits`.
fn max_fds(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // A command name with spaces and a parenthesis, as a process may give itself.
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 4 0 \
                    12345 100000000 2560 18446744073709551615";
        let s = parse_stat(stat, 4096.0).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.start_time_seconds, 123.45);
        assert_eq!(s.resident_bytes, 2560.0 * 4096.0);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000.0)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_fds(limits), Some(1024.0));
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample().unwrap();
        assert!(s.open_fds >= 3.0 && s.resident_bytes > 0.0, "{s:?}");
    }
}
