//! gRPC and HTTP/2 to static clusters (issue 31, items 1, 2 and 4): `protocol = "h2c"` and
//! `"h2"` clusters carry calls over multiplexed connections — unary and bidirectional, with
//! their trailers, `te: trailers` passed on, the endpoint's stream limit respected, another
//! connection opened when those open are full, GOAWAY survived without a failed call — and
//! Sluice's own failures reach a gRPC client as `grpc-status` (UNIMPLEMENTED, UNAVAILABLE,
//! DEADLINE_EXCEEDED from `grpc-timeout`). A real tonic client and server make one of the calls.
#![allow(clippy::unwrap_used)]

use crate::reverse_support;
use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::channel::{Channel, Sender};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::TestProxy;
use tokio::net::{TcpListener, TcpStream};

/// What the test service saw.
#[derive(Debug, Default)]
struct Seen {
    connections: AtomicUsize,
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Every call came with `te: trailers` and as HTTP/2.
    te_trailers: AtomicBool,
    not_h2: AtomicBool,
    /// What `grpc.health.v1.Health/Check` answers: 1 SERVING, 2 NOT_SERVING.
    health: std::sync::atomic::AtomicU8,
}

/// An HTTP/2 (cleartext) gRPC-shaped service: `/echo.Echo/Stream` sends each request message
/// back as it arrives, then the trailers `grpc-status: 0` and `x-echo: done`; `/echo.Echo/Slow`
/// answers (its head too) after 300 ms. At most `max_streams` streams per connection (its SETTINGS); after
/// `goaway_after` calls a connection is shut down gracefully (GOAWAY).
struct Service {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

impl Service {
    async fn start(max_streams: u32, goaway_after: Option<usize>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen {
            te_trailers: AtomicBool::new(true),
            health: std::sync::atomic::AtomicU8::new(1),
            ..Seen::default()
        });
        let s = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::SeqCst);
                let s = Arc::clone(&s);
                tokio::spawn(serve(stream, s, max_streams, goaway_after));
            }
        });
        Self { addr, seen }
    }
}

async fn serve(stream: TcpStream, seen: Arc<Seen>, max_streams: u32, goaway_after: Option<usize>) {
    let on_conn = Arc::new(AtomicUsize::new(0));
    let (shut_tx, mut shut_rx) = tokio::sync::watch::channel(false);
    let counted = Arc::clone(&on_conn);
    let svc = hyper::service::service_fn(move |req| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        if goaway_after.is_some_and(|after| n >= after) {
            let _ = shut_tx.send(true);
        }
        call(Arc::clone(&seen), req)
    });
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .max_concurrent_streams(max_streams)
        .serve_connection(TokioIo::new(stream), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = shut_rx.wait_for(|shut| *shut) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

async fn call(
    seen: Arc<Seen>,
    req: Request<Incoming>,
) -> Result<Response<Channel<Bytes>>, Infallible> {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    if req
        .headers()
        .get(http::header::TE)
        .is_none_or(|v| v != "trailers")
    {
        seen.te_trailers.store(false, Ordering::SeqCst);
    }
    if req.version() != http::Version::HTTP_2 {
        seen.not_h2.store(true, Ordering::SeqCst);
    }
    let (mut tx, body) = Channel::<Bytes>::new(4);
    if req.uri().path() == "/grpc.health.v1.Health/Check" {
        let status = seen.health.load(Ordering::SeqCst);
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let _ = tx.send_data(message(&[0x08, status])).await;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let _ = tx.send_trailers(trailers).await;
        });
        return Ok(Response::new(body));
    }
    let slow = req.uri().path() == "/echo.Echo/Slow";
    if slow {
        // Its head comes late too (a deadline bounds the wait for it).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut incoming = req.into_body();
    tokio::spawn(async move {
        if slow {
            let _ = tx.send_data(message(b"slow")).await;
        }
        while let Some(Ok(frame)) = incoming.frame().await {
            if let Ok(data) = frame.into_data() {
                if !slow && tx.send_data(data).await.is_err() {
                    return;
                }
            }
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-echo", HeaderValue::from_static("done"));
        let _ = tx.send_trailers(trailers).await;
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
    });
    let mut res = Response::new(body);
    res.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    Ok(res)
}

/// One gRPC message: a zero flag byte, its length, its bytes.
fn message(payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + payload.len());
    buf.put_u8(0);
    buf.put_u32(u32::try_from(payload.len()).unwrap());
    buf.put_slice(payload);
    buf.freeze()
}

