//! # xpu-vulkan: any Vulkan 1.2+ compute device as an xpu device
//!
//! Every physical device with a compute queue, timeline semaphores and push
//! descriptors becomes `vulkan:N` — an AMD, Intel or NVIDIA GPU, or Mesa's lavapipe on
//! the CPU. The library is loaded at run time (ash's loaded entry, or the file named by
//! `XPU_VULKAN_LIBRARY`); without it, or without a driver, the backend is
//! `Unavailable` with the loader's reason and lists no devices.
//!
//! ## Shape
//!
//! - `instance` — loading, the instance (with the Khronos validation layer and a
//!   message log when `XPU_VULKAN_VALIDATION=1`), and the physical devices' facts.
//! - [`VulkanDevice`] — a logical device: queues behind locks, memory types, limits,
//!   and the builtin pipelines built so far.
//! - `memory` — one `VkBuffer` with its own memory per allocation (device-local, and
//!   mapped when it is also host-visible); staging buffers in host-visible memory.
//!   Sub-allocation is the HAL's `(allocation, offset, length)` addressing.
//! - `pinned` — host memory imported as buffers (`VK_EXT_external_memory_host`) when
//!   the HAL pins a host buffer for the device, so copies to and from it are one
//!   `vkCmdCopyBuffer` with no staging buffer or host step.
//! - [`VulkanStream`] — operations recorded into a batch separated by full barriers,
//!   submitted with a timeline-semaphore signal; a completion thread per stream runs
//!   read-backs, completes events and releases resources in order, and runs *host
//!   steps* (waits on other devices' or backends' events, ordered host reads) that later
//!   batches wait for through a second timeline semaphore.
//! - [`VulkanEvent`] — a semaphore value plus a stream position.
//! - `builtins` — every builtin operation as a WGSL compute shader compiled by naga,
//!   one cached pipeline per operation and dtype, ranges larger than the largest
//!   storage binding bound in pieces.
//! - `ops` — the standard operations as WGSL compute shaders; [`ops_abi`] describes
//!   one of their dispatches for a raw Vulkan program (the benchmarks' reference).
//! - `kernel` — user kernels in WGSL (naga) or SPIR-V; buffers bound with push
//!   descriptors, scalars in push constants.

pub mod builtins;
mod device;
mod error;
mod event;
mod instance;
mod kernel;
mod memory;
mod ops;
pub mod ops_abi;
mod pinned;
mod pipeline;
mod retire;
mod shader;
mod staging;
mod stream;

use std::sync::{Arc, OnceLock};

use xpu_hal::backend::{Backend, DeviceImpl, DeviceSummary};
use xpu_hal::{Error, Result};

pub use device::{imports_host_memory, VulkanDevice, HOST_IMPORT_KEY};
pub use event::VulkanEvent;
pub use instance::{Instance, LoadOptions, ValidationLog, LIBRARY_ENV, VALIDATION_ENV};
pub use stream::VulkanStream;

/// The backend's registered name.
pub const NAME: &str = "vulkan";

/// The Vulkan backend. Loading happens on first enumeration.
pub struct VulkanBackend {
    options: LoadOptions,
    instance: OnceLock<std::result::Result<Arc<Instance>, String>>,
}

impl Default for VulkanBackend {
    fn default() -> Self {
        VulkanBackend::new()
    }
}

impl VulkanBackend {
    /// A backend configured from `XPU_VULKAN_LIBRARY` and `XPU_VULKAN_VALIDATION`,
    /// loading Vulkan on first use.
    pub fn new() -> Self {
        VulkanBackend::with_options(LoadOptions::from_env())
    }

    /// A backend with explicit load options.
    pub fn with_options(options: LoadOptions) -> Self {
        VulkanBackend {
            options,
            instance: OnceLock::new(),
        }
    }

    fn instance(&self) -> Result<Arc<Instance>> {
        self.instance
            .get_or_init(|| match Instance::load(&self.options) {
                Ok(i) => Ok(Arc::new(i)),
                Err(Error::Unavailable { reason, .. }) => Err(reason),
                Err(other) => Err(other.to_string()),
            })
            .clone()
            .map_err(|reason| Error::unavailable(NAME, reason))
    }

