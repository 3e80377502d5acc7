//! Compute pipelines: a shader module, a push-descriptor set layout with N storage
//! buffers, a push-constant range, and the pipeline itself.

use ash::vk;
use xpu_hal::Result;

use crate::device::DeviceShared;
use crate::error::VkResultExt;

/// The push-descriptor writes that bind `infos` to bindings 0, 1, … of a pipeline's
/// storage buffers.
pub(crate) fn storage_writes(
    infos: &[vk::DescriptorBufferInfo],
) -> Vec<vk::WriteDescriptorSet<'_>> {
    infos
        .iter()
        .enumerate()
        .map(|(b, info)| {
            vk::WriteDescriptorSet::default()
                .dst_binding(b as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(std::slice::from_ref(info))
        })
        .collect()
}

/// A compute pipeline whose buffers are bound with push descriptors.
pub struct Pipeline {
    device: ash::Device,
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    set_layout: vk::DescriptorSetLayout,
    module: vk::ShaderModule,
    /// Bytes of push constants the layout declares.
    pub(crate) push_size: u32,
}

// SAFETY: Vulkan pipeline objects may be used from any thread once created.
unsafe impl Send for Pipeline {}
// SAFETY: as above.
unsafe impl Sync for Pipeline {}

impl Pipeline {
    /// Builds a pipeline from SPIR-V words.
    pub(crate) fn new(
        dev: &DeviceShared,
        spirv: &[u32],
        entry: &str,
        buffers: u32,
        push_size: u32,
    ) -> Result<Self> {
        let name = dev.name.as_str();
        let device = dev.device.clone();
        let entry = std::ffi::CString::new(entry).map_err(|_| {
            xpu_hal::Error::invalid(format!("entry point `{entry}` contains a NUL byte"))
        })?;
        let module_info = vk::ShaderModuleCreateInfo::default().code(spirv);
        // SAFETY: valid device; the SPIR-V was produced by naga or given by the user,
        // and drivers validate modules at pipeline creation.
        let module = unsafe { device.create_shader_module(&module_info, None) }
            .vk(name, "vkCreateShaderModule")?;
        let bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..buffers)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set_info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR)
            .bindings(&bindings);
        let destroy_module = |d: &ash::Device| {
            // SAFETY: created above on this device and unused.
            unsafe { d.destroy_shader_module(module, None) }
        };
        // SAFETY: valid device and create info.
        let set_layout = match unsafe { device.create_descriptor_set_layout(&set_info, None) }
            .vk(name, "vkCreateDescriptorSetLayout")
        {
            Ok(l) => l,
            Err(e) => {
                destroy_module(&device);
                return Err(e);
            }
        };
        let set_layouts = [set_layout];
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(push_size.max(4))];
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts)
            .push_constant_ranges(if push_size > 0 { &ranges } else { &[] });
        // SAFETY: valid device and create info.
        let layout = match unsafe { device.create_pipeline_layout(&layout_info, None) }
            .vk(name, "vkCreatePipelineLayout")
        {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: unused objects of this device.
                unsafe { device.destroy_descriptor_set_layout(set_layout, None) };
                destroy_module(&device);
                return Err(e);
            }
        };
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry);
        let info = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)];
        // SAFETY: valid device and create info.
        let pipeline = match unsafe {
            device.create_compute_pipelines(vk::PipelineCache::null(), &info, None)
        } {
            Ok(p) => p.into_iter().next().unwrap_or_default(),
            Err((_, e)) => {
                // SAFETY: unused objects of this device.
                unsafe {
                    device.destroy_pipeline_layout(layout, None);
                    device.destroy_descriptor_set_layout(set_layout, None);
                }
                destroy_module(&device);
                return Err(crate::error::vk_error(name, "vkCreateComputePipelines", e));
            }
        };
        Ok(Pipeline {
            device,
            pipeline,
            layout,
            set_layout,
            module,
            push_size,
        })
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: created on `self.device`; pipelines are kept alive by the work that uses
        // them (held until completion) and destroyed before the device.
        unsafe {
            self.device.destroy_pipeline(self.pipeline, None);
            self.device.destroy_pipeline_layout(self.layout, None);
            self.device
                .destroy_descriptor_set_layout(self.set_layout, None);
            self.device.destroy_shader_module(self.module, None);
        }
    }
}
