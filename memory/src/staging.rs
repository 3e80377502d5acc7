//! Host staging memory, reused in stream order.
//!
//! Copies between devices that cannot reach each other go through host memory: the
//! source's stream downloads into a host buffer, the destination's stream uploads from
//! it. A [`StagingPool`] keeps those buffers between copies, so that moving a large
//! message costs no allocation per piece, and bounds how much host memory they take.
//!
//! Reuse follows the streams, not the host: a buffer is released together with an
//! [`Event`] recorded after its last use, and the next caller may take it at once if it
//! makes its own stream wait for that event first ([`StagingBuffer::ready_after`]).
//! Nothing blocks the host, and buffers are handed out oldest release first, so that
//! consecutive pieces of one transfer get different buffers and one piece's upload
//! overlaps the next one's download. A buffer whose event has completed is preferred
//! (no wait at all); a new buffer is made while the pool is under its limit; past it,
//! the oldest released buffer that is large enough is reused with its wait. Only when
//! nothing released is large enough does the pool exceed its limit, counted in
//! [`StagingStats::over_limit`], rather than fail a copy.
//!
//! Buffers can be pinned for the devices that copy through them
//! ([`StagingPool::acquire_for`]): each is registered once per device with
//! [`xpu_hal::Device::pin_host`] (page-locked for CUDA, imported as a buffer on Vulkan),
//! so that both the download and the upload are direct transfers. The registration
//! stays with the buffer as it is reused, and keeps the device's driver objects alive
//! until the buffer is dropped ([`StagingPool::empty_cache`] drops the idle ones). A
//! device that cannot pin is no error: its copies stage as for any host memory, and a
//! failed registration is counted ([`StagingStats::pin_failures`],
//! [`StagingPool::last_pin_error`]).
//!
//! [`host_staging`] is the process's pool, shared by every user (the collectives'
//! transport among them), so that staging memory is bounded and reported in one place.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, OnceLock};

use xpu_hal::{Device, Event, HostBuffer, Result};

/// Buffers are made in multiples of this many bytes, so that slightly different piece
/// lengths share them.
const GRANULE: usize = 64 << 10;

/// The limit of [`host_staging`], bytes.
pub const DEFAULT_STAGING_LIMIT: u64 = 64 << 20;

/// A staging buffer taken from a [`StagingPool`]. Give it back with
/// [`StagingPool::release`] once the work that uses it is enqueued.
#[derive(Debug)]
pub struct StagingBuffer {
    buffer: HostBuffer,
    after: Option<Event>,
    /// The devices (by uid) the buffer has been offered to for pinning.
    offered: Vec<u64>,
}

impl StagingBuffer {
    /// The buffer: at least the bytes asked for.
    pub fn buffer(&self) -> &HostBuffer {
        &self.buffer
    }

    /// The event recorded after the buffer's previous use, if that may still be running:
    /// make the stream that writes the buffer first wait for it.
    pub fn ready_after(&self) -> Option<&Event> {
        self.after.as_ref()
    }
}

/// What a [`StagingPool`] has done and holds now, read at one instant under the pool's
/// lock: `acquired` is always `reused_idle + reused_pending + allocated`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagingStats {
    /// Bytes of all buffers the pool has made and not dropped, in use or not.
    pub reserved_bytes: u64,
    /// The most `reserved_bytes` has been.
    pub peak_reserved_bytes: u64,
    /// Buffers handed out.
    pub acquired: u64,
    /// Of those, reused buffers whose previous use had finished.
    pub reused_idle: u64,
    /// Of those, reused buffers handed out with an event to wait for.
    pub reused_pending: u64,
    /// Of those, new buffers.
    pub allocated: u64,
    /// New buffers made although the pool was at its limit, because nothing released
    /// was large enough.
    pub over_limit: u64,
    /// Registrations of buffers with devices that pin host memory, one per buffer and
    /// device ([`StagingPool::acquire_for`]).
    pub pins: u64,
    /// Registrations a device refused with an error (the copies stage instead).
    pub pin_failures: u64,
}

struct Released {
    buffer: HostBuffer,
    after: Option<Event>,
    offered: Vec<u64>,
}

struct Inner {
    released: VecDeque<Released>,
    limit: u64,
    stats: StagingStats,
    last_pin_error: Option<String>,
}

/// A thread-safe pool of host staging buffers reused in stream order (module docs).
pub struct StagingPool {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("StagingPool")
            .field("limit", &inner.limit)
            .field("released", &inner.released.len())
            .field("stats", &inner.stats)
            .finish()
    }
}

/// Whether `event` may still be running (a failed one has finished: its work will not
/// touch the buffer again).
fn pending(event: &Option<Event>) -> bool {
    event
        .as_ref()
        .is_some_and(|e| matches!(e.query(), Ok(false)))
}

