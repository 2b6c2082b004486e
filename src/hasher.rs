//! [`SipState`]: the service's default hasher of client keys, SipHash-1-3 under 128 random key
//! bits: the very function std's `RandomState` computes, written so that a key's integers cost
//! no more than their rounds.
//!
//! Client keys are chosen by clients (addresses, API keys, header values), and the hash picks
//! the buckets a client's state may live in: keys made to collide would crowd other clients out.
//! SipHash under a secret key is the hash std's authors chose against that (HashDoS), and what
//! this one computes is SipHash-1-3 of the same bytes std's `DefaultHasher` would hash, under
//! keys drawn from std's own random source. Only the cost differs: std's hasher takes every
//! integer as a byte slice through its general buffering path, which costs a `u64` key about 56
//! instructions more than its five SipHash rounds, and an `IpAddr` about 88 (an integer of 8
//! bytes or fewer is folded into the pending word here as one shift and one or).

use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// Builds [`SipHasher13`]s under one pair of random keys, drawn when it is made: the default
/// hasher of [`ServiceBuilder`](crate::ServiceBuilder) and
/// [`RateLimiterService`](crate::RateLimiterService).
///
/// Each `SipState` has keys of its own, so the hash of a key differs from one service (and one
/// process) to the next, and clients cannot aim at a collision. Clones share their keys.
#[derive(Clone)]
pub struct SipState {
    k0: u64,
    k1: u64,
}

impl SipState {
    /// A state with 128 fresh random key bits.
    pub fn new() -> Self {
        // std's `RandomState` is keyed from the operating system's random source; two of its
        // hashes under one fresh state are 128 bits no one can foresee without its keys.
        let random = std::hash::RandomState::new();
        SipState {
            k0: random.hash_one(0_u8),
            k1: random.hash_one(1_u8),
        }
    }
}

impl Default for SipState {
    fn default() -> Self {
        SipState::new()
    }
}

impl fmt::Debug for SipState {
    // The keys are the secret that makes collisions unforeseeable: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SipState").finish_non_exhaustive()
    }
}

impl BuildHasher for SipState {
    type Hasher = SipHasher13;

    #[inline]
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13(Sip::new(self.k0, self.k1))
    }
}

/// SipHash-1-3 of the bytes written, under a [`SipState`]'s keys.
#[derive(Clone)]
pub struct SipHasher13(Sip<1, 3>);

impl fmt::Debug for SipHasher13 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SipHasher13").finish_non_exhaustive()
    }
}

/// Forwards every write of an integer to [`Sip::write_int`], which takes its bytes in the order
/// std's default methods write them (native, read little-endian by SipHash).
macro_rules! write_ints {
    ($($method:ident: $int:ty),* $(,)?) => {$(
        #[inline]
        fn $method(&mut self, value: $int) {
            self.0.write_int(u64::from(value.to_le()), size_of::<$int>());
        }
    )*};
}

impl Hasher for SipHasher13 {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    write_ints!(write_u8: u8, write_u16: u16, write_u32: u32, write_u64: u64);

    #[inline]
    fn write_usize(&mut self, value: usize) {
        // usize is 64 bits or fewer on every target std supports.
        self.0.write_int(value.to_le() as u64, size_of::<usize>());
    }

    #[inline]
    fn write_i8(&mut self, value: i8) {
        self.write_u8(value as u8);
    }

    #[inline]
    fn write_i16(&mut self, value: i16) {
        self.write_u16(value as u16);
    }

    #[inline]
    fn write_i32(&mut self, value: i32) {
        self.write_u32(value as u32);
    }

    #[inline]
    fn write_i64(&mut self, value: i64) {
        self.write_u64(value as u64);
    }

