//! The suite catches broken backends: the host backend wrapped with one deliberate
//! fault at a time must fail the cases about that behaviour (collectives cases included),
//! and the same wrapper with no fault must fail exactly the core cases the plain host
//! backend fails.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use xpu_conformance::{all_cases, run_cases, Expectations, Profile, RunOptions, Status};
use xpu_hal::backend::{Backend, BuiltinOp, DeviceImpl, DeviceSummary, EventImpl, StreamImpl};
use xpu_hal::ops::{Op, RawTensor, ReduceOp};
use xpu_hal::{
    BinaryOp, Device, DeviceInfo, DeviceSelector, HostSlice, KernelDesc, KernelImpl, LaunchDims,
    MemoryInfo, RawAllocation, RawKernelArg, RawSlice, Registry, Result,
};
use xpu_host::{HostBackend, HostConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Stream waits on events do nothing.
    IgnoreWaits,
    /// Events claim to be complete as soon as they are recorded.
    EventsAlwaysDone,
    /// Synchronize drops the errors of enqueued work.
    SwallowErrors,
    /// Fill leaves the last element of its range untouched.
    ShortFill,
    /// Min and max are exchanged.
    SwapMinMax,
    /// Device-to-device copies leave out their last byte.
    ShortDeviceCopy,
    /// memory_info always reports the whole device free.
    FrozenMemoryInfo,
    /// Capabilities claim a larger allocation than the device holds.
    OversizedMaxAllocation,
    /// Capabilities list no dtype (not a fault: a device without builtin operations).
    NoDtypes,
    /// Capabilities lack f64 (not a fault: a device without double precision).
    NoF64,
    /// Standard operations report success and do nothing.
    OpsDoNothing,
    /// Standard operations run with a parameter or a variant slightly wrong (GELU for
    /// ReLU, min for max, another seed, offset, eps, step or scale).
    OpsSlightlyWrong,
    /// Capabilities list no standard operation (not a fault: a device without them).
    NoOps,
}

struct FaultyBackend {
    inner: HostBackend,
    fault: Fault,
}

impl Backend for FaultyBackend {
    fn name(&self) -> &str {
        "faulty"
    }

    fn enumerate(&self) -> Result<Vec<DeviceSummary>> {
        self.inner.enumerate()
    }

    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>> {
        Ok(Arc::new(FaultyDevice {
            inner: self.inner.create_device(index)?,
            fault: self.fault,
        }))
    }
}

struct FaultyDevice {
    inner: Arc<dyn DeviceImpl>,
    fault: Fault,
}

impl DeviceImpl for FaultyDevice {
    fn info(&self) -> DeviceInfo {
        let mut info = self.inner.info();
        if self.fault == Fault::OversizedMaxAllocation {
            info.capabilities.max_allocation = info.memory_bytes * 2;
        }
        if self.fault == Fault::NoDtypes {
            info.capabilities.dtypes.clear();
        }
        if self.fault == Fault::NoOps {
            info.capabilities.ops.clear();
        }
        if self.fault == Fault::NoF64 {
            info.capabilities
                .dtypes
                .retain(|d| *d != xpu_hal::DType::F64);
        }
        info
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        let m = self.inner.memory_info()?;
        if self.fault == Fault::FrozenMemoryInfo {
            return Ok(MemoryInfo {
                total: m.total,
                free: m.total,
            });
        }
        Ok(m)
    }

    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>> {
        self.inner.allocate(size)
    }

    fn allocate_growable(&self, reserve: u64, initial: u64) -> Result<Arc<dyn RawAllocation>> {
        self.inner.allocate_growable(reserve, initial)
    }

