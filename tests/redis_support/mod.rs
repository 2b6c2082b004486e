//! Throwaway `redis-server`s for the tests: each on its own loopback port, no persistence,
//! stopped on drop; also a 3-master cluster of them, and a server that speaks only TLS. A
//! missing binary fails the test loudly; it is never skipped.

#![allow(dead_code)]

#[cfg(all(feature = "redis", feature = "test-util"))]
pub(crate) mod grants;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The round-trip timeout of a limiter whose decisions a test checks: its answers are checked,
/// not its latency, and on a loaded machine a call can take longer than the default (50 ms),
/// which would turn an answer into the failure policy's. Tests of failures set their own.
pub(crate) const DECISION_TIMEOUT: Duration = Duration::from_secs(5);

/// A small deterministic generator (xorshift64*) for the randomized Redis tests, so that a
/// failure names its seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..=max`.
    pub(crate) fn upto(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next();
        }
        self.next() % (max + 1)
    }

    /// A number in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A number in `lo..=hi` (`lo` when `hi` is not above it).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }

    /// True `percent` times in 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.upto(99) < percent
    }

    /// One of `items`.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.upto(items.len() as u64 - 1) as usize]
    }
}

/// Every future's output, each polled in turn, first to last, on every wake: requests asked
/// together so reach a limiter's batch queue in their order (on a test's one thread), as a
/// batch's order.
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(&mut outputs) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

/// Whether two keys' times to live (`PTTL`, in milliseconds; negative: no expiry, or no key)
/// agree within `tolerance_ms`: twin keys are written moments apart, so their expiries differ
/// by that much, but no more.
pub(crate) fn ttls_within(a: i64, b: i64, tolerance_ms: u64) -> bool {
    if a < 0 || b < 0 {
        a == b
    } else {
        a.abs_diff(b) <= tolerance_ms
    }
}

/// The greatest common divisor of `a` and `b`.
pub(crate) fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The inverse of `a` modulo `m`, if they are coprime.
pub(crate) fn inverse_mod(a: u128, m: u128) -> Option<u128> {
    if m == 1 {
        return Some(0);
    }
    let (mut old_r, mut r) = (a as i128 % m as i128, m as i128);
    let (mut old_s, mut s) = (1i128, 0i128);
    while r != 0 {
        let q = old_r / r;
        (old_r, r) = (r, old_r - q * r);
        (old_s, s) = (s, old_s - q * s);
    }
    (old_r == 1).then(|| old_s.rem_euclid(m as i128) as u128)
}

/// How long a starting server has to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What to do when a Redis binary is missing.
const INSTALL: &str = "run `apt-get update && apt-get install -y redis-server` (or `bash .ci/test`, \
                       which does)";

/// A running `redis-server`, killed when dropped.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra: Vec<String>,
    /// Serves TLS only, on `port`: ready once it accepts connections (a plain PING gets no
    /// answer).
    tls: bool,
}

