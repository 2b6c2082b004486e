//! Review: attacks on the give-back of a request refused at a taking after its look
//! (`decide_in_process`, `RateLimiterService::give_back`), through the public API only.

mod rls_support;

use std::sync::{Arc, Barrier};
use std::thread;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use rls_support::{descriptor, in_process as server, runtime};
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig};

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "race".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn one(key: &str, value: &str) -> RateLimitDescriptor {
    descriptor(&[(key, value)])
}

fn with_hits(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    let mut made = descriptor(&[(key, value)]);
    made.hits_addend = Some(UInt64Value { value: hits });
    made
}

fn decide(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    request: &RateLimitRequest,
) -> RateLimitResponse {
    runtime
        .block_on(server.decide(request))
        .expect("the request is decided")
}

fn is_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

/// What one thread saw: per round, its OK answers; and how many of its refusals were made at a
/// taking after the look (the `tail` descriptor, taken last, was skipped: no `current_limit`).
#[derive(Debug, Default, Clone)]
struct Seen {
    oks: Vec<u64>,
    after_look: u64,
}

/// Races `threads` threads for `rounds` rounds, each thread sending `tries` copies of
/// `make(thread, round)` per round (rounds start together: a barrier before each). `tail`: the
/// index of a descriptor that is taken last, to count the refusals made after a look.
fn race_once(
    server: &RateLimitServer,
    threads: usize,
    rounds: std::ops::Range<usize>,
    tries: usize,
    tail: Option<usize>,
    make: &Arc<dyn Fn(usize, usize) -> RateLimitRequest + Send + Sync>,
) -> Vec<Seen> {
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let (server, barrier, make) = (server.clone(), Arc::clone(&barrier), Arc::clone(make));
            let rounds = rounds.clone();
            thread::spawn(move || {
                let runtime = runtime();
                let mut seen = Seen::default();
                for round in rounds {
                    let request = make(thread, round);
                    let mut oks = 0;
                    barrier.wait();
                    for _ in 0..tries {
                        let response = decide(&runtime, &server, &request);
                        if is_ok(&response) {
                            oks += 1;
                        } else if let Some(tail) = tail
                            && response.statuses[tail].current_limit.is_none()
                        {
                            seen.after_look += 1;
                        }
                    }
                    seen.oks.push(oks);
                }
                seen
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect()
}

/// Rounds per batch of `race`.
const ROUNDS: usize = 500;
/// At most this many batches: enough, on a loaded machine, for some refusals after a look.
const MAX_BATCHES: usize = 8;
/// `race` stops after the batch in which it has seen this many refusals after a look.
const ENOUGH: u64 = 30;

/// [`race_once`] in batches of [`ROUNDS`] rounds (numbered on), until [`ENOUGH`] refusals after a
/// look were seen (when `tail` counts them) or [`MAX_BATCHES`] batches ran. Each thread's OK
/// answers per round, over every batch, and the refusals after a look seen in all.
fn race(
    server: &RateLimitServer,
    threads: usize,
    tries: usize,
    tail: Option<usize>,
    make: impl Fn(usize, usize) -> RateLimitRequest + Send + Sync + 'static,
) -> (Vec<Seen>, u64) {
    let make: Arc<dyn Fn(usize, usize) -> RateLimitRequest + Send + Sync> = Arc::new(make);
    let mut all = vec![Seen::default(); threads];
    let mut after_look = 0;
    for batch in 0..MAX_BATCHES {
        let rounds = batch * ROUNDS..(batch + 1) * ROUNDS;
        for (total, seen) in all
            .iter_mut()
            .zip(race_once(server, threads, rounds, tries, tail, &make))
        {
            total.oks.extend(seen.oks);
            total.after_look += seen.after_look;
            after_look += seen.after_look;
        }
        if tail.is_none() || after_look >= ENOUGH {
            break;
        }
    }
    eprintln!("{after_look} refusals after a look");
    (all, after_look)
}

/// What a lone request of `descriptor` gets: whether OK, and what it reports left (it takes
/// its own permits too).
fn lone(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    descriptor: RateLimitDescriptor,
) -> (bool, u64) {
    let response = decide(runtime, server, &request(vec![descriptor]));
    (
        is_ok(&response),
        u64::from(response.statuses[0].limit_remaining),
    )
}

/// What `descriptor`'s limit of `limit` has been charged, read by one more request of one
/// permit (which must pass).
fn charged(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    descriptor: RateLimitDescriptor,
    limit: u64,
    context: &str,
) -> u64 {
    let (allowed, remaining) = lone(runtime, server, descriptor);
    assert!(allowed, "{context}: the limit is far from spent");
    limit - 1 - remaining
}

const METHODS: [&str; 3] = ["token_bucket", "fixed_window", "sliding_window_counter"];

/// The client's own limit: never what refuses a request.
const OWN: u64 = 100_000;
/// The shared limit a round's requests race for.
const SHARED: u64 = 3;

fn base_yaml(method: &str, extra: &str) -> String {
    format!(
        r#"
domain: race
method: {method}
descriptors:
  - key: user
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
  - key: round
    rate_limit: {{unit: year, requests_per_unit: {SHARED}}}
  - key: tail
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
{extra}"#
    )
}

fn user(thread: usize) -> RateLimitDescriptor {
    one("user", &format!("u{thread}"))
}

fn tail(thread: usize) -> RateLimitDescriptor {
    one("tail", &format!("t{thread}"))
}

fn round(round: usize) -> RateLimitDescriptor {
    one("round", &round.to_string())
}

fn oks_of(seen: &Seen) -> u64 {
    seen.oks.iter().sum()
}

/// No round granted more than its shared limit (`per_request` permits per OK answer).
fn check_rounds(seen: &[Seen], per_request: u64, limit: u64, context: &str) {
    let rounds = seen[0].oks.len();
    for at in 0..rounds {
        let granted: u64 = seen.iter().map(|s| s.oks[at]).sum::<u64>() * per_request;
        assert!(
            granted <= limit,
            "{context}: round {at} granted {granted} permits of its shared limit of {limit}"
        );
    }
}

/// **All or nothing with a descriptor repeated** (`decide`: a refused request is charged to
/// none; every grant is given back). Each request carries the client's own descriptor twice,
/// then the shared one: a request refused at the shared one's taking, after both copies were
/// taken, must give both back, so the client's limit is charged exactly 2 per OK answer.
fn duplicate_descriptors(method: &str) {
    let rt = runtime();
    let server = server(&rt, &base_yaml(method, ""), 4096);
    let (seen, _) = race(&server, 4, 2, Some(3), |thread, at| {
        request(vec![user(thread), user(thread), round(at), tail(thread)])
    });
    check_rounds(&seen, 1, SHARED, method);
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let charged = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            charged,
            2 * oks,
            "{method}: client u{thread}, whose requests each carry its descriptor twice, was \
             charged {charged} permits for {oks} requests answered OK (expected {})",
            2 * oks
        );
    }
}

