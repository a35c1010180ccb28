//! [`RouteFeature`]: a route feature as one thing — its rule and the phase hooks every
//! transport drives — and its [`Registration`], which builds it from a configured route. A
//! feature added to Sluice is its config, its module (the rule, this trait, a
//! [`Registration`]) and one line in `sluice`'s `registry::REGISTERED`, the one list of them; the router
//! tables hold what the registrations built, the admission pipeline (`admission`) runs their hooks in the list's
//! order, and a transport serves a route only when it drives every hook the route's features
//! use ([`Hooks`]), so a feature is never skipped: a new one that says nothing uses them all
//! and goes to the path that drives everything (issue 49: "fails closed").
//!
//! A framework user's own feature is the same trait, put on a route with
//! `Route::with_feature`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

pub use crate::body::Tee;
use crate::error::ProxyError;
pub use crate::fields::{DynFields, Fields};

/// The phase hooks a feature uses; a transport serves a route whose features use only hooks
/// it drives ([`Hooks::within`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hooks(u8);

impl Hooks {
    /// None.
    pub const NONE: Hooks = Hooks(0);
    /// [`RouteFeature::admit`] may let the request through or refuse it (an error answer, as
    /// every transport renders).
    pub const REFUSE: Hooks = Hooks(1);
    /// [`RouteFeature::admit`] may answer the request itself ([`Verdict::Answer`]).
    pub const ANSWER: Hooks = Hooks(2);
    /// [`RouteFeature::admit`] may wait ([`Verdict::Check`]).
    pub const WAIT: Hooks = Hooks(4);
    /// [`RouteFeature::edit`] edits the answer's fields.
    pub const EDIT: Hooks = Hooks(8);
    /// [`RouteFeature::keep`] sees the request on its way upstream and the upstream's answer
    /// and body on their way out (a cache storing a miss); its answers have bodies, and
    /// [`RouteFeature::admit`] may answer at once while the request still goes upstream in the
    /// background for the keeps ([`Verdict::Refresh`]).
    pub const KEEP: Hooks = Hooks(16);
    /// Every hook: what a feature that does not say uses.
    pub const ALL: Hooks = Hooks(31);

    /// Both sets.
    pub const fn and(self, other: Hooks) -> Hooks {
        Hooks(self.0 | other.0)
    }

    /// Whether every hook of this set is in `driven`.
    pub const fn within(self, driven: Hooks) -> bool {
        self.0 & !driven.0 == 0
    }
}

/// What a feature's hooks see of a request: the same for every transport.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    /// The method.
    pub method: &'a Method,
    /// The header fields as the client sent them (hyper's map, or the fast path's bytes).
    pub fields: &'a dyn DynFields,
    /// The client's address.
    pub client: IpAddr,
    /// The request's path as the client sent it (normalised), without the query.
    pub path: &'a str,
    /// Its query, without the `?` (`None`: none).
    pub query: Option<&'a str>,
    /// The host it names (the target's authority or `Host`), lowercase, with its port if it
    /// named one.
    pub host: Option<&'a str>,
    /// Whether it came over TLS (its scheme is `https`).
    pub tls: bool,
}

impl fmt::Debug for Asked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Asked")
            .field("method", self.method)
            .field("client", &self.client)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("host", &self.host)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// A wait of [`Verdict::Check`]: `Ok(None)` lets the request on, `Ok(Some)` answers it (a
/// cache's waiter, answered from the object another request fetched), `Err` refuses it.
pub type Check<'a> = Pin<Box<dyn Future<Output = Result<Option<Answer>, ProxyError>> + Send + 'a>>;

/// What a feature's admission hook decided.
pub enum Verdict<'a> {
    /// On to the next feature, then the route's target.
    Pass,
    /// Refused: the error the client is answered with (the refusing feature's own
    /// [`edit`](RouteFeature::edit) is left off it).
    Refuse(ProxyError),
    /// Answered here; it never goes upstream.
    Answer(Answer),
    /// Decided after a wait (a password's hash, a remote service's answer).
    Check(Check<'a>),
    /// Answered here at once (a cache's stale object within `stale-while-revalidate`), and
    /// the request still goes upstream, in the background, for the features' [`Keep`]s: its
    /// answer is theirs, never the client's (a cache refreshing the object). A transport that
    /// cannot send it in the background answers it as it would a [`Verdict::Pass`]: upstream,
    /// with the keeps, the client waiting. Part of [`Hooks::KEEP`].
    Refresh(Answer),
}

impl fmt::Debug for Verdict<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass => f.write_str("Pass"),
            Verdict::Refuse(e) => f.debug_tuple("Refuse").field(e).finish(),
            Verdict::Answer(a) => f.debug_tuple("Answer").field(a).finish(),
            Verdict::Check(_) => f.write_str("Check(..)"),
            Verdict::Refresh(a) => f.debug_tuple("Refresh").field(a).finish(),
        }
    }
}

