//! A plan of several limits: the all-or-nothing reservation `SeveralLimits::acquire` makes
//! (look at every limit, taking nothing, and refuse if any refuses; then take from each limit in
//! order, and on a refusal undo what the limits before it granted), on the token bucket's own
//! CAS loop, `GcraParams::reserve` and `GcraParams::undo`, with loom's atomics.
//!
//! Checked under every interleaving: no limit grants more than its own limit, and no give-back
//! returns more than its reservation took: once every thread is done, each limit's state holds
//! at least the permits of the requests that were granted (exactly them, unless a give-back met
//! a later grant and kept its permits, which is stricter).
//!
//! And the gate that evicts such a client's limits together: a sweep retires it only when every
//! committed permit has left its limit, and a request whose commit meets the retired gate gives
//! its permits back.
//!
//! `negative_controls` runs the same models with an undo that restores the word it replaced by a
//! blind store (losing a grant that landed since), and with a sweep that retires the gate by a
//! check and a blind store, and shows each caught.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use std::time::Duration;

use tollgate::Rule;
use tollgate::loom_support::{Gate, GcraParams, Method, WindowParams};

use crate::support::{FixedClock, WINDOW, explore, rule};

/// How a refused reservation gives back what it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// `GcraParams::undo`: restores the word the grant replaced only while it still holds what
    /// the grant stored.
    Exact,
    /// Stores the word the grant replaced whatever the word holds now.
    BlindRestore,
}

/// Two limits, 2 and 1 per window; each of `threads` requests one permit at the same instant.
pub(crate) fn check_two_limits(threads: usize, undo: Undo) {
    explore(3, move || {
        let limits = [
            GcraParams::new(rule(2)).expect("a valid rule"),
            GcraParams::new(rule(1)).expect("a valid rule"),
        ];
        let states = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let requests: Vec<_> = (0..threads)
            .map(|_| {
                let states = Arc::clone(&states);
                thread::spawn(move || {
                    let clock = FixedClock(0);
                    // The look: a limit that refuses at this reading refuses with no write.
                    let refused_at_look = limits.iter().zip(states.iter()).any(|(limit, state)| {
                        limit
                            .decide(state.load(Ordering::Relaxed), 0, 1)
                            .0
                            .is_denied()
                    });
                    if refused_at_look {
                        return false;
                    }
                    let mut reservations = Vec::new();
                    for (taken, limit) in limits.iter().enumerate() {
                        let (decision, reservation) = limit
                            .reserve(&states[taken], 1, &clock)
                            .expect("nothing retires these states");
                        if let (true, Some(reservation)) = (decision.is_allowed(), reservation) {
                            reservations.push((decision, reservation));
                            continue;
                        }
                        let given_back = limits[..taken].iter().zip(&reservations).enumerate();
                        for (given, (limit, (decision, reservation))) in given_back.rev() {
                            match undo {
                                Undo::Exact => {
                                    limit.undo(&states[given], 1, decision, *reservation, 0)
                                }
                                Undo::BlindRestore => {
                                    states[given].store(reservation.before(), Ordering::Relaxed)
                                }
                            }
                        }
                        return false;
                    }
                    true
                })
            })
            .collect();
        let granted = requests
            .into_iter()
            .filter_map(|request| request.join().expect("a request panicked").then_some(()))
            .count() as u64;
        assert!(
            granted <= 1,
            "over-admitted: {granted} granted, the second limit allows 1"
        );
        assert_eq!(
            granted, 1,
            "the first request to reach both limits is granted"
        );
        for (limit, state) in limits.iter().zip(states.iter()) {
            // At least what the granted requests took (a give-back that meets a later grant
            // keeps its permits, refilling at the bucket's rate), and never less: a bucket at
            // least as far in debt as `granted` grants alone leave it.
            let alone = AtomicU64::new(0);
            for _ in 0..granted {
                let decided = limit.acquire(&alone, 1, &FixedClock(0));
                assert!(decided.is_ok_and(|decision| decision.is_allowed()));
            }
            let (held, expected) = (state.load(Ordering::Relaxed), alone.load(Ordering::Relaxed));
            assert!(
                held >= expected,
                "inexact reservation: the limit of {} holds {held}, {granted} grants make {expected}",
                limit.rule().limit()
            );
        }
    });
}

#[test]
fn two_limits_two_requests_keep_nothing_of_a_refusal() {
    check_two_limits(2, Undo::Exact);
}

#[test]
fn two_limits_three_requests_keep_nothing_of_a_refusal() {
    check_two_limits(3, Undo::Exact);
}

/// How the sweep retires the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// `Gate::retire_if_idle`.
    Exchange,
    /// A check, then a blind store.
    BlindStore,
}

