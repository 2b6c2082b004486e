//! Decisions per second and latency of Envoy's `ShouldRateLimit` on loopback: tollgate's
//! [`RateLimitServer`] (state in process) against the floor, an empty service of the same
//! trait that answers OK at once, served and called the same way.
//!
//! ```sh
//! cargo run --release --features envoy --example rls_throughput [-- --seconds N]
//! ```
//!
//! Both servers run in this process on a tokio runtime of their own (`--server-threads`
//! workers, 1 by default), the clients on another (`--client-threads`, 1 by default), so that
//! neither takes the other's worker; each server listens on its own loopback port with
//! `TCP_NODELAY`, as `tollgate-rls` does, and each client is tonic's `Channel`. A run keeps 1, 8
//! or 64 unary calls in flight (*streams*) over one HTTP/2 connection, and 8 or 64 over 4
//! connections (streams dealt out in turn). Each case gives the empty service and tollgate the
//! same requests for `--seconds` each (1.5 by default), in 4 rounds that take turns (empty,
//! tollgate, empty, ...), each on new connections after a tenth of a second of warm-up, so
//! that a neighbour's load that comes and goes falls on both alike: about 100 seconds in all.
//!
//! The cases, over 10,000 distinct values cycled by every stream from its own offset:
//! - *grant*: one descriptor, `remote_address` (key only, token bucket, 10⁹ per second: every
//!   decision a grant);
//! - *refuse*: the same in a domain of 1 per hour, every value already spent before the run:
//!   every decision a refusal;
//! - *nested*: two descriptors, `remote_address` and the nested `plan=free`, `user`, both
//!   limited (a request of two limits is looked at, then taken from).
//!
//! `--prometheus` installs the Prometheus recorder, as `tollgate-rls` does (by default the
//! metrics go to the facade's no-op recorder).
//!
//! `--instructions N --subject empty|grant|refuse|nested` instead makes N direct calls of
//! `RateLimitService::should_rate_limit` (no network: a clone of the request, the call, the
//! answer dropped) on one thread after one pass over every value, for counting under
//! callgrind; the difference between two values of N over their difference is the count per
//! call:
//!
//! ```sh
//! for n in 20000 40000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/release/examples/rls_throughput --instructions $n --subject grant
//! done
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tokio::runtime::Runtime;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::envoy::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

#[path = "support/report.rs"]
mod report;

const USAGE: &str = "usage: rls_throughput [--seconds N] [--server-threads N] \
[--client-threads N] [--prometheus] [--instructions N --subject empty|grant|refuse|nested]";

/// Two domains: `edge`, never reached, and `edge_over`, 1 per hour.
const CONFIG: &str = "\
domain: edge
method: token_bucket
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1000000000}
---
domain: edge_over
method: token_bucket
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// Distinct values each case cycles over.
const VALUES: usize = 10_000;

const STREAMS: [usize; 3] = [1, 8, 64];

/// The connections of the runs of more than one stream that spread them.
const SPREAD_CONNECTIONS: usize = 4;

/// Turns each server's time in a case is split into.
const ROUNDS: u32 = 4;

const WARM_UP: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Grant,
    Refuse,
    Nested,
}

impl Case {
    const ALL: [Case; 3] = [Case::Grant, Case::Refuse, Case::Nested];

    fn name(self) -> &'static str {
        match self {
            Case::Grant => "grant",
            Case::Refuse => "refuse",
            Case::Nested => "nested",
        }
    }

    fn requests(self) -> Vec<RateLimitRequest> {
        (0..VALUES)
            .map(|index| {
                let address = format!("10.{}.{}.{}", index >> 16, (index >> 8) & 255, index & 255);
                let (domain, mut descriptors) = match self {
                    Case::Grant => ("edge", vec![descriptor(&[("remote_address", &address)])]),
                    Case::Refuse => (
                        "edge_over",
                        vec![descriptor(&[("remote_address", &address)])],
                    ),
                    Case::Nested => ("edge", vec![descriptor(&[("remote_address", &address)])]),
                };
                if self == Case::Nested {
                    descriptors.push(descriptor(&[
                        ("plan", "free"),
                        ("user", &format!("user-{index}")),
                    ]));
                }
                RateLimitRequest {
                    domain: domain.to_owned(),
                    descriptors,
                    hits_addend: 0,
                }
            })
            .collect()
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// The floor: the same trait, answering OK at once.
#[derive(Debug, Clone, Copy)]
struct EmptyService;

#[tonic::async_trait]
impl RateLimitService for EmptyService {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        }))
    }
}

#[derive(Debug)]
struct Options {
    seconds: f64,
    server_threads: usize,
    client_threads: usize,
    prometheus: bool,
    instructions: Option<u64>,
    subject: Option<String>,
}

