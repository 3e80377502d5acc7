//! The caching algorithm on plain offsets: segments from a [`SegmentSource`], blocks inside
//! them, a best-fit index of free blocks per pool and stream, and the deferred frees that wait
//! on fences.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, BudgetMember, BudgetReport};
use crate::clock::Clock;
use crate::policy::{round_up, Config};
use crate::stats::{
    BlockSnapshot, BlockStateKind, MemoryStats, SegmentSnapshot, Snapshot, TraceAction, TraceEvent,
};

/// The source's name for a segment. Unique among the segments the source has live.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct SegmentId(pub u64);

/// A stream (an in-order queue of device work), named by the caller.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct StreamId(pub u64);

/// Something that completes once a stream has passed the point where it was recorded
/// (a device event, or a flag in tests).
pub trait Fence {
    /// Whether the work before the fence has finished. Must not block.
    fn is_complete(&self) -> bool;
}

/// Why a [`SegmentSource`] call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// The source has no room for the segment; the allocator releases its cache and retries.
    OutOfMemory,
    /// Any other failure; reported to the caller as is.
    Failed(String),
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::OutOfMemory => write!(f, "the source is out of memory"),
            SourceError::Failed(m) => write!(f, "{m}"),
        }
    }
}

/// Raw storage: where segments come from and go back to, and how fences are recorded.
///
/// The allocator owns the source and calls it with its own lock held, so implementations need
/// no locking of their own.
pub trait SegmentSource {
    /// The fence [`SegmentSource::record_fence`] returns.
    type Fence: Fence;
    /// Obtains a segment of exactly `size` bytes.
    fn allocate(&mut self, size: u64) -> Result<SegmentId, SourceError>;
    /// Returns a segment obtained from [`SegmentSource::allocate`]. Called once per segment.
    fn free(&mut self, segment: SegmentId) -> Result<(), SourceError>;
    /// Records a fence on `stream` that completes when the work enqueued so far has finished.
    fn record_fence(&mut self, stream: StreamId) -> Result<Self::Fence, SourceError>;
    /// Total bytes the source can hold, if known; the base of [`Config::memory_fraction`].
    fn capacity(&self) -> Option<u64>;

    /// `Some(granularity)` when the source can make growable segments
    /// ([`SegmentSource::allocate_growable`], [`SegmentSource::resize`]) whose backed length
    /// is a multiple of `granularity` bytes. The default, `None`, means it cannot.
    fn growth_granularity(&self) -> Option<u64> {
        None
    }

    /// Obtains a growable segment: `reserve` bytes of address range of which `[0, initial)`
    /// is backed by memory. Both are multiples of the granularity and `0 < initial <=
    /// reserve`. The segment is returned with [`SegmentSource::free`] like any other. The
    /// default refuses.
    fn allocate_growable(&mut self, reserve: u64, initial: u64) -> Result<SegmentId, SourceError> {
        let _ = (reserve, initial);
        Err(SourceError::Failed(
            "this source cannot make growable segments".to_string(),
        ))
    }

    /// Changes the backed length of a growable segment to `new_len` (a non-zero multiple of
    /// the granularity, at most its reserve), keeping offsets and the contents of the bytes
    /// both lengths share. Segments are backed as a prefix: growing backs `[old, new_len)`,
    /// shrinking releases `[new_len, old)`. The allocator shrinks only over free bytes. The
    /// default refuses.
    fn resize(&mut self, segment: SegmentId, new_len: u64) -> Result<(), SourceError> {
        let _ = new_len;
        Err(SourceError::Failed(format!(
            "segment {} cannot be resized by this source",
            segment.0
        )))
    }
}

/// A block handed out by [`CachingAllocator::allocate`]. Plain data: pass it back to
/// [`CachingAllocator::free`] exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Block {
    /// The segment holding the block.
    pub segment: SegmentId,
    /// Offset of the block in the segment.
    pub offset: u64,
    /// Size of the block (at least `requested`, rounded).
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The stream it was allocated on.
    pub stream: StreamId,
}

/// The numbers behind an out-of-memory failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The size of the segment the allocator tried to obtain.
    pub segment_size: u64,
    /// The source's capacity, if known.
    pub capacity: Option<u64>,
    /// The allocator's limit under [`Config::memory_fraction`], if set.
    pub limit: Option<u64>,
    /// Capacity (or limit) not reserved by this allocator, if known.
    pub free: Option<u64>,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes reserved but not allocated (cached free blocks and pending frees).
    pub reserved_unallocated: u64,
    /// The largest cached free block.
    pub largest_free_block: u64,
    /// `1 - largest free block / free cached bytes` (0 when nothing is cached).
    pub fragmentation: f64,
    /// Blocks still waiting for other streams' fences.
    pub pending_frees: usize,
    /// The shared budget this allocator draws from, if any: its limit, its use, and every
    /// allocator sharing it.
    pub budget: Option<BudgetReport>,
    /// Remedies that are not already in effect.
    pub suggestions: Vec<String>,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), |v| v.to_string());
        write!(
            f,
            "tried to allocate {} bytes (a {}-byte segment); capacity {} bytes, {} free; \
             {} allocated, {} reserved but unallocated, largest free block {} bytes, \
             fragmentation {:.2}",
            self.requested,
            self.segment_size,
            opt(self.capacity),
            opt(self.free),
            self.allocated,
            self.reserved_unallocated,
            self.largest_free_block,
            self.fragmentation
        )?;
        if let Some(limit) = self.limit {
            write!(f, "; memory limit {limit} bytes")?;
        }
        if let Some(budget) = &self.budget {
            write!(f, "; {budget}")?;
        }
        if !self.suggestions.is_empty() {
            write!(f, ". {}", self.suggestions.join("; "))?;
        }
        Ok(())
    }
}

