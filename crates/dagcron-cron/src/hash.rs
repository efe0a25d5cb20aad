//! Stable hashing for `H`: the same key gives the same schedule on every
//! machine and in every version, so these functions must never change.

use crate::ast::FieldKind;

/// Derives the `H` seed from a job's identity (for example `namespace/name`),
/// with 64-bit FNV-1a.
pub fn seed_from_key(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A well-mixed value per (seed, field), so that `H H * * *` does not pick
/// the same number for the minute and the hour.
pub(crate) fn field_hash(seed: u64, kind: FieldKind) -> u64 {
    // splitmix64 finalizer.
    let mut z = seed ^ (kind.index() as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_pinned() {
        // These values are part of the schedule semantics: changing them
        // would move the fires of every job that uses `H`.
        assert_eq!(seed_from_key(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(seed_from_key("billing/nightly"), 0xf27e_6921_6aa0_a2a6);
        assert_ne!(
            field_hash(1, FieldKind::Minute),
            field_hash(1, FieldKind::Hour)
        );
    }
}