#[test]
fn a_repeated_descriptor_is_given_back_whole_under_the_token_bucket() {
    duplicate_descriptors("token_bucket");
}

#[test]
fn a_repeated_descriptor_is_given_back_whole_under_the_fixed_window() {
    duplicate_descriptors("fixed_window");
}

#[test]
fn a_repeated_descriptor_is_given_back_whole_under_the_sliding_window_counter() {
    duplicate_descriptors("sliding_window_counter");
}

/// **All or nothing with several limits on one descriptor** (`limits:`; `decide`: every grant is
/// given back, to each limit). The client's own descriptor has two limits; a request refused at
/// the shared descriptor's taking gives back what it took from both, so the closer limit is
/// charged exactly 1 per OK answer.
fn several_limits(method: &str) {
    let rt = runtime();
    let extra = format!(
        "  - key: tiers\n    limits:\n      - {{unit: month, requests_per_unit: {OWN}}}\n      - {{unit: year, requests_per_unit: {}}}\n",
        OWN * 10
    );
    let server = server(&rt, &base_yaml(method, &extra), 4096);
    let tiers = |thread: usize| one("tiers", &format!("u{thread}"));
    let (seen, _) = race(&server, 4, 2, Some(2), move |thread, at| {
        request(vec![tiers(thread), round(at), tail(thread)])
    });
    check_rounds(&seen, 1, SHARED, method);
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let charged = charged(&rt, &server, tiers(thread), OWN, method);
        assert_eq!(
            charged, oks,
            "{method}: client u{thread} of two limits was charged {charged} permits for {oks} \
             requests answered OK"
        );
    }
}

