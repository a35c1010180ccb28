//! `sluice ctl status`: the reply of `GET /status`, rendered as tables.
//!
//! The reply's types are `sluice_config::admin`'s, the ones the proxy writes. Fields the server
//! adds later are ignored; lists it leaves out read as empty.

use std::fmt::Write as _;

use sluice_config::admin::{
    CacheStatus as Cache, ClusterStatus as Cluster, ConsumerStatus as Consumer,
    EndpointStatus as Endpoint, InstanceStatus as Instance, ListenerStatus as Listener,
    RelayStatus as Relay, SliceStatus as Slice, Status,
};

use super::client::AdminUrl;
use super::table::{printable, Align, Table};

/// The whole status as text: a summary line, listeners, acceptor, clusters, then each
/// cluster's detail.
pub(crate) fn render(status: &Status, url: &AdminUrl) -> String {
    let node = match status.node.as_str() {
        "" => String::new(),
        state => format!(", {}", printable(state)),
    };
    let mut out = format!(
        "sluice {} at {url}, up {}{node}\n",
        printable(&status.version),
        uptime(status.uptime_seconds)
    );
    listeners(&status.listeners, &mut out);
    let acceptor = status
        .acceptor
        .as_ref()
        .map_or("none".into(), |a| printable(&a.addr));
    let _ = writeln!(out, "\nacceptor: {acceptor}");
    clusters(&status.clusters, &mut out);
    for cluster in &status.clusters {
        detail(cluster, &mut out);
    }
    relays(&status.relays, &mut out);
    caches(&status.caches, &mut out);
    consumers(&status.consumers, &mut out);
    out
}

/// A standalone acceptor's consumers: one row per consumer and slice it holds credit or
/// sessions of.
fn consumers(consumers: &[Consumer], out: &mut String) {
    if consumers.is_empty() {
        return;
    }
    out.push('\n');
    let mut t = Table::new(&[
        ("CONSUMER", Align::Right),
        ("CLUSTER", Align::Left),
        ("SLICE", Align::Left),
        ("CREDIT", Align::Right),
        ("LENT", Align::Right),
    ]);
    for c in consumers {
        if c.slices.is_empty() {
            t.row([
                c.id.to_string(),
                "-".into(),
                "-".into(),
                "0".into(),
                "0".into(),
            ]);
        }
        for s in &c.slices {
            t.row([
                c.id.to_string(),
                s.cluster.clone(),
                s.slice.clone(),
                s.credit.to_string(),
                s.lent.to_string(),
            ]);
        }
    }
    t.render("", out);
}

/// Every route's cache: what it holds and its lookups (`-` for a disk tier it has not).
fn caches(caches: &[Cache], out: &mut String) {
    if caches.is_empty() {
        return;
    }
    out.push('\n');
    let mut t = Table::new(&[
        ("CACHE", Align::Left),
        ("ENTRIES", Align::Right),
        ("BYTES", Align::Right),
        ("HITS", Align::Right),
        ("MISSES", Align::Right),
        ("STALE", Align::Right),
        ("DISK-ENTRIES", Align::Right),
        ("DISK-BYTES", Align::Right),
    ]);
    for c in caches {
        let disk = c.disk.as_ref();
        let disk = |f: fn(&sluice_config::admin::CacheDiskStatus) -> u64| {
            disk.map_or_else(|| "-".to_owned(), |d| f(d).to_string())
        };
        t.row([
            c.route.clone(),
            c.entries.to_string(),
            c.stored_bytes.to_string(),
            c.hits.to_string(),
            c.misses.to_string(),
            c.stale.to_string(),
            disk(|d| d.entries),
            disk(|d| d.stored_bytes),
        ]);
    }
    t.render("", out);
}

