//! [`Latency`]: percentiles of a set of latencies in microseconds.

use serde::Serialize;

/// Nearest-rank percentiles, the maximum and the mean, in microseconds; all 0 when there were
/// no samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// The median.
    pub p50: u32,
    /// The 90th percentile.
    pub p90: u32,
    /// The 99th percentile.
    pub p99: u32,
    /// The 99.9th percentile.
    pub p999: u32,
    /// The slowest sample.
    pub max: u32,
    /// The arithmetic mean, to 0.1 µs.
    pub mean: f64,
}

impl Latency {
    /// Summarises `samples`, sorting them in place.
    pub fn of(samples: &mut [u32]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let rank = |q: f64| {
            let r = (q * samples.len() as f64).ceil() as usize;
            samples[r.clamp(1, samples.len()) - 1]
        };
        let sum: u64 = samples.iter().map(|&s| u64::from(s)).sum();
        let mean = sum as f64 / samples.len() as f64;
        Self {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            p999: rank(0.999),
            max: samples[samples.len() - 1],
            mean: (mean * 10.0).round() / 10.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Latency;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<u32> = (1..=1000).rev().collect();
        let l = Latency::of(&mut samples);
        assert_eq!(
            (l.p50, l.p90, l.p99, l.p999, l.max),
            (500, 900, 990, 999, 1000)
        );
        assert_eq!(l.mean, 500.5);
        let one = Latency::of(&mut [7]);
        assert_eq!((one.p50, one.p999, one.max, one.mean), (7, 7, 7, 7.0));
        assert_eq!(Latency::of(&mut []), Latency::default());
    }
}