#[test]
fn several_limits_on_a_descriptor_are_given_back_under_the_token_bucket() {
    several_limits("token_bucket");
}

#[test]
fn several_limits_on_a_descriptor_are_given_back_under_the_fixed_window() {
    several_limits("fixed_window");
}

#[test]
fn several_limits_on_a_descriptor_are_given_back_under_the_sliding_window_counter() {
    several_limits("sliding_window_counter");
}

/// **A repeated descriptor of several limits** (`decide`: a refused request is charged to none).
/// As `duplicate_descriptors`, for a descriptor with `limits:`.
#[test]
fn a_repeated_descriptor_of_several_limits_is_given_back_whole() {
    for method in METHODS {
        let rt = runtime();
        let extra = format!(
            "  - key: tiers\n    limits:\n      - {{unit: month, requests_per_unit: {OWN}}}\n      - {{unit: year, requests_per_unit: {}}}\n",
            OWN * 10
        );
        let server = server(&rt, &base_yaml(method, &extra), 4096);
        let tiers = |thread: usize| one("tiers", &format!("u{thread}"));
        let (seen, _) = race(&server, 4, 2, Some(3), move |thread, at| {
            request(vec![tiers(thread), tiers(thread), round(at), tail(thread)])
        });
        check_rounds(&seen, 1, SHARED, method);
        for (thread, seen) in seen.iter().enumerate() {
            let oks = oks_of(seen);
            let charged = charged(&rt, &server, tiers(thread), OWN, method);
            assert_eq!(
                charged,
                2 * oks,
                "{method}: client u{thread} of two limits, its descriptor twice in each request, \
                 was charged {charged} permits for {oks} requests answered OK (expected {})",
                2 * oks
            );
        }
    }
}

/// **Shadow mode and all or nothing** (`decide`: a refused request is charged to none, shadowed
/// descriptors included; a shadowed descriptor over its limit refuses nothing). Each request
/// carries a shadowed descriptor of a large limit, one of a spent limit, and the shared one: a
/// request refused at the shared one's taking gives back both the client's and the shadowed
/// grant; the spent shadowed limit never refuses.
fn shadowed(method: &str) {
    let rt = runtime();
    let extra = format!(
        "  - key: watch\n    shadow_mode: true\n    rate_limit: {{unit: year, requests_per_unit: {OWN}}}\n  - key: spent\n    shadow_mode: true\n    rate_limit: {{unit: year, requests_per_unit: 1}}\n"
    );
    let server = server(&rt, &base_yaml(method, &extra), 4096);
    let watch = |thread: usize| one("watch", &format!("w{thread}"));
    let spent = |thread: usize| one("spent", &format!("s{thread}"));
    for thread in 0..4 {
        assert!(
            lone(&rt, &server, spent(thread)).0,
            "{method}: a shadowed limit answers OK"
        );
    }
    let (seen, _) = race(&server, 4, 2, Some(4), move |thread, at| {
        request(vec![
            user(thread),
            spent(thread),
            watch(thread),
            round(at),
            tail(thread),
        ])
    });
    // Each round grants its shared limit exactly: the spent shadowed limit refuses none.
    let rounds = seen[0].oks.len();
    for at in 0..rounds {
        let granted: u64 = seen.iter().map(|s| s.oks[at]).sum();
        assert_eq!(granted, SHARED, "{method}: round {at} granted {granted}");
    }
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let own = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            own, oks,
            "{method}: u{thread}'s own limit charged {own} for {oks} OKs"
        );
        let shadow = charged(&rt, &server, watch(thread), OWN, method);
        assert_eq!(
            shadow, oks,
            "{method}: w{thread}'s shadowed limit charged {shadow} for {oks} OKs"
        );
    }
}

#[test]
fn shadowed_grants_are_given_back_under_the_token_bucket() {
    shadowed("token_bucket");
}

