//! Optional active HTTP health checks of static endpoints.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use http::{header, Request};
use sluice_net::log_limit::REPORT_INTERVAL;
use tracing::{info, warn};

use super::{Endpoint, HealthCheck, Inner};
use crate::connect::{connect as connect_any, Connected};
use crate::tls::UpstreamTls;
use sluice_config::{H2Options, UpstreamProtocol};
use sluice_core::body::ProxyBody;
use sluice_core::grpc;

/// Starts checking `endpoint` if the cluster has a health check. The task ends when the
/// endpoint is removed or the cluster dropped.
pub(super) fn spawn(inner: &Arc<Inner>, endpoint: Arc<Endpoint>) {
    let Some(check) = inner.opts.health_check.clone() else {
        return;
    };
    // gRPC's health check on a plaintext `auto` cluster goes as its gRPC calls do: h2c.
    let protocol = match (inner.opts.protocol, &inner.tls, &check.grpc_service) {
        (UpstreamProtocol::Auto, None, Some(_)) => UpstreamProtocol::H2c,
        (protocol, _, _) => protocol,
    };
    let connect = Connect {
        timeout: inner.opts.connect_timeout,
        tls: inner.tls.clone(),
        protocol,
        h2: inner.opts.h2.clone(),
    };
    let cluster = Arc::downgrade(inner);
    tokio::spawn(check_loop(cluster, endpoint, check, connect));
}

/// How a check connects: as the cluster's requests do.
struct Connect {
    timeout: Duration,
    tls: Option<UpstreamTls>,
    protocol: UpstreamProtocol,
    h2: H2Options,
}

async fn check_loop(
    cluster: Weak<Inner>,
    endpoint: Arc<Endpoint>,
    check: HealthCheck,
    connect: Connect,
) {
    let (mut passes, mut fails) = (0u32, 0u32);
    let mut log = Transitions::default();
    loop {
        let Some(name) = cluster.upgrade().map(|c| c.name.clone()) else {
            return;
        };
        if endpoint.is_removed() {
            return;
        }
        match probe(endpoint.addr(), &check, &connect).await {
            Ok(()) => (passes, fails) = (passes + 1, 0),
            Err(why) => {
                (passes, fails) = (0, fails + 1);
                log.last_failure = why;
            }
        }
        let now = Instant::now();
        // A pending endpoint (just given by DNS) joins on its first pass.
        let joins = (passes > 0 && endpoint.take_pending()) || passes >= check.healthy_threshold;
        if joins && !endpoint.is_healthy() {
            endpoint.set_healthy(true);
            log.changed(true, now);
        } else if fails >= check.unhealthy_threshold && endpoint.is_healthy() {
            endpoint.set_healthy(false);
            log.changed(false, now);
        }
        log.report(&name, &endpoint, now);
        tokio::time::sleep(check.interval).await;
    }
}

/// How an endpoint's health transitions reach the log: the first at once, then at most one
/// line per [`REPORT_INTERVAL`] with how many happened since, so a flapping endpoint does not
/// flood it; the state the endpoint settles in is always written. Going out of rotation is a
/// warning with the check's failure; coming back, a line with how long it was out.
#[derive(Debug, Default)]
struct Transitions {
    unlogged: u64,
    last_line: Option<Instant>,
    /// Since when it has been out of rotation (the first time since the last "back" line).
    out_since: Option<Instant>,
    /// What the last failed check saw.
    last_failure: String,
}

impl Transitions {
    fn changed(&mut self, healthy: bool, now: Instant) {
        self.unlogged += 1;
        if !healthy {
            self.out_since.get_or_insert(now);
        }
    }

