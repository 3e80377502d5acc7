//! `xpu compare`: per-operation precision of devices against a reference device, or of
//! one tensor dump against another ([`xpu_conformance::precision`]).

use std::path::PathBuf;

use xpu::ops::OpKind;
use xpu::{Device, Error, Result};
use xpu_conformance::precision::{compare_devices, compare_dumps, Metrics, TensorDump};

/// What `xpu compare` was asked for.
pub struct Options {
    /// The operations (empty: all the devices share).
    pub ops: Vec<OpKind>,
    /// Two dumps to compare instead of devices (reference first).
    pub dumps: Vec<PathBuf>,
    /// JSON instead of a table.
    pub json: bool,
}

/// Parses `matmul,softmax` into operations.
pub fn parse_ops(text: &str) -> Result<Vec<OpKind>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

fn header() {
    println!(
        "{:<24} {:<6} {:<10} {:>11} {:>11} {:>10} {:>9} {:>9}  within",
        "op", "dtype", "device", "max_abs", "max_rel", "cosine", ">1e-3", ">5e-3"
    );
}

fn line(op: &str, dtype: &str, device: &str, m: &Metrics) {
    println!(
        "{:<24} {:<6} {:<10} {:>11.3e} {:>11.3e} {:>10.7} {:>9.5} {:>9.5}  {}",
        op,
        dtype,
        device,
        m.max_abs_err,
        m.max_rel_err,
        m.cosine,
        m.frac_rel_err_gt_1e_3,
        m.frac_rel_err_gt_5e_3,
        if m.within_tolerance { "yes" } else { "NO" }
    );
}

/// Compares every device of `devices` other than `reference` with it; `Ok(false)` when
/// any result is out of tolerance.
pub fn run(reference: &Device, devices: &[Device], options: &Options) -> Result<bool> {
    let others: Vec<&Device> = devices.iter().filter(|d| *d != reference).collect();
    if others.is_empty() {
        return Err(Error::invalid(format!(
            "--devices selects no device besides the reference {}; select the devices to compare with it",
            reference.id()
        )));
    }
    let mut rows = Vec::new();
    let mut nothing_shared = Vec::new();
    for device in others {
        let found = compare_devices(reference, device, &options.ops)?;
        if found.is_empty() {
            nothing_shared.push(device.id().to_string());
        }
        rows.extend(found);
    }
    let ok = rows.iter().all(|r| r.metrics.within_tolerance);
    if options.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "reference": reference.id().to_string(),
            "results": rows,
            "no_shared_operations": nothing_shared,
            "within_tolerance": ok,
        }))
        .map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(ok);
    }
    println!("reference: {}", reference.id());
    header();
    for r in &rows {
        line(r.op, r.dtype, &r.device, &r.metrics);
    }
    for d in &nothing_shared {
        println!(
            "{d}: shares no standard operation with {} (skipped)",
            reference.id()
        );
    }
    println!();
    println!(
        "{} of {} results within tolerance (relative to |want| + max|want|: f64 1e-9, f32 1e-4, f16 2e-3, bf16 1.6e-2)",
        rows.iter().filter(|r| r.metrics.within_tolerance).count(),
        rows.len()
    );
    Ok(ok)
}

/// Compares the two dumps of `options.dumps`; `Ok(false)` when they differ beyond
/// tolerance or in their tensors.
pub fn run_dumps(options: &Options) -> Result<bool> {
    let [reference, other] = options.dumps.as_slice() else {
        return Err(Error::invalid(
            "--dumps takes two files: the reference dump, then the dump to compare with it",
        ));
    };
    let cmp = compare_dumps(&TensorDump::read(reference)?, &TensorDump::read(other)?);
    let ok = cmp.ok();
    if options.json {
        let text = serde_json::to_string_pretty(&cmp).map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(ok);
    }
    header();
    for t in &cmp.tensors {
        match (&t.metrics, &t.mismatch) {
            (Some(m), _) => line(&t.name, &t.dtype, "dump", m),
            (None, why) => println!(
                "{:<24} {:<6} not comparable: {}",
                t.name,
                t.dtype,
                why.as_deref().unwrap_or("?")
            ),
        }
    }
    for n in &cmp.only_in_reference {
        println!("{n}: only in {}", reference.display());
    }
    for n in &cmp.only_in_other {
        println!("{n}: only in {}", other.display());
    }
    Ok(ok)
}