#[test]
fn shadowed_grants_are_given_back_under_the_fixed_window() {
    shadowed("fixed_window");
}

#[test]
fn shadowed_grants_are_given_back_under_the_sliding_window_counter() {
    shadowed("sliding_window_counter");
}

/// **All or nothing with `hits_addend` > 1** (`decide`: each descriptor takes the request's
/// hits; a refused request is charged to none). Each request asks 3 of every descriptor; the
/// shared limit is 9: 3 requests per round. The client's limit is charged 3 per OK answer.
fn hits_addend(method: &str) {
    let rt = runtime();
    let yaml = base_yaml(method, "").replace(
        &format!("requests_per_unit: {SHARED}}}"),
        "requests_per_unit: 9}",
    );
    let server = server(&rt, &yaml, 4096);
    let (seen, _) = race(&server, 4, 2, Some(2), |thread, at| {
        let mut made = request(vec![user(thread), round(at), tail(thread)]);
        made.hits_addend = 3;
        made
    });
    check_rounds(&seen, 3, 9, method);
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let charged = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            charged,
            3 * oks,
            "{method}: u{thread} was charged {charged} permits for {oks} requests of 3 answered OK"
        );
    }
}

#[test]
fn hits_addend_is_given_back_whole_under_the_token_bucket() {
    hits_addend("token_bucket");
}

#[test]
fn hits_addend_is_given_back_whole_under_the_fixed_window() {
    hits_addend("fixed_window");
}

#[test]
fn hits_addend_is_given_back_whole_under_the_sliding_window_counter() {
    hits_addend("sliding_window_counter");
}

/// **Descriptors' own `hits_addend`, one repeated with different hits** (`decide`: a refused
/// request is charged to none). The client's descriptor comes twice, asking 1 then 2.
#[test]
fn a_repeated_descriptor_of_different_hits_is_given_back_whole() {
    for method in METHODS {
        let rt = runtime();
        let server = server(&rt, &base_yaml(method, ""), 4096);
        let (seen, _) = race(&server, 4, 2, Some(3), |thread, at| {
            request(vec![
                with_hits("user", &format!("u{thread}"), 1),
                with_hits("user", &format!("u{thread}"), 2),
                round(at),
                tail(thread),
            ])
        });
        check_rounds(&seen, 1, SHARED, method);
        for (thread, seen) in seen.iter().enumerate() {
            let oks = oks_of(seen);
            let charged = charged(&rt, &server, user(thread), OWN, method);
            assert_eq!(
                charged,
                3 * oks,
                "{method}: u{thread} was charged {charged} permits for {oks} requests of 1 + 2 \
                 answered OK (expected {})",
                3 * oks
            );
        }
    }
}

/// **No limit grants more than it allows, and all or nothing, when both descriptors race**
/// (`decide`: "No limit ever grants more than it allows"; the windows take a give-back off the
/// window it was counted in). Two threads share each client, whose limit runs out mid-race, and
/// all four race for each round's shared limit; the shared descriptor is taken first, so a
/// request refused at the client's taking gives the round's grant back while the other thread
/// of the pair decides on the same client. Then: no client and no round granted more than its
/// limit; under the windows, every limit is charged exactly its OK answers.
fn pairs(method: &str) {
    const PAIR: u64 = 600;
    let rt = runtime();
    let extra =
        format!("  - key: pair\n    rate_limit: {{unit: year, requests_per_unit: {PAIR}}}\n");
    let server = server(&rt, &base_yaml(method, &extra), 4096);
    let pair = |thread: usize| one("pair", &format!("p{}", thread / 2));
    let (seen, _) = race(&server, 4, 2, Some(2), move |thread, at| {
        request(vec![round(at), pair(thread), tail(thread)])
    });
    let exact = method != "token_bucket";
    check_rounds(&seen, 1, SHARED, method);
    for at in 0..seen[0].oks.len() {
        let granted: u64 = seen.iter().map(|s| s.oks[at]).sum();
        let (allowed, remaining) = lone(&rt, &server, round(at));
        if allowed {
            let charged = SHARED - 1 - remaining;
            let fits = if exact {
                charged == granted
            } else {
                charged >= granted
            };
            assert!(
                fits,
                "{method}: round {at} was charged {charged} for {granted} OK answers"
            );
        } else if exact {
            assert_eq!(
                granted, SHARED,
                "{method}: round {at} spent with {granted} OK answers"
            );
        }
    }
    for p in 0..2 {
        let oks: u64 = seen[2 * p..2 * p + 2].iter().map(oks_of).sum();
        assert!(
            oks <= PAIR,
            "{method}: client p{p} granted {oks} of its limit of {PAIR}"
        );
        let (allowed, remaining) = lone(&rt, &server, pair(2 * p));
        if allowed {
            let charged = PAIR - 1 - remaining;
            let fits = if exact {
                charged == oks
            } else {
                charged >= oks
            };
            assert!(
                fits,
                "{method}: client p{p} was charged {charged} for {oks} OK answers"
            );
        } else if exact {
            assert_eq!(
                oks, PAIR,
                "{method}: client p{p} spent with {oks} OK answers"
            );
        }
    }
}

