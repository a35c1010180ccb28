//! Names that follow DNS, with hickory-resolver: [`Dns`], where and how names are looked up
//! (`[dns]`); [`Resolve`], how long an answer holds (a name's TTL within bounds) and how a
//! failed lookup backs off; [`Followed`], one `host:port` whose addresses are looked up again as
//! its TTL says, for a caller that only needs "the addresses now" (a relay's next hop). A static
//! cluster follows its names with its own bookkeeping (which endpoints each name brought in) on
//! these same parts.
//!
//! Every lookup builds its resolver afresh: it reads `/etc/resolv.conf` (or takes `[dns]`'s
//! nameservers) and `/etc/hosts` again, as glibc does, and it has no cache, so an answer is
//! never older than its record's TTL says (the follower itself waits out the TTL before it asks
//! again). A handful of lookups per name and TTL cost nothing next to a stale address set.

mod followed;
mod lookup;

pub use followed::{Followed, FollowedStatus, Looked};
pub use lookup::{Dns, HostPort, LookupError, Resolve, Resolved};
