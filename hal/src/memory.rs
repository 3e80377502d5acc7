//! Memory handles: device [`Allocation`]s addressed through [`BufferSlice`]s, and
//! [`HostBuffer`]s, the host memory that asynchronous copies read from and write to.
//!
//! # Ownership and lifetime
//! An [`Allocation`] is a cheap, clonable handle. The device memory behind it is
//! released when [`Allocation::free`] is called or when the last handle is dropped,
//! whichever comes first; operations already enqueued keep the memory alive until they
//! complete, so freeing never pulls memory out from under queued work. Using an
//! allocation after `free` is an [`Error::InvalidArgument`], never undefined behaviour.
//!
//! A [`HostBuffer`] is owned by one holder. While asynchronous copies that use it are in
//! flight, the backend holds a share of it, and [`HostBuffer::as_slice`] /
//! [`HostBuffer::as_mut_slice`] refuse with an error that says to synchronize first.
//! This is what makes asynchronous copies safe without pinning borrows to a stream.
//!
//! # Pinned host memory
//! [`crate::Device::pin_host`] registers a host buffer with a device (a [`Pin`], made by
//! the backend and kept in the [`HostMemory`] until it is freed), so that the device's
//! copies to and from it are direct transfers. Buffers from a page up are page aligned
//! and whole pages long for this; smaller ones are never pinned.

use std::alloc::Layout;
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::id::DeviceId;

/// The backend side of a device allocation. Backends implement it for their own memory
/// object; the HAL only holds it and hands it back to the same backend.
///
/// Dropping the last `Arc` of a raw allocation releases its memory: that is how
/// [`Allocation::free`] and in-flight operations cooperate.
pub trait RawAllocation: Any + Send + Sync {
    /// The size in bytes (at least 1: the HAL serves zero-size allocations itself). For a
    /// growable allocation, the length currently backed by memory.
    fn size(&self) -> u64;
    /// Changes the backed length of a growable allocation (from
    /// [`crate::backend::DeviceImpl::allocate_growable`]) to `new_size`, keeping the
    /// addresses and the contents of `[0, min(old, new))`. Bytes that become backed have
    /// unspecified contents. Releasing bytes must not make the process fault, even if work
    /// already enqueued still touches them (the host backend keeps the addresses mapped;
    /// the CUDA backend waits for the device before unmapping). Plain allocations keep the
    /// default, which refuses.
    ///
    /// Guaranteed by the HAL: the allocation is growable; `new_size` is a multiple of the
    /// device's granularity, at least one granule and at most the reserved size; calls on
    /// one allocation are serialized.
    fn resize(&self, new_size: u64) -> Result<()> {
        let _ = new_size;
        Err(Error::unsupported("this allocation cannot be resized"))
    }
    /// The address at which the CPU reads and writes this memory directly, when it can:
    /// host memory, or device memory mapped host-visible and coherent on a device that
    /// shares memory with the host. Such devices report
    /// [`crate::Capabilities::host_addressable`]. The contents seen there are the
    /// device's once the stream work writing them has completed, and writes there are
    /// seen by work enqueued afterwards. The default: `None`.
    fn host_address(&self) -> Option<std::ptr::NonNull<u8>> {
        None
    }
    /// The allocation as `Any`, for the owning backend to downcast.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// Direct CPU access to an allocation ([`Allocation::host_view`]): its address, and a
/// reference that keeps the memory alive as long as the view is, even if the allocation
/// is freed meanwhile.
///
/// The view hands out a raw pointer; reading or writing through it is `unsafe` and
/// races with device work on the same bytes exactly as another stream would: touch the
/// bytes only while no enqueued work uses them (the streams that wrote them are idle or
/// synchronized).
#[derive(Clone)]
pub struct HostView {
    _memory: Arc<dyn RawAllocation>,
    base: std::ptr::NonNull<u8>,
    len: u64,
}

// SAFETY: a view is an address plus an owning reference to thread-safe backend memory;
// it creates no references into the bytes, and every access through the address is the
// caller's `unsafe` code, bound by the stream ordering rules above.
unsafe impl Send for HostView {}
// SAFETY: as above; shared references expose only the address and the length.
unsafe impl Sync for HostView {}

impl HostView {
    /// The allocation's first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The bytes the allocation had backed when the view was made.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the allocation was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for HostView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostView")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

/// Downcasts a raw allocation to the backend's concrete type. A failure means memory of
/// one backend reached another, which validation forbids: an internal bug, reported as
/// an [`Error::Backend`] rather than a panic.
pub fn downcast_raw<T: Any + Send + Sync>(
    raw: &Arc<dyn RawAllocation>,
    backend: &str,
) -> Result<Arc<T>> {
    raw.clone().into_any().downcast::<T>().map_err(|_| {
        Error::backend_message(
            backend,
            format!(
                "internal error: an allocation of another backend reached the {backend} backend (expected {})",
                std::any::type_name::<T>()
            ),
        )
    })
}

static NEXT_ALLOCATION_ID: AtomicU64 = AtomicU64::new(1);

enum AllocState {
    /// Usable; `None` for a zero-size allocation, which has no backend memory.
    Live(Option<Arc<dyn RawAllocation>>),
    Freed,
}

// A cache line of its own: a handle's reference count and lock change on every use, and
// allocations used by different threads must not share lines.
#[repr(align(64))]
struct AllocationInner {
    id: u64,
    device: DeviceId,
    device_uid: u64,
    /// The usable length: fixed for a plain allocation, the backed length of a growable
    /// one (changed only under `state`'s lock).
    size: AtomicU64,
    /// `Some((reserved bytes, granularity))` for a growable allocation.
    growable: Option<(u64, u64)>,
    state: Mutex<AllocState>,
    /// Whether `state` is `Freed`, readable without the lock (set under it).
    freed: std::sync::atomic::AtomicBool,
}

/// A region of device memory. Clone to share; see the module docs for lifetime rules.
///
/// Thread-safe: handles may be used from any thread.
#[derive(Clone)]
pub struct Allocation {
    inner: Arc<AllocationInner>,
}

impl Allocation {
    pub(crate) fn new(
        device: DeviceId,
        device_uid: u64,
        size: u64,
        raw: Option<Arc<dyn RawAllocation>>,
    ) -> Self {
        Self::with_growth(device, device_uid, size, None, raw)
    }

