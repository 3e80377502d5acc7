//! The traits a backend implements. Code above the HAL never calls these directly: it
//! uses the validated handles ([`crate::Device`], [`crate::Stream`], [`crate::Event`]),
//! which check every argument and then call in here. A backend may therefore assume
//! what each method's docs list under "Guaranteed by the HAL".
//!
//! All traits are object safe; the HAL holds implementations as `Arc<dyn …>` /
//! `Box<dyn …>`, so a backend loaded at run time (a vendor plugin) fits exactly like
//! a built-in one.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::dtype::{BinaryOp, DType, Scalar};
use crate::error::Result;
use crate::event::ForeignEvent;
use crate::info::{DeviceInfo, MemoryInfo};
use crate::kernel::{KernelDesc, KernelImpl, LaunchDims, RawKernelArg};
use crate::memory::{HostSlice, RawAllocation, RawSlice};

/// Locks `m`, going on with the data of a holder that panicked: backends catch panics
/// at their boundaries and report them as errors, so the state behind a poisoned lock
/// is still the last one a completed operation left.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use crate::progress::{EventOutcome, StreamProgress};

/// Cheap facts about one device, from [`Backend::enumerate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The device's index within its backend.
    pub index: u32,
    /// Its name.
    pub name: String,
}

/// A family of devices (host, Vulkan, CUDA, one vendor plugin …).
///
/// Thread-safe. `enumerate` must be cheap and must not create devices; a backend that is
/// not present on this machine returns [`crate::Error::Unavailable`] from it and is then
/// simply listed with no devices.
pub trait Backend: Send + Sync {
    /// The registered name, used in device ids (`host`, `vulkan`, `plugin.simnpu`).
    fn name(&self) -> &str;

    /// The devices present, or `Unavailable` with the reason.
    fn enumerate(&self) -> Result<Vec<DeviceSummary>>;

    /// Creates device `index`. Called at most once per index per registry.
    ///
    /// Guaranteed by the HAL: `index` was listed by `enumerate`.
    fn create_device(&self, index: u32) -> Result<Arc<dyn DeviceImpl>>;

    /// Problems the backend's own checking has reported since it was created — for
    /// instance the Vulkan validation layer's messages when it is enabled. A conformance
    /// run treats any as a failure. The default reports none.
    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One device. Thread-safe; owned by the HAL's [`crate::Device`] handle.
pub trait DeviceImpl: Send + Sync {
    /// Static properties, read once when the device is created.
    fn info(&self) -> DeviceInfo;

    /// Current memory use.
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// Allocates `size` bytes. Dropping the last `Arc` releases them.
    ///
    /// Guaranteed by the HAL: `1 <= size <= capabilities.max_allocation`.
    fn allocate(&self, size: u64) -> Result<Arc<dyn RawAllocation>>;

    /// Reserves `reserve` bytes of addresses and backs the first `initial` of them with
    /// memory: a growable allocation, whose [`RawAllocation::size`] is the backed length
    /// and which [`RawAllocation::resize`] changes. Devices without virtual memory keep
    /// the default, which refuses.
    ///
    /// Guaranteed by the HAL: `capabilities.virtual_memory_granularity` is `Some(g)`;
    /// `reserve` and `initial` are multiples of `g`; `g <= initial <= reserve`.
    fn allocate_growable(&self, reserve: u64, initial: u64) -> Result<Arc<dyn RawAllocation>> {
        let _ = (reserve, initial);
        Err(crate::Error::unsupported(
            "this device has no virtual memory, so allocations cannot grow in place",
        ))
    }

    /// Registers host memory with the device so that its copies to and from it can move
    /// the bytes directly (page-locking it for DMA, importing it as a device buffer …),
    /// returning the registration, which undoes itself when dropped. `Ok(None)`: the
    /// device has nothing to register (the default), or cannot for this range; its copies
    /// then go as for any host memory. Streams find the registration with
    /// [`crate::HostMemory::pin`] on the slices they are given.
    ///
    /// Guaranteed by the HAL: `ptr` is valid for `len >= 1` bytes until the returned
    /// registration is dropped, and aligned to [`crate::HostMemory::PAGE`] with `len` a
    /// multiple of it when `len` is at least a page; each range is registered at most
    /// once per device.
    fn pin_host(&self, ptr: std::ptr::NonNull<u8>, len: usize) -> Result<Option<crate::Pin>> {
        let _ = (ptr, len);
        Ok(None)
    }