/// Why [`CachingAllocator`] refused a call.
#[derive(Debug, Clone, PartialEq)]
pub enum AllocError {
    /// No segment could be obtained even after releasing the cache.
    OutOfMemory(Box<OomReport>),
    /// The source failed for another reason.
    Source(String),
    /// The block passed in is not an allocated block of this allocator.
    InvalidBlock(String),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(r) => write!(f, "out of memory: {r}"),
            AllocError::Source(m) => write!(f, "segment source failed: {m}"),
            AllocError::InvalidBlock(m) => write!(f, "invalid block: {m}"),
        }
    }
}

impl std::error::Error for AllocError {}

#[derive(Debug)]
enum State {
    Free,
    Allocated {
        requested: u64,
        uses: Vec<StreamId>,
    },
    PendingFree {
        requested: u64,
    },
    /// Freed on its own stream and not yet merged with its neighbours: the next request of
    /// the same stream and size takes it back without touching the free index. Counted as
    /// free in every statistic; at most one block is parked at a time.
    Parked,
}

#[derive(Debug)]
struct BlockInfo {
    size: u64,
    state: State,
}

#[derive(Debug)]
struct Segment {
    /// Bytes backed by memory (for a growable segment, its current length).
    size: u64,
    /// `Some(reserved address range)` for a growable segment.
    reserve: Option<u64>,
    stream: StreamId,
    small: bool,
    blocks: BTreeMap<u64, BlockInfo>,
}

impl Segment {
    /// `(offset, size)` of the last block if it is free.
    fn free_tail(&self) -> Option<(u64, u64)> {
        self.blocks
            .iter()
            .next_back()
            .filter(|(_, b)| matches!(b.state, State::Free))
            .map(|(o, b)| (*o, b.size))
    }

    /// Whether the segment is one free block.
    fn is_whole_free(&self) -> bool {
        self.blocks.len() == 1
            && self
                .blocks
                .values()
                .all(|b| matches!(b.state, State::Free) && b.size == self.size)
    }
}

/// Key of the free index: best fit is the first key at or after `(stream, size, 0, 0)`.
type FreeKey = (StreamId, u64, SegmentId, u64);

/// A multiplicative hasher for the small integer keys of the allocator's maps: segment ids
/// are not attacker-chosen, and SipHash would dominate the cost of a cached allocation.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.add(u64::from(*b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
}

pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// The parked block (see `State::Parked`).
#[derive(Debug, Clone, Copy)]
struct Parked {
    segment: SegmentId,
    offset: u64,
    size: u64,
    stream: StreamId,
    small: bool,
}

struct Pending<F> {
    segment: SegmentId,
    offset: u64,
    fences: Vec<F>,
}

/// The caching allocator over a [`SegmentSource`]. Not internally synchronized: put it behind
/// a `Mutex` to share it (see [`crate::DeviceAllocator`]).
pub struct CachingAllocator<S: SegmentSource> {
    source: S,
    config: Config,
    /// The source's growth granularity when expandable segments are in use.
    granularity: Option<u64>,
    segments: IdMap<SegmentId, Segment>,
    /// The growable segment each (pool, stream) grows: `(small, stream)`.
    growable: IdMap<(bool, StreamId), SegmentId>,
    free_small: BTreeSet<FreeKey>,
    free_large: BTreeSet<FreeKey>,
    pending: Vec<Pending<S::Fence>>,
    parked: Option<Parked>,
    stats: MemoryStats,
    /// The event ring: `history_next` is where the next event goes once it is full.
    history: Vec<TraceEvent>,
    history_next: usize,
    clock: Clock,
    /// The most bytes ever reserved at once (unlike the peak statistic, never reset).
    high_water: u64,
    /// Declared after `source` so that, when the allocator is dropped, the budget gets its
    /// bytes back only after the source has let go of the segments.
    budget: Option<BudgetMember>,
}

