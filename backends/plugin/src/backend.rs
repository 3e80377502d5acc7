//! [`PluginBackend`]: one loaded plugin as a HAL backend.

use std::path::Path;
use std::sync::Arc;

use xpu_hal::backend::{Backend, DeviceImpl, DeviceSummary};
use xpu_hal::{Error, Result};
use xpu_plugin_sdk::abi::xpu_device_count_args;

use crate::device::PluginDevice;
use crate::error::{LoadError, LoadErrorKind};
use crate::load::{Args, Plugin};

/// One vendor plugin, registered as the backend `plugin.<name>`; its devices are
/// `plugin.<name>:0`, `plugin.<name>:1` …
///
/// Thread-safe. The plugin's library stays loaded while this backend or any object of
/// its devices exists (and, for safety, until the process exits).
pub struct PluginBackend {
    plugin: Arc<Plugin>,
}

impl PluginBackend {
    /// Loads the plugin in the file `path`, after the checks of
    /// [`crate::check_file`]. A relative path is resolved against the current
    /// directory.
    pub fn load(path: impl AsRef<Path>) -> std::result::Result<PluginBackend, LoadError> {
        let given = path.as_ref();
        let absolute = std::path::absolute(given).map_err(|e| {
            LoadError::new(
                given,
                LoadErrorKind::Io {
                    message: format!("cannot resolve it against the current directory: {e}"),
                },
            )
        })?;
        let canonical = crate::check_file(&absolute).map_err(|c| LoadError::new(given, c))?;
        PluginBackend::open_checked(&canonical, given)
    }

    /// Loads a file that passed the checks; `given` is the path named in messages.
    pub(crate) fn open_checked(
        canonical: &Path,
        given: &Path,
    ) -> std::result::Result<PluginBackend, LoadError> {
        let plugin = Plugin::open(canonical, given).map_err(|c| LoadError::new(given, c))?;
        Ok(PluginBackend {
            plugin: Arc::new(plugin),
        })
    }

    /// The file it was loaded from, as given.
    pub fn path(&self) -> &Path {
        &self.plugin.path
    }

    /// The plugin's own name (`minimal`; the backend is `plugin.minimal`).
    pub fn plugin_name(&self) -> &str {
        &self.plugin.plugin_name
    }

    /// The plugin's own version string (empty if it gave none).
    pub fn version(&self) -> &str {
        &self.plugin.version
    }

    /// The plugin ABI version the plugin was built for, `(major, minor)`.
    pub fn abi_version(&self) -> (u32, u32) {
        self.plugin.abi
    }

    /// Whether the plugin implements native kernels (`kernel_load`, `kernel_launch` and
    /// `kernel_destroy`; a plugin with only some of them is treated as having none).
    pub fn has_kernels(&self) -> bool {
        self.plugin.table.kernels.is_some()
    }

    /// Opens device `index` as the concrete plugin type.
    pub fn create_plugin_device(&self, index: u32) -> Result<PluginDevice> {
        PluginDevice::open(self.plugin.clone(), index)
    }

    fn device_count(&self) -> Result<u32> {
        let mut args = xpu_device_count_args::new();
        // SAFETY: `device_count` of this plugin's table with a fresh argument struct.
        unsafe {
            self.plugin.call(
                self.plugin.table.device_count,
                &mut args,
                "device_count",
                &self.plugin.backend,
            )
        }?;
        Ok(args.count)
    }
}

impl std::fmt::Debug for PluginBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginBackend")
            .field("name", &self.plugin.backend)
            .field("path", &self.plugin.path)
            .field("version", &self.plugin.version)
            .field("abi", &self.plugin.abi)
            .finish()
    }
}

/// The most devices a plugin may claim: more is a broken plugin, not a machine.
const MAX_DEVICES: u32 = 4096;

impl Backend for PluginBackend {
    fn name(&self) -> &str {
        &self.plugin.backend
    }

    /// The devices `device_count` reports. The ABI names a device only once it is
    /// open, so the summaries are named `plugin.<name> device N`. A failing
    /// `device_count` makes the backend unavailable, with the file and the plugin's
    /// message as the reason.
    fn enumerate(&self) -> Result<Vec<DeviceSummary>> {
        let count = self.device_count().map_err(|e| {
            Error::unavailable(
                self.plugin.backend.clone(),
                format!(
                    "the plugin {} could not count its devices: {e}",
                    self.plugin.path.display()
                ),
            )
        })?;
        if count > MAX_DEVICES {
            return Err(Error::unavailable(
                self.plugin.backend.clone(),
                format!(
                    "the plugin {} claims {count} devices, more than the {MAX_DEVICES} a plugin may have; it is broken",
                    self.plugin.path.display()
                ),
            ));
        }
        Ok((0..count)
            .map(|index| DeviceSummary {
                index,
                name: format!("{} device {index}", self.plugin.backend),
            })
            .collect())
    }

    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>> {
        Ok(Arc::new(self.create_plugin_device(index)?))
    }

    /// Errors of calls that had no caller to report to: failed frees, destroys and
    /// closes, in the order they happened.
    fn diagnostics(&self) -> Vec<String> {
        self.plugin.diagnostics()
    }
}
