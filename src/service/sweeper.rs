//! [`Sweeper`]: a service's idle eviction on a background thread.

use std::fmt;
use std::hash::{BuildHasher, Hash};

use super::rate_limiter::RateLimiterService;
use crate::clock::Clock;

/// Runs [`RateLimiterService::sweep`] on a background thread every `interval`; the thread stops
/// when this handle is dropped (or when the service is).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, Sweeper};
///
/// let service: Arc<RateLimiterService<u64, &str, FakeClock>> = Arc::new(
///     RateLimiterService::new(Algorithm::TokenBucket, [("free", Rule::per_second(5)?)], FakeClock::new())?,
/// );
/// let sweeper = Sweeper::start(&service, Duration::from_millis(100))?;
/// // ... serve requests ...
/// drop(sweeper); // stops and joins the thread
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "the sweeper stops as soon as this handle is dropped"]
pub struct Sweeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sweeper {
    /// Starts sweeping `service` every `interval`. The thread holds only a weak reference, so it
    /// never keeps the service alive.
    ///
    /// # Errors
    ///
    /// An [`std::io::Error`] of kind `InvalidInput` when `interval` is zero (the thread would
    /// spin), or the OS's error when it refuses a new thread.
    pub fn start<K, P, C, S>(
        service: &std::sync::Arc<RateLimiterService<K, P, C, S>>,
        interval: std::time::Duration,
    ) -> std::io::Result<Sweeper>
    where
        K: Hash + Eq + Send + Sync + 'static,
        P: Eq + fmt::Debug + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        if interval.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "sweep interval 0s is invalid: it must be at least 1ns (1ms is typical)",
            ));
        }
        let service = std::sync::Arc::downgrade(service);
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tollgate-sweeper".into())
            .spawn(move || {
                // A timeout means "sweep now"; a message or a dropped sender means "stop".
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(interval)
                {
                    match service.upgrade() {
                        Some(service) => {
                            service.sweep();
                        }
                        None => return,
                    }
                }
            })?;
        Ok(Sweeper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A sweep that panicked has nothing left to clean up; the join only waits for it.
            let _ = thread.join();
        }
    }
}
