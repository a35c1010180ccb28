//! What the cache keeps of a request that goes upstream: its fields (the variant it is
//! stored under), the revalidation it sends, and the answer it stores as its body streams.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use sluice_core::cache::{self as rules, Stored, Variant};
use sluice_core::error::ProxyError;
use sluice_core::route_feature::{Answer, Asked, Keep, Kept, Tee};

use super::disk::Writer;
use super::{hit, key_of, stale_for, Cache, Filled, Store, CACHE_STATUS};

/// The [`Keep`] of a request to the cache's route (`None`: it has nothing to keep).
pub(super) fn keep(cache: &Cache, asked: &Asked<'_>) -> Option<Box<dyn Keep>> {
    let key = key_of(asked)?;
    let method = asked.method.clone();
    if method != Method::GET && method != Method::HEAD {
        // An unsafe method's success invalidates what is stored for its target (§4.4).
        return Some(Box::new(Invalidate {
            cache: cache.handle(),
            key,
            method,
        }));
    }
    let stale = stale_for(cache, &key, asked);
    Some(Box::new(Miss {
        cache: cache.handle(),
        filled: cache.claim(&key),
        key,
        method,
        stale,
        fields: HeaderMap::new(),
        asked_at: SystemTime::now(),
    }))
}

/// An unsafe request: its success invalidates the stored answers for its target.
struct Invalidate {
    cache: Arc<Store>,
    key: String,
    method: Method,
}

impl Keep for Invalidate {
    fn answer(self: Box<Self>, head: &mut http::response::Parts) -> Kept {
        if rules::invalidates(&self.method, head.status) {
            self.cache.invalidate(&self.key);
        }
        Kept::Leave
    }
}

/// A `GET` or `HEAD` that goes upstream: a miss, or a revalidation of `stale`.
struct Miss {
    cache: Arc<Store>,
    key: String,
    method: Method,
    /// The fetch this request started, which others wait for.
    filled: Option<Filled>,
    /// The stored answer it revalidates.
    stale: Option<Arc<Stored>>,
    /// The request's fields as the client sent them.
    fields: HeaderMap,
    asked_at: SystemTime,
}

impl Drop for Miss {
    fn drop(&mut self) {
        if let Some(filled) = self.filled.take() {
            self.cache.end_fill(&filled);
        }
    }
}

impl Miss {
    /// The stored `stale` answer in place of the upstream's: refreshed by a `304` to its
    /// revalidation, or served on an error within its `stale-if-error`.
    fn stale_answer(
        &self,
        stale: &Stored,
        head: &http::response::Parts,
        times: (SystemTime, SystemTime),
    ) -> Option<Answer> {
        if head.status == StatusCode::NOT_MODIFIED && stale.has_validators() {
            let refreshed = stale.refreshed(&head.headers, times);
            let status = "fwd=stale; fwd-status=304";
            let answer = hit(&refreshed, &self.fields, times.1, status);
            self.cache.put(&self.key, refreshed);
            return Some(answer);
        }
        let error = matches!(head.status.as_u16(), 500 | 502 | 503 | 504);
        let req = rules::request_directives(&self.fields);
        (error && rules::stale_if_error(stale, &req, times.1)).then(|| {
            self.cache.counters.stale.inc();
            let status = format!("fwd=stale; fwd-status={}", head.status.as_u16());
            hit(stale, &self.fields, times.1, &status)
        })
    }
}

impl Miss {
    /// A `200` to a `HEAD` updates the stored `GET`'s fields when their validators agree
    /// (RFC 9111 §4.3.5); the body stays.
    fn head_update(&self, head: &http::response::Parts, times: (SystemTime, SystemTime)) {
        if head.status != StatusCode::OK {
            return;
        }
        let Some(stored) = self.cache.lookup(&self.key, &self.fields) else {
            return;
        };
        if rules::head_updates(&stored, &head.headers) {
            self.cache
                .put(&self.key, stored.refreshed(&head.headers, times));
        }
    }

