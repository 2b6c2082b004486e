//! Live rule changes: the plan table's published versions, and the service's protocol around
//! them.
//!
//! - Publication (the plan table): a change writes a new, immutable version and publishes it
//!   through one atomic pointer; readers racing two and three consecutive changes always see a
//!   version's contents whole, with its number. The contents sit in loom cells, so loom reports
//!   any read that is not ordered after the write. (Reclamation of replaced versions is seize's,
//!   papaya's collector; here they are kept until the model ends.)
//! - A rule change and a sweep racing a client's requests: the client never starts afresh more
//!   than once across the change, so it gets at most one window's worth of the new rule beyond
//!   what it had used. The requests and the sweep are the service's own protocol (`decide` and
//!   `sweep`: look the client up, insert a fresh state on a miss, read the plan *after* the
//!   lookup, retire and replace a state made under an earlier version, move on from a retired
//!   one), run on the crate's loom map as in `service`, with the plan's version one atomic word
//!   (a read of the published pointer is one atomic snapshot, as a word's load is).
//!
//! `negative_controls` runs both checkers on broken variants (a publication by a Relaxed store;
//! a plan whose version a request reads once, before its lookup, so that it inserts under that
//! version after a retry) and shows that each is caught.

// The model's versions are raw pointers, as the table's are; each block says why it is sound.
#![allow(unsafe_code)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use loom::thread;

use tollgate::loom_support::service::MapFault;

use crate::fixed_window::window;
use crate::service::{ModelService, PlanRead};
use crate::sliding_window_log::log;
use crate::support::{Admission, Evictable, at, explore};
use crate::token_bucket::bucket;

/// The contents of version `v`: each word tells its version, so a mix is visible.
fn contents_of(version: u64) -> [u64; 2] {
    [100 + version, 200 + version]
}

/// One published version: its number and contents, written before it is published and never
/// again (`PlanVersion`).
struct Published {
    version: u64,
    contents: UnsafeCell<[u64; 2]>,
}

/// How a change publishes its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// `PlanTable::set_limits`: a swap with Release (AcqRel) ordering.
    Release,
    /// Broken: a Relaxed swap, which does not order the contents before the pointer.
    Relaxed,
}

/// The plan table's pointer and every version ever published (kept to the end, where the real
/// table retires them through seize).
struct Table {
    current: AtomicPtr<Published>,
}

impl Table {
    fn new() -> Self {
        Table {
            current: AtomicPtr::new(Box::into_raw(Box::new(Published {
                version: 0,
                contents: UnsafeCell::new(contents_of(0)),
            }))),
        }
    }

    /// `PlanTable::set_limits` (changes are serialized: one writer); returns the replaced version.
    fn publish(&self, version: u64, how: Publish) -> *mut Published {
        let next = Box::into_raw(Box::new(Published {
            version,
            contents: UnsafeCell::new([0; 2]),
        }));
        // Written after the allocation, as a version's fields are, so that loom tracks the write.
        // SAFETY: `next` is not published yet; this thread is its only user.
        unsafe {
            (*next)
                .contents
                .with_mut(|contents| *contents = contents_of(version))
        };
        let ordering = match how {
            Publish::Release => Ordering::AcqRel,
            Publish::Relaxed => Ordering::Relaxed,
        };
        self.current.swap(next, ordering)
    }

    /// `PinnedPlan::limits`: the version's number and contents.
    fn read(&self) -> (u64, [u64; 2]) {
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: every version lives until the model's end (see `check_reads_racing_changes`).
        let published = unsafe { &*current };
        (
            published.version,
            published.contents.with(|contents| unsafe { *contents }),
        )
    }
}

/// Readers racing a writer that makes `changes` consecutive changes: every read returns the
/// contents of the version it names; loom panics with a causality violation if a read of the
/// contents is not ordered after their write.
pub(crate) fn check_reads_racing_changes(changes: u64, readers: usize, how: Publish) {
    explore(3, move || {
        let table = Arc::new(Table::new());
        let writer = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                (1..=changes)
                    .map(|version| table.publish(version, how) as usize)
                    .collect::<Vec<_>>()
            })
        };
        let readers: Vec<_> = (0..readers)
            .map(|_| {
                let table = Arc::clone(&table);
                thread::spawn(move || table.read())
            })
            .collect();
        let replaced = writer.join().expect("the writer panicked");
        for reader in readers {
            let (version, read) = reader.join().expect("a reader panicked");
            assert!(version <= changes);
            assert_eq!(
                read,
                contents_of(version),
                "mixed versions: version {version} read with other contents"
            );
        }
        assert_eq!(table.read(), (changes, contents_of(changes)));
        // Every thread is joined: no reader remains (seize's guarantee in the real table).
        for version in replaced {
            // SAFETY: each was made by `Box::into_raw` and swapped out once.
            drop(unsafe { Box::from_raw(version as *mut Published) });
        }
        // SAFETY: the current version, likewise, with no reader left.
        drop(unsafe { Box::from_raw(table.current.load(Ordering::Relaxed)) });
    });
}

#[test]
fn plan_table_reads_racing_two_changes_never_mix_versions() {
    check_reads_racing_changes(2, 1, Publish::Release);
}

#[test]
fn plan_table_reads_racing_three_changes_never_mix_versions() {
    check_reads_racing_changes(3, 1, Publish::Release);
}

/// A client that has used its one permit at 0; at the same instant the rule changes (to the same
/// rule: the point is the version) and a sweep runs, while two requests race them. The change
/// may start the client afresh once: at most one of the requests is granted. Panics with
/// "started afresh twice" otherwise.
pub(crate) fn check_change_racing_requests<M: Evictable>(method: M, read: PlanRead) {
    explore(3, move || {
        let service = Arc::new(ModelService::<M, AtomicU64>::new(method, MapFault::None));
        let old = service.plan.insert_first();
        assert!(
            method.acquire(&old.state, 1, 0).admission().is_some(),
            "the prefill is admitted"
        );
        let changer = {
            let service = Arc::clone(&service);
            thread::spawn(move || {
                // `set_rule`: Release, as the table's publication.
                service.plan.version.store(1, Ordering::Release);
                service.sweep(0);
            })
        };
        let requests = {
            let service = Arc::clone(&service);
            thread::spawn(move || [0, 1].map(|_| service.request(at(0, 1), read).1))
        };
        changer.join().expect("the change panicked");
        let answers = requests.join().expect("a request panicked");
        let granted: Vec<Admission> = answers
            .iter()
            .filter_map(|answer| answer.admission())
            .collect();
        assert!(
            granted.len() <= 1,
            "started afresh twice across one change: {answers:?}"
        );
    });
}

#[test]
fn a_rule_change_and_a_sweep_racing_requests_start_a_token_bucket_afresh_once() {
    check_change_racing_requests(bucket(1), PlanRead::EachTime);
}

#[test]
fn a_rule_change_and_a_sweep_racing_requests_start_a_fixed_window_afresh_once() {
    check_change_racing_requests(window(1), PlanRead::EachTime);
}

#[test]
fn a_rule_change_and_a_sweep_racing_requests_start_a_sliding_log_afresh_once() {
    check_change_racing_requests(log(1), PlanRead::EachTime);
}
