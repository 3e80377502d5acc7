//! The reference for the Vulkan benchmarks: a small program written directly against
//! Vulkan with `ash`, doing the same device work as the xpu Vulkan backend with nothing
//! around it.
//!
//! It creates its own instance and logical device on the same physical device that
//! xpu calls `vulkan:0` (the first one with Vulkan 1.2, a compute queue, timeline
//! semaphores and push descriptors, picked with the same rules), one command pool with
//! one command buffer, and one fence. Every operation records the command buffer
//! again, submits it, and waits on the fence — the cheapest honest way to run one piece
//! of work and know that it finished.
//!
//! Buffers have the backend's usage flags and memory-type preferences (device data on a
//! CPU driver or an integrated GPU: device-local, host-visible and coherent; on a
//! discrete GPU: device-local and not host-visible; staging: host-visible, coherent and
//! cached where possible), one `VkDeviceMemory` per buffer, mapped when host-visible.
//! Builtin shaders are the backend's own WGSL
//! ([`xpu_vulkan::builtins::wgsl::source`]) compiled by naga with the backend's
//! options, bound with push descriptors, with the push constants and the workgroup
//! count of [`xpu_vulkan::builtins::abi`]. Standard operations ([`RawVulkan::op`]) are
//! the backend's own shaders too, with the bindings, parameter buffer and workgroup
//! counts of [`xpu_vulkan::ops_abi`].

use std::cell::Cell;
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use xpu_hal::{Error, Result};
use xpu_vulkan::builtins::abi::{
    PushConstants, ShaderFeatures, ShaderKind, BINDING_ALIGN, ENTRY_POINT, MAX_GROUPS,
    WORKGROUP_SIZE,
};
use xpu_vulkan::ops_abi::Dispatch;

const WHO: &str = "vulkan (raw reference)";

fn vk_err(what: &str) -> impl FnOnce(vk::Result) -> Error + '_ {
    move |r| Error::backend_message(WHO, format!("{what} failed with {r:?}"))
}

/// The instance and logical device; destroyed after every object made from it (they
/// all hold an `Arc` to it).
struct Context {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    push: ash::khr::push_descriptor::Device,
    queue: vk::Queue,
    memory: vk::PhysicalDeviceMemoryProperties,
    limits: vk::PhysicalDeviceLimits,
    features: ShaderFeatures,
    /// A CPU driver or an integrated GPU (the backend's rule for unified memory).
    unified_memory: bool,
    name: String,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object created from this device holds an `Arc<Context>`, so
        // none is left; waiting for idle first makes destruction safe even after an
        // error left work in flight.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Data on the device, in the memory type the backend picks for it (see
    /// [`RawVulkan::buffer`]).
    Device,
    /// Host-visible memory for transfers.
    Staging,
}

/// A buffer bound to its own memory.
pub struct RawBuffer {
    ctx: Arc<Context>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    size: u64,
    mapped: Option<NonNull<u8>>,
    /// Whether the mapping is coherent (host access needs no flush or invalidate).
    coherent: bool,
}

impl RawBuffer {
    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its bytes, when its memory is host-visible and coherent (unified memory).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        let p = self.mapped.filter(|_| self.coherent)?;
        // SAFETY: the mapping covers the whole allocation (at least `size` bytes) and
        // lives as long as `self`; no device work is in flight (every operation of
        // `RawVulkan` waits for its submission), and `&self` excludes `host_bytes_mut`.
        Some(unsafe { std::slice::from_raw_parts(p.as_ptr(), self.size as usize) })
    }

    /// Its bytes, mutably, when its memory is host-visible and coherent.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let p = self.mapped.filter(|_| self.coherent)?;
        // SAFETY: as in `host_bytes`; `&mut self` makes the borrow exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), self.size as usize) })
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: both handles belong to `ctx.device`, which outlives them; every
        // operation waits for its submission, so no work uses the buffer any more.
        unsafe {
            self.ctx.device.destroy_buffer(self.buffer, None);
            self.ctx.device.free_memory(self.memory, None);
        }
    }
}

/// A compute pipeline whose storage buffers are bound with push descriptors.
pub struct RawPipeline {
    ctx: Arc<Context>,
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    set_layout: vk::DescriptorSetLayout,
    module: vk::ShaderModule,
    bindings: u32,
}

