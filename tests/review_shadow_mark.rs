//! A shadow mark written by a client never reaches the upstream, whatever becomes of the request,
//! and a request shadow mode lets through over its limit reaches it with the layer's own mark
//! alone.
//!
//! Each test drives the layer's `tower::Service` with `http::Request`s over an upstream that
//! records the header fields it receives, and compares them with the client's fields (the mark
//! left out, or replaced by the layer's). Every request is sent in many layouts: the mark absent
//! or with 1, 2 or 100 values, among 0 to 100 other fields (either side of the 16 distinct names
//! up to which the layer compares names before the map's own lookup), first, in the middle, last
//! or spread among them; the other fields include names that share the mark's prefix or length;
//! every name is spelled in lower, upper and mixed case, as clients write them. The mark is the
//! default `x-ratelimit-shadowed`, the standard name `forwarded`, or a custom name longer than
//! 64 bytes. Every path is taken: allowed, shadowed, allowed in shadow mode, not sampled, without
//! a key, failed check let through, checked later (a backend that answers after a yield), and
//! refused.
//!
//! The fake clock is never moved: `free` allows 5 requests, `open` more than the tests send.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::FORWARDED;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Empty;
use tollgate::tower::{
    ClientKey, Fallback, Figures, GlobalKey, HeaderKey, KeyExtractor, RateLimitBackend,
    RateLimitLayer, RateLimitLayerBuilder, RateLimitStats, ResponseBody, SHADOWED_HEADER, Shadow,
    Verdict,
};
use tollgate::{FakeClock, RateLimiterService, ServiceError, Settings};
use tower::{Layer as _, Service, ServiceExt};

type Backend = Arc<RateLimiterService<ClientKey, &'static str, FakeClock>>;

const FREE_LIMIT: usize = 5;
/// The mark the layer writes for a request over `free` (no token back for 1 s).
const LAYERS_MARK: &str = r#""free";r=0;t=1"#;
/// The key `HeaderKey` reads in the tests of requests without a key (never sent).
const API_KEY: &str = "x-api-key";

const SETTINGS: &str = r#"
    algorithm = "token_bucket"

    [plans.free]
    limit = 5
    window = "1s"

    [plans.open]
    limit = 1000000
    window = "1s"
"#;

/// The names the shadow mark is given: the default, a standard name, and a custom name longer
/// than the 64 bytes `HeaderName` parses on the stack.
fn mark_names() -> [HeaderName; 3] {
    [
        SHADOWED_HEADER,
        FORWARDED,
        HeaderName::from_static(
            "x-ratelimit-shadowed-by-the-edge-proxy-of-the-eu-west-region-cluster-seven",
        ),
    ]
}

/// A layer builder limiting every request by `plan`, whose shadow mark is `mark` (left to the
/// default when `mark` is the default name).
fn builder<X: KeyExtractor<Key = ClientKey>>(
    extractor: X,
    plan: &'static str,
    mark: &HeaderName,
) -> RateLimitLayerBuilder<Backend, X, &'static str> {
    let settings = Settings::from_toml_str(SETTINGS).expect("the settings are valid");
    let builder = RateLimitLayer::from_settings(
        &settings,
        FakeClock::new(),
        [("free", "free"), ("open", "open")],
        extractor,
        plan,
    )
    .expect("the settings have plans free and open")
    .without_sweep();
    if *mark == SHADOWED_HEADER {
        builder
    } else {
        builder.shadow_header(mark.clone())
    }
}

/// The upstream: answers 200 and records the header fields of every request it receives.
#[derive(Debug, Clone, Default)]
struct Upstream(Arc<Mutex<Vec<HeaderMap>>>);

impl Upstream {
    /// The fields of the requests received since the last call.
    fn received(&self) -> Vec<HeaderMap> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Service<Request<()>> for Upstream {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<()>) -> Self::Future {
        self.0.lock().unwrap().push(request.headers().clone());
        ready(Ok(Response::new(Empty::new())))
    }
}

/// A backend that answers only after yielding to the runtime once, as one over the network
/// would: the layer then checks the request out of line.
#[derive(Debug, Clone)]
struct Deferred(Backend);

