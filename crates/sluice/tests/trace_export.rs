//! `[tracing]` (issue 32, item 1): W3C trace context continued or started and sent upstream,
//! and each sampled request's spans — the request, its wait in a slice's queue, the upstream
//! exchange — exported over OTLP to a real receiver the test runs: HTTP/protobuf (a hyper
//! server decoding the official `opentelemetry-proto` messages) and gRPC (tonic serving the
//! official `TraceService`). The test command runs these on the fast path and again with it
//! off (hyper).
#![allow(clippy::unwrap_used)]

use crate::reverse_support;
use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use support::upstream::{BlackholePort, RefusingPort};
use support::{send, Backend, Reply, TestProxy};
use tokio::net::TcpListener;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A span as a collector received it, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    resource: BTreeMap<String, String>,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i32,
    start: u64,
    end: u64,
    attributes: BTreeMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn text(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    let value = |v: &Option<Value>| match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    let pairs = kvs.iter().map(|kv| {
        let v = kv.value.as_ref().and_then(|v| v.value.clone());
        (kv.key.clone(), value(&v))
    });
    pairs.collect()
}

fn keep(spans: &Spans, req: ExportTraceServiceRequest) {
    let mut out = spans.lock().unwrap();
    for rs in req.resource_spans {
        let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(Received {
                resource: resource.clone(),
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                name: span.name,
                kind: span.kind,
                start: span.start_time_unix_nano,
                end: span.end_time_unix_nano,
                attributes: text(&span.attributes),
            });
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with an `ExportTraceServiceRequest`.
async fn http_collector() -> (String, Spans) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Spans::default();
    let kept = Arc::clone(&spans);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let kept = Arc::clone(&kept);
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let kept = Arc::clone(&kept);
                async move {
                    assert_eq!(req.uri().path(), "/v1/traces");
                    let ctype = req.headers().get("content-type").cloned();
                    assert_eq!(ctype.unwrap(), "application/x-protobuf");
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    keep(&kept, ExportTraceServiceRequest::decode(body).unwrap());
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(answer))))
                }
            });
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (format!("http://{addr}/v1/traces"), spans)
}

struct Grpc(Spans);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver: the official `TraceService`.
async fn grpc_collector() -> (String, Spans) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Spans::default();
    let service = TraceServiceServer::new(Grpc(Arc::clone(&spans)));
    let incoming = tokio_stream_of(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (format!("http://{addr}"), spans)
}

fn tokio_stream_of(
    listener: TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| s);
        Some((next, l))
    })
}

/// Waits (10 s at most) until `spans` holds `n` spans of `trace`.
async fn spans_of(spans: &Spans, trace: &str, n: usize) -> Vec<Received> {
    for _ in 0..200 {
        let of: Vec<Received> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace)
            .cloned()
            .collect();
        if of.len() >= n {
            return of;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "fewer than {n} spans of {trace}: {:?}",
        spans.lock().unwrap()
    );
}

fn named(spans: &[Received], kind: SpanKind) -> &Received {
    spans
        .iter()
        .find(|s| s.kind == kind as i32)
        .unwrap_or_else(|| panic!("no {kind:?} span in {spans:?}"))
}

fn tracing_toml(endpoint: &str, protocol: &str, extra: &str) -> String {
    format!(
        "[tracing]\nendpoint = \"{endpoint}\"\nprotocol = \"{protocol}\"\n\
         resource = {{ \"deployment.environment.name\" = \"test\" }}\n{extra}\n"
    )
}

async fn static_proxy(backend: &Backend, tracing: &str, listener: &str) -> TestProxy {
    let toml = format!(
        "{tracing}[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n{listener}\n\
         [[route]]\nname = \"all\"\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        backend.addr
    );
    TestProxy::start(&toml).await
}

async fn get(addr: SocketAddr, path: &str, fields: &[(&str, &str)]) -> Reply {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let req = req.body(Full::default()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), send(&support::client(), req))
        .await
        .expect("no answer")
}

/// The values of `name` the backend saw, from its `/headers` listing.
fn seen(reply: &Reply, name: &str) -> Vec<String> {
    let prefix = format!("{name}: ");
    let lines = reply.body.lines();
    lines
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(str::to_owned)
        .collect()
}

fn traceparent(sampled: bool) -> String {
    format!(
        "00-{TRACE}-{CLIENT_SPAN}-{}",
        if sampled { "01" } else { "00" }
    )
}

