//! `max_connections_per_client`: how many connections each client address holds open, and
//! the slot a connection holds while it is open.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use sluice_net::addr::client_key;

/// A listener's open connections by client address (an IPv6 client's /64); an address is
/// forgotten when its last connection closes, so the map holds no more than the connections.
#[derive(Debug)]
pub(super) struct PerClient {
    limit: u32,
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// One open connection of a client; gives its place back when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    of: Arc<PerClient>,
    key: IpAddr,
}

impl PerClient {
    pub(super) fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for another connection of `client`, unless it holds `limit` already.
    pub(super) fn take(self: &Arc<Self>, client: IpAddr) -> Option<Slot> {
        let key = client_key(client);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let held = open.entry(key).or_insert(0);
        if *held >= self.limit {
            return None;
        }
        *held += 1;
        Some(Slot {
            of: Arc::clone(self),
            key,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.of.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = open.get_mut(&self.key) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_the_limit_and_closing_gives_a_place_back() {
        let per = PerClient::new(2);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let a = per.take(ip("192.0.2.1"));
        let b = per.take(ip("192.0.2.1"));
        assert!(a.is_some() && b.is_some());
        assert!(per.take(ip("192.0.2.1")).is_none());
        assert!(per.take(ip("192.0.2.2")).is_some(), "another client");
        drop(a);
        assert!(per.take(ip("192.0.2.1")).is_some());
        let v6 = [per.take(ip("2001:db8::1")), per.take(ip("2001:db8::2"))];
        assert!(v6.iter().all(Option::is_some));
        assert!(per.take(ip("2001:db8::3")).is_none(), "one /64");
    }

    #[test]
    fn an_address_whose_connections_all_closed_is_forgotten() {
        let per = PerClient::new(1);
        let slot = per.take(IpAddr::from([192, 0, 2, 1]));
        drop(slot);
        assert!(per.open.lock().map(|m| m.is_empty()).unwrap_or(false));
    }
}
