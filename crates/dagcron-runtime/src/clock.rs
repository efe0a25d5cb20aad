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
            // Tokio's timer wheel has a 1 ms granularity and rounds up: it
            // takes the wait to within NEAR of the instant, and a precise
            // timer the rest of the way.
            let wait = until(at);
            if wait > NEAR {
                tokio::time::sleep(wait - NEAR).await;
            }
            precise::sleep_until(at).await;
        })
    }
}

/// The system clock read `offset` away from the true time: a node whose
/// clock is wrong, for fault drills and their tests, never for real work.
#[derive(Clone, Copy, Debug)]
pub struct SkewedClock {
    /// How far ahead it reads (negative: behind).
    pub offset: SignedDuration,
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let now = Timestamp::now();
        now.checked_add(self.offset).unwrap_or(now)
    }

    fn sleep_until(&self, at: Timestamp) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let at = at.checked_sub(self.offset).unwrap_or(at);
        SystemClock.sleep_until(at)
    }
}

/// How close to its instant a wait leaves the coarse timer for the precise one.
const NEAR: Duration = Duration::from_millis(2);

/// The time left until `at` (zero once it has passed).
fn until(at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO)
}

/// How long before its instant a precise wait stops sleeping and spins. A
/// thread asleep on a timer is woken some tens of microseconds after the
/// timer expires (50-170 µs measured on the 2-core virtual machines this
/// project is benchmarked on); spinning the last stretch makes the wake-up
/// land on the instant, for at most this much of one core per instant.
const SPIN: Duration = Duration::from_micros(200);

/// Spins until `at` has come, for at most twice [`SPIN`]: a wall clock
/// stepped back while spinning must not hold a core (the caller yields the
/// rest of the way).
fn spin_until(at: Timestamp) {
    let start = std::time::Instant::now();
    while Timestamp::now() < at && start.elapsed() < 2 * SPIN {
        std::hint::spin_loop();
    }
}

/// Yields until `at` has come: the last resort when no precise timer is
/// available, at the cost of a busy worker for the time left.
async fn yield_until(at: Timestamp) {
    while Timestamp::now() < at {
        tokio::task::yield_now().await;
    }
}

#[cfg(target_os = "linux")]
mod precise {
    //! A timerfd on the wall clock with an absolute expiry: the kernel's
    //! high-resolution timer wakes the runtime's poller at the instant,
    //! with no busy waiting. An absolute wall-clock timer also follows a
    //! step of the clock, as the engine's instants do.

    use std::os::fd::{AsFd, AsRawFd, RawFd};

    use jiff::Timestamp;
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    use tokio::io::unix::AsyncFd;

    struct Fd(TimerFd);

    impl AsRawFd for Fd {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_fd().as_raw_fd()
        }
    }

    fn armed(at: Timestamp) -> std::io::Result<AsyncFd<Fd>> {
        let timer = TimerFd::new(
            ClockId::CLOCK_REALTIME,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        let expiry = TimeSpec::new(at.as_second(), i64::from(at.subsec_nanosecond()));
        timer.set(
            Expiration::OneShot(expiry),
            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        )?;
        // `new` is deprecated because a value could hand out a descriptor
        // it does not own; this one owns its descriptor (closed when the
        // `AsyncFd` drops it, after deregistering), and the unsafe
        // `register` that replaces it is forbidden in this codebase.
        #[allow(deprecated)]
        AsyncFd::new(Fd(timer))
    }

    pub(super) async fn sleep_until(at: Timestamp) {
        let Ok(wake) = at.checked_sub(super::SPIN) else {
            return super::yield_until(at).await;
        };
        if Timestamp::now() < wake {
            match armed(wake) {
                // Readable once it has expired; the descriptor closes on drop.
                Ok(timer) => {
                    let _ = timer.readable().await;
                }
                Err(e) => tracing::debug!("no precise timer ({e}); yielding until the instant"),
            }
        }
        super::spin_until(at);
        super::yield_until(at).await;
    }
}

#[cfg(not(target_os = "linux"))]
mod precise {
    pub(super) async fn sleep_until(at: jiff::Timestamp) {
        super::yield_until(at).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The system clock's wait never ends before its instant, whether the
    /// instant is past, within the precise timer's reach, or beyond it.
    #[tokio::test]
    async fn the_system_clock_never_wakes_early() {
        for ahead_us in [-1_000, 0, 50, 300, 1_900, 2_100, 4_500] {
            let at = Timestamp::now()
                .checked_add(SignedDuration::from_micros(ahead_us))
                .unwrap();
            SystemClock.sleep_until(at).await;
            assert!(
                Timestamp::now() >= at,
                "woke before {at} ({ahead_us} µs ahead)"
            );
        }
    }

    /// Many waits at once (the engine's loop, a lease watchdog, tests) each
    /// end at their own instant, and a dropped wait leaves the others be.
    #[tokio::test]
    async fn concurrent_system_clock_waits_end_at_their_own_instants() {
        let start = Timestamp::now();
        let instants: Vec<Timestamp> = (1..=20)
            .map(|i| {
                start
                    .checked_add(SignedDuration::from_micros(i * 250))
                    .unwrap()
            })
            .collect();
        let dropped = SystemClock.sleep_until(instants[10]);
        drop(dropped);
        let woke = futures_join(instants.iter().map(|&at| async move {
            SystemClock.sleep_until(at).await;
            (at, Timestamp::now())
        }))
        .await;
        for (at, now) in woke {
            assert!(now >= at, "woke at {now}, before {at}");
        }
    }

    /// A spin ends at its instant, and never holds the core for more than
    /// twice SPIN, even for an instant far away (as after a step of the
    /// clock back).
    #[test]
    fn a_spin_ends_at_its_instant_and_is_bounded() {
        let at = Timestamp::now()
            .checked_add(SignedDuration::from_micros(100))
            .unwrap();
        spin_until(at);
        assert!(Timestamp::now() >= at, "the spin ended before its instant");
        let far = Timestamp::now()
            .checked_add(SignedDuration::from_secs(3600))
            .unwrap();
        let start = std::time::Instant::now();
        spin_until(far);
        assert!(
            start.elapsed() >= 2 * SPIN,
            "the spin gave up before its bound"
        );
        assert!(Timestamp::now() < far);
    }

    async fn futures_join<F: Future + Send + 'static>(
        futures: impl Iterator<Item = F>,
    ) -> Vec<F::Output>
    where
        F::Output: Send + 'static,
    {
        let handles: Vec<_> = futures.map(tokio::spawn).collect();
        let mut out = Vec::new();
        for handle in handles {
            out.push(handle.await.expect("a wait"));
        }
        out
    }
}
