//! An axum API behind the rate-limit layer, with the plans of a settings file and a table of the
//! API keys it knows.
//!
//! ```sh
//! cargo run --release --features tower --example api_server -- --listen 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/hello              # anonymous: free plan, keyed by address
//! curl -i -H 'x-api-key: pro-4e8a2f61b0d93c57' http://127.0.0.1:3000/hello  # a known key
//! curl -i -H 'x-api-key: pro-made-up' http://127.0.0.1:3000/hello # unknown: anonymous, free
//! curl -i http://127.0.0.1:3000/shadow             # as /hello, limits observed, not enforced
//! curl http://127.0.0.1:3000/stats                 # the layers' counts (not limited)
//! curl http://127.0.0.1:3000/open                  # as /hello, but not limited
//! ```
//!
//! Options: `--listen ADDR` (default 127.0.0.1:3000); `--settings FILE`, the plans (default
//! `examples/settings/plans.toml`, which must have plans `free` and `pro`); `--keys FILE`, the
//! API keys and their plans (default `examples/settings/api_keys.toml`); and `--trust CIDR`,
//! repeatable, to read the client's address from `X-Forwarded-For` when the peer is one of your
//! proxies. Without `--trust` forwarding headers are ignored.
//!
//! `--redis URL` (feature `redis`) serves the same limits from the Redis at `URL`, so that every
//! process started with it shares each client's limit (run two on different `--listen` ports and
//! a client gets its plan's limit across both). While Redis cannot answer, the limited routes
//! answer as `--redis-failure` says: `error` (the default) `503 Service Unavailable`, `open` let
//! requests through, `closed` `429 Too Many Requests` with a `Retry-After` of the breaker's
//! cool-down.
//!
//! ```sh
//! cargo run --release --features tower,redis --example api_server -- --redis redis://127.0.0.1:6379
//! ```
//!
//! A key is trusted only if the table lists it: a client can write any `x-api-key`, so a key it
//! invented is no key at all, and its request is limited as an anonymous one, by address. (A real
//! API checks the key, by such a table or a signature, before it is trusted as a limit's key.)
//!
//! `/hello` and `/shadow` answer `hello`, followed by the `x-ratelimit-shadowed` marks they
//! received, if any: `/shadow`'s layer runs in shadow mode, letting limited requests through
//! marked for the upstream and telling the client nothing; a mark a client writes never arrives.

use std::collections::HashMap;
use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{HeaderMap, HeaderName};
use serde::Deserialize;
use tollgate::tower::{
    Cidr, ClientIp, ClientKey, HeaderKey, KeyExtractor, RateLimitBackend, RateLimitLayer,
    RequestHead, SHADOWED_HEADER, SetupError, Shadow, key_fn,
};
use tollgate::{Clock, MonotonicClock, Settings};

#[path = "support/report.rs"]
mod report;

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The plans of the settings file (the layer names them in the `RateLimit` fields as the file
/// does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    Free,
    Pro,
}

impl Plan {
    const ALL: [(&'static str, Plan); 2] = [("free", Plan::Free), ("pro", Plan::Pro)];

    fn named(name: &str) -> Option<Plan> {
        Plan::ALL
            .iter()
            .find(|(plan_name, _)| *plan_name == name)
            .map(|(_, plan)| *plan)
    }
}

/// The plan's name in the settings file, which the `RateLimit` fields use.
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = Plan::ALL
            .iter()
            .find(|(_, plan)| plan == self)
            .map_or("?", |(name, _)| *name);
        f.write_str(name)
    }
}

/// The API keys file: `[keys]`, each key with its plan's name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    keys: HashMap<String, String>,
}

/// The keys the server knows, with their plans.
#[derive(Debug)]
pub(crate) struct ApiKeys {
    plans: HashMap<Box<[u8]>, Plan>,
}

impl ApiKeys {
    /// The keys of the file at `path`. Refuses a key no request could send as `x-api-key`, one
    /// longer than a key the layer takes, and a plan the program does not have.
    pub(crate) fn from_path(path: &str) -> Result<ApiKeys, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("{path}: {error}"))?;
        let file: KeysFile = toml::from_str(&text).map_err(|error| format!("{path}: {error}"))?;
        let mut plans = HashMap::with_capacity(file.keys.len());
        for (number, (key, plan)) in file.keys.into_iter().enumerate() {
            let plan = Plan::named(&plan).ok_or_else(|| {
                format!("{path}: plan {plan:?} of a key is unknown: expected free or pro")
            })?;
            // Visible ASCII only, so that the key is one header value, compared byte for byte.
            if key.is_empty()
                || key.len() > HeaderKey::DEFAULT_MAX_LEN
                || !key.bytes().all(|byte| byte.is_ascii_graphic())
            {
                return Err(format!(
                    "{path}: key {} of {} bytes is invalid: a key is 1 to {} visible ASCII \
                     characters",
                    number + 1,
                    key.len(),
                    HeaderKey::DEFAULT_MAX_LEN
                ));
            }
            plans.insert(key.into_bytes().into_boxed_slice(), plan);
        }
        Ok(ApiKeys { plans })
    }

    /// The request's key and its plan, if the request sends a key of the table.
    fn of(&self, head: &RequestHead<'_>) -> Option<(ClientKey, Plan)> {
        let key = head.headers().get(&API_KEY)?;
        let plan = *self.plans.get(key.as_bytes())?;
        Some((ClientKey::Header(key.clone()), plan))
    }
}