#[tokio::test]
async fn a_clients_trace_is_continued_upstream_and_exported_over_http() {
    let (endpoint, spans) = http_collector().await;
    let backend = Backend::start("b").await;
    let proxy = static_proxy(&backend, &tracing_toml(&endpoint, "http/protobuf", ""), "").await;
    let parent = traceparent(true);
    let fields = [
        ("traceparent", parent.as_str()),
        ("tracestate", "congo=t61rcWkgMzE"),
    ];
    let reply = get(proxy.addr(), "/headers", &fields).await;
    assert_eq!(reply.status, StatusCode::OK);
    let up = seen(&reply, "traceparent");
    assert_eq!(up.len(), 1, "one traceparent upstream: {up:?}");
    let up: Vec<&str> = up[0].split('-').collect();
    assert_eq!((up[0], up[1], up[3]), ("00", TRACE, "01"), "{up:?}");
    assert_ne!(up[2], CLIENT_SPAN, "the upstream's parent is Sluice's span");
    assert_eq!(seen(&reply, "tracestate"), ["congo=t61rcWkgMzE"]);

    let got = spans_of(&spans, TRACE, 2).await;
    let server = named(&got, SpanKind::Server);
    let client = named(&got, SpanKind::Client);
    assert_eq!(
        server.parent, CLIENT_SPAN,
        "the request's span is the client's child"
    );
    assert_eq!(
        client.parent, server.span_id,
        "the exchange is under the request"
    );
    assert_eq!(
        client.span_id, up[2],
        "the upstream was told the exchange's span"
    );
    assert_eq!(server.name, "GET all");
    assert_eq!(client.name, "upstream backend");
    let attrs = &server.attributes;
    assert_eq!(attrs["sluice.route"], "all");
    assert_eq!(attrs["sluice.cluster"], "backend");
    assert_eq!(attrs["http.request.method"], "GET");
    assert_eq!(attrs["url.path"], "/headers");
    assert_eq!(attrs["http.response.status_code"], "200");
    let endpoint = backend.addr;
    assert_eq!(
        client.attributes["server.address"],
        endpoint.ip().to_string()
    );
    assert_eq!(
        client.attributes["server.port"],
        endpoint.port().to_string()
    );
    assert!(
        server.start <= client.start && client.end <= server.end,
        "{got:?}"
    );
    assert_eq!(server.resource["service.name"], "sluice");
    assert_eq!(server.resource["deployment.environment.name"], "test");
}

/// Over gRPC, with a dial-in service of one session: of two requests at once, one waits
/// for the other's session, and its trace shows that wait as a span of its own.
#[tokio::test]
async fn a_wait_for_a_session_is_a_span_and_sessions_get_the_context_too() {
    use reverse_support::custom::serve_fn;
    use reverse_support::ServiceSpec;

    let (endpoint, spans) = grpc_collector().await;
    let tracing = tracing_toml(&endpoint, "grpc", "");
    let text = format!(
        "{tracing}[acceptor]\nlisten = \"127.0.0.1:0\"\n\
         [[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"api\"\ncluster = \"api\"\n\
         [cluster.api]\nkind = \"reverse\"\nqueue_timeout = \"10s\"\n"
    );
    let config = sluice::config::parse_str(&text, "t.toml", std::path::Path::new(".")).unwrap();
    let proxy = sluice::Proxy::bind(&config).await.unwrap();
    let addr = proxy.local_addrs()[0].1;
    let acceptor = proxy.acceptor_addr().unwrap();
    let cluster = proxy.reverse_cluster("api").unwrap().clone();
    tokio::spawn(proxy.run_until(std::future::pending()));
    // One session, 300 ms a request; it answers with the traceparent it was sent.
    let _svc = serve_fn(acceptor, &ServiceSpec::new("slow", 1), |req| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tp = req.headers().get("traceparent").cloned();
        let tp = tp.map(|v| v.as_bytes().to_vec()).unwrap_or_default();
        Ok(Response::new(Full::new(Bytes::from(tp))))
    })
    .await;
    cluster
        .wait_until(|c| c.idle_sessions("default") == 1)
        .await;
    let (a, b) = tokio::join!(get(addr, "/a", &[]), get(addr, "/b", &[]));
    let mut queued = 0;
    for reply in [a, b] {
        assert_eq!(reply.status, StatusCode::OK);
        let sent: Vec<String> = reply.body.split('-').map(str::to_owned).collect();
        assert_eq!(sent.len(), 4, "the session got a traceparent: {sent:?}");
        let trace = &sent[1];
        // A new trace: sampled (ratio 1), its own ID.
        assert_eq!(sent[3], "01");
        assert_ne!(trace, TRACE);
        let n = if queued == 0 { 2 } else { 3 };
        let got = spans_of(&spans, trace, n).await;
        let server = named(&got, SpanKind::Server);
        let client = named(&got, SpanKind::Client);
        assert_eq!(server.parent, "", "a new trace's request span is its root");
        assert_eq!(
            client.span_id, sent[2],
            "the session was told the exchange's span"
        );
        assert_eq!(client.attributes["sluice.instance"], "slow");
        assert_eq!(client.attributes["sluice.slice"], "default");
        if let Some(queue) = got.iter().find(|s| s.kind == SpanKind::Internal as i32) {
            queued += 1;
            assert_eq!(queue.name, "queue");
            assert_eq!(queue.parent, server.span_id);
            // It waited for the other's 300 ms (generously: at least 150 ms).
            assert!(queue.end - queue.start >= 150_000_000, "{queue:?}");
            assert!(queue.end <= client.start + 1_000_000, "{got:?}");
        }
    }
    assert_eq!(
        queued,
        1,
        "exactly one of the two waited: {:?}",
        spans.lock().unwrap()
    );
}

