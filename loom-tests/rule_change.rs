//! Live rule changes: the plan table's versioned constants, and the service's protocol around
//! them.
//!
//! - `VersionedWords` (the plan table): readers racing two and three consecutive changes always
//!   get one version's words whole, with that version's number.
//! - A rule change and a sweep racing a client's requests: the client never starts afresh more
//!   than once across the change, so it gets at most one window's worth of the new rule beyond
//!   what it had used. The requests follow `RateLimiterService::acquire` step by step (look the
//!   client up, insert a fresh state on a miss, read the plan *after* the lookup, retire and
//!   replace a state made under an earlier version, move on from a retired one), with the map a
//!   stand-in for one client's entry as in `service`.
//!
//! `negative_controls` runs both checkers on the protocols as they were before (a read that
//! checks only the copy's parity; a request that reads the plan once, before its lookup, and
//! inserts under that version after a retry) and shows that each is caught.

use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;
use loom::thread;
use tollgate::loom_support::VersionedWords;

use crate::fixed_window::window;
use crate::service::{CasSlot, ClientSlot};
use crate::sliding_window_log::log;
use crate::support::{Admission, Answer, Evictable, explore};
use crate::token_bucket::bucket;

/// The words of version `v`: each tells its version, so a mix is visible.
fn words_of(version: u64) -> [u64; 2] {
    [100 + version, 200 + version]
}

/// How a reader reads the versioned words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// `VersionedWords::read`.
    Checked,
    /// The read before the fix: only the copy's parity is checked.
    ParityOnly,
}

fn read(words: &VersionedWords<AtomicU64, 2>, how: Read) -> (u64, [u64; 2]) {
    match how {
        Read::Checked => words.read(),
        Read::ParityOnly => words.read_checking_only_parity(),
    }
}

/// One reader racing a writer that makes `changes` consecutive changes: every read returns the
/// words of the version it names. Panics with "mixed versions" otherwise.
pub(crate) fn check_reads_racing_changes(changes: u64, readers: usize, how: Read) {
    explore(3, move || {
        let words = Arc::new(VersionedWords::<AtomicU64, 2>::new(words_of(0)));
        let writer = {
            let words = Arc::clone(&words);
            thread::spawn(move || {
                for version in 1..=changes {
                    words.write(words_of(version));
                }
            })
        };
        let readers: Vec<_> = (0..readers)
            .map(|_| {
                let words = Arc::clone(&words);
                thread::spawn(move || read(&words, how))
            })
            .collect();
        writer.join().expect("the writer panicked");
        for reader in readers {
            let (version, read) = reader.join().expect("a reader panicked");
            assert!(version <= changes);
            assert_eq!(
                read,
                words_of(version),
                "mixed versions: version {version} read with other words"
            );
        }
        assert_eq!(words.read(), (changes, words_of(changes)));
    });
}

#[test]
fn plan_table_reads_racing_two_changes_never_mix_versions() {
    check_reads_racing_changes(2, 1, Read::Checked);
}

#[test]
fn plan_table_reads_racing_three_changes_never_mix_versions() {
    check_reads_racing_changes(3, 1, Read::Checked);
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
    plan: VersionedWords<AtomicU64, 1>,
    states: Vec<M::State>,
}

impl<M: Evictable> Client<M> {
    const VERSIONS: usize = 2;

    fn new(method: M, requests: usize) -> Self {
        let candidates = requests * ROUNDS * Self::VERSIONS;
        Client {
            slot: CasSlot::empty(),
            plan: VersionedWords::new([0]),
            states: (0..=candidates).map(|_| method.fresh_state()).collect(),
        }
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
            Protocol::ReadOnceBefore => self.plan.read().0,
        };
        for round in 0..ROUNDS {
            let entry = match self.slot.get() {
                Some(entry) => entry,
                None => {
                    let version = match protocol {
                        Protocol::ReadAfterLookup => self.plan.read().0,
                        Protocol::ReadOnceBefore => version_read_before,
                    };
                    self.slot
                        .get_or_insert(Self::candidate(request, round, version))
                }
            };
            let version = match protocol {
                Protocol::ReadAfterLookup => self.plan.read().0,
                Protocol::ReadOnceBefore => {
                    if Self::version_of(entry) != version_read_before {
                        version_read_before = self.plan.read().0;
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
                Answer::Retired => self.slot.remove_if_same(entry),
                answer => return answer,
            }
        }
        panic!("request {request} went round more than {ROUNDS} times");
    }

    /// `set_rule`, then `sweep` for this one client at `now`.
    fn change_then_sweep(&self, method: M, now: u64) {
        self.plan.write([1]);
        let Some(entry) = self.slot.get() else {
            return;
        };
        let (version, _) = self.plan.read();
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
