//! HTTP/2 dial-in sessions (protocol/README.md, "HTTP/2 sessions"): a session's declared
//! streams are its capacity, leased one per request, never more at once at the service; they
//! come back when a client leaves (the stream is reset and the service hears it); drains,
//! retirements and the service's own `GOAWAY` end the session without failing a request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::reverse_support;

use std::time::Duration;

use http::{Method, StatusCode};
use reverse_support::service::dial_raw;
use reverse_support::{get, send, start_proxy, Service, ServiceSpec, DEFAULT_ROUTE};

#[tokio::test]
async fn a_session_takes_its_declared_streams_at_once_and_no_more() {
    let proxy = start_proxy("queue_max = 64\n", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 3)).await;
    // One session of three streams: three units of capacity.
    proxy.idle("default", 3).await;
    let calls: Vec<_> = (0..10)
        .map(|_| tokio::spawn(get(proxy.http, "/delay/150")))
        .collect();
    for call in calls {
        let res = call.await.unwrap();
        assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "a"));
    }
    assert_eq!(svc.requests(), 10);
    // Three at once (all three streams were used), never four.
    assert_eq!(svc.max_in_flight(), 3);
    // Every stream came back, on the one connection.
    proxy.idle("default", 3).await;
    assert_eq!(svc.live(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn streams_of_several_sessions_add_up() {
    let proxy = start_proxy("queue_max = 64\n", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 2, 4)).await;
    proxy.idle("default", 8).await;
    let calls: Vec<_> = (0..16)
        .map(|_| tokio::spawn(get(proxy.http, "/delay/150")))
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(svc.max_in_flight(), 8);
    proxy.idle("default", 8).await;
    proxy.stop().await;
}

#[tokio::test]
async fn bodies_cross_an_http2_session_both_ways() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let _svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 2)).await;
    proxy.idle("default", 2).await;
    // Larger than the session's response buffer and its stream window.
    let res = get(proxy.http, "/big/3000000").await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body.len(), 3_000_000);
    proxy.idle("default", 2).await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_resets_its_stream_and_frees_it() {
    let proxy = start_proxy("queue_timeout = \"5s\"\n", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 1)).await;
    proxy.idle("default", 1).await;
    // HTTP/2 even with one stream: the fast path leaves the slice to hyper's path.
    assert!(proxy.cluster.slice("default").pool().multiplexed());
    let hung = tokio::spawn(send(proxy.http, Method::GET, "/hang"));
    proxy.idle("default", 0).await;
    hung.abort();
    // The reset reaches the service, which drops the request's handler...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while svc.cancelled() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no RST_STREAM reached the service"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and the one stream is free again, on the same connection.
    proxy.idle("default", 1).await;
    let res = get(proxy.http, "/").await;
    assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "a"));
    assert_eq!(svc.live(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn a_service_goaway_fails_no_request() {
    let proxy = start_proxy("queue_max = 64\nqueue_timeout = \"10s\"\n", DEFAULT_ROUTE).await;
    let old = Service::start(proxy.acceptor, ServiceSpec::h2("old", 1, 4)).await;
    proxy.idle("default", 4).await;
    let calls: Vec<_> = (0..12)
        .map(|_| tokio::spawn(get(proxy.http, "/delay/200")))
        .collect();
    proxy.cluster.wait_until(|c| c.queued("default") == 8).await;
    // The old service leaves gracefully while its streams are busy and requests wait; a new
    // one takes over.
    old.goaway();
    let new = Service::start(proxy.acceptor, ServiceSpec::h2("new", 1, 4)).await;
    for call in calls {
        let res = call.await.unwrap();
        assert_eq!(res.status, StatusCode::OK, "{}", res.text());
    }
    old.wait_live(0).await;
    assert_eq!(old.requests() + new.requests(), 12);
    assert!(new.requests() >= 1);
    proxy.idle("default", 4).await;
    proxy.stop().await;
}

/// What a `GOAWAY` needs to cross loopback: nothing in Sluice shows that it came until a
/// request meets it (hyper's client notices only then).
const GOAWAY_CROSSES: Duration = Duration::from_millis(300);

#[tokio::test]
async fn sessions_going_away_together_fail_no_request() {
    // Two instances shut down gracefully at once (a rolling deploy), each with a request in
    // flight and an idle stream; a request may meet both refusals before it finds the third.
    let proxy = start_proxy("queue_timeout = \"5s\"\n", DEFAULT_ROUTE).await;
    let o1 = Service::start(proxy.acceptor, ServiceSpec::h2("o1", 1, 2)).await;
    let o2 = Service::start(proxy.acceptor, ServiceSpec::h2("o2", 1, 2)).await;
    proxy.idle("default", 4).await;
    // Leases take turns between instances: each ends up with one stream held, one idle.
    let mut held = Vec::new();
    for (left, path) in [
        (3, "/wait"),
        (2, "/delay/300"),
        (1, "/wait"),
        (0, "/delay/300"),
    ] {
        held.push(tokio::spawn(get(proxy.http, path)));
        proxy.idle("default", left).await;
    }
    proxy.idle("default", 2).await;
    let n = Service::start(proxy.acceptor, ServiceSpec::new("n", 1)).await;
    proxy.idle("default", 3).await;
    o1.goaway();
    o2.goaway();
    tokio::time::sleep(GOAWAY_CROSSES).await;
    for _ in 0..4 {
        let res = get(proxy.http, "/").await;
        assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "n"));
    }
    assert_eq!(n.requests(), 4);
    o1.open_gate();
    o2.open_gate();
    for call in held {
        assert_eq!(call.await.unwrap().status, StatusCode::OK);
    }
    proxy.stop().await;
}

