//! The CUDA backend (`cuda:0`) through the HAL vs the same device work issued directly
//! with cudarc's safe API on the same GPU: a device-to-device copy
//! (`memcpy_dtod`), the builtin add (the backend's own generated CUDA C for
//! `binary(Sum, F32)`, compiled by NVRTC and launched with the same grid), and the
//! per-launch overhead of many tiny adds. Each HAL figure is followed by a
//! `synchronize`, each reference by a stream synchronize. Without a CUDA driver, NVRTC
//! or device the groups print a skip line and measure nothing.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use xpu_cuda::builtins::{source, BuiltinKind, BLOCK};
use xpu_hal::backend::Backend;
use xpu_hal::{BinaryOp, DType, Device, DeviceId, Scalar};

/// Copy sizes (bytes).
const COPY_SIZES: [usize; 2] = [1 << 20, 64 << 20];
/// Elementwise add sizes (f32 elements).
const ADD_SIZES: [usize; 2] = [1 << 20, 16 << 20];
/// Elements of each tiny add in the per-launch group.
const TINY: usize = 64;
/// Tiny adds enqueued before one synchronize.
const LAUNCHES: usize = 1000;

struct Raw {
    stream: Arc<CudaStream>,
    add: CudaFunction,
    sm_count: u64,
}

fn setup() -> Result<(Device, Raw), String> {
    let backend = xpu_cuda::CudaBackend::new();
    let listed = backend.enumerate().map_err(|e| e.to_string())?;
    if listed.is_empty() {
        return Err("the backend lists no device".into());
    }
    let imp = backend.create_device(0).map_err(|e| e.to_string())?;
    let device = Device::from_impl(DeviceId::new(xpu_cuda::NAME, 0), imp);
    if !device.capabilities().supports_dtype(DType::F32) {
        return Err("no NVRTC: builtin operations are unavailable".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
    let stream = ctx.new_stream().map_err(|e| e.to_string())?;
    let kind = BuiltinKind::Binary(BinaryOp::Sum, DType::F32);
    // The same NVRTC, options and target as the backend's, so that both sides run the
    // same machine code.
    let nvrtc = xpu_cuda::driver()?.nvrtc.clone()?;
    let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
    let image = nvrtc.compile(
        &source::source(kind),
        major * 10 + minor,
        xpu_cuda::nvrtc::Flavor::Builtin,
    )?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_binary(image.bytes.clone()))
        .map_err(|e| e.to_string())?;
    let add = module
        .load_function(&source::entry(kind))
        .map_err(|e| e.to_string())?;
    let sm_count = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(|e| e.to_string())? as u64;
    Ok((
        device,
        Raw {
            stream,
            add,
            sm_count,
        },
    ))
}

pub fn bench(c: &mut Criterion) {
    let (device, raw) = match setup() {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("cuda: skipped, no usable CUDA device: {e}");
            return;
        }
    };
    copies(c, &device, &raw);
    adds(c, &device, &raw);
    launches(c, &device, &raw);
}