    /// The validation layer's message log, when the instance was loaded with
    /// `XPU_VULKAN_VALIDATION=1` (and `None` before the first enumeration).
    pub fn validation_log(&self) -> Option<Arc<ValidationLog>> {
        match self.instance.get() {
            Some(Ok(i)) => Some(i.log.clone()),
            _ => None,
        }
    }
}

impl std::fmt::Debug for VulkanBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanBackend").finish_non_exhaustive()
    }
}

impl Backend for VulkanBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn enumerate(&self) -> Result<Vec<DeviceSummary>> {
        let instance = self.instance()?;
        if instance.physical.is_empty() {
            return Err(Error::unavailable(
                NAME,
                "no Vulkan 1.2 device with a compute queue, timeline semaphores and push descriptors was found",
            ));
        }
        Ok(instance
            .physical
            .iter()
            .enumerate()
            .map(|(i, p)| DeviceSummary {
                index: i as u32,
                name: p.name.clone(),
            })
            .collect())
    }

    fn diagnostics(&self) -> Vec<String> {
        match self.validation_log() {
            Some(log) if log.count() > 0 => {
                let mut out = vec![format!(
                    "the Vulkan validation layer reported {} message(s)",
                    log.count()
                )];
                out.extend(log.messages());
                out
            }
            _ => Vec::new(),
        }
    }

    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>> {
        let instance = self.instance()?;
        let physical = instance
            .physical
            .get(index as usize)
            .cloned()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "vulkan:{index} does not exist; there are {} Vulkan device(s)",
                    instance.physical.len()
                ))
            })?;
        Ok(Arc::new(VulkanDevice::new(instance, &physical, index)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether CI requires Vulkan here (then a missing driver or layer fails the test).
    fn required() -> bool {
        std::env::var("XPU_REQUIRE").is_ok_and(|v| v.split(',').any(|p| p.trim() == NAME))
    }

    #[test]
    fn a_missing_library_is_unavailable_with_its_path() {
        let backend = VulkanBackend::with_options(LoadOptions {
            library: Some("/nonexistent/libvulkan.so.1".into()),
            validation: false,
        });
        let err = backend.enumerate().unwrap_err();
        assert_eq!(err.kind(), "unavailable", "{err}");
        assert!(
            err.to_string().contains("/nonexistent/libvulkan.so.1"),
            "{err}"
        );
        assert!(backend.create_device(0).is_err());
        assert!(backend.diagnostics().is_empty());
    }

    #[test]
    fn a_library_that_is_not_vulkan_is_unavailable() {
        let dir = std::env::temp_dir().join(format!("xpu-vk-fake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("libvulkan.so.1");
        std::fs::write(&fake, b"not a shared library").unwrap();
        let backend = VulkanBackend::with_options(LoadOptions {
            library: Some(fake.clone()),
            validation: false,
        });
        let err = backend.enumerate().unwrap_err();
        assert_eq!(err.kind(), "unavailable", "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn validation_messages_become_diagnostics() {
        let backend = VulkanBackend::with_options(LoadOptions {
            library: None,
            validation: true,
        });
        let devices = match backend.enumerate() {
            Ok(d) => d,
            Err(e) => {
                assert!(!required(), "Vulkan with validation is required here: {e}");
                eprintln!("skipped: {e}");
                return;
            }
        };
        assert!(!devices.is_empty());
        assert!(
            backend.diagnostics().is_empty(),
            "{:?}",
            backend.diagnostics()
        );
        let device = backend.create_device(0).unwrap();
        let vk_device = device.as_any().downcast_ref::<VulkanDevice>().unwrap();
        // A zero-sized buffer breaks a valid-usage rule the layer checks.
        let info = ash::vk::BufferCreateInfo::default()
            .size(0)
            .usage(ash::vk::BufferUsageFlags::STORAGE_BUFFER);
        // SAFETY: deliberately invalid usage, to provoke the validation layer; the
        // buffer, if one is created at all, is destroyed right away.
        unsafe {
            if let Ok(b) = vk_device.shared.device.create_buffer(&info, None) {
                vk_device.shared.device.destroy_buffer(b, None);
            }
        }
        let diagnostics = backend.diagnostics();
        assert!(!diagnostics.is_empty(), "the layer reported nothing");
        assert!(
            diagnostics.iter().any(|m| m.contains("size")),
            "{diagnostics:?}"
        );
    }
}
