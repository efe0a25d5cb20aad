//! The clock offset between an agent and its server, estimated the way NTP
//! does from the four timestamps of a request and its answer.
//!
//! The agent sends at `t0` (its clock); the server receives at `t1` and
//! answers at `t2` (its clock); the agent receives at `t3`. With the
//! network delay the same both ways, the agent's clock minus the server's is
//! `((t0 - t1) + (t3 - t2)) / 2`, and the round trip `(t3 - t0) - (t2 - t1)`;
//! the error of the offset is at most half the round trip. The estimate keeps
//! the sample with the smallest round trip among the recent ones, as the
//! least disturbed by queueing.

use std::collections::VecDeque;

/// One exchange's four timestamps, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// Agent sent (agent clock).
    pub t0: i64,
    /// Server received (server clock).
    pub t1: i64,
    /// Server answered (server clock).
    pub t2: i64,
    /// Agent received (agent clock).
    pub t3: i64,
}

impl ClockSample {
    /// Agent clock minus server clock.
    pub fn offset_us(&self) -> i64 {
        ((self.t0 - self.t1) + (self.t3 - self.t2)) / 2
    }

    /// Time on the network, both ways.
    pub fn round_trip_us(&self) -> i64 {
        ((self.t3 - self.t0) - (self.t2 - self.t1)).max(0)
    }
}

/// The offset from the best of the last few samples.
#[derive(Clone, Debug, Default)]
pub struct ClockEstimate {
    recent: VecDeque<ClockSample>,
}

/// Samples kept.
const WINDOW: usize = 8;

impl ClockEstimate {
    /// Adds a sample.
    pub fn add(&mut self, sample: ClockSample) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(sample);
    }

    /// The best sample: the one with the smallest round trip.
    pub fn best(&self) -> Option<ClockSample> {
        self.recent
            .iter()
            .copied()
            .min_by_key(ClockSample::round_trip_us)
    }

    /// Agent clock minus server clock, microseconds (0 before any sample).
    pub fn offset_us(&self) -> i64 {
        self.best().map_or(0, |s| s.offset_us())
    }

    /// A server instant in the agent's clock.
    pub fn to_agent_clock(&self, server_us: i64) -> i64 {
        server_us + self.offset_us()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// With equal delays both ways, the estimate is exact; with unequal
        /// ones, it is off by at most half the round trip.
        #[test]
        fn the_offset_is_within_half_the_round_trip(
            offset in -10_000_000i64..10_000_000,
            start in 0i64..1_000_000_000_000,
            out in 0i64..50_000,
            back in 0i64..50_000,
            busy in 0i64..10_000,
        ) {
            // True times (server clock); the agent reads true + offset.
            let sample = ClockSample {
                t0: start + offset,
                t1: start + out,
                t2: start + out + busy,
                t3: start + out + busy + back + offset,
            };
            prop_assert_eq!(sample.round_trip_us(), out + back);
            let error = (sample.offset_us() - offset).abs();
            prop_assert!(error <= (out + back) / 2 + 1, "error {} round trip {}", error, out + back);
            if out == back {
                prop_assert!(error <= 1);
            }
        }
    }

    #[test]
    fn the_least_delayed_sample_wins() {
        let mut e = ClockEstimate::default();
        assert_eq!(e.offset_us(), 0);
        // Offset 500 µs; one sample delayed 10 ms on the way back only.
        e.add(ClockSample {
            t0: 1_500,
            t1: 1_050,
            t2: 1_150,
            t3: 11_700,
        });
        e.add(ClockSample {
            t0: 20_500,
            t1: 20_050,
            t2: 20_150,
            t3: 20_700,
        });
        assert_eq!(e.best().unwrap().round_trip_us(), 100);
        assert_eq!(e.offset_us(), 500);
        assert_eq!(e.to_agent_clock(1_000_000), 1_000_500);
    }
}
