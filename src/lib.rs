//! # xpu: one runtime contract for every accelerator
//!
//! This facade crate is what a framework depends on. It re-exports the HAL contract
//! ([`xpu_hal`]: devices, streams, events, memory, errors) and assembles the
//! [`Registry`] of built-in backends, so that a program can go from nothing to a
//! device in two calls:
//!
//! ```
//! let registry = xpu::registry()?;
//! let devices = registry.devices(&xpu::selector_from_env("host:*")?)?;
//! let stream = devices[0].create_stream()?;
//! let buf = devices[0].allocate(16)?;
//! stream.fill(&buf, xpu::Scalar::F32(1.5))?;
//! assert_eq!(stream.read(&buf)?, 1.5f32.to_le_bytes().repeat(4));
//! # Ok::<(), xpu::Error>(())
//! ```
//!
//! Backends are found at run time: one whose driver or library is missing is listed
//! as unavailable with the reason and contributes no devices; nothing panics.
//! Vendor plugins are found on `XPU_PLUGIN_PATH` (and in paths given to
//! [`registry_with_plugins`]); a plugin that cannot be loaded is listed as an
//! unavailable backend with the file and the cause. The same crate builds the `xpu`
//! command-line tool (`xpu devices`, `xpu conformance`, `xpu bench`).

use std::sync::Arc;

pub use xpu_hal::*;

/// The HAL crate itself, for paths like `xpu::hal::backend::StreamImpl`.
pub use xpu_hal as hal;

/// The host backend crate.
pub use xpu_host as host;

/// The Vulkan backend crate.
pub use xpu_vulkan as vulkan;

/// The CUDA backend crate.
pub use xpu_cuda as cuda;

/// The plugin loader crate.
pub use xpu_plugin as plugin;

/// The scheduler: task graphs over every device.
pub use xpu_scheduler as scheduler;

/// The environment variable holding the default device selector.
pub const DEVICES_ENV: &str = "XPU_DEVICES";

/// A registry holding every built-in backend (host, vulkan, cuda) and the plugins found on
/// `XPU_PLUGIN_PATH`. See [`registry_with_plugins`].
pub fn registry() -> Result<Registry> {
    Ok(registry_with_plugins(&[])?.0)
}

/// A registry holding every built-in backend, in a fixed order (host, vulkan, cuda), then
/// the plugins named in `plugins` (files or folders) and on `XPU_PLUGIN_PATH`.
///
/// A plugin that cannot be loaded does not stop the others: it is listed as an
/// unavailable backend whose reason names the file and the cause, and returned in the
/// second element so that a caller that named it explicitly can refuse to go on.
/// Fails only when a backend's configuration in the environment is invalid (for
/// example `XPU_HOST_DEVICES=abc`), with a message naming the variable.
pub fn registry_with_plugins(
    plugins: &[std::path::PathBuf],
) -> Result<(Registry, Vec<xpu_plugin::LoadError>)> {
    let mut registry = Registry::new();
    registry.register(Arc::new(xpu_host::HostBackend::from_env()?))?;
    registry.register(Arc::new(xpu_vulkan::VulkanBackend::new()))?;
    registry.register(Arc::new(xpu_cuda::CudaBackend::new()))?;
    let found = xpu_plugin::discover(plugins);
    for backend in found.backends {
        registry.register(backend)?;
    }
    for (i, error) in found.errors.iter().enumerate() {
        registry.register(Arc::new(UnloadedPlugin {
            name: format!("plugin!{}", i + 1),
            reason: error.to_string(),
        }))?;
    }
    Ok((registry, found.errors))
}

/// A plugin file that could not be loaded, listed so that `xpu devices` shows why.
struct UnloadedPlugin {
    name: String,
    reason: String,
}

impl backend::Backend for UnloadedPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn enumerate(&self) -> Result<Vec<backend::DeviceSummary>> {
        Err(Error::unavailable(self.name.clone(), self.reason.clone()))
    }

    fn create_device(&self, _index: u32) -> Result<Arc<dyn backend::DeviceImpl>> {
        Err(Error::unavailable(self.name.clone(), self.reason.clone()))
    }
}

/// The device selector from `XPU_DEVICES`, or `default` when it is unset or empty.
pub fn selector_from_env(default: &str) -> Result<DeviceSelector> {
    match std::env::var(DEVICES_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            DeviceSelector::parse(&v).map_err(|e| Error::invalid(format!("{DEVICES_ENV}: {e}")))
        }
        _ => DeviceSelector::parse(default),
    }
}
