//! Test support: waiting, bounded, until a condition holds.
//!
//! Every test that waits for something to happen waits with [`until`] (or
//! [`until_async`] in async code), never with a sleep and a hope: the
//! condition is polled, at first often, then less, until it holds or the
//! deadline passes; the failure says what was awaited and what was seen
//! last. A check returns `bool`, `Option<T>` (the value it waited for) or
//! `Result<T, E>` (the error says what it saw instead).
//!
//! The deadline is generous ([`PATIENCE`]) because the machines that run
//! the suite are shared and loaded: it only bounds a test that would hang,
//! it never measures speed.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a wait lasts unless a test gives its own bound.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// What a check returned: done with a value, or not yet (with what it saw).
pub trait Check {
    /// What the wait returns once the check is done.
    type Value;
    /// Done with its value, or not yet, with what the check saw if it says.
    fn settle(self) -> Result<Self::Value, Option<String>>;
}

impl Check for bool {
    type Value = ();
    fn settle(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    fn settle(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;
    fn settle(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// The pause before the next poll: 5 ms, doubling up to 100 ms.
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(100))
}

fn timed_out(what: &str, within: Duration, seen: Option<String>) -> ! {
    match seen {
        Some(seen) => panic!("timed out after {within:?} waiting until {what}; last seen: {seen}"),
        None => panic!("timed out after {within:?} waiting until {what}"),
    }
}

/// Polls `check` until it is done, at most [`PATIENCE`]; returns its value.
#[track_caller]
pub fn until<C: Check>(what: &str, check: impl FnMut() -> C) -> C::Value {
    until_within(PATIENCE, what, check)
}

/// As [`until`], bounded by `within`.
#[track_caller]
pub fn until_within<C: Check>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> C,
) -> C::Value {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        match check().settle() {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => timed_out(what, within, seen),
            Err(_) => {}
        }
        std::thread::sleep(pause);
        pause = next_pause(pause);
    }
}

/// As [`until`], in async code (the wait is a tokio sleep).
pub async fn until_async<C: Check>(what: &str, check: impl AsyncFnMut() -> C) -> C::Value {
    until_async_within(PATIENCE, what, check).await
}

/// As [`until_async`], bounded by `within`.
pub async fn until_async_within<C: Check>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> C,
) -> C::Value {
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        match check().await.settle() {
            Ok(value) => return value,
            Err(seen) if tokio::time::Instant::now() >= deadline => timed_out(what, within, seen),
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_check_holds() {
        let mut n = 0;
        let got = until("the third poll", || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "waiting until never; last seen: still 7")]
    fn a_timeout_says_what_was_awaited_and_what_was_seen() {
        until_within(Duration::from_millis(20), "never", || {
            Err::<(), _>("still 7")
        });
    }

    #[tokio::test]
    async fn the_async_wait_polls_until_the_check_holds() {
        let mut n = 0;
        until_async("the second poll", async || {
            n += 1;
            n == 2
        })
        .await;
        assert_eq!(n, 2);
    }
}
