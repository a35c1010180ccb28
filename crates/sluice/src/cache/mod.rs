//! A route's `cache`: a shared HTTP cache (RFC 9111) in memory and on disk, a registered
//! route feature ([`REGISTRATION`]). Its rules are `sluice_core::cache`'s; this is the store
//! and the hooks that drive them.
//!
//! * Lookup ([`RouteFeature::admit`]): a fresh stored answer for the request's key (scheme,
//!   host with port, path and query) and variant (`Vary`) answers it (`Cache-Status: Sluice;
//!   hit`), `304` when the client's own validators match; a stale one, or none, lets it go
//!   upstream; a stale one within its `stale-while-revalidate` (RFC 5861) answers it at once
//!   (`Cache-Status: Sluice; hit; detail=stale-while-revalidate`) and the request goes on
//!   upstream in the background to refresh it, one such request per key at a time.
//! * Request coalescing: while one request fetches a key that has nothing stored, the others
//!   for it wait (at most `lock_timeout`) and are answered from what it stored; if it stored
//!   nothing they go upstream themselves.
//! * On the way up and back ([`RouteFeature::keep`]): a stale answer with validators is
//!   revalidated (`If-None-Match`, `If-Modified-Since`), a `304` refreshes it and the client
//!   gets the stored answer; a storable answer is kept as its body streams to the client (up
//!   to `max_object`) and stored once it ended whole; an unsafe method's success invalidates
//!   the key.
//!
//! The store is a `moka` cache bounded in bytes (each key's variants weighed together):
//! TinyLFU admission with LRU eviction, concurrent without a global lock; it is already in
//! the build (hickory's resolver cache), so it adds no dependency. With a `disk` tier
//! ([`disk`]), answers are stored in files as they stream, and the memory tier keeps the
//! ones read back from disk: a lookup that misses memory reads the file (on tokio's blocking
//! pool) before it answers or goes upstream.

mod disk;
mod keep;
mod metrics;

pub(crate) use metrics::register;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use tokio::sync::watch;

use sluice_core::cache::{self as rules, Stored, Use};
use sluice_core::fields::{DynFields, Fields};
use sluice_core::route_feature::{
    downcast, Answer, Asked, Hooks, Keep, Registration, RouteFeature, Verdict,
};

/// `Cache-Status` (RFC 9211).
pub(crate) static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// `cache`: asked after every other feature let the request through, so nothing stored is
/// handed to a request a limit or a password would refuse.
pub(crate) const REGISTRATION: Registration = Registration {
    key: "cache",
    cargo_feature: None,
    built: true,
    wanted: |route| route.cache.is_some(),
    build: |route, kept| {
        let config = route.cache.as_ref()?;
        let same = kept.filter(|k| {
            downcast::<Cache>(k).is_some_and(|c| c.config == *config && c.route == route.name)
        });
        match same {
            Some(kept) => Some(Arc::clone(kept)),
            None => Some(Arc::new(Cache::new(&route.name, config)) as Arc<dyn RouteFeature>),
        }
    },
};

/// A key's stored variants, the newest first.
type Variants = Arc<Vec<Arc<Stored>>>;

/// One route's cache (shared with what its requests keep).
#[derive(Debug)]
pub(crate) struct Cache(Arc<Store>);

impl std::ops::Deref for Cache {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.0
    }
}

impl Cache {
    pub(crate) fn new(route: &str, config: &sluice_config::Cache) -> Self {
        Self(Arc::new(Store::new(route, config)))
    }

    /// The store, for a request's [`Keep`].
    fn handle(&self) -> Arc<Store> {
        Arc::clone(&self.0)
    }
}

/// One route's store and the fetches under way.
pub(crate) struct Store {
    config: sluice_config::Cache,
    /// The route's name, which its counters are labelled by.
    route: String,
    counters: metrics::Counters,
    store: moka::sync::Cache<String, Variants>,
    /// The disk tier, if the cache has one (and its directory could be opened).
    disk: Option<disk::Disk>,
    /// The keys being fetched with nothing stored, each with the fetch's end to wait for.
    filling: Mutex<HashMap<String, Arc<Fill>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .field("entries", &self.store.entry_count())
            .finish_non_exhaustive()
    }
}

