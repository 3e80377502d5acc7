//! The HAL's standard operations ([`xpu_hal::ops`]) as CUDA C kernels compiled by NVRTC
//! (with the builtins' compile-and-load cache, [`crate::builtins::compiled`]).
//!
//! One source per dtype ([`source`]): the builtins' helper library, a prelude naming the
//! storage and compute types ([`prelude`]), `common.cu` (parameters, offsets, index
//! check, Philox, gather, random bits), and for floats `float.cu` and, for `f32` and
//! `f64`, `scatter.cu`. Every kernel takes one [`OpParams`] by value. [`plan`] turns an
//! operation into launches (pure, so it is unit-tested without a GPU); [`dispatch`]
//! issues them on the stream under one submission.

mod check;
pub mod plan;

pub use check::{decode_record, Checked, IndexCheck, RECORD_BYTES};
pub use plan::{plan, Entry, Launch, OpParams, BLOCK};

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use xpu_hal::ops::{HasLayout, Op, OpKind, OpSupport, RawTensor};
use xpu_hal::{DType, Error, Result};

use crate::builtins::{compiled, source as builtin_source};
use crate::driver::cu;
use crate::stream::{buffer_of, Held, Step, StreamShared};

/// Shared kernels: parameters, offsets, index check, Philox, gather, random bits.
pub const COMMON: &str = include_str!("common.cu");
/// The float operations.
pub const FLOAT: &str = include_str!("float.cu");
/// Scatter-add (`atomicAdd` on `f32`, and on `f64` from sm_60).
pub const SCATTER: &str = include_str!("scatter.cu");

/// The first compute capability with `atomicAdd` on `double`.
pub const F64_ATOMIC_ARCH: i32 = 60;

/// A loaded operation kernel: the entry and the dtype of its module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelKey {
    /// Which kernel.
    pub entry: Entry,
    /// The module's dtype.
    pub dtype: DType,
}

/// Whether scatter-add is provided for `dtype` on compute capability `arch` (`major·10 +
/// minor`).
pub fn scatter_supported(dtype: DType, arch: i32) -> bool {
    dtype == DType::F32 || (dtype == DType::F64 && arch >= F64_ATOMIC_ARCH)
}

/// The operations and dtypes listed in the capabilities (with NVRTC).
pub fn supported(arch: i32) -> Vec<OpSupport> {
    let mut ops = OpSupport::all(&DType::ALL);
    for s in &mut ops {
        if s.kind == OpKind::ScatterAdd {
            s.dtypes.retain(|&d| scatter_supported(d, arch));
        }
    }
    ops.retain(|s| !s.dtypes.is_empty());
    ops
}

/// The prelude for `dtype`: `xpu_s` (storage), `xpu_w` (compute), loads and stores, and
/// for floats the math wrappers.
pub fn prelude(dtype: DType) -> String {
    let s = builtin_source::storage_type(dtype);
    let w = match dtype {
        DType::F64 => "double",
        DType::F32 | DType::F16 | DType::BF16 => "float",
        _ => s,
    };
    let (ld, st, st_d) = match dtype {
        DType::F32 => ("p[o]", "v", "(float)v"),
        DType::F64 => ("p[o]", "v", "v"),
        DType::F16 => (
            "xpu_f32_from_f16(p[o])",
            "xpu_f16_from_f32(v)",
            "(unsigned short)xpu_encode(xpu_unpack_f64(v), 10u, 5u)",
        ),
        DType::BF16 => (
            "xpu_f32_from_bf16(p[o])",
            "xpu_bf16_from_f32(v)",
            "(unsigned short)xpu_encode(xpu_unpack_f64(v), 7u, 8u)",
        ),
        _ => ("p[o]", "v", "(xpu_s)v"),
    };
    let mut text = format!(
        "
typedef {s} xpu_s;
typedef {w} xpu_w;
__device__ static xpu_w xpu_ld(const xpu_s* p, unsigned long long o) {{
    return {ld};
}}
__device__ static void xpu_st(xpu_s* p, unsigned long long o, xpu_w v) {{
    p[o] = {st};
}}
__device__ static void xpu_st_d(xpu_s* p, unsigned long long o, double v) {{
    p[o] = {st_d};
}}
"
    );
    if dtype == DType::F64 {
        text.push_str(
            "__device__ static double xpu_exp(double x) { return exp(x); }
__device__ static double xpu_log(double x) { return log(x); }
__device__ static double xpu_sqrt(double x) { return sqrt(x); }
__device__ static double xpu_tanh(double x) { return tanh(x); }
__device__ static double xpu_neg_inf() { return __longlong_as_double((long long)0xFFF0000000000000ull); }
__device__ static double xpu_pos_inf() { return __longlong_as_double((long long)0x7FF0000000000000ull); }
",
        );
    } else if w == "float" {
        text.push_str(
            "__device__ static float xpu_exp(float x) { return expf(x); }
__device__ static float xpu_log(float x) { return logf(x); }
__device__ static float xpu_sqrt(float x) { return sqrtf(x); }
__device__ static float xpu_tanh(float x) { return tanhf(x); }
__device__ static float xpu_neg_inf() { return __uint_as_float(0xFF800000u); }
__device__ static float xpu_pos_inf() { return __uint_as_float(0x7F800000u); }
",
        );
    }
    text
}

