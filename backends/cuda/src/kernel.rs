//! User kernels in PTX, loaded with `cuModuleLoadData`, or in CUDA C, compiled to PTX by
//! NVRTC first (cached per source and compute capability for the process). Parameters
//! follow the ABI in the crate docs: buffers as 64-bit device pointers, scalars by value
//! in their width.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction, CUmodule};
use xpu_hal::{
    Error, KernelDesc, KernelImpl, KernelSource, LaunchDims, RawKernelArg, Result, Scalar,
};

use crate::device::DeviceShared;
use crate::driver::cu;
use crate::nvrtc::{Image, ImageKind, Target};
use crate::stream::{buffer_of, Held, StreamShared};
use crate::NAME;

/// A loaded PTX (or compiled CUDA C) kernel.
pub struct CudaKernel {
    dev: Arc<DeviceShared>,
    module: CUmodule,
    function: CUfunction,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

impl KernelImpl for CudaKernel {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        let m = self.module;
        // SAFETY: our module, unloaded once; launches hold the kernel until they
        // complete, so none is pending.
        self.dev
            .release("unloading a kernel", "cuModuleUnload", || unsafe {
                sys::cuModuleUnload(m)
            });
    }
}

impl CudaKernel {
    pub(crate) fn load(dev: &Arc<DeviceShared>, desc: &KernelDesc) -> Result<Self> {
        let image = match &desc.source {
            KernelSource::Ptx(text) => {
                if text.as_bytes().contains(&0) {
                    return Err(Error::invalid(format!(
                        "the PTX of kernel `{}` contains a NUL byte",
                        desc.name
                    )));
                }
                let mut ptx = text.as_bytes().to_vec();
                ptx.push(0);
                Arc::new(Image {
                    bytes: ptx,
                    kind: ImageKind::Ptx,
                    target: Target::Compute(0),
                })
            }
            KernelSource::CudaC(source) => compile_cuda_c(dev, &desc.name, source)?,
            other => {
                return Err(Error::unsupported(format!(
                    "kernel `{}` is {}, but {} loads only PTX and CUDA C",
                    desc.name,
                    other.format(),
                    dev.name
                )))
            }
        };
        let (module, function) =
            crate::builtins::load_module(dev, &image.bytes, image.kind, &desc.entry_point)?;
        Ok(CudaKernel {
            dev: dev.clone(),
            module,
            function,
        })
    }
}

/// Device code for the CUDA C kernel `name`, compiled by NVRTC for the device's
/// compute capability (see the `nvrtc` module for machine code and PTX).
fn compile_cuda_c(dev: &DeviceShared, name: &str, source: &str) -> Result<Arc<Image>> {
    let nvrtc = dev.driver.nvrtc.as_ref().map_err(|reason| {
        Error::unsupported(format!(
            "CUDA C kernel `{name}` needs NVRTC on {}: {reason}; or pass PTX",
            dev.name
        ))
    })?;
    if source.as_bytes().contains(&0) {
        return Err(Error::invalid(format!(
            "the CUDA C source of kernel `{name}` contains a NUL byte"
        )));
    }
    let arch = dev.arch.0 * 10 + dev.arch.1;
    nvrtc
        .compile(source, arch, crate::nvrtc::Flavor::User)
        .map_err(|e| {
            Error::invalid(format!(
                "NVRTC could not compile CUDA C kernel `{name}` for sm_{arch}: {e}"
            ))
        })
}

/// A scalar's little-endian bits in the low bytes of a `u64` slot (the driver reads
/// as many bytes as the kernel's parameter has).
fn scalar_slot(s: &Scalar) -> u64 {
    let mut b = [0u8; 8];
    for (d, v) in b.iter_mut().zip(s.to_le_bytes()) {
        *d = v;
    }
    u64::from_le_bytes(b)
}

/// Enqueues a launch of `kernel`.
pub(crate) fn launch(
    stream: &Arc<StreamShared>,
    kernel: &Arc<dyn KernelImpl>,
    desc: &KernelDesc,
    dims: LaunchDims,
    args: Vec<RawKernelArg>,
) -> Result<()> {
    let Some(k) = kernel.as_any().downcast_ref::<CudaKernel>() else {
        return Err(Error::backend_message(
            NAME,
            "internal error: a kernel of another backend reached the CUDA backend",
        ));
    };
    let mut held: Vec<Held> = vec![Arc::new(kernel.clone())];
    let mut slots: Vec<u64> = Vec::with_capacity(args.len());
    for arg in &args {
        match arg {
            RawKernelArg::Buffer(Some(slice), _) => {
                let b = buffer_of(slice)?;
                slots.push(b.address(slice.offset));
                held.push(b);
            }
            RawKernelArg::Buffer(None, _) => slots.push(0),
            RawKernelArg::Scalar(s) => slots.push(scalar_slot(s)),
        }
    }
    let function = k.function;
    let name = stream.dev.name.clone();
    let what = format!("launching kernel `{}`", desc.name);
    stream.enqueue(held, |s| {
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: one parameter pointer per declared parameter, each to an 8-byte slot
        // that outlives the call (the driver copies the values); buffers are held until
        // the launch completes. A kernel whose PTX signature disagrees with its
        // declared parameters is the caller's contract (see the crate docs).
        cu(&name, &what, "cuLaunchKernel", || unsafe {
            sys::cuLaunchKernel(
                function,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    })
}
