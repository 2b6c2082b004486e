//! Review of f532df5 ("Redis: the window counter's script divides a product below 2^53 at once
//! and decides without helper closures"), through the public API, against a real
//! `redis-server`.
//!
//! Every call goes through `RedisRateLimiter::decide_at` / `peek_at` (injected time) with
//! `Algorithm::SlidingWindowCounter`, and its answer is compared with:
//! - an exact model written here in u128 integers: the documented estimate
//!   `ceil(P * (W - e) / W) + C`, the grant rule `estimate + n <= limit`, and the wait found by
//!   a binary search over nanoseconds for the first instant at which the request fits (not by
//!   the closed form the script and the in-process counter use), the reset, and for a plan of
//!   several limits all or nothing with each limit's figures;
//! - the in-process `SlidingWindowCounter` (a plan of one limit) or `RateLimiterService` (a plan
//!   of several) on a fake clock fed the same times, while the instants they report lie within
//!   their horizon;
//! - the keys themselves: a call that commits nothing leaves every key's `DUMP` and
//!   `PEXPIRETIME` as they were; a grant writes `w`, `c` and `p` as the model says, with the
//!   expiry `floor(until_zero_us / 1000) + 60001` ms of an injected time.
//!
//! Rules are chosen where the script's products of a count and a time straddle 2^53: large
//! limits (up to 2^31 - 1, the largest the builder accepts) over long windows (prime ones, and
//! powers of two where a product of 2^53 + 1 is read as 2^53 by a double), with readings aimed
//! so that a weight lands on, or one microsecond off, an integer.
//!
//! Findings on f532df5: none; every test passes. Each test fails on planted bugs in
//! `sliding_window_counter.lua` (the quick path taken at a product of exactly 2^53, below 2^54
//! or below 2^64; a peek reporting the quota as after a grant; the wait's second branch taken
//! at `cur + n == limit`; a grant's reset measured without its permits; the wait measured from
//! the stored window instead of the branch's; the nanoseconds of a wait divided by the window;
//! a weight not rounded up at a remainder of 1). The product of exactly 2^53 + 1 (read as 2^53
//! by a double) is caught only by `products_at_and_one_past_2_pow_53_weigh_exactly`.

mod redis_support;

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use redis_support::{DECISION_TIMEOUT, RedisServer, Rng, gcd, inverse_mod};
use tollgate::redis::{Answer, RedisRateLimiter};
use tollgate::{
    Algorithm, Decision, FakeClock, Limiter, RateLimiterService, Rejection, Rule, ServiceBuilder,
    SlidingWindowCounter,
};

type Redis = RedisRateLimiter<&'static str>;

/// 2025-01-01 in microseconds since the Unix epoch (to which the windows are aligned).
const EPOCH_2025_US: u64 = 1_735_689_600_000_000;

const TWO_53: u128 = 1 << 53;

/// The in-process counter's horizon in windows, as `CounterParams::new` lays out its word.
fn horizon_windows(limit: u64) -> u128 {
    let count_bits = u64::BITS - limit.leading_zeros();
    1u128 << (63 - 2 * count_bits)
}

fn rule(limit: u64, window_us: u64) -> Rule {
    Rule::new(limit, Duration::from_micros(window_us)).unwrap()
}

fn window_us(rule: Rule) -> u64 {
    u64::try_from(rule.window().as_micros()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The exact model.
// ---------------------------------------------------------------------------------------------

/// A counter key's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    w: u64,
    c: u64,
    p: u64,
}

/// The counts carried to the window a reading is counted in, and the microseconds into it.
#[derive(Debug, Clone, Copy)]
struct Rolled {
    index: u64,
    cur: u64,
    prev: u64,
    e: u64,
}

/// What one limit replies, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    allowed: bool,
    remaining: u64,
    retry_ns: u128,
    reset_ns: u128,
}

#[derive(Debug, Clone, Copy)]
struct ModelLimit {
    limit: u64,
    window: u64,
    stored: Option<Stored>,
}

impl ModelLimit {
    fn new(rule: Rule) -> ModelLimit {
        ModelLimit {
            limit: rule.limit(),
            window: window_us(rule),
            stored: None,
        }
    }

    fn roll(&self, now: u64) -> Rolled {
        let w = self.window;
        let k = now / w;
        let e = now - k * w;
        match self.stored {
            None => Rolled {
                index: k,
                cur: 0,
                prev: 0,
                e,
            },
            // Behind the stored window: counted at its start.
            Some(s) if now < s.w * w => Rolled {
                index: s.w,
                cur: s.c,
                prev: s.p,
                e: 0,
            },
            Some(s) if k == s.w => Rolled {
                index: k,
                cur: s.c,
                prev: s.p,
                e,
            },
            Some(s) if k == s.w + 1 => Rolled {
                index: k,
                cur: 0,
                prev: s.c,
                e,
            },
            Some(_) => Rolled {
                index: k,
                cur: 0,
                prev: 0,
                e,
            },
        }
    }

    /// ceil(prev * (W - e) / W) at the reading itself.
    fn weight(&self, r: &Rolled) -> u64 {
        let w = u128::from(self.window);
        (u128::from(r.prev) * (w - u128::from(r.e))).div_ceil(w) as u64
    }

    /// The estimate at the instant `t_ns` (nanoseconds since the epoch, at or after the reading
    /// that rolled `r`) if nothing more is taken.
    fn estimate_at(&self, r: &Rolled, t_ns: u128) -> u128 {
        let w_ns = u128::from(self.window) * 1000;
        let start = u128::from(r.index) * w_ns;
        if t_ns < start {
            // A reading behind the stored window: counted at its start.
            return u128::from(r.prev) + u128::from(r.cur);
        }
        let j = t_ns / w_ns;
        let e = t_ns - j * w_ns;
        if j == u128::from(r.index) {
            (u128::from(r.prev) * (w_ns - e)).div_ceil(w_ns) + u128::from(r.cur)
        } else if j == u128::from(r.index) + 1 {
            (u128::from(r.cur) * (w_ns - e)).div_ceil(w_ns)
        } else {
            0
        }
    }