    /// Creates a stream.
    fn create_stream(&self) -> Result<Box<dyn StreamImpl>>;

    /// The backend's vendor collective library over `devices` (all of this backend,
    /// this device among them or not), rank `r` on `devices[r]`: `None` when the backend
    /// has none (the default), else the group or why it could not be made. See
    /// [`crate::group`].
    fn collective_group(
        &self,
        devices: &[crate::Device],
        config: crate::group::GroupConfig,
    ) -> Option<Result<Box<dyn crate::group::CollectiveGroup>>> {
        let _ = (devices, config);
        None
    }

    /// Whether the backend's vendor library makes groups that span processes
    /// ([`crate::group::collective_group_across`]). Default: false.
    fn collective_groups_across(&self) -> bool {
        false
    }

    /// A fresh identifier for a group across processes (`ncclGetUniqueId`): at most
    /// [`crate::group::GroupAcross::MAX_ID`] bytes. The default refuses.
    fn collective_group_id(&self) -> Result<Vec<u8>> {
        Err(crate::Error::unsupported(
            "this backend makes no collective groups across processes",
        ))
    }

    /// This process's part of a group across processes: `devices` (all of this
    /// backend) at the ranks `across` gives them; returns once every process has
    /// joined, or fails with a timeout after `config.timeout`. The default refuses.
    ///
    /// Guaranteed by the HAL: `across` was checked against `devices`
    /// ([`crate::group::GroupAcross::check`]).
    fn collective_group_across(
        &self,
        devices: &[crate::Device],
        across: &crate::group::GroupAcross,
        config: crate::group::GroupConfig,
    ) -> Result<Box<dyn crate::group::CollectiveGroup>> {
        let _ = (devices, across, config);
        Err(crate::Error::unsupported(
            "this backend makes no collective groups across processes",
        ))
    }

    /// Loads a kernel.
    ///
    /// Guaranteed by the HAL: the source's format is in `capabilities.kernel_formats`.
    fn load_kernel(&self, desc: &KernelDesc) -> Result<Arc<dyn KernelImpl>>;

    /// Makes the device fail as `fault` says, from now on and for real (every later
    /// call on it or its streams fails as a failed device would), so that what runs
    /// above — recovery, elastic training, conformance cases — can be tested. The
    /// default refuses: the backend has no fault injection.
    fn inject_fault(&self, fault: Fault) -> Result<()> {
        Err(crate::Error::unsupported(format!(
            "this backend cannot inject the fault {fault:?}; choose a host or sim-npu device to test failures on"
        )))
    }

    /// Runs the check named `check` of the contract beneath the HAL — for a plugin
    /// device, the C ABI of `xpu_plugin.h`, called through the plugin's own table —
    /// for the conformance suite's `abi` profile: `None` when the device has no such
    /// lower contract (the default: a backend the HAL calls directly), `Some(Err)` with
    /// what was wrong when the check fails (an unknown name included).
    fn abi_check(&self, check: &str) -> Option<std::result::Result<(), String>> {
        let _ = check;
        None
    }

    /// The device as `Any`, for code that knows the backend (benchmarks, tests).
    fn as_any(&self) -> &dyn Any;
}

/// A failure [`DeviceImpl::inject_fault`] makes a device suffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The device is lost: work queued on it fails, and every later allocation,
    /// stream, copy, operation, synchronisation and memory query returns
    /// [`crate::Error::DeviceLost`]. It does not come back.
    Lost,
    /// The device becomes a straggler: every operation its streams run from now on
    /// takes this much longer (replacing an earlier slowdown; zero ends it). Results
    /// do not change.
    Slow(Duration),
    /// The device runs at this percentage of its speed (1 to 100): every operation its
    /// streams run from now on takes `100 / percent` times as long as it does (replacing
    /// an earlier throttle; 100 ends it). Results do not change. Where [`Fault::Slow`]
    /// adds the same time to every operation, as a device of high latency would, this
    /// stretches each in proportion to its work, as a device of lower throughput would.
    Throttle(u32),
}

