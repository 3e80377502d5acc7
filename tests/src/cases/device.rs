//! Device properties: what a device says about itself must be usable.

use std::collections::HashSet;

use crate::case::{Case, CaseContext, CaseOutcome};
use crate::cases::util::ensure;

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "device.properties",
        "name, memory size, dtypes, kernel formats, allocation and stream limits are present and consistent",
        properties,
    ),
    Case::core(
        "device.memory_info",
        "memory_info reports a non-zero total and no more free than total",
        memory_info,
    ),
    Case::core(
        "device.memory_total",
        "memory_info's total equals the device's memory_bytes",
        memory_total,
    ),
    Case::core(
        "device.streams",
        "several streams can be created; an idle stream synchronizes and queries as done",
        streams,
    ),
];

fn properties(ctx: &CaseContext) -> CaseOutcome {
    let d = &ctx.device;
    let info = d.info();
    let caps = d.capabilities();
    ensure(!info.name.trim().is_empty(), || {
        "the device name is empty; report a human-readable name".to_string()
    })?;
    ensure(info.memory_bytes > 0, || {
        "memory_bytes is 0; report the memory the device can allocate".to_string()
    })?;
    ensure(!caps.dtypes.is_empty(), || {
        "capabilities list no dtypes; every device must support builtin operations on at least one"
            .to_string()
    })?;
    let unique: HashSet<_> = caps.dtypes.iter().collect();
    ensure(unique.len() == caps.dtypes.len(), || {
        format!("capabilities list a dtype twice: {:?}", caps.dtypes)
    })?;
    let formats: HashSet<_> = caps.kernel_formats.iter().collect();
    ensure(formats.len() == caps.kernel_formats.len(), || {
        format!(
            "capabilities list a kernel format twice: {:?}",
            caps.kernel_formats
        )
    })?;
    ensure(caps.max_allocation > 0, || {
        "max_allocation is 0; report the largest single allocation".to_string()
    })?;
    ensure(caps.max_allocation <= info.memory_bytes, || {
        format!(
            "max_allocation ({}) exceeds memory_bytes ({}); a single allocation cannot be larger than the device",
            caps.max_allocation, info.memory_bytes
        )
    })?;
    ensure(caps.max_streams >= 1, || {
        "max_streams is 0; every device must support at least one stream".to_string()
    })?;
    ensure(
        d.id().backend == d.backend() && !d.backend().is_empty(),
        || format!("the device id {} does not name its backend", d.id()),
    )?;
    Ok(())
}

fn memory_info(ctx: &CaseContext) -> CaseOutcome {
    let m = ctx.device.memory_info()?;
    ensure(m.total > 0, || {
        "memory_info reports a total of 0 bytes".to_string()
    })?;
    ensure(m.free <= m.total, || {
        format!(
            "memory_info reports {} bytes free of a total of {}; free cannot exceed total",
            m.free, m.total
        )
    })
}

fn memory_total(ctx: &CaseContext) -> CaseOutcome {
    let m = ctx.device.memory_info()?;
    let bytes = ctx.device.info().memory_bytes;
    ensure(m.total == bytes, || {
        format!(
            "memory_info reports a total of {} bytes but the device info says memory_bytes = {bytes}; both describe the memory the device can hold",
            m.total
        )
    })
}

fn streams(ctx: &CaseContext) -> CaseOutcome {
    let n = ctx.device.capabilities().max_streams.min(4);
    let mut streams = Vec::new();
    for _ in 0..n {
        streams.push(ctx.device.create_stream()?);
    }
    for (i, s) in streams.iter().enumerate() {
        ensure(s.device() == &ctx.device, || {
            format!("stream {i} reports another device than the one that created it")
        })?;
        s.synchronize()?;
        ensure(s.query()?, || {
            format!("stream {i} has no work, yet query says work is pending")
        })?;
    }
    Ok(())
}
