//! # xpu-sim-npu: a simulated NPU, as an xpu plugin
//!
//! A vendor plugin written with `xpu-plugin-sdk`, for two audiences. For vendors it is
//! a complete example of the SDK in use: memory, streams with a worker thread each,
//! events with timestamps, waits on its own and on foreign events, every builtin
//! operation, and a native kernel format. For xpu itself it is a second kind of device
//! that is *different* from the host: its own memory with its own capacity, a
//! configurable latency per operation and bandwidth per copy, and kernels that are
//! neither host functions nor WGSL — so that the scheduler and the collectives can be
//! exercised on a slower, heterogeneous device on any machine.
//!
//! Built, it is `libxpu_sim_npu.so` (`.dylib`, `.dll`) under `target/<profile>/`;
//! load it with `xpu --plugin PATH …` or `XPU_PLUGIN_PATH`. Its devices are
//! `plugin.simnpu:0`, `plugin.simnpu:1` …
//!
//! ## Configuration
//!
//! Read once, when the host first asks for devices ([`SimConfig::from_env`]):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `XPU_SIMNPU_DEVICES` | number of devices, 0–64 | 2 |
//! | `XPU_SIMNPU_MEMORY` | bytes per device (`512M`, `1G`, `1048576`), at least 4K | 256 MiB |
//! | `XPU_SIMNPU_LATENCY_US` | microseconds every copy, builtin and launch takes at least | 0 |
//! | `XPU_SIMNPU_BANDWIDTH_GBPS` | copy bandwidth, GB/s (10^9 bytes/s), or `unlimited` | unlimited |
//! | `XPU_SIMNPU_LOSE_AFTER` | `DEVICE:OPS`: fault injection, device `DEVICE` is lost after `OPS` operations | never |
//! | `XPU_SIMNPU_WITHOUT_OPS` | comma-separated standard operations the devices do not provide (`gelu,gelu_backward`) | none |
//! | `XPU_SIMNPU_CCL` | `on`/`off`: the devices offer their collective library, `simccl` | on |
//! | `XPU_SIMNPU_CCL_LATENCY_US` | the latency `simccl` states, µs, or `none` to state no figures | latency × 2 + 60 |
//! | `XPU_SIMNPU_CCL_GBPS` | the bus bandwidth `simccl` states, GB/s | the copy bandwidth, else 4 |
//! | `XPU_SIMNPU_CCL_SLOT` | bytes per rank and step of `simccl` across processes | 8M |
//!
//! A malformed value makes `device_count` fail with an `InvalidArgument` error naming
//! the variable.
//!
//! Besides `XPU_SIMNPU_LOSE_AFTER`, whose lost device fails the operations (and the
//! allocations and new streams) asked of it from then on, a host can lose a device at a
//! moment of its choosing through `device_inject_fault` (ABI 1.2,
//! `xpu_hal::Device::inject_fault`, `xpu train --inject-fault`). Such a device is lost
//! as the header's rules for `XPU_FAULT_LOST` say: every later call on it, its streams
//! and its events fails with `DeviceLost`, work queued on its streams fails instead of
//! running, and it never comes back. Either way the message says which of the two lost
//! it. `device_inject_fault` with `XPU_FAULT_SLOW` (`xpu_hal::Fault::Slow`) instead
//! makes a device a straggler: every copy, builtin, standard operation and launch its
//! streams run from then on takes that much longer — the stream's worker sleeps the
//! delay before the work, the enqueueing call does not wait — with unchanged results,
//! until a delay of zero ends it.
//!
//! ## Shape
//!
//! - [`SimNpu`] — the [`Plugin`]: the configuration and device
//!   count. [`xpu_plugin_get_api`] is the exported entry.
//! - [`SimDevice`] — one device: an arena (`arena`), streams, kernel loading. Every
//!   dtype is supported; `kernel_arg_alignment` is 64 bytes; events carry timestamps.
//! - `arena` — the device's memory: one block of the configured size, carved into
//!   256-byte-aligned buffers by a first-fit allocator that merges freed neighbours.
//!   Out-of-memory (and fragmentation) is real; new buffers are not cleared.
//! - [`SimStream`] — an in-order queue with a worker thread. Each job takes at least its
//!   simulated time (latency, plus bytes / bandwidth for copies): the worker does the
//!   work, then sleeps for the rest. Waits on events — this plugin's, or another
//!   backend's through the SDK's [`ExternalWait`](xpu_plugin_sdk::ExternalWait) — hold
//!   the worker, not a host thread.
//! - [`SimEvent`] — completed by the worker with a timestamp and the outcome of the
//!   work before it.
//! - [`SimGroup`] — `simccl`, the devices' own collective library (native collectives,
//!   ABI 1.3): each rank's part is a job on its stream that contributes a copy of its
//!   data, waits for the ranks it needs, and writes its result from their copies in
//!   rank order with the HAL's reference arithmetic; it states cost figures for the
//!   host's cost model, times out, aborts, and fails its peers when it cannot run.
//!   Across processes (ABI 1.4, `group_across`), the ranks meet in a POSIX
//!   shared-memory segment that the group's identifier names, in steps of at most
//!   `XPU_SIMNPU_CCL_SLOT` bytes per rank.
//! - `ops` — the builtin operations, computed with the host backend's functions
//!   (`xpu_hal::reference`) so that results agree bit for bit with the reference.
//! - `health` — whether the device still works, and how slow it is: the fault
//!   injections above.
//! - `std_ops` — every standard operation (ABI 1.1: matmul, activations, softmax,
//!   cross-entropy, layer norm, gather/scatter-add, reductions, optimizers, random
//!   numbers, dropout) on every dtype it is defined on, computed by the HAL's reference
//!   (`xpu_hal::reference::ops::run`) over arena memory.
//! - [`bytecode`] — `simnpu-bytecode`, the native kernel format: straight-line `f32`
//!   programs, one invocation per element, with a builder ([`bytecode::Module`]) and
//!   [`bytecode::axpy`] as the example.
//!
//! ## Errors
//!
//! Enqueue-time problems (a kernel argument of the wrong kind, a wrong format) are
//! returned at once. Failures of work — a kernel's `TRAP`, a panic inside a job, a
//! waited-on event whose work failed — become the stream's error: later work is
//! skipped and later events fail with `Aborted` until `synchronize` or `query`
//! reports it.

