//! The Envoy rate-limit service's decisions, through its public API: matching as
//! envoyproxy/ratelimit matches, every descriptor all or nothing, shadow mode, `replaces`,
//! `unlimited`, a limit of 0, the answer's figures and fields, configuration mistakes named by
//! place, and a reload that keeps unchanged limits.

mod rls_support;

use rls_support::descriptor;
use tollgate::envoy::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;

const CONFIG: &str = r#"
domain: edge
method: token_bucket
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2, name: free-user}
  - key: plan
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    method: sliding_window_counter
    limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 100}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: vip
      replaces: [{name: free-user}]
"#;

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn server(yaml: &str) -> RateLimitServer {
    let config = RlsConfig::from_yaml_str("test.yaml", yaml).expect("the configuration is valid");
    RateLimitServer::new(&config, StateStore::InProcess { clients: 1024 })
        .await
        .expect("the service builds")
}

async fn decide(
    server: &RateLimitServer,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    server
        .decide(&request("edge", descriptors))
        .await
        .expect("the request is decided")
}

/// How many of `times` identical requests are answered OK.
async fn oks(server: &RateLimitServer, descriptors: &[RateLimitDescriptor], times: usize) -> usize {
    let mut ok = 0;
    for _ in 0..times {
        if decide(server, descriptors.to_vec()).await.overall_code == Code::Ok as i32 {
            ok += 1;
        }
    }
    ok
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key == name)
        .map(|header| header.value.as_str())
}

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).expect("a known code")
}

#[tokio::test]
async fn a_key_only_descriptor_gives_each_value_its_own_limit() {
    let server = server(CONFIG).await;
    let alice = [descriptor(&[("remote_address", "10.0.0.1")])];
    let bob = [descriptor(&[("remote_address", "10.0.0.2")])];
    assert_eq!(oks(&server, &alice, 10).await, 3);
    assert_eq!(oks(&server, &bob, 10).await, 3);
}

#[tokio::test]
async fn a_value_specific_descriptor_comes_before_the_key_alone_and_nested_entries_decide() {
    let server = server(CONFIG).await;
    // (plan, free), (user, u): the free plan's 2 per hour.
    let free = [descriptor(&[("plan", "free"), ("user", "u")])];
    assert_eq!(oks(&server, &free, 10).await, 2);
    // (plan, pro), (user, u): the key-only plan's 5 per hour, counted apart from free's.
    let pro = [descriptor(&[("plan", "pro"), ("user", "u")])];
    assert_eq!(oks(&server, &pro, 10).await, 5);
    // (plan, free) alone reaches a descriptor without a limit: never limited.
    let plan_only = [descriptor(&[("plan", "free")])];
    assert_eq!(oks(&server, &plan_only, 10).await, 10);
    // An entry below a descriptor without children: no match, no limit.
    let deeper = [descriptor(&[
        ("remote_address", "10.0.0.9"),
        ("extra", "x"),
    ])];
    assert_eq!(oks(&server, &deeper, 10).await, 10);
}

#[tokio::test]
async fn a_value_ending_in_a_star_matches_by_prefix_each_value_apart() {
    let server = server(CONFIG).await;
    assert_eq!(
        oks(&server, &[descriptor(&[("path", "/api/a")])], 10).await,
        4
    );
    assert_eq!(
        oks(&server, &[descriptor(&[("path", "/api/b")])], 10).await,
        4
    );
    assert_eq!(
        oks(&server, &[descriptor(&[("path", "/web")])], 10).await,
        10
    );
}

#[tokio::test]
async fn a_refused_request_charges_none_of_its_descriptors() {
    let server = server(CONFIG).await;
    let address = descriptor(&[("remote_address", "10.0.0.1")]);
    let user = descriptor(&[("plan", "free"), ("user", "carol")]);
    // Spend carol's 2 per hour.
    assert_eq!(oks(&server, std::slice::from_ref(&user), 2).await, 2);
    // Requests carrying the address and carol are refused by carol's limit...
    for _ in 0..5 {
        let answer = decide(&server, vec![address.clone(), user.clone()]).await;
        assert_eq!(answer.overall_code, Code::OverLimit as i32);
        assert_eq!(code(&answer.statuses[0]), Code::Ok);
        assert_eq!(code(&answer.statuses[1]), Code::OverLimit);
    }
    // ... and took nothing from the address: its 3 per minute are whole.
    assert_eq!(oks(&server, &[address], 10).await, 3);
}

