//! Header blocks (RFC 7541): [`Decoder`], with the peer's dynamic table, and [`encode_field`],
//! which writes a field without the dynamic table.
//!
//! - `tables`: the static table and the Huffman code, as RFC 7541 gives them.
//! - `huffman`: Huffman-coded strings decoded four bits at a time.

mod huffman;
mod tables;

use std::collections::VecDeque;

use crate::error::{Error, Reason};

/// The dynamic table a peer may use, unless the server's SETTINGS said otherwise (RFC 9113
/// §6.5.2); this server never says otherwise.
pub const TABLE_SIZE: usize = 4_096;

/// What an entry costs in the table besides its bytes (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// The largest integer a block may hold (a length or an index): more is an error, not an
/// allocation (a block is at most `max_header_bytes` long anyway).
const MAX_INTEGER: usize = 1 << 24;

/// A dynamic table entry: a field's name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// A connection's HPACK decoder: its dynamic table holds what the peer put there, up to
/// [`TABLE_SIZE`], and is empty (no allocation) on a connection whose peer indexes nothing.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is the front.
    entries: VecDeque<Entry>,
    /// What the entries cost, and what the peer set the table's size to.
    size: usize,
    capacity: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            capacity: TABLE_SIZE,
        }
    }
}

/// A block that does not decode: the table is no longer the peer's (RFC 7541 §2.3.3, §4.2,
/// §5.2, §6).
fn malformed<T>() -> Result<T, Error> {
    Err(Error::Connection(Reason::COMPRESSION_ERROR))
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
        let mut at = 0;
        let (mut name_buf, mut value_buf) = (Vec::new(), Vec::new());
        // A size update may only start a block (RFC 7541 §4.2).
        let mut fields_seen = false;
        while let Some(&first) = block.get(at) {
            if first & 0x80 != 0 {
                // Indexed (§6.1).
                let index = read_integer(block, &mut at, 7)?;
                let (name, value) = self.get(index)?;
                field(name, value);
                fields_seen = true;
            } else if first & 0x40 != 0 {
                // Literal with incremental indexing (§6.2.1).
                let index = read_integer(block, &mut at, 6)?;
                let name: Box<[u8]> = match index {
                    0 => read_string(block, &mut at, &mut name_buf)?.into(),
                    _ => self.get(index)?.0.into(),
                };
                let value = read_string(block, &mut at, &mut value_buf)?;
                field(&name, value);
                let value: Box<[u8]> = value.into();
                self.insert(name, value);
                fields_seen = true;
            } else if first & 0x20 != 0 {
                // Dynamic table size update (§6.3): never above what SETTINGS allow.
                let size = read_integer(block, &mut at, 5)?;
                if fields_seen || size > TABLE_SIZE {
                    return malformed();
                }
                self.capacity = size;
                self.evict(0);
            } else {
                // Literal without indexing (§6.2.2) or never indexed (§6.2.3).
                let index = read_integer(block, &mut at, 4)?;
                let name = match index {
                    0 => read_string(block, &mut at, &mut name_buf)?,
                    _ => self.get(index)?.0,
                };
                let value = read_string(block, &mut at, &mut value_buf)?;
                field(name, value);
                fields_seen = true;
            }
        }
        Ok(())
    }

    /// The field at `index` (1 to 61: the static table; from 62, the dynamic, newest first).
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), Error> {
        if let Some(&(name, value)) = index.checked_sub(1).and_then(|i| tables::STATIC.get(i)) {
            return Ok((name, value));
        }
        match index
            .checked_sub(tables::STATIC.len() + 1)
            .and_then(|i| self.entries.get(i))
        {
            Some((name, value)) => Ok((name, value)),
            None => malformed(),
        }
    }

    fn insert(&mut self, name: Box<[u8]>, value: Box<[u8]>) {
        let cost = name.len() + value.len() + ENTRY_OVERHEAD;
        if cost > self.capacity {
            // An entry larger than the table empties it and is not added (§4.4).
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict(cost);
        self.size += cost;
        self.entries.push_front((name, value));
    }

    /// Evicts the oldest entries until `room` more fits.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.capacity {
            let Some((name, value)) = self.entries.pop_back() else {
                break;
            };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
        if self.entries.is_empty() {
            // An emptied table gives its memory back.
            self.entries = VecDeque::new();
        }
    }
}

/// Reads an integer with an `n`-bit prefix at `*at` (RFC 7541 §5.1), moving `at` past it.
fn read_integer(block: &[u8], at: &mut usize, n: u8) -> Result<usize, Error> {
    let max = (1usize << n) - 1;
    let Some(&first) = block.get(*at) else {
        return malformed();
    };
    *at += 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let Some(&byte) = block.get(*at) else {
            return malformed();
        };
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        if value > MAX_INTEGER {
            return malformed();
        }
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        // Continuation bytes of zeros add nothing but length: four carry any value allowed.
        shift += 7;
        if shift > 21 {
            return malformed();
        }
    }
}