impl RateLimitBackend<ClientKey, &'static str> for Deferred {
    type Error = ServiceError;
    type Future = Pin<Box<dyn Future<Output = Result<Verdict, ServiceError>> + Send>>;

    fn check(&self, key: &ClientKey, plan: &&'static str, cost: u64, _: Figures) -> Self::Future {
        let (service, key, plan) = (Arc::clone(&self.0), key.clone(), *plan);
        Box::pin(async move {
            tokio::task::yield_now().await;
            service.acquire(&key, &plan, cost).map(Into::into)
        })
    }
}

/// How a client spells a field's name.
#[derive(Debug, Clone, Copy)]
enum Case {
    Lower,
    Upper,
    /// `X-Ratelimit-Shadowed`.
    Title,
}

/// `name` as a client in `case` writes it.
fn spelled(name: &str, case: Case) -> String {
    match case {
        Case::Lower => name.to_owned(),
        Case::Upper => name.to_ascii_uppercase(),
        Case::Title => {
            let mut start = true;
            name.chars()
                .map(|c| {
                    let c = if start { c.to_ascii_uppercase() } else { c };
                    start = c == '-';
                    c
                })
                .collect()
        }
    }
}

/// Where the mark's fields are among the others.
#[derive(Debug, Clone, Copy)]
enum Place {
    First,
    Middle,
    Last,
    /// The first at the start, the others spread evenly to the end.
    Spread,
}

