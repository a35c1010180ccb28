//! `[[relay]]`: entry relays and tunnel ends, their tokens, `allow` list and socket settings.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::dns::Endpoint;
use super::{secret, unique, Ctx};
use crate::error::ConfigError;
use crate::model::{
    AllowedTarget, Dns, Forward, NextHop, Relay, RelayOptions, RelayRole, Token, TunnelEnd,
    TunnelTarget,
};
use crate::raw::{RawRelay, RawResolve};
use crate::values::parse_cidr;

/// Socket buffers below 4 KiB starve a long path; above 256 MiB is beyond any kernel limit.
const SOCKET_BUFFER_RANGE: std::ops::RangeInclusive<usize> = 4096..=256 << 20;
/// Linux's `TCP_CA_NAME_MAX` is 16 bytes with the NUL.
const MAX_CONGESTION_NAME: usize = 15;
/// A pool this large would be a connection flood towards the next hop.
const MAX_POOL: usize = 4096;
/// A pre-auth deadline longer than this would let silent peers hold connections for long;
/// an entry relay sends its token as soon as it connects.
const MAX_PREAMBLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Validates every `[[relay]]`: unique names and listen addresses, then each one.
pub(super) fn relays(
    ctx: Ctx<'_>,
    raw: Vec<Spanned<RawRelay>>,
    dns: &Dns,
) -> Result<Vec<Relay>, ConfigError> {
    let mut names = HashMap::new();
    let mut addrs = HashMap::new();
    raw.into_iter()
        .map(|r| {
            let span = r.span();
            let r = r.into_inner();
            unique(
                ctx,
                &mut names,
                r.name.get_ref(),
                r.name.span(),
                "relay name",
            )?;
            let addr = r.listen.get_ref().0;
            if addr.port() != 0 {
                unique(
                    ctx,
                    &mut addrs,
                    &addr,
                    r.listen.span(),
                    "relay listen address",
                )?;
            }
            relay(ctx, span, r, dns)
        })
        .collect()
}

fn relay(
    ctx: Ctx<'_>,
    span: Range<usize>,
    mut raw: RawRelay,
    dns: &Dns,
) -> Result<Relay, ConfigError> {
    let options = options(ctx, &raw)?;
    let tunnel = raw.tunnel.as_ref().is_some_and(|t| *t.get_ref());
    let role = if tunnel {
        RelayRole::Tunnel(tunnel_end(ctx, &raw)?)
    } else {
        RelayRole::Forward(forward(ctx, span, raw.resolve.take(), &raw, dns)?)
    };
    Ok(Relay {
        name: raw.name.into_inner(),
        addr: raw.listen.into_inner().0,
        role,
        options,
    })
}

/// An entry relay: `to` is required; `target` and `token` come together.
fn forward(
    ctx: Ctx<'_>,
    span: Range<usize>,
    resolve: Option<Spanned<RawResolve>>,
    raw: &RawRelay,
    dns: &Dns,
) -> Result<Forward, ConfigError> {
    let refused = [
        ("tokens", raw.tokens.as_ref().map(Spanned::span)),
        ("allow", raw.allow.as_ref().map(Spanned::span)),
        (
            "preamble_timeout",
            raw.preamble_timeout.as_ref().map(Spanned::span),
        ),
        (
            "max_unauthenticated",
            raw.max_unauthenticated.as_ref().map(Spanned::span),
        ),
        ("pool_targets", raw.pool_targets.as_ref().map(Spanned::span)),
    ];
    for (key, span) in refused {
        refuse(ctx, span, key, "a tunnel end")?;
    }
    let name = raw.name.get_ref();
    let Some(to) = &raw.to else {
        let msg = format!("relay `{name}` needs `to` (its next hop), or `tunnel = true`");
        return Err(ctx.err(span, msg));
    };
    let tunnel = match (&raw.target, &raw.token) {
        (None, None) => None,
        (Some(target), Some(token)) => Some(TunnelTarget {
            target: target.get_ref().0,
            token: token_value(ctx, token)?,
        }),
        (Some(target), None) => {
            let msg = format!("relay `{name}` names a `target` but has no `token` to authenticate it to the tunnel end");
            return Err(ctx.err(target.span(), msg));
        }
        (None, Some(token)) => {
            let msg = "`token` is only used with `target` (naming a target to a tunnel end)";
            return Err(ctx.err(token.span(), msg));
        }
    };
    let pool = pool_size(ctx, raw)?;
    Ok(Forward {
        to: next_hop(ctx, to, resolve, dns)?,
        tunnel,
        pool,
        early_connect: raw.early_connect.as_ref().is_some_and(|e| *e.get_ref()),
    })
}

