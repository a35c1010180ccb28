//! Huffman-coded strings (RFC 7541 §5.2) decoded four bits at a time: a table built once from
//! the code (`tables::HUFFMAN`) says, for each place in the code tree and each nibble, where
//! the nibble leads and which symbol it completes, so that a string costs two lookups a byte.

use std::sync::OnceLock;

use super::tables::HUFFMAN;

/// The EOS symbol: never in a string (RFC 7541 §5.2).
const EOS: u16 = 256;

/// What a nibble does from one place in the tree.
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    /// The internal node it ends on (0: the root).
    next: u8,
    /// The symbol it completed, if `EMIT` is set.
    symbol: u8,
    flags: u8,
}

const EMIT: u8 = 1;
/// It reached EOS, or a code the tree does not have.
const FAIL: u8 = 2;

/// The decoding table: 16 steps per internal node (256 of them), and which nodes a string may
/// end on (the root, or at most 7 bits of EOS's leading ones: its padding, §5.2).
struct Machine {
    steps: Vec<[Step; 16]>,
    may_end: Vec<bool>,
}

/// The code tree while it is built: each internal node's two children.
#[derive(Debug, Clone, Copy)]
enum Child {
    Missing,
    Node(u16),
    Leaf(u16),
}

fn machine() -> &'static Machine {
    static MACHINE: OnceLock<Machine> = OnceLock::new();
    MACHINE.get_or_init(build)
}

fn build() -> Machine {
    let mut nodes: Vec<[Child; 2]> = vec![[Child::Missing; 2]];
    // Whether a node's path from the root is all ones, and how long it is.
    let mut ones: Vec<Option<u8>> = vec![Some(0)];
    for (symbol, &(code, len)) in HUFFMAN.iter().enumerate() {
        let mut at = 0usize;
        for i in (0..len).rev() {
            let bit = ((code >> i) & 1) as usize;
            if i == 0 {
                nodes[at][bit] = Child::Leaf(symbol as u16);
                break;
            }
            at = match nodes[at][bit] {
                Child::Node(n) => n as usize,
                _ => {
                    let n = nodes.len();
                    nodes.push([Child::Missing; 2]);
                    let depth = len - i;
                    ones.push(match (ones[at], bit) {
                        (Some(_), 1) => Some(depth),
                        _ => None,
                    });
                    nodes[at][bit] = Child::Node(n as u16);
                    n
                }
            };
        }
    }
    debug_assert_eq!(nodes.len(), 256, "257 leaves hang on 256 internal nodes");
    let steps = (0..nodes.len())
        .map(|from| {
            let mut row = [Step::default(); 16];
            for (nibble, step) in row.iter_mut().enumerate() {
                let mut at = from;
                for i in (0..4).rev() {
                    let bit = (nibble >> i) & 1;
                    match nodes[at][bit] {
                        Child::Node(n) => at = n as usize,
                        Child::Leaf(EOS) | Child::Missing => {
                            step.flags = FAIL;
                            break;
                        }
                        Child::Leaf(symbol) => {
                            // A code is at least 5 bits: a nibble completes one symbol at most.
                            step.symbol = symbol as u8;
                            step.flags |= EMIT;
                            at = 0;
                        }
                    }
                }
                step.next = at as u8;
            }
            row
        })
        .collect();
    let may_end = ones.iter().map(|o| o.is_some_and(|d| d <= 7)).collect();
    Machine { steps, may_end }
}

/// Appends the decoding of `coded` to `out`; `Err` for EOS in the string, padding longer
/// than 7 bits or not of ones (all errors of the peer's making).
pub(super) fn decode(coded: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
    let machine = machine();
    out.reserve(coded.len() * 8 / 5);
    let mut state = 0usize;
    for &byte in coded {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = machine.steps[state][nibble as usize];
            if step.flags & FAIL != 0 {
                return Err(());
            }
            if step.flags & EMIT != 0 {
                out.push(step.symbol);
            }
            state = step.next as usize;
        }
    }
    match machine.may_end[state] {
        true => Ok(()),
        false => Err(()),
    }
}

/// The Huffman encoding of `s` (RFC 7541 §5.2: EOS's leading ones pad the last byte), for
/// tests: the encoder writes no coded strings.
#[cfg(test)]
pub(super) fn encode(s: &[u8]) -> Vec<u8> {
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u64, 0u32);
    for &b in s {
        let (code, len) = HUFFMAN[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn rfc_7541_examples_decode() {
        // C.4.1: "www.example.com"; C.4.2: "no-cache"; C.4.3: "custom-key".
        let cases: [(&[u8], &[u8]); 3] = [
            (
                &[
                    0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
                ],
                b"www.example.com",
            ),
            (&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf], b"no-cache"),
            (
                &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f],
                b"custom-key",
            ),
        ];
        for (coded, plain) in cases {
            let mut out = Vec::new();
            decode(coded, &mut out).unwrap();
            assert_eq!(out, plain);
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        for window in all.windows(7).chain([&all[..]]) {
            let mut out = Vec::new();
            decode(&encode(window), &mut out).unwrap();
            assert_eq!(out, window);
        }
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // "a" is 00011 (5 bits): padded with zeros instead of ones.
        assert!(decode(&[0b0001_1000], &mut out).is_err());
        // A whole byte of ones after a complete symbol: 8 bits of padding.
        assert!(decode(&[0b0001_1111, 0xff], &mut out).is_err());
        // EOS itself (30 ones) in the string.
        assert!(decode(&[0xff, 0xff, 0xff, 0xff], &mut out).is_err());
        // The empty string and a string padded with up to 7 ones are fine.
        out.clear();
        decode(&[], &mut out).unwrap();
        decode(&[0b0001_1111], &mut out).unwrap();
        assert_eq!(out, b"a");
    }
}
