//! HTTP helpers shared by the proxy paths: hop-by-hop stripping and forwarding headers.

pub mod headers;
