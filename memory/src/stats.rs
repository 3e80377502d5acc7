//! Counters with PyTorch's names, a snapshot of the pool and the bounded event history.

use serde::{Deserialize, Serialize};

use crate::allocator::{SegmentId, StreamId};

/// One statistic: its current value, its peak since the last reset, and the running totals
/// of increases (`allocated`) and decreases (`freed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value since creation or the last [`crate::CachingAllocator::reset_peak_stats`].
    pub peak: u64,
    /// Sum of all increases.
    pub allocated: u64,
    /// Sum of all decreases.
    pub freed: u64,
}

impl Stat {
    // Saturating: the lifetime totals of a long-running process may pass 2^64 bytes,
    // and a statistic that wraps to a small number would mislead more than one that
    // stops at the maximum.
    pub(crate) fn increase(&mut self, n: u64) {
        self.current = self.current.saturating_add(n);
        self.allocated = self.allocated.saturating_add(n);
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn decrease(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed = self.freed.saturating_add(n);
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// The allocator's statistics, named as in `torch.cuda.memory_stats()`.
///
/// * `allocated`: bytes (and blocks) handed out and not yet freed, at block granularity.
/// * `reserved`: bytes (and segments) obtained from the source; for an expandable segment,
///   the bytes currently backed, not its reserved address range.
/// * `active`: allocated blocks plus blocks freed but still waiting for other streams.
/// * `inactive_split`: free blocks inside segments that are split (fragmentation).
/// * `requested`: the bytes callers asked for, before rounding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Bytes in allocated blocks.
    pub allocated_bytes: Stat,
    /// Bytes in segments (the backed length of expandable ones).
    pub reserved_bytes: Stat,
    /// Bytes in active (allocated or pending-free) blocks.
    pub active_bytes: Stat,
    /// Bytes in free blocks of split segments.
    pub inactive_split_bytes: Stat,
    /// Bytes requested by callers for allocated blocks.
    pub requested_bytes: Stat,
    /// Number of allocated blocks.
    pub allocation: Stat,
    /// Number of segments.
    pub segment: Stat,
    /// Number of active blocks.
    pub active: Stat,
    /// Number of free blocks in split segments.
    pub inactive_split: Stat,
    /// Times a source failure made the allocator release its cache and retry.
    pub num_alloc_retries: u64,
    /// Requests that failed with out-of-memory.
    pub num_ooms: u64,
    /// Calls that obtained memory from the source: segments requested plus growths of
    /// expandable segments (each growth is one call, whatever its size).
    pub num_device_alloc: u64,
    /// Calls that returned memory to the source: segments returned plus shrinks of
    /// expandable segments.
    pub num_device_free: u64,
    /// Growths of expandable segments (included in `num_device_alloc`).
    pub num_segment_grows: u64,
    /// Shrinks of expandable segments (included in `num_device_free`).
    pub num_segment_shrinks: u64,
}

impl MemoryStats {
    pub(crate) fn reset_peaks(&mut self) {
        for s in [
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
        ] {
            s.reset_peak();
        }
    }
}

/// The state of one block in a [`Snapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockStateKind {
    /// Cached and reusable.
    Free,
    /// Handed out.
    Allocated,
    /// Freed by its owner, waiting for other streams to pass their fences.
    PendingFree,
    /// Free, freed last on its own stream and kept aside unmerged: the next request of the
    /// same stream and size takes it back at once. It merges with its free neighbours at the
    /// next allocation that needs the free index, at `empty_cache` and at `coalesce`.
    /// Counted as a free block in every statistic.
    Parked,
}

/// One block of a segment in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSnapshot {
    /// Offset of the block in its segment.
    pub offset: u64,
    /// Size of the block (rounded).
    pub size: u64,
    /// Bytes the caller asked for (0 when free).
    pub requested: u64,
    /// Its state.
    pub state: BlockStateKind,
}

/// One segment in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSnapshot {
    /// The source's id for it.
    pub id: SegmentId,
    /// Its size (for an expandable segment, the bytes backed now).
    pub size: u64,
    /// The address range reserved for an expandable segment; `None` for a fixed one.
    pub reserve: Option<u64>,
    /// The stream it serves.
    pub stream: StreamId,
    /// Whether it belongs to the small pool.
    pub small: bool,
    /// Its blocks, by offset; they tile the segment.
    pub blocks: Vec<BlockSnapshot>,
}

/// The pool at one moment: every segment and its blocks. Serializable as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Segments sorted by id.
    pub segments: Vec<SegmentSnapshot>,
    /// The statistics at the same moment.
    pub stats: MemoryStats,
}

/// What a [`TraceEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed out.
    Alloc,
    /// A block was freed by its owner.
    Free,
    /// A segment was obtained from the source.
    SegmentAlloc,
    /// A segment was returned to the source.
    SegmentFree,
    /// An expandable segment grew (the size is the growth).
    SegmentGrow,
    /// An expandable segment shrank (the size is the bytes released).
    SegmentShrink,
    /// A request failed with out-of-memory.
    Oom,
}

/// One entry of the bounded alloc/free history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// What happened.
    pub action: TraceAction,
    /// Bytes involved (block or segment size; the request for an OOM).
    pub size: u64,
    /// The stream involved.
    pub stream: StreamId,
    /// Nanoseconds since the allocator was created.
    pub timestamp_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_stop_at_the_maximum_instead_of_wrapping() {
        let mut s = Stat::default();
        s.increase(u64::MAX - 1);
        s.increase(10);
        assert_eq!(
            (s.current, s.allocated, s.peak),
            (u64::MAX, u64::MAX, u64::MAX)
        );
        s.decrease(u64::MAX);
        s.decrease(5);
        assert_eq!((s.current, s.freed), (0, u64::MAX));
    }
}
