//! An axum API behind the rate-limit layer, with the plans of a settings file.
//!
//! ```sh
//! cargo run --release --features tower --example api_server -- --listen 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/hello                         # free plan, keyed by address
//! curl -i -H 'x-api-key: pro-alice' http://127.0.0.1:3000/hello  # pro plan, keyed by the key
//! curl http://127.0.0.1:3000/stats                             # the layer's counts (not limited)
//! curl http://127.0.0.1:3000/open                              # as /hello, but not limited
//! ```
//!
//! Options: `--listen ADDR` (default 127.0.0.1:3000), `--settings FILE` (default
//! `examples/settings/plans.toml`, which must have plans `free` and `pro`), and `--trust CIDR`,
//! repeatable, to read the client's address from `X-Forwarded-For` when the peer is one of your
//! proxies. Without `--trust` forwarding headers are ignored.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::HeaderName;
use tollgate::MonotonicClock;
use tollgate::Settings;
use tollgate::tower::{Cidr, ClientIp, HeaderKey, KeyExtractor, PolicyName, RateLimitLayer};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The plans of the settings file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
}

impl PolicyName for Plan {
    fn policy_name(&self) -> &str {
        match self {
            Plan::Free => "free",
            Plan::Pro => "pro",
        }
    }
}

struct Options {
    listen: SocketAddr,
    settings: String,
    trusted: Vec<Cidr>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        settings: concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml").to_owned(),
        trusted: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                options.listen = value.parse().map_err(|_| {
                    format!("--listen {value:?}: expected an address like 127.0.0.1:3000")
                })?;
            }
            "--settings" => options.settings = value,
            "--trust" => options
                .trusted
                .push(value.parse().map_err(|error| format!("--trust: {error}"))?),
            other => {
                return Err(format!(
                    "unknown option {other:?}: expected --listen, --settings or --trust"
                ));
            }
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let settings = Settings::from_path(&options.settings)?;

    // An API key if the request has one, else the peer's address (or the client's, behind
    // trusted proxies).
    let address =
        ClientIp::behind_proxies(options.trusted.iter().copied()).peer_source(|extensions| {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        });
    let key = HeaderKey::new(API_KEY).or(address);
    let layer = RateLimitLayer::from_settings(
        &settings,
        MonotonicClock::new(),
        [("free", Plan::Free), ("pro", Plan::Pro)],
        key,
        Plan::Free,
    )?
    .plan_fn(|head| {
        let key = head.headers().get(&API_KEY)?;
        key.as_bytes().starts_with(b"pro-").then_some(Plan::Pro)
    })
    .headers_on_allowed(true)
    .build();

    let stats_layer = layer.clone();
    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(layer)
        // Added after the layer, so not limited: `/open` is the baseline of `.ci/load-tower.sh`.
        .route("/open", get(|| async { "hello\n" }))
        .route(
            "/stats",
            get(move || async move { format!("{:?}\n", stats_layer.stats()) }),
        );

    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!(
        "api_server: {} from {} ({}), listening on http://{}",
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
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
