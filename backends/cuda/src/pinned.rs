//! Host buffers page-locked for DMA (`cuMemHostRegister`): what
//! [`xpu_hal::Device::pin_host`] makes on a CUDA device.
//!
//! Registered with `CU_MEMHOSTREGISTER_PORTABLE`, so one registration serves every CUDA
//! context: a second CUDA device asked to pin the same buffer finds it registered
//! (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`) and keeps a pin that does not
//! unregister. Copies between device memory and a pinned buffer are one
//! `cuMemcpy*Async` straight to or from the user's pages, with no staging lease and no
//! host callback on the stream.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use xpu_hal::{HostMemory, Pin, Result};

use crate::device::DeviceShared;
use crate::driver::{guarded, CuError};

/// A registration of one host range.
pub struct CudaPin {
    device: Arc<DeviceShared>,
    ptr: usize,
    /// Whether this pin made the registration (and so undoes it).
    owner: bool,
}

impl Drop for CudaPin {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let ptr = self.ptr as *mut c_void;
        // SAFETY: `ptr` is the start of a range this pin registered; the HAL drops pins
        // before it frees the memory, and copies through it hold the memory (and so this
        // pin) until they complete.
        self.device
            .release("unpinning host memory", "cuMemHostUnregister", || unsafe {
                sys::cuMemHostUnregister(ptr)
            });
    }
}

/// Page-locks `len` bytes at `ptr` for every CUDA context.
pub(crate) fn register(
    device: &Arc<DeviceShared>,
    ptr: NonNull<u8>,
    len: usize,
) -> Result<Option<Pin>> {
    device.bind()?;
    let raw = ptr.as_ptr().cast::<c_void>();
    // SAFETY: context current; the HAL keeps `len` bytes at `ptr` valid until the pin
    // is dropped.
    let result = guarded("cuMemHostRegister_v2", || unsafe {
        sys::cuMemHostRegister_v2(raw, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
    });
    let owner = match result {
        Ok(()) => true,
        Err(CuError::Code {
            code: CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            ..
        }) => false,
        Err(e) => return Err(e.into_hal(&device.name, "pinning host memory")),
    };
    Ok(Some(Arc::new(CudaPin {
        device: device.clone(),
        ptr: ptr.as_ptr() as usize,
        owner,
    })))
}

/// A CUDA registration of `memory`, if any (portable: it serves every context).
pub(crate) fn pinned(memory: &HostMemory) -> Option<Arc<CudaPin>> {
    memory.pin::<CudaPin>(|_| true)
}