pub(crate) struct Options {
    listen: SocketAddr,
    settings: String,
    keys: String,
    trusted: Vec<Cidr>,
    redis: Option<String>,
    redis_failure: RedisFailure,
}

/// `--redis-failure`: what the limited routes answer while Redis cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedisFailure {
    /// `503 Service Unavailable` (the limiter's `FailurePolicy::Error`).
    Error,
    /// Every request passes (`FailurePolicy::FailOpen`).
    Open,
    /// Every request is refused (`FailurePolicy::FailClosed`).
    Closed,
}

/// The options given by `args` (the program's arguments, without its name).
pub(crate) fn options(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        settings: concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml").to_owned(),
        keys: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/settings/api_keys.toml"
        )
        .to_owned(),
        trusted: Vec::new(),
        redis: None,
        redis_failure: RedisFailure::Error,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                options.listen = value.parse().map_err(|_| {
                    format!("--listen {value:?}: expected an address like 127.0.0.1:3000")
                })?;
            }
            "--settings" => options.settings = value,
            "--keys" => options.keys = value,
            "--trust" => options
                .trusted
                .push(value.parse().map_err(|error| format!("--trust: {error}"))?),
            "--redis" => options.redis = Some(value),
            "--redis-failure" => {
                options.redis_failure = match value.as_str() {
                    "error" => RedisFailure::Error,
                    "open" => RedisFailure::Open,
                    "closed" => RedisFailure::Closed,
                    other => {
                        return Err(format!(
                            "--redis-failure {other:?}: expected error, open or closed"
                        ));
                    }
                }
            }
            other => {
                return Err(format!(
                    "unknown option {other:?}: expected --listen, --settings, --keys, --trust, \
                     --redis or --redis-failure"
                ));
            }
        }
    }
    Ok(options)
}

/// `hello`, and the shadow marks the request arrived with.
fn greeting(headers: &HeaderMap) -> String {
    let marks: Vec<String> = headers
        .get_all(SHADOWED_HEADER)
        .iter()
        .map(|mark| String::from_utf8_lossy(mark.as_bytes()).into_owned())
        .collect();
    if marks.is_empty() {
        "hello\n".to_owned()
    } else {
        format!("hello (shadowed: {})\n", marks.join(" | "))
    }
}

fn main() -> ExitCode {
    report::exit_code(run())
}

#[tokio::main]
async fn run() -> Result<(), Box<dyn Error>> {
    serve(options(std::env::args().skip(1))?).await
}

/// Serves the API as `options` say, until the process ends.
pub(crate) async fn serve(options: Options) -> Result<(), Box<dyn Error>> {
    let settings = Settings::from_path(&options.settings)?;
    let keys = Arc::new(ApiKeys::from_path(&options.keys)?);
    let key_count = keys.plans.len();
    let (app, store) = match &options.redis {
        None => (
            app(&settings, MonotonicClock::new(), keys, &options.trusted)?,
            "in process".to_owned(),
        ),
        Some(url) => {
            redis::app(
                &settings,
                url,
                options.redis_failure,
                keys,
                &options.trusted,
            )
            .await?
        }
    };

    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|error| format!("--listen {}: {error}", options.listen))?;
    println!(
        "api_server: {} from {} ({}), {store}, {key_count} API keys from {}, listening on \
         http://{}",
        settings.algorithm(),
        options.settings,
        settings
            .plans()
            .map(|(plan, rules)| {
                let rules: Vec<String> = rules.iter().map(ToString::to_string).collect();
                format!("{plan}: {}", rules.join(" and "))
            })
            .collect::<Vec<_>>()
            .join(", "),
        options.keys,
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The API: `/hello` limited, `/shadow` observed by the same limits, `/open` and `/stats` not
/// limited. Served with `into_make_service_with_connect_info::<SocketAddr>()`, which records the
/// peer's address.
pub(crate) fn app<C: Clock + Clone + 'static>(
    settings: &Settings,
    clock: C,
    keys: Arc<ApiKeys>,
    trusted: &[Cidr],
) -> Result<Router, SetupError> {
    let key = client_key(&keys, trusted);
    let layer =
        RateLimitLayer::from_settings(settings, clock.clone(), Plan::ALL, key.clone(), Plan::Free)?
            .plan_fn(plan_of(Arc::clone(&keys)))
            .headers_on_allowed(true)
            .build();
    // The same limits observed only: every request checked, none refused.
    let shadow_layer = RateLimitLayer::from_settings(settings, clock, Plan::ALL, key, Plan::Free)?
        .plan_fn(plan_of(keys))
        .headers_on_allowed(true)
        .shadow(Shadow::new(1.0, 0.0))
        .build();
    Ok(routes(layer, shadow_layer))
}

