//! W3C trace context (`[tracing]`): the rule of both data paths, without I/O. A request
//! continues the trace its client's `traceparent` names (when `extract` allows it), else
//! starts one; sampling is decided here, once, by the OpenTelemetry SDK's samplers. The
//! request gets two spans of its own — the request ([`RequestTrace::span_id`]) and, under it,
//! the upstream exchange ([`RequestTrace::upstream_span_id`]) — and the upstream is sent a
//! `traceparent` naming the exchange as its parent, over any copy. The client's `tracestate`
//! goes upstream as it came when its trace is continued; when it is not, no copy does.

#[cfg(feature = "otel")]
use std::time::SystemTime;

use http::HeaderValue;
#[cfg(feature = "otel")]
use opentelemetry::propagation::{Extractor, TextMapPropagator};
#[cfg(feature = "otel")]
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
};
#[cfg(feature = "otel")]
use opentelemetry::Context;
#[cfg(feature = "otel")]
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "otel")]
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};
#[cfg(feature = "otel")]
use sluice_config::TraceExtract;

/// The field that names a request's trace and parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The field of vendors' trace data.
pub const TRACESTATE: &str = "tracestate";

/// How requests join traces: whose context they continue, and which are sampled.
#[cfg(feature = "otel")]
#[derive(Debug)]
pub struct TraceRules {
    sampler: Sampler,
    extract: TraceExtract,
}

/// A request's place in a trace.
#[cfg(feature = "otel")]
#[derive(Debug, Clone)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The request's span.
    pub span_id: SpanId,
    /// The upstream exchange's span, the upstream's parent.
    pub upstream_span_id: SpanId,
    /// The client's span, when the request continues its trace.
    pub parent: Option<SpanId>,
    pub sampled: bool,
    /// The continued trace's vendor data (empty for a new trace).
    pub state: TraceState,
    /// The `traceparent` sent upstream.
    pub traceparent: HeaderValue,
    /// When the request began (a span's start is wall-clock time).
    pub started: SystemTime,
}

#[cfg(feature = "otel")]
impl RequestTrace {
    /// Whether the client's `tracestate` goes upstream: only with the trace it belongs to.
    pub fn keeps_tracestate(&self) -> bool {
        self.parent.is_some()
    }
}

/// Built without the `otel` feature no request is traced: no value of this type is made
/// (`sluice::Tracing` cannot be started in such a build).
#[cfg(not(feature = "otel"))]
#[derive(Debug, Clone)]
pub struct RequestTrace {
    /// Whether its spans are exported.
    pub sampled: bool,
    /// The `traceparent` sent upstream.
    pub traceparent: HeaderValue,
    never: std::convert::Infallible,
}

#[cfg(not(feature = "otel"))]
impl RequestTrace {
    /// Whether the client's `tracestate` goes upstream.
    pub fn keeps_tracestate(&self) -> bool {
        match self.never {}
    }
}

/// What a client sent of its trace context: the `traceparent` when it sent exactly one (two
/// make it invalid, W3C Trace Context §3.2), the first `tracestate`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SentContext<'a> {
    pub traceparent: Option<&'a [u8]>,
    pub tracestate: Option<&'a [u8]>,
}

impl<'a> SentContext<'a> {
    /// What the request's fields (`name`, `value`, in order) say.
    pub fn of(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        let mut sent = Self::default();
        let mut traceparents = 0;
        for (name, value) in fields {
            if name.eq_ignore_ascii_case(TRACEPARENT.as_bytes()) {
                traceparents += 1;
                sent.traceparent = Some(value);
            } else if name.eq_ignore_ascii_case(TRACESTATE.as_bytes()) {
                sent.tracestate.get_or_insert(value);
            }
        }
        if traceparents > 1 {
            sent.traceparent = None;
        }
        sent
    }
}

#[cfg(feature = "otel")]
impl Extractor for SentContext<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => self.tracestate,
            _ => None,
        };
        value.and_then(|v| std::str::from_utf8(v).ok())
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

