//! Negative controls: each checker, run on a variant broken in one racy step, must fail. A model
//! that passes for the real code but also for a broken variant would prove nothing.
//!
//! Every broken variant copies the real step it stands for and changes only the step that makes
//! it racy, and runs through the very scenario the real code passes (the same `static`). Its
//! blind writes are `swap`s whose result is ignored, not `store`s: the same write, but loom keeps
//! a swap in one total order with the compare-and-swaps on the word, where it may let a plain
//! store race a compare-and-swap in ways no real machine can (and the control should fail for
//! the reason it claims, not for an artifact of the checker).
//!
//! | checker | broken variant | scenario |
//! |---|---|---|
//! | bound, token bucket | TAT: load, decide, write | `token_bucket::THREE_AT_ONE_INSTANT` |
//! | bound, fixed window | word: load, decide, write | `fixed_window::ROLL_WITH_LATE_READING` |
//! | bound, sliding log | claim by CAS on head, then write the slot | `sliding_window_log::LAP_WRAP_OF_ONE_SLOT` |
//! | bound, sliding window counter | word: load, decide, write | `sliding_window_counter::THREE_HALF_WAY_INTO_NEXT` |
//! | a denied batch leaves nothing | a batch that leaves its claims in place | `sliding_window_log::BATCH_INTERRUPTED_BY_A_SINGLE` |
//! | true figures after a batch | a batch that undoes a claim to an empty slot | `sliding_window_log::BATCH_INTERRUPTED_BY_A_SINGLE` |
//! | linearizability | TAT: load, decide, write | `token_bucket::BOTH_TOKENS_AT_ONE_INSTANT` |
//! | acquire racing retire | retire: load, check idle, write | `fixed_window::RETIRE_RACING_ROLL` |
//! | first requests | map insert: load, write if empty (`MapFault::BlindInsert`) | `service::TWO_FIRST_REQUESTS` |
//! | sweep racing requests | map removal without the identity check (`MapFault::RemoveIgnoresIdentity`) | `service::SWEEP_THEN_REQUESTS` |
//! | sweep, lagging clock | no Acquire fence before reading the sweep's instant (a word whose fence is none) | `service::SWEEP_WITH_LAGGING_CLOCK` |
//! | plan table publication | a version published by a Relaxed swap | `rule_change::check_reads_racing_changes` |
//! | rule change racing requests | the plan read once, before the lookup (`PlanRead::OnceBeforeLookup`) | `rule_change::check_change_racing_requests` |
//! | several limits, all or nothing | an undo that restores the replaced word by a blind store | `several_limits::check_two_limits` |
//! | a refusal leaves no window moved | takings in the plan's order, a window's move not last | `several_limits::check_a_refusal_leaves_no_window_moved` |
//! | several limits, eviction | the gate retired by a check and a blind store | `several_limits::check_gate_racing_a_sweep` |

use loom::sync::atomic::{AtomicU64, Ordering};
use tollgate::loom_support::service::MapFault;
use tollgate::loom_support::store::StoreFault;
use tollgate::loom_support::{
    AtomicWord, CounterParams, GcraParams, OwnedWord, Retired, WindowParams,
};
use tollgate::{Decision, Rule};

use crate::fixed_window::{self, window};
use crate::service;
use crate::sliding_window_counter::{self, counter};
use crate::sliding_window_log::{self, Reports};
use crate::support::{
    Admission, Answer, Bound, Evictable, Method, OneWord, WINDOW, answer, answer_or_retired,
    counted_time, counter_counted_time, rule,
};
use crate::token_bucket::{self, bucket};

/// `GcraParams::acquire` with its compare-and-swap replaced by a blind write: two threads that
/// load the same TAT both take from it, and one update is lost.
#[derive(Debug, Clone, Copy)]
struct BlindWriteTokenBucket(GcraParams);

impl Method for BlindWriteTokenBucket {
    type State = AtomicU64;
    const BOUND: Bound = Bound::RefillRate;

