//! The Vulkan backend (`vulkan:0`) through the HAL vs the same device work written
//! directly against Vulkan (`xpu_benches::vulkan_raw`: its own instance, device,
//! buffers of the same size and memory type, one command buffer, submit, fence wait),
//! and, for copies on unified memory, vs a `memcpy` between the mapped buffers (what
//! the backend does for a copy on an idle stream there). Without a Vulkan device the
//! groups print a skip line and measure nothing.

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use xpu_benches::vulkan_raw::{Behind, Memory, RawVulkan};
use xpu_hal::{BinaryOp, DType, Device, HostBuffer, Scalar};
use xpu_vulkan::builtins::abi::ShaderKind;

/// Copy sizes (bytes).
const COPY_SIZES: [usize; 2] = [1 << 20, 64 << 20];
/// Elementwise add sizes (f32 elements).
const ADD_SIZES: [u64; 2] = [1 << 20, 16 << 20];
/// Elements of each tiny add in the per-launch group.
const TINY: u64 = 64;
/// Tiny adds enqueued before one synchronize.
const LAUNCHES: usize = 1000;

pub fn bench(c: &mut Criterion) {
    let (device, raw) = match xpu_benches::vulkan_devices() {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("vulkan: skipped, no Vulkan device: {e}");
            return;
        }
    };
    copies(c, &device, &raw);
    adds(c, &device, &raw);
    launches(c, &device, &raw);
}

