//! The service's store of one-word states (`service/store.rs`): its own protocol, `decide`,
//! `insert` and `sweep`, run on loom's atomics with the token bucket's real state machine, in a
//! table of one bucket of two slots (every key of the model shares it, so slots are fought over
//! and reused).
//!
//! - A lookup racing an insert of the same key: first requests of one client make one state,
//!   also into a full bucket, where each evicts. In a store of two buckets, a key whose state an
//!   insert put outside home (racing a sweep that frees home slots) is found there by its next
//!   request.
//! - A rule change racing requests: the client starts afresh once across the change.
//! - An eviction racing a decision on the state being evicted, and a slot reused for another
//!   client while a stale request holds it: no grant is made but from a fresh state's permits.
//! - An eviction by an insert whose reading lags its victim's: the victim's next state gives back
//!   one permit at most. An eviction by an insert whose reading lags a decision made since takes
//!   a client idle at the reading that decision's counts show, not the one it was made for.
//! - A sweep racing requests: nothing is granted twice; racing a first request, it never
//!   retires the fresh state before the request's decision (which would make it insert again).
//! - A give-back (a grant undone: `RateLimiterService::give_back`) racing an eviction of its
//!   slot, and a decision on its state: it reaches its own state or nothing, and returns its
//!   permit once.
//!
//! `negative_controls` runs each checker on a broken variant of the store and shows that it is
//! caught: an insert without its lock, an insert that publishes its fresh state before deciding,
//! a tag taken twice, a sweep that retires active states, an insert outside home that its home's
//! lock word does not show, an eviction that is not counted
//! (a fresh state the eviction model cannot account for), one that publishes only its own
//! reading, and one that chooses its victim at its own reading alone.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::thread;

use tollgate::Decision;
use tollgate::loom_support::store::{
    ClientStore, Holding, Place, SlotWord, StoreFault, StoreHead, StorePlan, Stored, WordRequest,
    decide, give_back,
};
use tollgate::loom_support::{Admit, GcraParams, Method as Core, Reservation, Retired};

use crate::support::{FixedClock, WINDOW, explore, one_word_limit};
use crate::token_bucket::bucket;

// A token bucket's constants, as the store's plan hands them out.
one_word_limit!(ModelLimit, GcraParams, full_since);

/// A plan whose version is one atomic word (a read of the table's published pointer is one
/// atomic snapshot, as a word's load is), with the limit of each version.
pub(crate) struct ModelPlan {
    pub(crate) version: AtomicU64,
    pub(crate) limits: [GcraParams; 2],
}

impl StorePlan for ModelPlan {
    type Limit = ModelLimit;

    fn head(&self) -> StoreHead<ModelLimit> {
        // Acquire: as the table's read of its published version.
        let version = self.version.load(Ordering::Acquire);
        StoreHead {
            version: version as u16,
            kept: true,
            limit: ModelLimit(self.limits[version as usize]),
        }
    }
}

/// One permit at a fixed reading; answers whether it was granted.
pub(crate) struct ModelRequest {
    pub(crate) now: u64,
}

impl WordRequest<AtomicU64, ModelLimit> for ModelRequest {
    type Answer = bool;

    fn acquire(
        &self,
        limit: &ModelLimit,
        state: &SlotWord<'_, AtomicU64>,
    ) -> Result<bool, Retired> {
        self.acquire_at(limit, state, self.now)
    }

    fn acquire_at(
        &self,
        limit: &ModelLimit,
        state: &SlotWord<'_, AtomicU64>,
        now_nanos: u64,
    ) -> Result<bool, Retired> {
        Core::acquire_one(&limit.0, state, &FixedClock(now_nanos))
            .map(|admit| admit == Admit::Granted)
    }

    fn answered(&self, answer: bool) -> bool {
        answer
    }

    fn without_state(&self, _limit: &ModelLimit, _since_nanos: u64) -> Option<bool> {
        None
    }
}

/// A grant kept to give back: where it landed, and what it took.
pub(crate) type Grant = (Holding, Decision, Reservation);

/// One permit at a fixed reading, keeping its grant (see `RateLimiterService::reserve_reported`).
pub(crate) struct ReservingRequest {
    pub(crate) now: u64,
}

