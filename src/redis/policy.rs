//! [`FailurePolicy`]: what a decision is when Redis cannot make it, and the circuit breaker that
//! keeps a dead Redis from costing every request a timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::duration_to_nanos;

/// What a [`RedisRateLimiter`](super::RedisRateLimiter) answers when Redis fails (an error, a
/// timeout) or the circuit breaker is open.
///
/// Whatever the policy, a failure never panics and never queues requests without bound: each
/// round trip is bounded by the request timeout, and an open circuit sends none.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Return the error ([`RedisError::Timeout`](super::RedisError::Timeout),
    /// [`CircuitOpen`](super::RedisError::CircuitOpen), ...) and let the caller choose.
    Error,
    /// Allow the request: availability over limits. The decision reports 0 remaining.
    FailOpen,
    /// Deny the request: limits over availability. The decision asks the client to retry after
    /// the circuit's cool-down.
    FailClosed,
    /// Decide in process, each node on its own, with `share` (in (0, 1]) of each limit, rounded
    /// down but at least 1: with `share = 1/nodes` a fleet admits at most what Redis would
    /// (per window of an outage). The node's in-process state is its own, kept across outages
    /// (what it granted during one is not known to Redis), and swept of idle clients.
    Local {
        /// The fraction of each limit a node grants on its own.
        share: f64,
    },
}

/// Which path answered a request (see [`Answer::source`](super::Answer::source)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// Redis, in one round trip.
    Redis,
    /// The local deny cache: a denial Redis gave earlier, still in force.
    DenyCache,
    /// No round trip needed: the request can never be granted (see
    /// [`Decision::rejection`](crate::Decision::rejection)).
    Rejected,
    /// [`FailurePolicy::FailOpen`].
    FailOpen,
    /// [`FailurePolicy::FailClosed`].
    FailClosed,
    /// [`FailurePolicy::Local`].
    Local,
}

/// When the circuit breaker opens, probes and closes.
///
/// It opens on an outage, not on one stall: a failure counts only if its round trip was sent
/// after the last counted failure happened. Round trips in flight together, which one stall
/// times out together, thus count once, however many there are; each further count needs a
/// round trip sent after that failure, which fails in turn.
///
/// - **Opens** when `failures` round trips have failed in a row so counted, with no success
///   between (a success, whichever request it answers, starts the count again). Under an outage
///   in which every round trip times out, with requests arriving, it opens within `failures`
///   timeouts of the outage's start: each count waits at most one timeout for the next
///   ([`timeout`](super::RedisRateLimiterBuilder::timeout), 50 ms by default, so 150 ms at the
///   default 3). Where round trips fail at once (a refused connection), it opens after
///   `failures` of them one after another. A stall opens it only if Redis answers nothing for at
///   least `failures - 1` timeouts on end (100 ms at the defaults).
/// - **While open** no request is sent for `cool_down`; the [`FailurePolicy`] answers.
/// - **Half-open**: once `cool_down` has passed, exactly one request probes Redis while the
///   others keep falling back. The probe's success **closes** the circuit; its failure (or the
///   caller dropping it) keeps it open for another `cool_down`. A probe that fails after the
///   circuit closed meanwhile (another request's success), or opened again, changes nothing.
///
/// On a Redis Cluster each of the 16,384 hash slots has a breaker of its own (1 MiB per
/// limiter), chosen by the slot of the client's keys: a master's outage opens the circuits of
/// its slots, each after its own `failures` (so each client of a dead master waits out at most
/// that many round trips of its slot before it is short-circuited, and each slot in use sends
/// one probe per `cool_down`), while the live masters' clients are decided by Redis throughout,
/// and their successes hold no dead master's circuit closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Failed round trips that open the circuit, counted as above: each sent after the previous
    /// counted one failed, with no success between. At least 1.
    pub failures: u32,
    /// How long an open circuit sends nothing before one request probes Redis.
    pub cool_down: Duration,
}

impl Default for CircuitBreaker {
    /// Opens after 3 failures one after another (one is a blip, three an outage: at the default
    /// 50 ms timeout, Redis silent for 100 ms or more), probes every 500 ms (a restarted Redis
    /// is used again within half a second).
    fn default() -> Self {
        CircuitBreaker {
            failures: 3,
            cool_down: Duration::from_millis(500),
        }
    }
}

