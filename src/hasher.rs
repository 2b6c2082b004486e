//! [`SipState`]: the service's default hasher of client keys, SipHash-1-3 under 128 random key
//! bits: the very function std's `RandomState` computes, written so that a key's integers cost
//! no more than their rounds.
//!
//! Client keys are chosen by clients (addresses, API keys, header values), and the hash picks
//! the buckets a client's state may live in: keys made to collide would crowd other clients out.
//! SipHash under a secret key is the hash std's authors chose against that (HashDoS), and what
//! this one computes is SipHash-1-3 of the same bytes std's `DefaultHasher` would hash, under
//! keys drawn from std's own random source, and stays SipHash-1-3 whatever std's default becomes.
//! Only the cost differs: std's hasher takes every integer as a byte slice through its general
//! buffering path, where this one folds an integer of 8 bytes or fewer into the pending word with
//! one shift and one or; and what depends on the keys alone (their XOR with SipHash's constants,
//! the first round's opening steps) is computed once per [`SipState`], not once per hash. The
//! service's lookup of a `u64` client executes about 57 instructions fewer with it in the default
//! release profile (BENCHMARKS.md, "Instructions per decision": 289 with std's `RandomState`,
//! 232); with thin LTO, which folds std's path as well, 10 fewer (244, 234).

use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// Builds [`SipHasher13`]s under one pair of random keys, drawn when it is made: the default
/// hasher of [`ServiceBuilder`](crate::ServiceBuilder) and
/// [`RateLimiterService`](crate::RateLimiterService).
///
/// A hash is SipHash-1-3 of the bytes std's `DefaultHasher` would hash for the same writes (the
/// function std's `RandomState` computes today, and this one keeps computing whatever std's
/// default becomes), under 128 key bits drawn from std's own random source; only the cost of an
/// integer differs (see BENCHMARKS.md, "Instructions per decision"). Each `SipState` has keys
/// of its own, so the hash of a key differs from one service (and one process) to the next, and
/// clients cannot aim at a collision. Clones share their keys; neither type prints them.
#[derive(Clone)]
pub struct SipState {
    /// SipHash's state before the first word, made from the keys once (their XOR with the
    /// algorithm's constants), so that a hash does not redo it.
    initial: [u64; 4],
}

