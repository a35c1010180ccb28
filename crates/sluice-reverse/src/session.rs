//! A session: a protocol client over a stream a service registered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};

use crate::instance::Instance;
use crate::protocol::Protocol;
use crate::stream::Parking;

/// One registered connection; the proxy is the client, the service the server.
pub struct Session<P: Protocol> {
    client: P::Client,
    instance: Arc<Instance>,
    parking: Arc<Parking>,
    /// While a request holds it: the in-flight count of the slice that lent it, given back at
    /// checkin or drop. Counting leases (not sessions less idle ones) keeps sessions being
    /// added or closing out of `DEMAND`.
    lent: Option<Arc<AtomicUsize>>,
}

impl<P: Protocol> std::fmt::Debug for Session<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("client", &self.client)
            .field("instance", &self.instance.id())
            .finish_non_exhaustive()
    }
}

impl<P: Protocol> Drop for Session<P> {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl<P: Protocol> Session<P> {
    /// A session of `instance` over `client`, whose socket `parking` can let go.
    pub(crate) fn new(client: P::Client, instance: Arc<Instance>, parking: Arc<Parking>) -> Self {
        Self {
            client,
            instance,
            parking,
            lent: None,
        }
    }

    /// A request has it: counted in `in_flight` until it comes back or is dropped.
    pub(crate) fn lend(&mut self, in_flight: &Arc<AtomicUsize>) {
        debug_assert!(
            self.lent.is_none(),
            "a session lent twice would count for good"
        );
        in_flight.fetch_add(1, Ordering::AcqRel);
        self.lent = Some(Arc::clone(in_flight));
    }

    /// It came back (or is dropped): no longer in flight.
    pub(crate) fn give_back(&mut self) {
        if let Some(in_flight) = self.lent.take() {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The client to send a request with.
    pub fn client(&mut self) -> &mut P::Client {
        &mut self.client
    }

    /// The instance that registered it.
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        P::is_closed(&self.client)
    }

    /// Whether it is one stream of a shared connection ([`Protocol::is_shared`]).
    pub fn is_shared(&self) -> bool {
        P::is_shared(&self.client)
    }

    /// Ends its connection once every lease on it is back (see [`Protocol::end`]); false when
    /// the connection was ending already.
    pub fn end(&self) -> bool {
        P::end(&self.client)
    }

    /// Whether the session may be leased: connected, and its instance is not draining.
    pub(crate) fn usable(&self) -> bool {
        !self.is_closed() && !self.instance.is_draining()
    }

    /// Waits until the client can take a request; false when the connection ended.
    pub(crate) async fn ready(&mut self) -> bool {
        std::future::poll_fn(|cx| P::poll_ready(&mut self.client, cx)).await
    }

    /// Whether the client can take a request now (`Pending`: not yet; [`ready`](Self::ready)
    /// waits). Polled with a waker that nobody waits on.
    pub(crate) fn ready_now(&mut self) -> std::task::Poll<bool> {
        P::poll_ready(&mut self.client, &mut Context::from_waker(Waker::noop()))
    }

    /// Which session this is (its connection's identity), for tests.
    #[cfg(test)]
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.parking) as usize
    }

    /// Lets go of an idle session so that its socket moves to another process: the client
    /// ends the connection without closing the socket, and the session's task hands it over.
    /// False when the connection had already ended: nothing will be handed over.
    /// A stream of a shared connection never moves: it is dropped, and the connection ends
    /// once its other streams are dropped too (the service then dials again).
    #[must_use = "a session that cannot be handed over is lost to the hand-over"]
    pub(crate) fn hand_over(self) -> bool {
        if self.is_shared() {
            return false;
        }
        self.parking.want()
    }
}
