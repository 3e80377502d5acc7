//! NCCL's XML topology format, read and written.
//!
//! NCCL dumps the topology it detected with `NCCL_TOPO_DUMP_FILE` and reads one with
//! `NCCL_TOPO_FILE`; operators of virtual machines write such files because the VM's PCI
//! tree hides the real one. xpu reads the same files (`xpu topo --topo-file`, or
//! `XPU_TOPO_FILE`) and writes them (`xpu topo --xml`). The parts used:
//!
//! ```xml
//! <system version="1">
//!   <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel">
//!     <pci busid="0000:1a:00.0" class="0x060400" vendor="0x10b5" device="0x8747"
//!          link_speed="16.0 GT/s PCIe" link_width="16">      <!-- a PCIe switch -->
//!       <pci busid="0000:1b:00.0" class="0x030200" vendor="0x10de" device="0x2335">
//!         <gpu dev="0" sm="90" rank="0" gdr="1">
//!           <nvlink target="0000:1c:00.0" count="18" tclass="0x030200"/>
//!         </gpu>
//!       </pci>
//!     </pci>
//!   </cpu>
//! </system>
//! ```
//!
//! Each `cpu` is a NUMA node; nested `pci` elements are the PCI tree below it (an element
//! whose class is a bridge, `0x0604xx`, is a switch port); `nvlink` elements are direct
//! links. Elements and attributes xpu does not use are accepted and ignored.

use std::collections::BTreeMap;

use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, Event};
use quick_xml::{Reader, Writer, XmlVersion};
use xpu_hal::{Error, Result};

use super::host::{normalize_bus_id, DirectLink, HostTopology, NumaNode, PciDevice, HOST_BRIDGE};
use super::Topology;

/// A parsed element: name, attributes, children.
#[derive(Debug, Default)]
struct Element {
    name: String,
    attrs: BTreeMap<String, String>,
    children: Vec<Element>,
}

/// How deep elements may nest: a real machine's `<system>`, `<cpu>`, bridges and devices
/// are a few levels; the limit keeps a hostile file from exhausting the stack (the tree
/// is walked and dropped recursively) or memory.
const MAX_DEPTH: usize = 64;

/// The largest topology file read, in bytes (NCCL's dumps of large machines are tens
/// of kilobytes).
const MAX_FILE_BYTES: u64 = 16 << 20;

