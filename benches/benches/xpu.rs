//! The one criterion root for xpu. Groups:
//! - `dispatch`: a tiny fill through the HAL vs the same fill enqueued directly on the
//!   host backend's concrete stream (no validation, no dynamic dispatch) vs the fill
//!   loop called inline with no queue at all.
//! - `copy`: host→device, device→host and device→device copies through the HAL vs
//!   `memcpy` (`copy_from_slice`) of the same size between pre-faulted host buffers.
//! - `vulkan_copy`, `vulkan_add`, `vulkan_launch`: copies, a large elementwise add and
//!   many tiny adds on `vulkan:0` through the HAL vs the same Vulkan commands issued
//!   directly with ash (`xpu_benches::vulkan_raw`); skipped without a Vulkan device.
//! - `cuda_copy`, `cuda_add`, `cuda_launch`: a device-to-device copy, a large
//!   elementwise add and many tiny adds on `cuda:0` through the HAL vs the same work
//!   issued directly with cudarc; skipped without a CUDA driver and device.
//! - `memory_cached`: allocate + free of a cached size (4 KiB, 1 MiB, 16 MiB) through the
//!   caching allocator (`xpu_memory::DeviceAllocator`) vs the raw HAL `Device::allocate` +
//!   drop of the same size, on a host device.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod copy;
mod cuda;
mod dispatch;
mod memory;
mod vulkan;

use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = dispatch::bench, copy::bench, memory::bench, vulkan::bench, cuda::bench
}
criterion_main!(benches);
