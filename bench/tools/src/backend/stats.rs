//! [`Counters`]: what the backend has handled, and the `/stats` service that reports it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;

/// Request counters shared by every connection and session of the backend.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    connections: AtomicU64,
    registrations: AtomicU64,
}

/// The counters at one moment, as `GET /stats` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Requests received since start or the last reset.
    pub requests: u64,
    /// Requests being handled now.
    pub in_flight: u64,
    /// The most requests handled at once since start or the last reset.
    pub max_in_flight: u64,
    /// Connections accepted since start (listening; never reset): each is one a proxy opened.
    pub connections: u64,
    /// Sessions registered since start, re-dials included (dialing in; never reset).
    pub registrations: u64,
}

/// One request being handled; dropping it (answered or abandoned) ends it.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Counters);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Counters {
    /// Counts a request that just arrived, until the returned guard drops.
    pub fn start(&self) -> InFlight<'_> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(self)
    }

    /// Counts a connection the listener accepted.
    pub fn accepted(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the SDK's count of registrations since start.
    pub fn set_registrations(&self, n: u64) {
        self.registrations.store(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            requests: self.requests.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            max_in_flight: self.max_in_flight.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            registrations: self.registrations.load(Ordering::Relaxed),
        }
    }

    /// Zeroes `requests` and lowers `max_in_flight` to the requests in flight now.
    pub fn reset(&self) {
        self.requests.store(0, Ordering::Relaxed);
        let now = self.in_flight.load(Ordering::Relaxed);
        self.max_in_flight.store(now, Ordering::Relaxed);
    }

    /// The stats service: `GET /stats` answers the snapshot as JSON, `POST /reset` resets and
    /// answers the snapshot after it; anything else is a 404.
    pub async fn serve<B>(
        self: Arc<Self>,
        req: Request<B>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let snapshot = match (req.method(), req.uri().path()) {
            (&Method::GET, "/stats") => self.snapshot(),
            (&Method::POST, "/reset") => {
                self.reset();
                self.snapshot()
            }
            _ => {
                let mut res = Response::new(Full::new(Bytes::from_static(b"not found\n")));
                *res.status_mut() = StatusCode::NOT_FOUND;
                return Ok(res);
            }
        };
        let json = serde_json::to_vec(&snapshot).unwrap_or_default();
        let mut res = Response::new(Full::new(Bytes::from(json)));
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_keeps_what_is_still_in_flight() {
        let c = Counters::default();
        let a = c.start();
        let b = c.start();
        drop(a);
        c.accepted();
        let snap = |requests, in_flight, max_in_flight| Snapshot {
            requests,
            in_flight,
            max_in_flight,
            connections: 1,
            registrations: 0,
        };
        assert_eq!(c.snapshot(), snap(2, 1, 2));
        c.reset();
        assert_eq!(c.snapshot(), snap(0, 1, 1));
        drop(b);
        assert_eq!(c.snapshot(), snap(0, 0, 1));
    }
}
