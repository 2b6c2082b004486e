//! Parking a test's thread at a chosen step of a request (its `n`th hash of a key, its `n`th
//! clock reading): a stand-in for the thread being preempted at that point. A test keeps one
//! thread-local `Option<Park>` per kind of step, steps it from the key's `Hash` (or the clock),
//! and asks for a park with [`park_at`]. A [`ParkingClock`] steps [`PARK_AT_READING`] at each
//! reading; [`park_request`] runs a request on a thread of its own, parked at a chosen step.

#![allow(dead_code)]

use std::cell::RefCell;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::{self, LocalKey};
use std::time::{Duration, Instant};

use tollgate::{Clock, FakeClock};

/// How long a park, or a resumed request, may take before the test fails as hung.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

thread_local! {
    /// The park of a thread at its `n`th reading of a [`ParkingClock`].
    pub(crate) static PARK_AT_READING: RefCell<Option<Park>> = const { RefCell::new(None) };
}

/// A clock (a [`FakeClock`]'s readings) that parks the reading thread at its `n`th reading, when
/// that thread has asked for it (`park_at(&PARK_AT_READING, n)`): a stand-in for the thread
/// being preempted at that point of a request.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParkingClock(pub(crate) FakeClock);

impl Clock for ParkingClock {
    fn now_nanos(&self) -> u64 {
        step_towards_park(&PARK_AT_READING);
        self.0.now_nanos()
    }
}

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

/// A request on a thread of its own, parked (see [`park_request`]).
pub(crate) struct Parked<T> {
    resume: Sender<()>,
    request: thread::JoinHandle<T>,
}

/// Runs `request` on a thread of its own, parked at its `nth` step towards `point` (`where_`
/// names that step, for the failure messages); returns once it has parked (within
/// [`PATIENCE`]). The request's thread fails where the request ends without having parked.
pub(crate) fn park_request<T: Send + 'static>(
    point: &'static LocalKey<RefCell<Option<Park>>>,
    nth: usize,
    where_: &'static str,
    request: impl FnOnce() -> T + Send + 'static,
) -> Parked<T> {
    // The request's thread asks for its park, and hands the park's channels back.
    let (channels_tx, channels_rx) = channel();
    let request = thread::spawn(move || {
        channels_tx.send(park_at(point, nth)).unwrap();
        let answer = request();
        assert!(parked_or_none(point), "the request parked {where_}");
        answer
    });
    let (parked, resume) = channels_rx.recv().unwrap();
    parked
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("the request parks {where_}"));
    Parked { resume, request }
}

impl<T> Parked<T> {
    /// Resumes the request; its answer (within [`PATIENCE`]).
    pub(crate) fn resume(self) -> T {
        self.resume.send(()).unwrap();
        let started = Instant::now();
        while !self.request.is_finished() {
            assert!(started.elapsed() < PATIENCE, "the resumed request hung");
            thread::sleep(Duration::from_millis(1));
        }
        self.request.join().unwrap()
    }
}
