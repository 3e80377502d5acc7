//! The builtin operations: generated CUDA C ([`source`]), compiled by NVRTC on first
//! use (cached per source and architecture for the process), loaded once per device,
//! and launched on the stream with the operands' device pointers.

pub mod source;

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction, CUmodule};
use xpu_hal::backend::BuiltinOp;
use xpu_hal::{BinaryOp, DType, Error, Result, Scalar};

use crate::device::{lock, DeviceShared};
use crate::driver::{cu, guarded};
use crate::nvrtc::ImageKind;
use crate::stream::{buffer_of, Held, StreamShared};
use crate::NAME;

/// Threads per block of every builtin launch.
pub const BLOCK: u32 = 256;

/// Which builtin kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinKind {
    /// `dst[i] = scalar`.
    Fill(DType),
    /// `dst[i] = a[i] op b[i]`.
    Binary(BinaryOp, DType),
    /// `dst[i] = dst[i] op a[i]`.
    Accumulate(BinaryOp, DType),
    /// `dst[i] = a[i] * scalar`.
    Scale(DType),
    /// `dst[i] = a[i] as dst dtype`: (source dtype, destination dtype).
    Cast(DType, DType),
}

impl BuiltinKind {
    /// Every builtin kernel.
    pub fn all() -> Vec<BuiltinKind> {
        let mut v = Vec::new();
        for d in DType::ALL {
            v.push(BuiltinKind::Fill(d));
            v.push(BuiltinKind::Scale(d));
            for op in BinaryOp::ALL {
                v.push(BuiltinKind::Binary(op, d));
                v.push(BuiltinKind::Accumulate(op, d));
            }
            for s in DType::ALL {
                v.push(BuiltinKind::Cast(s, d));
            }
        }
        v
    }
}