/// A feature's own answer to a request: a status and fields, and no body (a CORS preflight's
/// 204) or one (a cache's hit). The other features' edits are applied first, then these
/// fields appended. An answer with a body stands for the upstream's: the route's response
/// edits and compression apply to it as to one.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The fields, appended in order.
    pub fields: Vec<(HeaderName, HeaderValue)>,
    /// The body (`None`: none, and the answer is the feature's own).
    pub body: Option<Bytes>,
}

impl Answer {
    /// An answer without a body.
    pub fn bare(status: StatusCode, fields: Vec<(HeaderName, HeaderValue)>) -> Self {
        Self {
            status,
            fields,
            body: None,
        }
    }
}

/// What a feature keeps of a request that goes upstream ([`RouteFeature::keep`]): it sees the
/// request's fields on their way up, then the upstream's answer head on its way out, and
/// either keeps its body ([`Tee`]), replaces the answer (a `304` to a revalidation answered
/// with the stored object), or lets it go. Dropped unused when the request fails before an
/// answer.
pub trait Keep: Send + Sync {
    /// Edits the request's fields on their way upstream (a revalidation's `If-None-Match`).
    fn ask(&mut self, _fields: &mut HeaderMap) {}

    /// The upstream's answer head (which it may edit: `Cache-Status`).
    fn answer(self: Box<Self>, head: &mut http::response::Parts) -> Kept;

    /// The upstream failed (no answer: refused, reset, timed out): an answer in place of the
    /// error (a stale stored one), or `None` for the error.
    fn failed(self: Box<Self>, _error: &ProxyError) -> Option<Answer> {
        None
    }
}

/// What a [`Keep`] made of the upstream's answer.
pub enum Kept {
    /// Nothing more.
    Leave,
    /// Its body goes through this as it streams to the client.
    Tee(Box<dyn Tee>),
    /// The answer replaced by this one (rendered as a feature's answer with a body).
    Replace(Answer),
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::Leave => f.write_str("Leave"),
            Kept::Tee(_) => f.write_str("Tee(..)"),
            Kept::Replace(a) => f.debug_tuple("Replace").field(a).finish(),
        }
    }
}

/// An edit of the answer's fields a feature decided from the request (a CORS route's fields
/// for the request's `Origin`), applied to whatever answers it — the upstream's, Sluice's own
/// error, another feature's answer.
pub type Edit = Box<dyn FnOnce(&mut HeaderMap) + Send>;

/// A route feature: its rule and its hooks. Every hook has a default that does nothing; a
/// feature says which it uses in [`hooks`](Self::hooks) (by default: all of them, so a
/// transport that does not drive them all hands its requests on).
pub trait RouteFeature: Any + Send + Sync + fmt::Debug {
    /// Its name, as a route configures it (`rate_limit`), for logs and refusals.
    fn name(&self) -> &'static str;

    /// The hooks it uses.
    fn hooks(&self) -> Hooks {
        Hooks::ALL
    }

    /// The edit of the request's answer (read before [`admit`](Self::admit), so a request an
    /// earlier feature refuses gets it too); `None`: none.
    fn edit(&self, _asked: &Asked<'_>) -> Option<Edit> {
        None
    }

    /// Whether the request goes on (hooks run in the order of `sluice`'s `registry::REGISTERED`).
    fn admit<'a>(&'a self, _asked: &Asked<'a>) -> Verdict<'a> {
        Verdict::Pass
    }

    /// What it keeps of a request every feature let through, on its way upstream and back
    /// (`None`: nothing).
    fn keep(&self, _asked: &Asked<'_>) -> Option<Box<dyn Keep>> {
        None
    }
}

/// How a route's configuration turns into one feature: the single place a feature is
/// registered (an entry of `sluice`'s `registry::REGISTERED`).
pub struct Registration {
    /// The route's key (`rate_limit`).
    pub key: &'static str,
    /// The cargo feature of `sluice-core` that builds it (`None`: always built).
    pub cargo_feature: Option<&'static str>,
    /// Whether this build has it.
    pub built: bool,
    /// Whether a configured route asks for it.
    pub wanted: fn(&sluice_config::Route) -> bool,
    /// The feature a configured route asks for (`None`: it does not, or this build leaves it
    /// out). `kept` is the one the route had before a reload, which a feature with state (a
    /// rate limit's buckets) returns again when its configuration is unchanged.
    pub build: Build,
}

/// [`Registration::build`].
pub type Build = fn(
    &sluice_config::Route,
    kept: Option<&Arc<dyn RouteFeature>>,
) -> Option<Arc<dyn RouteFeature>>;

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("built", &self.built)
            .finish_non_exhaustive()
    }
}

/// `feature` as `T`, when it is one.
pub fn downcast<T: RouteFeature>(feature: &Arc<dyn RouteFeature>) -> Option<&T> {
    let any: &dyn Any = &**feature;
    any.downcast_ref::<T>()
}
