//! [`VulkanDevice`]: one logical device on one physical device, with its queue, its
//! memory types, and the pipelines built for it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;
use xpu_hal::backend::{DeviceImpl, StreamImpl};
use xpu_hal::{
    Capabilities, DeviceInfo, DeviceKind, Error, KernelDesc, KernelFormat, KernelImpl, MemoryInfo,
    RawAllocation, Result,
};

use crate::builtins::abi::{ShaderFeatures, ShaderKind};
use crate::error::VkResultExt;
use crate::instance::{Instance, PhysicalInfo};
use crate::memory::{Placement, VulkanBuffer};
use crate::pipeline::Pipeline;
use crate::retire::Graveyard;
use crate::stream::VulkanStream;

/// A WGSL kernel's identity in the compile cache: its source and entry point.
pub(crate) type WgslKey = (String, String);

/// Everything the device's objects share. Destroyed after the last of them.
pub struct DeviceShared {
    /// Keeps the instance alive until the device is destroyed (fields drop after
    /// `Drop::drop` has destroyed the device).
    _instance: Arc<Instance>,
    pub(crate) device: ash::Device,
    pub(crate) push: ash::khr::push_descriptor::Device,
    /// Importing host memory as buffers (`VK_EXT_external_memory_host`), where the
    /// device can.
    pub(crate) host_import: Option<crate::pinned::HostImport>,
    /// Queues of the chosen family, each behind its own lock (`vkQueueSubmit` needs
    /// external synchronisation). Streams take them round-robin.
    pub(crate) queues: Vec<Mutex<vk::Queue>>,
    next_queue: AtomicU64,
    pub(crate) queue_family: u32,
    pub(crate) memory_properties: vk::PhysicalDeviceMemoryProperties,
    pub(crate) limits: vk::PhysicalDeviceLimits,
    pub(crate) features: ShaderFeatures,
    /// Whether the device shares memory with the host (a CPU driver or an integrated
    /// GPU): then device data lives in host-visible memory and idle streams copy with
    /// `memcpy`.
    pub(crate) unified_memory: bool,
    /// Nanoseconds per timestamp tick, when the queue family writes timestamps.
    pub(crate) timestamp_period: Option<f64>,
    /// `vulkan:N`, for messages.
    pub(crate) name: String,
    pub(crate) heap_size: u64,
    max_allocation: u64,
    allocated: AtomicU64,
    pub(crate) builtin_pipelines: Mutex<HashMap<ShaderKind, Arc<Pipeline>>>,
    /// Pipelines of the standard operations, by shader text.
    pub(crate) op_pipelines: crate::ops::OpPipelines,
    /// SPIR-V of the WGSL kernels compiled so far, by (source, entry point), so that
    /// loading the same kernel again does not run naga again.
    pub(crate) wgsl_cache: Mutex<HashMap<WgslKey, Arc<Vec<u32>>>>,
    /// Objects of dropped streams that the queues may still refer to (see `retire`).
    pub(crate) graveyard: Graveyard,
    info: DeviceInfo,
}

// SAFETY: ash::Device is a function table plus a handle; Vulkan devices may be used from
// any thread, and the externally synchronised objects (queues) are behind mutexes.
unsafe impl Send for DeviceShared {}
// SAFETY: as above.
unsafe impl Sync for DeviceShared {}