/// `to = "IP:port"` or `"host:port"`: a name with `resolve` is followed by the relay; without
/// it, looked up once now, as a static cluster's endpoint names are.
fn next_hop(
    ctx: Ctx<'_>,
    to: &Spanned<String>,
    resolve: Option<Spanned<RawResolve>>,
    dns: &Dns,
) -> Result<NextHop, ConfigError> {
    let resolve_span = resolve.as_ref().map(Spanned::span);
    let bounds = super::dns::resolve(ctx, resolve)?;
    let text = to.get_ref();
    let parsed = super::dns::endpoint(text).map_err(|why| {
        let why = why.replacen("endpoint", "next hop", 1);
        ctx.err(to.span(), why)
    })?;
    match (parsed, bounds) {
        (Endpoint::Name(name), Some(resolve)) => Ok(NextHop::Follow {
            name,
            resolve,
            dns: dns.clone(),
        }),
        (Endpoint::Addr(_), Some(_)) => Err(ctx.err(
            resolve_span.unwrap_or_else(|| to.span()),
            format!("`resolve` follows a name's DNS records, but `to` is the address `{text}`: give `to` as \"host:port\", or drop `resolve`"),
        )),
        (Endpoint::Addr(addr), None) => Ok(NextHop::Addrs(vec![addr])),
        (Endpoint::Name(_), None) => {
            let addrs = crate::values::resolve_endpoint(text);
            let addrs = addrs.map_err(|why| ctx.err(to.span(), format!("{why} (with `resolve = true` the relay looks it up itself, when it starts and as its TTL says)")))?;
            Ok(NextHop::Addrs(addrs))
        }
    }
}

/// A tunnel end: at least one token and one `allow` entry; no next-hop keys.
fn tunnel_end(ctx: Ctx<'_>, raw: &RawRelay) -> Result<TunnelEnd, ConfigError> {
    let refused = [
        ("to", raw.to.as_ref().map(Spanned::span)),
        ("resolve", raw.resolve.as_ref().map(Spanned::span)),
        ("target", raw.target.as_ref().map(Spanned::span)),
        ("token", raw.token.as_ref().map(Spanned::span)),
        (
            "early_connect",
            raw.early_connect.as_ref().map(Spanned::span),
        ),
    ];
    for (key, span) in refused {
        refuse(ctx, span, key, "an entry relay")?;
    }
    let tunnel_span = raw.tunnel.as_ref().map(Spanned::span).unwrap_or_default();
    let name = raw.name.get_ref();
    let tokens = match &raw.tokens {
        Some(t) if !t.get_ref().is_empty() => t.get_ref(),
        _ => {
            let msg = format!("tunnel end `{name}` needs `tokens` (no token, no tunnel)");
            return Err(ctx.err(tunnel_span, msg));
        }
    };
    let allow = match &raw.allow {
        Some(a) if !a.get_ref().is_empty() => a.get_ref(),
        _ => {
            let msg = format!("tunnel end `{name}` needs `allow`, the CIDR:port targets it may connect to (it is never an open relay)");
            return Err(ctx.err(tunnel_span, msg));
        }
    };
    let allow: Vec<AllowedTarget> = allow
        .iter()
        .map(|a| parse_allowed(a.get_ref()).map_err(|msg| ctx.err(a.span(), msg)))
        .collect::<Result<_, _>>()?;
    let (pool_targets, pool) = tunnel_pool(ctx, raw, &allow)?;
    Ok(TunnelEnd {
        tokens: tokens
            .iter()
            .map(|t| token_value(ctx, t))
            .collect::<Result<_, _>>()?,
        allow,
        preamble_timeout: preamble_timeout(ctx, raw)?,
        max_unauthenticated: max_unauthenticated(ctx, raw)?,
        pool_targets,
        pool,
    })
}

