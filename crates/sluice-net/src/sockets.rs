//! [`Sockets`]: every listening socket a proxy binds, by the name it travels under in a hot
//! restart (Pingora's `Fds` is the model). Binding through the table takes the socket a
//! predecessor handed over when there is one, and remembers a duplicate of each, so a successor
//! gets exactly what was bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;

use sluice_handoff::ListenAddr;
use socket2::SockRef;
use tokio::net::{TcpListener, UnixListener};
use tracing::{info, warn};

/// The name a listener's socket travels under: `listener:<name>`.
pub fn listener_key(name: &str) -> String {
    format!("listener:{name}")
}

/// A relay's listening socket travels as `relay:<name>`.
pub fn relay_key(name: &str) -> String {
    format!("relay:{name}")
}

/// A listener's HTTP/3 (UDP) socket travels as `quic:<name>`.
pub fn quic_key(name: &str) -> String {
    format!("quic:{name}")
}

/// The acceptor's TCP socket travels as `acceptor`.
pub const ACCEPTOR_KEY: &str = "acceptor";
/// The acceptor's UNIX socket travels as `acceptor-unix`.
pub const ACCEPTOR_UNIX_KEY: &str = "acceptor-unix";
/// The admin API's socket travels as `admin`.
pub const ADMIN_KEY: &str = "admin";

/// A listening socket for a successor: its name in the hand-over, its address, the socket.
#[derive(Debug)]
pub struct HandedListener {
    /// The key it was bound under (`listener:<name>`, `acceptor`, …).
    pub name: String,
    /// Where it listens.
    pub addr: ListenAddr,
    /// The socket.
    pub fd: OwnedFd,
}

impl HandedListener {
    /// Another descriptor of the same socket.
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            name: self.name.clone(),
            addr: self.addr.clone(),
            fd: self.fd.try_clone()?,
        })
    }
}

/// The listen backlog asked for; the kernel caps it at `net.core.somaxconn` (4096 by default
/// since Linux 5.4), so this means "as deep as the machine allows", as Go's listeners do.
/// Tokio's `bind` asks for 128 (the standard library's value): a burst of connects beyond
/// what the accept loop takes in time (a busy 2-core machine, many clients at once)
/// overflowed it, and each dropped SYN costs its client a 1 s retransmit; `demo --load`
/// showed it as a step whose p99 jumped past 1 s and whose goodput halved, with no error
/// (issue 48, item 7).
pub const LISTEN_BACKLOG: i32 = 65_535;

/// A TCP socket listening on `addr` with [`LISTEN_BACKLOG`], as tokio's `bind` makes it
/// otherwise (`SO_REUSEADDR`, non-blocking).
pub fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// The listening sockets of one process: those a predecessor handed over and not yet taken,
/// and those taken or bound since (duplicates, for [`export`](Self::export)).
#[derive(Debug, Default)]
pub struct Sockets {
    inherited: HashMap<String, (ListenAddr, OwnedFd)>,
    bound: Vec<HandedListener>,
}

impl Sockets {
    /// A table that hands out `inherited` before binding anything.
    pub fn inheriting(inherited: HashMap<String, (ListenAddr, OwnedFd)>) -> Self {
        Self {
            inherited,
            bound: Vec::new(),
        }
    }

    /// The TCP socket handed over under `key` if it listens where `addr` says (an unspecified
    /// port in `addr` accepts any port on the same IP); otherwise a socket bound to `addr`.
    pub async fn tcp(&mut self, key: &str, addr: SocketAddr) -> std::io::Result<TcpListener> {
        let listener = match self.take_tcp(key, addr) {
            Some(std) => TcpListener::from_std(std)?,
            None => bind_tcp(addr)?,
        };
        let bound = listener.local_addr().map(ListenAddr::Inet);
        self.remember(key, bound, SockRef::from(&listener));
        Ok(listener)
    }

    /// As [`tcp`](Self::tcp), with `bind` making the socket when none was handed over (a
    /// listener whose options are set before `listen`, as a relay's).
    pub fn tcp_or(
        &mut self,
        key: &str,
        addr: SocketAddr,
        bind: impl FnOnce() -> std::io::Result<TcpListener>,
    ) -> std::io::Result<TcpListener> {
        let listener = match self.take_tcp(key, addr) {
            Some(std) => TcpListener::from_std(std)?,
            None => bind()?,
        };
        let bound = listener.local_addr().map(ListenAddr::Inet);
        self.remember(key, bound, SockRef::from(&listener));
        Ok(listener)
    }

    /// The UDP socket handed over under `key` if it is bound where `addr` says (an unspecified
    /// port in `addr` takes any port on the same IP); otherwise one bound to `addr`
    /// (non-blocking).
    pub fn udp(&mut self, key: &str, addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
        let socket = match self.take_udp(key, addr) {
            Some(socket) => socket,
            None => std::net::UdpSocket::bind(addr)?,
        };
        socket.set_nonblocking(true)?;
        let bound = socket.local_addr().map(ListenAddr::Inet);
        self.remember(key, bound, SockRef::from(&socket));
        Ok(socket)
    }

    /// The UNIX socket handed over under `key` if it is at `path`; otherwise one bound there
    /// (a socket file a crashed process left behind is replaced, one a live process listens on
    /// is refused).
    pub fn unix(&mut self, key: &str, path: &Path) -> std::io::Result<UnixListener> {
        let listener = match self.take_unix(key, path) {
            Some(std) => UnixListener::from_std(std)?,
            None => bind_unix(path)?,
        };
        let bound = Ok(ListenAddr::Unix(path.to_owned()));
        self.remember(key, bound, SockRef::from(&listener));
        Ok(listener)
    }