    /// The first instant from the reading on at which `take` permits fit, found by bisection
    /// over nanoseconds (the estimate never grows while nothing is taken).
    fn fits_at(&self, r: &Rolled, now: u64, take: u64) -> u128 {
        let limit = u128::from(self.limit);
        let take = u128::from(take);
        let fits = |t: u128| self.estimate_at(r, t) + take <= limit;
        let mut lo = u128::from(now) * 1000;
        assert!(!fits(lo), "bisection from an instant where it already fits");
        let mut hi = (u128::from(r.index) + 2) * u128::from(self.window) * 1000;
        assert!(fits(hi));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    fn reset_ns(&self, r: &Rolled, counted: u64, now: u64) -> u128 {
        let windows = if counted > 0 {
            2
        } else if r.prev > 0 {
            1
        } else {
            return 0;
        };
        (u128::from(r.index + windows) * u128::from(self.window) - u128::from(now)) * 1000
    }

    /// The figures for `take` permits at `now`, and the key after a grant of them.
    fn decide(&self, now: u64, take: u64) -> (Figures, Option<Stored>) {
        let r = self.roll(now);
        let weight = self.weight(&r);
        let room = self.limit - r.cur;
        if take == 0 {
            let figures = Figures {
                allowed: true,
                remaining: room.saturating_sub(weight),
                retry_ns: 0,
                reset_ns: self.reset_ns(&r, r.cur, now),
            };
            return (figures, None);
        }
        if u128::from(weight) + u128::from(r.cur) + u128::from(take) <= u128::from(self.limit) {
            let figures = Figures {
                allowed: true,
                remaining: room - take - weight,
                retry_ns: 0,
                reset_ns: self.reset_ns(&r, r.cur + take, now),
            };
            let after = Stored {
                w: r.index,
                c: r.cur + take,
                p: r.prev,
            };
            return (figures, Some(after));
        }
        let at = self.fits_at(&r, now, take);
        let figures = Figures {
            allowed: false,
            remaining: room.saturating_sub(weight),
            retry_ns: at - u128::from(now) * 1000,
            reset_ns: self.reset_ns(&r, r.cur, now),
        };
        (figures, None)
    }
}

/// What a plan's call should answer and write.
#[derive(Debug)]
struct Expected {
    allowed: bool,
    each: Vec<Figures>,
    commit: Option<Vec<Stored>>,
}

fn expect_plan(limits: &[ModelLimit], now: u64, n: u64, peek: bool) -> Expected {
    let take = if peek { 1 } else { n };
    let mut each = Vec::new();
    let mut after = Vec::new();
    for limit in limits {
        let (mut figures, stored) = limit.decide(now, take);
        if peek && figures.allowed {
            // A peek that would be granted reports the quota as it stands.
            figures = limit.decide(now, 0).0;
        }
        each.push(figures);
        after.push(stored);
    }
    let allowed = each.iter().all(|f| f.allowed);
    if !allowed && !peek && n != 0 {
        // A refused plan takes nothing: a limit that would have granted reports its quota.
        for (figures, limit) in each.iter_mut().zip(limits) {
            if figures.allowed {
                *figures = limit.decide(now, 0).0;
            }
        }
    }
    let commit = (allowed && !peek && n > 0)
        .then(|| after.into_iter().map(|stored| stored.unwrap()).collect());
    Expected {
        allowed,
        each,
        commit,
    }
}

/// The plan's decision from its limits' (the documented rule: the refusal with the longest wait
/// if any refuses, otherwise the grant with the fewest permits left; the first on a tie).
fn combined(each: &[Figures]) -> usize {
    let mut best = 0;
    for (i, f) in each.iter().enumerate().skip(1) {
        let c = &each[best];
        let better = match (!c.allowed, !f.allowed) {
            (false, true) => true,
            (true, true) => f.retry_ns > c.retry_ns,
            (false, false) => f.remaining < c.remaining,
            _ => false,
        };
        if better {
            best = i;
        }
    }
    best
}

fn check(decision: &Decision, figures: &Figures, rule: Rule, what: &str) {
    let got = (
        decision.is_allowed(),
        decision.rejection(),
        decision.remaining(),
        decision.retry_after().as_nanos(),
        decision.reset_after().as_nanos(),
        decision.limit(),
        decision.window(),
    );
    let want = (
        figures.allowed,
        None,
        figures.remaining,
        figures.retry_ns,
        figures.reset_ns,
        rule.limit(),
        rule.window(),
    );
    assert_eq!(got, want, "{what}");
}

// ---------------------------------------------------------------------------------------------
// The harness: one client of one plan, on Redis, in the model and in process.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Op {
    Acquire(u64),
    Peek,
}

/// A key's value and absolute expiry.
type Snapshot = (Option<Vec<u8>>, i64);

struct Harness {
    redis: Redis,
    connection: MultiplexedConnection,
    rules: Vec<Rule>,
    model: Vec<ModelLimit>,
    client: String,
    keys: Vec<String>,
    clock: FakeClock,
    local: Option<Box<dyn Limiter>>,
    service: Option<RateLimiterService<String, &'static str, FakeClock>>,
    /// The window each in-process limit counts from.
    origins: Vec<u64>,
    trail: Vec<String>,
    /// Steps the in-process references checked.
    in_process_steps: usize,
    /// Decisions whose weight's product `prev * (W - e)` was past 2^53, and of those, the ones
    /// where it was a multiple of W (the weight exactly an integer) or one off.
    weights_past: usize,
    weights_past_on_integer: usize,
    /// Refusals whose wait's product `fits * W` was past 2^53.
    waits_past: usize,
}

async fn limiter(server: &RedisServer, rules: &[Rule]) -> Redis {
    RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowCounter)
        .plan_limits("p", rules.iter().copied())
        .timeout(DECISION_TIMEOUT)
        .build()
        .await
        .unwrap()
}

