//! A drained instance stays out (`protocol/README.md`, `410 Gone`): its slots stop, and one
//! registration probes every `drained_probe` until an operator resumes it; then every slot
//! dials at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_sdk::serve;
use sluice_session::{Hello, Rejection};
use support::{hello, options, registered, within, Event, Fake, Listener};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// A fake acceptor that answers registrations `410` while `drained` is set.
async fn holding(drained: Arc<AtomicBool>) -> (Fake, std::net::SocketAddr) {
    let policy: support::Policy = Arc::new(move |hello: &Hello| match hello {
        Hello::Register(_) if drained.load(Ordering::SeqCst) => {
            Some(Rejection::drained("hello", "i-1"))
        }
        _ => None,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (Fake::start(Listener::Tcp(listener), None, policy), addr)
}

async fn refused_410(fake: &mut Fake) {
    match fake.next().await {
        Event::Refused(Hello::Register(_), 410) => {}
        Event::Refused(_, status) => panic!("expected a 410, got {status}"),
        _ => panic!("expected a refused registration"),
    }
}

#[tokio::test]
async fn a_drained_instance_probes_once_per_interval_and_returns_when_resumed() {
    let drained = Arc::new(AtomicBool::new(true));
    let (mut fake, addr) = holding(drained.clone()).await;
    let probe = Duration::from_millis(200);
    let mut opts = options(addr, 3);
    opts.drained_probe = probe;
    let sessions = serve(opts, tower::service_fn(hello)).unwrap();
    // Each slot's first dial is refused; then the slots wait.
    for _ in 0..3 {
        refused_410(&mut fake).await;
    }
    // One probe per interval for the whole instance, not one per slot per backoff (the
    // backoff here is 5 to 50 ms): consecutive probes are far apart.
    let mut last = Instant::now();
    for _ in 0..3 {
        refused_410(&mut fake).await;
        let now = Instant::now();
        assert!(now - last >= probe / 2, "probes {:?} apart", now - last);
        last = now;
    }
    assert_eq!(sessions.registered(), 0);
    assert!(sessions.last_error().unwrap().is_drained());

    // `sluice ctl resume`: the next probe registers, and the other slots follow at once.
    drained.store(false, Ordering::SeqCst);
    let _all = fake.sessions(3).await;
    registered(&sessions, 3).await;
}

#[tokio::test]
async fn setting_the_capacity_while_drained_dials_at_once() {
    let drained = Arc::new(AtomicBool::new(true));
    let (mut fake, addr) = holding(drained.clone()).await;
    let mut opts = options(addr, 1);
    opts.drained_probe = Duration::from_secs(3600);
    let sessions = serve(opts, tower::service_fn(hello)).unwrap();
    refused_410(&mut fake).await;
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.last_error.is_some()))
        .await
        .unwrap();
    drained.store(false, Ordering::SeqCst);
    sessions.set_capacity(1);
    let _one = fake.session().await;
    registered(&sessions, 1).await;
}

#[tokio::test]
async fn shutdown_while_drained_returns() {
    let drained = Arc::new(AtomicBool::new(true));
    let (mut fake, addr) = holding(drained).await;
    let mut opts = options(addr, 2);
    opts.drained_probe = Duration::from_secs(3600);
    let sessions = serve(opts, tower::service_fn(hello)).unwrap();
    for _ in 0..2 {
        refused_410(&mut fake).await;
    }
    within(sessions.shutdown()).await.unwrap();
    assert!(matches!(fake.next().await, Event::Drain(_)));
    assert_eq!(fake.pending(), 0);
}