#[cfg(feature = "otel")]
impl TraceRules {
    /// New traces sampled at `ratio` (0 to 1); a continued one follows its parent's decision
    /// when `parent_based`.
    pub fn new(ratio: f64, parent_based: bool, extract: TraceExtract) -> Self {
        let ratio = Sampler::TraceIdRatioBased(ratio);
        let sampler = if parent_based {
            Sampler::ParentBased(Box::new(ratio))
        } else {
            ratio
        };
        Self { sampler, extract }
    }

    /// The trace of a request whose client (`trusted` or not) sent `sent`.
    pub fn start(&self, sent: SentContext<'_>, trusted: bool) -> RequestTrace {
        let started = SystemTime::now();
        let extract = match self.extract {
            TraceExtract::Always => true,
            TraceExtract::Trusted => trusted,
            TraceExtract::Never => false,
        };
        let parent = extract.then(|| continued(sent)).flatten();
        let trace_id = parent
            .as_ref()
            .map_or_else(|| TraceId::from(fastrand::u128(1..)), SpanContext::trace_id);
        let parent_cx = parent
            .as_ref()
            .map(|sc| Context::new().with_remote_span_context(sc.clone()));
        let decision = self.sampler.should_sample(
            parent_cx.as_ref(),
            trace_id,
            "request",
            &SpanKind::Server,
            &[],
            &[],
        );
        let sampled = decision.decision == SamplingDecision::RecordAndSample;
        let upstream_span_id = SpanId::from(fastrand::u64(1..));
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let traceparent = format!("00-{trace_id:032x}-{upstream_span_id:016x}-{flags:02x}");
        RequestTrace {
            trace_id,
            span_id: SpanId::from(fastrand::u64(1..)),
            upstream_span_id,
            parent: parent.as_ref().map(SpanContext::span_id),
            sampled,
            state: parent.map_or_else(TraceState::default, |sc| sc.trace_state().clone()),
            traceparent: HeaderValue::from_str(&traceparent)
                .unwrap_or_else(|_| HeaderValue::from_static("")),
            started,
        }
    }
}

