//! [`HostDevice`]: one virtual device with its own memory accounting.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xpu_hal::backend::{DeviceImpl, Fault, FaultState, StreamImpl};
use xpu_hal::{
    Capabilities, DType, DeviceInfo, DeviceKind, Error, KernelDesc, KernelFormat, KernelImpl,
    KernelSource, MemoryInfo, RawAllocation, Result,
};

use crate::kernel::HostKernel;
use crate::memory::{page_size, Accounting, HostAllocation};
use crate::std_ops::{self, OpThreads};
use crate::stream::HostStream;

/// A virtual device on the CPU.
pub struct HostDevice {
    index: u32,
    accounting: Arc<Accounting>,
    streams_created: AtomicU64,
    cpu: CpuFacts,
    threads: Arc<OpThreads>,
    /// Injected faults; shared with the streams.
    faults: Arc<FaultState>,
}

/// What the host says about its processor, for the device's name and vendor.
#[derive(Debug, Clone)]
struct CpuFacts {
    model: String,
    vendor: String,
}

impl CpuFacts {
    fn read() -> Self {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |key: &str| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        CpuFacts {
            model: field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            vendor: field("vendor_id").unwrap_or_else(|| "unknown".to_string()),
        }
    }
}

impl HostDevice {
    pub(crate) fn new(index: u32, capacity: u64, threads: usize) -> Self {
        HostDevice {
            index,
            accounting: Arc::new(Accounting {
                device: format!("host:{index}"),
                capacity,
                used: AtomicU64::new(0),
            }),
            streams_created: AtomicU64::new(0),
            cpu: CpuFacts::read(),
            threads: OpThreads::new(threads),
            faults: FaultState::new(format!("host:{index}")),
        }
    }

    /// Creates a stream and returns it as the concrete host type.
    pub fn create_host_stream(&self) -> Result<HostStream> {
        self.faults.check()?;
        let n = self.streams_created.fetch_add(1, Ordering::Relaxed);
        HostStream::new(
            self.accounting.device.clone(),
            format!("xpu-host{}-s{n}", self.index),
            self.threads.clone(),
            self.faults.clone(),
        )
    }

    /// Allocates memory and returns it as the concrete host type.
    pub fn allocate_host(&self, size: u64) -> Result<Arc<HostAllocation>> {
        self.faults.check()?;
        Ok(Arc::new(HostAllocation::new(
            size,
            self.accounting.clone(),
        )?))
    }

    /// Makes a growable allocation (see [`DeviceImpl::allocate_growable`]) and returns
    /// it as the concrete host type. `reserve` and `initial` must be multiples of the
    /// page size with `0 < initial <= reserve`.
    pub fn allocate_growable_host(
        &self,
        reserve: u64,
        initial: u64,
    ) -> Result<Arc<HostAllocation>> {
        self.faults.check()?;
        let page = page_size().ok_or_else(|| {
            Error::unsupported("the host backend reserves address space only on Unix systems")
        })?;
        if initial == 0
            || initial > reserve
            || !initial.is_multiple_of(page)
            || !reserve.is_multiple_of(page)
        {
            return Err(Error::invalid(format!(
                "a growable host allocation needs 0 < initial ({initial}) <= reserve ({reserve}), both multiples of the page size ({page} bytes)"
            )));
        }
        Ok(Arc::new(HostAllocation::growable(
            reserve,
            initial,
            self.accounting.clone(),
        )?))
    }
}

impl DeviceImpl for HostDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: format!("{} (virtual device {})", self.cpu.model, self.index),
            kind: DeviceKind::Cpu,
            vendor: self.cpu.vendor.clone(),
            driver: format!("xpu-host {}", env!("CARGO_PKG_VERSION")),
            memory_bytes: self.accounting.capacity,
            capabilities: Capabilities {
                dtypes: DType::ALL.to_vec(),
                max_allocation: self.accounting.capacity,
                peer_access: true,
                timeline_events: true,
                event_timing: true,
                kernel_formats: vec![KernelFormat::HostFunction],
                max_streams: u32::MAX,
                kernel_arg_alignment: 1,
                virtual_memory_granularity: page_size(),
                host_addressable: true,
                ops: std_ops::supported(),
            },
            extra: vec![format!("threads={}", self.threads.threads())],
        }
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.faults.check()?;
        let used = self.accounting.used.load(Ordering::Acquire);
        Ok(MemoryInfo {
            total: self.accounting.capacity,
            free: self.accounting.capacity.saturating_sub(used),
        })
    }

    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>> {
        Ok(self.allocate_host(size)?)
    }

    fn allocate_growable(&self, reserve: u64, initial: u64) -> Result<Arc<dyn RawAllocation>> {
        Ok(self.allocate_growable_host(reserve, initial)?)
    }

    fn create_stream(&self) -> Result<Box<dyn StreamImpl>> {
        Ok(Box::new(self.create_host_stream()?))
    }

    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>> {
        match &desc.source {
            KernelSource::HostFunction(f) => Ok(Arc::new(HostKernel::new(f.clone(), &desc.name))),
            other => Err(Error::unsupported(format!(
                "the host backend runs host-function kernels only, not {}",
                other.format()
            ))),
        }
    }

    fn inject_fault(&self, fault: Fault) -> Result<()> {
        match fault {
            Fault::Lost | Fault::Slow(_) | Fault::Throttle(_) => self.faults.inject(fault),
            other => {
                return Err(Error::unsupported(format!(
                    "the host backend cannot inject {other:?}"
                )))
            }
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
