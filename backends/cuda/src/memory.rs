//! Device memory and pinned host staging memory (`cuMemHostAlloc`) for copies between
//! device memory and `HostBuffer`s.
//!
//! Device memory is one type, [`CudaBuffer`], with two backings:
//!
//! - *plain*: one `cuMemAlloc` per allocation;
//! - *growable*: a virtual address range reserved with `cuMemAddressReserve`, backed
//!   granule by granule (the device's minimum VMM granularity) by physical handles from
//!   `cuMemCreate`, each mapped with `cuMemMap` and made read-write for the device with
//!   `cuMemSetAccess`. One handle per granule lets a shrink unmap (`cuMemUnmap`) and
//!   release (`cuMemRelease`) exactly the tail, whatever sizes the allocation grew by.
//!   Before it unmaps anything a shrink synchronizes the context (`cuCtxSynchronize`),
//!   so work already enqueued that still touches the released range finishes first and
//!   cannot fault. Dropping unmaps and releases every handle and frees the addresses
//!   (`cuMemAddressFree`). Access is granted to the owning device and to every device
//!   that can access its memory as a peer, as for a plain block.
//!
//! Slices are a device address (the first byte, which never moves) plus a byte offset,
//! whichever the backing.

use std::any::Any;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use xpu_hal::{Error, RawAllocation, Result};

use crate::device::{lock, DeviceShared};
use crate::driver::{cu, guarded, CuError};

/// How a [`CudaBuffer`]'s bytes are held.
enum Backing {
    /// One `cuMemAlloc` block.
    Plain,
    /// A reserved address range, mapped granule by granule.
    Growable(Mutex<Mapping>),
}

/// The physical side of a growable allocation.
struct Mapping {
    /// Bytes of addresses reserved at the buffer's `ptr`.
    reserved: u64,
    /// Bytes per handle: the device's VMM granularity.
    granularity: u64,
    /// `handles[i]` backs `[i * granularity, (i + 1) * granularity)`.
    handles: Vec<CUmemGenericAllocationHandle>,
}

/// A device allocation: `size` bytes at `ptr`, plain or growable (see the module
/// docs). Dropping it releases the memory; a failure to release is recorded on the
/// device and reported by the next synchronize.
pub struct CudaBuffer {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) ptr: CUdeviceptr,
    /// The usable length: fixed for a plain block, the backed length of a growable one.
    size: AtomicU64,
    backing: Backing,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("device", &self.dev.name)
            .field("size", &self.size.load(Ordering::Relaxed))
            .field("growable", &matches!(self.backing, Backing::Growable(_)))
            .finish()
    }
}

/// The out-of-memory error for `requested` bytes on `dev`, with the driver's figures.
fn out_of_memory(dev: &DeviceShared, requested: u64, e: &CuError) -> Error {
    let (free, capacity) = dev.mem_info().unwrap_or((0, dev.total_memory));
    Error::OutOfMemory {
        device: dev.name.clone(),
        requested,
        free,
        capacity,
        hint: format!("{e}; free allocations you no longer need"),
    }
}

/// The properties of the physical memory growable allocations map: pinned device
/// memory of device `ordinal`, no exportable handle types.
pub(crate) fn vmm_properties(ordinal: c_int) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct of integers and a null pointer; all-zero is a valid value
    // (no handle types, no flags).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

