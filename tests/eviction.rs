//! A proxy keyed by client address sees endless new clients: with the sweeper on, a million
//! passing clients leave the map and the process's memory bounded, while threads hammering a few
//! hot clients never get more than their limit. In a file of its own so that no other test's
//! allocations blur the process's resident memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, Sweeper};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
}

type Service = RateLimiterService<u64, Plan, FakeClock>;

/// Resident memory of this process, in bytes (Linux); `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn a_million_passing_clients_leave_memory_bounded_while_hot_clients_stay_within_their_limit() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let window = Duration::from_millis(100);
        let service: Arc<Service> = Arc::new(
            RateLimiterService::new(
                algorithm,
                [
                    (Plan::Free, Rule::new(4, window).unwrap()),
                    (Plan::Pro, Rule::new(5, window).unwrap()),
                ],
                clock.clone(),
            )
            .unwrap(),
        );
        let sweeper = Sweeper::start(&service, Duration::from_millis(1)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        // Two hot clients, hammered from two threads each; every admission is recorded with the
        // clock readings around it (the fake clock only moves forward).
        let hot: Vec<_> = (0..4u64)
            .map(|thread| {
                let (service, stop, clock) =
                    (Arc::clone(&service), Arc::clone(&stop), clock.clone());
                std::thread::spawn(move || {
                    let client = u64::MAX - thread % 2;
                    let mut admissions = Vec::new();
                    // Relaxed: a stop flag; the join orders the result.
                    while !stop.load(Ordering::Relaxed) {
                        let before = clock.now_nanos();
                        if service.allow(&client, &Plan::Pro).unwrap() {
                            admissions.push((client, before, clock.now_nanos()));
                        }
                    }
                    admissions
                })
            })
            .collect();

        let base = resident_bytes();
        let mut most_held = 0;
        for client in 0..1_000_000u64 {
            assert!(service.allow(&client, &Plan::Free).unwrap());
            if client % 10_000 == 9_999 {
                // Every 10,000 new clients a window passes, so the earlier ones become idle.
                clock.advance(window);
                most_held = most_held.max(service.len());
                // The sweeper must keep up: on a busy machine, wait for it (within a deadline)
                // rather than outrun it with inserts it has had no CPU time to match.
                let deadline = Instant::now() + Duration::from_secs(10);
                while service.len() > 50_000 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(
                    service.len() <= 50_000,
                    "{algorithm}: the sweeper left {} clients after 10 s",
                    service.len()
                );
            }
        }
        let grown = resident_bytes()
            .zip(base)
            .map(|(now, base)| now.saturating_sub(base));
        stop.store(true, Ordering::Relaxed);
        let admissions: Vec<_> = hot.into_iter().flat_map(|h| h.join().unwrap()).collect();
        drop(sweeper);

        eprintln!(
            "{algorithm}: at most {most_held} clients held, resident memory grew {grown:?} bytes, \
             {} hot admissions",
            admissions.len()
        );
        assert!(
            most_held <= 60_000,
            "{algorithm}: the map held {most_held} clients at once"
        );
        if let Some(grown) = grown {
            // A million live token buckets take about 80 MB here; the churn must stay well under
            // half of that.
            assert!(
                grown < 40 << 20,
                "{algorithm}: resident memory grew {grown} bytes"
            );
        }
        clock.advance(window);
        service.sweep();
        assert!(service.len() <= 2, "{algorithm}: {} left", service.len());

        // No hot client ever got more than the method allows in one window's span.
        let per_span_bound = match algorithm {
            Algorithm::SlidingWindowLog => 5,
            _ => 10,
        };
        let window = window.as_nanos() as u64;
        for &(client, start, _) in &admissions {
            let within = admissions
                .iter()
                .filter(|&&(other, before, after)| {
                    other == client && before >= start && after < start + window
                })
                .count();
            assert!(
                within <= per_span_bound,
                "{algorithm}: {within} admissions for one client within one window"
            );
        }
        assert!(!admissions.is_empty());
    }
}