    fn create_stream(&self) -> Result<Box<dyn StreamImpl>> {
        Ok(Box::new(FaultyStream {
            inner: self.inner.create_stream()?,
            fault: self.fault,
        }))
    }

    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>> {
        self.inner.load_kernel(desc)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct FaultyStream {
    inner: Box<dyn StreamImpl>,
    fault: Fault,
}

fn swap(op: BinaryOp) -> BinaryOp {
    match op {
        BinaryOp::Min => BinaryOp::Max,
        BinaryOp::Max => BinaryOp::Min,
        other => other,
    }
}

impl StreamImpl for FaultyStream {
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()> {
        self.inner.copy_host_to_device(src, dst)
    }

    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()> {
        self.inner.copy_device_to_host(src, dst)
    }

    fn copy_device_to_device(&self, mut src: RawSlice, mut dst: RawSlice) -> Result<()> {
        if self.fault == Fault::ShortDeviceCopy && src.len > 1 {
            src.len -= 1;
            dst.len -= 1;
        }
        self.inner.copy_device_to_device(src, dst)
    }

    fn copy_peer(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        self.inner.copy_peer(src, dst)
    }

    fn builtin(&self, op: BuiltinOp) -> Result<()> {
        let op = match (self.fault, op) {
            (Fault::ShortFill, BuiltinOp::Fill { mut dst, value }) => {
                let size = value.dtype().size() as u64;
                if dst.len > size {
                    dst.len -= size;
                }
                BuiltinOp::Fill { dst, value }
            }
            (
                Fault::SwapMinMax,
                BuiltinOp::Binary {
                    op,
                    dtype,
                    a,
                    b,
                    dst,
                },
            ) => BuiltinOp::Binary {
                op: swap(op),
                dtype,
                a,
                b,
                dst,
            },
            (
                Fault::SwapMinMax,
                BuiltinOp::Accumulate {
                    op,
                    dtype,
                    dst,
                    src,
                },
            ) => BuiltinOp::Accumulate {
                op: swap(op),
                dtype,
                dst,
                src,
            },
            (_, op) => op,
        };
        self.inner.builtin(op)
    }

    fn launch(
        &self,
        kernel: &Arc<dyn KernelImpl>,
        desc: &KernelDesc,
        dims: LaunchDims,
        args: Vec<RawKernelArg>,
    ) -> Result<()> {
        self.inner.launch(kernel, desc, dims, args)
    }

    fn run_op(&self, op: Op<RawTensor>) -> Result<()> {
        match self.fault {
            Fault::OpsDoNothing => Ok(()),
            Fault::OpsSlightlyWrong => self.inner.run_op(slightly_wrong(op)),
            _ => self.inner.run_op(op),
        }
    }

    fn record_event(&self) -> Result<Arc<dyn EventImpl>> {
        Ok(Arc::new(FaultyEvent {
            inner: self.inner.record_event()?,
            fault: self.fault,
        }))
    }

    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()> {
        if self.fault == Fault::IgnoreWaits {
            return Ok(());
        }
        let inner = event
            .as_any()
            .downcast_ref::<FaultyEvent>()
            .map(|e| e.inner.clone())
            .ok_or_else(|| xpu_hal::Error::invalid("not an event of the faulty backend"))?;
        self.inner.wait_event(&inner)
    }

    fn wait_foreign_event(&self, event: xpu_hal::ForeignEvent) -> Result<()> {
        if self.fault == Fault::IgnoreWaits {
            return Ok(());
        }
        self.inner.wait_foreign_event(event)
    }

    fn synchronize(&self) -> Result<()> {
        let result = self.inner.synchronize();
        if self.fault == Fault::SwallowErrors {
            return Ok(());
        }
        result
    }

    fn query(&self) -> Result<bool> {
        self.inner.query()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn slightly_wrong(op: Op<RawTensor>) -> Op<RawTensor> {
    match op {
        Op::Relu { x, y } => Op::Gelu { x, y },
        Op::Gelu { x, y } => Op::Relu { x, y },
        Op::ReluBackward { x, dy, dx } => Op::GeluBackward { x, dy, dx },
        Op::GeluBackward { x, dy, dx } => Op::ReluBackward { x, dy, dx },
        Op::Matmul {
            a,
            b,
            c,
            trans_a,
            trans_b,
            alpha,
            beta,
        } => Op::Matmul {
            a,
            b,
            c,
            trans_a,
            trans_b,
            alpha: alpha * 1.01,
            beta,
        },
        Op::Reduce { x, y, op, axis } => Op::Reduce {
            x,
            y,
            op: match op {
                ReduceOp::Max => ReduceOp::Min,
                ReduceOp::Min => ReduceOp::Max,
                ReduceOp::Sum => ReduceOp::Mean,
                ReduceOp::Mean => ReduceOp::Sum,
            },
            axis,
        },
        Op::Random {
            y,
            dist,
            seed,
            offset,
        } => Op::Random {
            y,
            dist,
            seed,
            offset: offset.wrapping_add(1),
        },
        Op::Dropout {
            x,
            y,
            p,
            seed,
            offset,
        } => Op::Dropout {
            x,
            y,
            p,
            seed: seed ^ 1,
            offset,
        },
        Op::LayerNorm {
            x,
            gamma,
            beta,
            y,
            mean,
            rstd,
            eps,
        } => Op::LayerNorm {
            x,
            gamma,
            beta,
            y,
            mean,
            rstd,
            eps: eps + 0.05,
        },
        Op::AdamW {
            param,
            grad,
            m,
            v,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step,
        } => Op::AdamW {
            param,
            grad,
            m,
            v,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step: step + 1,
        },
        Op::SgdMomentum {
            param,
            grad,
            velocity,
            lr,
            momentum,
            weight_decay,
            nesterov,
        } => Op::SgdMomentum {
            param,
            grad,
            velocity,
            lr,
            momentum,
            weight_decay,
            nesterov: !nesterov,
        },
        other => other,
    }
}

struct FaultyEvent {
    inner: Arc<dyn EventImpl>,
    fault: Fault,
}

impl EventImpl for FaultyEvent {
    fn query(&self) -> Result<bool> {
        if self.fault == Fault::EventsAlwaysDone {
            return Ok(true);
        }
        self.inner.query()
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.inner.wait(timeout)
    }

    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration> {
        let earlier = earlier
            .as_any()
            .downcast_ref::<FaultyEvent>()
            .ok_or_else(|| xpu_hal::Error::invalid("not an event of the faulty backend"))?;
        self.inner.elapsed_since(&*earlier.inner)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn faulty_devices(fault: Fault) -> Result<Vec<Device>> {
    let mut registry = Registry::new();
    registry.register(Arc::new(FaultyBackend {
        inner: HostBackend::new(config()),
        fault,
    }))?;
    registry.devices(&DeviceSelector::parse("*")?)
}

fn plain_devices() -> Result<Vec<Device>> {
    let mut registry = Registry::new();
    registry.register(Arc::new(HostBackend::new(config())))?;
    registry.devices(&DeviceSelector::parse("*")?)
}

fn config() -> HostConfig {
    HostConfig {
        devices: 2,
        capacity: 128 << 20,
    }
}

/// Runs the cases named in `only` (every core case when empty) on `devices` and returns
/// the names of the failed ones.
fn failed_cases(devices: &[Device], only: &[&str]) -> Vec<String> {
    let mut options = RunOptions::new(Profile::Core);
    options.expectations = Expectations::none();
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| {
            if only.is_empty() {
                c.profile == Profile::Core
            } else {
                only.contains(&c.name)
            }
        })
        .collect();
    let report = run_cases(&cases, devices, &options, |_| {});
    let mut failed: Vec<String> = report
        .results
        .iter()
        .filter(|r| r.status == Status::Fail)
        .map(|r| r.case.clone())
        .collect();
    failed.sort();
    failed.dedup();
    failed
}

/// Each case in `expected` fails on the faulty devices and passes on plain host devices.
fn assert_caught(fault: Fault, expected: &[&str]) {
    let (faulty, plain) = (faulty_devices(fault), plain_devices());
    assert!(
        faulty.is_ok() && plain.is_ok(),
        "the backends could not be set up"
    );
    let with_fault = failed_cases(&faulty.unwrap_or_default(), expected);
    let without = failed_cases(&plain.unwrap_or_default(), expected);
    for case in expected {
        assert!(
            !without.iter().any(|f| f == case),
            "case {case} fails on the plain host backend too, so it proves nothing about fault {fault:?}"
        );
        assert!(
            with_fault.iter().any(|f| f == case),
            "with fault {fault:?}, case {case} should fail; failed: {with_fault:?}"
        );
    }
}

#[test]
fn without_a_fault_the_wrapper_fails_what_the_host_fails() {
    let wrapped = failed_cases(&faulty_devices(Fault::None).unwrap(), &[]);
    let plain = failed_cases(&plain_devices().unwrap(), &[]);
    assert_eq!(wrapped, plain);
}

#[test]
fn ignored_waits_are_caught() {
    assert_caught(
        Fault::IgnoreWaits,
        &["event.cross_stream", "event.cross_device"],
    );
}

#[test]
fn events_that_complete_early_are_caught() {
    assert_caught(Fault::EventsAlwaysDone, &["event.query_pending"]);
}

#[test]
fn swallowed_errors_are_caught() {
    assert_caught(
        Fault::SwallowErrors,
        &[
            "kernel.error_at_synchronize",
            "kernel.panic_becomes_error",
            "event.failed_work",
        ],
    );
}

#[test]
fn short_fills_are_caught() {
    assert_caught(
        Fault::ShortFill,
        &["fill.every_dtype", "stream.order_builtin"],
    );
}

#[test]
fn swapped_min_max_is_caught() {
    assert_caught(
        Fault::SwapMinMax,
        &[
            "binary.min",
            "binary.max",
            "accumulate.min",
            "accumulate.max",
            "ops.nan_min_max",
            "collectives.allreduce_self",
            "collectives.reduce_backend",
        ],
    );
}

#[test]
fn short_device_copies_are_caught() {
    assert_caught(
        Fault::ShortDeviceCopy,
        &[
            "copy.d2d_offsets",
            "memory.free_in_flight",
            "event.cross_stream",
            "collectives.broadcast_self",
        ],
    );
}

#[test]
fn frozen_memory_info_is_caught() {
    assert_caught(
        Fault::FrozenMemoryInfo,
        &["memory.accounting", "memory.growable_accounting"],
    );
}

#[test]
fn oversized_max_allocation_is_caught() {
    assert_caught(Fault::OversizedMaxAllocation, &["device.properties"]);
}

/// Runs the collectives cases named in `only` on `devices` and returns each one's status
/// and reason.
fn collectives_results(devices: &[Device], only: &[&str]) -> Vec<(String, Status, String)> {
    let mut options = RunOptions::new(Profile::Collectives);
    options.expectations = Expectations::none();
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| only.contains(&c.name))
        .collect();
    run_cases(&cases, &devices[..1], &options, |_| {})
        .results
        .into_iter()
        .map(|r| (r.case, r.status, r.reason.unwrap_or_default()))
        .collect()
}

#[test]
fn collectives_skip_reductions_a_device_cannot_do_and_still_move_data() {
    let devices = faulty_devices(Fault::NoDtypes).unwrap();
    let results = collectives_results(
        &devices,
        &["collectives.allreduce_self", "collectives.broadcast_self"],
    );
    assert_eq!(results.len(), 2, "{results:?}");
    let (_, status, reason) = &results[0];
    assert_eq!(*status, Status::Skip, "{reason}");
    assert!(
        reason.contains("no dtype is supported by every rank")
            && reason.contains("faulty:0 lacks f32, f64"),
        "{reason}"
    );
    assert_eq!(results[1].1, Status::Pass, "{}", results[1].2);

    // Without f64, integer averages (computed through f64) are left out; the rest runs.
    let devices = faulty_devices(Fault::NoF64).unwrap();
    let results = collectives_results(&devices, &["collectives.reduce_self"]);
    assert_eq!(results[0].1, Status::Pass, "{}", results[0].2);
}

/// Runs the training cases named in `only` on the first of `devices`.
fn training_results(devices: &[Device], only: &[&str]) -> Vec<(String, Status, String)> {
    let mut options = RunOptions::new(Profile::Training);
    options.expectations = Expectations::none();
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.profile == Profile::Training && (only.is_empty() || only.contains(&c.name)))
        .collect();
    run_cases(&cases, &devices[..1], &options, |_| {})
        .results
        .into_iter()
        .map(|r| (r.case, r.status, r.reason.unwrap_or_default()))
        .collect()
}

const TRAINING_OPS: &[&str] = &[
    "training.matmul",
    "training.bias_add",
    "training.relu",
    "training.relu_backward",
    "training.gelu",
    "training.gelu_backward",
    "training.softmax",
    "training.softmax_backward",
    "training.cross_entropy",
    "training.cross_entropy_backward",
    "training.layer_norm",
    "training.layer_norm_backward",
    "training.gather",
    "training.scatter_add",
    "training.reduce",
    "training.sgd_momentum",
    "training.adamw",
    "training.random",
    "training.dropout",
];

#[test]
fn operations_that_claim_success_and_do_nothing_fail_every_training_case() {
    let results = training_results(&faulty_devices(Fault::OpsDoNothing).unwrap(), TRAINING_OPS);
    assert_eq!(results.len(), TRAINING_OPS.len());
    for (case, status, reason) in &results {
        assert_eq!(*status, Status::Fail, "{case} did not fail: {reason}");
    }
    // The wrapper without a fault passes them all (so the failures are the fault's).
    let plain = training_results(&faulty_devices(Fault::None).unwrap(), &[]);
    assert!(plain.len() > TRAINING_OPS.len());
    for (case, status, reason) in plain {
        assert_eq!(status, Status::Pass, "{case}: {reason}");
    }
}

#[test]
fn slightly_wrong_operations_are_caught() {
    let wrong = [
        "training.matmul",
        "training.relu",
        "training.relu_backward",
        "training.gelu",
        "training.gelu_backward",
        "training.reduce",
        "training.random",
        "training.dropout",
        "training.layer_norm",
        "training.adamw",
        "training.sgd_momentum",
    ];
    let results = training_results(&faulty_devices(Fault::OpsSlightlyWrong).unwrap(), &wrong);
    assert_eq!(results.len(), wrong.len());
    for (case, status, reason) in results {
        assert_eq!(
            status,
            Status::Fail,
            "{case} did not catch the fault: {reason}"
        );
    }
}

#[test]
fn operations_a_device_does_not_list_are_skipped_by_name() {
    let results = training_results(&faulty_devices(Fault::NoOps).unwrap(), TRAINING_OPS);
    assert_eq!(results.len(), TRAINING_OPS.len());
    for (case, status, reason) in results {
        assert_eq!(status, Status::Skip, "{case}: {reason}");
        assert!(
            reason.contains("does not list the standard operation"),
            "{case}: {reason}"
        );
    }
}
