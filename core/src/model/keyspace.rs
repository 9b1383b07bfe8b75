//! The keyspace: `xxh3_64(key)` positions and power-of-two aligned bands.
//!
//! A band is `[start, start + 2^size_log2)` of the u64 space. It is stored as
//! `(start, size_log2)` rather than `(start, end)` for two reasons. The whole
//! space ends at 2^64, which a u64 end cannot hold; and the pair makes an
//! unaligned band unrepresentable once the constructor has checked that
//! `start` is a multiple of the size. Every exclusive end is computed in u128,
//! so no arithmetic here can overflow.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The number of bits of a position: the whole keyspace is a band of size 2^64.
pub const POSITION_BITS: u8 = 64;

/// The position of a key in the keyspace.
///
/// This is the one hash function of the log model: changing it relocates every
/// key, so it is part of the on-disk and wire contract.
pub fn position(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// Why a pair cannot be a band.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BandError {
    #[error("band size 2^{size_log2} exceeds the keyspace of 2^64")]
    TooLarge { size_log2: u8 },
    #[error("band start {start:#018x} is not aligned to its size 2^{size_log2}")]
    Unaligned { start: u64, size_log2: u8 },
}

/// A power-of-two aligned band of the keyspace: `[start, start + 2^size_log2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawBand", into = "RawBand")]
pub struct Band {
    start: u64,
    size_log2: u8,
}

/// The serialized form of a band, validated on the way back in so that a
/// snapshot cannot smuggle in an unaligned band.
#[derive(Serialize, Deserialize)]
struct RawBand {
    start: u64,
    size_log2: u8,
}

impl TryFrom<RawBand> for Band {
    type Error = BandError;
    fn try_from(raw: RawBand) -> Result<Self, Self::Error> {
        Band::new(raw.start, raw.size_log2)
    }
}

impl From<Band> for RawBand {
    fn from(band: Band) -> Self {
        RawBand {
            start: band.start,
            size_log2: band.size_log2,
        }
    }
}

impl Band {
    /// The whole keyspace, `[0, 2^64)`.
    pub const FULL: Band = Band {
        start: 0,
        size_log2: POSITION_BITS,
    };

    /// A band of size 2^size_log2 starting at `start`, which must be aligned to the size.
    pub fn new(start: u64, size_log2: u8) -> Result<Band, BandError> {
        if size_log2 > POSITION_BITS {
            return Err(BandError::TooLarge { size_log2 });
        }
        if u128::from(start) % (1u128 << size_log2) != 0 {
            return Err(BandError::Unaligned { start, size_log2 });
        }
        Ok(Band { start, size_log2 })
    }

    /// The `count` equal bands that tile the keyspace, in keyspace order.
    /// `count` must be a power of two no larger than 2^64; `None` otherwise.
    pub fn tiling(count: u64) -> Option<Vec<Band>> {
        if !count.is_power_of_two() {
            return None;
        }
        let size_log2 = POSITION_BITS - count.trailing_zeros() as u8;
        let size = 1u128 << size_log2;
        let bands = (0..u128::from(count))
            .map(|i| Band {
                start: (i * size) as u64,
                size_log2,
            })
            .collect();
        Some(bands)
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn size_log2(&self) -> u8 {
        self.size_log2
    }

    /// The number of positions in the band (up to 2^64, hence u128).
    pub fn size(&self) -> u128 {
        1u128 << self.size_log2
    }

    /// The exclusive end (up to 2^64, hence u128).
    pub fn end_exclusive(&self) -> u128 {
        u128::from(self.start) + self.size()
    }

    /// The last position inside the band.
    pub fn last(&self) -> u64 {
        // The end is at most 2^64 and the size at least 1, so this fits.
        (self.end_exclusive() - 1) as u64
    }

    pub fn contains(&self, position: u64) -> bool {
        let p = u128::from(position);
        p >= u128::from(self.start) && p < self.end_exclusive()
    }

    /// Whether `other` lies entirely inside this band.
    pub fn covers(&self, other: &Band) -> bool {
        other.size_log2 <= self.size_log2 && self.contains(other.start)
    }

    /// The two halves of the band, lower first; `None` for a band of one position.
    pub fn halves(&self) -> Option<(Band, Band)> {
        if self.size_log2 == 0 {
            return None;
        }
        let size_log2 = self.size_log2 - 1;
        let lower = Band {
            start: self.start,
            size_log2,
        };
        let upper = Band {
            start: self.start + (1u64 << size_log2),
            size_log2,
        };
        Some((lower, upper))
    }

    /// The band twice this size that holds this one; `None` for the whole space.
    pub fn parent(&self) -> Option<Band> {
        if self.size_log2 >= POSITION_BITS {
            return None;
        }
        let size_log2 = self.size_log2 + 1;
        let mask = if size_log2 >= POSITION_BITS {
            0
        } else {
            !((1u64 << size_log2) - 1)
        };
        Some(Band {
            start: self.start & mask,
            size_log2,
        })
    }

    /// The other half of this band's parent (the buddy-allocator buddy).
    pub fn buddy(&self) -> Option<Band> {
        if self.size_log2 >= POSITION_BITS {
            return None;
        }
        Some(Band {
            start: self.start ^ (1u64 << self.size_log2),
            size_log2: self.size_log2,
        })
    }

    /// The overlap of two bands. Two aligned power-of-two bands are either
    /// disjoint or one holds the other, so the overlap is the smaller band or nothing.
    pub fn intersect(&self, other: &Band) -> Option<Band> {
        if self.covers(other) {
            Some(*other)
        } else if other.covers(self) {
            Some(*self)
        } else {
            None
        }
    }
}

impl fmt::Display for Band {
    /// `[0x0000000000000000, 0x4000000000000000)`, the end of the whole space
    /// printed as `0x10000000000000000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#018x}, {:#018x})", self.start, self.end_exclusive())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_band_ends_at_two_to_the_sixty_four() {
        assert_eq!(Band::FULL.end_exclusive(), 1u128 << 64);
        assert_eq!(Band::FULL.last(), u64::MAX);
        assert!(Band::FULL.contains(0) && Band::FULL.contains(u64::MAX));
        assert_eq!(Band::FULL.parent(), None);
        assert_eq!(Band::FULL.buddy(), None);
    }

