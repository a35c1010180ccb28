//! Optional active HTTP health checks of static endpoints.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{header, Request};
use tracing::info;

use super::{Endpoint, HealthCheck, Inner};
use crate::body::ProxyBody;
use crate::upstream::connect::connect_http1;
use crate::upstream::tls::UpstreamTls;

/// Starts checking `endpoint` if the cluster has a health check. The task ends when the
/// endpoint is removed or the cluster dropped.
pub(super) fn spawn(inner: &Arc<Inner>, endpoint: Arc<Endpoint>) {
    let Some(check) = inner.opts.health_check.clone() else {
        return;
    };
    let connect_timeout = inner.opts.connect_timeout;
    let tls = inner.tls.clone();
    let cluster = Arc::downgrade(inner);
    tokio::spawn(check_loop(cluster, endpoint, check, (connect_timeout, tls)));
}

async fn check_loop(
    cluster: Weak<Inner>,
    endpoint: Arc<Endpoint>,
    check: HealthCheck,
    connect: (Duration, Option<UpstreamTls>),
) {
    let (mut passes, mut fails) = (0u32, 0u32);
    loop {
        if endpoint.is_removed() || cluster.strong_count() == 0 {
            return;
        }
        let ok = probe(endpoint.addr(), &check, &connect).await;
        (passes, fails) = if ok { (passes + 1, 0) } else { (0, fails + 1) };
        if ok && passes >= check.healthy_threshold && !endpoint.is_healthy() {
            info!(upstream.addr = %endpoint.addr(), "health check passed; endpoint back in rotation");
            endpoint.set_healthy(true);
        } else if !ok && fails >= check.unhealthy_threshold && endpoint.is_healthy() {
            info!(upstream.addr = %endpoint.addr(), "health check failed; endpoint out of rotation");
            endpoint.set_healthy(false);
        }
        tokio::time::sleep(check.interval).await;
    }
}

/// One check: `GET <path>` on a fresh connection (TLS for an HTTPS cluster); a 2xx or 3xx
/// within the timeout passes.
async fn probe(
    addr: SocketAddr,
    check: &HealthCheck,
    (connect_timeout, tls): &(Duration, Option<UpstreamTls>),
) -> bool {
    let attempt = async {
        let mut sender = connect_http1(addr, (*connect_timeout).min(check.timeout), tls.as_ref())
            .await
            .ok()?;
        let host = tls.as_ref().and_then(UpstreamTls::sni);
        let req = Request::get(check.path.as_str())
            .header(header::HOST, host.unwrap_or_else(|| addr.to_string()))
            .header(header::USER_AGENT, "sluice-health-check")
            .header(header::CONNECTION, "close")
            .body(ProxyBody::empty())
            .ok()?;
        let res = sender.send_request(req).await.ok()?;
        Some(res.status().is_success() || res.status().is_redirection())
    };
    matches!(
        tokio::time::timeout(check.timeout, attempt).await,
        Ok(Some(true))
    )
}