impl Drop for RawPipeline {
    fn drop(&mut self) {
        // SAFETY: created on `ctx.device`; every operation waits for its submission,
        // so no work uses the pipeline any more. Destroying null handles is a no-op.
        unsafe {
            self.ctx.device.destroy_pipeline(self.pipeline, None);
            self.ctx.device.destroy_pipeline_layout(self.layout, None);
            self.ctx
                .device
                .destroy_descriptor_set_layout(self.set_layout, None);
            self.ctx.device.destroy_shader_module(self.module, None);
        }
    }
}

/// A standard operation's dispatch ([`Dispatch`]) with buffers of its own: a device
/// buffer per tensor, then the parameter buffer (host-visible, as the backend keeps it).
pub struct RawOp {
    pipeline: RawPipeline,
    buffers: Vec<RawBuffer>,
    groups: [u32; 3],
}

impl RawOp {
    /// Tensor `k`'s buffer (binding `k`).
    pub fn tensor(&self, k: usize) -> Option<&RawBuffer> {
        self.buffers
            .get(..self.buffers.len().saturating_sub(1))?
            .get(k)
    }
}

/// Work a copy is queued behind in the same command buffer: the builtin fill shader
/// (`ShaderKind::Fill(F32)`, see [`RawVulkan::builtin_pipeline`]) over the whole of a
/// (small) buffer, as `Stream::fill` would record it.
#[derive(Clone, Copy)]
pub struct Behind<'a> {
    /// The fill pipeline.
    pub fill: &'a RawPipeline,
    /// The buffer it fills (a multiple of 4 bytes).
    pub buffer: &'a RawBuffer,
}

/// One raw Vulkan device with a command buffer and a fence.
pub struct RawVulkan {
    ctx: Arc<Context>,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    /// Not `Sync`: one thread at a time records the command buffer and uses the queue.
    _one_thread: PhantomData<Cell<()>>,
}

impl Drop for RawVulkan {
    fn drop(&mut self) {
        // SAFETY: the pool (with its command buffer) and the fence belong to this
        // device; every submission was waited for, and waiting for idle covers the
        // error paths.
        unsafe {
            let _ = self.ctx.device.device_wait_idle();
            self.ctx.device.destroy_fence(self.fence, None);
            self.ctx.device.destroy_command_pool(self.pool, None);
        }
    }
}

/// Facts about the physical device chosen.
struct Chosen {
    handle: vk::PhysicalDevice,
    family: u32,
    features: ShaderFeatures,
    properties: vk::PhysicalDeviceProperties,
}

/// The first physical device the backend would list as `vulkan:0`, with its queue
/// family (the backend's rules: Vulkan 1.2, a compute family — compute-only preferred —
/// timeline semaphores, push descriptors).
fn choose(instance: &ash::Instance) -> Result<Option<Chosen>> {
    // SAFETY: the instance is valid.
    let handles = unsafe { instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    for handle in handles {
        // SAFETY: `handle` came from this instance.
        let properties = unsafe { instance.get_physical_device_properties(handle) };
        if properties.api_version < vk::API_VERSION_1_2 {
            continue;
        }
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(handle) };
        let Some((family, _)) = families
            .iter()
            .enumerate()
            .filter(|(_, f)| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .min_by_key(|(_, f)| f.queue_flags.contains(vk::QueueFlags::GRAPHICS))
        else {
            continue;
        };
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
        // SAFETY: as above; the chained struct lives across the call.
        unsafe { instance.get_physical_device_features2(handle, &mut features) };
        let base = features.features;
        if v12.timeline_semaphore == vk::FALSE {
            continue;
        }
        // SAFETY: as above.
        let extensions =
            unsafe { instance.enumerate_device_extension_properties(handle) }.unwrap_or_default();
        if !extensions.iter().any(|e| {
            e.extension_name_as_c_str()
                .is_ok_and(|n| n == ash::khr::push_descriptor::NAME)
        }) {
            continue;
        }
        return Ok(Some(Chosen {
            handle,
            family: family as u32,
            features: ShaderFeatures {
                float64: base.shader_float64 == vk::TRUE,
                int64: base.shader_int64 == vk::TRUE,
            },
            properties,
        }));
    }
    Ok(None)
}

/// Compiles WGSL to SPIR-V exactly as the backend does (naga, every validation flag and
/// capability, SPIR-V 1.3, one compute entry point).
pub fn wgsl_to_spirv(source: &str, entry: &str) -> Result<Vec<u32>> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| Error::invalid(format!("WGSL: {}", e.emit_to_string(source))))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| Error::invalid(format!("WGSL: {}", e.emit_to_string(source))))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| Error::invalid(format!("SPIR-V generation failed: {e}")))
}