/// A key of the table if the request sends one, else the peer's address (or the client's, behind
/// trusted proxies).
fn client_key(
    keys: &Arc<ApiKeys>,
    trusted: &[Cidr],
) -> impl KeyExtractor<Key = ClientKey> + Clone + Send + Sync + 'static {
    let address = ClientIp::behind_proxies(trusted.iter().copied()).peer_source(|extensions| {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip())
    });
    let known_key = {
        let keys = Arc::clone(keys);
        key_fn(move |head: &RequestHead<'_>| keys.of(head).map(|(key, _)| key))
    };
    known_key.or(address)
}

/// The plan of a request that sends a key of the table.
fn plan_of(keys: Arc<ApiKeys>) -> impl Fn(&RequestHead<'_>) -> Option<Plan> + Send + Sync {
    move |head: &RequestHead<'_>| keys.of(head).map(|(_, plan)| plan)
}

/// The routes, `/hello` behind `layer` and `/shadow` behind `shadow_layer`.
fn routes<Bk, X>(
    layer: RateLimitLayer<Bk, X, Plan>,
    shadow_layer: RateLimitLayer<Bk, X, Plan>,
) -> Router
where
    Bk: RateLimitBackend<ClientKey, Plan> + Send + Sync + 'static,
    Bk::Future: Send + 'static,
    X: KeyExtractor<Key = ClientKey> + Send + Sync + 'static,
{
    let (stats_layer, stats_shadow) = (layer.clone(), shadow_layer.clone());
    let hello = get(|headers: HeaderMap| async move { greeting(&headers) });
    Router::new()
        .route("/hello", hello.clone().layer(layer))
        .route("/shadow", hello.layer(shadow_layer))
        // Not limited: `/open` is the baseline of `.ci/load-tower.sh`.
        .route("/open", get(|| async { "hello\n" }))
        .route(
            "/stats",
            get(move || async move {
                format!(
                    "hello: {:?}\nshadow: {:?}\n",
                    stats_layer.stats(),
                    stats_shadow.stats()
                )
            }),
        )
}

/// `--redis`: the same layers, deciding in Redis.
#[cfg(feature = "redis")]
mod redis {
    use std::error::Error;
    use std::sync::Arc;

    use axum::Router;
    use tollgate::Settings;
    use tollgate::redis::{FailurePolicy, RedisRateLimiter};
    use tollgate::tower::{Cidr, RateLimitLayer, RedisBackend, Shadow};

    use super::{ApiKeys, Plan, RedisFailure, client_key, plan_of, routes};

    /// The API with its limits kept in the Redis at `url`, answering as `failure` says while
    /// Redis cannot, and how it says so at start-up.
    pub(crate) async fn app(
        settings: &Settings,
        url: &str,
        failure: RedisFailure,
        keys: Arc<ApiKeys>,
        trusted: &[Cidr],
    ) -> Result<(Router, String), Box<dyn Error>> {
        let policy = match failure {
            RedisFailure::Error => FailurePolicy::Error,
            RedisFailure::Open => FailurePolicy::FailOpen,
            RedisFailure::Closed => FailurePolicy::FailClosed,
        };
        let mut builder =
            RedisRateLimiter::builder(url, settings.algorithm()).failure_policy(policy);
        for (name, rules) in settings.plans() {
            let plan = Plan::named(name).ok_or_else(|| {
                format!("plan {name:?} of the settings is unknown: expected free or pro")
            })?;
            builder = builder.plan_limits(plan, rules.iter().copied());
        }
        let backend = RedisBackend::new(Arc::new(builder.build().await?));
        let key = client_key(&keys, trusted);
        // Plans named as the settings file names them, as from_settings does.
        let layer = RateLimitLayer::builder_display_names(backend.clone(), key.clone(), Plan::Free)
            .plan_fn(plan_of(Arc::clone(&keys)))
            .headers_on_allowed(true)
            .build();
        let shadow_layer = RateLimitLayer::builder_display_names(backend, key, Plan::Free)
            .plan_fn(plan_of(keys))
            .headers_on_allowed(true)
            .shadow(Shadow::new(1.0, 0.0))
            .build();
        Ok((
            routes(layer, shadow_layer),
            // Not the URL, which may hold a password.
            "limits in Redis".to_owned(),
        ))
    }
}

/// Without feature `redis`, `--redis` is refused with the command that has it.
#[cfg(not(feature = "redis"))]
mod redis {
    use std::error::Error;
    use std::sync::Arc;

    use axum::Router;
    use tollgate::Settings;
    use tollgate::tower::Cidr;

    use super::{ApiKeys, RedisFailure};

    pub(crate) async fn app(
        _: &Settings,
        _: &str,
        _: RedisFailure,
        _: Arc<ApiKeys>,
        _: &[Cidr],
    ) -> Result<(Router, String), Box<dyn Error>> {
        Err(
            "--redis needs the feature redis: cargo run --features tower,redis --example \
             api_server -- --redis URL"
                .into(),
        )
    }
}