/// Read-write access for the owning device `own` and for every device in `peers`
/// (those that can access its memory): what `cuMemSetAccess` grants each granule of a
/// growable allocation, so that peer copies and NCCL reach it as they reach a plain
/// `cuMemAlloc` block.
pub(crate) fn access_descriptors(own: c_int, peers: &[c_int]) -> Vec<sys::CUmemAccessDesc> {
    std::iter::once(own)
        .chain(peers.iter().copied().filter(|p| *p != own))
        .map(|ordinal| sys::CUmemAccessDesc {
            location: vmm_properties(ordinal).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect()
}

impl CudaBuffer {
    pub(crate) fn new(dev: &Arc<DeviceShared>, size: u64) -> Result<Self> {
        dev.bind()?;
        let bytes = usize::try_from(size).map_err(|_| {
            Error::invalid(format!("{size} bytes do not fit this host's address space"))
        })?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: context current; valid out-pointer; size ≥ 1 (HAL guarantee).
        let r = guarded("cuMemAlloc_v2", || unsafe {
            sys::cuMemAlloc_v2(&mut ptr, bytes)
        });
        match r {
            Ok(()) => Ok(CudaBuffer {
                dev: dev.clone(),
                ptr,
                size: AtomicU64::new(size),
                backing: Backing::Plain,
            }),
            Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                Err(out_of_memory(dev, size, &e))
            }
            Err(e) => Err(e.into_hal(&dev.name, "allocating device memory")),
        }
    }

    /// A growable allocation: `reserve` bytes of addresses, the first `initial` backed.
    /// The HAL guarantees both are multiples of the device's granularity (which the
    /// device only reports when it supports virtual memory management) and
    /// `0 < initial <= reserve`.
    pub(crate) fn growable(dev: &Arc<DeviceShared>, reserve: u64, initial: u64) -> Result<Self> {
        let Some(granularity) = dev.vmm_granularity else {
            return Err(Error::unsupported(format!(
                "{} does not support virtual memory management, so allocations cannot grow in place",
                dev.name
            )));
        };
        let bytes = usize::try_from(reserve).map_err(|_| {
            Error::invalid(format!(
                "{reserve} bytes of addresses do not fit this host's address space"
            ))
        })?;
        let align = usize::try_from(granularity).unwrap_or(0);
        dev.bind()?;
        let mut ptr: CUdeviceptr = 0;
        cu(
            &dev.name,
            &format!("reserving {reserve} bytes of device addresses"),
            "cuMemAddressReserve",
            // SAFETY: context current; valid out-pointer; the size is a non-zero multiple
            // of the granularity and the alignment is the granularity (or 0: default).
            || unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, align, 0, 0) },
        )?;
        let buffer = CudaBuffer {
            dev: dev.clone(),
            ptr,
            size: AtomicU64::new(0),
            backing: Backing::Growable(Mutex::new(Mapping {
                reserved: reserve,
                granularity,
                handles: Vec::new(),
            })),
        };
        // On failure, dropping `buffer` frees the reservation.
        buffer.resize_to(initial)?;
        Ok(buffer)
    }

    /// The device address of byte `offset`.
    pub fn address(&self, offset: u64) -> CUdeviceptr {
        self.ptr + offset
    }

    /// Whether the buffer is growable (a reserved address range).
    pub fn is_growable(&self) -> bool {
        matches!(self.backing, Backing::Growable(_))
    }

    /// Grows or shrinks a growable buffer to `new_size` bytes.
    fn resize_to(&self, new_size: u64) -> Result<()> {
        let Backing::Growable(mapping) = &self.backing else {
            return Err(Error::unsupported(
                "this CUDA allocation is a plain cuMemAlloc block and cannot be resized; make it with Device::allocate_growable",
            ));
        };
        let mut m = lock(mapping);
        let g = m.granularity;
        if new_size == 0 || !new_size.is_multiple_of(g) || new_size > m.reserved {
            return Err(Error::invalid(format!(
                "cannot resize a growable allocation on {} to {new_size} bytes: it must be a non-zero multiple of the granularity ({g} bytes) and at most the {} bytes reserved",
                self.dev.name, m.reserved
            )));
        }
        let want = usize::try_from(new_size / g)
            .map_err(|_| Error::invalid("the allocation has more granules than fit in memory"))?;
        self.dev.bind()?;
        let result = if want > m.handles.len() {
            self.grow(&mut m, want)
        } else if want < m.handles.len() {
            self.shrink(&mut m, want)
        } else {
            Ok(())
        };
        // What is mapped now, even after a failure part way.
        self.size
            .store(m.handles.len() as u64 * g, Ordering::Release);
        result
    }

    /// Maps granules until `want` are mapped; on failure unmaps what this call mapped.
    /// The context is current.
    fn grow(&self, m: &mut Mapping, want: usize) -> Result<()> {
        let g = m.granularity;
        let g_bytes = usize::try_from(g).unwrap_or(usize::MAX);
        let first = m.handles.len();
        let prop = vmm_properties(self.dev.index as c_int);
        let mut failure = None;
        while m.handles.len() < want {
            let at = self.ptr + m.handles.len() as u64 * g;
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: context current; valid out-pointer and properties; the size is
            // the granularity.
            let created = guarded("cuMemCreate", || unsafe {
                sys::cuMemCreate(&mut handle, g_bytes, &prop, 0)
            });
            if let Err(e) = created {
                failure = Some(
                    if e.code() == Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
                        out_of_memory(&self.dev, (want - first) as u64 * g, &e)
                    } else {
                        e.into_hal(
                            &self.dev.name,
                            "creating physical memory for a growable allocation",
                        )
                    },
                );
                break;
            }
            // SAFETY: `[at, at + g)` lies inside our reservation and is unmapped (every
            // granule below `handles.len()` is mapped, none above); `handle` is a live
            // handle of exactly `g` bytes.
            let mapped = cu(
                &self.dev.name,
                "mapping physical memory into a growable allocation",
                "cuMemMap",
                || unsafe { sys::cuMemMap(at, g_bytes, 0, handle, 0) },
            );
            if let Err(e) = mapped {
                // SAFETY: our handle, never mapped, released once.
                let _ = guarded("cuMemRelease", || unsafe { sys::cuMemRelease(handle) });
                failure = Some(e);
                break;
            }
            m.handles.push(handle);
        }
        if failure.is_none() && m.handles.len() > first {
            let descs = access_descriptors(self.dev.index as c_int, &self.dev.accessed_by);
            let at = self.ptr + first as u64 * g;
            let len = (m.handles.len() - first) * g_bytes;
            // SAFETY: `[at, at + len)` is fully mapped (just above); `descs` holds
            // `descs.len()` valid descriptors.
            let access = cu(
                &self.dev.name,
                "making a growable allocation accessible",
                "cuMemSetAccess",
                || unsafe { sys::cuMemSetAccess(at, len, descs.as_ptr(), descs.len()) },
            );
            failure = access.err();
        }
        match failure {
            None => Ok(()),
            Some(e) => {
                // Nothing was enqueued on the new granules yet: unmap them directly.
                if let Err(undo) = self.unmap_from(m, first) {
                    self.dev.record_error(undo);
                }
                Err(e)
            }
        }
    }

    /// Unmaps granules until `want` are left, after the device has finished every
    /// operation enqueued so far. The context is current.
    fn shrink(&self, m: &mut Mapping, want: usize) -> Result<()> {
        cu(
            &self.dev.name,
            "waiting for the device before releasing part of a growable allocation",
            "cuCtxSynchronize",
            // SAFETY: context current; a plain wait.
            || unsafe { sys::cuCtxSynchronize() },
        )?;
        self.unmap_from(m, want)
    }

    /// Unmaps and releases the granules from index `keep` on, last first. Stops at the
    /// first failure (the granules below it stay mapped and counted). The context is
    /// current and no work touches those granules.
    fn unmap_from(&self, m: &mut Mapping, keep: usize) -> Result<()> {
        let g = m.granularity;
        let g_bytes = usize::try_from(g).unwrap_or(usize::MAX);
        while m.handles.len() > keep {
            let i = m.handles.len() - 1;
            let handle = m.handles[i];
            let at = self.ptr + i as u64 * g;
            cu(
                &self.dev.name,
                "unmapping part of a growable allocation",
                "cuMemUnmap",
                // SAFETY: `[at, at + g)` is exactly the mapping of `handle`; no work uses
                // it (the caller's contract).
                || unsafe { sys::cuMemUnmap(at, g_bytes) },
            )?;
            m.handles.pop();
            cu(
                &self.dev.name,
                "releasing physical memory of a growable allocation",
                "cuMemRelease",
                // SAFETY: our handle, now unmapped, released once.
                || unsafe { sys::cuMemRelease(handle) },
            )?;
        }
        Ok(())
    }

    fn release(&self) -> Result<()> {
        self.dev.bind()?;
        match &self.backing {
            Backing::Plain => {
                let ptr = self.ptr;
                // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once;
                // the stream contract guarantees no queued work still uses it (work
                // holds an Arc to this buffer until it completes).
                cu(
                    &self.dev.name,
                    "freeing device memory",
                    "cuMemFree_v2",
                    || unsafe { sys::cuMemFree_v2(ptr) },
                )
            }
            Backing::Growable(mapping) => {
                let mut m = lock(mapping);
                // As for a plain block, no queued work uses the buffer any more.
                self.unmap_from(&mut m, 0)?;
                let (ptr, len) = (self.ptr, usize::try_from(m.reserved).unwrap_or(0));
                // SAFETY: exactly the reservation made in `growable`, now fully
                // unmapped, freed once.
                cu(
                    &self.dev.name,
                    "freeing the addresses of a growable allocation",
                    "cuMemAddressFree",
                    || unsafe { sys::cuMemAddressFree(ptr, len) },
                )
            }
        }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            self.dev.record_error(e);
        }
    }
}

