//! Device memory (one `cuMemAlloc` per allocation) and pinned host staging memory
//! (`cuMemHostAlloc`) for copies between device memory and `HostBuffer`s.

use std::any::Any;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr};
use xpu_hal::{Error, RawAllocation, Result};

use crate::device::{lock, DeviceShared};
use crate::driver::{cu, guarded, CuError};

/// A device allocation: `size` bytes at `ptr`. Dropping it frees the memory; a failure
/// to free is recorded on the device and reported by the next synchronize.
pub struct CudaBuffer {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) ptr: CUdeviceptr,
    size: u64,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("device", &self.dev.name)
            .field("size", &self.size)
            .finish()
    }
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
                size,
            }),
            Err(e) if e.code() == Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                let (free, capacity) = dev.mem_info().unwrap_or((0, dev.total_memory));
                Err(Error::OutOfMemory {
                    device: dev.name.clone(),
                    requested: size,
                    free,
                    capacity,
                    hint: format!("{e}; free allocations you no longer need"),
                })
            }
            Err(e) => Err(e.into_hal(&dev.name, "allocating device memory")),
        }
    }

    /// The device address of byte `offset`.
    pub fn address(&self, offset: u64) -> CUdeviceptr {
        self.ptr + offset
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr;
        let result = self.dev.bind().and_then(|()| {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once; the
            // stream contract guarantees no queued work still uses it (work holds an
            // Arc to this buffer until it completes).
            cu(
                &self.dev.name,
                "freeing device memory",
                "cuMemFree_v2",
                || unsafe { sys::cuMemFree_v2(ptr) },
            )
        });
        if let Err(e) = result {
            self.dev.record_error(e);
        }
    }
}

impl RawAllocation for CudaBuffer {
    fn size(&self) -> u64 {
        self.size
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
