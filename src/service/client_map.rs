//! [`ClientMap`]: what the service's protocol (`protocol.rs`) needs of a plan's map of clients,
//! so that the protocol is written once: run with [`papaya::HashMap`] by the service, and with
//! [`LoomClientMap`] (feature `loom`) by the loom models, which check that very code.
//!
//! The contract the protocol relies on, for every operation on one key:
//!
//! - Each operation takes effect atomically at one instant within the call (it is
//!   linearizable), and a lookup that returns an entry sees everything written to it before it
//!   was put in the map.
//! - [`ClientMap::get_or_insert_with`] puts an entry only where the key has none, and returns
//!   the entry the map holds for the key from then on: of two racing calls for one key, both
//!   return the same entry.
//! - [`ClientMap::remove_if_same`] removes the key's entry only if it is the very entry given
//!   (pointer identity, not equality), in the same atomic step as the check: a fresh entry
//!   another thread put in its place stays.
//! - [`ClientMap::iter`] yields every entry that is in the map throughout the iteration, once;
//!   entries put or removed meanwhile may or may not be yielded.
//! - An entry returned under a guard stays valid (unchanged in place, never freed) while that
//!   guard lives, even once removed from the map. A map that never frees an entry while it can
//!   be read has a guard of `()`.

// The trait is public (doc-hidden) only for the `loom` feature's models.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// A concurrent map from client keys to entries, as the service's protocol uses it (see the
/// module's docs for the contract).
#[doc(hidden)]
pub trait ClientMap<K, V> {
    /// What keeps the entries a lookup returned valid while it lives (made by whoever pins the
    /// map for a decision or a sweep: see `protocol::Pinned`).
    type Guard<'m>;

    /// The entry under `key`, if any.
    fn get<'g, Q>(&'g self, key: &Q, guard: &'g Self::Guard<'_>) -> Option<&'g V>
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ?Sized;

    /// The entry under `key`: the one already there, else `make()`'s, put there now.
    fn get_or_insert_with<'g>(
        &'g self,
        key: K,
        make: impl FnOnce() -> V,
        guard: &'g Self::Guard<'_>,
    ) -> &'g V
    where
        K: 'g;

    /// Removes the entry under `key` if it is `entry` itself; whether this call removed it.
    fn remove_if_same<Q>(&self, key: &Q, entry: &V, guard: &Self::Guard<'_>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// Every key and entry in the map.
    fn iter<'g, 'm>(&'g self, guard: &'g Self::Guard<'m>) -> impl Iterator<Item = (&'g K, &'g V)>
    where
        K: 'g,
        V: 'g;
}

/// The service's map: papaya's lock-free map, whose guard is its collector's (seize).
impl<K, V, S> ClientMap<K, V> for papaya::HashMap<K, V, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    type Guard<'m> = papaya::LocalGuard<'m>;

    #[inline]
    fn get<'g, Q>(&'g self, key: &Q, guard: &'g papaya::LocalGuard<'_>) -> Option<&'g V>
    where
        K: Borrow<Q> + 'g,
        Q: Hash + Eq + ?Sized,
    {
        papaya::HashMap::get(self, key, guard)
    }

    #[inline]
    fn get_or_insert_with<'g>(
        &'g self,
        key: K,
        make: impl FnOnce() -> V,
        guard: &'g papaya::LocalGuard<'_>,
    ) -> &'g V
    where
        K: 'g,
    {
        papaya::HashMap::get_or_insert_with(self, key, make, guard)
    }

    #[inline]
    fn remove_if_same<Q>(&self, key: &Q, entry: &V, guard: &papaya::LocalGuard<'_>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        matches!(
            self.remove_if(key, |_, current| std::ptr::eq(current, entry), guard),
            Ok(Some(_))
        )
    }

    #[inline]
    fn iter<'g, 'm>(&'g self, guard: &'g Self::Guard<'m>) -> impl Iterator<Item = (&'g K, &'g V)>
    where
        K: 'g,
        V: 'g,
    {
        papaya::HashMap::iter(self, guard)
    }
}

#[cfg(feature = "loom")]
pub use model::{LoomClientMap, MapFault};

/// A [`ClientMap`] for the loom models (see `loom-tests/service.rs`).
#[cfg(feature = "loom")]
mod model {
    use std::borrow::Borrow;
    use std::hash::Hash;
    use std::sync::OnceLock;

    use loom::sync::atomic::{AtomicUsize, Ordering};

    use super::ClientMap;

