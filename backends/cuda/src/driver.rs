//! The `result` layer over `cudarc::driver::sys`: the presence probe, the symbol check,
//! guarded calls (a cudarc panic becomes an error), and CUDA result codes mapped onto
//! the HAL's errors with the CUDA error name in the message.
//!
//! Nothing in this crate calls a driver `sys` function except through `guarded`, and
//! nothing calls `guarded` before [`Driver::load`] has succeeded. NCCL's functions go
//! through the same kind of wrapper in `nccl.rs`.

use std::ffi::c_int;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use xpu_hal::Error;

use crate::nccl::Nccl;
use crate::nvrtc::Nvrtc;
use crate::NAME;

/// The driver API version the `cuda-12060` bindings are generated for (CUDA 12.6): a
/// driver reporting less may lack symbols the backend calls.
pub const REQUIRED_DRIVER_VERSION: c_int = 12060;

/// Every driver symbol the backend calls. Checked to be exported before the first call,
/// so that a driver too old for one is an `Unavailable` error rather than a cudarc panic.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuLaunchKernel",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
];

/// Driver symbols of the virtual memory management API, which growable allocations
/// use. Looked up like [`REQUIRED_SYMBOLS`], but their absence only leaves the
/// `virtual_memory_granularity` capability `None`.
pub const VMM_SYMBOLS: &[&str] = &[
    "cuCtxSynchronize",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Driver symbols of the stream memory operation that waits for another backend's
/// event (a stream waiting on a pinned host word). Without them the stream waits in a
/// spinning one-thread kernel instead.
pub const WAIT_VALUE_SYMBOLS: &[&str] = &["cuStreamWaitValue32_v2"];

/// Why a driver call failed.
#[derive(Debug, Clone)]
pub enum CuError {
    /// The driver returned an error code.
    Code {
        /// The driver function.
        call: &'static str,
        /// What it returned.
        code: CUresult,
    },
    /// cudarc panicked (a missing symbol, most likely).
    Panic {
        /// The driver function.
        call: &'static str,
        /// The panic message.
        message: String,
    },
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CuError::Code { call, code } => write!(f, "{call} failed with {code:?}"),
            CuError::Panic { call, message } => {
                write!(f, "{call} could not be called: {message}")
            }
        }
    }
}

impl std::error::Error for CuError {}

impl CuError {
    /// The result code, when the driver returned one.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            CuError::Code { code, .. } => Some(*code),
            CuError::Panic { .. } => None,
        }
    }

    /// The HAL error for this failure on `device` (`cuda:N`), with `what` saying what
    /// was being done.
    pub fn into_hal(self, device: &str, what: &str) -> Error {
        use CUresult as R;
        match self.code() {
            Some(R::CUDA_ERROR_OUT_OF_MEMORY) => Error::OutOfMemory {
                device: device.to_string(),
                requested: 0,
                free: 0,
                capacity: 0,
                hint: format!("{what}: {self}; free memory or use smaller buffers"),
            },
            Some(
                R::CUDA_ERROR_ILLEGAL_ADDRESS
                | R::CUDA_ERROR_LAUNCH_FAILED
                | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | R::CUDA_ERROR_MISALIGNED_ADDRESS
                | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | R::CUDA_ERROR_INVALID_PC
                | R::CUDA_ERROR_HARDWARE_STACK_ERROR
                | R::CUDA_ERROR_ECC_UNCORRECTABLE
                | R::CUDA_ERROR_ASSERT
                | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
                | R::CUDA_ERROR_DEINITIALIZED,
            ) => Error::DeviceLost {
                device: device.to_string(),
                message: format!(
                    "{what}: {self}; the CUDA context is unusable (a sticky error), recreate the process's CUDA devices"
                ),
            },
            Some(R::CUDA_ERROR_LAUNCH_TIMEOUT) => Error::Timeout {
                message: format!("{what} on {device}: {self}"),
            },
            Some(R::CUDA_ERROR_NOT_SUPPORTED) => {
                Error::unsupported(format!("{what} on {device}: {self}"))
            }
            _ => Error::backend(NAME, ContextError(format!("{what} on {device}"), self)),
        }
    }
}

/// A [`CuError`] with the context it happened in, as the source of `Error::Backend`.
#[derive(Debug)]
struct ContextError(String, CuError);

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0, self.1)
    }
}

impl std::error::Error for ContextError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.1)
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Calls one driver function, turning an error code or a cudarc panic into a
/// [`CuError`].
pub(crate) fn guarded(call: &'static str, f: impl FnOnce() -> CUresult) -> Result<(), CuError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(code) => Err(CuError::Code { call, code }),
        Err(p) => Err(CuError::Panic {
            call,
            message: panic_message(&*p),
        }),
    }
}

/// Like [`guarded`], mapped to a HAL error for `device`.
pub(crate) fn cu(
    device: &str,
    what: &str,
    call: &'static str,
    f: impl FnOnce() -> CUresult,
) -> xpu_hal::Result<()> {
    guarded(call, f).map_err(|e| e.into_hal(device, what))
}