#[tokio::test]
async fn a_session_going_away_counts_until_its_socket_closes() {
    let proxy = start_proxy("queue_timeout = \"300ms\"\n", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 2)).await;
    proxy.idle("default", 2).await;
    let held = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 1).await;
    svc.goaway();
    tokio::time::sleep(GOAWAY_CROSSES).await;
    // The request meets the refusal and waits for a session (none comes in time)...
    let res = get(proxy.http, "/").await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    // ...while the session still carries its request: it counts, against its limits too.
    assert_eq!(proxy.cluster.instance_sessions("a"), 1);
    assert_eq!(svc.live(), 1);
    svc.open_gate();
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    svc.wait_live(0).await;
    proxy
        .cluster
        .wait_until(|c| c.instance_sessions("a") == 0)
        .await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_stream_answered_before_its_upload_ended_stays_leased_until_it_does() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let config = "request_buffer = \"1KiB\"\nqueue_timeout = \"5s\"\n";
    let proxy = start_proxy(config, DEFAULT_ROUTE).await;
    let (session, status) = dial_raw(
        proxy.acceptor,
        &ServiceSpec::h2("u", 1, 1).registration().encode(),
    )
    .await;
    assert_eq!(status, 101);
    // A service that answers at once and reads the body on; it allows 100 streams, the
    // session declared one.
    let (open, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (o, m) = (Arc::clone(&open), Arc::clone(&most));
    tokio::spawn(async move {
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let (o, m) = (Arc::clone(&o), Arc::clone(&m));
            async move {
                m.fetch_max(o.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::spawn(async move {
                    use http_body_util::BodyExt;
                    let _ = req.into_body().collect().await;
                    o.fetch_sub(1, Ordering::SeqCst);
                });
                let body = http_body_util::Full::new(bytes::Bytes::from_static(b"ok"));
                Ok::<_, std::io::Error>(http::Response::new(body))
            }
        });
        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .max_concurrent_streams(100)
            .serve_connection(hyper_util::rt::TokioIo::new(session), svc)
            .await;
    });
    proxy.idle("default", 1).await;
    let mut upload = tokio::net::TcpStream::connect(proxy.http).await.unwrap();
    let head = "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n";
    upload.write_all(head.as_bytes()).await.unwrap();
    upload.write_all(&[b'y'; 0x1000]).await.unwrap();
    upload.write_all(b"\r\n").await.unwrap();
    let mut answer = [0u8; 12];
    upload.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    // The answer is whole, the upload is not: the stream is still open at the service.
    let second = tokio::spawn(get(proxy.http, "/second"));
    proxy.cluster.wait_until(|c| c.queued("default") == 1).await;
    assert_eq!(open.load(Ordering::SeqCst), 1);
    upload.write_all(b"0\r\n\r\n").await.unwrap();
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "never two streams open at once"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_drain_closes_the_session_once_its_streams_are_back() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 2)).await;
    proxy.idle("default", 2).await;
    let slow = tokio::spawn(get(proxy.http, "/delay/300"));
    proxy.idle("default", 1).await;
    assert!(proxy.cluster.drain("a"));
    // The request in flight finishes; then the connection closes.
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    svc.wait_live(0).await;
    proxy.idle("default", 0).await;
    proxy.stop().await;
}

#[tokio::test]
async fn retire_counts_a_session_not_its_streams() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 2, 3)).await;
    proxy.idle("default", 6).await;
    assert_eq!(proxy.cluster.retire("default", "a", 1), 1);
    // One connection of three streams closed; the other is whole.
    svc.wait_live(1).await;
    proxy.idle("default", 3).await;
    for _ in 0..4 {
        assert_eq!(get(proxy.http, "/").await.status, StatusCode::OK);
    }
    proxy.stop().await;
}

