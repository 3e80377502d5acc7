//! The standard operations ([`xpu_hal::ops`]) as WGSL compute shaders.
//!
//! Each family module turns an [`Op`] into a [`Plan`]: the tensors with how the shader
//! sees them ([`wgsl::Slot`]), scalar parameters, and one or more passes (shader text
//! and workgroup counts). This module binds the tensors, writes the parameter buffer
//! (shapes and strides of every tensor, so any layout works), caches one pipeline per
//! shader text, and records the passes in stream order.
//!
//! # Out-of-range indices and labels
//! A shader cannot fail, so an operation with indices first runs a check pass that
//! records the smallest bad position in the parameter buffer (`err_pos`); every later
//! pass returns at once when one is recorded (the first of them also stores the value
//! found there). When the batch completes, the stream reads the record and turns it
//! into the stream's error, naming the position and the value: nothing was written.

mod elementwise;
mod index;
mod matmul;
mod reduce;
mod rows;
mod wgsl;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ash::vk;
use xpu_hal::ops::{HasLayout, Layout, Op, OpKind, OpSupport, RawTensor};
use xpu_hal::{DType, Error, Result};

use crate::builtins::abi::ShaderFeatures;
use crate::device::DeviceShared;
use crate::memory::{Placement, VulkanBuffer};
use crate::pipeline::Pipeline;
use crate::stream::{buffer_of, Held, HostAction, StreamShared};
use wgsl::{Repr, Slot, TENSOR_WORDS};

/// Bytes to which a tensor binding's start is rounded down.
const BINDING_ALIGN: u64 = 256;

/// Invocations per workgroup of the one-dimensional shaders.
const GROUP: u32 = 64;

/// The most workgroups launched along x.
const MAX_GROUPS: u64 = 65_535;

/// Shader pipelines of the standard operations, by WGSL text.
pub(crate) type OpPipelines = Mutex<HashMap<String, Arc<Pipeline>>>;

/// The operations and dtypes a device with `features` provides.
pub(crate) fn supported(features: ShaderFeatures) -> Vec<OpSupport> {
    let floats = |f64_ok: bool| {
        let mut v = vec![DType::F32, DType::F16, DType::BF16];
        if f64_ok && features.float64 && features.int64 {
            v.insert(1, DType::F64);
        }
        v
    };
    OpKind::ALL
        .iter()
        .map(|&kind| {
            let dtypes = match kind {
                // exp, log, tanh, sin and cos exist only in 32 bits in SPIR-V's GLSL
                // instructions: no f64 for the operations that need them.
                OpKind::Gelu
                | OpKind::GeluBackward
                | OpKind::Softmax
                | OpKind::CrossEntropy
                | OpKind::CrossEntropyBackward => floats(false),
                OpKind::Random => {
                    let mut v = floats(false);
                    v.push(DType::I32);
                    v
                }
                OpKind::Gather => {
                    let mut v = floats(true);
                    v.extend([DType::I32, DType::U8]);
                    if features.int64 {
                        v.push(DType::I64);
                    }
                    v
                }
                _ => floats(true),
            };
            OpSupport { kind, dtypes }
        })
        .collect()
}

/// One shader dispatch of a plan.
pub(crate) struct Pass {
    /// The shader's body (appended to the prelude): must define `main`.
    pub body: String,
    /// Workgroups in x, y, z.
    pub groups: [u32; 3],
}

/// What a check pass looks for, to word the error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check {
    /// Indices into `rows` rows.
    Index { rows: u64 },
    /// Labels of `classes` classes (or −1).
    Label { classes: u64 },
}

/// An operation ready to record (`T`: how its tensors are given; a [`Layout`] alone
/// describes a dispatch for [`crate::ops_abi`]).
pub(crate) struct Plan<T = RawTensor> {
    /// The tensors, in binding order.
    pub tensors: Vec<(T, Slot)>,
    /// The dtype computed in.
    pub dtype: DType,
    /// Scalar parameters (two words each: `f32` bits or `f64`/`u64` bits).
    pub scalars: Vec<u64>,
    /// The passes, in order.
    pub passes: Vec<Pass>,
    /// The check the first pass makes, if any.
    pub check: Option<Check>,
}

impl<T: HasLayout + Clone> Plan<T> {
    fn new(dtype: DType) -> Self {
        Plan {
            tensors: Vec::new(),
            dtype,
            scalars: Vec::new(),
            passes: Vec::new(),
            check: None,
        }
    }