fn relays(relays: &[Relay], out: &mut String) {
    if relays.is_empty() {
        return;
    }
    out.push('\n');
    let mut t = Table::new(&[
        ("RELAY", Align::Left),
        ("ADDR", Align::Left),
        ("ACTIVE", Align::Right),
        ("ACCEPTED", Align::Right),
        ("REFUSED", Align::Right),
        ("POOL-IDLE", Align::Right),
        ("POOL-MISSES", Align::Right),
        ("CONNECT-MS", Align::Right),
        ("BYTES-UP", Align::Right),
        ("BYTES-DOWN", Align::Right),
        ("KERNEL", Align::Right),
    ]);
    for r in relays {
        // Connections and bytes the kernel spliced, or `-` where it does not (no sockmap).
        let kernel = match r.sockmap {
            true => format!("{}/{}", r.kernel_spliced, r.bytes_kernel),
            false => "-".to_owned(),
        };
        t.row([
            r.name.clone(),
            r.addr.clone(),
            r.active.to_string(),
            r.accepted.to_string(),
            r.refused.to_string(),
            r.pool_idle.to_string(),
            r.pool_misses.to_string(),
            format!("{:.1}", r.connect_ms_avg),
            r.bytes_up.to_string(),
            r.bytes_down.to_string(),
            kernel,
        ]);
    }
    t.render("", out);
    // Next hops by name that follow DNS, with what they resolved to.
    let followed: Vec<_> = relays.iter().filter_map(|r| r.next_hop.clone()).collect();
    if !followed.is_empty() {
        names(&followed, out);
    }
}

fn listeners(listeners: &[Listener], out: &mut String) {
    out.push('\n');
    if listeners.is_empty() {
        out.push_str("no listeners\n");
        return;
    }
    let mut t = Table::new(&[
        ("LISTENER", Align::Left),
        ("ADDR", Align::Left),
        ("TLS", Align::Left),
        ("CERTIFICATES", Align::Left),
    ]);
    for l in listeners {
        let certs: Vec<String> = l
            .certificates
            .iter()
            .map(|c| {
                let name = c.names.first().map_or("-", String::as_str);
                match c.days_left {
                    Some(d) if d < 0.0 => format!("{name}:EXPIRED"),
                    Some(d) => format!("{name}:{d:.0}d"),
                    None => format!("{name}:?"),
                }
            })
            .collect();
        let certs = if certs.is_empty() {
            "-".to_owned()
        } else {
            certs.join(",")
        };
        t.row([l.name.clone(), l.addr.clone(), yes_no(l.tls), certs]);
    }
    t.render("", out);
}

fn clusters(clusters: &[Cluster], out: &mut String) {
    out.push('\n');
    if clusters.is_empty() {
        out.push_str("no clusters\n");
        return;
    }
    let mut t = Table::new(&[
        ("CLUSTER", Align::Left),
        ("KIND", Align::Left),
        ("SESSIONS", Align::Right),
    ]);
    for c in clusters {
        let sessions = c.sessions.map_or("-".into(), |n| n.to_string());
        t.row([c.name.clone(), c.kind.clone(), sessions]);
    }
    t.render("", out);
}

/// One cluster's slices and instances (reverse) or endpoints (static); for a kind this
/// version does not know, whichever lists the server sent.
fn detail(c: &Cluster, out: &mut String) {
    let _ = writeln!(
        out,
        "\ncluster {} ({})",
        printable(&c.name),
        printable(&c.kind)
    );
    let reverse = c.kind == "reverse";
    let known = reverse || c.kind == "static";
    let (slice_list, instance_list, endpoint_list) = (
        c.slices.as_deref().unwrap_or_default(),
        c.instances.as_deref().unwrap_or_default(),
        c.endpoints.as_deref().unwrap_or_default(),
    );
    if reverse || (!known && !slice_list.is_empty()) {
        slices(slice_list, out);
    }
    if reverse || (!known && !instance_list.is_empty()) {
        instances(instance_list, out);
    }
    if c.kind == "static" || (!known && !endpoint_list.is_empty()) {
        endpoints(endpoint_list, out);
    }
    if let Some(list) = c.names.as_deref() {
        names(list, out);
    }
}

