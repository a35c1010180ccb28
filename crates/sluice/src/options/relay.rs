//! `sluice-relay`'s options: one `[[relay]]`.

use sluice_config::RelayRole;
use sluice_relay::{
    AllowedTarget, Forward, NextHop, RelayConfig, RelayOptions, TunnelEnd, TunnelTarget,
};

/// The relay `[[relay]]` describes.
pub fn config(cfg: &sluice_config::Relay) -> RelayConfig {
    let role = match &cfg.role {
        RelayRole::Forward(f) => sluice_relay::RelayRole::Forward(Forward {
            to: next_hop(&f.to),
            tunnel: f.tunnel.as_ref().map(|t| TunnelTarget {
                target: t.target,
                token: t.token.clone(),
            }),
            pool: f.pool,
            early_connect: f.early_connect,
        }),
        RelayRole::Tunnel(end) => sluice_relay::RelayRole::Tunnel(TunnelEnd {
            tokens: end.tokens.clone(),
            allow: end
                .allow
                .iter()
                .map(|a| AllowedTarget {
                    net: a.net,
                    port: a.port,
                })
                .collect(),
            preamble_timeout: end.preamble_timeout,
            max_unauthenticated: end.max_unauthenticated,
            pool_targets: end.pool_targets.clone(),
            pool: end.pool,
        }),
    };
    RelayConfig {
        name: cfg.name.clone(),
        addr: cfg.addr,
        role,
        options: options(&cfg.options),
    }
}

/// Where an entry relay connects: fixed addresses, or a name it follows.
fn next_hop(to: &sluice_config::NextHop) -> NextHop {
    match to {
        sluice_config::NextHop::Addrs(addrs) => NextHop::Addrs(addrs.clone()),
        sluice_config::NextHop::Follow { name, resolve, dns } => NextHop::Follow {
            name: name.clone(),
            resolve: *resolve,
            dns: dns.clone(),
        },
    }
}

/// A relay's timeouts, limits and socket settings.
fn options(cfg: &sluice_config::RelayOptions) -> RelayOptions {
    RelayOptions {
        connect_timeout: cfg.connect_timeout,
        idle_timeout: cfg.idle_timeout,
        max_connections: cfg.max_connections,
        nodelay: cfg.nodelay,
        congestion: cfg.congestion.clone(),
        socket_buffer: cfg.socket_buffer,
        splice: cfg.splice,
        sockmap: cfg.sockmap,
    }
}
