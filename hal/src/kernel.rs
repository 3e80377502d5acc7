//! Kernels: sources in several formats, their declared parameters, and launch arguments.
//!
//! A kernel is described once by a [`KernelDesc`] (source, entry point, parameters) and
//! loaded per device with [`crate::Device::load_kernel`]. The declared parameters let
//! the HAL validate every launch in one place, whatever the backend: argument count,
//! kinds, scalar dtypes, and buffer access (a writable buffer may not overlap any other
//! buffer argument of the same launch).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::dtype::{DType, Scalar};
use crate::memory::{BufferSlice, RawSlice};

/// The formats a kernel source can come in. A device lists the ones it accepts in
/// [`crate::Capabilities::kernel_formats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFormat {
    /// A Rust function run on the host (the host backend).
    HostFunction,
    /// SPIR-V words (Vulkan).
    SpirV,
    /// WGSL text, compiled by the backend (Vulkan).
    Wgsl,
    /// PTX text (CUDA).
    Ptx,
    /// CUDA C++ source, compiled by the backend (CUDA, with NVRTC).
    CudaC,
    /// A vendor's native binary format (plugins).
    PluginNative,
}

impl KernelFormat {
    /// The lowercase name (`"host-function"`, `"spirv"` …).
    pub const fn name(self) -> &'static str {
        match self {
            KernelFormat::HostFunction => "host-function",
            KernelFormat::SpirV => "spirv",
            KernelFormat::Wgsl => "wgsl",
            KernelFormat::Ptx => "ptx",
            KernelFormat::CudaC => "cuda-c",
            KernelFormat::PluginNative => "plugin-native",
        }
    }
}

impl fmt::Display for KernelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The signature of a host-function kernel.
pub type HostKernelFn =
    dyn Fn(&mut HostKernelContext<'_>) -> std::result::Result<(), String> + Send + Sync;

/// A kernel's source code or binary.
#[derive(Clone)]
pub enum KernelSource {
    /// A host function (see [`HostKernelContext`]).
    HostFunction(Arc<HostKernelFn>),
    /// A SPIR-V module.
    SpirV(Vec<u32>),
    /// WGSL text.
    Wgsl(String),
    /// PTX text.
    Ptx(String),
    /// CUDA C++ source text; the entry point must be an `extern "C" __global__`
    /// function so that its name is not mangled.
    CudaC(String),
    /// A vendor-native binary; `format` names it for the plugin (`"simnpu-bytecode"` …).
    PluginNative {
        /// The vendor's name for the format.
        format: String,
        /// The binary.
        bytes: Vec<u8>,
    },
}

impl KernelSource {
    /// A host-function source from a closure.
    pub fn host_fn<F>(f: F) -> Self
    where
        F: Fn(&mut HostKernelContext<'_>) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
    {
        KernelSource::HostFunction(Arc::new(f))
    }

    /// The format of this source.
    pub fn format(&self) -> KernelFormat {
        match self {
            KernelSource::HostFunction(_) => KernelFormat::HostFunction,
            KernelSource::SpirV(_) => KernelFormat::SpirV,
            KernelSource::Wgsl(_) => KernelFormat::Wgsl,
            KernelSource::Ptx(_) => KernelFormat::Ptx,
            KernelSource::CudaC(_) => KernelFormat::CudaC,
            KernelSource::PluginNative { .. } => KernelFormat::PluginNative,
        }
    }
}

impl fmt::Debug for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelSource::{}", self.format())
    }
}

/// How a kernel uses a buffer parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only reads it.
    Read,
    /// Only writes it.
    Write,
    /// Reads and writes it.
    ReadWrite,
}

