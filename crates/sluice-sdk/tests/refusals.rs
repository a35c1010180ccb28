//! How refusals are handled: configuration errors stop a slot, load errors are retried.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_sdk::{serve, Error};
use sluice_session::{Hello, Rejection};
use support::{hello, options, within, Event, Fake, Listener};
use tokio::net::TcpListener;

async fn fake(policy: support::Policy) -> (Fake, std::net::SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (Fake::start(Listener::Tcp(listener), None, policy), addr)
}

#[tokio::test]
async fn unauthorized_stops_the_slot_without_retrying() {
    let policy: support::Policy = Arc::new(|hello: &Hello| match hello {
        Hello::Register(_) | Hello::Control(..) => Some(Rejection::unauthorized()),
        Hello::Drain(_) => None,
    });
    let (mut fake, addr) = fake(policy).await;
    let sessions = serve(options(addr, 2), tower::service_fn(hello)).unwrap();
    for _ in 0..2 {
        assert!(matches!(
            fake.next().await,
            Event::Refused(Hello::Register(_), 401)
        ));
    }
    let mut status = sessions.subscribe();
    within(status.wait_for(|s| s.last_error.is_some()))
        .await
        .unwrap();
    let error = sessions.last_error().unwrap();
    assert!(
        matches!(error, Error::Refused { status: 401, .. }),
        "{error}"
    );
    assert!(!error.is_retryable());

    within(sessions.shutdown()).await.unwrap();
    // Only the drain followed: neither slot dialed again.
    assert!(matches!(fake.next().await, Event::Drain(_)));
    assert_eq!(fake.pending(), 0);
}

#[tokio::test]
async fn unavailable_is_retried_with_backoff_until_accepted() {
    let refusals = Arc::new(AtomicUsize::new(3));
    let policy: support::Policy = Arc::new(move |_: &Hello| {
        let left = refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        left.is_ok().then(|| Rejection::unavailable("draining"))
    });
    let (mut fake, addr) = fake(policy).await;
    let sessions = serve(options(addr, 1), tower::service_fn(hello)).unwrap();
    for _ in 0..3 {
        assert!(matches!(fake.next().await, Event::Refused(_, 503)));
    }
    let mut session = fake.session().await;
    assert_eq!(session.get("/ok").await.body, "hello /ok");
    support::registered(&sessions, 1).await;
    assert!(matches!(
        sessions.last_error(),
        Some(Error::Refused { status: 503, .. })
    ));
}