impl SipState {
    /// A state with 128 fresh random key bits.
    pub fn new() -> Self {
        // std's `RandomState` is keyed from the operating system's random source; two of its
        // hashes under one fresh state are 128 bits no one can foresee without its keys.
        let random = std::hash::RandomState::new();
        SipState {
            initial: initial_state(random.hash_one(0_u8), random.hash_one(1_u8)),
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
        SipHasher13(Sip::from_initial(self.initial))
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

/// Forwards each of `Hasher`'s methods named to the inner [`Sip`].
macro_rules! forward {
    ($($method:ident: $int:ty),* $(,)?) => {$(
        #[inline]
        fn $method(&mut self, value: $int) {
            self.0.$method(value);
        }
    )*};
}

impl Hasher for SipHasher13 {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    forward!(
        write_u8: u8, write_u16: u16, write_u32: u32, write_u64: u64, write_usize: usize,
        write_i8: i8, write_i16: i16, write_i32: i32, write_i64: i64, write_isize: isize,
    );

    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

// `write_usize` takes a `usize` as one integer of 8 bytes or fewer.
const _: () = assert!(size_of::<usize>() <= 8);

/// Hands a write of an unsigned integer of 8 bytes or fewer to [`Sip::write_int`], which takes
/// its bytes in the order std's default methods write them (native, read little-endian by
/// SipHash). (128-bit integers keep `Hasher`'s default: their bytes, through `write`.)
macro_rules! write_ints {
    ($($method:ident: $int:ty),* $(,)?) => {$(
        #[inline]
        fn $method(&mut self, value: $int) {
            self.write_int(value.to_le() as u64, size_of::<$int>());
        }
    )*};
}

/// Hands a write of a signed integer to the unsigned one of its width: the same bytes.
macro_rules! write_signed {
    ($($method:ident: $int:ty => $unsigned:ident: $as:ty),* $(,)?) => {$(
        #[inline]
        fn $method(&mut self, value: $int) {
            self.$unsigned(value as $as);
        }
    )*};
}

impl<const C: usize, const D: usize> Hasher for Sip<C, D> {
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

    write_ints!(
        write_u8: u8, write_u16: u16, write_u32: u32, write_u64: u64, write_usize: usize,
    );

    write_signed!(
        write_i8: i8 => write_u8: u8, write_i16: i16 => write_u16: u16,
        write_i32: i32 => write_u32: u32, write_i64: i64 => write_u64: u64,
        write_isize: isize => write_usize: usize,
    );

    #[inline]
    fn finish(&self) -> u64 {
        let mut end = self.clone();
        let last = ((self.length as u64 & 0xff) << 56) | self.pending;
        end.word(last);
        // (`v2` is not one the opening taken by `word` reads.)
        end.v2 ^= 0xff;
        end.rounds(D);
        end.v0 ^ end.v1 ^ end.v2 ^ end.v3
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

/// SipHash's state under the keys `k0` and `k1` before the first word, as [`Sip`] keeps it:
/// with the first round's opening steps taken (see [`Sip::round_opening`]).
fn initial_state(k0: u64, k1: u64) -> [u64; 4] {
    let mut state = Sip::<1, 3> {
        v0: k0 ^ 0x736f_6d65_7073_6575,
        v1: k1 ^ 0x646f_7261_6e64_6f6d,
        v2: k0 ^ 0x6c79_6765_6e65_7261,
        v3: k1 ^ 0x7465_6462_7974_6573,
        pending: 0,
        pending_len: 0,
        length: 0,
    };
    state.round_opening();
    [state.v0, state.v1, state.v2, state.v3]
}

impl<const C: usize, const D: usize> Sip<C, D> {
    #[cfg(test)]
    fn new(k0: u64, k1: u64) -> Self {
        Self::from_initial(initial_state(k0, k1))
    }

    /// A hasher from the state [`initial_state`] made.
    #[inline]
    fn from_initial([v0, v1, v2, v3]: [u64; 4]) -> Self {
        const {
            assert!(
                C >= 1 && D >= 1,
                "SipHash makes at least one round of each kind"
            )
        };
        Sip {
            v0,
            v1,
            v2,
            v3,
            pending: 0,
            pending_len: 0,
            length: 0,
        }
    }

    /// A SipRound's opening steps: they read and write `v0` and `v1` alone, which nothing
    /// between two rounds changes (a word is XORed into `v3` before its rounds, into `v0` after
    /// them, where this follows). So the state is kept with the next round's opening taken:
    /// taken at the end of a word for the next, and for the first word once per key, in
    /// [`initial_state`].
    #[inline(always)]
    fn round_opening(&mut self) {
        self.v0 = self.v0.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(13) ^ self.v0;
        self.v0 = self.v0.rotate_left(32);
    }

    /// The rest of a SipRound, after [`Sip::round_opening`].
    #[inline(always)]
    fn round_rest(&mut self) {
        self.v2 = self.v2.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(16) ^ self.v2;
        self.v0 = self.v0.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(21) ^ self.v0;
        self.v2 = self.v2.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(17) ^ self.v2;
        self.v2 = self.v2.rotate_left(32);
    }

    /// `rounds` SipRounds (at least one) on a state kept with the first one's opening taken.
    #[inline(always)]
    fn rounds(&mut self, rounds: usize) {
        self.round_rest();
        for _ in 1..rounds {
            self.round_opening();
            self.round_rest();
        }
    }

    /// Compresses one whole message word, and takes the next round's opening.
    #[inline(always)]
    fn word(&mut self, word: u64) {
        self.v3 ^= word;
        self.rounds(C);
        self.v0 ^= word;
        self.round_opening();
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
}

/// Up to 8 bytes read as a little-endian integer.
#[inline(always)]
fn little_endian(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

// Shared with the tests of the public API (`tests/review_hasher.rs`).
#[cfg(test)]
#[path = "../tests/support/hasher_writes.rs"]
mod hasher_writes;

#[cfg(test)]
mod tests {
    use super::hasher_writes::{Write, any_write, hash, one_of_each};
    use super::*;
    use proptest::prelude::*;
    use std::hash::{DefaultHasher, Hash};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    use std::time::Duration;

    /// SipHash-1-3 under keys 0 and 0: what std's `DefaultHasher::new()` computes today (a later
    /// std may change its algorithm, which would fail the tests against it and leave those
    /// against SipHash-2-4, whose std type is documented as such).
    fn ours() -> SipHasher13 {
        SipHasher13(Sip::new(0, 0))
    }

    /// SipHash-2-4 under given keys: std's (deprecated, stable, documented as 2-4) `SipHasher`.
    #[allow(deprecated)]
    fn std_sip24(k0: u64, k1: u64) -> std::hash::SipHasher {
        std::hash::SipHasher::new_with_keys(k0, k1)
    }

    const SEEDS: [u64; 5] = [
        0,
        u64::MAX,
        0x0102_0304_0506_0708,
        0x8000_0000_0000_0080,
        0xfedc_ba98_7654_3210,
    ];

    /// Every kind of write after every count of pending bytes (0 to 15, written as one slice or
    /// byte by byte), followed by 0 to 17 bytes: as std's SipHash-1-3 and SipHash-2-4.
    #[test]
    fn every_write_at_every_offset_agrees_with_std() {
        let mut cases = 0;
        for seed in SEEDS {
            let slices =
                (0..=17).map(|len| Write::Bytes((0..len).map(|i| i ^ seed as u8).collect()));
            for write in one_of_each(seed).into_iter().chain(slices) {
                for pending in 0..16_u8 {
                    for byte_by_byte in [false, true] {
                        for tail in [0_u8, 1, 3, 7, 8, 9, 17] {
                            let prefix: Vec<u8> = (0..pending).map(|i| 0xa0 + i).collect();
                            let mut writes = if byte_by_byte {
                                prefix.into_iter().map(Write::U8).collect()
                            } else {
                                vec![Write::Bytes(prefix)]
                            };
                            writes.push(write.clone());
                            writes.push(Write::Bytes((0..tail).map(|i| 0x50 ^ i).collect()));
                            assert_eq!(
                                hash(ours(), &writes),
                                hash(DefaultHasher::new(), &writes),
                                "SipHash-1-3 differs from std's on {writes:?}"
                            );
                            let (k0, k1) = (seed ^ 0x0706_0504_0302_0100, !seed);
                            assert_eq!(
                                hash(Sip::<2, 4>::new(k0, k1), &writes),
                                hash(std_sip24(k0, k1), &writes),
                                "SipHash-2-4 differs from std's on {writes:?} under {k0:#x}, {k1:#x}"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > 10_000);
    }

    /// Inputs of every length up to 600 (the length's low byte wraps past 255 and 511), in one
    /// write and split into two, and 1 MiB + 3 bytes in pieces of 7.
    #[test]
    fn long_inputs_agree_with_std() {
        let data: Vec<u8> = (0..600_u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..=data.len() {
            let bytes = &data[..len];
            let expected = hash(DefaultHasher::new(), &[Write::Bytes(bytes.to_vec())]);
            let splits: Vec<usize> = if len <= 80 {
                (0..=len).collect()
            } else {
                vec![1, 7, 8, 9, len / 2, len - 9, len - 1]
            };
            for split in splits {
                let mut two = ours();
                two.write(&bytes[..split]);
                two.write(&bytes[split..]);
                assert_eq!(two.finish(), expected, "length {len} split at {split}");
            }
        }
        let big: Vec<u8> = (0..(1 << 20) + 3_u32)
            .map(|i| (i ^ (i >> 8)) as u8)
            .collect();
        let mut std_hasher = DefaultHasher::new();
        std_hasher.write(&big);
        let mut pieces = ours();
        for piece in big.chunks(7) {
            pieces.write(piece);
        }
        assert_eq!(pieces.finish(), std_hasher.finish());
    }

    macro_rules! agree_with_std {
        ($($value:expr),* $(,)?) => {$(
            let (mut std_hasher, mut sip) = (DefaultHasher::new(), ours());
            $value.hash(&mut std_hasher);
            $value.hash(&mut sip);
            assert_eq!(sip.finish(), std_hasher.finish(), "{}", stringify!($value));
        )*};
    }

    /// The types client keys are made of, through their own `Hash`.
    #[test]
    fn key_types_agree_with_std() {
        let v4 = Ipv4Addr::new(203, 0, 113, 7);
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0xff00, 0x42, 0x8329);
        agree_with_std!(
            IpAddr::V4(v4),
            IpAddr::V6(v6),
            IpAddr::V6(v4.to_ipv6_mapped()),
            v4,
            v6,
            SocketAddr::new(IpAddr::V4(v4), 443),
            SocketAddr::new(IpAddr::V6(v6), 65535),
            String::new(),
            "api-key-0123456789abcdef0123456789abcdef",
            String::from("ü\u{10ffff}"),
            Box::<str>::from("boxed"),
            (7_u64, "tenant"),
            ("a", "bc"),
            ("ab", "c"),
            [0_u8; 16],
            vec![1_u16, 2, 3],
            Vec::<u64>::new(),
            'é',
            true,
            Some(3_u32),
            None::<u32>,
            u128::MAX,
            i128::MIN,
            -1_i8,
            i16::MIN,
            -2_i64,
            isize::MIN,
            usize::MAX,
            Duration::new(5, 999_999_999),
            (
                1_u8, 2_u16, 3_u32, 4_u64, 5_u128, 6_usize, "seven", [8_u8; 9]
            ),
        );
    }

    /// `finish` only reads: called between writes, or twice, it changes nothing.
    #[test]
    fn finish_between_writes_changes_nothing() {
        for seed in SEEDS {
            let writes = one_of_each(seed);
            let interleaved: Vec<Write> = writes
                .iter()
                .flat_map(|write| [Write::Finish, write.clone()])
                .collect();
            let expected = hash(DefaultHasher::new(), &writes);
            assert_eq!(hash(ours(), &interleaved), expected);
            let mut hasher = ours();
            for write in &writes {
                write.apply(&mut hasher);
            }
            assert_eq!(hasher.finish(), hasher.finish());
            assert_eq!(hasher.clone().finish(), expected);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// The rounds, the message words, the pending bytes and the last word are SipHash's:
        /// under 2 and 4 rounds, any keys and any writes hash as under std's SipHash-2-4.
        #[test]
        fn siphash_2_4_agrees_with_std(
            k0: u64,
            k1: u64,
            writes in proptest::collection::vec(any_write(300), 0..40),
        ) {
            prop_assert_eq!(hash(Sip::<2, 4>::new(k0, k1), &writes), hash(std_sip24(k0, k1), &writes));
        }

        /// Under 1 and 3 rounds, any writes hash as under std's `DefaultHasher::new()`.
        #[test]
        fn siphash_1_3_agrees_with_std_default_hasher(
            writes in proptest::collection::vec(any_write(300), 0..40),
        ) {
            prop_assert_eq!(hash(ours(), &writes), hash(DefaultHasher::new(), &writes));
        }
    }

    #[test]
    fn each_state_has_keys_of_its_own_and_prints_none() {
        // States of one thread (whose std keys differ by one in `k0`) and of others.
        let mut states: Vec<SipState> = (0..2_000).map(|_| SipState::new()).collect();
        let threads: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| (0..100).map(|_| SipState::new()).collect::<Vec<_>>()))
            .collect();
        states.extend(
            threads
                .into_iter()
                .flat_map(|thread| thread.join().unwrap()),
        );
        let mut keys = std::collections::HashSet::new();
        for state in &states {
            assert!(
                // `k0` and `k1` XORed with constants (words the round's opening leaves).
                keys.insert(state.initial[2]) && keys.insert(state.initial[3]),
                "a key drawn twice"
            );
        }
        let (first, clone) = (&states[0], states[0].clone());
        assert!((0..64_u64).all(|key| first.hash_one(key) == clone.hash_one(key)));
        let mut hasher = first.build_hasher();
        hasher.write_u64(42);
        assert_eq!(format!("{hasher:#?}"), "SipHasher13 { .. }");
        assert_eq!(format!("{first:#?}"), "SipState { .. }");
    }
}
