//! A route's admission — whether a request is let through before anything goes upstream —
//! in the one order every transport applies it: the rate limit, then the CORS preflight
//! (which carries no credentials, so it is answered before they are asked for), then the
//! route's users. A refusal is a [`ProxyError`] (429, 403, 401), answered as every other.

use std::net::IpAddr;

use http::{HeaderName, HeaderValue, Method};

use crate::basic_auth::BasicAuth;
use crate::cors::Cors;
use crate::error::ProxyError;
use crate::fields::Fields;
use crate::rate_limit::RateLimit;

/// The admission features of one route (none by default: every request is let through).
#[derive(Debug, Clone, Copy, Default)]
pub struct Admission<'r> {
    /// Requests per client (or field value) over time.
    pub rate_limit: Option<&'r RateLimit>,
    /// Which web origins may call the route; its preflights are answered here.
    pub cors: Option<&'r Cors>,
    /// The users who may use the route.
    pub basic_auth: Option<&'r BasicAuth>,
}

/// What became of a request admission let through.
#[derive(Debug)]
pub enum Admitted {
    /// On to the route's target.
    Pass,
    /// An allowed CORS preflight, answered 204 with these fields (after the route's CORS
    /// fields); it never goes upstream.
    Preflight(Vec<(HeaderName, HeaderValue)>),
}

impl Admission<'_> {
    /// Whether a request of `method` with `fields` from `client` is let through, or refused
    /// (the error the client is answered with), or answered here (a preflight).
    pub async fn admit(
        &self,
        method: &Method,
        fields: &(impl Fields + Sync),
        client: IpAddr,
    ) -> Result<Admitted, ProxyError> {
        if let Some(limit) = self.rate_limit {
            let value = limit.field().and_then(|n| fields.first(n.as_str()));
            limit.check(client, value)?;
        }
        if let Some(cors) = self.cors {
            if let Some(answer) = cors.preflight(method, fields) {
                return answer.map(Admitted::Preflight);
            }
        }
        if let Some(auth) = self.basic_auth {
            auth.check(fields.first("authorization")).await?;
        }
        Ok(Admitted::Pass)
    }
}
