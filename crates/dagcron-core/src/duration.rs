//! Durations as users write them in job files: `250ms`, `90s`, `5m`,
//! `1h30m`, `2d`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative duration with millisecond precision, written `1h30m`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    /// From milliseconds.
    pub const fn from_millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }

    /// From seconds.
    pub const fn from_secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }

    /// In milliseconds, saturating.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// Parses `250ms`, `90s`, `5m`, `1h30m`, `2d` (units may repeat in
    /// decreasing order; a bare `0` is zero).
    pub fn parse(text: &str) -> Result<Dur, String> {
        let bad = || {
            format!(
                "invalid duration {text:?}: write a number and a unit (ms, s, m, h, d), such as 250ms, 90s, 5m or 1h30m"
            )
        };
        if text == "0" {
            return Ok(Dur::default());
        }
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Err(bad());
        }
        let mut i = 0;
        let mut total: u64 = 0;
        while i < bytes.len() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if start == i {
                return Err(bad());
            }
            let n: u64 = text[start..i].parse().map_err(|_| bad())?;
            let ustart = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let scale = match &text[ustart..i] {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(bad()),
            };
            total = n
                .checked_mul(scale)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
        }
        Ok(Dur::from_millis(total))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (size, unit) in [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1000, "s"),
            (1, "ms"),
        ] {
            if ms >= size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let text = String::deserialize(d)?;
        Dur::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (text, ms, back) in [
            ("250ms", 250, "250ms"),
            ("90s", 90_000, "1m30s"),
            ("5m", 300_000, "5m"),
            ("1h30m", 5_400_000, "1h30m"),
            ("2d", 172_800_000, "2d"),
            ("0", 0, "0s"),
        ] {
            let d = Dur::parse(text).unwrap();
            assert_eq!(d.as_millis(), ms, "{text}");
            assert_eq!(d.to_string(), back);
        }
        for bad in ["", "5", "m", "5x", "1.5h", "-1s", "99999999999999999999d"] {
            assert!(Dur::parse(bad).is_err(), "{bad}");
        }
    }
}
