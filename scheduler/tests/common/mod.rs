//! Helpers the scheduler's test files share: one registry of real devices (host,
//! Vulkan, both example plugins), random task programs, and the sequential reference
//! they are checked against.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use xpu_hal::{BinaryOp, DType, Device, DeviceSelector, HostBuffer, Registry, Scalar};
use xpu_host::{HostBackend, HostConfig};
use xpu_scheduler::{
    AccessMode, Builtin, Codelet, Handle, Policy, Scheduler, SchedulerOptions, Task,
};

/// Backends `XPU_REQUIRE` names.
pub fn required() -> Vec<String> {
    std::env::var("XPU_REQUIRE")
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default()
}

pub fn is_required(backend: &str) -> bool {
    required().iter().any(|r| {
        r.strip_suffix('*')
            .map_or(r == backend, |p| backend.starts_with(p))
    })
}

/// The sim-npu plugin's shared library, built as a dependency of this package.
pub fn sim_npu() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let name = format!(
        "{}xpu_sim_npu{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [dir.join(&name), dir.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
}

/// The C example plugin, compiled once per test process.
pub fn c_minimal() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            let src = root.join("backends/plugin/examples/c-minimal/minimal.c");
            let dir =
                std::env::temp_dir().join(format!("xpu-sched-plugins-{}", std::process::id()));
            std::fs::create_dir_all(&dir).ok()?;
            let out = dir.join("libxpu_minimal.so");
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
            let ok = Command::new(cc)
                .args([
                    "-std=c11",
                    "-O2",
                    "-shared",
                    "-fPIC",
                    "-fvisibility=hidden",
                    "-pthread",
                ])
                .arg(format!(
                    "-I{}",
                    root.join("backends/plugin/include").display()
                ))
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .status()
                .ok()?
                .success();
            if !ok {
                return None;
            }
            use std::os::unix::fs::PermissionsExt;
            for p in [&dir, &out] {
                let mut perm = std::fs::metadata(p).ok()?.permissions();
                perm.set_mode(perm.mode() & !0o022);
                std::fs::set_permissions(p, perm).ok()?;
            }
            Some(out)
        })
        .clone()
}

/// One registry for the whole test process (devices are shared like an application's).
pub fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::new();
        r.register(Arc::new(HostBackend::new(HostConfig {
            devices: 4,
            capacity: 256 << 20,
        })))
        .unwrap();
        r.register(Arc::new(xpu_vulkan::VulkanBackend::new()))
            .unwrap();
        for lib in [sim_npu(), c_minimal()].into_iter().flatten() {
            match xpu_plugin::PluginBackend::load(&lib) {
                Ok(b) => r.register(Arc::new(b)).unwrap(),
                Err(e) => eprintln!("plugin {} not loaded: {e}", lib.display()),
            }
        }
        Mutex::new(r)
    })
}

/// The devices of `sel`, or `None` (with a note) when a backend it names is missing and
/// not required.
pub fn devices(sel: &str) -> Option<Vec<Device>> {
    let r = registry().lock().unwrap();
    let selector = DeviceSelector::parse(sel).unwrap();
    match r.devices(&selector) {
        Ok(d) => Some(d),
        Err(e) => {
            let missing: Vec<&str> = sel
                .split(';')
                .filter_map(|t| t.split(':').next())
                .filter(|b| is_required(b))
                .collect();
            assert!(
                missing.is_empty(),
                "{sel}: a required backend is missing ({missing:?}): {e}"
            );
            eprintln!("skipped {sel}: {e}");
            None
        }
    }
}

pub fn options(policy: Policy) -> SchedulerOptions {
    SchedulerOptions {
        policy,
        no_persist: true,
        ..SchedulerOptions::default()
    }
}

// --------------------------------------------------------------- random programs --

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One step of a random program.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// `c = a op b`.
    Binary(BinaryOp, usize, usize, usize),
    /// `dst op= src`, with `dst` accessed read-write, or as a reduction for the
    /// commutative max and min.
    Accumulate(BinaryOp, usize, usize, bool),
    /// `dst = src * 0.5`.
    Half(usize, usize),
    /// `dst = v`.
    Fill(usize, f32),
}

pub const ELEMS: usize = 517;

