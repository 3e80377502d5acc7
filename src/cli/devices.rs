//! `xpu devices`: what the registry finds, as a table or as JSON.

use serde::Serialize;
use xpu::{Availability, Device, DeviceSelector, Registry, Result};

use crate::cli::format_bytes;

/// One device as `xpu devices --json` prints it.
#[derive(Serialize)]
struct DeviceJson {
    id: String,
    backend: String,
    index: u32,
    name: String,
    kind: String,
    vendor: String,
    driver: String,
    memory_bytes: u64,
    free_bytes: Option<u64>,
    capabilities: CapabilitiesJson,
    extra: Vec<String>,
}

#[derive(Serialize)]
struct CapabilitiesJson {
    dtypes: Vec<&'static str>,
    max_allocation: u64,
    peer_access: bool,
    timeline_events: bool,
    event_timing: bool,
    kernel_formats: Vec<&'static str>,
    max_streams: u32,
    kernel_arg_alignment: u64,
    /// Bytes per granule of growable allocations; `null` without virtual memory.
    virtual_memory_granularity: Option<u64>,
    /// Whether the CPU reads and writes the device's memory directly.
    host_addressable: bool,
    /// The standard operations the device provides, each with its dtypes.
    ops: std::collections::BTreeMap<&'static str, Vec<&'static str>>,
}

#[derive(Serialize)]
struct BackendJson {
    name: String,
    available: bool,
    devices: usize,
    reason: Option<String>,
}

#[derive(Serialize)]
struct Listing {
    devices: Vec<DeviceJson>,
    backends: Vec<BackendJson>,
}

fn device_json(d: &Device) -> DeviceJson {
    let caps = d.capabilities();
    DeviceJson {
        id: d.id().to_string(),
        backend: d.backend().to_string(),
        index: d.id().index,
        name: d.name().to_string(),
        kind: d.kind().name().to_string(),
        vendor: d.info().vendor.clone(),
        driver: d.info().driver.clone(),
        memory_bytes: d.info().memory_bytes,
        free_bytes: d.memory_info().ok().map(|m| m.free),
        extra: d.info().extra.clone(),
        capabilities: CapabilitiesJson {
            dtypes: caps.dtypes.iter().map(|t| t.name()).collect(),
            max_allocation: caps.max_allocation,
            peer_access: caps.peer_access,
            timeline_events: caps.timeline_events,
            event_timing: caps.event_timing,
            kernel_formats: caps.kernel_formats.iter().map(|f| f.name()).collect(),
            max_streams: caps.max_streams,
            kernel_arg_alignment: caps.kernel_arg_alignment,
            virtual_memory_granularity: caps.virtual_memory_granularity,
            host_addressable: caps.host_addressable,
            ops: caps
                .ops
                .iter()
                .map(|o| (o.kind.name(), o.dtypes.iter().map(|t| t.name()).collect()))
                .collect(),
        },
    }
}

/// Prints the devices the selector picks and every backend's availability.
pub fn run(registry: &Registry, selector: &DeviceSelector, json: bool) -> Result<()> {
    let devices = registry.devices(selector)?;
    let backends: Vec<BackendJson> = registry
        .backends()
        .into_iter()
        .map(|b| match b.availability {
            Availability::Available(list) => BackendJson {
                name: b.name,
                available: true,
                devices: list.len(),
                reason: None,
            },
            Availability::Unavailable(reason) => BackendJson {
                name: b.name,
                available: false,
                devices: 0,
                reason: Some(reason),
            },
        })
        .collect();
    if json {
        let listing = Listing {
            devices: devices.iter().map(device_json).collect(),
            backends,
        };
        let text =
            serde_json::to_string_pretty(&listing).map_err(|e| xpu::Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    print_table(&devices);
    println!();
    println!("backends:");
    for b in &backends {
        match &b.reason {
            None => println!("  {:<16} available, {} device(s)", b.name, b.devices),
            Some(reason) => println!("  {:<16} unavailable: {reason}", b.name),
        }
    }
    Ok(())
}

fn print_table(devices: &[Device]) {
    let rows: Vec<[String; 8]> = devices
        .iter()
        .map(|d| {
            let caps = d.capabilities();
            [
                d.id().to_string(),
                d.kind().name().to_string(),
                d.name().to_string(),
                format_bytes(d.info().memory_bytes),
                caps.dtypes
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(","),
                caps.kernel_formats
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(","),
                caps.virtual_memory_granularity
                    .map_or_else(|| "-".to_string(), format_bytes),
                format!("{}/{}", caps.ops.len(), xpu::ops::OpKind::ALL.len()),
            ]
        })
        .collect();
    let header = [
        "DEVICE", "KIND", "NAME", "MEMORY", "DTYPES", "KERNELS", "GROWABLE", "OPS",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    if rows.is_empty() {
        println!("(no devices selected)");
    }
}