#[tokio::test]
async fn extract_trusted_starts_a_new_trace_for_an_untrusted_client_and_drops_its_state() {
    let (endpoint, spans) = http_collector().await;
    let backend = Backend::start("b").await;
    let tracing = tracing_toml(&endpoint, "http/protobuf", "extract = \"trusted\"");
    let proxy = static_proxy(&backend, &tracing, "").await;
    let parent = traceparent(true);
    let fields = [
        ("traceparent", parent.as_str()),
        ("tracestate", "congo=t61rcWkgMzE"),
    ];
    let reply = get(proxy.addr(), "/headers", &fields).await;
    let up = seen(&reply, "traceparent");
    assert_eq!(up.len(), 1, "{up:?}");
    let trace = up[0].split('-').nth(1).unwrap().to_owned();
    assert_ne!(trace, TRACE, "an untrusted client chose the trace");
    assert!(
        seen(&reply, "tracestate").is_empty(),
        "the client's tracestate went upstream"
    );
    let got = spans_of(&spans, &trace, 2).await;
    assert_eq!(named(&got, SpanKind::Server).parent, "");
    // From a trusted proxy, the same context is continued.
    let trusting = static_proxy(&backend, &tracing, "trusted_proxies = [\"127.0.0.1/32\"]").await;
    let reply = get(trusting.addr(), "/headers", &fields).await;
    let up = seen(&reply, "traceparent");
    assert_eq!(up[0].split('-').nth(1), Some(TRACE), "{up:?}");
    assert_eq!(seen(&reply, "tracestate"), ["congo=t61rcWkgMzE"]);
}

/// With `sample_ratio = 0`, new traces are not exported, yet the upstream is told (flags
/// 00); a continued trace that its parent sampled still is (parent-based sampling).
#[tokio::test]
async fn unsampled_requests_propagate_but_export_nothing_and_parents_decide() {
    let (endpoint, spans) = http_collector().await;
    let backend = Backend::start("b").await;
    let tracing = tracing_toml(&endpoint, "http/protobuf", "sample_ratio = 0");
    let proxy = static_proxy(&backend, &tracing, "").await;
    let mut unsampled = Vec::new();
    for _ in 0..5 {
        let reply = get(proxy.addr(), "/headers", &[]).await;
        let up = seen(&reply, "traceparent");
        let fields: Vec<&str> = up[0].split('-').collect();
        assert_eq!(fields[3], "00", "{up:?}");
        unsampled.push(fields[1].to_owned());
    }
    let parent = traceparent(true);
    let reply = get(
        proxy.addr(),
        "/headers",
        &[("traceparent", parent.as_str())],
    )
    .await;
    assert!(seen(&reply, "traceparent")[0].ends_with("-01"));
    // The sampled one was exported after the others ended: by then they would have been too.
    spans_of(&spans, TRACE, 2).await;
    let exported = spans.lock().unwrap().clone();
    assert!(exported.iter().all(|s| s.trace_id == TRACE), "{exported:?}");
    assert!(!unsampled.contains(&TRACE.to_owned()));
}

/// A collector that never answers does not hold up requests: spans wait in a bounded queue
/// (here 1), and what does not fit is dropped and counted; one that refuses connections
/// counts its spans as failed. Loops are bounded (400 requests, 10 s).
#[tokio::test]
async fn an_unreachable_collector_costs_requests_nothing_and_losses_are_counted() {
    let hole = BlackholePort::new().await;
    let endpoint = format!("http://{}/v1/traces", hole.addr);
    let backend = Backend::start("b").await;
    let tracing = tracing_toml(&endpoint, "http/protobuf", "queue = 1\ntimeout = \"30s\"");
    let proxy = static_proxy(&backend, &tracing, "").await;
    // The exporter gathers a batch for a second, then hangs on its export: requests go on
    // being answered while the spans that do not fit are dropped.
    let dropped = || {
        let metrics = proxy.metrics.render();
        counter(&metrics, "sluice_trace_spans_total{outcome=\"dropped\"}")
    };
    let mut answered = 0;
    while dropped() == 0 && answered < 400 {
        let reply = get(proxy.addr(), "/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(dropped() > 0, "no span dropped after {answered} requests");
    for _ in 0..10 {
        assert_eq!(get(proxy.addr(), "/", &[]).await.status, StatusCode::OK);
    }
    // Each request is two spans: the ten after the queue filled were all dropped.
    assert!(dropped() >= 20, "{}", proxy.metrics.render());

    let refusing = RefusingPort::new();
    let endpoint = format!("http://{}/v1/traces", refusing.addr);
    let tracing = tracing_toml(&endpoint, "http/protobuf", "");
    let proxy = static_proxy(&backend, &tracing, "").await;
    assert_eq!(get(proxy.addr(), "/", &[]).await.status, StatusCode::OK);
    for _ in 0..200 {
        let metrics = proxy.metrics.render();
        if counter(&metrics, "sluice_trace_spans_total{outcome=\"failed\"}") == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no failed export counted: {}", proxy.metrics.render());
}

fn counter(metrics: &str, series: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with(series));
    line.and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
