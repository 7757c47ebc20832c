//! The mutations: byte- and field-level edits of one part of an input, dictionary words
//! for the text formats, and splices between inputs of the corpus.

use crate::Input;

/// xorshift64*: the fuzzer's only randomness, so a run is reproducible from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Integers that sit on the edges parsers get wrong.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    7,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    u64::MAX,
];

/// Mutates `input` in place with one to four edits.
pub fn mutate(rng: &mut Rng, input: &mut Input, corpus: &[Input], dictionary: &[&str]) {
    let part = rng.below(input.parts.len());
    for _ in 0..1 + rng.below(4) {
        let donor = &corpus[rng.below(corpus.len())];
        let donor = donor.parts.get(part).map(|p| &p.bytes[..]).unwrap_or(&[]);
        edit(rng, &mut input.parts[part].bytes, donor, dictionary);
    }
}

fn edit(rng: &mut Rng, b: &mut Vec<u8>, donor: &[u8], dictionary: &[&str]) {
    let len = b.len();
    let at = |rng: &mut Rng| if len == 0 { 0 } else { rng.below(len) };
    match rng.below(10) {
        0 if len > 0 => {
            let i = at(rng);
            b[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = at(rng);
            b[i] = rng.next_u64() as u8;
        }
        2 | 3 if len >= 8 => {
            // A 1-, 2-, 4- or 8-byte little-endian field set to an edge value, or nudged.
            let width = 1 << rng.below(4);
            let i = rng.below(len - width + 1);
            let mut v = INTERESTING[rng.below(INTERESTING.len())];
            if rng.chance(3) {
                let old = read_le(&b[i..i + width]);
                v = old.wrapping_add(rng.below(33) as u64).wrapping_sub(16);
            }
            b[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
        }
        4 if len > 0 => {
            let i = at(rng);
            let n = 1 + rng.below((len - i).min(64));
            b.drain(i..i + n);
        }
        5 if len > 0 => {
            // Duplicates a range (repeated keys, tensors, template blocks).
            let i = at(rng);
            let n = 1 + rng.below((len - i).min(256));
            let copy = b[i..i + n].to_vec();
            let to = at(rng);
            b.splice(to..to, copy);
        }
        6 if len > 0 => b.truncate(at(rng)),
        7 if !dictionary.is_empty() => {
            let word = dictionary[rng.below(dictionary.len())].as_bytes();
            let to = at(rng);
            b.splice(to..to, word.iter().copied());
        }
        8 if !donor.is_empty() => {
            // A range of another input in the same place.
            let i = rng.below(donor.len());
            let n = 1 + rng.below((donor.len() - i).min(512));
            let to = at(rng);
            let end = (to + n).min(len);
            b.splice(to..end, donor[i..i + n].iter().copied());
        }
        _ => {
            let to = at(rng);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            b.splice(to..to, bytes);
        }
    }
}

fn read_le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0, |v, &x| (v << 8) | x as u64)
}