/// Names other than `mark` a request may carry: some that share its length or a prefix with it
/// (or have it for a prefix), some standard, then `x-filler-<n>`; neither the mark nor
/// [`API_KEY`].
fn other_names(mark: &str, count: usize) -> Vec<String> {
    let (head, last) = mark.split_at(mark.len() - 1);
    let tricky = [
        format!("{head}{}", if last == "x" { "y" } else { "x" }),
        head.to_owned(),
        format!("{mark}-x"),
        format!("{mark}x"),
        format!(
            "{}{}",
            if mark.starts_with('y') { "z" } else { "y" },
            &mark[1..]
        ),
        "x-ratelimit-shadowed".to_owned(),
        "forwarded".to_owned(),
        "x-forwarded-for".to_owned(),
        "accept".to_owned(),
        "host".to_owned(),
        "user-agent".to_owned(),
        "cookie".to_owned(),
    ];
    let mut names: Vec<String> = Vec::new();
    for name in tricky
        .into_iter()
        .chain((0..).map(|n| format!("x-filler-{n}")))
    {
        if names.len() == count {
            break;
        }
        if name != mark && name != API_KEY && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// A client's request: its fields in the order it wrote them.
#[derive(Debug)]
struct Fields {
    /// `(is the mark, name as spelled, value)`.
    fields: Vec<(bool, String, String)>,
    what: String,
}

impl Fields {
    /// `others` distinct names other than `mark`, `per_name` values each, and `marks` values
    /// of `mark` placed at `place`, every name spelled in `case`. The mark's first value is
    /// the very value the layer writes, the others `forged-<n>`.
    fn new(
        mark: &HeaderName,
        (others, per_name): (usize, usize),
        marks: usize,
        place: Place,
        case: Case,
    ) -> Self {
        let mut fields: Vec<(bool, String, String)> = Vec::new();
        for round in 0..per_name {
            for name in other_names(mark.as_str(), others) {
                fields.push((false, spelled(&name, case), format!("{round}")));
            }
        }
        let total = fields.len();
        for n in 0..marks {
            let at = match place {
                Place::First => n,
                Place::Middle => total / 2 + n,
                Place::Last => total + n,
                Place::Spread => n * total / marks + n,
            };
            let value = if n == 0 {
                LAYERS_MARK.to_owned()
            } else {
                format!("forged-{n}")
            };
            fields.insert(at, (true, spelled(mark.as_str(), case), value));
        }
        let what = format!(
            "{marks} values of {mark} at {place:?} among {others} other names \
             ({per_name} values each), spelled {case:?}"
        );
        Fields { fields, what }
    }

    /// The request the client sends.
    fn request(&self) -> Request<()> {
        let mut request = Request::get("/");
        for (_, name, value) in &self.fields {
            request = request.header(name, value);
        }
        request.body(()).unwrap()
    }

    /// Its fields as they should reach the upstream: all but the mark's, in the order written.
    fn without_mark(&self) -> HeaderMap {
        let mut expected = HeaderMap::new();
        for (_, name, value) in self.fields.iter().filter(|(mark, ..)| !mark) {
            expected.append(
                HeaderName::try_from(name.as_str()).unwrap(),
                HeaderValue::try_from(value.as_str()).unwrap(),
            );
        }
        expected
    }
}

/// Every layout of a request: the mark's values, where they are, the other fields, the case.
fn layouts(mark: &HeaderName) -> Vec<Fields> {
    // Distinct other names and values each: with the mark, the map has up to 16 distinct names
    // (its names compared) or more (its lookup).
    let others = [
        (0, 1),
        (1, 1),
        (1, 100),
        (14, 1),
        (15, 1),
        (15, 3),
        (16, 1),
        (16, 3),
        (17, 1),
        (17, 2),
        (100, 1),
        (100, 2),
    ];
    let mut layouts = Vec::new();
    for other in others {
        for marks in [0, 1, 2, 100] {
            for place in [Place::First, Place::Middle, Place::Last, Place::Spread] {
                for case in [Case::Lower, Case::Upper, Case::Title] {
                    layouts.push(Fields::new(mark, other, marks, place, case));
                }
            }
        }
    }
    layouts
}

/// What becomes of each request after the warm-up.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Reaches the upstream with every field but the client's mark.
    Stripped,
    /// Reaches the upstream with every field but the client's mark, and the layer's mark.
    LayersMark,
    /// Answered by the layer with this status; the upstream never sees it.
    Refused(StatusCode),
}

/// Sends `request` through `service`: the answer's status, and the fields the upstream received
/// (`None` when it was not called).
async fn send<S>(
    service: &mut S,
    upstream: &Upstream,
    request: Request<()>,
) -> (StatusCode, Option<HeaderMap>)
where
    S: Service<Request<()>, Response = Response<ResponseBody<Empty<Bytes>>>, Error = Infallible>,
{
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let mut received = upstream.received();
    assert!(
        received.len() <= 1,
        "the upstream was called {} times",
        received.len()
    );
    (response.status(), received.pop())
}

/// For each mark name, builds the layer with `layer`, sends `warm_up` requests without fields
/// (each reaches the upstream unmarked), then every layout, which must fare as `expect` says
/// and each be counted in the layer's stats by `counted` (so that the path is the one meant).
async fn every_layout<Bk, X>(
    layer: impl Fn(&HeaderName) -> RateLimitLayer<Bk, X, &'static str>,
    warm_up: usize,
    expect: Expect,
    counted: fn(&RateLimitStats) -> u64,
) where
    Bk: RateLimitBackend<ClientKey, &'static str> + Send + Sync + 'static,
    Bk::Future: Send + 'static,
    X: KeyExtractor<Key = ClientKey> + Send + Sync + 'static,
{
    for mark in mark_names() {
        let upstream = Upstream::default();
        let mut service = layer(&mark).layer(upstream.clone());
        for n in 0..warm_up {
            let request = Request::get("/").body(()).unwrap();
            let (status, received) = send(&mut service, &upstream, request).await;
            assert_eq!(status, StatusCode::OK, "warm-up request {n}");
            assert_eq!(received, Some(HeaderMap::new()), "warm-up request {n}");
        }
        let before = service.stats();
        let layouts = layouts(&mark);
        for fields in &layouts {
            let request = fields.request();
            let sent = request.headers().get_all(&mark).iter().count();
            let marks = fields.fields.iter().filter(|(mark, ..)| *mark).count();
            assert_eq!(sent, marks, "the client's mark is sent: {}", fields.what);
            let (status, received) = send(&mut service, &upstream, request).await;
            match expect {
                Expect::Stripped | Expect::LayersMark => {
                    let mut expected = fields.without_mark();
                    if let Expect::LayersMark = expect {
                        expected.insert(&mark, HeaderValue::from_static(LAYERS_MARK));
                    }
                    assert_eq!(status, StatusCode::OK, "{}", fields.what);
                    let received = received.unwrap_or_else(|| panic!("not sent: {}", fields.what));
                    let values: Vec<_> = received.get_all(&mark).iter().collect();
                    let own: &[&str] = match expect {
                        Expect::LayersMark => &[LAYERS_MARK],
                        _ => &[],
                    };
                    assert_eq!(values, own, "the upstream's marks: {}", fields.what);
                    assert_eq!(received, expected, "the upstream's fields: {}", fields.what);
                }
                Expect::Refused(refusal) => {
                    assert_eq!(status, refusal, "{}", fields.what);
                    assert_eq!(received, None, "refused, yet sent: {}", fields.what);
                }
            }
        }
        let after = service.stats();
        let sent = layouts.len() as u64;
        assert_eq!(after.requests - before.requests, sent, "{mark}");
        assert_eq!(
            counted(&after) - counted(&before),
            sent,
            "{mark}: {after:?}"
        );
    }
}

/// The names a client writes in any case are the names the layer is given: `HeaderName`
/// lowers them, standard or not, short or longer than 64 bytes, on the client's side as on the
/// side of the layer's settings (a mark named in mixed case is written and stripped in lower
/// case).
#[tokio::test]
async fn a_name_in_any_case_is_the_name_the_layer_is_given() {
    for mark in mark_names() {
        for case in [Case::Lower, Case::Upper, Case::Title] {
            let name = spelled(mark.as_str(), case);
            assert_eq!(HeaderName::try_from(name.as_str()).unwrap(), mark, "{name}");
            let request = Request::get("/").header(&name, "forged").body(()).unwrap();
            assert_eq!(request.headers().get(&mark).unwrap(), "forged", "{name}");
        }
    }
    assert_eq!(HeaderName::try_from("Forwarded").unwrap(), FORWARDED);

    // A mark named in mixed case by the server's own settings.
    let named = HeaderName::from_bytes(b"X-Would-Be-Limited").unwrap();
    assert_eq!(named.as_str(), "x-would-be-limited");
    let layer = builder(GlobalKey, "free", &named)
        .shadow(Shadow::new(1.0, 0.0))
        .build();
    let upstream = Upstream::default();
    let mut service = layer.layer(upstream.clone());
    let forged = || {
        Request::get("/")
            .header("X-WOULD-BE-LIMITED", "forged")
            .header("x-would-be-limited", LAYERS_MARK)
            .body(())
            .unwrap()
    };
    for n in 0..FREE_LIMIT + 2 {
        let (status, received) = send(&mut service, &upstream, forged()).await;
        assert_eq!(status, StatusCode::OK, "request {n}");
        let received = received.unwrap();
        let marks: Vec<_> = received.get_all("x-would-be-limited").iter().collect();
        let own: &[&str] = if n < FREE_LIMIT { &[] } else { &[LAYERS_MARK] };
        assert_eq!(marks, own, "request {n}");
        assert_eq!(received.len(), own.len(), "request {n}");
    }
}

/// Enforcing, within the limit: the request reaches the upstream without the client's mark and
/// with every other field, with and without the fields on allowed responses.
#[tokio::test]
async fn an_allowed_request_reaches_the_upstream_without_the_clients_mark() {
    for headers_on_allowed in [false, true] {
        every_layout(
            |mark| {
                builder(GlobalKey, "open", mark)
                    .headers_on_allowed(headers_on_allowed)
                    .build()
            },
            0,
            Expect::Stripped,
            |stats| stats.allowed,
        )
        .await;
    }
}

/// Shadow mode, within the limit: as when enforcing.
#[tokio::test]
async fn a_request_shadow_mode_allows_reaches_the_upstream_without_the_clients_mark() {
    every_layout(
        |mark| {
            builder(GlobalKey, "open", mark)
                .shadow(Shadow::new(1.0, 0.0))
                .build()
        },
        0,
        Expect::Stripped,
        |stats| stats.allowed,
    )
    .await;
}

/// Shadow mode, over the limit: the upstream sees one value of the mark, the layer's, however
/// many the client wrote (one of them the very value the layer writes), and every other field.
#[tokio::test]
async fn a_shadowed_request_reaches_the_upstream_with_the_layers_mark_alone() {
    for headers_on_allowed in [false, true] {
        every_layout(
            |mark| {
                builder(GlobalKey, "free", mark)
                    .shadow(Shadow::new(1.0, 0.0))
                    .headers_on_allowed(headers_on_allowed)
                    .build()
            },
            FREE_LIMIT,
            Expect::LayersMark,
            |stats| stats.limited - stats.enforced,
        )
        .await;
    }
}

/// The mark the layer writes is what the client would have been told: the `RateLimit` field of
/// an enforcing layer's refusal in the same state.
#[tokio::test]
async fn the_layers_mark_is_the_refusals_ratelimit_field() {
    let layer = builder(GlobalKey, "free", &SHADOWED_HEADER).build();
    let upstream = Upstream::default();
    let mut service = layer.layer(upstream.clone());
    for _ in 0..FREE_LIMIT {
        let (status, _) = send(&mut service, &upstream, Request::new(())).await;
        assert_eq!(status, StatusCode::OK);
    }
    let response = service
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers().get("ratelimit").unwrap(), LAYERS_MARK);
    assert!(upstream.received().is_empty());
}

