//! Names that follow DNS: the resolver's settings (`[dns]`), a static cluster's or a relay's
//! `resolve`, and a name to follow. The types are `sluice-net`'s, which looks the names up: the
//! configuration fills them, the runtime takes them as they are.

pub use sluice_net::dns::{Dns, HostPort, Resolve};