    /// Adds a tensor; returns its binding index.
    fn tensor(&mut self, t: &T, write: bool, repr: Repr) -> u32 {
        self.tensors.push((
            t.clone(),
            Slot {
                dtype: t.layout().dtype,
                write,
                repr,
            },
        ));
        self.tensors.len() as u32 - 1
    }

    /// Adds a float tensor.
    fn float(&mut self, t: &T, write: bool) -> u32 {
        self.tensor(t, write, Repr::Float)
    }

    /// Adds a scalar in the computation type; returns its index.
    fn scalar_c(&mut self, v: f64) -> u32 {
        if self.dtype == DType::F64 {
            self.scalars.push(v.to_bits());
        } else {
            self.scalars.push(u64::from((v as f32).to_bits()));
        }
        self.scalars.len() as u32 - 1
    }

    /// Adds a raw 64-bit scalar (read as `sc(i)` low and `sc_hi(i)` high words).
    fn scalar_bits(&mut self, v: u64) -> u32 {
        self.scalars.push(v);
        self.scalars.len() as u32 - 1
    }

    /// Adds a one-dimensional pass over `units` invocations (grid-stride loops).
    fn pass_1d(&mut self, body: String, units: u64) {
        let groups = units.div_ceil(u64::from(GROUP)).clamp(1, MAX_GROUPS) as u32;
        self.passes.push(Pass {
            body,
            groups: [groups, 1, 1],
        });
    }

    /// Adds a pass with one workgroup per row (rows beyond the limit loop).
    fn pass_rows(&mut self, body: String, rows: u64) {
        let groups = rows.clamp(1, MAX_GROUPS) as u32;
        self.passes.push(Pass {
            body,
            groups: [groups, 1, 1],
        });
    }
}

use xpu_hal::backend::lock;

fn too_large(what: &str) -> Error {
    Error::unsupported(format!(
        "{what} is too large for the Vulkan backend's standard operations (32-bit indexing)"
    ))
}

fn u32_of(v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| too_large(what))
}