impl WordRequest<AtomicU64, ModelLimit> for ReservingRequest {
    const KEEPS_GRANTS: bool = true;
    type Answer = Option<Grant>;

    fn acquire(
        &self,
        limit: &ModelLimit,
        state: &SlotWord<'_, AtomicU64>,
    ) -> Result<Self::Answer, Retired> {
        self.acquire_at(limit, state, self.now)
    }

    fn acquire_at(
        &self,
        limit: &ModelLimit,
        state: &SlotWord<'_, AtomicU64>,
        now_nanos: u64,
    ) -> Result<Self::Answer, Retired> {
        let (decision, reservation) = Core::reserve(&limit.0, state, 1, &FixedClock(now_nanos))?;
        Ok(reservation
            .filter(|_| decision.is_allowed())
            .map(|reservation| (state.holding(), decision, reservation)))
    }

    fn answered(&self, answer: Self::Answer) -> Self::Answer {
        answer
    }

    fn without_state(&self, _limit: &ModelLimit, _since_nanos: u64) -> Option<Self::Answer> {
        None
    }
}

/// A service's store, plan and `evicted_up_to`, with one bucket of two slots. Every model's
/// rule is a bucket of one permit per window, before and after the change.
pub(crate) struct ModelStore {
    pub(crate) store: ClientStore<AtomicU64, 2>,
    pub(crate) plan: ModelPlan,
    pub(crate) evicted_up_to: AtomicU64,
}

impl ModelStore {
    /// A store for a plan of `limits[0]`, changed to `limits[1]` by [`ModelStore::change`],
    /// with `fault` in its protocol.
    pub(crate) fn new(limits: [GcraParams; 2], fault: StoreFault) -> Self {
        Self::with_buckets(limits, fault, 1)
    }

    /// [`ModelStore::new`] with `buckets` buckets of two slots.
    pub(crate) fn with_buckets(limits: [GcraParams; 2], fault: StoreFault, buckets: usize) -> Self {
        ModelStore {
            store: ClientStore::with_fault(2 * buckets, fault),
            plan: ModelPlan {
                version: AtomicU64::new(0),
                limits,
            },
            evicted_up_to: AtomicU64::new(0),
        }
    }

    /// Where the client `key` lives (every key shares the one bucket; keys differ by
    /// fingerprint).
    pub(crate) fn place(&self, key: u64) -> Place {
        self.store.place(key)
    }

    /// One permit for `key` at `now`, as the service decides it; whether it was granted.
    pub(crate) fn request(&self, key: u64, now: u64) -> bool {
        match decide(
            &self.store,
            self.place(key),
            &self.plan,
            &ModelRequest { now },
            &self.evicted_up_to,
            |_| {},
            || now,
        ) {
            Stored::Answer(granted) => granted,
            other => panic!("the store gave no answer: {other:?}"),
        }
    }

    /// One permit for `key` at `now`, keeping the grant (`None` if refused).
    pub(crate) fn reserve(&self, key: u64, now: u64) -> Option<Grant> {
        match decide(
            &self.store,
            self.place(key),
            &self.plan,
            &ReservingRequest { now },
            &self.evicted_up_to,
            |_| {},
            || now,
        ) {
            Stored::Answer(grant) => grant,
            other => panic!("the store gave no answer: {other:?}"),
        }
    }

    /// Gives `grant` back, as the service does; whether its holding was found.
    pub(crate) fn give_back(&self, grant: Grant, now: u64) -> bool {
        let (holding, decision, reservation) = grant;
        give_back(&self.store, holding, &self.plan, |limit, slot| {
            Core::undo(&limit.0, slot, 1, &decision, reservation, now);
        })
    }

    /// `set_rule`: publishes the plan's next version.
    pub(crate) fn change(&self) {
        // Release: as the table's publication.
        self.plan.version.store(1, Ordering::Release);
    }

    /// The service's sweep of the store at `now`.
    pub(crate) fn sweep(&self, now: u64) -> usize {
        self.store
            .sweep(&self.plan.head(), now, &self.evicted_up_to)
    }
}

/// Key values: their fingerprints differ, and every one lives in the model's one bucket. In a
/// store of two buckets, each has the first bucket for home (a key's high bits), and Alice and
/// Carol have the second for their other (a remix's high bits), Bob none.
pub(crate) const ALICE: u64 = 1;
pub(crate) const BOB: u64 = 2;
pub(crate) const CAROL: u64 = 3;

