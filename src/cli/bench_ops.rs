//! `xpu bench ops`: one standard operation ([`xpu::ops`]) on each selected device,
//! timed in interleaved rounds beside a reference measured in the same run: OpenBLAS's
//! `cblas_sgemm`/`cblas_dgemm` with the device's threads for matmul on host devices, the
//! backend's own matmul shader dispatched through raw ash on `vulkan:0`
//! ([`xpu::vulkan::ops_abi`]), otherwise `memcpy` of the bytes the operation reads and
//! writes (the bandwidth bound of a memory-bound operation) on the host.

use std::time::Instant;

use serde::Serialize;
use xpu::ops::{Distribution, Layout, Op, OpKind, ReduceOp, Tensor};
use xpu::reference::ops::from_f64;
use xpu::{Allocation, DType, Device, Error, Result};
use xpu_benches::openblas::{Gemm, OpenBlas};
use xpu_benches::vulkan_raw::{RawOp, RawVulkan};

/// What `xpu bench ops` was asked for.
pub struct Options {
    /// The operation.
    pub op: OpKind,
    /// Its shape: `MxNxK` for matmul, `RxN` for row operations, `N` (or any dims) for
    /// elementwise ones, `VxDxN` for gather and scatter-add.
    pub shape: Vec<u64>,
    /// The dtype of its main operand.
    pub dtype: DType,
    /// Interleaved rounds (the median is reported).
    pub rounds: usize,
    /// JSON instead of a table.
    pub json: bool,
}

/// Parses `1024x1024x1024` (also `×` or `*` between numbers).
pub fn parse_shape(text: &str) -> Result<Vec<u64>> {
    let dims: std::result::Result<Vec<u64>, _> = text
        .split(['x', 'X', '×', '*'])
        .map(|p| p.trim().parse::<u64>())
        .collect();
    match dims {
        Ok(d) if !d.is_empty() && d.len() <= 4 && d.iter().all(|&v| v > 0) => Ok(d),
        _ => Err(Error::invalid(format!(
            "--shape `{text}` is not 1 to 4 positive whole numbers separated by x (e.g. 1024x1024x1024)"
        ))),
    }
}

/// Parses a dtype as the command line names it: `float`, `half`, `bfloat16`, `double`
/// or the HAL's names (`f32`, `f16`, `bf16`, `f64`).
pub fn parse_dtype(text: &str) -> Result<DType> {
    match text.to_ascii_lowercase().as_str() {
        "float" | "float32" => Ok(DType::F32),
        "half" | "float16" => Ok(DType::F16),
        "bfloat16" => Ok(DType::BF16),
        "double" | "float64" => Ok(DType::F64),
        other => other.parse(),
    }
}

/// One device's figure.
#[derive(Debug, Serialize)]
struct Row {
    op: &'static str,
    dtype: &'static str,
    shape: String,
    device: String,
    threads: Option<usize>,
    seconds: f64,
    /// GFLOP/s for matmul, GB/s otherwise.
    rate: f64,
    unit: &'static str,
    reference: String,
    reference_seconds: Option<f64>,
    reference_rate: Option<f64>,
    /// xpu rate / reference rate (1.0: as fast; higher is faster).
    ratio: Option<f64>,
}

/// Runs the benchmark on every device in `devices`.
pub fn run(devices: &[Device], options: &Options) -> Result<()> {
    if options.rounds == 0 {
        return Err(Error::invalid("--rounds must be at least 1"));
    }
    let plan = plan(options.op, &options.shape, options.dtype)?;
    let mut rows = Vec::new();
    for device in devices {
        rows.push(measure(device, &plan, options)?);
    }
    if options.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| Error::backend("xpu", e))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{:<10} {:<12} {:<6} {:<18} {:>10} {:>12}  {:>12}  {:>6}  reference is",
        "device", "op", "dtype", "shape", "ms", "rate", "reference", "ratio"
    );
    for r in &rows {
        println!(
            "{:<10} {:<12} {:<6} {:<18} {:>10.3} {:>7.2} {:<5} {:>7} {:<5} {:>6}  {}",
            r.device,
            r.op,
            r.dtype,
            r.shape,
            r.seconds * 1e3,
            r.rate,
            r.unit,
            r.reference_rate
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
            r.unit,
            r.ratio
                .map_or_else(|| "-".to_string(), |v| format!("{v:.3}")),
            r.reference
        );
    }
    println!();
    println!("ratio: xpu rate / reference rate, measured in interleaved rounds (medians); 1.0 = as fast.");
    Ok(())
}

