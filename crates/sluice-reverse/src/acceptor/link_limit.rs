//! Control links open at once, in all and per source address (an IPv6 /64 counted as one):
//! a link reserves no session, so without a bound anyone who may open one could hold
//! thousands, each reported to every second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use sluice_net::addr::client_key;
use sluice_session::Rejection;

use crate::instance::locked;

/// The open links, against `max_control_links` and `max_control_links_per_address`.
#[derive(Debug)]
pub(super) struct LinkLimits {
    total: Option<usize>,
    per_address: Option<usize>,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// One link's place within the limits; dropping it frees the place.
#[derive(Debug)]
pub(super) struct LinkPlace {
    limits: Arc<LinkLimits>,
    key: Option<IpAddr>,
}

impl LinkLimits {
    /// `None` allows any number.
    pub(super) fn new(total: Option<usize>, per_address: Option<usize>) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_address,
            open: Mutex::default(),
        })
    }

    /// A place for one more link from `ip` (`None`: a UNIX socket, counted in the total
    /// only), or 429.
    pub(super) fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<LinkPlace, Rejection> {
        let key = ip.map(client_key);
        let mut open = locked(&self.open);
        if self.total.is_some_and(|max| open.total >= max) {
            return Err(Rejection::limited("control links on this node"));
        }
        if let Some(key) = key {
            let here = open.by_address.entry(key).or_default();
            if self.per_address.is_some_and(|max| *here >= max) {
                return Err(Rejection::limited("control links from this address"));
            }
            *here += 1;
        }
        open.total += 1;
        Ok(LinkPlace {
            limits: Arc::clone(self),
            key,
        })
    }
}

impl Drop for LinkPlace {
    fn drop(&mut self) {
        let mut open = locked(&self.limits.open);
        open.total -= 1;
        let Some(key) = self.key else { return };
        if let Some(n) = open.by_address.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                open.by_address.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("an address"))
    }

    #[test]
    fn links_are_bounded_per_address_and_in_all_and_places_come_back() {
        let limits = LinkLimits::new(Some(3), Some(2));
        let a = limits.admit(ip("2001:db8::1")).expect("admitted");
        let _b = limits.admit(ip("2001:db8::2")).expect("admitted");
        let refused = limits.admit(ip("2001:db8::ffff:3")).expect_err("refused");
        assert_eq!(refused.status, 429, "a third from the same /64");
        let _c = limits.admit(ip("192.0.2.1")).expect("admitted");
        let refused = limits.admit(ip("192.0.2.2")).expect_err("refused");
        assert_eq!(
            (refused.status, refused.reason.contains("node")),
            (429, true)
        );
        drop(a);
        assert!(
            limits.admit(ip("2001:db8::3")).is_ok(),
            "a closed link frees its place"
        );
        assert!(locked(&limits.open).by_address.len() <= 2);
    }
}
