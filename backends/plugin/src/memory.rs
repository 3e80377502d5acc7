//! [`PluginAllocation`]: a plugin buffer as the HAL's raw allocation.

use std::any::Any;
use std::sync::Arc;

use xpu_hal::RawAllocation;
use xpu_plugin_sdk::abi::{xpu_buffer, xpu_buffer_free_args, xpu_buffer_range};

use crate::device::DeviceShared;
use crate::load::{Args, Handle};

/// One `xpu_buffer`. Freed with `buffer_free` when the last `Arc` goes: the HAL's
/// allocation handle and every stream with work on it hold one, so the plugin never
/// sees a free while enqueued work still uses the buffer.
pub struct PluginAllocation {
    device: Arc<DeviceShared>,
    handle: Handle<xpu_buffer>,
    size: u64,
}

impl PluginAllocation {
    pub(crate) fn new(device: Arc<DeviceShared>, handle: Handle<xpu_buffer>, size: u64) -> Self {
        PluginAllocation {
            device,
            handle,
            size,
        }
    }

    /// The range `[offset, offset + length)` of this buffer, for an argument struct.
    pub(crate) fn range(&self, offset: u64, length: u64) -> xpu_buffer_range {
        xpu_buffer_range {
            buffer: self.handle.0,
            offset,
            length,
        }
    }

    /// Whether the buffer belongs to `device`.
    pub(crate) fn is_on(&self, device: &Arc<DeviceShared>) -> bool {
        Arc::ptr_eq(&self.device, device)
    }
}

impl RawAllocation for PluginAllocation {
    fn size(&self) -> u64 {
        self.size
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl Drop for PluginAllocation {
    fn drop(&mut self) {
        let mut args = xpu_buffer_free_args::new();
        args.buffer = self.handle.0;
        let plugin = &self.device.plugin;
        // SAFETY: the last holder is gone, so no enqueued work uses the buffer; it is
        // freed exactly once, here, before its device is closed (we hold the device).
        unsafe {
            plugin.release(
                plugin.table.buffer_free,
                args,
                "buffer_free",
                &self.device.id,
            )
        };
    }
}
