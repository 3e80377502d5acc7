//! [`SimDevice`]: one simulated NPU with its own memory arena.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xpu_plugin_sdk::{
    DType, Device, DeviceKind, DeviceProperties, Error, Fault, KernelCode, MemoryInfo, OpSupport,
    Result,
};

use crate::arena::{Arena, Buffer, ALIGN};
use crate::bytecode::{self, Kernel, Module};
use crate::config::SimConfig;
use crate::health::Health;
use crate::stream::SimStream;
use crate::SimNpu;

/// Byte alignment of kernel buffer arguments the device asks for (an NPU-like value,
/// so that the host's alignment checks are exercised).
pub const KERNEL_ARG_ALIGNMENT: u64 = 64;

/// An open simulated device.
pub struct SimDevice {
    index: u32,
    config: SimConfig,
    arena: Arc<Arena>,
    streams: AtomicU64,
    health: Arc<Health>,
}

impl SimDevice {
    pub(crate) fn open(index: u32, config: SimConfig) -> Result<Self> {
        Ok(SimDevice {
            index,
            config,
            arena: Arena::new(id(index), config.memory)?,
            streams: AtomicU64::new(0),
            health: Arc::new(Health::new(
                id(index),
                config
                    .lose_after
                    .and_then(|(d, n)| (d == index).then_some(n)),
            )),
        })
    }
}

impl SimDevice {
    /// The device's index (`plugin.simnpu:N`).
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// The device's id as xpu shows it.
fn id(index: u32) -> String {
    format!("plugin.simnpu:{index}")
}

impl Device<SimNpu> for SimDevice {
    fn properties(&self) -> Result<DeviceProperties> {
        Ok(DeviceProperties {
            name: format!("simnpu {} (simulated NPU)", self.index),
            vendor: "xpu (simulated)".to_string(),
            driver: format!("xpu-sim-npu {}", env!("CARGO_PKG_VERSION")),
            kind: DeviceKind::Npu,
            dtypes: DType::ALL.to_vec(),
            memory_bytes: self.arena.capacity(),
            // Buffers take whole ALIGN-byte blocks, so the largest is the arena rounded
            // down to a block.
            max_allocation: self.arena.capacity() - self.arena.capacity() % ALIGN,
            kernel_arg_alignment: KERNEL_ARG_ALIGNMENT,
            timeline_events: true,
            event_timing: true,
            kernel_format: Some(bytecode::FORMAT.to_string()),
        })
    }

    fn capabilities(&self) -> Result<Vec<String>> {
        Ok(vec![
            "simulated=1".to_string(),
            format!("latency_us={}", self.config.latency.as_micros()),
            match self.config.bandwidth {
                Some(b) => format!("bandwidth_gbps={}", b / 1e9),
                None => "bandwidth_gbps=unlimited".to_string(),
            },
        ])
    }

    fn ops(&self) -> Result<Vec<OpSupport>> {
        Ok(crate::std_ops::supported()
            .into_iter()
            .filter(|s| self.config.without_ops & (1u64 << (s.kind.raw() % 64)) == 0)
            .collect())
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.health.check_call()?;
        Ok(MemoryInfo {
            total: self.arena.capacity(),
            free: self.arena.free_bytes(),
        })
    }

    fn allocate(&self, size: u64) -> Result<Buffer> {
        self.health.check()?;
        self.arena.allocate(size)
    }

    fn create_stream(&self) -> Result<SimStream> {
        self.health.check()?;
        let n = self.streams.fetch_add(1, Ordering::Relaxed);
        SimStream::new(
            format!("{} stream {n}", id(self.index)),
            self.config,
            self.health.clone(),
        )
    }

    fn inject_fault(&self, fault: Fault) -> Result<()> {
        match fault {
            // Streams and events share the health: their next call fails, and so does
            // the work their workers have not run yet.
            Fault::Lost => {
                self.health.lose();
                Ok(())
            }
            // The streams' workers sleep the delay before each operation from now on;
            // a lost device stays lost.
            Fault::Slow(delay) => {
                self.health.slow(delay);
                Ok(())
            }
            other => Err(Error::unsupported(format!(
                "{} cannot suffer the fault `{other}`; it injects `lost` and `slow` only",
                id(self.index)
            ))),
        }
    }

    fn load_kernel(&self, code: KernelCode<'_>) -> Result<Kernel> {
        self.health.check_call()?;
        if code.format != bytecode::FORMAT {
            return Err(Error::unsupported(format!(
                "{} loads `{}` kernels, not `{}`",
                id(self.index),
                bytecode::FORMAT,
                code.format
            )));
        }
        let module = Module::decode(code.code)?;
        let function = module.entry(code.entry_point)?.clone();
        Ok(Kernel {
            function: Arc::new(function),
        })
    }
}
