//! A service's control link to a node (many nodes, `protocol/README.md`): the node reports its
//! demand for the slice, retires the instance's sessions when asked (idle ones at once, busy
//! ones when their responses end, never one with a request in flight), and says `DRAINING`
//! when it stops for good. The admin API shows the link and answers `/ready`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::net::IpAddr;
use std::time::Duration;

use reverse_support::service::dial_raw;
use reverse_support::{get, start_proxy, start_proxy_full, Service, ServiceSpec, DEFAULT_ROUTE};
use sluice_session::control::{Demand, LineReader, NodeLine, ServiceLine};
use sluice_session::{parse_reply, Drain, Identity, Parsed, Registration, Reply, SplitBy};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpSocket, TcpStream};

/// A control link as a service holds it.
struct Link {
    lines: LineReader<ReadHalf<TcpStream>>,
    write: WriteHalf<TcpStream>,
}

impl Link {
    async fn open(acceptor: std::net::SocketAddr, instance: &str, capacity: u32) -> Self {
        let from = [127, 0, 0, 1].into();
        let link = Self::try_open(acceptor, from, instance, "default", capacity).await;
        link.unwrap_or_else(|status| panic!("the acceptor refused the link: {status}"))
    }

    /// A link from the local address `from` for `slice`, or the acceptor's refusal status.
    async fn try_open(
        acceptor: std::net::SocketAddr,
        from: IpAddr,
        instance: &str,
        slice: &str,
        capacity: u32,
    ) -> Result<Self, u16> {
        Self::open_as(
            acceptor,
            from,
            (instance, slice, capacity),
            SplitBy::Instance,
        )
        .await
    }

    /// [`try_open`](Self::try_open) by an SDK that splits as `split` says.
    async fn open_as(
        acceptor: std::net::SocketAddr,
        from: IpAddr,
        (instance, slice, capacity): (&str, &str, u32),
        split: SplitBy,
    ) -> Result<Self, u16> {
        let mut identity = Identity::new("api");
        identity.instance = Some(instance.to_owned());
        identity.slice = slice.to_owned();
        let reg = Registration {
            identity,
            capacity: Some(capacity),
            streams: None,
        };
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind((from, 0).into()).unwrap();
        let mut stream = socket.connect(acceptor).await.unwrap();
        stream
            .write_all(&reg.encode_control_split(split))
            .await
            .unwrap();
        let mut buf = Vec::new();
        let rest = loop {
            let mut chunk = [0u8; 512];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the acceptor closed the link without an answer");
            buf.extend_from_slice(&chunk[..n]);
            match parse_reply(&buf).unwrap() {
                Parsed::Complete(Reply::Control, len) => break buf[len..].to_vec(),
                Parsed::Complete(Reply::Refused(status), _) => return Err(status),
                Parsed::Complete(other, _) => panic!("not a link's answer: {other:?}"),
                Parsed::Partial => {}
            }
        };
        let (read, write) = tokio::io::split(stream);
        Ok(Self {
            lines: LineReader::new(read, &rest),
            write,
        })
    }

    /// Sends a line the node refuses, and waits for it to close the link: every line before
    /// it has been acted on.
    async fn close_after_acting(mut self) {
        self.write.write_all(b"BOGUS\n").await.unwrap();
        let closed = async { while self.lines.next_line().await.is_ok() {} };
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the node kept a link that sent a malformed line");
    }

    async fn next(&mut self) -> NodeLine {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("no line from the node for 10 s")
            .unwrap();
        NodeLine::parse(&line).unwrap()
    }

    /// Reads until a `DEMAND` satisfies `want`.
    async fn demand_until(&mut self, want: impl Fn(&Demand) -> bool) -> Demand {
        loop {
            if let NodeLine::Demand(d) = self.next().await {
                if want(&d) {
                    return d;
                }
            }
        }
    }

    /// Reads until a `FLOOR`, and says what it said.
    async fn floor(&mut self) -> bool {
        loop {
            if let NodeLine::Floor(on) = self.next().await {
                return on;
            }
        }
    }

    async fn send(&mut self, line: ServiceLine) {
        self.write.write_all(&line.encode()).await.unwrap();
    }
}

#[tokio::test]
async fn the_node_reports_its_demand_as_it_changes() {
    let proxy = start_proxy("queue_timeout = \"10s\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 2)).await;
    proxy.idle("default", 2).await;
    let mut link = Link::open(proxy.acceptor, "a", 2).await;
    let first = link.demand_until(|_| true).await;
    assert_eq!(
        first,
        Demand {
            in_flight: 0,
            queued: 0,
            refused: 0,
            sessions: 2
        }
    );
    // Three requests that wait at the service: two in flight, one queued.
    let addr = proxy.http;
    let waiting: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { get(addr, "/wait").await }))
        .collect();
    let busy = link
        .demand_until(|d| d.in_flight == 2 && d.queued == 1)
        .await;
    assert_eq!(busy.sessions, 2);
    svc.open_gate();
    for w in waiting {
        assert_eq!(w.await.unwrap().status, 200);
    }
    link.demand_until(|d| d.in_flight == 0 && d.queued == 0)
        .await;
}