/// Two first requests of one client race: one state is made, so a bucket of one grants once.
/// Panics with "more than one state" otherwise.
pub(crate) fn check_first_requests(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        race_two_first_requests(&model);
    });
}

/// Two first requests of Alice (a bucket of one permit) racing, each on a thread of its own (not
/// the model's main thread), so that loom interleaves them: exactly one is granted.
fn race_two_first_requests(model: &Arc<ModelStore>) {
    let [here, there] = [0, 1].map(|_| {
        let model = Arc::clone(model);
        thread::spawn(move || model.request(ALICE, 0))
    });
    let here = here.join().expect("a request panicked");
    let there = there.join().expect("a request panicked");
    assert!(
        !(here && there),
        "more than one state for one client: both first requests granted"
    );
    assert!(here || there, "one of the first requests is granted");
}

/// Two first requests of one client race into a full bucket (two other clients, each with its
/// one permit used): each evicts under its insert lock, and the second to take the lock finds
/// the state the first put. One state is made, so the client is granted once. Panics with "more
/// than one state" otherwise.
pub(crate) fn check_first_requests_into_a_full_bucket(fault: StoreFault) {
    explore(2, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        assert!(
            model.request(BOB, 0) && model.request(CAROL, 0),
            "the prefill"
        );
        race_two_first_requests(&model);
    });
}

/// A client that has used its one permit; the rule changes (to the same rule: the point is the
/// version) while two requests race it. The client may start afresh once: at most one request
/// is granted. Panics with "started afresh twice" otherwise.
pub(crate) fn check_change_racing_requests(fault: StoreFault) {
    explore(2, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        assert!(model.request(ALICE, 0), "the prefill is granted");
        let changer = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.change())
        };
        let other = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(ALICE, 0))
        };
        let here = model.request(ALICE, 0);
        changer.join().expect("the change panicked");
        let there = other.join().expect("a request panicked");
        assert!(
            !(here && there),
            "started afresh twice across one change: both requests granted"
        );
    });
}

/// Bob and Alice fill the bucket's two slots, each having used its one permit. Carol's first
/// request evicts one of them while Alice asks again, her request holding the slot that
/// Carol's state may then take (and her own re-insert may evict Carol's in turn). Every grant
/// is taken from a fresh state, and every fresh state here comes from an eviction, of one
/// permit: no more grants than evictions, however the requests and evictions interleave (a
/// request that decided on a slot that changed hands meanwhile drops its answer and looks
/// again). Panics with "more grants than" otherwise.
pub(crate) fn check_eviction_racing_a_decision(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        for client in [BOB, ALICE] {
            assert!(model.request(client, 0), "the prefill is granted");
        }
        // Both requests on threads of their own (not the model's main thread), so that loom
        // interleaves them.
        let carol = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(CAROL, 0))
        };
        let alice = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(ALICE, 0))
        };
        let alice = alice.join().expect("Alice's request panicked");
        let carol = carol.join().expect("Carol's request panicked");
        let evictions = model.store.evictions();
        assert!(
            u64::from(alice) + u64::from(carol) <= evictions,
            "more grants than fresh states: Alice {alice}, Carol {carol}, {evictions} evictions"
        );
        assert!(evictions >= 1, "a full bucket of active states evicts");
    });
}

/// Alice and Bob fill the bucket's two slots, each having used its one permit at `LATER`.
/// Carol's first request comes with a reading that lags theirs (0: another thread's older
/// reading) and evicts Alice, while Alice asks again at `WINDOW` and then at `LATER`.
/// Every fresh state is made as of where its evicted predecessor's counts end, so Carol's
/// lagging reading and Alice's earlier one are refused, and each eviction gives at most its one
/// permit back: no more grants than evictions, however the requests interleave. (A fresh state
/// made as of the lagging reading would grant Alice at both her readings.) Panics with "more
/// grants than evictions" otherwise.
pub(crate) fn check_eviction_at_a_lagging_reading(fault: StoreFault) {
    const LATER: u64 = 2 * WINDOW;
    explore(2, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        // Alice's state last: of states equally close to fresh, the eviction takes the last.
        for client in [BOB, ALICE] {
            assert!(model.request(client, LATER), "the prefill is granted");
        }
        let carol = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(CAROL, 0))
        };
        let alice = {
            let model = Arc::clone(&model);
            thread::spawn(move || [model.request(ALICE, WINDOW), model.request(ALICE, LATER)])
        };
        let grants = alice
            .join()
            .expect("Alice's requests panicked")
            .into_iter()
            .chain([carol.join().expect("Carol's request panicked")])
            .filter(|granted| *granted)
            .count() as u64;
        let evictions = model.store.evictions();
        assert!(
            grants <= evictions,
            "more grants than evictions: {grants} grants, {evictions} evictions"
        );
        assert!(evictions >= 1, "a full bucket of active states evicts");
    });
}