fn parse_options(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        seconds: 1.5,
        server_threads: 1,
        client_threads: 1,
        prometheus: false,
        instructions: None,
        subject: None,
    };
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let whole = |text: String| -> Result<u64, String> {
            text.parse::<u64>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("{flag} {text:?}: expected a whole number of at least 1"))
        };
        match flag.as_str() {
            "--seconds" => {
                let text = value()?;
                options.seconds = text
                    .parse::<f64>()
                    .ok()
                    .filter(|&s| (0.1..=600.0).contains(&s))
                    .ok_or_else(|| format!("--seconds {text:?}: expected 0.1 to 600"))?;
            }
            "--server-threads" => options.server_threads = whole(value()?)? as usize,
            "--client-threads" => options.client_threads = whole(value()?)? as usize,
            "--prometheus" => options.prometheus = true,
            "--instructions" => options.instructions = Some(whole(value()?)?),
            "--subject" => options.subject = Some(value()?),
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    report::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let options = parse_options(std::env::args().skip(1))?;
    if options.prometheus {
        metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    }
    let config = RlsConfig::from_yaml_str("rls_throughput", CONFIG)?;
    match options.instructions {
        Some(calls) => {
            let subject = options
                .subject
                .ok_or_else(|| format!("--instructions needs --subject\n{USAGE}"))?;
            count_calls(&config, &subject, calls)
        }
        None => measure_all(&config, &options),
    }
}

/// `calls` direct calls of the trait, after one pass over every value, on one thread.
fn count_calls(config: &RlsConfig, subject: &str, calls: u64) -> Result<(), Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let (case, empty) = match subject {
        "empty" => (Case::Grant, true),
        "grant" => (Case::Grant, false),
        "refuse" => (Case::Refuse, false),
        "nested" => (Case::Nested, false),
        other => {
            return Err(format!("--subject {other:?}: expected empty|grant|refuse|nested").into());
        }
    };
    let requests = case.requests();
    runtime.block_on(async {
        let server = RateLimitServer::new(config, in_process()).await?;
        let call = async |request: &RateLimitRequest| {
            let request = Request::new(request.clone());
            let answer = if empty {
                EmptyService.should_rate_limit(request).await
            } else {
                server.should_rate_limit(request).await
            };
            std::hint::black_box(answer).map(drop)
        };
        for request in &requests {
            call(request).await?;
        }
        for request in requests.iter().cycle().take(calls as usize) {
            call(request).await?;
        }
        println!("{calls} calls of {subject}");
        Ok(())
    })
}

fn in_process() -> StateStore {
    StateStore::InProcess {
        clients: 4 * VALUES,
    }
}

/// What the calls of one server in one case came to, over its rounds.
#[derive(Default)]
struct Calls {
    /// The latency of every call counted.
    latencies: Vec<Duration>,
    refused: u64,
    elapsed: Duration,
}

impl Calls {
    fn add(&mut self, round: Calls) {
        self.latencies.extend(round.latencies);
        self.refused += round.refused;
        self.elapsed += round.elapsed;
    }

    fn figures(mut self) -> Result<Figures, Box<dyn Error>> {
        if self.latencies.is_empty() {
            return Err("no call completed while measuring".into());
        }
        self.latencies.sort_unstable();
        let last = self.latencies.len() - 1;
        let quantile = |q: f64| self.latencies[(last as f64 * q).round() as usize];
        Ok(Figures {
            per_second: self.latencies.len() as f64 / self.elapsed.as_secs_f64(),
            p50: quantile(0.50),
            p99: quantile(0.99),
            refused: self.refused as f64 / self.latencies.len() as f64,
        })
    }
}

/// One server's figures in one case.
struct Figures {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    refused: f64,
}

