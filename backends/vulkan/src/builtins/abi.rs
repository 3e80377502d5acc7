//! The interface between the builtin-operation shaders and the code that dispatches
//! them. Both sides follow exactly this; change it in both places at once.
//!
//! # Bindings (descriptor set 0, all storage buffers)
//! | binding | operation use | WGSL declaration |
//! |---|---|---|
//! | 0 | destination (written) | `var<storage, read_write>` |
//! | 1 | first source: `a`, `src` | `var<storage, read>` |
//! | 2 | second source: `b` | `var<storage, read>` |
//!
//! Only the bindings an operation uses are declared (fill: 0; accumulate, scale,
//! cast: 0 and 1; binary: 0, 1, 2). The dispatcher binds each range starting at a
//! byte offset rounded down to [`BINDING_ALIGN`] and passes the remainder in the push
//! constants, so a shader never assumes its data starts at index 0.
//!
//! A binding may alias another one exactly (an in-place operation binds the same
//! range twice); each invocation reads its element(s) before writing them.
//!
//! # Element storage
//! - **Native** dtypes are declared as arrays of their WGSL type: `f32`, `i32`, `f64`
//!   (needs the device's `shaderFloat64`), `i64` (needs `shaderInt64`). The push
//!   constant offsets are in **elements** from the binding start.
//! - **Packed** dtypes (`u8`, `f16`, `bf16`) are declared as `array<u32>` for sources
//!   and `array<atomic<u32>>` for the destination; the offsets are in **bytes** from
//!   the binding start. One invocation owns one destination word; in a word that the
//!   range covers only in part, it changes only the covered lanes, with `atomicAnd` /
//!   `atomicOr`, so that bytes outside the range are never written (another stream may
//!   own them).
//!
//! # Push constants ([`PushConstants`], 32 bytes, `var<immediate>` in WGSL)
//! ```wgsl
//! struct Params {
//!     dst_offset: u32,   // elements (native) or bytes (packed) into binding 0
//!     a_offset: u32,     // same, into binding 1
//!     b_offset: u32,     // same, into binding 2
//!     count: u32,        // number of elements
//!     scalar_lo: u32,    // fill value / scale factor: low 32 bits of its
//!     scalar_hi: u32,    //   little-endian representation (high 32 bits for 8-byte dtypes)
//!     _pad0: u32,
//!     _pad1: u32,
//! }
//! ```
//!
//! # Dispatch
//! Workgroup size [`WORKGROUP_SIZE`] in x. The dispatcher launches
//! `min(ceil(units / WORKGROUP_SIZE), MAX_GROUPS)` workgroups in x, where a unit is an
//! element (native destination) or a destination word (packed destination); shaders
//! loop with a grid stride of `num_workgroups.x * WORKGROUP_SIZE` until all units are
//! done. The entry point is named [`ENTRY_POINT`].

/// Bytes to which a binding's start is rounded down (a multiple of every device's
/// `minStorageBufferOffsetAlignment` we accept, and of every element size).
pub const BINDING_ALIGN: u64 = 256;

/// Invocations per workgroup.
pub const WORKGROUP_SIZE: u32 = 64;

/// The most workgroups launched in x for one builtin dispatch.
pub const MAX_GROUPS: u32 = 65_535;

/// The entry point of every builtin shader.
pub const ENTRY_POINT: &str = "main";

/// The push constants of every builtin shader, as the dispatcher writes them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PushConstants {
    /// Destination offset: elements (native dtype) or bytes (packed dtype).
    pub dst_offset: u32,
    /// First source offset, in the first source's unit.
    pub a_offset: u32,
    /// Second source offset, in its unit.
    pub b_offset: u32,
    /// Number of elements.
    pub count: u32,
    /// Low 32 bits of the scalar operand (fill value, scale factor).
    pub scalar_lo: u32,
    /// High 32 bits of the scalar operand (8-byte dtypes).
    pub scalar_hi: u32,
    /// Padding to 32 bytes.
    pub pad: [u32; 2],
}

/// Which builtin shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShaderKind {
    /// `dst[i] = scalar`.
    Fill(xpu_hal::DType),
    /// `dst[i] = a[i] op b[i]`.
    Binary(xpu_hal::BinaryOp, xpu_hal::DType),
    /// `dst[i] = dst[i] op a[i]` (binding 1 is the source).
    Accumulate(xpu_hal::BinaryOp, xpu_hal::DType),
    /// `dst[i] = a[i] * scalar`.
    Scale(xpu_hal::DType),
    /// `dst[i] = a[i] as dst dtype`: (source dtype, destination dtype).
    Cast(xpu_hal::DType, xpu_hal::DType),
}

/// Whether `dtype` is stored packed in 32-bit words (see the module docs).
pub const fn is_packed(dtype: xpu_hal::DType) -> bool {
    matches!(
        dtype,
        xpu_hal::DType::U8 | xpu_hal::DType::F16 | xpu_hal::DType::BF16
    )
}

/// Shader features the device offers, which decide the dtypes it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ShaderFeatures {
    /// `shaderFloat64`: `f64` builtins.
    pub float64: bool,
    /// `shaderInt64`: `i64` builtins.
    pub int64: bool,
}

impl ShaderFeatures {
    /// The dtypes builtin operations support with these features.
    pub fn dtypes(&self) -> Vec<xpu_hal::DType> {
        use xpu_hal::DType;
        let mut v = vec![DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8];
        if self.float64 {
            v.insert(1, DType::F64);
        }
        if self.int64 {
            v.push(DType::I64);
        }
        v
    }
}