/// The grid the backend launches for `n` elements.
fn grid(raw: &Raw, n: usize) -> LaunchConfig {
    let blocks = (n as u64)
        .div_ceil(u64::from(BLOCK))
        .min(raw.sm_count * 32)
        .max(1) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn raw_add(raw: &Raw, a: &CudaSlice<f32>, b: &CudaSlice<f32>, dst: &mut CudaSlice<f32>, n: usize) {
    let count = n as u64;
    let scalar = 0u64;
    let mut builder = raw.stream.launch_builder(&raw.add);
    builder.arg(dst).arg(a).arg(b).arg(&count).arg(&scalar);
    // SAFETY: the kernel's signature is the builtin ABI: three device pointers (here
    // f32 slices of `n` elements) and two u64 values.
    unsafe { builder.launch(grid(raw, n)) }.unwrap();
}

fn copies(c: &mut Criterion, device: &Device, raw: &Raw) {
    let stream = device.create_stream().unwrap();
    let mut group = c.benchmark_group("cuda_copy");
    for size in COPY_SIZES {
        if size >= 16 << 20 {
            group.sampling_mode(SamplingMode::Flat).sample_size(10);
        }
        group.throughput(Throughput::Bytes(size as u64));
        let a = device.allocate(size as u64).unwrap();
        let b = device.allocate(size as u64).unwrap();
        stream.fill(&a, Scalar::U8(1)).unwrap();
        stream.synchronize().unwrap();
        group.bench_with_input(BenchmarkId::new("d2d/hal", size), &size, |bench, _| {
            bench.iter(|| {
                stream.copy(&a, &b).unwrap();
                stream.synchronize().unwrap();
            })
        });
        let ra = raw.stream.alloc_zeros::<u8>(size).unwrap();
        let mut rb = raw.stream.alloc_zeros::<u8>(size).unwrap();
        group.bench_with_input(BenchmarkId::new("d2d/raw", size), &size, |bench, _| {
            bench.iter(|| {
                raw.stream.memcpy_dtod(&ra, &mut rb).unwrap();
                raw.stream.synchronize().unwrap();
            })
        });
    }
    group.finish();
}

fn adds(c: &mut Criterion, device: &Device, raw: &Raw) {
    let stream = device.create_stream().unwrap();
    let mut group = c.benchmark_group("cuda_add");
    for n in ADD_SIZES {
        group.throughput(Throughput::Elements(n as u64));
        let bytes = (n * 4) as u64;
        let a = device.allocate(bytes).unwrap();
        let b = device.allocate(bytes).unwrap();
        let d = device.allocate(bytes).unwrap();
        stream.fill(&a, Scalar::F32(1.0)).unwrap();
        stream.fill(&b, Scalar::F32(2.0)).unwrap();
        stream.synchronize().unwrap();
        group.bench_with_input(BenchmarkId::new("f32/hal", n), &n, |bench, _| {
            bench.iter(|| {
                stream
                    .binary(BinaryOp::Sum, DType::F32, &a, &b, &d)
                    .unwrap();
                stream.synchronize().unwrap();
            })
        });
        let ra = raw.stream.alloc_zeros::<f32>(n).unwrap();
        let rb = raw.stream.alloc_zeros::<f32>(n).unwrap();
        let mut rd = raw.stream.alloc_zeros::<f32>(n).unwrap();
        group.bench_with_input(BenchmarkId::new("f32/raw", n), &n, |bench, _| {
            bench.iter(|| {
                raw_add(raw, &ra, &rb, &mut rd, n);
                raw.stream.synchronize().unwrap();
            })
        });
    }
    group.finish();
}

fn launches(c: &mut Criterion, device: &Device, raw: &Raw) {
    let stream = device.create_stream().unwrap();
    let mut group = c.benchmark_group("cuda_launch");
    let bytes = (TINY * 4) as u64;
    let a = device.allocate(bytes).unwrap();
    let b = device.allocate(bytes).unwrap();
    let d = device.allocate(bytes).unwrap();
    stream.fill(&a, Scalar::F32(1.0)).unwrap();
    stream.fill(&b, Scalar::F32(2.0)).unwrap();
    stream.synchronize().unwrap();
    group.throughput(Throughput::Elements(LAUNCHES as u64));
    group.bench_function(format!("add_{TINY}xf32_x{LAUNCHES}+sync/hal"), |bench| {
        bench.iter(|| {
            for _ in 0..LAUNCHES {
                stream
                    .binary(BinaryOp::Sum, DType::F32, &a, &b, &d)
                    .unwrap();
            }
            stream.synchronize().unwrap();
        })
    });
    let ra = raw.stream.alloc_zeros::<f32>(TINY).unwrap();
    let rb = raw.stream.alloc_zeros::<f32>(TINY).unwrap();
    let mut rd = raw.stream.alloc_zeros::<f32>(TINY).unwrap();
    group.bench_function(format!("add_{TINY}xf32_x{LAUNCHES}+sync/raw"), |bench| {
        bench.iter(|| {
            for _ in 0..LAUNCHES {
                raw_add(raw, &ra, &rb, &mut rd, TINY);
            }
            raw.stream.synchronize().unwrap();
        })
    });
    group.finish();
}