/// A fetch other requests for its key wait for.
#[derive(Debug)]
struct Fill {
    done: watch::Sender<bool>,
    started: Instant,
    /// Whether the request that started it has taken it up (its [`Keep`]).
    claimed: std::sync::atomic::AtomicBool,
}

impl Store {
    fn new(route: &str, config: &sluice_config::Cache) -> Self {
        let counters = metrics::Counters::new(route);
        let evictions = counters.evictions.clone();
        let store = moka::sync::Cache::builder()
            .max_capacity(config.memory)
            .weigher(|_: &String, v: &Variants| weight(v))
            .eviction_listener(move |_, _, cause| {
                if cause.was_evicted() {
                    evictions.inc();
                }
            })
            .build();
        Self {
            config: config.clone(),
            route: route.to_owned(),
            disk: open_disk(route, config, &counters),
            counters,
            store,
            filling: Mutex::default(),
        }
    }

    /// Brings the store's size (and its evictions) up to date and shows it. Called after a
    /// change, which follows an upstream fetch: its cost is small beside the fetch's.
    fn settle(&self) {
        self.store.run_pending_tasks();
        let bytes = i64::try_from(self.store.weighted_size()).unwrap_or(i64::MAX);
        self.counters.bytes.set(bytes);
    }

    /// What it holds and has counted, for `/status`.
    fn status(&self, route: &str) -> sluice_config::admin::CacheStatus {
        self.settle();
        sluice_config::admin::CacheStatus {
            route: route.to_owned(),
            entries: self.store.entry_count(),
            stored_bytes: self.store.weighted_size(),
            memory: self.config.memory,
            hits: self.counters.hits.get(),
            misses: self.counters.misses.get(),
            stale: self.counters.stale.get(),
            disk: self.disk.as_ref().map(disk::Disk::status),
        }
    }

    /// The stored variant of `key` for a request with these fields.
    fn lookup(&self, key: &str, fields: &(impl Fields + ?Sized)) -> Option<Arc<Stored>> {
        let variants = self.store.get(key)?;
        variants.iter().find(|s| s.variant.matches(fields)).cloned()
    }

    /// Stores `stored` for `key` in both tiers, over the variant it replaces.
    fn put(&self, key: &str, stored: Stored) {
        if let Some(disk) = &self.disk {
            disk.put(key, &stored);
        }
        self.remember(key, Arc::new(stored));
    }

    /// Ends a file written as an answer streamed and stores it under `key` (disk tier).
    fn commit(&self, key: &str, variant: rules::Variant, writer: disk::Writer) {
        if let Some(disk) = &self.disk {
            disk.commit(key, variant, writer);
        }
    }

    /// A file for the answer `stored` to `key`, its body to follow, when the cache has a disk
    /// tier (`Err`: it has one, but no file could be had).
    fn writer(&self, key: &str, stored: &Stored) -> Result<Option<disk::Writer>, ()> {
        match &self.disk {
            Some(disk) => disk.writer(key, stored).map(Some).ok_or(()),
            None => Ok(None),
        }
    }

    /// The stored variant of `key` for a request with these fields, in memory or on disk
    /// (read back, and kept in memory).
    async fn find(&self, key: &str, fields: &(impl Fields + ?Sized)) -> Option<Arc<Stored>> {
        if let Some(stored) = self.lookup(key, fields) {
            return Some(stored);
        }
        let disk = self.disk.as_ref()?;
        let file = disk.find(key, fields)?;
        let stored = Arc::new(disk.read(key, file).await?);
        self.remember(key, Arc::clone(&stored));
        Some(stored)
    }