/// `pool`: at most [`MAX_POOL`] (connections to one next hop or target).
fn pool_size(ctx: Ctx<'_>, raw: &RawRelay) -> Result<usize, ConfigError> {
    let pool = raw.pool.as_ref().map_or(0, |p| *p.get_ref());
    if pool > MAX_POOL {
        let span = raw.pool.as_ref().map(Spanned::span).unwrap_or_default();
        return Err(ctx.err(span, format!("pool must be at most {MAX_POOL}")));
    }
    Ok(pool)
}

/// A tunnel end's `pool_targets` and `pool`: both or neither, each target inside `allow` (a
/// pool is never a way around it), none twice.
fn tunnel_pool(
    ctx: Ctx<'_>,
    raw: &RawRelay,
    allow: &[AllowedTarget],
) -> Result<(Vec<std::net::SocketAddr>, usize), ConfigError> {
    let pool = pool_size(ctx, raw)?;
    let targets = raw.pool_targets.as_ref();
    match (targets, &raw.pool) {
        (None, None) => return Ok((Vec::new(), 0)),
        (None, Some(p)) => {
            let msg = "a tunnel end's `pool` needs `pool_targets`, the fixed targets to keep connections to";
            return Err(ctx.err(p.span(), msg));
        }
        (Some(t), None) => {
            let msg = "`pool_targets` needs `pool`, the connections kept to each";
            return Err(ctx.err(t.span(), msg));
        }
        (Some(_), Some(_)) => {}
    }
    let mut seen = HashMap::new();
    let mut out = Vec::new();
    for t in targets.map(Spanned::get_ref).into_iter().flatten() {
        let addr = t.get_ref().0;
        let addr = std::net::SocketAddr::new(addr.ip().to_canonical(), addr.port());
        if !allow.iter().any(|a| a.allows(addr)) {
            let msg = format!("pool target {addr} is not inside `allow`");
            return Err(ctx.err(t.span(), msg));
        }
        unique(ctx, &mut seen, &addr, t.span(), "pool target")?;
        out.push(addr);
    }
    Ok((out, pool))
}

/// `preamble_timeout`: above zero (checked while parsing) and at most a minute.
fn preamble_timeout(ctx: Ctx<'_>, raw: &RawRelay) -> Result<Duration, ConfigError> {
    match &raw.preamble_timeout {
        None => Ok(TunnelEnd::DEFAULT_PREAMBLE_TIMEOUT),
        Some(t) if t.get_ref().0 <= MAX_PREAMBLE_TIMEOUT => Ok(t.get_ref().0),
        Some(t) => {
            let msg = "preamble_timeout must be at most 1m (an entry relay sends its token as soon as it connects)";
            Err(ctx.err(t.span(), msg))
        }
    }
}

/// `max_unauthenticated`: at least 1.
fn max_unauthenticated(ctx: Ctx<'_>, raw: &RawRelay) -> Result<usize, ConfigError> {
    match &raw.max_unauthenticated {
        None => Ok(TunnelEnd::DEFAULT_MAX_UNAUTHENTICATED),
        Some(n) if *n.get_ref() > 0 => Ok(*n.get_ref()),
        Some(n) => Err(ctx.err(n.span(), "max_unauthenticated must be at least 1")),
    }
}

/// An error at `span`, if present: `key` belongs to the other role.
fn refuse(
    ctx: Ctx<'_>,
    span: Option<Range<usize>>,
    key: &str,
    role: &str,
) -> Result<(), ConfigError> {
    match span {
        Some(span) => Err(ctx.err(span, format!("`{key}` only applies to {role}"))),
        None => Ok(()),
    }
}

