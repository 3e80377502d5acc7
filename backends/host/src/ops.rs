//! Running a validated [`BuiltinOp`] on host device memory, with the HAL's reference
//! arithmetic ([`xpu_hal::reference`]).

use xpu_hal::backend::BuiltinOp;
use xpu_hal::reference::{
    accumulate, binary, cast, combine_with_self, fill, scale, scale_in_place, Element,
};
use xpu_hal::{DType, Error, Result, Scalar};

use crate::memory::Region;

/// The HAL's dtypes, for this module.
macro_rules! with_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        xpu_hal::with_dtype!(DType, $dtype, $T => $body)
    };
}

fn scalar_as<T: Element>(s: Scalar) -> Result<T> {
    T::from_scalar(s).ok_or_else(|| {
        Error::backend_message(
            "host",
            format!("internal error: scalar {s} does not match the operation's dtype"),
        )
    })
}

/// Executes a validated builtin operation on host device memory.
pub(crate) fn execute(op: &BuiltinOp) -> Result<()> {
    // SAFETY (for every `typed`/`typed_mut` below): the HAL guarantees that slices are
    // in bounds, element-aligned, and identical or disjoint; identical ranges are
    // handled by the in-place variants so no two live references alias a written range.
    // This runs on the stream's worker thread, which is the only one touching these
    // bytes by the HAL's ordering contract.
    match op {
        BuiltinOp::Fill { dst, value } => {
            let dst = Region::from_raw(dst)?;
            with_type!(value.dtype(), T => {
                let v: T = scalar_as(*value)?;
                // SAFETY: see above.
                fill(unsafe { dst.typed_mut::<T>() }, v);
            });
        }
        BuiltinOp::Binary {
            op,
            dtype,
            a,
            b,
            dst,
        } => {
            let (a, b, dst) = (
                Region::from_raw(a)?,
                Region::from_raw(b)?,
                Region::from_raw(dst)?,
            );
            with_type!(*dtype, T => {
                match (dst.same_as(&a), dst.same_as(&b)) {
                    // SAFETY: see above; one mutable view of the single range.
                    (true, true) => combine_with_self(*op, unsafe { dst.typed_mut::<T>() }),
                    // SAFETY: see above; `b` is disjoint from `dst`.
                    (true, false) => accumulate(*op, unsafe { dst.typed_mut::<T>() }, unsafe { b.typed::<T>() }),
                    // SAFETY: see above; `a` is disjoint from `dst` (every operator commutes).
                    (false, true) => accumulate(*op, unsafe { dst.typed_mut::<T>() }, unsafe { a.typed::<T>() }),
                    // SAFETY: see above; all disjoint from `dst` (a and b may coincide: both read-only).
                    (false, false) => binary(*op, unsafe { a.typed::<T>() }, unsafe { b.typed::<T>() }, unsafe { dst.typed_mut::<T>() }),
                }
            });
        }
        BuiltinOp::Accumulate {
            op,
            dtype,
            dst,
            src,
        } => {
            let (dst, src) = (Region::from_raw(dst)?, Region::from_raw(src)?);
            with_type!(*dtype, T => {
                if dst.same_as(&src) {
                    // SAFETY: see above.
                    combine_with_self(*op, unsafe { dst.typed_mut::<T>() });
                } else {
                    // SAFETY: see above; disjoint.
                    accumulate(*op, unsafe { dst.typed_mut::<T>() }, unsafe { src.typed::<T>() });
                }
            });
        }
        BuiltinOp::Scale { alpha, src, dst } => {
            let (src, dst) = (Region::from_raw(src)?, Region::from_raw(dst)?);
            with_type!(alpha.dtype(), T => {
                let alpha: T = scalar_as(*alpha)?;
                if dst.same_as(&src) {
                    // SAFETY: see above.
                    scale_in_place(alpha, unsafe { dst.typed_mut::<T>() });
                } else {
                    // SAFETY: see above; disjoint.
                    scale(alpha, unsafe { src.typed::<T>() }, unsafe { dst.typed_mut::<T>() });
                }
            });
        }
        BuiltinOp::Cast {
            src,
            src_dtype,
            dst,
            dst_dtype,
        } => {
            let (src, dst) = (Region::from_raw(src)?, Region::from_raw(dst)?);
            if dst.same_as(&src) {
                // In place: read everything first (same element size, so same count).
                // SAFETY: see above; the copy ends the shared borrow before the write.
                let copy = unsafe { src.bytes() }.to_vec();
                with_type!(*src_dtype, S => with_type!(*dst_dtype, D => {
                    let s: &[S] = bytemuck::try_cast_slice(&copy).map_err(|e| {
                        Error::backend_message("host", format!("internal error: {e}"))
                    })?;
                    // SAFETY: see above.
                    cast(s, unsafe { dst.typed_mut::<D>() });
                }));
            } else {
                with_type!(*src_dtype, S => with_type!(*dst_dtype, D => {
                    // SAFETY: see above; disjoint.
                    cast(unsafe { src.typed::<S>() }, unsafe { dst.typed_mut::<D>() });
                }));
            }
        }
    }
    Ok(())
}