pub fn program(seed: u64, handles: usize, steps: usize) -> (Vec<Vec<f32>>, Vec<Step>) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let init = (0..handles)
        .map(|_| {
            (0..ELEMS)
                .map(|_| (rng.below(200) as f32 - 100.0) / 8.0)
                .collect()
        })
        .collect();
    let distinct = |rng: &mut Rng, k: usize| -> Vec<usize> {
        let mut v = Vec::new();
        while v.len() < k {
            let h = rng.below(handles);
            if !v.contains(&h) {
                v.push(h);
            }
        }
        v
    };
    let ops = [BinaryOp::Sum, BinaryOp::Max, BinaryOp::Min];
    let prog = (0..steps)
        .map(|_| match rng.below(10) {
            0..=2 => {
                let h = distinct(&mut rng, 3);
                Step::Binary(ops[rng.below(3)], h[0], h[1], h[2])
            }
            3..=5 => {
                let h = distinct(&mut rng, 2);
                let op = ops[rng.below(3)];
                // Max and min commute exactly: those may be reductions.
                let reduce = op != BinaryOp::Sum && rng.below(2) == 0;
                Step::Accumulate(op, h[0], h[1], reduce)
            }
            6..=8 => {
                let h = distinct(&mut rng, 2);
                Step::Half(h[0], h[1])
            }
            _ => Step::Fill(rng.below(handles), rng.below(16) as f32),
        })
        .collect();
    (init, prog)
}

pub fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The program run in order on one host device's stream, directly through the HAL.
pub fn reference(init: &[Vec<f32>], prog: &[Step]) -> Vec<Vec<u8>> {
    let device = {
        let r = registry().lock().unwrap();
        r.devices(&DeviceSelector::parse("host:3").unwrap())
            .unwrap()
            .remove(0)
    };
    let s = device.create_stream().unwrap();
    let bufs: Vec<_> = init
        .iter()
        .map(|v| {
            let a = device.allocate((v.len() * 4) as u64).unwrap();
            s.write(&a, &bytes(v)).unwrap();
            a
        })
        .collect();
    for step in prog {
        match *step {
            Step::Binary(op, a, b, c) => s
                .binary(op, DType::F32, &bufs[a], &bufs[b], &bufs[c])
                .unwrap(),
            Step::Accumulate(op, d, src, _) => {
                s.accumulate(op, DType::F32, &bufs[d], &bufs[src]).unwrap()
            }
            Step::Half(src, dst) => s.scale(&bufs[src], &bufs[dst], Scalar::F32(0.5)).unwrap(),
            Step::Fill(d, v) => s.fill(&bufs[d], Scalar::F32(v)).unwrap(),
        }
    }
    bufs.iter().map(|b| s.read(b).unwrap()).collect()
}

/// Submits one step of `prog` over `handles`.
pub fn submit_program(
    sched: &Scheduler,
    handles: &[xpu_scheduler::Handle],
    prog: &[Step],
) -> xpu_hal::Result<()> {
    for step in prog {
        let task = match *step {
            Step::Binary(op, a, b, c) => Task::new(&Codelet::from_builtin(Builtin::Binary {
                op,
                dtype: DType::F32,
            }))
            .read(handles[a])
            .read(handles[b])
            .write(handles[c]),
            Step::Accumulate(op, d, src, reduce) => {
                let mode = if reduce {
                    AccessMode::Reduce
                } else {
                    AccessMode::ReadWrite
                };
                Task::new(&Codelet::from_builtin(Builtin::Accumulate {
                    op,
                    dtype: DType::F32,
                }))
                .access(handles[d], mode)
                .read(handles[src])
            }
            Step::Half(src, dst) => Task::new(&Codelet::from_builtin(Builtin::Scale {
                alpha: Scalar::F32(0.5),
            }))
            .read(handles[src])
            .write(handles[dst]),
            Step::Fill(d, v) => Task::new(&Codelet::from_builtin(Builtin::Fill {
                value: Scalar::F32(v),
            }))
            .write(handles[d]),
        };
        sched.submit(task)?;
    }
    Ok(())
}

/// A handle per value of `init`, registered with `sched`.
pub fn register_all(sched: &Scheduler, init: &[Vec<f32>]) -> Vec<Handle> {
    init.iter()
        .map(|v| {
            sched
                .register(HostBuffer::from_bytes(&bytes(v)).unwrap())
                .unwrap()
        })
        .collect()
}
