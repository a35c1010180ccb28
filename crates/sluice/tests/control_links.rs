//! A service's control link to a node (many nodes, `protocol/README.md`): the node reports its
//! demand for the slice, retires the instance's sessions when asked (idle ones at once, busy
//! ones when their responses end, never one with a request in flight), and says `DRAINING`
//! when it stops for good. The admin API shows the link and answers `/ready`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::time::Duration;

use reverse_support::{get, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use sluice_session::control::{Demand, LineReader, NodeLine, ServiceLine};
use sluice_session::{parse_reply, Identity, Parsed, Registration, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

/// A control link as a service holds it.
struct Link {
    lines: LineReader<ReadHalf<TcpStream>>,
    write: WriteHalf<TcpStream>,
}

impl Link {
    async fn open(acceptor: std::net::SocketAddr, instance: &str, capacity: u32) -> Self {
        let mut identity = Identity::new("api");
        identity.instance = Some(instance.to_owned());
        let reg = Registration {
            identity,
            capacity: Some(capacity),
            streams: None,
        };
        let mut stream = TcpStream::connect(acceptor).await.unwrap();
        stream.write_all(&reg.encode_control()).await.unwrap();
        let mut buf = Vec::new();
        let rest = loop {
            let mut chunk = [0u8; 512];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the acceptor closed the link");
            buf.extend_from_slice(&chunk[..n]);
            if let Parsed::Complete(reply, len) = parse_reply(&buf).unwrap() {
                assert_eq!(reply, Reply::Control);
                break buf[len..].to_vec();
            }
        };
        let (read, write) = tokio::io::split(stream);
        Self {
            lines: LineReader::new(read, &rest),
            write,
        }
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
