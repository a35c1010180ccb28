//! Kernel splicing (`sockmap`): both sockets of a relayed connection go into a BPF sockmap whose
//! verdict program (bpf/sockmap.c) sends each socket's bytes out of its peer, so no byte and no
//! copy reaches user space. The relay's task stays with the connection and does what the
//! kernel cannot:
//!
//! * **Half-close.** A FIN is no byte the program sees. The task waits for each socket's read
//!   side to close (`EPOLLRDHUP`), then for the peer to have taken every byte the program
//!   redirected (the program's own count, against the peer's `TCP_INFO` bytes acked plus its
//!   send queue), and only then shuts the peer's write side, so no redirected byte is cut off.
//! * **Resets.** An error on either socket ends the connection, as on the splice path: both
//!   sockets leave the map and close.
//! * **Counters and the idle timeout** read the program's per-socket byte counts (`ends`),
//!   every quarter of `idle_timeout` and at the end.
//! * **Drain and `max_connections`** are unchanged: the task holds its slot and is what the
//!   grace period waits for (or aborts, which takes both sockets out of the map).
//!
//! A socket whose bytes arrived in the instant between the two insertions has them delivered to
//! user space instead, and from then on always (`passed`): that direction is copied by the task.
//! Bytes already queued before the insertion are handed to the program by `SO_RCVLOWAT`, which
//! makes TCP signal readable data again.
//!
//! The program is loaded once per process; when it cannot be (no CAP_BPF/CAP_NET_ADMIN, no
//! kernel support), a relay with `sockmap = true` logs why once and forwards as before.

use std::io;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use aya::maps::{HashMap, MapData, SockMap};
use aya::programs::SkSkb;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::copy;
use crate::stats::Stats;

/// The compiled program (scripts/bpf builds it from bpf/sockmap.c; the test command checks the
/// committed object against a fresh build).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/sockmap.o");

/// Slots in `socks` (bpf/sockmap.c): two per connection.
const SLOTS: u32 = 65_536;

/// One socket's entry in `ends`, as bpf/sockmap.c lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct End {
    /// The peer's slot in `socks`.
    peer: u32,
    /// Non-zero: this socket's bytes are delivered to user space.
    passed: u32,
    /// Bytes redirected to the peer.
    bytes: u64,
}

#[allow(unsafe_code)]
// SAFETY: `End` is `repr(C)`, made of integers only, with no padding (4 + 4 + 8 bytes).
unsafe impl aya::Pod for End {}

/// The loaded program and its maps, shared by every relay of the process.
pub(crate) struct Kernel {
    maps: Mutex<Maps>,
    /// Owns the program (attached to `socks`) for as long as the process runs.
    _bpf: aya::Ebpf,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").finish_non_exhaustive()
    }
}

struct Maps {
    socks: SockMap<MapData>,
    ends: HashMap<MapData, u64, End>,
    /// Free slot pairs: slots `2i` and `2i + 1`.
    free: Vec<u32>,
}

/// The process's program, loaded on first use; the error says why it could not be.
pub(crate) fn kernel() -> Result<Arc<Kernel>, String> {
    static KERNEL: OnceLock<Result<Arc<Kernel>, String>> = OnceLock::new();
    KERNEL.get_or_init(|| Kernel::load().map(Arc::new)).clone()
}

