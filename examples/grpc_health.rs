//! A gRPC server behind the rate-limit layer: tonic with the standard health service
//! (`grpc.health.v1.Health`), each client limited by its address on the `free` plan.
//!
//! ```sh
//! cargo run --release --features tonic --example grpc_health -- --listen 127.0.0.1:50051
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check  # 5 a second, then:
//! # ERROR: Code: ResourceExhausted  Message: rate limit exceeded
//! cargo run --release --features tonic --example grpc_health -- --demo  # calls itself 7 times
//! ```
//!
//! Options: `--listen ADDR` (default 127.0.0.1:50051), `--settings FILE` (default
//! `examples/settings/plans.toml`, which must have plans `free` and `pro`; every client is on
//! `free`), and `--demo`, which serves on a free port, calls the health check 7 times with a
//! tonic client and exits.
//!
//! The peer's address comes from tonic's `TcpConnectInfo`, which tollgate reads with its feature
//! `tonic`. A call over its limit is answered by the layer alone, in gRPC's own terms: HTTP 200
//! with `grpc-status: 8` (`RESOURCE_EXHAUSTED`), which a tonic client reports as
//! `Code::ResourceExhausted`.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;
use tollgate::tower::{ClientIp, ClientKey, RateLimitLayer};
use tollgate::{Clock, MonotonicClock, RateLimiterService, Settings};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[path = "support/report.rs"]
mod report;

/// The layer this server runs behind: every client keyed by its address.
pub(crate) type Layer<C> =
    RateLimitLayer<Arc<RateLimiterService<ClientKey, &'static str, C>>, ClientIp, &'static str>;

struct Options {
    listen: SocketAddr,
    settings: String,
    demo: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
        settings: concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml").to_owned(),
        demo: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--demo" {
            options.demo = true;
            options.listen.set_port(0);
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                options.listen = value.parse().map_err(|_| {
                    format!("--listen {value:?}: expected an address like 127.0.0.1:50051")
                })?;
            }
            "--settings" => options.settings = value,
            other => {
                return Err(format!(
                    "unknown option {other:?}: expected --listen, --settings or --demo"
                ));
            }
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    report::exit_code(run())
}

#[tokio::main]
async fn run() -> Result<(), Box<dyn Error>> {
    let options = options()?;
    let settings = Settings::from_path(&options.settings)?;
    let layer = layer(&settings, MonotonicClock::new())?;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|error| format!("--listen {}: {error}", options.listen))?;
    let addr = listener.local_addr()?;
    if !options.demo {
        println!(
            "grpc_health: grpc.health.v1.Health on {addr}, from {}",
            options.settings
        );
        return Ok(serve(listener, layer).await?);
    }
    tokio::spawn(serve(listener, layer));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for call in 1..=7 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match client.check(request).await {
            Ok(response) => println!("call {call}: {:?}", response.into_inner().status()),
            Err(status) => println!("call {call}: {:?}: {}", status.code(), status.message()),
        }
    }
    Ok(())
}

/// The layer over the plans of `settings`, every client on `free`.
pub(crate) fn layer<C: Clock + 'static>(
    settings: &Settings,
    clock: C,
) -> Result<Layer<C>, tollgate::tower::SetupError> {
    Ok(RateLimitLayer::from_settings(
        settings,
        clock,
        [("free", "free"), ("pro", "pro")],
        ClientIp::peer(),
        "free",
    )?
    .build())
}

/// Serves the health service behind `layer` on `listener`'s connections.
pub(crate) async fn serve<C: Clock + 'static>(
    listener: TcpListener,
    layer: Layer<C>,
) -> Result<(), tonic::transport::Error> {
    // The reporter sets services' statuses; the server (`""`) is SERVING from the start.
    let (_reporter, health) = tonic_health::server::health_reporter();
    Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}
