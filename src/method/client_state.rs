//! [`ClientState`]: one client's state under one plan, of whichever shape its method keeps.
//!
//! A standalone limiter holds its rule's constants, its state and a clock. A service holds the
//! constants once per plan and the clock once in all, so each client costs only its state: one
//! word for the token bucket, the fixed window and the sliding window counter, a ring for the
//! sliding log, one of those per limit for a plan of several.

use super::several_limits::SeveralLimits;
use super::sliding_window_log::LogRing;
use crate::sync::{AtomicWord, Word};

/// The version of a plan's limits that a client's state was made under (the service's plan
/// table numbers them).
///
/// 16 bits: the service's store of one-word states keeps it in each slot's tag beside a 40-bit
/// fingerprint of the key (see `service/store.rs`). The plan table refuses a change that would
/// take a plan past `Version::MAX`.
pub(crate) type Version = u16;

/// One client's state, and the version of its plan's limits it was made under (0 for the
/// per-limit states inside [`ClientState::Several`], whose own version is the one that counts).
#[derive(Debug)]
pub(crate) enum ClientState {
    /// The token bucket's TAT, or the fixed window's or the sliding window counter's packed word.
    Word(Version, Word),
    /// The sliding log's ring; boxed so that the one-word methods' entries stay small.
    Ring(Version, Box<LogRing<Word>>),
    /// One state per limit of a plan with several (see `SeveralLimits`).
    Several(Version, Box<SeveralLimits>),
}

// Where 64-bit atomics are native words, a one-word client's state is two words: the version
// sits beside the tag (see `Version`). Checked here, since an entry's size is its memory cost.
#[cfg(target_has_atomic = "64")]
const _: () = assert!(size_of::<ClientState>() == 16);

impl ClientState {
    /// The version of its plan's limits this state was made under.
    #[inline]
    pub(crate) fn version(&self) -> Version {
        match self {
            ClientState::Word(version, _)
            | ClientState::Ring(version, _)
            | ClientState::Several(version, _) => *version,
        }
    }

    /// This state, marked as made under `version`.
    pub(crate) fn made_under(mut self, version: Version) -> ClientState {
        match &mut self {
            ClientState::Word(made_under, _)
            | ClientState::Ring(made_under, _)
            | ClientState::Several(made_under, _) => *made_under = version,
        }
        self
    }
}

/// A client's state borrowed in its shape, whatever holds it: a service's entry
/// ([`ClientState`]), or a word kept elsewhere (the service's store of one-word states, which
/// decides through a view of its slot's word: `A`).
#[derive(Debug)]
pub(crate) enum StateRef<'s, A = Word> {
    /// A one-word method's word.
    Word(&'s A),
    /// The sliding log's ring.
    Ring(&'s LogRing<A>),
    /// The states of a plan of several limits.
    Several(&'s SeveralLimits),
}

impl<A> Clone for StateRef<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for StateRef<'_, A> {}

impl<'s> From<&'s ClientState> for StateRef<'s> {
    #[inline]
    fn from(state: &'s ClientState) -> Self {
        match state {
            ClientState::Word(_, word) => StateRef::Word(word),
            ClientState::Ring(_, ring) => StateRef::Ring(ring),
            ClientState::Several(_, several) => StateRef::Several(several),
        }
    }
}

impl<'s, A: AtomicWord> From<&'s A> for StateRef<'s, A> {
    #[inline]
    fn from(word: &'s A) -> Self {
        StateRef::Word(word)
    }
}
