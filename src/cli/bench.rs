//! `xpu bench hal`, `xpu bench vulkan` and `xpu bench cuda`: the HAL's overheads and the
//! Vulkan and CUDA backends' costs, each figure beside its reference measured in the same
//! run (interleaved rounds, medians), because shared machines are noisy.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use xpu::backend::BuiltinOp;
use xpu::host::{HostBackend, HostConfig};
use xpu::vulkan::builtins::abi::ShaderKind;
use xpu::{
    Allocation, BinaryOp, DType, Device, DeviceId, Error, HostBuffer, KernelDesc, KernelSource,
    LaunchDims, Result, Scalar, Stream,
};
use xpu_benches::cuda_raw::{EMPTY_ENTRY, EMPTY_PTX};
use xpu_benches::vulkan_raw::{Behind, Memory, RawBuffer, RawVulkan};

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
pub(crate) fn interleaved(
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

pub(crate) fn median(v: &mut [f64]) -> f64 {
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

/// The HAL's own cost per operation: the same fill on the same stream and memory, once
/// through [`Stream`] (validation, lookup of the memory, dispatch) and once handed to
/// the host backend's stream directly ([`Stream::implementation`]). Both paths share one
/// queue and one worker thread, so they meet the worker in the same state (spinning or
/// asleep) and the ratio is the HAL's alone.
fn dispatch(figures: &mut Vec<Figure>, rounds: usize) -> Result<()> {
    let (device, _) = devices()?;
    let stream = device.create_stream()?;
    let buf = device.allocate(64)?;
    let direct = stream.implementation();
    let slice = buf
        .whole()
        .resolve(&device)?
        .ok_or_else(|| Error::invalid("a 64-byte allocation resolved to no memory"))?;
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
    print(
        &figures,
        json,
        &[
            "ratio: xpu time / reference time for latencies (1.0 = no overhead);",
            "       xpu bandwidth / reference bandwidth for copies (1.0 = as fast as memcpy).",
        ],
    )
}

/// Prints `figures` as a table followed by `notes`, or as JSON.
fn print(figures: &[Figure], json: bool, notes: &[&str]) -> Result<()> {
    if json {
        let text = serde_json::to_string_pretty(figures).map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    let width = figures
        .iter()
        .map(|f| f.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(40);
    println!(
        "{:<width$} {:>12} {:>12}  {:<7} {:<30}",
        "figure", "xpu", "reference", "ratio", "reference is"
    );
    for f in figures {
        println!(
            "{:<width$} {:>7.3} {:<4} {:>7.3} {:<4}  {:<7.3} {}",
            f.name, f.xpu, f.unit, f.reference, f.unit, f.ratio, f.reference_name
        );
    }
    println!();
    for line in notes {
        println!("{line}");
    }
    Ok(())
}

/// Iterations per round so that a round of the slower of `a` and `b` takes about
/// `target` seconds (at least one), from one timed call of each after a first call.
fn calibrate(
    target: f64,
    a: &mut impl FnMut() -> Result<()>,
    b: &mut impl FnMut() -> Result<()>,
) -> Result<usize> {
    let mut slowest = 0f64;
    for f in [a as &mut dyn FnMut() -> Result<()>, b] {
        f()?;
        let t = Instant::now();
        f()?;
        slowest = slowest.max(t.elapsed().as_secs_f64());
    }
    Ok(((target / slowest.max(1e-9)) as usize).clamp(1, 100_000))
}

/// Seconds one round of one path takes in `xpu bench vulkan`.
const VULKAN_ROUND_S: f64 = 0.1;

/// The median seconds per call of `a` (xpu) and `b` (reference), interleaved, with
/// iterations per round calibrated to [`VULKAN_ROUND_S`].
fn compare(
    rounds: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let iters = calibrate(VULKAN_ROUND_S, &mut a, &mut b)?;
    interleaved(rounds, iters, a, b)
}

fn vulkan_copies(
    figures: &mut Vec<Figure>,
    rounds: usize,
    device: &Device,
    raw: &RawVulkan,
) -> Result<()> {
    let stream = device.create_stream()?;
    let fill = raw.builtin_pipeline(ShaderKind::Fill(DType::F32))?;
    for size in [1usize << 20, 64 << 20] {
        let bytes = size as u64;
        let host = prefaulted(size);
        let host_src = HostBuffer::from_bytes(&host)?;
        let host_dst = HostBuffer::from_bytes(&host)?;
        let a = device.allocate(bytes)?;
        let b = device.allocate(bytes)?;
        stream.fill(&a, Scalar::F32(1.0))?;
        stream.fill(&b, Scalar::F32(2.0))?;
        stream.synchronize()?;
        let ra = raw.buffer(bytes, Memory::Device)?;
        let mut rb = raw.buffer(bytes, Memory::Device)?;
        let staging = raw.buffer(bytes, Memory::Staging)?;
        raw.fill(&ra, 1)?;
        raw.fill(&rb, 2)?;
        raw.fill(&staging, 3)?;
        let mut out = prefaulted(size);
        // A small fill queued before a copy, so that the copy is not on an idle stream.
        let tiny = device.allocate(64)?;
        let raw_tiny = raw.buffer(64, Memory::Device)?;
        let behind = Behind {
            fill: &fill,
            buffer: &raw_tiny,
        };
        // Unified memory: the raw buffers are mapped, and a memcpy between them is the
        // floor of the backend's idle-stream copies.
        let mapped = ra.host_bytes().is_some() && rb.host_bytes().is_some();
        let unmapped = || Error::invalid("a raw buffer is not mapped");
        let mib = size >> 20;
        let mut add = |name: String, (x, r): (f64, f64), reference: &str| {
            let gbs = |t: f64| size as f64 / t / 1e9;
            figures.push(Figure {
                name,
                unit: "GB/s",
                xpu: gbs(x),
                reference: gbs(r),
                reference_name: reference.into(),
                ratio: r / x,
            });
        };
        let mut hal_d2d = || {
            stream.copy(&a, &b)?;
            stream.synchronize()
        };
        let name = format!("copy device→device {mib} MiB");
        let t = compare(rounds, &mut hal_d2d, || raw.copy(&ra, &rb, bytes))?;
        add(name.clone(), t, "ash: vkCmdCopyBuffer, submit, fence");
        if mapped {
            let t = compare(rounds, &mut hal_d2d, || {
                let src = ra.host_bytes().ok_or_else(unmapped)?;
                rb.host_bytes_mut()
                    .ok_or_else(unmapped)?
                    .copy_from_slice(src);
                Ok(())
            })?;
            add(name, t, "memcpy between mapped buffers");
        }
        let mut hal_h2d = || {
            stream.copy_from_host(&host_src, 0, &a)?;
            stream.synchronize()
        };
        let name = format!("copy host→device {mib} MiB");
        let t = compare(rounds, &mut hal_h2d, || {
            raw.upload(&host, &staging, &rb, None)
        })?;
        add(name.clone(), t, "ash: memcpy to staging + copy");
        if mapped {
            let t = compare(rounds, &mut hal_h2d, || {
                rb.host_bytes_mut()
                    .ok_or_else(unmapped)?
                    .copy_from_slice(&host);
                Ok(())
            })?;
            add(name, t, "memcpy into the mapped buffer");
        }
        let mut hal_d2h = || {
            stream.copy_to_host(&a, &host_dst, 0)?;
            stream.synchronize()
        };
        let name = format!("copy device→host {mib} MiB");
        let t = compare(rounds, &mut hal_d2h, || {
            raw.download(&ra, &staging, &mut out, None)
        })?;
        add(name.clone(), t, "ash: copy to staging + memcpy");
        if mapped {
            let t = compare(rounds, &mut hal_d2h, || {
                out.copy_from_slice(ra.host_bytes().ok_or_else(unmapped)?);
                Ok(())
            })?;
            add(name, t, "memcpy from the mapped buffer");
        }
        let t = compare(
            rounds,
            || {
                stream.fill(&tiny, Scalar::F32(0.0))?;
                stream.copy_from_host(&host_src, 0, &a)?;
                stream.synchronize()
            },
            || raw.upload(&host, &staging, &rb, Some(behind)),
        )?;
        add(
            format!("copy host→device {mib} MiB behind a fill"),
            t,
            "ash: fill shader + staged copy",
        );
        let t = compare(
            rounds,
            || {
                stream.fill(&tiny, Scalar::F32(0.0))?;
                stream.copy_to_host(&a, &host_dst, 0)?;
                stream.synchronize()
            },
            || raw.download(&ra, &staging, &mut out, Some(behind)),
        )?;
        add(
            format!("copy device→host {mib} MiB behind a fill"),
            t,
            "ash: fill shader + staged copy",
        );
        // The same copies through host buffers pinned for the device (imported as
        // buffers), against the unpinned ones above, where the device can import.
        let pinned_src = HostBuffer::from_bytes(&host)?;
        let pinned_dst = HostBuffer::from_bytes(&host)?;
        if device.pin_host(&pinned_src)? && device.pin_host(&pinned_dst)? {
            let t = compare(
                rounds,
                || {
                    stream.fill(&tiny, Scalar::F32(0.0))?;
                    stream.copy_from_host(&pinned_src, 0, &a)?;
                    stream.synchronize()
                },
                || {
                    stream.fill(&tiny, Scalar::F32(0.0))?;
                    stream.copy_from_host(&host_src, 0, &a)?;
                    stream.synchronize()
                },
            )?;
            add(
                format!("copy host→device {mib} MiB behind a fill, pinned"),
                t,
                "xpu: the same from an unpinned buffer",
            );
            let t = compare(
                rounds,
                || {
                    stream.fill(&tiny, Scalar::F32(0.0))?;
                    stream.copy_to_host(&a, &pinned_dst, 0)?;
                    stream.synchronize()
                },
                || {
                    stream.fill(&tiny, Scalar::F32(0.0))?;
                    stream.copy_to_host(&a, &host_dst, 0)?;
                    stream.synchronize()
                },
            )?;
            add(
                format!("copy device→host {mib} MiB behind a fill, pinned"),
                t,
                "xpu: the same into an unpinned buffer",
            );
        }
    }
    Ok(())
}

/// Three buffers of `n` f32 on each side, filled with 1, 2 and 0.
fn add_operands(
    device: &Device,
    stream: &Stream,
    raw: &RawVulkan,
    n: u64,
) -> Result<(Vec<Allocation>, Vec<RawBuffer>)> {
    let mut hal = Vec::new();
    let mut reference = Vec::new();
    for v in [1.0f32, 2.0, 0.0] {
        let buf = device.allocate(n * 4)?;
        stream.fill(&buf, Scalar::F32(v))?;
        hal.push(buf);
        let buf = raw.buffer(n * 4, Memory::Device)?;
        raw.fill(&buf, v.to_bits())?;
        reference.push(buf);
    }
    stream.synchronize()?;
    Ok((hal, reference))
}

fn vulkan_adds(
    figures: &mut Vec<Figure>,
    rounds: usize,
    device: &Device,
    raw: &RawVulkan,
) -> Result<()> {
    let stream = device.create_stream()?;
    let pipeline = raw.builtin_pipeline(ShaderKind::Binary(BinaryOp::Sum, DType::F32))?;
    for n in [1u64 << 20, 16 << 20] {
        let (hal, r) = add_operands(device, &stream, raw, n)?;
        let (x, t) = compare(
            rounds,
            || {
                stream.binary(BinaryOp::Sum, DType::F32, &hal[0], &hal[1], &hal[2])?;
                stream.synchronize()
            },
            || raw.builtin(&pipeline, &[&r[2], &r[0], &r[1]], n, 4, 0, 1),
        )?;
        figures.push(Figure {
            name: format!("add f32, {}M elements + sync", n >> 20),
            unit: "ms",
            xpu: x * 1e3,
            reference: t * 1e3,
            reference_name: "ash: same SPIR-V, 1 dispatch".into(),
            ratio: x / t,
        });
    }
    const TINY: u64 = 64;
    const LAUNCHES: usize = 1000;
    let (hal, r) = add_operands(device, &stream, raw, TINY)?;
    let (x, t) = compare(
        rounds,
        || {
            stream.binary(BinaryOp::Sum, DType::F32, &hal[0], &hal[1], &hal[2])?;
            stream.synchronize()
        },
        || raw.builtin(&pipeline, &[&r[2], &r[0], &r[1]], TINY, 4, 0, 1),
    )?;
    figures.push(Figure {
        name: format!("add {TINY} f32 + synchronize"),
        unit: "µs",
        xpu: x * 1e6,
        reference: t * 1e6,
        reference_name: "ash: 1 dispatch, submit, fence".into(),
        ratio: x / t,
    });
    let (x, t) = compare(
        rounds,
        || {
            for _ in 0..LAUNCHES {
                stream.binary(BinaryOp::Sum, DType::F32, &hal[0], &hal[1], &hal[2])?;
            }
            stream.synchronize()
        },
        || raw.builtin(&pipeline, &[&r[2], &r[0], &r[1]], TINY, 4, 0, LAUNCHES),
    )?;
    figures.push(Figure {
        name: format!("add {TINY} f32, per op, {LAUNCHES} then sync"),
        unit: "µs",
        xpu: x * 1e6 / LAUNCHES as f64,
        reference: t * 1e6 / LAUNCHES as f64,
        reference_name: format!("ash: {LAUNCHES} dispatches, 1 submit"),
        ratio: x / t,
    });
    Ok(())
}

/// Runs the Vulkan benchmarks on `vulkan:0` and prints them (or JSON).
pub fn vulkan(json: bool, rounds: usize) -> Result<()> {
    if rounds == 0 {
        return Err(Error::invalid("--rounds must be at least 1"));
    }
    let (device, raw) = xpu_benches::vulkan_devices().map_err(|e| match e {
        Error::Unavailable { backend, reason } => Error::unavailable(
            backend,
            format!(
                "{reason}; `xpu bench vulkan` needs a Vulkan device (vulkan:0), e.g. \
                 Mesa's lavapipe (apt-get install mesa-vulkan-drivers libvulkan1)"
            ),
        ),
        other => other,
    })?;
    if !json {
        println!("vulkan:0 = {}", device.name());
        println!();
    }
    let mut figures = Vec::new();
    vulkan_copies(&mut figures, rounds, &device, &raw)?;
    vulkan_adds(&mut figures, rounds, &device, &raw)?;
    print(
        &figures,
        json,
        &[
            "reference: the same Vulkan commands issued directly with ash on the same physical",
            "           device (own instance, device, buffers of the same memory type).",
            "ratio: xpu time / reference time for latencies (1.0 = no overhead);",
            "       xpu bandwidth / reference bandwidth for copies (1.0 = as fast).",
        ],
    )
}

/// Iterations per round of each copy in `xpu bench cuda`: about 256 MiB moved per round
/// and side, between 1 and 64 copies. `benches/torch/cuda_copy_launch.py` uses the same
/// rule.
pub fn cuda_copy_iters(size: u64) -> usize {
    ((256u64 << 20) / size.max(1)).clamp(1, 64) as usize
}

/// Launches per round and side in `xpu bench cuda` (and in the PyTorch script).
pub const CUDA_LAUNCH_ITERS: usize = 200;

/// The mean and median of one side's per-round figures.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stats {
    /// From the mean of the rounds' figures (seconds per operation, tokens/s …).
    pub mean: f64,
    /// From the median round's figure.
    pub p50: f64,
}

/// One `xpu bench cuda` comparison: xpu beside raw cudarc, in the same run.
#[derive(Debug, Serialize)]
pub struct CudaFigure {
    /// What is measured.
    pub name: String,
    /// The unit of `xpu` and `raw` (`GB/s` or `µs`).
    pub unit: &'static str,
    /// The xpu path.
    pub xpu: Stats,
    /// The raw cudarc path.
    pub raw: Stats,
    /// What the raw path does.
    pub raw_is: &'static str,
    /// From the p50 figures: xpu/raw throughput for copies (1.0 as fast, lower is
    /// slower), xpu/raw time for launches (1.0 no overhead, higher is slower).
    pub ratio: f64,
    /// What `ratio` should be: at least this for copies, at most this for launches.
    pub target: f64,
    /// Whether `ratio` meets `target`.
    pub meets_target: bool,
}

/// What `xpu bench cuda --json` prints.
#[derive(Debug, Serialize)]
pub struct CudaReport {
    /// The device measured (`cuda:0`).
    pub device: String,
    /// Its name.
    pub name: String,
    /// Bytes per copy.
    pub size: u64,
    /// Interleaved rounds per figure.
    pub rounds: usize,
    /// Copies per round and side.
    pub copy_iters: usize,
    /// Launches per round and side.
    pub launch_iters: usize,
    /// `h2d`, `d2h` and `launch`.
    pub figures: std::collections::BTreeMap<&'static str, CudaFigure>,
}

/// Seconds per operation of `a` and of `b` in each of `rounds` rounds, run in turns
/// (a round of `a`, a round of `b`, …) after `warmup` calls of each.
fn rounds_of(
    rounds: usize,
    iters: usize,
    warmup: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    for _ in 0..warmup {
        a()?;
        b()?;
    }
    let mut ta = Vec::with_capacity(rounds);
    let mut tb = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for (f, times) in [
            (&mut a as &mut dyn FnMut() -> Result<()>, &mut ta),
            (&mut b, &mut tb),
        ] {
            let t = Instant::now();
            for _ in 0..iters {
                f()?;
            }
            times.push(t.elapsed().as_secs_f64() / iters as f64);
        }
    }
    Ok((ta, tb))
}

/// Mean and median of `seconds`, each mapped through `to_unit`.
pub(crate) fn stats(seconds: &mut [f64], to_unit: impl Fn(f64) -> f64) -> Stats {
    let mean = seconds.iter().sum::<f64>() / seconds.len().max(1) as f64;
    Stats {
        mean: to_unit(mean),
        p50: to_unit(median(seconds)),
    }
}

/// Whether one of `patterns` (backend names, a trailing `*` a prefix wildcard, as in
/// `XPU_REQUIRE`) names `backend`.
fn names_backend(patterns: &[String], backend: &str) -> bool {
    patterns.iter().any(|p| {
        p.strip_suffix('*')
            .map_or(p == backend, |prefix| backend.starts_with(prefix))
    })
}

/// Runs `xpu bench cuda` on `cuda:0`: pinned host→device and device→host copies of
/// `size` bytes and the launch + synchronize of an empty PTX kernel, each beside the
/// same driver calls made directly through cudarc ([`xpu_benches::cuda_raw`]), in
/// interleaved rounds; prints a table or one JSON object. Without a CUDA driver or
/// device it prints `skipped: <reason>` (with `--json`, `{"skipped": "<reason>"}`) and
/// succeeds, unless `XPU_REQUIRE` names `cuda`: then the reason is the error.
pub fn cuda(json: bool, rounds: usize, size: u64) -> Result<()> {
    if rounds == 0 {
        return Err(Error::invalid("--rounds must be at least 1"));
    }
    let len = usize::try_from(size)
        .ok()
        .filter(|n| *n >= xpu::HostMemory::PAGE)
        .ok_or_else(|| {
            Error::invalid(format!(
                "--size {size} must be at least {} bytes (Device::pin_host pins whole pages)",
                xpu::HostMemory::PAGE
            ))
        })?;
    let (device, raw) = match xpu_benches::cuda_devices() {
        Ok(pair) => pair,
        Err(Error::Unavailable { backend, reason }) => {
            if names_backend(&xpu_conformance::required_from_env(), xpu::cuda::NAME) {
                return Err(Error::unavailable(
                    backend,
                    format!("{reason} (XPU_REQUIRE lists cuda, so `xpu bench cuda` may not skip)"),
                ));
            }
            if json {
                let text = serde_json::to_string(&serde_json::json!({ "skipped": reason }))
                    .map_err(|e| Error::backend("xpu", e))?;
                println!("{text}");
            } else {
                println!("skipped: {reason}");
            }
            return Ok(());
        }
        Err(other) => return Err(other),
    };
    let copy_iters = cuda_copy_iters(size);
    let mut figures = std::collections::BTreeMap::new();
    let stream = device.create_stream()?;
    let mib = size as f64 / f64::from(1u32 << 20);
    let gbs = |t: f64| size as f64 / t / 1e9;
    {
        let content = prefaulted(len);
        let src = HostBuffer::from_bytes(&content)?;
        let dst = HostBuffer::from_bytes(&content)?;
        if !(device.pin_host(&src)? && device.pin_host(&dst)?) {
            return Err(Error::unsupported(
                "cuda:0 did not pin the host buffers (Device::pin_host returned false)",
            ));
        }
        let buf = device.allocate(size)?;
        let mut raw_src = raw.pinned(len)?;
        raw_src.bytes_mut().copy_from_slice(&content);
        let mut raw_dst = raw.pinned(len)?;
        let raw_buf = raw.device_memory(len)?;
        let mut copy = |key: &'static str,
                        name: String,
                        raw_is: &'static str,
                        (mut x, mut r): (Vec<f64>, Vec<f64>)| {
            let (xpu, raw) = (stats(&mut x, gbs), stats(&mut r, gbs));
            let ratio = xpu.p50 / raw.p50;
            figures.insert(
                key,
                CudaFigure {
                    name,
                    unit: "GB/s",
                    xpu,
                    raw,
                    raw_is,
                    ratio,
                    target: 0.9,
                    meets_target: ratio >= 0.9,
                },
            );
        };
        let samples = rounds_of(
            rounds,
            copy_iters,
            2,
            || {
                stream.copy_from_host(&src, 0, &buf)?;
                stream.synchronize()
            },
            || raw.upload(&raw_src, &raw_buf),
        )?;
        copy(
            "h2d",
            format!("copy host→device {mib:.0} MiB, pinned"),
            "cudarc: cuMemHostAlloc memory, cuMemcpyHtoDAsync + cuStreamSynchronize",
            samples,
        );
        let samples = rounds_of(
            rounds,
            copy_iters,
            2,
            || {
                stream.copy_to_host(&buf, &dst, 0)?;
                stream.synchronize()
            },
            || raw.download(&raw_buf, &mut raw_dst),
        )?;
        copy(
            "d2h",
            format!("copy device→host {mib:.0} MiB, pinned"),
            "cudarc: cuMemHostAlloc memory, cuMemcpyDtoHAsync + cuStreamSynchronize",
            samples,
        );
    }
    let kernel = device.load_kernel(KernelDesc {
        name: EMPTY_ENTRY.to_string(),
        entry_point: EMPTY_ENTRY.to_string(),
        source: KernelSource::Ptx(EMPTY_PTX.to_string()),
        params: Vec::new(),
    })?;
    let (mut x, mut r) = rounds_of(
        rounds,
        CUDA_LAUNCH_ITERS,
        50,
        || {
            stream.launch(&kernel, LaunchDims::linear(1, 1), &[])?;
            stream.synchronize()
        },
        || raw.launch_empty(),
    )?;
    let micros = |t: f64| t * 1e6;
    let (xpu_launch, raw_launch) = (stats(&mut x, micros), stats(&mut r, micros));
    let ratio = xpu_launch.p50 / raw_launch.p50;
    figures.insert(
        "launch",
        CudaFigure {
            name: "launch empty PTX kernel + synchronize".to_string(),
            unit: "µs",
            xpu: xpu_launch,
            raw: raw_launch,
            raw_is: "cudarc: cuModuleLoadData module, cuLaunchKernel + cuStreamSynchronize",
            ratio,
            target: 1.1,
            meets_target: ratio <= 1.1,
        },
    );
    let report = CudaReport {
        device: device.id().to_string(),
        name: device.name().to_string(),
        size,
        rounds,
        copy_iters,
        launch_iters: CUDA_LAUNCH_ITERS,
        figures,
    };
    if json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{} = {}; {} rounds, {} copies or {} launches per round and side, interleaved",
        report.device, report.name, rounds, copy_iters, CUDA_LAUNCH_ITERS
    );
    println!();
    println!(
        "{:<42} {:>10} {:>10} {:>10} {:>10}  {:<6} {:<7} reference is",
        "figure", "xpu p50", "xpu mean", "raw p50", "raw mean", "ratio", "target"
    );
    for key in ["h2d", "d2h", "launch"] {
        if let Some(f) = report.figures.get(key) {
            let target = if f.unit == "GB/s" {
                format!(">={}", f.target)
            } else {
                format!("<={}", f.target)
            };
            println!(
                "{:<42} {:>10.3} {:>10.3} {:>10.3} {:>10.3}  {:<6.3} {:<7} {}{}",
                format!("{} ({})", f.name, f.unit),
                f.xpu.p50,
                f.xpu.mean,
                f.raw.p50,
                f.raw.mean,
                f.ratio,
                target,
                f.raw_is,
                if f.meets_target {
                    ""
                } else {
                    "  [misses target]"
                }
            );
        }
    }
    println!();
    println!("ratio (from p50): xpu bandwidth / raw bandwidth for copies (1.0 = as fast);");
    println!("                  xpu time / raw time for launches (1.0 = no overhead).");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_copies_move_about_256_mib_per_round_and_side() {
        assert_eq!(cuda_copy_iters(64 << 20), 4);
        assert_eq!(cuda_copy_iters(1 << 30), 1);
        assert_eq!(cuda_copy_iters(4096), 64);
    }

    #[test]
    fn stats_are_the_mean_and_the_median_of_the_rounds() {
        let mut rounds = vec![3.0, 1.0, 2.0, 10.0, 4.0];
        let s = stats(&mut rounds, |t| t * 2.0);
        assert_eq!(s.mean, 8.0);
        assert_eq!(s.p50, 6.0);
    }

    #[test]
    fn required_backends_match_by_name_or_prefix() {
        let p = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(names_backend(&p(&["host", "cuda"]), "cuda"));
        assert!(names_backend(&p(&["cu*"]), "cuda"));
        assert!(names_backend(&p(&["*"]), "cuda"));
        assert!(!names_backend(&p(&["host", "cudax"]), "cuda"));
        assert!(!names_backend(&[], "cuda"));
    }
}