    pub(crate) fn with_growth(
        device: DeviceId,
        device_uid: u64,
        size: u64,
        growable: Option<(u64, u64)>,
        raw: Option<Arc<dyn RawAllocation>>,
    ) -> Self {
        Allocation {
            inner: Arc::new(AllocationInner {
                id: NEXT_ALLOCATION_ID.fetch_add(1, Ordering::Relaxed),
                device,
                device_uid,
                size: AtomicU64::new(size),
                growable,
                state: Mutex::new(AllocState::Live(raw)),
                freed: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A process-unique number naming this allocation in messages.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Its size in bytes: for a growable allocation, the length currently backed by
    /// memory, which [`Allocation::resize`] changes.
    pub fn size(&self) -> u64 {
        self.inner.size.load(Ordering::Acquire)
    }

    /// Whether it came from [`crate::Device::allocate_growable`].
    pub fn is_growable(&self) -> bool {
        self.inner.growable.is_some()
    }

    /// The most it can grow to: the reserved address range of a growable allocation, the
    /// size of a plain one.
    pub fn reserved(&self) -> u64 {
        self.inner.growable.map_or_else(|| self.size(), |(r, _)| r)
    }

    /// Grows or shrinks a growable allocation in place to `new_size` bytes, keeping its
    /// addresses and the contents of the bytes both sizes share; newly backed bytes have
    /// unspecified contents. `new_size` must be a multiple of the device's
    /// `virtual_memory_granularity`, at least one granule and at most
    /// [`Allocation::reserved`].
    ///
    /// Shrinking releases memory; enqueue no work on the released range after it (such
    /// work is refused) and let work already enqueued on it finish first, since its
    /// results there are lost.
    pub fn resize(&self, new_size: u64) -> Result<()> {
        let Some((reserved, granularity)) = self.inner.growable else {
            return Err(Error::invalid(format!(
                "allocation #{} on {} is not growable; make it with Device::allocate_growable to resize it",
                self.inner.id, self.inner.device
            )));
        };
        if new_size == 0 || !new_size.is_multiple_of(granularity) || new_size > reserved {
            return Err(Error::invalid(format!(
                "cannot resize allocation #{} on {} to {new_size} bytes: the size must be a non-zero multiple of the device's granularity ({granularity} bytes) and at most the {reserved} bytes reserved",
                self.inner.id, self.inner.device
            )));
        }
        let state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let raw = match &*state {
            AllocState::Live(Some(raw)) => raw.clone(),
            AllocState::Live(None) | AllocState::Freed => {
                return Err(Error::invalid(format!(
                    "allocation #{} on {} was resized after it was freed; keep it alive while you resize it",
                    self.inner.id, self.inner.device
                )))
            }
        };
        if new_size == self.size() {
            return Ok(());
        }
        raw.resize(new_size)?;
        self.inner.size.store(new_size, Ordering::Release);
        Ok(())
    }

    /// The device that owns it.
    pub fn device(&self) -> &DeviceId {
        &self.inner.device
    }

    /// Whether this allocation was made by `device` (that very device handle's device,
    /// not merely one with the same id in another registry). Cheaper than comparing ids.
    pub fn belongs_to(&self, device: &crate::Device) -> bool {
        self.inner.device_uid == device.uid()
    }

    pub(crate) fn device_uid(&self) -> u64 {
        self.inner.device_uid
    }

    /// Whether [`Allocation::free`] has been called.
    pub fn is_freed(&self) -> bool {
        self.inner.freed.load(Ordering::Acquire)
    }

    /// Releases the memory now (queued operations that use it still complete).
    /// Freeing twice is an [`Error::InvalidArgument`].
    pub fn free(&self) -> Result<()> {
        let mut state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        self.inner.freed.store(true, Ordering::Release);
        match std::mem::replace(&mut *state, AllocState::Freed) {
            AllocState::Live(_raw) => Ok(()),
            AllocState::Freed => Err(Error::invalid(format!(
                "allocation #{} on {} was already freed; free each allocation once",
                self.inner.id, self.inner.device
            ))),
        }
    }

    /// The backend memory, or an error if the allocation was freed. `Ok(None)` for a
    /// zero-size allocation.
    pub(crate) fn raw(&self) -> Result<Option<Arc<dyn RawAllocation>>> {
        match &*self.inner.state.lock().unwrap_or_else(|p| p.into_inner()) {
            AllocState::Live(raw) => Ok(raw.clone()),
            AllocState::Freed => Err(Error::invalid(format!(
                "allocation #{} on {} was used after it was freed; keep it alive until the last operation that uses it is enqueued",
                self.inner.id, self.inner.device
            ))),
        }
    }

    /// Direct CPU access to the memory, when its device has it
    /// ([`crate::Capabilities::host_addressable`]); `None` otherwise, for a zero-size
    /// allocation, and once the allocation is freed. See [`HostView`] for the rules.
    pub fn host_view(&self) -> Option<HostView> {
        let raw = match &*self.inner.state.lock().unwrap_or_else(|p| p.into_inner()) {
            AllocState::Live(Some(raw)) => raw.clone(),
            AllocState::Live(None) | AllocState::Freed => return None,
        };
        let base = raw.host_address()?;
        Some(HostView {
            len: self.size(),
            base,
            _memory: raw,
        })
    }

    /// The bytes `[offset, offset + len)` of this allocation. Bounds are checked when the
    /// slice is used.
    pub fn slice(&self, offset: u64, len: u64) -> BufferSlice<'_> {
        BufferSlice {
            allocation: self,
            offset,
            len,
        }
    }

    /// The whole allocation as a slice.
    pub fn whole(&self) -> BufferSlice<'_> {
        self.slice(0, self.size())
    }
}

impl fmt::Debug for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("id", &self.inner.id)
            .field("device", &self.inner.device.to_string())
            .field("size", &self.size())
            .field("reserved", &self.reserved())
            .field("freed", &self.is_freed())
            .finish()
    }
}

/// A byte range `(allocation, offset, length)`: how every operation addresses device
/// memory, so that memory pools can sub-allocate on every backend.
#[derive(Clone, Copy, Debug)]
pub struct BufferSlice<'a> {
    /// The allocation.
    pub allocation: &'a Allocation,
    /// Byte offset into the allocation.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl BufferSlice<'_> {
    /// Checks that the slice is memory of `device`, live and in bounds, and returns the
    /// backend memory behind it (`None` when it is empty). For a backend's extensions that
    /// hand device memory to a vendor library outside the stream operations.
    pub fn resolve(&self, device: &crate::Device) -> Result<Option<RawSlice>> {
        crate::validate::resolve(device, self, "the buffer")
    }