/// A backend that answers later (the layer's out-of-line path): allowed requests arrive without
/// the client's mark, shadowed ones with the layer's alone.
#[tokio::test]
async fn a_request_checked_later_reaches_the_upstream_without_the_clients_mark() {
    let deferred = |mark: &HeaderName, plan, shadow| {
        let backend = Arc::clone(builder(GlobalKey, plan, mark).build().backend());
        let builder = RateLimitLayer::builder(Deferred(backend), GlobalKey, plan);
        let builder = if *mark == SHADOWED_HEADER {
            builder
        } else {
            builder.shadow_header(mark.clone())
        };
        builder.shadow(shadow).build()
    };
    every_layout(
        |mark| deferred(mark, "open", Shadow::new(1.0, 1.0)),
        0,
        Expect::Stripped,
        |stats| stats.allowed,
    )
    .await;
    every_layout(
        |mark| deferred(mark, "free", Shadow::new(1.0, 0.0)),
        FREE_LIMIT,
        Expect::LayersMark,
        |stats| stats.limited - stats.enforced,
    )
    .await;
    every_layout(
        |mark| deferred(mark, "free", Shadow::new(1.0, 1.0)),
        FREE_LIMIT,
        Expect::Refused(StatusCode::TOO_MANY_REQUESTS),
        |stats| stats.enforced,
    )
    .await;
}

