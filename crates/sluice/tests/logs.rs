//! The lines an operator needs: refused registrations, refused requests (rate-limited, with a
//! count) and upstream failures naming their cluster and endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod log_capture;
mod reverse_support;
mod support;

use http::StatusCode;
use log_capture::{captured_logs, lines_with};
use reverse_support::service::dial;
use reverse_support::{get, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};
use support::upstream::{ObservedBackend, RefusingPort};
use support::{static_config, TestProxy};

#[tokio::test]
async fn a_refused_registration_leaves_a_line_with_its_status_and_reason() {
    let logs = captured_logs();
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let mut spec = ServiceSpec::new("a", 1);
    spec.service = "nosuch".into();
    for _ in 0..20 {
        let (_, status) = dial(proxy.acceptor, &spec.registration()).await;
        assert_eq!(status, 404);
    }
    let lines = lines_with(&logs, "service registration refused");
    // A service re-dials when refused: one line per interval, not one per attempt.
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("status=404"), "{}", lines[0]);
    assert!(
        lines[0].contains(r#"unknown service "nosuch""#),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("service.addr=127.0.0.1"), "{}", lines[0]);
    proxy.stop().await;
}

#[tokio::test]
async fn admission_queue_503s_leave_one_line_per_interval_with_the_slice() {
    let logs = captured_logs();
    let proxy = start_proxy("queue_timeout = \"20ms\"", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::new("a", 1)).await;
    proxy.idle("default", 1).await;
    let busy = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    for _ in 0..5 {
        let refused = get(proxy.http, "/").await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let lines = lines_with(&logs, "for want of capacity");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    for field in [
        "cluster=api",
        "slice=default",
        "refused=1",
        "queue wait expired",
    ] {
        assert!(lines[0].contains(field), "{field}: {}", lines[0]);
    }
    svc.open_gate();
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    proxy.stop().await;
}

#[tokio::test]
async fn a_static_upstream_failure_names_the_cluster_and_the_endpoint() {
    let logs = captured_logs();
    let refusing = RefusingPort::new();
    let proxy = TestProxy::start(&static_config(&[refusing.addr], "")).await;
    let reply = support::get(&support::client(), &proxy.url("/")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    let endpoint = format!("upstream.addr={}", refusing.addr);
    // Other tests here log upstream failures of their own: this one's name its endpoint.
    let lines: Vec<_> = lines_with(&logs, "upstream failed")
        .into_iter()
        .filter(|l| l.contains(&endpoint))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    for field in ["WARN", "cluster=backend", &endpoint, "status=502"] {
        assert!(lines[0].contains(field), "{field}: {}", lines[0]);
    }
    proxy.shutdown();
}

/// Issue 28, item 7: a service that goes away mid-load. The requests waiting for its sessions
/// are answered at once (not at the queue timeout, 30 s here) with the reason that no session
/// is registered; the request in flight on it gets 502, logged with its instance; and the
/// instance losing its last session is logged.
#[tokio::test]
async fn a_service_that_goes_away_fails_its_queue_at_once_and_says_so() {
    let logs = captured_logs();
    let proxy = start_proxy("queue_timeout = \"30s\"", DEFAULT_ROUTE).await;
    let mut spec = ServiceSpec::new("going-away", 1);
    spec.service = "api".into();
    let svc = Service::start(proxy.acceptor, spec).await;
    proxy.idle("default", 1).await;
    let addr = proxy.http;
    let in_flight = tokio::spawn(async move {
        reverse_support::send_body(addr, http::Method::POST, "/wait", "payload").await
    });
    proxy
        .cluster
        .wait_until(|c| c.idle_sessions("default") == 0)
        .await;
    let queued: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { get(addr, "/x").await }))
        .collect();
    proxy.cluster.wait_until(|c| c.queued("default") == 3).await;
    svc.kill();
    let guard = std::time::Duration::from_secs(10);
    for q in queued {
        let reply = tokio::time::timeout(guard, q)
            .await
            .expect("still queued")
            .unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            reply.text().contains("no sessions registered"),
            "{}",
            reply.text()
        );
    }
    let posted = tokio::time::timeout(guard, in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(posted.status, StatusCode::BAD_GATEWAY);
    let failed = lines_with(&logs, "upstream failed");
    assert!(
        failed
            .iter()
            .any(|l| l.contains("WARN") && l.contains("cluster=") && l.contains("api")),
        "{failed:#?}"
    );
    let gone = lines_with(&logs, "instance has no sessions left");
    assert!(gone.iter().any(|l| l.contains("going-away")), "{gone:#?}");
    let answered = lines_with(&logs, "waiting requests are answered 503 at once");
    assert!(!answered.is_empty());
    proxy.stop().await;
}

/// Issue 28, item 14: a flapping health check is one warning with what the check saw, not an
/// INFO line per transition.
#[tokio::test]
async fn a_flapping_endpoint_is_one_warning_with_its_reason() {
    let logs = captured_logs();
    let flaky = ObservedBackend::start("flaky").await;
    let extra = r#"health_check = { path = "/healthz", interval = "10ms", timeout = "1s", unhealthy_threshold = 1, healthy_threshold = 1 }"#;
    let proxy = TestProxy::start(&static_config(&[flaky.addr], extra)).await;
    // Checks start with the cluster's first request.
    let reply = support::get(&support::client(), &proxy.url("/")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let endpoint = support::upstream::endpoint(&proxy, flaky.addr);
    let mut transitions = 0;
    for healthy in [false, true].repeat(5) {
        flaky
            .healthy
            .store(healthy, std::sync::atomic::Ordering::SeqCst);
        let settled = async {
            while endpoint.is_healthy() != healthy {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), settled)
            .await
            .expect("the health check follows the endpoint");
        transitions += 1;
    }
    let addr = format!("upstream.addr={}", flaky.addr);
    let lines: Vec<_> = lines_with(&logs, "rotation")
        .into_iter()
        .filter(|l| l.contains(&addr))
        .collect();
    assert_eq!(lines.len(), 1, "{transitions} transitions: {lines:#?}");
    for field in [
        "WARN",
        "out of rotation",
        "cluster=backend",
        "reason=status 503",
    ] {
        assert!(lines[0].contains(field), "{field}: {}", lines[0]);
    }
    proxy.shutdown();
}

/// Issue 48, item 3: a gRPC call whose own deadline (`grpc-timeout`) expires before a static
/// cluster's endpoint answers is DEADLINE_EXCEEDED, and it is the client's deadline, not an
/// upstream failure: no WARN "upstream failed … upstream response timed out status=504" (the
/// cluster's `response_timeout`, 30 s here, was never reached).
#[tokio::test]
async fn a_grpc_deadline_that_expires_is_not_logged_as_an_upstream_failure() {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let logs = captured_logs();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow = listener.local_addr().unwrap();
    // An h2c service that answers after 5 s: far past the call's deadline.
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|_req| async {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                    bytes::Bytes::new(),
                )))
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    let extra = "protocol = \"h2c\"\nresponse_timeout = \"30s\"";
    let proxy = TestProxy::start(&static_config(&[slow], extra)).await;
    let mut client = support::h2_connect_with::<Full<bytes::Bytes>>(proxy.addr()).await;
    let req = http::Request::post(proxy.url("/echo.Echo/Slow"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "50m")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "4", "DEADLINE_EXCEEDED");
    let endpoint = format!("upstream.addr={slow}");
    let lines: Vec<_> = lines_with(&logs, "upstream failed")
        .into_iter()
        .filter(|l| l.contains(&endpoint))
        .collect();
    assert!(lines.is_empty(), "{lines:#?}");
    proxy.shutdown();
}

/// The same on a reverse cluster: the call's deadline passing while its service works is not
/// logged WARN "upstream failed" (there, the line names the client, not an endpoint).
#[tokio::test]
async fn a_grpc_deadline_on_a_reverse_cluster_is_not_logged_as_an_upstream_failure() {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let logs = captured_logs();
    let proxy = start_proxy("response_timeout = \"30s\"", DEFAULT_ROUTE).await;
    let _svc = Service::start(proxy.acceptor, ServiceSpec::h2("deadline", 1, 4)).await;
    proxy.idle("default", 4).await;
    let stream = tokio::net::TcpStream::connect(proxy.http).await.unwrap();
    let client_addr = stream.local_addr().unwrap();
    let (mut client, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post(format!("http://{}/delay/5000", proxy.http))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "50m")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let res = client.send_request(req).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "4", "DEADLINE_EXCEEDED");
    let client = format!("client.addr={client_addr}");
    let lines: Vec<_> = lines_with(&logs, "upstream failed")
        .into_iter()
        .filter(|l| l.contains(&client))
        .collect();
    assert!(lines.is_empty(), "{lines:#?}");
    proxy.stop().await;
}