#[tokio::test]
async fn hits_addend_takes_that_many_per_request_and_per_descriptor() {
    let server = server(CONFIG).await;
    let mut request = request("edge", vec![descriptor(&[("path", "/api/x")])]);
    request.hits_addend = 3;
    let first = server.decide(&request).await.unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses[0].limit_remaining, 1);
    // 3 more do not fit in the 1 left.
    assert_eq!(
        server.decide(&request).await.unwrap().overall_code,
        Code::OverLimit as i32
    );
    // A descriptor's own hits_addend overrides the request's.
    let mut one = descriptor(&[("path", "/api/x")]);
    one.hits_addend = Some(UInt64Value { value: 1 });
    request.descriptors = vec![one];
    assert_eq!(
        server.decide(&request).await.unwrap().overall_code,
        Code::Ok as i32
    );
}

#[tokio::test]
async fn shadow_mode_answers_ok_past_the_limit() {
    let server = server(CONFIG).await;
    let login = [descriptor(&[("path", "/login")])];
    assert_eq!(oks(&server, &login, 5).await, 5);
    let answer = decide(&server, login.to_vec()).await;
    assert_eq!(code(&answer.statuses[0]), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    // A shadowed limit is not shown to clients.
    assert_eq!(header(&answer, "ratelimit"), None);
}

#[tokio::test]
async fn unlimited_and_zero_limits_answer_as_envoyproxy_ratelimit_does() {
    let server = server(CONFIG).await;
    assert_eq!(
        oks(&server, &[descriptor(&[("internal", "a")])], 50).await,
        50
    );
    assert_eq!(oks(&server, &[descriptor(&[("banned", "a")])], 5).await, 0);
    // A banned descriptor beside another refuses the request and charges the other nothing.
    let address = descriptor(&[("remote_address", "10.9.9.9")]);
    let answer = decide(
        &server,
        vec![address.clone(), descriptor(&[("banned", "a")])],
    )
    .await;
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    assert_eq!(oks(&server, &[address], 10).await, 3);
}

#[tokio::test]
async fn a_limit_that_replaces_another_leaves_it_unapplied() {
    let server = server(CONFIG).await;
    let user = descriptor(&[("plan", "free"), ("user", "dave")]);
    let vip = descriptor(&[("vip", "dave")]);
    // With the vip limit beside it, free-user's 2 per hour do not apply: vip's 10 do.
    assert_eq!(oks(&server, &[user.clone(), vip], 20).await, 10);
    // Alone, free-user's limit applies, and was not charged while it was replaced.
    assert_eq!(oks(&server, &[user], 10).await, 2);
}

#[tokio::test]
async fn several_limits_on_one_descriptor_are_enforced_together_and_reported_each() {
    let server = server(CONFIG).await;
    let tenant = [descriptor(&[("tenant", "t1")])];
    let answer = decide(&server, tenant.to_vec()).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let policy = header(&answer, "ratelimit-policy").expect("the policy field");
    assert_eq!(policy, r#""tenant-1s";q=2;w=1, "tenant-1h";q=100;w=3600"#);
    let state = header(&answer, "ratelimit").expect("the state field");
    assert!(state.starts_with(r#""tenant-1s";r=1;t="#), "{state}");
    assert!(state.contains(r#""tenant-1h";r=99;t="#), "{state}");
    // The second-long limit refuses the third request within the second.
    assert_eq!(oks(&server, &tenant, 5).await, 1);
}

#[tokio::test]
async fn the_answer_carries_the_limit_the_remaining_the_reset_and_retry_after() {
    let server = server(CONFIG).await;
    let address = [descriptor(&[("remote_address", "10.1.1.1")])];
    let first = decide(&server, address.to_vec()).await;
    let status = &first.statuses[0];
    let limit = status.current_limit.as_ref().expect("the current limit");
    assert_eq!(limit.requests_per_unit, 3);
    assert_eq!(limit.unit, 2, "MINUTE");
    assert_eq!(status.limit_remaining, 2);
    assert!(status.duration_until_reset.is_some());
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some(r#""remote_address";q=3;w=60"#)
    );
    assert_eq!(header(&first, "retry-after"), None);
    oks(&server, &address, 2).await;
    let refused = decide(&server, address.to_vec()).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    // One token of 3 per minute refills in 20 s.
    assert_eq!(header(&refused, "retry-after"), Some("20"));
}

#[tokio::test]
async fn unknown_domains_limit_nothing_and_empty_requests_are_refused_as_invalid() {
    let server = server(CONFIG).await;
    let answer = server
        .decide(&request(
            "other",
            vec![descriptor(&[("remote_address", "a")])],
        ))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let error = server
        .decide(&request("", vec![descriptor(&[("a", "b")])]))
        .await;
    assert_eq!(error.unwrap_err().code(), tonic::Code::InvalidArgument);
    let error = server.decide(&request("edge", Vec::new())).await;
    assert_eq!(error.unwrap_err().code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn a_reload_keeps_the_state_of_unchanged_limits_and_starts_changed_ones_afresh() {
    let server = server(CONFIG).await;
    let address = [descriptor(&[("remote_address", "10.2.2.2")])];
    let api = [descriptor(&[("path", "/api/z")])];
    assert_eq!(oks(&server, &address, 3).await, 3);
    assert_eq!(oks(&server, &api, 4).await, 4);
    // The same configuration, but /api/* now allows 6 per minute.
    let changed = CONFIG.replace(
        "value: /api/*\n    rate_limit: {unit: minute, requests_per_unit: 4}",
        "value: /api/*\n    rate_limit: {unit: minute, requests_per_unit: 6}",
    );
    assert_ne!(changed, CONFIG);
    let config = RlsConfig::from_yaml_str("changed.yaml", &changed).unwrap();
    server.reload(&config).await.unwrap();
    // The address's limit did not change: still spent.
    assert_eq!(oks(&server, &address, 5).await, 0);
    // /api/*'s did: it starts afresh under its new limit.
    assert_eq!(oks(&server, &api, 10).await, 6);
}

#[test]
fn configuration_mistakes_name_their_place() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "test.yaml: domain \"d\": descriptors[0] (a): rate_limit.unit",
            "is not a unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
            "descriptors[0] (a): rate_limit.requests_per_unit",
            "missing",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        limits: [{unit: second, requests_per_unit: 1}, {unit: second, requests_per_unit: 1}]\n",
            "descriptors[0] (a=x).descriptors[0] (b): limits[1]",
            "the same limit is given twice",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "descriptors[1] (a)",
            "the same key and value as descriptors[0]",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
            "test.yaml: document 1",
            "unknown field `rate_limt`",
        ),
        (
            "domain: d\nmethod: leaky\ndescriptors: []\n",
            "test.yaml: domain \"d\": method",
            "leaky",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: nobody}]}\n",
            "descriptor a: replaces",
            "no limit of this domain is named \"nobody\"",
        ),
        (
            "domain: d\ndescriptors: []\n---\ndomain: d\ndescriptors: []\n",
            "test.yaml: domain \"d\"",
            "configured twice",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    method: sliding_window_log\n    limits: [{unit: second, requests_per_unit: 1}, {unit: hour, requests_per_unit: 9}]\n",
            "descriptors[0] (a): limits",
            "the sliding window log takes one limit per descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 5000000000, unit: second}\n",
            "rate_limit.requests_per_unit",
            "the most Envoy's answer can carry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "rate_limit.unlimited",
            "takes no `unit`",
        ),
    ];
    for (yaml, place, message) in cases {
        let error = RlsConfig::from_yaml_str("test.yaml", yaml).expect_err(yaml);
        assert!(
            error.place().contains(place),
            "place {:?} for {yaml}",
            error.place()
        );
        assert!(
            error.message().contains(message),
            "message {:?} for {yaml}",
            error.message()
        );
    }
}

#[tokio::test]
async fn a_descriptor_that_cannot_be_built_is_named() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let config = RlsConfig::from_yaml_str("test.yaml", yaml).unwrap();
    let error = RateLimitServer::new(&config, StateStore::InProcess { clients: 0 })
        .await
        .expect_err("a descriptor cannot hold 0 clients");
    let message = error.to_string();
    assert!(
        message.starts_with("domain \"d\": descriptor a: "),
        "{message}"
    );
}

/// The ```yaml blocks of the README that configure the service (those with a `domain:`).
fn readme_configurations() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in readme.lines() {
        match open.take() {
            None if line.trim() == "```yaml" => open = Some(String::new()),
            None => {}
            Some(block) if line.trim() == "```" => blocks.push(block),
            Some(mut block) => {
                block.push_str(line);
                block.push('\n');
                open = Some(block);
            }
        }
    }
    blocks.retain(|block| block.starts_with("domain:"));
    blocks
}