/// Not sampled at all (`Shadow::new(0.0, 0.0)`), over the limit or not: never checked, and
/// never marked by the client either.
#[tokio::test]
async fn a_request_not_sampled_reaches_the_upstream_without_the_clients_mark() {
    every_layout(
        |mark| {
            builder(GlobalKey, "free", mark)
                .shadow(Shadow::new(0.0, 0.0))
                .build()
        },
        2 * FREE_LIMIT,
        Expect::Stripped,
        |stats| stats.requests - stats.checked,
    )
    .await;
}

/// Without a key and let through (`Fallback::Allow`).
#[tokio::test]
async fn a_request_without_a_key_let_through_reaches_the_upstream_without_the_clients_mark() {
    for shadow in [Shadow::new(1.0, 1.0), Shadow::new(1.0, 0.0)] {
        every_layout(
            |mark| {
                builder(
                    HeaderKey::new(HeaderName::from_static(API_KEY)),
                    "free",
                    mark,
                )
                .on_missing_key(Fallback::Allow)
                .shadow(shadow)
                .build()
            },
            2 * FREE_LIMIT,
            Expect::Stripped,
            |stats| stats.unkeyed,
        )
        .await;
    }
}

/// A check that failed (a plan the backend has no rule for) and was let through
/// (`Fallback::Allow`).
#[tokio::test]
async fn a_request_whose_check_failed_let_through_reaches_the_upstream_without_the_clients_mark() {
    every_layout(
        |mark| {
            builder(GlobalKey, "free", mark)
                .plan_fn(|_| Some("gold"))
                .on_error(Fallback::Allow)
                .build()
        },
        0,
        Expect::Stripped,
        |stats| stats.errors,
    )
    .await;
}