/// The client's span, when `sent` names a valid one.
#[cfg(feature = "otel")]
fn continued(sent: SentContext<'_>) -> Option<SpanContext> {
    if !well_formed(sent.traceparent?) {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(&sent);
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// Whether `tp` has a `traceparent`'s shape (W3C Trace Context §3.2): `version-trace-parent-
/// flags`, 2, 32, 16 and 2 lowercase hex digits, version `ff` refused, and after version `00`
/// nothing more (a later version may go on after a `-`). The propagator parses the numbers
/// leniently (`+1` and `1` would pass): this is the shape it leaves unchecked.
#[cfg(feature = "otel")]
fn well_formed(tp: &[u8]) -> bool {
    let hex = |b: &[u8]| {
        b.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    if tp.len() < 55 || !hex(&tp[..2]) || &tp[..2] == b"ff" {
        return false;
    }
    let dashes = tp[2] == b'-' && tp[35] == b'-' && tp[52] == b'-';
    let fields = hex(&tp[3..35]) && hex(&tp[36..52]) && hex(&tp[53..55]);
    let end = tp.len() == 55 || (&tp[..2] != b"00" && tp[55] == b'-');
    dashes && fields && end
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    const PARENT: &[u8] = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn sent(traceparent: &'static [u8]) -> SentContext<'static> {
        SentContext {
            traceparent: Some(traceparent),
            tracestate: Some(b"congo=t61rcWkgMzE"),
        }
    }

    fn fields(tp: &HeaderValue) -> Vec<String> {
        let text = tp.to_str().unwrap_or_default();
        text.split('-').map(str::to_owned).collect()
    }

    #[test]
    fn a_clients_trace_is_continued_under_a_span_of_the_upstream_exchange() {
        let rules = TraceRules::new(0.0, true, TraceExtract::Always);
        let trace = rules.start(sent(PARENT), false);
        assert_eq!(
            format!("{:032x}", trace.trace_id),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(
            trace.parent.map(|p| format!("{p:016x}")).as_deref(),
            Some("b7ad6b7169203331")
        );
        assert!(
            trace.sampled,
            "the parent sampled it, and the sampler is parent-based"
        );
        assert!(trace.keeps_tracestate());
        assert_eq!(trace.state.header(), "congo=t61rcWkgMzE");
        let up = fields(&trace.traceparent);
        assert_eq!(up[0], "00");
        assert_eq!(up[1], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(up[2], format!("{:016x}", trace.upstream_span_id));
        assert_ne!(trace.upstream_span_id, trace.span_id);
        assert_eq!(up[3], "01");
    }

    #[test]
    fn an_unsampled_parent_is_followed_when_parent_based_and_not_otherwise() {
        let unsampled = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        let follows = TraceRules::new(1.0, true, TraceExtract::Always);
        let trace = follows.start(sent(unsampled), false);
        assert!(!trace.sampled);
        assert_eq!(fields(&trace.traceparent)[3], "00");
        let ratio_only = TraceRules::new(1.0, false, TraceExtract::Always);
        assert!(ratio_only.start(sent(unsampled), false).sampled);
    }

    #[test]
    fn invalid_or_repeated_context_starts_a_new_trace_without_the_clients_state() {
        let rules = TraceRules::new(1.0, true, TraceExtract::Always);
        for bad in [
            &b"00-00000000000000000000000000000000-b7ad6b7169203331-01"[..],
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            b"garbage",
            b"",
            b"00-1-1-01",
            b"00-+af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-+7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",
        ] {
            let trace = rules.start(sent(bad), false);
            assert!(trace.parent.is_none(), "{:?}", String::from_utf8_lossy(bad));
            assert!(!trace.keeps_tracestate());
            assert_ne!(
                format!("{:032x}", trace.trace_id),
                "0af7651916cd43dd8448eb211c80319c"
            );
        }
        let none = rules.start(SentContext::default(), false);
        assert!(none.parent.is_none() && none.sampled);
    }

    #[test]
    fn two_traceparents_are_none_and_the_first_tracestate_counts() {
        let fields = [
            (&b"TraceParent"[..], PARENT),
            (b"tracestate", b"a=1"),
            (b"tracestate", b"b=2"),
        ];
        let sent = SentContext::of(fields.into_iter());
        assert_eq!(sent.traceparent, Some(PARENT));
        assert_eq!(sent.tracestate, Some(&b"a=1"[..]));
        let twice = [(&b"traceparent"[..], PARENT), (b"traceparent", PARENT)];
        assert_eq!(SentContext::of(twice.into_iter()).traceparent, None);
    }

    #[test]
    fn a_later_version_may_carry_more_after_a_dash() {
        let rules = TraceRules::new(1.0, true, TraceExtract::Always);
        let later =
            b"cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds";
        let trace = rules.start(sent(later), false);
        assert_eq!(
            format!("{:032x}", trace.trace_id),
            "0af7651916cd43dd8448eb211c80319c"
        );
    }

    #[test]
    fn extract_decides_whose_context_is_continued() {
        let trusted_only = TraceRules::new(1.0, true, TraceExtract::Trusted);
        assert!(trusted_only.start(sent(PARENT), false).parent.is_none());
        assert!(trusted_only.start(sent(PARENT), true).parent.is_some());
        let never = TraceRules::new(1.0, true, TraceExtract::Never);
        assert!(never.start(sent(PARENT), true).parent.is_none());
    }

    #[test]
    fn new_traces_are_sampled_at_the_ratio() {
        let rules = TraceRules::new(0.25, true, TraceExtract::Always);
        let sampled = (0..4000)
            .filter(|_| rules.start(SentContext::default(), false).sampled)
            .count();
        assert!((700..1300).contains(&sampled), "{sampled} of 4000 at 0.25");
        let none = TraceRules::new(0.0, true, TraceExtract::Always);
        assert!(!none.start(SentContext::default(), false).sampled);
    }
}
