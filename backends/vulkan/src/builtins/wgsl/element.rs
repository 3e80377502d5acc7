//! How each dtype looks in a shader: its storage, the type it is computed in, and the
//! WGSL expressions that decode, combine, encode and cast its values.
//!
//! Three forms of a value appear in the kernels:
//! - **storage**: what an array element holds: the WGSL type itself for native dtypes,
//!   the lane's bits (in the low bits of a `u32`) for packed ones;
//! - **work**: what arithmetic runs on: `f32` for `f16`/`bf16`, `u32` holding 0..=255
//!   for `u8`, the dtype's own type otherwise;
//! - the **scalar** operand, assembled from the push constants.

use xpu_hal::{BinaryOp, DType};

/// The layout of a packed dtype's elements inside 32-bit words.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lane {
    /// Bytes per element (1 or 2).
    pub size: u32,
    /// `log2(size)`.
    pub size_log2: u32,
    /// The element's bits, as a WGSL `u32` literal.
    pub mask: &'static str,
}

/// The lane layout of `dtype`, or `None` for a native dtype.
pub(super) fn lane(dtype: DType) -> Option<Lane> {
    match dtype {
        DType::U8 => Some(Lane {
            size: 1,
            size_log2: 0,
            mask: "0xFFu",
        }),
        DType::F16 | DType::BF16 => Some(Lane {
            size: 2,
            size_log2: 1,
            mask: "0xFFFFu",
        }),
        DType::F32 | DType::F64 | DType::I32 | DType::I64 => None,
    }
}

/// The WGSL type of one storage form value.
pub(super) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 | DType::U8 => "u32",
    }
}

/// The WGSL type arithmetic on `dtype` runs in.
pub(super) fn work_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "u32",
    }
}

/// The work value of the storage value `raw` (exact).
pub(super) fn decode(dtype: DType, raw: &str) -> String {
    match dtype {
        DType::F16 => format!("f32_from_f16({raw})"),
        DType::BF16 => format!("f32_from_bf16({raw})"),
        DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::U8 => raw.to_string(),
    }
}

/// The storage value of the work value `v`: rounded to nearest-even (`f16`, `bf16`),
/// wrapped (`u8`).
pub(super) fn encode(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F16 => format!("f16_from_f32({v})"),
        DType::BF16 => format!("bf16_from_f32({v})"),
        DType::U8 => format!("(({v}) & 0xFFu)"),
        DType::F32 | DType::F64 | DType::I32 | DType::I64 => v.to_string(),
    }
}

/// The scalar operand (`scalar_lo`, `scalar_hi`: its little-endian bits) as a work value.
pub(super) fn scalar(dtype: DType) -> String {
    let lo = "params.scalar_lo";
    let hi = "params.scalar_hi";
    match dtype {
        DType::F32 => format!("bitcast<f32>({lo})"),
        DType::F64 => format!("f64_from_bits({lo}, {hi})"),
        DType::I32 => format!("bitcast<i32>({lo})"),
        DType::I64 => format!("i64_from_bits({lo}, {hi})"),
        DType::U8 => format!("({lo} & 0xFFu)"),
        DType::F16 => format!("f32_from_f16({lo} & 0xFFFFu)"),
        DType::BF16 => format!("f32_from_bf16({lo} & 0xFFFFu)"),
    }
}

/// `a op b` on work values of `dtype` (the result is a work value; `u8` results are
/// wrapped by [`encode`]).
pub(super) fn combine(op: BinaryOp, dtype: DType, a: &str, b: &str) -> String {
    let float_fn = match dtype {
        DType::F64 => "f64",
        _ => "f32",
    };
    match (op, dtype.is_float()) {
        (BinaryOp::Sum, _) => format!("({a} + {b})"),
        (BinaryOp::Prod, _) => format!("({a} * {b})"),
        (BinaryOp::Min, true) => format!("min_{float_fn}({a}, {b})"),
        (BinaryOp::Max, true) => format!("max_{float_fn}({a}, {b})"),
        (BinaryOp::Min, false) => format!("select({b}, {a}, {a} < {b})"),
        (BinaryOp::Max, false) => format!("select({b}, {a}, {a} > {b})"),
    }
}

/// The work value `x` of `src` converted to a storage value of `dst`, with Rust `as`
/// semantics: integers wrap, floats saturate into integers (NaN → 0), and every
/// conversion to a float rounds once to nearest-even.
pub(super) fn cast(src: DType, dst: DType, x: &str) -> String {
    use DType::*;
    match dst {
        I32 | I64 | U8 => cast_to_int(src, dst, x),
        F64 => match src {
            F64 => x.to_string(),
            F32 | F16 | BF16 => format!("f64_from_f32({x})"),
            I32 | U8 => format!("f64({x})"),
            I64 => format!("f64_from_i64({x})"),
        },
        // A copy: the host's `f32 as f32` keeps even a signaling NaN's bits.
        F32 if src == F32 => x.to_string(),
        F32 | F16 | BF16 => {
            let unpacked = match src {
                F32 | F16 | BF16 => format!("unpack_f32(bitcast<u32>({x}))"),
                F64 => format!("unpack_f64({x})"),
                I32 => format!("unpack_i32({x})"),
                I64 => format!("unpack_i64({x})"),
                U8 => format!("unpack_u32(false, {x})"),
            };
            match dst {
                F32 => format!("bitcast<f32>(encode({unpacked}, 23u, 8u))"),
                F16 => format!("encode({unpacked}, 10u, 5u)"),
                _ => format!("encode({unpacked}, 7u, 8u)"),
            }
        }
    }
}

/// [`cast`] into an integer dtype.
fn cast_to_int(src: DType, dst: DType, x: &str) -> String {
    use DType::*;
    let float = match src {
        F32 | F16 | BF16 => Some("f32"),
        F64 => Some("f64"),
        I32 | I64 | U8 => None,
    };
    if let Some(from) = float {
        let to = match dst {
            I64 => "i64",
            U8 => "u8",
            _ => "i32",
        };
        return format!("{to}_from_{from}({x})");
    }
    match (src, dst) {
        (I32, I64) | (U8, I64) => format!("i64({x})"),
        (U8, I32) => format!("i32({x})"),
        (I32, U8) => format!("(bitcast<u32>({x}) & 0xFFu)"),
        (I64, I32) => format!("i32_from_i64({x})"),
        (I64, U8) => format!("u8_from_i64({x})"),
        // The same dtype.
        _ => x.to_string(),
    }
}
