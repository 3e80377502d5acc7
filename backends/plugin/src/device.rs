//! [`PluginDevice`]: an open plugin device as a HAL device.

use std::any::Any;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use xpu_hal::backend::{DeviceImpl, Fault, StreamImpl};
use xpu_hal::{
    Capabilities, DType, DeviceInfo, DeviceKind, Error, KernelDesc, KernelFormat, KernelImpl,
    KernelSource, MemoryInfo, RawAllocation, Result,
};
use xpu_plugin_sdk::abi::*;

use crate::kernel::PluginKernel;
use crate::load::{plugin_string, Args, Handle, Plugin};
use crate::memory::PluginAllocation;
use crate::stream::PluginStream;

/// The most capability strings read from the capabilities extension.
const MAX_CAPABILITIES: u64 = 1024;

/// The `xpu_dtype` value of a dtype.
pub(crate) fn abi_dtype(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => dtype::F32,
        DType::F64 => dtype::F64,
        DType::F16 => dtype::F16,
        DType::BF16 => dtype::BF16,
        DType::I32 => dtype::I32,
        DType::I64 => dtype::I64,
        DType::U8 => dtype::U8,
    }
}

/// An open device, shared by its HAL device and by every buffer, stream, event and
/// kernel of it: the device is closed when the last of them is gone, so children are
/// always destroyed before their device, as the ABI requires.
pub(crate) struct DeviceShared {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) handle: Handle<xpu_device>,
    /// `plugin.<name>:<index>`, for messages.
    pub(crate) id: String,
    /// Whether `Fault::Lost` was injected through this host (`device_inject_fault`).
    /// The ABI 1.2 rules then promise that `stream_synchronize` returns only once no
    /// work of the stream runs any more, even though it reports `DEVICE_LOST`.
    injected_loss: AtomicBool,
}

impl DeviceShared {
    /// Whether a `DEVICE_LOST` from `stream_synchronize` still means that the stream's
    /// work has stopped, so that what it held may be released: only after a loss this
    /// host injected (for a loss of its own, the plugin promises nothing).
    pub(crate) fn work_stops_when_lost(&self) -> bool {
        self.injected_loss.load(Ordering::Acquire)
    }
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        let mut args = xpu_device_close_args::new();
        args.device = self.handle.0;
        // SAFETY: the device is open, and every child held an `Arc` of this struct, so
        // none is left; it is closed exactly once, here.
        unsafe {
            self.plugin.release(
                self.plugin.table.device_close,
                args,
                "device_close",
                &self.id,
            )
        };
    }
}

/// One open plugin device. Thread-safe.
pub struct PluginDevice {
    shared: Arc<DeviceShared>,
    info: DeviceInfo,
    kernel_format: Option<String>,
    extra: Vec<String>,
}

impl PluginDevice {
    /// The open device, shared with its children.
    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }
}

impl PluginDevice {
    pub(crate) fn open(plugin: Arc<Plugin>, index: u32) -> Result<PluginDevice> {
        let id = format!("{}:{index}", plugin.backend);
        let mut args = xpu_device_open_args::new();
        args.index = index;
        // SAFETY: `device_open` with a fresh argument struct.
        unsafe { plugin.call(plugin.table.device_open, &mut args, "device_open", &id) }?;
        if args.device.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                format!("{id}: device_open succeeded but returned no device (a plugin bug)"),
            ));
        }
        let shared = Arc::new(DeviceShared {
            plugin,
            handle: Handle(args.device),
            id,
            injected_loss: AtomicBool::new(false),
        });
        let (mut info, kernel_format) = properties(&shared)?;
        let extra = capabilities(&shared);
        // What the host knows of the plugin, for reports and certificates, then what
        // the plugin says of the device.
        let plugin = &shared.plugin;
        info.extra = [
            format!("plugin_version={}", plugin.version),
            format!("plugin_abi={}.{}", plugin.abi.0, plugin.abi.1),
            format!("plugin_file={}", plugin.path.display()),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect();
        info.capabilities.ops = crate::std_ops::supported(&shared);
        Ok(PluginDevice {
            shared,
            info,
            kernel_format,
            extra,
        })
    }

    /// The device's id (`plugin.<name>:<index>`).
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The name of the native kernel format the device loads, if it loads kernels.
    pub fn kernel_format(&self) -> Option<&str> {
        self.kernel_format.as_deref()
    }

    /// The `key=value` strings of the plugin's capabilities extension, if it has one.
    pub fn extra_capabilities(&self) -> &[String] {
        &self.extra
    }
}