/// Bob and Alice fill the bucket's two slots, each having used its one permit at 0. Alice asks
/// again at `LATER` (granted: her state is idle by then) and says so on a flag; Carol's first
/// request, with a reading of 0 that lags Alice's (a thread held after its reading), finds no
/// state idle at 0 and evicts one. Where Carol's request began after Alice's decision (it read
/// the flag set), Alice's counts show a reading in `LATER`'s window, at which Bob's state is
/// idle (from `WINDOW`) and Alice's is not (only from the window after): Carol takes Bob's
/// slot, and Alice's state stands (refused again at `LATER`).
/// However the two interleave, every grant but Alice's one at `LATER` comes from an eviction.
/// Panics with "an active client was evicted" or "more grants than" otherwise.
pub(crate) fn check_eviction_after_a_later_decision(fault: StoreFault) {
    const LATER: u64 = 2 * WINDOW;
    explore(2, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        // Alice's state last: of states alike at the evicting reading, the last is the one
        // taken when nothing else tells them apart.
        for client in [BOB, ALICE] {
            assert!(model.request(client, 0), "the prefill is granted");
        }
        let alice_decided = Arc::new(AtomicBool::new(false));
        let alice = {
            let (model, alice_decided) = (Arc::clone(&model), Arc::clone(&alice_decided));
            thread::spawn(move || {
                let granted = model.request(ALICE, LATER);
                // Release: Carol's request, reading this first, sees Alice's state as it left it.
                alice_decided.store(true, Ordering::Release);
                granted
            })
        };
        let carol = {
            let (model, alice_decided) = (Arc::clone(&model), Arc::clone(&alice_decided));
            thread::spawn(move || {
                // Acquire: pairs with the Release above.
                let after_alice = alice_decided.load(Ordering::Acquire);
                (after_alice, model.request(CAROL, 0))
            })
        };
        let alice = alice.join().expect("Alice's request panicked");
        let (after_alice, carol) = carol.join().expect("Carol's request panicked");
        let alice_again = model.request(ALICE, LATER);
        let evictions = model.store.evictions();
        if after_alice {
            assert!(
                !alice_again && evictions == 1,
                "an active client was evicted while an idle one was there: Alice granted again \
                 at {LATER}: {alice_again}, {evictions} evictions"
            );
        }
        let grants = [alice, carol, alice_again]
            .into_iter()
            .filter(|granted| *granted)
            .count() as u64;
        assert!(
            grants <= 1 + evictions,
            "more grants than Alice's one and the evictions: {grants} grants, {evictions} \
             evictions"
        );
    });
}

/// In a store of two buckets, Bob and Carol fill their home (Alice's too) with their permits
/// used; Alice's first request races a sweep that frees their slots, both at the reading where
/// their permits are back. Alice's state goes to her other bucket where the sweep comes after
/// her insert's look at home (a free slot is claimed before an idle one is reused; her home's
/// lock word then says an insert overflowed), else home. Her next request, at the same reading,
/// must find it wherever it is (her look at home finds no tag of hers, and a home slot is
/// free): she is granted once. Panics with "a second state" otherwise.
pub(crate) fn check_request_after_an_overflow(fault: StoreFault) {
    const LATER: u64 = WINDOW;
    explore(3, move || {
        let model = Arc::new(ModelStore::with_buckets([bucket(1), bucket(1)], fault, 2));
        assert!(
            model.request(BOB, 0) && model.request(CAROL, 0),
            "the prefill"
        );
        let sweeper = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.sweep(LATER))
        };
        let alice = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(ALICE, LATER))
        };
        assert_eq!(
            sweeper.join().expect("the sweep panicked"),
            2,
            "the sweep frees Bob's and Carol's slots"
        );
        assert!(
            alice.join().expect("Alice's request panicked"),
            "Alice's first permit"
        );
        assert!(
            !model.request(ALICE, LATER),
            "Alice granted twice in one window: a second state for her at home"
        );
    });
}