#[tokio::test]
async fn an_upgrade_over_an_http2_session_is_refused_not_hung() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let _svc = Service::start(proxy.acceptor, ServiceSpec::h2("a", 1, 1)).await;
    proxy.idle("default", 1).await;
    let res = reverse_support::send_with_headers(
        proxy.http,
        Method::GET,
        "/",
        &[("connection", "upgrade"), ("upgrade", "websocket")],
    )
    .await;
    assert_eq!(res.status, StatusCode::NOT_IMPLEMENTED, "{}", res.text());
    // The stream was never used: it is idle again.
    proxy.idle("default", 1).await;
    proxy.stop().await;
}

#[tokio::test]
async fn registration_fields_are_checked_on_the_wire() {
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let head = "GET /.sluice/v1/session HTTP/1.1\r\nHost: sluice\r\nConnection: Upgrade\r\n\
                Upgrade: sluice-session/1\r\nSluice-Service: api\r\n";
    for (extra, status) in [
        ("Sluice-Protocol: h2\r\nSluice-Streams: 0\r\n", 400),
        ("Sluice-Protocol: h2\r\n", 400),
        ("Sluice-Streams: 3\r\n", 400),
        ("Sluice-Protocol: h3\r\nSluice-Streams: 3\r\n", 400),
        ("Sluice-Protocol: h2\r\nSluice-Streams: 3\r\n", 101),
    ] {
        let bytes = format!("{head}{extra}\r\n");
        let (_stream, got) = dial_raw(proxy.acceptor, bytes.as_bytes()).await;
        assert_eq!(got, status, "{extra:?}");
    }
    proxy.stop().await;
}

#[tokio::test]
async fn a_request_routed_before_the_first_http2_session_is_served_on_it() {
    // The fast path takes HTTP/1.1 requests to slices without HTTP/2 sessions; one that waits
    // in the queue of such a slice and is then given a stream of an HTTP/2 session that just
    // registered is served by hyper's path on that stream.
    let proxy = start_proxy("queue_timeout = \"10s\"\n", DEFAULT_ROUTE).await;
    let one = Service::start(proxy.acceptor, ServiceSpec::new("one", 1)).await;
    proxy.idle("default", 1).await;
    let held = tokio::spawn(get(proxy.http, "/wait"));
    proxy.idle("default", 0).await;
    let waiting = tokio::spawn(get(proxy.http, "/"));
    proxy.cluster.wait_until(|c| c.queued("default") == 1).await;
    let two = Service::start(proxy.acceptor, ServiceSpec::h2("two", 1, 1)).await;
    let res = waiting.await.unwrap();
    assert_eq!((res.status, res.text().as_str()), (StatusCode::OK, "two"));
    assert_eq!(two.requests(), 1);
    one.open_gate();
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    proxy.stop().await;
}

mod tonic_over_sessions {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };

    use super::*;
    use reverse_support::service::dial;

    /// A real gRPC service (tonic): counts the spans it is sent, and the calls open at once;
    /// a request of exactly three spans is refused with `FAILED_PRECONDITION`.
    #[derive(Debug, Default, Clone)]
    struct Collector {
        spans: Arc<AtomicUsize>,
        open: Arc<AtomicUsize>,
        max_open: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let spans = request.into_inner().resource_spans.len();
            if spans == 3 {
                return Err(tonic::Status::failed_precondition("three is refused"));
            }
            let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_open.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.spans.fetch_add(spans, Ordering::SeqCst);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    #[tokio::test]
    async fn a_tonic_service_on_http2_sessions_takes_calls_through_sluice() {
        let proxy = start_proxy("queue_max = 64\n", DEFAULT_ROUTE).await;
        // tonic's server serves the registered connections as if it had accepted them.
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let (stream, status) =
                dial(proxy.acceptor, &ServiceSpec::h2("t", 2, 2).registration()).await;
            assert_eq!(status, 101);
            sessions.push(Ok::<_, std::io::Error>(stream));
        }
        let collector = Collector::default();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(futures_util::stream::iter(sessions)),
        );
        proxy.idle("default", 4).await;
        let client = TraceServiceClient::connect(format!("http://{}", proxy.http))
            .await
            .unwrap();
        let calls: Vec<_> = (0..12)
            .map(|_| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let request = ExportTraceServiceRequest {
                        resource_spans: vec![Default::default(), Default::default()],
                    };
                    client.export(request).await.map(|_| ())
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        assert_eq!(collector.spans.load(Ordering::SeqCst), 24);
        // Two sessions of two streams: four calls at once, never more.
        assert_eq!(collector.max_open.load(Ordering::SeqCst), 4);
        // The service's own status comes back in its trailers.
        let mut client = client.clone();
        let request = ExportTraceServiceRequest {
            resource_spans: vec![Default::default(); 3],
        };
        let status = client.export(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), "three is refused");
        proxy.idle("default", 4).await;
        proxy.stop().await;
    }
}
