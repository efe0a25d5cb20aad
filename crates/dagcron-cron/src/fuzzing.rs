//! The checks the fuzz target runs on arbitrary input, shared with the test
//! that replays the fuzz corpus so both exercise the same properties.

use jiff::Timestamp;

use crate::{Options, Schedule};

/// Parses `input`; if it is valid, checks that the search, the explanation
/// and the normal form hold their promises near a few instants. Panics on a
/// violation.
pub fn check(input: &str) {
    let Ok(schedule) = Schedule::parse_with(
        input,
        &Options {
            hash_seed: 7,
            ..Options::default()
        },
    ) else {
        return;
    };
    let _ = schedule.explain();
    let normal = schedule.normalized();
    let again = Schedule::parse_with(
        &normal,
        &Options {
            hash_seed: 7,
            ..Options::default()
        },
    )
    .unwrap_or_else(|e| panic!("normal form {normal:?} of {input:?} does not parse: {e}"));
    assert_eq!(
        again.normalized(),
        normal,
        "normal form is not stable for {input:?}"
    );
    for t in [
        Timestamp::MIN,
        Timestamp::UNIX_EPOCH,
        Timestamp::from_second(1_795_000_000).expect("valid"),
        Timestamp::MAX,
    ] {
        let next: Vec<_> = schedule.fires_after(t).take(3).collect();
        for w in next.windows(2) {
            assert!(
                w[0].at < w[1].at,
                "fires of {input:?} are not increasing after {t}"
            );
        }
        if let Some(first) = next.first() {
            assert!(first.at > t, "{input:?}: next after {t} is {}", first.at);
            assert_eq!(
                again.next_after(t),
                Some(first.at),
                "normal form {normal:?} of {input:?} disagrees after {t}"
            );
            let back = schedule.prev_before(first.at);
            assert!(
                back.is_none_or(|b| b <= t),
                "{input:?}: prev_before({}) = {back:?} is after {t}",
                first.at
            );
        }
        let prev: Vec<_> = schedule.fires_before(t).take(3).collect();
        for w in prev.windows(2) {
            assert!(
                w[0].at > w[1].at,
                "fires of {input:?} are not decreasing before {t}"
            );
        }
        if let Some(last) = prev.first() {
            assert!(last.at < t);
            let fwd = schedule.next_after(last.at);
            assert!(
                fwd.is_none_or(|f| f >= t),
                "{input:?}: next_after({}) = {fwd:?} is before {t}",
                last.at
            );
        }
    }
}
