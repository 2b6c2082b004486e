//! The local deny cache: a client Redis denied until an instant is denied in process until then,
//! without a round trip.
//!
//! Sound for every method: a denial's `retry_after` is the earliest instant the same request can
//! be granted, and nothing but a refund or a give-back can make a client's state more generous
//! sooner (decisions only take permits). A node that refunds or gives back forgets its own cached
//! denial of the client ([`DenyCache::remove`]); another node's is held for at most
//! [`MAX_HOLD_NANOS`] (1 s), so that a client whose permits came back elsewhere is asked of Redis
//! again within a second: meanwhile the cache can admit less, never more. A denial of `n` permits also answers any request for `n` or more. The instant
//! is measured from when the request was *sent*, which is no later than when Redis decided, so a
//! cached denial never outlasts the real one: the cache can only save round trips, never change a
//! decision beyond the round trip's own latency.
//!
//! # Cost: O(1) at any fill
//!
//! The table is allocated whole when the cache is built: `capacity` slots (rounded down to a
//! multiple of [`WAYS`] when at least [`WAYS`]) in buckets of [`WAYS`] slots, each bucket behind
//! its own lock, held for at most [`WAYS`] comparisons and never across an await. A key's bucket
//! comes from a keyed 64-bit hash (std's `RandomState`, seeded per cache, so that clients cannot
//! choose names that crowd one bucket). `get` and `insert` lock one bucket and look at its slots
//! only: nothing ever scans the table, and the cache never holds more than its slots.
//!
//! # Collisions can only miss
//!
//! Each slot stores its key in full, and a lookup compares it (the hash, compared first, is a
//! filter only, read from the bucket's first cache line). Two keys sharing a hash or a bucket are two entries; all a collision can do is
//! displace an entry, so that a later lookup misses and asks Redis. A stored fingerprint alone
//! could answer one client with another's denial, so the key is kept, at the cost of its bytes.
//!
//! # Replacement
//!
//! An insert for a key its bucket holds overwrites that entry (the newer denial, sound on its
//! own). Otherwise it takes an empty slot, else one whose denial has expired, else the slot of
//! the denial that expires first (a denial expires here at the end of its hold), unless the new
//! one expires no later: then the new one is not kept. A bucket full of live denials thus keeps the ones that save the most round trips. A
//! lookup that meets its entry expired frees the slot.
//!
//! Memory: 96 bytes a slot (a bucket of 4 and its lock on 6 cache lines), allocated up front
//! (9.6 MB for the default 100 000), plus the bytes of each key held.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::clock::duration_to_nanos;
use crate::{Decision, Rule};

/// Slots per bucket: the most a lookup or an insert compares.
pub(super) const WAYS: usize = 4;

/// The longest a denial is held, in nanoseconds, however long it lasts: the most a refund or a
/// give-back made by another node waits to be seen here. A client denied for longer costs one
/// round trip a second on this node.
pub(super) const MAX_HOLD_NANOS: u64 = 1_000_000_000;

/// One cached denial.
#[derive(Debug, Clone, Copy)]
struct Entry {
    rule: Rule,
    /// The permits that were denied.
    n: u64,
    remaining: u64,
    /// Nanoseconds after the cache's origin: until when it is denied, and when the quota is
    /// whole again.
    until: u64,
    reset_at: u64,
    /// Until when the cache answers it: `until`, or [`MAX_HOLD_NANOS`] after the request was
    /// sent if sooner.
    held_until: u64,
}

/// A held denial and the key it is for.
#[derive(Debug)]
struct Held {
    plan: usize,
    client: Box<str>,
    entry: Entry,
}

/// A denial's key: the plan's index and the client, borrowed (a key is copied into the cache on
/// insert only, so that a lookup allocates nothing).
pub(super) type Key<'a> = (usize, &'a str);

/// One bucket: its slots' hashes side by side, so that a lookup compares them in the cache line
/// of the bucket's lock and touches only the slot whose hash matches.
#[derive(Debug, Default)]
struct Bucket {
    /// The hash of each slot's key; meaningless for an empty slot.
    hashes: [u64; WAYS],
    slots: [Option<Held>; WAYS],
}

/// A bucket and its lock, on cache lines of their own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line(Mutex<Bucket>);

pub(super) struct DenyCache<S = RandomState> {
    origin: Instant,
    hasher: S,
    buckets: Box<[Line]>,
    /// Slots used in each bucket: [`WAYS`], or the capacity when it is smaller.
    ways: usize,
    /// Slots holding an entry, live or expired.
    held: AtomicUsize,
}

