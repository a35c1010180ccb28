//! [`AccessLog`]: one line per answered request, in the Common or Combined Log Format, as JSON,
//! or by a template of the operator's (`docs/access-log.md`), to stdout or a file
//! (`[access_log]`; off by default).
//!
//! A line is written when the response's body has ended (or the client went away), so its
//! duration and bytes mean what NGINX's `$request_time` and `$body_bytes_sent` mean: from the
//! request to the last byte, and the body bytes that went out (Sluice's own error answers
//! included).
//!
//! Requests only queue their line; one background task writes, so a slow disk never holds a
//! request. If the writer falls more than [`BACKLOG`] lines behind, lines are dropped and
//! counted, and the drop is reported once it catches up.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Uri, Version};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::warn;

use sluice_net::log_limit::Tally;

pub(crate) use sluice_config::{AccessLogFormat, AccessLogTarget};
use sluice_config::{LogField, LogPiece, LogTemplate};

/// Lines that may wait for the writer before new ones are dropped.
pub(crate) const BACKLOG: usize = 65_536;

/// What one answered request leaves in the access log.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// The request's method.
    pub method: &'a Method,
    /// The request target.
    pub uri: &'a Uri,
    /// The HTTP version.
    pub version: Version,
    /// The response status.
    pub status: u16,
    /// The response body's bytes sent to the client (NGINX's `$body_bytes_sent`).
    pub bytes: u64,
    /// Whether the whole body went out (false: the client went away, or the body failed).
    pub complete: bool,
    /// The request body's length, when its framing said it.
    pub request_bytes: Option<u64>,
    /// The route that matched (`-`: none).
    pub route: &'a str,
    /// From the request to the response body's end (NGINX's `$request_time`).
    pub elapsed: Duration,
    /// Who served it upstream: a static endpoint, or a session's instance and its wait.
    pub upstream: &'a sluice_upstream::ServedBy,
    /// The `User-Agent`, if any.
    pub user_agent: Option<&'a str>,
    /// The `Referer`, if any.
    pub referer: Option<&'a str>,
    /// The request's ID, when `[request_id]` is on.
    pub request_id: Option<&'a str>,
}

