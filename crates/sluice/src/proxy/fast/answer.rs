//! What the fast path writes itself: error responses and routes' fixed answers (the same
//! status, fields and body as the hyper path's), chunk framing, and the `Date` value,
//! formatted once a second per thread.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, StatusCode};

use sluice_core::error::ProxyError;

/// The response the client gets for `e` ([`ProxyError::answer`], as the hyper path renders
/// it), and its body's length; see [`render`].
pub(super) fn error(
    e: &ProxyError,
    close: bool,
    head_request: bool,
    id: Option<(&HeaderName, &HeaderValue)>,
    listener: &[(HeaderName, HeaderValue)],
) -> (Vec<u8>, usize) {
    let answer = e.answer(id);
    let fields = answer.fields.iter().map(|(n, v)| (n, v));
    let fields = with_listeners(fields, listener);
    render(
        answer.status,
        fields,
        answer.body.as_bytes(),
        close,
        head_request,
    )
}

/// `fields`, then the listener's own (`Alt-Svc`) in place of any of the same name, as hyper's
/// server on that listener sets them last.
pub(super) fn with_listeners<'f>(
    fields: impl IntoIterator<Item = (&'f HeaderName, &'f HeaderValue)>,
    listener: &'f [(HeaderName, HeaderValue)],
) -> impl Iterator<Item = (&'f HeaderName, &'f HeaderValue)> {
    let theirs = move |name: &HeaderName| listener.iter().any(|(n, _)| n == name);
    let fields = fields.into_iter().filter(move |(n, _)| !theirs(n));
    fields.chain(listener.iter().map(|(n, v)| (n, v)))
}

/// A response Sluice answers itself (an error, a route's `direct_response`) as hyper's server
/// writes it: the status line (`<none>` for a status without a reason phrase), `fields` in
/// order, `Content-Length` (none for an empty answer to `HEAD`) and `Date` (unless `fields` has
/// one), then the body; `close` adds `Connection: close`, and the answer to a `HEAD` request has
/// no body (its length stays). Returns the bytes and the body's length.
pub(super) fn render<'f>(
    status: StatusCode,
    fields: impl IntoIterator<Item = (&'f HeaderName, &'f HeaderValue)>,
    body: &[u8],
    close: bool,
    head_request: bool,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(160 + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or("<none>")
    );
    let mut dated = false;
    for (name, value) in fields {
        dated |= name == http::header::DATE;
        for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
            out.extend_from_slice(part);
        }
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    // hyper knows an empty body has ended, and names no length for one to `HEAD`.
    if !(head_request && body.is_empty()) {
        let _ = write!(out, "content-length: {}\r\n", body.len());
    }
    if !dated {
        let _ = write!(out, "date: {}\r\n", date());
    }
    out.extend_from_slice(b"\r\n");
    if !head_request {
        out.extend_from_slice(body);
    }
    (out, body.len())
}

/// Appends `data` as one chunk.
pub(super) fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The current date in HTTP form (RFC 9110 §5.6.7).
pub(super) fn date() -> Arc<str> {
    date_at(Instant::now())
}

/// The date in HTTP form at `now` (a clock reading the caller already has), formatted at most
/// once a second per thread and read off the wall clock only then; shared, so a response costs
/// a reference count, not a string.
pub(super) fn date_at(now: Instant) -> Arc<str> {
    thread_local! {
        /// The date, and until when it holds.
        static CACHED: RefCell<(Option<Instant>, Arc<str>)> = RefCell::new((None, Arc::from("")));
    }
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0.is_none_or(|until| now >= until) {
            let wall = SystemTime::now();
            let into = wall
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let left = Duration::from_nanos(1_000_000_000 - u64::from(into));
            *cached = (Some(now + left), Arc::from(httpdate::fmt_http_date(wall)));
        }
        Arc::clone(&cached.1)
    })
}