/// Reads `device_properties` into the HAL's description.
fn properties(shared: &DeviceShared) -> Result<(DeviceInfo, Option<String>)> {
    let plugin = &shared.plugin;
    let mut p = xpu_device_properties_args::new();
    p.device = shared.handle.0;
    // SAFETY: the device is open; the strings returned are read below, while it still
    // is (they are valid until it is closed).
    unsafe {
        plugin.call(
            plugin.table.device_properties,
            &mut p,
            "device_properties",
            &shared.id,
        )
    }?;
    // SAFETY: NULL or NUL-terminated strings valid until the device is closed.
    let (name, vendor, driver, format) = unsafe {
        (
            plugin_string(p.name),
            plugin_string(p.vendor),
            plugin_string(p.driver),
            (!p.kernel_format.is_null()).then(|| plugin_string(p.kernel_format)),
        )
    };
    let kind = match p.kind {
        device_kind::CPU => DeviceKind::Cpu,
        device_kind::GPU => DeviceKind::Gpu,
        device_kind::NPU => DeviceKind::Npu,
        _ => DeviceKind::Other,
    };
    let dtypes = DType::ALL
        .into_iter()
        .filter(|d| p.dtype_mask & (1u32 << abi_dtype(*d)) != 0)
        .collect();
    let kernel_format = format.filter(|f| !f.is_empty() && plugin.table.kernels.is_some());
    let kernel_formats = if kernel_format.is_some() {
        vec![KernelFormat::PluginNative]
    } else {
        Vec::new()
    };
    let info = DeviceInfo {
        name: if name.is_empty() {
            shared.id.clone()
        } else {
            name
        },
        kind,
        vendor,
        driver,
        memory_bytes: p.memory_bytes,
        capabilities: Capabilities {
            dtypes,
            max_allocation: p.max_allocation,
            peer_access: false,
            timeline_events: p.timeline_events != 0,
            event_timing: p.event_timing != 0 && plugin.table.event_elapsed.is_some(),
            kernel_formats,
            max_streams: u32::MAX,
            kernel_arg_alignment: p.kernel_arg_alignment.max(1),
            virtual_memory_granularity: None,
            host_addressable: false,
            ops: Vec::new(),
        },
        extra: Vec::new(),
    };
    Ok((info, kernel_format))
}

/// The capabilities extension's strings, or none. A failure is recorded as a
/// diagnostic: the device works without them.
fn capabilities(shared: &DeviceShared) -> Vec<String> {
    let plugin = &shared.plugin;
    let Some(f) = plugin.table.capabilities else {
        return Vec::new();
    };
    let mut args = xpu_capabilities_args::new();
    args.device = shared.handle.0;
    // SAFETY: the extension's function with a fresh argument struct for an open device.
    if let Err(e) = unsafe { plugin.call_raw(f, &mut args, "capabilities") } {
        plugin.record(format!("{}: {e}", shared.id));
        return Vec::new();
    }
    if args.capabilities.is_null() {
        return Vec::new();
    }
    (0..args.count.min(MAX_CAPABILITIES))
        .map(|i| {
            // SAFETY: an array of `count` string pointers, valid until the device is
            // closed; `i < count`.
            unsafe { plugin_string(*args.capabilities.add(i as usize)) }
        })
        .collect()
}

