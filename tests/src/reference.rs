//! The arithmetic of the builtin operations, computed on the host independently of
//! any backend: what a device's results are compared with.
//!
//! The rules are those of [`xpu_hal::dtype`]: integers wrap; `f16` and `bf16` are
//! computed in `f32` and rounded once to nearest-even; `min`/`max` ignore a NaN operand
//! when the other is a number; casts follow Rust's `as` (float → integer truncates and
//! saturates, NaN → 0; integer → narrower integer wraps; anything → float rounds to
//! nearest).

use xpu_hal::{bf16, f16, BinaryOp, DType, Scalar};

fn min_num<T: PartialOrd + Copy>(a: T, b: T, a_nan: bool, b_nan: bool) -> T {
    if a_nan {
        b
    } else if b_nan || a <= b {
        a
    } else {
        b
    }
}

fn max_num<T: PartialOrd + Copy>(a: T, b: T, a_nan: bool, b_nan: bool) -> T {
    if a_nan {
        b
    } else if b_nan || a >= b {
        a
    } else {
        b
    }
}

fn float_op(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Sum => a + b,
        BinaryOp::Prod => a * b,
        BinaryOp::Min => min_num(a, b, a.is_nan(), b.is_nan()),
        BinaryOp::Max => max_num(a, b, a.is_nan(), b.is_nan()),
    }
}

fn double_op(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Sum => a + b,
        BinaryOp::Prod => a * b,
        BinaryOp::Min => min_num(a, b, a.is_nan(), b.is_nan()),
        BinaryOp::Max => max_num(a, b, a.is_nan(), b.is_nan()),
    }
}

macro_rules! int_op {
    ($op:expr, $a:expr, $b:expr) => {
        match $op {
            BinaryOp::Sum => $a.wrapping_add($b),
            BinaryOp::Prod => $a.wrapping_mul($b),
            BinaryOp::Min => $a.min($b),
            BinaryOp::Max => $a.max($b),
        }
    };
}

/// `a op b`. `None` when the operands' dtypes differ.
pub(crate) fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    Some(match (a, b) {
        (Scalar::F32(a), Scalar::F32(b)) => Scalar::F32(float_op(op, a, b)),
        (Scalar::F64(a), Scalar::F64(b)) => Scalar::F64(double_op(op, a, b)),
        (Scalar::F16(a), Scalar::F16(b)) => {
            Scalar::F16(f16::from_f32(float_op(op, a.to_f32(), b.to_f32())))
        }
        (Scalar::BF16(a), Scalar::BF16(b)) => {
            Scalar::BF16(bf16::from_f32(float_op(op, a.to_f32(), b.to_f32())))
        }
        (Scalar::I32(a), Scalar::I32(b)) => Scalar::I32(int_op!(op, a, b)),
        (Scalar::I64(a), Scalar::I64(b)) => Scalar::I64(int_op!(op, a, b)),
        (Scalar::U8(a), Scalar::U8(b)) => Scalar::U8(int_op!(op, a, b)),
        _ => return None,
    })
}

/// `x * alpha`. `None` when the dtypes differ.
pub(crate) fn scale(x: Scalar, alpha: Scalar) -> Option<Scalar> {
    binary(BinaryOp::Prod, x, alpha)
}

/// An exact view of an element: integers as `i64` (every supported integer fits), floats
/// as `f64` (every supported float widens exactly).
enum Wide {
    Int(i64),
    Float(f64),
}

fn widen(x: Scalar) -> Wide {
    match x {
        Scalar::F32(v) => Wide::Float(v as f64),
        Scalar::F64(v) => Wide::Float(v),
        Scalar::F16(v) => Wide::Float(v.to_f64()),
        Scalar::BF16(v) => Wide::Float(v.to_f64()),
        Scalar::I32(v) => Wide::Int(v as i64),
        Scalar::I64(v) => Wide::Int(v),
        Scalar::U8(v) => Wide::Int(v as i64),
    }
}

/// `v` rounded to `f64` toward zero, with the last bit set when inexact ("round to
/// odd"). Rounding to odd first and to nearest-even later, with at least two bits to
/// spare in between, is the same as rounding once to nearest-even.
fn i64_to_f64_odd(v: i64) -> f64 {
    let t = v as f64;
    let back = t as i128;
    if back == v as i128 {
        return t;
    }
    let toward_zero = if back.unsigned_abs() > (v as i128).unsigned_abs() {
        f64::from_bits(t.to_bits() - 1)
    } else {
        t
    };
    f64::from_bits(toward_zero.to_bits() | 1)
}