/// The faults injected into a device: one state a backend shares between the device
/// and its streams, checked wherever they start work.
#[derive(Debug)]
pub struct FaultState {
    /// The device's id, for messages.
    device: String,
    lost: std::sync::atomic::AtomicBool,
    /// Nanoseconds added to every operation ([`Fault::Slow`]).
    delay_ns: std::sync::atomic::AtomicU64,
    /// The percentage of its speed the device runs at ([`Fault::Throttle`]).
    speed_percent: std::sync::atomic::AtomicU32,
}

impl FaultState {
    /// The state of the healthy device `device` (its id, for messages).
    pub fn new(device: impl Into<String>) -> Arc<FaultState> {
        Arc::new(FaultState {
            device: device.into(),
            lost: std::sync::atomic::AtomicBool::new(false),
            delay_ns: std::sync::atomic::AtomicU64::new(0),
            speed_percent: std::sync::atomic::AtomicU32::new(100),
        })
    }

    /// Applies `fault` from now on.
    pub fn inject(&self, fault: Fault) {
        use std::sync::atomic::Ordering;
        match fault {
            Fault::Lost => self.lost.store(true, Ordering::Release),
            Fault::Slow(d) => self.delay_ns.store(
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Release,
            ),
            Fault::Throttle(percent) => self
                .speed_percent
                .store(percent.clamp(1, 100), Ordering::Release),
        }
    }

    /// Whether the device has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Acquire)
    }

    /// `DeviceLost` once the device has been lost.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(crate::Error::DeviceLost {
                device: self.device.clone(),
                message: "the device failed (an injected fault); use the other devices".into(),
            });
        }
        Ok(())
    }

    /// The time to add to each operation (zero unless the device is a straggler).
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Whether the device is throttled ([`Fault::Throttle`] below 100%): whether work
    /// needs timing for [`FaultState::stretch`].
    pub fn throttled(&self) -> bool {
        self.speed_percent
            .load(std::sync::atomic::Ordering::Acquire)
            < 100
    }

    /// The time to add to an operation that took `took` ([`Fault::Throttle`]: zero
    /// unless the device is throttled).
    pub fn stretch(&self, took: Duration) -> Duration {
        let percent = self
            .speed_percent
            .load(std::sync::atomic::Ordering::Acquire)
            .clamp(1, 100);
        took.mul_f64(f64::from(100 - percent) / f64::from(percent))
    }
}

/// A builtin operation, validated. Element counts are the slice lengths divided by the
/// dtype size.
///
/// Guaranteed by the HAL for every variant: every slice is on this stream's device, in
/// bounds, non-empty, aligned to and a whole number of its dtype's elements; the dtypes
/// are supported by the device; element counts agree; two slices of one operation are
/// either identical (same memory, offset and length) or disjoint.
#[derive(Debug, Clone)]
pub enum BuiltinOp {
    /// `dst[i] = value` (the dtype is the value's).
    Fill {
        /// Destination.
        dst: RawSlice,
        /// The value.
        value: Scalar,
    },
    /// `dst[i] = a[i] op b[i]`.
    Binary {
        /// The operator.
        op: BinaryOp,
        /// Element type of all three.
        dtype: DType,
        /// Left operand.
        a: RawSlice,
        /// Right operand.
        b: RawSlice,
        /// Destination (may be identical to `a` or `b`).
        dst: RawSlice,
    },
    /// `dst[i] = dst[i] op src[i]`.
    Accumulate {
        /// The operator.
        op: BinaryOp,
        /// Element type of both.
        dtype: DType,
        /// Accumulator.
        dst: RawSlice,
        /// Operand (may be identical to `dst`).
        src: RawSlice,
    },
    /// `dst[i] = src[i] * alpha` (the dtype is `alpha`'s).
    Scale {
        /// Factor.
        alpha: Scalar,
        /// Source.
        src: RawSlice,
        /// Destination (may be identical to `src`).
        dst: RawSlice,
    },
    /// `dst[i] = src[i] as dst_dtype`.
    Cast {
        /// Source.
        src: RawSlice,
        /// Source element type.
        src_dtype: DType,
        /// Destination (disjoint from `src`, or identical when the sizes agree).
        dst: RawSlice,
        /// Destination element type.
        dst_dtype: DType,
    },
}

