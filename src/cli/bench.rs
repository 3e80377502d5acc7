//! `xpu bench hal`: the HAL's overheads, each figure beside its reference measured in
//! the same run (interleaved rounds, medians), because shared machines are noisy.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use xpu::backend::{BuiltinOp, StreamImpl};
use xpu::host::{HostBackend, HostConfig};
use xpu::{Device, DeviceId, Error, HostBuffer, RawAllocation, RawSlice, Result, Scalar};

/// One comparison: an xpu figure, its reference, and their ratio.
#[derive(Debug, Serialize)]
pub struct Figure {
    /// What is measured.
    pub name: String,
    /// The unit of `xpu` and `reference`.
    pub unit: &'static str,
    /// The xpu path.
    pub xpu: f64,
    /// The reference path.
    pub reference: f64,
    /// What the reference is.
    pub reference_name: String,
    /// For latencies, xpu time / reference time (1.0: no overhead, higher is slower);
    /// for bandwidths, xpu bandwidth / reference bandwidth (1.0: as fast, lower is
    /// slower).
    pub ratio: f64,
}

/// Median seconds per iteration of `a` and of `b`, measured in `rounds` interleaved
/// rounds of `iters` iterations each.
fn interleaved(
    rounds: usize,
    iters: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let mut ta = Vec::with_capacity(rounds);
    let mut tb = Vec::with_capacity(rounds);
    // Warm both paths up first.
    for _ in 0..iters.min(64) {
        a()?;
        b()?;
    }
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..iters {
            a()?;
        }
        ta.push(t.elapsed().as_secs_f64() / iters as f64);
        let t = Instant::now();
        for _ in 0..iters {
            b()?;
        }
        tb.push(t.elapsed().as_secs_f64() / iters as f64);
    }
    Ok((median(&mut ta), median(&mut tb)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn devices() -> Result<(Device, xpu::host::HostDevice)> {
    let backend = HostBackend::new(HostConfig {
        devices: 2,
        capacity: 1 << 30,
    });
    let hal = Device::from_impl(
        DeviceId::new("host", 0),
        Arc::new(backend.create_host_device(0)?),
    );
    Ok((hal, backend.create_host_device(1)?))
}

fn dispatch(figures: &mut Vec<Figure>, rounds: usize) -> Result<()> {
    let (device, host) = devices()?;
    let stream = device.create_stream()?;
    let buf = device.allocate(64)?;
    let direct = host.create_host_stream()?;
    let mem: Arc<dyn RawAllocation> = host.allocate_host(64)?;
    let slice = RawSlice {
        memory: mem,
        offset: 0,
        len: 64,
    };
    let fill_direct = || {
        direct.builtin(BuiltinOp::Fill {
            dst: slice.clone(),
            value: Scalar::F32(1.0),
        })
    };
    let (x, r) = interleaved(
        rounds,
        2000,
        || {
            stream.fill(&buf, Scalar::F32(1.0))?;
            stream.synchronize()
        },
        || {
            fill_direct()?;
            direct.synchronize()
        },
    )?;
    figures.push(Figure {
        name: "fill 64 B + synchronize".into(),
        unit: "µs",
        xpu: x * 1e6,
        reference: r * 1e6,
        reference_name: "host stream called directly".into(),
        ratio: x / r,
    });
    const BATCH: usize = 100;
    let (x, r) = interleaved(
        rounds,
        50,
        || {
            for _ in 0..BATCH {
                stream.fill(&buf, Scalar::F32(1.0))?;
            }
            stream.synchronize()
        },
        || {
            for _ in 0..BATCH {
                fill_direct()?;
            }
            direct.synchronize()
        },
    )?;
    figures.push(Figure {
        name: format!("fill 64 B, per op in batches of {BATCH}"),
        unit: "µs",
        xpu: x * 1e6 / BATCH as f64,
        reference: r * 1e6 / BATCH as f64,
        reference_name: "host stream called directly".into(),
        ratio: x / r,
    });
    Ok(())
}

fn prefaulted(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn copies(figures: &mut Vec<Figure>, rounds: usize) -> Result<()> {
    let (device, _) = devices()?;
    let stream = device.create_stream()?;
    for size in [1usize << 20, 16 << 20] {
        let iters = ((256usize << 20) / size).clamp(4, 256);
        let host_src = HostBuffer::from_bytes(&prefaulted(size))?;
        let host_dst = HostBuffer::from_bytes(&prefaulted(size))?;
        let a = device.allocate(size as u64)?;
        let b = device.allocate(size as u64)?;
        stream.copy_from_host(&host_src, 0, &a)?;
        stream.copy_from_host(&host_src, 0, &b)?;
        stream.synchronize()?;
        let src = prefaulted(size);
        let mut dst = prefaulted(size);
        let mut memcpy = || {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            Ok(())
        };
        let mib = size >> 20;
        let mut add = |name: String, x: f64, r: f64| {
            let gbs = |t: f64| size as f64 / t / 1e9;
            figures.push(Figure {
                name,
                unit: "GB/s",
                xpu: gbs(x),
                reference: gbs(r),
                reference_name: "memcpy of the same size".into(),
                ratio: r / x,
            });
        };
        let (x, r) = interleaved(
            rounds,
            iters,
            || {
                stream.copy_from_host(&host_src, 0, &a)?;
                stream.synchronize()
            },
            &mut memcpy,
        )?;
        add(format!("copy host→device {mib} MiB"), x, r);
        let (x, r) = interleaved(
            rounds,
            iters,
            || {
                stream.copy_to_host(&a, &host_dst, 0)?;
                stream.synchronize()
            },
            &mut memcpy,
        )?;
        add(format!("copy device→host {mib} MiB"), x, r);
        let (x, r) = interleaved(
            rounds,
            iters,
            || {
                stream.copy(&a, &b)?;
                stream.synchronize()
            },
            &mut memcpy,
        )?;
        add(format!("copy device→device {mib} MiB"), x, r);
    }
    Ok(())
}

/// Runs the HAL benchmarks and prints them (or JSON).
pub fn hal(json: bool, rounds: usize) -> Result<()> {
    if rounds == 0 {
        return Err(Error::invalid("--rounds must be at least 1"));
    }
    let mut figures = Vec::new();
    dispatch(&mut figures, rounds)?;
    copies(&mut figures, rounds)?;
    if json {
        let text = serde_json::to_string_pretty(&figures).map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{:<40} {:>12} {:>12}  {:<7} {:<30}",
        "figure", "xpu", "reference", "ratio", "reference is"
    );
    for f in &figures {
        println!(
            "{:<40} {:>7.3} {:<4} {:>7.3} {:<4}  {:<7.3} {}",
            f.name, f.xpu, f.unit, f.reference, f.unit, f.ratio, f.reference_name
        );
    }
    println!();
    println!("ratio: xpu time / reference time for latencies (1.0 = no overhead);");
    println!("       xpu bandwidth / reference bandwidth for copies (1.0 = as fast as memcpy).");
    Ok(())
}