#[test]
fn pairs_racing_on_both_descriptors_never_over_grant_under_the_token_bucket() {
    pairs("token_bucket");
}

#[test]
fn pairs_racing_on_both_descriptors_never_over_grant_under_the_fixed_window() {
    pairs("fixed_window");
}

#[test]
fn pairs_racing_on_both_descriptors_never_over_grant_under_the_sliding_window_counter() {
    pairs("sliding_window_counter");
}

/// **The sliding log is taken last** (`decide`: the sliding log cannot give back, so its
/// descriptors are taken last; only a request with two of them keeps a grant). The shared
/// descriptor is a sliding log; the client's own (another method) is listed after it but must
/// be taken before it and given back when the log refuses after the look.
fn log_last(method: &str) {
    let rt = runtime();
    let yaml = format!(
        r#"
domain: race
method: {method}
descriptors:
  - key: user
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
  - key: round
    method: sliding_window_log
    rate_limit: {{unit: year, requests_per_unit: {SHARED}}}
  - key: tail
    method: sliding_window_log
    rate_limit: {{unit: year, requests_per_unit: 65536}}
"#
    );
    let server = server(&rt, &yaml, 4096);
    let (seen, _) = race(&server, 4, 2, Some(2), |thread, at| {
        request(vec![round(at), user(thread), tail(thread)])
    });
    let rounds = seen[0].oks.len();
    for at in 0..rounds {
        let granted: u64 = seen.iter().map(|s| s.oks[at]).sum();
        assert_eq!(
            granted, SHARED,
            "{method}: log round {at} granted {granted}"
        );
    }
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let charged = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            charged, oks,
            "{method}: u{thread} was charged {charged} permits for {oks} OKs beside a shared log"
        );
    }
}

#[test]
fn a_sliding_log_is_taken_after_a_token_bucket() {
    log_last("token_bucket");
}

#[test]
fn a_sliding_log_is_taken_after_a_fixed_window() {
    log_last("fixed_window");
}

#[test]
fn a_sliding_log_is_taken_after_a_sliding_window_counter() {
    log_last("sliding_window_counter");
}

