//! [`Tracing`] (`[tracing]`): each sampled request's spans, exported over OTLP.
//!
//! A request joins a trace when it arrives (`sluice_core::trace_context`, on both data paths); when
//! its response body has ended — where the access log writes its line, from the same
//! [`Entry`] — its spans are put together: the request (server), under it the wait in a
//! slice's admission queue (when it waited) and the upstream exchange (client), whose ID the
//! upstream got as its parent. They wait in a bounded queue for a task that exports them in
//! batches with the OpenTelemetry OTLP exporter; when the queue is full they are dropped and
//! counted (`sluice_trace_spans{outcome="dropped"}`), never waited for by a request.

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use opentelemetry_sdk::Resource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_config::OtlpProtocol;
use sluice_net::log_limit::{Tally, REPORT_INTERVAL};
use tokio::sync::mpsc;
use tracing::warn;

use crate::access_log::Entry;
use crate::router::{Route, Target};
use sluice_core::trace_context::{RequestTrace, SentContext, TraceRules};
use sluice_upstream::Upstream;

/// The most spans in one export (the OpenTelemetry SDK's default batch).
const MAX_BATCH: usize = 512;
/// How long the exporter gathers a batch after its first span.
const BATCH_DELAY: Duration = Duration::from_secs(1);

/// The tracer of a proxy: its sampling and context rules, and the queue to its exporter.
/// Cloning is cheap.
#[derive(Debug, Clone)]
pub struct Tracing {
    rules: std::sync::Arc<TraceRules>,
    spans: mpsc::Sender<Finished>,
    counts: SpanCounts,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the OTLP exporter for {endpoint}: {source}")]
pub struct TracingError {
    endpoint: String,
    source: opentelemetry_otlp::ExporterBuildError,
}

impl Tracing {
    /// Builds the exporter `config` names and starts its task (call it inside a Tokio
    /// runtime); registers `sluice_trace_spans` in `registry`.
    pub fn start(
        config: &sluice_config::Tracing,
        registry: &mut Registry,
    ) -> Result<Self, TracingError> {
        let mut exporter = exporter(config).map_err(|source| TracingError {
            endpoint: config.endpoint.clone(),
            source,
        })?;
        exporter.set_resource(&resource(config));
        let counts = SpanCounts::register(registry);
        let (spans, queued) = mpsc::channel(config.queue);
        tokio::spawn(export(exporter, queued, counts.clone()));
        let rules = TraceRules::new(config.sample_ratio, config.parent_based, config.extract);
        Ok(Self {
            rules: std::sync::Arc::new(rules),
            spans,
            counts,
        })
    }

    /// The trace of a request whose client (`trusted` or not) sent `sent`.
    pub(crate) fn begin(&self, sent: SentContext<'_>, trusted: bool) -> RequestTrace {
        self.rules.start(sent, trusted)
    }

    /// Queues the spans of a sampled request that has ended as `entry` says.
    pub(crate) fn finish(&self, trace: &RequestTrace, entry: &Entry<'_>, route: Option<&Route>) {
        if !trace.sampled {
            return;
        }
        let finished = Finished::of(trace, entry, route);
        let spans = finished.spans();
        if self.spans.try_send(finished).is_err() {
            self.counts.dropped.inc_by(spans);
        }
    }
}

/// The exporter `config` names.
fn exporter(
    config: &sluice_config::Tracing,
) -> Result<opentelemetry_otlp::SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    match config.protocol {
        OtlpProtocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(&config.endpoint)
            .with_timeout(config.timeout)
            .build(),
        OtlpProtocol::Grpc => builder
            .with_tonic()
            .with_endpoint(&config.endpoint)
            .with_timeout(config.timeout)
            .build(),
    }
}

/// `service.name`, Sluice's version, the configured attributes (and what
/// `OTEL_RESOURCE_ATTRIBUTES` adds, as every OpenTelemetry SDK reads it).
fn resource(config: &sluice_config::Tracing) -> Resource {
    let extra = config
        .resource
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
    Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(extra)
        .build()
}

/// `sluice_trace_spans` by outcome.
#[derive(Debug, Clone)]
struct SpanCounts {
    exported: Counter,
    dropped: Counter,
    failed: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl SpanCounts {
    fn register(registry: &mut Registry) -> Self {
        let family = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "trace_spans",
            "Spans of sampled requests, by outcome: exported; dropped (the export queue was full); failed (the collector refused them or could not be reached)",
            family.clone(),
        );
        let count = |outcome| family.get_or_create(&OutcomeLabels { outcome }).clone();
        Self {
            exported: count("exported"),
            dropped: count("dropped"),
            failed: count("failed"),
        }
    }
}

/// A sampled request's spans, as the exporter's task needs them (owned: they cross tasks).
#[derive(Debug)]
struct Finished {
    trace: RequestTrace,
    name: String,
    end: SystemTime,
    status: u16,
    attributes: Vec<KeyValue>,
    /// The wait in the admission queue, when the request waited.
    queue: Option<(SystemTime, SystemTime)>,
    /// The exchange's start, cluster and attributes, when the request went upstream.
    upstream: Option<(SystemTime, String, Vec<KeyValue>)>,
}

