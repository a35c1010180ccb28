//! The counters a server keeps of its connections, handles to series its owner registered
//! (the app's `Metrics`); by default series nobody scrapes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// One listener's client connections open now, and its failed TLS handshakes.
#[derive(Debug, Clone, Default)]
pub struct ConnectionCounters {
    /// Connections open now.
    pub open: Gauge,
    /// TLS handshakes that failed or timed out.
    pub tls_failures: Counter,
    /// Connections closed at accept, over `max_connections_per_client`.
    pub refused: Counter,
}

/// The byte counters of one listener's client connections: (received, sent).
pub type ByteCounters = (Counter, Counter);

/// One listener's HTTP/3 counts: QUIC handshakes completed, and requests received over them.
#[derive(Debug, Clone, Default)]
pub struct QuicCounters {
    /// QUIC handshakes that completed.
    pub handshakes: Counter,
    /// HTTP/3 requests whose head arrived.
    pub requests: Counter,
}