/// Names that follow DNS (a static cluster's endpoints, relays' next hops), with what they
/// resolved to.
fn names(names: &[sluice_config::admin::NameStatus], out: &mut String) {
    let mut t = Table::new(&[
        ("NAME", Align::Left),
        ("ADDRESSES", Align::Left),
        ("FAILED-LOOKUPS", Align::Right),
        ("NEXT-LOOKUP", Align::Right),
        ("LAST-ERROR", Align::Left),
    ]);
    for n in names {
        let addrs = match n.addrs.is_empty() {
            true => "none yet".to_owned(),
            false => printable(&n.addrs.join(" ")),
        };
        t.row([
            printable(&n.name),
            addrs,
            n.failures.to_string(),
            format!("{}ms", n.next_in_ms),
            n.last_error.as_deref().map_or("-".to_owned(), printable),
        ]);
    }
    t.render("  ", out);
}

fn slices(slices: &[Slice], out: &mut String) {
    if slices.is_empty() {
        out.push_str("  no slices\n");
        return;
    }
    let mut t = Table::new(&[
        ("SLICE", Align::Left),
        ("SESSIONS", Align::Right),
        ("IDLE", Align::Right),
        ("IN-FLIGHT", Align::Right),
        ("QUEUED", Align::Right),
        ("OLDEST-WAIT", Align::Right),
        ("ASKS-FOR", Align::Right),
        ("WHY", Align::Left),
    ]);
    for s in slices {
        t.row([
            s.name.clone(),
            s.sessions.to_string(),
            s.idle.to_string(),
            s.in_flight.to_string(),
            s.queued.to_string(),
            format!("{}ms", s.oldest_wait_ms),
            s.asks_for.to_string(),
            s.why.clone(),
        ]);
    }
    t.render("  ", out);
}

fn instances(instances: &[Instance], out: &mut String) {
    if instances.is_empty() {
        out.push_str("  no instances registered\n");
        return;
    }
    let mut t = Table::new(&[
        ("INSTANCE", Align::Left),
        ("SESSIONS", Align::Right),
        ("DECLARED", Align::Right),
        ("RETIRING", Align::Right),
        ("UPGRADED", Align::Right),
        ("DRAINING", Align::Left),
    ]);
    for i in instances {
        t.row([
            i.id.clone(),
            i.sessions.to_string(),
            i.declared.map_or("-".into(), |n| n.to_string()),
            i.retiring.to_string(),
            i.upgraded.to_string(),
            yes_no(i.draining),
        ]);
    }
    t.render("  ", out);
}

fn endpoints(endpoints: &[Endpoint], out: &mut String) {
    if endpoints.is_empty() {
        out.push_str("  no endpoints\n");
        return;
    }
    let mut t = Table::new(&[
        ("ENDPOINT", Align::Left),
        ("HEALTHY", Align::Left),
        ("EJECTED", Align::Right),
        ("EJECTIONS", Align::Right),
        ("CONNECT-FAILS", Align::Right),
        ("IN-FLIGHT", Align::Right),
        ("IDLE-CONNS", Align::Right),
    ]);
    for e in endpoints {
        let ejected = match e.ejected_ms {
            0 => "no".to_owned(),
            ms => format!("{ms}ms"),
        };
        t.row([
            e.addr.clone(),
            yes_no(e.healthy),
            ejected,
            e.ejections.to_string(),
            e.connect_failures.to_string(),
            e.in_flight.to_string(),
            e.idle_connections.to_string(),
        ]);
    }
    t.render("  ", out);
}

fn yes_no(b: bool) -> String {
    match b {
        true => "yes".into(),
        false => "no".into(),
    }
}

/// `12.5s` under a minute, else the two largest units: `3m 20s`, `2h 5m`, `4d 1h`.
fn uptime(seconds: f64) -> String {
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    let s = seconds as u64;
    let units = [
        (s / 86_400, "d"),
        (s / 3600 % 24, "h"),
        (s / 60 % 60, "m"),
        (s % 60, "s"),
    ];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    units[first..]
        .iter()
        .take(2)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::uptime;

    #[test]
    fn uptime_shows_the_two_largest_units() {
        assert_eq!(uptime(12.54), "12.5s");
        assert_eq!(uptime(200.0), "3m 20s");
        assert_eq!(uptime(7_530.0), "2h 5m");
        assert_eq!(uptime(349_200.0), "4d 1h");
    }
}