impl<S: SegmentSource> fmt::Debug for CachingAllocator<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("config", &self.config)
            .field("expandable", &self.granularity)
            .field("segments", &self.segments.len())
            .field("pending", &self.pending.len())
            .field("budget", &self.budget)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// An empty allocator drawing segments from `source` under `config`.
    pub fn new(source: S, config: Config) -> Self {
        let granularity = if config.expandable_segments {
            source.growth_granularity().filter(|g| *g > 0)
        } else {
            None
        };
        CachingAllocator {
            source,
            config,
            granularity,
            segments: IdMap::default(),
            growable: IdMap::default(),
            free_small: BTreeSet::new(),
            free_large: BTreeSet::new(),
            pending: Vec::new(),
            parked: None,
            stats: MemoryStats::default(),
            history: Vec::new(),
            history_next: 0,
            clock: Clock::new(),
            high_water: 0,
            budget: None,
        }
    }

    /// An allocator like [`CachingAllocator::new`] that also draws every segment from
    /// `budget`, shared with other allocators; `name` identifies it in the budget's reports.
    pub fn with_budget(
        source: S,
        config: Config,
        budget: &Budget,
        name: impl Into<String>,
    ) -> Self {
        let mut a = Self::new(source, config);
        a.budget = Some(budget.join(name.into()));
        a
    }

    /// The rules in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether segments grow in place: [`Config::expandable_segments`] is set and the source
    /// can grow segments.
    pub fn expandable(&self) -> bool {
        self.granularity.is_some()
    }

    /// The shared budget this allocator draws from, if any.
    pub fn budget(&self) -> Option<&Budget> {
        self.budget.as_ref().map(BudgetMember::budget)
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The source, mutably (for tests and adapters; do not free segments through it).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Sets (or clears) the fraction of the source's capacity this allocator may reserve.
    pub fn set_memory_fraction(&mut self, fraction: Option<f64>) {
        self.config.memory_fraction = fraction;
    }

    /// The statistics now.
    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// Resets every peak to its current value.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// The bounded alloc/free history, oldest first.
    pub fn history(&self) -> impl Iterator<Item = TraceEvent> + '_ {
        let scale = self.clock.scale();
        let (newer, older) = self
            .history
            .split_at(self.history_next.min(self.history.len()));
        older.iter().chain(newer).map(move |e| TraceEvent {
            // Recorded as raw clock ticks; see `log`.
            timestamp_ns: scale(e.timestamp_ns),
            ..*e
        })
    }

    /// Number of blocks freed but still waiting for fences.
    pub fn pending_frees(&self) -> usize {
        self.pending.len()
    }

    fn limit(&self) -> Option<u64> {
        let cap = self.source.capacity()?;
        let fraction = self.config.memory_fraction?;
        Some((cap as f64 * fraction.clamp(0.0, 1.0)) as u64)
    }

    fn log(&mut self, action: TraceAction, size: u64, stream: StreamId) {
        let cap = self.config.history;
        if cap == 0 {
            return;
        }
        let event = TraceEvent {
            action,
            size,
            stream,
            // Raw ticks; `history` converts them to nanoseconds.
            timestamp_ns: self.clock.ticks(),
        };
        if self.history.len() < cap {
            self.history.push(event);
        } else {
            if self.history_next >= self.history.len() {
                self.history_next = 0;
            }
            if let Some(slot) = self.history.get_mut(self.history_next) {
                *slot = event;
            }
            self.history_next += 1;
        }
    }

    fn free_set(&mut self, small: bool) -> &mut BTreeSet<FreeKey> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    /// Indexes a free block and counts it as inactive-split when its segment is split.
    fn insert_free(&mut self, seg_id: SegmentId, offset: u64, size: u64) {
        let Some(seg) = self.segments.get(&seg_id) else {
            return;
        };
        let (small, stream, split) = (seg.small, seg.stream, size < seg.size);
        self.free_set(small).insert((stream, size, seg_id, offset));
        if split {
            self.stats.inactive_split_bytes.increase(size);
            self.stats.inactive_split.increase(1);
        }
    }

    fn remove_free(&mut self, seg_id: SegmentId, offset: u64, size: u64) {
        let Some(seg) = self.segments.get(&seg_id) else {
            return;
        };
        let (small, stream, split) = (seg.small, seg.stream, size < seg.size);
        if self.free_set(small).remove(&(stream, size, seg_id, offset)) && split {
            self.stats.inactive_split_bytes.decrease(size);
            self.stats.inactive_split.decrease(1);
        }
    }

    /// Turns pending frees whose fences have all completed into free blocks.
    pub fn process_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut done = Vec::new();
        self.pending.retain(|p| {
            if p.fences.iter().all(Fence::is_complete) {
                done.push((p.segment, p.offset));
                false
            } else {
                true
            }
        });
        for (seg, off) in done {
            self.release_block(seg, off, true);
        }
    }

    /// Allocates `size` bytes for use on `stream`.
    ///
    /// Serves the smallest cached free block of the right pool and stream that fits, splitting
    /// it when the remainder is worth keeping; otherwise grows the pool's expandable segment
    /// or obtains a new segment, releasing the whole free segments of the cache and retrying
    /// once if the source (or the budget) is out of memory.
    pub fn allocate(&mut self, size: u64, stream: StreamId) -> Result<Block, AllocError> {
        self.process_pending();
        let rounded = self.config.round_size(size);
        let small = self.config.is_small(rounded);
        if let Some(p) = self.parked {
            if p.stream == stream
                && p.small == small
                && p.size >= rounded
                && !self.config.should_split(p.size, rounded, small)
            {
                if let Some(block) = self.take_parked(p, size) {
                    return Ok(block);
                }
            }
            self.flush_parked();
        }
        let (seg_id, offset, block_size) = match self.find_free(small, stream, rounded) {
            Some(k) => k,
            None => self.grow(size, rounded, small, stream)?,
        };
        let split = self.config.should_split(block_size, rounded, small);
        let used = if split { rounded } else { block_size };
        let Some(seg) = self.segments.get_mut(&seg_id) else {
            return Err(AllocError::InvalidBlock(format!(
                "internal: segment {} vanished",
                seg_id.0
            )));
        };
        let (seg_size, seg_stream) = (seg.size, seg.stream);
        let Some(block) = seg.blocks.get_mut(&offset) else {
            return Err(AllocError::InvalidBlock(format!(
                "internal: block {offset} of segment {} vanished",
                seg_id.0
            )));
        };
        block.size = used;
        block.state = State::Allocated {
            requested: size,
            uses: Vec::new(),
        };
        if split {
            seg.blocks.insert(
                offset + rounded,
                BlockInfo {
                    size: block_size - rounded,
                    state: State::Free,
                },
            );
        }
        // The index updates of `remove_free` and `insert_free`, inlined: one segment lookup.
        let set = if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        };
        let was_split = block_size < seg_size;
        if set.remove(&(seg_stream, block_size, seg_id, offset)) && was_split {
            self.stats.inactive_split_bytes.decrease(block_size);
            self.stats.inactive_split.decrease(1);
        }
        if split {
            let rest = block_size - rounded;
            set.insert((seg_stream, rest, seg_id, offset + rounded));
            self.stats.inactive_split_bytes.increase(rest);
            self.stats.inactive_split.increase(1);
        }
        self.stats.allocated_bytes.increase(used);
        self.stats.allocation.increase(1);
        self.stats.active_bytes.increase(used);
        self.stats.active.increase(1);
        self.stats.requested_bytes.increase(size);
        self.log(TraceAction::Alloc, used, stream);
        Ok(Block {
            segment: seg_id,
            offset,
            size: used,
            requested: size,
            stream,
        })
    }

    /// Merges the block parked by the last free (see [`BlockStateKind::Parked`]) into the
    /// free index and its free neighbours. Allocations that miss it and
    /// [`CachingAllocator::empty_cache`] do this anyway; call it before inspecting a
    /// [`CachingAllocator::snapshot`] for fully coalesced blocks.
    pub fn coalesce(&mut self) {
        self.flush_parked();
    }

    /// Hands the parked block out again for a request of `size` bytes.
    fn take_parked(&mut self, p: Parked, size: u64) -> Option<Block> {
        let seg = self.segments.get_mut(&p.segment)?;
        let seg_size = seg.size;
        let info = seg.blocks.get_mut(&p.offset)?;
        if !matches!(info.state, State::Parked) {
            return None;
        }
        info.state = State::Allocated {
            requested: size,
            uses: Vec::new(),
        };
        self.parked = None;
        let st = &mut self.stats;
        if p.size < seg_size {
            st.inactive_split_bytes.decrease(p.size);
            st.inactive_split.decrease(1);
        }
        st.allocated_bytes.increase(p.size);
        st.allocation.increase(1);
        st.active_bytes.increase(p.size);
        st.active.increase(1);
        st.requested_bytes.increase(size);
        self.log(TraceAction::Alloc, p.size, p.stream);
        Some(Block {
            segment: p.segment,
            offset: p.offset,
            size: p.size,
            requested: size,
            stream: p.stream,
        })
    }

    /// Merges the parked block, if any, into the free index like any freed block.
    fn flush_parked(&mut self) {
        let Some(p) = self.parked.take() else {
            return;
        };
        let Some(seg) = self.segments.get(&p.segment) else {
            return;
        };
        if p.size < seg.size {
            self.stats.inactive_split_bytes.decrease(p.size);
            self.stats.inactive_split.decrease(1);
        }
        self.release_block(p.segment, p.offset, false);
    }

    fn find_free(
        &self,
        small: bool,
        stream: StreamId,
        rounded: u64,
    ) -> Option<(SegmentId, u64, u64)> {
        let set = if small {
            &self.free_small
        } else {
            &self.free_large
        };
        let lo = (stream, rounded, SegmentId(0), 0);
        let hi = (stream, u64::MAX, SegmentId(u64::MAX), u64::MAX);
        let &(_, size, seg, off) = set.range(lo..=hi).next()?;
        if !small && self.config.too_large_to_split(size, rounded) {
            return None;
        }
        Some((seg, off, size))
    }

    fn grow(
        &mut self,
        requested: u64,
        rounded: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<(SegmentId, u64, u64), AllocError> {
        let result = match self.obtain(rounded, small, stream) {
            Err(SourceError::OutOfMemory) => {
                // Free this allocator's own cache, then try once more.
                self.stats.num_alloc_retries += 1;
                self.process_pending();
                self.release_cached(None, None);
                self.shrink_tails();
                self.obtain(rounded, small, stream)
            }
            other => other,
        };
        match result {
            Ok(found) => Ok(found),
            Err(SourceError::Failed(m)) => Err(AllocError::Source(m)),
            Err(SourceError::OutOfMemory) if !small => {
                // Last resort: a cached block the split limit passed over beats failing.
                let lo = (stream, rounded, SegmentId(0), 0);
                let hi = (stream, u64::MAX, SegmentId(u64::MAX), u64::MAX);
                match self.free_large.range(lo..=hi).next() {
                    Some(&(_, size, seg, off)) => Ok((seg, off, size)),
                    None => Err(self.out_of_memory(requested, rounded, stream)),
                }
            }
            Err(SourceError::OutOfMemory) => Err(self.out_of_memory(requested, rounded, stream)),
        }
    }

    /// Counts and reports a request that nothing could serve.
    fn out_of_memory(&mut self, requested: u64, rounded: u64, stream: StreamId) -> AllocError {
        self.stats.num_ooms += 1;
        self.log(TraceAction::Oom, requested, stream);
        let seg_size = self.config.segment_size(rounded);
        AllocError::OutOfMemory(Box::new(self.oom_report(requested, seg_size)))
    }

    /// A free block of at least `rounded` bytes from new memory: the pool's expandable
    /// segment grown, or a new segment.
    fn obtain(
        &mut self,
        rounded: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<(SegmentId, u64, u64), SourceError> {
        if let Some(g) = self.granularity {
            return self.obtain_expandable(rounded, small, stream, g);
        }
        let seg_size = self.config.segment_size(rounded);
        if self.releases_before(seg_size) {
            self.release_cached(Some(seg_size), None);
        }
        let id = self.new_segment(seg_size, small, stream)?;
        Ok((id, 0, seg_size))
    }

    fn obtain_expandable(
        &mut self,
        rounded: u64,
        small: bool,
        stream: StreamId,
        g: u64,
    ) -> Result<(SegmentId, u64, u64), SourceError> {
        let current = self
            .growable
            .get(&(small, stream))
            .and_then(|id| self.segments.get(id).map(|s| (*id, s)));
        if let Some((id, seg)) = current {
            let (tail_off, tail_size) = seg.free_tail().unwrap_or((seg.size, 0));
            if tail_size >= rounded {
                // The free tail fits (a split limit passed it over): use it rather than grow.
                return Ok((id, tail_off, tail_size));
            }
            // The small pool grows in steps of a small segment, so that many small blocks
            // share one growth call; the large pool by the shortfall itself.
            let step = if small {
                round_up(self.config.small_segment.max(g), g)
            } else {
                g
            };
            let new_len = round_up(tail_off.saturating_add(rounded), step);
            if new_len <= seg.reserve.unwrap_or(seg.size) {
                let delta = new_len - seg.size;
                if self.releases_before(delta) {
                    self.release_cached(Some(delta), Some(id));
                }
                self.resize_segment(id, new_len)?;
                return Ok((id, tail_off, new_len - tail_off));
            }
        }
        let initial = round_up(self.config.segment_size(rounded), g);
        if self.releases_before(initial) {
            self.release_cached(Some(initial), None);
        }
        let reserve = round_up(self.expandable_reserve().max(initial), g);
        self.admit(initial)?;
        let id = match self.source.allocate_growable(reserve, initial) {
            Ok(id) => id,
            Err(e) => {
                self.unadmit(initial);
                return Err(e);
            }
        };
        self.add_segment(id, initial, Some(reserve), small, stream);
        self.growable.insert((small, stream), id);
        Ok((id, 0, initial))
    }

    /// Whether to hand whole free segments back before obtaining `bytes` more: under
    /// [`Config::release_before_grow`], when the new bytes would raise the reserved
    /// high-water mark. Below the mark the memory was needed before and likely will be
    /// again (a training step repeats), so it is kept: a repeated trace then settles to no
    /// device calls instead of releasing and re-obtaining the same segments every pass.
    fn releases_before(&self, bytes: u64) -> bool {
        self.config.release_before_grow
            && self.stats.reserved_bytes.current.saturating_add(bytes) > self.high_water
    }

    /// The address range a new growable segment reserves: what this allocator could ever
    /// hold (the limits in force), or 64 GiB where nothing bounds it.
    fn expandable_reserve(&self) -> u64 {
        [
            self.source.capacity(),
            self.limit(),
            self.budget().map(Budget::limit),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(64 << 30)
    }

    /// Checks the memory-fraction limit and takes `bytes` from the budget.
    fn admit(&mut self, bytes: u64) -> Result<(), SourceError> {
        if let Some(limit) = self.limit() {
            if self.stats.reserved_bytes.current.saturating_add(bytes) > limit {
                return Err(SourceError::OutOfMemory);
            }
        }
        if let Some(b) = &self.budget {
            if !b.take(bytes) {
                return Err(SourceError::OutOfMemory);
            }
        }
        Ok(())
    }

    /// Gives `bytes` back to the budget.
    fn unadmit(&mut self, bytes: u64) {
        if let Some(b) = &self.budget {
            b.give_back(bytes);
        }
    }

    fn new_segment(
        &mut self,
        seg_size: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<SegmentId, SourceError> {
        self.admit(seg_size)?;
        let id = match self.source.allocate(seg_size) {
            Ok(id) => id,
            Err(e) => {
                self.unadmit(seg_size);
                return Err(e);
            }
        };
        self.add_segment(id, seg_size, None, small, stream);
        Ok(id)
    }

    fn add_segment(
        &mut self,
        id: SegmentId,
        seg_size: u64,
        reserve: Option<u64>,
        small: bool,
        stream: StreamId,
    ) {
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            BlockInfo {
                size: seg_size,
                state: State::Free,
            },
        );
        self.segments.insert(
            id,
            Segment {
                size: seg_size,
                reserve,
                stream,
                small,
                blocks,
            },
        );
        self.insert_free(id, 0, seg_size);
        self.stats.reserved_bytes.increase(seg_size);
        self.high_water = self.high_water.max(self.stats.reserved_bytes.current);
        self.stats.segment.increase(1);
        self.stats.num_device_alloc += 1;
        self.log(TraceAction::SegmentAlloc, seg_size, stream);
    }

    /// Changes the backed length of growable segment `id` to `new_len`, growing its free tail
    /// (or adding one) or cutting it. The caller ensures a shrink only cuts free bytes.
    fn resize_segment(&mut self, id: SegmentId, new_len: u64) -> Result<(), SourceError> {
        let Some(seg) = self.segments.get(&id) else {
            return Err(SourceError::Failed(format!(
                "internal: segment {} vanished",
                id.0
            )));
        };
        let (old, stream) = (seg.size, seg.stream);
        let tail = seg.free_tail();
        if new_len > old {
            let delta = new_len - old;
            self.admit(delta)?;
            if let Err(e) = self.source.resize(id, new_len) {
                self.unadmit(delta);
                return Err(e);
            }
            let start = match tail {
                Some((o, s)) => {
                    self.remove_free(id, o, s);
                    o
                }
                None => old,
            };
            if let Some(seg) = self.segments.get_mut(&id) {
                seg.size = new_len;
                seg.blocks.insert(
                    start,
                    BlockInfo {
                        size: new_len - start,
                        state: State::Free,
                    },
                );
            }
            self.insert_free(id, start, new_len - start);
            self.stats.reserved_bytes.increase(delta);
            self.high_water = self.high_water.max(self.stats.reserved_bytes.current);
            self.stats.num_device_alloc += 1;
            self.stats.num_segment_grows += 1;
            self.log(TraceAction::SegmentGrow, delta, stream);
        } else if new_len < old {
            let Some((o, s)) = tail.filter(|(o, _)| *o <= new_len) else {
                return Err(SourceError::Failed(format!(
                    "internal: segment {} would lose bytes in use",
                    id.0
                )));
            };
            self.source.resize(id, new_len)?;
            let delta = old - new_len;
            self.unadmit(delta);
            self.remove_free(id, o, s);
            if let Some(seg) = self.segments.get_mut(&id) {
                seg.size = new_len;
                seg.blocks.remove(&o);
                if new_len > o {
                    seg.blocks.insert(
                        o,
                        BlockInfo {
                            size: new_len - o,
                            state: State::Free,
                        },
                    );
                }
            }
            if new_len > o {
                self.insert_free(id, o, new_len - o);
            }
            self.stats.reserved_bytes.decrease(delta);
            self.stats.num_device_free += 1;
            self.stats.num_segment_shrinks += 1;
            self.log(TraceAction::SegmentShrink, delta, stream);
        }
        Ok(())
    }

    /// Shrinks every growable segment that has allocated blocks to just past its last one,
    /// releasing its free tail; returns the bytes released.
    fn shrink_tails(&mut self) -> u64 {
        let Some(g) = self.granularity else {
            return 0;
        };
        let cuts: Vec<(SegmentId, u64, u64)> = self
            .segments
            .iter()
            .filter(|(_, s)| s.reserve.is_some())
            .filter_map(|(id, s)| {
                let (o, _) = s.free_tail()?;
                let new_len = round_up(o, g);
                (o > 0 && new_len < s.size).then_some((*id, new_len, s.size - new_len))
            })
            .collect();
        let mut released = 0;
        for (id, new_len, delta) in cuts {
            if self.resize_segment(id, new_len).is_ok() {
                released += delta;
            }
        }
        released
    }

    /// Returns whole free segments to the source, except `keep`. With `Some(n)` it stops once
    /// the released bytes reach `n`, releasing the smallest segments first that would cover
    /// it.
    fn release_cached(&mut self, enough: Option<u64>, keep: Option<SegmentId>) -> u64 {
        let mut whole: Vec<(u64, SegmentId)> = self
            .segments
            .iter()
            .filter(|(id, s)| Some(**id) != keep && s.is_whole_free())
            .map(|(id, s)| (s.size, *id))
            .collect();
        if whole.is_empty() {
            return 0;
        }
        whole.sort_unstable();
        if let Some(n) = enough {
            // Only release when the free segments can make room for the new one; otherwise
            // they would be released for nothing.
            if whole.iter().map(|w| w.0).sum::<u64>() < n {
                return 0;
            }
            // Prefer the single smallest segment that covers `n`; else release from the largest.
            if let Some(pos) = whole.iter().position(|w| w.0 >= n) {
                whole = vec![whole[pos]];
            } else {
                whole.reverse();
            }
        }
        let mut released = 0;
        for (size, id) in whole {
            if let Some(n) = enough {
                if released >= n {
                    break;
                }
            }
            if self.release_segment(id).is_ok() {
                released += size;
            }
        }
        released
    }

    fn release_segment(&mut self, id: SegmentId) -> Result<(), SourceError> {
        let Some(seg) = self.segments.get(&id) else {
            return Ok(());
        };
        let (size, stream, small) = (seg.size, seg.stream, seg.small);
        self.source.free(id)?;
        self.unadmit(size);
        self.remove_free(id, 0, size);
        self.segments.remove(&id);
        if self.growable.get(&(small, stream)) == Some(&id) {
            self.growable.remove(&(small, stream));
        }
        self.stats.reserved_bytes.decrease(size);
        self.stats.segment.decrease(1);
        self.stats.num_device_free += 1;
        self.log(TraceAction::SegmentFree, size, stream);
        Ok(())
    }

    /// Returns every whole free segment to the source and shrinks the free tails of growable
    /// segments; returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.flush_parked();
        self.process_pending();
        self.release_cached(None, None) + self.shrink_tails()
    }

    /// Marks `block` as used by work on `stream` too: when it is freed, it is reused only after
    /// `stream` has passed a fence recorded at free time.
    pub fn record_stream(&mut self, block: &Block, stream: StreamId) -> Result<(), AllocError> {
        let info = self.allocated_mut(block)?;
        if let State::Allocated { uses, .. } = &mut info.state {
            if stream != block.stream && !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    fn allocated_mut(&mut self, block: &Block) -> Result<&mut BlockInfo, AllocError> {
        let info = self
            .segments
            .get_mut(&block.segment)
            .and_then(|s| s.blocks.get_mut(&block.offset));
        match info {
            Some(b) if matches!(b.state, State::Allocated { .. }) && b.size == block.size => Ok(b),
            _ => Err(AllocError::InvalidBlock(format!(
                "no allocated block of {} bytes at offset {} of segment {}; free each block once",
                block.size, block.offset, block.segment.0
            ))),
        }
    }

    /// Frees `block`. It becomes reusable at once on its own stream, or, if it was recorded on
    /// other streams, once fences recorded now on each of them complete.
    pub fn free(&mut self, block: &Block) -> Result<(), AllocError> {
        if self.parked.is_none() && self.park_fast(block) {
            return Ok(());
        }
        let info = self.allocated_mut(block)?;
        let (requested, uses) = match &mut info.state {
            State::Allocated { requested, uses } => (*requested, std::mem::take(uses)),
            _ => (0, Vec::new()),
        };
        let mut fences = Vec::with_capacity(uses.len());
        for s in &uses {
            match self.source.record_fence(*s) {
                Ok(f) => fences.push(f),
                Err(e) => {
                    // Leave the block allocated, as it was.
                    if let Ok(info) = self.allocated_mut(block) {
                        info.state = State::Allocated { requested, uses };
                    }
                    return Err(AllocError::Source(e.to_string()));
                }
            }
        }
        self.stats.allocated_bytes.decrease(block.size);
        self.stats.allocation.decrease(1);
        self.stats.requested_bytes.decrease(requested);
        self.log(TraceAction::Free, block.size, block.stream);
        if fences.is_empty() {
            self.park(block);
        } else {
            if let Ok(info) = self.allocated_mut(block) {
                info.state = State::PendingFree { requested };
            }
            self.pending.push(Pending {
                segment: block.segment,
                offset: block.offset,
                fences,
            });
        }
        Ok(())
    }

    /// The common free, in one lookup: an allocated block used on its own stream only, with
    /// nothing parked yet, is parked. Returns `false` (having changed nothing) otherwise.
    #[inline]
    fn park_fast(&mut self, block: &Block) -> bool {
        let Some(seg) = self.segments.get_mut(&block.segment) else {
            return false;
        };
        let (seg_size, small) = (seg.size, seg.small);
        let Some(info) = seg.blocks.get_mut(&block.offset) else {
            return false;
        };
        let requested = match &info.state {
            State::Allocated { requested, uses } if uses.is_empty() && info.size == block.size => {
                *requested
            }
            _ => return false,
        };
        info.state = State::Parked;
        let st = &mut self.stats;
        st.allocated_bytes.decrease(block.size);
        st.allocation.decrease(1);
        st.requested_bytes.decrease(requested);
        st.active_bytes.decrease(block.size);
        st.active.decrease(1);
        if block.size < seg_size {
            st.inactive_split_bytes.increase(block.size);
            st.inactive_split.increase(1);
        }
        self.parked = Some(Parked {
            segment: block.segment,
            offset: block.offset,
            size: block.size,
            stream: block.stream,
            small,
        });
        self.log(TraceAction::Free, block.size, block.stream);
        true
    }

    /// Parks a block freed on its own stream, merging the block parked before it.
    fn park(&mut self, block: &Block) {
        self.flush_parked();
        let Some(seg) = self.segments.get_mut(&block.segment) else {
            return;
        };
        let (seg_size, small) = (seg.size, seg.small);
        let Some(info) = seg.blocks.get_mut(&block.offset) else {
            return;
        };
        info.state = State::Parked;
        let st = &mut self.stats;
        st.active_bytes.decrease(block.size);
        st.active.decrease(1);
        if block.size < seg_size {
            st.inactive_split_bytes.increase(block.size);
            st.inactive_split.increase(1);
        }
        self.parked = Some(Parked {
            segment: block.segment,
            offset: block.offset,
            size: block.size,
            stream: block.stream,
            small,
        });
    }

    /// A block becomes free and merges with its free neighbours. `active` says whether it
    /// still counts as active (an allocated or pending-free block; a parked one does not).
    fn release_block(&mut self, seg_id: SegmentId, offset: u64, active: bool) {
        let Some(seg) = self.segments.get_mut(&seg_id) else {
            return;
        };
        let Some(size) = seg.blocks.get(&offset).map(|b| b.size) else {
            return;
        };
        let prev = seg
            .blocks
            .range(..offset)
            .next_back()
            .filter(|(o, b)| matches!(b.state, State::Free) && **o + b.size == offset)
            .map(|(o, b)| (*o, b.size));
        let next = seg
            .blocks
            .get(&(offset + size))
            .filter(|b| matches!(b.state, State::Free))
            .map(|b| (offset + size, b.size));
        let (mut start, mut total) = (offset, size);
        if let Some((po, ps)) = prev {
            seg.blocks.remove(&offset);
            start = po;
            total += ps;
        }
        if let Some((no, ns)) = next {
            seg.blocks.remove(&no);
            total += ns;
        }
        match seg.blocks.get_mut(&start) {
            Some(b) => {
                b.size = total;
                b.state = State::Free;
            }
            None => {
                seg.blocks.insert(
                    start,
                    BlockInfo {
                        size: total,
                        state: State::Free,
                    },
                );
            }
        }
        // The index updates of `remove_free` and `insert_free`, inlined: one segment lookup.
        let (seg_size, stream) = (seg.size, seg.stream);
        let set = if seg.small {
            &mut self.free_small
        } else {
            &mut self.free_large
        };
        let st = &mut self.stats;
        if active {
            st.active_bytes.decrease(size);
            st.active.decrease(1);
        }
        for (o, s) in prev.into_iter().chain(next) {
            if set.remove(&(stream, s, seg_id, o)) && s < seg_size {
                st.inactive_split_bytes.decrease(s);
                st.inactive_split.decrease(1);
            }
        }
        set.insert((stream, total, seg_id, start));
        if total < seg_size {
            st.inactive_split_bytes.increase(total);
            st.inactive_split.increase(1);
        }
    }

    fn oom_report(&self, requested: u64, segment_size: u64) -> OomReport {
        let capacity = self.source.capacity();
        let limit = self.limit();
        let base = limit.or(capacity);
        let reserved = self.stats.reserved_bytes.current;
        let allocated = self.stats.allocated_bytes.current;
        let free_cached: u64 = self
            .free_small
            .iter()
            .chain(self.free_large.iter())
            .map(|k| k.1)
            .sum();
        let largest = self
            .free_small
            .iter()
            .chain(self.free_large.iter())
            .map(|k| k.1)
            .max()
            .unwrap_or(0);
        let fragmentation = if free_cached == 0 {
            0.0
        } else {
            1.0 - largest as f64 / free_cached as f64
        };
        let budget = self.budget().map(Budget::report);
        let mut suggestions = Vec::new();
        if !self.pending.is_empty() {
            suggestions.push(format!(
                "{} freed block(s) wait for other streams; synchronize those streams and retry",
                self.pending.len()
            ));
        }
        if free_cached >= requested && largest < requested && self.config.max_split.is_none() {
            suggestions.push(
                "the cache is fragmented; set a split limit (Config::max_split) so large cached blocks are not carved up"
                    .to_string(),
            );
        }
        if !self.config.expandable_segments && self.source.growth_granularity().is_some() {
            suggestions.push(
                "the device can grow segments in place; enable Config::expandable_segments so freed blocks merge across segments"
                    .to_string(),
            );
        }
        if let Some(f) = self.config.memory_fraction {
            if f < 1.0 {
                suggestions.push(format!(
                    "this allocator may use only {:.0}% of the device; raise Config::memory_fraction",
                    f * 100.0
                ));
            }
        }
        if let Some(b) = &budget {
            if b.reserved.saturating_add(segment_size) > b.limit {
                let others: Vec<&str> = b
                    .shares
                    .iter()
                    .filter(|s| s.reserved > 0)
                    .map(|s| s.name.as_str())
                    .collect();
                suggestions.push(format!(
                    "the shared budget `{}` is exhausted; empty the caches of the allocators holding it ({}) or raise its limit",
                    b.name,
                    others.join(", ")
                ));
            }
        }
        suggestions.push(
            "free or shrink live buffers (for example a smaller batch) before this allocation"
                .to_string(),
        );
        OomReport {
            requested,
            segment_size,
            capacity,
            limit,
            free: base.map(|b| b.saturating_sub(reserved)),
            allocated,
            reserved_unallocated: reserved.saturating_sub(allocated),
            largest_free_block: largest,
            fragmentation,
            pending_frees: self.pending.len(),
            budget,
            suggestions,
        }
    }

    /// Every segment and its blocks, with the statistics.
    pub fn snapshot(&self) -> Snapshot {
        let mut segments: Vec<SegmentSnapshot> = self
            .segments
            .iter()
            .map(|(id, s)| SegmentSnapshot {
                id: *id,
                size: s.size,
                reserve: s.reserve,
                stream: s.stream,
                small: s.small,
                blocks: s
                    .blocks
                    .iter()
                    .map(|(o, b)| {
                        let (state, requested) = match b.state {
                            State::Free => (BlockStateKind::Free, 0),
                            State::Parked => (BlockStateKind::Parked, 0),
                            State::Allocated { requested, .. } => {
                                (BlockStateKind::Allocated, requested)
                            }
                            State::PendingFree { requested } => {
                                (BlockStateKind::PendingFree, requested)
                            }
                        };
                        BlockSnapshot {
                            offset: *o,
                            size: b.size,
                            requested,
                            state,
                        }
                    })
                    .collect(),
            })
            .collect();
        segments.sort_by_key(|s| s.id);
        Snapshot {
            segments,
            stats: self.stats,
        }
    }

    /// Checks the allocator's invariants: blocks tile each segment (in bounds, no overlap),
    /// no two neighbouring blocks are both free, the free index holds exactly the free blocks,
    /// `allocated <= active <= reserved`, every current statistic equals a recomputation, a
    /// growable segment's length is a multiple of the granularity within its reserve, each
    /// pool's current growable segment is live and its own, and the bytes held from a budget
    /// equal the reserved bytes. Meant for tests; costs a walk over every block.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut allocated = (0u64, 0u64);
        let mut active = (0u64, 0u64);
        let mut split = (0u64, 0u64);
        let mut requested = 0u64;
        let mut reserved = 0u64;
        let mut free_keys = 0usize;
        let mut parked = 0usize;
        for (id, seg) in &self.segments {
            reserved += seg.size;
            if let Some(r) = seg.reserve {
                let g = self.granularity.unwrap_or(1);
                if seg.size > r || seg.size == 0 || !seg.size.is_multiple_of(g) {
                    return Err(format!(
                        "segment {}: growable length {} is not a non-zero multiple of {g} within {r}",
                        id.0, seg.size
                    ));
                }
            }
            let mut at = 0u64;
            let mut prev_free = false;
            for (o, b) in &seg.blocks {
                if *o != at || b.size == 0 {
                    return Err(format!(
                        "segment {}: block at {o} does not follow {at}",
                        id.0
                    ));
                }
                at = o + b.size;
                if at > seg.size {
                    return Err(format!(
                        "segment {}: block at {o} overruns the segment",
                        id.0
                    ));
                }
                let free = matches!(b.state, State::Free);
                match b.state {
                    State::Free => {
                        let set = if seg.small {
                            &self.free_small
                        } else {
                            &self.free_large
                        };
                        if !set.contains(&(seg.stream, b.size, *id, *o)) {
                            return Err(format!("segment {}: free block at {o} not indexed", id.0));
                        }
                        free_keys += 1;
                        if prev_free {
                            return Err(format!("segment {}: free neighbours at {o}", id.0));
                        }
                        if b.size < seg.size {
                            split.0 += b.size;
                            split.1 += 1;
                        }
                    }
                    State::Allocated { requested: r, .. } => {
                        allocated.0 += b.size;
                        allocated.1 += 1;
                        active.0 += b.size;
                        active.1 += 1;
                        requested += r;
                    }
                    State::PendingFree { .. } => {
                        active.0 += b.size;
                        active.1 += 1;
                    }
                    State::Parked => {
                        parked += 1;
                        let p = self.parked.filter(|p| {
                            p.segment == *id
                                && p.offset == *o
                                && p.size == b.size
                                && p.stream == seg.stream
                                && p.small == seg.small
                        });
                        if p.is_none() {
                            return Err(format!(
                                "segment {}: parked block at {o} is not the one recorded",
                                id.0
                            ));
                        }
                        if b.size < seg.size {
                            split.0 += b.size;
                            split.1 += 1;
                        }
                    }
                }
                prev_free = free;
            }
            if at != seg.size {
                return Err(format!(
                    "segment {}: blocks end at {at} of {}",
                    id.0, seg.size
                ));
            }
        }
        for ((small, stream), id) in &self.growable {
            match self.segments.get(id) {
                Some(s) if s.reserve.is_some() && s.small == *small && s.stream == *stream => {}
                _ => {
                    return Err(format!(
                    "the growable segment of stream {} is not a live growable segment of its pool",
                    stream.0
                ))
                }
            }
        }
        if parked != usize::from(self.parked.is_some()) {
            return Err(format!(
                "{parked} parked block(s), {} recorded",
                usize::from(self.parked.is_some())
            ));
        }
        if free_keys != self.free_small.len() + self.free_large.len() {
            return Err("the free index holds blocks that are not free".to_string());
        }
        let s = &self.stats;
        let checks = [
            ("allocated_bytes", s.allocated_bytes.current, allocated.0),
            ("allocation", s.allocation.current, allocated.1),
            ("active_bytes", s.active_bytes.current, active.0),
            ("active", s.active.current, active.1),
            (
                "inactive_split_bytes",
                s.inactive_split_bytes.current,
                split.0,
            ),
            ("inactive_split", s.inactive_split.current, split.1),
            ("requested_bytes", s.requested_bytes.current, requested),
            ("reserved_bytes", s.reserved_bytes.current, reserved),
            ("segment", s.segment.current, self.segments.len() as u64),
        ];
        for (name, kept, recomputed) in checks {
            if kept != recomputed {
                return Err(format!("{name}: kept {kept}, recomputed {recomputed}"));
            }
        }
        if let Some(b) = &self.budget {
            if b.held() != reserved {
                return Err(format!(
                    "holds {} bytes of its budget but reserves {reserved}",
                    b.held()
                ));
            }
        }
        if !(allocated.0 <= active.0 && active.0 <= reserved) {
            return Err("allocated <= active <= reserved does not hold".to_string());
        }
        Ok(())
    }
}