/// A token: a literal or an `env:`/`file:` secret, not empty, at most 255 bytes (the
/// preamble's limit).
fn token_value(ctx: Ctx<'_>, raw: &Spanned<String>) -> Result<Token, ConfigError> {
    let value = secret::resolve(ctx, raw)?;
    match value.len() {
        0 => Err(ctx.err(raw.span(), "a relay token must not be empty")),
        1..=255 => Ok(Token(value.as_bytes().to_vec())),
        _ => Err(ctx.err(raw.span(), "a relay token must be at most 255 bytes")),
    }
}

/// `"10.3.0.0/24:8000"` or `"[2001:db8::/32]:443"`; a bare IP means that one address.
pub(super) fn parse_allowed(text: &str) -> Result<AllowedTarget, String> {
    let bad = || {
        format!("invalid allow entry `{text}`; expected CIDR:port like \"10.3.0.0/24:8000\" or \"[2001:db8::/32]:443\"")
    };
    let (net, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let net = match net.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']').ok_or_else(bad)?,
        None if net.contains(':') => return Err(bad()),
        None => net,
    };
    let port: u16 = port.parse().ok().filter(|&p| p != 0).ok_or_else(bad)?;
    let net = parse_cidr(net).map_err(|e| format!("{e} in allow entry `{text}`"))?;
    Ok(AllowedTarget { net, port })
}

fn options(ctx: Ctx<'_>, raw: &RawRelay) -> Result<RelayOptions, ConfigError> {
    let defaults = RelayOptions::default();
    let max_connections = match &raw.max_connections {
        None => defaults.max_connections,
        Some(n) if *n.get_ref() > 0 => *n.get_ref(),
        Some(n) => return Err(ctx.err(n.span(), "max_connections must be at least 1")),
    };
    let socket_buffer = match &raw.socket_buffer {
        None => None,
        Some(s) if SOCKET_BUFFER_RANGE.contains(&s.get_ref().0) => Some(s.get_ref().0),
        Some(s) => return Err(ctx.err(s.span(), "socket_buffer must be between 4KiB and 256MiB")),
    };
    let congestion = match &raw.congestion {
        None => None,
        Some(c) if valid_congestion(c.get_ref()) => Some(c.get_ref().clone()),
        Some(c) => {
            let msg = format!(
                "invalid congestion control `{}`; expected a kernel name like \"bbr\" or \"reno\"",
                c.get_ref()
            );
            return Err(ctx.err(c.span(), msg));
        }
    };
    Ok(RelayOptions {
        connect_timeout: raw
            .connect_timeout
            .map_or(defaults.connect_timeout, |t| t.0),
        idle_timeout: raw.idle_timeout.map_or(defaults.idle_timeout, |t| t.0),
        max_connections,
        nodelay: raw.nodelay.unwrap_or(defaults.nodelay),
        congestion,
        socket_buffer,
        splice: raw.splice.unwrap_or(defaults.splice),
        sockmap: raw.sockmap.unwrap_or(defaults.sockmap),
    })
}

fn valid_congestion(name: &str) -> bool {
    (1..=MAX_CONGESTION_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(net: &str, port: u16) -> AllowedTarget {
        let net = net.parse().expect("net");
        AllowedTarget { net, port }
    }

    #[test]
    fn allow_entries_take_cidr_and_port() {
        let a = parse_allowed("10.3.0.0/24:8000").expect("valid");
        assert_eq!(a, allowed("10.3.0.0/24", 8000));
        let one = parse_allowed("10.3.0.2:80").expect("a bare IP");
        assert_eq!(one, allowed("10.3.0.2/32", 80));
        let v6 = parse_allowed("[2001:db8::/32]:443").expect("v6");
        assert_eq!(v6, allowed("2001:db8::/32", 443));
        for bad in [
            "10.3.0.0/24",
            "10.3.0.0/24:0",
            "2001:db8::/32:443",
            "x:1",
            "10.0.0.0/33:1",
        ] {
            assert!(parse_allowed(bad).is_err(), "{bad}");
        }
    }
}
