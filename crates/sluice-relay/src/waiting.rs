//! A tunnel end's connections still waiting for their token, under `max_unauthenticated`.
//!
//! Before, the bound was a semaphore taken before `accept`: once silent peers held every place,
//! honest clients waited in the kernel's accept queue until those timed out
//! (`preamble_timeout`). Now every connection is accepted, and when the places are all taken a
//! newcomer takes the place of one still waiting for its token — the oldest of the address
//! (an IPv4 address, or an IPv6 /64) holding the most — which is closed. An honest peer sends
//! its token as soon as it connects, so it is authenticated long before enough newcomers come
//! to shed it, and a flood from a few addresses sheds itself first. Connections whose token was
//! checked keep their place, and cannot be shed, until `max_connections` has a slot for them:
//! when every place is held so, accepting waits as before.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, Notify};

/// The places of connections waiting for their token.
#[derive(Debug)]
pub(crate) struct Unauthenticated {
    limit: usize,
    state: Mutex<State>,
    /// Told when a place frees.
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Those still waiting for their token, by id: their address and how to shed them.
    waiting: HashMap<u64, (IpAddr, oneshot::Sender<()>)>,
    /// Their ids by address, oldest first.
    by_client: HashMap<IpAddr, VecDeque<u64>>,
    /// Places held by connections whose token was checked (not to be shed).
    held: usize,
}

impl State {
    fn taken(&self) -> usize {
        self.waiting.len() + self.held
    }

    /// Removes a waiting connection's entry; its sender, if it was still waiting.
    fn remove(&mut self, id: u64) -> Option<oneshot::Sender<()>> {
        let (client, shed) = self.waiting.remove(&id)?;
        if let Some(ids) = self.by_client.get_mut(&client) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_client.remove(&client);
            }
        }
        Some(shed)
    }

    /// The connection to shed for a newcomer: the oldest of the address holding the most
    /// (ties: the address whose oldest is oldest).
    fn victim(&self) -> Option<u64> {
        let most = self
            .by_client
            .values()
            .filter_map(|ids| Some((ids.len(), std::cmp::Reverse(*ids.front()?))))
            .max()?;
        Some(most.1 .0)
    }
}

/// A connection's place; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    set: Arc<Unauthenticated>,
    id: u64,
    /// Resolves when a newcomer took the place (while it waits for its token).
    shed: Option<oneshot::Receiver<()>>,
    authenticated: bool,
}

impl Unauthenticated {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            state: Mutex::default(),
            freed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change is whole under the lock: a poisoned one is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `client` (its [`client_key`](sluice_net::addr::client_key)
    /// is what counts): at once while one is free, else by shedding a connection still waiting
    /// for its token; waits only while every place is held by an authenticated one.
    pub(crate) async fn admit(self: &Arc<Self>, client: IpAddr) -> Place {
        let client = sluice_net::addr::client_key(client);
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            // Registered before the places are counted, so a place freed meanwhile is not missed.
            freed.as_mut().enable();
            if let Some(place) = self.try_admit(client) {
                return place;
            }
            freed.await;
        }
    }

    fn try_admit(self: &Arc<Self>, client: IpAddr) -> Option<Place> {
        let mut state = self.lock();
        if state.taken() >= self.limit {
            let victim = state.victim()?;
            if let Some(shed) = state.remove(victim) {
                // Its connection closes when it sees this; its place is the newcomer's now.
                let _ = shed.send(());
            }
        }
        let id = state.next;
        state.next += 1;
        let (tx, rx) = oneshot::channel();
        state.waiting.insert(id, (client, tx));
        state.by_client.entry(client).or_default().push_back(id);
        Some(Place {
            set: Arc::clone(self),
            id,
            shed: Some(rx),
            authenticated: false,
        })
    }

    /// Places taken now (for tests).
    #[cfg(test)]
    fn taken(&self) -> usize {
        self.lock().taken()
    }
}

impl Place {
    /// Resolves when a newcomer took this place: the connection is to close. Never, once it is
    /// authenticated.
    pub(crate) async fn shed(&mut self) {
        if let Some(rx) = self.shed.as_mut() {
            let shed = rx.await.is_ok();
            // Resolved once: a place is shed once (an error: it was authenticated meanwhile).
            self.shed = None;
            if shed {
                return;
            }
        }
        std::future::pending().await
    }

    /// Its token was checked: it keeps its place, and cannot be shed, until it has a
    /// `max_connections` slot (and this is dropped).
    pub(crate) fn authenticated(&mut self) {
        let mut state = self.set.lock();
        if state.remove(self.id).is_some() {
            state.held += 1;
            self.authenticated = true;
        }
        self.shed = None;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.set.lock();
        if self.authenticated {
            state.held -= 1;
        } else {
            state.remove(self.id);
        }
        drop(state);
        self.set.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[tokio::test]
    async fn a_newcomer_sheds_the_oldest_of_the_address_holding_the_most() {
        let set = Unauthenticated::new(3);
        let mut honest = set.admit(ip("10.0.0.1")).await;
        let mut flood1 = set.admit(ip("10.0.0.2")).await;
        let _flood2 = set.admit(ip("10.0.0.2")).await;
        // Full: the flood's address holds two, so its oldest goes.
        let _next = set.admit(ip("10.0.0.3")).await;
        tokio::time::timeout(Duration::from_secs(5), flood1.shed())
            .await
            .expect("the flood's oldest was shed");
        assert_eq!(set.taken(), 3);
        // Ties (one each): the oldest goes, unless it was authenticated.
        honest.authenticated();
        let _more = set.admit(ip("10.0.0.4")).await;
        assert_eq!(set.taken(), 3);
        let shed = tokio::time::timeout(Duration::from_millis(1), honest.shed()).await;
        assert!(shed.is_err(), "an authenticated connection is never shed");
    }

    #[tokio::test]
    async fn a_newcomer_waits_while_every_place_is_authenticated() {
        let set = Unauthenticated::new(1);
        let mut only = set.admit(ip("10.0.0.1")).await;
        only.authenticated();
        let waiting = {
            let set = Arc::clone(&set);
            tokio::spawn(async move { set.admit(ip("10.0.0.2")).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(only);
        let place = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted once the place freed")
            .expect("the task");
        drop(place);
        assert_eq!(set.taken(), 0);
    }

    #[tokio::test]
    async fn an_ipv6_slash_64_counts_as_one_address() {
        let set = Unauthenticated::new(2);
        let mut a = set.admit(ip("2001:db8::1")).await;
        let _b = set.admit(ip("2001:db8::2")).await;
        let _c = set.admit(ip("2001:db9::1")).await;
        tokio::time::timeout(Duration::from_secs(5), a.shed())
            .await
            .expect("the /64 holding two was shed first");
    }
}
