//! `sluice-reverse`'s options: reverse clusters, the acceptor, the standalone acceptor.

use std::io;

use sluice_config::{ClusterKind, Config, SessionSource};
use sluice_reverse::handoff::BrokerError;
use sluice_reverse::{
    AcceptorOptions, BrokerOptions, Protocol, ReverseCluster, ReverseMetrics, ReverseOptions,
    ServiceGrant,
};

/// A reverse cluster's queueing, limits, timeouts and buffers.
pub fn options(cfg: &sluice_config::ReverseOptions) -> ReverseOptions {
    ReverseOptions {
        queue_max: cfg.queue_max,
        queue_timeout: cfg.queue_timeout,
        no_sessions_wait: cfg.no_sessions_wait,
        startup_wait: cfg.startup_wait,
        max_sessions_per_instance: cfg.max_sessions_per_instance,
        max_sessions: cfg.max_sessions,
        response_timeout: cfg.response_timeout,
        request_buffer: cfg.request_buffer,
        response_buffer: cfg.response_buffer,
    }
}

/// The reverse cluster `[cluster.<name>]` describes, recording in `metrics`, with the proxy's
/// own settings of it (`protocol`).
pub fn cluster<P: Protocol>(
    name: &str,
    cfg: &sluice_config::ReverseCluster,
    metrics: &ReverseMetrics,
    protocol: P::Options,
) -> ReverseCluster<P> {
    let opts = options(&cfg.options);
    let tokens = cfg.tokens.clone();
    let cluster = ReverseCluster::with_protocol_options(name, tokens, opts, metrics, protocol);
    match cfg.source {
        SessionSource::Acceptor => cluster,
        SessionSource::Handoff { .. } => cluster.lent(),
    }
}

/// The reverse clusters whose services register with this process's own `[acceptor]` (not
/// through a standalone acceptor's handoff socket).
pub fn registering_here(
    config: &Config,
) -> impl Iterator<Item = (&String, &sluice_config::ReverseCluster)> {
    config
        .clusters
        .iter()
        .filter_map(|(name, c)| match &c.kind {
            ClusterKind::Reverse(r) if r.source == SessionSource::Acceptor => Some((name, r)),
            _ => None,
        })
}

/// The `[acceptor]`, with its TLS config built (the error: rustls refused the certificate,
/// the key or the client CA).
pub fn acceptor(cfg: &sluice_config::Acceptor) -> io::Result<AcceptorOptions> {
    let tls = cfg.tls.as_ref().map(|tls| {
        let ca = tls
            .client_auth
            .as_ref()
            .map(|auth| sluice_net::tls::ClientCa {
                path: &auth.ca_path,
                pem: &auth.ca_pem,
            });
        sluice_net::tls::acceptor_config(&tls.server, ca)
    });
    Ok(AcceptorOptions {
        tls: tls.transpose()?,
        ..plaintext_acceptor(cfg)
    })
}

/// The `[acceptor]` without its TLS.
fn plaintext_acceptor(cfg: &sluice_config::Acceptor) -> AcceptorOptions {
    let auth = cfg.tls.as_ref().and_then(|t| t.client_auth.as_ref());
    let clients = auth.into_iter().flat_map(|a| &a.clients);
    let clients = clients.map(|(name, grant)| (name.clone(), service_grant(grant)));
    AcceptorOptions {
        addr: cfg.addr,
        unix: cfg.unix.clone(),
        handshake_timeout: cfg.handshake_timeout,
        max_handshake_size: cfg.max_handshake_size,
        max_sessions: cfg.max_sessions,
        handshakes_per_second: cfg.handshakes_per_second,
        max_control_links: cfg.max_control_links,
        max_control_links_per_address: cfg.max_control_links_per_address,
        max_slices: cfg.max_slices,
        tls: None,
        clients: clients.collect(),
    }
}

fn service_grant(grant: &sluice_config::ServiceGrant) -> ServiceGrant {
    match grant {
        sluice_config::ServiceGrant::Any => ServiceGrant::Any,
        sluice_config::ServiceGrant::Services(names) => ServiceGrant::Services(names.clone()),
    }
}

/// `sluice acceptor`'s `[acceptor]` and `[handoff]`; refused without either, or with TLS on
/// the acceptor (a lent session's TLS state cannot leave this process).
pub fn broker(config: &Config) -> Result<BrokerOptions, BrokerError> {
    let (Some(acceptor), Some(handoff)) = (&config.acceptor, &config.handoff) else {
        return Err(BrokerError::Config(format!(
            "{}: a standalone acceptor needs [acceptor] (where services dial in) and [handoff] (where consumers connect)",
            config.source
        )));
    };
    if acceptor.tls.is_some() {
        return Err(BrokerError::Config(format!(
            "{}: [acceptor] tls: a standalone acceptor cannot lend sessions over TLS (their TLS state stays in this process); remove `tls` here and let services register over plain TCP on a private network or a UNIX socket",
            config.source
        )));
    }
    Ok(BrokerOptions {
        acceptor: plaintext_acceptor(acceptor),
        path: handoff.path.clone(),
        allowed_uids: handoff.allowed_uids.clone(),
        access: sluice_handoff::SocketAccess {
            mode: handoff.mode,
            group: handoff.group,
        },
    })
}
