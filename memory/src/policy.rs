//! Size rounding, size classes and the other knobs of the pooling algorithm.

use serde::{Deserialize, Serialize};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// A named set of allocator rules, for [`crate::replay`] and for building a [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// PyTorch's default CUDA caching allocator rules: 512 B rounding, a 1 MiB small/large
    /// boundary, 2 MiB small segments, 20 MiB segments for 1–10 MiB requests, larger requests
    /// rounded up to 2 MiB, large blocks split only when more than 1 MiB remains, no split limit
    /// and no expandable segments.
    PyTorch,
    /// This crate's default: PyTorch's size classes and small pool, but large segments sized to
    /// the request (512 B granularity, no 20 MiB buckets), large blocks split whenever 512 B
    /// remain, no split limit (any cached block that fits is used, however large), whole free
    /// segments handed back to the device before the reserved bytes pass their high-water
    /// mark, and expandable segments where the device can grow memory in place.
    Xpu,
}

impl Policy {
    /// The rules this policy names.
    pub fn config(self) -> Config {
        match self {
            Policy::PyTorch => Config::pytorch(),
            Policy::Xpu => Config::xpu(),
        }
    }
}

/// The knobs of the caching algorithm. Plain data; cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Every request is rounded up to a multiple of this (and to at least this). A power of two.
    pub min_block: u64,
    /// Requests of at most this many (rounded) bytes are "small" and served from small segments.
    pub small_size: u64,
    /// Size of the segments serving small requests.
    pub small_segment: u64,
    /// Large requests below this size get a segment of [`Config::mid_segment`] bytes...
    pub mid_limit: u64,
    /// ...this many bytes (0 disables the middle bucket).
    pub mid_segment: u64,
    /// Larger requests get a segment of the request rounded up to a multiple of this.
    pub large_round: u64,
    /// A large free block is split only if at least this many bytes would remain.
    pub large_split_min: u64,
    /// When set as `(threshold, ratio)`, a cached block bigger than `threshold` and more than
    /// `ratio` times the request is not used for it (it would be split into a small piece and
    /// a large remainder that fragments the pool); a new segment is requested instead.
    /// `None` in both policies: on the AlexNet and transformer training traces, a split
    /// limit raised the peak reserved bytes (a new segment, or a growth of the expandable
    /// segment's tail, adds bytes while the passed-over block stays reserved) and the
    /// device calls of repeated passes.
    pub max_split: Option<(u64, f64)>,
    /// When set, the allocator reserves at most this fraction of the source's capacity.
    pub memory_fraction: Option<f64>,
    /// Before asking the source for a new segment, hand back whole free segments first,
    /// keeping the reserved footprint close to what is live.
    pub release_before_grow: bool,
    /// How many alloc/free events the history ring keeps (0, the default, keeps none).
    /// Recording costs two clock reads and two ring writes per allocate + free pair, about
    /// a third of a cached pair, so it is opt-in, as PyTorch's memory history is.
    pub history: usize,
    /// Where the source can grow a segment in place
    /// ([`crate::SegmentSource::growth_granularity`]), keep one growable segment per pool
    /// and stream and grow it by the shortfall instead of adding segments, so that freed
    /// blocks merge across what would have been segment boundaries. Ignored where the source
    /// cannot grow segments.
    pub expandable_segments: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config::xpu()
    }
}

impl Config {
    /// PyTorch's default rules; see [`Policy::PyTorch`].
    pub fn pytorch() -> Self {
        Config {
            min_block: 512,
            small_size: MIB,
            small_segment: 2 * MIB,
            mid_limit: 10 * MIB,
            mid_segment: 20 * MIB,
            large_round: 2 * MIB,
            large_split_min: MIB + 1,
            max_split: None,
            memory_fraction: None,
            release_before_grow: false,
            history: 0,
            expandable_segments: false,
        }
    }

    /// This crate's rules; see [`Policy::Xpu`].
    pub fn xpu() -> Self {
        Config {
            mid_segment: 0,
            large_round: 512,
            large_split_min: 512,
            release_before_grow: true,
            expandable_segments: true,
            ..Config::pytorch()
        }
    }

    /// `size` rounded up to the block granularity (0 becomes one minimum block).
    pub fn round_size(&self, size: u64) -> u64 {
        round_up(size.max(1), self.min_block.max(1))
    }

    /// Whether a rounded request belongs to the small pool.
    pub fn is_small(&self, rounded: u64) -> bool {
        rounded <= self.small_size
    }

    /// The size of the segment requested from the source for a rounded request that found no
    /// cached block.
    pub fn segment_size(&self, rounded: u64) -> u64 {
        if self.is_small(rounded) {
            self.small_segment.max(rounded)
        } else if self.mid_segment > 0 && rounded < self.mid_limit {
            self.mid_segment.max(rounded)
        } else {
            round_up(rounded, self.large_round.max(1))
        }
    }

    /// Whether a free block of `block` bytes serving a request of `rounded` bytes is split.
    pub fn should_split(&self, block: u64, rounded: u64, small: bool) -> bool {
        let rest = block.saturating_sub(rounded);
        if small {
            rest >= self.min_block
        } else {
            rest >= self.large_split_min.max(1)
        }
    }

    /// Whether a cached block of `block` bytes is too large to be split for `rounded` bytes.
    pub fn too_large_to_split(&self, block: u64, rounded: u64) -> bool {
        match self.max_split {
            Some((threshold, ratio)) => {
                block > threshold && (block as f64) > ratio * rounded as f64
            }
            None => false,
        }
    }
}

/// `v` rounded up to a multiple of `to` (saturating at the largest multiple).
pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    match v.checked_add(to - 1) {
        Some(x) => x / to * to,
        None => u64::MAX / to * to,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_rounding_and_classes() {
        let c = Config::pytorch();
        assert_eq!(c.round_size(0), 512);
        assert_eq!(c.round_size(1), 512);
        assert_eq!(c.round_size(513), 1024);
        assert_eq!(c.segment_size(512), 2 * MIB);
        assert_eq!(c.segment_size(MIB), 2 * MIB);
        assert_eq!(c.segment_size(MIB + 512), 20 * MIB);
        assert_eq!(c.segment_size(10 * MIB), 10 * MIB);
        assert_eq!(c.segment_size(10 * MIB + 512), 12 * MIB);
        assert!(c.should_split(2 * MIB, MIB, true));
        assert!(!c.should_split(3 * MIB, 2 * MIB, false));
        assert!(c.should_split(3 * MIB + 512, 2 * MIB, false));
    }

    #[test]
    fn split_limit() {
        let c = Config {
            max_split: Some((32 * MIB, 4.0)),
            ..Config::xpu()
        };
        assert!(c.too_large_to_split(100 * MIB, 2 * MIB));
        assert!(!c.too_large_to_split(100 * MIB, 30 * MIB));
        assert!(!c.too_large_to_split(16 * MIB, 512));
        // The xpu rules use any cached block that fits.
        assert_eq!(Config::xpu().max_split, None);
        assert!(!Config::xpu().too_large_to_split(u64::MAX, 512));
    }
}
