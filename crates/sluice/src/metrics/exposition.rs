//! The two exposition formats `/metrics` speaks, chosen by the scraper's `Accept` as
//! Prometheus' own client libraries choose: the Prometheus text format (`text/plain;
//! version=0.0.4`) unless OpenMetrics is asked for.
//!
//! `prometheus-client` encodes only OpenMetrics, where a counter family `x` is declared as
//! `# TYPE x counter` and its samples are `x_total`. Served as `text/plain`, Prometheus'
//! parser (`expfmt`) reads such a family as a counter with no samples and every `x_total`
//! sample as UNTYPED, since in that format a family's samples carry its name exactly. So the
//! text format is made from the OpenMetrics one by [`to_prometheus_text`], as client_golang
//! writes it: the counter family is named `x_total`.

use std::collections::HashMap;

/// An exposition format `/metrics` can answer in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposition {
    /// The Prometheus text format, version 0.0.4: what any scraper understands, and the
    /// answer when nothing else is asked for.
    PrometheusText,
    /// OpenMetrics 1.0.0 text (also answered to a scraper that asks for 0.0.1, the draft
    /// version Prometheus still lists, whose text is the same for what Sluice exposes).
    OpenMetrics,
}

impl Exposition {
    /// The format to answer an `Accept` header with (`None`: no header): the acceptable media
    /// range with the highest `q` that Sluice can serve, the first of equals; the Prometheus
    /// text format if none is.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::PrometheusText;
        };
        let mut best: Option<(f32, Self)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0_f32, None);
            for param in parts {
                let Some((key, value)) = param.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    // An unparsable weight is ignored rather than made 1: a range is not
                    // preferred by being malformed.
                    "q" => q = value.parse().unwrap_or(0.0),
                    "version" => version = Some(value.to_owned()),
                    _ => {}
                }
            }
            let format = match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None | Some("1.0.0" | "0.0.1")) => {
                    Self::OpenMetrics
                }
                // Text 1.0.0 is 0.0.4 with quoted UTF-8 names allowed; Sluice's names need
                // no quoting, so a 0.0.4 body is valid as either.
                ("text/plain", None | Some("0.0.4" | "1.0.0")) => Self::PrometheusText,
                ("*/*" | "text/*", _) => Self::PrometheusText,
                ("application/*", _) => Self::OpenMetrics,
                _ => continue,
            };
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Self::PrometheusText, |(_, f)| f)
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics text exposition as
/// `prometheus-client` writes it: counter families renamed to their samples' `_total` name,
/// info families to gauges named `_info`, `unknown` to `untyped`; `# UNIT`, `# EOF` and
/// exemplars (which 0.0.4 has not) left out. Samples are unchanged.
pub(super) fn to_prometheus_text(openmetrics: &str) -> String {
    let types: HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 16);
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let (name, _) = renamed(name, types.get(name).copied());
            out.push_str("# HELP ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(help);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = renamed(name, Some(kind));
            out.push_str("# TYPE ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(kind);
        } else if line.starts_with('#') {
            // `# UNIT` and `# EOF`: 0.0.4 has neither (its parser would skip them as
            // comments, but a strict reader need not).
            continue;
        } else {
            out.push_str(without_exemplar(line));
        }
        out.push('\n');
    }
    out
}

/// A family's name and type in the text format, from its OpenMetrics name and type.
fn renamed(name: &str, kind: Option<&str>) -> (String, &'static str) {
    match kind {
        Some("counter") => (format!("{name}_total"), "counter"),
        Some("info") => (format!("{name}_info"), "gauge"),
        Some("gauge") => (name.to_owned(), "gauge"),
        Some("histogram") => (name.to_owned(), "histogram"),
        Some("summary") => (name.to_owned(), "summary"),
        _ => (name.to_owned(), "untyped"),
    }
}

/// A sample line without its exemplar (` # {...} v`): the first ` # ` outside a quoted
/// label value.
fn without_exemplar(line: &str) -> &str {
    let bytes = line.as_bytes();
    let (mut quoted, mut escaped) = (false, false);
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b'#' if !quoted && i > 0 && bytes[i - 1] == b' ' => return line[..i - 1].trim_end(),
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_asks_for_openmetrics_first() {
        // Prometheus 2.x's and 3.x's scrape Accept headers.
        let v2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                  version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let v3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
                  application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;\
                  escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert_eq!(Exposition::negotiate(Some(v2)), Exposition::OpenMetrics);
        assert_eq!(Exposition::negotiate(Some(v3)), Exposition::OpenMetrics);
        // `scrape_protocols = ["PrometheusText0.0.4"]`, curl, a browser, nothing.
        for accept in [
            Some("text/plain;version=0.0.4;q=0.2,*/*;q=0.1"),
            Some("*/*"),
            Some("text/html,application/xhtml+xml,*/*;q=0.8"),
            Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily"),
            Some("application/openmetrics-text;version=2.0.0"),
            Some("application/openmetrics-text;q=0"),
            None,
        ] {
            assert_eq!(
                Exposition::negotiate(accept),
                Exposition::PrometheusText,
                "{accept:?}"
            );
        }
        assert_eq!(
            Exposition::negotiate(Some("text/plain;q=0.5, application/openmetrics-text")),
            Exposition::OpenMetrics
        );
    }

    #[test]
    fn counters_are_named_as_their_samples_in_the_text_format() {
        let om = "# HELP sluice_requests Requests answered.\n\
                  # TYPE sluice_requests counter\n\
                  sluice_requests_total{route=\"a # {b}\",status=\"200\"} 3 # {trace=\"x\"} 1.0\n\
                  # HELP sluice_wait_seconds Waits.\n\
                  # TYPE sluice_wait_seconds histogram\n\
                  # UNIT sluice_wait_seconds seconds\n\
                  sluice_wait_seconds_bucket{le=\"+Inf\"} 1\n\
                  sluice_wait_seconds_sum 0.5\n\
                  sluice_wait_seconds_count 1\n\
                  # HELP build Build.\n\
                  # TYPE build info\n\
                  build_info{version=\"1\"} 1\n\
                  # HELP odd Odd.\n\
                  # TYPE odd unknown\n\
                  odd 1\n\
                  # EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP sluice_requests_total Requests answered.\n\
             # TYPE sluice_requests_total counter\n\
             sluice_requests_total{route=\"a # {b}\",status=\"200\"} 3\n\
             # HELP sluice_wait_seconds Waits.\n\
             # TYPE sluice_wait_seconds histogram\n\
             sluice_wait_seconds_bucket{le=\"+Inf\"} 1\n\
             sluice_wait_seconds_sum 0.5\n\
             sluice_wait_seconds_count 1\n\
             # HELP build_info Build.\n\
             # TYPE build_info gauge\n\
             build_info{version=\"1\"} 1\n\
             # HELP odd Odd.\n\
             # TYPE odd untyped\n\
             odd 1\n"
        );
    }
}
