//! [`ClientStore`]: a plan's clients whose state is one word (the token bucket, the fixed window
//! and the sliding window counter under one limit), in a table of fixed size allocated when the
//! service is built: no allocation per client, no guard per decision, and memory bounded by the
//! capacity whatever number of distinct keys passes through.
//!
//! # Layout
//!
//! Slots in buckets of `B` (8 in production): a bucket is its insert lock (below), then `B` tag
//! words, then `B` state words (the lock first, so that it shares a cache line with the tags
//! that a decision reads right after it). A slot's tag is `version (16 bits) | busy (1) |
//! generation (6) | fingerprint (40) | retiring (1)`: free when the busy bit and the fingerprint
//! are 0, *being filled* by the one thread that claimed it when the busy bit is set, and
//! otherwise *live*: a state made under that version of the plan's limits for the key of that
//! fingerprint (40 bits of the key's keyed hash, never 0). The generation counts the states the
//! slot has held (wrapping at 64). The state word is the method's own (a TAT, a packed window),
//! stored XORed with the holding's salt (see below).
//!
//! A slot changes hands only through its tag: a thread that retires a live state first sets the
//! tag's retiring bit by an exchange from the tag it read, which exactly one thread wins for one
//! holding of the slot; only that thread then retires the state, and frees the slot, fills it
//! anew, or (when an idle state turned out active) puts the tag back. Decisions change only the
//! state, by the method's own exchange, so a retirement never lands on a state other than the
//! one whose tag it won. One lock word per bucket serializes the inserts of the keys whose
//! home the bucket is, and counts its holdings; decisions never take it (they read its count:
//! see below). A one-word client costs 16 bytes, and the locks one more per client.
//!
//! Keys are not stored: a key is its fingerprint and its two buckets (its *home*, from the
//! hash's high bits, and another from a remix of it). Two keys share a state only if they share
//! the 40-bit fingerprint and one's state sits in a bucket the other probes (its home always,
//! its other bucket once an insert of its home has put a state there: see [`OVERFLOWED`]). A
//! key whose look finds the other's state decides on it, so the two may share one state (one
//! limit's worth between them); but two keys of different homes insert under different locks,
//! so where their first requests meet, or where one's state is in the other's unprobed other
//! bucket, each may put its own, and a key may then find the other's before its own. Such a pair is granted at most two limits' worth between them per window (what they
//! would be granted apart: one key can use what the other leaves), never more. With a keyed
//! hash (the service's default is randomly seeded, so clients cannot aim at a collision), a key
//! that is not held meets a stored one by chance with probability at most `2 B / 2^40`: about
//! 1 in 7 * 10^10 per new key, so about one pair of clients in a service that sees 70 billion
//! new keys (one in 7,000 over ten million).
//!
//! # Protocol
//!
//! - **Decision on a known client** ([`decide`]): read the home lock's count of holdings, probe
//!   the key's two buckets for its fingerprint (Acquire loads of the tags; the count serves the
//!   insert that follows a look that found none; the other bucket is probed only where the
//!   lock's word says an insert has put a state there for a key of this home, see
//!   [`OVERFLOWED`]), read the plan's current limits *after* the
//!   lookup, decide on the state with the method's own compare-and-swap, and check that the
//!   slot's tag is still the one found (else the answer is dropped and the decision looks
//!   again). A state
//!   made under an earlier version is retired and its slot freed; a retired state (evicted,
//!   swept or being replaced) makes the probe go on, and then insert.
//! - **Insert** ([`ClientStore::insert`]), under the home bucket's lock: a live state for the
//!   key put meanwhile is used (looked for only where the decision's look at the buckets saw
//!   a tag with the key's fingerprint, or where the lock was held between the decision's
//!   reading of its count of holdings, before that look, and this insert: see
//!   [`ClientStore::holdings`]); otherwise the first free slot of the two buckets is claimed
//!   (compare-and-swap of its tag from free to `BUSY`); otherwise a slot is *reused*: one made
//!   under an earlier version, else one whose state is indistinguishable from fresh (retired by
//!   one exchange on its state, so a state that is admitting is never taken), else the state
//!   closest to fresh among the two buckets (of the states idle at the latest reading known to
//!   have been taken, the insert's or one the states' counts show, the one idle from the
//!   earliest; where none is, the most permits available at the insert's reading, then the
//!   least recently counted: so that a request held after its reading takes a client idle at
//!   the readings the bucket's states show since, never one that decided there), which is an
//!   **eviction**, counted. A reading that leaves the bucket's states as they were (a peek, a
//!   refusal, another plan's decision) is not seen: under the sliding window counter, whose
//!   states' permits at an earlier reading do not order them as their idleness does, an insert
//!   held across such a reading alone may take a client active there while another is idle
//!   there (within the bound of one limit per eviction; `tests/review_victim_3.rs` has the
//!   case). An insert evicts only while no slot of the two buckets is free or being freed by
//!   another thread (a sweep): holding its victim, it looks at the tags once more,
//!   and where one is, it puts the victim back and inserts again (waiting for that slot), up to
//!   four times a decision (a slot being taken by another insert looks the same). The request
//!   reads the clock before the lock (the clock is the user's), and again, with the lock let
//!   go, where no slot is free (idleness is judged at that later reading: states used since the
//!   first may be idle now); the insert decides it at its reading on the slot's new state
//!   *before* publishing the slot's tag (Release; the state stored
//!   before it), with the lock still held and the plan's limits read again after the slot was
//!   taken: while its tag says the slot is being filled no other thread reaches it, so a sweep
//!   cannot retire the fresh state (idle until that decision) and make the request insert
//!   again, and the answer stands. (Where the fresh state is made as of a reading ahead of the
//!   request's, it is published undecided, and the lookup decides on it at a reading of its own.)
//! - **Give-back** ([`give_back`]): a grant kept by a request that may have to undo it (the
//!   Envoy service's request of several descriptors, refused at a later taking) carries its
//!   slot, the tag it found and the eviction count read before its decision; the method's undo
//!   runs through the same checked, salted view as a decision, only while the slot has that
//!   tag and no eviction has happened since.
//! - **Sweep** ([`ClientStore::sweep`]): retires idle states and ones made under earlier
//!   versions, and frees their slots. The store never needs it to take new clients (inserts
//!   reuse idle slots themselves); it keeps [`ClientStore::clients`] to the clients that are active.
//!
//! # What reuse can change
//!
//! Every state is retired by an exchange on its own word before its slot changes hands, and
//! the service publishes the clock reading it retires at first (`evicted_up_to`), so a fresh
//! state made afterwards is at least as strict as the retired one for every reading. Reusing an
//! idle state changes no answer. An evicted client (one not idle, in a full pair of buckets) is
//! started afresh on its next request: it can gain at most one limit's worth, once per eviction,
//! in permits asked one at a time (two under the sliding window counter, whose fresh word also
//! grants readings of the window before its own a part of a limit, which the evicted word may
//! have refused). For that, an eviction also publishes where its victim's counts end
//! (`WordLimit::retire_evicted`): they may run past the evicting insert's own reading, which can
//! lag another thread's, and a fresh state made as of that reading would give back one limit
//! for every window between.
//! A decision writes a state only through a view of the slot's word ([`SlotWord`]) that checks,
//! before each exchange (and each add), that the slot still has the holding whose tag the
//! decision found, and fails as on a retired word if not; and the decision checks again after
//! its answer, dropping the answer and looking again if the holding changed. (The fresh state is
//! stored with Release before its tag, and the checks fence with Acquire, so a decision that has
//! read any word of a later holding sees that holding's tag.) So a request's answer always comes
//! from its own client's state, under the limits that state was made under, and a decision's
//! compare-and-swap loop that retries on a word the slot's next holding wrote fails its check.
//! One race is left, and salts close it: should the slot change hands in the few instructions
//! between a check and its exchange, the exchange expects the word it read of the earlier
//! holding. Each holding's word is stored XORed with a salt of its own ([`SaltedWord`]: a folded
//! multiply of the holding's tag by the store's random keys), so that exchange lands only if the
//! later holding's word, in its own frame, equals the value read XORed with the difference of
//! the two salts, a 64-bit pattern no one can foresee: a chance of about 2^-64 for each word the
//! later holding passes through while the decision is descheduled. Without the salts the
//! windowed methods could grant more than a later rule allows: the sliding window counter's
//! layout depends on the limit (its count fields are as wide as the limit's bits) and the fixed
//! window's index counts windows of the rule's length, so a word written under an earlier
//! version can read, under the later one, as fewer permits taken (`loom-tests/store_layouts.rs`
//! finds 4 grants under a limit of 2 across a rule change once the salts are taken away). A slot
//! that comes back to the very tag the decision found (the same key, version and generation, so
//! the same salt: 64 changes of hands during one decision) holds the same client's state under
//! the same limits, where a landed exchange keeps the permit taken: the client pays one permit
//! for the race, and no one is granted one more. Since a salted word cannot be added to in place,
//! the fixed window's one-permit add runs in the store as checked exchanges.

// The store is public (doc-hidden) only for the `loom` feature's models.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use std::cmp::Reverse;
use std::hash::BuildHasher;

use crate::decision::Retired;
use crate::method::client_state::Version;
use crate::sync::{AtomicWord, Ordering, OwnedWord};

/// Slots per bucket in production: 8 tags and 8 states, 128 bytes with 8-byte words (136 with
/// the bucket's insert lock, not aligned to cache lines).
pub(crate) const SLOTS_PER_BUCKET: usize = 8;

/// The tag bit of a live slot taken by one thread to retire its state: set by an exchange from
/// the live tag, so that exactly one thread retires the state of one tag's holding. The lowest
/// bit, so that the checks of a holding, which leave it aside (`tag & !RETIRING`), mask with
/// an immediate operand rather than a constant loaded first.
const RETIRING: u64 = 1;
/// The bits of a key's hash that make its fingerprint: the low 40.
const KEY_FINGERPRINT: u64 = (1 << 40) - 1;
/// Where the fingerprint starts in a tag: just above `RETIRING`.
const FINGERPRINT_SHIFT: u32 = 1;
/// The fingerprint's bits in a tag: 40, never all 0 in a live tag.
const FINGERPRINT: u64 = KEY_FINGERPRINT << FINGERPRINT_SHIFT;
/// Where the slot's generation starts in a tag: 6 bits, one more (wrapping) each time the slot
/// takes a new state, so that a request can tell its slot changed hands while it decided even
/// when the slot came back to the same key (see [`decide`]).
const GENERATION_SHIFT: u32 = 41;
/// The generation's bits in a tag.
const GENERATION: u64 = 0x3f << GENERATION_SHIFT;
/// The tag bit of a slot being filled (its fingerprint bits are 0: no key matches it).
const BUSY: u64 = 1 << 47;
/// Where the version starts in a tag.
const VERSION_SHIFT: u32 = 48;