    /// Closes the handed-over sockets that nothing took (listeners of the old configuration
    /// missing from the new one).
    pub fn close_unused(&mut self) {
        if self.inherited.is_empty() {
            return;
        }
        let unused: Vec<_> = self.inherited.keys().collect();
        info!(
            ?unused,
            "listeners of the old configuration not in the new one are closed"
        );
        self.inherited.clear();
    }

    /// Every socket taken or bound, for a successor.
    pub fn export(self) -> Vec<HandedListener> {
        self.bound
    }

    fn take_tcp(&mut self, key: &str, want: SocketAddr) -> Option<std::net::TcpListener> {
        let matches = |have: &SocketAddr| {
            have.ip() == want.ip() && (want.port() == 0 || have.port() == want.port())
        };
        match self.inherited.get(key) {
            Some((ListenAddr::Inet(have), _)) if matches(have) => {}
            _ => return None,
        }
        let (_, fd) = self.inherited.remove(key)?;
        let listener = std::net::TcpListener::from(fd);
        listener.set_nonblocking(true).ok()?;
        Some(listener)
    }

    fn take_udp(&mut self, key: &str, want: SocketAddr) -> Option<std::net::UdpSocket> {
        let matches = |have: &SocketAddr| {
            have.ip() == want.ip() && (want.port() == 0 || have.port() == want.port())
        };
        match self.inherited.get(key) {
            Some((ListenAddr::Inet(have), _)) if matches(have) => {}
            _ => return None,
        }
        let (_, fd) = self.inherited.remove(key)?;
        Some(std::net::UdpSocket::from(fd))
    }

    fn take_unix(&mut self, key: &str, want: &Path) -> Option<std::os::unix::net::UnixListener> {
        match self.inherited.get(key) {
            Some((ListenAddr::Unix(have), _)) if have == want => {}
            _ => return None,
        }
        let (_, fd) = self.inherited.remove(key)?;
        let listener = std::os::unix::net::UnixListener::from(fd);
        listener.set_nonblocking(true).ok()?;
        Some(listener)
    }

    /// Keeps a duplicate of a socket just taken or bound; one that cannot be duplicated is
    /// left out (a successor binds it afresh) with a warning.
    fn remember(&mut self, key: &str, addr: std::io::Result<ListenAddr>, sock: SockRef<'_>) {
        match addr.and_then(|addr| Ok((addr, sock.try_clone()?))) {
            Ok((addr, fd)) => self.bound.push(HandedListener {
                name: key.to_owned(),
                addr,
                fd: fd.into(),
            }),
            Err(error) => warn!(socket = %key, %error, "cannot duplicate the listening socket"),
        }
    }
}

fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    sluice_handoff::remove_stale(path).map_err(std::io::Error::other)?;
    UnixListener::bind(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// A listener's backlog is as deep as the kernel allows, not tokio's 128: 1 100 connects
    /// that nothing accepts all complete their handshake (with 128, 129 did: the 130th SYN
    /// is dropped and its client retries a second later).
    #[tokio::test]
    async fn a_burst_of_connects_beyond_128_fits_the_backlog() {
        use socket2::{Domain, Socket, Type};
        const CONNECTS: usize = 1100;
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        // Every client socket is a descriptor of this process.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
        let mut sockets = Sockets::default();
        let listener = sockets.tcp("listener:a", loopback()).await.expect("bind");
        let addr = listener.local_addr().expect("addr").into();
        let clients: Vec<Socket> = (0..CONNECTS)
            .map(|_| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
                s.set_nonblocking(true).expect("non-blocking");
                let _ = s.connect(&addr); // EINPROGRESS
                s
            })
            .collect();
        let want = CONNECTS.min(somaxconn + 1);
        let connected = || clients.iter().filter(|c| c.peer_addr().is_ok()).count();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        while connected() < want && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            connected() >= want,
            "{} of {CONNECTS} connects completed (somaxconn {somaxconn})",
            connected()
        );
        drop(listener);
    }

    /// A successor's table hands out the very socket the predecessor exported, so a
    /// connection queued on it before the hand-over is accepted by the successor.
    #[tokio::test]
    async fn an_exported_socket_is_taken_not_rebound() {
        let mut old = Sockets::default();
        let listener = old.tcp("listener:a", loopback()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let queued = std::net::TcpStream::connect(addr).expect("connect");
        let handed = old
            .export()
            .into_iter()
            .map(|h| (h.name, (h.addr, h.fd)))
            .collect();
        drop(listener);
        let mut new = Sockets::inheriting(handed);
        let taken = new.tcp("listener:a", loopback()).await.expect("take");
        assert_eq!(taken.local_addr().expect("addr"), addr);
        let (accepted, _) = taken.accept().await.expect("the queued connection");
        assert_eq!(
            accepted.peer_addr().expect("peer"),
            queued.local_addr().expect("local")
        );
        assert_eq!(new.export().len(), 1);
    }

    /// A handed socket under another key, or at another address, is not taken: the new
    /// configuration's listener binds afresh.
    #[tokio::test]
    async fn a_socket_elsewhere_is_not_taken() {
        let mut old = Sockets::default();
        let _kept = old.tcp("admin", loopback()).await.expect("bind");
        let handed: HashMap<_, _> = old
            .export()
            .into_iter()
            .map(|h| (h.name, (h.addr, h.fd)))
            .collect();
        let mut new = Sockets::inheriting(handed);
        let moved = SocketAddr::from(([127, 0, 0, 2], 0));
        let other = new.tcp("admin", moved).await.expect("bind afresh");
        assert_eq!(other.local_addr().expect("addr").ip(), moved.ip());
        assert_eq!(new.inherited.len(), 1, "the old socket is still unused");
    }
}
