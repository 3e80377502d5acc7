//! Builtin operations on arena memory, with the host backend's functions
//! (`xpu_hal::reference`) as the arithmetic, so that the simulated NPU computes bit for bit
//! what the reference computes.
//!
//! Operands that are the same range are handled as the host backend does: `binary`
//! with `dst` equal to an operand becomes `accumulate` (every operator commutes), all
//! three equal becomes `combine_with_self`, `scale` in place becomes `scale_in_place`,
//! and an in-place cast reads its source first.

use half::{bf16, f16};
use xpu_hal::reference::{self as ops, Element};
use xpu_hal::BinaryOp as HalOp;
use xpu_plugin_sdk::{BinaryOp, BufferRange, Builtin, DType, Error, Result, Scalar};

use crate::arena::Buffer;

/// Runs `$body` with `$T` bound to the Rust type of an SDK dtype.
macro_rules! with_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        xpu_hal::with_dtype!(DType, $dtype, $T => $body)
    };
}

/// An element type with its SDK scalar.
trait Lane: Element {
    fn from_sdk(s: Scalar) -> Option<Self>;
}

macro_rules! lane {
    ($($t:ty: $variant:ident => $conv:expr),* $(,)?) => {$(
        impl Lane for $t {
            fn from_sdk(s: Scalar) -> Option<Self> {
                match s {
                    Scalar::$variant(v) => Some($conv(v)),
                    _ => None,
                }
            }
        }
    )*};
}

lane! {
    f32: F32 => std::convert::identity,
    f64: F64 => std::convert::identity,
    f16: F16 => f16::from_bits,
    bf16: BF16 => bf16::from_bits,
    i32: I32 => std::convert::identity,
    i64: I64 => std::convert::identity,
    u8: U8 => std::convert::identity,
}

fn scalar<T: Lane>(s: Scalar) -> Result<T> {
    T::from_sdk(s).ok_or_else(|| {
        Error::internal(format!(
            "the scalar {s:?} does not match the operation's dtype"
        ))
    })
}

fn hal_op(op: BinaryOp) -> HalOp {
    match op {
        BinaryOp::Sum => HalOp::Sum,
        BinaryOp::Prod => HalOp::Prod,
        BinaryOp::Min => HalOp::Min,
        BinaryOp::Max => HalOp::Max,
    }
}

/// The elements of a range.
///
/// # Safety
/// The range is in bounds and aligned to `T` (guaranteed by the SDK, with buffers
/// aligned to 256 bytes), and no live `&mut` view overlaps it.
pub(crate) unsafe fn view<T: bytemuck::Pod>(r: &BufferRange<Buffer>) -> &[T] {
    let len = r.length as usize / std::mem::size_of::<T>();
    // SAFETY: per the contract; arena bytes are initialised (zero-filled at creation)
    // and every bit pattern is a valid `T`.
    unsafe { std::slice::from_raw_parts(r.buffer.ptr(r.offset).cast::<T>(), len) }
}

/// The elements of a range, to write.
///
/// # Safety
/// As for [`view`], and no other live view overlaps it.
// The bytes belong to the arena, not to the range: exclusivity is the caller's part of
// the contract above, not something `&` could express.
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn view_mut<T: bytemuck::Pod>(r: &BufferRange<Buffer>) -> &mut [T] {
    let len = r.length as usize / std::mem::size_of::<T>();
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts_mut(r.buffer.ptr(r.offset).cast::<T>(), len) }
}

/// Executes a builtin operation (on the stream's worker thread).
pub(crate) fn execute(op: &Builtin<Buffer>) -> Result<()> {
    // SAFETY (for every view below): the SDK guarantees in-bounds, element-aligned
    // ranges that are identical or disjoint; identical ranges take the in-place paths,
    // so no two live views of one operation overlap where one is written. This runs on
    // the stream's worker, and the host orders other streams' access with events.
    match op {
        Builtin::Fill { dst, value } => with_type!(value.dtype(), T => {
            let v: T = scalar(*value)?;
            // SAFETY: see above.
            ops::fill(unsafe { view_mut::<T>(dst) }, v);
        }),
        Builtin::Binary {
            op,
            dtype,
            a,
            b,
            dst,
        } => {
            let op = hal_op(*op);
            with_type!(*dtype, T => match (dst.same_as(a), dst.same_as(b)) {
                // SAFETY: see above; one view of the single range.
                (true, true) => ops::combine_with_self::<T>(op, unsafe { view_mut(dst) }),
                // SAFETY: see above; `b` is disjoint from `dst`.
                (true, false) => ops::accumulate::<T>(op, unsafe { view_mut(dst) }, unsafe { view(b) }),
                // SAFETY: see above; `a` is disjoint from `dst` (every operator commutes).
                (false, true) => ops::accumulate::<T>(op, unsafe { view_mut(dst) }, unsafe { view(a) }),
                // SAFETY: see above; `a` and `b` are disjoint from `dst` (they may be the
                // same range: both are only read).
                (false, false) => ops::binary::<T>(op, unsafe { view(a) }, unsafe { view(b) }, unsafe { view_mut(dst) }),
            })
        }
        Builtin::Accumulate {
            op,
            dtype,
            dst,
            src,
        } => {
            let op = hal_op(*op);
            with_type!(*dtype, T => if dst.same_as(src) {
                // SAFETY: see above.
                ops::combine_with_self::<T>(op, unsafe { view_mut(dst) });
            } else {
                // SAFETY: see above; disjoint.
                ops::accumulate::<T>(op, unsafe { view_mut(dst) }, unsafe { view(src) });
            })
        }
        Builtin::Scale { alpha, src, dst } => with_type!(alpha.dtype(), T => {
            let alpha: T = scalar(*alpha)?;
            if dst.same_as(src) {
                // SAFETY: see above.
                ops::scale_in_place(alpha, unsafe { view_mut::<T>(dst) });
            } else {
                // SAFETY: see above; disjoint.
                ops::scale(alpha, unsafe { view::<T>(src) }, unsafe { view_mut::<T>(dst) });
            }
        }),
        Builtin::Cast {
            src,
            src_dtype,
            dst,
            dst_dtype,
        } => {
            if dst.same_as(src) {
                // In place (same element size): read everything first.
                // SAFETY: see above; the copy ends the shared view before the write.
                let copy: Vec<u8> = unsafe { view::<u8>(src) }.to_vec();
                with_type!(*src_dtype, S => with_type!(*dst_dtype, D => {
                    let s: Vec<S> = copy
                        .chunks_exact(std::mem::size_of::<S>())
                        .map(bytemuck::pod_read_unaligned)
                        .collect();
                    // SAFETY: see above.
                    ops::cast::<S, D>(&s, unsafe { view_mut(dst) });
                }));
            } else {
                with_type!(*src_dtype, S => with_type!(*dst_dtype, D => {
                    // SAFETY: see above; disjoint.
                    ops::cast::<S, D>(unsafe { view(src) }, unsafe { view_mut(dst) });
                }));
            }
        }
    }
    Ok(())
}