impl DeviceImpl for PluginDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let plugin = &self.shared.plugin;
        let mut args = xpu_memory_info_args::new();
        args.device = self.shared.handle.0;
        // SAFETY: the device is open.
        unsafe {
            plugin.call(
                plugin.table.memory_info,
                &mut args,
                "memory_info",
                &self.shared.id,
            )
        }?;
        Ok(MemoryInfo {
            total: args.total,
            free: args.free,
        })
    }

    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>> {
        let plugin = &self.shared.plugin;
        let mut args = xpu_buffer_allocate_args::new();
        args.device = self.shared.handle.0;
        args.size = size;
        // SAFETY: the device is open; the HAL guarantees 1 <= size <= max_allocation.
        match unsafe { plugin.call_raw(plugin.table.buffer_allocate, &mut args, "buffer_allocate") }
        {
            Ok(()) => {}
            Err(e) if e.code == error_code::OUT_OF_MEMORY => {
                let memory = self.memory_info().ok();
                return Err(Error::OutOfMemory {
                    device: self.shared.id.clone(),
                    requested: size,
                    free: memory.map_or(0, |m| m.free),
                    capacity: memory.map_or(self.info.memory_bytes, |m| m.total),
                    hint: format!(
                        "the plugin says: {}; free memory or allocate less",
                        e.message
                    ),
                });
            }
            Err(e) => return Err(plugin.hal_error(e, &self.shared.id)),
        }
        if args.buffer.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                format!(
                    "{}: buffer_allocate succeeded but returned no buffer (a plugin bug)",
                    self.shared.id
                ),
            ));
        }
        Ok(Arc::new(PluginAllocation::new(
            self.shared.clone(),
            Handle(args.buffer),
            size,
        )))
    }

    fn create_stream(&self) -> Result<Box<dyn StreamImpl>> {
        let plugin = &self.shared.plugin;
        let mut args = xpu_stream_create_args::new();
        args.device = self.shared.handle.0;
        // SAFETY: the device is open.
        unsafe {
            plugin.call(
                plugin.table.stream_create,
                &mut args,
                "stream_create",
                &self.shared.id,
            )
        }?;
        if args.stream.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                format!(
                    "{}: stream_create succeeded but returned no stream (a plugin bug)",
                    self.shared.id
                ),
            ));
        }
        Ok(Box::new(PluginStream::new(
            self.shared.clone(),
            Handle(args.stream),
        )))
    }

    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>> {
        let plugin = &self.shared.plugin;
        let KernelSource::PluginNative { format, bytes } = &desc.source else {
            return Err(Error::unsupported(format!(
                "{} loads plugin-native kernels only, not {} (kernel `{}`)",
                self.shared.id,
                desc.source.format(),
                desc.name
            )));
        };
        let (Some(native), Some(fns)) = (&self.kernel_format, plugin.table.kernels) else {
            return Err(Error::unsupported(format!(
                "{} does not load kernels (kernel `{}`)",
                self.shared.id, desc.name
            )));
        };
        if format != native {
            return Err(Error::unsupported(format!(
                "{} loads kernels in the format `{native}`, not `{format}` (kernel `{}`)",
                self.shared.id, desc.name
            )));
        }
        let c_format = CString::new(format.as_str()).map_err(|_| {
            Error::invalid(format!(
                "the kernel format name of `{}` contains a NUL byte",
                desc.name
            ))
        })?;
        let entry = CString::new(desc.entry_point.as_str()).map_err(|_| {
            Error::invalid(format!(
                "the entry point of kernel `{}` contains a NUL byte; name it without one",
                desc.name
            ))
        })?;
        let mut args = xpu_kernel_load_args::new();
        args.device = self.shared.handle.0;
        args.format = c_format.as_ptr();
        args.code = bytes.as_ptr();
        args.code_length = bytes.len() as u64;
        args.entry_point = entry.as_ptr();
        // SAFETY: the device is open; format, code and entry point outlive the call.
        unsafe { plugin.call(fns.load, &mut args, "kernel_load", &self.shared.id) }
            .map_err(|e| with_kernel_name(e, &desc.name))?;
        if args.kernel.is_null() {
            return Err(Error::backend_message(
                plugin.backend.clone(),
                format!(
                    "{}: kernel_load succeeded but returned no kernel (a plugin bug)",
                    self.shared.id
                ),
            ));
        }
        Ok(Arc::new(PluginKernel::new(
            self.shared.clone(),
            Handle(args.kernel),
            fns.destroy,
        )))
    }

    fn collective_group(
        &self,
        devices: &[xpu_hal::Device],
        config: xpu_hal::group::GroupConfig,
    ) -> Option<Result<Box<dyn xpu_hal::group::CollectiveGroup>>> {
        let plugin = &self.shared.plugin;
        let fns = plugin.table.groups?;
        Some(
            crate::group::PluginGroup::create(plugin, fns, devices, config, None)
                .map(|g| Box::new(g) as Box<dyn xpu_hal::group::CollectiveGroup>),
        )
    }

    fn collective_groups_across(&self) -> bool {
        self.shared
            .plugin
            .table
            .groups
            .is_some_and(|g| g.id.is_some())
    }

    fn collective_group_id(&self) -> Result<Vec<u8>> {
        crate::group::group_id(&self.shared)
    }

    fn collective_group_across(
        &self,
        devices: &[xpu_hal::Device],
        across: &xpu_hal::group::GroupAcross,
        config: xpu_hal::group::GroupConfig,
    ) -> Result<Box<dyn xpu_hal::group::CollectiveGroup>> {
        let plugin = &self.shared.plugin;
        let fns = plugin
            .table
            .groups
            .filter(|g| g.id.is_some())
            .ok_or_else(|| {
                Error::unsupported(format!(
                    "the plugin `{}` has no collective groups across processes (ABI 1.4 group_id)",
                    plugin.plugin_name
                ))
            })?;
        crate::group::PluginGroup::create(plugin, fns, devices, config, Some(across))
            .map(|g| Box::new(g) as Box<dyn xpu_hal::group::CollectiveGroup>)
    }

    fn abi_check(&self, check: &str) -> Option<std::result::Result<(), String>> {
        Some(crate::abi_check::run(&self.shared, check))
    }

    fn inject_fault(&self, fault: Fault) -> Result<()> {
        let plugin = &self.shared.plugin;
        let Some(f) = plugin.table.inject_fault else {
            let (major, minor) = plugin.abi;
            return Err(Error::unsupported(format!(
                "{}: the plugin `{}` ({}, ABI {major}.{minor}) has no fault injection (the optional ABI 1.2 function device_inject_fault), so the fault {fault:?} cannot be injected; test failures on a device whose plugin has it, such as the simulated NPU, or on a host device",
                self.shared.id,
                plugin.plugin_name,
                plugin.path.display()
            )));
        };
        let (raw, delay_ns) = match fault {
            Fault::Lost => (xpu_plugin_sdk::abi::fault::LOST, 0),
            Fault::Slow(delay) => (
                xpu_plugin_sdk::abi::fault::SLOW,
                u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX),
            ),
            other => {
                return Err(Error::unsupported(format!(
                    "{}: the fault {other:?} has no number in the plugin ABI {}.{}, so no plugin can inject it; inject `Lost` or `Slow` instead",
                    self.shared.id, XPU_PLUGIN_ABI_MAJOR, XPU_PLUGIN_ABI_MINOR
                )))
            }
        };
        let mut args = xpu_device_fault_args::new();
        args.device = self.shared.handle.0;
        args.fault = raw;
        args.delay_ns = delay_ns;
        // SAFETY: the device is open; the function was read from a table of ABI 1.2 or
        // later that reaches it.
        unsafe { plugin.call(f, &mut args, "device_inject_fault", &self.shared.id) }?;
        if matches!(fault, Fault::Lost) {
            self.shared.injected_loss.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Adds the kernel's name to a message-carrying error.
fn with_kernel_name(e: Error, name: &str) -> Error {
    match e {
        Error::InvalidArgument { message } => Error::invalid(format!("kernel `{name}`: {message}")),
        Error::Unsupported { message } => Error::unsupported(format!("kernel `{name}`: {message}")),
        other => other,
    }
}

impl std::fmt::Debug for PluginDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDevice")
            .field("id", &self.shared.id)
            .field("name", &self.info.name)
            .finish()
    }
}
