//! HTTP/2 sessions against a fake acceptor (`protocol/README.md`, "HTTP/2 sessions"): the
//! registration names `h2` and the streams, the acceptor answers the `101` that names `h2`
//! again and then drives the session as an HTTP/2 client (hyper's), as Sluice does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use sluice_sdk::{serve, ClientAddr, Error, SessionService};
use support::h2::{h2_options, Event, H2Acceptor};
use support::{registered, within};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Requests to `/gated` wait until `open`; every request is answered with its [`ClientAddr`].
#[derive(Debug, Default)]
struct Gate {
    in_flight: watch::Sender<usize>,
    max: AtomicUsize,
    open: watch::Sender<bool>,
}

impl Gate {
    async fn in_flight(&self, n: usize) {
        let mut in_flight = self.in_flight.subscribe();
        within(in_flight.wait_for(|now| *now == n)).await.unwrap();
    }
}

fn gated(gate: Arc<Gate>) -> impl SessionService {
    tower::service_fn(move |req: Request<Incoming>| {
        let gate = gate.clone();
        async move {
            let client = req
                .extensions()
                .get::<ClientAddr>()
                .map_or_else(|| "none".to_owned(), ToString::to_string);
            if req.uri().path() == "/gated" {
                gate.in_flight.send_modify(|n| *n += 1);
                let now = *gate.in_flight.borrow();
                gate.max.fetch_max(now, Ordering::SeqCst);
                let mut open = gate.open.subscribe();
                let _ = open.wait_for(|open| *open).await;
                gate.in_flight.send_modify(|n| *n -= 1);
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(client))))
        }
    })
}

/// `GET path` on the session, with `Sluice-Client-Addr: client` if given; the status and body.
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    path: &str,
    client: Option<&str>,
) -> Result<(StatusCode, String), hyper::Error> {
    let mut req = Request::get(format!("http://app.example{path}"));
    if let Some(client) = client {
        req = req.header("sluice-client-addr", client);
    }
    sender.ready().await?;
    let res = sender
        .send_request(req.body(Full::default()).unwrap())
        .await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec()).unwrap()))
}

