//! # xpu-cuda: NVIDIA GPUs through the CUDA driver API
//!
//! Every CUDA device becomes `cuda:N`. The driver library (`libcuda.so`) is loaded at
//! run time through cudarc's `dynamic-loading` bindings; without it the backend is
//! `Unavailable` with the reason and lists no devices.
//!
//! **Required driver:** one that supports CUDA 12.6 (`cuDriverGetVersion` ≥ 12060,
//! NVIDIA driver 560 or newer; CUDA 13 drivers included). Builtin operations
//! additionally need NVRTC, no newer than the driver; without it a device lists no
//! builtin dtypes and only PTX kernels run (no CUDA C). NVRTC and NCCL are found where
//! installs put them — the loader path under their versioned names (`libnvrtc.so.13`,
//! `libnccl.so.2`), `CUDA_HOME`/`CUDA_PATH`, `/usr/local/cuda*`, the `lib` folders of
//! Python's `nvidia-*` packages — or where `XPU_CUDA_NVRTC` and `XPU_NCCL_LIBRARY`
//! say (module [`libs`]). `DeviceInfo::extra` names the file loaded and its version
//! (`nvrtc=13.0 (/…/libnvrtc.so.13; machine code for sm_90)`), or where the search
//! looked when it found none.
//!
//! ## Loading without panics
//!
//! cudarc panics when a library or a symbol is missing, so this crate never lets it get
//! that far. [`CudaBackend`] probes once and caches the answer:
//!
//! 1. `cudarc::driver::sys::is_culib_present()` — the non-panicking probe. When it says
//!    no, nothing else in cudarc is touched.
//! 2. The library is opened once more with libloading and every driver symbol this
//!    crate calls ([`driver::REQUIRED_SYMBOLS`]) is looked up, so that a driver too old
//!    for one of them is an `Unavailable` error naming it.
//! 3. `cuDriverGetVersion` is checked against CUDA 12.6, the version the bindings are
//!    generated for, before `cuInit`.
//!
//! As a second line of defence every driver call goes through `driver::guarded`, which
//! catches a panic and returns it as a typed error. NVRTC and NCCL are probed the same
//! way, separately, through function tables of our own over their C ABIs (not
//! cudarc's loaders, which know neither their versioned names nor Python's folders);
//! their absence only narrows what a device can do.
//!
//! ## Shape (sys → result → safe)
//!
//! - `driver` — the result layer: guarded calls, CUDA result codes mapped onto HAL
//!   errors with the CUDA error name (`CUDA_ERROR_OUT_OF_MEMORY` → `OutOfMemory`;
//!   sticky errors such as `CUDA_ERROR_ILLEGAL_ADDRESS` or `CUDA_ERROR_LAUNCH_FAILED` →
//!   `DeviceLost`; the rest → `Backend` with the code in the source chain).
//! - [`CudaDevice`] — one device: its primary context (retained for the device's
//!   lifetime and made current on each thread before it calls the driver), its
//!   properties, a pinned staging pool, and the builtin kernels compiled so far.
//! - `memory` — one `cuMemAlloc` per allocation; slices are device pointer + byte
//!   offset. Pinned host memory (`cuMemHostAlloc`) stages host copies. Errors of
//!   `cuMemFree` in `Drop` are recorded on the device and reported by the next
//!   synchronize of any of its streams, never panicked or lost. Growable allocations
//!   (`Device::allocate_growable`) use the virtual memory management API: an address
//!   range from `cuMemAddressReserve`, backed by one `cuMemCreate` handle per granule
//!   (mapped with `cuMemMap`, made accessible with `cuMemSetAccess` to the device and
//!   to every device that can access it as a peer), so that a shrink
//!   can unmap and release exactly the tail — after `cuCtxSynchronize`, so that work
//!   already enqueued on the released range cannot fault. The capability
//!   `virtual_memory_granularity` is the device's minimum VMM granularity, offered only
//!   when the driver exports the [`driver::VMM_SYMBOLS`] and the device reports
//!   `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`; otherwise `None`.
//! - `pinned` — host buffers the HAL pins for a device, page-locked with
//!   `cuMemHostRegister` (portable to every context); copies to and from them are one
//!   `cuMemcpy*Async`, with no staging or host callback.
//! - [`CudaStream`] — a non-blocking `CUstream`. Work goes straight to the stream;
//!   host-side steps (copying between a `HostBuffer` and pinned staging memory) are
//!   `cuLaunchHostFunc` callbacks, so stream order holds across the host and the
//!   device. A callback runs a plain memcpy between raw addresses and owns nothing, so
//!   it never calls CUDA, not even by dropping the last reference to something. A completion thread per stream synchronises checkpoint events in
//!   order, completes xpu events, and releases what the work held. Callbacks never
//!   block.
//! - [`CudaEvent`] — a timing-enabled `CUevent` recorded on the stream, plus the
//!   stream position whose outcome it reports. Waits on events of the same backend are
//!   native (`cuStreamWaitEvent`, which accepts events of other devices' contexts).
//!   Waits on other backends' events never block inside a host callback (the driver
//!   runs a context's callbacks on one thread, so a blocked one can deadlock against
//!   CUDA work the foreign event depends on). Where the driver exports
//!   `cuStreamWaitValue32_v2` (the v2 memory operations work on every device; only
//!   their NOR comparison, unused here, needs a device attribute), the stream waits on
//!   the device for a pinned host word that a per-stream helper thread advances once
//!   the foreign event is done; elsewhere the stream runs a one-thread kernel that
//!   spins on the word. Neither blocks a host thread the caller needs.
//!   `DeviceInfo::extra` says which (`foreign_event_wait=stream-wait-value` or
//!   `spin-kernel`); the `stream` module has the details.
//! - `builtins` — every builtin operation as generated CUDA C (one kernel per
//!   operation and dtype), compiled by NVRTC on first use, once per (source, GPU
//!   architecture) in the process, and loaded once per device.
//! - [`nvrtc`] — compiles to the device's own machine code (`sm_XX`, a cubin) when
//!   NVRTC knows the architecture, and to PTX for the newest architecture it knows
//!   otherwise (the driver compiles that forward).
//! - `kernel` — user kernels in PTX (`cuModuleLoadData`) or in CUDA C
//!   (`KernelFormat::CudaC`, compiled by NVRTC for the device as above with NVRTC's
//!   default options, cached per (source, architecture) for the process; offered when
//!   NVRTC is present). A compile error is an `InvalidArgument` error carrying NVRTC's
//!   log.
//! - [`nccl`] — NCCL groups, of this process's devices (`ncclCommInitAll`) or spanning
//!   processes (`ncclGetUniqueId`, non-blocking `ncclCommInitRankConfig` under the
//!   group's timeout, NCCL ≥ 2.14); their work is accounted to the ranks' xpu streams,
//!   so `synchronize`, `query` and events cover it and it holds its buffers.
//!
//! ## Errors of asynchronous work
//!
//! As on every backend: a failure is recorded on the stream when it is observed (a
//! checkpoint event's synchronisation fails, a host step fails, an event waited for
//! failed) and reported once, by the next `synchronize` or `query`, and by every event
//! recorded after it. CUDA's sticky errors poison the whole context; they are reported
//! as `DeviceLost` and every later call fails the same way.
//!
//! ## Kernel ABI (PTX and CUDA C)
//!
//! A CUDA C entry point must be declared `extern "C" __global__` so that its name is
//! the entry point's, unmangled.
//!
//! Parameters are passed in declaration order: a buffer as a 64-bit device pointer to
//! the first byte of its slice (null for an empty slice), a scalar by value in its own
//! width (`u8` one byte, `f16`/`bf16` as their 16 bits, `f32`/`i32` four bytes,
//! `f64`/`i64` eight). `LaunchDims` is the grid and block.
//!
//! ## Limits
//!
//! A shrink of a growable allocation waits for the whole context, not only for the
//! work that uses the allocation.

