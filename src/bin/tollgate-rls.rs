//! `tollgate-rls`: Envoy's global rate-limit service on tollgate's methods.
//!
//! ```text
//! tollgate-rls --config FILE|DIR --listen ADDR [--redis URL] [--redis-failure error|open|closed]
//!              [--redis-timeout-ms N] [--metrics ADDR] [--clients N] [--watch-ms N]
//! ```
//!
//! Serves `envoy.service.ratelimit.v3.RateLimitService` and the standard gRPC health service
//! (`grpc.health.v1.Health`) on `ADDR` (HTTP/2, as Envoy's `envoy_grpc` cluster speaks it), and
//! Prometheus metrics on `--metrics ADDR` (`GET /metrics`). The configuration is
//! envoyproxy/ratelimit's YAML (see `tollgate::envoy`); it is read again when its file changes
//! (checked every `--watch-ms`, 1,000 by default) and on SIGHUP, keeping the state of every
//! limit that did not change; a configuration with a mistake is reported and the one in use
//! stays. Prints `listening on ADDR` once it serves (ADDR with the port chosen for `:0`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use tollgate::envoy::proto::rate_limit_service_server::RateLimitServiceServer;
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

const USAGE: &str = "usage: tollgate-rls --config FILE|DIR --listen ADDR [--redis URL] \
[--redis-failure error|open|closed] [--redis-timeout-ms N] [--metrics ADDR] [--clients N] \
[--watch-ms N]";

#[derive(Debug)]
struct Options {
    config: PathBuf,
    listen: SocketAddr,
    store: StateStore,
    metrics: Option<SocketAddr>,
    watch: Duration,
}

fn parse_options(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut config = None;
    let mut listen = None;
    let mut redis = None;
    let mut policy = FailurePolicy::Error;
    let mut timeout = Duration::from_millis(50);
    let mut metrics = None;
    let mut clients = tollgate::ServiceBuilder::<(), tollgate::MonotonicClock>::DEFAULT_CAPACITY;
    let mut watch = Duration::from_millis(1_000);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--listen" => listen = Some(parse_addr("--listen", &value("--listen")?)?),
            "--redis" => redis = Some(value("--redis")?),
            "--redis-failure" => {
                policy = match value("--redis-failure")?.as_str() {
                    "error" => FailurePolicy::Error,
                    "open" => FailurePolicy::FailOpen,
                    "closed" => FailurePolicy::FailClosed,
                    other => {
                        return Err(format!(
                            "--redis-failure {other:?}: expected error, open or closed"
                        ));
                    }
                }
            }
            "--redis-timeout-ms" => {
                timeout = Duration::from_millis(parse_number(
                    "--redis-timeout-ms",
                    &value("--redis-timeout-ms")?,
                    1,
                )?)
            }
            "--metrics" => metrics = Some(parse_addr("--metrics", &value("--metrics")?)?),
            "--clients" => {
                let text = value("--clients")?;
                clients = usize::try_from(parse_number("--clients", &text, 1)?)
                    .map_err(|_| format!("--clients {text}: too large"))?;
            }
            "--watch-ms" => {
                watch =
                    Duration::from_millis(parse_number("--watch-ms", &value("--watch-ms")?, 10)?)
            }
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let store = match redis {
        Some(url) => StateStore::Redis {
            url,
            policy,
            timeout,
        },
        None => StateStore::InProcess { clients },
    };
    Ok(Options {
        config: config.ok_or_else(|| format!("--config is required\n{USAGE}"))?,
        listen: listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?,
        store,
        metrics,
        watch,
    })
}

fn parse_addr(flag: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{flag} {text:?}: expected an address such as 127.0.0.1:8081"))
}

fn parse_number(flag: &str, text: &str, least: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(number) if number >= least => Ok(number),
        _ => Err(format!(
            "{flag} {text:?}: expected a whole number of at least {least}"
        )),
    }
}