/// **A give-back never lands on another client's state after an eviction** (`decide`: every grant
/// is given back "to the very state it was made on (a client evicted ... meanwhile took it away
/// already)"). The clients' descriptor holds 8 clients (one bucket); every request brings a new
/// client, so each insert evicts or reuses a slot while other threads' grants are in flight and
/// given back. Six sentinel clients, put in mid-race, spend their whole limit at once and must
/// stay refused: being the farthest from fresh, they are never evicted, so an OK for one means
/// some other client's give-back landed on its state.
fn evictions(method: &str) {
    const LIMIT: u64 = 1_000;
    const SENTINELS: usize = 6;
    let rt = runtime();
    let yaml = format!(
        r#"
domain: race
method: {method}
descriptors:
  - key: churn
    rate_limit: {{unit: year, requests_per_unit: {LIMIT}}}
  - key: round
    rate_limit: {{unit: year, requests_per_unit: {SHARED}}}
  - key: tail
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
"#
    );
    let server = server(&rt, &yaml, 8);
    let sentinel = |at: usize| with_hits("churn", &format!("s{at}"), 1);
    let checker = server.clone();
    let sentinels = Arc::new(std::sync::Mutex::new(Vec::new()));
    let put = Arc::clone(&sentinels);
    let (seen, _) = race(&server, 4, 2, Some(2), move |thread, at| {
        // Thread 0 puts a sentinel in now and then, between its rounds.
        if thread == 0 && at % 400 == 200 && put.lock().unwrap().len() < SENTINELS {
            let rt = runtime();
            let spend = request(vec![with_hits("churn", &format!("s{at}"), LIMIT)]);
            assert!(
                is_ok(&decide(&rt, &checker, &spend)),
                "{at}: a new client's whole limit"
            );
            for _ in 0..3 {
                assert!(
                    !is_ok(&decide(&rt, &checker, &request(vec![sentinel(at)]))),
                    "sentinel s{at} granted right after spending its limit"
                );
            }
            put.lock().unwrap().push(at);
        }
        request(vec![
            one("churn", &format!("c{thread}-{at}")),
            round(at),
            tail(thread),
        ])
    });
    check_rounds(&seen, 1, SHARED, method);
    let sentinels = sentinels.lock().unwrap().clone();
    assert!(!sentinels.is_empty());
    for at in sentinels {
        let response = decide(&rt, &server, &request(vec![sentinel(at)]));
        assert!(
            !is_ok(&response),
            "{method}: sentinel s{at}, spent and never evicted, was granted again \
             (remaining {})",
            response.statuses[0].limit_remaining
        );
    }
}

#[test]
fn a_give_back_after_an_eviction_lands_on_no_other_client_under_the_token_bucket() {
    evictions("token_bucket");
}

#[test]
fn a_give_back_after_an_eviction_lands_on_no_other_client_under_the_fixed_window() {
    evictions("fixed_window");
}

#[test]
fn a_give_back_after_an_eviction_lands_on_no_other_client_under_the_sliding_window_counter() {
    evictions("sliding_window_counter");
}

/// **A give-back across a reload** (`reload`: a descriptor whose limits are unchanged keeps its
/// clients' state; requests finish on the configuration they started with; `decide`: a refused
/// request is charged to none). While the threads race, another thread reloads configurations
/// that change only the shared descriptor's limit: the clients' state is kept, and each client's
/// limit is charged exactly its OK answers.
fn reloads(method: &str) {
    let rt = runtime();
    let server = server(&rt, &base_yaml(method, ""), 4096);
    let other = RlsConfig::from_yaml_str(
        "other.yaml",
        &base_yaml(method, "").replace(
            &format!("requests_per_unit: {SHARED}}}"),
            &format!("requests_per_unit: {}}}", SHARED + 1),
        ),
    )
    .expect("valid");
    let first = RlsConfig::from_yaml_str("first.yaml", &base_yaml(method, "")).expect("valid");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloader = {
        let (server, stop) = (server.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            let rt = runtime();
            let mut reloads = 0_u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let config = if reloads.is_multiple_of(2) {
                    &other
                } else {
                    &first
                };
                rt.block_on(server.reload(config)).expect("a reload");
                reloads += 1;
                thread::yield_now();
            }
            reloads
        })
    };
    let (seen, _) = race(&server, 4, 2, Some(2), |thread, at| {
        request(vec![user(thread), round(at), tail(thread)])
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reloads = reloader.join().expect("the reloader");
    assert!(reloads > 0);
    for (thread, seen) in seen.iter().enumerate() {
        let oks = oks_of(seen);
        let charged = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            charged, oks,
            "{method}: across {reloads} reloads, u{thread} was charged {charged} for {oks} OKs"
        );
    }
}

#[test]
fn a_give_back_across_reloads_under_the_token_bucket() {
    reloads("token_bucket");
}

#[test]
fn a_give_back_across_reloads_under_the_fixed_window() {
    reloads("fixed_window");
}

#[test]
fn a_give_back_across_reloads_under_the_sliding_window_counter() {
    reloads("sliding_window_counter");
}

