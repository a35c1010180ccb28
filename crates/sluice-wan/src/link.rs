//! The emulated link: packets read from one TUN device are written to the other after a
//! serialization delay at `rate`, a propagation `delay`, and random `loss` — each direction
//! on its own pair of threads (reader, timed writer), with a drop-tail queue.

use std::fs::File;
use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One direction's properties.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bits per second.
    pub rate_bps: u64,
    /// Probability of dropping a packet, 0.0..1.0.
    pub loss: f64,
    /// The most bytes waiting to be sent (drop-tail beyond).
    pub queue_bytes: usize,
}

/// Forwards both directions between `a` and `b` until either device goes away.
pub fn spawn(a: File, b: File, shape: Shape) -> std::io::Result<()> {
    let (a2, b2) = (a.try_clone()?, b.try_clone()?);
    direction(a, b2, shape);
    direction(b, a2, shape);
    Ok(())
}

fn direction(mut from: File, mut to: File, shape: Shape) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let in_writer = std::sync::Arc::clone(&queued);
    std::thread::spawn(move || {
        let mut free_at = Instant::now();
        let mut buf = vec![0u8; 65_536];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || fastrand::f64() < shape.loss {
                continue;
            }
            let now = Instant::now();
            free_at = free_at.max(now);
            let backlog = queued.load(std::sync::atomic::Ordering::Relaxed);
            if backlog + n > shape.queue_bytes {
                continue; // drop-tail
            }
            let bits = n as u64 * 8;
            free_at += Duration::from_nanos(bits * 1_000_000_000 / shape.rate_bps.max(1));
            queued.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            if tx.send((free_at + shape.delay, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, packet) in rx {
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            in_writer.fetch_sub(packet.len(), std::sync::atomic::Ordering::Relaxed);
            // A write fails while the far end is still down (setup) or going away
            // (teardown): that packet is lost, as on a real link.
            let _ = to.write_all(&packet);
        }
    });
}