mod arena;
pub mod bytecode;
mod config;
mod device;
mod event;
mod group;
mod group_across;
mod health;
mod ops;
mod std_ops;
mod stream;

use std::ffi::CStr;

use xpu_plugin_sdk::{Error, Plugin, Result};

pub use arena::{Buffer, ALIGN};
pub use config::{SimConfig, DEFAULT_DEVICES, DEFAULT_MEMORY, MAX_DEVICES, MIN_MEMORY};
pub use device::{SimDevice, KERNEL_ARG_ALIGNMENT};
pub use event::SimEvent;
pub use group::SimGroup;
pub use stream::SimStream;

/// The plugin's name: its devices are `plugin.simnpu:N`.
pub const NAME: &str = "simnpu";

/// The simulated NPU plugin.
#[derive(Debug, Clone)]
pub struct SimNpu {
    config: SimConfig,
}

impl SimNpu {
    /// A plugin with the given configuration (the exported entry uses
    /// [`SimConfig::from_env`]).
    pub fn with_config(config: SimConfig) -> Self {
        SimNpu { config }
    }

    /// Its configuration.
    pub fn config(&self) -> SimConfig {
        self.config
    }
}

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };

impl Plugin for SimNpu {
    const NAME: &'static CStr = c"simnpu";
    const VERSION: &'static CStr = VERSION;
    const EVENT_TIMING: bool = true;
    const KERNELS: bool = true;
    const COLLECTIVES: bool = true;
    const COLLECTIVES_ACROSS: bool = true;
    type Device = SimDevice;
    type Stream = SimStream;
    type Event = SimEvent;
    type Buffer = Buffer;
    type Kernel = bytecode::Kernel;

    fn new() -> Result<Self> {
        Ok(SimNpu::with_config(SimConfig::from_env()?))
    }

    fn device_count(&self) -> Result<u32> {
        Ok(self.config.devices)
    }

    fn open_device(&self, index: u32) -> Result<SimDevice> {
        if index >= self.config.devices {
            return Err(Error::invalid_argument(format!(
                "plugin.simnpu:{index} does not exist; the simulated NPU has {} device(s) (set XPU_SIMNPU_DEVICES for more)",
                self.config.devices
            )));
        }
        SimDevice::open(index, self.config)
    }

    fn create_group(
        &self,
        devices: &[&SimDevice],
        config: xpu_plugin_sdk::GroupConfig,
    ) -> Result<xpu_plugin_sdk::NewGroup<Self>> {
        match &config.across {
            Some(across) => {
                group_across::SimGroupAcross::join(devices, self.config, &config, across)
            }
            None => group::SimGroup::create(devices, self.config, config),
        }
    }

    fn group_id(&self, _device: &SimDevice) -> Result<Vec<u8>> {
        group_across::group_id()
    }
}

xpu_plugin_sdk::export_plugin!(SimNpu);
