//! HTTP rules shared by the proxy paths: request checks, hop-by-hop stripping, forwarding headers.

pub mod checks;
pub mod headers;
