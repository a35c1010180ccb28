//! Early connect: the next leg starts when a client's SYN arrives, not when `accept` returns
//! one round trip later. An `AF_PACKET` socket with a classic BPF filter sees only SYNs to the
//! relay's port (needs CAP_NET_RAW; without it the relay connects on accept).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::pool::Pool;
use crate::upstream::Connector;

/// `ETH_P_IP` in network byte order, as `socket(AF_PACKET, …, protocol)` wants it.
const ETH_P_IP_BE: i32 = 0x0800_u16.to_be() as i32;

/// Connections started on a SYN, waiting for `accept` to claim them by the client's address.
#[derive(Debug)]
pub(crate) struct Early {
    /// The packet socket, registered with Tokio's reactor through `UdpSocket` (a safe
    /// `OwnedFd` conversion: Tokio only polls it and calls `recv`, which any datagram socket
    /// answers). `AsyncFd` would need `unsafe` here.
    socket: tokio::net::UdpSocket,
    pending: Mutex<HashMap<SocketAddr, Pending>>,
    /// Unclaimed entries (a handshake that never completed) are dropped after this.
    expire: Duration,
    /// The listening port, checked again on each packet.
    port: u16,
}

#[derive(Debug)]
struct Pending {
    since: Instant,
    conn: oneshot::Receiver<io::Result<TcpStream>>,
}

