//! The one module that names atomic types.
//!
//! Every state machine in this crate is written once, generic over [`AtomicWord`]. The public
//! limiters instantiate it with [`Word`] (a `portable_atomic::AtomicU64`, which is the native
//! instruction where the target has one and a fallback where it does not); the `loom` feature adds
//! a second instantiation with loom's model-checked atomic, without touching the first.

// The parameter types and `AtomicWord` are public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

pub(crate) use core::sync::atomic::Ordering;

/// The atomic word the public limiters keep their state in.
pub(crate) type Word = portable_atomic::AtomicU64;

/// The operations the state machines need from a 64-bit atomic word.
///
/// Implemented for the production word and, with the `loom` feature, for loom's `AtomicU64`.
#[doc(hidden)]
pub trait AtomicWord: Send + Sync + std::fmt::Debug {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u64;
    /// Atomic store.
    fn store(&self, value: u64, order: Ordering);
    /// Weak compare-and-exchange; may fail spuriously.
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    /// Strong compare-and-exchange.
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    /// Atomic wrapping add, returning the previous value.
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    /// Atomic maximum, returning the previous value.
    fn fetch_max(&self, value: u64, order: Ordering) -> u64;
    /// A memory fence of the same model as this word (loom's under loom, the hardware's
    /// otherwise), so that protocols built on fences can be model-checked too.
    fn fence(order: Ordering);
    /// Waits a moment for another thread to finish a write this one must see: a spin hint, or
    /// under loom a yield (loom must know the thread is waiting for another).
    fn wait_for_writer();
    /// Gives the core to another thread, after waiting with [`AtomicWord::wait_for_writer`] has
    /// not been enough (the writer may be descheduled): the OS's yield, or loom's.
    fn yield_thread();
}

/// An [`AtomicWord`] that is a word of its own, which can be made (a state is made of these); a
/// view of another's word, as the service's store decides through, is not.
#[doc(hidden)]
pub trait OwnedWord: AtomicWord + Sized {
    /// A word holding `value`.
    fn new(value: u64) -> Self;
}

macro_rules! impl_atomic_word {
    ($ty:ty, $fence:path, $wait:path, $yield:path) => {
        impl OwnedWord for $ty {
            #[inline]
            fn new(value: u64) -> Self {
                <$ty>::new(value)
            }
        }

        impl AtomicWord for $ty {
            #[inline]
            fn load(&self, order: Ordering) -> u64 {
                <$ty>::load(self, order)
            }
            #[inline]
            fn store(&self, value: u64, order: Ordering) {
                <$ty>::store(self, value, order)
            }
            #[inline]
            fn compare_exchange_weak(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$ty>::compare_exchange_weak(self, current, new, success, failure)
            }
            #[inline]
            fn compare_exchange(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$ty>::compare_exchange(self, current, new, success, failure)
            }
            #[inline]
            fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
                <$ty>::fetch_add(self, value, order)
            }
            #[inline]
            fn fetch_max(&self, value: u64, order: Ordering) -> u64 {
                <$ty>::fetch_max(self, value, order)
            }
            #[inline]
            fn fence(order: Ordering) {
                $fence(order)
            }
            #[inline]
            fn wait_for_writer() {
                $wait()
            }
            #[inline]
            fn yield_thread() {
                $yield()
            }
        }
    };
}

impl_atomic_word!(
    portable_atomic::AtomicU64,
    core::sync::atomic::fence,
    core::hint::spin_loop,
    std::thread::yield_now
);
#[cfg(feature = "loom")]
impl_atomic_word!(
    loom::sync::atomic::AtomicU64,
    loom::sync::atomic::fence,
    loom::thread::yield_now,
    loom::thread::yield_now
);
