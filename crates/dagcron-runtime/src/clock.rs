//! Time as a dependency: the engine asks a [`Clock`] for "now" and for a
//! wake-up, so tests can drive a year of schedules with a [`ManualClock`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

/// A source of time.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
    /// Completes at or after `at`.
    fn sleep_until(&self, at: Timestamp) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn sleep_until(&self, at: Timestamp) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            // Tokio's timer wheel has a 1 ms granularity and rounds up, so
            // sleep until just before the instant, then yield until it comes:
            // fires land within microseconds of their instant, for at most
            // SPIN of busy waiting per wake-up.
            const SPIN: Duration = Duration::from_micros(1500);
            let wait =
                Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
            if wait > SPIN {
                tokio::time::sleep(wait - SPIN).await;
            }
            while Timestamp::now() < at {
                tokio::task::yield_now().await;
            }
        })
    }
}

/// A clock that moves only when told to.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Timestamp>>,
    tick: watch::Sender<Timestamp>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
            tick: watch::channel(start).0,
        }
    }

    /// Moves time forward by `by`, waking every sleeper whose instant has come.
    pub fn advance(&self, by: SignedDuration) {
        let mut now = self.now.lock().expect("clock lock");
        *now = now.checked_add(by).expect("in range");
        self.tick.send_replace(*now);
    }

    /// Sets the time (forward only).
    pub fn set(&self, to: Timestamp) {
        let mut now = self.now.lock().expect("clock lock");
        assert!(to >= *now, "a manual clock only moves forward");
        *now = to;
        self.tick.send_replace(to);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().expect("clock lock")
    }

    fn sleep_until(&self, at: Timestamp) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.tick.subscribe();
        Box::pin(async move {
            // An error means the clock is gone: then nothing will ever wake us.
            let _ = rx.wait_for(|now| *now >= at).await;
        })
    }
}