impl Harness {
    /// A client named `client` of a plan of `rules`, whose first reading is at `start_us` (the
    /// in-process references start there; no reading goes behind its window).
    async fn new(server: &RedisServer, rules: &[Rule], client: &str, start_us: u64) -> Harness {
        let redis = limiter(server, rules).await;
        let keys = redis.keys(client, &"p").unwrap();
        let clock = FakeClock::starting_at(Duration::from_micros(start_us));
        let in_process_fits = rules.iter().all(|&r| horizon_windows(r.limit()) > 2);
        let (local, service) = match (in_process_fits, rules.len()) {
            (false, _) => (None, None),
            (true, 1) => {
                let local: Box<dyn Limiter> =
                    Box::new(SlidingWindowCounter::new(rules[0], clock.clone()).unwrap());
                (Some(local), None)
            }
            (true, _) => {
                let service = ServiceBuilder::new(Algorithm::SlidingWindowCounter, clock.clone())
                    .plan_limits("p", rules.iter().copied())
                    .build::<String>()
                    .unwrap();
                (None, Some(service))
            }
        };
        Harness {
            redis,
            connection: server.connection().await,
            rules: rules.to_vec(),
            model: rules.iter().map(|&r| ModelLimit::new(r)).collect(),
            client: client.to_owned(),
            keys,
            clock,
            local,
            service,
            origins: rules.iter().map(|&r| start_us / window_us(r)).collect(),
            trail: Vec::new(),
            in_process_steps: 0,
            weights_past: 0,
            weights_past_on_integer: 0,
            waits_past: 0,
        }
    }

    async fn snapshot(&mut self) -> Vec<Snapshot> {
        let mut all = Vec::new();
        for key in &self.keys {
            let value: Option<Vec<u8>> = ::redis::cmd("DUMP")
                .arg(key)
                .query_async(&mut self.connection)
                .await
                .unwrap();
            let expires: i64 = ::redis::cmd("PEXPIRETIME")
                .arg(key)
                .query_async(&mut self.connection)
                .await
                .unwrap();
            all.push((value, expires));
        }
        all
    }

    /// Whether the in-process references still answer every instant this reading can report:
    /// the reset and the wait end by the start of the window after next of the window the
    /// reading is counted in.
    fn in_process_comparable(&self, now: u64) -> bool {
        self.model
            .iter()
            .zip(&self.origins)
            .all(|(limit, &origin)| {
                let index = limit.roll(now).index;
                u128::from(index - origin) + 2 < horizon_windows(limit.limit)
            })
    }

    /// One call at `now`, checked against the model, the in-process references and the keys.
    async fn step(&mut self, now: u64, op: Op) -> Answer {
        let note = format!("{op:?} at {now}");
        self.trail.push(note);
        let what = format!(
            "client {} of {:?}, step {} ({}); trail: {:?}",
            self.client,
            self.rules,
            self.trail.len(),
            self.trail.last().unwrap(),
            &self.trail[self.trail.len().saturating_sub(8)..]
        );
        let before = self.snapshot().await;
        let answer = match op {
            Op::Peek => self.redis.peek_at(&self.client, &"p", now).await.unwrap(),
            Op::Acquire(n) => self
                .redis
                .decide_at(&self.client, &"p", n, now)
                .await
                .unwrap(),
        };
        // The in-process references, fed the same time.
        if !self.in_process_comparable(now) {
            self.local = None;
            self.service = None;
        }
        self.clock.set(Duration::from_micros(now));
        if self.local.is_some() || self.service.is_some() {
            self.in_process_steps += 1;
        }
        if let Some(local) = &self.local {
            let expected = match op {
                Op::Peek => local.peek(),
                Op::Acquire(n) => local.try_acquire_n(n),
            };
            assert_eq!(answer.decision(), expected, "in process: {what}");
        }
        if let Some(service) = &self.service {
            let expected = match op {
                Op::Peek => service.peek(self.client.as_str(), &"p").unwrap(),
                Op::Acquire(n) => service.acquire(self.client.as_str(), &"p", n).unwrap(),
            };
            assert_eq!(answer.decision(), expected, "in-process service: {what}");
        }
        // The model.
        let (n, peek) = match op {
            Op::Peek => (1, true),
            Op::Acquire(n) => (n, false),
        };
        for limit in &self.model {
            let r = limit.roll(now);
            let w = u128::from(limit.window);
            let product = u128::from(r.prev) * (w - u128::from(r.e));
            if product >= TWO_53 {
                self.weights_past += 1;
                if matches!(product % w, 0 | 1) || product % w == w - 1 {
                    self.weights_past_on_integer += 1;
                }
            }
            let take = if peek { 1 } else { n };
            if take <= limit.limit && !limit.decide(now, take).0.allowed {
                let fits = if r.cur + take > limit.limit {
                    limit.limit - take
                } else {
                    limit.limit - r.cur - take
                };
                if u128::from(fits) * w >= TWO_53 {
                    self.waits_past += 1;
                }
            }
        }
        let exceeded = (!peek)
            .then(|| self.rules.iter().position(|r| n > r.limit()))
            .flatten();
        let commit = if let Some(at) = exceeded {
            // Never grantable: rejected with the quota of the limit that rejects it.
            let quota = expect_plan(&self.model, now, 0, false);
            let decision = answer.decision();
            assert_eq!(
                decision.rejection(),
                Some(Rejection::ExceedsLimit {
                    requested: n,
                    limit: self.rules[at].limit()
                }),
                "model: {what}"
            );
            let own = &quota.each[at];
            assert_eq!(
                (
                    decision.remaining(),
                    decision.reset_after().as_nanos(),
                    decision.limit(),
                    decision.retry_after(),
                ),
                (
                    own.remaining,
                    own.reset_ns,
                    self.rules[at].limit(),
                    Duration::MAX
                ),
                "model: {what}"
            );
            if self.rules.len() > 1 {
                assert_eq!(answer.each_limit().len(), self.rules.len(), "{what}");
                for (i, (d, f)) in answer.each_limit().iter().zip(&quota.each).enumerate() {
                    check(d, f, self.rules[i], &format!("model, limit {i}: {what}"));
                }
            }
            None
        } else {
            let expected = expect_plan(&self.model, now, n, peek);
            if self.rules.len() == 1 {
                assert!(answer.each_limit().is_empty(), "{what}");
                check(
                    &answer.decision(),
                    &expected.each[0],
                    self.rules[0],
                    &format!("model: {what}"),
                );
            } else {
                assert_eq!(answer.each_limit().len(), self.rules.len(), "{what}");
                for (i, (d, f)) in answer.each_limit().iter().zip(&expected.each).enumerate() {
                    check(d, f, self.rules[i], &format!("model, limit {i}: {what}"));
                }
                let at = combined(&expected.each);
                check(
                    &answer.decision(),
                    &expected.each[at],
                    self.rules[at],
                    &format!("model, the plan's decision: {what}"),
                );
            }
            assert_eq!(answer.decision().is_allowed(), expected.allowed, "{what}");
            expected.commit
        };
        // The keys.
        let after = self.snapshot().await;
        match commit {
            None => assert_eq!(after, before, "a call that takes nothing wrote: {what}"),
            Some(stored) => {
                for (i, s) in stored.iter().enumerate() {
                    let fields: Vec<Option<u64>> = ::redis::cmd("HMGET")
                        .arg(&self.keys[i])
                        .arg("w")
                        .arg("c")
                        .arg("p")
                        .query_async(&mut self.connection)
                        .await
                        .unwrap();
                    assert_eq!(
                        fields,
                        vec![Some(s.w), Some(s.c), Some(s.p)],
                        "limit {i}'s key after a grant: {what}"
                    );
                    let ttl: i64 = ::redis::cmd("PTTL")
                        .arg(&self.keys[i])
                        .query_async(&mut self.connection)
                        .await
                        .unwrap();
                    let until_zero = (s.w + 2) * self.model[i].window - now;
                    let want = (until_zero / 1000 + 60_001) as i64;
                    assert!(
                        ttl <= want && ttl > want - 10_000,
                        "limit {i}'s expiry {ttl} ms, expected {want}: {what}"
                    );
                    self.model[i].stored = Some(*s);
                }
            }
        }
        answer
    }

