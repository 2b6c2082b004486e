//! Attacks on the service's default hasher through the public API (`SipState`, `SipHasher13`):
//! a key's hash must be a function of the bytes std's default `Hasher` methods would write
//! (whatever mix of integer and slice writes, split anywhere), two states must place keys apart,
//! and the service must use it by default. (Equality with std's SipHash-1-3 itself needs fixed
//! keys, and the keys' independence and secrecy need the fields: `src/hasher.rs`'s tests.)

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use tollgate::{
    Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder, SipHasher13, SipState,
};

#[path = "support/hasher_writes.rs"]
mod hasher_writes;
use hasher_writes::{Write, any_write, hash, one_of_each};

/// Records the bytes a sequence of writes stands for: every integer method left to std's
/// default (`write(&value.to_ne_bytes())`), as std's `DefaultHasher` takes them.
#[derive(Default)]
struct Recorder(Vec<u8>);

impl Hasher for Recorder {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    /// A `finish` between writes writes nothing.
    fn finish(&self) -> u64 {
        0
    }
}

fn bytes_of(writes: &[Write]) -> Vec<u8> {
    let mut recorder = Recorder::default();
    for write in writes {
        write.apply(&mut recorder);
    }
    recorder.0
}

fn hash_writes(state: &SipState, writes: &[Write]) -> u64 {
    hash(state.build_hasher(), writes)
}

fn hash_pieces<'a>(state: &SipState, pieces: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hasher = state.build_hasher();
    for piece in pieces {
        hasher.write(piece);
    }
    hasher.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Any mix of writes hashes as the bytes they stand for: in one slice, byte by byte, and cut
    /// at arbitrary points (empty pieces included).
    #[test]
    fn writes_hash_as_their_bytes(
        writes in proptest::collection::vec(any_write(70), 0..24),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let state = SipState::new();
        let bytes = bytes_of(&writes);
        let expected = hash_writes(&state, &writes);
        prop_assert_eq!(hash_pieces(&state, [&bytes[..]]), expected);
        prop_assert_eq!(hash_pieces(&state, bytes.chunks(1)), expected);
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        let pieces = cuts.windows(2).map(|pair| &bytes[pair[0]..pair[1]]);
        prop_assert_eq!(hash_pieces(&state, pieces), expected);
    }
}

/// Every integer width (and two strings) after every count of pending bytes (0 to 8),
/// deterministic.
#[test]
fn integers_at_every_offset_hash_as_their_bytes() {
    let state = SipState::new();
    let values = [
        0_u64,
        u64::MAX,
        0x0102_0304_0506_0708,
        0x8000_0000_0000_0001,
    ];
    for pending in 0..=8_u8 {
        for &value in &values {
            for kind in one_of_each(value) {
                let writes = [
                    Write::Bytes((0..pending).collect()),
                    kind,
                    Write::U8(0xee),
                    Write::Bytes(vec![0x11; 9]),
                ];
                assert_eq!(
                    hash_writes(&state, &writes),
                    hash_pieces(&state, [&bytes_of(&writes)[..]]),
                    "{writes:?}"
                );
            }
        }
    }
}

/// Keys that differ only where a prefix-sharing attacker would vary them (the last bytes of an
/// IPv6 address, a counter at the end of an API key) all hash apart under one state, and two
/// states (made back to back on one thread, where std's keys differ by one) place them apart.
#[test]
fn states_are_independent_and_keys_spread() {
    let (first, second) = (SipState::new(), SipState::new());
    let base = u128::from(Ipv6Addr::new(0x2001, 0xdb8, 7, 7, 0, 0, 0, 0));
    let mut seen = HashSet::new();
    let mut same_across = 0;
    for i in 0..100_000_u128 {
        let ip = IpAddr::V6(Ipv6Addr::from(base | i));
        let hash = first.hash_one(ip);
        assert!(seen.insert(hash), "a 64-bit collision among {i} addresses");
        // The store's fingerprint: the low 40 bits.
        same_across += usize::from(hash & ((1 << 40) - 1) == second.hash_one(ip) & ((1 << 40) - 1));
    }
    assert_eq!(same_across, 0, "two states gave addresses one fingerprint");

    // The high bits pick the bucket: 256 buckets over 65 536 API keys differing in one digit
    // run, a chi-square far under what even a poor hash gives (255 expected, about 23 apart).
    let mut buckets = [0_u32; 256];
    for i in 0..65_536_u32 {
        let key = format!("key-{i:08}");
        buckets[((u128::from(first.hash_one(&key)) * 256) >> 64) as usize] += 1;
    }
    let chi: f64 = buckets
        .iter()
        .map(|&n| (f64::from(n) - 256.0).powi(2) / 256.0)
        .sum();
    assert!(chi < 420.0, "buckets uneven: chi-square {chi}");
}

/// The service's and the builder's default hasher is `SipState`, and they are shareable.
#[test]
fn service_defaults_to_sip_state() -> Result<(), Box<dyn std::error::Error>> {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<SipState>();
    shareable::<SipHasher13>();

    let builder: ServiceBuilder<&str, FakeClock, SipState> =
        ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new());
    let service: RateLimiterService<IpAddr, &str, FakeClock, SipState> = builder
        .plan("free", Rule::per_second(2)?)
        .capacity(64)
        .build::<IpAddr>()?;
    let client = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    assert!(service.allow(&client, &"free")?);
    assert!(service.allow(&client, &"free")?);
    assert!(!service.allow(&client, &"free")?);
    let debug = format!("{service:?}");
    assert!(debug.contains("RateLimiterService"));
    Ok(())
}