impl Finished {
    fn of(trace: &RequestTrace, e: &Entry<'_>, route: Option<&Route>) -> Self {
        let now = Instant::now();
        let end = SystemTime::now();
        // Instants of this request, as wall-clock times.
        let at = |i: Instant| {
            end.checked_sub(now.saturating_duration_since(i))
                .unwrap_or(end)
        };
        let upstream = route.and_then(|r| match &r.target {
            Target::Upstream(u) => Some(u),
            Target::Direct(_) => None,
        });
        let leased = e.upstream.leased_at.map(at);
        let queue = e.upstream.queued.filter(|q| !q.is_zero());
        let queue = queue
            .zip(leased)
            .map(|(q, l)| (l.checked_sub(q).unwrap_or(l), l));
        let mut attributes = vec![
            KeyValue::new("http.request.method", e.method.to_string()),
            KeyValue::new("url.path", e.uri.path().to_owned()),
            KeyValue::new("http.response.status_code", i64::from(e.status)),
            KeyValue::new("network.protocol.version", protocol_version(e.version)),
            KeyValue::new("client.address", e.client.ip().to_string()),
            KeyValue::new("client.port", i64::from(e.client.port())),
            KeyValue::new(
                "http.response.body.size",
                i64::try_from(e.bytes).unwrap_or(i64::MAX),
            ),
            KeyValue::new("sluice.route", e.route.to_owned()),
        ];
        attributes.extend(
            e.user_agent
                .map(|ua| KeyValue::new("user_agent.original", ua.to_owned())),
        );
        attributes.extend(
            e.request_id
                .map(|id| KeyValue::new("sluice.request_id", id.to_owned())),
        );
        if let Some(q) = e.upstream.queued {
            let ms = q.as_secs_f64() * 1000.0;
            attributes.push(KeyValue::new("sluice.queue.wait_ms", ms));
        }
        // The exchange of a request that reached an upstream: one that answered, or that
        // failed or timed out after the request went out (502, 504).
        let went = e.upstream.answered() || matches!(e.status, 502 | 504);
        let exchange = upstream.filter(|_| went).map(|u| {
            let start = leased.unwrap_or(trace.started);
            (start, u.name().to_owned(), upstream_attributes(u, e))
        });
        if let Some(u) = upstream {
            attributes.extend(cluster_attributes(u));
        }
        Self {
            trace: trace.clone(),
            name: format!("{} {}", e.method, e.route),
            end,
            status: e.status,
            attributes,
            queue,
            upstream: exchange,
        }
    }

    /// How many spans it makes.
    fn spans(&self) -> u64 {
        1 + u64::from(self.queue.is_some()) + u64::from(self.upstream.is_some())
    }

    /// Its spans, into `out`.
    fn into_spans(self, scope: &InstrumentationScope, out: &mut Vec<SpanData>) {
        let t = &self.trace;
        let status = if self.status >= 500 {
            Status::error(format!("status {}", self.status))
        } else {
            Status::Unset
        };
        let span = |id: SpanId, parent: Option<SpanId>, kind, name: Cow<'static, str>| SpanData {
            span_context: SpanContext::new(
                t.trace_id,
                id,
                TraceFlags::SAMPLED,
                false,
                t.state.clone(),
            ),
            parent_span_id: parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: parent.is_some() && id == t.span_id,
            span_kind: kind,
            name,
            start_time: t.started,
            end_time: self.end,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        };
        if let Some((start, end)) = self.queue {
            let id = SpanId::from(fastrand::u64(1..));
            let mut queue = span(id, Some(t.span_id), SpanKind::Internal, "queue".into());
            (queue.start_time, queue.end_time) = (start, end);
            out.push(queue);
        }
        if let Some((start, cluster, attributes)) = self.upstream {
            let name = format!("upstream {cluster}");
            let mut exchange = span(
                t.upstream_span_id,
                Some(t.span_id),
                SpanKind::Client,
                name.into(),
            );
            exchange.start_time = start;
            exchange.attributes = attributes;
            exchange.status = status.clone();
            out.push(exchange);
        }
        let mut request = span(t.span_id, t.parent, SpanKind::Server, self.name.into());
        request.attributes = self.attributes;
        request.status = status;
        out.push(request);
    }
}

fn protocol_version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The cluster (and slice) a request went to.
fn cluster_attributes(u: &Upstream) -> Vec<KeyValue> {
    let mut out = vec![KeyValue::new("sluice.cluster", u.name().to_owned())];
    if let Upstream::Reverse(s) = u {
        out.push(KeyValue::new("sluice.slice", s.slice().to_owned()));
    }
    out
}

/// Who served the exchange: the static endpoint, or the session's instance.
fn upstream_attributes(u: &Upstream, e: &Entry<'_>) -> Vec<KeyValue> {
    let mut out = cluster_attributes(u);
    out.push(KeyValue::new(
        "http.response.status_code",
        i64::from(e.status),
    ));
    if let Some(addr) = e.upstream.endpoint {
        out.push(KeyValue::new("server.address", addr.ip().to_string()));
        out.push(KeyValue::new("server.port", i64::from(addr.port())));
    }
    if let Some(instance) = &e.upstream.instance {
        out.push(KeyValue::new("sluice.instance", instance.id().to_owned()));
    }
    out
}

/// The exporter's task: batches of up to [`MAX_BATCH`] spans, each gathered for at most
/// [`BATCH_DELAY`], exported one at a time; failures counted and reported at most once per
/// interval. Ends when every [`Tracing`] is gone and the queue is empty.
async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut queued: mpsc::Receiver<Finished>,
    counts: SpanCounts,
) {
    let scope = InstrumentationScope::builder("sluice")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut failures = Tally::new(REPORT_INTERVAL);
    while let Some(first) = queued.recv().await {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        first.into_spans(&scope, &mut batch);
        let until = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, queued.recv()).await {
                Ok(Some(finished)) => finished.into_spans(&scope, &mut batch),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        match exporter.export(batch).await {
            Ok(()) => {
                counts.exported.inc_by(n);
            }
            Err(error) => {
                counts.failed.inc_by(n);
                if let Some(lost) = failures.record(n, Instant::now()) {
                    warn!(lost, %error, "spans could not be exported; lost since the last report");
                }
            }
        }
    }
}