    /// `Some(transitions since the last line)` when a line is due now.
    fn due(&mut self, now: Instant) -> Option<u64> {
        let quiet = self
            .last_line
            .is_none_or(|last| now - last >= REPORT_INTERVAL);
        if self.unlogged == 0 || !quiet {
            return None;
        }
        self.last_line = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    fn report(&mut self, cluster: &str, endpoint: &Endpoint, now: Instant) {
        let Some(transitions) = self.due(now) else {
            return;
        };
        let addr = endpoint.addr();
        match endpoint.is_healthy() {
            true => info!(
                cluster = %cluster, upstream.addr = %addr, transitions,
                out_for = ?self.out_since.take().map(|t| now - t),
                "health check passed; endpoint back in rotation"
            ),
            false => warn!(
                cluster = %cluster, upstream.addr = %addr, transitions, reason = %self.last_failure,
                "health check failed; endpoint out of rotation"
            ),
        }
    }
}

/// One check: `GET <path>` on a fresh connection (TLS for an HTTPS cluster, HTTP/2 for one
/// that speaks it); a 2xx or 3xx within the timeout passes. A failure says what the check saw.
async fn probe(addr: SocketAddr, check: &HealthCheck, connect: &Connect) -> Result<(), String> {
    let attempt = async {
        let timeout = connect.timeout.min(check.timeout);
        let tls = connect.tls.as_ref();
        let protocol = (connect.protocol, &connect.h2);
        let connected = connect_any(addr, timeout, tls, protocol).await;
        let host = tls
            .and_then(UpstreamTls::sni)
            .unwrap_or_else(|| addr.to_string());
        let req =
            Request::get(check.path.as_str()).header(header::USER_AGENT, "sluice-health-check");
        let res = match connected.map_err(|e| format!("connect: {e}"))? {
            Connected::H1(mut sender) => {
                let req = req
                    .header(header::HOST, host)
                    .header(header::CONNECTION, "close");
                let req = req
                    .body(ProxyBody::empty())
                    .map_err(|e| format!("request: {e}"))?;
                sender.send_request(req).await
            }
            Connected::H2(mut sender) => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                if let Some(service) = &check.grpc_service {
                    return grpc_check(&mut sender, &format!("{scheme}://{host}"), service).await;
                }
                let uri = format!("{scheme}://{host}{}", check.path);
                let req = req.uri(uri).version(http::Version::HTTP_2);
                let req = req
                    .body(ProxyBody::empty())
                    .map_err(|e| format!("request: {e}"))?;
                sender.send_request(req).await
            }
        };
        let res = res.map_err(|e| format!("exchange: {e}"))?;
        match res.status().is_success() || res.status().is_redirection() {
            true => Ok(()),
            false => Err(format!("status {}", res.status().as_u16())),
        }
    };
    match tokio::time::timeout(check.timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {:?}", check.timeout)),
    }
}

/// The gRPC health protocol's check of `service` at `origin`: passes when the answer says
/// SERVING with `grpc-status: 0`.
async fn grpc_check(
    sender: &mut hyper::client::conn::http2::SendRequest<ProxyBody>,
    origin: &str,
    service: &str,
) -> Result<(), String> {
    use http_body_util::BodyExt;

    let req = Request::post(format!("{origin}{}", sluice_wire::grpc::HEALTH_CHECK))
        .version(http::Version::HTTP_2)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .header(header::USER_AGENT, "sluice-health-check")
        .body(ProxyBody::full(sluice_wire::grpc::health_request(service)))
        .map_err(|e| format!("request: {e}"))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("exchange: {e}"))?;
    if res.status() != http::StatusCode::OK {
        return Err(format!("status {}", res.status().as_u16()));
    }
    let head_status = res.headers().get(&grpc::GRPC_STATUS).cloned();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    let trailers = body
        .trailers()
        .and_then(|t| t.get(&grpc::GRPC_STATUS))
        .cloned();
    match trailers.or(head_status) {
        Some(status) if status == "0" => sluice_wire::grpc::serving(&body.to_bytes()),
        Some(status) => Err(format!("grpc-status {}", status.to_str().unwrap_or("?"))),
        None => Err("no grpc-status".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flapping_endpoint_is_reported_once_per_interval_and_its_last_state_always() {
        let start = Instant::now();
        let mut log = Transitions::default();
        assert_eq!(log.due(start), None, "nothing happened");
        log.changed(false, start);
        assert_eq!(log.due(start), Some(1), "the first transition at once");
        for i in 1..=5 {
            let now = start + Duration::from_millis(100 * i);
            log.changed(i % 2 == 0, now);
            assert_eq!(log.due(now), None, "within the interval");
        }
        // The checks go on after the flapping stopped: the state it settled in is reported.
        assert_eq!(log.due(start + REPORT_INTERVAL), Some(5));
        assert_eq!(
            log.due(start + REPORT_INTERVAL * 3),
            None,
            "nothing new since"
        );
        assert_eq!(log.out_since, Some(start), "out since the first failure");
    }
}
