//! Device memory of a virtual host device: one memory type, [`HostAllocation`], with
//! two backings and the device's accounting, returned when the memory is released.
//!
//! - *Plain* allocations are aligned, zero-filled heap blocks.
//! - *Growable* allocations ([`xpu_hal::Device::allocate_growable`]) reserve their whole
//!   address range up front with `mmap(PROT_READ | PROT_WRITE, MAP_PRIVATE |
//!   MAP_ANONYMOUS | MAP_NORESERVE)`, so the kernel commits pages only when they are
//!   touched. The *backed* length is what the device's accounting charges: growing
//!   charges the new bytes (an over-capacity grow is the same out-of-memory error as a
//!   plain allocation), shrinking gives the released tail back to the operating system
//!   with `madvise(MADV_DONTNEED)` and uncharges it. The released range stays mapped
//!   read-write, so work already enqueued that still touches it can never fault (it
//!   reads zeros or writes pages that the next shrink or the final `munmap` returns).
//!   The granularity is the operating system's page size.
//!
//! Stream operations and kernels see both backings the same way: a pointer to the
//! first byte ([`HostAllocation::as_ptr`]), which never moves.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xpu_hal::{Error, RawAllocation, RawSlice, Result};

/// Alignment of every host device allocation (a GPU-like 256 bytes: enough for any
/// dtype and any SIMD width; growable allocations start on a page, which is more).
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

    /// Bytes not charged to any allocation.
    fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used.load(Ordering::Relaxed))
    }
}

/// How a [`HostAllocation`]'s bytes are held.
enum Backing {
    /// A heap block from the global allocator, freed with this layout.
    Heap(Layout),
    /// An address range of `reserved` bytes from `mmap`; the first
    /// [`HostAllocation::size`] bytes are backed (charged to the device).
    Mapped {
        reserved: usize,
        /// Serializes resizes (the HAL already does; this keeps the accounting exact
        /// even for a caller of the backend type directly).
        resize: Mutex<()>,
    },
}

/// One allocation of a virtual host device: plain or growable (see the module docs).
/// Aligned to a cache line so that the reference counts of allocations used by
/// different threads do not share one.
#[repr(align(64))]
pub struct HostAllocation {
    ptr: NonNull<u8>,
    /// The usable length: fixed for a heap block, the backed length of a mapping.
    size: AtomicU64,
    backing: Backing,
    accounting: Arc<Accounting>,
}

// SAFETY: the memory is owned by this value alone (like a Box<[u8]>); the raw pointer
// is only dereferenced by stream workers under the ordering rules of the HAL contract.
unsafe impl Send for HostAllocation {}
// SAFETY: as above; shared references expose the pointer, not references into it, and
// the only mutable state (the backed length) is atomic and resized under a mutex.
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
            return Err(os_refused(&accounting, size, "the memory"));
        };
        Ok(HostAllocation {
            ptr,
            size: AtomicU64::new(size),
            backing: Backing::Heap(layout),
            accounting,
        })
    }

    /// A growable allocation: `reserve` bytes of addresses, the first `initial` backed.
    /// Both are multiples of [`page_size`] and `initial <= reserve` (HAL guarantees).
    pub(crate) fn growable(
        reserve: u64,
        initial: u64,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        let Ok(len) = usize::try_from(reserve) else {
            return Err(Error::invalid(format!(
                "{reserve} bytes of addresses cannot be reserved in this process's address space; reserve fewer"
            )));
        };
        accounting.reserve(initial)?;
        let ptr = match os::reserve(len) {
            Ok(ptr) => ptr,
            Err(reason) => {
                accounting.release(initial);
                return Err(Error::OutOfMemory {
                    device: accounting.device.clone(),
                    requested: reserve,
                    free: accounting.free(),
                    capacity: accounting.capacity,
                    hint: format!(
                        "the operating system refused to reserve {reserve} bytes of addresses ({reason}); reserve fewer"
                    ),
                });
            }
        };
        Ok(HostAllocation {
            ptr,
            size: AtomicU64::new(initial),
            backing: Backing::Mapped {
                reserved: len,
                resize: Mutex::new(()),
            },
            accounting,
        })
    }

    /// The first byte. It never moves, not even when a growable allocation is resized.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether the allocation is growable (an `mmap` reservation).
    pub fn is_growable(&self) -> bool {
        matches!(self.backing, Backing::Mapped { .. })
    }
}

/// The out-of-memory error for an allocation the operating system refused.
fn os_refused(accounting: &Accounting, size: u64, what: &str) -> Error {
    Error::OutOfMemory {
        device: accounting.device.clone(),
        requested: size,
        free: accounting.free(),
        capacity: accounting.capacity,
        hint: format!("the operating system refused {what}; lower XPU_HOST_MEMORY or free memory"),
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Heap(layout) => {
                // SAFETY: allocated in `new` with this layout; dropped exactly once.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) };
            }
            Backing::Mapped { reserved, .. } => {
                // SAFETY: the range came from `os::reserve` with this length and is
                // unmapped exactly once; every holder of a pointer into it (queued work
                // holds an Arc to this value) is gone.
                unsafe { os::unreserve(self.ptr, *reserved) };
            }
        }
        self.accounting.release(self.size.load(Ordering::Acquire));
    }
}

