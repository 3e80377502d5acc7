//! `xpu topo`: the machine and how its devices connect, as a table, JSON or NCCL XML.

use std::path::{Path, PathBuf};

use serde::Serialize;
use xpu::{DeviceSelector, Registry, Result};
use xpu_collectives::topology::{calibrate, nccl_xml, HostTopology, TopoDevice};
use xpu_collectives::{Link, Topology};

use crate::cli::format_bytes;

/// What `xpu topo` was asked to do.
pub struct TopoArgs {
    /// Devices to include.
    pub selector: DeviceSelector,
    /// Print JSON.
    pub json: bool,
    /// Print NCCL XML.
    pub xml: bool,
    /// Read the machine from this NCCL topology file instead of hwloc.
    pub topo_file: Option<PathBuf>,
    /// Measure the links (and store the figures in the cache).
    pub calibrate: bool,
    /// Bytes of the calibration's bandwidth transfer.
    pub calibrate_bytes: u64,
}

#[derive(Serialize)]
struct LinkJson<'a> {
    from: &'a str,
    to: &'a str,
    #[serde(flatten)]
    link: &'a Link,
}

#[derive(Serialize)]
struct TopoJson<'a> {
    host: &'a HostTopology,
    devices: &'a [TopoDevice],
    links: Vec<LinkJson<'a>>,
    groups: Vec<Vec<&'a str>>,
    calibration_cache: Option<String>,
}

/// Runs `xpu topo`. Under an MPI launcher it forms a communicator over every
/// process's devices and the first process prints the whole job's topology: every
/// device named `ID@pQ`, with its process and machine, and the links between processes
/// (cross-process within a machine, network between machines), measured over the
/// communicator's own transport with `--calibrate`.
pub fn run(registry: &Registry, args: &TopoArgs) -> Result<()> {
    let devices = registry.devices(&args.selector)?;
    if let Some(launch) = super::launch::Launch::detect()? {
        let comm = launch.communicator(devices, xpu_collectives::CommOptions::from_env()?)?;
        if args.calibrate {
            let bytes = usize::try_from(args.calibrate_bytes).map_err(|_| {
                xpu::Error::invalid("--calibrate-bytes does not fit this platform's sizes")
            })?;
            comm.calibrate_processes(bytes)?;
        }
        if comm.first_rank() == 0 {
            let topology = comm.global_topology();
            if args.xml {
                print!("{}", nccl_xml::write(&topology)?);
            } else if args.json {
                print_json(&topology, None)?;
            } else {
                print_table(&topology);
            }
        }
        return Ok(());
    }
    let host = match &args.topo_file {
        Some(path) => nccl_xml::load(path)?,
        None => HostTopology::discover()?,
    };
    let mut topology =
        Topology::from_parts(host, devices.iter().map(TopoDevice::from_device).collect());
    let cache_path = calibrate::default_cache_path();
    if args.calibrate {
        let options = calibrate::CalibrationOptions {
            bytes: args.calibrate_bytes,
            ..Default::default()
        };
        let measured = calibrate::calibrate(&mut topology, &devices, options)?;
        if let Some(path) = &cache_path {
            calibrate::store(path, &topology, &measured)?;
        }
    } else if let Some(path) = &cache_path {
        // A cache that cannot be read is reported but does not stop the listing.
        match calibrate::load_cache(path) {
            Ok(cache) => {
                calibrate::apply_cached(&mut topology, &cache)?;
            }
            Err(e) => eprintln!("xpu: ignoring the calibration cache: {e}"),
        }
    }
    if args.xml {
        print!("{}", nccl_xml::write(&topology)?);
    } else if args.json {
        print_json(&topology, cache_path.as_deref())?;
    } else {
        print_table(&topology);
    }
    Ok(())
}

