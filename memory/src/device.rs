//! The adapter onto the HAL: segments are [`xpu_hal::Allocation`]s, streams are
//! [`xpu_hal::Stream`]s and fences are [`xpu_hal::Event`]s.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use xpu_hal::{Allocation, BufferSlice, Device, Error, Event, Result, Stream};

use crate::allocator::{
    AllocError, Block, CachingAllocator, Fence, IdMap, SegmentId, SegmentSource, SourceError,
    StreamId,
};
use crate::budget::Budget;
use crate::policy::Config;
use crate::replay::{run_replay, ReplayReport, ReplayTarget, Trace};
use crate::stats::{MemoryStats, Snapshot};

impl Fence for Event {
    /// A query error (for example a lost device) counts as complete: no further work of that
    /// stream can touch the memory.
    fn is_complete(&self) -> bool {
        self.query().unwrap_or(true)
    }
}

/// A [`SegmentSource`] over one HAL device. Holds each segment's [`Allocation`] and the
/// streams registered with [`DeviceAllocator::register_stream`].
#[derive(Debug)]
pub struct HalSource {
    device: Device,
    segments: IdMap<SegmentId, Allocation>,
    streams: HashMap<StreamId, Stream>,
    next: u64,
}

impl HalSource {
    /// A source drawing from `device`.
    pub fn new(device: Device) -> Self {
        HalSource {
            device,
            segments: IdMap::default(),
            streams: HashMap::new(),
            next: 0,
        }
    }

    /// The allocation behind `segment`.
    pub fn allocation(&self, segment: SegmentId) -> Option<&Allocation> {
        self.segments.get(&segment)
    }
}

fn source_error(e: Error) -> SourceError {
    match e {
        Error::OutOfMemory { .. } => SourceError::OutOfMemory,
        e => SourceError::Failed(e.to_string()),
    }
}

impl HalSource {
    fn keep(&mut self, a: Allocation) -> SegmentId {
        self.next += 1;
        let id = SegmentId(self.next);
        self.segments.insert(id, a);
        id
    }
}

impl SegmentSource for HalSource {
    type Fence = Event;

    fn allocate(&mut self, size: u64) -> std::result::Result<SegmentId, SourceError> {
        let a = self.device.allocate(size).map_err(source_error)?;
        Ok(self.keep(a))
    }

    /// The device's `virtual_memory_granularity` capability.
    fn growth_granularity(&self) -> Option<u64> {
        self.device.capabilities().virtual_memory_granularity
    }

    fn allocate_growable(
        &mut self,
        reserve: u64,
        initial: u64,
    ) -> std::result::Result<SegmentId, SourceError> {
        let a = self
            .device
            .allocate_growable(reserve, initial)
            .map_err(source_error)?;
        Ok(self.keep(a))
    }

    fn resize(&mut self, segment: SegmentId, new_len: u64) -> std::result::Result<(), SourceError> {
        match self.segments.get(&segment) {
            Some(a) => a.resize(new_len).map_err(source_error),
            None => Err(SourceError::Failed(format!(
                "segment {} is not live",
                segment.0
            ))),
        }
    }

    fn free(&mut self, segment: SegmentId) -> std::result::Result<(), SourceError> {
        match self.segments.remove(&segment) {
            Some(a) => a.free().map_err(|e| SourceError::Failed(e.to_string())),
            None => Err(SourceError::Failed(format!(
                "segment {} is not live",
                segment.0
            ))),
        }
    }

    fn record_fence(&mut self, stream: StreamId) -> std::result::Result<Event, SourceError> {
        let s = self.streams.get(&stream).ok_or_else(|| {
            SourceError::Failed(format!("stream {} was not registered", stream.0))
        })?;
        s.record_event()
            .map_err(|e| SourceError::Failed(e.to_string()))
    }

    fn capacity(&self) -> Option<u64> {
        self.device.memory_info().ok().map(|m| m.total)
    }
}

