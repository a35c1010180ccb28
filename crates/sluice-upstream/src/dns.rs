//! Looking up the endpoint names of static clusters with `resolve`: the resolver lives in
//! `sluice-net` (`sluice_net::dns`), which a relay's `to` by name uses too.

pub use sluice_net::dns::{Dns, LookupError, Resolved};
