//! A real gRPC service on HTTP/2 sessions: OTLP's trace collector as tonic generates it
//! (`TraceServiceServer`), passed to `sluice_sdk::serve` as it is, and called by tonic's
//! generated client — over a fake acceptor's session, and through the real proxy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::proxy;
use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use proxy::RunningProxy;
use sluice_sdk::{serve, BoxError, ClientAddr};
use support::h2::{h2_options, H2Acceptor};

/// A real gRPC service: counts the spans it is sent, the calls in flight (each takes `work`)
/// and the client addresses the calls carried.
#[derive(Debug, Default, Clone)]
struct Collector {
    work: Duration,
    spans: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    clients: Arc<Mutex<Vec<Option<ClientAddr>>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let client = request.extensions().get::<ClientAddr>().copied();
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(client);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.work).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let spans = request.into_inner().resource_spans.len();
        self.spans.fetch_add(spans, Ordering::SeqCst);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    fn clients(&self) -> Vec<Option<ClientAddr>> {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn spans(n: usize) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![Default::default(); n],
    }
}

#[tokio::test]
async fn a_tonic_service_answers_calls_on_a_fake_acceptors_http2_session() {
    let mut fake = H2Acceptor::start().await;
    let collector = Collector::default();
    // Several services go in one `Routes`, which is a `SessionService` too.
    let routes = tonic::service::Routes::new(TraceServiceServer::new(collector.clone()));
    let sessions = serve(h2_options(fake.addr, 1, 4), routes).unwrap();
    let session = fake.session().await;
    support::registered(&sessions, 1).await;

    // tonic's client over the session's streams, as Sluice would forward a call (unary:
    // each request's body is whole before it is sent).
    let sender = session.sender.clone();
    let channel = tower::service_fn(move |req: Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            sender.ready().await?;
            let req = Request::from_parts(parts, Full::<Bytes>::new(body));
            Ok::<_, BoxError>(sender.send_request(req).await?)
        }
    });
    let origin = Uri::from_static("http://app.example");
    let mut client = TraceServiceClient::with_origin(channel, origin);
    let mut call = tonic::Request::new(spans(2));
    let claimed = "203.0.113.9:4711";
    call.metadata_mut()
        .insert("sluice-client-addr", claimed.parse().unwrap());
    support::within(client.export(call)).await.unwrap();
    support::within(client.export(spans(3))).await.unwrap();

    assert_eq!(collector.spans.load(Ordering::SeqCst), 5);
    let clients: Vec<String> = collector
        .clients()
        .iter()
        .map(|c| c.unwrap().to_string())
        .collect();
    // Without the field, the session's peer: the acceptor.
    assert_eq!(clients, [claimed.to_owned(), fake.addr.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_calls_through_sluice_reach_a_tonic_service_and_never_exceed_its_streams() {
    let proxy = RunningProxy::any_port().await;
    let collector = Collector {
        work: Duration::from_millis(200),
        ..Collector::default()
    };
    let mut options = proxy::options_for(proxy.acceptor, "g-1", 1);
    options.streams = Some(3);
    let sessions = serve(options, TraceServiceServer::new(collector.clone())).unwrap();
    proxy::registered(&sessions, 1).await;

    // tonic's client speaks h2c to the proxy's listener.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.http))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let channel = proxy::within(endpoint.connect()).await.unwrap();
    let mut client = TraceServiceClient::new(channel.clone());
    proxy::within(client.export(spans(2))).await.unwrap();
    assert_eq!(collector.spans.load(Ordering::SeqCst), 2);

    // Ten slow calls at once on one session of three streams: three at a time, all answered.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let mut client = TraceServiceClient::new(channel.clone());
        calls.spawn(async move { client.export(spans(1)).await });
    }
    for answer in proxy::within(calls.join_all()).await {
        answer.unwrap();
    }
    assert_eq!(collector.spans.load(Ordering::SeqCst), 12);
    assert_eq!(
        collector.max_in_flight.load(Ordering::SeqCst),
        3,
        "the service saw more or fewer calls at once than the session's streams"
    );
    // Every call carried the client's address as the proxy saw it: this test, on loopback.
    let clients = collector.clients();
    assert_eq!(clients.len(), 11);
    for client in clients {
        assert!(client.unwrap().0.ip().is_loopback());
    }
    proxy::within(sessions.shutdown()).await.unwrap();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_through_sluice_lets_the_calls_in_flight_finish() {
    let proxy = RunningProxy::any_port().await;
    let collector = Collector {
        work: Duration::from_millis(300),
        ..Collector::default()
    };
    let mut options = proxy::options_for(proxy.acceptor, "g-1", 2);
    options.streams = Some(2);
    let sessions = serve(options, TraceServiceServer::new(collector.clone())).unwrap();
    proxy::registered(&sessions, 2).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.http))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let channel = proxy::within(endpoint.connect()).await.unwrap();

    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let mut client = TraceServiceClient::new(channel.clone());
        calls.spawn(async move { client.export(spans(1)).await });
    }
    proxy::within(async {
        while collector.in_flight.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Drain: the proxy leases no more streams, and each session ends once its calls have.
    proxy::within(sessions.shutdown()).await.unwrap();
    for answer in proxy::within(calls.join_all()).await {
        answer.unwrap();
    }
    assert_eq!(collector.spans.load(Ordering::SeqCst), 4);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_under_load_through_sluice_loses_no_call() {
    let proxy = RunningProxy::any_port().await;
    let collector = Collector {
        work: Duration::from_millis(20),
        ..Collector::default()
    };
    let mut options = proxy::options_for(proxy.acceptor, "g-1", 3);
    options.streams = Some(2);
    let sessions = serve(options, TraceServiceServer::new(collector.clone())).unwrap();
    proxy::registered(&sessions, 3).await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.http))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let channel = proxy::within(endpoint.connect()).await.unwrap();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (mut client, stop) = (TraceServiceClient::new(channel.clone()), stop.clone());
        callers.spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                answers.push(client.export(spans(1)).await.map(|_| ()));
            }
            answers
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Two sessions say GOAWAY, busy as they are; their calls finish, none is lost.
    sessions.set_capacity(1);
    proxy::registered(&sessions, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let answers = proxy::within(callers.join_all()).await.concat();
    let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {}: {failed:?}",
        failed.len(),
        answers.len()
    );
    assert!(answers.len() > 20, "{}", answers.len());
    assert!(collector.max_in_flight.load(Ordering::SeqCst) <= 6);
    proxy.stop().await;
}