impl RawVulkan {
    /// Loads Vulkan (the file in `XPU_VULKAN_LIBRARY` if set, like the backend) and
    /// creates a device on the physical device xpu calls `vulkan:0`. A missing library
    /// or device is [`Error::Unavailable`].
    pub fn new() -> Result<Self> {
        let unavailable = |reason: String| Error::unavailable(WHO, reason);
        let entry = match std::env::var_os(xpu_vulkan::LIBRARY_ENV) {
            // SAFETY: loading the Vulkan loader runs its initialisers; it is designed
            // to be loaded this way.
            Some(path) => unsafe { ash::Entry::load_from(path) },
            // SAFETY: as above.
            None => unsafe { ash::Entry::load() },
        }
        .map_err(|e| unavailable(format!("could not load the Vulkan library: {e}")))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"xpu-bench-raw")
            .api_version(vk::API_VERSION_1_2);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: the create info and what it points to live across the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(|e| unavailable(format!("vkCreateInstance failed: {e:?}")))?;
        let chosen = match choose(&instance) {
            Ok(Some(c)) => c,
            other => {
                // SAFETY: nothing else was created from the instance.
                unsafe { instance.destroy_instance(None) };
                return Err(other.err().unwrap_or_else(|| {
                    unavailable(
                        "no Vulkan 1.2 device with a compute queue, timeline semaphores and \
                         push descriptors"
                            .into(),
                    )
                }));
            }
        };
        let priorities = [1.0f32];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(chosen.family)
            .queue_priorities(&priorities)];
        // The builtin shaders' SPIR-V declares Float64/Int64 when the device has them
        // (as the backend compiles them), so enable what the backend enables.
        let features = vk::PhysicalDeviceFeatures::default()
            .shader_float64(chosen.features.float64)
            .shader_int64(chosen.features.int64);
        let extensions = [ash::khr::push_descriptor::NAME.as_ptr()];
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_features(&features)
            .enabled_extension_names(&extensions);
        // SAFETY: the physical device belongs to this instance; the create info and what
        // it points to live across the call.
        let device = match unsafe { instance.create_device(chosen.handle, &create, None) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: nothing else was created from the instance.
                unsafe { instance.destroy_instance(None) };
                return Err(vk_err("vkCreateDevice")(e));
            }
        };
        let push = ash::khr::push_descriptor::Device::new(&instance, &device);
        // SAFETY: queue 0 of this family was requested at creation.
        let queue = unsafe { device.get_device_queue(chosen.family, 0) };
        // SAFETY: valid physical device.
        let memory = unsafe { instance.get_physical_device_memory_properties(chosen.handle) };
        let name = chosen
            .properties
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ctx = Arc::new(Context {
            _entry: entry,
            instance,
            device,
            push,
            queue,
            memory,
            limits: chosen.properties.limits,
            features: chosen.features,
            unified_memory: matches!(
                chosen.properties.device_type,
                vk::PhysicalDeviceType::CPU | vk::PhysicalDeviceType::INTEGRATED_GPU
            ),
            name,
        });
        let d = &ctx.device;
        let pool_info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(chosen.family);
        // SAFETY: valid device and create info.
        let pool = unsafe { d.create_command_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool belongs to this device.
        let cmd = match unsafe { d.allocate_command_buffers(&alloc) } {
            Ok(v) if !v.is_empty() => v[0],
            other => {
                // SAFETY: the unused pool of this device.
                unsafe { d.destroy_command_pool(pool, None) };
                return Err(vk_err("vkAllocateCommandBuffers")(
                    other.err().unwrap_or(vk::Result::ERROR_UNKNOWN),
                ));
            }
        };
        // SAFETY: valid device and create info.
        let fence = match unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the unused pool of this device (frees its command buffer).
                unsafe { d.destroy_command_pool(pool, None) };
                return Err(vk_err("vkCreateFence")(e));
            }
        };
        Ok(RawVulkan {
            ctx,
            pool,
            cmd,
            fence,

            _one_thread: PhantomData,
        })
    }

    /// The physical device's name (to check that it is the one xpu calls `vulkan:0`).
    pub fn device_name(&self) -> &str {
        &self.ctx.name
    }

    /// The shader features the builtin WGSL is written for on this device.
    pub fn shader_features(&self) -> ShaderFeatures {
        self.ctx.features
    }

    /// The memory type for `memory` among `type_bits`, with the backend's preferences:
    /// on a device that shares memory with the host (a CPU driver, an integrated GPU)
    /// data goes to device-local, host-visible, coherent memory; on a discrete GPU to
    /// device-local memory that is not host-visible.
    fn memory_type(&self, type_bits: u32, memory: Memory) -> Option<u32> {
        use vk::MemoryPropertyFlags as F;
        let props = &self.ctx.memory;
        let types = props
            .memory_types
            .get(..props.memory_type_count as usize)
            .unwrap_or(&[]);
        // (must have, must not have), in order of preference.
        let wanted: &[(F, F)] = match (memory, self.ctx.unified_memory) {
            (Memory::Device, true) => &[
                (
                    F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
                    F::empty(),
                ),
                (F::DEVICE_LOCAL, F::empty()),
                (F::empty(), F::empty()),
            ],
            (Memory::Device, false) => &[
                (F::DEVICE_LOCAL, F::HOST_VISIBLE),
                (F::DEVICE_LOCAL, F::empty()),
                (F::empty(), F::empty()),
            ],
            (Memory::Staging, _) => &[
                (
                    F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
                    F::empty(),
                ),
                (F::HOST_VISIBLE | F::HOST_COHERENT, F::empty()),
            ],
        };
        wanted.iter().find_map(|(have, avoid)| {
            types.iter().enumerate().find_map(|(i, t)| {
                (type_bits & (1 << i) != 0
                    && t.property_flags.contains(*have)
                    && !t.property_flags.intersects(*avoid))
                .then_some(i as u32)
            })
        })
    }

    /// A buffer of `size` bytes (rounded up to 16, like the backend's) in `memory`,
    /// mapped when the memory is host-visible.
    pub fn buffer(&self, size: u64, memory: Memory) -> Result<RawBuffer> {
        let d = &self.ctx.device;
        let info = vk::BufferCreateInfo::default()
            .size(size.div_ceil(16).max(1) * 16)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let buffer = unsafe { d.create_buffer(&info, None) }.map_err(vk_err("vkCreateBuffer"))?;
        // From here on `raw` owns what exists and frees it on any error.
        let mut raw = RawBuffer {
            ctx: self.ctx.clone(),
            buffer,
            memory: vk::DeviceMemory::null(),
            size,
            mapped: None,
            coherent: false,
        };
        // SAFETY: `buffer` was created on this device.
        let req = unsafe { d.get_buffer_memory_requirements(buffer) };
        let type_index = self
            .memory_type(req.memory_type_bits, memory)
            .ok_or_else(|| {
                Error::unsupported(format!("{WHO}: no memory type for a {memory:?} buffer"))
            })?;
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(type_index);
        // SAFETY: valid device and allocate info.
        raw.memory =
            unsafe { d.allocate_memory(&alloc, None) }.map_err(vk_err("vkAllocateMemory"))?;
        // SAFETY: buffer and memory belong to this device; offset 0 is aligned.
        unsafe { d.bind_buffer_memory(buffer, raw.memory, 0) }
            .map_err(vk_err("vkBindBufferMemory"))?;
        let flags = self.ctx.memory.memory_types[type_index as usize].property_flags;
        raw.coherent = flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT);
        if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            // SAFETY: host-visible memory, mapped once for its whole lifetime (freeing
            // the memory unmaps it).
            let p =
                unsafe { d.map_memory(raw.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                    .map_err(vk_err("vkMapMemory"))?;
            raw.mapped = NonNull::new(p.cast::<u8>());
        }
        Ok(raw)
    }

    fn check(&self, b: &RawBuffer, len: u64) -> Result<()> {
        if !Arc::ptr_eq(&b.ctx, &self.ctx) {
            return Err(Error::invalid(format!("{WHO}: a buffer of another device")));
        }
        if len > b.size {
            return Err(Error::invalid(format!(
                "{WHO}: {len} bytes do not fit a buffer of {}",
                b.size
            )));
        }
        Ok(())
    }

    /// Records the command buffer with `record`, submits it, and waits on the fence.
    fn run(&self, record: impl FnOnce(&ash::Device, vk::CommandBuffer)) -> Result<()> {
        let d = &self.ctx.device;
        let cmd = self.cmd;
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the command buffer's last submission completed (every `run` waits on
        // the fence), so it may be reset; the pool allows resetting single buffers.
        unsafe {
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            d.begin_command_buffer(cmd, &begin)
                .map_err(vk_err("vkBeginCommandBuffer"))?;
        }
        record(d, cmd);
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: `cmd` is recording and then executable; the queue is only used by
        // one thread (`RawVulkan` is not `Sync`); the fence is unsignalled
        // (reset after every wait) and waited on before anything else touches it.
        unsafe {
            d.end_command_buffer(cmd)
                .map_err(vk_err("vkEndCommandBuffer"))?;
            d.queue_submit(self.ctx.queue, &submit, self.fence)
                .map_err(vk_err("vkQueueSubmit"))?;
            d.wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vk_err("vkWaitForFences"))?;
            d.reset_fences(&[self.fence])
                .map_err(vk_err("vkResetFences"))?;
        }
        Ok(())
    }

    /// `vkCmdFillBuffer` of the whole buffer with `word` (to touch fresh memory).
    pub fn fill(&self, buf: &RawBuffer, word: u32) -> Result<()> {
        self.check(buf, 0)?;
        let b = buf.buffer;
        self.run(|d, cmd| {
            // SAFETY: `cmd` is recording; the buffer lives until the wait in `run`.
            unsafe { d.cmd_fill_buffer(cmd, b, 0, vk::WHOLE_SIZE, word) }
        })
    }

    /// Copies the first `len` bytes of `src` to `dst` with one `vkCmdCopyBuffer`.
    pub fn copy(&self, src: &RawBuffer, dst: &RawBuffer, len: u64) -> Result<()> {
        self.record_copy(src, dst, len, None, false)
    }

    /// One command buffer: a `vkCmdFillBuffer` of `behind` first (when given), then
    /// the copy, then (when `to_host`) a transfer → host barrier; submit and wait.
    fn record_copy(
        &self,
        src: &RawBuffer,
        dst: &RawBuffer,
        len: u64,
        behind: Option<Behind<'_>>,
        to_host: bool,
    ) -> Result<()> {
        self.check(src, len)?;
        self.check(dst, len)?;
        if let Some(b) = behind {
            self.check_builtin(b.fill, &[b.buffer], b.buffer.size)?;
        }
        let (s, t) = (src.buffer, dst.buffer);
        let region = [vk::BufferCopy {
            src_offset: 0,
            dst_offset: 0,
            size: len,
        }];
        self.run(|d, cmd| {
            if let Some(b) = behind {
                // Independent of the copy (another buffer): no barrier needed.
                self.record_builtin(cmd, b.fill, &[b.buffer], b.buffer.size / 4, 4, 0);
            }
            let host_read = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ)];
            // SAFETY: `cmd` is recording; every buffer lives until the wait in `run` and
            // the region is inside `src` and `dst` (checked above).
            unsafe {
                d.cmd_copy_buffer(cmd, s, t, &region);
                if to_host {
                    d.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &host_read,
                        &[],
                        &[],
                    );
                }
            }
        })
    }

    /// Host → device: `memcpy` of `data` into the mapped `staging` buffer, then one
    /// `vkCmdCopyBuffer` from it into `dst`. With `behind`, the command buffer first
    /// dispatches that fill: a copy queued behind other work.
    pub fn upload(
        &self,
        data: &[u8],
        staging: &RawBuffer,
        dst: &RawBuffer,
        behind: Option<Behind<'_>>,
    ) -> Result<()> {
        let len = data.len() as u64;
        self.check(staging, len)?;
        let ptr = staging
            .mapped
            .ok_or_else(|| Error::invalid(format!("{WHO}: the staging buffer is not mapped")))?;
        // SAFETY: the mapping covers the staging buffer, at least `len` bytes (checked
        // above); no device work uses it now (every `run` waits); the ranges are
        // distinct allocations. Host writes before vkQueueSubmit are visible to it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        self.record_copy(staging, dst, len, behind, false)
    }

    /// Device → host: one `vkCmdCopyBuffer` from `src` into the mapped `staging`
    /// buffer, a transfer → host barrier, the wait, then `memcpy` into `out`. `behind`
    /// as in [`RawVulkan::upload`].
    pub fn download(
        &self,
        src: &RawBuffer,
        staging: &RawBuffer,
        out: &mut [u8],
        behind: Option<Behind<'_>>,
    ) -> Result<()> {
        let len = out.len() as u64;
        let ptr = staging
            .mapped
            .ok_or_else(|| Error::invalid(format!("{WHO}: the staging buffer is not mapped")))?;
        self.record_copy(src, staging, len, behind, true)?;
        // SAFETY: the copy completed and its writes are visible to the host (barrier +
        // fence); the mapping holds at least `len` bytes (checked by `record_copy`).
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// A compute pipeline from SPIR-V with `bindings` storage buffers (push
    /// descriptors, set 0) and `push_size` bytes of push constants.
    pub fn pipeline(&self, spirv: &[u32], bindings: u32, push_size: u32) -> Result<RawPipeline> {
        let d = &self.ctx.device;
        let entry = CString::new(ENTRY_POINT)
            .map_err(|_| Error::invalid(format!("{WHO}: NUL in the entry point")))?;
        // From here on `p` owns what exists and frees it on any error.
        let mut p = RawPipeline {
            ctx: self.ctx.clone(),
            pipeline: vk::Pipeline::null(),
            layout: vk::PipelineLayout::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            module: vk::ShaderModule::null(),
            bindings,
        };
        let module_info = vk::ShaderModuleCreateInfo::default().code(spirv);
        // SAFETY: valid device; the SPIR-V comes from naga.
        p.module = unsafe { d.create_shader_module(&module_info, None) }
            .map_err(vk_err("vkCreateShaderModule"))?;
        let layout_bindings: Vec<vk::DescriptorSetLayoutBinding<'_>> = (0..bindings)
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
            .bindings(&layout_bindings);
        // SAFETY: valid device and create info.
        p.set_layout = unsafe { d.create_descriptor_set_layout(&set_info, None) }
            .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
        let set_layouts = [p.set_layout];
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(push_size)];
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts)
            .push_constant_ranges(if push_size > 0 { &ranges } else { &[] });
        // SAFETY: valid device and create info.
        p.layout = unsafe { d.create_pipeline_layout(&layout_info, None) }
            .map_err(vk_err("vkCreatePipelineLayout"))?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(p.module)
            .name(&entry);
        let info = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(p.layout)];
        // SAFETY: valid device and create info.
        p.pipeline = unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) }
            .map_err(|(_, e)| vk_err("vkCreateComputePipelines")(e))?
            .into_iter()
            .next()
            .unwrap_or_default();
        Ok(p)
    }

    /// The pipeline of the backend's builtin shader `kind`: its WGSL for this device's
    /// features, compiled as the backend compiles it, with the ABI's bindings and push
    /// constants.
    pub fn builtin_pipeline(&self, kind: ShaderKind) -> Result<RawPipeline> {
        let source = xpu_vulkan::builtins::wgsl::source(kind, self.ctx.features)
            .map_err(|e| Error::unsupported(format!("{WHO}: {e}")))?;
        let words = wgsl_to_spirv(&source, ENTRY_POINT)?;
        let bindings = match kind {
            ShaderKind::Fill(_) => 1,
            ShaderKind::Binary(..) => 3,
            ShaderKind::Accumulate(..) | ShaderKind::Scale(_) | ShaderKind::Cast(..) => 2,
        };
        self.pipeline(
            &words,
            bindings,
            std::mem::size_of::<PushConstants>() as u32,
        )
    }

    /// A standard operation ready to run: `dispatch`'s WGSL compiled as the backend
    /// compiles it, a device buffer per tensor holding `tensors[k]` (in binding order),
    /// and the parameter buffer holding `dispatch.params`.
    pub fn op(&self, dispatch: &Dispatch, tensors: &[&[u8]]) -> Result<RawOp> {
        if tensors.len() + 1 != dispatch.bindings as usize {
            return Err(Error::invalid(format!(
                "{WHO}: the operation binds {} tensors, not {}",
                dispatch.bindings.saturating_sub(1),
                tensors.len()
            )));
        }
        let words = wgsl_to_spirv(&dispatch.wgsl, xpu_vulkan::ops_abi::ENTRY_POINT)?;
        let pipeline = self.pipeline(&words, dispatch.bindings, 0)?;
        let mut buffers = Vec::with_capacity(tensors.len() + 1);
        let mut staging: Option<RawBuffer> = None;
        for data in tensors {
            let len = data.len() as u64;
            let s = match staging.take() {
                Some(s) if s.size >= len => s,
                _ => self.buffer(len, Memory::Staging)?,
            };
            let b = self.buffer(len, Memory::Device)?;
            self.upload(data, &s, &b, None)?;
            staging = Some(s);
            buffers.push(b);
        }
        let mut params = self.buffer(dispatch.params.len() as u64, Memory::Staging)?;
        let bytes = params
            .host_bytes_mut()
            .ok_or_else(|| Error::unsupported(format!("{WHO}: no coherent host-visible memory")))?;
        bytes[..dispatch.params.len()].copy_from_slice(&dispatch.params);
        buffers.push(params);
        Ok(RawOp {
            pipeline,
            buffers,
            groups: dispatch.groups,
        })
    }

    /// Runs `op` once: its pipeline, its buffers bound whole with push descriptors, one
    /// `vkCmdDispatch`; then submits and waits.
    pub fn run_op(&self, op: &RawOp) -> Result<()> {
        let p = &op.pipeline;
        if !Arc::ptr_eq(&p.ctx, &self.ctx) {
            return Err(Error::invalid(format!(
                "{WHO}: an operation of another device"
            )));
        }
        let infos: Vec<vk::DescriptorBufferInfo> = op
            .buffers
            .iter()
            .map(|b| vk::DescriptorBufferInfo {
                buffer: b.buffer,
                offset: 0,
                range: vk::WHOLE_SIZE,
            })
            .collect();
        let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(std::slice::from_ref(info))
            })
            .collect();
        let [x, y, z] = op.groups;
        self.run(|d, cmd| {
            // SAFETY: `cmd` is recording; the pipeline and buffers belong to this device
            // (checked above: all of `op` was made by `RawVulkan::op` on it) and outlive
            // the wait in `run`; one buffer per binding of the layout.
            unsafe {
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.pipeline);
                self.ctx.push.cmd_push_descriptor_set(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    p.layout,
                    0,
                    &writes,
                );
                d.cmd_dispatch(cmd, x, y, z);
            }
        })
    }

    /// Records one builtin operation over `count` elements of `elem` bytes each:
    /// `buffers[0]` is the destination, the rest the sources (all from offset 0),
    /// split into pieces that fit the largest storage binding exactly as the backend
    /// splits them, each piece one `vkCmdDispatch` of
    /// `min(ceil(count / WORKGROUP_SIZE), MAX_GROUPS)` workgroups.
    fn record_builtin(
        &self,
        cmd: vk::CommandBuffer,
        p: &RawPipeline,
        buffers: &[&RawBuffer],
        count: u64,
        elem: u64,
        scalar: u64,
    ) {
        let d = &self.ctx.device;
        let max_range = u64::from(self.ctx.limits.max_storage_buffer_range);
        let per_piece = ((max_range.saturating_sub(BINDING_ALIGN + 8)) / elem / 4 * 4).max(4);
        let mut first = 0u64;
        while first < count {
            let n = per_piece.min(count - first);
            let at = first * elem;
            let base = at - at % BINDING_ALIGN;
            let rel = at - base;
            let infos: Vec<vk::DescriptorBufferInfo> = buffers
                .iter()
                .map(|b| vk::DescriptorBufferInfo {
                    buffer: b.buffer,
                    offset: base,
                    range: ((rel + n * elem).div_ceil(4) * 4).min(b.size.div_ceil(16) * 16 - base),
                })
                .collect();
            let writes: Vec<vk::WriteDescriptorSet<'_>> = infos
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_binding(i as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(std::slice::from_ref(info))
                })
                .collect();
            let offset = (rel / elem) as u32;
            let pc = PushConstants {
                dst_offset: offset,
                a_offset: if buffers.len() > 1 { offset } else { 0 },
                b_offset: if buffers.len() > 2 { offset } else { 0 },
                count: n as u32,
                scalar_lo: scalar as u32,
                scalar_hi: (scalar >> 32) as u32,
                pad: [0; 2],
            };
            let groups = n
                .div_ceil(u64::from(WORKGROUP_SIZE))
                .min(u64::from(MAX_GROUPS)) as u32;
            // SAFETY: `cmd` is recording; the pipeline and buffers outlive the
            // submission (the caller waits for it); the bindings lie inside the buffers
            // and the push range matches the layout.
            unsafe {
                d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, p.pipeline);
                self.ctx.push.cmd_push_descriptor_set(
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
            first += n;
        }
    }

    fn check_builtin(&self, p: &RawPipeline, buffers: &[&RawBuffer], bytes: u64) -> Result<()> {
        if !Arc::ptr_eq(&p.ctx, &self.ctx) || buffers.len() != p.bindings as usize {
            return Err(Error::invalid(format!(
                "{WHO}: the pipeline takes {} buffers of this device",
                p.bindings
            )));
        }
        buffers.iter().try_for_each(|b| self.check(b, bytes))
    }

    /// Runs a builtin operation `times` times in one command buffer, a compute →
    /// compute memory barrier between consecutive operations (they touch the same
    /// bytes), then submits once and waits. `buffers`, `count` and `elem` as in a single
    /// operation; `scalar` is the fill value / scale factor's little-endian bits.
    pub fn builtin(
        &self,
        p: &RawPipeline,
        buffers: &[&RawBuffer],
        count: u64,
        elem: u64,
        scalar: u64,
        times: usize,
    ) -> Result<()> {
        self.check_builtin(p, buffers, count * elem)?;
        self.run(|d, cmd| {
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
            for i in 0..times {
                if i > 0 {
                    // SAFETY: `cmd` is recording.
                    unsafe {
                        d.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::COMPUTE_SHADER,
                            vk::PipelineStageFlags::COMPUTE_SHADER,
                            vk::DependencyFlags::empty(),
                            &barrier,
                            &[],
                            &[],
                        )
                    };
                }
                self.record_builtin(cmd, p, buffers, count, elem, scalar);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use xpu_hal::{BinaryOp, DType};

    fn raw() -> Option<RawVulkan> {
        match RawVulkan::new() {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn copies_round_trip() {
        let Some(raw) = raw() else { return };
        let len = 4096 + 12;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let staging = raw.buffer(len as u64, Memory::Staging).unwrap();
        let a = raw.buffer(len as u64, Memory::Device).unwrap();
        let b = raw.buffer(len as u64, Memory::Device).unwrap();
        raw.upload(&data, &staging, &a, None).unwrap();
        raw.fill(&staging, 0).unwrap();
        raw.copy(&a, &b, len as u64).unwrap();
        let mut out = vec![0u8; len];
        let fill = raw
            .builtin_pipeline(ShaderKind::Fill(xpu_hal::DType::F32))
            .unwrap();
        let behind = Behind {
            fill: &fill,
            buffer: &a,
        };
        raw.download(&b, &staging, &mut out, Some(behind)).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn the_builtin_add_adds() {
        let Some(raw) = raw() else { return };
        let p = raw
            .builtin_pipeline(ShaderKind::Binary(BinaryOp::Sum, DType::F32))
            .unwrap();
        let n = 1000u64;
        let bytes = n * 4;
        let staging = raw.buffer(bytes, Memory::Staging).unwrap();
        let [dst, a, b] = [0, 1, 2].map(|_| raw.buffer(bytes, Memory::Device).unwrap());
        let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let bv: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
        raw.upload(bytemuck::cast_slice(&av), &staging, &a, None)
            .unwrap();
        let fill = raw.builtin_pipeline(ShaderKind::Fill(DType::F32)).unwrap();
        let behind = Behind {
            fill: &fill,
            buffer: &dst,
        };
        raw.upload(bytemuck::cast_slice(&bv), &staging, &b, Some(behind))
            .unwrap();
        raw.builtin(&p, &[&dst, &a, &b], n, 4, 0, 3).unwrap();
        let mut out = vec![0u8; bytes as usize];
        raw.download(&dst, &staging, &mut out, None).unwrap();
        let want: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x + y).collect();
        assert_eq!(f32s(&out), want);
        assert!(raw.builtin(&p, &[&dst, &a], n, 4, 0, 1).is_err());
    }

    #[test]
    fn the_backend_matmul_multiplies() {
        use xpu_hal::ops::{Layout, Op};
        let Some(raw) = raw() else { return };
        let (m, n, k) = (37u64, 45u64, 29u64);
        let l = |r, c| Layout::contiguous(DType::F32, &[r, c]).unwrap();
        let op = Op::Matmul {
            a: l(m, k),
            b: l(k, n),
            c: l(m, n),
            trans_a: false,
            trans_b: false,
            alpha: 2.0,
            beta: 0.0,
        };
        let dispatch = xpu_vulkan::ops_abi::matmul(&op, raw.shader_features()).unwrap();
        let av: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let bv: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        // c holds NaN: with beta 0 it must not be read.
        let cv = vec![f32::NAN; (m * n) as usize];
        let data = [&av, &bv, &cv].map(|v| bytemuck::cast_slice::<f32, u8>(v));
        let p = raw.op(&dispatch, &data).unwrap();
        raw.run_op(&p).unwrap();
        let bytes = (m * n * 4) as usize;
        let staging = raw.buffer(bytes as u64, Memory::Staging).unwrap();
        let mut out = vec![0u8; bytes];
        raw.download(p.tensor(2).unwrap(), &staging, &mut out, None)
            .unwrap();
        let got = f32s(&out);
        for i in 0..m as usize {
            for j in 0..n as usize {
                let want: f32 = (0..k as usize)
                    .map(|q| av[i * k as usize + q] * bv[q * n as usize + j])
                    .sum::<f32>()
                    * 2.0;
                assert_eq!(got[i * n as usize + j], want, "c[{i}, {j}]");
            }
        }
        assert!(p.tensor(3).is_none());
    }
}
