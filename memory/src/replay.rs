//! Replaying a tensor-lifetime trace through the allocator over a fake source.
//!
//! The trace format is one tensor per line, `start_op end_op bytes`: the tensor is allocated
//! when op `start_op` begins and freed when op `end_op` ends. Replay walks the ops in order; at
//! each op it allocates the tensors starting there (in file order), then frees those ending
//! there. Blank lines and lines starting with `#` are skipped.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::allocator::{
    AllocError, CachingAllocator, Fence, SegmentId, SegmentSource, SourceError, StreamId,
};
use crate::policy::{Config, Policy, MIB};
use crate::stats::MemoryStats;

/// One tensor of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// The op at whose start it is allocated.
    pub start_op: u64,
    /// The op at whose end it is freed.
    pub end_op: u64,
    /// Its size.
    pub bytes: u64,
}

/// A parsed trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// Tensors in file order.
    pub entries: Vec<TraceEntry>,
}

impl Trace {
    /// Parses the `start_op end_op bytes` format; the error names the offending line.
    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let parsed: Result<Vec<u64>, _> = fields.iter().map(|f| f.parse::<u64>()).collect();
            match parsed.as_deref() {
                Ok(&[start_op, end_op, bytes]) if start_op <= end_op => entries.push(TraceEntry {
                    start_op,
                    end_op,
                    bytes,
                }),
                _ => {
                    return Err(format!(
                        "line {}: expected `start_op end_op bytes` with start_op <= end_op, got `{line}`",
                        n + 1
                    ))
                }
            }
        }
        Ok(Trace { entries })
    }

    /// Reads and parses a trace file.
    pub fn load(path: impl AsRef<Path>) -> Result<Trace, String> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
        Trace::parse(&text)
    }

    /// The replay order: `(entry index, is_alloc)` events.
    fn events(&self) -> Vec<(usize, bool)> {
        let mut ev: Vec<(u64, u8, usize)> = Vec::with_capacity(self.entries.len() * 2);
        for (i, e) in self.entries.iter().enumerate() {
            ev.push((e.start_op, 0, i));
            ev.push((e.end_op, 1, i));
        }
        ev.sort_unstable();
        ev.into_iter().map(|(_, k, i)| (i, k == 0)).collect()
    }

    /// The highest total of live bytes, following the replay order.
    pub fn peak_live(&self) -> u64 {
        let (mut live, mut peak) = (0u64, 0u64);
        for (i, alloc) in self.events() {
            let b = self.entries[i].bytes;
            if alloc {
                live += b;
                peak = peak.max(live);
            } else {
                live -= b;
            }
        }
        peak
    }
}

/// A fence that is always complete (replay uses one stream).
#[derive(Debug, Clone, Copy, Default)]
pub struct Completed;

impl Fence for Completed {
    fn is_complete(&self) -> bool {
        true
    }
}

/// A source that hands out numbered segments without backing memory, optionally bounded, and
/// optionally able to grow segments in place (modelled on the HAL: a growable segment backs
/// a prefix `[0, len)` of its reserved range, in multiples of the granularity).
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    /// Capacity in bytes; `None` is unbounded.
    pub capacity: Option<u64>,
    /// Bytes currently backed.
    pub used: u64,
    /// Live segments and their backed lengths.
    pub live: std::collections::HashMap<SegmentId, u64>,
    /// The reserved range of each live growable segment.
    pub reserves: std::collections::HashMap<SegmentId, u64>,
    /// `Some(granularity)` makes the source able to grow segments.
    pub granularity: Option<u64>,
    /// Calls to allocate, allocate_growable and growing resizes.
    pub alloc_calls: u64,
    next: u64,
}

impl FakeSource {
    /// The growth granularity of a fake device with virtual memory: 2 MiB, the granularity
    /// of CUDA's virtual memory management on current GPUs.
    pub const DEFAULT_GRANULARITY: u64 = 2 * MIB;

    /// A source holding at most `capacity` bytes (`None`: unbounded) in fixed segments: it
    /// cannot grow them.
    pub fn new(capacity: Option<u64>) -> Self {
        FakeSource {
            capacity,
            ..FakeSource::default()
        }
    }

    /// A source like [`FakeSource::new`] that also grows segments in multiples of
    /// `granularity` bytes.
    pub fn growable(capacity: Option<u64>, granularity: u64) -> Self {
        FakeSource {
            capacity,
            granularity: Some(granularity.max(1)),
            ..FakeSource::default()
        }
    }

    fn take(&mut self, bytes: u64) -> Result<(), SourceError> {
        if let Some(cap) = self.capacity {
            if self.used.saturating_add(bytes) > cap {
                return Err(SourceError::OutOfMemory);
            }
        }
        self.used += bytes;
        self.alloc_calls += 1;
        Ok(())
    }
}

