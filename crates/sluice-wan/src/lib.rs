//! The project's WAN test bed (this kernel has no netem): network namespaces client, relay1,
//! relay2 and server, linked by a user-space forwarder over TUN devices that adds delay, a rate
//! limit and random loss per direction; and the programs run inside them (a sized-response
//! server, a TTFB-measuring client, a relay) by the `sluice-wan` binary.
//!
//! # Layout
//! * [`bed`] — namespaces, links, routes; torn down on drop.
//! * [`link`] — the forwarder threads of one link.
//! * `tun` — the TUN device (the crate's only `unsafe`: one ioctl).
//! * [`programs`] — server, client and relay, run inside namespaces.

pub mod bed;
pub mod link;
pub mod programs;
mod tun;