fn config(endpoints: &[SocketAddr], extra: &str) -> String {
    let eps: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\npath_prefix = \"/echo.Echo/\"\ncluster = \"grpc\"\n\
         [cluster.grpc]\nkind = \"static\"\nendpoints = [{}]\nprotocol = \"h2c\"\n{extra}\n",
        eps.join(", ")
    )
}

/// A call's request, its body a channel the test writes messages to.
fn grpc_request(addr: SocketAddr, method: &str) -> (Request<Channel<Bytes>>, Sender<Bytes>) {
    let (tx, body) = Channel::<Bytes>::new(4);
    let req = Request::post(format!("http://{addr}/echo.Echo/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    (req, tx)
}

/// The next data frame of `body`, or its trailers (`Err`).
async fn next_frame(body: &mut Incoming) -> Result<Bytes, Option<HeaderMap>> {
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await;
    match frame.expect("no frame within 10 s") {
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => Ok(data),
            Err(frame) => Err(frame.into_trailers().ok()),
        },
        _ => Err(None),
    }
}

#[tokio::test]
async fn a_bidirectional_call_streams_both_ways_with_its_trailers() {
    let service = Service::start(100, None).await;
    let proxy = TestProxy::start(&config(&[service.addr], "")).await;
    ping_pong(proxy.addr(), &service.seen).await;
}

#[tokio::test]
async fn a_call_streams_both_ways_when_a_retry_policy_reads_bodies_ahead() {
    // A policy that may replay reads request bodies ahead; a call's goes on at a pause, so
    // the ping-pong still streams.
    let service = Service::start(100, None).await;
    let retry = "retry = { retries = 1, on = [\"503\"], non_idempotent = true }";
    let proxy = TestProxy::start(&config(&[service.addr], retry)).await;
    ping_pong(proxy.addr(), &service.seen).await;
}

/// `protocol = "auto"` in plaintext (no ALPN to agree on HTTP/2) carries gRPC calls in h2c:
/// sent as HTTP/1.1, as before, every call to a gRPC server failed UNAVAILABLE "upstream
/// protocol error" (issue 48, item 2).
#[tokio::test]
async fn a_plaintext_auto_cluster_carries_grpc_calls_in_h2c() {
    let service = Service::start(100, None).await;
    let auto = config(&[service.addr], "").replace("protocol = \"h2c\"", "protocol = \"auto\"");
    let proxy = TestProxy::start(&auto).await;
    ping_pong(proxy.addr(), &service.seen).await;
}

/// ... and its gRPC health checks go in h2c too, so they pass on a serving endpoint.
#[tokio::test]
async fn a_plaintext_auto_cluster_health_checks_grpc_in_h2c() {
    let service = Service::start(100, None).await;
    let extra = "health_check = { grpc_service = \"echo.Echo\", interval = \"50ms\", \
                 unhealthy_threshold = 1, healthy_threshold = 1 }";
    let auto = config(&[service.addr], extra).replace("protocol = \"h2c\"", "protocol = \"auto\"");
    let proxy = TestProxy::start(&auto).await;
    // A failed check would take the one endpoint out: calls answered UNAVAILABLE by Sluice.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        ping_pong(proxy.addr(), &service.seen).await;
    }
}

#[tokio::test]
async fn a_bidirectional_call_streams_over_a_dial_in_http2_session() {
    use reverse_support::{service::dial, start_proxy, ServiceSpec, DEFAULT_ROUTE};
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let seen = Arc::new(Seen {
        te_trailers: AtomicBool::new(true),
        ..Seen::default()
    });
    let (session, status) = dial(proxy.acceptor, &ServiceSpec::h2("g", 1, 4).registration()).await;
    assert_eq!(status, 101);
    tokio::spawn(serve(session, Arc::clone(&seen), 4, None));
    proxy.idle("default", 4).await;
    ping_pong(proxy.http, &seen).await;
    // The call's stream came back to the session.
    proxy.idle("default", 4).await;
}

#[tokio::test]
async fn a_call_whose_server_speaks_first_is_not_held_for_its_request() {
    use reverse_support::{service::dial, start_proxy, ServiceSpec, DEFAULT_ROUTE};
    let proxy = start_proxy("", DEFAULT_ROUTE).await;
    let seen = Arc::new(Seen::default());
    let (session, _) = dial(proxy.acceptor, &ServiceSpec::h2("g", 1, 1).registration()).await;
    tokio::spawn(serve(session, Arc::clone(&seen), 1, None));
    proxy.idle("default", 1).await;
    let mut client = support::h2_connect_with::<Channel<Bytes>>(proxy.http).await;
    // `Slow` answers its first message after 300 ms whatever the request holds: the request
    // sends nothing and stays open.
    let (req, tx) = grpc_request(proxy.http, "Slow");
    let res = tokio::time::timeout(Duration::from_secs(5), client.send_request(req))
        .await
        .expect("the call's answer came while its request was open")
        .unwrap();
    let mut body = res.into_body();
    assert_eq!(next_frame(&mut body).await.unwrap(), message(b"slow"));
    drop(tx);
}