pub mod builtins;
mod device;
pub mod driver;
mod event;
mod kernel;
pub mod libs;
mod memory;
pub mod nccl;
pub mod nvrtc;
pub mod ops;
mod pinned;
mod stream;

use std::sync::{Arc, OnceLock};

use xpu_hal::backend::{Backend, DeviceImpl, DeviceSummary};
use xpu_hal::{Error, Result};

pub use device::CudaDevice;
pub use driver::Driver;
pub use event::CudaEvent;
pub use memory::CudaBuffer;
pub use stream::CudaStream;

/// The backend's registered name.
pub const NAME: &str = "cuda";

/// The probe's outcome, shared by every backend value in the process: the probe loads
/// a library, which there is no reason to do twice.
static DRIVER: OnceLock<std::result::Result<Arc<Driver>, String>> = OnceLock::new();

/// The loaded driver, or why there is none. Probes on first call.
pub fn driver() -> std::result::Result<Arc<Driver>, String> {
    DRIVER.get_or_init(|| Driver::load().map(Arc::new)).clone()
}

/// The CUDA backend. The driver is probed on first enumeration.
#[derive(Debug, Default)]
pub struct CudaBackend {
    _private: (),
}

impl CudaBackend {
    /// A backend; nothing is loaded until it is first used.
    pub fn new() -> Self {
        CudaBackend { _private: () }
    }

    fn driver(&self) -> Result<Arc<Driver>> {
        driver().map_err(|reason| Error::unavailable(NAME, reason))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn enumerate(&self) -> Result<Vec<DeviceSummary>> {
        let driver = self.driver()?;
        if driver.device_count <= 0 {
            return Err(Error::unavailable(NAME, "no CUDA device was found"));
        }
        (0..driver.device_count)
            .map(|i| {
                Ok(DeviceSummary {
                    index: i as u32,
                    name: device::device_name(i)?,
                })
            })
            .collect()
    }

    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>> {
        let driver = self.driver()?;
        if i64::from(index) >= i64::from(driver.device_count) {
            return Err(Error::invalid(format!(
                "cuda:{index} does not exist; there are {} CUDA device(s)",
                driver.device_count
            )));
        }
        Ok(Arc::new(CudaDevice::new(driver, index)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this machine must have a CUDA device (then absence fails the test).
    fn required() -> bool {
        std::env::var("XPU_REQUIRE").is_ok_and(|v| v.split(',').any(|p| p.trim() == NAME))
    }

    #[test]
    fn enumeration_never_panics_and_explains_absence() {
        let backend = CudaBackend::new();
        assert_eq!(backend.name(), "cuda");
        match backend.enumerate() {
            Ok(devices) => assert!(!devices.is_empty()),
            Err(e) => {
                assert!(!required(), "CUDA is required here: {e}");
                assert_eq!(e.kind(), "unavailable", "{e}");
                assert!(!e.to_string().is_empty());
                assert!(backend.create_device(0).is_err());
                // The answer is cached: asking again gives the same reason.
                let again = backend.enumerate().unwrap_err();
                assert_eq!(again.to_string(), e.to_string());
            }
        }
    }
}