/// The operation with layouts, the values of each operand, and its work.
struct Plan {
    op: Op<(Layout, Vec<f64>)>,
    /// Floating-point operations (matmul) or bytes read and written (others).
    work: f64,
    gemm: Option<Gemm>,
}

fn plan(kind: OpKind, shape: &[u64], dt: DType) -> Result<Plan> {
    let c = |dims: &[u64]| Layout::contiguous(dt, dims);
    let want = |n: usize, form: &str| -> Result<()> {
        if shape.len() == n {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{kind} takes --shape {form}, not {} numbers",
                shape.len()
            )))
        }
    };
    let mut seed = 1u64;
    let mut values = |l: &Layout, lo: f64, hi: f64| -> Vec<f64> {
        (0..l.elements())
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                lo + (hi - lo) * ((seed >> 40) as f64 / (1u64 << 24) as f64)
            })
            .collect()
    };
    let mut with = |l: Layout| {
        let v = values(&l, -1.0, 1.0);
        (l, v)
    };
    let op = match kind {
        OpKind::Matmul => {
            want(3, "MxNxK")?;
            let (m, n, k) = (shape[0], shape[1], shape[2]);
            let op = Op::Matmul {
                a: with(c(&[m, k])?),
                b: with(c(&[k, n])?),
                c: with(c(&[m, n])?),
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta: 0.0,
            };
            let gemm = Gemm {
                m: m as usize,
                n: n as usize,
                k: k as usize,
                trans_a: false,
                trans_b: false,
            };
            return Ok(Plan {
                op,
                work: 2.0 * (m * n * k) as f64,
                gemm: Some(gemm),
            });
        }
        OpKind::BiasAdd => {
            want(2, "RxN")?;
            Op::BiasAdd {
                x: with(c(shape)?),
                bias: with(c(&shape[1..])?),
                y: with(c(shape)?),
            }
        }
        OpKind::Relu => Op::Relu {
            x: with(c(shape)?),
            y: with(c(shape)?),
        },
        OpKind::Gelu => Op::Gelu {
            x: with(c(shape)?),
            y: with(c(shape)?),
        },
        OpKind::ReluBackward => Op::ReluBackward {
            x: with(c(shape)?),
            dy: with(c(shape)?),
            dx: with(c(shape)?),
        },
        OpKind::GeluBackward => Op::GeluBackward {
            x: with(c(shape)?),
            dy: with(c(shape)?),
            dx: with(c(shape)?),
        },
        OpKind::Softmax => {
            want(2, "RxN")?;
            Op::Softmax {
                x: with(c(shape)?),
                y: with(c(shape)?),
            }
        }
        OpKind::SoftmaxBackward => {
            want(2, "RxN")?;
            Op::SoftmaxBackward {
                y: with(c(shape)?),
                dy: with(c(shape)?),
                dx: with(c(shape)?),
            }
        }
        OpKind::CrossEntropy | OpKind::CrossEntropyBackward => {
            want(2, "RxN")?;
            let labels = Layout::contiguous(DType::I32, &shape[..1])?;
            let lv: Vec<f64> = (0..shape[0]).map(|r| (r % shape[1]) as f64).collect();
            if kind == OpKind::CrossEntropy {
                Op::CrossEntropy {
                    logits: with(c(shape)?),
                    labels: (labels, lv),
                    loss: with(c(&shape[..1])?),
                }
            } else {
                Op::CrossEntropyBackward {
                    logits: with(c(shape)?),
                    labels: (labels, lv),
                    dloss: with(c(&shape[..1])?),
                    dlogits: with(c(shape)?),
                }
            }
        }
        OpKind::LayerNorm | OpKind::LayerNormBackward => {
            want(2, "RxN")?;
            let stats = if dt == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
            let s = Layout::contiguous(stats, &shape[..1])?;
            let rstd = (s, vec![1.0; shape[0] as usize]);
            if kind == OpKind::LayerNorm {
                Op::LayerNorm {
                    x: with(c(shape)?),
                    gamma: with(c(&shape[1..])?),
                    beta: with(c(&shape[1..])?),
                    y: with(c(shape)?),
                    mean: with(s),
                    rstd,
                    eps: 1e-5,
                }
            } else {
                Op::LayerNormBackward {
                    x: with(c(shape)?),
                    gamma: with(c(&shape[1..])?),
                    mean: with(s),
                    rstd,
                    dy: with(c(shape)?),
                    dx: with(c(shape)?),
                    dgamma: with(c(&shape[1..])?),
                    dbeta: with(c(&shape[1..])?),
                }
            }
        }
        OpKind::Gather | OpKind::ScatterAdd => {
            want(3, "VxDxN (table rows, row length, indices)")?;
            let (v, d, n) = (shape[0], shape[1], shape[2]);
            let idx = Layout::contiguous(DType::I32, &[n])?;
            let iv: Vec<f64> = (0..n).map(|i| ((i * 7919) % v) as f64).collect();
            if kind == OpKind::Gather {
                Op::Gather {
                    table: with(c(&[v, d])?),
                    indices: (idx, iv),
                    out: with(c(&[n, d])?),
                }
            } else {
                Op::ScatterAdd {
                    src: with(c(&[n, d])?),
                    indices: (idx, iv),
                    table: with(c(&[v, d])?),
                }
            }
        }
        OpKind::Reduce => Op::Reduce {
            x: with(c(shape)?),
            y: with(c(&[&shape[..shape.len() - 1], &[1]].concat())?),
            op: ReduceOp::Sum,
            axis: (shape.len() - 1) as u32,
        },
        OpKind::SgdMomentum => Op::SgdMomentum {
            param: with(c(shape)?),
            grad: with(c(shape)?),
            velocity: with(c(shape)?),
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
        },
        OpKind::AdamW => {
            let l = c(shape)?;
            let (l1, v) = with(l);
            let v = v.iter().map(|x| x.abs()).collect();
            Op::AdamW {
                param: with(l),
                grad: with(l),
                m: with(l),
                v: (l1, v),
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                step: 10,
            }
        }
        OpKind::Random => Op::Random {
            y: with(c(shape)?),
            dist: Distribution::Uniform {
                low: -1.0,
                high: 1.0,
            },
            seed: 1,
            offset: 0,
        },
        OpKind::Dropout => Op::Dropout {
            x: with(c(shape)?),
            y: with(c(shape)?),
            p: 0.1,
            seed: 1,
            offset: 0,
        },
    };
    let bytes: u64 = op
        .operands()
        .iter()
        .map(|o| {
            o.tensor.0.span_bytes()
                * if o.access == xpu::ops::Access::ReadWrite {
                    2
                } else {
                    1
                }
        })
        .sum();
    Ok(Plan {
        op,
        work: bytes as f64,
        gemm: None,
    })
}

