//! The builtin operations on plain slices: the reference semantics of every backend.
//!
//! What a fill, an elementwise operation, a scale or a cast computes, element by
//! element, for every dtype ([`Element`]: integers wrap, `f16`/`bf16` are computed in
//! `f32`, `min`/`max` ignore NaN, casts follow Rust's `as`). The host backend runs its
//! builtins with these functions; other code that must compute exactly what a device
//! computes (the shared-memory collectives' reductions, a plugin that wants results bit
//! for bit equal to the host's, tests and benchmarks) uses them too, through the HAL
//! rather than through a backend.
//!
//! Each operator is matched once, outside the loop, so that every loop is a plain
//! monomorphic `zip` the compiler vectorises.

mod element;
pub mod ops;

pub use element::{Element, Wide};

pub use half::{bf16, f16};

use crate::BinaryOp;

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`, a value of the enum
/// `$enum` whose variants are named like [`crate::DType`]'s (`F32`, `F64`, `F16`,
/// `BF16`, `I32`, `I64`, `U8`) — the HAL's own, or a plugin SDK's mirror of it.
///
/// ```
/// use xpu_hal::DType;
/// let size = xpu_hal::with_dtype!(DType, DType::BF16, T => std::mem::size_of::<T>());
/// assert_eq!(size, 2);
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($enum:ident, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $enum::F32 => {
                type $T = f32;
                $body
            }
            $enum::F64 => {
                type $T = f64;
                $body
            }
            $enum::F16 => {
                type $T = $crate::reference::f16;
                $body
            }
            $enum::BF16 => {
                type $T = $crate::reference::bf16;
                $body
            }
            $enum::I32 => {
                type $T = i32;
                $body
            }
            $enum::I64 => {
                type $T = i64;
                $body
            }
            $enum::U8 => {
                type $T = u8;
                $body
            }
        }
    };
}

#[inline(always)]
fn zip3<T: Element>(a: &[T], b: &[T], dst: &mut [T], f: impl Fn(T, T) -> T) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

#[inline(always)]
fn zip2<T: Element>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f(*d, s);
    }
}

#[inline(always)]
fn map1<T: Element>(dst: &mut [T], f: impl Fn(T) -> T) {
    for d in dst.iter_mut() {
        *d = f(*d);
    }
}

/// `dst[i] = a[i] op b[i]` over the common length.
pub fn binary<T: Element>(op: BinaryOp, a: &[T], b: &[T], dst: &mut [T]) {
    match op {
        BinaryOp::Sum => zip3(a, b, dst, T::add),
        BinaryOp::Prod => zip3(a, b, dst, T::mul),
        BinaryOp::Min => zip3(a, b, dst, T::min),
        BinaryOp::Max => zip3(a, b, dst, T::max),
    }
}

/// `dst[i] = dst[i] op src[i]` over the common length.
pub fn accumulate<T: Element>(op: BinaryOp, dst: &mut [T], src: &[T]) {
    match op {
        BinaryOp::Sum => zip2(dst, src, T::add),
        BinaryOp::Prod => zip2(dst, src, T::mul),
        BinaryOp::Min => zip2(dst, src, T::min),
        BinaryOp::Max => zip2(dst, src, T::max),
    }
}

/// `dst[i] = dst[i] op dst[i]` (an operation whose operands are all the same range).
pub fn combine_with_self<T: Element>(op: BinaryOp, dst: &mut [T]) {
    match op {
        BinaryOp::Sum => map1(dst, |x| T::add(x, x)),
        BinaryOp::Prod => map1(dst, |x| T::mul(x, x)),
        BinaryOp::Min => map1(dst, |x| T::min(x, x)),
        BinaryOp::Max => map1(dst, |x| T::max(x, x)),
    }
}

/// `dst[i] = src[i] * alpha`.
pub fn scale<T: Element>(alpha: T, src: &[T], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::mul(s, alpha);
    }
}

/// `dst[i] *= alpha`.
pub fn scale_in_place<T: Element>(alpha: T, dst: &mut [T]) {
    map1(dst, |x| T::mul(x, alpha));
}

/// The factor an average over `n` ranks multiplies the sum by: `1/n` in the dtype's
/// own precision for floating-point dtypes; for integers an `f64`, the next one above
/// `1/n`, which the sum is multiplied by through `f64` so that exact quotients never
/// fall just below an integer before the truncating cast back (exact while the sum's
/// magnitude is below 2^51 / n).
pub fn avg_factor(dtype: crate::DType, n: usize) -> crate::Scalar {
    use crate::{dtype, DType, Scalar};
    let n = n as f64;
    match dtype {
        DType::F32 => Scalar::F32((1.0 / n) as f32),
        DType::F64 => Scalar::F64(1.0 / n),
        DType::F16 => Scalar::F16(dtype::f16_from_f64(1.0 / n)),
        DType::BF16 => Scalar::BF16(dtype::bf16_from_f64(1.0 / n)),
        DType::I32 | DType::I64 | DType::U8 => Scalar::F64((1.0 / n).next_up()),
    }
}

/// Turns sums over `n` ranks into their average in place, as [`avg_factor`] says:
/// `dst` holds elements of `dtype`.
pub fn average<T: Element>(dtype: crate::DType, n: usize, dst: &mut [T]) {
    let factor = avg_factor(dtype, n);
    match (T::from_scalar(factor), factor) {
        (Some(alpha), _) => scale_in_place(alpha, dst),
        (None, crate::Scalar::F64(f)) => {
            for d in dst.iter_mut() {
                let wide = f64::narrow(d.widen()) * f;
                *d = T::narrow(Wide::Float(wide));
            }
        }
        // Every dtype's factor is its own scalar or an f64.
        (None, _) => {}
    }
}

/// `dst[i] = value`.
pub fn fill<T: Element>(dst: &mut [T], value: T) {
    dst.fill(value);
}

/// `dst[i] = src[i] as D`.
pub fn cast<S: Element, D: Element>(src: &[S], dst: &mut [D]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = D::narrow(s.widen());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_wrap() {
        let mut d = [0i32; 2];
        binary(BinaryOp::Sum, &[i32::MAX, 1], &[1, 2], &mut d);
        assert_eq!(d, [i32::MIN, 3]);
        let mut u = [200u8];
        accumulate(BinaryOp::Sum, &mut u, &[100]);
        assert_eq!(u, [44]);
    }

    #[test]
    fn min_max_ignore_nan() {
        let mut d = [0f32; 2];
        binary(BinaryOp::Min, &[f32::NAN, 1.0], &[2.0, f32::NAN], &mut d);
        assert_eq!(d, [2.0, 1.0]);
    }

    #[test]
    fn casts_follow_as() {
        let mut d = [0i32; 4];
        cast(&[1.9f32, -1.9, f32::NAN, 1e20], &mut d);
        assert_eq!(d, [1, -1, 0, i32::MAX]);
        let mut u = [0u8; 2];
        cast(&[-1i64, 256], &mut u);
        assert_eq!(u, [255, 0]);
        let mut h = [f16::ZERO; 1];
        cast(&[3i32], &mut h);
        assert_eq!(h[0].to_f32(), 3.0);
    }

    #[test]
    fn half_arithmetic_rounds_once() {
        let mut d = [bf16::ZERO];
        binary(
            BinaryOp::Prod,
            &[bf16::from_f32(3.0)],
            &[bf16::from_f32(0.5)],
            &mut d,
        );
        assert_eq!(d[0].to_f32(), 1.5);
    }
}
