//! Topology: which devices there are, where they sit in the machine, and how fast each pair
//! can exchange data.
//!
//! [`Topology::discover`] joins two views. hwloc ([`HostTopology`]) knows the machine:
//! packages, NUMA nodes, caches and the PCI tree with its bridges. Each backend knows its
//! devices: their PCI address, NUMA node, peer access and direct links, reported through
//! the well-known keys of [`xpu_hal::topology_keys`]. Matching the two by PCI address
//! classifies every device pair into a [`LinkClass`], which gives a first estimate of
//! latency (α) and bandwidth (β); [`calibrate`] replaces estimates with measurements.
//!
//! In a VM hwloc often sees a flattened or invented PCI tree. A topology file in NCCL's XML
//! format ([`nccl_xml`]) then stands in for hwloc's view, so the classification follows the
//! real machine.

pub mod calibrate;
pub mod host;
pub mod nccl_xml;

use std::fmt;

use serde::{Deserialize, Serialize};
use xpu_hal::{topology_keys, Device, DeviceKind, Error, Result};

pub use host::{CacheLevel, DirectLink, HostTopology, NumaNode, PciDevice};

/// How two devices exchange data, from fastest to slowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkClass {
    /// The same device: a copy within its memory.
    SameDevice,
    /// Direct device-to-device links (NVLink, xGMI …).
    DirectLink,
    /// Two devices of one backend that both keep their memory in this process's host
    /// memory (host devices): a copy is one `memcpy`.
    SharedMemory,
    /// Peer access through a PCIe switch both devices hang off.
    PcieSwitch,
    /// Peer access through the CPU's host bridge (same NUMA node).
    PcieHostBridge,
    /// Peer access across CPU sockets.
    CrossSocket,
    /// No path between the devices but through host memory: a copy to a host buffer and
    /// from it (different backends, or devices without peer access).
    HostStaged,
    /// Devices in different processes on one machine.
    CrossProcess,
    /// Devices on different machines.
    Network,
}

impl LinkClass {
    /// Every class, fastest first.
    pub const ALL: [LinkClass; 9] = [
        LinkClass::SameDevice,
        LinkClass::DirectLink,
        LinkClass::SharedMemory,
        LinkClass::PcieSwitch,
        LinkClass::PcieHostBridge,
        LinkClass::CrossSocket,
        LinkClass::HostStaged,
        LinkClass::CrossProcess,
        LinkClass::Network,
    ];

    /// The lowercase name (`same-device`, `pcie-switch` …).
    pub const fn name(self) -> &'static str {
        match self {
            LinkClass::SameDevice => "same-device",
            LinkClass::DirectLink => "direct-link",
            LinkClass::SharedMemory => "shared-memory",
            LinkClass::PcieSwitch => "pcie-switch",
            LinkClass::PcieHostBridge => "pcie-host-bridge",
            LinkClass::CrossSocket => "cross-socket",
            LinkClass::HostStaged => "host-staged",
            LinkClass::CrossProcess => "cross-process",
            LinkClass::Network => "network",
        }
    }

    /// NCCL's short name for the same path (`LOC`, `NVL`, `PIX`, `PHB`, `SYS`, `NET`), for
    /// readers who know its topology dumps.
    pub const fn nccl_name(self) -> &'static str {
        match self {
            LinkClass::SameDevice => "LOC",
            LinkClass::DirectLink => "NVL",
            LinkClass::SharedMemory => "MEM",
            LinkClass::PcieSwitch => "PIX",
            LinkClass::PcieHostBridge => "PHB",
            LinkClass::CrossSocket => "SYS",
            LinkClass::HostStaged => "HST",
            LinkClass::CrossProcess => "SHM",
            LinkClass::Network => "NET",
        }
    }

    /// Whether devices joined by this class belong in one group of a hierarchical
    /// algorithm (they exchange data without a trip through host staging).
    pub const fn is_close(self) -> bool {
        matches!(
            self,
            LinkClass::SameDevice
                | LinkClass::DirectLink
                | LinkClass::SharedMemory
                | LinkClass::PcieSwitch
                | LinkClass::PcieHostBridge
        )
    }

    /// A first estimate of the class's latency (µs) and bandwidth (GB/s) before anything is
    /// measured: typical figures of current hardware, scaled by `count` direct links.
    fn estimate(self, count: u32) -> (f64, f64) {
        match self {
            LinkClass::SameDevice => (1.0, 10.0),
            LinkClass::DirectLink => (2.0, 25.0 * f64::from(count.max(1))),
            LinkClass::SharedMemory => (0.5, 10.0),
            LinkClass::PcieSwitch => (3.0, 24.0),
            LinkClass::PcieHostBridge => (4.0, 20.0),
            LinkClass::CrossSocket => (6.0, 12.0),
            LinkClass::HostStaged => (10.0, 5.0),
            LinkClass::CrossProcess => (5.0, 8.0),
            LinkClass::Network => (20.0, 12.0),
        }
    }
}