    /// The model's figures for 0 permits now (the first limit's).
    fn quota(&self, now: u64) -> Figures {
        self.model[0].decide(now, 0).0
    }

    /// Checks, on a copy of this client's keys, that a refused request of `n` at `now` whose
    /// answer said `retry_after` is refused one microsecond before `now + retry_after` rounded
    /// up to microseconds, and granted then (model-free: the instant the reply names).
    async fn probe_retry(&mut self, now: u64, n: u64, retry_after: Duration) {
        let retry_us = u64::try_from(retry_after.as_nanos().div_ceil(1000)).unwrap();
        assert!(retry_us > 0);
        for (offset, granted) in [(retry_us - 1, false), (retry_us, true)] {
            let scratch = format!("{}-probe", self.client);
            let scratch_keys = self.redis.keys(&scratch, &"p").unwrap();
            for (from, to) in self.keys.iter().zip(&scratch_keys) {
                let _: i64 = ::redis::cmd("DEL")
                    .arg(to)
                    .query_async(&mut self.connection)
                    .await
                    .unwrap();
                let _: i64 = ::redis::cmd("COPY")
                    .arg(from)
                    .arg(to)
                    .query_async(&mut self.connection)
                    .await
                    .unwrap();
            }
            let answer = self
                .redis
                .decide_at(&scratch, &"p", n, now + offset)
                .await
                .unwrap();
            assert_eq!(
                answer.decision().is_allowed(),
                granted,
                "{n} permits {offset} us after {now} (retry_after {retry_after:?}), client {}: \
                 {:?}",
                self.client,
                answer.decision()
            );
        }
    }
}

/// The start of the first window of `window_us` after 2025-01-01 plus `skip` windows.
fn window_start(window_us: u64, skip: u64) -> u64 {
    (EPOCH_2025_US / window_us + 1 + skip) * window_us
}

// ---------------------------------------------------------------------------------------------
// Crafted products at 2^53.
// ---------------------------------------------------------------------------------------------

