//! # xpu-host: the embedded default backend and the reference semantics
//!
//! The host backend turns the CPU into `N` virtual xpu devices (`host:0` …), so that
//! everything above the HAL — memory pools, collectives, the scheduler, a training
//! loop, the conformance suite — runs on any machine, and so that every other backend
//! has a reference to be checked against.
//!
//! ## Shape
//!
//! - [`HostBackend`] — the registry entry; [`HostConfig`] says how many devices and how
//!   much memory each may hold (`XPU_HOST_DEVICES`, default 4; `XPU_HOST_MEMORY`,
//!   default half of RAM shared between them). The capacity is an accounting limit, so
//!   out-of-memory is real and testable without exhausting the machine.
//! - [`HostDevice`] — one virtual device: memory accounting, streams, host-function
//!   kernels.
//! - `memory` — each allocation is its own 256-byte-aligned, zero-filled block that
//!   returns its bytes to the device's account when the last holder drops it; queued
//!   work holds the blocks it touches, so freeing early is safe. Growable allocations
//!   (capability `virtual_memory_granularity` = the page size) are the same memory type
//!   backed by an `mmap(MAP_NORESERVE)` reservation: the backed length is charged to the
//!   account, shrinking hands the tail back with `madvise(MADV_DONTNEED)` but keeps it
//!   mapped, so queued work that still touches it cannot fault.
//! - `queue` + [`HostStream`] — every stream owns one worker thread that drains an
//!   in-order job queue. A thread that waits on the stream without a time limit
//!   (`synchronize`, an untimed event wait) does not sleep while jobs are queued: it runs
//!   them itself under the stream's executor lock, so a submit-then-synchronize pattern
//!   costs no thread hand-off at all and the data stays in the waiting core's cache.
//!   Only the holder of the executor lock pops jobs, and it finishes each before letting
//!   go, so order is kept whichever thread runs a job. Otherwise both sides spin for a
//!   few microseconds before they block, because on small machines a futex wake costs
//!   ~20 µs and a spinning hand-off ~0.1 µs. Panics in work are caught and become errors.
//! - [`HostEvent`] — a numbered point on a stream's timeline; it completes when the
//!   worker passes it, recording a timestamp and the outcome of the work before it.
//!   Waits on events of any backend are done by the waiting stream's worker.
//! - `ops` — runs the builtin operations on device memory with the HAL's reference
//!   arithmetic ([`xpu_hal::reference`]), which defines what every backend must match.
//!
//! ## Errors
//!
//! A failing job (a host kernel returning `Err`, or panicking) sets the stream's error:
//! later work is skipped until the error is reported by `synchronize`/`query`, and every
//! event recorded in between completes with an `Aborted` error naming the cause.

mod config;
mod device;
mod event;
mod kernel;
mod memory;
mod ops;
mod queue;
mod std_ops;
mod stream;

use std::sync::Arc;

use xpu_hal::backend::{Backend, DeviceImpl, DeviceSummary};
use xpu_hal::{Error, Result};

pub use config::{parse_size, HostConfig, DEFAULT_DEVICES, MAX_DEVICES};
pub use device::HostDevice;
pub use event::HostEvent;
pub use kernel::HostKernel;
pub use memory::{HostAllocation, ALIGN};
pub use stream::HostStream;

/// The backend's registered name.
pub const NAME: &str = "host";

/// The host backend: [`HostConfig::devices`] virtual devices.
#[derive(Debug, Clone)]
pub struct HostBackend {
    config: HostConfig,
}

impl HostBackend {
    /// A backend with the given configuration.
    pub fn new(config: HostConfig) -> Self {
        HostBackend { config }
    }

    /// A backend configured from `XPU_HOST_DEVICES` and `XPU_HOST_MEMORY`.
    pub fn from_env() -> Result<Self> {
        Ok(HostBackend::new(HostConfig::from_env()?))
    }

    /// Its configuration.
    pub fn config(&self) -> HostConfig {
        self.config
    }

    /// Creates device `index` as the concrete host type.
    pub fn create_host_device(&self, index: u32) -> Result<HostDevice> {
        if index >= self.config.devices {
            return Err(Error::invalid(format!(
                "host:{index} does not exist; the host backend has {} device(s) (set XPU_HOST_DEVICES for more)",
                self.config.devices
            )));
        }
        let threads = std_ops::threads_from_env(self.config.devices)?;
        Ok(HostDevice::new(index, self.config.capacity, threads))
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn enumerate(&self) -> Result<Vec<DeviceSummary>> {
        Ok((0..self.config.devices)
            .map(|index| DeviceSummary {
                index,
                name: format!("host virtual device {index}"),
            })
            .collect())
    }

    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>> {
        Ok(Arc::new(self.create_host_device(index)?))
    }
}
