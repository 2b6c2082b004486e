//! The service's metrics, through the `metrics` facade (the `tollgate-rls` binary installs the
//! Prometheus exporter; a program embedding the service installs the recorder it likes).
//!
//! Per limited descriptor, labelled `domain` and `descriptor` (its configured path, such as
//! `plan=free.user`), counted in hits as envoyproxy/ratelimit counts them:
//! - `tollgate_rls_hits_total`: every hit asked;
//! - `tollgate_rls_over_limit_total`: hits refused (a shadowed descriptor's too);
//! - `tollgate_rls_near_limit_total`: hits granted that left less than a fifth of the limit;
//! - `tollgate_rls_within_limit_total`: hits granted;
//! - `tollgate_rls_shadow_mode_total`: hits over the limit that shadow mode let through;
//!
//! and for the service: `tollgate_rls_decision_seconds` (a histogram of the time to decide one
//! request), `tollgate_rls_requests_total` labelled `code` (`ok`, `over_limit`, `error`) and
//! `tollgate_rls_config_reloads_total` labelled `result` (`ok`, `error`).
//!
//! A descriptor configured with `detailed_metric: true` adds a `values` label holding the
//! request's entry values: one series per value, so only for descriptors whose values are few.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use metrics::{Counter, Histogram, Label};

/// What one descriptor's decision counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Granted, with this many permits left after it, of this limit.
    Within { remaining: u64, limit: u64 },
    /// Refused (and answered as refused).
    OverLimit,
    /// Refused, but let through by shadow mode.
    Shadowed,
}

#[derive(Debug, Clone)]
struct Counters {
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

impl Counters {
    fn register(labels: &[Label]) -> Counters {
        Counters {
            hits: metrics::counter!("tollgate_rls_hits_total", labels.iter()),
            over_limit: metrics::counter!("tollgate_rls_over_limit_total", labels.iter()),
            near_limit: metrics::counter!("tollgate_rls_near_limit_total", labels.iter()),
            within_limit: metrics::counter!("tollgate_rls_within_limit_total", labels.iter()),
            shadow_mode: metrics::counter!("tollgate_rls_shadow_mode_total", labels.iter()),
        }
    }
}

/// One limited descriptor's counters, registered once when the configuration is made ready
/// (a decision then only adds to them), except under `detailed_metric`.
#[derive(Debug)]
pub(crate) struct DescriptorMetrics {
    domain: String,
    path: String,
    counters: Counters,
    detailed: bool,
}

impl DescriptorMetrics {
    pub(crate) fn new(domain: &str, path: &str, detailed: bool) -> DescriptorMetrics {
        let labels = [
            Label::new("domain", domain.to_owned()),
            Label::new("descriptor", path.to_owned()),
        ];
        DescriptorMetrics {
            domain: domain.to_owned(),
            path: path.to_owned(),
            counters: Counters::register(&labels),
            detailed,
        }
    }

    /// Counts `hits` of a request whose descriptor had `entries`.
    pub(crate) fn record(&self, entries: &[Entry], hits: u64, counted: Counted) {
        if self.detailed {
            let values: Vec<&str> = entries.iter().map(|entry| entry.value.as_str()).collect();
            let labels = [
                Label::new("domain", self.domain.clone()),
                Label::new("descriptor", self.path.clone()),
                Label::new("values", values.join(".")),
            ];
            add(&Counters::register(&labels), hits, counted);
        } else {
            add(&self.counters, hits, counted);
        }
    }
}

fn add(counters: &Counters, hits: u64, counted: Counted) {
    counters.hits.increment(hits);
    match counted {
        Counted::Within { remaining, limit } => {
            counters.within_limit.increment(hits);
            // Near: less than a fifth of the limit left (envoyproxy/ratelimit's 80% threshold).
            if remaining.saturating_mul(5) < limit {
                counters.near_limit.increment(hits);
            }
        }
        Counted::OverLimit => counters.over_limit.increment(hits),
        Counted::Shadowed => {
            counters.over_limit.increment(hits);
            counters.shadow_mode.increment(hits);
        }
    }
}

/// The service's own counters and latency histogram, registered once when it is built (a
/// recorder installed later is not seen by them: install it first, as `tollgate-rls` does).
#[derive(Debug)]
pub(crate) struct RequestMetrics {
    ok: Counter,
    over_limit: Counter,
    error: Counter,
    latency: Histogram,
}

impl RequestMetrics {
    pub(crate) fn register() -> RequestMetrics {
        RequestMetrics {
            ok: metrics::counter!("tollgate_rls_requests_total", "code" => "ok"),
            over_limit: metrics::counter!("tollgate_rls_requests_total", "code" => "over_limit"),
            error: metrics::counter!("tollgate_rls_requests_total", "code" => "error"),
            latency: metrics::histogram!("tollgate_rls_decision_seconds"),
        }
    }

    /// Counts one answered request (`over`: refused; `None`: an error) and the time it took.
    pub(crate) fn record(&self, over: Option<bool>, seconds: f64) {
        match over {
            Some(false) => self.ok.increment(1),
            Some(true) => self.over_limit.increment(1),
            None => self.error.increment(1),
        }
        self.latency.record(seconds);
    }
}

/// Counts one reload of the configuration.
pub(crate) fn record_reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!("tollgate_rls_config_reloads_total", "result" => result).increment(1);
}