/// Median seconds per call of `a`, and of `b` when there is one, over `rounds`
/// interleaved rounds of `iters` calls ([`crate::cli::bench::interleaved`]).
fn interleaved(
    rounds: usize,
    iters: usize,
    a: impl FnMut() -> Result<()>,
    b: Option<&mut dyn FnMut() -> Result<()>>,
) -> Result<(f64, Option<f64>)> {
    match b {
        Some(b) => {
            let (x, r) = crate::cli::bench::interleaved(rounds, iters, a, b)?;
            Ok((x, Some(r)))
        }
        None => {
            let (x, _) = crate::cli::bench::interleaved(rounds, iters, a, || Ok(()))?;
            Ok((x, None))
        }
    }
}

/// The device's threads for operations, from its `threads=N` fact (host devices).
fn device_threads(device: &Device) -> Option<usize> {
    device
        .info()
        .extra
        .iter()
        .find_map(|e| e.strip_prefix("threads="))
        .and_then(|v| v.parse().ok())
}

fn measure(device: &Device, plan: &Plan, options: &Options) -> Result<Row> {
    let kind = plan.op.kind();
    let stream = device.create_stream()?;
    let allocations: Vec<Allocation> = plan
        .op
        .operands()
        .iter()
        .map(|o| {
            let (layout, values) = o.tensor;
            let a = device.allocate(layout.span_bytes())?;
            stream.write(&a, &from_f64(values, layout.dtype))?;
            Ok(a)
        })
        .collect::<Result<_>>()?;
    let mut next = 0;
    let op = plan.op.by_ref().try_map(|_, _, (layout, _)| {
        next += 1;
        Ok::<_, Error>(Tensor::with_layout(&allocations[next - 1], *layout))
    })?;
    let mut run_xpu = || {
        stream.run_op(&op)?;
        stream.synchronize()
    };
    // Calibrate: about 0.2 s per round of the xpu path.
    run_xpu()?;
    let t = Instant::now();
    run_xpu()?;
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let iters = ((0.2 / once) as usize).clamp(1, 10_000);
    let threads = device_threads(device);
    let host = device.backend() == "host";
    let mut reference_name = "none".to_string();
    let (seconds, reference_seconds) = match (&plan.gemm, host) {
        (Some(gemm), true) if matches!(options.dtype, DType::F32 | DType::F64) => {
            match OpenBlas::load() {
                Ok(blas) => {
                    let used = blas.set_threads(threads.unwrap_or(1));
                    reference_name = format!(
                        "OpenBLAS cblas_{}gemm, {used} thread(s)",
                        if options.dtype == DType::F32 {
                            "s"
                        } else {
                            "d"
                        }
                    );
                    let g = *gemm;
                    let (a, b, c) = (
                        &plan.op.operands()[0].tensor.1,
                        &plan.op.operands()[1].tensor.1,
                        &plan.op.operands()[2].tensor.1,
                    );
                    if options.dtype == DType::F32 {
                        let (a, b) = (to_f32(a), to_f32(b));
                        let mut c = to_f32(c);
                        let mut r = || blas.sgemm(g, 1.0, &a, &b, 0.0, &mut c);
                        interleaved(options.rounds, iters, &mut run_xpu, Some(&mut r))?
                    } else {
                        let mut c = c.clone();
                        let mut r = || blas.dgemm(g, 1.0, a, b, 0.0, &mut c);
                        interleaved(options.rounds, iters, &mut run_xpu, Some(&mut r))?
                    }
                }
                Err(e) => {
                    reference_name = format!("unavailable: {e}");
                    interleaved(options.rounds, iters, &mut run_xpu, None)?
                }
            }
        }
        (Some(_), false) if device.backend() == xpu::vulkan::NAME => {
            match raw_vulkan(device, &plan.op) {
                Ok((raw, op)) => {
                    reference_name = "the same SPIR-V through raw ash".into();
                    let mut r = || raw.run_op(&op);
                    interleaved(options.rounds, iters, &mut run_xpu, Some(&mut r))?
                }
                Err(e) => {
                    reference_name = format!("unavailable: {e}");
                    interleaved(options.rounds, iters, &mut run_xpu, None)?
                }
            }
        }
        (Some(_), _) => interleaved(options.rounds, iters, &mut run_xpu, None)?,
        (None, _) => {
            let bytes = plan.work as usize / 2;
            let src = vec![1u8; bytes];
            let mut dst = vec![0u8; bytes];
            reference_name = "memcpy on the host of the bytes it reads and writes".into();
            let mut r = || {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
                Ok(())
            };
            interleaved(options.rounds, iters, &mut run_xpu, Some(&mut r))?
        }
    };
    let (unit, scale) = if plan.gemm.is_some() {
        ("GF/s", 1e-9)
    } else {
        ("GB/s", 1e-9)
    };
    let rate = plan.work / seconds * scale;
    let reference_rate = reference_seconds.map(|s| plan.work / s * scale);
    Ok(Row {
        op: kind.name(),
        dtype: options.dtype.name(),
        shape: options
            .shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x"),
        device: device.id().to_string(),
        threads,
        seconds,
        rate,
        unit,
        reference: reference_name,
        reference_seconds,
        reference_rate,
        ratio: reference_rate.map(|r| rate / r),
    })
}

/// The raw-ash reference of a matmul on `vulkan:0`: the backend's own shader
/// ([`xpu::vulkan::ops_abi::matmul`]) on buffers of its own holding the same values.
fn raw_vulkan(device: &Device, op: &Op<(Layout, Vec<f64>)>) -> Result<(RawVulkan, RawOp)> {
    let raw = RawVulkan::new()?;
    if device.id().index != 0 || raw.device_name() != device.name() {
        return Err(Error::unsupported(format!(
            "the raw reference opens vulkan:0 (`{}`) only",
            raw.device_name()
        )));
    }
    let layouts = op
        .by_ref()
        .try_map(|_, _, (layout, _)| Ok::<_, Error>(*layout))?;
    let dispatch = xpu::vulkan::ops_abi::matmul(&layouts, raw.shader_features())?;
    let bytes: Vec<Vec<u8>> = op
        .operands()
        .iter()
        .map(|o| from_f64(&o.tensor.1, o.tensor.0.dtype))
        .collect();
    let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let op = raw.op(&dispatch, &slices)?;
    Ok((raw, op))
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
