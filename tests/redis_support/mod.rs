//! A throwaway `redis-server` for the tests: its own loopback port, no persistence, stopped on
//! drop. A missing binary fails the test loudly; it is never skipped.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting server has to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `redis-server`, killed when dropped.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra: Vec<String>,
}

impl RedisServer {
    /// A server on a free loopback port.
    pub(crate) fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server on a free loopback port with `extra` arguments (say `--requirepass`).
    pub(crate) fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // `--port 0` is not supported: take a free port from the OS, release it, and try
        // another if the server loses the race for it.
        for _ in 0..10 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                extra: extra.clone(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// Starts the process on `self.port`; whether it answers PING.
    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not installed, and the Redis tests need it: run \
                 `apt-get update && apt-get install -y redis-server` (or `bash .ci/test`, which \
                 does)"
            ),
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