/// Over a window of 2^45 us, 321 permits read 28,059,810,762,433 us before the window they were
/// granted in ends weigh (2^53 + 1) / 2^45 = 256 + 2^-45, so ceil = 257: a double reads the
/// product 2^53 + 1 as 2^53 (a multiple of the window), which would weigh 256. And 441,650,591
/// permits read 20,394,401 us before its end weigh (2^53 - 1) / 2^45, so ceil = 256, a product
/// below 2^53 divided at once; 2^29 permits over 2^46 us weigh exactly 128 at 2^24 us before the
/// end, 129 one microsecond earlier, and 128 one later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_at_and_one_past_2_pow_53_weigh_exactly() {
    let server = RedisServer::start();

    // 2^53 + 1 = 321 * 28,059,810,762,433.
    let w = 1u64 << 45;
    let x = 28_059_810_762_433u64;
    assert_eq!(321 * u128::from(x), TWO_53 + 1);
    let r = rule(1000, w);
    let k = window_start(w, 0);
    let mut h = Harness::new(&server, &[r], "pow2-plus-one", k + 5).await;
    assert!(
        h.step(k + 5, Op::Acquire(321))
            .await
            .decision()
            .is_allowed()
    );
    let t = k + w + (w - x);
    let peek = h.step(t, Op::Peek).await;
    assert_eq!(peek.decision().remaining(), 1000 - 257);
    assert_eq!(h.step(t, Op::Acquire(0)).await.decision().remaining(), 743);
    // One more than fits: refused (it would fit at a weight of 256).
    let refused = h.step(t, Op::Acquire(744)).await;
    assert!(refused.decision().is_denied());
    // The weight falls to 256 once 321 * (W - e) <= 256 * W in nanoseconds: 4 ns on.
    assert_eq!(refused.decision().retry_after(), Duration::from_nanos(4));
    h.probe_retry(t, 744, refused.decision().retry_after())
        .await;
    // One microsecond later the weight is ceil((2^53 + 1 - 321) / 2^45) = 256.
    assert!(h.step(t + 1, Op::Acquire(745)).await.decision().is_denied());
    assert!(
        h.step(t + 1, Op::Acquire(744))
            .await
            .decision()
            .is_allowed()
    );
    let after = h.step(t + 1, Op::Peek).await;
    assert!(after.decision().is_denied());
    h.probe_retry(t + 1, 1, after.decision().retry_after())
        .await;

    // 2^53 - 1 = 441,650,591 * 20,394,401.
    let prev = 441_650_591u64;
    let x = 20_394_401u64;
    assert_eq!(u128::from(prev) * u128::from(x), TWO_53 - 1);
    let limit = prev + 1000;
    let r = rule(limit, w);
    let k = window_start(w, 2);
    let mut h = Harness::new(&server, &[r], "pow2-minus-one", k).await;
    assert!(h.step(k, Op::Acquire(prev)).await.decision().is_allowed());
    let t = k + w + (w - x);
    assert_eq!(
        h.step(t, Op::Peek).await.decision().remaining(),
        limit - 256
    );
    let refused = h.step(t, Op::Acquire(limit - 255)).await;
    assert!(refused.decision().is_denied());
    h.probe_retry(t, limit - 255, refused.decision().retry_after())
        .await;
    assert!(
        h.step(t, Op::Acquire(limit - 256))
            .await
            .decision()
            .is_allowed()
    );
    assert!(h.step(t, Op::Peek).await.decision().is_denied());

    // 2^29 permits over 2^46 us: products 2^53 + 2^29, 2^53 and 2^53 - 2^29, all exact doubles.
    let w = 1u64 << 46;
    let prev = 1u64 << 29;
    let limit = prev + 100;
    let r = rule(limit, w);
    let k = window_start(w, 0);
    let mut h = Harness::new(&server, &[r], "pow2-exact", k + 1).await;
    assert!(
        h.step(k + 1, Op::Acquire(prev))
            .await
            .decision()
            .is_allowed()
    );
    for (x, weight) in [
        ((1 << 24) + 1, 129u64),
        (1 << 24, 128),
        ((1 << 24) - 1, 128),
    ] {
        let t = k + w + (w - x);
        assert_eq!(
            h.step(t, Op::Acquire(0)).await.decision().remaining(),
            limit - weight
        );
        let refused = h.step(t, Op::Acquire(limit - weight + 1)).await;
        assert!(refused.decision().is_denied());
        h.probe_retry(t, limit - weight + 1, refused.decision().retry_after())
            .await;
    }
    let t = k + w + (w - ((1 << 24) - 1));
    assert!(
        h.step(t, Op::Acquire(limit - 128))
            .await
            .decision()
            .is_allowed()
    );
    // Full: a peek waits in the first branch (cur + 1 within the limit), 129 permits in the
    // second (cur + 129 above it).
    let peek = h.step(t, Op::Peek).await;
    assert!(peek.decision().is_denied());
    h.probe_retry(t, 1, peek.decision().retry_after()).await;
    let refused = h.step(t, Op::Acquire(129)).await;
    assert!(refused.decision().is_denied());
    h.probe_retry(t, 129, refused.decision().retry_after())
        .await;
}

/// A refusal's wait weighed by a count in `limit / 2..=limit` (drawn first) with `fits` permits
/// to make room for, such that `fits * W` lies past 2^53 with a remainder modulo the count at
/// which the wait's nanoseconds, floor(1000 * remainder / count), have just stepped up (the
/// step drawn second); `None` when the draw has no such `fits`.
fn wait_case(rng: &mut Rng, limit: u64, wide: u128) -> Option<(u64, u64)> {
    let weighing = rng.range(limit / 2, limit);
    let j = rng.range(1, 999) as u128;
    let rem = (j * u128::from(weighing)).div_ceil(1000);
    let inverse = inverse_mod(wide % u128::from(weighing), u128::from(weighing))?;
    let fits = (rem * inverse % u128::from(weighing)) as u64;
    (u128::from(fits) * wide >= TWO_53 && fits != 0).then_some((weighing, fits))
}

