//! What a device is and what it can do: [`DeviceInfo`], [`Capabilities`], [`MemoryInfo`].

use std::fmt;

use crate::dtype::DType;
use crate::kernel::KernelFormat;

/// The broad kind of a device, for display and for coarse placement decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A CPU (the host backend's virtual devices, or a CPU Vulkan driver like lavapipe).
    Cpu,
    /// A discrete or integrated GPU.
    Gpu,
    /// A neural processing unit or other fixed-function accelerator.
    Npu,
    /// Anything else.
    Other,
}

impl DeviceKind {
    /// The lowercase name (`"cpu"`, `"gpu"` …).
    pub const fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
            DeviceKind::Other => "other",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a device can do. The conformance suite skips a case whose capability is absent,
/// naming the capability as the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Capabilities {
    /// Dtypes the builtin operations support on this device.
    pub dtypes: Vec<DType>,
    /// The largest single allocation in bytes.
    pub max_allocation: u64,
    /// Whether the device can copy from other devices of its backend directly
    /// ([`crate::Stream::copy_peer`]).
    pub peer_access: bool,
    /// Whether events are backed by timeline semaphores (or an equivalent counter), so
    /// that waits on them cost no host thread.
    pub timeline_events: bool,
    /// Whether events carry timestamps, so that [`crate::Event::elapsed_since`] works.
    pub event_timing: bool,
    /// Kernel formats [`crate::Device::load_kernel`] accepts.
    pub kernel_formats: Vec<KernelFormat>,
    /// The largest number of streams the device supports at once (`u32::MAX`: no limit).
    pub max_streams: u32,
    /// Byte alignment a buffer argument of a kernel launch must start at (1: any).
    /// Builtin operations have no such requirement.
    pub kernel_arg_alignment: u64,
    /// `Some(granularity)` when the device can reserve a range of addresses and back it
    /// with memory on demand, in multiples of `granularity` bytes: then
    /// [`crate::Device::allocate_growable`] makes allocations that
    /// [`crate::Allocation::resize`] grows and shrinks in place (expandable segments).
    /// `None` when it cannot.
    pub virtual_memory_granularity: Option<u64>,
    /// Whether the CPU can read and write the device's allocations directly
    /// ([`crate::Allocation::host_view`]): host memory, or a device that shares memory
    /// with the host and maps it coherently. Collectives then let the ranks' threads move
    /// the bytes themselves.
    pub host_addressable: bool,
    /// The standard operations ([`crate::ops`]) the device provides, with their dtypes;
    /// [`crate::Stream::run_op`] refuses the others as `Unsupported`.
    pub ops: Vec<crate::ops::OpSupport>,
}

impl Capabilities {
    /// Whether builtin operations on `dtype` are supported.
    pub fn supports_dtype(&self, dtype: DType) -> bool {
        self.dtypes.contains(&dtype)
    }

    /// Whether the standard operation `kind` runs on `dtype` (of its main operand).
    pub fn supports_op(&self, kind: crate::ops::OpKind, dtype: DType) -> bool {
        self.ops
            .iter()
            .any(|s| s.kind == kind && s.dtypes.contains(&dtype))
    }

    /// Whether kernels of `format` can be loaded.
    pub fn supports_kernel_format(&self, format: KernelFormat) -> bool {
        self.kernel_formats.contains(&format)
    }
}

/// The static description of a device, read once when it is created.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The device's human-readable name (`"host CPU (virtual device 0)"`, `"llvmpipe"` …).
    pub name: String,
    /// Its broad kind.
    pub kind: DeviceKind,
    /// The vendor, where the backend knows it.
    pub vendor: String,
    /// The driver or runtime version, where the backend knows it.
    pub driver: String,
    /// Total memory the device can allocate, in bytes.
    pub memory_bytes: u64,
    /// What it can do.
    pub capabilities: Capabilities,
    /// Backend-specific facts as `key=value` strings (a Vulkan device's subgroup size,
    /// a plugin's capabilities extension …), shown by `xpu devices`. The keys in
    /// [`topology_keys`] have fixed meanings that topology discovery reads.
    pub extra: Vec<String>,
}

/// Keys of [`DeviceInfo::extra`] with fixed meanings: how a backend tells topology
/// discovery where its device sits and how it connects to its siblings.
pub mod topology_keys {
    /// The device's PCI address, `DDDD:BB:DD.F` in hexadecimal (`0000:1b:00.0`).
    pub const PCI_BUS_ID: &str = "pci_bus_id";
    /// The device's UUID, as the vendor prints it.
    pub const UUID: &str = "uuid";
    /// The NUMA node the device is attached to, a decimal number.
    pub const NUMA_NODE: &str = "numa_node";
    /// Indexes of devices of the same backend this device reaches peer to peer, as a
    /// comma list (`1,2,3`).
    pub const PEERS: &str = "peers";
    /// Direct high-bandwidth links (NVLink and the like) to devices of the same backend,
    /// as a comma list of `INDEX:COUNT` (`1:12,2:12`: twelve links to each of 1 and 2).
    pub const LINKS: &str = "links";
}

impl DeviceInfo {
    /// The value of the `key=value` entry of [`DeviceInfo::extra`] named `key`, if any.
    pub fn extra_value(&self, key: &str) -> Option<&str> {
        self.extra.iter().find_map(|entry| {
            entry
                .split_once('=')
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)
        })
    }
}

/// A snapshot of a device's memory use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Total bytes the device can hold.
    pub total: u64,
    /// Bytes currently free for new allocations.
    pub free: u64,
}