/// A block of device memory from a [`DeviceAllocator`]: a range of a cached segment.
#[derive(Debug, Clone)]
pub struct DeviceBlock {
    /// The segment's allocation (shared by every block of the segment).
    pub allocation: Allocation,
    /// The pool's record of the block; pass the `DeviceBlock` back to free it.
    pub block: Block,
}

impl DeviceBlock {
    /// The requested bytes as a slice usable in any stream operation.
    pub fn slice(&self) -> BufferSlice<'_> {
        self.allocation
            .slice(self.block.offset, self.block.requested)
    }

    /// `(allocation, offset, len)` of the requested bytes.
    pub fn parts(&self) -> (&Allocation, u64, u64) {
        (&self.allocation, self.block.offset, self.block.requested)
    }
}

/// A thread-safe caching allocator for one HAL device. Cheap operations take one mutex.
#[derive(Debug)]
pub struct DeviceAllocator {
    device: Device,
    inner: Mutex<CachingAllocator<HalSource>>,
}

fn to_hal(device: &Device, e: AllocError) -> Error {
    match e {
        AllocError::OutOfMemory(r) => Error::OutOfMemory {
            device: device.id().to_string(),
            requested: r.requested,
            free: r.free.unwrap_or(0),
            capacity: r.capacity.unwrap_or(0),
            hint: r.to_string(),
        },
        AllocError::Source(m) => Error::backend_message(device.backend(), m),
        AllocError::InvalidBlock(m) => Error::invalid(m),
    }
}

impl DeviceAllocator {
    /// An allocator over `device` under `config`. Expandable segments are used when
    /// [`Config::expandable_segments`] is set and the device has a
    /// `virtual_memory_granularity`.
    pub fn new(device: Device, config: Config) -> Self {
        DeviceAllocator {
            device: device.clone(),
            inner: Mutex::new(CachingAllocator::new(HalSource::new(device), config)),
        }
    }

    /// An allocator like [`DeviceAllocator::new`] that also draws from `budget`, a limit
    /// shared with other allocators (of this device or others); the device id names it in
    /// the budget's reports.
    pub fn with_budget(device: Device, config: Config, budget: &Budget) -> Self {
        let name = device.id().to_string();
        DeviceAllocator {
            device: device.clone(),
            inner: Mutex::new(CachingAllocator::with_budget(
                HalSource::new(device),
                config,
                budget,
                name,
            )),
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether segments grow in place on this device.
    pub fn expandable(&self) -> bool {
        self.lock().expandable()
    }

    fn lock(&self) -> MutexGuard<'_, CachingAllocator<HalSource>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `stream` (a clone is kept) and returns the id to allocate on it with.
    pub fn register_stream(&self, stream: &Stream) -> StreamId {
        let mut a = self.lock();
        let src = a.source_mut();
        let id = StreamId(src.streams.len() as u64);
        src.streams.insert(id, stream.clone());
        id
    }

    /// Allocates `size` bytes for work on `stream`.
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<DeviceBlock> {
        let mut a = self.lock();
        let block = a
            .allocate(size, stream)
            .map_err(|e| to_hal(&self.device, e))?;
        let allocation = a
            .source()
            .allocation(block.segment)
            .cloned()
            .ok_or_else(|| Error::invalid("internal: the block's segment has no allocation"))?;
        Ok(DeviceBlock { allocation, block })
    }

    /// Marks `block` as used by work on `stream` as well.
    pub fn record_stream(&self, block: &DeviceBlock, stream: StreamId) -> Result<()> {
        self.lock()
            .record_stream(&block.block, stream)
            .map_err(|e| to_hal(&self.device, e))
    }

    /// Frees `block`; see [`CachingAllocator::free`] for when it is reused.
    pub fn free(&self, block: DeviceBlock) -> Result<()> {
        let result = self.lock().free(&block.block);
        // The segment's handle is dropped after the lock is released.
        drop(block);
        result.map_err(|e| to_hal(&self.device, e))
    }

    /// Returns whole free segments to the device and shrinks the free tails of expandable
    /// segments; returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.lock().empty_cache()
    }

    /// The statistics now.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats()
    }