/// What the breaker lets a request do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Closed: ask Redis.
    Closed,
    /// Half-open: this request is the one probe, which reports with its ticket.
    Probe(ProbeTicket),
    /// Open: do not ask; the next probe may go in `retry_in`.
    Open { retry_in: Duration },
}

/// The circuit as a probe took it (the word of [`Breaker::open`] with the probe's bit set): its
/// failure reopens the circuit only if the circuit is still so, so that a probe that reports
/// late (its round trip outlived a success that closed the circuit, or a later opening and the
/// probe of that one) changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProbeTicket(u64);

/// The breaker's state, lock-free: the failures counted in a row, when the last one counted
/// happened, and one word holding both the instant the circuit stays open until (0: closed)
/// and whether a probe is out.
#[derive(Debug)]
pub(super) struct Breaker {
    settings: CircuitBreaker,
    origin: Instant,
    failures: AtomicU32,
    /// Nanoseconds after `origin` of the last counted failure; 0 before the first.
    counted_at: AtomicU64,
    /// Nanoseconds after `origin` the circuit stays open until, shifted left by one, with the
    /// low bit set while a probe is out; 0 when closed. One word, so that the exchange that
    /// takes the probe compares the very opening it saw cooled down: a probe that failed and
    /// reopened the circuit meanwhile makes it fail, and no second probe goes out.
    open: AtomicU64,
}

/// The low bit of [`Breaker::open`]: a probe is out.
const PROBING: u64 = 1;

/// [`Breaker::open`]'s word for a circuit open until `until` (nanoseconds after the origin,
/// at least 1), no probe out.
fn open_until(until: u64) -> u64 {
    until.clamp(1, u64::MAX >> 1) << 1
}

impl Breaker {
    pub(super) fn new(settings: CircuitBreaker) -> Breaker {
        Breaker {
            settings,
            origin: Instant::now(),
            failures: AtomicU32::new(0),
            counted_at: AtomicU64::new(0),
            open: AtomicU64::new(0),
        }
    }

    /// Nanoseconds after the breaker's origin, at least 1 (0 keeps meaning closed): when a round
    /// trip is sent, for [`Breaker::failure`].
    pub(super) fn now(&self) -> u64 {
        duration_to_nanos(self.origin.elapsed()).max(1)
    }

    pub(super) fn gate(&self) -> Gate {
        self.gate_at(self.now())
    }

    fn gate_at(&self, now: u64) -> Gate {
        self.gate_seen(self.open.load(Ordering::Relaxed), now)
    }

    /// The gate for a request that read [`Breaker::open`] as `seen`, at `now`.
    fn gate_seen(&self, mut seen: u64, now: u64) -> Gate {
        // Relaxed throughout: the word is the whole state of the circuit, read and exchanged on
        // its own (nothing else is published through it); a stale read costs at most one extra
        // round trip or one extra fallback, never a wrong decision, and the exchange that takes
        // the probe fails on any change since the read.
        loop {
            if seen == 0 {
                return Gate::Closed;
            }
            let until = seen >> 1;
            if now < until {
                return Gate::Open {
                    retry_in: Duration::from_nanos(until - now),
                };
            }
            if seen & PROBING != 0 {
                return Gate::Open {
                    retry_in: Duration::ZERO,
                };
            }
            // Cooled down: exactly one request probes; the rest keep falling back meanwhile.
            match self.open.compare_exchange_weak(
                seen,
                seen | PROBING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Gate::Probe(ProbeTicket(seen | PROBING)),
                Err(current) => seen = current,
            }
        }
    }

