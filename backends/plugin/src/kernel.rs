//! [`PluginKernel`]: a kernel loaded by a plugin.

use std::any::Any;
use std::sync::Arc;

use xpu_hal::KernelImpl;
use xpu_plugin_sdk::abi::{xpu_kernel, xpu_kernel_destroy_args};

use crate::device::DeviceShared;
use crate::load::{Args, Func, Handle};

/// One `xpu_kernel`, destroyed with `kernel_destroy` when the last `Arc` goes (the
/// HAL's kernel handle and every stream with a launch of it in flight hold one).
pub struct PluginKernel {
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) handle: Handle<xpu_kernel>,
    destroy: Func<xpu_kernel_destroy_args>,
}

impl PluginKernel {
    pub(crate) fn new(
        device: Arc<DeviceShared>,
        handle: Handle<xpu_kernel>,
        destroy: Func<xpu_kernel_destroy_args>,
    ) -> Self {
        PluginKernel {
            device,
            handle,
            destroy,
        }
    }
}

impl KernelImpl for PluginKernel {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for PluginKernel {
    fn drop(&mut self) {
        let mut args = xpu_kernel_destroy_args::new();
        args.kernel = self.handle.0;
        // SAFETY: no launch in flight uses the kernel (every one held an `Arc`); it is
        // destroyed exactly once, before its device is closed.
        unsafe {
            self.device
                .plugin
                .release(self.destroy, args, "kernel_destroy", &self.device.id)
        };
    }
}