impl Early {
    /// Opens the packet socket for SYNs to `listen`. Fails with `PermissionDenied` without
    /// CAP_NET_RAW, and for IPv6 listeners (`Unsupported`).
    pub(crate) fn open(listen: SocketAddr, expire: Duration) -> io::Result<Self> {
        let IpAddr::V4(ip) = listen.ip() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "IPv4 listeners only",
            ));
        };
        let socket = Socket::new(
            Domain::PACKET,
            Type::DGRAM,
            Some(Protocol::from(ETH_P_IP_BE)),
        )?;
        socket.attach_filter(&syn_filter(ip, listen.port()))?;
        socket.set_nonblocking(true)?;
        // Packets queued between socket() and the filter passed no filter: drop them.
        let mut scratch = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        while socket.recv(&mut scratch).is_ok() {}
        Ok(Self {
            socket: tokio::net::UdpSocket::from_std(std::os::fd::OwnedFd::from(socket).into())?,
            pending: Mutex::new(HashMap::new()),
            expire,
            port: listen.port(),
        })
    }

    /// The connection started for `client`'s SYN, if one was.
    pub(crate) async fn claim(&self, client: SocketAddr) -> Option<io::Result<TcpStream>> {
        let pending = self.lock().remove(&client)?;
        pending.conn.await.ok()
    }

    /// Starts a connection for each SYN seen, until the socket fails.
    pub(crate) async fn run(self: Arc<Self>, connector: Arc<Connector>, pool: Option<Arc<Pool>>) {
        let mut packet = [0u8; 128];
        loop {
            let read = match self.socket.readable().await {
                Ok(()) => self.socket.try_recv(&mut packet),
                Err(e) => Err(e),
            };
            let n = match read {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => {
                    tracing::warn!(%error, "early connect: the packet socket failed; connecting on accept");
                    return;
                }
            };
            if let Some(client) = syn_source(&packet[..n.min(packet.len())], self.port) {
                self.start(client, &connector, pool.clone());
            }
        }
    }

    fn start(&self, client: SocketAddr, connector: &Arc<Connector>, pool: Option<Arc<Pool>>) {
        let mut pending = self.lock();
        pending.retain(|_, p| p.since.elapsed() < self.expire);
        if pending.contains_key(&client) {
            return; // a retransmitted SYN
        }
        let (tx, rx) = oneshot::channel();
        connector.stats.early.fetch_add(1, Relaxed);
        let connector = Arc::clone(connector);
        tokio::spawn(async move {
            let pooled = pool.as_deref().and_then(Pool::take);
            let _ = tx.send(connector.for_client(pooled).await);
        });
        let since = Instant::now();
        pending.insert(client, Pending { since, conn: rx });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The client address of an IPv4 TCP SYN to `port`; `None` for anything else (the filter
/// should have passed only such SYNs; this checks again).
fn syn_source(packet: &[u8], port: u16) -> Option<SocketAddr> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || *packet.get(9)? != 6 {
        return None;
    }
    let src: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
    let tcp = packet.get(ihl..ihl + 14)?;
    let (sport, dport) = (
        u16::from_be_bytes([tcp[0], tcp[1]]),
        u16::from_be_bytes([tcp[2], tcp[3]]),
    );
    if dport != port || tcp[13] & 0x12 != 0x02 {
        return None;
    }
    Some(SocketAddr::new(Ipv4Addr::from(src).into(), sport))
}

/// One classic BPF instruction before its jump offsets are known: conditional jumps either
/// fall through or go to DROP (the last instruction).
#[derive(Clone, Copy)]
enum Insn {
    /// An instruction without jumps.
    Op(u16, u32),
    /// A conditional jump that drops when the condition is false.
    Need(u16, u32),
    /// A conditional jump that drops when the condition is true.
    Reject(u16, u32),
}

/// Classic BPF: accept incoming IPv4 TCP segments to `ip:port` (any local address if `ip` is
/// unspecified) with SYN set and ACK clear, unfragmented; drop everything else. Offsets are
/// from the IP header (a `SOCK_DGRAM` packet socket sees no link-layer header).
fn syn_filter(ip: Ipv4Addr, port: u16) -> Vec<SockFilter> {
    const LD_W_ABS: u16 = 0x20;
    const LD_H_ABS: u16 = 0x28;
    const LD_B_ABS: u16 = 0x30;
    const LD_H_IND: u16 = 0x48;
    const LD_B_IND: u16 = 0x50;
    const LDX_B_MSH: u16 = 0xb1;
    const AND_K: u16 = 0x54;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    /// `SKF_AD_OFF + SKF_AD_PKTTYPE`: the packet's type; 4 is `PACKET_OUTGOING`.
    const PKTTYPE: u32 = 0xffff_f000 + 4;
    use Insn::{Need, Op, Reject};
    let mut prog = vec![
        Op(LD_W_ABS, PKTTYPE),
        Reject(JEQ_K, 4), // our own outgoing copy (loopback shows both)
        Op(LD_B_ABS, 9),
        Need(JEQ_K, 6), // TCP
        Op(LD_H_ABS, 6),
        Reject(JSET_K, 0x1fff), // a fragment
    ];
    if !ip.is_unspecified() {
        prog.extend([Op(LD_W_ABS, 16), Need(JEQ_K, u32::from(ip))]);
    }
    prog.extend([
        Op(LDX_B_MSH, 0), // X = IP header length
        Op(LD_H_IND, 2),
        Need(JEQ_K, u32::from(port)),
        Op(LD_B_IND, 13),
        Op(AND_K, 0x12),
        Need(JEQ_K, 0x02), // SYN without ACK
        Op(RET_K, 128),
        Op(RET_K, 0), // DROP
    ]);
    let drop_at = prog.len() - 1;
    let skip = |at: usize| u8::try_from(drop_at - at - 1).unwrap_or(u8::MAX);
    prog.iter()
        .enumerate()
        .map(|(at, insn)| match *insn {
            Op(code, k) => SockFilter::new(code, 0, 0, k),
            Need(code, k) => SockFilter::new(code, 0, skip(at), k),
            Reject(code, k) => SockFilter::new(code, skip(at), 0, k),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_syn_to_the_port_names_a_client() {
        let mut packet = [0u8; 40];
        packet[0] = 0x45;
        packet[9] = 6;
        packet[12..16].copy_from_slice(&[10, 1, 0, 1]);
        packet[20..22].copy_from_slice(&40000u16.to_be_bytes());
        packet[22..24].copy_from_slice(&7000u16.to_be_bytes());
        packet[33] = 0x02; // SYN
        let addr = syn_source(&packet, 7000).expect("a SYN");
        assert_eq!(addr, "10.1.0.1:40000".parse().expect("addr"));
        assert_eq!(syn_source(&packet, 7001), None, "another port");
        assert_eq!(syn_source(&packet[..21], 7000), None, "truncated");
        packet[33] = 0x12; // SYN-ACK
        assert_eq!(syn_source(&packet, 7000), None, "not a client's SYN");
    }
}