/// One operation of a batch (see [`StreamImpl::batch`]), validated as the single call
/// would be.
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// A builtin operation (as [`StreamImpl::builtin`] receives it).
    Builtin(BuiltinOp),
    /// A kernel launch (as [`StreamImpl::launch`] receives it: the kernel's backend
    /// object is [`crate::Kernel::backend_kernel`], its description
    /// [`crate::Kernel::desc`]).
    Launch {
        /// The kernel, loaded on this stream's device.
        kernel: crate::Kernel,
        /// The launch dimensions.
        dims: LaunchDims,
        /// The arguments.
        args: Vec<RawKernelArg>,
    },
    /// A standard operation (as [`StreamImpl::run_op`] receives it).
    Op(Box<crate::ops::Op<crate::ops::RawTensor>>),
}

impl BatchOp {
    /// Enqueues it on `stream` by itself (`builtin` or `launch`).
    pub(crate) fn enqueue_alone<S: StreamImpl + ?Sized>(self, stream: &S) -> Result<()> {
        match self {
            BatchOp::Builtin(op) => stream.builtin(op),
            BatchOp::Launch { kernel, dims, args } => {
                stream.launch(kernel.backend_kernel(), kernel.desc(), dims, args)
            }
            BatchOp::Op(op) => stream.run_op(*op),
        }
    }
}

/// An in-order queue of work on one device. Thread-safe: several threads may enqueue
/// at once; the order between them is the order in which the calls take effect.
///
/// Errors of enqueued work are reported asynchronously: by the next
/// [`StreamImpl::synchronize`] or [`StreamImpl::query`] and by events recorded after
/// the failure. After reporting, the stream is usable again.
///
/// Contract on held resources: a backend keeps the `Arc`s it was given (memory, host
/// memory, kernels) until the operation completes, and drops them no later than the
/// moment `synchronize` returns or an event recorded after the operation completes.
pub trait StreamImpl: Send + Sync {
    /// Copies host bytes to the device. Guaranteed: `src.len == dst.len`.
    fn copy_host_to_device(&self, src: HostSlice, dst: RawSlice) -> Result<()>;

    /// Copies device bytes to the host. Guaranteed: `src.len == dst.len`.
    fn copy_device_to_host(&self, src: RawSlice, dst: HostSlice) -> Result<()>;

    /// Copies between two ranges of this device. Guaranteed: equal lengths; disjoint.
    fn copy_device_to_device(&self, src: RawSlice, dst: RawSlice) -> Result<()>;

    /// Copies from memory of another device of this backend to this stream's device.
    /// Called only when `capabilities.peer_access` is true; the default refuses.
    ///
    /// Guaranteed: equal lengths; `src` belongs to another device of this backend (same
    /// registry), `dst` to this stream's device.
    fn copy_peer(&self, src: RawSlice, dst: RawSlice) -> Result<()> {
        let _ = (src, dst);
        Err(crate::Error::unsupported(
            "this backend does not copy between its devices directly",
        ))
    }

    /// Enqueues a builtin operation.
    fn builtin(&self, op: BuiltinOp) -> Result<()>;

    /// Enqueues a standard operation ([`crate::ops`]). An error found while it runs
    /// (an index out of range) is the stream's, reported like any failed work.
    ///
    /// Guaranteed by the HAL: the device lists the operation for its dtype in
    /// `capabilities.ops`; [`crate::ops::check`] passed (shapes, dtypes, parameters,
    /// written tensors address each element once); every tensor is on this device, in
    /// bounds, non-empty, its `memory` spanning exactly what its layout addresses; a
    /// written tensor overlaps no other operand except an input it may be identical to
    /// ([`crate::ops::OpKind::in_place_pairs`]: same memory, offset and layout). The
    /// default refuses (a device that provides operations lists them and overrides this).
    fn run_op(&self, op: crate::ops::Op<crate::ops::RawTensor>) -> Result<()> {
        Err(crate::Error::unsupported(format!(
            "this device does not provide the standard operation {}",
            op.kind()
        )))
    }

    /// Enqueues a kernel launch.
    ///
    /// Guaranteed: `kernel` came from this device's `load_kernel`; `args` match the
    /// declared parameters; every buffer argument starts at a multiple of
    /// `capabilities.kernel_arg_alignment`; a writable buffer overlaps no other buffer
    /// argument; every dimension of `dims` is at least 1.
    fn launch(
        &self,
        kernel: &Arc<dyn KernelImpl>,
        desc: &KernelDesc,
        dims: LaunchDims,
        args: Vec<RawKernelArg>,
    ) -> Result<()>;