impl fmt::Display for LinkClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One device of a topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopoDevice {
    /// The device id (`host:0`, `vulkan:0` …).
    pub id: String,
    /// Its backend.
    pub backend: String,
    /// Its name.
    pub name: String,
    /// Its kind (`cpu`, `gpu` …).
    pub kind: String,
    /// Its PCI address, when the backend reports one.
    pub pci_bus_id: Option<String>,
    /// The NUMA node it is attached to, when known.
    pub numa_node: Option<u32>,
    /// The process holding it (0: this one; in the topology of a communicator across
    /// processes, the process's index).
    pub process: u32,
    /// The machine (node) of that process: an index over the communicator's host names
    /// in process order (0: the first process's machine).
    #[serde(default)]
    pub node: u32,
    /// The measured throughput of its builtin reduction (an `f32` sum accumulated into a
    /// buffer), GB/s of destination, once calibrated ([`calibrate`]).
    #[serde(default)]
    pub reduce_gbps: Option<f64>,
    /// Indexes (within its backend) of the devices it reaches peer to peer.
    #[serde(default)]
    peers: Vec<u32>,
    /// Direct links: (index within its backend, count).
    #[serde(default)]
    direct: Vec<(u32, u32)>,
    /// Its index within its backend.
    #[serde(default)]
    index: u32,
    /// Whether its memory is its process's host memory.
    #[serde(default)]
    host_memory: bool,
}

impl TopoDevice {
    /// Describes a HAL device from what its backend reports.
    pub fn from_device(device: &Device) -> Self {
        let info = device.info();
        let list = |key: &str| -> Vec<&str> {
            info.extra_value(key)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        TopoDevice {
            id: device.id().to_string(),
            backend: device.backend().to_string(),
            name: device.name().to_string(),
            kind: device.kind().name().to_string(),
            pci_bus_id: info
                .extra_value(topology_keys::PCI_BUS_ID)
                .and_then(host::normalize_bus_id),
            numa_node: info
                .extra_value(topology_keys::NUMA_NODE)
                .and_then(|v| v.parse().ok()),
            process: 0,
            node: 0,
            reduce_gbps: None,
            peers: list(topology_keys::PEERS)
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
            direct: list(topology_keys::LINKS)
                .iter()
                .filter_map(|l| {
                    let (peer, count) = l.split_once(':')?;
                    Some((peer.parse().ok()?, count.parse().ok()?))
                })
                .collect(),
            index: device.id().index,
            host_memory: device.backend() == "host" && device.kind() == DeviceKind::Cpu,
        }
    }
}

/// The reduction throughput assumed for a GPU that has not been calibrated, GB/s of
/// destination: a conservative figure for current GPUs' memory (an `f32` sum moves three
/// bytes per byte of destination).
pub const GPU_REDUCE_GBPS: f64 = 200.0;

/// The path between two devices and what it costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// How the devices are connected.
    pub class: LinkClass,
    /// One-way latency of a small transfer, µs (the α of the cost model).
    pub latency_us: f64,
    /// Bandwidth of a large transfer, GB/s (1 / β).
    pub bandwidth_gbps: f64,
    /// Whether the figures were measured ([`calibrate`]) rather than estimated from the class.
    pub measured: bool,
}

