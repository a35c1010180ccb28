//! [`Observers`]: what every transport does around a request besides serving it — its ID, its
//! trace — and, at its end, its count, its access-log line and its trace's spans. Each
//! transport fills an `access_log::Entry` the way it can; what is done with it is said here
//! once.

use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use crate::access_log::{AccessLog, Entry};
use crate::metrics::Metrics;
use crate::otel::Tracing;
use crate::router::Route;
use sluice_core::fields::Fields;
use sluice_core::request_id::RequestIds;
use sluice_core::trace_context::{RequestTrace, SentContext};

/// A proxy's metrics, access log, request IDs and tracing, each off by default; shared by
/// its transports behind one `Arc` (a logged request's body holds that, not a copy).
#[derive(Debug, Clone, Default)]
pub(crate) struct Observers {
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) access_log: Option<AccessLog>,
    pub(crate) request_ids: Option<RequestIds>,
    pub(crate) tracing: Option<Tracing>,
}

impl Observers {
    /// The request's ID and the field it goes in: the trusted client's copy, else a new one
    /// (`None` without `[request_id]`).
    pub(crate) fn request_id(
        &self,
        fields: &impl Fields,
        trusted: bool,
    ) -> Option<(&HeaderName, HeaderValue)> {
        let ids = self.request_ids.as_ref()?;
        let sent = fields.first(ids.name().as_str());
        Some((ids.name(), ids.decide(sent, trusted)))
    }

    /// The request's trace, continued from what its client sent or new (`None` without
    /// `[tracing]`).
    pub(crate) fn trace(&self, sent: SentContext<'_>, trusted: bool) -> Option<RequestTrace> {
        Some(self.tracing.as_ref()?.begin(sent, trusted))
    }

    /// Whether a request's end is written down: there is an access log, or its trace is
    /// sampled.
    pub(crate) fn records(&self, trace: Option<&RequestTrace>) -> bool {
        self.access_log.is_some() || self.sampled(trace).is_some()
    }

    /// Writes the request's access-log line and queues its trace's spans (when sampled), once
    /// its response has gone out (or the client went away).
    pub(crate) fn record(
        &self,
        entry: &Entry<'_>,
        route: Option<&Route>,
        trace: Option<&RequestTrace>,
    ) {
        self.record_answered(entry, None, route, trace);
    }

    /// [`Self::record`] of an answer a route's cache gave `cache_status` (its `Cache-Status`):
    /// hyper's path, which serves every cached route.
    pub(crate) fn record_answered(
        &self,
        entry: &Entry<'_>,
        cache_status: Option<&str>,
        route: Option<&Route>,
        trace: Option<&RequestTrace>,
    ) {
        if let Some(log) = &self.access_log {
            log.record(entry, cache_status);
        }
        if let Some((tracing, trace)) = self.sampled(trace) {
            tracing.finish(trace, entry, route);
        }
    }

    fn sampled<'a>(
        &'a self,
        trace: Option<&'a RequestTrace>,
    ) -> Option<(&'a Tracing, &'a RequestTrace)> {
        self.tracing.as_ref().zip(trace.filter(|t| t.sampled))
    }
}
