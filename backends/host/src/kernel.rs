//! [`HostKernel`]: a host function loaded as a kernel.

use std::any::Any;
use std::sync::Arc;

use xpu_hal::{HostKernelFn, KernelImpl};

/// A loaded host-function kernel.
#[derive(Clone)]
pub struct HostKernel {
    function: Arc<HostKernelFn>,
    /// The kernel's name, for messages.
    name: Arc<str>,
}

impl HostKernel {
    pub(crate) fn new(function: Arc<HostKernelFn>, name: &str) -> Self {
        HostKernel {
            function,
            name: Arc::from(name),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn function(&self) -> &HostKernelFn {
        &*self.function
    }
}

impl KernelImpl for HostKernel {
    fn as_any(&self) -> &dyn Any {
        self
    }
}