    /// Keeps `stored` for `key` in memory, over the variant it replaces.
    fn remember(&self, key: &str, stored: Arc<Stored>) {
        let mut variants = vec![Arc::clone(&stored)];
        if let Some(old) = self.store.get(key) {
            let others = old.iter().filter(|s| s.variant != stored.variant);
            variants.extend(others.take(15).cloned());
        }
        self.store.insert(key.to_owned(), Arc::new(variants));
        self.settle();
    }

    fn invalidate(&self, key: &str) {
        self.store.invalidate(key);
        if let Some(disk) = &self.disk {
            disk.remove(key);
        }
        self.settle();
    }

    /// Removes what `what` names; how many keys (each with its variants) it removed.
    fn purge(&self, what: &Purge) -> u64 {
        let removed = |key: &str| {
            let in_memory = self.store.remove(key).is_some();
            let on_disk = self.disk.as_ref().is_some_and(|d| d.remove(key));
            in_memory || on_disk
        };
        let purged = match what {
            Purge::Key(key) => u64::from(removed(key)),
            Purge::Prefix(prefix) => {
                let mut keys: Vec<Arc<String>> = self
                    .store
                    .iter()
                    .filter(|(k, _)| k.starts_with(prefix.as_str()))
                    .map(|(k, _)| k)
                    .collect();
                if let Some(disk) = &self.disk {
                    keys.extend(disk.keys_with(prefix));
                }
                keys.sort_unstable();
                keys.dedup();
                keys.iter().filter(|k| removed(k)).count() as u64
            }
        };
        self.settle();
        purged
    }

