//! Host memory imported as device buffers (`VK_EXT_external_memory_host`): what
//! [`xpu_hal::Device::pin_host`] makes on a Vulkan device.
//!
//! The pages of a host buffer become a `VkDeviceMemory` bound to a `VkBuffer` over the
//! whole range, so a copy between device memory and that host buffer is one
//! `vkCmdCopyBuffer` in the stream's batch: no staging buffer and, for a download, no
//! `memcpy` on the completion thread once the batch completes (the batch's closing
//! host-read barrier makes the device's writes visible, as for staging buffers). The
//! import needs a host-coherent memory type among those the driver allows for the
//! pointer, and the range aligned to the device's `minImportedHostPointerAlignment`;
//! where either is missing, nothing is imported and copies stage as before.

use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use xpu_hal::{Pin, Result};

use crate::device::DeviceShared;
use crate::error::VkResultExt;

/// A device's means to import host memory.
pub(crate) struct HostImport {
    pub(crate) ext: ash::ext::external_memory_host::Device,
    /// `minImportedHostPointerAlignment`: pointer and size must be multiples of it.
    pub(crate) align: u64,
}

/// One host range imported on one device; released when dropped, before the HAL frees
/// the host memory.
pub struct VulkanPin {
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

// SAFETY: Vulkan handles may be used from any thread; the pin holds no host pointer.
unsafe impl Send for VulkanPin {}
// SAFETY: as above.
unsafe impl Sync for VulkanPin {}

impl Drop for VulkanPin {
    fn drop(&mut self) {
        // SAFETY: both handles belong to `self.device` (kept alive by the Arc); work that
        // copies through the buffer holds this pin until it completes.
        unsafe {
            self.device.device.destroy_buffer(self.buffer, None);
            self.device.device.free_memory(self.memory, None);
        }
    }
}

const HANDLE: vk::ExternalMemoryHandleTypeFlags =
    vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

/// Imports `len` bytes at `ptr` as a buffer of `device`, or `None` where the device
/// cannot (no extension, misaligned range, no host-coherent memory type for it).
pub(crate) fn import(
    device: &Arc<DeviceShared>,
    ptr: NonNull<u8>,
    len: usize,
) -> Result<Option<Pin>> {
    let Some(host) = &device.host_import else {
        return Ok(None);
    };
    let name = device.name.as_str();
    let (addr, size) = (ptr.as_ptr() as u64, len as u64);
    if addr % host.align != 0 || size % host.align != 0 {
        return Ok(None);
    }
    let mut props = vk::MemoryHostPointerPropertiesEXT::default();
    // SAFETY: the extension is enabled on this device, so its function pointer is
    // loaded; the device handle is the one it was loaded for; `props` is writable.
    unsafe {
        (host.ext.fp().get_memory_host_pointer_properties_ext)(
            host.ext.device(),
            HANDLE,
            ptr.as_ptr().cast_const().cast(),
            &mut props,
        )
    }
    .result()
    .vk(name, "vkGetMemoryHostPointerPropertiesEXT")?;
    let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HANDLE);
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: valid device and create info (the chained struct lives across the call).
    let buffer = unsafe { device.device.create_buffer(&info, None) }.vk(name, "vkCreateBuffer")?;
    // SAFETY: `buffer` was just created on this device.
    let req = unsafe { device.device.get_buffer_memory_requirements(buffer) };
    let coherent = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let types = &device.memory_properties.memory_types
        [..device.memory_properties.memory_type_count as usize];
    let allowed = props.memory_type_bits & req.memory_type_bits;
    let type_index = types
        .iter()
        .enumerate()
        .position(|(i, t)| allowed & (1 << i) != 0 && t.property_flags.contains(coherent));
    let Some(type_index) = type_index.filter(|_| req.size <= size) else {
        // SAFETY: unused buffer of this device.
        unsafe { device.device.destroy_buffer(buffer, None) };
        return Ok(None);
    };
    let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
        .handle_type(HANDLE)
        .host_pointer(ptr.as_ptr().cast());
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(size)
        .memory_type_index(type_index as u32)
        .push_next(&mut import);
    // SAFETY: valid device and allocate info; the host range is aligned as the device
    // requires and stays valid while the memory exists (HAL contract).
    let memory = match unsafe { device.device.allocate_memory(&alloc, None) }
        .vk(name, "vkAllocateMemory (importing host memory)")
    {
        Ok(m) => m,
        Err(e) => {
            // SAFETY: unused buffer of this device.
            unsafe { device.device.destroy_buffer(buffer, None) };
            return Err(e);
        }
    };
    // SAFETY: buffer and memory belong to this device; offset 0 satisfies alignment.
    if let Err(e) = unsafe { device.device.bind_buffer_memory(buffer, memory, 0) }
        .vk(name, "vkBindBufferMemory")
    {
        // SAFETY: both handles belong to this device and are unused.
        unsafe {
            device.device.destroy_buffer(buffer, None);
            device.device.free_memory(memory, None);
        }
        return Err(e);
    }
    Ok(Some(Arc::new(VulkanPin {
        device: device.clone(),
        buffer,
        memory,
    })))
}

/// The buffer importing `memory` on `device`, if the HAL pinned it for that device.
pub(crate) fn pinned(
    memory: &xpu_hal::HostMemory,
    device: &Arc<DeviceShared>,
) -> Option<Arc<VulkanPin>> {
    memory.pin::<VulkanPin>(|p| Arc::ptr_eq(&p.device, device))
}