    /// The answer as it would be stored, if it may be (and fits in `max_object` as far as its
    /// `Content-Length` says).
    fn storable(
        &self,
        head: &http::response::Parts,
        times: (SystemTime, SystemTime),
    ) -> Option<Stored> {
        let assigned = self.cache.config.valid.lifetime(head.status.as_u16());
        let storable = self.method == Method::GET
            && rules::storable_with(
                &self.method,
                &self.fields,
                head.status,
                &head.headers,
                assigned.is_some(),
            );
        let length = head.headers.get(header::CONTENT_LENGTH);
        let length = length.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let fits = length.is_none_or(|l| l <= self.cache.config.max_object);
        let names = rules::vary_names(&head.headers).filter(|_| storable && fits)?;
        let variant = Variant::of(&names, &self.fields);
        let mut stored = Stored::new(head.status, &head.headers, variant, times);
        stored.assigned = assigned;
        Some(stored)
    }
}

impl Keep for Miss {
    fn ask(&mut self, fields: &mut HeaderMap) {
        self.fields = fields.clone();
        if let Some(stale) = &self.stale {
            for (name, value) in stale.validators() {
                fields.insert(name, value);
            }
        }
    }

    fn failed(mut self: Box<Self>, _error: &ProxyError) -> Option<Answer> {
        let stale = self.stale.take()?;
        let now = SystemTime::now();
        let req = rules::request_directives(&self.fields);
        let served = rules::stale_if_error(&stale, &req, now);
        served.then(|| {
            self.cache.counters.stale.inc();
            hit(
                &stale,
                &self.fields,
                now,
                "fwd=stale; detail=upstream-failed",
            )
        })
    }

    fn answer(mut self: Box<Self>, head: &mut http::response::Parts) -> Kept {
        let times = (self.asked_at, SystemTime::now());
        if let Some(stale) = self.stale.take() {
            if let Some(replaced) = self.stale_answer(&stale, head, times) {
                return Kept::Replace(replaced);
            }
        }
        if self.method == Method::HEAD {
            self.head_update(head, times);
        }
        let stored = self.storable(head, times);
        // With a disk tier the body streams into a file; without a file free it is not stored.
        let (stored, writer) = match stored.map(|s| (self.cache.writer(&self.key, &s), s)) {
            Some((Ok(writer), stored)) => (Some(stored), writer),
            _ => (None, None),
        };
        let status = match stored {
            Some(_) => "Sluice; fwd=miss; stored",
            None => "Sluice; fwd=miss",
        };
        head.headers
            .append(CACHE_STATUS.clone(), HeaderValue::from_static(status));
        let Some(stored) = stored else {
            return Kept::Leave;
        };
        Kept::Tee(Box::new(Filler {
            limit: self.cache.config.max_object,
            cache: Arc::clone(&self.cache),
            key: std::mem::take(&mut self.key),
            stored: Some(stored),
            body: BytesMut::new(),
            writer,
            _miss: self,
        }))
    }
}

/// A storable answer's body, gathered as it streams (in memory, or into its file with a disk
/// tier); stored when it ended whole.
struct Filler {
    cache: Arc<Store>,
    key: String,
    stored: Option<Stored>,
    body: BytesMut,
    /// The file the body goes to (a disk tier's), if any.
    writer: Option<Writer>,
    limit: u64,
    /// The request's keep, ending its fetch (the waiters look again) once this is stored or
    /// dropped.
    _miss: Box<Miss>,
}

impl Tee for Filler {
    fn data(&mut self, chunk: &Bytes) -> bool {
        let held = self
            .writer
            .as_ref()
            .map_or(self.body.len() as u64, Writer::written);
        let written = match &mut self.writer {
            _ if held + chunk.len() as u64 > self.limit => false,
            Some(writer) => writer.data(chunk),
            None => {
                self.body.extend_from_slice(chunk);
                true
            }
        };
        if !written {
            // Not stored: the file (removed as it drops) and the body so far go.
            self.stored = None;
            self.body = BytesMut::new();
            self.writer = None;
        }
        written
    }

    fn end(mut self: Box<Self>) {
        let Some(mut stored) = self.stored.take() else {
            return;
        };
        match self.writer.take() {
            Some(writer) => self.cache.commit(&self.key, stored.variant, writer),
            None => {
                stored.body = std::mem::take(&mut self.body).freeze();
                self.cache.put(&self.key, stored);
            }
        }
    }
}
