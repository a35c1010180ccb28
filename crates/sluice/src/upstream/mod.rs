//! Upstream clusters: where routed requests go.
//!
//! [`Upstream`] is an enum rather than a trait object so that the per-request path is a static
//! call. [`static_cluster`] reaches listening endpoints; [`reverse`] leases sessions that
//! services registered by dialing in.

pub(crate) mod connect;
pub(crate) mod dns;
pub(crate) mod exchange;
mod host;
pub(crate) mod leased;
pub(crate) mod reverse;
pub(crate) mod served;
pub(crate) mod static_cluster;
pub(crate) mod tls;

use http::{Request, Response};

pub(crate) use exchange::Deadline;
pub(crate) use host::default_host;
pub use reverse::{ReverseCluster, ReverseSlice};
pub(crate) use served::{ServedBy, WantsServedBy};
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
pub(crate) use static_cluster::StaticMetrics;
pub use static_cluster::{StaticCluster, StaticOptions};

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
