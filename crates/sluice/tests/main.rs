//! The integration tests of `sluice`, one module per area, in one test binary: a binary per
//! file compiled and linked the crate's generic code again (44 of them took 3 min 40 s of a
//! clean test build on two cores; this one takes 27 s).
//! `logs` and `access_log` keep binaries of their own: they install a global log
//! subscriber and count lines that other tests would write too.

mod reverse_support;
mod support;

mod admin;
mod basic_auth;
mod body_limit;
mod cache;
mod cache_disk;
mod compression;
mod connection_limits;
mod control_links;
mod cors;
mod dns_follow;
mod fast_path;
mod features;
mod grpc;
mod h1_differential;
mod h1_responses;
mod h2_own;
mod handoff;
mod hot_restart;
mod http3;
mod idle;
mod metrics;
mod normalization;
mod protocol_vectors;
mod protocols;
mod rate_limit;
mod relay;
mod request_id;
mod retries;
mod reverse_buffers;
mod reverse_differential;
mod reverse_failures;
mod reverse_fast_path;
mod reverse_h2;
mod reverse_handshake;
mod reverse_load;
mod reverse_protocol;
mod reverse_slices;
mod reverse_tls;
mod rewrite;
mod route_features;
mod routing;
mod stalled_clients;
mod strict_http1;
mod tls;
mod trace_export;
mod transport_neutral;
mod upgrade;
mod upstream_failures;
mod upstream_lifecycle;
mod upstream_pool;
