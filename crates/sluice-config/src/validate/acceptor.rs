//! `[acceptor]`: the service-facing listener, and the route `slice` checks that depend on
//! reverse clusters.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{Acceptor, Action, Cluster, ClusterKind, Route};
use crate::raw::{RawAcceptor, RawCluster, RawKind};

const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_MAX_HANDSHAKE: usize = 8 * 1024;
const DEFAULT_MAX_SESSIONS: usize = 10_000;
const DEFAULT_HANDSHAKES_PER_SECOND: u32 = 100;
/// A registration with a long token needs a few hundred bytes; more than 64 KiB is abuse.
const HANDSHAKE_RANGE: std::ops::RangeInclusive<usize> = 256..=64 * 1024;

/// Validates `[acceptor]`; it is required as soon as one cluster is a reverse cluster.
pub(super) fn acceptor(
    ctx: Ctx<'_>,
    raw: Option<Spanned<RawAcceptor>>,
    clusters: &BTreeMap<Spanned<String>, RawCluster>,
) -> Result<Option<Acceptor>, ConfigError> {
    let Some(raw) = raw.map(Spanned::into_inner) else {
        let reverse = clusters
            .iter()
            .find(|(_, c)| matches!(c.kind, RawKind::Reverse));
        return match reverse {
            Some((name, _)) => Err(ctx.err(
                name.span(),
                format!(
                    "reverse cluster `{}` needs an [acceptor] with `listen` for services to dial in to",
                    name.get_ref()
                ),
            )),
            None => Ok(None),
        };
    };
    let max_handshake_size = match raw.max_handshake_size {
        None => DEFAULT_MAX_HANDSHAKE,
        Some(s) if HANDSHAKE_RANGE.contains(&s.get_ref().0) => s.get_ref().0,
        Some(s) => {
            return Err(ctx.err(s.span(), "max_handshake_size must be between 256 and 64KiB"))
        }
    };
    Ok(Some(Acceptor {
        addr: raw.listen.into_inner().0,
        unix: raw.unix.map(|p| ctx.resolve(p.get_ref())),
        handshake_timeout: raw
            .handshake_timeout
            .map_or(DEFAULT_HANDSHAKE_TIMEOUT, |t| t.0),
        max_handshake_size,
        max_sessions: Some(raw.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS)).filter(|&n| n > 0),
        handshakes_per_second: Some(
            raw.handshakes_per_second
                .unwrap_or(DEFAULT_HANDSHAKES_PER_SECOND),
        )
        .filter(|&n| n > 0),
    }))
}

/// Sets each route's slice; a slice other than the default needs a reverse cluster.
/// `raw` holds each route's `slice` key in file order.
pub(super) fn slices(
    ctx: Ctx<'_>,
    routes: &mut [Route],
    raw: Vec<Option<Spanned<String>>>,
    clusters: &BTreeMap<String, Cluster>,
) -> Result<(), ConfigError> {
    for (route, slice) in routes.iter_mut().zip(raw) {
        let Some(slice) = slice else { continue };
        let reverse = match &route.action {
            Action::Proxy { cluster } => clusters
                .get(cluster)
                .is_some_and(|c| matches!(c.kind, ClusterKind::Reverse(_))),
            Action::Direct(_) => false,
        };
        if !reverse {
            let msg = format!(
                "route `{}` has `slice`, which only applies to a cluster of kind = \"reverse\"",
                route.name
            );
            return Err(ctx.err(slice.span(), msg));
        }
        if slice.get_ref().is_empty() {
            return Err(ctx.err(slice.span(), "`slice` must not be empty"));
        }
        route.slice = slice.into_inner();
    }
    Ok(())
}