#[tokio::test]
async fn the_readme_and_example_configurations_load_and_serve() {
    let blocks = readme_configurations();
    assert!(!blocks.is_empty(), "the README shows a configuration");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy/ratelimit.yaml");
    let mut configs = vec![RlsConfig::from_path(example).expect("the example loads")];
    for block in &blocks {
        configs.push(RlsConfig::from_yaml_str("README.md", block).expect("the README's loads"));
    }
    for config in configs {
        RateLimitServer::new(&config, StateStore::InProcess { clients: 16 })
            .await
            .expect("it builds");
    }
}

/// The reference the service is held to, request by request, for one thread: envoyproxy's
/// matching on a small configuration, each limit a count of permits taken (hour-long token
/// buckets refill nothing within a test), and a request granted only if every limit that is not
/// shadowed can take what the whole request asks of it, then charged to each; else charged to
/// none.
mod reference {
    use std::collections::HashMap;

    pub(super) const CONFIG: &str = "\
domain: edge
method: token_bucket
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: b
    value: x
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: c
    descriptors:
      - key: d
        rate_limit: {unit: hour, requests_per_unit: 4}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: z
    rate_limit: {unit: hour, requests_per_unit: 0}
";

    /// A descriptor of the generated requests: its entries, its hits, and the limit it brings
    /// (requests per hour), if any.
    pub(super) type Descriptor = (Vec<(&'static str, String)>, u64, Option<u32>);

    /// The limit a descriptor reaches: (name, limit, shadowed), with its client. A brought
    /// limit applies in place of any configured one, never shadowed, per limit and entries.
    fn limit_of(
        entries: &[(&'static str, String)],
        brought: Option<u32>,
    ) -> Option<((&'static str, u64, bool), String)> {
        let values: Vec<&str> = entries.iter().map(|(_, value)| value.as_str()).collect();
        let keys: Vec<&str> = entries.iter().map(|(key, _)| *key).collect();
        if let Some(limit) = brought {
            let name = ["brought 0", "brought 1", "brought 2"][limit as usize];
            return Some(((name, u64::from(limit), false), format!("{entries:?}")));
        }
        let client = values.join("\u{0}");
        let limit = match (keys.as_slice(), values.as_slice()) {
            (["a"], _) => ("a", 3, false),
            (["b"], ["x"]) => ("b", 2, false),
            (["c", "d"], _) => ("cd", 4, false),
            (["s"], _) => ("s", 1, true),
            (["z"], _) => ("z", 0, false),
            _ => return None,
        };
        Some((limit, client))
    }

    #[derive(Default)]
    pub(super) struct Model {
        taken: HashMap<(&'static str, String), u64>,
    }

    impl Model {
        /// Whether the request is granted; charges it if so.
        pub(super) fn decide(&mut self, request: &[Descriptor]) -> bool {
            let matched: Vec<_> = request
                .iter()
                .filter_map(|(entries, hits, brought)| {
                    limit_of(entries, *brought).map(|found| (found, *hits))
                })
                .collect();
            let mut asked: HashMap<(&'static str, String), u64> = HashMap::new();
            for (((name, _, _), client), hits) in &matched {
                *asked.entry((name, client.clone())).or_default() += hits;
            }
            let refused = matched
                .iter()
                .any(|(((name, limit, shadowed), client), _)| {
                    let key = (*name, client.clone());
                    let taken = self.taken.get(&key).copied().unwrap_or(0);
                    !shadowed && asked[&key] > 0 && taken + asked[&key] > *limit
                });
            if refused {
                return false;
            }
            for (((name, limit, _), client), hits) in matched {
                let taken = self.taken.entry((name, client)).or_default();
                // A shadowed limit takes only what fits; others always fit here.
                if *taken + hits <= limit {
                    *taken += hits;
                }
            }
            true
        }
    }
}

fn generated_descriptor() -> impl proptest::strategy::Strategy<Value = reference::Descriptor> {
    use proptest::prelude::*;
    let value = || prop::sample::select(vec!["1", "2"]).prop_map(str::to_owned);
    let entries = prop_oneof![
        value().prop_map(|v| vec![("a", v)]),
        prop::sample::select(vec!["x", "y"]).prop_map(|v| vec![("b", v.to_owned())]),
        (value(), value()).prop_map(|(c, d)| vec![("c", c), ("d", d)]),
        value().prop_map(|v| vec![("c", v)]),
        value().prop_map(|v| vec![("s", v)]),
        value().prop_map(|v| vec![("z", v)]),
    ];
    // Now and then a descriptor brings its own limit: 0, 1 or 2 per hour.
    let brought = prop_oneof![3 => Just(None), 1 => (0u32..=2).prop_map(Some)];
    (entries, 0u64..=3, brought)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// The service answers as the reference for every request of a random sequence: requests of
    /// one to four descriptors, the same descriptor repeated, shadowed and refusing ones mixed
    /// in, hits of 0 to 3, some bringing their own limits.
    #[test]
    fn the_service_decides_as_the_all_or_nothing_reference(
        requests in proptest::collection::vec(proptest::collection::vec(generated_descriptor(), 1..=4), 1..40)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let server = server(reference::CONFIG).await;
            let mut model = reference::Model::default();
            for (step, request) in requests.iter().enumerate() {
                let descriptors = request
                    .iter()
                    .map(|(entries, hits, brought)| {
                        let pairs: Vec<(&str, &str)> =
                            entries.iter().map(|(k, v)| (*k, v.as_str())).collect();
                        let mut made = descriptor(&pairs);
                        made.hits_addend = Some(UInt64Value { value: *hits });
                        made.limit = brought.map(|requests_per_unit| RateLimitOverride {
                            requests_per_unit,
                            // HOUR
                            unit: 3,
                        });
                        made
                    })
                    .collect();
                let granted = decide(&server, descriptors).await.overall_code == Code::Ok as i32;
                let expected = model.decide(request);
                proptest::prop_assert_eq!(granted, expected, "step {}: {:?}", step, request);
            }
            Ok(())
        })?;
    }
}

/// A descriptor with `is_negative_hits` refunds its permits to its client's state, by each
/// method's own rule: the windows and the bucket take them back (never past a fresh state:
/// a refund to an unspent client changes nothing), the sliding log takes nothing back.
#[tokio::test]
async fn a_negative_hits_descriptor_refunds_up_to_what_was_taken() {
    for (method, refunded) in [
        ("token_bucket", 2),
        ("fixed_window", 2),
        ("sliding_window_counter", 2),
        ("sliding_window_log", 0),
    ] {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 3}}\n"
        );
        let server = server(&yaml).await;
        let user = descriptor(&[("user", "ann")]);
        let refund = |n: u64| {
            let mut refund = descriptor(&[("user", "ann")]);
            refund.hits_addend = Some(UInt64Value { value: n });
            refund.is_negative_hits = true;
            refund
        };
        // A refund to a client that has taken nothing gives it nothing more.
        let answer = decide(&server, vec![refund(5)]).await;
        assert_eq!(answer.overall_code, Code::Ok as i32, "{method}");
        assert_eq!(
            oks(&server, std::slice::from_ref(&user), 5).await,
            3,
            "{method}"
        );
        // Spent: a refund of 2 gives back 2 (none under the sliding log).
        let answer = decide(&server, vec![refund(2)]).await;
        assert_eq!(answer.overall_code, Code::Ok as i32, "{method}");
        assert_eq!(
            oks(&server, std::slice::from_ref(&user), 5).await,
            refunded,
            "{method}: permits after a refund of 2"
        );
        // A refund larger than what was taken fills the limit, no more.
        decide(&server, vec![refund(100)]).await;
        let expected = if refunded == 0 { 0 } else { 3 };
        assert_eq!(
            oks(&server, std::slice::from_ref(&user), 5).await,
            expected,
            "{method}: a refund past what was taken"
        );
    }
}