/// A prime window of 2,999,999,929 us and 8,388,607 per window (products up to 2^54.5): the
/// previous count is chosen so that its product with the time left lies past 2^53 a few
/// microseconds above a multiple of the window (an odd product, which a double rounds), and
/// the waits of refusals in both branches (`cur + n` within the limit: weighed by the previous
/// count; above it: by the current one) so that `fits * W` lies past 2^53 with a remainder at
/// which one unit less changes the nanoseconds of the wait. Every reply is checked against the
/// model and the in-process counter, and each refusal's wait on a copy of the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_just_past_2_pow_53_weigh_and_wait_exactly() {
    let server = RedisServer::start();
    let w = 2_999_999_929u64;
    let limit = 8_388_607u64;
    let r = rule(limit, w);
    let wide = u128::from(w);
    let mut rng = Rng(0x5eed_2053);
    let mut window = 0;
    let mut past = [0usize; 3];

    // Weights: prev * (W - e) = remainder (mod W), remainder 1 to 3.
    let mut case = 0;
    while past[0] < 24 {
        case += 1;
        assert!(case < 500, "too few products past 2^53: {past:?}");
        let prev = rng.range((TWO_53 / wide) as u64 + 1, limit);
        let remainder = rng.range(1, 3) as u128;
        let Some(inverse) = inverse_mod(u128::from(prev), wide) else {
            continue;
        };
        let x = (remainder * inverse % wide) as u64;
        let product = u128::from(prev) * u128::from(x);
        if x == 0 || product < TWO_53 {
            continue;
        }
        past[0] += 1;
        let weight = product.div_ceil(wide) as u64;
        let k = window_start(w, window);
        window += 3;
        let mut h = Harness::new(&server, &[r], &format!("weight-{case}"), k + 2).await;
        assert!(
            h.step(k + 2, Op::Acquire(prev))
                .await
                .decision()
                .is_allowed()
        );
        let t = k + w + (w - x);
        assert_eq!(
            h.step(t, Op::Peek).await.decision().remaining(),
            limit - weight
        );
        let _ = h.step(t, Op::Acquire(0)).await;
        let refused = h.step(t, Op::Acquire(limit - weight + 1)).await;
        assert!(refused.decision().is_denied());
        h.probe_retry(t, limit - weight + 1, refused.decision().retry_after())
            .await;
        assert!(
            h.step(t, Op::Acquire(limit - weight))
                .await
                .decision()
                .is_allowed()
        );
        // Full at the weight: a peek waits in the first branch (fits = weight - 1).
        let peek = h.step(t, Op::Peek).await;
        assert!(peek.decision().is_denied());
        h.probe_retry(t, 1, peek.decision().retry_after()).await;
    }

    // First branch: weighing = prev, fits = limit - cur - n, with fits * W = rem (mod prev)
    // where floor(1000 * rem / prev) has just stepped up.
    let mut case = 0;
    while past[1] < 16 {
        case += 1;
        assert!(
            case < 500,
            "too few first-branch products past 2^53: {past:?}"
        );
        let Some((prev, fits)) = wait_case(&mut rng, limit, wide) else {
            continue;
        };
        past[1] += 1;
        let k = window_start(w, window);
        window += 3;
        let mut h = Harness::new(&server, &[r], &format!("first-{case}"), k + 7).await;
        assert!(
            h.step(k + 7, Op::Acquire(prev))
                .await
                .decision()
                .is_allowed()
        );
        // One microsecond into the next window the previous count weighs all of itself.
        let t = k + w + 1;
        let cur = limit - prev;
        assert!(h.step(t, Op::Acquire(cur)).await.decision().is_allowed());
        let n = prev - fits;
        let refused = h.step(t, Op::Acquire(n)).await;
        assert!(refused.decision().is_denied(), "{:?}", refused.decision());
        h.probe_retry(t, n, refused.decision().retry_after()).await;
        // Later in the window, still refused, from another reading.
        let later = t + rng.range(1, 1000);
        if h.quota(later).remaining < n {
            let refused = h.step(later, Op::Acquire(n)).await;
            h.probe_retry(later, n, refused.decision().retry_after())
                .await;
        }
    }

    // Second branch: weighing = cur, fits = limit - n, fits * W = rem (mod cur).
    let mut case = 0;
    while past[2] < 16 {
        case += 1;
        assert!(
            case < 500,
            "too few second-branch products past 2^53: {past:?}"
        );
        let Some((cur, fits)) = wait_case(&mut rng, limit, wide) else {
            continue;
        };
        past[2] += 1;
        let k = window_start(w, window);
        window += 3;
        let mut h = Harness::new(&server, &[r], &format!("second-{case}"), k + 3).await;
        assert!(
            h.step(k + 3, Op::Acquire(cur))
                .await
                .decision()
                .is_allowed()
        );
        let t = k + rng.range(3, w - 1);
        let n = limit - fits;
        let refused = h.step(t, Op::Acquire(n)).await;
        assert!(refused.decision().is_denied());
        h.probe_retry(t, n, refused.decision().retry_after()).await;
        let _ = h.step(t, Op::Peek).await;
        let _ = h.step(t, Op::Acquire(0)).await;
        // The same request from the next window, where cur weighs as the previous count.
        let next = k + w + rng.range(0, w / 2);
        let refused = h.step(next, Op::Acquire(n)).await;
        if refused.decision().is_denied() {
            h.probe_retry(next, n, refused.decision().retry_after())
                .await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random histories.
// ---------------------------------------------------------------------------------------------

/// Rules where the script's products straddle 2^53, and a few small ones.
fn large_rules() -> Vec<Rule> {
    vec![
        // Prime window of ~50 min: products up to 2^54.5.
        rule(8_388_607, 2_999_999_929),
        // 2^29 - 1 over a prime window of ~116 days: products up to 2^72.
        rule(536_870_911, 9_999_999_999_971),
        // The largest limit the builder takes, over a prime window of ~9 years (the in-process
        // counter's horizon is two windows: the model alone checks it).
        rule(2_147_483_647, 281_474_976_710_597),
        // A power-of-two window, where products land on multiples of it.
        rule(1000, 1 << 45),
        rule(441_651_591, 1 << 45),
        rule(999_983, 999_999_937),
        rule(7, 1_000_003),
    ]
}

/// The next reading: mostly forward (staying, a little, to a microsecond aimed so that the
/// previous count's weight lands on or next to an integer, to a window's edge, up to two
/// windows), sometimes back (at most one window behind the latest reading, never behind
/// `first`).
fn next_reading(rng: &mut Rng, model: &ModelLimit, now: u64, latest: u64, first: u64) -> u64 {
    let w = model.window;
    let floor = (latest.saturating_sub(w)).max(first);
    match rng.range(0, 99) {
        0..=29 => now,
        30..=44 => now + rng.range(1, 1000.min(w)),
        45..=59 => {
            // Aim: prev * (W - e) = r (mod W) for r in {0, g, W - g}, g = gcd(prev, W).
            let r = model.roll(now);
            let wide = u128::from(w);
            let prev = u128::from(r.prev);
            if prev == 0 {
                return now + rng.range(0, w / 3);
            }
            let g = gcd(prev, wide);
            let m = wide / g;
            let target = [0, g, wide - g][rng.range(0, 2) as usize];
            // -prev * e = target (mod W)  <=>  e = -(target / g) * inv(prev / g) (mod W / g).
            let inverse = inverse_mod(prev / g, m).unwrap();
            let e0 = ((m - (target / g) % m) % m * inverse % m) as u64;
            let step = m as u64;
            let start = r.index * w;
            if now < start {
                return now;
            }
            let e_now = now - start;
            // The first aimed microsecond after e_now, plus a few steps of W / g.
            let mut e = e0;
            if e <= e_now {
                e += (e_now - e0) / step * step + step;
            }
            e = e.saturating_add(rng.range(0, 3) * step);
            if e >= w || e == 0 {
                return now;
            }
            start + e + [0, 0, 1][rng.range(0, 2) as usize]
        }
        60..=69 => {
            let next = (now / w + 1) * w;
            next + [0, 0, 1, w - 1][rng.range(0, 3) as usize]
        }
        70..=79 => now + rng.range(0, 2 * w),
        _ => now.saturating_sub(rng.range(0, w)).max(floor),
    }
}

/// The next request: around what fits now (the quota, one more), a peek, n = 0, a random batch,
/// or more than a limit.
fn next_op(rng: &mut Rng, harness: &Harness, now: u64) -> Op {
    let smallest = harness.rules.iter().map(|r| r.limit()).min().unwrap();
    let available = harness
        .model
        .iter()
        .map(|m| m.decide(now, 0).0.remaining)
        .min()
        .unwrap();
    match rng.range(0, 99) {
        0..=14 => Op::Peek,
        15..=22 => Op::Acquire(0),
        23..=25 => Op::Acquire(smallest + 1),
        26..=45 => Op::Acquire(available.max(1)),
        46..=60 => Op::Acquire((available + 1).min(smallest)),
        61..=70 => Op::Acquire(rng.range(1, smallest)),
        71..=80 => Op::Acquire(rng.range(1, (smallest / 1000).max(1))),
        _ => Op::Acquire(rng.range(1, available.max(1)).min(smallest)),
    }
}

/// A random history of `steps` calls; returns how many weights past 2^53 it decided, how many
/// of them on or next to an integer, and how many waits past 2^53.
async fn run_history(server: &RedisServer, rules: &[Rule], seed: u64, steps: usize) -> [usize; 3] {
    let mut rng = Rng(seed);
    let longest = rules.iter().map(|&r| window_us(r)).max().unwrap();
    let start = window_start(longest, rng.range(0, 3)) + rng.range(0, longest - 1);
    let mut h = Harness::new(server, rules, &format!("history-{seed:x}"), start).await;
    // Readings move on the window of the plan's first limit, never behind the first reading
    // (the in-process references start there), and the script's integers stay below 2^53.
    let cap = (u64::try_from(TWO_53).unwrap() / longest - 4) * longest;
    let (mut now, mut latest) = (start, start);
    let mut refusals = 0;
    for _ in 0..steps {
        now = next_reading(&mut rng, &h.model[0], now, latest, start).min(cap);
        // The script's integers stay below 2^53: the window after next starts before it.
        let longest_end = (now / longest + 3) * longest;
        assert!(u128::from(longest_end) < TWO_53);
        latest = latest.max(now);
        let op = next_op(&mut rng, &h, now);
        let answer = h.step(now, op).await;
        if answer.decision().is_denied() && answer.decision().rejection().is_none() {
            refusals += 1;
            if rng.chance(15)
                && let Op::Acquire(n) = op
            {
                h.probe_retry(now, n, answer.decision().retry_after()).await;
            }
        }
    }
    assert!(refusals > 0, "seed {seed:x}: a history without a refusal");
    eprintln!(
        "{rules:?} seed {seed:x}: {refusals} refusals, {} of {steps} steps checked in process; \
         weights past 2^53 {} ({} on or next to an integer), waits past 2^53 {}",
        h.in_process_steps, h.weights_past, h.weights_past_on_integer, h.waits_past
    );
    [h.weights_past, h.weights_past_on_integer, h.waits_past]
}

/// Random histories on each rule of [`large_rules`]: every reply equal to the model's (and the
/// in-process counter's within its horizon), every key as the model says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_at_large_limits_agree_with_the_model_and_in_process() {
    let server = RedisServer::start();
    let mut past = [0; 3];
    for (i, &r) in large_rules().iter().enumerate() {
        for seed in 0..10u64 {
            let counts = run_history(&server, &[r], 0x1000 * (i as u64 + 1) + seed, 80).await;
            for (total, count) in past.iter_mut().zip(counts) {
                *total += count;
            }
        }
    }
    // The histories did reach the slow path, on integers too.
    assert!(past.iter().all(|&count| count >= 50), "{past:?}");
}

/// Plans of several limits over odd windows where the products straddle 2^53: all or nothing,
/// each limit's own figures (a refused plan's granting limits report their quota), the plan's
/// decision as in process, and no key written unless every limit grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_decide_all_or_nothing_with_each_limits_figures() {
    let server = RedisServer::start();
    let plans = [
        vec![rule(8_388_607, 2_999_999_929), rule(4_194_301, 999_999_937)],
        vec![
            rule(999_983, 999_999_937),
            rule(8_388_607, 2_999_999_929),
            rule(4_194_301, 86_400_000_007),
        ],
        vec![rule(1000, 1 << 45), rule(441_651_591, 1 << 45)],
        vec![rule(7, 1_000_003), rule(5, 999_983), rule(3, 2_000_003)],
    ];
    for (i, rules) in plans.iter().enumerate() {
        for seed in 0..8u64 {
            let _ = run_history(&server, rules, 0x9000 * (i as u64 + 1) + seed, 80).await;
        }
    }
}