impl RedisServer {
    /// A server on a free loopback port.
    pub(crate) fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server on a free loopback port with `extra` arguments (say `--requirepass`).
    pub(crate) fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_on_free_port(extra, false)
    }

    /// A server speaking only TLS, with `extra` arguments (its `--tls-*` files).
    pub(crate) fn start_tls(extra: &[&str]) -> RedisServer {
        RedisServer::start_on_free_port(extra, true)
    }

    fn start_on_free_port(extra: &[&str], tls: bool) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // `--port 0` is not supported: take a free port from the OS, release it, and try
        // another if the server loses the race for it.
        for _ in 0..10 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                extra: extra.clone(),
                tls,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// Starts the process on `self.port`; whether it answers PING.
    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let ports: &[&str] = if self.tls {
            &["--port", "0", "--tls-port", &port]
        } else {
            &["--port", &port]
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                panic!("redis-server is not installed, and the Redis tests need it: {INSTALL}")
            }
            Err(error) => panic!("cannot start redis-server: {error}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if self.answers_ping() {
                return true;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                // Exited: most likely the port was taken meanwhile.
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if self.tls {
            return true;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut reply = [0u8; 64];
        match stream.read(&mut reply) {
            // `-NOAUTH` from a server with a password is an answer too.
            Ok(read) => {
                reply[..read].starts_with(b"+PONG") || reply[..read].starts_with(b"-NOAUTH")
            }
            Err(_) => false,
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("server is running")
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A paused server must run to die; it may be gone already, so no check.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: persistence is off).
    pub(crate) fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        // The port may linger for a moment after the kill.
        while !self.spawn() {
            assert!(Instant::now() < deadline, "redis-server did not restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub(crate) fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub(crate) fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// A plain connection for inspecting keys.
    pub(crate) async fn connection(&self) -> ::redis::aio::MultiplexedConnection {
        ::redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback, each owning a third of the slots,
/// stopped on drop. Its masters serve their own slots while another is down
/// (`cluster-require-full-coverage no`).
#[derive(Debug)]
pub(crate) struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: ScratchDir,
    /// What `redis-cli` needs to reach the nodes: `--tls --cacert <file>` for a TLS cluster.
    cli_tls: Vec<String>,
}

impl RedisCluster {
    pub(crate) fn start() -> RedisCluster {
        RedisCluster::start_on(None)
    }

    /// A cluster whose nodes speak TLS only, to clients and on the cluster bus: `tls` are each
    /// server's `--tls-*` arguments (certificate, key, authority), and `ca_file` the authority
    /// that `redis-cli` trusts.
    pub(crate) fn start_tls(tls: &[&str], ca_file: &str) -> RedisCluster {
        RedisCluster::start_on(Some((tls, ca_file)))
    }

    fn start_on(tls: Option<(&[&str], &str)>) -> RedisCluster {
        let dir = ScratchDir::new("cluster");
        let cli_tls: Vec<String> = match tls {
            Some((_, ca_file)) => vec!["--tls".into(), "--cacert".into(), ca_file.into()],
            None => Vec::new(),
        };
        let nodes: Vec<RedisServer> = (0..3)
            .map(|node| {
                let config = dir.path().join(format!("nodes-{node}.conf"));
                let mut extra = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    config.to_str().expect("a UTF-8 temporary path"),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--dir",
                    dir.path().to_str().expect("a UTF-8 temporary path"),
                ];
                match tls {
                    Some((tls, _)) => {
                        extra.extend(tls);
                        extra.extend(["--tls-cluster", "yes"]);
                        RedisServer::start_tls(&extra)
                    }
                    None => RedisServer::start_with(&extra),
                }
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let mut create: Vec<&str> = cli_tls.iter().map(String::as_str).collect();
        create.extend(["--cluster", "create"]);
        create.extend(addresses.iter().map(String::as_str));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = redis_cli(&create);
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster {
            nodes,
            dir,
            cli_tls,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while !cluster.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Whether every node reports `cluster_state:ok` and knows all three masters.
    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info = self.cli(node, &["cluster", "info"]);
            let info = String::from_utf8_lossy(&info.stdout);
            info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
        })
    }

    /// `redis-cli` run with `args` against `node`.
    fn cli(&self, node: &RedisServer, args: &[&str]) -> std::process::Output {
        let port = node.port().to_string();
        let mut all: Vec<&str> = self.cli_tls.iter().map(String::as_str).collect();
        all.extend(["-p", &port]);
        all.extend(args);
        redis_cli(&all)
    }

    /// The index of the node that holds `key` (read with `redis-cli`, which works over TLS too);
    /// panics if none does.
    pub(crate) fn node_holding(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| {
                let exists = self.cli(node, &["exists", key]);
                String::from_utf8_lossy(&exists.stdout).trim() == "1"
            })
            .unwrap_or_else(|| panic!("no node holds {key}"))
    }

    /// A URL naming one node, as a deployment would.
    pub(crate) fn url(&self) -> String {
        let scheme = if self.cli_tls.is_empty() {
            "redis+cluster"
        } else {
            "rediss+cluster"
        };
        format!("{scheme}://127.0.0.1:{}", self.nodes[0].port())
    }

    pub(crate) fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Kills node `index` (SIGKILL), as a crash would.
    pub(crate) fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Freezes node `index` (SIGSTOP), and thaws it on drop.
    pub(crate) fn pause(&self, index: usize) -> Paused<'_> {
        self.nodes[index].pause();
        Paused(&self.nodes[index])
    }
}

/// A paused node, thawed when dropped (a frozen server also ignores the SIGKILL of its drop
/// until thawed).
#[derive(Debug)]
pub(crate) struct Paused<'a>(&'a RedisServer);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Runs `redis-cli` with `args` on loopback.
fn redis_cli(args: &[&str]) -> std::process::Output {
    match Command::new("redis-cli")
        .args(["-h", "127.0.0.1"])
        .args(args)
        .output()
    {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            panic!("redis-cli is not installed, and the Redis tests need it: {INSTALL}")
        }
        Err(error) => panic!("cannot run redis-cli: {error}"),
    }
}

/// A fresh directory under the system's temporary one, removed on drop.
#[derive(Debug)]
pub(crate) struct ScratchDir(PathBuf);

impl ScratchDir {
    pub(crate) fn new(name: &str) -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("tollgate-{name}-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        ScratchDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status();
    assert!(
        status.is_ok_and(|status| status.success()),
        "kill -{name} {pid} failed"
    );
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("a bound address").port()
}