/// What tells a changed configuration: each file's name, length and modification time.
fn fingerprint(path: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut files = vec![path.to_path_buf()];
    if path.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        files.extend(entries.flatten().map(|entry| entry.path()));
    }
    let mut seen: Vec<_> = files
        .into_iter()
        .map(|file| {
            let metadata = std::fs::metadata(&file).ok();
            let length = metadata.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = metadata.and_then(|m| m.modified().ok());
            (file, length, modified)
        })
        .collect();
    seen.sort();
    seen
}

/// Reloads the configuration when its files change or on SIGHUP.
async fn watch_configuration(server: RateLimitServer, path: PathBuf, every: Duration) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(error) => {
            eprintln!("tollgate-rls: SIGHUP will not reload the configuration: {error}");
            None
        }
    };
    let mut last = fingerprint(&path);
    let mut ticks = tokio::time::interval(every);
    loop {
        let hangup = async {
            match &mut hangups {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            _ = ticks.tick() => false,
            _ = hangup => true,
        };
        let now = fingerprint(&path);
        if !forced && now == last {
            continue;
        }
        last = now;
        match RlsConfig::from_path(&path) {
            Ok(config) => match server.reload(&config).await {
                Ok(()) => eprintln!(
                    "tollgate-rls: configuration reloaded from {}",
                    path.display()
                ),
                Err(error) => eprintln!("tollgate-rls: configuration not reloaded: {error}"),
            },
            Err(error) => eprintln!("tollgate-rls: configuration not reloaded: {error}"),
        }
    }
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse_options(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("tollgate-rls: {message}");
            return ExitCode::from(2);
        }
    };
    if let Some(address) = options.metrics {
        let installed = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(address)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("tollgate_rls_decision_seconds".into()),
                &[
                    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5,
                    0.005, 0.01, 0.025, 0.05, 0.1,
                ],
            )
            .and_then(metrics_exporter_prometheus::PrometheusBuilder::install);
        if let Err(error) = installed {
            eprintln!("tollgate-rls: --metrics {address}: {error}");
            return ExitCode::from(2);
        }
    }
    let config = match RlsConfig::from_path(&options.config) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("tollgate-rls: {error}");
            return ExitCode::from(2);
        }
    };
    let server = match RateLimitServer::new(&config, options.store.clone()).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("tollgate-rls: {error}");
            return ExitCode::from(2);
        }
    };
    let incoming = match tonic::transport::server::TcpIncoming::bind(options.listen) {
        Ok(incoming) => incoming.with_nodelay(Some(true)),
        Err(error) => {
            eprintln!("tollgate-rls: --listen {}: {error}", options.listen);
            return ExitCode::from(2);
        }
    };
    let bound = incoming.local_addr().unwrap_or(options.listen);

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<RateLimitServiceServer<RateLimitServer>>()
        .await;
    tokio::spawn(watch_configuration(
        server.clone(),
        options.config.clone(),
        options.watch,
    ));

    println!("listening on {bound}");
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(server.into_service())
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-rls: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
        parse_options(args.iter().map(|arg| (*arg).to_owned()))
    }

    #[test]
    fn options_name_the_flag_that_is_wrong() {
        let error = parse(&["--listen", "127.0.0.1:1"]).unwrap_err();
        assert!(error.starts_with("--config is required"), "{error}");
        let error = parse(&["--config", "x", "--listen", "here"]).unwrap_err();
        assert!(error.starts_with("--listen \"here\""), "{error}");
        let error =
            parse(&["--config", "x", "--listen", "127.0.0.1:1", "--clients", "0"]).unwrap_err();
        assert!(error.contains("at least 1"), "{error}");
        let error = parse(&[
            "--config",
            "x",
            "--listen",
            "127.0.0.1:1",
            "--redis-failure",
            "maybe",
        ])
        .unwrap_err();
        assert!(error.contains("error, open or closed"), "{error}");
        let options = parse(&[
            "--config",
            "x",
            "--listen",
            "127.0.0.1:1",
            "--redis",
            "redis://127.0.0.1:6379",
            "--redis-failure",
            "closed",
        ])
        .unwrap();
        assert!(matches!(
            options.store,
            StateStore::Redis {
                policy: FailurePolicy::FailClosed,
                ..
            }
        ));
    }
}
