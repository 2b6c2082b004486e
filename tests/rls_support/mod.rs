//! A `tollgate-rls` process for the tests: started on a free loopback port with a
//! configuration file, killed on drop; and a gRPC client for it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::envoy::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

/// A running `tollgate-rls`, killed when dropped.
#[derive(Debug)]
pub(crate) struct Rls {
    child: Child,
    address: SocketAddr,
}

impl Rls {
    /// Starts the binary on a free loopback port with `config` and `extra` arguments, and waits
    /// until it serves.
    pub(crate) fn start(config: &Path, extra: &[&str]) -> Rls {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-rls"))
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tollgate-rls starts");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("tollgate-rls prints where it listens");
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("tollgate-rls printed {line:?}, not `listening on ADDR`"))
            .parse()
            .expect("an address");
        Rls { child, address }
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    pub(crate) fn port(&self) -> u16 {
        self.address.port()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A gRPC client of it.
    pub(crate) async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.address))
            .await
            .expect("the service accepts a connection")
    }

    /// Stops it now.
    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A file of its own for a test's configuration, removed on drop.
#[derive(Debug)]
pub(crate) struct ConfigFile(PathBuf);

impl ConfigFile {
    pub(crate) fn new(yaml: &str) -> ConfigFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tollgate-rls-{}-{}.yaml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, yaml).expect("the configuration is written");
        ConfigFile(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Replaces the configuration at once (written beside it, then renamed over it), so that
    /// a watcher never reads it half written.
    pub(crate) fn rewrite(&self, yaml: &str) {
        let next = self.0.with_extension("next");
        std::fs::write(&next, yaml).expect("the configuration is written");
        std::fs::rename(&next, &self.0).expect("the configuration is replaced");
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A descriptor of `entries` (key, value), its hits the request's.
pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
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

/// A descriptor of `entries` that brings its own limit (`RateLimitDescriptor.limit`):
/// `requests_per_unit` per `unit` (envoy.type.v3.RateLimitUnit's number: 1 second, 2 minute,
/// 3 hour, 4 day, 5 month, 6 year, 7 week).
pub(crate) fn bringing(
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: i32,
) -> RateLimitDescriptor {
    let mut made = descriptor(entries);
    made.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit,
    });
    made
}

/// `descriptor` asking `hits` permits (its own `hits_addend`).
pub(crate) fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor
}

/// `descriptor` made a refund of `hits` permits (`is_negative_hits`).
pub(crate) fn refund(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.is_negative_hits = true;
    with_hits(descriptor, hits)
}

/// A request of `domain` with one descriptor per list of entries.
pub(crate) fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend: 0,
    }
}

/// How many of `times` copies of `request` are answered OK.
pub(crate) async fn oks(
    client: &mut RateLimitServiceClient<Channel>,
    request: &RateLimitRequest,
    times: usize,
) -> usize {
    let mut ok = 0;
    for _ in 0..times {
        let answer: RateLimitResponse = client
            .should_rate_limit(request.clone())
            .await
            .expect("the service answers")
            .into_inner();
        if answer.overall_code == 1 {
            ok += 1;
        }
    }
    ok
}

/// Polls `check` every 50 ms for up to `within`; whether it came true.
pub(crate) async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A runtime of one thread, for tests that decide from threads of their own.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The service of the configuration `yaml`, its state in process for `clients` per limited
/// descriptor, built on `runtime`.
pub(crate) fn in_process(
    runtime: &tokio::runtime::Runtime,
    yaml: &str,
    clients: usize,
) -> tollgate::envoy::RateLimitServer {
    let config =
        tollgate::envoy::RlsConfig::from_yaml_str("test.yaml", yaml).expect("valid configuration");
    runtime
        .block_on(tollgate::envoy::RateLimitServer::new(
            &config,
            tollgate::envoy::StateStore::InProcess { clients },
        ))
        .expect("the service builds")
}