fn copies(c: &mut Criterion, device: &Device, raw: &RawVulkan) {
    let stream = device.create_stream().unwrap();
    let fill = raw.builtin_pipeline(ShaderKind::Fill(DType::F32)).unwrap();
    let mut group = c.benchmark_group("vulkan_copy");
    for size in COPY_SIZES {
        if size >= 16 << 20 {
            group.sampling_mode(SamplingMode::Flat).sample_size(10);
        }
        let bytes = size as u64;
        group.throughput(Throughput::Bytes(bytes));
        let host = xpu_benches::prefaulted(size);
        let src_host = HostBuffer::from_bytes(&host).unwrap();
        let dst_host = HostBuffer::from_bytes(&host).unwrap();
        let a = device.allocate(bytes).unwrap();
        let b = device.allocate(bytes).unwrap();
        stream.fill(&a, Scalar::F32(1.0)).unwrap();
        stream.fill(&b, Scalar::F32(2.0)).unwrap();
        stream.synchronize().unwrap();
        let ra = raw.buffer(bytes, Memory::Device).unwrap();
        let mut rb = raw.buffer(bytes, Memory::Device).unwrap();
        let staging = raw.buffer(bytes, Memory::Staging).unwrap();
        raw.fill(&ra, 1).unwrap();
        raw.fill(&rb, 2).unwrap();
        raw.fill(&staging, 3).unwrap();
        let mut out = xpu_benches::prefaulted(size);
        // A small fill queued before a copy, so that the copy is not on an idle stream.
        let tiny = device.allocate(64).unwrap();
        let raw_tiny = raw.buffer(64, Memory::Device).unwrap();
        let behind = Behind {
            fill: &fill,
            buffer: &raw_tiny,
        };
        // Unified memory: the raw buffers are mapped, and a memcpy between them is the
        // floor of the backend's idle-stream copies.
        let mapped = ra.host_bytes().is_some() && rb.host_bytes().is_some();

        group.bench_with_input(BenchmarkId::new("d2d/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy(&a, &b).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("d2d/raw", size), &size, |bch, _| {
            bch.iter(|| raw.copy(&ra, &rb, bytes).unwrap())
        });
        if mapped {
            group.bench_with_input(
                BenchmarkId::new("d2d/mapped_memcpy", size),
                &size,
                |bch, _| {
                    bch.iter(|| {
                        let src = ra.host_bytes().unwrap();
                        rb.host_bytes_mut().unwrap().copy_from_slice(src)
                    })
                },
            );
        }
        group.bench_with_input(BenchmarkId::new("h2d/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy_from_host(&src_host, 0, &a).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("h2d/raw", size), &size, |bch, _| {
            bch.iter(|| raw.upload(&host, &staging, &rb, None).unwrap())
        });
        if mapped {
            group.bench_with_input(
                BenchmarkId::new("h2d/mapped_memcpy", size),
                &size,
                |bch, _| bch.iter(|| rb.host_bytes_mut().unwrap().copy_from_slice(&host)),
            );
        }
        group.bench_with_input(BenchmarkId::new("d2h/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy_to_host(&a, &dst_host, 0).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("d2h/raw", size), &size, |bch, _| {
            bch.iter(|| raw.download(&ra, &staging, &mut out, None).unwrap())
        });
        if mapped {
            group.bench_with_input(
                BenchmarkId::new("d2h/mapped_memcpy", size),
                &size,
                |bch, _| bch.iter(|| out.copy_from_slice(ra.host_bytes().unwrap())),
            );
        }
        group.bench_with_input(BenchmarkId::new("h2d_queued/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.fill(&tiny, Scalar::F32(0.0)).unwrap();
                stream.copy_from_host(&src_host, 0, &a).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("h2d_queued/raw", size), &size, |bch, _| {
            bch.iter(|| raw.upload(&host, &staging, &rb, Some(behind)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("d2h_queued/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.fill(&tiny, Scalar::F32(0.0)).unwrap();
                stream.copy_to_host(&a, &dst_host, 0).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("d2h_queued/raw", size), &size, |bch, _| {
            bch.iter(|| raw.download(&ra, &staging, &mut out, Some(behind)).unwrap())
        });
    }
    group.finish();
}

fn adds(c: &mut Criterion, device: &Device, raw: &RawVulkan) {
    let stream = device.create_stream().unwrap();
    let pipeline = raw
        .builtin_pipeline(ShaderKind::Binary(BinaryOp::Sum, DType::F32))
        .unwrap();
    let mut group = c.benchmark_group("vulkan_add");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for n in ADD_SIZES {
        let bytes = n * 4;
        // Bytes read and written: two sources and one destination.
        group.throughput(Throughput::Bytes(3 * bytes));
        let [a, b, out] = [1.0f32, 2.0, 0.0].map(|v| {
            let buf = device.allocate(bytes).unwrap();
            stream.fill(&buf, Scalar::F32(v)).unwrap();
            buf
        });
        stream.synchronize().unwrap();
        let [ra, rb, rout] = [1.0f32, 2.0, 0.0].map(|v| {
            let buf = raw.buffer(bytes, Memory::Device).unwrap();
            raw.fill(&buf, v.to_bits()).unwrap();
            buf
        });
        group.bench_with_input(BenchmarkId::new("f32/hal", n), &n, |bch, _| {
            bch.iter(|| {
                stream
                    .binary(BinaryOp::Sum, DType::F32, &a, &b, &out)
                    .unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("f32/raw", n), &n, |bch, _| {
            bch.iter(|| {
                raw.builtin(&pipeline, &[&rout, &ra, &rb], n, 4, 0, 1)
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn launches(c: &mut Criterion, device: &Device, raw: &RawVulkan) {
    let stream = device.create_stream().unwrap();
    let pipeline = raw
        .builtin_pipeline(ShaderKind::Binary(BinaryOp::Sum, DType::F32))
        .unwrap();
    let bytes = TINY * 4;
    let [a, b, out] = [1.0f32, 2.0, 0.0].map(|v| {
        let buf = device.allocate(bytes).unwrap();
        stream.fill(&buf, Scalar::F32(v)).unwrap();
        buf
    });
    stream.synchronize().unwrap();
    let [ra, rb, rout] = [1.0f32, 2.0, 0.0].map(|v| {
        let buf = raw.buffer(bytes, Memory::Device).unwrap();
        raw.fill(&buf, v.to_bits()).unwrap();
        buf
    });
    let mut group = c.benchmark_group("vulkan_launch");
    group.bench_function(format!("add_{TINY}xf32+sync/hal"), |bch| {
        bch.iter(|| {
            stream
                .binary(BinaryOp::Sum, DType::F32, &a, &b, &out)
                .unwrap();
            stream.synchronize().unwrap();
        })
    });
    group.bench_function(format!("add_{TINY}xf32+sync/raw"), |bch| {
        bch.iter(|| {
            raw.builtin(&pipeline, &[&rout, &ra, &rb], TINY, 4, 0, 1)
                .unwrap()
        })
    });
    group
        .throughput(Throughput::Elements(LAUNCHES as u64))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10);
    group.bench_function(format!("add_{TINY}xf32_x{LAUNCHES}+sync/hal"), |bch| {
        bch.iter(|| {
            for _ in 0..LAUNCHES {
                stream
                    .binary(BinaryOp::Sum, DType::F32, &a, &b, &out)
                    .unwrap();
            }
            stream.synchronize().unwrap();
        })
    });
    group.bench_function(format!("add_{TINY}xf32_x{LAUNCHES}+sync/raw"), |bch| {
        bch.iter(|| {
            raw.builtin(&pipeline, &[&rout, &ra, &rb], TINY, 4, 0, LAUNCHES)
                .unwrap()
        })
    });
    group.finish();
}