    fn filling(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Fill>>> {
        // A map of plain values: a poisoned lock is still consistent.
        self.filling.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fetch under way for `key`, or `None` after starting one (this request's).
    fn join_or_start(&self, key: &str) -> Option<Arc<Fill>> {
        let mut filling = self.filling();
        let stale = self.config.lock_timeout.saturating_mul(2);
        match filling.get(key) {
            Some(fill) if fill.started.elapsed() < stale => Some(Arc::clone(fill)),
            _ => {
                let fill = Fill {
                    done: watch::Sender::new(false),
                    started: Instant::now(),
                    claimed: false.into(),
                };
                filling.insert(key.to_owned(), Arc::new(fill));
                None
            }
        }
    }

    /// The fetch this request started for `key`, if it did and has not taken it up.
    fn claim(&self, key: &str) -> Option<Filled> {
        let fill = self.filling().get(key).cloned()?;
        let taken = fill.claimed.swap(true, std::sync::atomic::Ordering::AcqRel);
        (!taken).then(|| Filled {
            key: key.to_owned(),
            fill,
        })
    }

    /// Ends the fetch `filled` of its key: the waiting requests look again.
    fn end_fill(&self, filled: &Filled) {
        let mut filling = self.filling();
        if filling
            .get(&filled.key)
            .is_some_and(|f| Arc::ptr_eq(f, &filled.fill))
        {
            filling.remove(&filled.key);
        }
        drop(filling);
        filled.fill.done.send_replace(true);
    }

    /// Waits for `fill`, then answers from what it stored, or lets the request go.
    async fn wait(&self, fill: Arc<Fill>, key: String, fields: &dyn DynFields) -> Option<Answer> {
        let mut done = fill.done.subscribe();
        let waited = tokio::time::timeout(self.config.lock_timeout, done.wait_for(|d| *d));
        drop(waited.await);
        let now = SystemTime::now();
        let req = rules::request_directives(fields);
        let stored = self.find(&key, fields).await;
        let fresh = stored.filter(|s| rules::usable(s, &req, now) == Use::Fresh);
        let answer = fresh.map(|s| hit(&s, fields, now, "hit; collapsed"));
        let counter = match answer {
            Some(_) => &self.counters.hits,
            None => &self.counters.misses,
        };
        counter.inc();
        answer
    }
}

/// The disk tier of a route's cache, if it has one; logged and left out when its directory
/// cannot be opened (the cache goes on in memory).
fn open_disk(
    route: &str,
    config: &sluice_config::Cache,
    counters: &metrics::Counters,
) -> Option<disk::Disk> {
    let tier = config.disk.as_ref()?;
    let counters = disk::DiskCounters {
        evictions: counters.disk_evictions.clone(),
        bytes: counters.disk_bytes.clone(),
    };
    match disk::Disk::open(tier, config.max_object, counters) {
        Ok(disk) => Some(disk),
        Err(e) => {
            tracing::error!(route, dir = %tier.path.display(), error = %e,
                "the cache's disk tier cannot be opened: the route caches in memory only");
            None
        }
    }
}

/// What `variants` weigh against the store's `memory`.
fn weight(variants: &Variants) -> u32 {
    let bytes: usize = variants.iter().map(|s| s.weight()).sum();
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// What a purge removes: one key (`https://host/path?query`, as requests are keyed), or
/// every key that starts with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Purge {
    Key(String),
    Prefix(String),
}

/// Purges `what` from the cache among a route's `features`: how many keys it removed, `None`
/// when the route has no cache.
pub(crate) fn purge(features: &[Arc<dyn RouteFeature>], what: &Purge) -> Option<u64> {
    let mut features = features.iter();
    let cache = features.find_map(|f| downcast::<Cache>(f))?;
    Some(cache.purge(what))
}

/// The status of the cache among the `features` of the route `route` (`None`: it has none).
pub(crate) fn status(
    route: &str,
    features: &[Arc<dyn RouteFeature>],
) -> Option<sluice_config::admin::CacheStatus> {
    let mut features = features.iter();
    let cache = features.find_map(|f| downcast::<Cache>(f))?;
    Some(cache.status(route))
}

/// A fetch this request started (held by its [`Keep`]): ended when it is dropped.
struct Filled {
    key: String,
    fill: Arc<Fill>,
}

/// The key of a request the cache looks up: `GET` or `HEAD`, with a host.
fn key_of(asked: &Asked<'_>) -> Option<String> {
    rules::primary_key(asked.tls, asked.host, asked.path, asked.query)
}

/// A stored answer as a request gets it: `304` when the client's validators match, else the
/// answer with its `Age`, cut to the request's `Range` (`206`, `416`); all with
/// `Cache-Status`.
fn hit(stored: &Stored, request: &(impl Fields + ?Sized), now: SystemTime, status: &str) -> Answer {
    let age = HeaderValue::from(stored.current_age(now).as_secs());
    let cache_status = HeaderValue::from_str(&format!("Sluice; {status}"))
        .unwrap_or_else(|_| HeaderValue::from_static("Sluice; hit"));
    if rules::not_modified(request, stored) {
        let mut fields = rules::not_modified_fields(&stored.fields);
        fields.push((header::AGE, age));
        fields.push((CACHE_STATUS.clone(), cache_status));
        return Answer {
            status: StatusCode::NOT_MODIFIED,
            fields,
            body: Some(Bytes::new()),
        };
    }
    let kept = stored.fields.iter().filter(|(n, _)| **n != header::AGE);
    let mut fields: Vec<_> = kept.map(|(n, v)| (n.clone(), v.clone())).collect();
    fields.push((header::AGE, age));
    fields.push((CACHE_STATUS.clone(), cache_status));
    let whole = Answer {
        status: stored.status,
        fields,
        body: Some(stored.body.clone()),
    };
    rules::range::cut(request, whole)
}

/// Looks the request up; answers it when a fresh stored answer fits, or waits for the fetch
/// another request has under way for its key.
impl RouteFeature for Cache {
    fn name(&self) -> &'static str {
        "cache"
    }

    fn hooks(&self) -> Hooks {
        Hooks::ANSWER.and(Hooks::WAIT).and(Hooks::KEEP)
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Verdict<'a> {
        let lookup = *asked.method == Method::GET || *asked.method == Method::HEAD;
        let Some(key) = key_of(asked).filter(|_| lookup) else {
            return Verdict::Pass;
        };
        let req = rules::request_directives(asked.fields);
        let now = SystemTime::now();
        let stored = self.lookup(&key, asked.fields);
        if let Some(stored) = &stored {
            if rules::usable(stored, &req, now) == Use::Fresh {
                self.counters.hits.inc();
                return Verdict::Answer(hit(stored, asked.fields, now, "hit"));
            }
            if *asked.method == Method::GET && rules::stale_while_revalidate(stored, &req, now) {
                return self.revalidating(stored, &key, asked.fields, now);
            }
        }
        let on_disk = stored.is_none()
            && self
                .disk
                .as_ref()
                .is_some_and(|d| d.find(&key, asked.fields).is_some());
        if on_disk {
            let fields = asked.fields;
            return Verdict::Check(Box::pin(async move {
                Ok(self.answer_from_disk(key, fields).await)
            }));
        }
        // Only a plain GET of a key with nothing stored waits for another's fetch (not a
        // range, whose answer is not stored); a wait counts its lookup once it has waited,
        // every other request here misses.
        let whole = asked.fields.first_value("range").is_none();
        let coalesced = stored.is_none() && *asked.method == Method::GET && !req.no_cache && whole;
        let waits = coalesced && !req.no_store && !req.only_if_cached;
        let fill = waits.then(|| self.join_or_start(&key)).flatten();
        let Some(fill) = fill else {
            self.counters.misses.inc();
            return self.missed(&req);
        };
        self.counters.coalesced.inc();
        let fields = asked.fields;
        Verdict::Check(Box::pin(
            async move { Ok(self.wait(fill, key, fields).await) },
        ))
    }

    fn keep(&self, asked: &Asked<'_>) -> Option<Box<dyn Keep>> {
        keep::keep(self, asked)
    }
}

impl Cache {
    /// A stale `stored` answer within its `stale-while-revalidate`, served at once; the
    /// request refreshes it in the background unless another's refresh of its key is under
    /// way (one refresh per key at a time).
    fn revalidating<'a>(
        &self,
        stored: &Stored,
        key: &str,
        fields: &dyn DynFields,
        now: SystemTime,
    ) -> Verdict<'a> {
        self.counters.hits.inc();
        self.counters.stale.inc();
        let answer = hit(stored, fields, now, "hit; detail=stale-while-revalidate");
        match self.join_or_start(key) {
            Some(_under_way) => Verdict::Answer(answer),
            None => Verdict::Refresh(answer),
        }
    }

