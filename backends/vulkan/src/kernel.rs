//! User kernels: WGSL (compiled by naga) or SPIR-V, with buffer parameters bound in
//! order to bindings 0.. of set 0 and scalar parameters packed into push constants.
//!
//! Push-constant layout: scalars in declaration order, each at an offset aligned to its
//! size; 8-byte dtypes take 8 bytes, every other dtype 4 bytes (`u8` zero-extended,
//! `f16`/`bf16` as their bits in the low half of a `u32`).

use std::any::Any;
use std::sync::Arc;

use ash::vk;
use xpu_hal::{
    DType, Error, KernelDesc, KernelImpl, KernelParam, KernelSource, LaunchDims, RawKernelArg,
    Result, Scalar,
};

use crate::device::DeviceShared;
use crate::pipeline::Pipeline;
use crate::stream::{buffer_of, Held, StreamShared};

/// A loaded user kernel.
pub struct VulkanKernel {
    pipeline: Arc<Pipeline>,
}

impl KernelImpl for VulkanKernel {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn scalar_slot(dtype: DType) -> u32 {
    if dtype.size() == 8 {
        8
    } else {
        4
    }
}

fn push_size(params: &[KernelParam]) -> u32 {
    let mut off = 0u32;
    for p in params {
        if let KernelParam::Scalar(dt) = p {
            let slot = scalar_slot(*dt);
            off = off.div_ceil(slot) * slot + slot;
        }
    }
    off
}

fn scalar_bytes(s: &Scalar) -> Vec<u8> {
    match *s {
        Scalar::U8(v) => u32::from(v).to_le_bytes().to_vec(),
        Scalar::F16(v) => u32::from(v.to_bits()).to_le_bytes().to_vec(),
        Scalar::BF16(v) => u32::from(v.to_bits()).to_le_bytes().to_vec(),
        other => other.to_le_bytes(),
    }
}

impl VulkanKernel {
    pub(crate) fn load(dev: &Arc<DeviceShared>, desc: &KernelDesc) -> Result<Self> {
        let words = match &desc.source {
            KernelSource::Wgsl(text) => {
                let key = (text.clone(), desc.entry_point.clone());
                let cached = dev
                    .wgsl_cache
                    .lock()
                    .ok()
                    .and_then(|c| c.get(&key).cloned());
                match cached {
                    Some(words) => words,
                    None => {
                        let words = Arc::new(crate::shader::wgsl_to_spirv(
                            text,
                            &desc.entry_point,
                            &format!("kernel `{}`", desc.name),
                        )?);
                        if let Ok(mut c) = dev.wgsl_cache.lock() {
                            c.insert(key, words.clone());
                        }
                        words
                    }
                }
            }
            KernelSource::SpirV(words) => Arc::new(words.clone()),
            other => {
                return Err(Error::unsupported(format!(
                    "{} runs WGSL and SPIR-V kernels, not {}",
                    dev.name,
                    other.format()
                )))
            }
        };
        let buffers = desc
            .params
            .iter()
            .filter(|p| matches!(p, KernelParam::Buffer(_)))
            .count() as u32;
        let push = push_size(&desc.params);
        if push > dev.limits.max_push_constants_size {
            return Err(Error::invalid(format!(
                "kernel `{}` needs {push} bytes of scalar arguments but {} allows {}",
                desc.name, dev.name, dev.limits.max_push_constants_size
            )));
        }
        if buffers > 32 {
            return Err(Error::invalid(format!(
                "kernel `{}` has {buffers} buffer parameters; at most 32 are supported",
                desc.name
            )));
        }
        let pipeline = Pipeline::new(dev, &words, &desc.entry_point, buffers, push)?;
        Ok(VulkanKernel {
            pipeline: Arc::new(pipeline),
        })
    }
}

/// Records a launch of a loaded kernel.
pub(crate) fn launch(
    stream: &Arc<StreamShared>,
    kernel: &Arc<dyn KernelImpl>,
    desc: &KernelDesc,
    dims: LaunchDims,
    args: Vec<RawKernelArg>,
) -> Result<()> {
    let dev = &stream.dev;
    let Some(k) = kernel.as_any().downcast_ref::<VulkanKernel>() else {
        return Err(Error::backend_message(
            "vulkan",
            "internal error: a kernel of another backend reached the Vulkan backend",
        ));
    };
    let limits = &dev.limits;
    for (i, (&g, &max)) in dims
        .grid
        .iter()
        .zip(&limits.max_compute_work_group_count)
        .enumerate()
    {
        if g > max {
            return Err(Error::invalid(format!(
                "launch of `{}`: grid dimension {i} is {g} but {} allows at most {max}",
                desc.name, dev.name
            )));
        }
    }
    let mut infos = Vec::new();
    let mut held: Vec<Held> = vec![k.pipeline.clone()];
    let mut push = vec![0u8; k.pipeline.push_size as usize];
    let mut off = 0usize;
    for (i, arg) in args.iter().enumerate() {
        match arg {
            // The HAL checked the offset against `kernel_arg_alignment`.
            RawKernelArg::Buffer(Some(slice), _) => {
                if slice.len > u64::from(limits.max_storage_buffer_range) {
                    return Err(Error::invalid(format!(
                        "argument {i} of `{}` is {} bytes, more than {}'s largest binding ({} bytes); pass it in pieces",
                        desc.name, slice.len, dev.name, limits.max_storage_buffer_range
                    )));
                }
                let buf = buffer_of(slice)?;
                infos.push(vk::DescriptorBufferInfo {
                    buffer: buf.buffer,
                    offset: slice.offset,
                    range: slice.len,
                });
                held.push(buf);
            }
            RawKernelArg::Buffer(None, _) => {
                return Err(Error::invalid(format!(
                "argument {i} of `{}` is an empty buffer range; Vulkan cannot bind an empty range",
                desc.name
            )))
            }
            RawKernelArg::Scalar(s) => {
                let slot = scalar_slot(s.dtype()) as usize;
                off = off.div_ceil(slot) * slot;
                let bytes = scalar_bytes(s);
                if let Some(dst) = push.get_mut(off..off + bytes.len()) {
                    dst.copy_from_slice(&bytes);
                }
                off += slot;
            }
        }
    }
    let d = dev.device.clone();
    let push_fn = dev.push.clone();
    let pipeline = k.pipeline.clone();
    stream.record(held, None, move |cmd| {
        let writes = crate::pipeline::storage_writes(&infos);
        // SAFETY: `cmd` is recording; the pipeline and buffers are held until the batch
        // completes; the push range matches the pipeline layout.
        unsafe {
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            if !writes.is_empty() {
                push_fn.cmd_push_descriptor_set(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    pipeline.layout,
                    0,
                    &writes,
                );
            }
            if !push.is_empty() {
                d.cmd_push_constants(
                    cmd,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    &push,
                );
            }
            d.cmd_dispatch(cmd, dims.grid[0], dims.grid[1], dims.grid[2]);
        }
        Ok(())
    })
}
