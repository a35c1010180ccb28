//! What the HTTP/1 fuzz targets (`h1_request`, `h1_response`) share: a runtime for hyper, and
//! the fast path's fields and chunked bodies in the form hyper gives them.

use std::sync::OnceLock;

use sluice_wire::h1::{Chunked, Field};

/// One single-threaded runtime per fuzzing process, for the hyper side of the comparisons.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

/// Fields in hyper's form: lowercase names, sorted by name (values in order within a name).
pub fn fields(data: &[u8], fields: &[Field]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fields
        .iter()
        .map(|f| {
            let name = String::from_utf8_lossy(&data[f.name.clone()]).to_ascii_lowercase();
            (name, data[f.value.clone()].to_vec())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A chunked body by the fast path's decoder: `Some(Ok)` read whole, `Some(Err)` refused,
/// `None` when the data ends first.
pub fn dechunk(rest: &[u8], max_trailer: usize) -> Option<Result<Vec<u8>, ()>> {
    let (mut chunked, mut out, mut at) = (Chunked::new(max_trailer), Vec::new(), 0);
    while !chunked.is_done() {
        let Ok(p) = chunked.feed(&rest[at..]) else {
            return Some(Err(()));
        };
        if p.consumed == 0 {
            return None;
        }
        out.extend_from_slice(&rest[at..][p.data]);
        at += p.consumed;
    }
    Some(Ok(out))
}