#[tokio::test]
async fn refusals_for_want_of_capacity_are_reported_once() {
    // No session at all: every request is refused at once, and the node says how many.
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let mut link = Link::open(proxy.acceptor, "a", 1).await;
    link.demand_until(|_| true).await;
    for _ in 0..3 {
        assert_eq!(get(proxy.http, "/").await.status, 503);
    }
    let mut refused = 0;
    while refused < 3 {
        refused += link.demand_until(|d| d.refused > 0).await.refused;
    }
    assert_eq!(refused, 3);
}

#[tokio::test]
async fn retire_closes_idle_sessions_now_and_busy_ones_after_their_response() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 3)).await;
    proxy.idle("default", 3).await;
    let mut link = Link::open(proxy.acceptor, "a", 3).await;
    // One request holds a session; retiring two closes the two idle ones.
    let addr = proxy.http;
    let busy = tokio::spawn(async move { get(addr, "/wait").await });
    link.demand_until(|d| d.in_flight == 1).await;
    link.send(ServiceLine::Retire(2)).await;
    svc.wait_live(1).await;
    // The busy one, asked too, finishes its request first.
    link.send(ServiceLine::Retire(1)).await;
    link.demand_until(|d| d.sessions == 1).await;
    assert_eq!(
        svc.live(),
        1,
        "a session with a request in flight was closed"
    );
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, 200);
    svc.wait_live(0).await;
    assert_eq!(svc.max_in_flight(), 1);
}

/// What a link asked lapses with the link (protocol/README.md, `RETIRE`): a busy session
/// asked to retire on a link that then ends stays once its response is done. Its SDK counts
/// it held again and asks again on its next link if it still wants one fewer; before, the
/// node owed it across links (and forgot it in a hot restart), so the two sides disagreed.
#[tokio::test]
async fn what_a_link_asked_lapses_with_the_link() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let mut link = Link::open(proxy.acceptor, "a", 1).await;
    let addr = proxy.http;
    let busy = tokio::spawn(async move { get(addr, "/wait").await });
    link.demand_until(|d| d.in_flight == 1).await;
    link.send(ServiceLine::Retire(1)).await;
    link.close_after_acting().await;
    // The node has let the link go once it no longer lists it.
    let gone = async {
        while !proxy.cluster.links().list().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the node still lists a link it closed");
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, 200);
    tokio::time::timeout(Duration::from_secs(10), proxy.idle("default", 1))
        .await
        .expect("the session closed for a retirement its link took with it");
    assert_eq!(svc.live(), 1);
}

#[tokio::test]
async fn a_stopping_node_says_draining_and_lists_the_links_capacity() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let mut link = Link::open(proxy.acceptor, "a", 7).await;
    link.demand_until(|_| true).await;
    let declared = || {
        let links = proxy.cluster.links().list();
        links.first().map(|l| (l.instance.clone(), l.capacity()))
    };
    assert_eq!(declared(), Some(("a".to_owned(), 7)));
    // Lines are acted on in order: once the retirement shows, the capacity before it has too.
    link.send(ServiceLine::Capacity(9)).await;
    link.send(ServiceLine::Retire(1)).await;
    svc.wait_live(0).await;
    assert_eq!(declared(), Some(("a".to_owned(), 9)));
    proxy.stop().await;
    while link.next().await != NodeLine::Draining {}
}

/// A peer that names an instance is not that instance: a link from an address none of its
/// sessions came from cannot retire them, nor can a drain request from there drain it.
#[tokio::test]
async fn only_the_instances_own_address_may_retire_or_drain_its_sessions() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("victim", 3)).await;
    proxy.idle("default", 3).await;
    let elsewhere: IpAddr = [127, 0, 0, 2].into();
    let mut link = Link::try_open(proxy.acceptor, elsewhere, "victim", "default", 3)
        .await
        .expect("a link that only listens is allowed");
    link.demand_until(|d| d.sessions == 3).await;
    link.send(ServiceLine::Retire(3)).await;
    link.close_after_acting().await;
    assert_eq!(
        svc.live(),
        3,
        "a link from another address retired the sessions"
    );
    assert_eq!(proxy.cluster.idle_sessions("default"), 3);

    let mut identity = Identity::new("api");
    identity.instance = Some("victim".to_owned());
    let drain = Drain { identity }.encode();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind((elsewhere, 0).into()).unwrap();
    let mut stream = socket.connect(proxy.acceptor).await.unwrap();
    stream.write_all(&drain).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 403"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(svc.live(), 3);
    assert!(!proxy.cluster.instances()[0].is_draining());

    // From the instance's own address, the same line is obeyed.
    let mut own = Link::open(proxy.acceptor, "victim", 3).await;
    own.send(ServiceLine::Retire(1)).await;
    svc.wait_live(2).await;
}