impl Link {
    /// The modelled time of moving `bytes` over the link, in µs: α + bytes·β.
    pub fn time_us(&self, bytes: u64) -> f64 {
        self.latency_us + bytes as f64 / (self.bandwidth_gbps.max(1e-9) * 1e3)
    }
}

/// Devices, the machine they are in, and a link for every ordered pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// The CPU side and the PCI tree.
    pub host: HostTopology,
    /// The devices, in the order they were given.
    pub devices: Vec<TopoDevice>,
    /// Row-major `devices.len()²` links: `links[a * n + b]` is the path from `a` to `b`.
    links: Vec<Link>,
}

impl Topology {
    /// Reads the machine with hwloc and classifies every pair of `devices`.
    pub fn discover(devices: &[Device]) -> Result<Self> {
        Ok(Self::from_parts(
            HostTopology::discover()?,
            devices.iter().map(TopoDevice::from_device).collect(),
        ))
    }

    /// [`Topology::discover`], then the measured figures the calibration cache holds for
    /// this device set, if any ([`calibrate::default_cache_path`]; `xpu topo --calibrate`
    /// writes it). A missing or unreadable cache leaves the estimates.
    pub fn discover_calibrated(devices: &[Device]) -> Result<Self> {
        let mut t = Self::discover(devices)?;
        if let Some(path) = calibrate::default_cache_path() {
            if let Ok(cache) = calibrate::load_cache(&path) {
                calibrate::apply_cached(&mut t, &cache)?;
            }
        }
        Ok(t)
    }

    /// Classifies every pair of `devices` within the given machine description (from
    /// hwloc or a topology file).
    pub fn from_parts(host: HostTopology, mut devices: Vec<TopoDevice>) -> Self {
        for d in &mut devices {
            if d.numa_node.is_none() {
                d.numa_node = d
                    .pci_bus_id
                    .as_deref()
                    .and_then(|b| host.pci_device(b))
                    .and_then(|p| p.numa_node);
            }
        }
        let n = devices.len();
        let mut links = Vec::with_capacity(n * n);
        for a in &devices {
            for b in &devices {
                let (class, count) = classify(&host, a, b);
                let (latency_us, bandwidth_gbps) = class.estimate(count);
                links.push(Link {
                    class,
                    latency_us,
                    bandwidth_gbps,
                    measured: false,
                });
            }
        }
        Topology {
            host,
            devices,
            links,
        }
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The path from device `a` to device `b` (positions in [`Topology::devices`]).
    pub fn link(&self, a: usize, b: usize) -> Result<&Link> {
        let n = self.len();
        if a >= n || b >= n {
            return Err(Error::invalid(format!(
                "the topology has {n} devices; positions {a} and {b} must both be below {n}"
            )));
        }
        Ok(&self.links[a * n + b])
    }

    /// Replaces the estimate for `a → b` with a measurement.
    pub fn set_measured(
        &mut self,
        a: usize,
        b: usize,
        latency_us: f64,
        bandwidth_gbps: f64,
    ) -> Result<()> {
        self.link(a, b)?;
        let n = self.len();
        let link = &mut self.links[a * n + b];
        link.latency_us = latency_us;
        link.bandwidth_gbps = bandwidth_gbps;
        link.measured = true;
        Ok(())
    }

    /// µs per byte of destination of device `i`'s builtin reduction: measured where
    /// calibrated; else [`GPU_REDUCE_GBPS`] for a GPU, whose memory serves hundreds of
    /// GB/s, and for other devices their copy within their own memory slowed by half (a
    /// reduction reads two bytes where a copy reads one).
    pub fn reduce_beta(&self, i: usize) -> f64 {
        let device = self.devices.get(i);
        let gbps = match device.and_then(|d| d.reduce_gbps) {
            Some(g) => g,
            None if device.is_some_and(|d| d.kind == DeviceKind::Gpu.name()) => GPU_REDUCE_GBPS,
            None => self.link(i, i).map_or(1.0, |l| l.bandwidth_gbps / 1.5),
        };
        1.0 / (gbps.max(1e-6) * 1e3)
    }

    /// The position of the device with this id.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.devices.iter().position(|d| d.id == id)
    }

