//! The machine as hwloc sees it: packages, NUMA nodes, cores, caches and PCI devices with
//! the bridges above them and the CPUs close to them.

use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes, UpstreamAttributes};
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use serde::{Deserialize, Serialize};
use xpu_hal::{Error, Result};

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The operating system's number for it.
    pub os_index: u32,
    /// The CPUs (processing units) in it, as hwloc's list syntax (`0-15,32-47`).
    pub cpus: String,
}

/// One CPU cache level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheLevel {
    /// 1 for L1, 2 for L2 …
    pub level: u32,
    /// How many caches of this level the machine has.
    pub count: u32,
    /// The size of one, in bytes.
    pub size: u64,
}

/// One PCI function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciDevice {
    /// `DDDD:BB:DD.F`, lowercase hexadecimal.
    pub bus_id: String,
    /// The PCI class code (`0x0302` is a 3D controller, `0x1200` an accelerator).
    pub class: u16,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Link speed in GB/s as hwloc reports it (0 when unknown, as in most VMs).
    pub link_speed_gbps: f32,
    /// The bridges above it, from the host bridge down: PCI bridges (switch ports) by
    /// their bus id, host bridges as `hostbridge:…`. Two devices share a PCIe switch when
    /// they share a PCI bridge.
    pub bridges: Vec<String>,
    /// The NUMA node it is attached to, if hwloc knows.
    pub numa_node: Option<u32>,
}

/// The CPU side of the machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTopology {
    /// Where this description came from: `hwloc` or the file it was read from.
    pub source: String,
    /// CPU packages (sockets).
    pub packages: u32,
    /// Physical cores.
    pub cores: u32,
    /// Processing units (hardware threads).
    pub pus: u32,
    /// NUMA nodes.
    pub numa_nodes: Vec<NumaNode>,
    /// Cache levels, innermost first.
    pub caches: Vec<CacheLevel>,
    /// PCI functions.
    pub pci: Vec<PciDevice>,
    /// Direct device-to-device links (NVLink and the like) between PCI functions. hwloc
    /// does not see them; they come from a topology file or from the backends.
    pub links: Vec<DirectLink>,
}

/// A direct link between two PCI functions, as a topology file gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectLink {
    /// One end's bus id.
    pub from: String,
    /// The other end's bus id.
    pub to: String,
    /// How many links join them.
    pub count: u32,
}

impl HostTopology {
    /// Reads the machine through hwloc, with I/O devices.
    pub fn discover() -> Result<Self> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::backend_message(
                "topology",
                format!(
                    "hwloc could not {what}: {e}; give the topology by file (--topo-file or XPU_TOPO_FILE) instead"
                ),
            )
        };
        let topology = hwlocality::Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| fail("enable I/O discovery", &e))?
            .build()
            .map_err(|e| fail("read this machine's topology", &e))?;
        let count = |ty: ObjectType| topology.objects_with_type(ty).count() as u32;
        let numa_nodes = topology
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| NumaNode {
                os_index: n.os_index().unwrap_or(0) as u32,
                cpus: n
                    .cpuset()
                    .map(|c| cpu_list(&c.to_string()))
                    .unwrap_or_default(),
            })
            .collect();
        let caches = [
            (1, ObjectType::L1Cache),
            (2, ObjectType::L2Cache),
            (3, ObjectType::L3Cache),
        ]
        .into_iter()
        .filter_map(|(level, ty)| {
            let objects: Vec<_> = topology.objects_with_type(ty).collect();
            let size = objects.first().and_then(|o| match o.attributes() {
                Some(ObjectAttributes::Cache(c)) => c.size().map(|s| s.get()),
                _ => None,
            })?;
            Some(CacheLevel {
                level,
                count: objects.len() as u32,
                size,
            })
        })
        .collect();
        let pci = topology.pci_devices().filter_map(pci_device).collect();
        Ok(HostTopology {
            source: "hwloc".into(),
            packages: count(ObjectType::Package),
            cores: count(ObjectType::Core),
            pus: count(ObjectType::PU),
            numa_nodes,
            caches,
            pci,
            links: Vec::new(),
        })
    }

    /// The PCI function with this bus id (compared case-insensitively, with or without
    /// the domain).
    pub fn pci_device(&self, bus_id: &str) -> Option<&PciDevice> {
        let wanted = normalize_bus_id(bus_id)?;
        self.pci.iter().find(|p| p.bus_id == wanted)
    }
}

/// `DDDD:BB:DD.F` in lowercase, from the forms drivers print (`0000:1B:00.0`,
/// `00000000:1b:00.0`, `1b:00.0`). `None` when it is not a PCI address.
pub fn normalize_bus_id(bus_id: &str) -> Option<String> {
    let text = bus_id.trim().to_ascii_lowercase();
    let (rest, function) = text.rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, device] = parts.as_slice() else {
        return None;
    };
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    Some(format_bus_id(domain, bus, device, function))
}

/// The prefix of a host bridge's name in [`PciDevice::bridges`].
pub const HOST_BRIDGE: &str = "hostbridge:";

fn format_bus_id(domain: u32, bus: u8, device: u8, function: u8) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

fn pci_device(object: &TopologyObject) -> Option<PciDevice> {
    let Some(ObjectAttributes::PCIDevice(a)) = object.attributes() else {
        return None;
    };
    let mut bridges = Vec::new();
    let mut parent = object.parent();
    while let Some(p) = parent {
        if p.object_type() != ObjectType::Bridge {
            break;
        }
        let id = match p.attributes() {
            Some(ObjectAttributes::Bridge(b)) => match b.upstream_attributes() {
                Some(UpstreamAttributes::PCI(u)) => {
                    format_bus_id(u.domain() as u32, u.bus_id(), u.bus_device(), u.function())
                }
                // A host bridge: name it by the bus it opens.
                None => match b.downstream_attributes() {
                    Some(DownstreamAttributes::PCI(d)) => {
                        format!("{HOST_BRIDGE}{:04x}:{:02x}", d.domain(), d.secondary_bus())
                    }
                    None => format!("{HOST_BRIDGE}{}", p.global_persistent_index()),
                },
            },
            _ => format!("{HOST_BRIDGE}{}", p.global_persistent_index()),
        };
        bridges.push(id);
        parent = p.parent();
    }
    bridges.reverse();
    let numa_node = object
        .first_non_io_ancestor()
        .and_then(|a| a.nodeset())
        .and_then(|n| n.first_set())
        .map(|n| usize::from(n) as u32);
    Some(PciDevice {
        bus_id: format_bus_id(a.domain() as u32, a.bus_id(), a.bus_device(), a.function()),
        class: a.class_id(),
        vendor: a.vendor_id(),
        device: a.device_id(),
        link_speed_gbps: a.link_speed(),
        bridges,
        numa_node,
    })
}

/// hwloc's bitmap `Display` is `CpuSet(0-3)`; keep the list.
fn cpu_list(text: &str) -> String {
    text.split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(text)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized() {
        assert_eq!(
            normalize_bus_id("0000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalize_bus_id("00000000:1b:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(normalize_bus_id("1b:00.1").as_deref(), Some("0000:1b:00.1"));
        assert_eq!(normalize_bus_id("nonsense"), None);
        assert_eq!(normalize_bus_id("zz:00.0"), None);
    }

    #[test]
    fn this_machine_is_read() {
        let host = HostTopology::discover().unwrap();
        assert!(host.pus >= 1 && host.cores >= 1 && host.packages >= 1);
        assert!(host.pus >= host.cores);
        assert!(!host.numa_nodes.is_empty());
    }
}