fn print_json(t: &Topology, cache: Option<&Path>) -> Result<()> {
    let n = t.len();
    let mut links = Vec::new();
    for a in 0..n {
        for b in 0..n {
            links.push(LinkJson {
                from: &t.devices[a].id,
                to: &t.devices[b].id,
                link: t.link(a, b)?,
            });
        }
    }
    let groups = t
        .groups()
        .into_iter()
        .map(|g| g.into_iter().map(|d| t.devices[d].id.as_str()).collect())
        .collect();
    let doc = TopoJson {
        host: &t.host,
        devices: &t.devices,
        links,
        groups,
        calibration_cache: cache.map(|p| p.display().to_string()),
    };
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| xpu::Error::backend_message("xpu", format!("encoding JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

fn print_table(t: &Topology) {
    let h = &t.host;
    println!(
        "machine ({}): {} package(s), {} core(s), {} PU(s), {} NUMA node(s)",
        h.source,
        h.packages,
        h.cores,
        h.pus,
        h.numa_nodes.len()
    );
    for node in &h.numa_nodes {
        println!("  NUMA node {}: CPUs {}", node.os_index, node.cpus);
    }
    if !h.caches.is_empty() {
        let caches: Vec<String> = h
            .caches
            .iter()
            .map(|c| format!("L{} {}×{}", c.level, c.count, format_bytes(c.size)))
            .collect();
        println!("  caches: {}", caches.join(", "));
    }
    println!("  PCI functions: {}", h.pci.len());
    println!();
    // The processes and machines, for a topology that spans processes.
    let spans = t.devices.iter().any(|d| d.process != 0);
    if spans {
        println!("processes: device@pQ is process Q's; machines numbered in process order");
    }
    println!(
        "{:<18} {}{:<10} {:<14} {:<5} {:<12} name",
        "device",
        if spans { "proc machine " } else { "" },
        "kind",
        "pci",
        "numa",
        "reduce GB/s"
    );
    for (i, d) in t.devices.iter().enumerate() {
        let place = if spans {
            format!("{:<4} {:<7} ", d.process, d.node)
        } else {
            String::new()
        };
        // Measured (`*`) where calibrated, else the estimate the cost model uses.
        let reduce = format!(
            "{:.2}{}",
            1.0 / (t.reduce_beta(i) * 1e3),
            if d.reduce_gbps.is_some() { "*" } else { "" }
        );
        println!(
            "{:<18} {place}{:<10} {:<14} {:<5} {:<12} {}",
            d.id,
            d.kind,
            d.pci_bus_id.as_deref().unwrap_or("-"),
            d.numa_node
                .map_or_else(|| "-".to_string(), |n| n.to_string()),
            reduce,
            d.name
        );
    }
    if t.is_empty() {
        return;
    }
    println!();
    println!("links (class, latency µs / bandwidth GB/s; * = measured):");
    let width = t
        .devices
        .iter()
        .map(|d| d.id.len())
        .max()
        .unwrap_or(8)
        .max(8);
    print!("{:<width$}", "");
    for d in &t.devices {
        print!("  {:<28}", d.id);
    }
    println!();
    for (a, da) in t.devices.iter().enumerate() {
        print!("{:<width$}", da.id);
        for b in 0..t.len() {
            let cell = match t.link(a, b) {
                Ok(l) => format!(
                    "{} {:.1}/{:.1}{}",
                    l.class.nccl_name(),
                    l.latency_us,
                    l.bandwidth_gbps,
                    if l.measured { "*" } else { "" }
                ),
                Err(_) => "?".into(),
            };
            print!("  {cell:<28}");
        }
        println!();
    }
    let legend: Vec<String> = xpu_collectives::LinkClass::ALL
        .iter()
        .map(|c| format!("{}={}", c.nccl_name(), c.name()))
        .collect();
    println!("  ({})", legend.join(", "));
    let groups: Vec<String> = t
        .groups()
        .into_iter()
        .map(|g| {
            let ids: Vec<&str> = g.into_iter().map(|d| t.devices[d].id.as_str()).collect();
            format!("[{}]", ids.join(" "))
        })
        .collect();
    println!("groups of well-connected devices: {}", groups.join(" "));
}
