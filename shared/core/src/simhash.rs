//! 64-bit SimHash over normalized text, and the banded keys that keep near-duplicate lookup an
//! index probe rather than a scan.
//!
//! Features are word unigrams and bigrams (CJK characters count as words, so Chinese text gets
//! character bigrams), each hashed with xxh3. Two texts are near-duplicates when their fingerprints
//! differ in at most [`NEAR_DUPLICATE_DISTANCE`] bits.

use xxhash_rust::xxh3::xxh3_64;

use crate::normalize::{normalize_for_fingerprint, tokenize};

/// The largest Hamming distance at which two fingerprints count as the same memory.
pub const NEAR_DUPLICATE_DISTANCE: u32 = 3;

/// Number of 16-bit bands. With 4 bands and a threshold of 3, two fingerprints within the
/// threshold differ in at most 3 bands, so (pigeonhole) at least one band matches exactly: an
/// equality lookup on any band finds every candidate.
pub const BANDS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SimHash(pub u64);

impl SimHash {
    /// Fingerprints text as the user gave it (it is normalized here).
    pub fn of_text(text: &str) -> Self {
        Self::of_normalized(&normalize_for_fingerprint(text))
    }

    /// Fingerprints text that is already normalized.
    pub fn of_normalized(normalized: &str) -> Self {
        let tokens = tokenize(normalized);
        let mut weights = [0i64; 64];
        let mut add_feature = |feature: &[u8]| {
            let hash = xxh3_64(feature);
            for (bit, weight) in weights.iter_mut().enumerate() {
                if hash & (1 << bit) != 0 {
                    *weight += 1;
                } else {
                    *weight -= 1;
                }
            }
        };
        for token in &tokens {
            add_feature(token.as_str().as_bytes());
        }
        for pair in tokens.windows(2) {
            let bigram = format!("{} {}", pair[0].as_str(), pair[1].as_str());
            add_feature(bigram.as_bytes());
        }
        if tokens.is_empty() {
            // Text of punctuation only: fingerprint the characters themselves.
            add_feature(normalized.as_bytes());
        }
        let fingerprint = weights
            .iter()
            .enumerate()
            .filter(|(_, weight)| **weight > 0)
            .fold(0u64, |acc, (bit, _)| acc | (1 << bit));
        Self(fingerprint)
    }

    pub fn distance(self, other: SimHash) -> u32 {
        (self.0 ^ other.0).count_ones()
    }

    pub fn is_near_duplicate_of(self, other: SimHash) -> bool {
        self.distance(other) <= NEAR_DUPLICATE_DISTANCE
    }

    /// The four 16-bit bands, lowest bits first.
    pub fn bands(self) -> [i32; BANDS] {
        std::array::from_fn(|band| ((self.0 >> (16 * band)) & 0xFFFF) as i32)
    }

    /// The fingerprint as Postgres stores it (`bigint`, same bits).
    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }

    pub fn from_i64(stored: i64) -> Self {
        Self(stored as u64)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn identical_after_normalization() {
        let a = SimHash::of_text("I prefer dark mode in every editor");
        let b = SimHash::of_text("  i PREFER dark mode in every editor https://x.io ");
        assert_eq!(a, b);
    }

    #[test]
    fn small_edits_of_long_text_stay_near() {
        let a = SimHash::of_text(
            "The weekly sync with the platform team is every Tuesday at 10am in room 4B, \
             and Alice runs it; bring the latency dashboard and the incident list",
        );
        let b = SimHash::of_text(
            "The weekly sync with the platform team is every Tuesday at 10am in room 4B, \
             and Alice runs it; bring the latency dashboard and the incident list!",
        );
        assert!(a.is_near_duplicate_of(b), "distance {}", a.distance(b));
    }

    #[test]
    fn different_statements_are_far_apart() {
        let pairs = [
            ("I like green tea", "I like black coffee"),
            ("My sister lives in Berlin", "My brother works in Paris"),
            ("我喜欢喝绿茶", "我讨厌喝咖啡"),
            ("Meeting moved to Friday", "Dentist appointment on Monday"),
        ];
        for (left, right) in pairs {
            let distance = SimHash::of_text(left).distance(SimHash::of_text(right));
            assert!(
                distance > NEAR_DUPLICATE_DISTANCE,
                "{left:?} vs {right:?}: {distance}"
            );
        }
    }

    #[test]
    fn chinese_text_fingerprints_by_characters() {
        assert_eq!(
            SimHash::of_text("我 喜欢 绿茶"),
            SimHash::of_text("我喜欢绿茶")
        );
    }

    proptest! {
        #[test]
        fn distance_is_a_metric(a: u64, b: u64, c: u64) {
            let (a, b, c) = (SimHash(a), SimHash(b), SimHash(c));
            prop_assert_eq!(a.distance(a), 0);
            prop_assert_eq!(a.distance(b), b.distance(a));
            prop_assert!(a.distance(c) <= a.distance(b) + b.distance(c));
        }

        /// The pigeonhole property the banded index relies on.
        #[test]
        fn near_duplicates_share_a_band(a: u64, flips in proptest::collection::vec(0u32..64, 0..=3)) {
            let mut b = a;
            for bit in flips {
                b ^= 1 << bit;
            }
            let (a, b) = (SimHash(a), SimHash(b));
            prop_assert!(a.is_near_duplicate_of(b));
            let shared = a.bands().iter().zip(b.bands()).any(|(x, y)| *x == y);
            prop_assert!(shared);
        }

        #[test]
        fn stored_form_round_trips(a: u64) {
            prop_assert_eq!(SimHash::from_i64(SimHash(a).as_i64()), SimHash(a));
        }
    }
}