impl SegmentSource for FakeSource {
    type Fence = Completed;

    fn allocate(&mut self, size: u64) -> Result<SegmentId, SourceError> {
        self.take(size)?;
        self.next += 1;
        let id = SegmentId(self.next);
        self.live.insert(id, size);
        Ok(id)
    }

    fn free(&mut self, segment: SegmentId) -> Result<(), SourceError> {
        match self.live.remove(&segment) {
            Some(size) => {
                self.used -= size;
                self.reserves.remove(&segment);
                Ok(())
            }
            None => Err(SourceError::Failed(format!(
                "segment {} is not live",
                segment.0
            ))),
        }
    }

    fn record_fence(&mut self, _stream: StreamId) -> Result<Completed, SourceError> {
        Ok(Completed)
    }

    fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn growth_granularity(&self) -> Option<u64> {
        self.granularity
    }

    fn allocate_growable(&mut self, reserve: u64, initial: u64) -> Result<SegmentId, SourceError> {
        let Some(g) = self.granularity else {
            return Err(SourceError::Failed(
                "this source cannot make growable segments".to_string(),
            ));
        };
        if initial == 0
            || initial > reserve
            || !initial.is_multiple_of(g)
            || !reserve.is_multiple_of(g)
        {
            return Err(SourceError::Failed(format!(
                "a growable segment needs 0 < initial ({initial}) <= reserve ({reserve}), both multiples of {g}"
            )));
        }
        let id = self.allocate(initial)?;
        self.reserves.insert(id, reserve);
        Ok(id)
    }

    fn resize(&mut self, segment: SegmentId, new_len: u64) -> Result<(), SourceError> {
        let (Some(g), Some(&reserve), Some(&len)) = (
            self.granularity,
            self.reserves.get(&segment),
            self.live.get(&segment),
        ) else {
            return Err(SourceError::Failed(format!(
                "segment {} is not a live growable segment",
                segment.0
            )));
        };
        if new_len == 0 || new_len > reserve || !new_len.is_multiple_of(g) {
            return Err(SourceError::Failed(format!(
                "segment {} cannot be resized to {new_len}: not a non-zero multiple of {g} within {reserve}",
                segment.0
            )));
        }
        if new_len > len {
            self.take(new_len - len)?;
        } else {
            self.used -= len - new_len;
        }
        self.live.insert(segment, new_len);
        Ok(())
    }
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The rules replayed.
    pub config: Config,
    /// Where it ran: `fake` for the fake source, else the device id.
    pub target: String,
    /// Whether expandable segments were in use (the config asks and the target can grow).
    pub expandable: bool,
    /// Allocation requests in one pass of the trace.
    pub requests: u64,
    /// Times the trace was replayed.
    pub iterations: u64,
    /// The highest total of live tensor bytes (from the trace alone).
    pub peak_live_bytes: u64,
    /// The highest reserved (segment) bytes during the replay.
    pub peak_reserved_bytes: u64,
    /// The highest allocated (block, rounded) bytes during the replay.
    pub peak_allocated_bytes: u64,
    /// `peak_live_bytes / peak_reserved_bytes`.
    pub utilization: f64,
    /// Calls that obtained memory from the source during the replay (segments and
    /// growths; see [`MemoryStats::num_device_alloc`]): the sum of
    /// `device_allocs_per_iteration`.
    pub device_allocs: u64,
    /// Calls that returned memory to the source during the replay.
    pub device_frees: u64,
    /// Of `device_allocs`, those made after the first pass of the trace: 0 when the cache
    /// serves the repeated trace without asking the device for memory.
    pub steady_device_allocs: u64,
    /// Device allocation calls made during each pass of the trace, in order.
    pub device_allocs_per_iteration: Vec<u64>,
    /// Median time of one allocate or free call, in nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile of the same.
    pub p99_ns: u64,
    /// The allocator's statistics at the end.
    pub stats: MemoryStats,
}

/// What [`run_replay`] drives: an allocator behind a uniform allocate/free interface.
pub(crate) trait ReplayTarget {
    /// A live block.
    type Handle;
    /// The error of a failed call.
    type Error;
    fn alloc(&mut self, size: u64) -> Result<Self::Handle, Self::Error>;
    fn free(&mut self, handle: Self::Handle) -> Result<(), Self::Error>;
    fn stats(&self) -> MemoryStats;
}