/// Records `op` on `stream`.
pub(crate) fn run(stream: &Arc<StreamShared>, op: Op<RawTensor>) -> Result<()> {
    let dev = &stream.dev;
    let kind = op.kind();
    let dtype = op
        .operands()
        .first()
        .map(|o| o.tensor.layout.dtype)
        .unwrap_or(DType::F32);
    let listed = dev
        .info()
        .capabilities
        .ops
        .iter()
        .any(|s| s.kind == kind && s.dtypes.contains(&dtype));
    if !listed {
        return Err(Error::unsupported(format!(
            "{}: the standard operation {kind} is not provided on {dtype}",
            dev.name
        )));
    }
    for o in op.operands() {
        if o.tensor.layout.elements() > u64::from(u32::MAX) {
            return Err(too_large(&format!("operand {} of {kind}", o.name)));
        }
    }
    let plan = match &op {
        Op::Matmul { .. } => matmul::plan(&op)?,
        Op::Softmax { .. }
        | Op::SoftmaxBackward { .. }
        | Op::CrossEntropy { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::LayerNorm { .. }
        | Op::LayerNormBackward { .. } => rows::plan(&op)?,
        Op::Gather { .. } | Op::ScatterAdd { .. } => index::plan(&op)?,
        Op::Reduce { .. } => reduce::plan(&op)?,
        _ => elementwise::plan(&op)?,
    };
    record(stream, plan, kind)
}

/// One bound tensor: the buffer range and the element offset of element 0 in it.
struct Bound {
    buf: Arc<VulkanBuffer>,
    start: u64,
    range: u64,
    base: u32,
}

fn bind(dev: &DeviceShared, t: &RawTensor) -> Result<Bound> {
    let buf = buffer_of(&t.memory)?;
    let offset = t.memory.offset;
    let start = offset - offset % BINDING_ALIGN;
    let rel = offset - start;
    let range = ((rel + t.memory.len).div_ceil(4) * 4).min(buf.bound() - start);
    if range > u64::from(dev.limits.max_storage_buffer_range) {
        return Err(too_large(&format!(
            "a tensor spanning {} bytes (the device binds at most {})",
            t.memory.len, dev.limits.max_storage_buffer_range
        )));
    }
    let base = u32_of(rel / t.layout.dtype.size() as u64, "a tensor offset")?;
    Ok(Bound {
        buf,
        start,
        range,
        base,
    })
}

/// The parameter buffer's words: the error record, then each tensor (its element 0 at
/// `bases[k]` elements into its binding), then the scalars.
fn param_words<T: HasLayout>(plan: &Plan<T>, bases: &[u32]) -> Result<Vec<u32>> {
    let mut words: Vec<u32> = vec![u32::MAX, 0, 0, 0];
    for ((t, _), &base) in plan.tensors.iter().zip(bases) {
        let l = t.layout();
        let mut w = [0u32; TENSOR_WORDS];
        w[0] = base;
        w[1] = l.rank() as u32;
        for k in 0..l.rank() {
            let d = l.dims()[k];
            w[2 + k] = u32_of(d, "a dimension")?;
            w[6 + k] = if d == 1 {
                0
            } else {
                u32_of(l.strides()[k], "a stride")?
            };
        }
        words.extend(w);
    }
    for s in &plan.scalars {
        words.extend([*s as u32, (*s >> 32) as u32]);
    }
    Ok(words)
}

/// The prelude of every pass of `plan`.
fn plan_prelude<T>(plan: &Plan<T>, int64: bool) -> String {
    let slots: Vec<Slot> = plan.tensors.iter().map(|(_, s)| *s).collect();
    wgsl::prelude(&slots, plan.dtype, int64)
}

/// The complete WGSL of `pass`.
fn source(prelude: &str, pass: &Pass) -> String {
    format!("{prelude}\n{}", pass.body)
}

/// The pipeline of `source`, built on first use.
fn pipeline(dev: &DeviceShared, source: String, bindings: u32) -> Result<Arc<Pipeline>> {
    if let Some(p) = lock(&dev.op_pipelines).get(&source) {
        return Ok(p.clone());
    }
    let words = crate::shader::wgsl_to_spirv(&source, "main", "standard operation")
        .map_err(|e| Error::backend_message("vulkan", format!("internal error: {e}")))?;
    let p = Arc::new(Pipeline::new(dev, &words, "main", bindings, 0)?);
    lock(&dev.op_pipelines).insert(source, p.clone());
    Ok(p)
}

fn record(stream: &Arc<StreamShared>, plan: Plan, kind: OpKind) -> Result<()> {
    let dev = &stream.dev;
    let bounds = plan
        .tensors
        .iter()
        .map(|(t, _)| bind(dev, t))
        .collect::<Result<Vec<_>>>()?;
    let bases: Vec<u32> = bounds.iter().map(|b| b.base).collect();
    let words = param_words(&plan, &bases)?;
    let params = Arc::new(VulkanBuffer::new(
        dev,
        (words.len() * 4) as u64,
        Placement::Staging,
    )?);
    let ptr = params.mapped().ok_or_else(|| {
        Error::backend_message("vulkan", "internal error: a parameter buffer is not mapped")
    })?;
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    // SAFETY: the buffer is fresh, mapped, coherent (staging memory) and at least
    // `bytes.len()` long; nothing else uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
    let prelude = plan_prelude(&plan, dev.features.int64);
    let bindings = plan.tensors.len() as u32 + 1;
    let last = plan.passes.len().saturating_sub(1);
    let mut after = plan
        .check
        .map(|check| check_action(params.clone(), check, kind));
    for (i, pass) in plan.passes.into_iter().enumerate() {
        let p = pipeline(dev, source(&prelude, &pass), bindings)?;
        let mut held: Vec<Held> = vec![p.clone(), params.clone()];
        held.extend(bounds.iter().map(|b| -> Held { b.buf.clone() }));
        let mut infos: Vec<vk::DescriptorBufferInfo> = bounds
            .iter()
            .map(|b| vk::DescriptorBufferInfo {
                buffer: b.buf.buffer,
                offset: b.start,
                range: b.range,
            })
            .collect();
        infos.push(vk::DescriptorBufferInfo {
            buffer: params.buffer,
            offset: 0,
            range: vk::WHOLE_SIZE,
        });
        let d = dev.device.clone();
        let push = dev.push.clone();
        let groups = pass.groups;
        let action = if i == last { after.take() } else { None };
        stream.record(held, action, move |cmd| {
            let writes = crate::pipeline::storage_writes(&infos);
            // SAFETY: `cmd` is recording; the pipeline and every buffer are held until
            // the batch completes; each range lies within its buffer (`bind`).
            unsafe {
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.pipeline);
                push.cmd_push_descriptor_set(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    0,
                    &writes,
                );
                d.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// The host action that turns a recorded out-of-range position into the stream's error.
fn check_action(params: Arc<VulkanBuffer>, check: Check, kind: OpKind) -> HostAction {
    Box::new(move || {
        let ptr = params.mapped().ok_or_else(|| {
            Error::backend_message("vulkan", "internal error: a parameter buffer is not mapped")
        })?;
        let mut record = [0u32; 2];
        // SAFETY: the batch that wrote the record has completed (with a host-read
        // barrier); the buffer holds at least these 8 bytes and stays mapped while held.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.as_ptr().cast::<u32>(), record.as_mut_ptr(), 2)
        };
        let [pos, value] = record;
        if pos == u32::MAX {
            return Ok(());
        }
        let value = value as i32;
        Err(Error::invalid(match check {
            Check::Index { rows } => format!(
                "{kind}: index at position {pos} is {value}, outside [0, {rows}); the operation was not carried out"
            ),
            Check::Label { classes } => format!(
                "{kind}: label of row {pos} is {value}, outside [0, {classes}) and not -1 (ignored); the operation was not carried out"
            ),
        }))
    })
}

/// The WGSL of a grid-stride loop over `count` units, running `body` with `n` bound.
fn grid_loop(count: u64, body: &str) -> String {
    grid_loop_after(count, body, "if failed() { return; }")
}

/// [`grid_loop`] with `head` (WGSL that may return) run first.
fn grid_loop_after(count: u64, body: &str, head: &str) -> String {
    format!(
        "@compute @workgroup_size({GROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    {head}
    let step = nwg.x * {GROUP}u;
    for (var n = gid.x; n < {count}u; n = n + step) {{
        {body}
    }}
}}
"
    )
}

/// The WGSL of a check pass over the `count` elements of `i32` tensor `t`: bad when
/// outside `[0, bound)` (and not −1 when `ignore_minus_one`).
fn check_pass(t: u32, count: u64, bound: u64, ignore_minus_one: bool) -> String {
    let ok_minus_one = if ignore_minus_one { "v == -1 ||" } else { "" };
    format!(
        "@compute @workgroup_size({GROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let step = nwg.x * {GROUP}u;
    for (var n = gid.x; n < {count}u; n = n + step) {{
        let v = ld{t}(off({t}u, n));
        if !({ok_minus_one} (v >= 0 && u32(v) < {bound}u)) {{ fail_at(n); }}
    }}
}}
"
    )
}

