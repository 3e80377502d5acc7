//! Device memory: one `VkBuffer` bound to its own `VkDeviceMemory` per allocation,
//! mapped persistently when the memory is host-visible. Staging buffers are the same
//! object in host-visible memory.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use xpu_hal::{Error, RawAllocation, Result};

use crate::device::DeviceShared;
use crate::error::VkResultExt;

/// Where an allocation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Device memory for data (device-local where the device has it).
    Device,
    /// Host-visible memory for transfers.
    Staging,
}

/// A Vulkan buffer with its memory.
pub struct VulkanBuffer {
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    size: u64,
    /// The buffer's real size: `size` rounded up to 16 bytes, so that shaders may read
    /// whole 32-bit words at the end of any range.
    bound: u64,
    mapped: Option<NonNull<u8>>,
    /// Whether the mapping is coherent (no flush or invalidate needed).
    coherent: bool,
    accounted: bool,
}

// SAFETY: Vulkan buffer and memory handles may be used from any thread; the mapped
// pointer is only dereferenced under the stream-ordering rules of the HAL contract.
unsafe impl Send for VulkanBuffer {}
// SAFETY: as above.
unsafe impl Sync for VulkanBuffer {}

impl VulkanBuffer {
    pub(crate) fn new(device: &Arc<DeviceShared>, size: u64, placement: Placement) -> Result<Self> {
        let name = device.name.as_str();
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let bound = size.div_ceil(16).saturating_mul(16);
        let info = vk::BufferCreateInfo::default()
            .size(bound)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        if placement == Placement::Device {
            device.reserve(size)?;
        }
        let release = |d: &DeviceShared| {
            if placement == Placement::Device {
                d.release(size);
            }
        };
        // SAFETY: valid device and create info.
        let buffer =
            match unsafe { device.device.create_buffer(&info, None) }.vk(name, "vkCreateBuffer") {
                Ok(b) => b,
                Err(e) => {
                    release(device);
                    return Err(e);
                }
            };
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { device.device.get_buffer_memory_requirements(buffer) };
        let Some(type_index) = device.memory_type(req.memory_type_bits, placement) else {
            // SAFETY: unused buffer of this device.
            unsafe { device.device.destroy_buffer(buffer, None) };
            release(device);
            return Err(Error::unsupported(format!(
                "{name} has no suitable memory type for a {placement:?} buffer"
            )));
        };
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(type_index);
        // SAFETY: valid device and allocate info.
        let memory = match unsafe { device.device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unused buffer of this device.
                unsafe { device.device.destroy_buffer(buffer, None) };
                release(device);
                return Err(match e {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                        Error::OutOfMemory {
                            device: name.to_string(),
                            requested: size,
                            free: device.free_bytes(),
                            capacity: device.heap_size,
                            hint: format!("vkAllocateMemory failed with {e:?}; free allocations or use smaller ones"),
                        }
                    }
                    other => crate::error::vk_error(name, "vkAllocateMemory", other),
                });
            }
        };
        let cleanup = |d: &DeviceShared| {
            // SAFETY: both handles belong to this device and are unused.
            unsafe {
                d.device.destroy_buffer(buffer, None);
                d.device.free_memory(memory, None);
            }
            release(d);
        };
        // SAFETY: buffer and memory belong to this device; offset 0 satisfies alignment.
        if let Err(e) = unsafe { device.device.bind_buffer_memory(buffer, memory, 0) }
            .vk(name, "vkBindBufferMemory")
        {
            cleanup(device);
            return Err(e);
        }
        let flags = device.memory_properties.memory_types[type_index as usize].property_flags;
        let host_visible = flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE);
        let coherent = flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT);
        let mapped = if host_visible {
            // SAFETY: host-visible memory, mapped once for its whole lifetime.
            match unsafe {
                device
                    .device
                    .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .vk(name, "vkMapMemory")
            {
                Ok(p) => NonNull::new(p as *mut u8),
                Err(e) => {
                    cleanup(device);
                    return Err(e);
                }
            }
        } else {
            None
        };
        Ok(VulkanBuffer {
            device: device.clone(),
            buffer,
            memory,
            size,
            bound,
            mapped,
            coherent,
            accounted: placement == Placement::Device,
        })
    }

    /// The mapped bytes, when the memory is host-visible.
    pub(crate) fn mapped(&self) -> Option<NonNull<u8>> {
        self.mapped
    }

    /// The mapped bytes, when the host can read and write them directly without flushes
    /// (host-visible and coherent).
    pub(crate) fn host_direct(&self) -> Option<*mut u8> {
        self.mapped.filter(|_| self.coherent).map(NonNull::as_ptr)
    }

    /// Bytes that may be bound from the buffer (its size rounded up to 16).
    pub(crate) fn bound(&self) -> u64 {
        self.bound
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        // SAFETY: both handles belong to `self.device`, which outlives them (held by the
        // Arc); the stream contract guarantees no queued work still uses the buffer
        // (work holds an Arc to it until it completes).
        unsafe {
            self.device.device.destroy_buffer(self.buffer, None);
            self.device.device.free_memory(self.memory, None);
        }
        if self.accounted {
            self.device.release(self.size);
        }
    }
}

impl RawAllocation for VulkanBuffer {
    fn size(&self) -> u64 {
        self.size
    }

    fn host_address(&self) -> Option<NonNull<u8>> {
        self.host_direct().and_then(NonNull::new)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
