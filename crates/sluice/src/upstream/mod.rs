//! Upstream clusters: where routed requests go.
//!
//! [`Upstream`] is an enum rather than a trait object so that the per-request path is a static
//! call. [`static_cluster`] reaches listening endpoints; [`reverse`] leases sessions that
//! services registered by dialing in.

pub mod connect;
pub(crate) mod exchange;
pub(crate) mod leased;
pub mod reverse;
pub mod static_cluster;
pub mod tls;

use http::{Request, Response};

use crate::body::ProxyBody;
use crate::error::ProxyError;
pub use exchange::is_idempotent;
pub use reverse::{ReverseCluster, ReverseSlice};
pub use static_cluster::{StaticCluster, StaticMetrics, StaticOptions};

/// A cluster a route can forward to. Cloning is cheap (a reference count).
#[derive(Debug, Clone)]
pub enum Upstream {
    /// Listening endpoints over pooled keep-alive connections.
    Static(StaticCluster),
    /// One slice of a cluster whose services dial in and register sessions.
    Reverse(ReverseSlice),
}

impl Upstream {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Static(c) => c.name(),
            Self::Reverse(s) => s.name(),
        }
    }

    /// Starts the cluster's background work (health checks, idle reaping). Idempotent.
    pub fn start(&self) {
        match self {
            Self::Static(c) => c.start(),
            // Sessions need no background work: the services keep them registered.
            Self::Reverse(_) => {}
        }
    }

    /// Sends one request (already in origin form with forwarding headers) and returns the
    /// upstream's response head with its streaming body.
    ///
    /// A request without `Host` (HTTP/1.0) gets one, since every HTTP/1.1 request must carry
    /// it: the endpoint's address for a static cluster, the cluster's name for a reverse one
    /// (as NGINX's `$proxy_host` is the upstream's name).
    pub async fn send(
        &self,
        mut req: Request<ProxyBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        match self {
            Self::Static(c) => c.send(req).await,
            Self::Reverse(s) => {
                default_host(&mut req, || s.name().to_owned());
                reverse::send(s, req).await
            }
        }
    }
}

impl From<ReverseSlice> for Upstream {
    fn from(s: ReverseSlice) -> Self {
        Self::Reverse(s)
    }
}

impl From<StaticCluster> for Upstream {
    fn from(c: StaticCluster) -> Self {
        Self::Static(c)
    }
}

/// Who served a request upstream, for the access log: a static cluster's endpoint, or the
/// instance whose session carried it and how long the request waited for that session.
#[derive(Debug, Clone, Default)]
pub struct ServedBy {
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
pub struct WantsServedBy;

/// Puts `by` into `res`'s extensions when the request asked for it.
pub(crate) fn note_served_by<B>(wants: bool, res: &mut Response<B>, by: impl FnOnce() -> ServedBy) {
    if wants {
        res.extensions_mut().insert(by());
    }
}

/// Sets `Host` to `authority()` when the request has none.
pub(crate) fn default_host<B>(req: &mut Request<B>, authority: impl FnOnce() -> String) {
    if req.headers().contains_key(http::header::HOST) {
        return;
    }
    if let Ok(value) = http::HeaderValue::try_from(authority()) {
        req.headers_mut().insert(http::header::HOST, value);
    }
}
