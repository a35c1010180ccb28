//! [`ClientAddr`]: the address of the client a request came from, as the proxy saw it.

use std::net::SocketAddr;

use http::HeaderMap;
use sluice_session::{parse_client_addr, HEADER_CLIENT_ADDR};

/// The client's address, in every request's extensions: the TCP peer the proxy saw, from the
/// `Sluice-Client-Addr` header the proxy sets on each request (and never passes through from a
/// client). A request without one valid field of it carries the session's peer (the acceptor's
/// address) instead, or, over a UNIX socket, no `ClientAddr` at all.
///
/// ```
/// # use sluice_sdk::ClientAddr;
/// fn client(req: &http::Request<hyper::body::Incoming>) -> Option<std::net::SocketAddr> {
///     req.extensions().get::<ClientAddr>().map(|c| c.0)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr);

impl ClientAddr {
    /// The address `headers` vouch for, else `peer`: exactly one `Sluice-Client-Addr` field
    /// that parses whole; a malformed or repeated one is ignored, never trusted in part.
    pub fn from_headers(headers: &HeaderMap, peer: Option<SocketAddr>) -> Option<Self> {
        let mut values = headers.get_all(HEADER_CLIENT_ADDR).iter();
        let claimed = match (values.next(), values.next()) {
            (Some(one), None) => parse_client_addr(one.as_bytes()),
            _ => None,
        };
        claimed.or(peer).map(Self)
    }
}

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&sluice_session::client_addr_value(self.0))
    }
}
