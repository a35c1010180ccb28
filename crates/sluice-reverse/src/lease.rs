//! A session's way into its slice and back: [`attach`] starts the protocol's client on a
//! registered stream and adds it as idle; the [`Lease`] a response carries gives it back when
//! the response ends.

use std::sync::Arc;

use tracing::debug;

use crate::instance::SessionPermit;
use crate::pool::SlicePool;
use crate::protocol::Protocol;
use crate::session::Session;
use crate::stream::{ParkedIo, Parking, SessionStream};

/// Starts the client on `io` and adds the session to `pool` as idle: once, or once per stream
/// when it takes `streams` requests at once (HTTP/2). The connection runs in its own task,
/// which holds `permit` until the socket is closed or handed over.
pub(crate) async fn attach<P: Protocol>(
    io: Box<dyn SessionStream>,
    pool: &Arc<SlicePool<P>>,
    mut permit: SessionPermit,
    streams: Option<u32>,
) -> Result<(), P::Error> {
    permit.count_in(pool.alive());
    let parking = Arc::new(Parking::default());
    let io = ParkedIo::new(io, Arc::clone(&parking));
    let (client, conn) = P::handshake(io, streams).await?;
    let shares: Vec<P::Client> = match streams {
        Some(n) => (1..n).map_while(|_| P::share(&client)).collect(),
        None => Vec::new(),
    };
    // Each stream is a unit of the slice's capacity: its counts are in units.
    let units = 1 + shares.len();
    let instance = Arc::clone(&permit.instance);
    let weak = Arc::downgrade(pool);
    let task_parking = Arc::clone(&parking);
    pool.session_attached(units, P::is_shared(&client));
    // With upgrades, a 101 hands the socket to the proxy's bridge; the session (and its
    // permit) ends there, so the service may register a replacement.
    tokio::spawn(async move {
        let ended = conn.await;
        if let Err(error) = &ended {
            debug!(instance = %permit.instance.id(), %error, "session ended with an error");
        }
        // Parked only when the pool handed the session over; a connection that failed is
        // not passed on (its socket closes here).
        let wanted = task_parking.end();
        let parked = task_parking.take().filter(|_| ended.is_ok());
        let Some(pool) = weak.upgrade() else {
            return drop(permit);
        };
        pool.session_detached(units);
        match parked {
            Some(io) => pool.hand_off(io, permit),
            None => {
                if wanted {
                    pool.hand_off_lost();
                } else if permit.lent.is_some() {
                    // Reported GONE: the lender counts it against any recall it is owed.
                    pool.settle_owed(1);
                }
                drop(permit);
            }
        }
        pool.purge_closed();
    });
    for share in shares {
        let session = Session::new(share, Arc::clone(&instance), Arc::clone(&parking));
        pool.checkin(session);
    }
    pool.checkin(Session::new(client, instance, parking));
    Ok(())
}

/// Travels with a response: gives the session back to its slice when the response has been
/// read to the end ([`finish`](Self::finish)). Dropped before that, it drops the session
/// instead, because HTTP/1.1 cannot reuse a connection with an unread response on it; a
/// stream of a shared connection (HTTP/2) goes back all the same, as dropping its exchange
/// reset the stream (`RST_STREAM`) and left the connection as it was.
#[derive(Debug)]
pub struct Lease<P: Protocol> {
    session: Option<Session<P>>,
    pool: Arc<SlicePool<P>>,
}

impl<P: Protocol> Lease<P> {
    /// A lease of `session` (`None`: a session that may not carry another request) from
    /// `pool`.
    pub fn new(session: Option<Session<P>>, pool: Arc<SlicePool<P>>) -> Self {
        Self { session, pool }
    }

    /// The response has ended cleanly: the session may carry another request.
    pub fn finish(&mut self) {
        if let Some(session) = self.session.take() {
            self.pool.checkin(session);
        }
    }

    /// The session it holds, until it is given back.
    pub fn session(&mut self) -> Option<&mut Session<P>> {
        self.session.as_mut()
    }
}

impl<P: Protocol> Drop for Lease<P> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take().filter(Session::is_shared) {
            self.pool.checkin(session);
        }
    }
}
