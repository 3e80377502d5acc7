//! Builtin operations as WGSL compute shaders: the interface ([`abi`]), the shader
//! sources ([`wgsl`]), and the dispatcher here, which caches one pipeline per shader
//! kind and device, binds ranges larger than the device's largest storage binding in
//! pieces, and records each piece as one dispatch.

pub mod abi;
pub mod wgsl;

use std::sync::Arc;

use ash::vk;
use xpu_hal::backend::BuiltinOp;
use xpu_hal::{DType, Error, RawSlice, Result, Scalar};

use crate::device::DeviceShared;
use crate::memory::VulkanBuffer;
use crate::pipeline::Pipeline;
use crate::stream::{buffer_of, Held, StreamShared};
use abi::{is_packed, PushConstants, ShaderKind, BINDING_ALIGN, MAX_GROUPS, WORKGROUP_SIZE};

use xpu_hal::backend::lock;

/// The pipeline for `kind`, built on first use.
fn pipeline(dev: &DeviceShared, kind: ShaderKind) -> Result<Arc<Pipeline>> {
    let mut cache = lock(&dev.builtin_pipelines);
    if let Some(p) = cache.get(&kind) {
        return Ok(p.clone());
    }
    let source = wgsl::source(kind, dev.features).map_err(|e| {
        Error::unsupported(format!("{}: no builtin shader for {kind:?}: {e}", dev.name))
    })?;
    let words =
        crate::shader::wgsl_to_spirv(&source, abi::ENTRY_POINT, &format!("builtin {kind:?}"))
            .map_err(|e| Error::backend_message("vulkan", format!("internal error: {e}")))?;
    let p = Arc::new(Pipeline::new(
        dev,
        &words,
        abi::ENTRY_POINT,
        bindings(kind),
        std::mem::size_of::<PushConstants>() as u32,
    )?);
    cache.insert(kind, p.clone());
    Ok(p)
}

fn bindings(kind: ShaderKind) -> u32 {
    match kind {
        ShaderKind::Fill(_) => 1,
        ShaderKind::Binary(..) => 3,
        ShaderKind::Accumulate(..) | ShaderKind::Scale(_) | ShaderKind::Cast(..) => 2,
    }
}

fn scalar_words(s: &Scalar) -> (u32, u32) {
    let mut b = s.to_le_bytes();
    b.resize(8, 0);
    let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let hi = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    (lo, hi)
}

/// One bound range: the binding's start and length, and the data's offset inside it
/// in the unit the shader expects.
struct Bound {
    buffer: vk::Buffer,
    base: u64,
    range: u64,
    offset: u32,
}

fn bind(buf: &VulkanBuffer, byte_offset: u64, len: u64, dtype: DType) -> Result<Bound> {
    let base = byte_offset - byte_offset % BINDING_ALIGN;
    let rel = byte_offset - base;
    let range = (rel + len).div_ceil(4) * 4;
    let range = range.min(buf.bound() - base);
    let offset = if is_packed(dtype) {
        rel
    } else {
        rel / dtype.size() as u64
    };
    Ok(Bound {
        buffer: buf.buffer,
        base,
        range,
        offset: u32::try_from(offset).map_err(|_| {
            Error::backend_message("vulkan", "internal error: binding offset overflow")
        })?,
    })
}

/// One operand: its slice and dtype.
struct Operand {
    buf: Arc<VulkanBuffer>,
    slice: RawSlice,
    dtype: DType,
}

fn operand(slice: RawSlice, dtype: DType) -> Result<Operand> {
    Ok(Operand {
        buf: buffer_of(&slice)?,
        slice,
        dtype,
    })
}