impl Kernel {
    fn load() -> Result<Self, String> {
        let mut bpf = aya::Ebpf::load(OBJECT).map_err(|e| format!("loading the maps: {e}"))?;
        let socks = bpf.take_map("socks").ok_or("no map `socks`")?;
        let socks = SockMap::try_from(socks).map_err(|e| e.to_string())?;
        let ends = bpf.take_map("ends").ok_or("no map `ends`")?;
        let ends = HashMap::try_from(ends).map_err(|e| e.to_string())?;
        let program: &mut SkSkb = bpf
            .program_mut("sluice_redirect")
            .ok_or("no program `sluice_redirect`")?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        program
            .load()
            .map_err(|e| format!("loading the verdict program: {e}"))?;
        program
            .attach(socks.fd())
            .map_err(|e| format!("attaching the verdict program: {e}"))?;
        let free = (0..SLOTS / 2).rev().collect();
        let maps = Mutex::new(Maps { socks, ends, free });
        Ok(Self { maps, _bpf: bpf })
    }

    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `client` and `upstream` into the map, each redirecting to the other. Fails, having
    /// changed nothing, when every slot is taken or a socket cannot be added (the caller then
    /// forwards in user space).
    ///
    /// Bytes already readable are first copied to the peer in user space: the kernel hands
    /// its program whole queued segments, also the part of one that user space has read (a
    /// tunnel preamble), which would be sent twice.
    async fn pipe<'a>(
        self: &Arc<Self>,
        (client, upstream): (&'a TcpStream, &'a TcpStream),
        stats: &Stats,
        between: &(dyn Fn() + Sync),
    ) -> io::Result<Pipe<'a>> {
        let up = copy::copy_ready(client, upstream).await?;
        stats.bytes_up.fetch_add(up, Relaxed);
        let down = copy::copy_ready(upstream, client).await?;
        stats.bytes_down.fetch_add(down, Relaxed);
        // The kernel takes only established sockets; one that has its peer's FIN already
        // would fail its insertion, maybe after the other's, whose bytes meanwhile would be
        // delivered to the map's own queue and lost when it left the map.
        if !(sys::established(client)? && sys::established(upstream)?) {
            return Err(io::Error::other("a socket is no longer established"));
        }
        let base = [sys::written(client)?, sys::written(upstream)?];
        let cookies = [
            rustix::net::sockopt::socket_cookie(client)?,
            rustix::net::sockopt::socket_cookie(upstream)?,
        ];
        let pair = self
            .lock()
            .free
            .pop()
            .ok_or_else(|| io::Error::other("every sockmap slot is taken"))?;
        let pipe = Pipe {
            kernel: Arc::clone(self),
            socks: [client, upstream],
            slots: [2 * pair, 2 * pair + 1],
            cookies,
            base,
            counted: [AtomicU64::new(0), AtomicU64::new(0)],
        };
        pipe.insert(between)?;
        Ok(pipe)
    }
}

/// A connection the kernel forwards; dropping it takes both sockets out of the map.
struct Pipe<'a> {
    kernel: Arc<Kernel>,
    /// Client, upstream.
    socks: [&'a TcpStream; 2],
    /// Their slots in `socks`.
    slots: [u32; 2],
    /// Their cookies: their keys in `ends`.
    cookies: [u64; 2],
    /// What each had been given to send before it entered the map.
    base: [u64; 2],
    /// The program's byte counts already added to the relay's counters.
    counted: [AtomicU64; 2],
}

impl Pipe<'_> {
    /// `ends` first (the program passes bytes of sockets it does not know), then both sockets;
    /// then bytes queued before are handed to the program.
    /// (`between` runs between the two sockets' insertions: a test's hook.)
    fn insert(&self, between: &(dyn Fn() + Sync)) -> io::Result<()> {
        let mut maps = self.kernel.lock();
        for side in 0..2 {
            let end = End {
                peer: self.slots[1 - side],
                ..End::default()
            };
            maps.ends
                .insert(self.cookies[side], end, 0)
                .map_err(io::Error::other)?;
        }
        for side in 0..2 {
            let sock = self.socks[side];
            maps.socks
                .set(self.slots[side], sock, 0)
                .map_err(io::Error::other)?;
            if side == 0 {
                between();
            }
        }
        drop(maps);
        for sock in self.socks {
            sys::set_rcvlowat(sock.as_fd(), 1)?;
        }
        Ok(())
    }

    fn end(&self, side: usize) -> End {
        let maps = self.kernel.lock();
        maps.ends.get(&self.cookies[side], 0).unwrap_or_default()
    }

    /// Adds what the program counted since the last call to `stats`; whether anything moved.
    fn count(&self, stats: &Stats) -> bool {
        let mut moved = false;
        for (side, total) in [&stats.bytes_up, &stats.bytes_down].into_iter().enumerate() {
            let now = self.end(side).bytes;
            let before = self.counted[side].swap(now, Relaxed);
            let delta = now.saturating_sub(before);
            total.fetch_add(delta, Relaxed);
            stats.bytes_kernel.fetch_add(delta, Relaxed);
            moved |= delta > 0;
        }
        moved
    }

    /// The bytes from `side` towards its peer, until that side's EOF (passed on as a write
    /// shutdown once the peer has sent them all) or an error.
    async fn direction(&self, side: usize, activity: &Activity, stats: &Stats) -> io::Result<()> {
        let (from, to) = (self.socks[side], self.socks[1 - side]);
        if self.end(side).passed != 0 {
            // Delivered to user space (read through the map's own receive path): a copy.
            let bytes = [&stats.bytes_up, &stats.bytes_down][side];
            let moved = |n: usize| {
                bytes.fetch_add(n as u64, Relaxed);
                activity.touch();
            };
            copy::copy_loop(from, to, &moved).await?;
        } else {
            read_closed(from).await?;
            self.flushed(side).await?;
        }
        // The peer may already be gone; its own direction reports that.
        let _ = SockRef::from(to).shutdown(Shutdown::Write);
        Ok(())
    }

    /// Waits until the peer of `side` has been given every byte the program redirected to it.
    async fn flushed(&self, side: usize) -> io::Result<()> {
        let to = self.socks[1 - side];
        let mut wait = Duration::from_micros(200);
        loop {
            let want = self.base[1 - side] + self.end(side).bytes;
            if sys::written(to)? >= want {
                return Ok(());
            }
            if let Some(error) = to.take_error()? {
                return Err(error);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(50));
        }
    }
}

