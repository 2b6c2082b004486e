//! A new client whose two buckets hold no free slot reuses, uncounted, a state made under an
//! earlier rule: of *another* client. `len()` then does not grow, and `evictions()` stays 0.
//! (What `first_requests_racing_a_rule_change_start_the_client_at_most_once_per_change` in
//! `review_holdings.rs` meets, rarely, when two buckets of its random placement fill up.)

use std::time::Duration;

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder};

const STORE_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];
const PLAN: &str = "p";
const LIMITS: [u64; 2] = [3, 2];

fn rule(limit: u64) -> Rule {
    Rule::new(limit, Duration::from_secs(1)).unwrap()
}

fn spend(service: &RateLimiterService<u64, &'static str, FakeClock>, key: u64) -> u64 {
    let mut granted = 0;
    while granted <= 10 && service.allow(&key, &PLAN).unwrap() {
        granted += 1;
    }
    granted
}

/// The racing test's rounds, one thread, in a table of one bucket (8 slots): a fresh key each
/// round spends its limit, then the rule changes. The ninth key finds every slot taken by a
/// state of an earlier rule and reuses one (uncounted, as documented): 9 clients, `len()` 8.
/// Every earlier client, its state reused or not, starts afresh under the current rule.
#[test]
fn the_ninth_client_in_a_full_bucket_of_earlier_rules_states_reuses_one() {
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_millis(500));
        let service = ServiceBuilder::new(algorithm, clock)
            .plan(PLAN, rule(LIMITS[0]))
            .capacity(8)
            .build::<u64>()
            .unwrap();
        for round in 0..9_u64 {
            let limit = LIMITS[round as usize % 2];
            assert_eq!(spend(&service, round), limit, "{algorithm}: round {round}");
            service
                .set_rule(&PLAN, rule(LIMITS[(round as usize + 1) % 2]))
                .unwrap();
        }
        assert_eq!(
            (service.len(), service.evictions()),
            (8, 0),
            "{algorithm}: 9 clients, len, evictions"
        );
        let now = LIMITS[9 % 2];
        let peeks: Vec<u64> = (0..9_u64)
            .map(|key| service.peek(&key, &PLAN).unwrap().remaining())
            .collect();
        assert_eq!(
            peeks,
            vec![now; 9],
            "{algorithm}: every client fresh under the rule in force"
        );
    }
}