    /// A broken operation, for the models' negative controls: each checker must fail on it.
    #[doc(hidden)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum MapFault {
        /// No fault: the map keeps the contract.
        None,
        /// Insert-if-absent as a lookup and a blind write: two racing first inserts both put
        /// their entry, and each returns its own.
        BlindInsert,
        /// Removal without the identity check: whatever entry is there goes, even a fresh one
        /// another thread put in place of the one meant.
        RemoveIgnoresIdentity,
    }

    /// A map of a fixed set of keys, each with one loom atomic word naming its entry (0 for
    /// none, `i + 1` for the `i`-th entry made), so that loom explores every interleaving of
    /// the protocol's operations on it.
    ///
    /// Its operations are papaya's for one key: a lookup is one Acquire load of the key's slot,
    /// an insert one compare-and-swap from empty (papaya's insert-if-absent), a removal one
    /// compare-and-swap from the very entry to empty (papaya's `remove_if`, whose predicate is
    /// checked against the entry its compare-and-swap replaces). As in papaya, the entry is
    /// published by the Release of the insert and removed by an AcqRel exchange. Entries are
    /// kept until the map is dropped, as papaya keeps a removed entry while any guard that could
    /// have read it lives; the guard is therefore `()`.
    #[doc(hidden)]
    #[derive(Debug)]
    pub struct LoomClientMap<K, V> {
        keys: Vec<K>,
        /// Per key: 0, or `i + 1` for `entries[i]`.
        slots: Vec<AtomicUsize>,
        /// Every entry ever made, in the order made.
        entries: Box<[OnceLock<V>]>,
        /// How many of `entries` are taken. Not a loom atomic: it allocates, as the heap
        /// does for papaya, and is no part of the protocol under check.
        made: std::sync::atomic::AtomicUsize,
        fault: MapFault,
    }

    impl<K: Eq, V> LoomClientMap<K, V> {
        /// An empty map for `keys` (it holds no other), with room for `capacity` entries made
        /// over its life, and `fault` in its operations.
        pub fn new(keys: impl IntoIterator<Item = K>, capacity: usize, fault: MapFault) -> Self {
            let keys: Vec<K> = keys.into_iter().collect();
            LoomClientMap {
                slots: keys.iter().map(|_| AtomicUsize::new(0)).collect(),
                keys,
                entries: (0..capacity).map(|_| OnceLock::new()).collect(),
                made: std::sync::atomic::AtomicUsize::new(0),
                fault,
            }
        }

        fn slot<Q>(&self, key: &Q) -> &AtomicUsize
        where
            K: Borrow<Q>,
            Q: Eq + ?Sized,
        {
            let at = self
                .keys
                .iter()
                .position(|known| known.borrow() == key)
                .expect("the model's map has a slot for every key it is asked for");
            &self.slots[at]
        }

        fn entry(&self, word: usize) -> Option<&V> {
            let at = word.checked_sub(1)?;
            Some(self.entries[at].get().expect("a published entry is made"))
        }

        /// The word that names `entry`.
        fn word_of(&self, entry: &V) -> usize {
            1 + self
                .entries
                .iter()
                .position(|made| made.get().is_some_and(|made| std::ptr::eq(made, entry)))
                .expect("the entry was made by this map")
        }

        /// Makes `value` an entry of the map, not yet in any slot; the word that names it.
        fn make(&self, value: V) -> usize {
            let at = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert!(
                at < self.entries.len(),
                "the model made more entries than its map has room for"
            );
            if self.entries[at].set(value).is_err() {
                unreachable!("each entry cell is taken once");
            }
            at + 1
        }
    }

    impl<K: Eq, V> ClientMap<K, V> for LoomClientMap<K, V> {
        type Guard<'m> = ();

        fn get<'g, Q>(&'g self, key: &Q, _guard: &'g ()) -> Option<&'g V>
        where
            K: Borrow<Q> + 'g,
            Q: Hash + Eq + ?Sized,
        {
            // Acquire: sees the entry's contents, published by the insert's Release.
            self.entry(self.slot(key).load(Ordering::Acquire))
        }

        fn get_or_insert_with<'g>(
            &'g self,
            key: K,
            make: impl FnOnce() -> V,
            _guard: &'g (),
        ) -> &'g V
        where
            K: 'g,
        {
            let slot = self.slot(&key);
            if self.fault == MapFault::BlindInsert {
                // Acquire: as `get`.
                if let Some(existing) = self.entry(slot.load(Ordering::Acquire)) {
                    return existing;
                }
                // The racy step: a blind write where the map has a compare-and-swap.
                let made = self.make(make());
                slot.swap(made, Ordering::AcqRel);
                return self.entry(made).expect("just made");
            }
            // One compare-and-swap from empty, without a lookup first: the protocol has just
            // made one, and each step more is one more for loom to interleave. (`make` runs even
            // where an entry is there, as papaya's may: its value is then never used.)
            let made = self.make(make());
            // AcqRel: publishes the entry (Release); on failure, sees the one there (Acquire).
            match slot.compare_exchange(0, made, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => self.entry(made).expect("just made"),
                Err(existing) => self.entry(existing).expect("only a taken slot fails"),
            }
        }

        fn remove_if_same<Q>(&self, key: &Q, entry: &V, _guard: &()) -> bool
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let slot = self.slot(key);
            if self.fault == MapFault::RemoveIgnoresIdentity {
                // The racy step: whatever entry is there now goes.
                return slot.swap(0, Ordering::AcqRel) != 0;
            }
            // AcqRel, as papaya's removal; a failure means another thread removed the entry,
            // or put a fresh one in its place.
            slot.compare_exchange(self.word_of(entry), 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        }

        fn iter<'g, 'm>(
            &'g self,
            _guard: &'g Self::Guard<'m>,
        ) -> impl Iterator<Item = (&'g K, &'g V)>
        where
            K: 'g,
            V: 'g,
        {
            self.keys.iter().zip(&self.slots).filter_map(|(key, slot)| {
                // Acquire: as `get`.
                Some((key, self.entry(slot.load(Ordering::Acquire))?))
            })
        }
    }
}