/// A loaded builtin kernel. Unloaded when the device drops its cache (with the
/// device's context current).
pub struct BuiltinKernel {
    module: CUmodule,
    function: CUfunction,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for BuiltinKernel {}
// SAFETY: as above.
unsafe impl Sync for BuiltinKernel {}

impl Drop for BuiltinKernel {
    fn drop(&mut self) {
        let m = self.module;
        // SAFETY: our module, unloaded once; dropped by `DeviceShared::drop` with the
        // context current, after every stream (which hold the device) is gone.
        let _ = guarded("cuModuleUnload", || unsafe { sys::cuModuleUnload(m) });
    }
}

/// Loads device code — NUL-terminated PTX, or a cubin — and looks up `entry`.
pub(crate) fn load_module(
    dev: &DeviceShared,
    image: &[u8],
    kind: ImageKind,
    entry: &str,
) -> Result<(CUmodule, CUfunction)> {
    match kind {
        ImageKind::Ptx if image.last() != Some(&0) => {
            return Err(Error::invalid(
                "PTX must not contain NUL bytes except at the end",
            ));
        }
        ImageKind::Cubin if !image.starts_with(b"\x7fELF") => {
            return Err(Error::backend_message(
                NAME,
                "internal error: NVRTC's machine code is not an ELF image",
            ));
        }
        _ => {}
    }
    let name = CString::new(entry)
        .map_err(|_| Error::invalid(format!("the entry point `{entry}` contains a NUL byte")))?;
    dev.bind()?;
    let mut module: CUmodule = std::ptr::null_mut();
    let what = match kind {
        ImageKind::Ptx => "loading PTX",
        ImageKind::Cubin => "loading machine code",
    };
    // SAFETY: context current; `image` is NUL-terminated PTX or a complete cubin (both
    // checked above), and outlives the call.
    cu(&dev.name, what, "cuModuleLoadData", || unsafe {
        sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
    })?;
    let mut function: CUfunction = std::ptr::null_mut();
    let m = module;
    // SAFETY: a live module; NUL-terminated name.
    let found = cu(
        &dev.name,
        &format!("looking up the entry point `{entry}`"),
        "cuModuleGetFunction",
        || unsafe { sys::cuModuleGetFunction(&mut function, m, name.as_ptr()) },
    );
    if let Err(e) = found {
        // SAFETY: our module, unused.
        let _ = guarded("cuModuleUnload", || unsafe { sys::cuModuleUnload(m) });
        return Err(e);
    }
    Ok((module, function))
}

fn kernel(dev: &Arc<DeviceShared>, kind: BuiltinKind) -> Result<Arc<BuiltinKernel>> {
    compiled(
        dev,
        &dev.builtins,
        kind,
        || source::source(kind),
        &source::entry(kind),
    )
}

/// The kernel `entry` of the CUDA C `source` for `key`, from `cache` or compiled by
/// NVRTC (builtin flavour: no contraction, IEEE division and square roots) and loaded.
/// Shared by the builtins and the standard operations.
pub(crate) fn compiled<K: Copy + Eq + std::hash::Hash + std::fmt::Debug>(
    dev: &Arc<DeviceShared>,
    cache: &std::sync::Mutex<std::collections::HashMap<K, Arc<BuiltinKernel>>>,
    key: K,
    source: impl FnOnce() -> String,
    entry: &str,
) -> Result<Arc<BuiltinKernel>> {
    let mut cache = lock(cache);
    if let Some(k) = cache.get(&key) {
        return Ok(k.clone());
    }
    let nvrtc = dev.driver.nvrtc.as_ref().map_err(|reason| {
        Error::unsupported(format!(
            "builtin and standard operations on {} need NVRTC: {reason}",
            dev.name
        ))
    })?;
    let arch = dev.arch.0 * 10 + dev.arch.1;
    let image = nvrtc
        .compile(&source(), arch, crate::nvrtc::Flavor::Builtin)
        .map_err(|e| {
            Error::backend_message(
                NAME,
                format!("NVRTC could not compile the kernel {key:?} for sm_{arch}: {e}"),
            )
        })?;
    let (module, function) = load_module(dev, &image.bytes, image.kind, entry)?;
    let k = Arc::new(BuiltinKernel { module, function });
    cache.insert(key, k.clone());
    Ok(k)
}

/// The scalar's little-endian bits in the low bytes of a `u64`.
fn scalar_bits(s: &Scalar) -> u64 {
    let mut b = [0u8; 8];
    for (dst, src) in b.iter_mut().zip(s.to_le_bytes()) {
        *dst = src;
    }
    u64::from_le_bytes(b)
}

/// Enqueues `op` on `stream`.
pub(crate) fn dispatch(stream: &Arc<StreamShared>, op: BuiltinOp) -> Result<()> {
    let (kind, dst, dtype, sources, scalar) = match op {
        BuiltinOp::Fill { dst, value } => (
            BuiltinKind::Fill(value.dtype()),
            dst,
            value.dtype(),
            vec![],
            Some(value),
        ),
        BuiltinOp::Binary {
            op,
            dtype,
            a,
            b,
            dst,
        } => (BuiltinKind::Binary(op, dtype), dst, dtype, vec![a, b], None),
        BuiltinOp::Accumulate {
            op,
            dtype,
            dst,
            src,
        } => (
            BuiltinKind::Accumulate(op, dtype),
            dst,
            dtype,
            vec![src],
            None,
        ),
        BuiltinOp::Scale { alpha, src, dst } => (
            BuiltinKind::Scale(alpha.dtype()),
            dst,
            alpha.dtype(),
            vec![src],
            Some(alpha),
        ),
        BuiltinOp::Cast {
            src,
            src_dtype,
            dst,
            dst_dtype,
        } => (
            BuiltinKind::Cast(src_dtype, dst_dtype),
            dst,
            dst_dtype,
            vec![src],
            None,
        ),
    };
    let dev = &stream.dev;
    let k = kernel(dev, kind)?;
    let count = dst.len / dtype.size() as u64;
    let dst_buf = buffer_of(&dst)?;
    let mut ptrs = [dst_buf.address(dst.offset), 0, 0];
    let mut held: Vec<Held> = vec![k.clone(), dst_buf];
    for (i, s) in sources.iter().enumerate() {
        let b = buffer_of(s)?;
        ptrs[i + 1] = b.address(s.offset);
        held.push(b);
    }
    let mut n = count;
    let mut bits = scalar.as_ref().map_or(0, scalar_bits);
    let blocks = count
        .div_ceil(u64::from(BLOCK))
        .min(u64::from(dev.sm_count) * 32)
        .clamp(1, i32::MAX as u64) as u32;
    let function = k.function;
    let name = dev.name.clone();
    stream.enqueue(held, |s| {
        let [mut d, mut a, mut b] = ptrs;
        let mut params: [*mut c_void; 5] = [
            (&mut d as *mut u64).cast(),
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut bits as *mut u64).cast(),
        ];
        // SAFETY: the kernel's signature is the one in `source` (three pointers, two
        // u64), matched by `params`, which outlive the call (the driver copies them);
        // the pointers address live buffers held until the launch completes.
        cu(
            &name,
            "launching a builtin kernel",
            "cuLaunchKernel",
            || unsafe {
                sys::cuLaunchKernel(
                    function,
                    blocks,
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    s,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
        )
    })
}

/// The entry point of [`FLAG_WAIT_PTX`].
const FLAG_WAIT_ENTRY: &str = "xpu_wait_flag";

/// The kernel a stream runs to wait for a host word where the device cannot
/// `cuStreamWaitValue32`: one thread spins on `*flag` (a device-mapped host word, read
/// with volatile loads, which are system-scope) until `(int)(*flag - value) >= 0`, the
/// same cyclic comparison as `CU_STREAM_WAIT_VALUE_GEQ`. Hand-written PTX, so it needs
/// no NVRTC. Parameters: the word's device address (u64), the value (u32).
const FLAG_WAIT_PTX: &str = "\
.version 7.0
.target sm_50
.address_size 64

.visible .entry xpu_wait_flag(
    .param .u64 xpu_wait_flag_param_0,
    .param .u32 xpu_wait_flag_param_1
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;

    ld.param.u64 %rd1, [xpu_wait_flag_param_0];
    ld.param.u32 %r1, [xpu_wait_flag_param_1];
$L_wait:
    ld.volatile.u32 %r2, [%rd1];
    sub.s32 %r3, %r2, %r1;
    setp.lt.s32 %p1, %r3, 0;
    @%p1 bra $L_wait;
    ret;
}
\0";

/// The flag-wait kernel of [`FLAG_WAIT_PTX`], loaded once per device.
pub(crate) fn flag_wait_kernel(dev: &Arc<DeviceShared>) -> Result<Arc<BuiltinKernel>> {
    let mut slot = lock(&dev.flag_wait);
    if let Some(k) = &*slot {
        return Ok(k.clone());
    }
    let (module, function) = load_module(
        dev,
        FLAG_WAIT_PTX.as_bytes(),
        ImageKind::Ptx,
        FLAG_WAIT_ENTRY,
    )?;
    let k = Arc::new(BuiltinKernel { module, function });
    *slot = Some(k.clone());
    Ok(k)
}

impl BuiltinKernel {
    /// The kernel's function handle.
    pub(crate) fn function(&self) -> CUfunction {
        self.function
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wait_ptx_is_one_nul_terminated_entry() {
        assert_eq!(FLAG_WAIT_PTX.bytes().filter(|b| *b == 0).count(), 1);
        assert!(FLAG_WAIT_PTX.ends_with('\0'));
        assert!(FLAG_WAIT_PTX.contains(&format!(".visible .entry {FLAG_WAIT_ENTRY}(")));
    }
}
