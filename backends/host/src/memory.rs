//! Device memory of a virtual host device: an aligned, zero-filled heap block plus the
//! device's accounting, returned when the block is dropped.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xpu_hal::{Error, RawAllocation, RawSlice, Result};

/// Alignment of every host device allocation (a GPU-like 256 bytes: enough for any
/// dtype and any SIMD width).
pub const ALIGN: usize = 256;

/// The memory accounting of one virtual device.
#[derive(Debug)]
pub(crate) struct Accounting {
    pub(crate) device: String,
    pub(crate) capacity: u64,
    pub(crate) used: AtomicU64,
}

impl Accounting {
    /// Reserves `size` bytes or explains why not.
    fn reserve(&self, size: u64) -> Result<()> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let free = self.capacity.saturating_sub(used);
            if size > free {
                return Err(Error::OutOfMemory {
                    device: self.device.clone(),
                    requested: size,
                    free,
                    capacity: self.capacity,
                    hint: "free allocations you no longer need, or raise XPU_HOST_MEMORY"
                        .to_string(),
                });
            }
            match self.used.compare_exchange_weak(
                used,
                used + size,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, size: u64) {
        self.used.fetch_sub(size, Ordering::AcqRel);
    }
}

/// One allocation of a virtual host device.
pub struct HostAllocation {
    ptr: NonNull<u8>,
    size: u64,
    accounting: Arc<Accounting>,
}

// SAFETY: the block is owned by this value alone (like a Box<[u8]>); the raw pointer is
// only dereferenced by stream workers under the ordering rules of the HAL contract.
unsafe impl Send for HostAllocation {}
// SAFETY: as above; shared references expose the pointer, not references into it.
unsafe impl Sync for HostAllocation {}

impl HostAllocation {
    pub(crate) fn new(size: u64, accounting: Arc<Accounting>) -> Result<Self> {
        accounting.reserve(size)?;
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, ALIGN).ok());
        let Some(layout) = layout else {
            accounting.release(size);
            return Err(Error::invalid(format!(
                "{size} bytes cannot be allocated in this process's address space"
            )));
        };
        // SAFETY: the HAL guarantees size >= 1, so the layout is not zero-sized.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            accounting.release(size);
            let free = accounting
                .capacity
                .saturating_sub(accounting.used.load(Ordering::Relaxed));
            return Err(Error::OutOfMemory {
                device: accounting.device.clone(),
                requested: size,
                free,
                capacity: accounting.capacity,
                hint:
                    "the operating system refused the memory; lower XPU_HOST_MEMORY or free memory"
                        .to_string(),
            });
        };
        Ok(HostAllocation {
            ptr,
            size,
            accounting,
        })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        if let Ok(layout) = Layout::from_size_align(self.size as usize, ALIGN) {
            // SAFETY: allocated in `new` with this layout; dropped exactly once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        self.accounting.release(self.size);
    }
}

impl RawAllocation for HostAllocation {
    fn size(&self) -> u64 {
        self.size
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// A resolved range of host device memory, holding its allocation alive.
#[derive(Clone)]
pub(crate) struct Region {
    mem: Arc<HostAllocation>,
    offset: usize,
    len: usize,
}

impl Region {
    pub(crate) fn from_raw(slice: &RawSlice) -> Result<Self> {
        let mem = xpu_hal::downcast_raw::<HostAllocation>(&slice.memory, "host")?;
        Ok(Region {
            mem,
            offset: slice.offset as usize,
            len: slice.len as usize,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        // The HAL checked offset + len <= size, so this stays inside the block.
        self.mem.as_ptr().wrapping_add(self.offset)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether both regions are exactly the same bytes.
    pub(crate) fn same_as(&self, other: &Region) -> bool {
        self.ptr() == other.ptr() && self.len == other.len
    }

    /// The bytes.
    ///
    /// # Safety
    /// No other live reference may write these bytes while the result lives (the HAL's
    /// aliasing checks and stream ordering provide this on the worker thread).
    pub(crate) unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: in bounds of a live allocation (held by `self.mem`); exclusivity is the
        // caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably.
    ///
    /// # Safety
    /// No other live reference may read or write these bytes while the result lives.
    pub(crate) unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        // SAFETY: as for `bytes`, with exclusivity of all access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// The elements of type `T`.
    ///
    /// # Safety
    /// As for [`Region::bytes`]; in addition offset and length are multiples of
    /// `size_of::<T>()` (the HAL checks this for builtin operations) and the block is
    /// [`ALIGN`]-aligned, so the pointer is aligned for `T`.
    pub(crate) unsafe fn typed<'a, T: bytemuck::Pod>(&self) -> &'a [T] {
        // SAFETY: see the function's contract; `T: Pod` makes any bytes a valid `T`.
        unsafe {
            std::slice::from_raw_parts(self.ptr() as *const T, self.len / std::mem::size_of::<T>())
        }
    }

    /// The elements of type `T`, mutably.
    ///
    /// # Safety
    /// As for [`Region::typed`], with exclusivity of all access.
    pub(crate) unsafe fn typed_mut<'a, T: bytemuck::Pod>(&self) -> &'a mut [T] {
        // SAFETY: see the function's contract.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr() as *mut T,
                self.len / std::mem::size_of::<T>(),
            )
        }
    }
}
