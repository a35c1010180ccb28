//! [`ServedBy`]: who served a request upstream, which the access log writes.

use http::Response;

/// Who served a request upstream, for the access log: a static cluster's endpoint, or the
/// instance whose session carried it and how long the request waited for that session.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServedBy {
    /// The static endpoint.
    pub endpoint: Option<std::net::SocketAddr>,
    /// The instance of the session.
    pub instance: Option<std::sync::Arc<sluice_reverse::Instance>>,
    /// The wait in the slice's admission queue (zero when a session was idle).
    pub queued: Option<std::time::Duration>,
}

/// In a request's extensions: the proxy logs it, so the upstream puts a [`ServedBy`] in the
/// response's extensions (nothing is inserted, and nothing allocated, without it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WantsServedBy;

/// Puts `by` into `res`'s extensions when the request asked for it.
pub(crate) fn note_served_by<B>(wants: bool, res: &mut Response<B>, by: impl FnOnce() -> ServedBy) {
    if wants {
        res.extensions_mut().insert(by());
    }
}
