//! The [`Element`] trait: per-dtype arithmetic with the HAL's rules (integers wrap,
//! `f16`/`bf16` computed in `f32`, `min`/`max` ignore NaN, casts as Rust's `as`).

use crate::Scalar;
use half::{bf16, f16};

/// A value widened without loss (except `i64` beyond 2^53 when it becomes a float), the
/// common currency of casts.
#[derive(Clone, Copy)]
pub enum Wide {
    /// An integer value.
    Int(i64),
    /// A floating-point value.
    Float(f64),
}

/// One dtype's element type and arithmetic.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a * b`.
    fn mul(a: Self, b: Self) -> Self;
    /// The smaller (a NaN operand is ignored).
    fn min(a: Self, b: Self) -> Self;
    /// The larger (a NaN operand is ignored).
    fn max(a: Self, b: Self) -> Self;
    /// The value of a scalar of this dtype, if it is one.
    fn from_scalar(s: Scalar) -> Option<Self>;
    /// The value widened for a cast.
    fn widen(self) -> Wide;
    /// The value cast from a widened one, with Rust `as` semantics.
    fn narrow(w: Wide) -> Self;
}

macro_rules! int_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            fn from_scalar(s: Scalar) -> Option<Self> {
                match s {
                    Scalar::$variant(v) => Some(v),
                    _ => None,
                }
            }
            #[inline(always)]
            fn widen(self) -> Wide {
                Wide::Int(self as i64)
            }
            #[inline(always)]
            fn narrow(w: Wide) -> Self {
                match w {
                    Wide::Int(v) => v as $t,
                    Wide::Float(v) => v as $t,
                }
            }
        }
    };
}

int_element!(i32, I32);
int_element!(i64, I64);
int_element!(u8, U8);

macro_rules! float_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                <$t>::min(a, b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                <$t>::max(a, b)
            }
            fn from_scalar(s: Scalar) -> Option<Self> {
                match s {
                    Scalar::$variant(v) => Some(v),
                    _ => None,
                }
            }
            #[inline(always)]
            fn widen(self) -> Wide {
                Wide::Float(self as f64)
            }
            #[inline(always)]
            fn narrow(w: Wide) -> Self {
                match w {
                    Wide::Int(v) => v as $t,
                    Wide::Float(v) => v as $t,
                }
            }
        }
    };
}

float_element!(f32, F32);
float_element!(f64, F64);

macro_rules! half_element {
    ($t:ty, $variant:ident, $from_f64:path) => {
        impl Element for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() * b.to_f32())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32().min(b.to_f32()))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32().max(b.to_f32()))
            }
            fn from_scalar(s: Scalar) -> Option<Self> {
                match s {
                    Scalar::$variant(v) => Some(v),
                    _ => None,
                }
            }
            #[inline(always)]
            fn widen(self) -> Wide {
                Wide::Float(self.to_f64())
            }
            #[inline(always)]
            fn narrow(w: Wide) -> Self {
                match w {
                    Wide::Int(v) => $from_f64(crate::dtype::f64_round_to_odd_from_i64(v)),
                    Wide::Float(v) => $from_f64(v),
                }
            }
        }
    };
}

half_element!(f16, F16, crate::dtype::f16_from_f64);
half_element!(bf16, BF16, crate::dtype::bf16_from_f64);
