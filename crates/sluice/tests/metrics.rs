//! What `/metrics` counts beyond requests (issue 28, item 11): responses of static endpoints
//! by status class with their latency, and 503s for want of a session by reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use support::{get, static_config, Backend, TestProxy};

fn value(proxy: &TestProxy, name: &str) -> Option<f64> {
    proxy
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
}

#[tokio::test]
async fn static_responses_are_counted_by_endpoint_and_class() {
    let backend = Backend::start("b").await;
    let proxy = TestProxy::start(&static_config(&[backend.addr], "")).await;
    let client = support::client();
    for _ in 0..3 {
        assert_eq!(get(&client, &proxy.url("/x")).await.status, 200);
    }
    let labels = format!("cluster=\"backend\",endpoint=\"{}\"", backend.addr);
    let ok = format!("sluice_upstream_responses_total{{{labels},class=\"2xx\"}}");
    assert_eq!(value(&proxy, &ok), Some(3.0));
    let timed = format!("sluice_upstream_response_seconds_count{{{labels}}}");
    assert_eq!(value(&proxy, &timed), Some(3.0));
}

#[tokio::test]
async fn capacity_refusals_are_counted_by_reason() {
    let text = "[acceptor]\nlisten = \"127.0.0.1:0\"\n\
                [[listener]]\nname = \"test\"\nlisten = \"127.0.0.1:0\"\n\
                [[route]]\ncluster = \"api\"\n\
                [cluster.api]\nkind = \"reverse\"\n";
    let proxy = TestProxy::start(text).await;
    let client = support::client();
    for _ in 0..2 {
        assert_eq!(get(&client, &proxy.url("/x")).await.status, 503);
    }
    let name =
        "sluice_capacity_refusals_total{cluster=\"api\",slice=\"default\",reason=\"no_sessions\"}";
    assert_eq!(value(&proxy, name), Some(2.0));
}
