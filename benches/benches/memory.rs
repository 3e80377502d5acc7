//! The caching allocator's hot path: allocate + free of a cached size through
//! `xpu_memory::DeviceAllocator` vs the raw HAL `Device::allocate` + drop of the same size,
//! on the same host device in the same run.

use std::hint::black_box;

use criterion::Criterion;
use xpu_memory::{Config, DeviceAllocator};

pub fn bench(c: &mut Criterion) {
    let (device, _) = xpu_benches::host_devices().unwrap();
    let pool = DeviceAllocator::new(device.clone(), Config::xpu());
    let stream = device.create_stream().unwrap();
    let s = pool.register_stream(&stream);
    let mut group = c.benchmark_group("memory_cached");
    for (name, size) in [("4KiB", 4096u64), ("1MiB", 1 << 20), ("16MiB", 16 << 20)] {
        // Warm the cache: the size is cached from here on.
        pool.free(pool.allocate(size, s).unwrap()).unwrap();
        group.bench_function(format!("alloc+free_{name}/pool"), |b| {
            b.iter(|| {
                let block = pool.allocate(black_box(size), s).unwrap();
                pool.free(black_box(block)).unwrap();
            })
        });
        group.bench_function(format!("alloc+free_{name}/hal_allocate"), |b| {
            b.iter(|| drop(black_box(device.allocate(black_box(size)).unwrap())))
        });
    }
    group.finish();
    let st = pool.stats();
    println!(
        "memory_cached: the pool made {} device allocation call(s) for 3 sizes over the whole run",
        st.num_device_alloc
    );
}