/// A request that took a permit (busy until the end of the window) commits while a sweep half
/// a window in tries to retire the gate. Whatever the order, a retired gate never forgets a
/// committed permit: either the commit failed (and the request gave its permit back), or the
/// permit had left its limit by the sweep's instant. Panics with "forgot a committed permit".
pub(crate) fn check_gate_racing_a_sweep(sweep: Sweep) {
    explore(3, move || {
        let gate = Arc::new(Gate::<AtomicU64>::new());
        let request = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || gate.commit(WINDOW))
        };
        let sweeper = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || match sweep {
                Sweep::Exchange => gate.retire_if_idle(WINDOW / 2),
                Sweep::BlindStore => gate.retire_if_idle_by_blind_store(WINDOW / 2),
            })
        };
        let committed = request.join().expect("the request panicked");
        let retired = sweeper.join().expect("the sweep panicked");
        assert!(
            !(committed && retired),
            "forgot a committed permit: the sweep at {} retired a gate busy until {WINDOW}",
            WINDOW / 2
        );
        assert!(committed || retired, "one of them wins");
        assert_eq!(gate.is_retired(), retired);
    });
}

#[test]
fn a_sweep_racing_a_commit_never_forgets_a_committed_permit() {
    check_gate_racing_a_sweep(Sweep::Exchange);
}

/// The order in which a request of several limits takes from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// `SeveralLimits::acquire`: a taking that would move a window forward comes last.
    RollsLast,
    /// The plan's own order.
    AsListed,
}

/// A refused request never leaves a window it moved forward. Two fixed-window limits, 2 per
/// window and 2 per 100 windows; window 0 of the first is full and the second has 1 permit
/// left. R asks 1 permit at 1.5 windows (the first limit would move to window 1), while O asks 1
/// at 0.5 windows (an older reading: refused, unless it meets the first limit moved by R). R is
/// refused only if O took the second limit's last permit first; then the first limit must still
/// be in window 0, so that a reading of 0.5 windows is refused by it as before.
pub(crate) fn check_a_refusal_leaves_no_window_moved(order: Order) {
    explore(3, move || {
        let limits = [
            WindowParams::new(rule(2)).expect("a valid rule"),
            WindowParams::new(
                Rule::new(2, Duration::from_nanos(100 * WINDOW)).expect("a valid rule"),
            )
            .expect("a valid rule"),
        ];
        // Window 0 of the first limit full; the second holds 1 of its 2.
        let full = |limit: &WindowParams, n| {
            let (decision, word) = limit.decide(0, 0, n);
            assert!(decision.is_allowed());
            word.expect("a grant writes")
        };
        let states = Arc::new([
            AtomicU64::new(full(&limits[0], 2)),
            AtomicU64::new(full(&limits[1], 1)),
        ]);
        let request = move |states: &[AtomicU64; 2], now: u64| -> bool {
            let clock = FixedClock(now);
            let mut rolls = [false; 2];
            for (at, limit) in limits.iter().enumerate() {
                let looked = limit.decide(states[at].load(Ordering::Relaxed), now, 1).0;
                if looked.is_denied() {
                    return false;
                }
                rolls[at] = limit.would_roll(&states[at], &clock);
            }
            let order: Vec<usize> = match order {
                Order::RollsLast => (0..2)
                    .filter(|&at| !rolls[at])
                    .chain((0..2).filter(|&at| rolls[at]))
                    .collect(),
                Order::AsListed => vec![0, 1],
            };
            let mut taken = Vec::new();
            for at in order {
                let (decision, reservation) = limits[at]
                    .reserve(&states[at], 1, &clock)
                    .expect("nothing retires these states");
                match reservation {
                    Some(reservation) if decision.is_allowed() => {
                        taken.push((at, decision, reservation));
                    }
                    _ => {
                        for (at, decision, reservation) in &taken {
                            limits[*at].undo(&states[*at], 1, decision, *reservation, now);
                        }
                        return false;
                    }
                }
            }
            true
        };
        let older = {
            let states = Arc::clone(&states);
            thread::spawn(move || request(&states, WINDOW / 2))
        };
        let newer = request(&states, 3 * WINDOW / 2);
        let _ = older.join().expect("a request panicked");
        if !newer {
            let first = states[0].load(Ordering::Relaxed);
            assert!(
                limits[0].decide(first, WINDOW / 2, 1).0.is_denied(),
                "a refused request left the first limit's window moved forward: a reading of \
                 0.5 windows is now granted by it"
            );
        }
    });
}

#[test]
fn a_refusal_leaves_no_window_moved_forward() {
    check_a_refusal_leaves_no_window_moved(Order::RollsLast);
}
