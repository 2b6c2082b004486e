//! What a new user of the layer reaches for: the idle sweep, whichever constructor made the
//! layer, and plan enums named in the `RateLimit` fields without a hand-written `PolicyName`.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tollgate::tower::{ClientKey, GlobalKey, RateLimitLayer, ResponseBody};
use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, Settings};
use tower::{Layer, ServiceExt};

/// The plans of a program, with neither `PolicyName` nor `Display`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
}

/// The plans of another program, named by their `Display` form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Basic,
    Gold,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Basic => "basic",
            Tier::Gold => "gold",
        })
    }
}

fn service<P: Eq + fmt::Debug>(
    plans: [(P, Rule); 2],
) -> Arc<RateLimiterService<ClientKey, P, FakeClock>> {
    Arc::new(RateLimiterService::new(Algorithm::TokenBucket, plans, FakeClock::new()).unwrap())
}

/// A service answering every request with an empty 200.
fn ok()
-> impl tower::Service<Request<()>, Response = Response<Empty<Bytes>>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    tower::service_fn(|_: Request<()>| async { Ok(Response::new(Empty::new())) })
}

/// The `RateLimit-Policy` of `service`'s response to one request.
async fn policy_of<S>(service: S) -> String
where
    S: tower::Service<Request<()>, Response = Response<ResponseBody<Empty<Bytes>>>>,
    S::Error: fmt::Debug,
{
    let response = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_layer_over_a_shared_service_sweeps_it_whichever_constructor_made_it() {
    // The sweeping thread holds the service weakly: one weak reference while the layer lives.
    let shared = service([
        ("free", Rule::per_second(5).unwrap()),
        ("pro", Rule::per_second(50).unwrap()),
    ]);
    let layer = RateLimitLayer::builder(Arc::clone(&shared), GlobalKey, "free").build();
    assert_eq!(Arc::weak_count(&shared), 1, "builder: {layer:?}");
    drop(layer);
    assert_eq!(
        Arc::weak_count(&shared),
        0,
        "the sweep stops with the layer"
    );

    let tiers = service([
        (Tier::Basic, Rule::per_second(5).unwrap()),
        (Tier::Gold, Rule::per_second(50).unwrap()),
    ]);
    let layer =
        RateLimitLayer::builder_display_names(Arc::clone(&tiers), GlobalKey, Tier::Basic).build();
    assert_eq!(Arc::weak_count(&tiers), 1, "builder_display_names");
    drop(layer);

    let settings = Settings::from_toml_str(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"\n",
    )
    .unwrap();
    let layer = RateLimitLayer::from_settings(
        &settings,
        FakeClock::new(),
        [("free", Plan::Free)],
        GlobalKey,
        Plan::Free,
    )
    .unwrap()
    .build();
    assert_eq!(Arc::weak_count(layer.backend()), 1, "from_settings");

    // Opted out, for a service swept elsewhere.
    let layer = RateLimitLayer::builder(Arc::clone(&shared), GlobalKey, "free")
        .without_sweep()
        .build();
    assert_eq!(Arc::weak_count(&shared), 0, "without_sweep");
    drop(layer);
}

#[tokio::test]
async fn plans_from_settings_are_named_as_the_settings_file_names_them() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "token_bucket"
        [plans.free]
        limit = 5
        window = "1s"
        [plans.pro]
        limit = 50
        window = "1s"
        "#,
    )
    .unwrap();
    let builder = || {
        RateLimitLayer::from_settings(
            &settings,
            FakeClock::new(),
            [("free", Plan::Free), ("pro", Plan::Pro)],
            GlobalKey,
            Plan::Free,
        )
        .unwrap()
        .headers_on_allowed(true)
    };
    assert_eq!(
        policy_of(builder().build().layer(ok())).await,
        r#""free";q=5;w=1"#
    );
    let pro = builder().plan_fn(|_| Some(Plan::Pro)).build();
    assert_eq!(policy_of(pro.layer(ok())).await, r#""pro";q=50;w=1"#);
}

#[tokio::test]
async fn plans_are_named_by_their_display_form_when_asked() {
    let tiers = service([
        (Tier::Basic, Rule::per_second(5).unwrap()),
        (Tier::Gold, Rule::per_second(50).unwrap()),
    ]);
    let layer = RateLimitLayer::builder_display_names(tiers, GlobalKey, Tier::Basic)
        .plan_fn(|_| Some(Tier::Gold))
        .headers_on_allowed(true)
        .build();
    assert_eq!(policy_of(layer.layer(ok())).await, r#""gold";q=50;w=1"#);
}