/// **Give-backs at window boundaries** (`decide`: "No limit ever grants more than it allows";
/// takings that move a window forward are taken last and given back exactly or off the window
/// they were counted in). Two shared descriptors of 5 per second and the client's own (per
/// year); the threads hammer them across a few window boundaries, where both shared takings roll
/// their windows and a refusal at the second gives back a grant that rolled the first. Each
/// grant is put in its window by the window's end the answer reports (the reset, from the
/// answer's instant: windows a second apart tell apart by far). No window of either shared
/// limit grants more than 5, and each client's own limit is charged exactly its OK answers.
fn boundaries(method: &str) {
    const PER_SECOND: u64 = 5;
    let rt = runtime();
    let yaml = format!(
        r#"
domain: race
method: {method}
descriptors:
  - key: a
    rate_limit: {{unit: second, requests_per_unit: {PER_SECOND}}}
  - key: b
    rate_limit: {{unit: second, requests_per_unit: {PER_SECOND}}}
  - key: user
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
"#
    );
    let server = server(&rt, &yaml, 4096);
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|thread| {
            let server = server.clone();
            thread::spawn(move || {
                let rt = runtime();
                let both = request(vec![one("a", "x"), one("b", "x"), user(thread)]);
                // (window end of a, window end of b) of each OK answer, in seconds from start.
                let mut ends = Vec::new();
                while started.elapsed() < std::time::Duration::from_millis(2_300) {
                    let response = decide(&rt, &server, &both);
                    if is_ok(&response) {
                        let at = started.elapsed().as_secs_f64();
                        let end = |status: usize| {
                            let reset = response.statuses[status]
                                .duration_until_reset
                                .expect("a reset");
                            at + reset.seconds as f64 + f64::from(reset.nanos) / 1e9
                        };
                        ends.push((end(0), end(1)));
                    }
                }
                ends
            })
        })
        .collect();
    let per_thread: Vec<Vec<(f64, f64)>> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect();
    let all: Vec<(f64, f64)> = per_thread.iter().flatten().copied().collect();
    assert!(!all.is_empty(), "{method}: some request passed");
    for (which, pick) in [("a", 0), ("b", 1)] {
        let end = |pair: &(f64, f64)| if pick == 0 { pair.0 } else { pair.1 };
        let base = end(&all[0]);
        let mut windows = std::collections::BTreeMap::<i64, u64>::new();
        for pair in &all {
            *windows
                .entry((end(pair) - base).round() as i64)
                .or_default() += 1;
        }
        for (window, granted) in &windows {
            assert!(
                *granted <= PER_SECOND,
                "{method}: shared limit {which} granted {granted} in window {window} \
                 (windows: {windows:?})"
            );
        }
    }
    for (thread, ends) in per_thread.iter().enumerate() {
        let oks = ends.len() as u64;
        let charged = charged(&rt, &server, user(thread), OWN, method);
        assert_eq!(
            charged, oks,
            "{method}: u{thread} was charged {charged} for {oks} OKs across window boundaries"
        );
    }
}

#[test]
fn window_boundaries_never_over_grant_under_the_fixed_window() {
    boundaries("fixed_window");
}

#[test]
fn window_boundaries_never_over_grant_under_the_sliding_window_counter() {
    boundaries("sliding_window_counter");
}