/// The access log's sender side; cheap to clone.
#[derive(Debug, Clone)]
pub struct AccessLog {
    format: AccessLogFormat,
    lines: mpsc::Sender<String>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// Opens `target` (a file is created or appended to) and starts the writer task; call
    /// it inside a Tokio runtime.
    pub fn open(target: &AccessLogTarget, format: AccessLogFormat) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match target {
            AccessLogTarget::Stdout => Box::new(std::io::stdout()),
            AccessLogTarget::File(path) => Box::new(open_file(path)?),
        };
        let (lines, rx) = mpsc::channel(BACKLOG);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::task::spawn_blocking({
            let dropped = Arc::clone(&dropped);
            move || write_lines(out, rx, &dropped)
        });
        Ok(Self {
            format,
            lines,
            dropped,
        })
    }

    /// Queues the line for `entry`, whose answer's `Cache-Status` (a route's cache's) is
    /// `cache_status` (the fixed NGINX formats leave it out).
    pub(crate) fn record(&self, entry: &Entry<'_>, cache_status: Option<&str>) {
        let now = SystemTime::now();
        let line = match &self.format {
            AccessLogFormat::Common => common(entry, now),
            AccessLogFormat::Combined => combined(entry, now),
            AccessLogFormat::Json => json_line(entry, cache_status, now),
            AccessLogFormat::Template(t) => template(entry, cache_status, now, t),
        };
        if self.lines.try_send(line).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn open_file(path: &PathBuf) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// How often a failing access log (a full disk, `/dev/full`) is reported: requests go on being
/// served, and one warning per interval says how many lines were lost.
pub(crate) const FAILURE_REPORT_INTERVAL: Duration = sluice_net::log_limit::REPORT_INTERVAL;

/// The writer: one line at a time, flushed whenever the queue runs empty.
fn write_lines(
    mut out: Box<dyn Write + Send>,
    mut rx: mpsc::Receiver<String>,
    dropped: &AtomicU64,
) {
    let mut failures = Tally::new(FAILURE_REPORT_INTERVAL);
    while let Some(line) = rx.blocking_recv() {
        let mut batch = 1;
        let mut result = writeln!(out, "{line}");
        while let Ok(line) = rx.try_recv() {
            batch += 1;
            result = result.and_then(|()| writeln!(out, "{line}"));
        }
        if let Err(error) = result.and_then(|()| out.flush()) {
            if let Some(lost) = failures.record(batch, std::time::Instant::now()) {
                warn!(lost, %error, "the access log cannot be written; lines lost since the last report");
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            warn!(lost, "access log lines dropped: the writer fell behind");
        }
    }
}

/// `client - - [day/Mon/year:HH:MM:SS +0000] "METHOD target HTTP/x" status bytes`.
fn common(e: &Entry<'_>, now: SystemTime) -> String {
    format!(
        "{} - - [{}] \"{} {} {:?}\" {} {}",
        e.client.ip(),
        clf_time(now),
        e.method,
        escape_quoted(request_target(e.uri)),
        e.version,
        e.status,
        e.bytes
    )
}

/// `day/Mon/year:HH:MM:SS +0000`, as the Common Log Format writes a time.
fn clf_time(now: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(now);
    let month = MONTHS[(mo - 1) as usize];
    format!("{d:02}/{month}/{y}:{h:02}:{mi:02}:{s:02} +0000")
}

/// `year-mm-ddTHH:MM:SSZ`.
fn iso_time(now: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(now);
    format!("{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// A line of the operator's template: each field as `docs/access-log.md` says, `-` for one
/// without a value.
fn template(e: &Entry<'_>, cache: Option<&str>, now: SystemTime, t: &LogTemplate) -> String {
    let mut line = String::with_capacity(160);
    for piece in &t.0 {
        match piece {
            LogPiece::Text(text) => line.push_str(text),
            LogPiece::Field(LogField::CacheStatus) => {
                line.push_str(&cache.map_or_else(|| "-".to_owned(), escape_quoted));
            }
            LogPiece::Field(f) => field(&mut line, e, now, *f),
        }
    }
    line
}

/// Writes what `{f}` shows for `e` into `out` (a `String`: writing cannot fail).
fn field(out: &mut String, e: &Entry<'_>, now: SystemTime, f: LogField) {
    use std::fmt::Write as _;
    fn or_dash(out: &mut String, v: Option<impl std::fmt::Display>) -> std::fmt::Result {
        match v {
            Some(v) => write!(out, "{v}"),
            None => out.write_str("-"),
        }
    }
    let _ = match f {
        LogField::Client => write!(out, "{}", e.client.ip()),
        LogField::ClientPort => write!(out, "{}", e.client.port()),
        LogField::Time => write!(out, "{}", clf_time(now)),
        LogField::TimeIso8601 => write!(out, "{}", iso_time(now)),
        LogField::Method => write!(out, "{}", e.method),
        LogField::Target => write!(out, "{}", escape_quoted(request_target(e.uri))),
        LogField::Protocol => write!(out, "{:?}", e.version),
        LogField::Request => write!(
            out,
            "{} {} {:?}",
            e.method,
            escape_quoted(request_target(e.uri)),
            e.version
        ),
        LogField::Status => write!(out, "{}", e.status),
        LogField::Bytes => write!(out, "{}", e.bytes),
        LogField::RequestBytes => or_dash(out, e.request_bytes),
        LogField::RequestTime => {
            let ms = e.elapsed.as_millis();
            write!(out, "{}.{:03}", ms / 1000, ms % 1000)
        }
        LogField::DurationMs => write!(out, "{}", duration_ms(e.elapsed)),
        LogField::Route => write!(out, "{}", e.route),
        LogField::UpstreamAddr => or_dash(out, e.upstream.endpoint),
        LogField::Instance => or_dash(out, e.upstream.instance.as_ref().map(|i| i.id())),
        LogField::QueueMs => or_dash(out, e.upstream.queued.map(duration_ms)),
        LogField::UserAgent => or_dash(out, e.user_agent.map(escape_quoted)),
        LogField::Referer => or_dash(out, e.referer.map(escape_quoted)),
        LogField::Complete => write!(out, "{}", e.complete),
        LogField::RequestId => or_dash(out, e.request_id),
        // Not the entry's: written by `template`.
        LogField::CacheStatus => out.write_str("-"),
    };
}

/// Common, then `"referer" "user agent"` (`"-"` for either absent), as NGINX's `combined`.
fn combined(e: &Entry<'_>, now: SystemTime) -> String {
    let quoted = |v: Option<&str>| v.map_or_else(|| "-".to_owned(), escape_quoted);
    format!(
        "{} \"{}\" \"{}\"",
        common(e, now),
        quoted(e.referer),
        quoted(e.user_agent)
    )
}

/// A value written inside `"…"` (the request target, a header value), as NGINX's default
/// `escape` writes it: `"`, `\\`, control bytes and every byte above `~` (UTF-8 too, U+2028
/// among it) as `\\xHH`, so a line is one line of printable ASCII and a quote always ends a
/// field.
fn escape_quoted(v: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'"' | b'\\' | ..=0x1f | 0x7f.. => {
                let _ = write!(out, "\\x{b:02X}");
            }
            _ => out.push(char::from(b)),
        }
    }
    out
}

fn json_line(e: &Entry<'_>, cache_status: Option<&str>, now: SystemTime) -> String {
    json!({
        "time": iso_time(now),
        "client": e.client.ip().to_string(),
        "method": e.method.as_str(),
        "target": request_target(e.uri),
        "protocol": format!("{:?}", e.version),
        "status": e.status,
        "bytes": e.bytes,
        "complete": e.complete,
        "request_bytes": e.request_bytes,
        "route": e.route,
        "duration_ms": duration_ms(e.elapsed),
        "upstream_addr": e.upstream.endpoint.map(|a| a.to_string()),
        "instance": e.upstream.instance.as_ref().map(|i| i.id()),
        "queue_ms": e.upstream.queued.map(duration_ms),
        "user_agent": e.user_agent,
        "referer": e.referer,
        "request_id": e.request_id,
        "cache_status": cache_status,
    })
    .to_string()
}

/// The target as an HTTP/1.1 client sends it, as NGINX's `$request` shows it: origin form
/// (`/path?query`), whatever the protocol (HTTP/2's `:authority` is not part of it); a
/// CONNECT's authority as it is.
fn request_target(uri: &Uri) -> &str {
    match (uri.path_and_query(), uri.authority()) {
        (Some(pq), _) => pq.as_str(),
        (None, Some(authority)) => authority.as_str(),
        (None, None) => "/",
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// UTC (year, month, day, hour, minute, second) of `t` (days-from-civil, inverted; Howard
/// Hinnant's algorithm).
fn civil(t: SystemTime) -> (i64, u32, u32, u32, u32, u32) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (year, month, day, h as u32, m as u32, s as u32)
}

/// Milliseconds with microsecond precision, as the shortest decimal that reads back to it
/// (`5.37`, not the `5.370000000000001` that multiplying seconds by 1000 gives).
fn duration_ms(d: Duration) -> f64 {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    // Below 2^53 microseconds (285 years) the division is exact to the last digit printed.
    micros as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    static NOBODY: sluice_upstream::ServedBy = sluice_upstream::ServedBy {
        endpoint: None,
        instance: None,
        queued: None,
        leased_at: None,
    };

    fn entry<'a>(method: &'a Method, uri: &'a Uri) -> Entry<'a> {
        Entry {
            client: "192.0.2.7:5555".parse().unwrap_or_else(|_| unreachable!()),
            method,
            uri,
            version: Version::HTTP_11,
            status: 200,
            bytes: 6,
            complete: true,
            request_bytes: Some(0),
            route: "api",
            elapsed: Duration::from_millis(3),
            upstream: &NOBODY,
            user_agent: Some("curl/8"),
            referer: None,
            request_id: None,
        }
    }

    #[test]
    fn combined_lines_quote_referer_and_agent() {
        let (m, u) = (Method::GET, Uri::from_static("/a"));
        let at = UNIX_EPOCH + Duration::from_secs(1_795_424_400);
        let mut e = entry(&m, &u);
        e.user_agent = Some("a \"quoted\" agent");
        assert_eq!(
            combined(&e, at),
            "192.0.2.7 - - [23/Nov/2026:09:00:00 +0000] \"GET /a HTTP/1.1\" 200 6 \"-\" \"a \\x22quoted\\x22 agent\""
        );
    }

    #[test]
    fn json_durations_are_milliseconds_without_float_noise() {
        for (micros, printed) in [
            (5_370, "5.37"),
            (3_000, "3.0"),
            (1, "0.001"),
            (123_456, "123.456"),
        ] {
            let ms = duration_ms(Duration::from_micros(micros));
            assert_eq!(serde_json::json!(ms).to_string(), printed);
        }
        assert_eq!(
            serde_json::json!(duration_ms(Duration::from_nanos(5_370_123))).to_string(),
            "5.37"
        );
        // 5.37 us: seconds times 1000 printed 0.005370000000000001.
        assert_eq!(
            serde_json::json!(duration_ms(Duration::from_nanos(5_370))).to_string(),
            "0.005"
        );
    }

    #[test]
    fn civil_dates_are_right_across_leap_years() {
        let at = |s: u64| civil(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(at(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(at(1_795_424_400), (2026, 11, 23, 9, 0, 0));
    }

    #[test]
    fn http2_targets_are_written_in_origin_form() {
        let m = Method::GET;
        let u = Uri::from_static("https://api.example.com/hello?x=1");
        let mut e = entry(&m, &u);
        e.version = Version::HTTP_2;
        let at = UNIX_EPOCH + Duration::from_secs(1_795_424_400);
        assert!(
            common(&e, at).contains("\"GET /hello?x=1 HTTP/2.0\""),
            "{}",
            common(&e, at)
        );
        let v: serde_json::Value =
            serde_json::from_str(&json_line(&e, None, at)).unwrap_or_default();
        assert_eq!(v["target"], "/hello?x=1");
        let (m, u) = (Method::CONNECT, Uri::from_static("example.com:443"));
        assert!(common(&entry(&m, &u), at).contains("\"CONNECT example.com:443 HTTP/1.1\""));
    }

    #[test]
    fn a_template_writes_its_fields_and_a_dash_for_what_is_missing() {
        let (m, u) = (Method::POST, Uri::from_static("/orders?id=7"));
        let at = UNIX_EPOCH + Duration::from_secs(1_795_424_400);
        let mut e = entry(&m, &u);
        e.elapsed = Duration::from_micros(1_234_567);
        e.user_agent = Some("a \"quoted\" agent");
        let t = LogTemplate::parse(
            "{client}:{client_port} [{time}] {time_iso8601} \"{request}\" {status} {bytes} \
             {request_time} {duration_ms} {route} {upstream_addr} {queue_ms} \"{user_agent}\" \
             {referer} {complete} {{}}",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            template(&e, None, at, &t),
            "192.0.2.7:5555 [23/Nov/2026:09:00:00 +0000] 2026-11-23T09:00:00Z \
             \"POST /orders?id=7 HTTP/1.1\" 200 6 1.234 1234.567 api - - \
             \"a \\x22quoted\\x22 agent\" - true {}"
        );
    }

    #[test]
    fn a_template_writes_the_cache_status_or_a_dash() {
        let (m, u) = (Method::GET, Uri::from_static("/a"));
        let at = UNIX_EPOCH;
        let t = LogTemplate::parse("{status} [{cache_status}]").unwrap_or_else(|e| panic!("{e}"));
        let e = entry(&m, &u);
        assert_eq!(
            template(&e, Some("Sluice; hit"), at, &t),
            "200 [Sluice; hit]"
        );
        assert_eq!(template(&e, None, at, &t), "200 [-]");
    }

    /// Issue 47's probe: `GET /a"b"c` was logged as `"GET /a"b"c HTTP/1.1"`, and raw UTF-8
    /// (U+2028 too) went in as it came. Each is `\\xHH` now, as NGINX writes it.
    #[test]
    fn targets_are_escaped_as_nginx_escapes_them() {
        let m = Method::GET;
        let u = Uri::try_from(&b"/a\"b\"c/\xe2\x80\xa8\\"[..]).unwrap_or_else(|e| panic!("{e}"));
        let at = UNIX_EPOCH + Duration::from_secs(1_795_424_400);
        let want = "\"GET /a\\x22b\\x22c/\\xE2\\x80\\xA8\\x5C HTTP/1.1\"";
        assert!(
            common(&entry(&m, &u), at).contains(want),
            "{}",
            common(&entry(&m, &u), at)
        );
        assert!(combined(&entry(&m, &u), at).contains(want));
        let t = LogTemplate::parse("\"{request}\" {target}").unwrap_or_else(|e| panic!("{e}"));
        let line = template(&entry(&m, &u), None, at, &t);
        assert_eq!(line, format!("{want} /a\\x22b\\x22c/\\xE2\\x80\\xA8\\x5C"));
        let v: serde_json::Value =
            serde_json::from_str(&json_line(&entry(&m, &u), None, at)).unwrap_or_default();
        assert_eq!(
            v["target"], "/a\"b\"c/\u{2028}\\",
            "JSON escapes as JSON does"
        );
        assert_eq!(escape_quoted("tab\there\u{7f}"), "tab\\x09here\\x7F");
    }

    #[test]
    fn common_and_json_lines() {
        let (m, u) = (Method::GET, Uri::from_static("/hello?x=1"));
        let at = UNIX_EPOCH + Duration::from_secs(1_795_424_400);
        assert_eq!(
            common(&entry(&m, &u), at),
            "192.0.2.7 - - [23/Nov/2026:09:00:00 +0000] \"GET /hello?x=1 HTTP/1.1\" 200 6"
        );
        let v: serde_json::Value =
            serde_json::from_str(&json_line(&entry(&m, &u), None, at)).unwrap_or_default();
        assert_eq!(v["time"], "2026-11-23T09:00:00Z");
        assert_eq!(
            (v["status"].as_u64(), v["route"].as_str()),
            (Some(200), Some("api"))
        );
    }
}