/// The loaded, initialised driver: what the probe found.
#[derive(Debug)]
pub struct Driver {
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor.
    pub version: c_int,
    /// Number of CUDA devices.
    pub device_count: c_int,
    /// NVRTC, found as [`crate::libs`] describes and no newer than the driver, or why
    /// there is none; builtin operations and CUDA C kernels need it.
    pub nvrtc: Result<Arc<Nvrtc>, String>,
    /// NCCL, found the same way, or why there is none (collectives use it).
    pub nccl: Result<Arc<Nccl>, String>,
    /// Whether the driver exports every symbol of [`VMM_SYMBOLS`] (a device must also
    /// report virtual memory management support for growable allocations).
    pub vmm: bool,
    /// Whether the driver exports every symbol of [`WAIT_VALUE_SYMBOLS`] (a device must
    /// also report `CAN_USE_STREAM_WAIT_VALUE_NOR` for streams to wait for other
    /// backends' events with `cuStreamWaitValue32` rather than a spinning kernel).
    pub stream_wait_value: bool,
}

/// `major.minor` of a driver version number.
pub fn version_string(v: c_int) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Runs a presence probe, which cudarc declares `unsafe` because it loads a library
/// (running its initialisers); a panic in it counts as "absent".
fn probe(f: unsafe fn() -> bool) -> bool {
    // SAFETY: loading the vendor's library runs its initialisers; that is what using
    // the backend means. The probe itself never panics, and if it did we say "absent".
    catch_unwind(|| unsafe { f() }).unwrap_or(false)
}

/// Which of `lists` the library cudarc will load lacks symbols of: for each list, the
/// symbols it does not export.
fn missing_symbols(lists: &[&[&'static str]]) -> Result<Vec<Vec<&'static str>>, String> {
    let mut last = String::from("no candidate library name");
    for name in ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
    {
        // SAFETY: as in `probe`: loading the driver library runs its initialisers. It is
        // the same library, in the same search order, that cudarc loads.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => {
                let missing = lists
                    .iter()
                    .map(|list| {
                        list.iter()
                            .copied()
                            .filter(|s| {
                                // SAFETY: the symbol is only looked up, never called or read.
                                unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err()
                            })
                            .collect()
                    })
                    .collect();
                return Ok(missing);
            }
            Err(e) => last = format!("{name}: {e}"),
        }
    }
    Err(last)
}

impl Driver {
    /// Probes for libcuda and initialises it. Touches nothing else in cudarc when the
    /// library is absent. `Err` carries the reason the backend is unavailable.
    pub fn load() -> Result<Driver, String> {
        if !probe(sys::is_culib_present) {
            return Err(
                "libcuda.so not found; install the NVIDIA driver (CUDA 12.6 or newer, driver 560+)"
                    .to_string(),
            );
        }
        let missing = missing_symbols(&[REQUIRED_SYMBOLS, VMM_SYMBOLS, WAIT_VALUE_SYMBOLS])
            .map_err(|e| format!("libcuda could not be opened for a symbol check ({e})"))?;
        let [missing, missing_vmm, missing_wait] = missing.as_slice() else {
            return Err("the symbol check returned an unexpected answer".to_string());
        };
        if !missing.is_empty() {
            return Err(format!(
                "the CUDA driver library lacks {} (it is too old or not a CUDA driver); install an NVIDIA driver for CUDA 12.6 or newer",
                missing.join(", ")
            ));
        }
        let mut version: c_int = 0;
        // SAFETY: the symbol exists (checked); the out-pointer is valid for the call.
        guarded("cuDriverGetVersion", || unsafe {
            sys::cuDriverGetVersion(&mut version)
        })
        .map_err(|e| e.to_string())?;
        if version < REQUIRED_DRIVER_VERSION {
            return Err(format!(
                "the NVIDIA driver supports CUDA {} but xpu needs CUDA {} or newer; update the driver",
                version_string(version),
                version_string(REQUIRED_DRIVER_VERSION)
            ));
        }
        // SAFETY: plain call; flags must be 0.
        guarded("cuInit", || unsafe { sys::cuInit(0) }).map_err(|e| match e.code() {
            Some(CUresult::CUDA_ERROR_NO_DEVICE) => "no CUDA device was found".to_string(),
            _ => format!("the CUDA driver could not be initialised: {e}"),
        })?;
        let mut count: c_int = 0;
        // SAFETY: initialised; valid out-pointer.
        guarded("cuDeviceGetCount", || unsafe {
            sys::cuDeviceGetCount(&mut count)
        })
        .map_err(|e| e.to_string())?;
        Ok(Driver {
            version,
            device_count: count,
            vmm: missing_vmm.is_empty(),
            stream_wait_value: missing_wait.is_empty(),
            nvrtc: Nvrtc::find(version, None)
                .map(|found| Arc::new(found.value))
                .map_err(|e| e.to_string()),
            nccl: Nccl::find(None)
                .map(|found| Arc::new(found.value))
                .map_err(|e| e.to_string()),
        })
    }
}