    /// Records a successful round trip: the count starts again and the circuit closes.
    pub(super) fn success(&self) {
        // Relaxed: as in `gate_seen`. Each word is read before it is cleared: on a healthy server
        // every round trip succeeds, and storing the 0 already there would still take the cache
        // line from every core whose `gate` reads it. (A success that reads 0 takes effect at
        // that read: a store of 0 over 0 would change nothing.)
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        // Closed, with no probe out, whichever request succeeded (a probe still out then finds,
        // when it reports, the circuit no longer as it took it: see `failure_at`).
        if self.open.load(Ordering::Relaxed) != 0 {
            self.open.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failed round trip sent at `sent_at` (from [`Breaker::now`]), the probe of
    /// `probe`'s ticket if it is one; returns whether it opened the circuit.
    pub(super) fn failure(&self, probe: Option<ProbeTicket>, sent_at: u64) -> bool {
        self.failure_at(probe, sent_at, self.now())
    }

    fn failure_at(&self, probe: Option<ProbeTicket>, sent_at: u64, now: u64) -> bool {
        let reopen = now.saturating_add(duration_to_nanos(self.settings.cool_down));
        if let Some(ProbeTicket(taken)) = probe {
            // Open for another cool-down, the probe back, in one exchange: a request that saw
            // the cooled-down opening before it can no longer take a probe from it. Only from
            // the circuit as the probe took it: while its bit is set nothing but a success
            // changes the word (to closed), and a closed circuit, or a later opening and its own
            // probe, is newer news than this round trip. Relaxed: as in `gate_seen`.
            let _ = self.open.compare_exchange(
                taken,
                open_until(reopen),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return false;
        }
        // Relaxed: as in `gate_seen`. The exchange makes failures that race count once, as
        // failures of one moment.
        let counted_at = self.counted_at.load(Ordering::Relaxed);
        if sent_at < counted_at
            || self
                .counted_at
                .compare_exchange(counted_at, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            // In flight when a failure was counted: the same stall.
            return false;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        failures >= self.settings.failures
            && self
                .open
                .compare_exchange(0, open_until(reopen), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// A limiter's circuit breakers: one for a server; on a cluster, one per hash slot, so that a
/// master's outage opens the circuits of its own slots alone: the live masters' clients are
/// decided by Redis throughout, and their successes hold no failing slot's circuit closed,
/// wherever the masters' slot ranges begin and end. Clones share the breakers (the limiters a
/// service makes on one set of connections share what they learn of its nodes).
#[derive(Debug, Clone)]
pub(super) struct Breakers {
    /// One breaker, or one per slot in slot order.
    slots: Arc<[Breaker]>,
}

/// Redis Cluster's hash slots.
const SLOTS: u16 = 16_384;

impl Breakers {
    /// A cluster's are 16,384 breakers of 64 bytes (1 MiB), made once per limiter and shared by
    /// its siblings.
    pub(super) fn new(settings: CircuitBreaker, cluster: bool) -> Breakers {
        let count = if cluster { SLOTS } else { 1 };
        Breakers {
            slots: (0..count).map(|_| Breaker::new(settings)).collect(),
        }
    }

    /// Whether there is a breaker per slot (a cluster's), so that a key is needed to choose one.
    pub(super) fn is_per_slot(&self) -> bool {
        self.slots.len() > 1
    }

    /// The breaker of the slot holding `key` (every key of a plan's client shares one slot); a
    /// single server's one breaker whatever the key.
    pub(super) fn of_key(&self, key: &str) -> &Breaker {
        match &*self.slots {
            [only] => only,
            slots => &slots[usize::from(hash_slot(key.as_bytes()))],
        }
    }

    /// The settings every breaker was made with.
    pub(super) fn settings(&self) -> CircuitBreaker {
        self.slots[0].settings
    }

    /// How long an open circuit waits before it probes.
    pub(super) fn cool_down(&self) -> Duration {
        self.settings().cool_down
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (what stands between
/// its first `{` and the next `}`, when not empty), else of the whole key, modulo 16,384.
pub(super) fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// [`crc16`]'s table: the remainder of each byte value shifted to the top.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

/// Releases the probe if the request carrying it is dropped before it reports (a caller that
/// gave up on its future): counted as a failure, so the circuit stays open for another cool-down
/// rather than never probing again.
#[derive(Debug)]
pub(super) struct ProbeGuard<'a> {
    probe: Option<(&'a Breaker, ProbeTicket)>,
}

impl<'a> ProbeGuard<'a> {
    pub(super) fn new(breaker: &'a Breaker, gate: Gate) -> ProbeGuard<'a> {
        ProbeGuard {
            probe: match gate {
                Gate::Probe(ticket) => Some((breaker, ticket)),
                Gate::Closed | Gate::Open { .. } => None,
            },
        }
    }

    /// The probe's ticket, if the request is the probe.
    pub(super) fn ticket(&self) -> Option<ProbeTicket> {
        self.probe.map(|(_, ticket)| ticket)
    }

    /// The probe reported; nothing to release.
    pub(super) fn disarm(mut self) {
        self.probe = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some((breaker, ticket)) = self.probe {
            breaker.failure(Some(ticket), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(cool_down: Duration) -> Breaker {
        Breaker::new(CircuitBreaker {
            failures: 3,
            cool_down,
        })
    }

    const MS: u64 = 1_000_000;

    /// Redis's own answers (`CLUSTER KEYSLOT`, and the CRC16 check value of "123456789").
    #[test]
    fn hash_slots_are_redis_clusters() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(hash_slot(b"somekey"), 11_058);
        assert_eq!(hash_slot(b"foo{hash_tag}"), 2_515);
        assert_eq!(hash_slot(b"bar{hash_tag}"), 2_515);
        // An empty tag is no tag: the whole key is hashed; a tag ends at the first `}`.
        assert_eq!(hash_slot(b"{}somekey"), crc16(b"{}somekey") % SLOTS);
        assert_eq!(hash_slot(b"x{a}b}"), crc16(b"a") % SLOTS);
        assert_eq!(hash_slot(b"x{ab"), crc16(b"x{ab") % SLOTS);
    }

    /// On a cluster, keys of different slots have breakers of their own: one slot's outage
    /// opens its circuit alone, even beside its neighbouring slot.
    #[test]
    fn a_clusters_breakers_open_per_slot() {
        let settings = CircuitBreaker {
            failures: 1,
            cool_down: Duration::from_secs(60),
        };
        let breakers = Breakers::new(settings, true);
        // Slots 2,515 and 11,058.
        let dead = breakers.of_key("foo{hash_tag}");
        let live = breakers.of_key("somekey");
        // Neighbouring slots are apart too (a key of slot 2,516, found by its tag).
        let neighbour = (0..1_000_000)
            .map(|i| format!("{{n{i}}}"))
            .find(|key| hash_slot(key.as_bytes()) == 2_516)
            .expect("a key of slot 2,516");
        assert!(!std::ptr::eq(dead, breakers.of_key(&neighbour)));
        assert!(!std::ptr::eq(dead, live));
        assert!(std::ptr::eq(dead, breakers.of_key("bar{hash_tag}")));
        assert!(dead.failure(None, dead.now()));
        assert!(matches!(dead.gate(), Gate::Open { .. }));
        assert_eq!(live.gate(), Gate::Closed);
        // A server has one breaker for every key.
        let server = Breakers::new(settings, false);
        assert!(std::ptr::eq(
            server.of_key("foo{hash_tag}"),
            server.of_key("somekey")
        ));
    }

    /// The request timeout the tests model: a round trip sent at `t` fails at `t + TIMEOUT`.
    const TIMEOUT: u64 = 50 * MS;

    #[test]
    fn the_circuit_opens_after_failures_one_after_another_only() {
        let breaker = breaker(Duration::from_secs(60));
        assert!(!breaker.failure_at(None, 1, TIMEOUT));
        assert!(!breaker.failure_at(None, TIMEOUT, 2 * TIMEOUT));
        breaker.success();
        assert!(!breaker.failure_at(None, 2 * TIMEOUT, 3 * TIMEOUT));
        assert!(!breaker.failure_at(None, 3 * TIMEOUT, 4 * TIMEOUT));
        assert_eq!(breaker.gate_at(4 * TIMEOUT), Gate::Closed);
        assert!(
            breaker.failure_at(None, 4 * TIMEOUT, 5 * TIMEOUT),
            "the third in a row opens it"
        );
        assert!(
            matches!(breaker.gate_at(5 * TIMEOUT), Gate::Open { retry_in } if retry_in > Duration::ZERO)
        );
        assert!(
            !breaker.failure_at(None, 5 * TIMEOUT, 6 * TIMEOUT),
            "opening is reported once"
        );
    }

    #[test]
    fn sixty_four_round_trips_timed_out_by_one_stall_count_once() {
        let breaker = breaker(Duration::from_secs(60));
        // 64 tasks' round trips, sent over the 5 ms before a stall, all time out.
        for task in 0..64 {
            let sent_at = 100 * MS + task * MS / 13;
            assert!(!breaker.failure_at(None, sent_at, sent_at + TIMEOUT));
        }
        assert_eq!(breaker.gate_at(200 * MS), Gate::Closed);
        // Each task sends again at once; the stall is over and they succeed.
        breaker.success();
        // A second stall, 64 more: counted once again, from zero.
        for task in 0..64 {
            let sent_at = 300 * MS + task * MS / 13;
            assert!(!breaker.failure_at(None, sent_at, sent_at + TIMEOUT));
        }
        assert_eq!(breaker.gate_at(400 * MS), Gate::Closed);
    }

    #[test]
    fn the_control_the_same_sixty_four_one_after_another_open_it() {
        // The same 64 failures, each sent after the one before failed, do count: the stall test
        // above can fail.
        let breaker = breaker(Duration::from_secs(60));
        let opened = (0..64).any(|task| breaker.failure_at(None, task * 2, task * 2 + 1));
        assert!(opened);
    }

    #[test]
    fn continuous_failure_opens_it_within_failures_timeouts() {
        // 64 tasks each sending again as soon as their round trip times out, from an outage
        // that begins at 1 s: the circuit is open within 3 timeouts of the outage's start.
        let breaker = breaker(Duration::from_secs(60));
        let outage = 1_000 * MS;
        let mut sends: Vec<u64> = (0..64).map(|task| outage - TIMEOUT + task * MS).collect();
        let mut opened_at = None;
        while opened_at.is_none() {
            let (task, &sent_at) = sends
                .iter()
                .enumerate()
                .min_by_key(|&(_, &sent_at)| sent_at)
                .unwrap();
            let failed_at = sent_at + TIMEOUT;
            assert!(failed_at <= outage + 3 * TIMEOUT, "not open by {failed_at}");
            if breaker.failure_at(None, sent_at, failed_at) {
                opened_at = Some(failed_at);
            }
            sends[task] = failed_at;
        }
        let opened_at = opened_at.unwrap();
        assert!(
            opened_at > outage + TIMEOUT,
            "not on one stall: {opened_at}"
        );
        assert!(matches!(breaker.gate_at(opened_at), Gate::Open { .. }));
    }

    /// The ticket of a gate that lets its request probe; panics on any other gate.
    fn ticket(gate: Gate) -> ProbeTicket {
        match gate {
            Gate::Probe(ticket) => ticket,
            other => panic!("not a probe: {other:?}"),
        }
    }

    #[test]
    fn a_success_closes_it_and_starts_the_count_again() {
        let breaker = breaker(Duration::from_millis(10));
        for round in 1..=3 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        assert!(matches!(breaker.gate_at(4 * TIMEOUT), Gate::Open { .. }));
        let probe_at = 4 * TIMEOUT + 10 * MS;
        ticket(breaker.gate_at(probe_at));
        breaker.success();
        assert_eq!(breaker.gate_at(probe_at), Gate::Closed);
        assert!(!breaker.failure_at(None, probe_at, probe_at + TIMEOUT));
        assert!(!breaker.failure_at(None, probe_at + TIMEOUT, probe_at + 2 * TIMEOUT));
        assert_eq!(
            breaker.gate_at(probe_at + 2 * TIMEOUT),
            Gate::Closed,
            "two after the success: not yet"
        );
    }

    #[test]
    fn one_probe_at_a_time_among_many_callers() {
        let breaker = breaker(Duration::from_millis(10));
        for round in 1..=3 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        let after = 4 * TIMEOUT + 10 * MS;
        let probes: Vec<ProbeTicket> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..1_000)
                            .filter_map(|_| match breaker.gate_at(after) {
                                Gate::Probe(ticket) => Some(ticket),
                                Gate::Closed | Gate::Open { .. } => None,
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|handle| handle.join().unwrap())
                .collect()
        });
        assert_eq!(probes.len(), 1, "one probe until it reports");
        breaker.failure_at(Some(probes[0]), after, after + TIMEOUT);
        assert!(matches!(
            breaker.gate_at(after + TIMEOUT),
            Gate::Open { .. }
        ));
        ticket(breaker.gate_at(after + TIMEOUT + 10 * MS));
    }

    /// A request reads the circuit cooled down; before its exchange, another takes the probe,
    /// which fails at once (a refused connection) and reopens the circuit: the late request
    /// sends no second probe, and the reopened circuit probes once after its cool-down.
    #[test]
    fn a_request_that_saw_the_circuit_cool_before_the_probe_failed_takes_no_probe() {
        let breaker = breaker(Duration::from_millis(10));
        for round in 1..=3 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        let after = 4 * TIMEOUT + 10 * MS;
        let late_read = breaker.open.load(Ordering::Relaxed);
        let probe = ticket(breaker.gate_at(after));
        breaker.failure_at(Some(probe), after, after + MS);
        let late = breaker.gate_seen(late_read, after + MS);
        assert!(
            matches!(late, Gate::Open { retry_in } if retry_in > Duration::ZERO),
            "{late:?}"
        );
        ticket(breaker.gate_at(after + 11 * MS));
        assert!(matches!(
            breaker.gate_at(after + 11 * MS),
            Gate::Open { .. }
        ));
    }

    #[test]
    fn a_cooled_down_circuit_lets_exactly_one_probe_through() {
        let breaker = breaker(Duration::from_millis(1));
        for _ in 0..3 {
            breaker.failure(None, breaker.now());
        }
        std::thread::sleep(Duration::from_millis(5));
        let probe = ticket(breaker.gate());
        assert!(
            matches!(breaker.gate(), Gate::Open { .. }),
            "one probe at a time"
        );
        // The probe fails: open for another cool-down, then probe again.
        breaker.failure(Some(probe), breaker.now());
        assert!(matches!(breaker.gate(), Gate::Open { .. }));
        std::thread::sleep(Duration::from_millis(5));
        ticket(breaker.gate());
        breaker.success();
        assert_eq!(breaker.gate(), Gate::Closed);
    }

    #[test]
    fn a_probe_dropped_before_it_reports_does_not_jam_the_circuit() {
        let breaker = breaker(Duration::from_millis(1));
        for _ in 0..3 {
            breaker.failure(None, breaker.now());
        }
        std::thread::sleep(Duration::from_millis(5));
        let gate = breaker.gate();
        ticket(gate);
        drop(ProbeGuard::new(&breaker, gate));
        assert!(
            matches!(breaker.gate(), Gate::Open { retry_in } if retry_in > Duration::ZERO),
            "open for another cool-down"
        );
        std::thread::sleep(Duration::from_millis(5));
        ticket(breaker.gate());
    }

    /// A probe whose round trip outlives the circuit's closing (another request's success)
    /// fails late: the circuit stays closed, and opens again only after `failures` more.
    #[test]
    fn a_probe_failing_after_a_success_closed_the_circuit_leaves_it_closed() {
        let breaker = breaker(Duration::from_millis(10));
        for round in 1..=3 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        let after = 4 * TIMEOUT + 10 * MS;
        let stale = ticket(breaker.gate_at(after));
        breaker.success();
        breaker.failure_at(Some(stale), after, after + TIMEOUT);
        assert_eq!(breaker.gate_at(after + TIMEOUT), Gate::Closed);
    }

    /// A probe outlives a success, the circuit's reopening and the next probe, then fails: the
    /// next probe is still the only one out, and the circuit keeps the opening it was taken
    /// from (no second probe after the stale failure's cool-down while the next is out).
    #[test]
    fn a_stale_probes_failure_releases_no_later_probe() {
        let breaker = breaker(Duration::from_millis(10));
        for round in 1..=3 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        let first_at = 4 * TIMEOUT + 10 * MS;
        let stale = ticket(breaker.gate_at(first_at));
        breaker.success();
        let reopened_at = 8 * TIMEOUT;
        for round in 5..=7 {
            breaker.failure_at(None, round * TIMEOUT, (round + 1) * TIMEOUT);
        }
        let second_at = reopened_at + 10 * MS;
        ticket(breaker.gate_at(second_at));
        breaker.failure_at(Some(stale), first_at, second_at + MS);
        for later in [
            second_at + MS,
            second_at + 20 * MS,
            second_at + 10 * TIMEOUT,
        ] {
            assert!(
                matches!(breaker.gate_at(later), Gate::Open { retry_in } if retry_in == Duration::ZERO),
                "at {later}: the second probe is still out"
            );
        }
    }
}
