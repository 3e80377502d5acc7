//! Shared set-up for the xpu benchmarks (`cargo bench -p xpu-benches`).
//!
//! Every benchmark group times an xpu path *and* its reference in the same run, because
//! these machines are noisy: a figure is only meaningful next to the reference it is
//! compared with. See `benches/README.md` for what each group measures.

use std::sync::Arc;

use xpu_hal::backend::Backend;
use xpu_hal::{Device, DeviceId, Error, Result};
use xpu_host::{HostBackend, HostConfig, HostDevice};

pub mod cuda_raw;
pub mod openblas;
pub mod vulkan_raw;

/// Memory each benchmark device may hold.
pub const BENCH_CAPACITY: u64 = 1 << 30;

/// A host device through the HAL, and the same kind of device as its concrete type (a
/// separate instance, so the two paths share no queues).
pub fn host_devices() -> Result<(Device, HostDevice)> {
    let backend = HostBackend::new(HostConfig {
        devices: 2,
        capacity: BENCH_CAPACITY,
    });
    let hal = Device::from_impl(
        DeviceId::new("host", 0),
        Arc::new(backend.create_host_device(0)?),
    );
    let direct = backend.create_host_device(1)?;
    Ok((hal, direct))
}

/// A buffer of `len` bytes with every page already touched, so that first-touch page
/// faults (1–2.5 GB/s here) do not pollute a bandwidth figure.
pub fn prefaulted(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
    v
}

/// `vulkan:0` through the HAL, and the raw-ash reference ([`vulkan_raw::RawVulkan`]) on
/// the same physical device with its own instance, device and queue. Without a Vulkan
/// device, [`Error::Unavailable`] with the loader's or the backend's reason.
pub fn vulkan_devices() -> Result<(Device, vulkan_raw::RawVulkan)> {
    let backend = xpu_vulkan::VulkanBackend::new();
    let listed = backend.enumerate()?;
    if listed.is_empty() {
        return Err(Error::unavailable(
            xpu_vulkan::NAME,
            "the backend lists no device",
        ));
    }
    let hal = Device::from_impl(
        DeviceId::new(xpu_vulkan::NAME, 0),
        backend.create_device(0)?,
    );
    let raw = vulkan_raw::RawVulkan::new()?;
    if raw.device_name() != hal.name() {
        return Err(Error::invalid(format!(
            "the raw reference opened `{}` but vulkan:0 is `{}`",
            raw.device_name(),
            hal.name()
        )));
    }
    Ok((hal, raw))
}

/// `cuda:0` through the HAL, and the raw-cudarc reference ([`cuda_raw::RawCuda`]) on the
/// same GPU (its primary context, its own stream). Without a CUDA driver or device,
/// [`Error::Unavailable`] with the backend's reason.
pub fn cuda_devices() -> Result<(Device, cuda_raw::RawCuda)> {
    let backend = xpu_cuda::CudaBackend::new();
    let listed = backend.enumerate()?;
    if listed.is_empty() {
        return Err(Error::unavailable(
            xpu_cuda::NAME,
            "the backend lists no device",
        ));
    }
    let hal = Device::from_impl(DeviceId::new(xpu_cuda::NAME, 0), backend.create_device(0)?);
    let raw = cuda_raw::RawCuda::new(0)?;
    if raw.device_name() != hal.name() {
        return Err(Error::invalid(format!(
            "the raw reference opened `{}` but cuda:0 is `{}`",
            raw.device_name(),
            hal.name()
        )));
    }
    Ok((hal, raw))
}