impl StagingPool {
    /// A pool that makes new buffers while it holds at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        StagingPool {
            inner: Mutex::new(Inner {
                released: VecDeque::new(),
                limit,
                stats: StagingStats::default(),
                last_pin_error: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `len` bytes (see the module docs for which one).
    pub fn acquire(&self, len: usize) -> Result<StagingBuffer> {
        let mut inner = self.lock();
        let fits = |r: &Released| r.buffer.len() >= len;
        let idle = inner
            .released
            .iter()
            .position(|r| fits(r) && !pending(&r.after));
        if let Some(i) = idle {
            if let Some(r) = inner.released.remove(i) {
                inner.stats.acquired += 1;
                inner.stats.reused_idle += 1;
                return Ok(StagingBuffer {
                    buffer: r.buffer,
                    after: None,
                    offered: r.offered,
                });
            }
        }
        let size = len.max(1).div_ceil(GRANULE).saturating_mul(GRANULE);
        let under_limit = inner.stats.reserved_bytes.saturating_add(size as u64) <= inner.limit;
        if !under_limit {
            if let Some(i) = inner.released.iter().position(fits) {
                if let Some(r) = inner.released.remove(i) {
                    inner.stats.acquired += 1;
                    inner.stats.reused_pending += 1;
                    return Ok(StagingBuffer {
                        buffer: r.buffer,
                        after: r.after,
                        offered: r.offered,
                    });
                }
            }
            // Released buffers too small to ever serve this size make room first.
            while inner.stats.reserved_bytes.saturating_add(size as u64) > inner.limit {
                let Some(i) = inner.released.iter().position(|r| !pending(&r.after)) else {
                    break;
                };
                if let Some(r) = inner.released.remove(i) {
                    inner.stats.reserved_bytes -= r.buffer.len() as u64;
                }
            }
        }
        let buffer = HostBuffer::new(size)?;
        let limit = inner.limit;
        let stats = &mut inner.stats;
        stats.acquired += 1;
        stats.allocated += 1;
        stats.over_limit += u64::from(stats.reserved_bytes + size as u64 > limit);
        stats.reserved_bytes += size as u64;
        stats.peak_reserved_bytes = stats.peak_reserved_bytes.max(stats.reserved_bytes);
        Ok(StagingBuffer {
            buffer,
            after: None,
            offered: Vec::new(),
        })
    }

    /// Like [`StagingPool::acquire`], with the buffer pinned for each of `devices` that
    /// pins host memory (once per buffer and device; see the module docs).
    pub fn acquire_for(&self, len: usize, devices: &[&Device]) -> Result<StagingBuffer> {
        let mut staging = self.acquire(len)?;
        for device in devices {
            if staging.offered.contains(&device.uid()) {
                continue;
            }
            staging.offered.push(device.uid());
            // Outside the pool's lock: registering can take the driver a while.
            let pinned = device.pin_host(&staging.buffer);
            let mut inner = self.lock();
            match pinned {
                Ok(true) => inner.stats.pins += 1,
                Ok(false) => {}
                Err(e) => {
                    inner.stats.pin_failures += 1;
                    inner.last_pin_error = Some(format!("{}: {e}", device.id()));
                }
            }
        }
        Ok(staging)
    }

    /// The latest error a device gave when asked to pin a buffer, with its id.
    pub fn last_pin_error(&self) -> Option<String> {
        self.lock().last_pin_error.clone()
    }

    /// Gives `buffer` back; `done` is an event recorded after every use of it that has
    /// been enqueued (on the last stream to use it, ordered after the others).
    pub fn release(&self, buffer: StagingBuffer, done: Event) {
        self.lock().released.push_back(Released {
            buffer: buffer.buffer,
            after: Some(done),
            offered: buffer.offered,
        });
    }

    /// Takes `buffer` out of the pool for good, when no event marks the end of its use
    /// (enqueuing its work failed): work already enqueued on it keeps the memory alive
    /// until it finishes.
    pub fn discard(&self, buffer: StagingBuffer) {
        let mut inner = self.lock();
        inner.stats.reserved_bytes = inner
            .stats
            .reserved_bytes
            .saturating_sub(buffer.buffer.len() as u64);
    }

    /// Drops every released buffer whose last use has finished; returns the bytes freed.
    pub fn empty_cache(&self) -> u64 {
        let mut inner = self.lock();
        let mut freed = 0;
        inner.released.retain(|r| {
            let keep = pending(&r.after);
            if !keep {
                freed += r.buffer.len() as u64;
            }
            keep
        });
        inner.stats.reserved_bytes -= freed;
        freed
    }

    /// The figures now.
    pub fn stats(&self) -> StagingStats {
        self.lock().stats
    }

    /// The byte limit under which new buffers are made.
    pub fn limit(&self) -> u64 {
        self.lock().limit
    }

    /// Changes the limit; buffers already made stay until [`StagingPool::empty_cache`].
    pub fn set_limit(&self, limit: u64) {
        self.lock().limit = limit;
    }
}

/// The process's staging pool, limited to [`DEFAULT_STAGING_LIMIT`] bytes.
pub fn host_staging() -> &'static StagingPool {
    static POOL: OnceLock<StagingPool> = OnceLock::new();
    POOL.get_or_init(|| StagingPool::new(DEFAULT_STAGING_LIMIT))
}