impl RawAllocation for HostAllocation {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn host_address(&self) -> Option<NonNull<u8>> {
        Some(self.ptr)
    }

    fn resize(&self, new_size: u64) -> Result<()> {
        let Backing::Mapped { reserved, resize } = &self.backing else {
            return Err(Error::unsupported(
                "this host allocation is a plain heap block and cannot be resized; make it with Device::allocate_growable",
            ));
        };
        let _serial = resize.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.size.load(Ordering::Acquire);
        let page = page_size().unwrap_or(1);
        if new_size == 0 || !new_size.is_multiple_of(page) || new_size > *reserved as u64 {
            return Err(Error::invalid(format!(
                "cannot resize a host allocation to {new_size} bytes: it must be a non-zero multiple of the page size ({page} bytes) and at most the {reserved} bytes reserved"
            )));
        }
        if new_size > old {
            self.accounting.reserve(new_size - old)?;
            self.size.store(new_size, Ordering::Release);
        } else if new_size < old {
            let tail = (old - new_size) as usize;
            let start = self.ptr.as_ptr().wrapping_add(new_size as usize);
            // SAFETY: `[new_size, old)` lies inside the reservation (new_size < old <=
            // reserved) and starts on a page boundary (the mapping is page-aligned and
            // new_size a multiple of the page size). The range stays mapped, so no
            // access to it can fault.
            unsafe { os::discard(start, tail) }.map_err(|reason| {
                Error::backend_message(
                    crate::NAME,
                    format!(
                        "releasing {tail} bytes of a growable allocation on {} failed: {reason}",
                        self.accounting.device
                    ),
                )
            })?;
            self.size.store(new_size, Ordering::Release);
            self.accounting.release(old - new_size);
        }
        Ok(())
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// The operating system's page size: the granularity of growable allocations. `None`
/// where the host backend cannot reserve address space (not a Unix system).
pub(crate) fn page_size() -> Option<u64> {
    os::page_size()
}

/// Address-space reservation through `mmap`.
#[cfg(unix)]
mod os {
    use std::ptr::NonNull;
    use std::sync::OnceLock;

    pub(super) fn page_size() -> Option<u64> {
        static PAGE: OnceLock<Option<u64>> = OnceLock::new();
        *PAGE.get_or_init(|| {
            // SAFETY: sysconf only reads a system constant.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            u64::try_from(n).ok().filter(|n| n.is_power_of_two())
        })
    }

    fn errno() -> String {
        std::io::Error::last_os_error().to_string()
    }

    /// Reserves `len` bytes of readable, writable addresses whose pages the kernel
    /// commits (zero-filled) when first touched.
    pub(super) fn reserve(len: usize) -> Result<NonNull<u8>, String> {
        // SAFETY: an anonymous private mapping at an address the kernel chooses; no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        NonNull::new(p.cast::<u8>()).ok_or_else(|| "mmap returned a null address".to_string())
    }

    /// Gives the pages of `[ptr, ptr + len)` back to the operating system; the range
    /// stays mapped and reads zeros until written again.
    ///
    /// # Safety
    /// The range lies inside one mapping from [`reserve`] and `ptr` is page-aligned.
    pub(super) unsafe fn discard(ptr: *mut u8, len: usize) -> Result<(), String> {
        // SAFETY: the caller's contract; MADV_DONTNEED on a private anonymous mapping
        // only drops page contents, it never unmaps.
        let r = unsafe { libc::madvise(ptr.cast(), len, libc::MADV_DONTNEED) };
        if r == 0 {
            Ok(())
        } else {
            Err(errno())
        }
    }

    /// Unmaps a reservation.
    ///
    /// # Safety
    /// `ptr` and `len` are exactly one mapping from [`reserve`], unmapped once, and
    /// nothing uses its addresses any more.
    pub(super) unsafe fn unreserve(ptr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract. munmap of a whole mapping of ours cannot fail
        // in a way that leaves memory in use, so its result is not needed.
        let _ = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
    }
}

/// Without Unix `mmap` the host backend has no virtual memory: the capability is `None`
/// and growable allocations are refused by the HAL before they get here.
#[cfg(not(unix))]
mod os {
    use std::ptr::NonNull;

    pub(super) fn page_size() -> Option<u64> {
        None
    }

    pub(super) fn reserve(_len: usize) -> Result<NonNull<u8>, String> {
        Err("address-space reservation needs a Unix system".to_string())
    }

    /// # Safety
    /// Never called: no reservation exists.
    pub(super) unsafe fn discard(_ptr: *mut u8, _len: usize) -> Result<(), String> {
        Err("address-space reservation needs a Unix system".to_string())
    }

    /// # Safety
    /// Never called: no reservation exists.
    pub(super) unsafe fn unreserve(_ptr: NonNull<u8>, _len: usize) {}
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
        // The HAL checked offset + len <= size, so this stays inside the block (or the
        // backed part of a growable allocation's reservation).
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
    /// [`ALIGN`]-aligned (or page-aligned), so the pointer is aligned for `T`.
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