    /// Whether the two ranges share a byte of one allocation; an empty range shares
    /// none. The rule every argument check of the HAL applies, for layers above it to
    /// apply the same.
    pub fn overlaps(&self, other: &BufferSlice<'_>) -> bool {
        crate::validate::overlap(self, other) != crate::validate::Overlap::Disjoint
    }
}

impl<'a> From<&'a Allocation> for BufferSlice<'a> {
    fn from(a: &'a Allocation) -> Self {
        a.whole()
    }
}

impl fmt::Display for BufferSlice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocation #{} on {} [{}..{}) of {} bytes",
            self.allocation.id(),
            self.allocation.device(),
            self.offset,
            self.offset.saturating_add(self.len),
            self.allocation.size()
        )
    }
}

/// A validated, resolved device range handed to a backend: the memory is live, the range
/// is in bounds, non-empty, and on the backend's own device.
#[derive(Clone)]
pub struct RawSlice {
    /// The backend memory.
    pub memory: Arc<dyn RawAllocation>,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes (at least 1).
    pub len: u64,
}

impl fmt::Debug for RawSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawSlice[{}..{})", self.offset, self.offset + self.len)
    }
}

/// Host memory that asynchronous copies can use: zero-filled and aligned to
/// [`HostMemory::ALIGN`] bytes, or to a [`HostMemory::PAGE`] (with its length rounded up
/// to whole pages) from a page up, so that devices can pin it ([`crate::Device::pin_host`]).
/// Shared between its [`HostBuffer`] and in-flight operations.
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated: `len`, rounded up to whole pages from a page up.
    size: usize,
    /// Whether any device holds a registration (the lock is skipped while none does).
    pinned: AtomicBool,
    /// Per device (by [`crate::Device::uid`]): its backend's registration of the memory,
    /// or `None` when it had nothing to register. Dropped before the memory is freed.
    pins: Mutex<Vec<(u64, Option<Pin>)>>,
}