    #[inline]
    fn write_isize(&mut self, value: isize) {
        self.write_usize(value as usize);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// SipHash with `C` rounds per message word and `D` at the end, over a stream of bytes.
#[derive(Clone)]
struct Sip<const C: usize, const D: usize> {
    v0: u64,
    v1: u64,
    v2: u64,
    v3: u64,
    /// The bytes written since the last whole word, little-endian from bit 0.
    pending: u64,
    /// How many bytes `pending` holds (0 to 7).
    pending_len: usize,
    /// Bytes written in all, of which SipHash's last word keeps the low 8 bits.
    length: usize,
}

impl<const C: usize, const D: usize> Sip<C, D> {
    #[inline]
    fn new(k0: u64, k1: u64) -> Self {
        Sip {
            v0: k0 ^ 0x736f_6d65_7073_6575,
            v1: k1 ^ 0x646f_7261_6e64_6f6d,
            v2: k0 ^ 0x6c79_6765_6e65_7261,
            v3: k1 ^ 0x7465_6462_7974_6573,
            pending: 0,
            pending_len: 0,
            length: 0,
        }
    }

    #[inline(always)]
    fn round(&mut self) {
        self.v0 = self.v0.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(13) ^ self.v0;
        self.v0 = self.v0.rotate_left(32);
        self.v2 = self.v2.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(16) ^ self.v2;
        self.v0 = self.v0.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(21) ^ self.v0;
        self.v2 = self.v2.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(17) ^ self.v2;
        self.v2 = self.v2.rotate_left(32);
    }

    /// Compresses one whole message word.
    #[inline(always)]
    fn word(&mut self, word: u64) {
        self.v3 ^= word;
        for _ in 0..C {
            self.round();
        }
        self.v0 ^= word;
    }

    /// Writes the `size` (1 to 8) low bytes of `bytes`, the first byte lowest.
    #[inline(always)]
    fn write_int(&mut self, bytes: u64, size: usize) {
        self.length = self.length.wrapping_add(size);
        // `pending_len` is below 8, so the shift is too.
        self.pending |= bytes << (8 * self.pending_len);
        let room = 8 - self.pending_len;
        if size < room {
            self.pending_len += size;
            return;
        }
        let whole = self.pending;
        self.word(whole);
        self.pending_len = size - room;
        // The bytes that did not fit, if any (`room` is 8 only with nothing pending).
        self.pending = bytes.checked_shr(8 * room as u32).unwrap_or(0);
    }

    #[inline]
    fn write(&mut self, mut bytes: &[u8]) {
        if self.pending_len != 0 {
            let room = (8 - self.pending_len).min(bytes.len());
            let (head, rest) = bytes.split_at(room);
            self.write_int(little_endian(head), room);
            bytes = rest;
        }
        if bytes.is_empty() {
            return;
        }
        // Nothing is pending here: whole words go straight through.
        self.length = self.length.wrapping_add(bytes.len());
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.word(little_endian(word));
        }
        let rest = words.remainder();
        self.pending = little_endian(rest);
        self.pending_len = rest.len();
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut end = self.clone();
        let last = ((self.length as u64 & 0xff) << 56) | self.pending;
        end.word(last);
        end.v2 ^= 0xff;
        for _ in 0..D {
            end.round();
        }
        end.v0 ^ end.v1 ^ end.v2 ^ end.v3
    }
}

/// Up to 8 bytes read as a little-endian integer.
#[inline(always)]
fn little_endian(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::{DefaultHasher, Hash};

    /// One write of a key's `Hash`, of each kind std's `Hasher` has.
    #[derive(Debug, Clone)]
    enum Write {
        Bytes(Vec<u8>),
        U8(u8),
        U16(u16),
        U32(u32),
        U64(u64),
        U128(u128),
        Usize(usize),
        I32(i32),
        Isize(isize),
        Str(String),
    }

    impl Write {
        fn apply(&self, hasher: &mut impl Hasher) {
            match self {
                Write::Bytes(bytes) => hasher.write(bytes),
                Write::U8(value) => hasher.write_u8(*value),
                Write::U16(value) => hasher.write_u16(*value),
                Write::U32(value) => hasher.write_u32(*value),
                Write::U64(value) => hasher.write_u64(*value),
                Write::U128(value) => hasher.write_u128(*value),
                Write::Usize(value) => hasher.write_usize(*value),
                Write::I32(value) => hasher.write_i32(*value),
                Write::Isize(value) => hasher.write_isize(*value),
                Write::Str(text) => text.hash(hasher),
            }
        }
    }

    fn writes() -> impl Strategy<Value = Vec<Write>> {
        let write = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Write::Bytes),
            any::<u8>().prop_map(Write::U8),
            any::<u16>().prop_map(Write::U16),
            any::<u32>().prop_map(Write::U32),
            any::<u64>().prop_map(Write::U64),
            any::<u128>().prop_map(Write::U128),
            any::<usize>().prop_map(Write::Usize),
            any::<i32>().prop_map(Write::I32),
            any::<isize>().prop_map(Write::Isize),
            ".{0,20}".prop_map(Write::Str),
        ];
        proptest::collection::vec(write, 0..12)
    }

    fn hash(mut hasher: impl Hasher, writes: &[Write]) -> u64 {
        for write in writes {
            write.apply(&mut hasher);
        }
        hasher.finish()
    }

    /// SipHash-2-4 under given keys: std's (deprecated, stable, documented as 2-4) `SipHasher`.
    #[allow(deprecated)]
    fn std_sip24(k0: u64, k1: u64) -> std::hash::SipHasher {
        std::hash::SipHasher::new_with_keys(k0, k1)
    }

    /// The same rounds under 2 and 4 passes: this module's code, as a hasher.
    struct Sip24(Sip<2, 4>);

    impl Hasher for Sip24 {
        fn write(&mut self, bytes: &[u8]) {
            self.0.write(bytes);
        }
        fn write_u64(&mut self, value: u64) {
            self.0.write_int(value.to_le(), 8);
        }
        fn write_u32(&mut self, value: u32) {
            self.0.write_int(u64::from(value.to_le()), 4);
        }
        fn finish(&self) -> u64 {
            self.0.finish()
        }
    }

    proptest! {
        /// The rounds, the message words, the pending bytes and the last word are SipHash's:
        /// under 2 and 4 rounds they give what std's SipHash-2-4 gives for any keys and writes.
        #[test]
        fn siphash_2_4_agrees_with_std(k0: u64, k1: u64, writes in writes()) {
            prop_assert_eq!(
                hash(Sip24(Sip::new(k0, k1)), &writes),
                hash(std_sip24(k0, k1), &writes)
            );
        }

        /// Every kind of write, under 1 and 3 rounds, gives what std's `DefaultHasher::new()`
        /// gives: SipHash-1-3 under keys 0 and 0 today (a later std may change its algorithm,
        /// which would fail this test and call for the 2-4 test alone).
        #[test]
        fn siphash_1_3_agrees_with_std_default_hasher(writes in writes()) {
            let ours = SipHasher13(Sip::new(0, 0));
            prop_assert_eq!(hash(ours, &writes), hash(DefaultHasher::new(), &writes));
        }

        /// A key's hash is a function of its bytes: the same bytes in integers or in slices,
        /// split anywhere, hash alike.
        #[test]
        fn integers_hash_as_their_bytes(value: u64, small: u32, split in 0_usize..12) {
            let state = SipState::new();
            let mut bytes = value.to_ne_bytes().to_vec();
            bytes.extend_from_slice(&small.to_ne_bytes());
            let mut as_integers = state.build_hasher();
            as_integers.write_u64(value);
            as_integers.write_u32(small);
            let mut as_slices = state.build_hasher();
            as_slices.write(&bytes[..split]);
            as_slices.write(&bytes[split..]);
            prop_assert_eq!(as_integers.finish(), as_slices.finish());
        }
    }

    #[test]
    fn each_state_has_keys_of_its_own() {
        let (first, second) = (SipState::new(), SipState::new());
        let clone = first.clone();
        let keys: Vec<u64> = (0..64).collect();
        let differ = keys
            .iter()
            .filter(|key| first.hash_one(key) != second.hash_one(key))
            .count();
        assert_eq!(differ, keys.len(), "two states hashed a key alike");
        assert!(
            keys.iter()
                .all(|key| first.hash_one(key) == clone.hash_one(key))
        );
        assert_eq!(
            format!("{first:?}"),
            "SipState { .. }",
            "the keys are not printed"
        );
    }
}
