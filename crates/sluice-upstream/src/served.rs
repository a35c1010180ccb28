//! [`ServedBy`]: who served a request upstream, which the access log writes.

use http::Response;

/// Who served a request upstream, for the access log and traces: a static cluster's endpoint,
/// or the instance whose session carried it and how long the request waited for that session.
#[derive(Debug, Clone, Default)]
pub struct ServedBy {
    /// The static endpoint.
    pub endpoint: Option<std::net::SocketAddr>,
    /// The instance of the session.
    pub instance: Option<std::sync::Arc<sluice_reverse::Instance>>,
    /// The wait in the slice's admission queue (zero when a session was idle).
    pub queued: Option<std::time::Duration>,
    /// When the session was leased, if the request waited for it (the queue span's end; no
    /// clock is read for a request that found a session idle). Read by traces only.
    pub leased_at: Option<std::time::Instant>,
}

impl ServedBy {
    /// Whether an upstream answered (the default: nobody did). Asked by traces only.
    pub fn answered(&self) -> bool {
        self.endpoint.is_some() || self.instance.is_some()
    }
}

/// In a request's extensions: the proxy logs it, so the upstream puts a [`ServedBy`] in the
/// response's extensions (nothing is inserted, and nothing allocated, without it).
#[derive(Debug, Clone, Copy)]
pub struct WantsServedBy;

/// Puts `by` into `res`'s extensions when the request asked for it.
pub(crate) fn note_served_by<B>(wants: bool, res: &mut Response<B>, by: impl FnOnce() -> ServedBy) {
    if wants {
        res.extensions_mut().insert(by());
    }
}
