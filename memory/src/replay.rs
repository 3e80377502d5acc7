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
use crate::policy::{Config, Policy};
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

/// A source that hands out numbered segments without backing memory, optionally bounded.
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    /// Capacity in bytes; `None` is unbounded.
    pub capacity: Option<u64>,
    /// Bytes currently handed out.
    pub used: u64,
    /// Live segments and their sizes.
    pub live: std::collections::HashMap<SegmentId, u64>,
    next: u64,
}

impl FakeSource {
    /// A source holding at most `capacity` bytes (`None`: unbounded).
    pub fn new(capacity: Option<u64>) -> Self {
        FakeSource {
            capacity,
            ..FakeSource::default()
        }
    }
}

impl SegmentSource for FakeSource {
    type Fence = Completed;

    fn allocate(&mut self, size: u64) -> Result<SegmentId, SourceError> {
        if let Some(cap) = self.capacity {
            if self.used.saturating_add(size) > cap {
                return Err(SourceError::OutOfMemory);
            }
        }
        self.next += 1;
        let id = SegmentId(self.next);
        self.used += size;
        self.live.insert(id, size);
        Ok(id)
    }

    fn free(&mut self, segment: SegmentId) -> Result<(), SourceError> {
        match self.live.remove(&segment) {
            Some(size) => {
                self.used -= size;
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
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The rules replayed.
    pub config: Config,
    /// Allocation requests in the trace.
    pub requests: u64,
    /// The highest total of live tensor bytes (from the trace alone).
    pub peak_live_bytes: u64,
    /// The highest reserved (segment) bytes during the replay.
    pub peak_reserved_bytes: u64,
    /// The highest allocated (block, rounded) bytes during the replay.
    pub peak_allocated_bytes: u64,
    /// `peak_live_bytes / peak_reserved_bytes`.
    pub utilization: f64,
    /// Segments requested from the source.
    pub device_allocs: u64,
    /// Segments returned to the source.
    pub device_frees: u64,
    /// Median time of one allocate or free call, in nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile of the same.
    pub p99_ns: u64,
    /// The allocator's statistics at the end.
    pub stats: MemoryStats,
}

/// Replays `trace` under `policy` over an unbounded fake source.
pub fn replay(trace: &Trace, policy: Policy) -> Result<ReplayReport, AllocError> {
    replay_with(trace, policy.config(), None)
}

/// Replays `trace` under `config` over a fake source of `capacity` bytes (`None`: unbounded).
pub fn replay_with(
    trace: &Trace,
    config: Config,
    capacity: Option<u64>,
) -> Result<ReplayReport, AllocError> {
    let mut alloc = CachingAllocator::new(FakeSource::new(capacity), config);
    let stream = StreamId(0);
    let mut live = vec![None; trace.entries.len()];
    let mut times = Vec::with_capacity(trace.entries.len() * 2);
    let mut seen = HashSet::new();
    for (i, is_alloc) in trace.events() {
        if is_alloc {
            let t = Instant::now();
            let b = alloc.allocate(trace.entries[i].bytes, stream)?;
            times.push(t.elapsed().as_nanos());
            live[i] = Some(b);
            seen.insert(i);
        } else if let Some(b) = live[i].take() {
            let t = Instant::now();
            alloc.free(&b)?;
            times.push(t.elapsed().as_nanos());
        }
    }
    times.sort_unstable();
    let pct = |p: f64| -> u64 {
        if times.is_empty() {
            return 0;
        }
        let idx = ((times.len() - 1) as f64 * p).round() as usize;
        u64::try_from(times[idx.min(times.len() - 1)]).unwrap_or(u64::MAX)
    };
    let stats = alloc.stats();
    let peak_live = trace.peak_live();
    let peak_reserved = stats.reserved_bytes.peak;
    Ok(ReplayReport {
        config,
        requests: seen.len() as u64,
        peak_live_bytes: peak_live,
        peak_reserved_bytes: peak_reserved,
        peak_allocated_bytes: stats.allocated_bytes.peak,
        utilization: if peak_reserved == 0 {
            1.0
        } else {
            peak_live as f64 / peak_reserved as f64
        },
        device_allocs: stats.num_device_alloc,
        device_frees: stats.num_device_free,
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        stats,
    })
}