impl Drop for Pipe<'_> {
    fn drop(&mut self) {
        let mut maps = self.kernel.lock();
        for side in 0..2 {
            let _ = maps.socks.clear_index(&self.slots[side]);
            let _ = maps.ends.remove(&self.cookies[side]);
        }
        maps.free.push(self.slots[0] / 2);
    }
}

/// Resolves when `sock`'s read side is closed (its peer's FIN), or with its error (a reset).
/// Wake-ups for bytes the program redirected are let pass.
async fn read_closed(sock: &TcpStream) -> io::Result<()> {
    loop {
        let ready = sock.ready(Interest::READABLE).await?;
        if ready.is_read_closed() || ready.is_error() {
            return match sock.take_error()? {
                Some(error) => Err(error),
                None => Ok(()),
            };
        }
        // Clears the readiness without a syscall: there is nothing to read here.
        let _ = sock.try_io(Interest::READABLE, || {
            Err::<(), _>(io::ErrorKind::WouldBlock.into())
        });
    }
}

/// When a byte last moved (milliseconds since `start`).
struct Activity {
    start: Instant,
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(ms, Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last.load(Relaxed))
    }
}

/// Relays `client` ↔ `upstream` through the kernel, or returns `None` (having done nothing)
/// when they cannot enter the map; the caller then forwards in user space.
pub(crate) async fn relay(
    kernel: &Arc<Kernel>,
    client: &TcpStream,
    upstream: &TcpStream,
    idle: Duration,
    stats: &Stats,
) -> Option<io::Result<()>> {
    let pipe = match kernel.pipe((client, upstream), stats, &|| {}).await {
        Ok(pipe) => pipe,
        Err(error) => {
            tracing::debug!(%error, "this connection cannot be spliced by the kernel; forwarding in user space");
            return None;
        }
    };
    Some(run(&pipe, idle, stats).await)
}

/// Forwards through `pipe` until both directions have ended, an error, or `idle`.
async fn run(pipe: &Pipe<'_>, idle: Duration, stats: &Stats) -> io::Result<()> {
    stats.kernel_spliced.fetch_add(1, Relaxed);
    let activity = Activity {
        start: Instant::now(),
        last: AtomicU64::new(0),
    };
    let both = async {
        tokio::try_join!(
            pipe.direction(0, &activity, stats),
            pipe.direction(1, &activity, stats),
        )
    };
    let done = tokio::select! {
        done = both => done.map(|_| ()),
        () = idle_watch(pipe, &activity, idle, stats) => Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout")),
    };
    pipe.count(stats);
    done
}

/// Resolves once the program has counted no byte, and user space moved none, for `idle`. Reads
/// the program's counts every quarter of `idle` (into the relay's counters, too).
async fn idle_watch(pipe: &Pipe<'_>, activity: &Activity, idle: Duration, stats: &Stats) {
    let tick = (idle / 4).max(Duration::from_millis(1));
    loop {
        if pipe.count(stats) {
            activity.touch();
        }
        let last = activity.last();
        if last.elapsed() >= idle {
            return;
        }
        tokio::time::sleep(tick.min(idle.saturating_sub(last.elapsed()))).await;
    }
}

