//! [`LogRing`]: the sliding log's ring of admission slots, and the positions that walk it (a
//! lap count and a slot index in one word). How the ring keeps its bound under any interleaving
//! is documented on [`SlidingWindowLog`](crate::SlidingWindowLog).

// `LogRing` is public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use super::LogParams;
use crate::sync::{AtomicWord, Ordering, OwnedWord};

pub(super) const LAP_MARK: u64 = 1 << 63;
pub(super) const EXPIRY_MASK: u64 = LAP_MARK - 1;
/// The expiry written by retiring; admissions never reach it (see `LogParams::latest_time`).
pub(super) const RETIRED_EXPIRY: u64 = EXPIRY_MASK;

/// The ring's state: the admission counter and the slots.
#[doc(hidden)]
#[derive(Debug)]
pub struct LogRing<A> {
    head: A,
    slots: Box<[A]>,
}

impl<A: OwnedWord> LogRing<A> {
    /// An empty ring for `params`: every slot expired, in the lap before the first.
    #[cfg(any(test, feature = "loom"))]
    pub fn new(params: &LogParams) -> LogRing<A> {
        Self::empty_since(params, 0)
    }

    /// A ring that is empty from `since_nanos` on: every slot expires then, so an earlier reading
    /// is denied until then. At least as strict as any ring whose admissions had all expired by
    /// `since_nanos`. A service seeds new clients with it. (The lap mark 0 is lap -1's.)
    pub fn empty_since(params: &LogParams, since_nanos: u64) -> LogRing<A> {
        let expiry = params.elapsed(since_nanos).min(params.latest_time);
        LogRing {
            head: A::new(0),
            slots: (0..params.capacity).map(|_| A::new(expiry)).collect(),
        }
    }
}

impl<A: AtomicWord> LogRing<A> {
    /// How many slots the ring has. Counts over the ring use this, not a rule's limit, so that
    /// no index can pass its end whatever constants it is used with.
    #[inline]
    pub(super) fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The slot at `index` (below the capacity, as every index the ring computes is).
    #[inline]
    pub(super) fn slot(&self, index: usize) -> &A {
        &self.slots[index]
    }

    /// The slot a position names.
    #[inline]
    pub(super) fn slot_at(&self, position: u64) -> &A {
        self.slot(index_of(position))
    }

    /// The position after `position`: the next slot, or the first slot of the next lap.
    #[inline]
    pub(super) fn next(&self, position: u64) -> u64 {
        if index_of(position) + 1 == self.slots.len() {
            (position & !INDEX_MASK).wrapping_add(1 << LAP_SHIFT)
        } else {
            position + 1
        }
    }

    /// The index `steps` slots after `index`, wrapping (`steps` below the capacity).
    #[inline]
    pub(super) fn index_after(&self, index: usize, steps: usize) -> usize {
        let index = index + steps;
        if index >= self.slots.len() {
            index - self.slots.len()
        } else {
            index
        }
    }

    /// The position `steps` slots after `position` (`steps` below the capacity), in its lap.
    #[inline]
    pub(super) fn position_after(&self, position: u64, steps: u64) -> u64 {
        let index = index_of(position) as u64 + steps;
        let capacity = self.capacity();
        if index >= capacity {
            (position & !INDEX_MASK).wrapping_add(1 << LAP_SHIFT) | (index - capacity)
        } else {
            position + steps
        }
    }

