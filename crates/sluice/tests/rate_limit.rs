//! A route's `rate_limit` (issue 33, item 2): a token bucket per client address or per a
//! field's value; a request past it is answered 429 with `Retry-After`, never reaches the
//! upstream, and leaves the connection open; a reload that keeps the route's limit keeps its
//! buckets. The test command runs these on the fast path and again with it off (hyper).
#![allow(clippy::unwrap_used)]

use crate::support;

use std::net::{IpAddr, SocketAddr};

use sluice::Proxy;
use support::Backend;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// `/limited` allows 2 requests at once, then one per hour, per client; `/keyed` the same
/// per `x-api-key`; everything else is unlimited.
fn config(backend: SocketAddr, rate: &str) -> String {
    format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"limited\"\npath_prefix = \"/limited\"\ncluster = \"backend\"\n\
         rate_limit = {{ rate = \"{rate}\", burst = 2 }}\n\
         [[route]]\nname = \"keyed\"\npath_prefix = \"/keyed\"\ncluster = \"backend\"\n\
         rate_limit = {{ rate = \"1/h\", burst = 2, key = \"header:x-api-key\" }}\n\
         [[route]]\nname = \"open\"\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{backend}\"]\n"
    )
}

struct Running {
    addr: SocketAddr,
    in_place: sluice::InPlace,
    metrics: std::sync::Arc<sluice::Metrics>,
}

async fn start(backend: &Backend) -> Running {
    let text = config(backend.addr, "1/h");
    let config = sluice::config::parse_str(&text, "t.toml", std::path::Path::new(".")).unwrap();
    let proxy = Proxy::bind(&config).await.unwrap();
    let running = Running {
        addr: proxy.local_addrs()[0].1,
        in_place: proxy.in_place(),
        metrics: std::sync::Arc::clone(proxy.metrics()),
    };
    tokio::spawn(proxy.run_until(std::future::pending()));
    running
}

/// A keep-alive connection from `from`.
struct Conn(TcpStream);

impl Conn {
    async fn from(from: [u8; 4], to: SocketAddr) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(IpAddr::from(from), 0)).unwrap();
        Self(socket.connect(to).await.unwrap())
    }

    /// Sends `GET path` with `fields` and reads the answer.
    async fn get(&mut self, path: &str, fields: &str) -> String {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
        self.0.write_all(req.as_bytes()).await.unwrap();
        support::read_answer(&mut self.0).await.expect("closed")
    }
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

fn field<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

#[tokio::test]
async fn past_the_burst_a_client_gets_429_with_retry_after_and_its_connection_stays_open() {
    let backend = Backend::start("b").await;
    let proxy = start(&backend).await;
    let mut conn = Conn::from([127, 0, 0, 1], proxy.addr).await;
    for _ in 0..2 {
        assert_eq!(status(&conn.get("/limited", "").await), "200");
    }
    let refused = conn.get("/limited", "").await;
    assert_eq!(status(&refused), "429", "{refused}");
    // One token an hour: the next is an hour away.
    let wait: u32 = field(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((3500..=3600).contains(&wait), "{refused}");
    assert!(refused.ends_with("too many requests\n"), "{refused}");
    assert_eq!(field(&refused, "connection"), None, "{refused}");
    // The same connection goes on: other routes are not limited.
    assert_eq!(status(&conn.get("/open", "").await), "200");
    assert_eq!(
        backend.requests(),
        3,
        "the refused request reached the backend"
    );
    // Another client has its own bucket.
    let mut other = Conn::from([127, 0, 0, 2], proxy.addr).await;
    assert_eq!(status(&other.get("/limited", "").await), "200");
    let metrics = proxy.metrics.render();
    let refused = "sluice_requests_total{route=\"limited\",status=\"429\"} 1";
    assert!(metrics.contains(refused), "{metrics}");
    // All five went by the fast path when it is on (the 429 included).
    if let Some(served) = support::fast_path_served(&proxy.metrics) {
        assert_eq!(served, 5, "{metrics}");
    }
}

#[tokio::test]
async fn a_keyed_limit_follows_the_key_across_clients_and_a_missing_key_is_the_client() {
    let backend = Backend::start("b").await;
    let proxy = start(&backend).await;
    let alice = "x-api-key: alice\r\n";
    let mut one = Conn::from([127, 0, 0, 1], proxy.addr).await;
    let mut two = Conn::from([127, 0, 0, 2], proxy.addr).await;
    assert_eq!(status(&one.get("/keyed", alice).await), "200");
    assert_eq!(status(&two.get("/keyed", alice).await), "200");
    assert_eq!(
        status(&one.get("/keyed", alice).await),
        "429",
        "alice's bucket is shared"
    );
    assert_eq!(
        status(&two.get("/keyed", "x-api-key: bob\r\n").await),
        "200"
    );
    // Without the field, the client's address is the key: leaving it out is no way around.
    for _ in 0..2 {
        assert_eq!(status(&one.get("/keyed", "").await), "200");
    }
    assert_eq!(status(&one.get("/keyed", "").await), "429");
}

#[tokio::test]
async fn a_reload_keeps_the_buckets_of_an_unchanged_limit_and_a_new_limit_starts_afresh() {
    let backend = Backend::start("b").await;
    let proxy = start(&backend).await;
    let mut conn = Conn::from([127, 0, 0, 1], proxy.addr).await;
    for _ in 0..2 {
        assert_eq!(status(&conn.get("/limited", "").await), "200");
    }
    assert_eq!(status(&conn.get("/limited", "").await), "429");
    // The same limit, another route added before it: still empty.
    let text = config(backend.addr, "1/h").replace(
        "[[route]]\nname = \"open\"",
        "[[route]]\nname = \"extra\"\npath_prefix = \"/extra\"\ncluster = \"backend\"\n\
         [[route]]\nname = \"open\"",
    );
    let same = sluice::config::parse_str(&text, "t.toml", std::path::Path::new(".")).unwrap();
    assert!(proxy.in_place.apply(&same).is_some(), "applied in place");
    assert_eq!(
        status(&conn.get("/limited", "").await),
        "429",
        "a reload refilled the bucket"
    );
    // A new limit: new buckets.
    let text = config(backend.addr, "2/h");
    let changed = sluice::config::parse_str(&text, "t.toml", std::path::Path::new(".")).unwrap();
    assert!(proxy.in_place.apply(&changed).is_some());
    assert_eq!(status(&conn.get("/limited", "").await), "200");
}