/// A reading behind the stored window is counted at its start, where the previous count
/// weighs all of itself; a grant there counts in the stored window, and its key's expiry runs
/// from the reading itself. Peeks and n = 0 there write nothing; refusals in both branches
/// name the exact wait from the reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reading_behind_the_stored_window_counts_at_its_start() {
    let server = RedisServer::start();
    let w = 2_999_999_929u64;
    let limit = 8_388_607u64;
    let r = rule(limit, w);
    let k = window_start(w, 10);
    let mut h = Harness::new(&server, &[r], "behind", k + 11).await;
    // Window k: 5,000,001 permits; window k + 1: 1,000,000 at mid-window.
    assert!(
        h.step(k + 11, Op::Acquire(5_000_001))
            .await
            .decision()
            .is_allowed()
    );
    let mid = k + w + w / 2;
    assert!(
        h.step(mid, Op::Acquire(1_000_000))
            .await
            .decision()
            .is_allowed()
    );
    // Back into window k: counted at the start of k + 1, where 5,000,001 weigh 5,000,001.
    let back = k + w - 12_345;
    let quota = h.step(back, Op::Acquire(0)).await;
    assert_eq!(quota.decision().remaining(), limit - 6_000_001);
    assert_eq!(
        quota.decision().reset_after(),
        Duration::from_micros(k + 3 * w - back)
    );
    let _ = h.step(back, Op::Peek).await;
    // First branch (cur + n within the limit): weighed by the previous count.
    let n = limit - 6_000_001 + 1;
    let refused = h.step(back, Op::Acquire(n)).await;
    assert!(refused.decision().is_denied());
    h.probe_retry(back, n, refused.decision().retry_after())
        .await;
    // Second branch (cur + n above it): weighed by the current count, in the next window.
    let n = limit - 999_999;
    let refused = h.step(back, Op::Acquire(n)).await;
    assert!(refused.decision().is_denied());
    assert!(refused.decision().retry_after() > Duration::from_micros(k + 2 * w - back));
    h.probe_retry(back, n, refused.decision().retry_after())
        .await;
    // A grant behind the stored window counts in it, and fills it.
    assert!(
        h.step(back, Op::Acquire(2_388_606))
            .await
            .decision()
            .is_allowed()
    );
    assert_eq!(
        h.model[0].stored,
        Some(Stored {
            w: k / w + 1,
            c: 3_388_606,
            p: 5_000_001
        })
    );
    let full = h.step(back + 1, Op::Peek).await;
    assert!(full.decision().is_denied());
    h.probe_retry(back + 1, 1, full.decision().retry_after())
        .await;
    // Further back, to the first reading's window start, and forward again.
    let _ = h.step(k, Op::Acquire(0)).await;
    let _ = h.step(k + 11, Op::Peek).await;
    for t in [mid, mid + 1, k + 2 * w - 1, k + 2 * w, k + 2 * w + 1] {
        let _ = h.step(t, Op::Peek).await;
        let quota = h.quota(t).remaining;
        let _ = h.step(t, Op::Acquire((quota + 1).min(limit))).await;
    }
}

