//! The simulated services of `sluice demo`: each instance answers after [`WORK`] and counts
//! the requests it is working on, so the demo (and its `--load` table) can show that in-flight
//! work never exceeds the sessions it declared.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{header, Response};

/// Simulated work per request.
pub(crate) const WORK: Duration = Duration::from_millis(20);

/// One demo service instance and what it counts.
#[derive(Debug)]
pub(crate) struct Instance {
    /// The instance id, also the name it answers with.
    pub(crate) name: &'static str,
    /// The sessions it keeps registered: its declared concurrency.
    pub(crate) sessions: usize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: AtomicU64,
}

impl Instance {
    pub(crate) fn new(name: &'static str, sessions: usize) -> Arc<Self> {
        Arc::new(Self {
            name,
            sessions,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
        })
    }

    /// The most requests it worked on at once since the last call; resets the count.
    pub(crate) fn take_max_in_flight(&self) -> usize {
        let current = self.in_flight.load(Ordering::SeqCst);
        self.max_in_flight.swap(current, Ordering::SeqCst)
    }

    /// Requests answered so far.
    pub(crate) fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Simulates the work and says who did it and how busy it was.
    pub(crate) async fn handle(self: Arc<Self>) -> Response<String> {
        let _busy = Busy::enter(&self);
        let now = self.in_flight.load(Ordering::SeqCst);
        tokio::time::sleep(WORK).await;
        self.served.fetch_add(1, Ordering::Relaxed);
        let body = format!(
            "hello from {} (in flight {now}/{})\n",
            self.name, self.sessions
        );
        let mut response = Response::new(body);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
        response
    }
}

/// Counts one request in flight for as long as it lives, even if the request is cancelled.
struct Busy<'a>(&'a Instance);

impl<'a> Busy<'a> {
    fn enter(instance: &'a Instance) -> Self {
        let now = instance.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        instance.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(instance)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
