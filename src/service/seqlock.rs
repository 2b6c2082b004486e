//! [`VersionedWords`]: a few words that readers load without a lock or a wait while a writer
//! replaces them, each read returning one version's words whole, with that version's number.
//!
//! The service keeps each plan's rule constants in one, read on every decision.

// `VersionedWords` is public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use crate::sync::{AtomicWord, Ordering};

/// Words that many threads read and one writer at a time replaces.
///
/// # Protocol
///
/// Version `v`'s words live in `copies[v % 2]`, whose `sequence` is `2v + 2` once they are
/// written whole and `2v + 1` while they are being written. A writer of version `v + 1` rewrites
/// the copy readers of `v` are *not* directed to, then moves `version` on. A reader loads
/// `version`, then accepts the copy only if its sequence names exactly that version before and
/// after it loads the words: the copy may have been rewritten since (by the change after next,
/// for version `v + 2`, which uses the same copy), and the sequence tells.
///
/// So a read never returns one version's number with another version's words, and never a mix
/// of two versions' words. Reads retry only while a change overlaps them.
///
/// Writers must be serialized by the caller (the service holds a mutex that readers never touch).
#[doc(hidden)]
#[derive(Debug)]
pub struct VersionedWords<A, const N: usize> {
    version: A,
    copies: [Copy<A, N>; 2],
}

#[derive(Debug)]
struct Copy<A, const N: usize> {
    /// `2v + 2` once version `v` is whole here, odd while a version is being written.
    sequence: A,
    words: [A; N],
}

/// The sequence of a copy that holds version `version` whole.
#[inline]
fn complete(version: u64) -> u64 {
    version.wrapping_mul(2).wrapping_add(2)
}

impl<A: AtomicWord, const N: usize> VersionedWords<A, N> {
    /// Version 0, holding `words`.
    pub fn new(words: [u64; N]) -> Self {
        VersionedWords {
            version: A::new(0),
            copies: [
                Copy {
                    sequence: A::new(complete(0)),
                    words: words.map(A::new),
                },
                // Never read before version 1 is written into it.
                Copy {
                    sequence: A::new(0),
                    words: words.map(A::new),
                },
            ],
        }
    }

    /// Version `version`, holding `words`: a table that has been through that many writes.
    #[cfg(test)]
    pub(crate) fn at_version(version: u64, words: [u64; N]) -> Self {
        let versioned: Self = VersionedWords::new(words);
        versioned.version.store(version, Ordering::Relaxed);
        versioned.copies[(version & 1) as usize]
            .sequence
            .store(complete(version), Ordering::Relaxed);
        versioned
    }

    /// The current version's number and words.
    #[inline]
    pub fn read(&self) -> (u64, [u64; N]) {
        loop {
            // Acquire: pairs with the writer's Release store of the version, so the copy's
            // completed sequence (stored before it) is seen.
            let version = self.version.load(Ordering::Acquire);
            let copy = &self.copies[(version & 1) as usize];
            // Acquire: pairs with the Release store that completed the copy, so the words loaded
            // below are that version's or a later rewrite's (which the re-read then catches).
            let before = copy.sequence.load(Ordering::Acquire);
            if before != complete(version) {
                // A later change has rewritten this copy, or is rewriting it: the version has
                // moved on; read it again.
                A::wait_for_writer();
                continue;
            }
            // Relaxed: validated by the sequence re-read below.
            let words = copy
                .words
                .each_ref()
                .map(|word| word.load(Ordering::Relaxed));
            // Acquire fence: if any word came from a later rewrite, the re-read below sees that
            // rewrite's odd sequence (this pairs with the writer's Release fence).
            A::fence(Ordering::Acquire);
            // Relaxed: ordered by the fence above.
            if copy.sequence.load(Ordering::Relaxed) == before {
                return (version, words);
            }
            A::wait_for_writer();
        }
    }

    /// Makes `words` the next version. Callers must not write concurrently (see the type).
    pub fn write(&self, words: [u64; N]) {
        // Relaxed: writers are serialized by the caller, which orders them.
        let next = self.version.load(Ordering::Relaxed).wrapping_add(1);
        let copy = &self.copies[(next & 1) as usize];
        // Relaxed store, then a Release fence: a reader that loads any of the words below also
        // sees this odd sequence (its Acquire fence pairs with this one).
        copy.sequence.store(complete(next) - 1, Ordering::Relaxed);
        A::fence(Ordering::Release);
        for (word, value) in copy.words.iter().zip(words) {
            // Relaxed: published by the Release stores below.
            word.store(value, Ordering::Relaxed);
        }
        // Release: the words are whole before the sequence names the version...
        copy.sequence.store(complete(next), Ordering::Release);
        // ... and before readers are directed to this copy.
        self.version.store(next, Ordering::Release);
    }

    /// The read as it was before the sequence named the version: it checks only that the copy is
    /// not being written, so after two changes it returns version `v`'s number with version
    /// `v + 2`'s words. Kept for the loom model's negative control, which must catch it.
    #[cfg(feature = "loom")]
    pub fn read_checking_only_parity(&self) -> (u64, [u64; N]) {
        loop {
            let version = self.version.load(Ordering::Acquire);
            let copy = &self.copies[(version & 1) as usize];
            let before = copy.sequence.load(Ordering::Acquire);
            if before & 1 == 1 {
                A::wait_for_writer();
                continue;
            }
            let words = copy
                .words
                .each_ref()
                .map(|word| word.load(Ordering::Relaxed));
            A::fence(Ordering::Acquire);
            if copy.sequence.load(Ordering::Relaxed) == before {
                return (version, words);
            }
            A::wait_for_writer();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Word;

    #[test]
    fn each_read_returns_the_words_of_the_version_it_names() {
        let words: VersionedWords<Word, 2> = VersionedWords::new([10, 11]);
        assert_eq!(words.read(), (0, [10, 11]));
        for version in 1..6 {
            words.write([version * 10, version * 10 + 1]);
            assert_eq!(words.read(), (version, [version * 10, version * 10 + 1]));
        }
    }
}
