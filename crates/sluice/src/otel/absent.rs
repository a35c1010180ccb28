//! Built without the `otel` feature: `[tracing]` cannot be started ([`Tracing::start`] says
//! why), so no request is traced and nothing of OpenTelemetry is compiled in.

use prometheus_client::registry::Registry;

use crate::access_log::Entry;
use crate::router::Route;
use sluice_core::trace_context::{RequestTrace, SentContext};

/// The tracer of a proxy; no value of it is made in this build.
#[derive(Debug, Clone)]
pub enum Tracing {}

/// Why tracing could not start: this build leaves OpenTelemetry out.
#[derive(Debug, thiserror::Error)]
#[error(
    "[tracing] needs OpenTelemetry, which this build of sluice leaves out (build it with the \
     `otel` cargo feature, or remove [tracing] from the configuration)"
)]
pub struct TracingError(());

impl Tracing {
    /// Refuses: this build has no exporter.
    pub fn start(
        _config: &sluice_config::Tracing,
        _registry: &mut Registry,
    ) -> Result<Self, TracingError> {
        Err(TracingError(()))
    }

    pub(crate) fn begin(&self, _sent: SentContext<'_>, _trusted: bool) -> RequestTrace {
        match *self {}
    }

    pub(crate) fn finish(&self, _trace: &RequestTrace, _entry: &Entry<'_>, _route: Option<&Route>) {
        match *self {}
    }
}
