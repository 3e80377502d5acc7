//! Element types ([`DType`]), typed scalar values ([`Scalar`]) and the builtin
//! elementwise operators ([`BinaryOp`]).
//!
//! Arithmetic rules every backend follows (the host backend is the reference):
//! - Integers wrap on overflow (two's complement), as GPU integer arithmetic does.
//! - `f16` and `bf16` are computed in `f32` and rounded to nearest-even once per element.
//! - `min`/`max` on floats ignore a NaN operand when the other is a number (IEEE 754
//!   `minNum`/`maxNum`, like `fminf`).
//! - Casts follow Rust's `as`: float → integer truncates toward zero and saturates
//!   (NaN → 0); integer → narrower integer wraps; anything → float rounds once to
//!   nearest, ties to even (never through an intermediate rounding).

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::Error;

/// `value` rounded to `f32` with round-to-odd: truncated toward zero, with the lowest
/// mantissa bit set when anything was dropped. Rounding that result once more to a
/// format with at least two fewer mantissa bits (`f16`, `bf16`) gives the correctly
/// rounded value, where rounding through a nearest-even `f32` can round twice.
pub fn f32_round_to_odd(value: f64) -> f32 {
    let nearest = value as f32;
    if !nearest.is_finite() || f64::from(nearest) == value {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if f64::from(nearest).abs() > value.abs() {
        // Rounded away from zero: step back toward zero (sign-magnitude bits).
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `value` rounded to `f64` with round-to-odd (see [`f32_round_to_odd`]): exact up to
/// 2^53, and for larger magnitudes safe to round again to any format of at most 51
/// significand bits, so that `i64` → `f16`/`bf16` rounds once.
pub fn f64_round_to_odd_from_i64(value: i64) -> f64 {
    let magnitude = value.unsigned_abs();
    if magnitude < (1u64 << 53) {
        return value as f64;
    }
    let top = 63 - magnitude.leading_zeros();
    let shift = top - 52;
    let sticky = u64::from(magnitude & ((1u64 << shift) - 1) != 0);
    // 53 significant bits, the lowest forced to 1 when anything was dropped: exact in f64.
    let kept = (magnitude >> shift) | sticky;
    let result = kept as f64 * 2f64.powi(shift as i32);
    if value < 0 {
        -result
    } else {
        result
    }
}

/// `value` correctly rounded (to nearest, ties to even) to `f16`.
pub fn f16_from_f64(value: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(value))
}

/// `value` correctly rounded (to nearest, ties to even) to `bf16`.
pub fn bf16_from_f64(value: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(value))
}

/// The element types builtin operations understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of an `f32`).
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The lowercase name used in reports and on the command line (`"f32"`, `"bf16"` …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown dtype `{s}`; expected one of f32, f64, f16, bf16, i32, i64, u8"
                ))
            })
    }
}

/// One value of a known dtype: the fill value, or the factor of a scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// An `f32` value.
    F32(f32),
    /// An `f64` value.
    F64(f64),
    /// An `f16` value.
    F16(f16),
    /// A `bf16` value.
    BF16(bf16),
    /// An `i32` value.
    I32(i32),
    /// An `i64` value.
    I64(i64),
    /// A `u8` value.
    U8(u8),
}

