//! A cheap timestamp for the allocator's event history.
//!
//! Reading the OS clock costs tens of nanoseconds, as much as a cached allocation itself, so
//! events record a raw tick and ticks become nanoseconds only when the history is read. On
//! x86-64 the tick is the CPU's time-stamp counter (constant-rate on every CPU this runtime
//! targets), scaled by the ticks and the nanoseconds elapsed since the clock was made; on
//! other targets it is the OS clock in nanoseconds.

use std::time::Instant;

/// A clock started at creation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    epoch: Instant,
    epoch_ticks: u64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let epoch = Instant::now();
        let mut c = Clock {
            epoch,
            epoch_ticks: 0,
        };
        c.epoch_ticks = c.ticks();
        c
    }

    /// The raw tick now.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[allow(unused_unsafe)]
    pub(crate) fn ticks(&self) -> u64 {
        // SAFETY: RDTSC reads a register; it has no preconditions and touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// The raw tick now.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A converter from ticks to nanoseconds since creation, valid for ticks read so far.
    pub(crate) fn scale(&self) -> impl Fn(u64) -> u64 {
        let now_ns = self.epoch.elapsed().as_nanos() as f64;
        let now_ticks = self.ticks();
        let epoch_ticks = self.epoch_ticks;
        let per_tick = if cfg!(target_arch = "x86_64") {
            let span = now_ticks.saturating_sub(epoch_ticks);
            if span == 0 {
                0.0
            } else {
                now_ns / span as f64
            }
        } else {
            1.0
        };
        let base = if cfg!(target_arch = "x86_64") {
            epoch_ticks
        } else {
            0
        };
        move |t| (t.saturating_sub(base) as f64 * per_tick) as u64
    }
}