    fn rule(&self) -> Rule {
        self.0.rule()
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, state: &AtomicU64, n: u64, now: u64) -> Answer {
        answer_or_retired(self.acquire_decision(state, n, now), n, |_| now)
    }
}

impl OneWord for BlindWriteTokenBucket {
    fn acquire_decision(&self, tat: &AtomicU64, n: u64, now: u64) -> Result<Decision, Retired> {
        let current = tat.load(Ordering::Relaxed);
        let (decision, new) = self.0.decide(current, now, n);
        if let Some(new) = new {
            // The racy step: a blind write where `acquire` has a compare-and-swap.
            tat.swap(new, Ordering::Relaxed);
        }
        Ok(decision)
    }

    fn decide(&self, tat: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        self.0.decide(tat, now, n)
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn token_bucket_with_blind_write_fails_concurrent_acquire_model() {
    token_bucket::THREE_AT_ONE_INSTANT.check(BlindWriteTokenBucket(bucket(2)));
}

#[test]
#[should_panic(expected = "not linearizable")]
fn token_bucket_with_blind_write_fails_linearizability_model() {
    // Both threads win here, which the limit allows; only the lost update tells.
    token_bucket::BOTH_TOKENS_AT_ONE_INSTANT.check(BlindWriteTokenBucket(bucket(2)));
}

/// The fixed window's retired flag (bit 63 of the word, as `FixedWindow`'s docs lay out).
const WINDOW_RETIRED: u64 = 1 << 63;

/// `WindowParams::acquire` with the compare-and-swap of its general path replaced by a blind
/// write. The fast path is kept as it is, expressed through the pure `decide`: the word is in the
/// reading's window (its decision's reset comes within one window) and one permit would add
/// exactly one to its count; then a `fetch_add` grants iff the count it replaced was below the
/// limit, which is what `decide` answers for the word it returns.
#[derive(Debug, Clone, Copy)]
struct BlindWriteFixedWindow(WindowParams);

impl Method for BlindWriteFixedWindow {
    type State = AtomicU64;
    const BOUND: Bound = Bound::PerAlignedWindow;

    fn rule(&self) -> Rule {
        self.0.rule()
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, word: &AtomicU64, n: u64, now: u64) -> Answer {
        let current = word.load(Ordering::Relaxed);
        if current & WINDOW_RETIRED != 0 {
            return Answer::Retired;
        }
        let (decision, new) = self.0.decide(current, now, n);
        let in_current_window = decision.reset_after() <= decision.window();
        if n == 1 && in_current_window && new == Some(current + 1) {
            let previous = word.fetch_add(1, Ordering::Relaxed);
            if previous & WINDOW_RETIRED != 0 {
                return Answer::Retired;
            }
            let (decision, _) = self.0.decide(previous, now, 1);
            return answer(&decision, n, counted_time(&decision, now));
        }
        if let Some(new) = new {
            // The racy step: a blind write where `acquire` has a compare-and-swap.
            word.swap(new, Ordering::Relaxed);
        }
        answer(&decision, n, counted_time(&decision, now))
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn fixed_window_with_blind_write_fails_window_roll_model() {
    fixed_window::ROLL_WITH_LATE_READING.check(BlindWriteFixedWindow(window(2)));
}

/// The real fixed window, retired by a blind write instead of a compare-and-swap: an admission
/// that lands between the evictor's check and its write is overwritten, and the fresh state that
/// replaces the retired one grants its permit again.
#[derive(Debug, Clone, Copy)]
struct BlindRetireFixedWindow(WindowParams);

impl Method for BlindRetireFixedWindow {
    type State = AtomicU64;
    const BOUND: Bound = Bound::PerAlignedWindow;

    fn rule(&self) -> Rule {
        self.0.rule()
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, word: &AtomicU64, n: u64, now: u64) -> Answer {
        Method::acquire(&self.0, word, n, now)
    }
}

impl Evictable for BlindRetireFixedWindow {
    fn retire_if_idle(&self, word: &AtomicU64, now: u64) -> bool {
        let current = word.load(Ordering::Relaxed);
        // Idle exactly when a whole window's permits are available: the window is over, or
        // nothing was taken in it.
        let idle = current & WINDOW_RETIRED == 0
            && self
                .0
                .decide(current, now, self.0.rule().limit())
                .0
                .is_allowed();
        if idle {
            // The racy step: a blind write where `retire_if_idle` has a compare-and-swap (with
            // the same Release ordering).
            word.swap(current | WINDOW_RETIRED, Ordering::Release);
        }
        idle
    }

    fn retire_now(&self, word: &AtomicU64) -> bool {
        self.0.retire_now(word)
    }

    fn fresh_state_since(&self, since: u64) -> AtomicU64 {
        self.0.fresh_state_since(since)
    }

    fn state_is_retired(&self, word: &AtomicU64, now: u64) -> bool {
        self.0.state_is_retired(word, now)
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn fixed_window_with_blind_retire_fails_acquire_racing_retire_model() {
    fixed_window::RETIRE_RACING_ROLL.check(BlindRetireFixedWindow(window(1)));
}

/// The sliding window counter's retired flag (bit 63 of the word, as `SlidingWindowCounter`'s docs
/// lay out).
const COUNTER_RETIRED: u64 = 1 << 63;

/// `CounterParams::acquire` with its compare-and-swap replaced by a blind write: threads that
/// load the same word each add their permits to the count they read, and all but one addition is
/// lost.
#[derive(Debug, Clone, Copy)]
struct BlindWriteCounter(CounterParams);

impl Method for BlindWriteCounter {
    type State = AtomicU64;
    const BOUND: Bound = Bound::WeightedEstimate;

    fn rule(&self) -> Rule {
        self.0.rule()
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, word: &AtomicU64, n: u64, now: u64) -> Answer {
        let current = word.load(Ordering::Relaxed);
        if current & COUNTER_RETIRED != 0 {
            return Answer::Retired;
        }
        let (decision, new) = self.0.decide(current, now, n);
        if let Some(new) = new {
            // The racy step: a blind write where `acquire` has a compare-and-swap.
            word.swap(new, Ordering::Relaxed);
        }
        answer(&decision, n, counter_counted_time(&decision, now))
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn sliding_window_counter_with_blind_write_fails_concurrent_acquire_model() {
    sliding_window_counter::THREE_HALF_WAY_INTO_NEXT.check(BlindWriteCounter(counter(2)));
}

/// The sliding log's slot layout, `[63] lap mark · [62 .. 0] expiry`, as `SlidingWindowLog`'s
/// docs lay out.
const LAP_MARK: u64 = 1 << 63;
const EXPIRY_MASK: u64 = LAP_MARK - 1;

/// A ring whose claim is the compare-and-swap on `head`, with the slot written after it. Until
/// the write lands, the slot still holds the admission one lap older, which the next lap skips as
/// claimed and the lap after reads as free and expired: a thread that gets that far round the
/// ring admits into the very slot the pending claim is for, two admissions within one window.
#[derive(Debug, Clone, Copy)]
struct HeadClaimedLog {
    limit: u64,
}

#[derive(Debug)]
struct HeadClaimedRing {
    head: AtomicU64,
    slots: Vec<AtomicU64>,
}

impl HeadClaimedRing {
    fn slot(&self, position: u64) -> &AtomicU64 {
        &self.slots[(position % self.slots.len() as u64) as usize]
    }
}

impl HeadClaimedLog {
    fn lap_mark(&self, position: u64) -> u64 {
        if (position / self.limit) & 1 == 0 {
            LAP_MARK
        } else {
            0
        }
    }

    /// The real ring's snapshot: head, the slot at head and the latest admission, all read at
    /// one head.
    fn snapshot(&self, ring: &HeadClaimedRing) -> (u64, u64, u64) {
        loop {
            let head = ring.head.load(Ordering::Acquire);
            let slot = ring.slot(head).load(Ordering::Acquire);
            let latest = ring.slot(head.wrapping_sub(1)).load(Ordering::Acquire);
            if ring.head.load(Ordering::Acquire) == head {
                return (head, slot, latest);
            }
        }
    }
}

impl Method for HeadClaimedLog {
    type State = HeadClaimedRing;
    const BOUND: Bound = Bound::EverySpanOfOneWindow;

    fn rule(&self) -> Rule {
        rule(self.limit)
    }

    fn fresh_state(&self) -> HeadClaimedRing {
        HeadClaimedRing {
            head: AtomicU64::new(0),
            slots: (0..self.limit).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// `LogParams::acquire` for one permit, but for the claim, and without the retirement marks
    /// and the far-future clamp, which these models never reach.
    fn acquire(&self, ring: &HeadClaimedRing, n: u64, now: u64) -> Answer {
        assert_eq!(n, 1, "this copy takes single permits only");
        loop {
            let (head, slot, latest) = self.snapshot(ring);
            let mark = self.lap_mark(head);
            if slot & LAP_MARK == mark {
                let _ =
                    ring.head
                        .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Relaxed);
                continue;
            }
            let latest_time = (latest & EXPIRY_MASK).saturating_sub(WINDOW);
            let time = now.max(latest_time);
            if slot & EXPIRY_MASK > time {
                return Answer::Denied;
            }
            // The racy step: the claim is the exchange on head, and the slot is written after it.
            if ring
                .head
                .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                ring.slot(head)
                    .swap(mark | (time + WINDOW), Ordering::AcqRel);
                return Answer::Admitted(Admission { time, permits: 1 });
            }
        }
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn sliding_log_claimed_by_head_fails_lap_wrap_model() {
    sliding_window_log::LAP_WRAP_OF_ONE_SLOT.check(HeadClaimedLog { limit: 1 });
}

/// How [`CopiedBatchLog`] undoes the claims of an interrupted batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// As `LogRing::give_back`: the slot keeps this lap's mark and gets the later of the latest
    /// admission's expiry before the batch and the batch's time.
    Exact,
    /// The claims stay in place: a denied batch keeps slots as if it had been admitted.
    Skipped,
    /// The slot keeps this lap's mark but gets the expiry of a fresh ring, 0: the ring is no
    /// longer sorted, and its count of free slots is wrong.
    EmptySlot,
}

/// The sliding log's single and batch acquires and its count of free slots, copied from
/// `LogParams` (without the retirement marks and the far-future clamp, which these models never
/// reach), with the batch's undo as `undo` says. With [`Undo::Exact`] the copy passes the models
/// the real ring passes, so that a failure of another variant is its undo's.
#[derive(Debug, Clone, Copy)]
struct CopiedBatchLog {
    limit: u64,
    undo: Undo,
}

impl CopiedBatchLog {
    fn lap_mark(&self, position: u64) -> u64 {
        if (position / self.limit) & 1 == 0 {
            LAP_MARK
        } else {
            0
        }
    }

    fn help_head_past(&self, ring: &HeadClaimedRing, head: u64) {
        let _ = ring
            .head
            .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// `LogParams::acquire` for one permit.
    fn acquire_one(&self, ring: &HeadClaimedRing, now: u64) -> Answer {
        loop {
            let (head, slot, latest) = HeadClaimedLog { limit: self.limit }.snapshot(ring);
            let mark = self.lap_mark(head);
            if slot & LAP_MARK == mark {
                self.help_head_past(ring, head);
                continue;
            }
            let time = now.max((latest & EXPIRY_MASK).saturating_sub(WINDOW));
            if slot & EXPIRY_MASK > time {
                return Answer::Denied;
            }
            if ring
                .slot(head)
                .compare_exchange(
                    slot,
                    mark | (time + WINDOW),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.help_head_past(ring, head);
                return Answer::Admitted(Admission { time, permits: 1 });
            }
        }
    }

    /// `LogParams::acquire_batch`, with `LogRing::claim_run` inlined.
    fn acquire_batch(&self, ring: &HeadClaimedRing, n: u64, now: u64) -> Answer {
        loop {
            let (head, slot, latest) = HeadClaimedLog { limit: self.limit }.snapshot(ring);
            if slot & LAP_MARK == self.lap_mark(head) {
                self.help_head_past(ring, head);
                continue;
            }
            let latest_expiry = latest & EXPIRY_MASK;
            let time = now.max(latest_expiry.saturating_sub(WINDOW));
            let last = head + n - 1;
            let last_slot = ring.slot(last).load(Ordering::Acquire);
            if last_slot & LAP_MARK == self.lap_mark(last) {
                loom::thread::yield_now();
                continue;
            }
            if last_slot & EXPIRY_MASK > time {
                return Answer::Denied;
            }
            let expiry = time + WINDOW;
            let mut taken = 0;
            let mut slot = slot;
            let interrupted = loop {
                if taken == n {
                    return Answer::Admitted(Admission { time, permits: n });
                }
                let position = head + taken;
                if taken > 0 {
                    slot = ring.slot(position).load(Ordering::Acquire);
                }
                let mark = self.lap_mark(position);
                if slot & LAP_MARK == mark {
                    break true;
                }
                if slot & EXPIRY_MASK > time {
                    break false;
                }
                if ring
                    .slot(position)
                    .compare_exchange(slot, mark | expiry, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    break true;
                }
                self.help_head_past(ring, position);
                taken += 1;
            };
            for position in head..head + taken {
                let mark = self.lap_mark(position);
                let undone = match self.undo {
                    Undo::Exact => latest_expiry.max(time),
                    // The step under test.
                    Undo::Skipped => continue,
                    Undo::EmptySlot => 0,
                };
                let _ = ring.slot(position).compare_exchange(
                    mark | expiry,
                    mark | undone,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            if !interrupted {
                return Answer::Denied;
            }
        }
    }
}

impl Method for CopiedBatchLog {
    type State = HeadClaimedRing;
    const BOUND: Bound = Bound::EverySpanOfOneWindow;

    fn rule(&self) -> Rule {
        rule(self.limit)
    }

    fn fresh_state(&self) -> HeadClaimedRing {
        HeadClaimedLog { limit: self.limit }.fresh_state()
    }

    fn acquire(&self, ring: &HeadClaimedRing, n: u64, now: u64) -> Answer {
        match n {
            1 => self.acquire_one(ring, now),
            _ => self.acquire_batch(ring, n, now),
        }
    }
}

impl Reports for CopiedBatchLog {
    /// `LogParams::peek_at`'s count: the free slots from the oldest, by binary search.
    fn available(&self, ring: &HeadClaimedRing, now: u64) -> u64 {
        let (head, slot, latest) = HeadClaimedLog { limit: self.limit }.snapshot(ring);
        let (oldest, latest) = if slot & LAP_MARK == self.lap_mark(head) {
            (head + 1, slot)
        } else {
            (head, latest)
        };
        let time = now.max((latest & EXPIRY_MASK).saturating_sub(WINDOW));
        let (mut low, mut high) = (0, self.limit);
        while low < high {
            let middle = low + (high - low) / 2;
            let expiry = ring.slot(oldest + middle).load(Ordering::Relaxed) & EXPIRY_MASK;
            if expiry <= time {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }
}

#[test]
fn sliding_log_copy_with_exact_undo_passes_settled_race_model() {
    sliding_window_log::BATCH_INTERRUPTED_BY_A_SINGLE.check(CopiedBatchLog {
        limit: 3,
        undo: Undo::Exact,
    });
}

#[test]
#[should_panic(expected = "left an admission behind")]
fn sliding_log_batch_without_undo_fails_settled_race_model() {
    sliding_window_log::BATCH_INTERRUPTED_BY_A_SINGLE.check(CopiedBatchLog {
        limit: 3,
        undo: Undo::Skipped,
    });
}

#[test]
#[should_panic(expected = "but grants")]
fn sliding_log_batch_undoing_to_an_empty_slot_fails_settled_race_model() {
    sliding_window_log::BATCH_INTERRUPTED_BY_A_SINGLE.check(CopiedBatchLog {
        limit: 3,
        undo: Undo::EmptySlot,
    });
}

#[test]
#[should_panic(expected = "more than one limiter")]
fn service_with_blind_insert_fails_first_requests_model() {
    service::TWO_FIRST_REQUESTS.check_with::<_, AtomicU64>(bucket(1), MapFault::BlindInsert);
}

#[test]
#[should_panic(expected = "over-admitted")]
fn service_with_blind_removal_fails_sweep_model() {
    // A sweeper that retired one limiter removes the fresh one a request has put in its place,
    // and the next request starts a third.
    service::SWEEP_THEN_REQUESTS
        .check_with::<_, AtomicU64>(bucket(1), MapFault::RemoveIgnoresIdentity);
}

/// The service's `evicted_up_to` word with a fence that does nothing: the protocol's Acquire
/// fence, run by a request that meets a retired limiter before it reads the sweep's instant,
/// is left out.
#[derive(Debug)]
struct UnfencedWord(AtomicU64);

impl OwnedWord for UnfencedWord {
    fn new(value: u64) -> Self {
        UnfencedWord(AtomicU64::new(value))
    }
}

impl AtomicWord for UnfencedWord {
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }

    fn store(&self, value: u64, order: Ordering) {
        self.0.store(value, order)
    }

    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange_weak(current, new, success, failure)
    }

    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, success, failure)
    }

    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_add(value, order)
    }

    fn fetch_max(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_max(value, order)
    }

    fn fence(_order: Ordering) {
        // The broken step: no fence.
    }

    fn wait_for_writer() {
        loom::thread::yield_now();
    }

    fn yield_thread() {
        loom::thread::yield_now();
    }
}

#[test]
#[should_panic(expected = "over-admitted")]
fn service_without_acquire_fence_fails_sweep_model() {
    // Without the fence, the request that meets the retired limiter may read the sweep's instant
    // from before the sweep and make a replacement that grants its lagging reading.
    service::SWEEP_WITH_LAGGING_CLOCK.check_with::<_, UnfencedWord>(bucket(1), MapFault::None);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn plan_table_publishing_by_a_relaxed_swap_fails_two_changes_model() {
    crate::rule_change::check_reads_racing_changes(2, 1, crate::rule_change::Publish::Relaxed);
}

#[test]
#[should_panic(expected = "started afresh twice")]
fn service_reading_the_plan_once_before_the_lookup_fails_rule_change_model() {
    crate::rule_change::check_change_racing_requests(
        bucket(1),
        crate::service::PlanRead::OnceBeforeLookup,
    );
}

#[test]
#[should_panic(expected = "inexact reservation")]
fn several_limits_with_an_undo_by_blind_restore_fail_the_reservation_model() {
    crate::several_limits::check_two_limits(2, crate::several_limits::Undo::BlindRestore);
}

#[test]
#[should_panic(expected = "forgot a committed permit")]
fn several_limits_gate_retired_by_a_blind_store_fails_the_eviction_model() {
    crate::several_limits::check_gate_racing_a_sweep(crate::several_limits::Sweep::BlindStore);
}

#[test]
#[should_panic(expected = "left the first limit's window moved forward")]
fn several_limits_taken_in_the_plans_order_fail_the_moved_window_model() {
    crate::several_limits::check_a_refusal_leaves_no_window_moved(
        crate::several_limits::Order::AsListed,
    );
}

#[test]
#[should_panic(expected = "an active client was evicted")]
fn store_victim_by_its_own_reading_alone_fails_the_later_decision_model() {
    crate::store::check_eviction_after_a_later_decision(StoreFault::VictimByItsOwnReadingAlone);
}

#[test]
#[should_panic(expected = "more than one state for one client")]
fn store_inserting_without_the_lock_fails_first_requests_model() {
    crate::store::check_first_requests(StoreFault::InsertWithoutLock);
}

#[test]
#[should_panic(expected = "more than one state for one client")]
fn store_holdings_read_after_the_look_fail_first_requests_model() {
    crate::store::check_first_requests(StoreFault::HoldingsReadAfterTheLook);
}

#[test]
#[should_panic(expected = "a second state")]
fn store_overflow_unmarked_fails_request_after_an_overflow_model() {
    crate::store::check_request_after_an_overflow(StoreFault::OverflowUnmarked);
}

#[test]
#[should_panic(expected = "a second state")]
fn store_overflow_unmarked_fails_requests_racing_an_overflow_model() {
    crate::store::check_requests_racing_an_overflow(StoreFault::OverflowUnmarked);
}

#[test]
#[should_panic(expected = "more than one state for one client")]
fn store_insert_without_lock_fails_full_bucket_model() {
    crate::store::check_first_requests_into_a_full_bucket(StoreFault::InsertWithoutLock);
}

#[test]
#[should_panic(expected = "inserted again")]
fn store_fresh_state_published_before_its_decision_fails_sweep_and_first_request_model() {
    crate::store::check_sweep_racing_a_first_request(StoreFault::PublishedBeforeItsDecision);
}

#[test]
#[should_panic(expected = "started afresh twice")]
fn store_taking_a_taken_tag_fails_rule_change_model() {
    crate::store::check_change_racing_requests(StoreFault::TakeTakenTag);
}

#[test]
#[should_panic(expected = "stays used")]
fn store_sweep_retiring_active_states_fails_sweep_model() {
    crate::store::check_sweep_racing_requests(StoreFault::SweepRetiresActive);
}

#[test]
#[should_panic(expected = "more grants than fresh states")]
fn store_evicting_without_counting_fails_eviction_model() {
    crate::store::check_eviction_racing_a_decision(StoreFault::UncountedEviction);
}

#[test]
#[should_panic(expected = "more grants than evictions")]
fn store_eviction_at_its_own_reading_fails_the_lagging_reading_model() {
    crate::store::check_eviction_at_a_lagging_reading(StoreFault::EvictionAtItsOwnReading);
}

#[test]
#[should_panic(expected = "under a limit of 2")]
fn store_unsalted_words_fail_the_layouts_model() {
    crate::store_layouts::check_stale_exchange_across_layouts(StoreFault::Unsalted);
}

#[test]
#[should_panic(expected = "evicted an active client")]
fn store_evicting_past_retiring_slots_fails_the_sweep_and_insert_model() {
    crate::store::check_sweep_racing_an_insert(StoreFault::EvictPastRetiring);
}

#[test]
#[should_panic(expected = "evicted an active client")]
fn store_pass_ignoring_retiring_slots_fails_the_sweep_and_insert_model() {
    crate::store::check_sweep_racing_an_insert(StoreFault::PassIgnoresRetiring);
}

#[test]
#[should_panic(expected = "evicted an active client")]
fn store_unfenced_look_at_freed_tags_fails_the_sweep_and_insert_model() {
    crate::store::check_sweep_racing_an_insert(StoreFault::FreedTagsUnfenced);
}

#[test]
#[should_panic(expected = "Carol granted twice")]
fn store_give_back_to_the_slot_fails_the_give_back_and_eviction_model() {
    crate::store::check_give_back_racing_an_eviction(StoreFault::GiveBackToTheSlot);
}
