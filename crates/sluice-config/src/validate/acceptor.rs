//! `[acceptor]`: the service-facing listener with its TLS and client-certificate grants, and the
//! route `slice` checks that depend on reverse clusters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{
    Acceptor, AcceptorTls, Action, ClientAuth, Cluster, ClusterKind, Route, ServiceGrant,
};
use crate::raw::{RawAcceptor, RawAcceptorTls, RawCluster, RawGrant, RawKind, RawTls};

const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_MAX_HANDSHAKE: usize = 8 * 1024;
const DEFAULT_MAX_SESSIONS: usize = 10_000;
const DEFAULT_HANDSHAKES_PER_SECOND: u32 = 100;
/// Control links open at once, in all and from one address; slices services may create per
/// cluster. Generous for real fleets (an instance holds one link per node), small enough that
/// a flood of links or slice names costs a bounded amount of memory and CPU.
const DEFAULT_MAX_CONTROL_LINKS: usize = 4096;
const DEFAULT_MAX_CONTROL_LINKS_PER_ADDRESS: usize = 256;
const DEFAULT_MAX_SLICES: usize = 64;
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
            .find(|(_, c)| matches!(c.kind, RawKind::Reverse) && c.handoff.is_none());
        return match reverse {
            Some((name, _)) => Err(ctx.err(
                name.span(),
                format!(
                    "reverse cluster `{}` needs an [acceptor] with `listen` for services to dial in to (or `handoff` to draw on a standalone acceptor)",
                    name.get_ref()
                ),
            )),
            None => Ok(None),
        };
    };
    let reverse: BTreeSet<&str> = clusters
        .iter()
        .filter(|(_, c)| matches!(c.kind, RawKind::Reverse))
        .map(|(name, _)| name.get_ref().as_str())
        .collect();
    let tls = tls(ctx, raw.tls, raw.clients, &reverse)?;
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
        max_control_links: Some(raw.max_control_links.unwrap_or(DEFAULT_MAX_CONTROL_LINKS))
            .filter(|&n| n > 0),
        max_control_links_per_address: Some(
            raw.max_control_links_per_address
                .unwrap_or(DEFAULT_MAX_CONTROL_LINKS_PER_ADDRESS),
        )
        .filter(|&n| n > 0),
        max_slices: Some(raw.max_slices.unwrap_or(DEFAULT_MAX_SLICES)).filter(|&n| n > 0),
        tls,
    }))
}

/// `tls = { cert, key, client_ca }` and the `[acceptor.clients]` that `client_ca` allows.
fn tls(
    ctx: Ctx<'_>,
    raw: Option<RawAcceptorTls>,
    clients: Option<Spanned<RawClients>>,
    reverse: &BTreeSet<&str>,
) -> Result<Option<AcceptorTls>, ConfigError> {
    let has_ca = raw.as_ref().is_some_and(|t| t.client_ca.is_some());
    if let Some(clients) = clients.as_ref().filter(|_| !has_ca) {
        let msg = "[acceptor.clients] needs mTLS: set `client_ca` in the acceptor's `tls`";
        return Err(ctx.err(clients.span(), msg));
    }
    let Some(raw) = raw else { return Ok(None) };
    let server = super::tls::read(
        ctx,
        RawTls {
            cert: raw.cert,
            key: raw.key,
        },
    )?;
    let client_auth = match raw.client_ca {
        None => None,
        Some(ca) => {
            let (ca_path, ca_pem) = super::tls::read_ca(ctx, &ca, "client CA")?;
            let clients = match clients {
                Some(c) => self::clients(ctx, c, reverse)?,
                None => BTreeMap::new(),
            };
            Some(ClientAuth {
                ca_path,
                ca_pem,
                clients,
            })
        }
    };
    Ok(Some(AcceptorTls {
        server,
        client_auth,
    }))
}

type RawClients = BTreeMap<Spanned<String>, RawGrant>;

/// `[acceptor.clients]`: names are compared case-insensitively, as DNS names are.
fn clients(
    ctx: Ctx<'_>,
    raw: Spanned<RawClients>,
    reverse: &BTreeSet<&str>,
) -> Result<BTreeMap<String, ServiceGrant>, ConfigError> {
    if raw.get_ref().is_empty() {
        let msg = "[acceptor.clients] is empty, so no service could register; remove it to let \
                   every certificate that client_ca signed register for any service";
        return Err(ctx.err(raw.span(), msg));
    }
    let mut out = BTreeMap::new();
    for (name, services) in raw.into_inner() {
        let key = name.get_ref().to_ascii_lowercase();
        if key.is_empty() {
            return Err(ctx.err(name.span(), "a client certificate name must not be empty"));
        }
        let grant = grant(ctx, name.get_ref(), services, reverse)?;
        if out.insert(key, grant).is_some() {
            let msg = format!(
                "client `{}` is listed twice (names are case-insensitive)",
                name.get_ref()
            );
            return Err(ctx.err(name.span(), msg));
        }
    }
    Ok(out)
}

/// One client's services: reverse cluster names, or `"*"` for any.
fn grant(
    ctx: Ctx<'_>,
    client: &str,
    raw: RawGrant,
    reverse: &BTreeSet<&str>,
) -> Result<ServiceGrant, ConfigError> {
    if raw.get_ref().is_empty() {
        let msg = format!("client `{client}` may register for no service: list services, or \"*\"");
        return Err(ctx.err(raw.span(), msg));
    }
    let mut any = false;
    let mut names = BTreeSet::new();
    for service in raw.into_inner() {
        match service.get_ref().as_str() {
            "*" => any = true,
            name if reverse.contains(name) => {
                names.insert(name.to_owned());
            }
            name => {
                let msg = format!(
                    "client `{client}` names unknown service `{name}`: no reverse cluster has that name"
                );
                return Err(ctx.err(service.span(), msg));
            }
        }
    }
    Ok(if any {
        ServiceGrant::Any
    } else {
        ServiceGrant::Services(names)
    })
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
