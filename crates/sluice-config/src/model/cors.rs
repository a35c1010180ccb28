//! A route's `cors`: which web origins may call it from a browser, and how.

use std::time::Duration;

use http::{HeaderName, Method};

/// `cors = { origins = ["https://app.example.com"], methods = [...], headers = [...] }`:
/// Sluice answers the route's CORS preflights itself and adds the CORS fields to its answers
/// for the origins it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// The origins allowed.
    pub origins: CorsOrigins,
    /// The methods a preflight allows (default GET, HEAD, POST).
    pub methods: Vec<Method>,
    /// The request fields a preflight allows beyond the CORS-safelisted ones (lowercase).
    pub headers: Vec<HeaderName>,
    /// The response fields a page's script may read beyond the safelisted ones.
    pub expose: Vec<HeaderName>,
    /// Whether requests with credentials (cookies, `Authorization`) are allowed.
    pub credentials: bool,
    /// How long a browser may keep a preflight's answer (`Access-Control-Max-Age`).
    pub max_age: Option<Duration>,
}

/// The origins a route's `cors` allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    /// `["*"]`: any origin (without credentials).
    Any,
    /// These origins: exact (`https://app.example.com`, `http://localhost:3000`), or every
    /// subdomain of one (`https://*.example.com`, kept as scheme and `.example.com`).
    List(Vec<OriginMatch>),
}

/// One allowed origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginMatch {
    /// Exactly this origin, lowercase (`https://app.example.com`).
    Exact(String),
    /// A subdomain of a host, under a scheme: `("https", ".example.com")`.
    Subdomains(String, String),
}
