//! A hyper reverse proxy that limits each client address and forwards the rest upstream.
//!
//! ```sh
//! cargo run --release --features tower --example api_server -- --listen 127.0.0.1:3000 &
//! cargo run --release --features tower --example reverse_proxy -- \
//!     --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000
//! curl -i http://127.0.0.1:8080/hello
//! ```
//!
//! Options: `--listen ADDR` (default 127.0.0.1:8080), `--upstream URL` (required; `http` only),
//! `--settings FILE` (default `examples/settings/plans.toml`; every client is on plan `free`),
//! and `--trust CIDR`, repeatable, for proxies in front of this one. The proxy appends the peer's
//! address to `X-Forwarded-For`, so an upstream that trusts this proxy sees the client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, Scheme, Uri};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tollgate::tower::{Cidr, ClientIp, PolicyName, RateLimitLayer};
use tollgate::{MonotonicClock, Settings};
use tower::{Layer, ServiceExt};

#[path = "support/report.rs"]
mod report;

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Headers that describe one connection, not the request: never forwarded (RFC 9110, 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

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
    upstream: Authority,
    settings: String,
    trusted: Vec<Cidr>,
}

fn options() -> Result<Options, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 8080));
    let mut upstream = None;
    let mut settings =
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml").to_owned();
    let mut trusted = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                listen = value.parse().map_err(|_| {
                    format!("--listen {value:?}: expected an address like 127.0.0.1:8080")
                })?;
            }
            "--upstream" => {
                let uri: Uri = value
                    .parse()
                    .map_err(|_| format!("--upstream {value:?}: expected a URL"))?;
                if uri.scheme() != Some(&Scheme::HTTP) {
                    return Err(format!(
                        "--upstream {value:?}: only http:// upstreams are supported"
                    ));
                }
                upstream = uri.authority().cloned();
            }
            "--settings" => settings = value,
            "--trust" => trusted.push(value.parse().map_err(|error| format!("--trust: {error}"))?),
            other => {
                return Err(format!(
                    "unknown option {other:?}: expected --listen, --upstream, --settings or --trust"
                ));
            }
        }
    }
    Ok(Options {
        listen,
        upstream: upstream.ok_or("--upstream http://HOST:PORT is required")?,
        settings,
        trusted,
    })
}

/// Forwards `request` to `upstream`, answering 502 when the upstream cannot be reached.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: Authority,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let peer = request.extensions().get::<SocketAddr>().copied();
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(upstream)
        .path_and_query(path)
        .build();
    let Ok(uri) = uri else {
        return Ok(plain(StatusCode::BAD_REQUEST, "bad request target\n"));
    };
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // The Host header names this proxy; the client sets the upstream's from the URI.
    headers.remove(http::header::HOST);
    if let Some(peer) = peer
        && let Ok(address) = HeaderValue::from_str(&peer.ip().to_string())
    {
        headers.append(HeaderName::from_static("x-forwarded-for"), address);
    }
    match client.request(request).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(_) => Ok(plain(StatusCode::BAD_GATEWAY, "upstream unreachable\n")),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
}

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let settings = Settings::from_path(&options.settings)?;
    // Keyed by the peer's address, recorded below as a `SocketAddr` extension (the default
    // source), or by the client's behind trusted proxies.
    let layer = RateLimitLayer::from_settings(
        &settings,
        MonotonicClock::new(),
        [("free", Plan::Free), ("pro", Plan::Pro)],
        ClientIp::behind_proxies(options.trusted.iter().copied()),
        Plan::Free,
    )?
    .build();
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    let upstream = options.upstream.clone();
    let proxy = layer.layer(tower::service_fn(move |request| {
        forward(client.clone(), upstream.clone(), request)
    }));

    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!(
        "reverse_proxy: listening on http://{}, forwarding to http://{}",
        listener.local_addr()?,
        options.upstream
    );
    loop {
        let (stream, peer) = listener.accept().await?;
        let proxy = proxy.clone();
        // Each request carries its connection's peer address, where the layer's key reads it.
        let service = tower::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer);
            proxy.clone().oneshot(request)
        });
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            // A client that hangs up mid-request is no error of the proxy's.
            let _ = connection.await;
        });
    }
}
