//! `[tracing]`: OpenTelemetry traces of the requests, exported over OTLP.

use std::time::Duration;

/// `[tracing]`: a span per request (with its queue wait and its upstream exchange), W3C trace
/// context continued or started and passed upstream, spans exported over OTLP.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// Where spans go: for `http/protobuf` the whole URL of the traces resource
    /// (`http://host:4318/v1/traces`), for `grpc` the collector's base URL.
    pub endpoint: String,
    /// How they go.
    pub protocol: OtlpProtocol,
    /// The share of new traces sampled, 0 to 1.
    pub sample_ratio: f64,
    /// Whether a request that continues a trace follows its parent's sampling decision
    /// (else `sample_ratio` decides for every request).
    pub parent_based: bool,
    /// Whose `traceparent` a request continues.
    pub extract: TraceExtract,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// More resource attributes, by name.
    pub resource: Vec<(String, String)>,
    /// The most sampled requests whose spans (one to three each) wait for export; more are
    /// dropped and counted.
    pub queue: usize,
    /// The longest one export may take.
    pub timeout: Duration,
}

/// The OTLP transport (`OTEL_EXPORTER_OTLP_PROTOCOL`'s values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`: protobuf over HTTP/1.1 (default port 4318).
    HttpProtobuf,
    /// `grpc`: protobuf over gRPC (default port 4317).
    Grpc,
}

/// Whose trace context (`traceparent`, `tracestate`) a request continues; the others start a
/// new trace, and their copies do not go upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceExtract {
    /// Every client's (as NGINX's `otel_trace_context propagate` and Envoy do).
    Always,
    /// Only a trusted proxy's (`trusted_proxies`): a client on the internet cannot choose
    /// the trace, nor ask for sampling.
    Trusted,
    /// Nobody's: every request starts a trace.
    Never,
}
