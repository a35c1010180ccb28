//! The admin API's replies (`GET /status` and the drain/resume answers), as the proxy writes
//! them and `sluice ctl` reads them: one set of serde types for both sides.
//!
//! They live here because both crates already depend on `sluice-config` and it knows nothing
//! of the proxy's internals: `sluice ctl` reads them without reaching into the engine, and the
//! proxy fills them from its clusters. Reading is lenient the way a newer server needs: fields
//! a later proxy adds are ignored, and fields an older one lacks read as empty or zero.
//! Fields are declared in the order the JSON carries them (alphabetical where the proxy used
//! to build objects with `json!`), so the bytes on the wire do not change.

use serde::{Deserialize, Serialize};

/// `GET /status`: the process, its listeners, its acceptor and every cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The proxy's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The proxy's process id.
    #[serde(default)]
    pub pid: u32,
    /// `starting`, `ready`, `draining` (an operator's `POST /drain`: `/ready` fails) or
    /// `stopping`; absent from older proxies.
    #[serde(default)]
    pub node: String,
    /// Seconds since the proxy started.
    pub uptime_seconds: f64,
    /// The client listeners.
    #[serde(default)]
    pub listeners: Vec<ListenerStatus>,
    /// The acceptor, when reverse clusters are configured (`null` otherwise).
    #[serde(default)]
    pub acceptor: Option<AcceptorStatus>,
    /// Every cluster, by name.
    #[serde(default)]
    pub clusters: Vec<ClusterStatus>,
    /// Every `[[relay]]` (absent when there is none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relays: Vec<RelayStatus>,
    /// Every route's response cache (absent when no route has one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheStatus>,
    /// A standalone acceptor's consumers (the Sluice processes it lends sessions to; absent
    /// elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<ConsumerStatus>,
}

/// A consumer of a standalone acceptor: one Sluice process connected to its handoff socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerStatus {
    /// Its id (in connection order).
    pub id: u64,
    /// Per slice: its open credit and the sessions lent to it.
    pub slices: Vec<ConsumerSliceStatus>,
}

/// What one consumer holds of one slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerSliceStatus {
    /// The reverse cluster.
    pub cluster: String,
    /// The slice.
    pub slice: String,
    /// Sessions it may still be lent (what it asked for and did not get yet).
    pub credit: u32,
    /// Sessions lent to it now.
    pub lent: u64,
}

/// A route's response cache: what it holds now, and its lookups since the process started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheStatus {
    /// The route.
    pub route: String,
    /// Keys held in memory (each with its variants).
    pub entries: u64,
    /// Bytes held in memory, as weighed against `memory`.
    pub stored_bytes: u64,
    /// Its `memory`.
    pub memory: u64,
    /// Lookups answered from the store.
    pub hits: u64,
    /// Lookups that went upstream.
    pub misses: u64,
    /// Stale answers served (`stale-if-error`, `stale-while-revalidate`).
    pub stale: u64,
    /// Its disk tier (absent when it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<CacheDiskStatus>,
}

/// A cache's disk tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheDiskStatus {
    /// Its directory.
    pub path: String,
    /// Keys with files.
    pub entries: u64,
    /// The files' bytes.
    pub stored_bytes: u64,
    /// Its `max_size`.
    pub max_size: u64,
}

/// A `[[relay]]` and its counters since it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelayStatus {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections being relayed now.
    pub active: u64,
    /// The bound address.
    pub addr: String,
    /// Bytes from the next hop to clients.
    pub bytes_down: u64,
    /// Bytes from clients to the next hop.
    pub bytes_up: u64,
    /// The mean time to connect to the next hop, in milliseconds.
    pub connect_ms_avg: f64,
    /// Connections made to the next hop.
    pub connects: u64,
    /// Connections to the next hop started on a client's SYN.
    pub early_connects: u64,
    /// Its configured name.
    pub name: String,
    /// Pooled connections found closed before use.
    pub pool_dead: u64,
    /// Pooled connections ready now.
    pub pool_idle: u64,
    /// Clients that found the pool empty.
    pub pool_misses: u64,
    /// Connections refused (limit, tunnel authentication, target not allowed).
    pub refused: u64,
    /// A next hop by name with `resolve`: its addresses now and its lookups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop: Option<NameStatus>,
    /// Whether the kernel splices its pipes (`sockmap` configured and its program loaded).
    #[serde(default)]
    pub sockmap: bool,
    /// Connections whose bytes the kernel forwarded (`sockmap`).
    #[serde(default)]
    pub kernel_spliced: u64,
    /// Of `bytes_up` and `bytes_down`, those the kernel forwarded without user space.
    #[serde(default)]
    pub bytes_kernel: u64,
}

