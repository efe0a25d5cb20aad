//! Proleptic Gregorian calendar arithmetic on plain integers.
//!
//! The search in [`crate::civil`] works on "civil seconds": seconds since
//! 1970-01-01T00:00:00 of the local wall clock, with no time zone attached.
//! These helpers convert between that count and year/month/day fields without
//! going through a date-time library, because they sit on the hot path.

/// Seconds in a civil day.
pub(crate) const DAY: i64 = 86_400;

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
pub(crate) fn days_from_civil(year: i32, month: u8, day: u8) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a count of days since 1970-01-01.
pub(crate) fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month, day)
}

/// Whether `year` has a February 29.
pub(crate) fn is_leap(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Number of days in a month (1-based month).
pub(crate) fn days_in_month(year: i32, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Day of the week of a day count, 0 = Sunday .. 6 = Saturday.
pub(crate) fn weekday(days: i64) -> u8 {
    (days + 4).rem_euclid(7) as u8
}

/// A civil date-time split into fields, as the search manipulates it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Civil {
    pub(crate) year: i32,
    pub(crate) month: u8,
    pub(crate) day: u8,
    pub(crate) hour: u8,
    pub(crate) minute: u8,
    pub(crate) second: u8,
}

impl Civil {
    pub(crate) fn from_secs(secs: i64) -> Civil {
        let (year, month, day) = civil_from_days(secs.div_euclid(DAY));
        let sod = secs.rem_euclid(DAY);
        Civil {
            year,
            month,
            day,
            hour: (sod / 3600) as u8,
            minute: (sod / 60 % 60) as u8,
            second: (sod % 60) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_trip_over_a_wide_range() {
        // Every day from year -9999 to 9999 in steps that hit every
        // residue of the 400-year cycle.
        let lo = days_from_civil(-9999, 1, 1);
        let hi = days_from_civil(9999, 12, 31);
        let mut d = lo;
        while d <= hi {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
            assert!(dd >= 1 && dd <= days_in_month(y, m));
            d += 37;
        }
    }

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(weekday(0), 4); // Thursday
        assert_eq!(weekday(days_from_civil(2026, 11, 29)), 0); // a Sunday
        assert_eq!(days_in_month(2100, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(Civil::from_secs(-1).year, 1969);
    }
}
