//! HAL dispatch overhead: what validation + dynamic dispatch add to a tiny fill.

use std::hint::black_box;
use std::sync::Arc;

use criterion::Criterion;
use xpu_hal::backend::{BuiltinOp, StreamImpl};
use xpu_hal::{RawAllocation, RawSlice, Scalar};

const BYTES: u64 = 64;
const BATCH: usize = 100;

pub fn bench(c: &mut Criterion) {
    let (device, host) = xpu_benches::host_devices().unwrap();
    let hal_stream = device.create_stream().unwrap();
    let hal_buf = device.allocate(BYTES).unwrap();

    let direct_stream = host.create_host_stream().unwrap();
    let direct_mem: Arc<dyn RawAllocation> = host.allocate_host(BYTES).unwrap();
    let direct_slice = RawSlice {
        memory: direct_mem,
        offset: 0,
        len: BYTES,
    };

    let mut group = c.benchmark_group("dispatch");
    group.bench_function("fill_64B+sync/hal", |b| {
        b.iter(|| {
            hal_stream.fill(&hal_buf, Scalar::F32(1.0)).unwrap();
            hal_stream.synchronize().unwrap();
        })
    });
    group.bench_function("fill_64B+sync/host_direct", |b| {
        b.iter(|| {
            direct_stream
                .builtin(BuiltinOp::Fill {
                    dst: direct_slice.clone(),
                    value: Scalar::F32(1.0),
                })
                .unwrap();
            direct_stream.synchronize().unwrap();
        })
    });
    group.bench_function(format!("fill_64B_x{BATCH}+sync/hal"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                hal_stream.fill(&hal_buf, Scalar::F32(1.0)).unwrap();
            }
            hal_stream.synchronize().unwrap();
        })
    });
    group.bench_function(format!("fill_64B_x{BATCH}+sync/host_direct"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                direct_stream
                    .builtin(BuiltinOp::Fill {
                        dst: direct_slice.clone(),
                        value: Scalar::F32(1.0),
                    })
                    .unwrap();
            }
            direct_stream.synchronize().unwrap();
        })
    });
    let mut local = [0f32; (BYTES / 4) as usize];
    group.bench_function("fill_64B/inline", |b| {
        b.iter(|| xpu_hal::reference::fill(black_box(&mut local[..]), black_box(1.0f32)))
    });
    group.finish();
}
