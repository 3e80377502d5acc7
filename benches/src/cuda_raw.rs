//! The reference for `xpu bench cuda`: the same device work as the xpu CUDA backend,
//! written directly against the CUDA driver API through cudarc's thin `result` layer,
//! with nothing around it.
//!
//! It retains the primary context of the same GPU (the context the backend uses too),
//! creates one non-blocking stream, loads [`EMPTY_PTX`] with `cuModuleLoadData`, and
//! takes its host memory page-locked from the driver (`cuMemHostAlloc`). Every
//! operation makes the context current on the calling thread (as cudarc's safe API and
//! the backend do), enqueues one `cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync` or
//! `cuLaunchKernel` on the stream and waits with `cuStreamSynchronize`: the cheapest
//! honest way to run one piece of work and know that it finished.
//!
//! cudarc panics when the driver library or a symbol is missing, so [`RawCuda::new`]
//! first asks the backend's probe ([`xpu_cuda::driver`]), which never panics, and every
//! call here is made under `catch_unwind` as a second line of defence. Nothing in this
//! module ever panics on its own.

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use xpu_hal::{Error, Result};

const WHO: &str = "cuda (raw reference)";

/// An empty kernel (`xpu_empty`, no parameters) as PTX text: what a launch costs with no
/// work in it. PTX 7.0 for `sm_52` is JIT-compiled by any driver for CUDA 11 or newer
/// for the GPU at hand, and needs no NVRTC.
pub const EMPTY_PTX: &str = ".version 7.0
.target sm_52
.address_size 64

.visible .entry xpu_empty()
{
\tret;
}
";

/// The entry point of [`EMPTY_PTX`].
pub const EMPTY_ENTRY: &str = "xpu_empty";

/// Runs one cudarc call, turning its error or its panic into an [`Error`].
fn call<T>(what: &str, f: impl FnOnce() -> std::result::Result<T, DriverError>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Error::backend_message(WHO, format!("{what} failed: {e}"))),
        Err(payload) => Err(Error::from_panic(&format!("{WHO}: {what}"), &*payload)),
    }
}

/// The raw reference on one GPU: its primary context, one stream and the empty kernel.
///
/// Not `Send`: it is used on the thread that made it (it holds raw driver handles).
pub struct RawCuda {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    module: sys::CUmodule,
    empty: sys::CUfunction,
    name: String,
}

impl RawCuda {
    /// The reference on the GPU of ordinal `ordinal`. [`Error::Unavailable`] (with the
    /// backend's reason) when the driver cannot be loaded.
    pub fn new(ordinal: u32) -> Result<Self> {
        xpu_cuda::driver().map_err(|reason| Error::unavailable(xpu_cuda::NAME, reason))?;
        let index = i32::try_from(ordinal)
            .map_err(|_| Error::invalid(format!("CUDA ordinal {ordinal} is out of range")))?;
        let device = call("cuDeviceGet", || cu::device::get(index))?;
        let name = call("cuDeviceGetName", || cu::device::get_name(device))?;
        // SAFETY: `device` came from `cuDeviceGet`; the retain is released in `Drop`.
        let ctx = call("cuDevicePrimaryCtxRetain", || unsafe {
            cu::primary_ctx::retain(device)
        })?;
        // From here on `Drop` releases whatever was made, null handles excepted.
        let mut raw = RawCuda {
            device,
            ctx,
            stream: std::ptr::null_mut(),
            module: std::ptr::null_mut(),
            empty: std::ptr::null_mut(),
            name,
        };
        raw.bind()?;
        raw.stream = call("cuStreamCreate", || {
            cu::stream::create(cu::stream::StreamKind::NonBlocking)
        })?;
        let ptx = CString::new(EMPTY_PTX)
            .map_err(|_| Error::invalid("the empty kernel's PTX contains a NUL byte"))?;
        // SAFETY: the context is current; the image is a NUL-terminated PTX string that
        // outlives the call.
        raw.module = call("cuModuleLoadData", || unsafe {
            cu::module::load_data(ptx.as_ptr().cast::<c_void>())
        })?;
        let entry = CString::new(EMPTY_ENTRY)
            .map_err(|_| Error::invalid("the empty kernel's entry point contains a NUL byte"))?;
        let module = raw.module;
        // SAFETY: `module` is loaded and stays loaded until `Drop`.
        raw.empty = call("cuModuleGetFunction", || unsafe {
            cu::module::get_function(module, entry)
        })?;
        Ok(raw)
    }

    /// The GPU's name (`cuDeviceGetName`).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// Makes the context current on this thread.
    fn bind(&self) -> Result<()> {
        let ctx = self.ctx;
        // SAFETY: `ctx` is the retained primary context, alive until `Drop`.
        call("cuCtxSetCurrent", || unsafe { cu::ctx::set_current(ctx) })
    }

    /// Waits until the stream's work is done.
    fn synchronize(&self) -> Result<()> {
        let stream = self.stream;
        // SAFETY: our stream, alive until `Drop`.
        call("cuStreamSynchronize", || unsafe {
            cu::stream::synchronize(stream)
        })
    }

