//! [`Timer`]: a sleep with microsecond precision that wakes the runtime's own thread.
//!
//! Tokio's timer has millisecond resolution, and a request dispatched late is measured late.
//! Spinning would be precise but takes the CPU from whatever shares it (often the server under
//! test), and a separate sleeping thread costs a cross-thread wake-up per request. A `timerfd`
//! registered with the runtime is both precise and free while waiting.
//!
//! Tokio has no type for a timerfd and `AsyncFd::new` is deprecated with an `unsafe`
//! replacement, which the workspace forbids; as `sluice-handoff` does for its sockets, the fd
//! is registered as a `UnixDatagram`, used only for readiness (`async_io`), and read with
//! `read(2)`.

use std::io;
use std::time::Duration;

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::Interest;
use tokio::net::UnixDatagram;

/// A one-shot monotonic `timerfd`; must be created inside a Tokio runtime.
#[derive(Debug)]
pub(crate) struct Timer(UnixDatagram);

impl Timer {
    pub(crate) fn new() -> io::Result<Self> {
        let flags = TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC;
        let fd = timerfd_create(TimerfdClockId::Monotonic, flags)?;
        let std = std::os::unix::net::UnixDatagram::from(fd);
        Ok(Self(UnixDatagram::from_std(std)?))
    }

    /// Waits `duration`, which must not be zero (a zero time disarms the timer).
    pub(crate) async fn sleep(&self, duration: Duration) -> io::Result<()> {
        let value = Timespec::try_from(duration.max(Duration::from_nanos(1)))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(&self.0, TimerfdTimerFlags::empty(), &spec)?;
        // Reading the count of expirations clears the timer; until it expires the read fails
        // with `WouldBlock`, and `async_io` waits for readiness again.
        let mut expirations = [0u8; 8];
        let read = || Ok(rustix::io::read(&self.0, &mut expirations)?);
        self.0.async_io(Interest::READABLE, read).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sleeps_at_least_as_asked_and_can_be_reused() {
        let timer = Timer::new().expect("a timerfd");
        for micros in [300, 1, 2_000] {
            let start = std::time::Instant::now();
            timer
                .sleep(Duration::from_micros(micros))
                .await
                .expect("sleeps");
            assert!(start.elapsed() >= Duration::from_micros(micros));
        }
    }
}