    #[test]
    fn unaligned_bands_are_refused() {
        assert_eq!(
            Band::new(1, 1),
            Err(BandError::Unaligned {
                start: 1,
                size_log2: 1
            })
        );
        assert_eq!(
            Band::new(1, 64),
            Err(BandError::Unaligned {
                start: 1,
                size_log2: 64
            })
        );
        assert_eq!(Band::new(0, 65), Err(BandError::TooLarge { size_log2: 65 }));
        assert!(Band::new(1 << 62, 62).is_ok());
    }

    #[test]
    fn tiling_needs_a_power_of_two() {
        assert_eq!(Band::tiling(3), None);
        assert_eq!(Band::tiling(0), None);
        assert_eq!(Band::tiling(1), Some(vec![Band::FULL]));
        let four = Band::tiling(4).unwrap();
        assert_eq!(four.len(), 4);
        assert_eq!(four[3].start(), 3 << 62);
        assert_eq!(four[3].end_exclusive(), 1u128 << 64);
    }

    #[test]
    fn halves_are_buddies_whose_parent_is_the_band() {
        let band = Band::new(1 << 63, 62).unwrap();
        let (lower, upper) = band.halves().unwrap();
        assert_eq!(lower.buddy(), Some(upper));
        assert_eq!(upper.buddy(), Some(lower));
        assert_eq!(lower.parent(), Some(band));
        assert_eq!(upper.parent(), Some(band));
        assert_eq!(Band::new(7, 0).unwrap().halves(), None);
    }

    #[test]
    fn intersection_is_the_smaller_band_or_nothing() {
        let (lower, upper) = Band::FULL.halves().unwrap();
        let (ll, _) = lower.halves().unwrap();
        assert_eq!(Band::FULL.intersect(&ll), Some(ll));
        assert_eq!(ll.intersect(&lower), Some(ll));
        assert_eq!(ll.intersect(&upper), None);
    }

    #[test]
    fn a_misaligned_band_does_not_deserialize() {
        let bytes = rmp_serde::to_vec(&RawBand {
            start: 3,
            size_log2: 2,
        })
        .unwrap();
        assert!(rmp_serde::from_slice::<Band>(&bytes).is_err());
    }

    #[test]
    fn position_is_xxh3_64() {
        assert_eq!(position(b""), xxhash_rust::xxh3::xxh3_64(b""));
        assert_ne!(position(b"a"), position(b"b"));
    }

    fn any_band() -> impl proptest::strategy::Strategy<Value = Band> {
        use proptest::prelude::*;
        (0u8..=64, any::<u64>()).prop_map(|(size_log2, start)| {
            let mask = if size_log2 >= 64 {
                0
            } else {
                !((1u64 << size_log2) - 1)
            };
            Band::new(start & mask, size_log2).unwrap()
        })
    }

    proptest::proptest! {
        #[test]
        fn halves_partition_a_band_and_are_each_others_buddy(band in any_band(), p in proptest::prelude::any::<u64>()) {
            if let Some((lower, upper)) = band.halves() {
                proptest::prop_assert_eq!(band.contains(p), lower.contains(p) || upper.contains(p));
                proptest::prop_assert!(!(lower.contains(p) && upper.contains(p)));
                proptest::prop_assert_eq!(lower.end_exclusive(), u128::from(upper.start()));
                proptest::prop_assert_eq!(lower.buddy(), Some(upper));
                proptest::prop_assert_eq!(upper.parent(), Some(band));
            }
            if let Some(parent) = band.parent() {
                proptest::prop_assert!(parent.covers(&band));
                proptest::prop_assert_eq!(band.buddy().and_then(|b| b.buddy()), Some(band));
            }
        }
    }
}
