//! What the training tests share: two real host devices.

use std::sync::Arc;

use xpu_hal::{Device, DeviceSelector, Registry};
use xpu_host::{HostBackend, HostConfig};

/// The devices `sel` names among two host devices of 256 MiB.
pub fn host(sel: &str) -> Vec<Device> {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 2,
        capacity: 256 << 20,
    })))
    .unwrap();
    r.devices(&DeviceSelector::parse(sel).unwrap()).unwrap()
}
