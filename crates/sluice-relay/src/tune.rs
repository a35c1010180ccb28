//! Socket settings: `TCP_NODELAY`, `TCP_CONGESTION`, buffer sizes, keepalive; and the tuned
//! connect to a next hop.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::options::RelayOptions;

/// Idle time before keepalive probes on inter-relay sockets, so a pooled connection whose
/// peer vanished is noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Binds a relay's listener. `socket_buffer` is set on the listener so accepted sockets inherit
/// it before the handshake (the window scale is fixed then), and so is `congestion` when what it
/// accepts are legs from other relays (`from_relays`: see [`accepting_relays`]).
pub(crate) fn listen(
    addr: SocketAddr,
    opts: &RelayOptions,
    from_relays: bool,
) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    if let Some(size) = opts.socket_buffer {
        socket.set_recv_buffer_size(size)?;
        socket.set_send_buffer_size(size)?;
    }
    if from_relays {
        accepting_relays(&socket, opts)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// A tunnel end's listener: what it accepts are legs from other relays, and they carry the
/// answers back towards the client (the bulk, mostly), so they take `congestion` as the sockets
/// a relay connects do. Accepted sockets inherit it from the listener, as they inherit the
/// buffer sizes. Set before `listen` on a fresh bind, and again on a listener a hot restart
/// hands over; one handed over to a configuration without `congestion` keeps what its old
/// process set, as it keeps `socket_buffer`. An entry relay's or forwarder's clients keep the
/// namespace's default.
pub(crate) fn accepting_relays(
    listener: &impl std::os::fd::AsFd,
    opts: &RelayOptions,
) -> io::Result<()> {
    match &opts.congestion {
        Some(name) => set_congestion(&SockRef::from(listener), name),
        None => Ok(()),
    }
}

/// Applies the per-connection settings to an accepted client socket.
pub(crate) fn accepted(stream: &TcpStream, opts: &RelayOptions) -> io::Result<()> {
    stream.set_nodelay(opts.nodelay)
}

/// Connects to `addr` with every setting applied before the SYN, within `connect_timeout`.
pub(crate) async fn connect(addr: SocketAddr, opts: &RelayOptions) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(opts.nodelay)?;
    socket.set_tcp_keepalive(&TcpKeepalive::new().with_time(KEEPALIVE))?;
    if let Some(size) = opts.socket_buffer {
        socket.set_recv_buffer_size(size)?;
        socket.set_send_buffer_size(size)?;
    }
    if let Some(name) = &opts.congestion {
        set_congestion(&SockRef::from(&socket), name)?;
    }
    let socket = TcpSocket::from_std_stream(socket.into());
    match tokio::time::timeout(opts.connect_timeout, socket.connect(addr)).await {
        Ok(stream) => stream,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connect to {addr} timed out"),
        )),
    }
}

/// `TCP_CONGESTION`; the error names the algorithm and what to check (not loaded, or not
/// allowed to this process).
fn set_congestion(socket: &SockRef<'_>, name: &str) -> io::Result<()> {
    socket.set_tcp_congestion(name.as_bytes()).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::PermissionDenied => {
                "not in net.ipv4.tcp_allowed_congestion_control, and the process lacks CAP_NET_ADMIN"
            }
            _ => "is the module loaded?",
        };
        io::Error::new(e.kind(), format!("congestion control `{name}`: {e} ({hint})"))
    })
}
