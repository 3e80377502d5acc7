//! Loading the Vulkan library, creating the instance, and describing the physical
//! devices that can run compute work.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;
use xpu_hal::{Error, Result};

/// `XPU_VULKAN_LIBRARY`: load this file instead of the system's Vulkan loader.
pub const LIBRARY_ENV: &str = "XPU_VULKAN_LIBRARY";
/// `XPU_VULKAN_VALIDATION=1`: enable the Khronos validation layer.
pub const VALIDATION_ENV: &str = "XPU_VULKAN_VALIDATION";

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Messages the validation layer reported, shared with the debug callback.
#[derive(Debug, Default)]
pub struct ValidationLog {
    count: AtomicU64,
    messages: Mutex<Vec<String>>,
}

impl ValidationLog {
    /// How many warnings and errors the layer reported so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The first messages (at most 100 are kept).
    pub fn messages(&self) -> Vec<String> {
        self.messages.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn push(&self, text: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut m) = self.messages.lock() {
            if m.len() < 100 {
                m.push(text);
            }
        }
    }
}

unsafe extern "system" fn debug_callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    let result = std::panic::catch_unwind(|| {
        if user.is_null() || data.is_null() {
            return;
        }
        // SAFETY: `user` is the `ValidationLog` registered with the messenger, kept
        // alive by the `Instance` that owns the messenger; `data` is valid for the call.
        let (log, data) = unsafe { (&*(user as *const ValidationLog), &*data) };
        let text = if data.p_message.is_null() {
            String::from("(no message)")
        } else {
            // SAFETY: the layer passes a NUL-terminated string valid for the call.
            unsafe { CStr::from_ptr(data.p_message) }
                .to_string_lossy()
                .into_owned()
        };
        log.push(format!("{severity:?}: {text}"));
    });
    drop(result);
    vk::FALSE
}

/// What xpu needs to know about a physical device.
#[derive(Debug, Clone)]
pub(crate) struct PhysicalInfo {
    pub(crate) handle: vk::PhysicalDevice,
    pub(crate) name: String,
    pub(crate) properties: vk::PhysicalDeviceProperties,
    pub(crate) queue_family: u32,
    pub(crate) queue_count: u32,
    /// Valid bits of the queue family's timestamps (0: no timestamps).
    pub(crate) timestamp_bits: u32,
    pub(crate) float64: bool,
    pub(crate) int64: bool,
    pub(crate) subgroup_size: u32,
    pub(crate) memory: vk::PhysicalDeviceMemoryProperties,
    /// With `VK_EXT_external_memory_host`: the alignment of host memory it imports.
    pub(crate) host_import_align: Option<u64>,
}

/// The loaded library and the instance. Destroyed when the last device is gone.
pub struct Instance {
    /// Keeps the Vulkan library loaded while the instance exists.
    _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    debug: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    pub(crate) log: Arc<ValidationLog>,
    pub(crate) physical: Vec<PhysicalInfo>,
}

// SAFETY: ash's Entry/Instance are tables of function pointers plus a handle; Vulkan
// instances may be used from any thread (instance-level calls are internally synchronized
// except where the spec says otherwise, and we only make those calls at creation).
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

/// How to load Vulkan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The loader library to use instead of the system's.
    pub library: Option<std::path::PathBuf>,
    /// Enable the Khronos validation layer.
    pub validation: bool,
}

impl LoadOptions {
    /// The options from `XPU_VULKAN_LIBRARY` and `XPU_VULKAN_VALIDATION`.
    pub fn from_env() -> Self {
        LoadOptions {
            library: std::env::var_os(LIBRARY_ENV).map(Into::into),
            validation: std::env::var(VALIDATION_ENV).is_ok_and(|v| v == "1"),
        }
    }
}