impl<S: BuildHasher> fmt::Debug for DenyCache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("capacity", &self.capacity())
            .field("held", &self.len())
            .finish_non_exhaustive()
    }
}

impl DenyCache {
    /// A cache of at most `capacity` denials (at least 1).
    pub(super) fn new(capacity: usize) -> DenyCache {
        DenyCache::with_hasher(capacity, RandomState::new())
    }
}

impl<S: BuildHasher> DenyCache<S> {
    /// [`DenyCache::new`] with the keys hashed by `hasher`.
    fn with_hasher(capacity: usize, hasher: S) -> DenyCache<S> {
        let capacity = capacity.max(1);
        let ways = capacity.min(WAYS);
        let buckets = capacity / ways;
        DenyCache {
            origin: Instant::now(),
            hasher,
            buckets: (0..buckets).map(|_| Line::default()).collect(),
            ways,
            held: AtomicUsize::new(0),
        }
    }

    /// The most denials the cache holds.
    pub(super) fn capacity(&self) -> usize {
        self.buckets.len() * self.ways
    }

    /// Nanoseconds since the cache's origin.
    pub(super) fn now(&self) -> u64 {
        duration_to_nanos(self.origin.elapsed())
    }

    /// The denial in force for `key` and `n` permits, as of now.
    pub(super) fn get(&self, key: Key<'_>, n: u64) -> Option<Decision> {
        self.get_at(key, n, self.now())
    }

    /// Remembers `decision`, a denial of `n` permits for `key` by a request sent at `sent_at`.
    pub(super) fn insert(&self, key: Key<'_>, n: u64, sent_at: u64, decision: &Decision) {
        self.insert_at(key, n, sent_at, decision, self.now());
    }