    /// `len` bytes of page-locked host memory (`cuMemHostAlloc`, no flags), zeroed.
    pub fn pinned(&self, len: usize) -> Result<PinnedHost<'_>> {
        if len == 0 {
            return Err(Error::invalid("a pinned buffer needs at least one byte"));
        }
        self.bind()?;
        // SAFETY: the context is current; the memory is initialised below before any
        // read.
        let ptr = call("cuMemHostAlloc", || unsafe { cu::malloc_host(len, 0) })?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::backend_message(WHO, "cuMemHostAlloc returned null"))?;
        // SAFETY: `ptr` points to `len` writable bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedHost {
            raw: self,
            ptr,
            len,
        })
    }

    /// `len` bytes of device memory (`cuMemAlloc`), zeroed.
    pub fn device_memory(&self, len: usize) -> Result<DeviceMemory<'_>> {
        if len == 0 {
            return Err(Error::invalid("a device buffer needs at least one byte"));
        }
        self.bind()?;
        // SAFETY: the context is current.
        let ptr = call("cuMemAlloc", || unsafe { cu::malloc_sync(len) })?;
        let memory = DeviceMemory {
            raw: self,
            ptr,
            len,
        };
        // SAFETY: `ptr` is `len` bytes of device memory of this context.
        call("cuMemsetD8", || unsafe { cu::memset_d8_sync(ptr, 0, len) })?;
        Ok(memory)
    }

    /// Copies all of `src` into `dst` (of the same length) with one `cuMemcpyHtoDAsync`
    /// on the stream, then synchronizes the stream.
    pub fn upload(&self, src: &PinnedHost<'_>, dst: &DeviceMemory<'_>) -> Result<()> {
        same_length(src.len, dst.len)?;
        self.bind()?;
        // SAFETY: `src` is `len` bytes of page-locked host memory and `dst` `len` bytes of
        // device memory of this context; both are borrowed until the copy has finished
        // (the stream is synchronized before returning, also after a failed enqueue).
        let enqueued = call("cuMemcpyHtoDAsync", || unsafe {
            cu::memcpy_htod_async(dst.ptr, src.bytes(), self.stream)
        });
        let synced = self.synchronize();
        enqueued.and(synced)
    }

    /// Copies all of `src` into `dst` (of the same length) with one `cuMemcpyDtoHAsync`
    /// on the stream, then synchronizes the stream.
    pub fn download(&self, src: &DeviceMemory<'_>, dst: &mut PinnedHost<'_>) -> Result<()> {
        same_length(src.len, dst.len)?;
        self.bind()?;
        let stream = self.stream;
        // SAFETY: as in `upload`, with `dst` borrowed mutably until the copy has
        // finished.
        let enqueued = call("cuMemcpyDtoHAsync", || unsafe {
            cu::memcpy_dtoh_async(dst.bytes_mut(), src.ptr, stream)
        });
        let synced = self.synchronize();
        enqueued.and(synced)
    }

    /// Launches [`EMPTY_PTX`] as one block of one thread with `cuLaunchKernel` on the
    /// stream, then synchronizes the stream.
    pub fn launch_empty(&self) -> Result<()> {
        self.bind()?;
        let (function, stream) = (self.empty, self.stream);
        // SAFETY: `function` belongs to our loaded module; the kernel takes no
        // parameters, so the empty parameter list is complete.
        call("cuLaunchKernel", || unsafe {
            cu::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream, &mut [])
        })?;
        self.synchronize()
    }
}

impl Drop for RawCuda {
    fn drop(&mut self) {
        // Errors cannot be reported from here; the process keeps going either way.
        let _ = self.bind();
        if !self.stream.is_null() {
            let _ = self.synchronize();
            let stream = self.stream;
            // SAFETY: our stream, idle (synchronized), destroyed once.
            let _ = call("cuStreamDestroy", || unsafe { cu::stream::destroy(stream) });
        }
        if !self.module.is_null() {
            let module = self.module;
            // SAFETY: our module; no launch is pending (the stream was synchronized).
            let _ = call("cuModuleUnload", || unsafe { cu::module::unload(module) });
        }
        let device = self.device;
        // SAFETY: balances the retain in `new`; every buffer borrowed `self` and is gone.
        let _ = call("cuDevicePrimaryCtxRelease", || unsafe {
            cu::primary_ctx::release(device)
        });
    }
}

fn same_length(src: usize, dst: usize) -> Result<()> {
    if src == dst {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "the copy's source has {src} bytes but its destination {dst}; use buffers of one size"
        )))
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
pub struct PinnedHost<'a> {
    raw: &'a RawCuda,
    ptr: NonNull<u8>,
    len: usize,
}

impl PinnedHost<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: a pinned buffer has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation), alive until drop; no
        // copy is in flight outside `RawCuda`'s methods, which wait for theirs.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedHost<'_> {
    fn drop(&mut self) {
        let _ = self.raw.bind();
        let ptr = self.ptr.as_ptr().cast::<c_void>();
        // SAFETY: returned by `cuMemHostAlloc`, freed once; no copy is in flight.
        let _ = call("cuMemFreeHost", || unsafe { cu::free_host(ptr) });
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceMemory<'a> {
    raw: &'a RawCuda,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceMemory<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: a device buffer has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        let _ = self.raw.bind();
        let ptr = self.ptr;
        // SAFETY: returned by `cuMemAlloc`, freed once; no copy is in flight.
        let _ = call("cuMemFree", || unsafe { cu::free_sync(ptr) });
    }
}