impl RawAllocation for CudaBuffer {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn resize(&self, new_size: u64) -> Result<()> {
        self.resize_to(new_size)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// Pinned host memory from `cuMemHostAlloc`, freed by [`StagingPool`].
pub(crate) struct Pinned {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: plain host memory owned by this value; accesses are ordered by the stream.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    fn free(self) -> std::result::Result<(), CuError> {
        let p = self.ptr.cast::<std::ffi::c_void>();
        // SAFETY: `p` came from cuMemHostAlloc and is freed once (self is consumed).
        guarded("cuMemFreeHost", || unsafe { sys::cuMemFreeHost(p) })
    }
}

/// Bytes of pinned memory a pool keeps for reuse.
const POOL_LIMIT: usize = 256 << 20;
/// The smallest staging buffer.
const MIN_STAGING: usize = 64 << 10;

/// Pinned staging buffers for reuse, per device.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<Pinned>>,
}

impl StagingPool {
    /// A pinned buffer of at least `len` bytes, held by the returned lease.
    pub(crate) fn lease(dev: &Arc<DeviceShared>, len: usize) -> Result<Arc<Lease>> {
        {
            let mut free = lock(&dev.staging.free);
            if let Some(i) = free
                .iter()
                .enumerate()
                .filter(|(_, p)| p.cap >= len)
                .min_by_key(|(_, p)| p.cap)
                .map(|(i, _)| i)
            {
                let pinned = free.swap_remove(i);
                return Ok(Arc::new(Lease {
                    dev: dev.clone(),
                    pinned: Some(pinned),
                }));
            }
        }
        let cap = len
            .max(MIN_STAGING)
            .checked_next_power_of_two()
            .unwrap_or(len);
        dev.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        cu(
            &dev.name,
            "allocating pinned staging memory",
            "cuMemHostAlloc",
            // SAFETY: context current; valid out-pointer.
            || unsafe { sys::cuMemHostAlloc(&mut p, cap, sys::CU_MEMHOSTALLOC_PORTABLE) },
        )?;
        Ok(Arc::new(Lease {
            dev: dev.clone(),
            pinned: Some(Pinned { ptr: p.cast(), cap }),
        }))
    }