/// `v` rounded to `f32` to odd (see [`i64_to_f64_odd`]).
fn f64_to_f32_odd(v: f64) -> f32 {
    if v.is_nan() {
        return f32::NAN;
    }
    let t = v as f32;
    if t as f64 == v {
        return t;
    }
    let toward_zero = if (t as f64).abs() > v.abs() {
        f32::from_bits(t.to_bits() - 1)
    } else {
        t
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// `v` rounded once to nearest-even `f16`.
fn f64_to_f16(v: f64) -> f16 {
    f16::from_f32(f64_to_f32_odd(v))
}

/// `v` rounded once to nearest-even `bf16`.
fn f64_to_bf16(v: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_odd(v))
}

/// `x as dtype` under the cast rules.
pub(crate) fn cast(x: Scalar, dtype: DType) -> Scalar {
    match (widen(x), dtype) {
        // Float sources: the widened f64 is exact, so one rounding or one truncation.
        (Wide::Float(v), DType::F32) => Scalar::F32(v as f32),
        (Wide::Float(v), DType::F64) => Scalar::F64(v),
        (Wide::Float(v), DType::F16) => Scalar::F16(f64_to_f16(v)),
        (Wide::Float(v), DType::BF16) => Scalar::BF16(f64_to_bf16(v)),
        (Wide::Float(v), DType::I32) => Scalar::I32(v as i32),
        (Wide::Float(v), DType::I64) => Scalar::I64(v as i64),
        (Wide::Float(v), DType::U8) => Scalar::U8(v as u8),
        // Integer sources.
        (Wide::Int(v), DType::F32) => Scalar::F32(v as f32),
        (Wide::Int(v), DType::F64) => Scalar::F64(v as f64),
        (Wide::Int(v), DType::F16) => Scalar::F16(f64_to_f16(i64_to_f64_odd(v))),
        (Wide::Int(v), DType::BF16) => Scalar::BF16(f64_to_bf16(i64_to_f64_odd(v))),
        (Wide::Int(v), DType::I32) => Scalar::I32(v as i32),
        (Wide::Int(v), DType::I64) => Scalar::I64(v),
        (Wide::Int(v), DType::U8) => Scalar::U8(v as u8),
    }
}

/// `v` as an element of `dtype` under the cast rules (integers wrap).
pub(crate) fn from_i64(dtype: DType, v: i64) -> Scalar {
    cast(Scalar::I64(v), dtype)
}

/// `v` as an element of `dtype` under the cast rules (floats round, integers truncate
/// and saturate).
pub(crate) fn from_f64(dtype: DType, v: f64) -> Scalar {
    cast(Scalar::F64(v), dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_rules() {
        assert_eq!(cast(Scalar::F32(f32::NAN), DType::I32), Scalar::I32(0));
        assert_eq!(cast(Scalar::F32(-2.9), DType::I32), Scalar::I32(-2));
        assert_eq!(cast(Scalar::F64(1e20), DType::I32), Scalar::I32(i32::MAX));
        assert_eq!(cast(Scalar::F64(-1e20), DType::I64), Scalar::I64(i64::MIN));
        assert_eq!(cast(Scalar::F32(-3.0), DType::U8), Scalar::U8(0));
        assert_eq!(cast(Scalar::F32(300.0), DType::U8), Scalar::U8(255));
        assert_eq!(cast(Scalar::I64(0x1_0000_0001), DType::I32), Scalar::I32(1));
        assert_eq!(cast(Scalar::I32(-1), DType::U8), Scalar::U8(255));
        assert_eq!(
            cast(Scalar::I32(16_777_217), DType::F32),
            Scalar::F32(16_777_216.0)
        );
        assert_eq!(
            cast(Scalar::I32(259), DType::BF16),
            Scalar::BF16(bf16::from_f32(260.0))
        );
        assert_eq!(
            cast(Scalar::I32(70_000), DType::F16),
            Scalar::F16(f16::INFINITY)
        );
        // 2^24 + 2^16 + 1 lies just above a bf16 tie: one rounding goes up, rounding
        // through f32 first would go down.
        assert_eq!(
            cast(Scalar::I32((1 << 24) + (1 << 16) + 1), DType::BF16),
            Scalar::BF16(bf16::from_f32(((1 << 24) + (1 << 17)) as f32))
        );
        // 1 + 2^-11 + 2^-40 lies just above an f16 tie (and is exact only in f64).
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(
            cast(Scalar::F64(v), DType::F16),
            Scalar::F16(f16::from_f32(1.0 + 1.0 / 1024.0))
        );
        assert_eq!(
            cast(Scalar::F64(1e300), DType::BF16),
            Scalar::BF16(bf16::INFINITY)
        );
        assert_eq!(
            cast(Scalar::I64(i64::MAX), DType::F16),
            Scalar::F16(f16::INFINITY)
        );
    }

    #[test]
    fn arithmetic_rules() {
        let b = |op, x, y| binary(op, x, y).unwrap();
        assert_eq!(
            b(BinaryOp::Sum, Scalar::I32(i32::MAX), Scalar::I32(1)),
            Scalar::I32(i32::MIN)
        );
        assert_eq!(
            b(BinaryOp::Prod, Scalar::U8(16), Scalar::U8(16)),
            Scalar::U8(0)
        );
        assert_eq!(
            b(BinaryOp::Min, Scalar::F32(f32::NAN), Scalar::F32(2.0)),
            Scalar::F32(2.0)
        );
        assert_eq!(
            b(BinaryOp::Max, Scalar::F64(1.0), Scalar::F64(f64::NAN)),
            Scalar::F64(1.0)
        );
        // 1 + 2^-11 is a tie in f16 and rounds to even (1.0).
        assert_eq!(
            b(
                BinaryOp::Sum,
                Scalar::F16(f16::ONE),
                Scalar::F16(f16::from_f32(1.0 / 2048.0))
            ),
            Scalar::F16(f16::ONE)
        );
        assert!(binary(BinaryOp::Sum, Scalar::F16(f16::ONE), Scalar::F32(1.0)).is_none());
    }
}
