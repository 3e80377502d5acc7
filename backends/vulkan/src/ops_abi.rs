//! What a raw Vulkan dispatch of the backend's standard-operation shaders needs, so
//! that a benchmark can run exactly the same shader without the backend around it
//! (`xpu bench ops` times the backend's matmul against it).
//!
//! # Shader
//! [`Dispatch::wgsl`] is the complete WGSL the backend compiles for the operation (its
//! prelude and body, byte for byte), entry point [`ENTRY_POINT`]; compiled with naga
//! as the backend does (every validation flag and capability, SPIR-V 1.3) it is the
//! same SPIR-V. It uses no push constants.
//!
//! # Bindings (descriptor set 0, all storage buffers, push descriptors)
//! Tensor `k` of [`Op::operands`] is binding `k` — for a matmul: 0 `a`, 1 `b`, 2 `c`
//! (written) — each bound from the byte where its element 0 lies; the parameter buffer
//! is the last binding (`bindings - 1`), bound whole. The shader writes the parameter
//! buffer's first word only when an operation checks indices (a matmul does not), so
//! host-visible memory is where the backend keeps it.
//!
//! # Parameter buffer
//! [`Dispatch::params`]: the error record (4 words), then for each tensor its base (0:
//! bound from element 0), rank, 4 dimensions and 4 strides, then the scalars (sizes,
//! strides, `alpha`, `beta`), 2 words each — as the backend writes it.
//!
//! # Dispatch
//! One `vkCmdDispatch` of [`Dispatch::groups`] workgroups.

use xpu_hal::ops::{Layout, Op};
use xpu_hal::Result;

use crate::builtins::abi::ShaderFeatures;

/// The entry point of every standard-operation shader.
pub const ENTRY_POINT: &str = "main";

/// One dispatch of a standard-operation shader, described for a raw Vulkan program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// The complete WGSL (see the module docs).
    pub wgsl: String,
    /// Storage-buffer bindings: the tensors in operand order, then the parameter buffer.
    pub bindings: u32,
    /// The parameter buffer's bytes, for tensors bound from their element 0.
    pub params: Vec<u8>,
    /// Workgroups in x, y and z.
    pub groups: [u32; 3],
}

/// The dispatch of the matmul `op` (tensors given by their layouts) on a device with
/// `features`, exactly as the backend records it when each tensor starts a buffer.
///
/// # Errors
/// [`xpu_hal::Error::Invalid`] when `op` is not a valid matmul;
/// [`xpu_hal::Error::Unsupported`] when it is not a matmul, its dtype is not provided
/// with `features`, or it is too large for the backend (32-bit indexing, workgroup
/// counts).
pub fn matmul(op: &Op<Layout>, features: ShaderFeatures) -> Result<Dispatch> {
    crate::ops::matmul_dispatch(op, features)
}
