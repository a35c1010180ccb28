//! The `Host` a request upstream must carry.

use http::Request;

/// Sets `Host` to `authority()` when the request has none.
pub fn default_host<B>(req: &mut Request<B>, authority: impl FnOnce() -> String) {
    if req.headers().contains_key(http::header::HOST) {
        return;
    }
    if let Ok(value) = http::HeaderValue::try_from(authority()) {
        req.headers_mut().insert(http::header::HOST, value);
    }
}
