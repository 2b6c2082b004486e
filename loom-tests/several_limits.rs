//! A plan of several limits: the all-or-nothing reservation `SeveralLimits::acquire` makes
//! (take from each limit in order; on a refusal, give back what the limits before it granted),
//! on the token bucket's own CAS loop and `GcraParams::undo`, with loom's atomics.
//!
//! Checked under every interleaving: no limit grants more than its own limit, and the
//! reservations are exact: once every thread is done, each limit's state holds exactly the
//! permits of the requests that were granted, nothing of those refused.
//!
//! `negative_controls` runs the same model with an undo that is not exact and shows it caught.

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::loom_support::GcraParams;

use crate::support::{FixedClock, explore, rule};

/// How a refused reservation gives back what it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// `GcraParams::undo`.
    Exact,
    /// Gives back twice what was taken.
    Twice,
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
                    for (taken, limit) in limits.iter().enumerate() {
                        if limit.acquire(&states[taken], 1, &clock).is_allowed() {
                            continue;
                        }
                        for (given, limit) in limits[..taken].iter().enumerate() {
                            match undo {
                                Undo::Exact => limit.undo(&states[given], 1),
                                Undo::Twice => limit.undo(&states[given], 2),
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
            // What the granted requests took, and nothing more: the state a fresh bucket
            // reaches after `granted` grants alone.
            let alone = AtomicU64::new(0);
            for _ in 0..granted {
                assert!(limit.acquire(&alone, 1, &FixedClock(0)).is_allowed());
            }
            let (held, expected) = (state.load(Ordering::Relaxed), alone.load(Ordering::Relaxed));
            assert_eq!(
                held,
                expected,
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
