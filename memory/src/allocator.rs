//! The caching algorithm on plain offsets: segments from a [`SegmentSource`], blocks inside
//! them, a best-fit index of free blocks per pool and stream, and the deferred frees that wait
//! on fences.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::policy::Config;
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
    Allocated { requested: u64, uses: Vec<StreamId> },
    PendingFree { requested: u64 },
}

#[derive(Debug)]
struct BlockInfo {
    size: u64,
    state: State,
}

#[derive(Debug)]
struct Segment {
    size: u64,
    stream: StreamId,
    small: bool,
    blocks: BTreeMap<u64, BlockInfo>,
}

/// Key of the free index: best fit is the first key at or after `(stream, size, 0, 0)`.
type FreeKey = (StreamId, u64, SegmentId, u64);

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
    segments: HashMap<SegmentId, Segment>,
    free_small: BTreeSet<FreeKey>,
    free_large: BTreeSet<FreeKey>,
    pending: Vec<Pending<S::Fence>>,
    stats: MemoryStats,
    history: VecDeque<TraceEvent>,
    epoch: Instant,
}

impl<S: SegmentSource> fmt::Debug for CachingAllocator<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("config", &self.config)
            .field("segments", &self.segments.len())
            .field("pending", &self.pending.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// An empty allocator drawing segments from `source` under `config`.
    pub fn new(source: S, config: Config) -> Self {
        CachingAllocator {
            source,
            config,
            segments: HashMap::new(),
            free_small: BTreeSet::new(),
            free_large: BTreeSet::new(),
            pending: Vec::new(),
            stats: MemoryStats::default(),
            history: VecDeque::new(),
            epoch: Instant::now(),
        }
    }

    /// The rules in force.
    pub fn config(&self) -> &Config {
        &self.config
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
    pub fn history(&self) -> impl Iterator<Item = &TraceEvent> {
        self.history.iter()
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
        if self.config.history == 0 {
            return;
        }
        if self.history.len() >= self.config.history {
            self.history.pop_front();
        }
        let timestamp_ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.history.push_back(TraceEvent {
            action,
            size,
            stream,
            timestamp_ns,
        });
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
            self.release_block(seg, off);
        }
    }

    /// Allocates `size` bytes for use on `stream`.
    ///
    /// Serves the smallest cached free block of the right pool and stream that fits, splitting
    /// it when the remainder is worth keeping; otherwise obtains a new segment, releasing the
    /// whole free segments of the cache and retrying once if the source is out of memory.
    pub fn allocate(&mut self, size: u64, stream: StreamId) -> Result<Block, AllocError> {
        self.process_pending();
        let rounded = self.config.round_size(size);
        let small = self.config.is_small(rounded);
        let (seg_id, offset, block_size) = match self.find_free(small, stream, rounded) {
            Some(k) => k,
            None => self.grow(size, rounded, small, stream)?,
        };
        self.remove_free(seg_id, offset, block_size);
        let mut used = block_size;
        if self.config.should_split(block_size, rounded, small) {
            used = rounded;
            let rest = block_size - rounded;
            if let Some(seg) = self.segments.get_mut(&seg_id) {
                seg.blocks.insert(
                    offset + rounded,
                    BlockInfo {
                        size: rest,
                        state: State::Free,
                    },
                );
            }
            self.insert_free(seg_id, offset + rounded, rest);
        }
        let Some(block) = self
            .segments
            .get_mut(&seg_id)
            .and_then(|s| s.blocks.get_mut(&offset))
        else {
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
        let seg_size = self.config.segment_size(rounded);
        if self.config.release_before_grow {
            self.release_cached(Some(seg_size));
        }
        let first = self.new_segment(seg_size, small, stream);
        let result = match first {
            Err(SourceError::OutOfMemory) => {
                self.stats.num_alloc_retries += 1;
                self.process_pending();
                self.release_cached(None);
                self.new_segment(seg_size, small, stream)
            }
            other => other,
        };
        match result {
            Ok(id) => Ok((id, 0, seg_size)),
            Err(SourceError::Failed(m)) => Err(AllocError::Source(m)),
            Err(SourceError::OutOfMemory) => {
                self.stats.num_ooms += 1;
                self.log(TraceAction::Oom, requested, stream);
                Err(AllocError::OutOfMemory(Box::new(
                    self.oom_report(requested, seg_size),
                )))
            }
        }
    }

    fn new_segment(
        &mut self,
        seg_size: u64,
        small: bool,
        stream: StreamId,
    ) -> Result<SegmentId, SourceError> {
        if let Some(limit) = self.limit() {
            if self.stats.reserved_bytes.current.saturating_add(seg_size) > limit {
                return Err(SourceError::OutOfMemory);
            }
        }
        let id = self.source.allocate(seg_size)?;
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
                stream,
                small,
                blocks,
            },
        );
        self.insert_free(id, 0, seg_size);
        self.stats.reserved_bytes.increase(seg_size);
        self.stats.segment.increase(1);
        self.stats.num_device_alloc += 1;
        self.log(TraceAction::SegmentAlloc, seg_size, stream);
        Ok(id)
    }

    /// Returns whole free segments to the source. With `Some(n)` it stops once the released
    /// bytes reach `n`, releasing the smallest segments first that would cover it.
    fn release_cached(&mut self, enough: Option<u64>) -> u64 {
        let mut whole: Vec<(u64, SegmentId)> = self
            .segments
            .iter()
            .filter(|(_, s)| {
                s.blocks.len() == 1
                    && s.blocks
                        .values()
                        .all(|b| matches!(b.state, State::Free) && b.size == s.size)
            })
            .map(|(id, s)| (s.size, *id))
            .collect();
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
        let (size, stream) = (seg.size, seg.stream);
        self.source.free(id)?;
        self.remove_free(id, 0, size);
        self.segments.remove(&id);
        self.stats.reserved_bytes.decrease(size);
        self.stats.segment.decrease(1);
        self.stats.num_device_free += 1;
        self.log(TraceAction::SegmentFree, size, stream);
        Ok(())
    }

    /// Returns every whole free segment to the source; returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.process_pending();
        self.release_cached(None)
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
        let uses = match &self.allocated_mut(block)?.state {
            State::Allocated { uses, .. } => uses.clone(),
            _ => Vec::new(),
        };
        let mut fences = Vec::with_capacity(uses.len());
        for s in &uses {
            fences.push(
                self.source
                    .record_fence(*s)
                    .map_err(|e| AllocError::Source(e.to_string()))?,
            );
        }
        let info = self.allocated_mut(block)?;
        let requested = match info.state {
            State::Allocated { requested, .. } => requested,
            _ => 0,
        };
        info.state = State::PendingFree { requested };
        self.stats.allocated_bytes.decrease(block.size);
        self.stats.allocation.decrease(1);
        self.stats.requested_bytes.decrease(requested);
        self.log(TraceAction::Free, block.size, block.stream);
        if fences.is_empty() {
            self.release_block(block.segment, block.offset);
        } else {
            self.pending.push(Pending {
                segment: block.segment,
                offset: block.offset,
                fences,
            });
        }
        Ok(())
    }

    /// A pending-free block becomes free and merges with its free neighbours.
    fn release_block(&mut self, seg_id: SegmentId, offset: u64) {
        let Some(seg) = self.segments.get(&seg_id) else {
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
        self.stats.active_bytes.decrease(size);
        self.stats.active.decrease(1);
        let (mut start, mut total) = (offset, size);
        if let Some((po, ps)) = prev {
            self.remove_free(seg_id, po, ps);
            start = po;
            total += ps;
        }
        if let Some((no, ns)) = next {
            self.remove_free(seg_id, no, ns);
            total += ns;
        }
        if let Some(seg) = self.segments.get_mut(&seg_id) {
            if prev.is_some() {
                seg.blocks.remove(&offset);
            }
            if let Some((no, _)) = next {
                seg.blocks.remove(&no);
            }
            seg.blocks.insert(
                start,
                BlockInfo {
                    size: total,
                    state: State::Free,
                },
            );
        }
        self.insert_free(seg_id, start, total);
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
        if let Some(f) = self.config.memory_fraction {
            if f < 1.0 {
                suggestions.push(format!(
                    "this allocator may use only {:.0}% of the device; raise Config::memory_fraction",
                    f * 100.0
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
                stream: s.stream,
                small: s.small,
                blocks: s
                    .blocks
                    .iter()
                    .map(|(o, b)| {
                        let (state, requested) = match b.state {
                            State::Free => (BlockStateKind::Free, 0),
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
    /// `allocated <= active <= reserved`, and every current statistic equals a recomputation.
    /// Meant for tests; costs a walk over every block.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut allocated = (0u64, 0u64);
        let mut active = (0u64, 0u64);
        let mut split = (0u64, 0u64);
        let mut requested = 0u64;
        let mut reserved = 0u64;
        let mut free_keys = 0usize;
        for (id, seg) in &self.segments {
            reserved += seg.size;
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
        if !(allocated.0 <= active.0 && active.0 <= reserved) {
            return Err("allocated <= active <= reserved does not hold".to_string());
        }
        Ok(())
    }
}