impl Instance {
    /// Loads the library and creates an instance as `options` say. Every failure is an
    /// [`Error::Unavailable`] with the loader's reason.
    pub fn load(options: &LoadOptions) -> Result<Self> {
        let unavailable = |reason: String| Error::unavailable("vulkan", reason);
        let entry = match &options.library {
            // SAFETY: loading a shared library runs its initialisers; the Vulkan loader
            // is designed to be loaded this way.
            Some(path) => unsafe { ash::Entry::load_from(path) }.map_err(|e| {
                unavailable(format!(
                    "could not load the Vulkan library {} ({LIBRARY_ENV}): {e}",
                    path.display()
                ))
            })?,
            // SAFETY: as above, for the system's loader.
            None => unsafe { ash::Entry::load() }.map_err(|e| {
                unavailable(format!(
                    "could not load the Vulkan loader (libvulkan.so.1): {e}; install libvulkan1 and a driver (e.g. mesa-vulkan-drivers)"
                ))
            })?,
        };
        // SAFETY: `entry` is a loaded Vulkan library.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .ok()
            .flatten()
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_2 {
            return Err(unavailable(format!(
                "the Vulkan loader supports version {}.{} but xpu needs 1.2",
                vk::api_version_major(version),
                vk::api_version_minor(version)
            )));
        }
        let validation = options.validation;
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if validation {
            // SAFETY: `entry` is loaded.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(|e| unavailable(format!("could not list Vulkan layers: {e:?}")))?;
            let has = available
                .iter()
                .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
            if !has {
                return Err(unavailable(format!(
                    "{VALIDATION_ENV}=1 but the Khronos validation layer is not installed (install vulkan-validationlayers)"
                )));
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"xpu")
            .engine_name(c"xpu")
            .api_version(vk::API_VERSION_1_2);
        let log = Arc::new(ValidationLog::default());
        let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                    | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(debug_callback))
            .user_data(Arc::as_ptr(&log) as *mut c_void);
        let mut create = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        if validation {
            create = create.push_next(&mut messenger_info);
        }
        // SAFETY: the create info and everything it points to live across the call.
        let instance = unsafe { entry.create_instance(&create, None) }
            .map_err(|e| unavailable(format!("vkCreateInstance failed: {e:?}")))?;
        let debug = if validation {
            let loader = ash::ext::debug_utils::Instance::new(&entry, &instance);
            // SAFETY: the instance was created with the debug utils extension; the log
            // outlives the messenger (both owned by `Instance`, messenger destroyed first).
            match unsafe { loader.create_debug_utils_messenger(&messenger_info, None) } {
                Ok(m) => Some((loader, m)),
                Err(e) => {
                    // SAFETY: nothing else uses the instance yet.
                    unsafe { instance.destroy_instance(None) };
                    return Err(unavailable(format!(
                        "could not create the validation messenger: {e:?}"
                    )));
                }
            }
        } else {
            None
        };
        let mut this = Instance {
            _entry: entry,
            instance,
            debug,
            log,
            physical: Vec::new(),
        };
        this.physical = this.describe_devices()?;
        Ok(this)
    }

    fn describe_devices(&self) -> Result<Vec<PhysicalInfo>> {
        // SAFETY: the instance is valid.
        let handles = unsafe { self.instance.enumerate_physical_devices() }.map_err(|e| {
            Error::unavailable("vulkan", format!("could not list physical devices: {e:?}"))
        })?;
        let mut out = Vec::new();
        for handle in handles {
            // SAFETY: `handle` came from this instance.
            let properties = unsafe { self.instance.get_physical_device_properties(handle) };
            if properties.api_version < vk::API_VERSION_1_2 {
                continue;
            }
            // SAFETY: as above.
            let families = unsafe {
                self.instance
                    .get_physical_device_queue_family_properties(handle)
            };
            // Prefer a compute-only family (often an async compute queue), else any with
            // compute.
            let pick = families
                .iter()
                .enumerate()
                .filter(|(_, f)| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
                .min_by_key(|(_, f)| f.queue_flags.contains(vk::QueueFlags::GRAPHICS));
            let Some((family, props)) = pick else {
                continue;
            };
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
            let mut v11 = vk::PhysicalDeviceVulkan11Properties::default();
            let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
            // SAFETY: as above; the chained structs live across the call.
            unsafe {
                self.instance
                    .get_physical_device_features2(handle, &mut features)
            };
            let base = features.features;
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut v11);
            // SAFETY: as above.
            unsafe {
                self.instance
                    .get_physical_device_properties2(handle, &mut props2)
            };
            if v12.timeline_semaphore == vk::FALSE {
                continue;
            }
            // SAFETY: as above.
            let extensions = unsafe { self.instance.enumerate_device_extension_properties(handle) }
                .unwrap_or_default();
            let has_push = extensions.iter().any(|e| {
                e.extension_name_as_c_str()
                    .is_ok_and(|n| n == ash::khr::push_descriptor::NAME)
            });
            if !has_push {
                continue;
            }
            let has_import = extensions.iter().any(|e| {
                e.extension_name_as_c_str()
                    .is_ok_and(|n| n == ash::ext::external_memory_host::NAME)
            });
            let host_import_align = has_import.then(|| {
                let mut import = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
                let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut import);
                // SAFETY: as above; the device has the extension whose struct is chained.
                unsafe {
                    self.instance
                        .get_physical_device_properties2(handle, &mut props2)
                };
                import.min_imported_host_pointer_alignment.max(1)
            });
            // SAFETY: as above.
            let memory = unsafe { self.instance.get_physical_device_memory_properties(handle) };
            let name = properties
                .device_name_as_c_str()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unnamed Vulkan device".to_string());
            out.push(PhysicalInfo {
                handle,
                name,
                properties,
                queue_family: family as u32,
                queue_count: props.queue_count,
                timestamp_bits: props.timestamp_valid_bits,
                float64: base.shader_float64 == vk::TRUE,
                int64: base.shader_int64 == vk::TRUE,
                subgroup_size: v11.subgroup_size,
                memory,
                host_import_align,
            });
        }
        Ok(out)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some((loader, messenger)) = self.debug.take() {
            // SAFETY: created from this instance; no device is alive (devices hold an
            // `Arc<Instance>`).
            unsafe { loader.destroy_debug_utils_messenger(messenger, None) };
        }
        // SAFETY: as above; this is the last use of the instance.
        unsafe { self.instance.destroy_instance(None) };
    }
}