/// Slice names are the services' choice: beyond `max_slices` a new one is refused, and the
/// slices links made go once the links close, so `/status` and `/metrics` stay bounded.
#[tokio::test]
async fn slices_services_name_are_bounded_and_let_go() {
    let proxy = start_proxy_full("max_slices = 4", "", "", DEFAULT_ROUTE).await;
    let local: IpAddr = [127, 0, 0, 1].into();
    let mut links = Vec::new();
    // The route's "default" is one of the four.
    for i in 0..3 {
        let slice = format!("s{i}");
        let link = Link::try_open(proxy.acceptor, local, "a", &slice, 1).await;
        links.push(link.expect("within max_slices"));
    }
    assert_eq!(proxy.cluster.slice_names(), ["default", "s0", "s1", "s2"]);
    let refused = Link::try_open(proxy.acceptor, local, "a", "s3", 1).await;
    assert_eq!(refused.err(), Some(429));
    let mut identity = Identity::new("api");
    identity.slice = "s4".to_owned();
    let reg = Registration {
        identity,
        capacity: None,
        streams: None,
    };
    assert_eq!(
        dial_raw(proxy.acceptor, &reg.encode()).await.1,
        429,
        "a registration too"
    );
    for link in links {
        link.close_after_acting().await;
    }
    let gone = async {
        while proxy.cluster.slice_names() != ["default"] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the closed links' slices stayed");
    // The route's slice stays whatever happens; a new name fits again.
    assert!(Link::try_open(proxy.acceptor, local, "a", "s5", 1)
        .await
        .is_ok());
    assert_eq!(
        get(proxy.http, "/").await.status,
        503,
        "the route still answers"
    );
}

/// Control links reserve no session, so they are bounded on their own: per source address
/// and in all. A closed link frees its place.
#[tokio::test]
async fn control_links_are_bounded_per_address_and_in_all() {
    let acceptor = "max_control_links = 3\nmax_control_links_per_address = 2";
    let proxy = start_proxy_full(acceptor, "", "", DEFAULT_ROUTE).await;
    let (one, two): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
    let first = Link::try_open(proxy.acceptor, one, "a", "default", 1)
        .await
        .unwrap();
    let _second = Link::try_open(proxy.acceptor, one, "b", "default", 1)
        .await
        .unwrap();
    let third = Link::try_open(proxy.acceptor, one, "c", "default", 1).await;
    assert_eq!(third.err(), Some(429), "a third link from one address");
    let _other = Link::try_open(proxy.acceptor, two, "d", "default", 1)
        .await
        .unwrap();
    let over = Link::try_open(proxy.acceptor, [127, 0, 0, 3].into(), "e", "default", 1).await;
    assert_eq!(over.err(), Some(429), "a fourth link in all");
    first.close_after_acting().await;
    let again = async {
        loop {
            if let Ok(link) = Link::try_open(proxy.acceptor, one, "c", "default", 1).await {
                return link;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), again)
        .await
        .expect("a closed link's place never came back");
}

/// Issue 46: with several instances, each kept a session on every node (the floor was per
/// instance). A node now asks one instance per slice for its floor: the largest declared
/// capacity, told with `FLOOR` before the first `DEMAND`, to SDKs that split per service;
/// nobody while an older SDK (which keeps a floor everywhere) has a link open.
#[tokio::test]
async fn the_node_asks_one_instance_for_its_floor() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let local: IpAddr = [127, 0, 0, 1].into();
    let open = |instance: &'static str, capacity, split| {
        Link::open_as(
            proxy.acceptor,
            local,
            (instance, "default", capacity),
            split,
        )
    };
    let mut small = open("small", 4, SplitBy::Service).await.unwrap();
    assert_eq!(
        small.next().await,
        NodeLine::Floor(true),
        "alone, before any DEMAND"
    );
    assert!(matches!(small.next().await, NodeLine::Demand(_)));
    let mut big = open("big", 6, SplitBy::Service).await.unwrap();
    assert_eq!(
        big.next().await,
        NodeLine::Floor(true),
        "the largest capacity"
    );
    assert!(
        !small.floor().await,
        "the smaller instance is told it is not"
    );
    big.close_after_acting().await;
    assert!(
        small.floor().await,
        "the floor comes back when the larger link closes"
    );
    let old = open("old", 8, SplitBy::Instance).await.unwrap();
    assert!(
        !small.floor().await,
        "an older SDK keeps a floor here anyway"
    );
    drop(old);
    assert!(small.floor().await);
}