/// Whether `dtype` gets the float kernels.
fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// The complete CUDA C source of the module of `dtype` (`scatter`: include scatter-add).
pub fn source(dtype: DType, scatter: bool) -> String {
    let mut text = String::from(builtin_source::LIBRARY);
    text.push_str(&prelude(dtype));
    text.push_str(COMMON);
    if is_float(dtype) {
        text.push_str(FLOAT);
        if scatter {
            text.push_str(SCATTER);
        }
    }
    text
}

/// Enqueues `op` (checked by the HAL: non-empty tensors of the documented shapes) on
/// `stream`: an index check first where the operation has indices or labels, then its
/// kernels, all under one submission.
pub(crate) fn dispatch(stream: &Arc<StreamShared>, op: Op<RawTensor>) -> Result<()> {
    let dev = &stream.dev;
    let dtype = op
        .operands()
        .first()
        .map(|o| o.tensor.layout().dtype)
        .ok_or_else(|| Error::invalid("an operation without tensors"))?;
    let arch = dev.arch.0 * 10 + dev.arch.1;
    if op.kind() == OpKind::ScatterAdd && !scatter_supported(dtype, arch) {
        return Err(Error::unsupported(format!(
            "scatter_add on {dtype} is not provided on {}",
            dev.name
        )));
    }
    let mut held: Vec<Held> = Vec::new();
    for o in op.operands() {
        held.push(buffer_of(&o.tensor.memory)?);
    }
    let check = match plan::checked(&op) {
        Some(c) => {
            let record = Arc::new(IndexCheck::new(dev, c)?);
            held.push(record.clone());
            Some(record)
        }
        None => None,
    };
    let address =
        |t: &RawTensor| -> u64 { buffer_of(&t.memory).map_or(0, |b| b.address(t.memory.offset)) };
    let launches = plan(
        &op,
        address,
        dev.sm_count,
        check.as_ref().map_or(0, |c| c.device_address()),
    )?;
    let scatter = scatter_supported(dtype, arch);
    let mut steps: Vec<Step<'_>> = Vec::new();
    for launch in launches {
        let module_dtype = if launch.entry == Entry::RandomBits {
            DType::I32
        } else {
            dtype
        };
        let key = KernelKey {
            entry: launch.entry,
            dtype: module_dtype,
        };
        let k = compiled(
            dev,
            &dev.op_kernels,
            key,
            || source(module_dtype, scatter),
            launch.entry.name(),
        )?;
        let function = k.function();
        held.push(k);
        let name = dev.name.clone();
        let mut params = launch.params;
        let [gx, gy, gz] = launch.grid;
        steps.push(crate::stream::Step::Device(Box::new(move |s| {
            let mut args: [*mut c_void; 1] = [(&mut params as *mut OpParams).cast()];
            // SAFETY: every operation kernel takes one `XpuOpParams` by value, which
            // `OpParams` mirrors (same fields, order and size); `args` outlives the
            // call (the driver copies the parameters); the addresses in it are those
            // of the operation's buffers (and index record), held until it completes.
            cu(
                &name,
                "launching a standard operation",
                "cuLaunchKernel",
                || unsafe {
                    sys::cuLaunchKernel(
                        function,
                        gx,
                        gy,
                        gz,
                        BLOCK,
                        1,
                        1,
                        0,
                        s,
                        args.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                },
            )
        })));
    }
    stream.enqueue_steps(held, steps)
}

#[cfg(test)]
mod tests;