/// A client listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListenerStatus {
    /// Its configured name.
    pub name: String,
    /// The bound address.
    pub addr: String,
    /// Whether it terminates TLS.
    #[serde(default)]
    pub tls: bool,
    /// Its certificates, in the configured order (absent without TLS or from older proxies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<CertificateStatus>,
}

/// A certificate a TLS listener serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertificateStatus {
    /// The names it serves.
    pub names: Vec<String>,
    /// When it expires, in seconds since the Unix epoch (`null`: unreadable).
    pub not_after: Option<i64>,
    /// Days until then (negative: expired), at the time of the answer.
    pub days_left: Option<f64>,
}

/// The acceptor's bound TCP address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptorStatus {
    /// The bound address.
    pub addr: String,
}

/// One cluster. A reverse one has `sessions`, `slices` and `instances`; a static one
/// `health_check` and `endpoints`. The kind stays a string, so a `sluice ctl` shows clusters
/// of kinds it does not know with whatever lists they carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// A static cluster's endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<EndpointStatus>>,
    /// Whether a static cluster runs active health checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<bool>,
    /// A reverse cluster's instances (drained ones stay listed until resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceStatus>>,
    /// `reverse` or `static`.
    pub kind: String,
    /// The cluster's name.
    pub name: String,
    /// A static cluster's endpoint names that follow DNS (`resolve`), with their addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<NameStatus>>,
    /// A reverse cluster's registered sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    /// A reverse cluster's slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<Vec<SliceStatus>>,
}

impl ClusterStatus {
    /// A reverse cluster's status.
    pub fn reverse(
        name: &str,
        sessions: u64,
        slices: Vec<SliceStatus>,
        instances: Vec<InstanceStatus>,
    ) -> Self {
        Self {
            endpoints: None,
            health_check: None,
            instances: Some(instances),
            kind: "reverse".to_owned(),
            name: name.to_owned(),
            names: None,
            sessions: Some(sessions),
            slices: Some(slices),
        }
    }

    /// A static cluster's status.
    pub fn static_cluster(name: &str, health_check: bool, endpoints: Vec<EndpointStatus>) -> Self {
        Self {
            endpoints: Some(endpoints),
            health_check: Some(health_check),
            instances: None,
            kind: "static".to_owned(),
            name: name.to_owned(),
            names: None,
            sessions: None,
            slices: None,
        }
    }
}

/// A reverse cluster's slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceStatus {
    /// How many more sessions this node asks its services for (on their control links, as
    /// demand): the requests waiting here; 0 when what it holds serves what comes.
    #[serde(default)]
    pub asks_for: u64,
    /// Idle sessions.
    pub idle: u64,
    /// Requests in flight on its sessions; absent from older proxies.
    #[serde(default)]
    pub in_flight: u64,
    /// The slice's name.
    pub name: String,
    /// How long the oldest queued request has waited, in milliseconds (0: none waits).
    #[serde(default)]
    pub oldest_wait_ms: u64,
    /// Requests waiting in the admission queue.
    pub queued: u64,
    /// Sessions registered in the slice, idle or busy; absent from older proxies.
    #[serde(default)]
    pub sessions: u64,
    /// Why it asks for what it asks for, in a few words.
    #[serde(default)]
    pub why: String,
}

/// A reverse cluster's instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// The capacity it declared on its control link (many nodes), across every node; without
    /// a link (one acceptor), what its sessions' registrations declared (`Sluice-Capacity`);
    /// absent when neither did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<u64>,
    /// Whether it is draining (or drained and held until resumed).
    pub draining: bool,
    /// The instance id.
    pub id: String,
    /// Sessions it asked to retire here that close when their requests end.
    #[serde(default)]
    pub retiring: u64,
    /// Its registered sessions.
    pub sessions: u64,
    /// Sessions a WebSocket (an HTTP Upgrade) took over; absent from older proxies.
    #[serde(default)]
    pub upgraded: u64,
}