/// Reads a string literal at `*at` (RFC 7541 §5.2), Huffman-decoded into `buf` if it is coded.
fn read_string<'a>(
    block: &'a [u8],
    at: &mut usize,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8], Error> {
    let Some(&first) = block.get(*at) else {
        return malformed();
    };
    let len = read_integer(block, at, 7)?;
    let Some(bytes) = block.get(*at..*at + len) else {
        return malformed();
    };
    *at += len;
    if first & 0x80 == 0 {
        return Ok(bytes);
    }
    buf.clear();
    match huffman::decode(bytes, buf) {
        Ok(()) => Ok(buf),
        Err(()) => malformed(),
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
    fn an_integer_of_endless_zero_continuations_is_an_error_not_a_panic() {
        // Found by fuzz/h2_fields: a string length of 0x7f then 0xff and 70 bytes of 0x80
        // shifted past the integer's width.
        let mut block = vec![0x10, 0xff, 0xff];
        block.extend([0x80; 70]);
        block.extend([0xe8, 0, 0, 0, 0, b's', b't']);
        let err = Decoder::default().decode(&block, |_, _| {}).unwrap_err();
        assert_eq!(err, Error::Connection(Reason::COMPRESSION_ERROR));
        // Four continuation bytes are still read.
        let mut out = Vec::new();
        integer(&mut out, 1 << 20, 7, 0x80);
        assert_eq!(out.len(), 4);
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

#[cfg(test)]
mod differential {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A small deterministic generator (xorshift), so that a failure repeats.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn literal(out: &mut Vec<u8>, s: &[u8], coded: bool) {
        match coded {
            true => {
                let h = huffman::encode(s);
                integer(out, h.len(), 7, 0x80);
                out.extend_from_slice(&h);
            }
            false => string(out, s),
        }
    }

    const NAMES: &[&[u8]] = &[
        b"content-type",
        b"x-request-id",
        b"user-agent",
        b"grpc-timeout",
        b"te",
        b"cookie",
        b"x-\xff-odd",
    ];

    /// A block of random representations, every kind RFC 7541 §6 has, Huffman-coded or not.
    fn block(rng: &mut Rng, dynamic_len: &mut usize) -> Vec<u8> {
        let mut out = Vec::new();
        if rng.below(8) == 0 {
            integer(&mut out, rng.below(TABLE_SIZE + 1), 5, 0x20);
            *dynamic_len = 0; // may have evicted: refer to static entries only after this
        }
        for _ in 0..1 + rng.below(12) {
            let value: Vec<u8> = (0..rng.below(40)).map(|_| rng.below(256) as u8).collect();
            let coded = rng.below(2) == 0;
            match rng.below(5) {
                0 => integer(&mut out, 1 + rng.below(61 + *dynamic_len), 7, 0x80),
                1 => {
                    integer(&mut out, 0, 6, 0x40);
                    literal(&mut out, NAMES[rng.below(NAMES.len())], coded);
                    literal(&mut out, &value, !coded);
                }
                2 => {
                    integer(&mut out, 1 + rng.below(61), 6, 0x40);
                    literal(&mut out, &value, coded);
                }
                kind => {
                    let first = if kind == 3 { 0x00 } else { 0x10 };
                    integer(&mut out, 0, 4, first);
                    literal(&mut out, NAMES[rng.below(NAMES.len())], coded);
                    literal(&mut out, &value, coded);
                }
            }
        }
        out
    }

    /// Blocks in sequence on one connection decode to the same fields with both decoders:
    /// this one and loona-hpack's, the one it replaced.
    #[test]
    fn the_same_fields_as_loona_hpack() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        for _ in 0..50 {
            let (mut ours, mut theirs) = (Decoder::default(), loona_hpack::Decoder::new());
            theirs.set_max_allowed_table_size(TABLE_SIZE);
            let mut dynamic_len = 0;
            for _ in 0..20 {
                let block = block(&mut rng, &mut dynamic_len);
                let mut a = Vec::new();
                ours.decode(&block, |n, v| a.push((n.to_vec(), v.to_vec())))
                    .unwrap();
                let mut b = Vec::new();
                theirs
                    .decode_with_cb(&block, |n, v| b.push((n.to_vec(), v.to_vec())))
                    .unwrap();
                assert_eq!(a, b, "block {block:02x?}");
                dynamic_len = ours.entries.len();
            }
        }
    }

    /// RFC 7541 C.4: three requests with Huffman coding on one connection (the dynamic table
    /// carried across), and C.6's responses with a 256-byte table (evictions).
    #[test]
    fn rfc_7541_appendix_c() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let mut d = Decoder::default();
        let fields = |d: &mut Decoder, block: &str| {
            let mut out = Vec::new();
            d.decode(&hex(block), |n, v| {
                out.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                ))
            })
            .unwrap();
            out
        };
        assert_eq!(
            fields(&mut d, "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
            [
                ":method: GET",
                ":scheme: http",
                ":path: /",
                ":authority: www.example.com"
            ]
        );
        assert_eq!(
            fields(&mut d, "8286 84be 5886 a8eb 1064 9cbf"),
            [
                ":method: GET",
                ":scheme: http",
                ":path: /",
                ":authority: www.example.com",
                "cache-control: no-cache"
            ]
        );
        assert_eq!(
            fields(
                &mut d,
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"
            ),
            [
                ":method: GET",
                ":scheme: https",
                ":path: /index.html",
                ":authority: www.example.com",
                "custom-key: custom-value"
            ]
        );
        assert_eq!(d.size, 164);
        // C.6, with the table set to 256 bytes by a size update first.
        let mut d = Decoder::default();
        let first = fields(
            &mut d,
            "3fe1 01 4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0
             82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        );
        assert_eq!(first[0], ":status: 302");
        assert_eq!(first[3], "location: https://www.example.com");
        let second = fields(&mut d, "4883 640e ff c1 c0 bf");
        assert_eq!(second[0], ":status: 307");
        assert_eq!(d.entries.len(), 4);
        assert_eq!(d.size, 222);
    }
}
