//! HTTP/1.1 protocol switches (WebSocket and the like) carried through the proxy.
//!
//! An upgrade request keeps `Upgrade` and `Connection: upgrade` on its way upstream. When the
//! upstream answers 101, hyper hands over both sockets (the client's and the upstream's
//! `OnUpgrade`) and a bridge copies bytes between them until either side closes; the client's
//! connection task runs it ([`UpgradeCarrier`]), so a shutdown drains it within the grace
//! period and closes it when the grace ends. The upstream
//! connection or reverse session that carried the switch is consumed: the static pool and the
//! reverse slice never take it back after a 101.

use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sluice_core::body::RequestBody;
use tracing::{debug, warn, Instrument};

use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::headers::{strip_hop_by_hop, strip_hop_by_hop_keep_upgrade, wants_upgrade};
use sluice_server::UpgradeCarrier;
use sluice_upstream::reverse::UpgradedSession;

/// The client's side of a protocol switch, and the connection task that will carry it.
pub(super) struct ClientSide {
    on: OnUpgrade,
    carrier: Option<UpgradeCarrier>,
}

/// The client's side of a protocol switch, taken before the request is forwarded; `None`
/// when the request does not ask for one.
pub(super) fn requested(req: &mut Request<RequestBody>) -> Option<ClientSide> {
    if !wants_upgrade(req.version(), req.headers()) {
        return None;
    }
    let carrier = req.extensions_mut().remove::<UpgradeCarrier>();
    let on = hyper::upgrade::on(req);
    Some(ClientSide { on, carrier })
}

/// Prepares the upstream's response for the client. A 101 to a requested switch keeps its
/// `Upgrade` header and starts the bridge; any other answer is an ordinary response (the
/// client's connection stays HTTP). A 101 nobody asked for becomes a 502.
pub(super) fn respond(
    mut res: Response<ProxyBody>,
    client_side: Option<ClientSide>,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let switched = res.status() == StatusCode::SWITCHING_PROTOCOLS;
    match client_side {
        Some(client_side) if switched => {
            let upstream_side = hyper::upgrade::on(&mut res);
            // A reverse session's: keeps it listed as upgraded while the bridge runs.
            let held = res.extensions_mut().remove::<UpgradedSession>();
            strip_hop_by_hop_keep_upgrade(res.headers_mut());
            let span = tracing::debug_span!("upgrade", client.addr = %peer);
            let carrier = client_side.carrier;
            let bridged = async move {
                bridge(client_side.on, upstream_side).await;
                drop(held);
            };
            UpgradeCarrier::carry(carrier.as_ref(), bridged.instrument(span));
            res
        }
        None if switched => unasked_switch(peer),
        _ => {
            strip_hop_by_hop(res.headers_mut());
            res
        }
    }
}

/// Waits for both sides to finish switching, then copies bytes both ways until either closes.
async fn bridge(client_side: OnUpgrade, upstream_side: OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
        Ok(pair) => pair,
        Err(error) => {
            debug!(%error, "protocol switch failed before the bridge started");
            return;
        }
    };
    let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((to_upstream, to_client)) => {
            debug!(
                bytes.to_upstream = to_upstream,
                bytes.to_client = to_client,
                "upgraded connection closed"
            );
        }
        Err(error) => debug!(%error, "upgraded connection ended with an error"),
    }
}

/// hyper gives up an upstream connection on any 101, and a client that did not ask to switch
/// cannot follow one: the exchange has failed.
fn unasked_switch(peer: SocketAddr) -> Response<ProxyBody> {
    warn!(client.addr = %peer, "upstream switched protocols without being asked");
    let unasked = ProxyError::UpstreamInvalid(sluice_wire::h1::UNASKED_SWITCH);
    unasked.response(false)
}
