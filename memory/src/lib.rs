//! # xpu-memory: a stream-aware caching allocator
//!
//! Asking a device for memory is slow (a driver call, often a device synchronization) and
//! asking it to take memory back is slower, so a runtime that allocates a tensor per op keeps
//! freed memory and hands it out again. This crate is that cache.
//!
//! ## Two layers
//!
//! The crate splits raw storage from the pooling algorithm. [`SegmentSource`] is raw storage:
//! it hands out *segments* (large ranges, named by a [`SegmentId`]), takes them back, and
//! records [`Fence`]s on streams. [`CachingAllocator`] is the algorithm, and it only ever sees
//! sizes and offsets. That is what makes it testable without a device: the tests drive it over
//! plain numbered segments, check its invariants after every operation and hammer it from
//! threads, and [`replay`] measures it on recorded traces. [`DeviceAllocator`] puts the same
//! algorithm on a [`xpu_hal::Device`], with [`xpu_hal::Allocation`]s as segments and
//! [`xpu_hal::Event`]s as fences.
//!
//! ## The algorithm
//!
//! Requests are rounded up to [`Config::min_block`] (512 B) and split into two pools. Small
//! requests (≤ 1 MiB) are carved from 2 MiB small segments so that many of them share one
//! driver allocation; large requests get segments of their own size class. Each pool indexes
//! its free blocks in a `BTreeSet` keyed by `(stream, size, segment, offset)`, so the best fit
//! is one range lookup. A chosen block larger than the request is split when the remainder is
//! worth keeping; a freed block merges with free neighbours in its segment, so a segment whose
//! blocks are all freed becomes one block again and can go back to the device
//! ([`CachingAllocator::empty_cache`]). An optional split limit ([`Config::max_split`], off
//! in both policies) refuses to carve a small piece out of a huge cached block.
//!
//! ## Streams
//!
//! A segment belongs to the stream that caused it, and its blocks are only reused on that
//! stream: work on one in-order stream cannot overlap, so a block freed on its own stream can
//! be handed out at once. If the caller declared the block used on other streams
//! ([`CachingAllocator::record_stream`]), freeing it records a fence on each of them and the
//! block stays *pending* until all complete. The fence is an abstract trait so that tests can
//! complete fences by hand.
//!
//! ## Expandable segments
//!
//! Where the source can grow memory in place ([`SegmentSource::growth_granularity`]; on the
//! HAL, a device with a `virtual_memory_granularity`) and [`Config::expandable_segments`] is
//! set (the default of [`Policy::Xpu`]), each pool and stream has one growable segment: a
//! reserved address range backed as a prefix `[0, len)`. A request that finds no cached
//! block grows it by the shortfall beyond its free tail block (rounded to the granularity;
//! the small pool grows in small-segment steps), so what would have been separate segments
//! are one, and freed blocks merge across their old boundaries. [`CachingAllocator::empty_cache`]
//! shrinks a free tail. Reserved bytes count the backed length; each growth counts as one
//! device allocation call and each shrink as one device free ([`MemoryStats`]).
//!
//! ## Budgets
//!
//! A [`Budget`] is one limit shared by several allocators (every host device, or a GPU and
//! its pinned staging memory): each segment and each growth is taken from it first, and
//! releases give it back. A request past the budget fails like a full device: the
//! allocator frees its own cache and retries, and the report names the budget, its use and
//! each allocator's share.
//!
//! ## Running out
//!
//! When the source (or the budget) is out of memory, the allocator returns every whole free
//! segment, shrinks free tails, turns completed pending frees into free blocks, and retries
//! once. If that fails too the error ([`AllocError::OutOfMemory`]) carries an [`OomReport`]:
//! the request, capacity, free, allocated, reserved-but-unallocated, largest free block,
//! fragmentation, the shared budget if any, and only the remedies not already in effect
//! (expandable segments are suggested only where the source supports them and they are
//! off). [`Config::memory_fraction`] caps what one allocator may reserve, so that several can
//! share a device.
//!
//! ## The hot path
//!
//! A block freed on its own stream is *parked* ([`BlockStateKind::Parked`]): the next request
//! of the same stream and size takes it straight back, with no change to the free index; any
//! other request merges it first. With the history ring off (the default), a cached
//! allocate + free through [`DeviceAllocator`] is one uncontended lock, two hash lookups and
//! two B-tree lookups.
//!
//! ## Accounting
//!
//! [`MemoryStats`] uses PyTorch's names (allocated, reserved, active, inactive-split and
//! requested bytes and counts, each with current, peak, allocated and freed totals; retries,
//! OOMs, device allocations and frees, segment growths and shrinks) so figures compare
//! directly. [`Snapshot`] lists every segment and block and serializes as JSON; an opt-in
//! bounded ring ([`Config::history`]) keeps the latest alloc/free events.
//!
//! ## Host staging
//!
//! [`StagingPool`] keeps the host buffers that copies between devices pass through,
//! reused in stream order: a buffer comes back with an event recorded after its last use,
//! and the next user makes its stream wait for that event instead of the host waiting
//! (see the `staging` module). [`host_staging`] is the process's pool.
//!
//! ## Policies
//!
//! [`Policy::PyTorch`] reproduces PyTorch's default size rules as a baseline. [`Policy::Xpu`],
//! the default, sizes large segments to the request instead of to 2 MiB or 20 MiB buckets,
//! splits large blocks finely, uses expandable segments where it can, and hands whole free
//! segments back before growing past the most it has ever reserved; it trades more device
//! calls in the first pass for a smaller footprint. [`replay`] runs a trace under either over
//! a fake source that grows segments in 2 MiB steps as CUDA's virtual memory does
//! ([`FakeSource::DEFAULT_GRANULARITY`]; [`replay_source`] takes any source, fixed segments
//! included), [`replay_on_device`] through a [`DeviceAllocator`] on a real device, both
//! reporting utilization (peak live bytes over peak reserved bytes), device calls (also per
//! pass of a repeated trace) and latency.

mod allocator;
mod budget;
mod clock;
mod device;
mod policy;
mod replay;
mod staging;
mod stats;
mod trace;

pub use allocator::{
    AllocError, Block, CachingAllocator, Fence, OomReport, SegmentId, SegmentSource, SourceError,
    StreamId,
};
pub use budget::{Budget, BudgetReport, BudgetShare};
pub use device::{
    measure_cached_latency, replay_on_device, CachedLatency, DeviceAllocator, DeviceBlock,
    HalSource,
};
pub use policy::{Config, Policy, MIB};
pub use replay::{
    replay, replay_source, replay_with, reuse_scenario, Completed, FakeSource, ReplayReport, Trace,
    TraceEntry,
};
pub use staging::{host_staging, StagingBuffer, StagingPool, StagingStats, DEFAULT_STAGING_LIMIT};
pub use stats::{
    BlockSnapshot, BlockStateKind, MemoryStats, SegmentSnapshot, Snapshot, Stat, TraceAction,
    TraceEvent,
};
pub use trace::TraceFormat;
