//! Parking a test's thread at a chosen step of a request (its `n`th hash of a key, its `n`th
//! clock reading): a stand-in for the thread being preempted at that point. A test keeps one
//! thread-local `Option<Park>` per kind of step, steps it from the key's `Hash` (or the clock),
//! and asks for a park with [`park_at`].

#![allow(dead_code)]

use std::cell::RefCell;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::LocalKey;

/// A park asked for on one thread.
pub(crate) struct Park {
    /// Steps left before parking.
    countdown: usize,
    parked: Sender<()>,
    resume: Receiver<()>,
}

/// Counts one more step of a thread that may have asked to park at `point`, and parks it at the
/// asked one: it says so, then waits to be resumed.
pub(crate) fn step_towards_park(point: &'static LocalKey<RefCell<Option<Park>>>) {
    point.with(|park| {
        let mut park = park.borrow_mut();
        if let Some(plan) = park.as_mut() {
            plan.countdown -= 1;
            if plan.countdown == 0 {
                let plan = park.take().expect("just seen");
                plan.parked.send(()).expect("the test waits for the park");
                plan.resume.recv().expect("the test resumes the thread");
            }
        }
    });
}

/// Parks this thread at its `nth` step towards `point` from now (see [`step_towards_park`]);
/// returns the channel that says it has parked and the one that resumes it.
pub(crate) fn park_at(
    point: &'static LocalKey<RefCell<Option<Park>>>,
    nth: usize,
) -> (Receiver<()>, Sender<()>) {
    let (parked_tx, parked_rx) = channel();
    let (resume_tx, resume_rx) = channel();
    point.with(|park| {
        *park.borrow_mut() = Some(Park {
            countdown: nth,
            parked: parked_tx,
            resume: resume_rx,
        })
    });
    (parked_rx, resume_tx)
}

/// Whether this thread's park at `point` has happened (or none was asked for).
pub(crate) fn parked_or_none(point: &'static LocalKey<RefCell<Option<Park>>>) -> bool {
    point.with(|park| park.borrow().is_none())
}