impl Access {
    /// Whether the kernel may write the buffer.
    pub const fn writes(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// One declared kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelParam {
    /// A device buffer, used as stated.
    Buffer(Access),
    /// A scalar of this dtype.
    Scalar(DType),
}

/// Everything needed to load a kernel.
///
/// How parameters reach the code is the backend's convention, documented by each
/// backend: host functions see them in order in a [`HostKernelContext`]; Vulkan binds
/// buffer parameters in order to `@group(0) @binding(0..)` and packs scalars into push
/// constants (see the `xpu-vulkan` crate's `kernel` module).
#[derive(Debug, Clone)]
pub struct KernelDesc {
    /// A name for messages and reports.
    pub name: String,
    /// The entry point within the source (ignored by host functions).
    pub entry_point: String,
    /// The code.
    pub source: KernelSource,
    /// The parameters, in order.
    pub params: Vec<KernelParam>,
}

/// The grid of a launch: `grid` workgroups of `block` invocations each, per dimension.
///
/// For WGSL and SPIR-V kernels the workgroup size is fixed by the shader
/// (`@workgroup_size`), so `block` is not used; for PTX and CUDA C it is the block
/// size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    /// Number of workgroups (CUDA blocks) in x, y, z; each at least 1.
    pub grid: [u32; 3],
    /// Invocations per workgroup (CUDA threads per block) in x, y, z; each at least 1.
    pub block: [u32; 3],
}

impl LaunchDims {
    /// A one-dimensional launch.
    pub const fn linear(grid: u32, block: u32) -> Self {
        LaunchDims {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
        }
    }
}

/// One launch argument as the caller gives it.
#[derive(Debug, Clone, Copy)]
pub enum KernelArg<'a> {
    /// A device buffer range.
    Buffer(BufferSlice<'a>),
    /// A scalar value.
    Scalar(Scalar),
}

/// One validated launch argument as a backend receives it.
#[derive(Debug, Clone)]
pub enum RawKernelArg {
    /// A device range (`None` for an empty one) and how the kernel uses it.
    Buffer(Option<RawSlice>, Access),
    /// A scalar value.
    Scalar(Scalar),
}

/// The backend side of a loaded kernel.
pub trait KernelImpl: Send + Sync {
    /// The kernel as `Any`, for the owning backend to downcast.
    fn as_any(&self) -> &dyn Any;
}

/// One argument as a host-function kernel sees it.
pub enum HostArg<'a> {
    /// A read-only buffer.
    Read(&'a [u8]),
    /// A writable buffer.
    Write(&'a mut [u8]),
    /// A scalar.
    Scalar(Scalar),
}

/// What a host-function kernel receives: its launch dimensions and its arguments, in
/// the declared order. Buffers are borrowed for the duration of the call only.
pub struct HostKernelContext<'a> {
    /// The launch dimensions.
    pub dims: LaunchDims,
    /// The arguments.
    pub args: Vec<HostArg<'a>>,
}

impl<'a> HostKernelContext<'a> {
    /// Argument `i` as a read-only byte slice (a writable buffer can be read too).
    pub fn bytes(&self, i: usize) -> std::result::Result<&[u8], String> {
        match self.args.get(i) {
            Some(HostArg::Read(b)) => Ok(b),
            Some(HostArg::Write(b)) => Ok(b),
            Some(HostArg::Scalar(_)) => Err(format!("argument {i} is a scalar, not a buffer")),
            None => Err(format!("there is no argument {i}")),
        }
    }

    /// Argument `i` as a writable byte slice.
    pub fn bytes_mut(&mut self, i: usize) -> std::result::Result<&mut [u8], String> {
        match self.args.get_mut(i) {
            Some(HostArg::Write(b)) => Ok(b),
            Some(HostArg::Read(_)) => Err(format!("argument {i} is a read-only buffer")),
            Some(HostArg::Scalar(_)) => Err(format!("argument {i} is a scalar, not a buffer")),
            None => Err(format!("there is no argument {i}")),
        }
    }

    /// Argument `i` as a scalar.
    pub fn scalar(&self, i: usize) -> std::result::Result<Scalar, String> {
        match self.args.get(i) {
            Some(HostArg::Scalar(s)) => Ok(*s),
            Some(_) => Err(format!("argument {i} is a buffer, not a scalar")),
            None => Err(format!("there is no argument {i}")),
        }
    }

    /// Splits the arguments so that a kernel can hold several buffers at once.
    pub fn split(&mut self) -> &mut [HostArg<'a>] {
        &mut self.args
    }
}
