//! [`Device`]: the validated handle to one device of any backend.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::DeviceImpl;
use crate::error::{Error, Result};
use crate::id::DeviceId;
use crate::info::{Capabilities, DeviceInfo, DeviceKind, MemoryInfo};
use crate::kernel::{KernelDesc, KernelImpl, KernelParam};
use crate::memory::Allocation;
use crate::stream::Stream;

static NEXT_DEVICE_UID: AtomicU64 = AtomicU64::new(1);

struct DeviceInner {
    id: DeviceId,
    uid: u64,
    info: DeviceInfo,
    imp: Arc<dyn DeviceImpl>,
}

/// One device. A cheap, clonable, thread-safe handle; the device lives while any handle,
/// stream, event or allocation of it does.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl Device {
    /// Wraps a backend device. The registry calls this; tests of a backend may too.
    pub fn from_impl(id: DeviceId, imp: Arc<dyn DeviceImpl>) -> Self {
        let info = imp.info();
        Device {
            inner: Arc::new(DeviceInner {
                id,
                uid: NEXT_DEVICE_UID.fetch_add(1, Ordering::Relaxed),
                info,
                imp,
            }),
        }
    }

    /// Its id (`host:0` …).
    pub fn id(&self) -> &DeviceId {
        &self.inner.id
    }

    /// Its backend's name.
    pub fn backend(&self) -> &str {
        &self.inner.id.backend
    }

    /// A process-unique number telling device objects apart (two registries may each
    /// create a `host:0`; their memory is not interchangeable).
    pub fn uid(&self) -> u64 {
        self.inner.uid
    }

    /// Its static properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    /// Its kind.
    pub fn kind(&self) -> DeviceKind {
        self.inner.info.kind
    }

    /// What it can do.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.info.capabilities
    }

    /// Current memory use.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.imp.memory_info()
    }

    /// Runs the check named `check` of the contract beneath the HAL (a plugin's C
    /// ABI), for the conformance suite's `abi` profile: `None` when the device has no
    /// such contract (see [`crate::backend::DeviceImpl::abi_check`]).
    pub fn abi_check(&self, check: &str) -> Option<std::result::Result<(), String>> {
        self.inner.imp.abi_check(check)
    }

    /// Makes the device fail for real as `fault` says, so that recovery above it can
    /// be tested (`xpu train --inject-fault`). Backends without fault injection return
    /// `Unsupported`; the host backend and the sim-npu plugin have it.
    pub fn inject_fault(&self, fault: crate::backend::Fault) -> Result<()> {
        if let crate::backend::Fault::Throttle(percent) = fault {
            if !(1..=100).contains(&percent) {
                return Err(crate::Error::invalid(format!(
                    "a throttle of {percent}%: give the share of its speed the device keeps, 1 to 100 (100 ends the throttle)"
                )));
            }
        }
        self.inner.imp.inject_fault(fault)
    }

    /// The backend implementation, for code that knows the backend (benchmarks, tests).
    pub fn implementation(&self) -> &Arc<dyn DeviceImpl> {
        &self.inner.imp
    }

    /// Allocates `size` bytes of device memory (zero-filled on the host backend,
    /// uninitialised elsewhere). `size` may be 0. Failure leaves the device usable.
    pub fn allocate(&self, size: u64) -> Result<Allocation> {
        if size == 0 {
            return Ok(Allocation::new(self.id().clone(), self.uid(), 0, None));
        }
        let max = self.capabilities().max_allocation;
        if size > max {
            let free = self.memory_info().map(|m| m.free).unwrap_or(0);
            return Err(Error::OutOfMemory {
                device: self.id().to_string(),
                requested: size,
                free,
                capacity: self.info().memory_bytes,
                hint: format!(
                    "the largest single allocation on this device is {max} bytes; split the buffer"
                ),
            });
        }
        let raw = self.inner.imp.allocate(size)?;
        Ok(Allocation::new(
            self.id().clone(),
            self.uid(),
            size,
            Some(raw),
        ))
    }

    /// Pins `buffer` for this device: registers its memory so that this device's copies
    /// to and from it move the bytes directly — by DMA into page-locked memory (CUDA) or
    /// through a device buffer imported over its pages (Vulkan) — instead of through the
    /// device's own staging memory, so a copy to the host is one transfer and needs no
    /// host step on the stream. What staging buffers shared by several devices want.
    ///
    /// Returns `true` when the buffer is pinned for the device, `false` when the device
    /// has nothing to pin (host devices), cannot (no driver support), or the buffer is
    /// under [`crate::HostMemory::PAGE`] bytes (not page aligned); copies work the same
    /// either way. Pinning again is free, and the registration lasts as long as the
    /// buffer's memory, operations in flight included.
    pub fn pin_host(&self, buffer: &crate::HostBuffer) -> Result<bool> {
        if buffer.len() < crate::HostMemory::PAGE {
            return Ok(false);
        }
        buffer
            .share()
            .pin_with(self.uid(), |ptr, len| self.inner.imp.pin_host(ptr, len))
    }

    /// Reserves `reserve` bytes of addresses and backs the first `initial` bytes with
    /// memory, making an allocation that [`Allocation::resize`] grows and shrinks in place
    /// — what a memory pool needs for expandable segments. Both sizes are rounded up to
    /// the device's `virtual_memory_granularity`; `initial` must not be 0. Devices without
    /// virtual memory (the capability is `None`) refuse with [`Error::Unsupported`].
    pub fn allocate_growable(&self, reserve: u64, initial: u64) -> Result<Allocation> {
        let Some(granularity) = self
            .capabilities()
            .virtual_memory_granularity
            .map(|g| g.max(1))
        else {
            return Err(Error::unsupported(format!(
                "{} has no virtual memory (its virtual_memory_granularity capability is None), so allocations cannot grow in place; use Device::allocate",
                self.id()
            )));
        };
        let round = |v: u64| v.div_ceil(granularity).checked_mul(granularity);
        let (Some(reserve_r), Some(initial_r)) = (round(reserve), round(initial)) else {
            return Err(Error::invalid(format!(
                "a growable allocation of {reserve} bytes cannot be rounded to the granularity of {granularity} bytes; reserve fewer bytes"
            )));
        };
        if initial == 0 || initial_r > reserve_r {
            return Err(Error::invalid(format!(
                "a growable allocation needs 0 < initial ({initial}) <= reserve ({reserve}); back at least one byte and reserve at least as much as you back"
            )));
        }
        let max = self.capabilities().max_allocation;
        if initial_r > max {
            let free = self.memory_info().map(|m| m.free).unwrap_or(0);
            return Err(Error::OutOfMemory {
                device: self.id().to_string(),
                requested: initial_r,
                free,
                capacity: self.info().memory_bytes,
                hint: format!(
                    "the largest single allocation on this device is {max} bytes; back less of the reservation at first"
                ),
            });
        }
        let raw = self.inner.imp.allocate_growable(reserve_r, initial_r)?;
        Ok(Allocation::with_growth(
            self.id().clone(),
            self.uid(),
            initial_r,
            Some((reserve_r, granularity)),
            Some(raw),
        ))
    }

    /// Creates an in-order stream on this device.
    pub fn create_stream(&self) -> Result<Stream> {
        let imp = self.inner.imp.create_stream()?;
        Ok(Stream::new(self.clone(), imp))
    }

    /// Loads a kernel for this device.
    pub fn load_kernel(&self, desc: KernelDesc) -> Result<Kernel> {
        let format = desc.source.format();
        if !self.capabilities().supports_kernel_format(format) {
            return Err(Error::unsupported(format!(
                "{} cannot load {format} kernels (kernel `{}`); it accepts {}",
                self.id(),
                desc.name,
                self.capabilities()
                    .kernel_formats
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        for (i, p) in desc.params.iter().enumerate() {
            if let KernelParam::Scalar(dt) = p {
                if !self.capabilities().supports_dtype(*dt) {
                    return Err(Error::unsupported(format!(
                        "kernel `{}` parameter {i} is a {dt} scalar, which {} does not support",
                        desc.name,
                        self.id()
                    )));
                }
            }
        }
        let imp = self.inner.imp.load_kernel(&desc)?;
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                device: self.clone(),
                desc,
                imp,
            }),
        })
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.inner.uid == other.inner.uid
    }
}

impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.inner.id.to_string())
            .field("name", &self.inner.info.name)
            .finish()
    }
}

struct KernelInner {
    device: Device,
    desc: KernelDesc,
    imp: Arc<dyn KernelImpl>,
}

/// A kernel loaded on one device. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

impl Kernel {
    /// The device it was loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Its description.
    pub fn desc(&self) -> &KernelDesc {
        &self.inner.desc
    }

    /// The backend's object for it, for a backend's [`crate::backend::StreamImpl::batch`]
    /// (it is the one that backend's `load_kernel` returned).
    pub fn backend_kernel(&self) -> &Arc<dyn KernelImpl> {
        &self.inner.imp
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.inner.desc.name)
            .field("device", &self.inner.device.id().to_string())
            .finish()
    }
}