    /// Forgets the denial held for `key`, if any: its client's state became more generous (a
    /// refund, a give-back). A request sent before and answered after may put a denial back,
    /// which can only refuse what Redis would grant, never grant what it would refuse.
    pub(super) fn remove(&self, key: Key<'_>) {
        let hash = self.hash(key);
        let mut bucket = self.bucket(hash);
        if let Some(way) = self.find(&bucket, hash, key)
            && bucket.slots[way].take().is_some()
        {
            // Relaxed: a count for reports; nothing is published through it.
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The denials held, live or expired but not yet met.
    pub(super) fn len(&self) -> usize {
        // Relaxed: a count for reports; nothing is published through it.
        self.held.load(Ordering::Relaxed)
    }

    /// [`DenyCache::get`] at `now`.
    fn get_at(&self, key: Key<'_>, n: u64, now: u64) -> Option<Decision> {
        let hash = self.hash(key);
        let mut bucket = self.bucket(hash);
        let way = self.find(&bucket, hash, key)?;
        let entry = bucket.slots[way].as_ref()?.entry;
        if now >= entry.held_until {
            bucket.slots[way] = None;
            self.held.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        drop(bucket);
        if n < entry.n {
            return None;
        }
        Some(Decision::denied(
            entry.rule,
            entry.remaining,
            entry.until - now,
            entry.reset_at.saturating_sub(now),
        ))
    }

    /// [`DenyCache::insert`] at `now`.
    fn insert_at(&self, key: Key<'_>, n: u64, sent_at: u64, decision: &Decision, now: u64) {
        let Some(rule) = Rule::from_parts(decision.limit(), duration_to_nanos(decision.window()))
        else {
            return;
        };
        let entry = Entry {
            rule,
            n,
            remaining: decision.remaining(),
            until: sent_at.saturating_add(duration_to_nanos(decision.retry_after())),
            reset_at: sent_at.saturating_add(duration_to_nanos(decision.reset_after())),
            held_until: 0,
        };
        let entry = Entry {
            held_until: entry.until.min(sent_at.saturating_add(MAX_HOLD_NANOS)),
            ..entry
        };
        if entry.held_until <= now {
            return;
        }
        let hash = self.hash(key);
        let mut bucket = self.bucket(hash);
        let way = match self.find(&bucket, hash, key) {
            Some(same) => same,
            None => {
                // Empty and expired slots first (both ranked `now`), then the live denial that
                // expires first.
                let (victim, until) = bucket.slots[..self.ways]
                    .iter()
                    .map(|slot| {
                        slot.as_ref()
                            .map_or(now, |held| held.entry.held_until.max(now))
                    })
                    .enumerate()
                    .min_by_key(|&(_, until)| until)
                    .unwrap_or((0, now));
                if until >= entry.held_until {
                    return;
                }
                victim
            }
        };
        if bucket.slots[way].is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        bucket.hashes[way] = hash;
        bucket.slots[way] = Some(Held {
            plan: key.0,
            client: key.1.into(),
            entry,
        });
    }

    /// The hash of `key`: the client's keyed hash, with the plan's index mixed in by a
    /// multiplication (the client's hash alone is what a client cannot predict; the plan
    /// spreads one client's plans over buckets without hashing more bytes).
    fn hash(&self, (plan, client): Key<'_>) -> u64 {
        self.hasher.hash_one(client) ^ (plan as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The slot of `bucket` holding `key`, whose hash is `hash`.
    fn find(&self, bucket: &Bucket, hash: u64, (plan, client): Key<'_>) -> Option<usize> {
        (0..self.ways).find(|&way| {
            bucket.hashes[way] == hash
                && bucket.slots[way]
                    .as_ref()
                    .is_some_and(|held| held.plan == plan && *held.client == *client)
        })
    }

    /// The bucket of `hash`, locked.
    fn bucket(&self, hash: u64) -> MutexGuard<'_, Bucket> {
        // The hash's high bits pick the bucket, without a division.
        let index = ((u128::from(hash) * self.buckets.len() as u128) >> 64) as usize;
        // Nothing panics while a bucket is locked, and every write leaves it whole: a poisoned
        // lock holds a valid bucket.
        self.buckets[index]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn denial(retry: Duration) -> Decision {
        let rule = Rule::per_second(5).unwrap();
        let nanos = duration_to_nanos(retry);
        Decision::denied(rule, 1, nanos, nanos)
    }

    #[test]
    fn a_denial_of_n_answers_n_or_more_until_its_instant() {
        let cache = DenyCache::new(10);
        let sent_at = cache.now();
        cache.insert((0, "c"), 2, sent_at, &denial(Duration::from_secs(60)));
        assert!(cache.get((0, "c"), 1).is_none(), "fewer permits may pass");
        let hit = cache.get((0, "c"), 2).unwrap();
        assert!(hit.is_denied());
        assert_eq!(hit.remaining(), 1);
        assert!(hit.retry_after() <= Duration::from_secs(60));
        assert!(cache.get((0, "c"), 3).is_some());
        assert!(cache.get((0, "other"), 3).is_none());
    }

    #[test]
    fn a_removed_denial_answers_nothing_and_frees_its_slot() {
        let cache = DenyCache::new(10);
        let sent_at = cache.now();
        cache.insert((0, "c"), 1, sent_at, &denial(Duration::from_secs(60)));
        cache.insert((0, "d"), 1, sent_at, &denial(Duration::from_secs(60)));
        cache.remove((0, "c"));
        cache.remove((0, "e"));
        assert!(cache.get((0, "c"), 1).is_none());
        assert!(
            cache.get((0, "d"), 1).is_some(),
            "another client's denial stays"
        );
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_long_denial_is_held_for_a_second_at_most() {
        let cache = DenyCache::new(10);
        cache.insert_at((0, "c"), 1, 0, &denial(Duration::from_secs(3_600)), 0);
        let hit = cache.get_at((0, "c"), 1, MAX_HOLD_NANOS - 1).expect("held");
        assert_eq!(
            hit.retry_after(),
            Duration::from_nanos(3_600_000_000_000 - (MAX_HOLD_NANOS - 1)),
            "the denial's own wait is reported"
        );
        assert!(
            cache.get_at((0, "c"), 1, MAX_HOLD_NANOS).is_none(),
            "asked of Redis again"
        );
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_denial_expires_at_its_retry_instant() {
        let cache = DenyCache::new(10);
        cache.insert((0, "c"), 1, cache.now(), &denial(Duration::from_millis(2)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(cache.get((0, "c"), 1).is_none());
        assert_eq!(cache.len(), 0, "an expired entry is dropped when met");
    }

    #[test]
    fn a_full_cache_takes_expired_slots_then_replaces_the_soonest_to_expire() {
        let cache = DenyCache::new(2);
        cache.insert((0, "a"), 1, cache.now(), &denial(Duration::from_millis(1)));
        cache.insert((0, "b"), 1, cache.now(), &denial(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(3));
        cache.insert((0, "c"), 1, cache.now(), &denial(Duration::from_secs(60)));
        assert!(
            cache.get((0, "c"), 1).is_some(),
            "room made by taking the expired one's slot"
        );
        assert!(cache.get((0, "b"), 1).is_some());
        cache.insert((0, "d"), 1, cache.now(), &denial(Duration::from_secs(60)));
        assert_eq!(cache.len(), 2, "never past its capacity");
        assert!(
            cache.get((0, "d"), 1).is_some(),
            "full of live denials: replaced"
        );
        assert!(
            cache.get((0, "b"), 1).is_none(),
            "the one expiring first left"
        );
        assert!(cache.get((0, "c"), 1).is_some());
        cache.insert((0, "e"), 1, 0, &denial(Duration::from_secs(1)));
        assert!(
            cache.get((0, "e"), 1).is_none(),
            "a denial expiring before every held one is not kept"
        );
        assert!(cache.get((0, "c"), 1).is_some() && cache.get((0, "d"), 1).is_some());
    }

    /// A deterministic stand-in for the cache's clock and load: `count` clients `k{i}` of plan 0, each
    /// denied `n = 1 + i % 3` permits until `1_000 + i` (all live at `now = 500`).
    fn denial_of(i: u64) -> (String, u64, Decision) {
        let rule = Rule::per_second(5).unwrap();
        let until = 1_000 + i;
        (
            format!("k{i}"),
            1 + i % 3,
            Decision::denied(rule, 0, until, until),
        )
    }

    #[test]
    fn far_past_its_capacity_it_replaces_answers_only_what_was_denied_and_stays_bounded() {
        let capacity = 1_000;
        let clients = 100_000;
        let now = 500;
        let cache = DenyCache::new(capacity);
        assert_eq!(cache.capacity(), capacity);
        for i in 0..clients {
            let (key, n, decision) = denial_of(i);
            cache.insert_at((0, &key), n, 0, &decision, now);
            // Each new denial expires after every held one, so it is always kept.
            let hit = cache.get_at((0, &key), n, now).expect("just inserted");
            assert_eq!(hit.retry_after(), Duration::from_nanos(1_000 + i - now));
            assert!(cache.get_at((0, &key), n - 1, now).is_none() || n == 1);
            assert!(cache.len() <= capacity, "{} held", cache.len());
        }
        let mut hits = 0;
        for i in 0..clients {
            let (key, n, _) = denial_of(i);
            if let Some(hit) = cache.get_at((0, &key), 3, now) {
                hits += 1;
                // Never longer than the real denial.
                assert!(hit.retry_after() <= Duration::from_nanos(1_000 + i - now));
            }
            if n > 1 {
                assert!(
                    cache.get_at((0, &key), n - 1, now).is_none(),
                    "fewer permits"
                );
            }
        }
        assert!(hits <= capacity);
        // The held ones are the latest to expire, bar collisions of buckets: most of a full table.
        assert!(hits >= capacity / 2, "{hits} of {capacity} held");
        for i in 0..1_000 {
            assert!(
                cache.get_at((1, &format!("k{i}")), 3, now).is_none(),
                "never denied"
            );
            assert!(
                cache
                    .get_at((0, &format!("k{}", clients + i)), 3, now)
                    .is_none()
            );
        }
        // Every denial expires at its instant, and frees its slot when met.
        for i in 0..clients {
            let (key, _, _) = denial_of(i);
            assert!(cache.get_at((0, &key), 3, 1_000 + clients).is_none());
        }
        assert_eq!(cache.len(), 0);
    }

    /// Hashes every key to the same value: every pair of keys collides.
    #[derive(Debug, Clone, Copy)]
    struct OneHash;

    impl BuildHasher for OneHash {
        type Hasher = OneHasher;

        fn build_hasher(&self) -> OneHasher {
            OneHasher
        }
    }

    #[derive(Debug)]
    struct OneHasher;

    impl std::hash::Hasher for OneHasher {
        fn finish(&self) -> u64 {
            7
        }

        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn keys_that_share_a_hash_never_answer_for_one_another() {
        let cache = DenyCache::with_hasher(8, OneHash);
        let (key, n, decision) = denial_of(0);
        cache.insert_at((0, &key), n, 0, &decision, 500);
        assert!(
            cache.get_at((0, &key), n, 500).is_some(),
            "the control: it is held"
        );
        assert!(
            cache.get_at((0, "someone-else"), 3, 500).is_none(),
            "same hash, another key: a miss"
        );
        for i in 1..20 {
            let (key, n, decision) = denial_of(i);
            cache.insert_at((0, &key), n, 0, &decision, 500);
        }
        assert!(cache.len() <= cache.capacity());
        assert!(cache.get_at((0, "someone-else"), 3, 500).is_none());
    }

    #[test]
    fn concurrent_gets_and_inserts_stay_bounded_and_answer_only_their_own_keys() {
        let cache = DenyCache::new(64);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let cache = &cache;
                scope.spawn(move || {
                    for i in 0..20_000 {
                        let (key, n, decision) = denial_of(thread * 1_000_000 + i);
                        cache.insert_at((0, &key), n, 0, &decision, 500);
                        if let Some(hit) = cache.get_at((0, &key), 3, 500) {
                            let until = decision.retry_after();
                            assert_eq!(hit.retry_after(), until - Duration::from_nanos(500));
                        }
                        assert!(
                            cache
                                .get_at((1, &format!("{thread}:{i}")), 3, 500)
                                .is_none()
                        );
                    }
                });
            }
        });
        assert!(cache.len() <= 64, "{}", cache.len());
    }
}

/// The cost of `get` and `insert` at a given fill, natively and under callgrind: see
/// `measure_get_and_insert`.
#[cfg(test)]
mod measure {
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    use super::*;

    fn env(name: &str, default: usize) -> usize {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    }

    fn key(i: usize) -> String {
        format!("client-{i}")
    }

    #[inline(never)]
    fn counted_gets_hit(cache: &DenyCache, keys: &[String]) -> usize {
        keys.iter()
            .filter(|key| cache.get(black_box((0, key)), 1).is_some())
            .count()
    }

    #[inline(never)]
    fn counted_gets_miss(cache: &DenyCache, keys: &[String]) -> usize {
        // Counts the misses: a body of its own, which the linker cannot fold into the hits'.
        keys.iter()
            .filter(|key| cache.get(black_box((0, key)), 1).is_none())
            .count()
    }

    #[inline(never)]
    fn counted_inserts(cache: &DenyCache, keys: Vec<String>, sent_at: u64, denial: &Decision) {
        for key in keys {
            cache.insert(black_box((0, &key)), 1, sent_at, denial);
        }
    }

    /// Fills a cache of `DENY_CAPACITY` with `DENY_CLIENTS` live denials of distinct clients,
    /// then times `DENY_OPS` gets of cached clients (the most recent ones), as many of clients
    /// never denied, and `DENY_INSERTS` (default `DENY_OPS`) inserts of new clients. Under callgrind, `--collect-atstart=no
    /// --toggle-collect='*counted_*'` counts only those three loops (one function each).
    #[test]
    #[ignore = "a measurement: cargo test --release --all-features --lib measure -- --ignored --nocapture"]
    fn measure_get_and_insert() {
        let capacity = env("DENY_CAPACITY", 100_000);
        let clients = env("DENY_CLIENTS", 1_000_000);
        let ops = env("DENY_OPS", 10_000);
        let inserts = env("DENY_INSERTS", ops);
        let cache = DenyCache::new(capacity);
        let rule = Rule::per_second(5).unwrap();
        let minute = duration_to_nanos(Duration::from_secs(60));
        let denial = Decision::denied(rule, 0, minute, minute);
        let filled = Instant::now();
        for i in 0..clients {
            cache.insert((0, &key(i)), 1, cache.now(), &denial);
        }
        let filled = filled.elapsed();
        let hits: Vec<String> = (clients.saturating_sub(ops)..clients).map(key).collect();
        let misses: Vec<String> = (0..ops).map(|i| format!("1:absent-{i}")).collect();
        let fresh: Vec<String> = (clients..clients + inserts).map(key).collect();
        let started = Instant::now();
        let hit = counted_gets_hit(&cache, &hits);
        let get_hit = started.elapsed();
        let started = Instant::now();
        let missed = ops - counted_gets_miss(&cache, &misses);
        let get_miss = started.elapsed();
        let started = Instant::now();
        counted_inserts(&cache, fresh, cache.now(), &denial);
        let insert = started.elapsed();
        let per_op = |elapsed: Duration| elapsed.as_nanos() as f64 / ops as f64;
        println!(
            "capacity {capacity}, {clients} clients (filled in {filled:?}), {} held; \
             {ops} gets each: hit ({hit} hits) {:.0} ns/op, miss ({missed} hits) {:.0} ns/op; \
             {inserts} inserts: {:.0} ns/op",
            cache.len(),
            per_op(get_hit),
            per_op(get_miss),
            insert.as_nanos() as f64 / inserts as f64,
        );
    }
}