/// WGSL that, in the pass after a check, stores the bad value (read from `i32`
/// tensor `t`) and returns when a position was recorded.
fn after_check(t: u32) -> String {
    format!(
        "let bad = atomicLoad(&P.err_pos);
    if bad != 0xFFFFFFFFu {{
        if gid.x == 0u && gid.y == 0u && gid.z == 0u {{ atomicStore(&P.err_val, bitcast<u32>(ld{t}(off({t}u, bad)))); }}
        return;
    }}"
    )
}

/// The dispatch of a matmul described by layouts alone, each tensor bound from its
/// element 0 ([`crate::ops_abi::matmul`]).
pub(crate) fn matmul_dispatch(
    op: &Op<Layout>,
    features: ShaderFeatures,
) -> Result<crate::ops_abi::Dispatch> {
    xpu_hal::ops::check(op)?;
    let dtype = op.operands()[0].tensor.dtype;
    let listed = supported(features)
        .iter()
        .any(|s| s.kind == OpKind::Matmul && s.dtypes.contains(&dtype));
    if !listed {
        return Err(Error::unsupported(format!(
            "a matmul on {dtype} is not provided with these shader features"
        )));
    }
    for o in op.operands() {
        if o.tensor.elements() > u64::from(u32::MAX) {
            return Err(too_large(&format!("operand {} of matmul", o.name)));
        }
    }
    let plan = matmul::plan(op)?;
    let words = param_words(&plan, &vec![0; plan.tensors.len()])?;
    let prelude = plan_prelude(&plan, features.int64);
    let [pass] = plan.passes.as_slice() else {
        return Err(Error::backend_message(
            "vulkan",
            "internal error: a matmul is one pass",
        ));
    };
    Ok(crate::ops_abi::Dispatch {
        wgsl: source(&prelude, pass),
        bindings: plan.tensors.len() as u32 + 1,
        params: bytemuck::cast_slice(&words).to_vec(),
        groups: pass.groups,
    })
}