impl Scalar {
    /// The dtype of this value.
    pub const fn dtype(&self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::F64(_) => DType::F64,
            Scalar::F16(_) => DType::F16,
            Scalar::BF16(_) => DType::BF16,
            Scalar::I32(_) => DType::I32,
            Scalar::I64(_) => DType::I64,
            Scalar::U8(_) => DType::U8,
        }
    }

    /// `value` converted to `dtype` with the cast rules in the module docs.
    pub fn from_f64(dtype: DType, value: f64) -> Scalar {
        match dtype {
            DType::F32 => Scalar::F32(value as f32),
            DType::F64 => Scalar::F64(value),
            DType::F16 => Scalar::F16(f16_from_f64(value)),
            DType::BF16 => Scalar::BF16(bf16_from_f64(value)),
            DType::I32 => Scalar::I32(value as i32),
            DType::I64 => Scalar::I64(value as i64),
            DType::U8 => Scalar::U8(value as u8),
        }
    }

    /// The value widened to `f64` (exact for every dtype but large `i64`).
    pub fn to_f64(&self) -> f64 {
        match *self {
            Scalar::F32(v) => v as f64,
            Scalar::F64(v) => v,
            Scalar::F16(v) => v.to_f64(),
            Scalar::BF16(v) => v.to_f64(),
            Scalar::I32(v) => v as f64,
            Scalar::I64(v) => v as f64,
            Scalar::U8(v) => v as f64,
        }
    }

    /// The little-endian bytes of the value (as it is stored in device memory).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match *self {
            Scalar::F32(v) => v.to_le_bytes().to_vec(),
            Scalar::F64(v) => v.to_le_bytes().to_vec(),
            Scalar::F16(v) => v.to_le_bytes().to_vec(),
            Scalar::BF16(v) => v.to_le_bytes().to_vec(),
            Scalar::I32(v) => v.to_le_bytes().to_vec(),
            Scalar::I64(v) => v.to_le_bytes().to_vec(),
            Scalar::U8(v) => vec![v],
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::F32(v) => write!(f, "{v}f32"),
            Scalar::F64(v) => write!(f, "{v}f64"),
            Scalar::F16(v) => write!(f, "{v}f16"),
            Scalar::BF16(v) => write!(f, "{v}bf16"),
            Scalar::I32(v) => write!(f, "{v}i32"),
            Scalar::I64(v) => write!(f, "{v}i64"),
            Scalar::U8(v) => write!(f, "{v}u8"),
        }
    }
}

/// The elementwise operators of the builtin `binary` and `accumulate` operations.
///
/// All four are commutative and associative on integers (with wrapping), which the
/// collectives rely on when they reorder a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Sum,
    /// `a * b`.
    Prod,
    /// The smaller of `a` and `b`.
    Min,
    /// The larger of `a` and `b`.
    Max,
}

impl BinaryOp {
    /// Every operator, in a stable order.
    pub const ALL: [BinaryOp; 4] = [BinaryOp::Sum, BinaryOp::Prod, BinaryOp::Min, BinaryOp::Max];

    /// The lowercase name (`"sum"` …).
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Sum => "sum",
            BinaryOp::Prod => "prod",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
        }
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_once() {
        // Just above the tie between 1 and the next bf16 (1 + 2^-7).
        let v = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
        assert_eq!(bf16_from_f64(v).to_f64(), 1.0 + 2f64.powi(-7));
        // Above the f16 tie by less than an f32 ulp: nearest-even f32 would land on
        // the tie and round down.
        let v = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16_from_f64(v).to_f64(), 1.0 + 2f64.powi(-10));
        // Exact ties still go to even.
        assert_eq!(f16_from_f64(1.0 + 2f64.powi(-11)).to_f64(), 1.0);
        assert_eq!(bf16_from_f64(-0.0).to_bits(), bf16::NEG_ZERO.to_bits());
        assert!(f16_from_f64(f64::NAN).is_nan());
        assert_eq!(f16_from_f64(1e10), f16::INFINITY);
        assert_eq!(bf16_from_f64(1e-50), bf16::ZERO);
    }

    #[test]
    fn large_integers_round_once_to_half_formats() {
        // 2^62 + 2^54 + 1: through a nearest-even f64 the +1 is lost and the value lands
        // on a bf16 tie; rounded once it is above the tie.
        let v: i64 = (1 << 62) + (1 << 54) + 1;
        assert_eq!(
            bf16_from_f64(f64_round_to_odd_from_i64(v)).to_bits(),
            0x5e81
        );
        assert_eq!(f64_round_to_odd_from_i64(1 << 53), 9007199254740992.0);
        assert_eq!(f64_round_to_odd_from_i64(-(1 << 60)), -(2f64.powi(60)));
        assert_eq!(f64_round_to_odd_from_i64(i64::MIN), -(2f64.powi(63)));
        assert_eq!(f64_round_to_odd_from_i64(12345), 12345.0);
    }
}