/// Records `op` on `stream`.
pub(crate) fn dispatch(stream: &Arc<StreamShared>, op: BuiltinOp) -> Result<()> {
    let (kind, dst, sources, scalar) = match op {
        BuiltinOp::Fill { dst, value } => (
            ShaderKind::Fill(value.dtype()),
            operand(dst, value.dtype())?,
            vec![],
            Some(value),
        ),
        BuiltinOp::Binary {
            op,
            dtype,
            a,
            b,
            dst,
        } => (
            ShaderKind::Binary(op, dtype),
            operand(dst, dtype)?,
            vec![operand(a, dtype)?, operand(b, dtype)?],
            None,
        ),
        BuiltinOp::Accumulate {
            op,
            dtype,
            dst,
            src,
        } => (
            ShaderKind::Accumulate(op, dtype),
            operand(dst, dtype)?,
            vec![operand(src, dtype)?],
            None,
        ),
        BuiltinOp::Scale { alpha, src, dst } => (
            ShaderKind::Scale(alpha.dtype()),
            operand(dst, alpha.dtype())?,
            vec![operand(src, alpha.dtype())?],
            Some(alpha),
        ),
        BuiltinOp::Cast {
            src,
            src_dtype,
            dst,
            dst_dtype,
        } => (
            ShaderKind::Cast(src_dtype, dst_dtype),
            operand(dst, dst_dtype)?,
            vec![operand(src, src_dtype)?],
            None,
        ),
    };
    let dev = &stream.dev;
    let pipeline = pipeline(dev, kind)?;
    let count = dst.slice.len / dst.dtype.size() as u64;
    let (scalar_lo, scalar_hi) = scalar.as_ref().map(scalar_words).unwrap_or((0, 0));
    // Elements per piece, so that every binding fits the device's largest range.
    let widest = sources
        .iter()
        .map(|s| s.dtype.size())
        .chain([dst.dtype.size()])
        .max()
        .unwrap_or(1) as u64;
    let max_range = u64::from(dev.limits.max_storage_buffer_range);
    let per_piece = ((max_range.saturating_sub(BINDING_ALIGN + 8)) / widest / 4 * 4).max(4);
    let mut first = 0u64;
    while first < count {
        let n = per_piece.min(count - first);
        let at = |o: &Operand| o.slice.offset + first * o.dtype.size() as u64;
        let len = |o: &Operand| n * o.dtype.size() as u64;
        let d = bind(&dst.buf, at(&dst), len(&dst), dst.dtype)?;
        let mut bounds = vec![d];
        for s in &sources {
            bounds.push(bind(&s.buf, at(s), len(s), s.dtype)?);
        }
        let units = if is_packed(dst.dtype) {
            let rel = u64::from(bounds[0].offset);
            (rel + len(&dst)).div_ceil(4) - rel / 4
        } else {
            n
        };
        let groups = units
            .div_ceil(u64::from(WORKGROUP_SIZE))
            .min(u64::from(MAX_GROUPS)) as u32;
        let pc = PushConstants {
            dst_offset: bounds[0].offset,
            a_offset: bounds.get(1).map_or(0, |b| b.offset),
            b_offset: bounds.get(2).map_or(0, |b| b.offset),
            count: u32::try_from(n)
                .map_err(|_| Error::backend_message("vulkan", "internal error: piece too large"))?,
            scalar_lo,
            scalar_hi,
            pad: [0; 2],
        };
        let mut held: Vec<Held> = vec![pipeline.clone(), dst.buf.clone()];
        held.extend(sources.iter().map(|s| -> Held { s.buf.clone() }));
        let d = dev.device.clone();
        let push_fn = dev.push.clone();
        let p = pipeline.clone();
        stream.record(held, None, move |cmd| {
            let infos: Vec<vk::DescriptorBufferInfo> = bounds
                .iter()
                .map(|b| vk::DescriptorBufferInfo {
                    buffer: b.buffer,
                    offset: b.base,
                    range: b.range,
                })
                .collect();
            let writes = crate::pipeline::storage_writes(&infos);
            // SAFETY: `cmd` is recording; the pipeline and buffers are held until the
            // batch completes; bindings are within the buffers (checked by `bind`) and
            // the push range matches the layout.
            unsafe {
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.pipeline);
                push_fn.cmd_push_descriptor_set(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    0,
                    &writes,
                );
                d.cmd_push_constants(
                    cmd,
                    p.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    bytemuck::bytes_of(&pc),
                );
                d.cmd_dispatch(cmd, groups.max(1), 1, 1);
            }
            Ok(())
        })?;
        first += n;
    }
    Ok(())
}
