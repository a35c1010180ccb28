//! The integration tests of `sluice-sdk`, one module per area, in one test binary (a binary
//! each linked the SDK and the proxy again). `logs` keeps a binary of its own: it captures
//! log lines with a subscriber per test and counts them.

mod gated;
mod proxy;
mod support;

mod drained;
mod grpc;
mod http2;
mod nodes;
mod refusals;
mod sessions;
mod transports;
mod vectors;
mod with_nodes;
mod with_proxy;