/// An endpoint name that follows DNS: what it resolved to last, and its lookups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameStatus {
    /// `host:port`, as configured.
    pub name: String,
    /// Its addresses now (the last successful lookup's); empty if it never resolved.
    #[serde(default)]
    pub addrs: Vec<String>,
    /// Failed lookups in a row (0: the last one succeeded).
    #[serde(default)]
    pub failures: u64,
    /// Why the last lookup failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Milliseconds until the next lookup.
    #[serde(default)]
    pub next_in_ms: u64,
}

/// A static cluster's endpoint: health, ejection and load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointStatus {
    /// The endpoint's address.
    pub addr: String,
    /// Failed connects in a row.
    #[serde(default)]
    pub connect_failures: u64,
    /// Milliseconds left of its ejection (0: not ejected).
    #[serde(default)]
    pub ejected_ms: u64,
    /// Ejections so far.
    #[serde(default)]
    pub ejections: u64,
    /// The active check's verdict; always true without checks.
    #[serde(default)]
    pub healthy: bool,
    /// Idle pooled connections.
    #[serde(default)]
    pub idle_connections: u64,
    /// Requests in flight.
    #[serde(default)]
    pub in_flight: u64,
}

/// The answer to draining or resuming an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceDrain {
    /// The cluster's name.
    pub cluster: String,
    /// `true` after a drain, `false` after a resume.
    pub draining: bool,
    /// The instance id.
    pub instance: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes the proxy wrote when it built these objects with `json!` (keys sorted), so
    /// dashboards and scripts that read them see no change.
    #[test]
    fn clusters_serialize_as_before() {
        let reverse = ClusterStatus::reverse(
            "api",
            2,
            vec![SliceStatus {
                asks_for: 0,
                idle: 1,
                in_flight: 1,
                name: "default".to_owned(),
                oldest_wait_ms: 0,
                queued: 0,
                sessions: 2,
                why: String::new(),
            }],
            vec![InstanceStatus {
                declared: None,
                draining: false,
                id: "i-1".to_owned(),
                retiring: 0,
                sessions: 2,
                upgraded: 0,
            }],
        );
        let reverse = serde_json::to_string(&reverse).expect("serialize");
        assert_eq!(
            reverse,
            r#"{"instances":[{"draining":false,"id":"i-1","retiring":0,"sessions":2,"upgraded":0}],"kind":"reverse","name":"api","sessions":2,"slices":[{"asks_for":0,"idle":1,"in_flight":1,"name":"default","oldest_wait_ms":0,"queued":0,"sessions":2,"why":""}]}"#
        );
        let endpoint = EndpointStatus {
            addr: "127.0.0.1:9001".to_owned(),
            connect_failures: 0,
            ejected_ms: 0,
            ejections: 0,
            healthy: true,
            idle_connections: 1,
            in_flight: 0,
        };
        let fixed = ClusterStatus::static_cluster("legacy", false, vec![endpoint]);
        let fixed = serde_json::to_string(&fixed).expect("serialize");
        assert_eq!(
            fixed,
            r#"{"endpoints":[{"addr":"127.0.0.1:9001","connect_failures":0,"ejected_ms":0,"ejections":0,"healthy":true,"idle_connections":1,"in_flight":0}],"health_check":false,"kind":"static","name":"legacy"}"#
        );
    }

    /// `sluice ctl` reads an older proxy's reply (no `pid`, `upgraded`, `oldest_wait_ms`, no
    /// lists) and a newer one's (fields and kinds it does not know).
    #[test]
    fn replies_from_other_versions_parse() {
        let older = r#"{"version":"0.1.0","uptime_seconds":1.5,"acceptor":null,
            "clusters":[{"name":"api","kind":"reverse","sessions":1,
            "slices":[{"name":"default","idle":1,"queued":0}],
            "instances":[{"id":"i-1","sessions":1,"draining":false}]}]}"#;
        let status: Status = serde_json::from_str(older).expect("an older reply");
        assert_eq!(status.clusters[0].sessions, Some(1));
        assert!(status.listeners.is_empty());
        let newer = r#"{"version":"9.0.0","pid":7,"uptime_seconds":1.0,"listeners":[],
            "clusters":[{"name":"q","kind":"queue","depth":3}],"later":true}"#;
        let status: Status = serde_json::from_str(newer).expect("a newer reply");
        assert_eq!(status.clusters[0].kind, "queue");
        assert_eq!(status.clusters[0].slices, None);
    }
}