/// In a store of two buckets, Bob and Carol fill their home (Alice's too) with their permits
/// used, and Alice's first two requests race: the first to take her home's lock puts her state
/// in her other bucket, and the other request, whether it read her home's lock word before,
/// during or after that holding, finds it there (rather than claim the bucket's other free
/// slot). Exactly one is granted. Panics with "a second state" otherwise.
pub(crate) fn check_requests_racing_an_overflow(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::with_buckets([bucket(1), bucket(1)], fault, 2));
        assert!(
            model.request(BOB, 0) && model.request(CAROL, 0),
            "the prefill"
        );
        let [here, there] = [0, 1].map(|_| {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(ALICE, 0))
        });
        let here = here.join().expect("a request panicked");
        let there = there.join().expect("a request panicked");
        assert!(
            !(here && there),
            "Alice granted twice in one window: a second state for her"
        );
        assert!(here || there, "one of Alice's requests is granted");
    });
}

/// Alice has used her permit; a sweep at the same instant frees only states indistinguishable
/// from fresh, racing Bob's first two requests (his state is fresh until the first is granted,
/// and may be retired then): Bob is granted once, never twice, and Alice's used permit stays
/// used. Panics with "granted twice" or "stays used" otherwise.
pub(crate) fn check_sweep_racing_requests(fault: StoreFault) {
    explore(2, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        assert!(model.request(ALICE, 0), "Alice's permit");
        let sweeper = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.sweep(0))
        };
        let bob = {
            let model = Arc::clone(&model);
            thread::spawn(move || [model.request(BOB, 0), model.request(BOB, 0)])
        };
        sweeper.join().expect("the sweep panicked");
        let [first, second] = bob.join().expect("Bob's requests panicked");
        assert!(first, "Bob's first request is granted");
        assert!(
            !second,
            "Bob granted twice: the sweep retired an active state"
        );
        assert!(!model.request(ALICE, 0), "Alice's used permit stays used");
    });
}

/// Alice is active and Bob idle in the model's full bucket; a sweep (which frees Bob's slot)
/// races Carol's first request: Carol should take Bob's slot, and Alice keep her state (no
/// eviction while a slot no active client needs exists). Panics with "evicted an active client"
/// otherwise.
pub(crate) fn check_sweep_racing_an_insert(fault: StoreFault) {
    const LATER: u64 = 2 * WINDOW;
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        // Bob's permit at 0 is long back at `LATER`; Alice's, taken then, is not.
        assert!(model.request(BOB, 0), "Bob's permit");
        assert!(model.request(ALICE, LATER), "Alice's permit");
        let sweeper = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.sweep(LATER))
        };
        let carol = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(CAROL, LATER))
        };
        sweeper.join().expect("the sweep panicked");
        assert!(
            carol.join().expect("Carol's request panicked"),
            "Carol's first permit"
        );
        assert_eq!(
            model.store.evictions(),
            0,
            "evicted an active client while Bob's idle slot was there"
        );
        assert!(
            !model.request(ALICE, LATER),
            "Alice's used permit stays used"
        );
    });
}

/// Carol's first request races a sweep at the same reading. Her fresh state is idle (it has
/// taken nothing) until her decision on it, so the insert decides before it publishes the slot:
/// the sweep cannot retire it first and make her insert again. (Each insert after the first
/// spends one of the decision's deferrals of an eviction: see `EVICTION_DEFERRALS`, whose
/// exhaustion let an insert evict an active client while a sweep freed a slot.) Panics with
/// "inserted again" otherwise.
pub(crate) fn check_sweep_racing_a_first_request(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        let sweeper = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.sweep(0))
        };
        let carol = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(CAROL, 0))
        };
        let freed = sweeper.join().expect("the sweep panicked");
        assert!(
            carol.join().expect("Carol's request panicked"),
            "Carol's first permit"
        );
        assert_eq!(
            model.store.inserts_at_home(model.place(CAROL)),
            1,
            "Carol inserted again: the sweep retired her fresh state (freed {freed}) before her \
             decision"
        );
        assert_eq!(freed, 0, "the sweep freed a state that had taken a permit");
    });
}

