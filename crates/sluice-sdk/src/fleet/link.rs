//! One node's control link (`protocol/README.md`, "The control link"): dial
//! `GET /.sluice/v1/control` (saying `Sluice-Split: service`), say `CAPACITY`, read
//! `DEMAND`, `DRAINING` and `FLOOR`, write what the plan asks (`RETIRE`, `CAPACITY`). A
//! link that ends, or is silent for [`SILENCE`], is dialed again at once and then with
//! backoff; an old acceptor's `400` is tried again at the backoff's maximum. A redial
//! refused (`ECONNREFUSED`) takes the node down at once; other failures leave it
//! `node_grace` ([`Nodes`](super::Nodes)).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use sluice_session::control::{LineReader, NodeLine, ReadLineError, ServiceLine, SILENCE};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tracing::Instrument;

use super::Fleet;
use crate::dial::{self, Control, Io};

/// Why a link that was up ended.
#[derive(Debug, thiserror::Error)]
enum LinkEnd {
    #[error("{0}")]
    Read(#[from] ReadLineError),
    #[error("silent for {SILENCE:?}")]
    Silent,
    #[error("write failed: {0}")]
    Write(#[from] std::io::Error),
    #[error("the node left")]
    Left,
}

/// Keeps the link to `addr` until the task is aborted (the node left, or shutdown).
pub(crate) async fn run(fleet: Arc<Fleet>, addr: SocketAddr) {
    let span = tracing::debug_span!("control", node = %addr);
    keep(fleet, addr).instrument(span).await;
}

async fn keep(fleet: Arc<Fleet>, addr: SocketAddr) {
    let report = fleet.report(addr);
    let backoff = fleet.options().backoff;
    let mut failures = 0u32;
    loop {
        let epoch = report.epoch();
        let capacity = fleet.with(|n, _| n.capacity());
        let pause = match dial::control(fleet.options(), addr, capacity).await {
            Ok(Control::Up { io, rest }) => {
                let (ended, heard) = serve(&fleet, addr, io, rest).await;
                tracing::debug!(reason = %ended, "control link ended");
                lost(&fleet, addr);
                // Dialed again at once; a link that never said anything counts as a failure.
                failures = if heard { 0 } else { failures.saturating_add(1) };
                (failures > 0).then(|| backoff.delay(failures - 1))
            }
            Ok(Control::Unsupported) => {
                fleet.with(|n, now| n.unsupported(addr, now));
                Some(backoff.max)
            }
            Err(e) if e.is_drained() => {
                report.held(&e, fleet.options().drained_probe);
                fleet.with(|n, now| n.hold(addr, now));
                fleet.shared().record(e);
                Some(backoff.max)
            }
            Err(e) if !e.is_retryable() => {
                report.refused(&e);
                fleet.shared().record(e);
                lost(&fleet, addr);
                Some(backoff.max)
            }
            Err(e) => {
                let refused = e.is_connection_refused();
                if fleet.with(|n, now| n.link_failed(addr, refused, now)) {
                    report.dial_failed(&e, epoch);
                }
                fleet.shared().record(e);
                failures = failures.saturating_add(1);
                Some(backoff.delay(failures - 1))
            }
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
    }
}

/// The link is gone (or could not be dialed): a live node gets `node_grace` to come back.
fn lost(fleet: &Arc<Fleet>, addr: SocketAddr) {
    fleet.with(|n, now| n.link_lost(addr, now));
}

/// Serves an open link until it ends; also says whether the node said anything valid.
async fn serve(
    fleet: &Arc<Fleet>,
    addr: SocketAddr,
    io: Box<dyn Io>,
    rest: Bytes,
) -> (LinkEnd, bool) {
    let (read, mut write) = tokio::io::split(io);
    let mut lines = LineReader::new(read, &rest);
    let (tx, mut rx) = mpsc::unbounded_channel::<ServiceLine>();
    fleet.with(|n, _| n.connected(addr, tx));
    let mut heard = false;
    let mut silent_at = Instant::now() + SILENCE;
    loop {
        tokio::select! {
            // What the plan asks goes out first (the `CAPACITY` after the `101` included).
            biased;
            out = rx.recv() => {
                let Some(out) = out else { return (LinkEnd::Left, heard) };
                // TLS holds records until flushed.
                let sent = async {
                    write.write_all(&out.encode()).await?;
                    write.flush().await
                };
                if let Err(e) = sent.await {
                    return (e.into(), heard);
                }
            }
            line = lines.next_line() => {
                let line = match line {
                    Ok(line) => line,
                    Err(e) => return (e.into(), heard),
                };
                match NodeLine::parse(&line) {
                    Ok(NodeLine::Demand(d)) => fleet.with(|n, now| n.demand(addr, d, now)),
                    Ok(NodeLine::Draining) => fleet.with(|n, now| n.draining(addr, now)),
                    Ok(NodeLine::Floor(asks)) => fleet.with(|n, _| n.floor(addr, asks)),
                    Err(e) => return (ReadLineError::Invalid(e).into(), heard),
                }
                heard = true;
                silent_at = Instant::now() + SILENCE;
            }
            () = sleep_until(silent_at) => return (LinkEnd::Silent, heard),
        }
    }
}