impl DeviceShared {
    /// Reserves accounted bytes for a new allocation.
    pub(crate) fn reserve(&self, size: u64) -> Result<()> {
        let mut used = self.allocated.load(Ordering::Relaxed);
        loop {
            let free = self.heap_size.saturating_sub(used);
            if size > free {
                return Err(Error::OutOfMemory {
                    device: self.name.clone(),
                    requested: size,
                    free,
                    capacity: self.heap_size,
                    hint: "free allocations you no longer need".to_string(),
                });
            }
            match self.allocated.compare_exchange_weak(
                used,
                used + size,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    /// Returns accounted bytes.
    pub(crate) fn release(&self, size: u64) {
        self.allocated.fetch_sub(size, Ordering::AcqRel);
    }

    /// Bytes not allocated through xpu.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.heap_size
            .saturating_sub(self.allocated.load(Ordering::Acquire))
    }

    /// The memory type index for `placement` among `type_bits`.
    ///
    /// Device data goes to memory that is device-local *and* host-visible on a device
    /// that shares memory with the host (a CPU driver or an integrated GPU), so that
    /// copies can be plain `memcpy`s; on a discrete GPU it goes to device-local memory
    /// that is not host-visible (host-visible VRAM is scarce and slow to read).
    pub(crate) fn memory_type(&self, type_bits: u32, placement: Placement) -> Option<u32> {
        use vk::MemoryPropertyFlags as F;
        let types = &self.memory_properties.memory_types
            [..self.memory_properties.memory_type_count as usize];
        // (must have, must not have), in order of preference.
        let wanted: &[(F, F)] = match (placement, self.unified_memory) {
            (Placement::Device, true) => &[
                (
                    F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT,
                    F::empty(),
                ),
                (F::DEVICE_LOCAL, F::empty()),
                (F::empty(), F::empty()),
            ],
            (Placement::Device, false) => &[
                (F::DEVICE_LOCAL, F::HOST_VISIBLE),
                (F::DEVICE_LOCAL, F::empty()),
                (F::empty(), F::empty()),
            ],
            (Placement::Staging, _) => &[
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

    /// A queue for a new stream, round-robin over the family's queues.
    pub(crate) fn pick_queue(&self) -> usize {
        (self.next_queue.fetch_add(1, Ordering::Relaxed) as usize) % self.queues.len().max(1)
    }

    /// The device's static description.
    pub(crate) fn info(&self) -> &DeviceInfo {
        &self.info
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        if let Ok(pipes) = self.builtin_pipelines.get_mut() {
            pipes.clear();
        }
        if let Ok(pipes) = self.op_pipelines.get_mut() {
            pipes.clear();
        }
        // SAFETY: every object of this device holds an Arc to it, so none is left; once
        // the device is idle no submission refers to the retired objects.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.graveyard.destroy_all(&self.device);
            self.device.destroy_device(None);
        }
    }
}

fn vendor_name(id: u32) -> String {
    match id {
        0x10DE => "NVIDIA".into(),
        0x1002 => "AMD".into(),
        0x8086 => "Intel".into(),
        0x13B5 => "ARM".into(),
        0x5143 => "Qualcomm".into(),
        0x106B => "Apple".into(),
        0x10005 => "Mesa".into(),
        other => format!("0x{other:04x}"),
    }
}

/// The `DeviceInfo::extra` key saying whether, and with what alignment, the device
/// imports host memory (`none`, or `aligned to N bytes`).
pub const HOST_IMPORT_KEY: &str = "host_import";

/// Whether `device` is a Vulkan device that imports host memory
/// (`VK_EXT_external_memory_host`), so that [`xpu_hal::Device::pin_host`] pins host buffers
/// of a page or more for it.
pub fn imports_host_memory(device: &xpu_hal::Device) -> bool {
    device.backend() == crate::NAME
        && device
            .info()
            .extra_value(HOST_IMPORT_KEY)
            .is_some_and(|v| v != "none")
}

/// A Vulkan device as an xpu device.
pub struct VulkanDevice {
    pub(crate) shared: Arc<DeviceShared>,
}

impl VulkanDevice {
    pub(crate) fn new(
        instance: Arc<Instance>,
        physical: &PhysicalInfo,
        index: u32,
    ) -> Result<Self> {
        let name = format!("vulkan:{index}");
        let priorities = vec![1.0f32; physical.queue_count.clamp(1, 4) as usize];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(physical.queue_family)
            .queue_priorities(&priorities)];
        let features = vk::PhysicalDeviceFeatures::default()
            .shader_float64(physical.float64)
            .shader_int64(physical.int64);
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let mut extensions = vec![ash::khr::push_descriptor::NAME.as_ptr()];
        if physical.host_import_align.is_some() {
            extensions.push(ash::ext::external_memory_host::NAME.as_ptr());
        }
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_features(&features)
            .enabled_extension_names(&extensions)
            .push_next(&mut v12);
        // SAFETY: the physical device belongs to this instance; the create info and
        // everything it points to live across the call.
        let device = unsafe {
            instance
                .instance
                .create_device(physical.handle, &create, None)
        }
        .vk(&name, "vkCreateDevice")?;
        let push = ash::khr::push_descriptor::Device::new(&instance.instance, &device);
        let host_import = physical
            .host_import_align
            .map(|align| crate::pinned::HostImport {
                ext: ash::ext::external_memory_host::Device::new(&instance.instance, &device),
                align,
            });
        let queues = (0..priorities.len() as u32)
            // SAFETY: the queue family and index were requested at creation.
            .map(|i| Mutex::new(unsafe { device.get_device_queue(physical.queue_family, i) }))
            .collect();
        let heap_size = physical.memory.memory_heaps[..physical.memory.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        let mut v11 = vk::PhysicalDeviceVulkan11Properties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut v11);
        // SAFETY: valid physical device; chained struct lives across the call.
        unsafe {
            instance
                .instance
                .get_physical_device_properties2(physical.handle, &mut props2)
        };
        let max_allocation = v11.max_memory_allocation_size.min(heap_size).max(1);
        let shader_features = ShaderFeatures {
            float64: physical.float64,
            int64: physical.int64,
        };
        let p = &physical.properties;
        let unified_memory = matches!(
            p.device_type,
            vk::PhysicalDeviceType::CPU | vk::PhysicalDeviceType::INTEGRATED_GPU
        );
        // Device data lands in memory the CPU maps coherently (see `memory_type`).
        let host_addressable = unified_memory && {
            use vk::MemoryPropertyFlags as F;
            let wanted = F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT;
            physical.memory.memory_types[..physical.memory.memory_type_count as usize]
                .iter()
                .any(|t| t.property_flags.contains(wanted))
        };
        let info = DeviceInfo {
            name: physical.name.clone(),
            kind: match p.device_type {
                vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
                vk::PhysicalDeviceType::DISCRETE_GPU
                | vk::PhysicalDeviceType::INTEGRATED_GPU
                | vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Gpu,
                _ => DeviceKind::Other,
            },
            vendor: vendor_name(p.vendor_id),
            driver: format!(
                "Vulkan {}.{}.{}, driver 0x{:x}, subgroup {}",
                vk::api_version_major(p.api_version),
                vk::api_version_minor(p.api_version),
                vk::api_version_patch(p.api_version),
                p.driver_version,
                physical.subgroup_size
            ),
            memory_bytes: heap_size,
            capabilities: Capabilities {
                dtypes: shader_features.dtypes(),
                max_allocation,
                peer_access: false,
                timeline_events: true,
                event_timing: true,
                kernel_formats: vec![KernelFormat::Wgsl, KernelFormat::SpirV],
                max_streams: u32::MAX,
                kernel_arg_alignment: p.limits.min_storage_buffer_offset_alignment.max(1),
                virtual_memory_granularity: None,
                host_addressable,
                ops: crate::ops::supported(shader_features),
            },
            extra: vec![
                format!("subgroup_size={}", physical.subgroup_size),
                format!(
                    "max_storage_buffer_range={}",
                    p.limits.max_storage_buffer_range
                ),
                format!("queues={}", physical.queue_count),
                format!("unified_memory={unified_memory}"),
                format!(
                    "{HOST_IMPORT_KEY}={}",
                    physical
                        .host_import_align
                        .map_or("none".to_string(), |a| format!("aligned to {a} bytes"))
                ),
            ],
        };
        Ok(VulkanDevice {
            shared: Arc::new(DeviceShared {
                _instance: instance,
                device,
                push,
                host_import,
                queues,
                next_queue: AtomicU64::new(0),
                queue_family: physical.queue_family,
                memory_properties: physical.memory,
                limits: p.limits,
                features: shader_features,
                unified_memory,
                timestamp_period: (physical.timestamp_bits > 0
                    && p.limits.timestamp_compute_and_graphics == vk::TRUE)
                    .then_some(f64::from(p.limits.timestamp_period)),
                name,
                heap_size,
                max_allocation,
                allocated: AtomicU64::new(0),
                builtin_pipelines: Mutex::new(HashMap::new()),
                op_pipelines: Mutex::new(HashMap::new()),
                wgsl_cache: Mutex::new(HashMap::new()),
                graveyard: Graveyard::default(),
                info,
            }),
        })
    }
}

impl DeviceImpl for VulkanDevice {
    fn info(&self) -> DeviceInfo {
        self.shared.info().clone()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            total: self.shared.heap_size,
            free: self.shared.free_bytes(),
        })
    }

    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>> {
        if size > self.shared.max_allocation {
            return Err(Error::OutOfMemory {
                device: self.shared.name.clone(),
                requested: size,
                free: self.shared.free_bytes(),
                capacity: self.shared.heap_size,
                hint: format!(
                    "the largest single allocation is {} bytes",
                    self.shared.max_allocation
                ),
            });
        }
        Ok(Arc::new(VulkanBuffer::new(
            &self.shared,
            size,
            Placement::Device,
        )?))
    }

    fn pin_host(&self, ptr: std::ptr::NonNull<u8>, len: usize) -> Result<Option<xpu_hal::Pin>> {
        crate::pinned::import(&self.shared, ptr, len)
    }

    fn create_stream(&self) -> Result<Box<dyn StreamImpl>> {
        Ok(Box::new(VulkanStream::new(self.shared.clone())?))
    }

    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>> {
        Ok(Arc::new(crate::kernel::VulkanKernel::load(
            &self.shared,
            desc,
        )?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