    /// Groups of well-connected devices (every pair joined by a [`LinkClass::is_close`]
    /// class), in device order: the groups of hierarchical algorithms.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for d in 0..self.len() {
            let home = groups.iter_mut().find(|g| {
                g.iter().all(|&m| {
                    self.links[m * self.len() + d].class.is_close()
                        && self.links[d * self.len() + m].class.is_close()
                })
            });
            match home {
                Some(g) => g.push(d),
                None => groups.push(vec![d]),
            }
        }
        groups
    }

    /// The slowest link between distinct devices (`None` with fewer than two devices).
    pub fn slowest_link(&self) -> Option<&Link> {
        let n = self.len();
        (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| &self.links[a * n + b])
            .min_by(|x, y| x.bandwidth_gbps.total_cmp(&y.bandwidth_gbps))
    }
}

/// The class of the path from `a` to `b`, and the number of direct links for
/// [`LinkClass::DirectLink`].
fn classify(host: &HostTopology, a: &TopoDevice, b: &TopoDevice) -> (LinkClass, u32) {
    if a.node != b.node {
        return (LinkClass::Network, 0);
    }
    if a.process != b.process {
        return (LinkClass::CrossProcess, 0);
    }
    if a.id == b.id {
        return (LinkClass::SameDevice, 0);
    }
    if a.backend != b.backend {
        return (LinkClass::HostStaged, 0);
    }
    if a.host_memory && b.host_memory {
        return (LinkClass::SharedMemory, 0);
    }
    if let Some(&(_, count)) = a.direct.iter().find(|(peer, _)| *peer == b.index) {
        return (LinkClass::DirectLink, count);
    }
    if let (Some(pa), Some(pb)) = (a.pci_bus_id.as_deref(), b.pci_bus_id.as_deref()) {
        let count: u32 = host
            .links
            .iter()
            .filter(|l| (l.from == pa && l.to == pb) || (l.from == pb && l.to == pa))
            .map(|l| l.count)
            .sum();
        if count > 0 {
            return (LinkClass::DirectLink, count);
        }
    }
    if !a.peers.contains(&b.index) {
        return (LinkClass::HostStaged, 0);
    }
    let pci = |d: &TopoDevice| d.pci_bus_id.as_deref().and_then(|p| host.pci_device(p));
    match (pci(a), pci(b)) {
        (Some(pa), Some(pb)) => {
            let shared_switch = pa
                .bridges
                .iter()
                .filter(|br| !br.starts_with(host::HOST_BRIDGE))
                .any(|br| pb.bridges.contains(br));
            if shared_switch {
                (LinkClass::PcieSwitch, 0)
            } else if a.numa_node.is_some() && a.numa_node != b.numa_node {
                (LinkClass::CrossSocket, 0)
            } else {
                (LinkClass::PcieHostBridge, 0)
            }
        }
        _ if a.numa_node.is_some() && b.numa_node.is_some() && a.numa_node != b.numa_node => {
            (LinkClass::CrossSocket, 0)
        }
        _ => (LinkClass::PcieHostBridge, 0),
    }
}

#[cfg(test)]
mod tests;