/// **Token bucket bursts across give-backs** (`decide`: "No limit ever grants more than it
/// allows"; the token bucket keeps permits it cannot give back exactly). Two shared buckets of
/// 5 per second and the client's own, hammered for about 2 s: a bucket grants at most
/// `5 + 5 * s` in a span of `s` seconds (the span measured around the whole run, so longer than
/// the service's), and each client's own bucket is charged at least its OK answers.
#[test]
fn token_bucket_bursts_never_over_grant() {
    let rt = runtime();
    let yaml = format!(
        r#"
domain: race
method: token_bucket
descriptors:
  - key: a
    rate_limit: {{unit: second, requests_per_unit: 5}}
  - key: b
    rate_limit: {{unit: second, requests_per_unit: 5}}
  - key: user
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
"#
    );
    let server = server(&rt, &yaml, 4096);
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|thread| {
            let server = server.clone();
            thread::spawn(move || {
                let rt = runtime();
                let both = request(vec![one("a", "x"), one("b", "x"), user(thread)]);
                let mut oks = 0_u64;
                while started.elapsed() < std::time::Duration::from_millis(2_000) {
                    oks += u64::from(is_ok(&decide(&rt, &server, &both)));
                }
                oks
            })
        })
        .collect();
    let per_thread: Vec<u64> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect();
    let span = started.elapsed().as_secs_f64();
    let total: u64 = per_thread.iter().sum();
    let bound = 5 + (5.0 * span).floor() as u64;
    assert!(
        total <= bound,
        "{total} grants in {span:.3} s, at most {bound}"
    );
    for (thread, oks) in per_thread.iter().enumerate() {
        let charged = charged(&rt, &server, user(thread), OWN, "token_bucket");
        assert_eq!(
            charged, *oks,
            "u{thread} was charged {charged} for {oks} OKs"
        );
    }
}

/// **No panic and no hang on extreme permits** (`decide` answers every well-formed request).
/// Repeated descriptors whose hits add past `u64::MAX`, 0 hits, a limit's exact worth, and
/// the most descriptors a request may have, all the same client, raced by four threads with a
/// shared descriptor.
#[test]
fn extreme_hits_and_many_repeats_neither_panic_nor_over_grant() {
    for method in METHODS {
        let rt = runtime();
        let server = server(&rt, &base_yaml(method, ""), 4096);
        let huge = request(vec![
            with_hits("user", "x", u64::MAX),
            with_hits("user", "x", u64::MAX),
            round(0),
        ]);
        let answer = decide(&rt, &server, &huge);
        assert!(!is_ok(&answer), "{method}: u64::MAX hits refused");
        let zero = request(vec![with_hits("user", "x", 0), with_hits("round", "z", 0)]);
        assert!(is_ok(&decide(&rt, &server, &zero)), "{method}: 0 hits pass");
        // 256 copies of one descriptor of 1 each, within a limit of 256: all or nothing.
        let yaml = base_yaml(
            method,
            "  - key: many\n    rate_limit: {unit: year, requests_per_unit: 300}\n",
        );
        let server = self::server(&rt, &yaml, 4096);
        let (seen, _) = race(&server, 4, 1, None, |thread, at| {
            let mut descriptors = vec![round(at)];
            descriptors.extend((0..254).map(|_| one("many", &format!("m{thread}"))));
            descriptors.push(tail(thread));
            request(descriptors)
        });
        check_rounds(&seen, 1, SHARED, method);
        for (thread, seen) in seen.iter().enumerate() {
            let oks = oks_of(seen);
            assert!(
                oks <= 1,
                "{method}: m{thread} passed {oks} requests of 254 of 300"
            );
            let (allowed, remaining) = lone(&rt, &server, one("many", &format!("m{thread}")));
            assert!(allowed);
            let charged = 300 - 1 - remaining;
            let fits = if method == "token_bucket" {
                charged >= 254 * oks
            } else {
                charged == 254 * oks
            };
            assert!(
                fits,
                "{method}: m{thread} charged {charged} for {oks} OKs of 254"
            );
        }
    }
}

/// **The answer reports every limited descriptor** (module docs, "The answer Envoy uses": each
/// descriptor's code, `current_limit`, `limit_remaining` and `duration_until_reset`). A request
/// refused at its look reports every descriptor's look; one refused at a taking after the look
/// reports the descriptors given back by their look, but those not yet taken (listed after the
/// refusing one) with an empty status: no `current_limit`, `limit_remaining` 0. Minor (the
/// overall code is right), but the two refusals answer differently.
#[test]
fn a_refusal_after_the_look_reports_every_limited_descriptor() {
    let rt = runtime();
    let server = server(&rt, &base_yaml("fixed_window", ""), 4096);
    let (_, after_look) = race(&server, 4, 2, Some(2), |thread, at| {
        request(vec![user(thread), round(at), tail(thread)])
    });
    assert_eq!(
        after_look, 0,
        "{after_look} refused answers left a limited descriptor (taken after the refusing one) \
         without current_limit"
    );
}
