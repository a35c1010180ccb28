//! Header blocks (RFC 7541): [`Decoder`] over `loona-hpack`'s, and [`encode_field`], which
//! writes a field without the dynamic table.

use crate::error::{Error, Reason};

/// The dynamic table a peer may use, unless the server's SETTINGS said otherwise (RFC 9113
/// §6.5.2); this server never says otherwise.
pub const TABLE_SIZE: usize = 4_096;

/// A connection's HPACK decoder: its dynamic table holds what the peer put there, up to
/// [`TABLE_SIZE`], and is empty (a few words) on a connection whose peer indexes nothing.
pub struct Decoder {
    inner: loona_hpack::Decoder<'static>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        let mut inner = loona_hpack::Decoder::new();
        inner.set_max_allowed_table_size(TABLE_SIZE);
        Self { inner }
    }
}

impl Decoder {
    /// Decodes a whole header `block`, calling `field` with each field's name and value in
    /// order. A block that does not decode is a connection error (COMPRESSION_ERROR): the
    /// table is no longer the peer's.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), Error> {
        self.inner
            .decode_with_cb(block, |name, value| field(&name, &value))
            .map_err(|_| Error::Connection(Reason::COMPRESSION_ERROR))
    }
}

/// The static table's names (RFC 7541 Appendix A) a response carries often, with their index:
/// a field of one of them is written with its name as an index.
const STATIC_NAMES: &[(&str, usize)] = &[
    ("accept-ranges", 18),
    ("access-control-allow-origin", 20),
    ("age", 21),
    ("allow", 22),
    ("cache-control", 24),
    ("content-disposition", 25),
    ("content-encoding", 26),
    ("content-language", 27),
    ("content-length", 28),
    ("content-location", 29),
    ("content-range", 30),
    ("content-type", 31),
    ("date", 33),
    ("etag", 34),
    ("expires", 36),
    ("last-modified", 44),
    ("link", 45),
    ("location", 46),
    ("proxy-authenticate", 48),
    ("retry-after", 53),
    ("server", 54),
    ("set-cookie", 55),
    ("strict-transport-security", 56),
    ("vary", 59),
    ("via", 60),
    ("www-authenticate", 61),
];

/// Statuses the static table holds whole.
const STATIC_STATUS: &[(u16, usize)] = &[
    (200, 8),
    (204, 9),
    (206, 10),
    (304, 11),
    (400, 12),
    (404, 13),
    (500, 14),
];

/// Writes `:status` to `out`: an index when the static table has it, else a literal with the
/// name's index (`:status` is entry 8).
pub fn encode_status(out: &mut Vec<u8>, status: u16) {
    if let Some((_, index)) = STATIC_STATUS.iter().find(|(s, _)| *s == status) {
        integer(out, *index, 7, 0x80);
        return;
    }
    integer(out, 8, 4, 0x00);
    string(out, status.to_string().as_bytes());
}

/// Writes a field as a literal not indexed (RFC 7541 §6.2.2): with its name as an index when
/// the static table has it. Nothing goes in the peer's dynamic table, so the encoder keeps no
/// state. `sensitive` fields are written never-indexed (§6.2.3), so that an intermediary does
/// not index them either.
pub fn encode_field(out: &mut Vec<u8>, name: &str, value: &[u8], sensitive: bool) {
    let first = if sensitive { 0x10 } else { 0x00 };
    match STATIC_NAMES.iter().find(|(n, _)| *n == name) {
        Some((_, index)) => integer(out, *index, 4, first),
        None => {
            out.push(first);
            string(out, name.as_bytes());
        }
    }
    string(out, value);
}

/// A string literal without Huffman coding (RFC 7541 §5.2).
fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    integer(out, bytes.len(), 7, 0x00);
    out.extend_from_slice(bytes);
}

/// An integer with an `n`-bit prefix (RFC 7541 §5.1), the first byte's high bits `first`.
fn integer(out: &mut Vec<u8>, mut value: usize, n: u8, first: u8) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What the encoder writes, the decoder reads back, and so does loona's own (another
    /// reader than the one it is paired with here: the `h2` crate's client reads it in the
    /// transport's differential test).
    #[test]
    fn encoded_fields_decode_to_themselves() {
        let mut out = Vec::new();
        encode_status(&mut out, 200);
        encode_status(&mut out, 418);
        encode_field(&mut out, "content-type", b"text/plain", false);
        encode_field(&mut out, "x-a-long-name-of-its-own", &[b'v'; 300], false);
        encode_field(&mut out, "set-cookie", b"a=b", true);
        let mut fields = Vec::new();
        Decoder::default()
            .decode(&out, |n, v| fields.push((n.to_vec(), v.to_vec())))
            .unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b":status".to_vec(), b"200".to_vec()),
            (b":status".to_vec(), b"418".to_vec()),
            (b"content-type".to_vec(), b"text/plain".to_vec()),
            (b"x-a-long-name-of-its-own".to_vec(), vec![b'v'; 300]),
            (b"set-cookie".to_vec(), b"a=b".to_vec()),
        ];
        assert_eq!(fields, want);
    }

    #[test]
    fn a_block_that_does_not_decode_is_a_compression_error() {
        // Index 0 does not exist (RFC 7541 §6.1).
        let err = Decoder::default().decode(&[0x80], |_, _| {}).unwrap_err();
        assert_eq!(err, Error::Connection(Reason::COMPRESSION_ERROR));
        // A table size update above what the server allows.
        let err = Decoder::default()
            .decode(&[0x3f, 0xe2, 0x1f], |_, _| {})
            .unwrap_err();
        assert_eq!(err, Error::Connection(Reason::COMPRESSION_ERROR));
    }
}
