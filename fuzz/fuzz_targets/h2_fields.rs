//! The own HTTP/2 transport's HPACK decoder and request-head checks (`sluice_h2::hpack`,
//! `sluice_h2::head`) over any header block: they never panic; a block that makes a request
//! gives one whose fields, written again by the stateless encoder, decode to the same request;
//! a block both it and loona-hpack's decoder (the one it replaced, a second reader) decode
//! gives the same fields. (They may differ on what they refuse: this one refuses a table size
//! update after a field, as h2spec asks, and integers above 2^24.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_h2::head::Fields;
use sluice_h2::hpack::{self, Decoder};

/// The limit the listener's default gives (`max_header_bytes`).
const LIMIT: usize = 16 * 1024;

fn request(block: &[u8]) -> Option<(http::Request<()>, Option<u64>)> {
    let mut fields = Fields::new(LIMIT);
    Decoder::default().decode(block, |n, v| fields.field(n, v)).ok()?;
    fields.request().ok()
}

fn both_read_alike(bytes: &[u8]) {
    let mut ours = Vec::new();
    let ok = Decoder::default()
        .decode(bytes, |n, v| ours.push((n.to_vec(), v.to_vec())))
        .is_ok();
    let mut loona = loona_hpack::Decoder::new();
    loona.set_max_allowed_table_size(hpack::TABLE_SIZE);
    let mut theirs = Vec::new();
    let also = loona
        .decode_with_cb(bytes, |n, v| theirs.push((n.to_vec(), v.to_vec())))
        .is_ok();
    if ok && also {
        assert_eq!(ours, theirs);
    }
}

fuzz_target!(|bytes: &[u8]| {
    both_read_alike(bytes);
    // Two blocks on one decoder (the dynamic table carries over), the second as trailers.
    let split = bytes.first().map_or(0, |b| usize::from(*b)).min(bytes.len());
    let (first, second) = bytes.split_at(split);
    let mut decoder = Decoder::default();
    let mut fields = Fields::new(LIMIT);
    if decoder.decode(first, |n, v| fields.field(n, v)).is_ok() {
        let _ = fields.request();
        let mut trailers = Fields::new(LIMIT);
        if decoder.decode(second, |n, v| trailers.field(n, v)).is_ok() {
            let _ = trailers.trailers();
        }
    }
    let Some((req, length)) = request(bytes) else {
        return;
    };
    let mut block = Vec::new();
    let connect = req.method() == http::Method::CONNECT;
    // A target without an authority keeps no scheme (`http::Uri` has none without one): any
    // scheme gives the same request back.
    let scheme = req.uri().scheme_str().unwrap_or("http").to_string();
    let pseudo = [
        (":method", Some(req.method().as_str().to_string())),
        (":scheme", (!connect).then_some(scheme)),
        (":authority", req.uri().authority().map(|a| a.as_str().to_string())),
        (":path", req.uri().path_and_query().map(|p| p.as_str().to_string()).filter(|_| !connect)),
    ];
    for (name, value) in pseudo {
        if let Some(value) = value {
            hpack::encode_field(&mut block, name, value.as_bytes(), false);
        }
    }
    for (name, value) in req.headers() {
        hpack::encode_field(&mut block, name.as_str(), value.as_bytes(), false);
    }
    let (again, length_again) = request(&block).expect("a request written again decodes");
    assert_eq!(length, length_again);
    assert_eq!(req.method(), again.method());
    assert_eq!(req.uri(), again.uri());
    assert_eq!(req.headers(), again.headers());
});