/// A call that sends a message, reads its echo, sends another: the answer's head and first
/// message come while the request is still open (neither direction buffered whole), then the
/// trailers.
async fn ping_pong(addr: SocketAddr, seen: &Seen) {
    let mut client = support::h2_connect_with::<Channel<Bytes>>(addr).await;
    let (req, mut tx) = grpc_request(addr, "Stream");
    let res = client.send_request(req);
    tx.send_data(message(b"one")).await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), res)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    assert_eq!(next_frame(&mut body).await.unwrap(), message(b"one"));
    tx.send_data(message(b"two")).await.unwrap();
    assert_eq!(next_frame(&mut body).await.unwrap(), message(b"two"));
    drop(tx);
    let trailers = next_frame(&mut body).await.unwrap_err().expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-echo"], "done");
    assert!(
        seen.te_trailers.load(Ordering::SeqCst),
        "te: trailers reached the service"
    );
    assert!(
        !seen.not_h2.load(Ordering::SeqCst),
        "the service was spoken HTTP/2 to"
    );
}

#[tokio::test]
async fn an_http1_client_reaches_an_h2c_cluster() {
    let service = Service::start(100, None).await;
    let proxy = TestProxy::start(&config(&[service.addr], "")).await;
    let req = Request::post(proxy.url("/echo.Echo/Stream"))
        .body(Full::new(message(b"hello")))
        .unwrap();
    let reply = support::send(&support::client(), req).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body.as_bytes(), &message(b"hello")[..]);
}

#[tokio::test]
async fn the_endpoint_stream_limit_holds_and_full_connections_get_company() {
    // The service takes 2 streams per connection; Sluice may open 3 connections.
    let service = Service::start(2, None).await;
    let extra = "h2 = { max_connections = 3, max_streams = 2 }";
    let proxy = TestProxy::start(&config(&[service.addr], extra)).await;
    let mut client = support::h2_connect_with::<Channel<Bytes>>(proxy.addr()).await;
    let mut calls = Vec::new();
    for _ in 0..12 {
        let (req, tx) = grpc_request(proxy.addr(), "Slow");
        drop(tx);
        calls.push(tokio::spawn(client.send_request(req)));
    }
    for call in calls {
        let res = call.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let trailers = res.into_body().collect().await.unwrap().trailers().cloned();
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
    }
    assert_eq!(service.seen.connections.load(Ordering::SeqCst), 3);
    assert!(service.seen.max_in_flight.load(Ordering::SeqCst) <= 6);
    assert_eq!(service.seen.calls.load(Ordering::SeqCst), 12);
}

#[tokio::test]
async fn a_goaway_mid_load_fails_no_call() {
    // Each connection is shut down gracefully after its 3rd call.
    let service = Service::start(100, Some(3)).await;
    let proxy = TestProxy::start(&config(&[service.addr], "")).await;
    let mut client = support::h2_connect_with::<Channel<Bytes>>(proxy.addr()).await;
    for round in 0..5 {
        let mut calls = Vec::new();
        for _ in 0..6 {
            let (req, mut tx) = grpc_request(proxy.addr(), "Stream");
            calls.push(tokio::spawn(client.send_request(req)));
            tx.send_data(message(b"x")).await.unwrap();
        }
        for call in calls {
            let res = call.await.unwrap().unwrap();
            let status = res.status();
            let collected = res.into_body().collect().await;
            let trailers = collected.unwrap().trailers().cloned();
            assert_eq!(status, StatusCode::OK, "round {round}");
            assert_eq!(trailers.unwrap()["grpc-status"], "0", "round {round}");
        }
    }
    assert!(service.seen.connections.load(Ordering::SeqCst) > 1);
}

/// Sends one call with `fields` and an empty body; its response head and fields.
async fn own_answer(addr: SocketAddr, path: &str, fields: &[(&str, &str)]) -> Response<Incoming> {
    let mut client = support::h2_connect_with::<Channel<Bytes>>(addr).await;
    let mut req = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    let (tx, body) = Channel::<Bytes>::new(1);
    drop(tx);
    client.send_request(req.body(body).unwrap()).await.unwrap()
}

