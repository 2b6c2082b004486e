//! The local deny cache: a client Redis denied until an instant is denied in process until then,
//! without a round trip.
//!
//! Sound for every method: a denial's `retry_after` is the earliest instant the same request can
//! be granted, and no other node can make a client's state more generous sooner (other nodes only
//! take permits). A denial of `n` permits also answers any request for `n` or more. The instant
//! is measured from when the request was *sent*, which is no later than when Redis decided, so a
//! cached denial never outlasts the real one: the cache can only save round trips, never change a
//! decision beyond the round trip's own latency.

use std::time::Instant;

use crate::clock::duration_to_nanos;
use crate::{Decision, Rule};

/// One cached denial.
#[derive(Debug, Clone, Copy)]
struct Entry {
    rule: Rule,
    /// The permits that were denied.
    n: u64,
    remaining: u64,
    /// Nanoseconds after the cache's origin: until when it is denied, and when the quota is
    /// whole again.
    until: u64,
    reset_at: u64,
}

#[derive(Debug)]
pub(super) struct DenyCache {
    origin: Instant,
    capacity: usize,
    entries: papaya::HashMap<String, Entry>,
}

impl DenyCache {
    pub(super) fn new(capacity: usize) -> DenyCache {
        DenyCache {
            origin: Instant::now(),
            capacity,
            entries: papaya::HashMap::new(),
        }
    }

    /// Nanoseconds since the cache's origin.
    pub(super) fn now(&self) -> u64 {
        duration_to_nanos(self.origin.elapsed())
    }

    /// The denial in force for `key` and `n` permits, as of now.
    pub(super) fn get(&self, key: &str, n: u64) -> Option<Decision> {
        let entries = self.entries.pin();
        let entry = *entries.get(key)?;
        let now = self.now();
        if now >= entry.until {
            entries.remove(key);
            return None;
        }
        if n < entry.n {
            return None;
        }
        Some(Decision::denied(
            entry.rule,
            entry.remaining,
            entry.until - now,
            entry.reset_at.saturating_sub(now),
        ))
    }

    /// Remembers `decision`, a denial of `n` permits for `key` by a request sent at `sent_at`.
    pub(super) fn insert(&self, key: String, n: u64, sent_at: u64, decision: &Decision) {
        let Some(rule) = Rule::from_parts(decision.limit(), duration_to_nanos(decision.window()))
        else {
            return;
        };
        let entries = self.entries.pin();
        if entries.len() >= self.capacity {
            let now = self.now();
            entries.retain(|_, entry| entry.until > now);
            // Still full of live denials: skip this one rather than grow without bound.
            if entries.len() >= self.capacity {
                return;
            }
        }
        let entry = Entry {
            rule,
            n,
            remaining: decision.remaining(),
            until: sent_at.saturating_add(duration_to_nanos(decision.retry_after())),
            reset_at: sent_at.saturating_add(duration_to_nanos(decision.reset_after())),
        };
        entries.insert(key, entry);
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn denial(retry: Duration) -> Decision {
        let rule = Rule::per_second(5).unwrap();
        let nanos = duration_to_nanos(retry);
        Decision::denied(rule, 1, nanos, nanos)
    }

    #[test]
    fn a_denial_of_n_answers_n_or_more_until_its_instant() {
        let cache = DenyCache::new(10);
        let sent_at = cache.now();
        cache.insert("c".into(), 2, sent_at, &denial(Duration::from_secs(60)));
        assert!(cache.get("c", 1).is_none(), "fewer permits may pass");
        let hit = cache.get("c", 2).unwrap();
        assert!(hit.is_denied());
        assert_eq!(hit.remaining(), 1);
        assert!(hit.retry_after() <= Duration::from_secs(60));
        assert!(cache.get("c", 3).is_some());
        assert!(cache.get("other", 3).is_none());
    }

    #[test]
    fn a_denial_expires_at_its_retry_instant() {
        let cache = DenyCache::new(10);
        cache.insert(
            "c".into(),
            1,
            cache.now(),
            &denial(Duration::from_millis(2)),
        );
        std::thread::sleep(Duration::from_millis(5));
        assert!(cache.get("c", 1).is_none());
        assert_eq!(cache.len(), 0, "an expired entry is dropped when met");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_and_never_grows_past_its_capacity() {
        let cache = DenyCache::new(2);
        cache.insert(
            "a".into(),
            1,
            cache.now(),
            &denial(Duration::from_millis(1)),
        );
        cache.insert("b".into(), 1, cache.now(), &denial(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(3));
        cache.insert("c".into(), 1, cache.now(), &denial(Duration::from_secs(60)));
        assert!(
            cache.get("c", 1).is_some(),
            "room made by dropping the expired one"
        );
        cache.insert("d".into(), 1, cache.now(), &denial(Duration::from_secs(60)));
        assert_eq!(cache.len(), 2);
        assert!(cache.get("d", 1).is_none(), "full of live denials: skipped");
    }
}