/// The most times one decision inserts its client (each insert after the first follows a change
/// another thread made meanwhile: a rule change, an eviction of the state just put).
const MAX_INSERTS: u32 = 1_000;

/// How many of one decision's inserts may put their victim back for a slot another thread is
/// freeing or taking (see `ClientStore::reuse`) before the next evicts all the same. A sweep's
/// slot is free for the insert after the first (which waits for it); the bound is for two
/// inserts that each find the other's victim taken and would put theirs back in turn.
const EVICTION_DEFERRALS: u32 = 4;

/// How many times an insert into a full pair of buckets looks for a state to evict, when each
/// one it picks changes before it can retire it (each change is a grant to an active client).
const EVICTION_TRIES: u32 = 4;

/// The tag of a live state made under `version` for `fingerprint`, in a slot whose previous
/// tag was `previous`: the next generation.
#[inline]
fn live_tag(version: Version, fingerprint: u64, previous: u64) -> u64 {
    let generation = (previous & GENERATION).wrapping_add(1 << GENERATION_SHIFT) & GENERATION;
    (u64::from(version) << VERSION_SHIFT) | generation | fingerprint
}

/// The tag of a free slot, or of a slot being filled (`busy`), that last held `previous`: it
/// keeps the generation (and drops `RETIRING`).
#[inline]
fn idle_tag(previous: u64, busy: bool) -> u64 {
    (previous & GENERATION) | if busy { BUSY } else { 0 }
}

/// Whether `tag` is a free slot's.
#[inline]
fn is_free(tag: u64) -> bool {
    tag & (FINGERPRINT | BUSY) == 0
}

/// The version a live tag names.
#[inline]
fn version_of(tag: u64) -> Version {
    // The shift leaves 16 bits, and a `Version` holds 16.
    (tag >> VERSION_SHIFT) as Version
}

/// Whether `tag` names a live state (neither free nor being filled: both have a fingerprint of
/// 0).
#[inline]
fn is_live(tag: u64) -> bool {
    tag & FINGERPRINT != 0
}

/// Where a key lives: its fingerprint, its home bucket, and the hash its other bucket is
/// computed from (only where the home bucket does not answer).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    fingerprint: u64,
    home: usize,
    hash: u64,
}

/// The insert lock of the keys whose home the bucket is, then `B` slots: their tags, then their
/// states. The lock is beside the slots, so that a look at the bucket finds it without another
/// bounds check (the decision reads it before its look at home, see [`decide_at_home`]), and in
/// front of the tags (`repr(C)` keeps that order), so that it shares its cache line with the
/// first tags, which that look reads next: after the states, its read was a cache line of its
/// own (a lookup of a known client missed 2.84 lines of the first-level cache under callgrind's
/// cache simulation, against 2.14 with the lock in front).
#[derive(Debug)]
#[repr(C)]
struct Bucket<W, const B: usize> {
    /// The lock of the inserts of keys whose home this bucket is: `HELD` while one runs,
    /// `OVERFLOWED` once one has put a state in its key's other bucket, plus `HOLDING` times
    /// the holdings released so far (see [`InsertLock`]).
    insert_lock: W,
    tags: [W; B],
    states: [W; B],
}

/// A plan's clients in a fixed table (see the module's docs).
#[doc(hidden)]
#[derive(Debug)]
pub struct ClientStore<W, const B: usize = SLOTS_PER_BUCKET> {
    buckets: Box<[Bucket<W, B>]>,
    /// How many states were evicted (taken from a client that was not idle).
    evictions: W,
    /// The keys of the holdings' salts (see [`ClientStore::salt_of`]): random for each store.
    salt_keys: [u64; 2],
    /// A broken step, for the loom models' negative controls.
    #[cfg(feature = "loom")]
    fault: StoreFault,
}

/// A broken step of the store's protocol, for the loom models' negative controls: each checker
/// must fail on it. (Named in production code too, where [`ClientStore::has_fault`] is always
/// false and compiles away.)
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "loom"), allow(dead_code))]
pub enum StoreFault {
    /// No fault.
    None,
    /// Inserts without the home bucket's lock: two first requests may each put a state.
    InsertWithoutLock,
    /// A state of an earlier version retired after taking a tag that another thread had
    /// taken already (its retiring bit set): two threads may both retire it and both put a
    /// fresh one.
    TakeTakenTag,
    /// A sweep that retires every state, idle or not.
    SweepRetiresActive,
    /// An eviction that is not counted: a client started afresh without its eviction showing.
    UncountedEviction,
    /// An eviction that publishes only the evicting insert's reading, not where the victim's
    /// counts end: an insert whose reading lags gives its victim's next state every window
    /// between back.
    EvictionAtItsOwnReading,
    /// An insert that evicts an active client while another slot of its buckets is being freed
    /// (a sweep's idle one).
    EvictPastRetiring,
    /// An eviction that chooses its victim by its permits at the insert's own reading alone, not
    /// first by which states are idle at the latest reading known to have been taken: a request
    /// held after its reading takes the last of states all spent at that reading, though only
    /// that one was used since and the others are idle at the readings taken since.
    VictimByItsOwnReadingAlone,
    /// The insert's pass over a bucket looks at its slots one by one only where a tag has the
    /// key's fingerprint, not where a slot is being retired: a slot a sweep is freeing is not
    /// waited for, and the insert may evict an active client instead.
    PassIgnoresRetiring,
    /// The insert's last look at the tags before an eviction without its Acquire fence: a slot
    /// skipped for its state read retired may still read live there.
    FreedTagsUnfenced,
    /// Every holding's salt 0: a decision's exchange, checked against one holding, can land on
    /// the next holding of its slot when that holding's word equals the one it read.
    Unsalted,
    /// Every holding's salt 0, and a give-back that finds its grant by the slot alone, not by
    /// the holding: it undoes on whatever state the slot holds now.
    GiveBackToTheSlot,
    /// An insert publishes its fresh state's tag before the request's decision on it (and the
    /// decision then looks the slot up as any other): a sweep may retire the fresh state, idle
    /// until that decision, first, and the request must insert again.
    PublishedBeforeItsDecision,
    /// A decision reads its home lock's count of holdings after its look at the buckets, not
    /// before: an insert of the key between the look and the count goes unseen, the decision's
    /// insert skips its passes, and the key gets two states.
    HoldingsReadAfterTheLook,
    /// An insert that takes a slot in its key's other bucket leaves its home lock's word
    /// without [`OVERFLOWED`]: a later decision of the key skips the bucket its state is in,
    /// and inserts a second one at home.
    OverflowUnmarked,
}