fn parse_elements(text: &str, origin: &str) -> Result<Element> {
    let bad = |pos: u64, what: String| {
        Error::invalid(format!(
            "{origin} is not a readable NCCL topology file: {what} (near byte {pos}); give a file written by NCCL_TOPO_DUMP_FILE or `xpu topo --xml`"
        ))
    };
    let mut reader = Reader::from_str(text);
    let mut stack: Vec<Element> = vec![Element::default()];
    loop {
        let pos = reader.buffer_position();
        let event = reader.read_event().map_err(|e| bad(pos, e.to_string()))?;
        match event {
            Event::Start(start) => {
                if stack.len() > MAX_DEPTH {
                    return Err(bad(
                        pos,
                        format!("elements nest more than {MAX_DEPTH} deep; a machine's PCI tree is far shallower"),
                    ));
                }
                stack.push(element(&start, pos, &bad)?)
            }
            Event::Empty(start) => {
                let e = element(&start, pos, &bad)?;
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(e);
                }
            }
            Event::End(_) => {
                let done = stack
                    .pop()
                    .ok_or_else(|| bad(pos, "an end tag without a start".into()))?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => return Err(bad(pos, "an end tag without a start".into())),
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let mut root = stack
        .pop()
        .filter(|_| stack.is_empty())
        .ok_or_else(|| bad(text.len() as u64, "an element is not closed".into()))?;
    root.children
        .pop()
        .filter(|e| e.name == "system")
        .ok_or_else(|| bad(0, "the document's root element is not <system>".into()))
}

fn element(
    start: &BytesStart<'_>,
    pos: u64,
    bad: &dyn Fn(u64, String) -> Error,
) -> Result<Element> {
    let name = start.name().into_inner().to_string();
    let mut attrs = BTreeMap::new();
    for attr in start.attributes() {
        let attr = attr.map_err(|e| bad(pos, e.to_string()))?;
        let key = attr.key.into_inner().to_string();
        let value = attr
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(|e| bad(pos, e.to_string()))?
            .into_owned();
        attrs.insert(key, value);
    }
    Ok(Element {
        name,
        attrs,
        children: Vec::new(),
    })
}

fn hex_u16(text: Option<&String>) -> u16 {
    text.and_then(|t| {
        let t = t.trim();
        let t = t.strip_prefix("0x").unwrap_or(t);
        u32::from_str_radix(t, 16).ok()
    })
    // Class codes are written with the programming interface byte (0x060400); keep the
    // class and subclass.
    .map(|v| {
        if v > 0xffff {
            (v >> 8) as u16
        } else {
            v as u16
        }
    })
    .unwrap_or(0)
}

/// Reads an NCCL topology file's text into a machine description. `origin` names the file
/// in messages.
pub fn parse(text: &str, origin: &str) -> Result<HostTopology> {
    let system = parse_elements(text, origin)?;
    let mut host = HostTopology {
        source: origin.to_string(),
        packages: 0,
        cores: 0,
        pus: 0,
        numa_nodes: Vec::new(),
        caches: Vec::new(),
        pci: Vec::new(),
        links: Vec::new(),
    };
    for (position, cpu) in system
        .children
        .iter()
        .filter(|c| c.name == "cpu")
        .enumerate()
    {
        let numa = cpu
            .attrs
            .get("numaid")
            .and_then(|n| n.parse().ok())
            .unwrap_or(position as u32);
        host.packages += 1;
        host.numa_nodes.push(NumaNode {
            os_index: numa,
            cpus: cpu.attrs.get("affinity").cloned().unwrap_or_default(),
        });
        let root = vec![format!("{HOST_BRIDGE}{numa}")];
        for pci in cpu.children.iter().filter(|c| c.name == "pci") {
            walk_pci(pci, &root, numa, origin, &mut host)?;
        }
    }
    if host.numa_nodes.is_empty() {
        return Err(Error::invalid(format!(
            "{origin} describes no <cpu> element, so no device can be placed; list each NUMA node as <cpu numaid=\"N\"> with its PCI tree inside"
        )));
    }
    Ok(host)
}

fn walk_pci(
    element: &Element,
    bridges: &[String],
    numa: u32,
    origin: &str,
    host: &mut HostTopology,
) -> Result<()> {
    let raw = element.attrs.get("busid").map(String::as_str).unwrap_or("");
    let bus_id = normalize_bus_id(raw).ok_or_else(|| {
        Error::invalid(format!(
            "{origin}: a <pci> element has busid \"{raw}\", which is not a PCI address; write it as DDDD:BB:DD.F"
        ))
    })?;
    let speed = element
        .attrs
        .get("link_speed")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f32>().ok())
        .unwrap_or(0.0);
    let width = element
        .attrs
        .get("link_width")
        .and_then(|w| w.parse::<f32>().ok())
        .unwrap_or(0.0);
    host.pci.push(PciDevice {
        bus_id: bus_id.clone(),
        class: hex_u16(element.attrs.get("class")),
        vendor: hex_u16(element.attrs.get("vendor")),
        device: hex_u16(element.attrs.get("device")),
        // GT/s per lane × lanes × 128/130 encoding / 8 bits.
        link_speed_gbps: speed * width * 128.0 / 130.0 / 8.0,
        bridges: bridges.to_vec(),
        numa_node: Some(numa),
    });
    let mut below = bridges.to_vec();
    below.push(bus_id.clone());
    for child in &element.children {
        match child.name.as_str() {
            "pci" => walk_pci(child, &below, numa, origin, host)?,
            "gpu" => {
                for link in child.children.iter().filter(|l| l.name == "nvlink") {
                    let Some(target) = link.attrs.get("target").and_then(|t| normalize_bus_id(t))
                    else {
                        continue;
                    };
                    let count = link
                        .attrs
                        .get("count")
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(1);
                    host.links.push(DirectLink {
                        from: bus_id.clone(),
                        to: target,
                        count,
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Reads an NCCL topology file.
pub fn load(path: &std::path::Path) -> Result<HostTopology> {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if size > MAX_FILE_BYTES {
        return Err(Error::invalid(format!(
            "the topology file {} is {size} bytes, more than the {MAX_FILE_BYTES} a topology file can be; give the file NCCL_TOPO_DUMP_FILE or `xpu topo --xml` wrote",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the topology file {}: {e}; check the path given by --topo-file or XPU_TOPO_FILE",
            path.display()
        ))
    })?;
    parse(&text, &path.display().to_string())
}

/// Writes the topology in NCCL's format: one `<cpu>` per NUMA node with the PCI functions
/// of the topology's devices and the bridges above them, devices with a PCI address as
/// `<gpu>` elements (their position in the topology as `rank`), direct links as `<nvlink>`.
/// Devices without a PCI address (host devices, CPU drivers) have no place in the format
/// and are left out.
pub fn write(topology: &Topology) -> Result<String> {
    let host = &topology.host;
    // The PCI functions to write: the devices' and every bridge above them.
    let mut wanted: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for (rank, d) in topology.devices.iter().enumerate() {
        let Some(bus) = d.pci_bus_id.as_deref() else {
            continue;
        };
        wanted.insert(bus.to_string(), Some(rank));
        if let Some(p) = host.pci_device(bus) {
            for br in p.bridges.iter().filter(|b| !b.starts_with(HOST_BRIDGE)) {
                wanted.entry(br.clone()).or_insert(None);
            }
        }
    }
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let io = |e: std::io::Error| Error::backend_message("topology", format!("writing XML: {e}"));
    w.write_event(Event::Decl(BytesDecl::new("1.0", None, None)))
        .map_err(io)?;
    let mut system = BytesStart::new("system");
    system.push_attribute(("version", "1"));
    w.write_event(Event::Start(system)).map_err(io)?;
    let mut numas: Vec<&NumaNode> = host.numa_nodes.iter().collect();
    if numas.is_empty() {
        return Err(Error::invalid(
            "the topology has no NUMA node to place devices under; describe the machine with hwloc or a topology file",
        ));
    }
    numas.sort_by_key(|n| n.os_index);
    for (i, numa) in numas.iter().enumerate() {
        let mut cpu = BytesStart::new("cpu");
        cpu.push_attribute(("numaid", numa.os_index.to_string().as_str()));
        cpu.push_attribute(("affinity", numa.cpus.as_str()));
        cpu.push_attribute(("arch", std::env::consts::ARCH));
        w.write_event(Event::Start(cpu)).map_err(io)?;
        // Top-level functions of this node: wanted ones whose wanted ancestors are none.
        let on_node = |p: &PciDevice| {
            p.numa_node.unwrap_or(numas[0].os_index) == numa.os_index
                || (i == 0 && p.numa_node.is_none())
        };
        let tops: Vec<&PciDevice> = host
            .pci
            .iter()
            .filter(|p| wanted.contains_key(&p.bus_id) && on_node(p))
            .filter(|p| !p.bridges.iter().any(|b| wanted.contains_key(b)))
            .collect();
        for p in tops {
            write_pci(&mut w, host, &wanted, p).map_err(io)?;
        }
        w.write_event(Event::End(BytesEnd::new("cpu")))
            .map_err(io)?;
    }
    w.write_event(Event::End(BytesEnd::new("system")))
        .map_err(io)?;
    String::from_utf8(w.into_inner()).map_err(|e| {
        Error::backend_message("topology", format!("the XML written is not UTF-8: {e}"))
    })
}

fn write_pci(
    w: &mut Writer<Vec<u8>>,
    host: &HostTopology,
    wanted: &BTreeMap<String, Option<usize>>,
    p: &PciDevice,
) -> std::io::Result<()> {
    let mut e = BytesStart::new("pci");
    e.push_attribute(("busid", p.bus_id.as_str()));
    e.push_attribute(("class", format!("0x{:04x}00", p.class).as_str()));
    e.push_attribute(("vendor", format!("0x{:04x}", p.vendor).as_str()));
    e.push_attribute(("device", format!("0x{:04x}", p.device).as_str()));
    w.write_event(Event::Start(e))?;
    if let Some(Some(rank)) = wanted.get(&p.bus_id) {
        let mut gpu = BytesStart::new("gpu");
        gpu.push_attribute(("dev", rank.to_string().as_str()));
        gpu.push_attribute(("rank", rank.to_string().as_str()));
        let links: Vec<&DirectLink> = host.links.iter().filter(|l| l.from == p.bus_id).collect();
        if links.is_empty() {
            w.write_event(Event::Empty(gpu))?;
        } else {
            w.write_event(Event::Start(gpu))?;
            for l in links {
                let mut nv = BytesStart::new("nvlink");
                nv.push_attribute(("target", l.to.as_str()));
                nv.push_attribute(("count", l.count.to_string().as_str()));
                w.write_event(Event::Empty(nv))?;
            }
            w.write_event(Event::End(BytesEnd::new("gpu")))?;
        }
    }
    // Children: wanted functions whose nearest wanted ancestor is this one.
    for child in host.pci.iter().filter(|c| wanted.contains_key(&c.bus_id)) {
        let nearest = child.bridges.iter().rev().find(|b| wanted.contains_key(*b));
        if nearest == Some(&p.bus_id) {
            write_pci(w, host, wanted, child)?;
        }
    }
    w.write_event(Event::End(BytesEnd::new("pci")))?;
    Ok(())
}