    /// Frees every kept buffer (the device is going away).
    pub(crate) fn clear(&self, dev: &DeviceShared) {
        let all = std::mem::take(&mut *lock(&self.free));
        if all.is_empty() || dev.bind().is_err() {
            return;
        }
        for p in all {
            let _ = p.free();
        }
    }
}

/// A staging buffer in use. Dropping it returns the buffer to the pool. Never dropped
/// inside a host callback (it may call CUDA).
pub(crate) struct Lease {
    dev: Arc<DeviceShared>,
    pinned: Option<Pinned>,
}

impl Lease {
    /// The first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.pinned.as_ref().map_or(std::ptr::null_mut(), |p| p.ptr)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(p) = self.pinned.take() else {
            return;
        };
        let mut free = lock(&self.dev.staging.free);
        let kept: usize = free.iter().map(|p| p.cap).sum();
        if kept + p.cap <= POOL_LIMIT {
            free.push(p);
            return;
        }
        drop(free);
        let result = self.dev.bind().and_then(|()| {
            p.free()
                .map_err(|e| e.into_hal(&self.dev.name, "freeing pinned memory"))
        });
        if let Err(e) = result {
            self.dev.record_error(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growable_memory_is_mapped_for_its_peers_too() {
        let descs = access_descriptors(1, &[0, 2, 1]);
        let ordinals: Vec<c_int> = descs.iter().map(|d| d.location.id).collect();
        assert_eq!(ordinals, [1, 0, 2], "the owner first, then each peer once");
        assert!(descs.iter().all(|d| {
            d.location.type_ == sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
                && d.flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        }));
        assert_eq!(access_descriptors(0, &[]).len(), 1);
    }
}