    /// Moves `head` past a slot already claimed at `head`.
    #[inline]
    pub(super) fn help_head_past(&self, head: u64) {
        // AcqRel: publishes nothing new, but keeps the slot -> head -> reader chain (see
        // `snapshot`) intact for whoever reads the head this exchange writes. Failure: another
        // thread moved it already.
        let _ =
            self.head
                .compare_exchange(head, self.next(head), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// A consistent view of the ring at `head`: the slot to claim and the latest admission.
    #[inline]
    pub(super) fn snapshot(&self) -> Snapshot {
        loop {
            // Acquire on `head`: pairs with the AcqRel exchange that moved it, so the slot it
            // passed (the latest admission) is seen as claimed, with its time. That keeps each
            // admission's time at or after the previous one's (the ring's order, which the
            // exactness and `remaining` rely on), and keeps a stale lap's slot from being taken
            // for this lap's, which would let a helper move `head` past an unclaimed slot. The
            // bound on admissions itself needs only the slot exchange.
            let head = self.head.load(Ordering::Acquire);
            // Acquire on the slots: pairs with the AcqRel claims that wrote them.
            let index = index_of(head);
            let slot = self.slot(index).load(Ordering::Acquire);
            let latest_index = self.index_after(index, self.slots.len() - 1);
            let latest = self.slot(latest_index).load(Ordering::Acquire);
            // The slot loads' Acquire keeps this re-read after them; an unchanged head means both
            // slots were read at the same head, not a lap apart. (Acquire here too, for the same
            // pairing as the first head load.)
            if self.head.load(Ordering::Acquire) == head {
                return Snapshot { head, slot, latest };
            }
        }
    }

    /// Claims the `n` slots from `head` on, one by one, each with `expiry` (for an admission at
    /// `time`) and the mark of its own lap, as a single admission claims its slot; `first` is the
    /// slot at `head` as the snapshot read it. Returns how many it claimed, and why it stopped
    /// short if it did.
    pub(super) fn claim_run(
        &self,
        head: u64,
        first: u64,
        n: u64,
        time: u64,
        expiry: u64,
    ) -> (u64, Option<RunStop>) {
        let mut position = head;
        let mut slot = first;
        for taken in 0..n {
            if taken > 0 {
                position = self.next(position);
                // Acquire: as for the slots in `snapshot`.
                slot = self.slot_at(position).load(Ordering::Acquire);
            }
            let mark = lap_mark(position);
            let stop = if is_retired(slot) {
                Some(RunStop::Retired)
            } else if slot & LAP_MARK == mark {
                Some(RunStop::Taken)
            } else if slot & EXPIRY_MASK > time {
                Some(RunStop::Live(slot & EXPIRY_MASK))
            } else {
                // AcqRel: as for a single admission's claim. Failure: another claim won the
                // slot.
                match self.slot_at(position).compare_exchange(
                    slot,
                    mark | expiry,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.help_head_past(position);
                        None
                    }
                    Err(_) => Some(RunStop::Taken),
                }
            };
            if stop.is_some() {
                return (taken, stop);
            }
        }
        (n, None)
    }

    /// Undoes the first `taken` claims of a run from `head` made with `expiry`: each slot keeps
    /// its lap's mark (it stays used for this lap, so no claim of this lap can take it) and gets
    /// `used_expiry`, at most `expiry`. First slot first, so that the ring stays sorted at every
    /// step.
    pub(super) fn give_back(&self, head: u64, taken: u64, expiry: u64, used_expiry: u64) {
        let mut position = head;
        for _ in 0..taken {
            let mark = lap_mark(position);
            // AcqRel: a write of the slot read as a claim is (see `snapshot`). Failure: a claim
            // of a later lap (or the retired mark) replaced this one, and stays.
            let _ = self.slot_at(position).compare_exchange(
                mark | expiry,
                mark | used_expiry,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            position = self.next(position);
        }
    }

    /// Retires the ring so that no admission can succeed on it any more: with `idle_at =
    /// Some(now)` only if every admission has expired by `now` (so the ring is indistinguishable
    /// from a fresh one), with `None` whatever its state (a client that moved to another rule).
    /// Returns whether this call retired it.
    ///
    /// Retiring writes the retired mark into the slot at `head` with the same exchange an
    /// admission would use, so it *is* a claim: exactly one of it and a racing admission wins the
    /// slot, and every later admission finds the mark (in its slot or as the latest admission).
    pub fn retire(&self, idle_at: Option<u64>) -> bool {
        loop {
            let Snapshot { head, slot, latest } = self.snapshot();
            if is_retired(slot) || is_retired(latest) {
                return false;
            }
            let mark = lap_mark(head);
            if slot & LAP_MARK == mark {
                // An admission just claimed the slot at `head`: the ring is not idle.
                if idle_at.is_some() {
                    return false;
                }
                self.help_head_past(head);
                continue;
            }
            // The latest admission is the newest, so it expiring means every slot has.
            if let Some(now) = idle_at
                && latest & EXPIRY_MASK > now
            {
                return false;
            }
            // AcqRel: as for an admission's claim.
            let retired = mark | RETIRED_EXPIRY;
            match self.slot_at(head).compare_exchange(
                slot,
                retired,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                // An admission won the slot: the ring is in use.
                Err(_) if idle_at.is_some() => return false,
                Err(_) => continue,
            }
        }
    }
}

/// Positions (`head`) are a lap count in the high 32 bits and a slot index in the low 32, so
/// finding a slot takes no division. Laps wrap at 2^32, which keeps their parity.
pub(super) const LAP_SHIFT: u32 = 32;
pub(super) const INDEX_MASK: u64 = (1 << LAP_SHIFT) - 1;

#[inline]
pub(super) fn index_of(position: u64) -> usize {
    (position & INDEX_MASK) as usize
}

/// The lap mark that an admission at `position` writes. Lap 0 writes 1, so a slot whose mark is
/// 0 reads as claimed in lap -1: free for lap 0.
#[inline]
pub(super) fn lap_mark(position: u64) -> u64 {
    if (position >> LAP_SHIFT) & 1 == 0 {
        LAP_MARK
    } else {
        0
    }
}

pub(super) fn is_retired(slot: u64) -> bool {
    slot & EXPIRY_MASK == RETIRED_EXPIRY
}

pub(super) struct Snapshot {
    pub(super) head: u64,
    pub(super) slot: u64,
    pub(super) latest: u64,
}

/// Why a batch's run of claims stopped short.
pub(super) enum RunStop {
    /// The ring has been retired.
    Retired,
    /// Another claim took a slot of the run first.
    Taken,
    /// A slot of the run had not expired at the batch's time (its expiry).
    Live(u64),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Rule;
    use crate::method::{Method, never_retired};
    use crate::sync::Word;

    #[test]
    fn positions_wrap_into_the_next_lap_and_flip_the_mark() {
        let params = LogParams::new(Rule::new(3, Duration::from_secs(1)).unwrap()).unwrap();
        let ring: LogRing<Word> = LogRing::new(&params);
        let mut position = 0;
        let mut seen = Vec::new();
        for _ in 0..7 {
            seen.push((index_of(position), lap_mark(position) == LAP_MARK));
            position = ring.next(position);
        }
        assert_eq!(
            seen,
            [
                (0, true),
                (1, true),
                (2, true),
                (0, false),
                (1, false),
                (2, false),
                (0, true)
            ]
        );
        assert_eq!(ring.index_after(2, 2), 1);
        assert_eq!(ring.index_after(0, 2), 2);
        let lap = 1 << LAP_SHIFT;
        assert_eq!(ring.position_after(1, 1), 2);
        assert_eq!(ring.position_after(1, 2), lap);
        assert_eq!(ring.position_after(lap | 2, 2), (2 * lap) | 1);
    }

    #[test]
    fn an_undone_claim_stays_used_for_its_lap_and_keeps_the_ring_sorted() {
        // A batch of two at 50 claims slot 1, a single at 50 takes slot 2 between its claims, and
        // the batch gives slot 1 back, as a batch interrupted on another thread does.
        let params = LogParams::new(Rule::new(3, Duration::from_nanos(100)).unwrap()).unwrap();
        let ring: LogRing<Word> = LogRing::new(&params);
        let clock = crate::FakeClock::new();
        let acquire = |n| never_retired(params.acquire(&ring, n, &clock));
        assert!(acquire(1).is_allowed());
        clock.advance(Duration::from_nanos(50));
        let Snapshot { head, slot, latest } = ring.snapshot();
        assert_eq!((head, latest & EXPIRY_MASK), (1, 100));
        assert!(matches!(ring.claim_run(head, slot, 1, 50, 150), (1, None)));
        assert!(acquire(1).is_allowed());
        ring.give_back(head, 1, 150, 100);

        // Slot 1 now reads as an admission that expires with the one at 0.
        let expiries: Vec<u64> = (0..3)
            .map(|index| ring.slot(index).load(Ordering::Relaxed) & EXPIRY_MASK)
            .collect();
        assert_eq!(expiries, [100, 100, 150]);
        assert_eq!(never_retired(params.peek(&ring, &clock)).remaining(), 0);
        assert!(acquire(1).is_denied());
        clock.advance(Duration::from_nanos(50));
        let batch = acquire(2);
        assert!(batch.is_allowed(), "{batch:?}");
        assert_eq!(batch.remaining(), 0);
    }
}