#[tokio::test]
async fn own_failures_are_grpc_statuses() {
    let service = Service::start(100, None).await;
    let proxy = TestProxy::start(&config(&[service.addr], "response_timeout = \"10s\"")).await;
    // No route: UNIMPLEMENTED, in an HTTP 200 with no body.
    let res = own_answer(proxy.addr(), "/other.Svc/Call", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "12");
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    // A deadline shorter than the service's answer: DEADLINE_EXCEEDED.
    let res = own_answer(proxy.addr(), "/echo.Echo/Slow", &[("grpc-timeout", "50m")]).await;
    assert_eq!(res.headers()["grpc-status"], "4");
    // Enough time: the call goes through.
    let res = own_answer(proxy.addr(), "/echo.Echo/Slow", &[("grpc-timeout", "5S")]).await;
    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
    // Nothing listens: UNAVAILABLE.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let proxy = TestProxy::start(&config(&[dead_addr], "")).await;
    let res = own_answer(proxy.addr(), "/echo.Echo/Stream", &[]).await;
    assert_eq!(res.headers()["grpc-status"], "14");
    assert!(res.headers().contains_key("grpc-message"));
}

mod tonic_call {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };

    /// A real gRPC service (tonic): counts the spans it is sent.
    #[derive(Debug, Default, Clone)]
    struct Collector(Arc<AtomicUsize>);

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let spans = request.into_inner().resource_spans.len();
            self.0.fetch_add(spans, Ordering::SeqCst);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    #[tokio::test]
    async fn a_tonic_client_calls_a_tonic_service_through_sluice() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Collector::default();
        let server = TraceServiceServer::new(collector.clone());
        let incoming = tokio_stream_of(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(incoming),
        );
        let text = format!(
            "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
             [[route]]\ncluster = \"grpc\"\n\
             [cluster.grpc]\nkind = \"static\"\nendpoints = [\"{addr}\"]\nprotocol = \"h2c\"\n"
        );
        let proxy = TestProxy::start(&text).await;
        let mut client = TraceServiceClient::connect(format!("http://{}", proxy.addr()))
            .await
            .unwrap();
        let request = ExportTraceServiceRequest {
            resource_spans: vec![Default::default(), Default::default()],
        };
        client.export(request).await.unwrap();
        assert_eq!(collector.0.load(Ordering::SeqCst), 2);
    }

    /// The listener's connections as tonic's `serve_with_incoming` takes them.
    fn tokio_stream_of(
        listener: TcpListener,
    ) -> impl futures_util::Stream<Item = std::io::Result<TcpStream>> {
        futures_util::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        })
    }
}

/// A protocol the cluster cannot speak as configured is a config error that says what to
/// write instead, at its line.
#[test]
fn a_protocol_that_does_not_fit_is_a_config_error() {
    let endpoint: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cases = [
        ("protocol = \"h2\"", "add `tls = { .. }`"),
        ("protocol = \"h3\"", "unknown variant `h3`"),
        ("h2 = { max_streams = 0 }", "at least 1"),
        ("h2 = { max_connections = 2 }", "`h2` settings need"),
        (
            "health_check = { grpc_service = \"\" }",
            "gRPC runs over HTTP/2",
        ),
    ];
    for (line, message) in cases {
        let text = support::static_config(&[endpoint], line);
        let text = if line.starts_with("h2 = { max_streams") {
            text.replace(line, &format!("protocol = \"h2c\"\n{line}"))
        } else {
            text
        };
        support::assert_refused_at(&text, line, message);
    }
}

#[tokio::test]
async fn grpc_health_checks_take_a_service_out_and_back() {
    let service = Service::start(100, None).await;
    let extra = "health_check = { grpc_service = \"echo.Echo\", interval = \"50ms\", \
                 unhealthy_threshold = 1, healthy_threshold = 1 }";
    let proxy = TestProxy::start(&config(&[service.addr], extra)).await;
    // Serving: calls go through. Not serving: Sluice answers UNAVAILABLE itself. Back: through.
    for (health, want) in [(1, "0"), (2, "14"), (1, "0")] {
        service.seen.health.store(health, Ordering::SeqCst);
        let mut got = String::new();
        for _ in 0..100 {
            let res = own_answer(proxy.addr(), "/echo.Echo/Stream", &[]).await;
            let head = res.headers().get("grpc-status").cloned();
            let collected = res.into_body().collect().await.unwrap();
            let trailers = collected
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .cloned();
            got = trailers
                .or(head)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            if got == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(got, want, "health {health}");
    }
}
