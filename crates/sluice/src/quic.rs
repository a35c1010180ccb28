//! A listener's HTTP/3 endpoint (`[[listener]] http3`), bound and served beside its TCP
//! server when the `http3` feature is built; without it, a configuration that asks for one
//! is refused by `Proxy::bind` with the feature's name.

use sluice_config::Listener;
use sluice_net::sockets::Sockets;
use sluice_server::Server;

use crate::metrics::Metrics;
use crate::router::Unbuilt;

/// The UDP address an endpoint was to be bound to, and why it could not be.
pub(crate) type BindError = (std::net::SocketAddr, std::io::Error);

/// A bound HTTP/3 endpoint.
#[cfg(feature = "http3")]
pub(crate) type Endpoint = sluice_server::http3::H3Server;

/// None can exist in a build without HTTP/3.
#[cfg(not(feature = "http3"))]
#[derive(Debug)]
pub(crate) enum Endpoint {}

/// The listener that asks for HTTP/3 from a build without it, refused by name.
pub(crate) fn unbuilt(config: &sluice_config::Config) -> Option<Unbuilt> {
    let wanted = config.listeners.iter().find(|l| l.http3.is_some())?;
    let part = format!("listener {}: http3", wanted.name);
    (!cfg!(feature = "http3")).then(|| Unbuilt::new(part, "http3"))
}

/// Binds `l`'s HTTP/3 endpoint (its UDP socket: `http3_listen`, or the TCP listener's own
/// address and bound port), or takes the one a predecessor handed over; `server` (the TCP
/// listener, with its certificates) offers it by `Alt-Svc` from then on.
#[cfg(feature = "http3")]
pub(crate) fn bind(
    l: &Listener,
    server: Server,
    sockets: &mut Sockets,
    metrics: &Metrics,
) -> Result<(Server, Option<Endpoint>), BindError> {
    use std::sync::Arc;
    let (Some(h3), Some(certs)) = (&l.http3, server.certificates()) else {
        return Ok((server, None));
    };
    let tcp = server.local_addr().unwrap_or(l.addr);
    let addr = h3.addr.unwrap_or(tcp);
    let socket = sockets.udp(&sluice_net::sockets::quic_key(&l.name), addr);
    let options = sluice_server::http3::H3Options {
        retry: h3.retry,
        max_streams: h3.max_streams,
    };
    let endpoint = socket.and_then(|socket| {
        Endpoint::new(&l.name, socket, Arc::clone(certs), l.http.clone(), options)
    });
    let endpoint = endpoint.map_err(|e| (addr, e))?;
    let endpoint = endpoint.with_counters(metrics.quic_counters(&l.name));
    let port = endpoint.local_addr().map_or(addr.port(), |a| a.port());
    Ok((server.with_alt_svc(port), Some(endpoint)))
}

#[cfg(not(feature = "http3"))]
pub(crate) fn bind(
    _: &Listener,
    server: Server,
    _: &mut Sockets,
    _: &Metrics,
) -> Result<(Server, Option<Endpoint>), BindError> {
    Ok((server, None))
}

/// Serves `endpoint` in `group`, with the same service and grace as the TCP listeners;
/// `upgraded` turns true when a hot restart's successor has its socket.
#[cfg(feature = "http3")]
pub(crate) fn add<S: sluice_server::H3Service>(
    group: &mut sluice_server::Group,
    endpoint: Endpoint,
    (service, grace): (S, std::time::Duration),
    upgraded: tokio::sync::watch::Receiver<bool>,
) {
    group.add_http3(endpoint.with_handover(upgraded), service, grace);
}

#[cfg(not(feature = "http3"))]
pub(crate) fn add<S>(
    _: &mut sluice_server::Group,
    endpoint: Endpoint,
    _: (S, std::time::Duration),
    _: tokio::sync::watch::Receiver<bool>,
) {
    match endpoint {}
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A listener that asks for HTTP/3 is refused by name by a build without it (the lean
    /// build's unit tests run this), and taken by one with it.
    #[test]
    fn a_build_without_http3_refuses_a_listener_that_asks_for_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs");
        let text = "[[listener]]\nname = \"q\"\nlisten = \"127.0.0.1:0\"\n\
                    tls = { cert = \"tls/cert.pem\", key = \"tls/key.pem\" }\nhttp3 = true\n\
                    [[route]]\ndirect_response = { status = 200 }\n";
        let config = sluice_config::parse_str(text, "t.toml", &dir).unwrap();
        let refused = unbuilt(&config).map(|e| e.to_string());
        if cfg!(feature = "http3") {
            assert_eq!(refused, None);
        } else {
            let said = refused.unwrap();
            assert!(
                said.starts_with("listener q: http3 needs the `http3` feature"),
                "{said}"
            );
        }
    }
}
