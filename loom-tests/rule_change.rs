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
//!   what it had used. The requests follow `RateLimiterService::acquire` step by step (look the
//!   client up, insert a fresh state on a miss, read the plan *after* the lookup, retire and
//!   replace a state made under an earlier version, move on from a retired one), with the map a
//!   stand-in for one client's entry as in `service`, and the plan's version one atomic word (a
//!   read of the published pointer is one atomic snapshot, as a word's load is).
//!
//! `negative_controls` runs both checkers on broken protocols (a publication by a Relaxed store;
//! a request that reads the plan once, before its lookup, and inserts under that version after a
//! retry) and shows that each is caught.

// The model's versions are raw pointers, as the table's are; each block says why it is sound.
#![allow(unsafe_code)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use loom::thread;

use crate::fixed_window::window;
use crate::service::{CasSlot, ClientSlot};
use crate::sliding_window_log::log;
use crate::support::{Admission, Answer, Evictable, explore};
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

/// How a request follows the plan's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `RateLimiterService::acquire`: the plan is read after every lookup.
    ReadAfterLookup,
    /// Before the fix: the plan is read once, before the lookup, and a request that finds its
    /// client's state retired inserts a fresh one under the version it read then.
    ReadOnceBefore,
}

/// How many times one request may go round: at most one retirement by the change, one by the
/// other request, and one to start afresh.
const ROUNDS: usize = 3;

/// One client's entry, the plan's version, and every state the entry may ever hold: the old
/// state (index 0, made under version 0 and used up), then one fresh state per request, round
/// and version a request may insert under.
struct Client<M: Evictable> {
    slot: CasSlot,
    /// The plan's current version (see the module's docs).
    plan: AtomicU64,
    states: Vec<M::State>,
}

impl<M: Evictable> Client<M> {
    const VERSIONS: usize = 2;

    fn new(method: M, requests: usize) -> Self {
        let candidates = requests * ROUNDS * Self::VERSIONS;
        Client {
            slot: CasSlot::empty(),
            plan: AtomicU64::new(0),
            states: (0..=candidates).map(|_| method.fresh_state()).collect(),
        }
    }

    /// The plan's current version, as `PinnedPlan::limits` reads it.
    fn read_plan(&self) -> u64 {
        self.plan.load(Ordering::Acquire)
    }

    /// The version state `entry` was made under.
    fn version_of(entry: usize) -> u64 {
        if entry == 0 {
            0
        } else {
            ((entry - 1) % Self::VERSIONS) as u64
        }
    }

    fn candidate(request: usize, round: usize, version: u64) -> usize {
        1 + (request * ROUNDS + round) * Self::VERSIONS + version as usize
    }

    /// One request for one permit, following `protocol`.
    fn request(&self, method: M, request: usize, now: u64, protocol: Protocol) -> Answer {
        let mut version_read_before = match protocol {
            Protocol::ReadAfterLookup => 0,
            Protocol::ReadOnceBefore => self.read_plan(),
        };
        for round in 0..ROUNDS {
            let entry = match self.slot.get() {
                Some(entry) => entry,
                None => {
                    let version = match protocol {
                        Protocol::ReadAfterLookup => self.read_plan(),
                        Protocol::ReadOnceBefore => version_read_before,
                    };
                    self.slot
                        .get_or_insert(Self::candidate(request, round, version))
                }
            };
            let version = match protocol {
                Protocol::ReadAfterLookup => self.read_plan(),
                Protocol::ReadOnceBefore => {
                    if Self::version_of(entry) != version_read_before {
                        version_read_before = self.read_plan();
                    }
                    version_read_before
                }
            };
            if Self::version_of(entry) != version {
                if Self::version_of(entry) < version {
                    method.retire_now(&self.states[entry]);
                    self.slot.remove_if_same(entry);
                }
                continue;
            }
            match method.acquire(&self.states[entry], 1, now) {
                Answer::Retired => {
                    // Acquire, as `RateLimiterService::acquire`: pairs with the Release of the
                    // retiring exchange, so that what the retirer did before (here the change's
                    // publication) is seen by the plan reads that follow.
                    loom::sync::atomic::fence(Ordering::Acquire);
                    self.slot.remove_if_same(entry);
                }
                answer => return answer,
            }
        }
        panic!("request {request} went round more than {ROUNDS} times");
    }

    /// `set_rule`, then `sweep` for this one client at `now`.
    fn change_then_sweep(&self, method: M, now: u64) {
        // Release: as the table's publication.
        self.plan.store(1, Ordering::Release);
        let Some(entry) = self.slot.get() else {
            return;
        };
        let version = self.read_plan();
        let retired = if Self::version_of(entry) == version {
            method.retire_if_idle(&self.states[entry], now)
        } else {
            method.retire_now(&self.states[entry]);
            true
        };
        if retired {
            self.slot.remove_if_same(entry);
        }
    }
}

/// A client that has used its one permit at 0; at the same instant the rule changes (to the same
/// rule: the point is the version) and a sweep runs, while two requests race them. The change
/// may start the client afresh once: at most one of the requests is granted. Panics with
/// "started afresh twice" otherwise.
pub(crate) fn check_change_racing_requests<M: Evictable>(method: M, protocol: Protocol) {
    explore(3, move || {
        let client = Arc::new(Client::<M>::new(method, 2));
        let old = client.slot.get_or_insert(0);
        assert!(
            method
                .acquire(&client.states[old], 1, 0)
                .admission()
                .is_some(),
            "the prefill is admitted"
        );
        let changer = {
            let client = Arc::clone(&client);
            thread::spawn(move || client.change_then_sweep(method, 0))
        };
        let requests = {
            let client = Arc::clone(&client);
            thread::spawn(move || {
                [0, 1].map(|request| client.request(method, request, 0, protocol))
            })
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
    check_change_racing_requests(bucket(1), Protocol::ReadAfterLookup);
}

#[test]
fn a_rule_change_and_a_sweep_racing_requests_start_a_fixed_window_afresh_once() {
    check_change_racing_requests(window(1), Protocol::ReadAfterLookup);
}

#[test]
fn a_rule_change_and_a_sweep_racing_requests_start_a_sliding_log_afresh_once() {
    check_change_racing_requests(log(1), Protocol::ReadAfterLookup);
}