/// Up to `count` offsets `e` in 2..W - 1 at which `prev * (W - e)` is 0, `g` or `-g` modulo W
/// (`g = gcd(prev, W)`): the weight exactly an integer, or as near one as it gets.
fn aimed_offsets(prev: u64, w: u64, count: usize) -> Vec<u64> {
    let (wide, p) = (u128::from(w), u128::from(prev));
    let g = gcd(p, wide);
    let m = wide / g;
    let inverse = inverse_mod(p / g, m).unwrap();
    let mut all = Vec::new();
    for target in [0, g, wide - g] {
        let e0 = (m - (target / g) % m) % m * inverse % m;
        let mut e = e0;
        let mut j = 0;
        while e < wide && j < count / 3 {
            if e >= 2 && e + 1 < wide {
                all.push(e as u64);
                j += 1;
            }
            // Spread over the window.
            e += m * (1 + (wide / m) / 5);
        }
    }
    all.sort_unstable();
    all.dedup();
    all
}

/// Around a refusal at the limit: peeks and n = 0 report the quota and write nothing, at
/// readings where the previous count's weight lands exactly on an integer and one microsecond
/// either side, on a window of 1,000,000 us and 1000 per window (products below 2^53, the
/// quick path) and on the window of 2^45 us (products past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_and_zero_permits_around_refusals_write_nothing_and_agree() {
    let server = RedisServer::start();
    for (limit, w, prev) in [
        (1000u64, 1_000_000u64, 750u64),
        (1000, 1_000_000, 999),
        (1000, 1 << 45, 640),
        (441_651_591, 1 << 45, 441_650_591),
    ] {
        let r = rule(limit, w);
        let k = window_start(w, 1);
        let mut h = Harness::new(&server, &[r], &format!("peek-{limit}-{w}-{prev}"), k).await;
        assert!(h.step(k, Op::Acquire(prev)).await.decision().is_allowed());
        // Fill the next window to the weight at its start plus a bit: cur = limit - prev.
        let next = k + w;
        assert!(
            h.step(next + 1, Op::Acquire(limit - prev))
                .await
                .decision()
                .is_allowed()
        );
        // Readings where prev * (W - e) is a multiple of W or next to one, and one microsecond
        // either side.
        for e in aimed_offsets(prev, w, 9) {
            for t in [next + e - 1, next + e, next + e + 1] {
                let p = h.step(t, Op::Peek).await;
                let z = h.step(t, Op::Acquire(0)).await;
                assert_eq!(p.decision().remaining(), z.decision().remaining());
                let quota = z.decision().remaining();
                if quota == 0 {
                    assert!(p.decision().is_denied());
                    h.probe_retry(t, 1, p.decision().retry_after()).await;
                } else {
                    assert!(p.decision().is_allowed());
                    assert_eq!(p.decision().reset_after(), z.decision().reset_after());
                }
                let refused = h.step(t, Op::Acquire(quota + 1)).await;
                assert!(refused.decision().is_denied());
                h.probe_retry(t, quota + 1, refused.decision().retry_after())
                    .await;
            }
        }
    }
}