/// Header maps that something in front of the layer edited (grown past 16 names and cut back,
/// which reorders their entries; the mark removed and written again; filled through `entry`,
/// `try_append`, `extend` and `drain`): the upstream gets every field but the client's mark,
/// enforcing within the limit and in shadow mode over it.
#[tokio::test]
async fn a_map_edited_in_front_of_the_layer_loses_the_clients_mark() {
    let filler = |n: usize| HeaderName::try_from(format!("x-filler-{n}")).unwrap();
    let value = |v: &str| HeaderValue::try_from(v).unwrap();
    for mark in mark_names() {
        let mut maps: Vec<(&str, HeaderMap)> = Vec::new();
        for (kept, at) in [(10, 0), (10, 15), (15, 39), (16, 20), (17, 5)] {
            // 40 fillers, the mark (3 values) after `at` of them, then all but `kept` removed.
            let mut map = HeaderMap::new();
            for n in 0..40 {
                if n == at {
                    for v in ["forged", "forged again", LAYERS_MARK] {
                        map.append(&mark, value(v));
                    }
                }
                map.append(filler(n), value("1"));
            }
            for n in kept..40 {
                map.remove(filler(n));
            }
            maps.push(("grown and cut back", map));
        }
        let mut map = HeaderMap::new();
        map.insert(&mark, value("forged"));
        for n in 0..3 {
            map.append(filler(n), value("1"));
        }
        map.remove(&mark);
        map.append(&mark, value("forged again"));
        maps.push(("removed and written again", map));
        let mut map = HeaderMap::with_capacity(1);
        map.entry(&mark).or_insert(value("forged"));
        for n in 0..16 {
            map.try_append(filler(n), value("1")).unwrap();
        }
        map.try_append(&mark, value(LAYERS_MARK)).unwrap();
        maps.push(("entry and try_append", map));
        let mut map = HeaderMap::new();
        map.append(filler(0), value("1"));
        let mut more = HeaderMap::new();
        more.append(&mark, value("forged"));
        more.append(&mark, value("forged again"));
        for n in 1..16 {
            more.append(filler(n), value("1"));
        }
        map.extend(more.clone());
        maps.push(("extended", map));
        let mut drained = HeaderMap::new();
        drained.extend(more.drain());
        maps.push(("drained", drained));

        for (shadow, plan, expect) in [
            (Shadow::new(1.0, 1.0), "open", Expect::Stripped),
            (Shadow::new(1.0, 0.0), "free", Expect::LayersMark),
        ] {
            let layer = builder(GlobalKey, plan, &mark).shadow(shadow).build();
            let upstream = Upstream::default();
            let mut service = layer.layer(upstream.clone());
            if let Expect::LayersMark = expect {
                for _ in 0..FREE_LIMIT {
                    let (status, _) = send(&mut service, &upstream, Request::new(())).await;
                    assert_eq!(status, StatusCode::OK);
                }
            }
            for (how, map) in &maps {
                assert!(map.contains_key(&mark), "{mark} {how}");
                let mut expected = HeaderMap::new();
                for (name, value) in map.iter().filter(|(name, _)| *name != mark) {
                    expected.append(name, value.clone());
                }
                if let Expect::LayersMark = expect {
                    expected.insert(&mark, HeaderValue::from_static(LAYERS_MARK));
                }
                let mut request = Request::new(());
                *request.headers_mut() = map.clone();
                let (status, received) = send(&mut service, &upstream, request).await;
                assert_eq!(status, StatusCode::OK, "{mark} {how}");
                assert_eq!(received, Some(expected), "{mark} {how} ({expect:?})");
            }
        }
    }
}

/// Refused over the limit, without a key, or for a failed check: the upstream sees nothing.
#[tokio::test]
async fn a_refused_request_never_reaches_the_upstream() {
    every_layout(
        |mark| builder(GlobalKey, "free", mark).build(),
        FREE_LIMIT,
        Expect::Refused(StatusCode::TOO_MANY_REQUESTS),
        |stats| stats.enforced,
    )
    .await;
    every_layout(
        |mark| {
            builder(
                HeaderKey::new(HeaderName::from_static(API_KEY)),
                "free",
                mark,
            )
            .build()
        },
        0,
        Expect::Refused(StatusCode::BAD_REQUEST),
        |stats| stats.unkeyed,
    )
    .await;
    every_layout(
        |mark| {
            builder(GlobalKey, "free", mark)
                .plan_fn(|_| Some("gold"))
                .build()
        },
        0,
        Expect::Refused(StatusCode::SERVICE_UNAVAILABLE),
        |stats| stats.errors,
    )
    .await;
}