    /// Enqueues `ops` in order, with the semantics of enqueuing them one after another,
    /// as one submission where the backend can make one (one job, one command buffer):
    /// what a batch saves is the per-operation cost of submitting. Guaranteed: each
    /// operation as for [`StreamImpl::builtin`], [`StreamImpl::launch`] and
    /// [`StreamImpl::run_op`]. On an error
    /// the operations before the failing one may have been enqueued. The default
    /// enqueues them one by one.
    fn batch(&self, ops: Vec<BatchOp>) -> Result<()> {
        for op in ops {
            op.enqueue_alone(self)?;
        }
        Ok(())
    }

    /// Enqueues the operations of `kept` with its slots bound to `memory` (see
    /// [`crate::KeptBatch::bound`]), with the semantics of [`StreamImpl::batch`].
    /// Guaranteed: `kept` was validated for this stream's device; `memory` has one
    /// allocation per slot (`None` for a zero-size one), of the slot's size, on this
    /// device, none twice. The default binds them here and calls `batch`; a backend that
    /// can bind them where it runs them saves the submitting thread that work.
    fn batch_kept(
        &self,
        kept: &crate::KeptBatch,
        memory: Vec<Option<Arc<dyn crate::memory::RawAllocation>>>,
    ) -> Result<()> {
        let ops = kept.bound(&memory).collect::<Result<Vec<_>>>()?;
        self.batch(ops)
    }

    /// Records an event at the current end of the stream.
    fn record_event(&self) -> Result<Arc<dyn EventImpl>>;

    /// Makes later work wait for an event of the same backend (any of its devices).
    fn wait_event(&self, event: &Arc<dyn EventImpl>) -> Result<()>;

    /// Makes later work wait for an event of another backend, or a user event. The
    /// backend bridges on the host: it must not start later work before `event.wait()`
    /// would return, and fails that work if it returns an error.
    fn wait_foreign_event(&self, event: ForeignEvent) -> Result<()>;

    /// Blocks until all enqueued work is done; returns the first error since the last
    /// report.
    fn synchronize(&self) -> Result<()>;

    /// `Ok(true)` when all enqueued work is done, `Ok(false)` while some is pending; the
    /// first error since the last report otherwise.
    fn query(&self) -> Result<bool>;

    /// The stream as `Any`, for the owning backend's extensions (a vendor collective
    /// library enqueueing on the native stream) to downcast.
    fn as_any(&self) -> &dyn Any;
}

/// A point on a stream's timeline. Thread-safe.
pub trait EventImpl: Send + Sync {
    /// `Ok(true)` once the work before the event finished, `Ok(false)` before; the error
    /// of that work if it failed.
    fn query(&self) -> Result<bool>;

    /// Blocks until the work before the event finished (or `timeout` passed:
    /// [`crate::Error::Timeout`]); returns that work's error if it failed.
    fn wait(&self, timeout: Option<Duration>) -> Result<()>;

    /// Time from `earlier` to this event.
    ///
    /// Guaranteed by the HAL: both events are on this device and complete.
    fn elapsed_since(&self, earlier: &dyn EventImpl) -> Result<Duration>;

    /// The event as `Any`, for the owning backend to downcast.
    fn as_any(&self) -> &dyn Any;
}

#[cfg(test)]
mod tests {
    use super::{Fault, FaultState};
    use std::time::Duration;

    #[test]
    fn a_throttle_stretches_work_in_proportion_and_100_percent_ends_it() {
        let f = FaultState::new("host:0");
        let took = Duration::from_micros(300);
        assert_eq!(f.stretch(took), Duration::ZERO);
        f.inject(Fault::Throttle(50));
        assert!(f.throttled());
        assert_eq!(f.stretch(took), took);
        f.inject(Fault::Throttle(25));
        assert_eq!(f.stretch(took), took * 3);
        // A delay per operation is a separate knob, kept beside the throttle.
        f.inject(Fault::Slow(Duration::from_micros(7)));
        assert_eq!(
            (f.delay(), f.stretch(took)),
            (Duration::from_micros(7), took * 3)
        );
        f.inject(Fault::Throttle(100));
        assert!(!f.throttled());
        assert_eq!(f.stretch(took), Duration::ZERO);
        assert!(!f.is_lost());
    }
}
