//! WGSL source of the builtin operations' shaders, following [`super::abi`] exactly.
//!
//! [`source`] writes the complete shader text of one [`ShaderKind`], to compile with
//! naga's WGSL front end and SPIR-V writer. Validation needs `Capabilities::IMMEDIATES`
//! (push constants), plus `FLOAT64` with `shaderFloat64` and `SHADER_INT64` with
//! `shaderInt64`; with `shaderInt64`, shaders that handle `f64` reach its bits through
//! `u64`, so their SPIR-V declares `Int64` even when no `i64` data is involved.
//!
//! # Design
//! - [`kernel`] is the frame every shader shares: the push constants (`var<immediate>`),
//!   the bindings the kind uses, a loader per source, one `element(i)` function and the
//!   grid-stride entry point (one unit per element for a native destination, per word
//!   with atomics for a packed one).
//! - [`element`] says how each dtype is stored and computed and writes the WGSL
//!   expressions that decode, combine, encode and cast its values.
//! - [`library`] holds the WGSL helper functions those expressions call.
//!
//! # Arithmetic (the HAL's rules)
//! - Integers wrap (`i32`/`i64` arithmetic wraps in WGSL; `u8` is computed in `u32` and
//!   masked to 8 bits).
//! - `f16` and `bf16` are never WGSL types: their bits are packed in `u32` words, and
//!   they are computed in `f32` (decoded exactly, encoded once to nearest-even with
//!   integer arithmetic).
//! - `min`/`max` on floats return the other operand when one is NaN, with explicit NaN
//!   tests (WGSL leaves `min`/`max` on NaN undefined).
//! - Casts follow Rust's `as`: float → integer truncates toward zero and saturates, NaN
//!   → 0 (decided by the shader, not left to the GPU's conversion); integer → narrower
//!   integer wraps; every conversion to a float rounds once to nearest-even, computed
//!   with integer arithmetic (`i64` → `f32`, `f64` → `f16` and such never round twice).
//!   A NaN becomes a quiet NaN with the same sign and the leading bits of its payload
//!   (an `f32` → `f32` or `f64` → `f64` cast is a plain copy).
//!
//! Float additions and multiplications (in `f32` for `f16`/`bf16`) are the device's,
//! which must be IEEE 754 (round to nearest-even, subnormals kept) for results to match
//! the host's bit for bit; the payload of a NaN they produce is the device's. `min` and
//! `max` of `-0.0` and `+0.0` return the first operand.

mod element;
mod kernel;
pub(crate) mod library;
#[cfg(test)]
mod tests;

use super::abi::{ShaderFeatures, ShaderKind};

/// The complete WGSL source of the builtin shader `kind` on a device with `features`.
///
/// # Errors
/// When `kind` involves a dtype that `features` do not support (see
/// [`ShaderFeatures::dtypes`]).
pub fn source(kind: ShaderKind, features: ShaderFeatures) -> Result<String, String> {
    let supported = features.dtypes();
    if let Some(missing) = kernel::dtypes(kind)
        .into_iter()
        .find(|d| !supported.contains(d))
    {
        let feature = match missing {
            xpu_hal::DType::F64 => "shaderFloat64",
            xpu_hal::DType::I64 => "shaderInt64",
            _ => "a feature no device has",
        };
        return Err(format!(
            "builtin shader {kind:?}: dtype {missing} is not supported by this device \
             (it needs {feature})"
        ));
    }
    Ok(kernel::shader(kind, features.int64))
}
