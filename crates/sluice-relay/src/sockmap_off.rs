//! Kernel splicing in a build without the `sockmap` feature: never available, so a relay with
//! `sockmap = true` logs why once and forwards in user space.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::stats::Stats;

/// No program: there is no value of this type.
#[derive(Debug)]
pub(crate) enum Kernel {}

/// Why kernel splicing is off.
pub(crate) fn kernel() -> Result<Arc<Kernel>, String> {
    Err("this build has no `sockmap` feature".to_owned())
}

/// Unreachable: no [`Kernel`] exists.
pub(crate) async fn relay(
    kernel: &Arc<Kernel>,
    _: &TcpStream,
    _: &TcpStream,
    _: Duration,
    _: &Stats,
) -> Option<io::Result<()>> {
    match **kernel {}
}