/// The socket calls rustix and socket2 do not wrap.
#[allow(unsafe_code)]
mod sys {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

    /// `tcp_info.tcpi_bytes_acked`'s offset (a stable ABI since Linux 4.1).
    const BYTES_ACKED: usize = 120;

    /// Bytes ever given to `sock` to send: those acknowledged plus those in its send queue.
    /// Read acked first, so an acknowledgement in between makes the sum smaller, never larger;
    /// repeated until the acked count held still, so it is exact.
    pub(super) fn written(sock: impl AsFd) -> io::Result<u64> {
        let fd = sock.as_fd();
        loop {
            let acked = bytes_acked(fd)?;
            let queued = outq(fd)?;
            if bytes_acked(fd)? == acked {
                return Ok(acked + queued);
            }
        }
    }

    /// Whether `sock` is in `TCP_ESTABLISHED` (`tcpi_state`, the first byte, is 1).
    pub(super) fn established(sock: impl AsFd) -> io::Result<bool> {
        let info = tcp_info(sock.as_fd())?;
        Ok(info[0].to_ne_bytes()[0] == 1)
    }

    fn bytes_acked(fd: BorrowedFd<'_>) -> io::Result<u64> {
        Ok(tcp_info(fd)?[BYTES_ACKED / 8])
    }

    /// `TCP_INFO`, as 8-byte words, at least up to `tcpi_bytes_acked`.
    fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<[u64; 32]> {
        let mut info = [0u64; 32];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is writable for `len` bytes, and `len` is passed by pointer as
        // getsockopt(2) wants; the kernel writes at most `len` bytes and updates it.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if (len as usize) < BYTES_ACKED + 8 {
            return Err(io::Error::other("TCP_INFO without tcpi_bytes_acked"));
        }
        Ok(info)
    }

    fn outq(fd: BorrowedFd<'_>) -> io::Result<u64> {
        let mut queued: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which is valid.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::try_from(queued).unwrap_or(0))
    }

    /// `SO_RCVLOWAT`: TCP signals readable data again when it is set, which hands bytes queued
    /// before the socket entered the map to the program.
    pub(super) fn set_rcvlowat(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
        // SAFETY: the option value is one int, passed by pointer with its size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::from_ref(&bytes).cast(),
                std::mem::size_of_val(&bytes) as libc::socklen_t,
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair: (the outside end, the end the relay holds).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let outside = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (inside, _) = listener.accept().await.unwrap();
        (outside, inside)
    }

    /// Bytes that reach the client's socket between the two insertions find no peer in the
    /// map: they and every later byte of that direction are delivered to user space and copied
    /// there, in order; the other direction stays in the kernel. Needs root (CI runs as root).
    #[tokio::test]
    async fn bytes_between_the_insertions_are_copied_in_order() {
        let kernel = kernel().expect("the sockmap program (needs CAP_BPF and CAP_NET_ADMIN)");
        let (mut user, client) = pair().await;
        let (upstream, mut server) = pair().await;
        let stats = Stats::default();
        let early = || {
            SockRef::from(&user).send(b"early").unwrap();
            // Loopback delivers (and the program judges) within the send, or just after.
            std::thread::sleep(Duration::from_millis(50));
        };
        let pipe = kernel
            .pipe((&client, &upstream), &stats, &early)
            .await
            .unwrap();
        assert_ne!(pipe.end(0).passed, 0, "the early bytes were not passed");
        assert_eq!(pipe.end(1).passed, 0);
        let outside = async {
            user.write_all(b" and later").await.unwrap();
            user.shutdown().await.unwrap();
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"early and later");
            server.write_all(b"reply").await.unwrap();
            server.shutdown().await.unwrap();
            let mut back = Vec::new();
            user.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"reply");
        };
        let (done, ()) = tokio::join!(run(&pipe, Duration::from_secs(30), &stats), outside);
        done.unwrap();
        let s = stats.snapshot();
        assert_eq!((s.bytes_up, s.bytes_down, s.bytes_kernel), (15, 5, 5));
    }
}
