//! A session's way into its slice and back: [`attach`] starts the HTTP/1.1 client on a
//! registered stream and adds it as idle; the [`Lease`] a response body carries gives it back
//! when the response ends.

use std::sync::Arc;

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tracing::debug;

use super::instance::SessionPermit;
use super::pool::SlicePool;
use super::session::Session;
use super::stream::{ParkedIo, Parking, SessionStream};
use crate::body::Release;
use crate::http::IO_BUFFER_BYTES;

/// Starts the HTTP/1.1 client on `io` and adds the session to `pool` as idle. The connection
/// runs in its own task, which holds `permit` until the socket is closed or handed over.
pub(crate) async fn attach(
    io: Box<dyn SessionStream>,
    pool: &Arc<SlicePool>,
    permit: SessionPermit,
) -> Result<(), hyper::Error> {
    let parking = Arc::new(Parking::default());
    let io = ParkedIo::new(io, Arc::clone(&parking));
    let (sender, conn) = http1::Builder::new()
        .max_buf_size(IO_BUFFER_BYTES)
        .handshake(TokioIo::new(io))
        .await?;
    let instance = Arc::clone(&permit.instance);
    let weak = Arc::downgrade(pool);
    let task_parking = Arc::clone(&parking);
    pool.session_attached();
    // With upgrades, a 101 hands the socket to the proxy's bridge; the session (and its
    // permit) ends there, so the service may register a replacement.
    tokio::spawn(async move {
        let ended = conn.with_upgrades().await;
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
        pool.session_detached();
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
    pool.checkin(Session::new(sender, instance, parking));
    Ok(())
}

/// Travels with a response body: gives the session back to its slice when the body has been
/// read to the end. Dropped before the end, it drops the session instead, because HTTP/1.1
/// cannot reuse a connection with an unread response on it.
#[derive(Debug)]
pub struct Lease {
    session: Option<Session>,
    pool: Arc<SlicePool>,
}

impl Lease {
    pub(crate) fn new(session: Option<Session>, pool: Arc<SlicePool>) -> Self {
        Self { session, pool }
    }
}

impl Release for Lease {
    /// The response has ended cleanly: the session may carry another request.
    fn finish(&mut self) {
        if let Some(session) = self.session.take() {
            self.pool.checkin(session);
        }
    }
}