/// Bob and Alice fill the bucket's two slots, each having used its one permit (Alice's grant
/// kept to give back). Alice's give-back races Carol's first two requests: Carol's insert takes
/// Alice's slot (by evicting her, or reusing it once the give-back made it idle), and the
/// give-back must reach Alice's state or nothing, never Carol's, which holds the same word in
/// the same slot. Carol, whom no one evicts, is granted once. Panics with "Carol granted twice"
/// otherwise.
pub(crate) fn check_give_back_racing_an_eviction(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        assert!(model.request(BOB, 0), "Bob's permit");
        let grant = model.reserve(ALICE, 0).expect("Alice's permit");
        let alice = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.give_back(grant, 0))
        };
        let carol = {
            let model = Arc::clone(&model);
            thread::spawn(move || [model.request(CAROL, 0), model.request(CAROL, 0)])
        };
        alice.join().expect("the give-back panicked");
        let [first, second] = carol.join().expect("Carol's requests panicked");
        assert!(first, "Carol's first permit");
        assert!(
            !second,
            "Carol granted twice: a give-back landed on the state that took its slot"
        );
    });
}

/// Alice's grant, kept to give back, races her next request: the give-back restores her permit
/// exactly (a refusal writes nothing for it to meet), so of that request and one after both,
/// exactly one is granted. Panics with "granted" otherwise.
pub(crate) fn check_give_back_racing_a_decision(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(ModelStore::new([bucket(1), bucket(1)], fault));
        let grant = model.reserve(ALICE, 0).expect("Alice's permit");
        let giver = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.give_back(grant, 0))
        };
        let racing = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(ALICE, 0))
        };
        assert!(
            giver.join().expect("the give-back panicked"),
            "the give-back finds Alice's state"
        );
        let racing = racing.join().expect("Alice's request panicked");
        let after = model.request(ALICE, 0);
        assert_eq!(
            u8::from(racing) + u8::from(after),
            1,
            "the given-back permit granted {} times (racing {racing}, after {after})",
            u8::from(racing) + u8::from(after)
        );
    });
}

#[test]
fn store_give_back_racing_an_eviction_reaches_only_its_own_state() {
    check_give_back_racing_an_eviction(StoreFault::None);
}

#[test]
fn store_give_back_racing_a_decision_returns_the_permit_once() {
    check_give_back_racing_a_decision(StoreFault::None);
}

#[test]
fn store_first_requests_make_one_state() {
    check_first_requests(StoreFault::None);
}

#[test]
fn store_first_requests_into_a_full_bucket_make_one_state() {
    check_first_requests_into_a_full_bucket(StoreFault::None);
}

#[test]
fn store_request_after_an_overflow_finds_the_state_outside_home() {
    check_request_after_an_overflow(StoreFault::None);
}

#[test]
fn store_requests_racing_an_overflow_make_one_state() {
    check_requests_racing_an_overflow(StoreFault::None);
}

#[test]
fn store_rule_change_racing_requests_starts_a_client_afresh_once() {
    check_change_racing_requests(StoreFault::None);
}

#[test]
fn store_eviction_racing_a_decision_never_grants_more_than_fresh_states() {
    check_eviction_racing_a_decision(StoreFault::None);
}

#[test]
fn store_eviction_at_a_lagging_reading_gives_back_one_permit_at_most() {
    check_eviction_at_a_lagging_reading(StoreFault::None);
}

#[test]
fn store_eviction_after_a_later_decision_takes_the_client_idle_since() {
    check_eviction_after_a_later_decision(StoreFault::None);
}

#[test]
fn store_sweep_racing_requests_never_grants_twice() {
    check_sweep_racing_requests(StoreFault::None);
}

#[test]
fn store_sweep_racing_a_first_request_never_makes_it_insert_again() {
    check_sweep_racing_a_first_request(StoreFault::None);
}

#[test]
fn store_sweep_racing_an_insert_evicts_no_active_client() {
    check_sweep_racing_an_insert(StoreFault::None);
}
