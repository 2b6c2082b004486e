//! The [`Limiter`] trait: one interface for every method.

use crate::{Decision, Rule};

/// A rate limiter for one client: decides, per attempt, whether permits may be taken now.
///
/// Every method is safe to call from many threads at once on one shared limiter, takes no lock,
/// and is all-or-nothing: a denied attempt takes nothing.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, FixedWindow, Limiter, Rule};
///
/// fn admit_all(limiter: &impl Limiter, requests: usize) -> usize {
///     (0..requests).filter(|_| limiter.try_acquire()).count()
/// }
///
/// let window = FixedWindow::new(Rule::per_second(3)?, FakeClock::new())?;
/// assert_eq!(admit_all(&window, 10), 3);
/// # Ok::<(), tollgate::RuleError>(())
/// ```
pub trait Limiter {
    /// Takes one permit if one is available now.
    #[inline]
    fn try_acquire(&self) -> bool {
        self.try_acquire_n(1).is_allowed()
    }

    /// Takes `n` permits if all `n` are available now, and nothing otherwise.
    ///
    /// `n = 0` is always allowed, takes nothing, and reports the permits available now.
    /// `n` above the rule's limit can never be granted: the decision is denied with a
    /// [`Rejection`](crate::Rejection) and a [`retry_after`](Decision::retry_after) of
    /// [`Duration::MAX`](std::time::Duration::MAX).
    fn try_acquire_n(&self, n: u64) -> Decision;

    /// Reports, without taking anything, whether one permit is available now, how many are, and
    /// when the next one will be.
    fn peek(&self) -> Decision;

    /// The rule this limiter enforces.
    fn rule(&self) -> Rule;
}
