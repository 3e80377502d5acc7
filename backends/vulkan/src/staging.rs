//! Staging buffers for host↔device copies, reused through a per-stream pool.
//!
//! Allocating a fresh host-visible buffer for every copy made queued copies 4–5× slower
//! than a program that reuses one. A stream keeps the staging buffers its finished
//! copies used, by power-of-two size class, and hands them out again; a [`Staging`]
//! lease returns its buffer when the last holder (the batch that used it, the
//! read-back that empties it) lets go, which is only after the device is done with it.

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use xpu_hal::Result;

use crate::device::DeviceShared;
use crate::memory::{Placement, VulkanBuffer};

/// The smallest size class.
const MIN_CLASS: u64 = 64 << 10;
/// Bytes of idle staging memory a stream keeps at most.
const MAX_CACHED: u64 = 256 << 20;

/// Idle staging buffers of one stream.
#[derive(Default)]
pub(crate) struct StagingPool {
    idle: Mutex<Vec<VulkanBuffer>>,
}

impl StagingPool {
    /// A staging buffer of at least `len` bytes.
    pub(crate) fn lease(
        self: &Arc<Self>,
        dev: &Arc<DeviceShared>,
        len: u64,
    ) -> Result<Arc<Staging>> {
        let class = len.max(MIN_CLASS).next_power_of_two();
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.iter()
                .position(|b| b.bound() == class)
                .map(|i| idle.swap_remove(i))
        };
        let buffer = match reused {
            Some(b) => b,
            None => VulkanBuffer::new(dev, class, Placement::Staging)?,
        };
        Ok(Arc::new(Staging {
            buffer: ManuallyDrop::new(buffer),
            pool: self.clone(),
        }))
    }

    fn give_back(&self, buffer: VulkanBuffer) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let cached: u64 = idle.iter().map(VulkanBuffer::bound).sum();
        if cached + buffer.bound() <= MAX_CACHED {
            idle.push(buffer);
        }
    }
}

/// A staging buffer on loan from a stream's pool.
pub(crate) struct Staging {
    buffer: ManuallyDrop<VulkanBuffer>,
    pool: Arc<StagingPool>,
}

impl Deref for Staging {
    type Target = VulkanBuffer;

    fn deref(&self) -> &VulkanBuffer {
        &self.buffer
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: the buffer is taken exactly once, here, and `self` is not used again.
        let buffer = unsafe { ManuallyDrop::take(&mut self.buffer) };
        self.pool.give_back(buffer);
    }
}