/// Sends `GET /` until one is refused: the SDK's `GOAWAY` has arrived. (Until its second,
/// final one, which names the last stream it took, new streams are still served.)
async fn goaway_seen(sender: &mut SendRequest<Full<Bytes>>) {
    within(async {
        while send(sender, "/", None).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn streams_are_served_at_once_up_to_the_declared_number_with_the_client_address() {
    let mut fake = H2Acceptor::start().await;
    let gate = Arc::new(Gate::default());
    let sessions = serve(h2_options(fake.addr, 1, 4), gated(gate.clone())).unwrap();
    let session = fake.session().await;
    assert_eq!(session.registration.streams, Some(4));
    assert_eq!(session.registration.capacity, Some(1));
    registered(&sessions, 1).await;

    // No field: the session's peer, the acceptor. (The round trip also delivers the SDK's
    // SETTINGS before the calls below.)
    let mut sender = session.sender.clone();
    let answer = send(&mut sender, "/", None).await.unwrap();
    assert_eq!(answer, (StatusCode::OK, fake.addr.to_string()));

    let mut calls = JoinSet::new();
    for i in 1..=6 {
        let mut sender = session.sender.clone();
        calls.spawn(async move {
            let client = format!("203.0.113.{i}:4711");
            let answer = send(&mut sender, "/gated", Some(&client)).await.unwrap();
            (client, answer)
        });
    }
    gate.in_flight(4).await;
    // The other two wait inside the connection: the SDK's SETTINGS allow four streams.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*gate.in_flight.borrow(), 4);
    gate.open.send_replace(true);
    let answers = within(calls.join_all()).await;
    assert_eq!(answers.len(), 6);
    for (client, answer) in answers {
        assert_eq!(answer, (StatusCode::OK, client));
    }
    assert_eq!(gate.max.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_shrink_sends_goaway_and_the_stream_in_flight_finishes() {
    let mut fake = H2Acceptor::start().await;
    let gate = Arc::new(Gate::default());
    let sessions = serve(h2_options(fake.addr, 1, 2), gated(gate.clone())).unwrap();
    let mut session = fake.session().await;
    registered(&sessions, 1).await;
    let mut sender = session.sender.clone();
    let busy = tokio::spawn(async move { send(&mut sender, "/gated", None).await });
    gate.in_flight(1).await;

    sessions.set_capacity(0);
    goaway_seen(&mut session.sender).await;
    assert!(!busy.is_finished(), "the stream in flight was cut");
    assert_eq!(sessions.registered(), 1);
    gate.open.send_replace(true);
    let (status, _) = within(busy).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    // Then the SDK closes the session, and does not dial another: it was retired.
    registered(&sessions, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        fake.events.try_recv().is_err(),
        "a retired session was re-dialed"
    );
}

#[tokio::test]
async fn shutdown_sends_goaway_once_the_drain_is_answered() {
    let mut fake = H2Acceptor::start().await;
    let gate = Arc::new(Gate::default());
    let sessions = serve(h2_options(fake.addr, 1, 2), gated(gate.clone())).unwrap();
    let mut session = fake.session().await;
    registered(&sessions, 1).await;
    let mut sender = session.sender.clone();
    let busy = tokio::spawn(async move { send(&mut sender, "/gated", None).await });
    gate.in_flight(1).await;

    let shutdown = tokio::spawn(sessions.shutdown());
    assert!(matches!(fake.next().await, Event::Drain));
    // This acceptor closes nothing itself; the SDK's GOAWAY ends the session.
    goaway_seen(&mut session.sender).await;
    assert!(!busy.is_finished(), "the stream in flight was cut");
    assert!(!shutdown.is_finished());
    gate.open.send_replace(true);
    let (status, _) = within(busy).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    // It returns once the session has closed.
    within(shutdown).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_session_the_acceptor_closes_is_dialed_again() {
    let mut fake = H2Acceptor::start().await;
    let gate = Arc::new(Gate::default());
    let sessions = serve(h2_options(fake.addr, 1, 2), gated(gate)).unwrap();
    let mut first = fake.session().await;
    registered(&sessions, 1).await;
    assert_eq!(send(&mut first.sender, "/", None).await.unwrap().0, 200);
    first.conn.abort();

    let mut second = fake.session().await;
    assert_eq!(second.registration.streams, Some(2));
    assert_eq!(send(&mut second.sender, "/", None).await.unwrap().0, 200);
    registered(&sessions, 1).await;
    assert_eq!(sessions.subscribe().borrow().registrations, 2);
}

#[tokio::test]
async fn an_acceptor_without_http2_sessions_stops_the_slot_for_good() {
    // The HTTP/1.1 fake: its 101 names no protocol, as an acceptor older than HTTP/2 sessions.
    let (mut fake, addr) = support::Fake::tcp().await;
    let sessions = serve(h2_options(addr, 1, 8), gated(Arc::default())).unwrap();
    let session = fake.session().await;
    assert_eq!(session.registration.streams, Some(8));
    let mut status = sessions.subscribe();
    let error = within(status.wait_for(|s| s.last_error.is_some()))
        .await
        .unwrap()
        .last_error
        .clone()
        .unwrap();
    assert!(matches!(error, Error::Http2Unsupported), "{error}");
    assert!(!error.is_retryable());
    assert!(
        error.to_string().contains("does not take HTTP/2 sessions"),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.pending(), 0, "the slot dialed again");
    assert_eq!(sessions.registered(), 0);
}

#[test]
fn stream_counts_outside_1_to_1000_are_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (streams, ok) in [(0, false), (1, true), (1000, true), (1001, false)] {
        let mut opts = h2_options(addr, 0, streams);
        opts.capacity = 0;
        match serve(opts, gated(Arc::default())) {
            Ok(_) => assert!(ok, "{streams} accepted"),
            Err(Error::Config(message)) => {
                assert!(!ok, "{streams} refused");
                assert!(message.contains("streams"), "{message}");
            }
            Err(e) => panic!("{streams}: {e}"),
        }
    }
}
