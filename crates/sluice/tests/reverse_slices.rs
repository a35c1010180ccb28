//! Client-CIDR slicing: two routes to one reverse cluster draw on separate capacity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use http::{Method, StatusCode};
use reverse_support::{send_from, start_proxy, Service, ServiceSpec};

const ROUTES: &str = "[[route]]\nname = \"mobile\"\nclient_cidr = [\"127.0.0.2/32\"]\n\
                      cluster = \"api\"\nslice = \"mobile\"\n\
                      [[route]]\nname = \"rest\"\ncluster = \"api\"\n";

#[tokio::test]
async fn client_cidr_routes_pick_their_slice() {
    let proxy = start_proxy("", ROUTES).await;
    let fast = Service::start(proxy.acceptor, ServiceSpec::new("fast", 2)).await;
    let mut spec = ServiceSpec::new("slow", 1);
    spec.slice = "mobile".into();
    let slow = Service::start(proxy.acceptor, spec).await;
    proxy.idle("default", 2).await;
    proxy.idle("mobile", 1).await;
    for _ in 0..4 {
        let res = send_from([127, 0, 0, 2].into(), proxy.http, Method::GET, "/").await;
        assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "slow"));
        let res = send_from([127, 0, 0, 1].into(), proxy.http, Method::GET, "/").await;
        assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "fast"));
    }
    assert_eq!((fast.requests(), slow.requests()), (4, 4));
    proxy.stop().await;
}