impl<S: SegmentSource> ReplayTarget for CachingAllocator<S> {
    type Handle = crate::allocator::Block;
    type Error = AllocError;
    fn alloc(&mut self, size: u64) -> Result<Self::Handle, AllocError> {
        self.allocate(size, StreamId(0))
    }
    fn free(&mut self, handle: Self::Handle) -> Result<(), AllocError> {
        CachingAllocator::free(self, &handle)
    }
    fn stats(&self) -> MemoryStats {
        CachingAllocator::stats(self)
    }
}

/// Replays `trace` `iterations` times (at least once) through `target` on one stream, timing
/// every allocate and free call.
pub(crate) fn run_replay<T: ReplayTarget>(
    target: &mut T,
    trace: &Trace,
    config: Config,
    iterations: u64,
    name: &str,
    expandable: bool,
) -> Result<ReplayReport, T::Error> {
    let iterations = iterations.max(1);
    let events = trace.events();
    let mut live: Vec<Option<T::Handle>> = (0..trace.entries.len()).map(|_| None).collect();
    let mut times: Vec<u64> = Vec::with_capacity(events.len() * iterations as usize);
    let mut seen = HashSet::new();
    // Counted from here, so that the totals are this replay's and equal the sum of the
    // passes' figures whatever the target did before.
    let start = target.stats();
    let mut per_iteration = Vec::with_capacity(iterations as usize);
    for _ in 0..iterations {
        let before = target.stats().num_device_alloc;
        for &(i, is_alloc) in &events {
            if is_alloc {
                let t = Instant::now();
                let b = target.alloc(trace.entries[i].bytes)?;
                times.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                live[i] = Some(b);
                seen.insert(i);
            } else if let Some(b) = live[i].take() {
                let t = Instant::now();
                target.free(b)?;
                times.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
            }
        }
        let now = target.stats().num_device_alloc;
        per_iteration.push(now - before);
    }
    times.sort_unstable();
    let pct = |p: f64| -> u64 {
        if times.is_empty() {
            return 0;
        }
        let idx = ((times.len() - 1) as f64 * p).round() as usize;
        times[idx.min(times.len() - 1)]
    };
    let stats = target.stats();
    let peak_live = trace.peak_live();
    let peak_reserved = stats.reserved_bytes.peak;
    Ok(ReplayReport {
        config,
        target: name.to_string(),
        expandable,
        requests: seen.len() as u64,
        iterations,
        peak_live_bytes: peak_live,
        peak_reserved_bytes: peak_reserved,
        peak_allocated_bytes: stats.allocated_bytes.peak,
        utilization: if peak_reserved == 0 {
            1.0
        } else {
            peak_live as f64 / peak_reserved as f64
        },
        device_allocs: per_iteration.iter().sum(),
        device_frees: stats.num_device_free - start.num_device_free,
        steady_device_allocs: per_iteration.iter().skip(1).sum(),
        device_allocs_per_iteration: per_iteration,
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        stats,
    })
}

/// Replays `trace` once under `policy` over an unbounded fake device with virtual memory
/// (growth granularity [`FakeSource::DEFAULT_GRANULARITY`]): the policy's
/// [`Config::expandable_segments`] decides whether segments grow in place.
pub fn replay(trace: &Trace, policy: Policy) -> Result<ReplayReport, AllocError> {
    replay_source(
        trace,
        policy.config(),
        FakeSource::growable(None, FakeSource::DEFAULT_GRANULARITY),
        1,
    )
}

/// Replays `trace` once under `config` over a fake source of `capacity` bytes (`None`:
/// unbounded) with fixed segments only.
pub fn replay_with(
    trace: &Trace,
    config: Config,
    capacity: Option<u64>,
) -> Result<ReplayReport, AllocError> {
    replay_source(trace, config, FakeSource::new(capacity), 1)
}

/// Replays `trace` `iterations` times under `config` over `source` (a [`FakeSource`], maybe
/// growable, or any other source).
pub fn replay_source<S: SegmentSource>(
    trace: &Trace,
    config: Config,
    source: S,
    iterations: u64,
) -> Result<ReplayReport, AllocError> {
    let mut alloc = CachingAllocator::new(source, config);
    let expandable = alloc.expandable();
    run_replay(&mut alloc, trace, config, iterations, "fake", expandable)
}

/// The reuse scenario: allocate 8 × 16 MiB, free them all, then allocate 4 × 32 MiB. An
/// allocator that cannot serve the second half from the first half's memory reserves twice
/// the 128 MiB that is ever live.
pub fn reuse_scenario() -> Trace {
    let mut entries = vec![
        TraceEntry {
            start_op: 0,
            end_op: 0,
            bytes: 16 * MIB,
        };
        8
    ];
    entries.extend(std::iter::repeat_n(
        TraceEntry {
            start_op: 1,
            end_op: 1,
            bytes: 32 * MIB,
        },
        4,
    ));
    Trace { entries }
}