fn measure_all(config: &RlsConfig, options: &Options) -> Result<(), Box<dyn Error>> {
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.server_threads)
        .thread_name("server")
        .enable_all()
        .build()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.client_threads)
        .thread_name("client")
        .enable_all()
        .build()?;
    let tollgate = RateLimitServer::new(config, in_process());
    let tollgate = server_runtime.block_on(tollgate)?;
    let tollgate_addr = serve(&server_runtime, tollgate.clone().into_service())?;
    let empty_addr = serve(&server_runtime, RateLimitServiceServer::new(EmptyService))?;

    let cases: Vec<(Case, Arc<Vec<RateLimitRequest>>)> = Case::ALL
        .iter()
        .map(|&case| (case, Arc::new(case.requests())))
        .collect();
    // Spend every value of the refusing domain, so that its run is refusals only.
    client_runtime.block_on(async {
        for request in cases[1].1.iter() {
            tollgate.decide(request).await?;
        }
        Ok::<_, Status>(())
    })?;

    let measured = Duration::from_secs_f64(options.seconds);
    println!(
        "{} logical CPUs, load average {}; server runtime {} worker(s), client runtime {} \
         worker(s); {} s per server and case in {ROUNDS} rounds{}",
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
        options.server_threads,
        options.client_threads,
        options.seconds,
        if options.prometheus {
            "; Prometheus recorder installed"
        } else {
            ""
        },
    );
    println!();
    println!(
        "| streams | connections | case | empty calls/s | tollgate decisions/s | tollgate / empty \
         | empty p50 / p99 µs | tollgate p50 / p99 µs |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for streams in STREAMS {
        let spreads: &[usize] = if streams == 1 {
            &[1]
        } else {
            &[1, SPREAD_CONNECTIONS]
        };
        for &connections in spreads {
            for (case, requests) in &cases {
                let run = |addr| {
                    client_runtime.block_on(measure(
                        addr,
                        Arc::clone(requests),
                        streams,
                        connections,
                        measured / ROUNDS,
                    ))
                };
                let (mut floor, mut ours) = (Calls::default(), Calls::default());
                for _ in 0..ROUNDS {
                    floor.add(run(empty_addr)?);
                    ours.add(run(tollgate_addr)?);
                }
                let (floor, ours) = (floor.figures()?, ours.figures()?);
                let expected_refusals = if *case == Case::Refuse { 1.0 } else { 0.0 };
                if (ours.refused - expected_refusals).abs() > 1e-9 {
                    return Err(format!(
                        "case {}: {:.4} of the decisions refused, expected {expected_refusals}",
                        case.name(),
                        ours.refused
                    )
                    .into());
                }
                println!(
                    "| {streams} | {connections} | {} | {:.0} | {:.0} | {:.2}x | {:.0} / {:.0} \
                     | {:.0} / {:.0} |",
                    case.name(),
                    floor.per_second,
                    ours.per_second,
                    ours.per_second / floor.per_second,
                    micros(floor.p50),
                    micros(floor.p99),
                    micros(ours.p50),
                    micros(ours.p99),
                );
            }
        }
    }
    println!();
    println!("load average at the end {}", load_average());
    Ok(())
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

/// The first figure of /proc/loadavg, or `?` where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Serves `service` on a loopback port of its own on `runtime`, as `tollgate-rls` does.
fn serve<S>(runtime: &Runtime, service: RateLimitServiceServer<S>) -> std::io::Result<SocketAddr>
where
    S: RateLimitService,
{
    let _entered = runtime.enter();
    let incoming =
        TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?.with_nodelay(Some(true));
    let addr = incoming
        .local_addr()
        .expect("a bound listener has an address");
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

/// Keeps `streams` calls in flight over `connections` new connections to `addr` for a warm-up
/// and then `measured`; counts the calls that started and ended while measuring.
async fn measure(
    addr: SocketAddr,
    requests: Arc<Vec<RateLimitRequest>>,
    streams: usize,
    connections: usize,
    measured: Duration,
) -> Result<Calls, Box<dyn Error>> {
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    let phase = Arc::new(AtomicU8::new(WARMING));
    let tasks: Vec<_> = (0..streams)
        .map(|stream| {
            let client =
                RateLimitServiceClient::new(Channel::clone(&channels[stream % connections]));
            let offset = stream * VALUES / streams;
            tokio::spawn(call_until_stopped(
                client,
                Arc::clone(&requests),
                offset,
                Arc::clone(&phase),
            ))
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    // Relaxed: the phase only gates which calls are counted; the join below orders the figures.
    phase.store(MEASURING, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(measured).await;
    phase.store(STOPPED, Ordering::Relaxed);
    let elapsed = started.elapsed();

    let mut calls = Calls {
        elapsed,
        ..Calls::default()
    };
    for task in tasks {
        let (latencies, refused) = task.await??;
        calls.latencies.extend(latencies);
        calls.refused += refused;
    }
    Ok(calls)
}

/// One stream: calls one after another from `offset` until stopped; the latencies of the
/// calls made while measuring, and how many of them were refused.
async fn call_until_stopped(
    mut client: RateLimitServiceClient<Channel>,
    requests: Arc<Vec<RateLimitRequest>>,
    offset: usize,
    phase: Arc<AtomicU8>,
) -> Result<(Vec<Duration>, u64), Status> {
    let mut latencies = Vec::new();
    let mut refused = 0;
    for request in requests.iter().cycle().skip(offset) {
        let before = phase.load(Ordering::Relaxed);
        if before == STOPPED {
            break;
        }
        let started = Instant::now();
        let answer = client.should_rate_limit(request.clone()).await?;
        let took = started.elapsed();
        if before == MEASURING && phase.load(Ordering::Relaxed) == MEASURING {
            latencies.push(took);
            refused += u64::from(answer.get_ref().overall_code == Code::OverLimit as i32);
        }
    }
    Ok((latencies, refused))
}