    /// The pool now, with the last freed block merged into its neighbours.
    pub fn snapshot(&self) -> Snapshot {
        let mut a = self.lock();
        a.coalesce();
        a.snapshot()
    }

    /// Sets (or clears) the fraction of device memory this allocator may reserve.
    pub fn set_memory_fraction(&self, fraction: Option<f64>) {
        self.lock().set_memory_fraction(fraction);
    }
}

struct DeviceTarget<'a> {
    alloc: &'a DeviceAllocator,
    stream: StreamId,
}

impl ReplayTarget for DeviceTarget<'_> {
    type Handle = DeviceBlock;
    type Error = Error;
    fn alloc(&mut self, size: u64) -> Result<DeviceBlock> {
        self.alloc.allocate(size, self.stream)
    }
    fn free(&mut self, handle: DeviceBlock) -> Result<()> {
        self.alloc.free(handle)
    }
    fn stats(&self) -> MemoryStats {
        self.alloc.stats()
    }
}

/// Replays `trace` `iterations` times on `device` through a fresh [`DeviceAllocator`] under
/// `config`, on one stream: real device memory, with each allocate and free call timed.
/// The allocator's cache is emptied at the end.
pub fn replay_on_device(
    trace: &Trace,
    device: &Device,
    config: Config,
    iterations: u64,
) -> Result<ReplayReport> {
    let alloc = DeviceAllocator::new(device.clone(), config);
    let stream = device.create_stream()?;
    let id = alloc.register_stream(&stream);
    let expandable = alloc.expandable();
    let mut target = DeviceTarget {
        alloc: &alloc,
        stream: id,
    };
    let report = run_replay(
        &mut target,
        trace,
        config,
        iterations,
        &device.id().to_string(),
        expandable,
    );
    alloc.empty_cache();
    report
}

/// Median times of a cached allocate + free pair through a [`DeviceAllocator`], beside the
/// device's own allocate + drop of the same size, measured in the same run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CachedLatency {
    /// The device measured.
    pub device: String,
    /// Bytes per allocation.
    pub size: u64,
    /// Whether the pool used expandable segments.
    pub expandable: bool,
    /// Median nanoseconds of one allocate + free pair through the pool (the block is cached).
    pub pool_p50_ns: f64,
    /// Median nanoseconds of one `Device::allocate` + drop pair.
    pub device_p50_ns: f64,
    /// Device allocation calls the pool made during the measurement (after warm-up: 0).
    pub pool_device_allocs: u64,
}

/// Times `batches` batches of `batch` allocate + free pairs of `size` bytes through a fresh
/// [`DeviceAllocator`] under `config` (after one warm-up pair, so the block is cached), and
/// the same through `Device::allocate` and drop, interleaving the two batch by batch. Each
/// figure is the median over batches of the batch time divided by `batch`, so the clock is
/// read twice per batch rather than twice per call.
pub fn measure_cached_latency(
    device: &Device,
    config: Config,
    size: u64,
    batches: usize,
    batch: usize,
) -> Result<CachedLatency> {
    use std::time::Instant;
    let alloc = DeviceAllocator::new(device.clone(), config);
    let stream = device.create_stream()?;
    let s = alloc.register_stream(&stream);
    alloc.free(alloc.allocate(size, s)?)?;
    let before = alloc.stats().num_device_alloc;
    let batch = batch.max(1);
    let (mut pool, mut raw) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
    for _ in 0..batches.max(1) {
        let t = Instant::now();
        for _ in 0..batch {
            let b = alloc.allocate(size, s)?;
            alloc.free(std::hint::black_box(b))?;
        }
        pool.push(t.elapsed().as_nanos() as f64 / batch as f64);
        let t = Instant::now();
        for _ in 0..batch {
            drop(std::hint::black_box(device.allocate(size)?));
        }
        raw.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let report = CachedLatency {
        device: device.id().to_string(),
        size,
        expandable: alloc.expandable(),
        pool_p50_ns: median(&mut pool),
        device_p50_ns: median(&mut raw),
        pool_device_allocs: alloc.stats().num_device_alloc - before,
    };
    alloc.empty_cache();
    Ok(report)
}