    /// A request whose answer is on disk (not in memory): answered from the file when it is
    /// fresh (and kept in memory either way, so a stale one is revalidated), else it goes on.
    async fn answer_from_disk(&self, key: String, fields: &dyn DynFields) -> Option<Answer> {
        let stored = self.find(&key, fields).await;
        let now = SystemTime::now();
        let req = rules::request_directives(fields);
        if let Some(stored) = stored.filter(|s| rules::usable(s, &req, now) == Use::Fresh) {
            self.counters.hits.inc();
            return Some(hit(&stored, fields, now, "hit"));
        }
        self.counters.misses.inc();
        match self.missed(&req) {
            Verdict::Answer(answer) => Some(answer),
            _ => None,
        }
    }

    /// A request with nothing fresh stored: `504` if it asked `only-if-cached`, else it goes
    /// upstream.
    fn missed<'a>(&self, req: &rules::Directives) -> Verdict<'a> {
        if req.only_if_cached {
            let status = (
                CACHE_STATUS.clone(),
                HeaderValue::from_static("Sluice; fwd=miss"),
            );
            return Verdict::Answer(Answer::bare(StatusCode::GATEWAY_TIMEOUT, vec![status]));
        }
        Verdict::Pass
    }
}

/// The stored answer for `key` of a request going upstream (GET or HEAD, not itself
/// conditional): revalidated when it has validators, and served if the upstream fails within
/// its `stale-if-error`.
fn stale_for(cache: &Store, key: &str, asked: &Asked<'_>) -> Option<Arc<Stored>> {
    let conditional = asked.fields.first_value("if-none-match").is_some()
        || asked.fields.first_value("if-modified-since").is_some();
    let stored = cache.lookup(key, asked.fields)?;
    (!conditional).then_some(stored)
}
