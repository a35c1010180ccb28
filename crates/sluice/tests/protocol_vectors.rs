//! The acceptor on a real socket against the shared protocol vectors
//! (protocol/vectors/session.json): every hello, registration and drain the vectors list gets
//! the status they give, from a proxy configured as their `acceptor` fixture says.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use reverse_support::service::dial_raw;
use reverse_support::{start_proxy, TestProxy, DEFAULT_ROUTE};
use sluice_session::vectors::{self, Vectors};

async fn fixture(v: &Vectors) -> TestProxy {
    assert_eq!(
        v.acceptor.cluster, "api",
        "the test harness names its cluster api"
    );
    let tokens: Vec<String> = v.acceptor.tokens.iter().map(|t| format!("{t:?}")).collect();
    start_proxy(&format!("tokens = [{}]", tokens.join(", ")), DEFAULT_ROUTE).await
}

/// Sends `bytes` as a service's first flight to a fresh fixture proxy; returns the status.
async fn answer(v: &Vectors, bytes: &[u8]) -> u16 {
    let proxy = fixture(v).await;
    let (stream, status) = dial_raw(proxy.acceptor, bytes).await;
    drop(stream);
    proxy.stop().await;
    status
}

#[tokio::test]
async fn every_hello_gets_the_vector_status() {
    let v = vectors::load().unwrap();
    let mut checked = 0;
    for case in &v.hellos {
        // `None`: an incomplete head, which the acceptor waits on (until its timeout).
        let Some(status) = case.status else { continue };
        assert_eq!(answer(&v, &case.bytes.0).await, status, "{}", case.name);
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} hellos checked");
}

#[tokio::test]
async fn the_sdk_requests_get_the_vector_status() {
    let v = vectors::load().unwrap();
    for case in v.registrations.iter().chain(&v.drains).chain(&v.controls) {
        assert_eq!(
            answer(&v, &case.bytes.0).await,
            case.status,
            "{}",
            case.name
        );
    }
}