/// A backend's registration of host memory with one of its devices (a page-locked
/// range, an imported buffer …); the backend undoes it when the last share drops.
pub type Pin = Arc<dyn Any + Send + Sync>;

// SAFETY: HostMemory owns its bytes like a Box<[u8]>; the pointer is never aliased by
// another owner. Concurrent access goes through raw pointers whose exclusivity is the
// stream ordering contract documented on `HostMemory::as_ptr`. Registrations are
// `Send + Sync` and behind a mutex.
unsafe impl Send for HostMemory {}
// SAFETY: as above; shared references only hand out the raw pointer.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Alignment of every host buffer, enough for any dtype and for SIMD loads.
    pub const ALIGN: usize = 64;

    /// Alignment (and length granularity) of host buffers of at least this many bytes,
    /// which devices can pin.
    pub const PAGE: usize = 4096;

    fn layout(len: usize) -> Result<Layout> {
        let (size, align) = if len >= Self::PAGE {
            (
                len.div_ceil(Self::PAGE).saturating_mul(Self::PAGE),
                Self::PAGE,
            )
        } else {
            (len, Self::ALIGN)
        };
        Layout::from_size_align(size, align).map_err(|e| {
            Error::invalid(format!(
                "a host buffer of {len} bytes cannot be laid out ({e}); ask for fewer bytes"
            ))
        })
    }

    fn new(len: usize) -> Result<Self> {
        let memory = |ptr, len, size| HostMemory {
            ptr,
            len,
            size,
            pinned: AtomicBool::new(false),
            pins: Mutex::new(Vec::new()),
        };
        if len == 0 {
            return Ok(memory(NonNull::dangling(), 0, 0));
        }
        let layout = Self::layout(len)?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::OutOfMemory {
            device: "host".to_string(),
            requested: len as u64,
            free: 0,
            capacity: 0,
            hint: "the process could not get this much host memory; use a smaller staging buffer"
                .to_string(),
        })?;
        Ok(memory(ptr, len, layout.size()))
    }

    /// The first byte. Backends read and write through it while executing an operation
    /// that names this buffer; the HAL guarantees that the user holds no reference into
    /// the buffer meanwhile (see [`HostBuffer::as_mut_slice`]). Two operations on
    /// different streams that touch the same bytes without an event between them race,
    /// as they would on any device.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn pins(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Option<Pin>)>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A backend's registration of this memory of type `T` for which `which` holds (the
    /// backend's test that it is for the device at hand), if there is one. Backends call
    /// this in their copies to move bytes directly.
    pub fn pin<T: Any + Send + Sync>(&self, which: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        if !self.pinned.load(Ordering::Acquire) {
            return None;
        }
        self.pins().iter().find_map(|(_, pin)| {
            pin.clone()
                .and_then(|p| p.downcast::<T>().ok())
                .filter(|p| which(p))
        })
    }

    /// Asks `register` once per device `uid` for a registration of all the allocated
    /// bytes and keeps its answer; later calls return it.
    pub(crate) fn pin_with(
        &self,
        uid: u64,
        register: impl FnOnce(NonNull<u8>, usize) -> Result<Option<Pin>>,
    ) -> Result<bool> {
        let mut pins = self.pins();
        if let Some((_, p)) = pins.iter().find(|(u, _)| *u == uid) {
            return Ok(p.is_some());
        }
        if self.size == 0 {
            return Ok(false);
        }
        let pin = register(self.ptr, self.size)?;
        let done = pin.is_some();
        pins.push((uid, pin));
        if done {
            self.pinned.store(true, Ordering::Release);
        }
        Ok(done)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // Registrations first: they refer to the bytes freed below.
        self.pins
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if self.len == 0 {
            return;
        }
        if let Ok(layout) = Self::layout(self.len) {
            // SAFETY: the pointer came from `alloc_zeroed` with this same layout and is
            // freed exactly once, here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// A host staging buffer for asynchronous copies. See the module docs.
pub struct HostBuffer {
    memory: Arc<HostMemory>,
}

impl HostBuffer {
    /// A zero-filled buffer of `len` bytes.
    pub fn new(len: usize) -> Result<Self> {
        Ok(HostBuffer {
            memory: Arc::new(HostMemory::new(len)?),
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        let mut b = HostBuffer::new(data.len())?;
        b.as_mut_slice()?.copy_from_slice(data);
        Ok(b)
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// How many enqueued operations still hold this buffer.
    pub fn in_flight(&self) -> usize {
        Arc::strong_count(&self.memory) - 1
    }

    fn busy_error(&self) -> Error {
        Error::invalid(format!(
            "the host buffer is still used by {} enqueued operation(s); synchronize the stream (or wait for an event recorded after them) before touching it",
            self.in_flight()
        ))
    }

    /// The bytes, if no enqueued operation still uses the buffer.
    pub fn as_slice(&mut self) -> Result<&[u8]> {
        let busy = self.busy_error();
        let mem = Arc::get_mut(&mut self.memory).ok_or(busy)?;
        if mem.len == 0 {
            return Ok(&[]);
        }
        // SAFETY: `get_mut` proved this handle is the only owner, so no operation can
        // touch the bytes while the returned borrow (tied to `&mut self`) lives; the
        // pointer is valid for `len` initialised (zero-filled) bytes.
        Ok(unsafe { std::slice::from_raw_parts(mem.ptr.as_ptr(), mem.len) })
    }

    /// The bytes, mutably, if no enqueued operation still uses the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        let busy = self.busy_error();
        let mem = Arc::get_mut(&mut self.memory).ok_or(busy)?;
        if mem.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `as_slice`; `&mut self` makes the borrow exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(mem.ptr.as_ptr(), mem.len) })
    }

    /// A share of the memory for an operation to hold while it is in flight.
    pub(crate) fn share(&self) -> Arc<HostMemory> {
        self.memory.clone()
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// A validated host range handed to a backend: `[offset, offset + len)` of `memory`.
#[derive(Clone)]
pub struct HostSlice {
    /// The host memory, held until the operation completes.
    pub memory: Arc<HostMemory>,
    /// Byte offset.
    pub offset: usize,
    /// Length in bytes (at least 1).
    pub len: usize,
}

impl fmt::Debug for HostSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostSlice[{}..{})", self.offset, self.offset + self.len)
    }
}
