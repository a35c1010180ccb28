//! Both directions of a relayed connection: `splice(2)` through a pipe, or a copy through a
//! bounded buffer; half-close passed on; an idle timeout over both.

use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::copy::copy_loop;
use crate::sockmap::{self, Kernel};
use crate::stats::Stats;

/// The amount asked of one splice (as much as the copy's buffer).
const CHUNK: usize = crate::copy::CHUNK;

/// How bytes move between the sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `splice(2)` through a pipe, falling back to [`Mode::Copy`] where it is refused.
    Splice,
    /// `read` into a buffer, `write` out of it.
    Copy,
}

impl Mode {
    /// Splice or copy, as the relay's `splice` key says.
    pub(crate) fn of(opts: &crate::options::RelayOptions) -> Self {
        match opts.splice {
            true => Self::Splice,
            false => Self::Copy,
        }
    }
}

/// Relays between `client` and `upstream` until both directions have ended (each EOF passed on
/// as a write shutdown) or nothing moved for `idle`; bytes are counted into `stats`. With
/// `kernel` (the `sockmap` key, its program loaded) the kernel moves the bytes (`sockmap`),
/// unless this connection cannot enter its map.
pub(crate) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    (mode, kernel): (Mode, Option<&Arc<Kernel>>),
    idle: Duration,
    stats: &Stats,
) -> io::Result<()> {
    if let Some(kernel) = kernel {
        if let Some(done) = sockmap::relay(kernel, client, upstream, idle, stats).await {
            return done;
        }
    }
    let start = Instant::now();
    let activity = AtomicU64::new(0);
    let both = async {
        tokio::try_join!(
            direction(client, upstream, mode, &activity, start, &stats.bytes_up),
            direction(upstream, client, mode, &activity, start, &stats.bytes_down),
        )
    };
    tokio::select! {
        done = both => done.map(|_| ()),
        () = idle_watch(&activity, start, idle) => Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout")),
    }
}

/// Resolves once no byte has moved for `idle` (`activity`: milliseconds since `start` of the
/// last transfer).
async fn idle_watch(activity: &AtomicU64, start: Instant, idle: Duration) {
    loop {
        let last = start + Duration::from_millis(activity.load(Relaxed));
        if last.elapsed() >= idle {
            return;
        }
        tokio::time::sleep_until(last + idle).await;
    }
}

/// One direction, `from` → `to`, then a write shutdown of `to`.
async fn direction(
    from: &TcpStream,
    to: &TcpStream,
    mode: Mode,
    activity: &AtomicU64,
    start: Instant,
    bytes: &AtomicU64,
) -> io::Result<()> {
    let moved = |n: usize| {
        bytes.fetch_add(n as u64, Relaxed);
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.fetch_max(ms, Relaxed);
    };
    let pipe = match mode {
        Mode::Splice => pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC).ok(),
        Mode::Copy => None,
    };
    let spliced = match &pipe {
        Some(pipe) => splice_loop(from, to, pipe, &moved).await?,
        None => false,
    };
    if !spliced {
        copy_loop(from, to, &moved).await?;
    }
    // The peer may already be gone; its own direction reports that.
    let _ = SockRef::from(to).shutdown(Shutdown::Write);
    Ok(())
}

/// Splices until EOF through `pipe` (read end, write end). Returns `false`, having moved
/// nothing, if the kernel refuses splice for these sockets (the caller copies instead).
async fn splice_loop(
    from: &TcpStream,
    to: &TcpStream,
    (pipe_r, pipe_w): &(OwnedFd, OwnedFd),
    moved: &impl Fn(usize),
) -> io::Result<bool> {
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    let mut first = true;
    loop {
        let n = loop {
            from.readable().await?;
            let res = from.try_io(Interest::READABLE, || {
                Ok(splice(from, None, pipe_w, None, CHUNK, flags)?)
            });
            match res {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if first && refused(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        };
        first = false;
        if n == 0 {
            return Ok(true);
        }
        drain(pipe_r, to, n, flags).await?;
        moved(n);
    }
}

/// Moves `n` bytes from the pipe into `to`; the pipe is empty after.
async fn drain(
    pipe_r: &OwnedFd,
    to: &TcpStream,
    mut n: usize,
    flags: SpliceFlags,
) -> io::Result<()> {
    while n > 0 {
        to.writable().await?;
        match to.try_io(Interest::WRITABLE, || {
            Ok(splice(pipe_r, None, to, None, n, flags)?)
        }) {
            Ok(m) => n -= m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Errors that mean "splice is not possible here", not "the connection failed".
fn refused(e: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP)
    )
}