/// What one limit of a plan does to a state word, as the store needs it (the method's own
/// operations: see `crate::method::Method`).
#[doc(hidden)]
pub trait WordLimit {
    /// The word of a client that has taken nothing, as of the clock reading `since_nanos`.
    fn fresh(&self, since_nanos: u64) -> u64;
    /// Retires `state` whatever it holds; whether this call did (false if it already was).
    fn retire_now<A: AtomicWord>(&self, state: &A) -> bool;
    /// Retires `state` whatever it holds, for an eviction: the earliest clock reading a fresh
    /// state ([`WordLimit::fresh`]) may be made as of and hold at most one limit's worth more
    /// than the retired one for every reading (`None` if this call did not retire it). The
    /// state's counts may run past the evicting insert's own reading, which can lag another
    /// thread's.
    fn retire_evicted<A: AtomicWord>(&self, state: &A) -> Option<u64>;
    /// Of `state` as it holds now (one load), for an eviction's choice of victim (see
    /// `Candidate::victim_key`): where its counts run up to (what
    /// [`WordLimit::retire_evicted`] would answer: no later than the reading of the decision
    /// that wrote it), and the earliest clock reading at which it is indistinguishable from a
    /// fresh one (idle there and at every later reading, at no earlier one); `None` when it is
    /// retired or the method cannot tell.
    fn counted_and_idle_from<A: AtomicWord>(&self, state: &A) -> Option<(u64, u64)>;
    /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`; whether it
    /// did.
    fn retire_if_idle<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> bool;
    /// The permits `state` has available at `now_nanos`; `None` when it is retired.
    fn available<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> Option<u64>;
    /// Whether `state` looks indistinguishable from a fresh one at `now_nanos` (a load: the
    /// retirement that follows decides, by an exchange).
    fn is_idle<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> bool;
}

/// A plan's current limits as the store reads them, after each lookup.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct StoreHead<L> {
    /// The version of the plan's limits.
    pub version: Version,
    /// Whether the store keeps the plan's clients under these limits (one limit of a one-word
    /// method); when not, the decision goes elsewhere.
    pub kept: bool,
    /// The plan's first limit: the whole plan when `kept`, and in any case one of the same
    /// method, which retires the states of earlier versions.
    pub limit: L,
}

/// A plan whose clients the store keeps: its current limits, read anew at every call.
#[doc(hidden)]
pub trait StorePlan {
    /// One limit's constants.
    type Limit;
    /// The plan's current limits.
    fn head(&self) -> StoreHead<Self::Limit>;
}

/// One request's decision on a state word.
#[doc(hidden)]
pub trait WordRequest<W, L> {
    /// Whether the request keeps its grant to give it back ([`give_back`]): its decision then
    /// reads the store's eviction count first, into the slot's [`Holding`].
    const KEEPS_GRANTS: bool = false;
    /// What the request answers.
    type Answer;
    /// Decides on `state` under `limit`; `Retired` when the state is retired, or the slot
    /// changed hands before the decision could write (nothing granted). The answer is not yet
    /// the request's: [`decide`] may drop it (see there).
    fn acquire(&self, limit: &L, state: &SlotWord<'_, W>) -> Result<Self::Answer, Retired>;
    /// [`WordRequest::acquire`] at the clock reading `now_nanos` (the insert's, for the fresh
    /// state it put: taken before its lock, or again with the lock let go where it must reuse a
    /// slot).
    fn acquire_at(
        &self,
        limit: &L,
        state: &SlotWord<'_, W>,
        now_nanos: u64,
    ) -> Result<Self::Answer, Retired>;
    /// `answer`, kept as the request's (counted, where the request counts its answers).
    fn answered(&self, answer: Self::Answer) -> Self::Answer;
    /// For a client the store does not hold: the answer without a state, where the request
    /// makes none (an attempt that takes nothing whatever the state: of 0 permits, or of more
    /// than the limit), from a fresh state as of the clock reading `since_nanos` (see
    /// `protocol::made_as_of`); `None` where it makes one.
    fn without_state(&self, limit: &L, since_nanos: u64) -> Option<Self::Answer>;
}

/// What [`decide`] came to.
#[doc(hidden)]
#[derive(Debug, PartialEq, Eq)]
pub enum Stored<A> {
    /// The answer.
    Answer(A),
    /// The plan's current limits are not kept in the store (it now has several): decide
    /// elsewhere. Any state of the client's in the store was made under earlier limits, and is
    /// retired.
    Elsewhere,
    /// The client was inserted [`MAX_INSERTS`] times and each time lost its state to another
    /// thread before deciding: give up rather than spin.
    GaveUp,
}

/// A slot an insert took (free, or its state retired), its tag set to `BUSY`: its tag, the tag
/// it held, and its state.
type TakenSlot<'s, W> = (&'s W, u64, &'s W);

/// What [`ClientStore::insert`] came to.
#[doc(hidden)]
#[derive(Debug)]
pub enum Inserted<A> {
    /// The request's answer, decided on the fresh state the insert put.
    Decided(A),
    /// Nothing put, and the decision looks again: a live state of the key's (made under the
    /// plan's version or a later one) is there, which another insert put; or the states the
    /// insert tried to take for reuse changed first; or it put back the one it was to evict for
    /// a slot another thread is freeing; or the plan's limits changed.
    LookAgain,
}

/// The bucket of `hash` among `buckets`: the high bits, by a multiply (no power of two needed).
#[inline]
fn bucket_of(hash: u64, buckets: usize) -> usize {
    // The product's high word is below `buckets`, which is a `usize`.
    ((u128::from(hash) * buckets as u128) >> 64) as usize
}

impl<W: OwnedWord, const B: usize> ClientStore<W, B> {
    /// A store with `fault` in its protocol (see [`ClientStore::new`]).
    #[cfg(feature = "loom")]
    pub fn with_fault(capacity: usize, fault: StoreFault) -> Self {
        ClientStore {
            fault,
            // Fixed keys: a model must run alike in every execution loom explores.
            salt_keys: [0x243F_6A88_85A3_08D3, 0x1319_8A2E_0370_7345],
            ..Self::new(capacity)
        }
    }

    /// A store of at least `capacity` slots (rounded up to whole buckets), all free.
    pub fn new(capacity: usize) -> Self {
        let buckets = capacity.div_ceil(B).max(1);
        let random = std::hash::RandomState::new();
        ClientStore {
            // Each from a random key of the process's (a different one for each `RandomState`).
            salt_keys: [random.hash_one(0_u64), random.hash_one(1_u64) | 1],
            buckets: (0..buckets)
                .map(|_| Bucket {
                    tags: std::array::from_fn(|_| W::new(0)),
                    states: std::array::from_fn(|_| W::new(0)),
                    insert_lock: W::new(0),
                })
                .collect(),
            evictions: W::new(0),
            #[cfg(feature = "loom")]
            fault: StoreFault::None,
        }
    }
}

impl<W: AtomicWord, const B: usize> ClientStore<W, B> {
    /// Whether the loom models planted `fault`; never, in production.
    #[inline(always)]
    fn has_fault(&self, fault: StoreFault) -> bool {
        #[cfg(feature = "loom")]
        return self.fault == fault;
        #[cfg(not(feature = "loom"))]
        {
            let _ = fault;
            false
        }
    }

    /// Where the key of keyed hash `hash` lives.
    #[inline]
    pub fn place(&self, hash: u64) -> Place {
        let buckets = self.buckets.len();
        // The low bits, never 0 (0 marks a free slot), where a tag holds them.
        let fingerprint = (hash & KEY_FINGERPRINT).max(1) << FINGERPRINT_SHIFT;
        Place {
            fingerprint,
            home: bucket_of(hash, buckets),
            hash,
        }
    }

    /// The salt of the holding whose tag is `tag` (its retiring bit aside): the holding's state
    /// is stored XORed with it (see [`SaltedWord`]). A folded multiply of the tag by the store's
    /// random keys, so two holdings' salts differ by a pattern of all 64 bits that no one can
    /// foresee: an exchange computed on one holding's word expects, in another holding's frame,
    /// a word that holding would have to reach by a 2^-64 chance.
    #[inline]
    fn salt_of(&self, tag: u64) -> u64 {
        if self.has_fault(StoreFault::Unsalted) || self.has_fault(StoreFault::GiveBackToTheSlot) {
            return 0;
        }
        let product =
            u128::from((tag & !RETIRING) ^ self.salt_keys[0]) * u128::from(self.salt_keys[1]);
        // The product's two halves: the high one depends on every bit of the tag.
        (product as u64) ^ ((product >> 64) as u64)
    }

    /// The state word of the holding whose tag is `tag`, as that holding reads it (for a thread
    /// that holds the slot, or only reads it).
    #[inline]
    fn salted<'s>(&self, state: &'s W, tag: u64) -> SaltedWord<'s, W> {
        SaltedWord {
            word: state,
            salt: self.salt_of(tag),
        }
    }

    /// The other bucket of `place`: the bucket of a remix of its hash, so that keys of one home
    /// spread over different second buckets. Computed where the home bucket does not answer.
    #[inline]
    fn other_of(&self, place: Place) -> usize {
        let remixed = (place.hash ^ (place.hash >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        bucket_of(remixed, self.buckets.len())
    }

    /// The other bucket of `place`, if it is not its home.
    #[inline]
    fn other_bucket(&self, place: Place) -> Option<&Bucket<W, B>> {
        let other = self.other_of(place);
        (other != place.home).then(|| &self.buckets[other])
    }

    /// The buckets `place` may use, home first: the home alone where the other is the same.
    #[inline]
    fn buckets(&self, place: Place) -> impl Iterator<Item = &Bucket<W, B>> {
        std::iter::once(&self.buckets[place.home]).chain(self.other_bucket(place))
    }

    /// The slots `place` may use, home bucket first: each slot's tag and state (for the insert's
    /// rarer passes; the decision's probe loops over [`ClientStore::buckets`] itself).
    fn slots(&self, place: Place) -> impl Iterator<Item = (&W, &W)> {
        self.buckets(place)
            .flat_map(|bucket| bucket.tags.iter().zip(&bucket.states))
    }

    /// The word of the first state the key at `place` has in the store, as its holding reads it,
    /// with the version it was made under, if any (live, or being retired: a look at it answers
    /// `Retired` then). A snapshot, kept only if the slot had the same holding after the load.
    pub fn find(&self, place: Place) -> Option<(Version, u64)> {
        self.key_slots(place).find_map(|(tag, state, seen)| {
            let slot = self.view(tag, state, seen);
            // Relaxed: a snapshot of one word; the check after it fences.
            let word = slot.load(Ordering::Relaxed);
            slot.same_holding().then(|| (version_of(seen), word))
        })
    }

    /// The slots of `place`'s buckets whose tag has the key's fingerprint, home bucket first:
    /// each slot's tag and state, and the tag as read (for the rarer lookups; the decision's
    /// probe loops over [`ClientStore::buckets`] itself).
    fn key_slots(&self, place: Place) -> impl Iterator<Item = (&W, &W, u64)> {
        self.slots(place).filter_map(move |(tag, state)| {
            // Acquire: pairs with the Release that published the tag after its state.
            let seen = tag.load(Ordering::Acquire);
            (seen & FINGERPRINT == place.fingerprint).then_some((tag, state, seen))
        })
    }

    /// The view of the holding whose tag read `seen`, for a caller that keeps no grant.
    fn view<'s>(&self, tag: &'s W, state: &'s W, seen: u64) -> SlotWord<'s, W> {
        SlotWord {
            state: self.salted(state, seen),
            tag,
            seen,
            published: seen,
            evictions_before: 0,
        }
    }

    /// The view of the holding whose tag read `seen`, with the plan's current first limit, if
    /// the store keeps the plan's clients under the limits that holding's state was made under.
    #[cfg(any(feature = "envoy", feature = "loom"))]
    fn current_view<'s, P: StorePlan>(
        &self,
        plan: &P,
        tag: &'s W,
        state: &'s W,
        seen: u64,
    ) -> Option<(P::Limit, SlotWord<'s, W>)> {
        let head = plan.head();
        (head.kept && head.version == version_of(seen))
            .then(|| (head.limit, self.view(tag, state, seen)))
    }

    /// The slot whose tag word lies at `address` (see [`Holding`]), if it is one of this store's.
    #[cfg(any(feature = "envoy", feature = "loom"))]
    fn slot_at(&self, address: usize) -> Option<(&W, &W)> {
        let start = self.buckets.as_ptr() as usize;
        let index = address.checked_sub(start)? / size_of::<Bucket<W, B>>();
        let bucket = self.buckets.get(index)?;
        bucket
            .tags
            .iter()
            .zip(&bucket.states)
            .find(|(tag, _)| std::ptr::from_ref::<W>(tag) as usize == address)
    }

    /// How many slots hold a client (at some instant during the call, slot by slot).
    pub fn clients(&self) -> usize {
        self.buckets
            .iter()
            .flat_map(|bucket| &bucket.tags)
            // Relaxed: a count, publishing nothing.
            .filter(|tag| is_live(tag.load(Ordering::Relaxed)))
            .count()
    }

    /// How many states inserts have evicted (taken from clients that were not idle).
    pub fn evictions(&self) -> u64 {
        // Relaxed: a count.
        self.evictions.load(Ordering::Relaxed)
    }

    /// Retires `state` (under `tag`, which read `seen`) made under an earlier version than
    /// `head`'s, and frees its slot, unless another thread has taken the slot since; whether it
    /// did.
    fn retire_earlier<L: WordLimit>(
        &self,
        head: &StoreHead<L>,
        tag: &W,
        seen: u64,
        state: &W,
    ) -> bool {
        let taken = if self.has_fault(StoreFault::TakeTakenTag) {
            // The broken step: an exchange from a tag that may carry the bit already.
            tag.compare_exchange(seen, seen | RETIRING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        } else {
            take_live(tag, seen)
        };
        if taken {
            // Once the tag is taken, the state is this thread's to retire (nothing else retires
            // it), and the slot to free.
            head.limit.retire_now(&self.salted(state, seen));
            // Release: the slot is free only after its state is retired (see `claim_free`).
            tag.store(idle_tag(seen, false), Ordering::Release);
        }
        taken
    }

    /// Puts a fresh state for the key at `place` under `head` (made as of `evicted_up_to`, read
    /// after any retirement this call makes) unless a live one made under `head`'s version or a
    /// later one is there, and decides `request` on the fresh state at the clock reading
    /// `now_nanos` *before* its tag is published: until then no other thread can reach the
    /// slot (a sweep would otherwise retire the fresh state, idle until its first decision, and
    /// make the request insert again: each insert after a decision's fourth may evict an active
    /// client while a sweep frees a slot, see `EVICTION_DEFERRALS`). Where no slot is free, the
    /// insert lets its lock go and takes `reading` (the clock read again): that reading decides
    /// which states are idle, is published in `evicted_up_to` before a state is retired for its
    /// slot, and is the one the request is decided at. Slots are reused, and fresh states
    /// decided on, only while `still_current` (the plan's limits are still `head`'s: a reuse
    /// under limits replaced meanwhile would take their states for earlier ones, and a decision
    /// under them would outlive the change).
    /// `absent_as_of` is the home lock's count of holdings ([`ClientStore::holdings`])
    /// before a look that found no tag of the key's in either bucket, if there was one: where
    /// the lock is taken at that count, the insert skips its passes over the buckets.
    // Always inlined: otherwise thin LTO calls it out of line from the decision and passes its
    // many arguments through the stack.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn insert<L: WordLimit, R: WordRequest<W, L>>(
        &self,
        place: Place,
        head: &StoreHead<L>,
        request: &R,
        now_nanos: u64,
        reading: impl FnOnce() -> u64,
        still_current: impl Fn() -> bool,
        evicted_up_to: &W,
        may_defer: bool,
        absent_as_of: Option<u64>,
    ) -> Inserted<R::Answer> {
        // The key's home bucket (the other is computed only where it is needed).
        let home = &self.buckets[place.home];
        let lock = self.insert_lock(place, absent_as_of);
        // No insert since the look that found no state of the key's: none is there now (see
        // `holdings`), and no slot needs waiting for (a free one is claimed below; where none
        // is, `reuse` makes its passes).
        let absent =
            matches!((&lock, absent_as_of), (Some(lock), Some(count)) if lock.holdings == count);
        if !absent && self.find_settled(place, head, home, self.other_bucket(place)) {
            // Rare (first requests of one client racing): the lookup finds it.
            return Inserted::LookAgain;
        }
        let (taken, lock, now_nanos) = match claim_free(home) {
            Some(slot) => (slot, lock, now_nanos),
            None => match self.other_bucket(place).and_then(claim_free) {
                Some(slot) => {
                    // A slot outside home: the lock's word says so once let go, so that the
                    // key's decisions probe this bucket (see `OVERFLOWED`).
                    let mut lock = lock;
                    if let Some(lock) = &mut lock {
                        self.mark_overflowed(lock);
                    }
                    (slot, lock, now_nanos)
                }
                None => {
                    // No slot free: the states' idleness is judged at a reading taken now, with
                    // the lock let go (the clock is the user's), not at the request's first one,
                    // which may be older than every state used since (the thread held between
                    // it and its insert), where none would look idle and the insert would evict.
                    // (`reading` and `still_current` are called here, not passed on: a closure
                    // passed out of line would keep what it borrows in memory on every
                    // decision's path.)
                    drop(lock);
                    let now_nanos = reading();
                    if !still_current() {
                        return Inserted::LookAgain;
                    }
                    match self.insert_reusing(place, head, now_nanos, evicted_up_to, may_defer) {
                        Some((slot, lock)) => (slot, lock, now_nanos),
                        None => return Inserted::LookAgain,
                    }
                }
            },
        };
        // The plan's limits read again once the slot is taken, as a lookup reads them after it
        // finds a state: a request that read them before a change never decides under them on
        // a state put after it. Where they changed, the slot, never published, is freed.
        if !still_current() {
            let (tag, previous, _) = taken;
            // Release: as every freed slot's tag (see `claim`).
            tag.store(idle_tag(previous, false), Ordering::Release);
            return Inserted::LookAgain;
        }
        let inserted = self.fill(place, head, request, now_nanos, evicted_up_to, taken);
        // The lock is let go only once the slot is published: another insert of the key, under
        // the lock, finds it.
        drop(lock);
        inserted
    }

    /// [`ClientStore::insert`] once it found no free slot and read the clock again
    /// (`now_nanos`) with its lock let go: the lock taken again, its passes made again (the
    /// buckets may have changed meanwhile; a slot another thread is freeing is waited for, and
    /// is then free), then a free slot if one is there now, else one taken by
    /// [`ClientStore::reuse`]. The slot, with the lock still held; `None` where the insert
    /// should look again (see [`Inserted::LookAgain`]).
    #[cold]
    #[inline(never)]
    fn insert_reusing<L: WordLimit>(
        &self,
        place: Place,
        head: &StoreHead<L>,
        now_nanos: u64,
        evicted_up_to: &W,
        may_defer: bool,
    ) -> Option<(TakenSlot<'_, W>, Option<InsertLock<'_, W>>)> {
        let home = &self.buckets[place.home];
        let other = self.other_bucket(place);
        let mut lock = self.insert_lock(place, None);
        if self.find_settled(place, head, home, other) {
            return None;
        }
        let slot = claim_free(home)
            .or_else(|| other.and_then(claim_free))
            .or_else(|| self.reuse(place, head, now_nanos, evicted_up_to, may_defer))?;
        let at_home = home
            .tags
            .as_ptr_range()
            .contains(&std::ptr::from_ref(slot.0));
        if let Some(lock) = &mut lock
            && !at_home
        {
            self.mark_overflowed(lock);
        }
        Some((slot, lock))
    }

    /// How many holdings of `place`'s home insert lock were let go: the inserts of keys of that
    /// home so far (for the loom models).
    #[cfg(feature = "loom")]
    pub fn inserts_at_home(&self, place: Place) -> u64 {
        // Relaxed: a count read after the threads that took the lock were joined.
        self.buckets[place.home].insert_lock.load(Ordering::Relaxed) / HOLDING
    }

    /// Marks `lock` as having taken a slot outside its bucket (but in a negative control): its
    /// word says so once let go (see [`OVERFLOWED`]).
    #[inline(always)]
    fn mark_overflowed(&self, lock: &mut InsertLock<'_, W>) {
        if !self.has_fault(StoreFault::OverflowUnmarked) {
            lock.overflowed = OVERFLOWED;
        }
    }

    /// The word of `place`'s home insert lock, if no insert holds it: the count of its
    /// holdings so far. A decision reads it before it looks for the key; if its insert then
    /// takes the lock at the same count, no state was put for the key in between (a key's
    /// states are put only under its home's lock), so what that look found still stands.
    ///
    /// Why it stands: the Acquire load here reads the count the last holding released
    /// (Release), so every tag put under the lock until then is seen by the look's (Acquire)
    /// loads of the tags that follow, as put or as changed since. A tag changed since is still
    /// the key's while it is being retired (its fingerprint stays until it is freed), and is
    /// no longer the key's once freed or taken by another key: a state of the key that the
    /// look missed could only come from a holding after this load, which the count shows.
    #[inline(always)]
    pub fn holdings(&self, place: Place) -> Option<u64> {
        // Acquire: see above.
        let word = self.buckets[place.home].insert_lock.load(Ordering::Acquire);
        (word & HELD == 0).then_some(word)
    }

    /// The insert lock of `place`'s home bucket, taken (but in a negative control); first tried
    /// from the word `expected` (a count of holdings read earlier), if any.
    #[inline(always)]
    fn insert_lock(&self, place: Place, expected: Option<u64>) -> Option<InsertLock<'_, W>> {
        (!self.has_fault(StoreFault::InsertWithoutLock))
            .then(|| InsertLock::take(&self.buckets[place.home].insert_lock, expected))
    }

    /// The insert's passes over the key's buckets (`home`, then `other`), under the insert
    /// lock: whether another insert of this key came first (its live state made under
    /// `head`'s version or a later one is there); a live state of an earlier version is
    /// retired, so that the key never has two live states.
    #[inline(always)]
    fn find_settled<L: WordLimit>(
        &self,
        place: Place,
        head: &StoreHead<L>,
        home: &Bucket<W, B>,
        other: Option<&Bucket<W, B>>,
    ) -> bool {
        // The retiring bit that makes a bucket's pass wait (always, but in a negative control).
        let retiring = if self.has_fault(StoreFault::PassIgnoresRetiring) {
            0
        } else {
            RETIRING
        };
        for bucket in std::iter::once(home).chain(other) {
            if needs_settling(bucket, place.fingerprint, retiring)
                && self.settle_key_slots(bucket, place, head)
            {
                return true;
            }
        }
        false
    }

    /// Fills the slot this insert took (`tag`, which held `previous`, and `state`) with a fresh
    /// state for the key at `place` under `head`, made as of `evicted_up_to`, decides `request`
    /// on it at `now_nanos` while the tag still says the slot is being filled, then publishes
    /// the tag. The request's answer, or [`Inserted::LookAgain`] where the state is made as of a
    /// reading ahead of the request's (published undecided: see below) or the decision met a
    /// retired word (a fresh word never reads so: a safe way out, where the lookup finds the
    /// state).
    #[inline(always)]
    fn fill<'s, L: WordLimit, R: WordRequest<W, L>>(
        &'s self,
        place: Place,
        head: &StoreHead<L>,
        request: &R,
        now_nanos: u64,
        evicted_up_to: &W,
        (tag, previous, state): (&'s W, u64, &'s W),
    ) -> Inserted<R::Answer> {
        let live = live_tag(head.version, place.fingerprint, previous);
        let salted = self.salted(state, live);
        // Relaxed: as `protocol::made_as_of`.
        let since = evicted_up_to.load(Ordering::Relaxed);
        // Release: a request whose exchange lands on this state or a later one (an Acquire
        // fence follows it) then sees the slot's tag no earlier than `BUSY`, so it knows the
        // slot changed hands (see `decide`).
        salted.store(head.limit.fresh(since), Ordering::Release);
        // A fresh state refuses every reading before the one it is made as of, which may be
        // ahead of the request's (taken before the lock): another thread's reading, published
        // by a sweep or an eviction, or where an evicted client's counts end. The request's
        // client has taken nothing, so it is not refused for that lag: the state is published
        // and the lookup decides on it at a reading of its own, taken now. (Rare: the request's
        // reading lags one another thread took before this insert, or the clock stepped back.)
        if since > now_nanos || self.has_fault(StoreFault::PublishedBeforeItsDecision) {
            // (The negative control's broken step: every fresh state published first.)
            // Release: a reader that finds the tag (Acquire) sees the state.
            tag.store(live, Ordering::Release);
            return Inserted::LookAgain;
        }
        let slot = SlotWord {
            state: salted,
            tag,
            // The tag while this insert fills the slot (as `claim` and `reuse` set it): no
            // other thread changes it, so the checks pass and the answer stands.
            seen: idle_tag(previous, true),
            published: live,
            evictions_before: if R::KEEPS_GRANTS { self.evictions() } else { 0 },
        };
        let decided = request.acquire_at(&head.limit, &slot, now_nanos);
        // Release: a reader that finds the tag (Acquire) sees the state as decided on.
        tag.store(live, Ordering::Release);
        match decided {
            Ok(answer) => Inserted::Decided(request.answered(answer)),
            Err(Retired) => Inserted::LookAgain,
        }
    }

    /// The insert's pass over a bucket that [`needs_settling`]: each slot's tag once no other
    /// thread is retiring its state (a sweep's freed slot is then free for this insert, which is
    /// what keeps an insert from evicting an active client for it: see [`ClientStore::reuse`]);
    /// whether the key has a live state made under `head`'s version or a later one; a live
    /// state of the key's made under an earlier version is retired.
    #[cold]
    fn settle_key_slots<L: WordLimit>(
        &self,
        bucket: &Bucket<W, B>,
        place: Place,
        head: &StoreHead<L>,
    ) -> bool {
        for (tag, state) in bucket.tags.iter().zip(&bucket.states) {
            let seen = settled(tag);
            if seen & FINGERPRINT != place.fingerprint {
                continue;
            }
            if version_of(seen) >= head.version {
                return true;
            }
            self.retire_earlier(head, tag, seen, state);
        }
        false
    }

    /// Takes a live slot of `place`'s buckets for reuse: one made under an earlier version, else
    /// an idle one, else the one closest to fresh (an eviction; see
    /// [`Candidate::victim_key`]). Its state is retired by this call, and its tag set to
    /// `BUSY`. Returns the slot's tag, the tag it held, and its state; `None` when each state it
    /// picked changed first, or when `may_defer` and another slot is being freed (see
    /// [`ClientStore::is_any_freed`]).
    fn reuse<L: WordLimit>(
        &self,
        place: Place,
        head: &StoreHead<L>,
        now_nanos: u64,
        evicted_up_to: &W,
        may_defer: bool,
    ) -> Option<(&W, u64, &W)> {
        // Relaxed: published to the requests that meet the retired state by the Release of the
        // retiring exchange (their Acquire fence follows).
        let published = evicted_up_to
            .fetch_max(now_nanos, Ordering::Relaxed)
            .max(now_nanos);
        let taken = |tag: &'_ W, seen: u64| {
            // This thread holds the slot (its retiring bit), so no one else changes the tag.
            // Release: a thread that reads the tag without the retiring bit (an insert settling
            // the slot waits for that) sees the reading an eviction published just before.
            tag.store(idle_tag(seen, true), Ordering::Release);
        };
        // Acquire: as in `decide`.
        let live = |tag: &W| {
            Some(tag.load(Ordering::Acquire)).filter(|seen| is_live(*seen) && seen & RETIRING == 0)
        };
        for (tag, state) in self.slots(place) {
            let Some(seen) = live(tag) else { continue };
            let salted = self.salted(state, seen);
            if version_of(seen) < head.version {
                if take_live(tag, seen) {
                    head.limit.retire_now(&salted);
                    taken(tag, seen);
                    return Some((tag, seen, state));
                }
            } else if version_of(seen) == head.version
                && head.limit.is_idle(&salted, now_nanos)
                && retire_if_idle(&head.limit, tag, seen, &salted, now_nanos)
            {
                taken(tag, seen);
                return Some((tag, seen, state));
            }
        }
        // Idleness is judged at this insert's own reading, never at a later one the states' counts
        // show another thread took: a state reused as idle there must have that reading published
        // first (its client's next state is made as of `evicted_up_to`), and a fresh state made
        // after it may then refuse a first request in flight with an older reading (bc7cdf5 has
        // the figures). So where no state is idle at this reading, one is evicted (counted), and
        // the states' own counts choose which (see `Candidate::victim_key`): a request held
        // after its reading never takes a client that decided since while another is idle at
        // that decision's reading.
        for _ in 0..EVICTION_TRIES {
            let by_idleness = !self.has_fault(StoreFault::VictimByItsOwnReadingAlone);
            // One look at each live state of the version, kept, and the latest reading known to
            // have been taken: this insert's, the one published for evictions, and every one
            // the states' counts show (each no later than its decision's reading).
            let mut candidates: [[Option<Candidate<'_, W>>; B]; 2] =
                [(); 2].map(|()| std::array::from_fn(|_| None));
            let mut reached = published;
            for (index, (tag, state)) in self.slots(place).enumerate() {
                let Some(seen) = live(tag).filter(|seen| version_of(*seen) == head.version) else {
                    continue;
                };
                let salted = self.salted(state, seen);
                let Some(available) = head.limit.available(&salted, now_nanos) else {
                    continue;
                };
                let counts = head.limit.counted_and_idle_from(&salted);
                if let Some((counted_up_to, _)) = counts {
                    reached = reached.max(counted_up_to);
                }
                candidates[index / B][index % B] = Some(Candidate {
                    tag,
                    seen,
                    state,
                    salted,
                    available,
                    counts,
                });
            }
            let Candidate {
                tag,
                seen,
                state,
                salted,
                ..
            } = candidates
                .into_iter()
                .flatten()
                .flatten()
                .max_by_key(|candidate| candidate.victim_key(reached, by_idleness))?;
            if take_live(tag, seen) {
                // Holding the victim, a last look at the tags as they are now: a slot another
                // thread is freeing (a sweep's, most often) or has freed since the passes above
                // is one no active client needs. The victim is put back and the insert runs
                // again, whose first pass waits for that slot. (The bit may also be another
                // insert's, taking its own victim: hence the bound on deferrals.)
                if may_defer
                    && !self.has_fault(StoreFault::EvictPastRetiring)
                    && self.is_any_freed(place, tag)
                {
                    // Release: as every tag a live state is published under.
                    tag.store(seen, Ordering::Release);
                    return None;
                }
                if !head.limit.retire_if_idle(&salted, now_nanos) {
                    // The victim's counts may run past this insert's reading (one that lags
                    // another thread's, or a clock stepped back): its client's next state is made
                    // as of where they end, so that the eviction gives it at most one limit's
                    // worth, not one for every window between the two. Relaxed: published by
                    // the Release of `taken` below, before the slot's tag changes again.
                    if self.has_fault(StoreFault::EvictionAtItsOwnReading) {
                        head.limit.retire_now(&salted);
                    } else if let Some(counted_up_to) = head.limit.retire_evicted(&salted) {
                        evicted_up_to.fetch_max(counted_up_to, Ordering::Relaxed);
                    }
                    if !self.has_fault(StoreFault::UncountedEviction) {
                        // Relaxed: a count.
                        self.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                }
                taken(tag, seen);
                return Some((tag, seen, state));
            }
        }
        None
    }

    /// Whether a slot of `place`'s buckets other than `holding` is free or being freed (its
    /// retiring bit set) since the insert's passes read it live. Those passes skip a slot that
    /// another thread is freeing by one of three reads: its tag with the retiring bit, an
    /// exchange on its tag that failed on that bit, or its state word retired (by the retiring
    /// thread's Release exchange, which follows its exchange on the tag). After the first two,
    /// this thread's loads of the tag return that tag or a later one; after the third, the
    /// Acquire fence below makes the retiring exchange on the tag happen before them. So a slot
    /// the passes skipped for a sweep's work reads free or retiring here.
    fn is_any_freed(&self, place: Place, holding: &W) -> bool {
        if !self.has_fault(StoreFault::FreedTagsUnfenced) {
            // Acquire: pairs with the Release of a retiring exchange whose word a pass read.
            W::fence(Ordering::Acquire);
        }
        self.slots(place).any(|(tag, _)| {
            !std::ptr::eq(tag, holding) && {
                // Relaxed: ordered by the fence above.
                let now = tag.load(Ordering::Relaxed);
                is_free(now) || now & RETIRING != 0
            }
        })
    }

    /// Retires every state idle at `now_nanos` under `head` or made under an earlier version,
    /// and frees its slot; how many it freed. Publishes `now_nanos` in `evicted_up_to` first.
    pub fn sweep<L: WordLimit>(
        &self,
        head: &StoreHead<L>,
        now_nanos: u64,
        evicted_up_to: &W,
    ) -> usize {
        // Relaxed: as in `reuse`.
        evicted_up_to.fetch_max(now_nanos, Ordering::Relaxed);
        let mut freed = 0;
        for bucket in &*self.buckets {
            for (tag, state) in bucket.tags.iter().zip(&bucket.states) {
                // Acquire: as in `decide`.
                let seen = tag.load(Ordering::Acquire);
                if !is_live(seen) || seen & RETIRING != 0 {
                    continue;
                }
                let freed_here = if version_of(seen) < head.version
                    || self.has_fault(StoreFault::SweepRetiresActive)
                {
                    self.retire_earlier(head, tag, seen, state)
                } else if version_of(seen) == head.version
                    && let salted = self.salted(state, seen)
                    && head.limit.is_idle(&salted, now_nanos)
                    && retire_if_idle(&head.limit, tag, seen, &salted, now_nanos)
                {
                    // Release: as in `retire_earlier`.
                    tag.store(idle_tag(seen, false), Ordering::Release);
                    true
                } else {
                    false
                };
                freed += usize::from(freed_here);
            }
        }
        freed
    }
}

/// A decision for the key at `place` under `plan`: finds its state (or inserts a fresh one)
/// and decides on it with `request`, only under the plan's limits read after the lookup.
/// `before_insert` runs before each insert, with the version of the plan's limits the insert
/// is made under; `now_nanos` reads the clock for an insert (before its lock: the request's
/// reading, and again with the lock let go where no slot is free); `evicted_up_to` is the
/// service's (see `protocol::made_as_of`).
///
/// The service makes its two steps, `decide_at_home` and `decide_beyond_home`, apart: it
/// inlines the first (the lookup of a known client) and calls the second out of line, where it
/// repeats the second alone if the plan moved its clients meanwhile (see
/// `RateLimiterService::decide`). This is that composition, for the loom models.
#[cfg(feature = "loom")]
#[inline(always)]
pub fn decide<W, const B: usize, P, R>(
    store: &ClientStore<W, B>,
    place: Place,
    plan: &P,
    request: &R,
    evicted_up_to: &W,
    before_insert: impl Fn(Version),
    now_nanos: impl Fn() -> u64,
) -> Stored<R::Answer>
where
    W: AtomicWord,
    P: StorePlan,
    P::Limit: WordLimit,
    R: WordRequest<W, P::Limit>,
{
    match decide_at_home(store, place, plan, request) {
        Ok(answer) => Stored::Answer(answer),
        Err(absent) => decide_beyond_home(
            store,
            place,
            plan,
            request,
            absent,
            evicted_up_to,
            before_insert,
            now_nanos,
        ),
    }
}

/// What [`decide_at_home`] saw where it found no tag with the key's fingerprint: the home
/// lock's word, read before its look at the bucket ([`ClientStore::holdings`]), so that
/// [`decide_beyond_home`] need not look at the bucket again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AbsentAtHome {
    lock_word: u64,
}

/// The first step of [`decide`]: the home bucket alone. A known key's state is there unless the
/// bucket was full when the key came, so the other bucket is computed only where the home does
/// not answer (`Err`, with what the look saw where it saw no tag of the key's). A look that
/// does not answer writes nothing a decision reads (at most it retires a state of earlier
/// limits, as any look does), so [`decide_beyond_home`] may follow it at any later time.
#[inline(always)]
pub(crate) fn decide_at_home<W, const B: usize, P, R>(
    store: &ClientStore<W, B>,
    place: Place,
    plan: &P,
    request: &R,
) -> Result<R::Answer, Option<AbsentAtHome>>
where
    W: AtomicWord,
    P: StorePlan,
    P::Limit: WordLimit,
    R: WordRequest<W, P::Limit>,
{
    let bucket = &store.buckets[place.home];
    // The home lock's word, read before the look (but in a negative control, after it), as
    // `decide_beyond_home` reads it before its own: where this look finds no tag of the key's,
    // that step looks at the other bucket alone (or at neither, where the word says that no
    // insert put a state outside home), and a first request looks at home once.
    let count_first = !store.has_fault(StoreFault::HoldingsReadAfterTheLook);
    // Acquire: as `holdings`'.
    let lock_word = count_first.then(|| bucket.insert_lock.load(Ordering::Acquire));
    // The first slot with the key's fingerprint alone, found as `probe` finds it. Any other
    // case (no such slot; a slot that does not answer: its state retired or being retired, of
    // an earlier version, or the slot changed hands meanwhile) is left to `decide_beyond_home`
    // (which, where this look found no tag of the key's, takes the lock's word read before it
    // and looks at the other bucket alone; else at both): the look then ends at its decision,
    // and keeps nothing for another slot's (which made the lookup hold the bucket's values in
    // memory across the decision). A state of another key with the same fingerprint answers,
    // as any look at it does: keys are not stored (see the module docs).
    let Some(first) = (0..B).position(|at| {
        // Acquire: as `probe`'s.
        bucket.tags[at].load(Ordering::Acquire) & FINGERPRINT == place.fingerprint
    }) else {
        // Acquire: as `holdings`'.
        let lock_word = lock_word.unwrap_or_else(|| bucket.insert_lock.load(Ordering::Acquire));
        return Err(Some(AbsentAtHome { lock_word }));
    };
    let (tag, state) = (&bucket.tags[first], &bucket.states[first]);
    // Acquire: as `probe`'s.
    let seen = tag.load(Ordering::Acquire);
    if seen & FINGERPRINT != place.fingerprint {
        return Err(None);
    }
    decide_on_slot(store, plan, request, tag, state, seen).ok_or(None)
}

/// The second step of [`decide`] (its arguments are `decide`'s, and what [`decide_at_home`]'s
/// look saw, `absent_at_home`, where it found no tag of the key's): both buckets, home first (the
/// order of [`decide_at_home`]'s look, which this repeats after reading the home lock's count;
/// but where that look found no tag of the key's after reading the count, this takes its count
/// and looks at the other bucket alone, or at neither where that count's word says no insert
/// has put a state outside home: see [`OVERFLOWED`]), then (as often as another thread's change
/// makes it) an insert and both buckets again.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_beyond_home<W, const B: usize, P, R>(
    store: &ClientStore<W, B>,
    place: Place,
    plan: &P,
    request: &R,
    mut absent_at_home: Option<AbsentAtHome>,
    evicted_up_to: &W,
    before_insert: impl Fn(Version),
    now_nanos: impl Fn() -> u64,
) -> Stored<R::Answer>
where
    W: AtomicWord,
    P: StorePlan,
    P::Limit: WordLimit,
    R: WordRequest<W, P::Limit>,
{
    let mut inserts = 0;
    loop {
        // The home lock's count of holdings, read before this pass's look (on a first pass
        // after `decide_at_home` found no tag of the key's, the count it read before its look
        // at home, which stands for this pass's at home; else read here, before a look at both
        // buckets: the count must come first): if the look finds no tag of the key's and the
        // insert takes the lock at this count, the insert skips its passes (see `holdings`).
        let count_first = !store.has_fault(StoreFault::HoldingsReadAfterTheLook);
        // The home look's count serves the first pass alone (a later one follows an insert).
        let home_look = absent_at_home.take();
        let mut holdings = match home_look {
            Some(absent) => (absent.lock_word & HELD == 0).then_some(absent.lock_word),
            None if count_first => store.holdings(place),
            None => None,
        };
        let mut key_seen = false;
        // Which of the key's buckets (0 home, 1 the other) this pass probes from, if any. Where
        // the home look found no tag of the key's, its look is this pass's at home; and where
        // its word also said that no insert had put a state outside home (neither held nor
        // `OVERFLOWED`), no state of the key's was in the other bucket as of that word, and
        // one put there since comes from a holding that the insert's count shows: neither is
        // probed (and the other bucket is not even computed).
        let probed_from = match home_look {
            Some(absent) if absent.lock_word & (HELD | OVERFLOWED) == 0 => None,
            Some(_) => Some(1),
            None => Some(0),
        };
        if let Some(first) = probed_from {
            for bucket in store.buckets(place).skip(first) {
                match probe(store, bucket, place, plan, request) {
                    Probed::Answer(answer) => return Stored::Answer(answer),
                    Probed::KeySeen => key_seen = true,
                    Probed::KeyAbsent => {}
                }
            }
        }
        if !count_first && home_look.is_none() {
            holdings = store.holdings(place);
        }
        let absent_as_of = holdings.filter(|_| !key_seen);
        let head = plan.head();
        if !head.kept {
            return Stored::Elsewhere;
        }
        // Relaxed: as `protocol::made_as_of`.
        if let Some(answer) =
            request.without_state(&head.limit, evicted_up_to.load(Ordering::Relaxed))
        {
            return Stored::Answer(answer);
        }
        if inserts == MAX_INSERTS {
            return Stored::GaveUp;
        }
        inserts += 1;
        // The slot the insert put (or found) the key's state in, decided on at once; the key's
        // buckets are looked up again only if that does not answer.
        let may_defer = inserts <= EVICTION_DEFERRALS;
        before_insert(head.version);
        // The request's reading of the clock, taken before the insert's lock (the clock is the
        // user's: it may take long, or ask this service for a decision that inserts into these
        // buckets). The fresh state is decided on at it where the insert claims a free slot
        // (else the insert reads the clock again).
        let now = now_nanos();
        // A reuse under limits replaced meanwhile would take states made under them for current
        // ones, and evict one (counted) where it could take it freely: it is made only under
        // the limits still in force after the reading.
        let still_current = || plan.head().version == head.version;
        match store.insert(
            place,
            &head,
            request,
            now,
            &now_nanos,
            still_current,
            evicted_up_to,
            may_defer,
            absent_as_of,
        ) {
            Inserted::Decided(answer) => return Stored::Answer(answer),
            Inserted::LookAgain => {}
        }
    }
}

/// What a look at one bucket for a key found.
enum Probed<A> {
    /// The answer of a slot of the key's.
    Answer(A),
    /// A tag with the key's fingerprint, whose slot did not answer (a state retired or being
    /// retired, of an earlier version, or a slot that changed hands meanwhile).
    KeySeen,
    /// No tag with the key's fingerprint.
    KeyAbsent,
}

/// [`decide`] on each slot of `bucket` whose tag has the key's fingerprint, in turn, until one
/// answers; else whether the bucket had a tag with the key's fingerprint.
#[inline(always)]
fn probe<W, const B: usize, P, R>(
    store: &ClientStore<W, B>,
    bucket: &Bucket<W, B>,
    place: Place,
    plan: &P,
    request: &R,
) -> Probed<R::Answer>
where
    W: AtomicWord,
    P: StorePlan,
    P::Limit: WordLimit,
    R: WordRequest<W, P::Limit>,
{
    // Where the first slot with the key's fingerprint is, by a loop of constant length that
    // holds nothing else (unrolled: a few instructions a slot, for a bucket that answers or
    // not); then slot by slot from there, past a slot that does not answer (a state retired
    // or being retired, of an earlier version, or a slot that changed hands meanwhile).
    let Some(first) = (0..B).position(|at| {
        // Acquire: pairs with the Release that published the tag (a state's, or a freed
        // slot's), as every read of the probe (the loop below reads again the one it decides on).
        bucket.tags[at].load(Ordering::Acquire) & FINGERPRINT == place.fingerprint
    }) else {
        return Probed::KeyAbsent;
    };
    for at in first..B {
        let (tag, state) = (&bucket.tags[at], &bucket.states[at]);
        // Acquire: pairs with the Release that published the tag after its state.
        let seen = tag.load(Ordering::Acquire);
        if seen & FINGERPRINT == place.fingerprint
            && let Some(answer) = decide_on_slot(store, plan, request, tag, state, seen)
        {
            return Probed::Answer(answer);
        }
    }
    Probed::KeySeen
}

/// [`decide`] on the slot whose tag read `seen` (the key's fingerprint): the answer, if the slot
/// holds the key's state under the plan's current limits and kept its holding.
#[inline(always)]
fn decide_on_slot<W, const B: usize, P, R>(
    store: &ClientStore<W, B>,
    plan: &P,
    request: &R,
    tag: &W,
    state: &W,
    seen: u64,
) -> Option<R::Answer>
where
    W: AtomicWord,
    P: StorePlan,
    P::Limit: WordLimit,
    R: WordRequest<W, P::Limit>,
{
    // The plan is read *after* the state is found: a state is used only if it was made under
    // the version this read returns, and a state of an earlier version is retired before a
    // fresh one is put under the later one (see `insert`), so a request that read the plan
    // before a change never grants on a state put after it.
    let head = plan.head();
    let version = version_of(seen);
    if version == head.version && head.kept {
        let slot = SlotWord {
            state: store.salted(state, seen),
            tag,
            seen,
            published: seen,
            // Before the decision: an eviction of the state this decision grants on retires it
            // after the grant (before, the grant fails), and counts it after that.
            evictions_before: if R::KEEPS_GRANTS {
                store.evictions()
            } else {
                0
            },
        };
        let decided = request.acquire(&head.limit, &slot);
        // Checked whatever the answer: after a decision that met a retired state, the check's
        // fence pairs with the Release of the retiring exchange, so that what the retiring
        // thread had seen (the plan's later limits, the reading it retired at) is seen by the
        // lookups and the insert that follow.
        let same_holding = slot.same_holding();
        if let Ok(answer) = decided
            && same_holding
        {
            return Some(request.answered(answer));
        }
        // Retired, or the slot changed hands: a denial read from the slot's next state, or a
        // grant whose exchange landed in the instant between its check and the slot's change.
        // The answer is dropped, and the decision looks again; what a grant took stays taken
        // from that state (its client pays one permit for the race, and no client is granted
        // one more).
    } else if version < head.version {
        retire_earlier_apart(store, head, tag, seen, state);
    }
    None
}

/// [`ClientStore::retire_earlier`] for a look that found a state of earlier limits: out of
/// line, with the plan's head passed in registers, so that the look does not keep it in memory
/// for this rare case.
#[cold]
#[inline(never)]
fn retire_earlier_apart<W: AtomicWord, const B: usize, L: WordLimit>(
    store: &ClientStore<W, B>,
    head: StoreHead<L>,
    tag: &W,
    seen: u64,
    state: &W,
) {
    store.retire_earlier(&head, tag, seen, state);
}

/// Whether the insert must look at `bucket`'s slots one by one (see
/// [`ClientStore::settle_key_slots`]): a tag has the key's fingerprint, or another thread is
/// retiring a slot's state (its tag has the bit `retiring`: [`RETIRING`], but in a negative
/// control). Most often neither: one read of each tag, with no branch per slot.
#[inline(always)]
fn needs_settling<W: AtomicWord, const B: usize>(
    bucket: &Bucket<W, B>,
    fingerprint: u64,
    retiring: u64,
) -> bool {
    let mut key_found = false;
    let mut any_retiring = 0;
    for tag in &bucket.tags {
        // Acquire: as in `decide` (the state of a tag this finds is read after it).
        let seen = tag.load(Ordering::Acquire);
        key_found |= seen & FINGERPRINT == fingerprint;
        any_retiring |= seen & retiring;
    }
    key_found || any_retiring != 0
}

/// Claims the first free slot of `bucket`: its tag goes from free to `BUSY`. Returns the slot's
/// tag, the free tag it held, and its state.
#[inline(always)]
fn claim_free<W: AtomicWord, const B: usize>(bucket: &Bucket<W, B>) -> Option<(&W, u64, &W)> {
    bucket
        .tags
        .iter()
        .zip(&bucket.states)
        .find_map(|(tag, state)| {
            // Relaxed: the exchange in `claim` decides.
            let seen = tag.load(Ordering::Relaxed);
            claim(tag, seen).then_some((tag, seen, state))
        })
}

/// Claims a slot whose tag read `seen`, if that is a free one: its tag goes from `seen` to
/// `BUSY`. Whether this thread claimed it.
fn claim<W: AtomicWord>(tag: &W, seen: u64) -> bool {
    // Acquire: pairs with the Release that freed the slot, so the state's retirement comes
    // before the fresh state this insert stores.
    is_free(seen)
        && tag
            .compare_exchange(
                seen,
                idle_tag(seen, true),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// A slot's state word as one holding reads it: stored XORed with the holding's salt
/// ([`ClientStore::salt_of`]), so that the words of two holdings of one slot, even when their
/// values coincide, almost never coincide bit for bit (see the module's docs). Every access of
/// the store's to a state word goes through the view of the holding it found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SaltedWord<'s, W> {
    word: &'s W,
    salt: u64,
}

/// Replaces `word`'s value by `change` of it, by exchanges until one lands: the value it
/// replaced. (An exchange that finds another value computes again from it.) The `fetch_add`
/// and `fetch_max` of a salted word, whose sum is not the sum of what it stores, and of a
/// decision's view of one ([`SlotWord`]), whose exchanges answer [`READS_AS_RETIRED`] once the
/// slot has another holding: that word ends the loop, nothing written (on a word that holds it,
/// retired for every method, writing would change no answer).
#[inline]
fn update_by_exchanges<A: AtomicWord>(
    word: &A,
    order: Ordering,
    change: impl Fn(u64) -> u64,
) -> u64 {
    // Relaxed: the exchange below decides, with the caller's ordering.
    let mut current = word.load(Ordering::Relaxed);
    loop {
        match word.compare_exchange_weak(current, change(current), order, Ordering::Relaxed) {
            Ok(previous) => return previous,
            Err(READS_AS_RETIRED) => return READS_AS_RETIRED,
            Err(actual) => current = actual,
        }
    }
}

impl<W> SaltedWord<'_, W> {
    /// An exchange's answer (the word it replaced, or the one it found) as the holding reads it.
    #[inline]
    fn unsalted(&self, answer: Result<u64, u64>) -> Result<u64, u64> {
        answer
            .map(|previous| previous ^ self.salt)
            .map_err(|actual| actual ^ self.salt)
    }
}

impl<W: AtomicWord> AtomicWord for SaltedWord<'_, W> {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        self.word.load(order) ^ self.salt
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        self.word.store(value ^ self.salt, order);
    }
    #[inline]
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.unsalted(self.word.compare_exchange_weak(
            current ^ self.salt,
            new ^ self.salt,
            success,
            failure,
        ))
    }
    #[inline]
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.unsalted(self.word.compare_exchange(
            current ^ self.salt,
            new ^ self.salt,
            success,
            failure,
        ))
    }
    #[inline]
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        update_by_exchanges(self, order, |current| current.wrapping_add(value))
    }
    #[inline]
    fn fetch_max(&self, value: u64, order: Ordering) -> u64 {
        update_by_exchanges(self, order, |current| current.max(value))
    }
    #[inline]
    fn fence(order: Ordering) {
        W::fence(order);
    }
    #[inline]
    fn wait_for_writer() {
        W::wait_for_writer();
    }
    #[inline]
    fn yield_thread() {
        W::yield_thread();
    }
}

/// A slot's state word as a decision sees it, through the tag the decision found: read through
/// that holding's salt, and every exchange first checks that the slot still has the same
/// holding (the same tag, its retiring bit aside), and fails as on a retired word if not. So a
/// decision made with the limits of one holding (its version) never writes another holding's
/// state from a word it read of that holding, even when the method's compare-and-swap loop
/// retries on a word the slot's next holding wrote; and an exchange whose check passed just
/// before the slot changed hands expects a word of the old holding's salt, which the next
/// holding's word matches only by chance (see the module's docs).
#[doc(hidden)]
#[derive(Debug)]
pub struct SlotWord<'s, W> {
    state: SaltedWord<'s, W>,
    tag: &'s W,
    /// The tag the checks expect: the one the decision found, or, for an insert's decision on
    /// the slot it is filling, the slot's tag while being filled (`BUSY`).
    seen: u64,
    /// The tag the holding is published under (`seen`, but for a slot being filled).
    published: u64,
    /// The store's eviction count, read before the decision, for a request that keeps its
    /// grant (`WordRequest::KEEPS_GRANTS`); 0 otherwise.
    evictions_before: u64,
}

/// Where a decision on a [`SlotWord`] landed: the slot (by the address of its tag word, which
/// stays the slot's for the store's life) and the holding (the tag the decision found), so that
/// its grant can be given back to that holding and no other ([`give_back`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    tag_address: usize,
    seen: u64,
    /// The store's eviction count before the decision (see [`give_back`]).
    evictions_before: u64,
}

impl<W> SlotWord<'_, W> {
    /// The slot and holding this view decides on.
    #[inline]
    pub fn holding(&self) -> Holding {
        Holding {
            tag_address: std::ptr::from_ref::<W>(self.tag) as usize,
            seen: self.published,
            evictions_before: self.evictions_before,
        }
    }
}

/// Gives back a grant made on `holding` of one of `store`'s slots (by a request that keeps its
/// grants, whose decision read the store's eviction count into the holding first): `undo` runs on that holding's state (the view a decision uses, which checks before
/// each exchange that the slot still has the holding), under the plan's current limits, only
/// if they are the ones the holding's state was made under. Nothing where the slot has changed
/// hands (its state was retired, and the grant's permits went with it: the next holding starts
/// afresh, and no undo may touch it) or the plan's limits have changed since. Whether `undo`
/// ran.
///
/// A slot's tag tells its holdings apart by a generation of 6 bits: after a multiple of 64
/// changes of hands back to the same key, the tag (and the salt) is the one the grant found,
/// and an undo there would give the key's later state permits it never took. While the grant
/// still counts in its state (its window is current, its tokens not refilled), that state is
/// never idle, so it leaves the slot only by an eviction (a rule change changes the version):
/// an eviction count unchanged since before the decision (read once the slot was found,
/// before its state was decided on), read again after the tag (whose Acquire
/// sees every insert's count that published the tags since), rules that out. A grant that no
/// longer counts has nothing an undo could wrongly give (the windows' undo finds another
/// window; the bucket's restore turns one full bucket into another). One case is left open: a
/// refund (`RateLimiterService::refund`) can make a state whose grant still counts idle, and an
/// idle state leaves its slot uncounted; should the slot then change hands a multiple of 64
/// times and come back to the same key while the grant is in flight, its give-back reaches the
/// key's later state (at most the grant's permits, once).
///
/// Should the slot change hands between the check and an exchange of `undo`, the exchange
/// expects a word in the earlier holding's frame, which the salts keep from landing on the
/// next holding's (see the module's docs): the same argument as a decision's.
#[doc(hidden)]
#[cfg(any(feature = "envoy", feature = "loom"))]
pub fn give_back<W, const B: usize, P>(
    store: &ClientStore<W, B>,
    holding: Holding,
    plan: &P,
    undo: impl FnOnce(&P::Limit, &SlotWord<'_, W>),
) -> bool
where
    W: AtomicWord,
    P: StorePlan,
{
    let Some((tag, state)) = store.slot_at(holding.tag_address) else {
        return false;
    };
    // Acquire: pairs with the Release that published the holding's tag after its state (and
    // after the count of the eviction that made room for it).
    let now_held = tag.load(Ordering::Acquire);
    let seen = if store.has_fault(StoreFault::GiveBackToTheSlot) {
        now_held
    } else if (now_held ^ holding.seen) & !RETIRING == 0
        && store.evictions() == holding.evictions_before
    {
        holding.seen
    } else {
        return false;
    };
    let Some((limit, slot)) = store.current_view(plan, tag, state, seen) else {
        return false;
    };
    undo(&limit, &slot);
    true
}

/// Runs `change` on the state the key at `place` has in `store` under the plan's current
/// limits, through the view a decision uses (which checks, before each exchange, that the slot
/// still has the holding found); inserts nothing. Whether it found one.
#[cfg(feature = "envoy")]
pub(crate) fn with_state<W, const B: usize, P>(
    store: &ClientStore<W, B>,
    place: Place,
    plan: &P,
    change: impl FnOnce(&P::Limit, &SlotWord<'_, W>),
) -> bool
where
    W: AtomicWord,
    P: StorePlan,
{
    let current = store
        .key_slots(place)
        .find_map(|(tag, state, seen)| store.current_view(plan, tag, state, seen));
    current.map(|(limit, slot)| change(&limit, &slot)).is_some()
}

/// A word that every one-word method reads as retired: the token bucket's retired TAT, and the
/// retired flag of the fixed window's and the sliding window counter's packed words.
const READS_AS_RETIRED: u64 = u64::MAX;

impl<W: AtomicWord> SlotWord<'_, W> {
    /// Whether the slot still has the holding the decision found.
    #[inline]
    fn same_holding(&self) -> bool {
        // Acquire: pairs with the Release store of any fresh state that this thread's accesses to
        // the state word read from (or read a later write of), so the tag read below is no
        // earlier than that holding's `BUSY`.
        W::fence(Ordering::Acquire);
        // Relaxed: ordered by the fence. The retiring bit aside: a retirement that lands after a
        // decision leaves the decision standing.
        (self.tag.load(Ordering::Relaxed) ^ self.seen) & !RETIRING == 0
    }
}

impl<W: AtomicWord> AtomicWord for SlotWord<'_, W> {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        self.state.load(order)
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        self.state.store(value, order);
    }
    #[inline]
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        if !self.same_holding() {
            return Err(READS_AS_RETIRED);
        }
        self.state
            .compare_exchange_weak(current, new, success, failure)
    }
    #[inline]
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        if !self.same_holding() {
            return Err(READS_AS_RETIRED);
        }
        self.state.compare_exchange(current, new, success, failure)
    }
    /// The fixed window's one-permit fast path, by checked exchanges (a salted word cannot be
    /// added to in place): on another holding it answers the retired word, having added nothing.
    #[inline]
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        update_by_exchanges(self, order, |current| current.wrapping_add(value))
    }
    #[inline]
    fn fetch_max(&self, value: u64, order: Ordering) -> u64 {
        update_by_exchanges(self, order, |current| current.max(value))
    }
    #[inline]
    fn fence(order: Ordering) {
        W::fence(order);
    }
    #[inline]
    fn wait_for_writer() {
        W::wait_for_writer();
    }
    #[inline]
    fn yield_thread() {
        W::yield_thread();
    }
}

/// Takes the live slot whose tag read `seen` for this thread to retire its state: sets the
/// retiring bit by one exchange, which fails if the tag changed (another thread took the slot,
/// or it changed hands). Whether this thread took it.
fn take_live<W: AtomicWord>(tag: &W, seen: u64) -> bool {
    // A tag read with the bit set is another thread's already.
    seen & RETIRING == 0
        // Acquire: sees the state as the slot's filler published it.
        && tag
            .compare_exchange(seen, seen | RETIRING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
}

/// A live state an eviction may take, as its one look at it read it.
struct Candidate<'s, W> {
    tag: &'s W,
    seen: u64,
    state: &'s W,
    salted: SaltedWord<'s, W>,
    /// The permits it has available at the insert's reading.
    available: u64,
    /// `WordLimit::counted_and_idle_from`.
    counts: Option<(u64, u64)>,
}

impl<W> Candidate<'_, W> {
    /// How close to fresh the eviction finds the state (the victim is the greatest), given
    /// `reached`, the latest reading known to have been taken (the insert's, the one published
    /// for evictions, and every one the bucket's states' counts show). First (where
    /// `by_idleness`) the states idle at `reached`, none of whose clients decided since a
    /// reading some thread has taken, and of those the one idle from the earliest reading: so a
    /// request held after its reading never takes a client that decided at a reading the
    /// bucket's states show, while another was idle there (a reading that writes no state, a
    /// peek or a refusal, is not seen). Where none is, as at the insert's own reading: the most
    /// permits available there, then the least recently counted, the one whose counts end
    /// earliest (a state active at every reading taken is judged where the insert stands, so
    /// that one whose counts run far ahead, a thread reading ahead, changes no other's place).
    /// A state the method cannot tell of ranks as the most recent.
    fn victim_key(
        &self,
        reached: u64,
        by_idleness: bool,
    ) -> (bool, Reverse<u64>, u64, Reverse<u64>) {
        if !by_idleness {
            return (false, Reverse(0), self.available, Reverse(0));
        }
        let (counted_up_to, idle_from) = self.counts.unwrap_or((u64::MAX, u64::MAX));
        let idle = idle_from <= reached;
        (
            idle,
            Reverse(if idle { idle_from } else { 0 }),
            self.available,
            Reverse(counted_up_to),
        )
    }
}

/// Takes the live slot whose tag read `seen` and retires its state if it is idle at `now_nanos`;
/// when it is not (an acquire landed first), puts the tag back. Whether it retired it (the slot
/// is then this thread's).
fn retire_if_idle<W: AtomicWord, L: WordLimit>(
    limit: &L,
    tag: &W,
    seen: u64,
    state: &SaltedWord<'_, W>,
    now_nanos: u64,
) -> bool {
    if !take_live(tag, seen) {
        return false;
    }
    if limit.retire_if_idle(state, now_nanos) {
        return true;
    }
    // Release: as every tag a live state is published under.
    tag.store(seen, Ordering::Release);
    false
}

/// `tag` once no thread holds it to retire its state (a few instructions' wait, unless that
/// thread is descheduled): an insert must know whether a live state stays.
fn settled<W: AtomicWord>(tag: &W) -> u64 {
    let mut waits = 0_u32;
    loop {
        // Acquire: as in `decide`.
        let seen = tag.load(Ordering::Acquire);
        if seen & RETIRING == 0 {
            return seen;
        }
        wait_a_moment::<W>(&mut waits);
    }
}

/// One more wait (of `waits` so far) for another thread's short write: a spin hint, and every
/// 64th time the core given up, in case that thread is descheduled.
fn wait_a_moment<W: AtomicWord>(waits: &mut u32) {
    *waits += 1;
    if waits.is_multiple_of(64) {
        W::yield_thread();
    } else {
        W::wait_for_writer();
    }
}

/// The insert lock of one bucket, held while this lives. Its word is `HELD` while held, plus
/// twice the number of holdings released so far ([`InsertLock::holdings`]), so a thread that
/// reads the word and later takes the lock knows whether anyone held it in between.
struct InsertLock<'l, W: AtomicWord> {
    lock: &'l W,
    /// The lock's word when this holding took it: not held, and the holdings before it.
    holdings: u64,
    /// `OVERFLOWED` where this holding took a slot in its key's other bucket, else 0.
    overflowed: u64,
}

/// The bit of an insert lock's word that says it is held.
const HELD: u64 = 1;
/// The bit of an insert lock's word that says a holding of it has taken a slot outside the
/// lock's bucket (in a key's other bucket), set when that holding is let go and never cleared.
/// A decision that read the word without it and without `HELD` (Acquire, before its look at
/// home, see [`decide_at_home`]) knows that every state of a key of this home put until then is
/// in the home bucket: where that look finds no tag of the key's, it skips the other bucket.
/// (A word with `HELD` gives the insert no count to skip its passes by, so skipping there would
/// be safe too; but an insert is then under way, whose state the probe finds without another
/// insert's round, which would spend one of the decision's deferrals of an eviction.)
/// A state put in the other bucket later comes from a later holding, which the insert that
/// follows sees (the count differs, so it makes its passes over both buckets: see
/// [`ClientStore::holdings`]). Sticky, as a state's tag does not tell its home: a bucket that
/// has once overflowed has its keys' other bucket probed from then on, as before.
const OVERFLOWED: u64 = 2;
/// One released holding, in an insert lock's word: the count above `HELD` and `OVERFLOWED`.
const HOLDING: u64 = 4;

impl<'l, W: AtomicWord> InsertLock<'l, W> {
    /// Takes `lock`, waiting while another insert holds it (a few dozen instructions, unless
    /// that thread is descheduled). The first exchange expects `expected` where it is given (a
    /// word read earlier, most often still the lock's), else the word as loaded.
    fn take(lock: &'l W, expected: Option<u64>) -> Self {
        let mut waits = 0_u32;
        // Relaxed: the exchange below decides, and fences.
        let mut word = expected.unwrap_or_else(|| lock.load(Ordering::Relaxed));
        loop {
            if word & HELD == 0 {
                // Acquire: sees every slot the previous holders wrote.
                match lock.compare_exchange_weak(
                    word,
                    word | HELD,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return InsertLock {
                            lock,
                            holdings: word,
                            overflowed: 0,
                        };
                    }
                    Err(current) => word = current,
                }
            } else {
                wait_a_moment::<W>(&mut waits);
                // Relaxed: as above.
                word = lock.load(Ordering::Relaxed);
            }
        }
    }
}

impl<W: AtomicWord> Drop for InsertLock<'_, W> {
    fn drop(&mut self) {
        // Release: publishes the slots written under the lock to the next holder, and to a
        // decision whose look at the word reads this count (see `ClientStore::holdings`).
        // Wrapping: 2^62 holdings of one lock would take centuries (and the carry out of the
        // top bit leaves `HELD` and `OVERFLOWED` as they are).
        self.lock.store(
            self.holdings.wrapping_add(HOLDING) | self.overflowed,
            Ordering::Release,
        );
    }
}
