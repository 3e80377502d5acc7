//! The adapter onto the HAL: segments are [`xpu_hal::Allocation`]s, streams are
//! [`xpu_hal::Stream`]s and fences are [`xpu_hal::Event`]s.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use xpu_hal::{Allocation, BufferSlice, Device, Error, Event, Result, Stream};

use crate::allocator::{
    AllocError, Block, CachingAllocator, Fence, SegmentId, SegmentSource, SourceError, StreamId,
};
use crate::policy::Config;
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
    segments: HashMap<SegmentId, Allocation>,
    streams: HashMap<StreamId, Stream>,
    next: u64,
}

impl HalSource {
    /// A source drawing from `device`.
    pub fn new(device: Device) -> Self {
        HalSource {
            device,
            segments: HashMap::new(),
            streams: HashMap::new(),
            next: 0,
        }
    }

    /// The allocation behind `segment`.
    pub fn allocation(&self, segment: SegmentId) -> Option<&Allocation> {
        self.segments.get(&segment)
    }
}

impl SegmentSource for HalSource {
    type Fence = Event;

    fn allocate(&mut self, size: u64) -> std::result::Result<SegmentId, SourceError> {
        match self.device.allocate(size) {
            Ok(a) => {
                self.next += 1;
                let id = SegmentId(self.next);
                self.segments.insert(id, a);
                Ok(id)
            }
            Err(Error::OutOfMemory { .. }) => Err(SourceError::OutOfMemory),
            Err(e) => Err(SourceError::Failed(e.to_string())),
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
    /// An allocator over `device` under `config`.
    pub fn new(device: Device, config: Config) -> Self {
        DeviceAllocator {
            inner: Mutex::new(CachingAllocator::new(HalSource::new(device), config)),
        }
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
        let device = a.source().device.clone();
        let block = a.allocate(size, stream).map_err(|e| to_hal(&device, e))?;
        let allocation = a
            .source()
            .allocation(block.segment)
            .cloned()
            .ok_or_else(|| Error::invalid("internal: the block's segment has no allocation"))?;
        Ok(DeviceBlock { allocation, block })
    }

    /// Marks `block` as used by work on `stream` as well.
    pub fn record_stream(&self, block: &DeviceBlock, stream: StreamId) -> Result<()> {
        let mut a = self.lock();
        let device = a.source().device.clone();
        a.record_stream(&block.block, stream)
            .map_err(|e| to_hal(&device, e))
    }

    /// Frees `block`; see [`CachingAllocator::free`] for when it is reused.
    pub fn free(&self, block: DeviceBlock) -> Result<()> {
        let mut a = self.lock();
        let device = a.source().device.clone();
        a.free(&block.block).map_err(|e| to_hal(&device, e))
    }

    /// Returns whole free segments to the device; returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.lock().empty_cache()
    }

    /// The statistics now.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats()
    }

    /// The pool now.
    pub fn snapshot(&self) -> Snapshot {
        self.lock().snapshot()
    }

    /// Sets (or clears) the fraction of device memory this allocator may reserve.
    pub fn set_memory_fraction(&self, fraction: Option<f64>) {
        self.lock().set_memory_fraction(fraction);
    }
}
