//! A session: an HTTP/1.1 client connection over a stream a service registered.

use std::sync::Arc;

use hyper::client::conn::http1::SendRequest;

use super::instance::Instance;
use super::stream::Parking;
use crate::body::ProxyBody;

/// One registered connection; the proxy is the HTTP client, the service the server.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) sender: SendRequest<ProxyBody>,
    pub(crate) instance: Arc<Instance>,
    parking: Arc<Parking>,
}

impl Session {
    /// A session of `instance` over `sender`, whose socket `parking` can let go.
    pub(super) fn new(
        sender: SendRequest<ProxyBody>,
        instance: Arc<Instance>,
        parking: Arc<Parking>,
    ) -> Self {
        Self {
            sender,
            instance,
            parking,
        }
    }
}

impl Session {
    /// Whether the session may be leased: connected, and its instance is not draining.
    pub(crate) fn usable(&self) -> bool {
        !self.sender.is_closed() && !self.instance.is_draining()
    }

    /// Which session this is (its connection's identity), for tests.
    #[cfg(test)]
    pub(super) fn id(&self) -> usize {
        Arc::as_ptr(&self.parking) as usize
    }

    /// Lets go of an idle session so that its socket moves to another process: hyper ends the
    /// connection without closing the socket, and the session's task hands it over. False
    /// when the connection had already ended: nothing will be handed over.
    #[must_use = "a session that cannot be handed over is lost to the hand-over"]
    pub(crate) fn hand_over(self) -> bool {
        self.parking.want()
    }
}
