//! Copy bandwidth through the HAL vs `memcpy` of the same size.

use criterion::{BenchmarkId, Criterion, Throughput};
use xpu_hal::HostBuffer;

const SIZES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];

pub fn bench(c: &mut Criterion) {
    let (device, _) = xpu_benches::host_devices().unwrap();
    let stream = device.create_stream().unwrap();
    let mut group = c.benchmark_group("copy");
    for size in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let src_host = HostBuffer::from_bytes(&xpu_benches::prefaulted(size)).unwrap();
        let dst_host = HostBuffer::from_bytes(&xpu_benches::prefaulted(size)).unwrap();
        let a = device.allocate(size as u64).unwrap();
        let b = device.allocate(size as u64).unwrap();
        // Touch the device pages once so no copy pays for first-touch faults.
        stream.copy_from_host(&src_host, 0, &a).unwrap();
        stream.copy_from_host(&src_host, 0, &b).unwrap();
        stream.synchronize().unwrap();

        group.bench_with_input(BenchmarkId::new("h2d/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy_from_host(&src_host, 0, &a).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("d2h/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy_to_host(&a, &dst_host, 0).unwrap();
                stream.synchronize().unwrap();
            })
        });
        group.bench_with_input(BenchmarkId::new("d2d/hal", size), &size, |bch, _| {
            bch.iter(|| {
                stream.copy(&a, &b).unwrap();
                stream.synchronize().unwrap();
            })
        });
        let src = xpu_benches::prefaulted(size);
        let mut dst = xpu_benches::prefaulted(size);
        group.bench_with_input(BenchmarkId::new("memcpy", size), &size, |bch, _| {
            bch.iter(|| {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            })
        });
    }
    group.finish();
}
