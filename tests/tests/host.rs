//! The conformance suite on the host backend, as `cargo test` trials named
//! `[backend/device] case`: four host devices, plus one device of the host backend
//! registered under another name, so that waits between backends (the host-side
//! bridge of `Stream::wait_event`) are exercised without a GPU. Every profile runs:
//! the core cases, and the collectives cases, whose communicators span two host devices
//! (peer paths) and a host device with the renamed one (host-staged paths).

use std::sync::Arc;

use xpu_conformance::{all_cases, harness, Expectations, DEFAULT_CASE_TIMEOUT};
use xpu_hal::backend::{Backend, DeviceImpl, DeviceSummary};
use xpu_hal::{DeviceSelector, Registry};
use xpu_host::{HostBackend, HostConfig};

const MIB: u64 = 1 << 20;

/// A backend that is the host backend under another name.
struct Renamed {
    name: &'static str,
    inner: HostBackend,
}

impl Backend for Renamed {
    fn name(&self) -> &str {
        self.name
    }

    fn enumerate(&self) -> xpu_hal::Result<Vec<DeviceSummary>> {
        self.inner.enumerate()
    }

    fn create_device(&self, index: u32) -> xpu_hal::Result<Arc<dyn DeviceImpl>> {
        self.inner.create_device(index)
    }
}

fn main() -> xpu_hal::Result<()> {
    let mut registry = Registry::new();
    registry.register(Arc::new(HostBackend::new(HostConfig {
        devices: 4,
        capacity: 256 * MIB,
    })))?;
    registry.register(Arc::new(Renamed {
        name: "hostbridge",
        inner: HostBackend::new(HostConfig {
            devices: 1,
            capacity: 64 * MIB,
        }),
    }))?;
    let devices = registry.devices(&DeviceSelector::parse("*")?)?;
    if devices.len() != 5 {
        return Err(xpu_hal::Error::invalid(format!(
            "expected 4 host devices and 1 bridge device, found {}",
            devices.len()
        )));
    }
    harness::run_trials(
        &all_cases(),
        &devices,
        &Expectations::builtin(),
        DEFAULT_CASE_TIMEOUT,
    )
}
