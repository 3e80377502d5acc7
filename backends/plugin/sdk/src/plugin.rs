//! The traits a vendor implements: [`Plugin`], [`Device`], [`Stream`] and [`Event`].
//! Buffers and kernels are plain values ([`Plugin::Buffer`], [`Plugin::Kernel`]) that
//! the plugin reads back through [`Handle`]s.
//!
//! Every method may be called from any thread, concurrently with any other method on
//! other objects, so every type is `Send + Sync`. The SDK has checked the arguments
//! listed under "Guaranteed by the SDK" before it calls a method; the header's
//! guarantees from the host (ranges non-empty, dtypes supported, buffers not freed
//! while enqueued work uses them …) come on top.

use std::ffi::CStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::group::{GroupConfig, NewGroup};
use crate::handle::Handle;
use crate::host::{ExternalWait, HostDestination, HostSource};
use crate::ops::{Op, OpSupport};
use crate::types::{
    BufferRange, Builtin, DeviceProperties, Fault, KernelArg, KernelCode, LaunchDims, MemoryInfo,
};

/// The plugin: its name and version, and its devices. One value per process, made by
/// [`Plugin::new`] on the first call that needs it (`device_count` or `device_open`) and
/// kept until the process exits.
pub trait Plugin: Sized + Send + Sync + 'static {
    /// The plugin's name: `[a-z0-9_-]+`, checked when the crate is compiled. Its devices
    /// are `plugin.<NAME>:N`.
    const NAME: &'static CStr;

    /// The plugin's own version (for example its crate version).
    const VERSION: &'static CStr;

    /// Whether events carry timestamps: `event_elapsed` is in the table and
    /// [`Event::elapsed_since`] is called. Default: false.
    const EVENT_TIMING: bool = false;

    /// Whether devices load and launch kernels: `kernel_load`, `kernel_destroy` and
    /// `kernel_launch` are in the table. Default: false.
    const KERNELS: bool = false;

    /// Whether the devices have a collective library of their own (ABI 1.3):
    /// `group_create`, `group_run`, `group_abort` and `group_destroy` are in the table
    /// and [`Plugin::create_group`] is called. Default: false.
    const COLLECTIVES: bool = false;

    /// Whether the collective library's groups span processes (ABI 1.4; only with
    /// [`Plugin::COLLECTIVES`]): `group_id` is in the table, [`Plugin::group_id`] is
    /// called, and [`Plugin::create_group`] may be asked for a group across processes
    /// ([`GroupConfig::across`]). Default: false.
    const COLLECTIVES_ACROSS: bool = false;

    /// An open device.
    type Device: Device<Self>;
    /// A stream of a device.
    type Stream: Stream<Self>;
    /// An event recorded on a stream.
    type Event: Event;
    /// A buffer of device memory. Dropping it (when the host frees it and no enqueued
    /// work holds its [`Handle`] any more) releases the memory.
    type Buffer: Send + Sync + 'static;
    /// A loaded kernel; [`NoKernel`] for a plugin without kernels.
    type Kernel: Send + Sync + 'static;

    /// Makes the plugin: reads its configuration, finds its hardware. An error here is
    /// returned by every `device_count` and `device_open` call. A plugin whose hardware
    /// is absent should still succeed and report 0 devices, or fail with
    /// [`ErrorCode::Unavailable`](crate::ErrorCode::Unavailable) and the reason.
    fn new() -> Result<Self>;

    /// The number of devices. Must be cheap: the host calls it to list devices.
    fn device_count(&self) -> Result<u32>;

    /// Opens device `index` (any value: check it against your count). A host normally
    /// opens each index once; a second open of an index that is already open should
    /// either work independently or fail with a clear error.
    fn open_device(&self, index: u32) -> Result<Self::Device>;

    /// Makes a native collective communicator over `devices`, rank `r` on `devices[r]`
    /// (ABI 1.3; only called when [`Plugin::COLLECTIVES`] is true). Refuse devices the
    /// library cannot span with [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported)
    /// saying why: the host then runs its own algorithms. Default: `Unsupported`.
    ///
    /// With [`GroupConfig::across`] set (only when [`Plugin::COLLECTIVES_ACROSS`] is
    /// true), the group spans processes: this call is collective, returning once every
    /// rank of every process has joined, or failing with `Timeout` after the timeout.
    ///
    /// Guaranteed by the SDK: at least one device, all open devices of this plugin, none
    /// twice; across processes, one rank per device, distinct and below the size.
    fn create_group(
        &self,
        devices: &[&Self::Device],
        config: GroupConfig,
    ) -> Result<NewGroup<Self>> {
        let _ = config;
        Err(Error::unsupported(format!(
            "this plugin has no collective library of its own ({} devices were asked for); the host's own algorithms run",
            devices.len()
        )))
    }

    /// A fresh identifier of a group across processes, made with `device` (ABI 1.4;
    /// only called when [`Plugin::COLLECTIVES_ACROSS`] is true): 1 to
    /// [`XPU_GROUP_ID_MAX`](crate::abi::XPU_GROUP_ID_MAX) bytes that every process then
    /// passes to [`Plugin::create_group`]. Default: `Unsupported`.
    fn group_id(&self, device: &Self::Device) -> Result<Vec<u8>> {
        let _ = device;
        Err(Error::unsupported(
            "this plugin's collective library spans one process only",
        ))
    }
}

/// An open device. Dropping it closes it; the host has destroyed its streams, buffers,
/// events and kernels first (but work they enqueued may still hold [`Handle`]s).
pub trait Device<P: Plugin>: Send + Sync + 'static {
    /// The static properties; called once, when the device is opened.
    fn properties(&self) -> Result<DeviceProperties>;

    /// Extra capabilities as `key=value` strings (`peer_access=1`), shown in device
    /// listings and conformance reports. Called at most once per open device. Default:
    /// none.
    fn capabilities(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// The current memory use.
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// Allocates `size` bytes. Out of memory is
    /// [`ErrorCode::OutOfMemory`](crate::ErrorCode::OutOfMemory), and the device stays
    /// usable.
    ///
    /// Guaranteed by the SDK: `1 <= size <= max_allocation` (from
    /// [`Device::properties`]).
    fn allocate(&self, size: u64) -> Result<P::Buffer>;

    /// Creates a stream: an in-order queue of work.
    fn create_stream(&self) -> Result<P::Stream>;

    /// The standard operations the device provides, with their dtypes (ABI 1.1): the
    /// host sends [`Stream::run_op`] only these. Called once per open device. Kinds
    /// listed twice are merged; dtypes an operation is not defined on are ignored by
    /// the host. Default: none.
    fn ops(&self) -> Result<Vec<OpSupport>> {
        Ok(Vec::new())
    }

    /// Makes the device suffer `fault` from now on, for real, as the header's "fault
    /// injection" section describes (ABI 1.2; for testing only). For [`Fault::Lost`]:
    /// every later call on the device, its streams and its events fails with
    /// [`ErrorCode::DeviceLost`](crate::ErrorCode::DeviceLost) — memory info,
    /// allocations, stream creation, kernel loading, every enqueue, synchronize and
    /// query, event queries and waits —, work already enqueued and not yet run fails
    /// with it (it becomes the stream's failure), and the device never comes back.
    /// Dropping buffers, streams, events and kernels, and closing the device, keep
    /// working. Messages should say that the fault was injected. For
    /// [`Fault::Slow`]: every operation the device's streams run from now on (copies,
    /// builtins, standard operations, launches; work enqueued earlier and not yet
    /// started included) takes that much longer, spent where the work runs — never in
    /// the enqueueing call — and with unchanged results; a later `Slow` replaces the
    /// delay, a zero delay ends it, and a lost device stays lost.
    ///
    /// Refuse a fault the device cannot suffer with
    /// [`ErrorCode::Unsupported`](crate::ErrorCode::Unsupported), changing nothing.
    /// Default: `Unsupported`, for every fault.
    ///
    /// Guaranteed by the SDK: `fault` is a fault of this ABI version (an unknown number
    /// is refused with `Unsupported` before this is called).
    fn inject_fault(&self, fault: Fault) -> Result<()> {
        Err(Error::unsupported(format!(
            "this device has no fault injection (the fault `{fault}` was asked for); test failures on a device whose plugin implements it, such as the simulated NPU"
        )))
    }

    /// Loads a kernel (only called when [`Plugin::KERNELS`] is true). Default:
    /// `Unsupported`.
    ///
    /// Guaranteed by the SDK: the strings are UTF-8; the code is borrowed for the call.
    fn load_kernel(&self, code: KernelCode<'_>) -> Result<P::Kernel> {
        Err(Error::unsupported(format!(
            "this device cannot load kernels (format `{}` was given)",
            code.format
        )))
    }
}

/// An in-order queue of work on one device.
///
/// Work methods enqueue and return; work runs in enqueue order. Several threads may
/// call one stream at once: the order between them is the order in which the calls
/// take effect. Errors in checking the arguments are returned at once; failures of the
/// work itself are returned by the next [`Stream::synchronize`] or [`Stream::query`]
/// and by every event recorded after the failure (and then the stream is usable again).
///
/// Dropping the stream (`stream_destroy`) must let enqueued work finish, before
/// returning or in the background.
///
/// Every [`BufferRange`] is guaranteed by the SDK to lie within a buffer of this
/// stream's device. Keeping its [`Handle`] keeps the buffer alive.
pub trait Stream<P: Plugin>: Send + Sync + 'static {
    /// Enqueues a copy of host memory into `dst`.
    ///
    /// Guaranteed by the SDK: `src.len() == dst.length`.
    fn copy_host_to_device(&self, src: HostSource, dst: BufferRange<P::Buffer>) -> Result<()>;

    /// Enqueues a copy of `src` into host memory.
    ///
    /// Guaranteed by the SDK: `src.length == dst.len()`.
    fn copy_device_to_host(&self, src: BufferRange<P::Buffer>, dst: HostDestination) -> Result<()>;

    /// Enqueues a copy between two ranges of this device.
    ///
    /// Guaranteed by the SDK: equal lengths; disjoint.
    fn copy_device_to_device(
        &self,
        src: BufferRange<P::Buffer>,
        dst: BufferRange<P::Buffer>,
    ) -> Result<()>;

    /// Enqueues a builtin operation (see [`Builtin`] for what the SDK guarantees).
    fn builtin(&self, op: Builtin<P::Buffer>) -> Result<()>;

    /// Enqueues a kernel launch (only called when [`Plugin::KERNELS`] is true).
    /// Default: `Unsupported`.
    ///
    /// Guaranteed by the SDK: `kernel` was loaded on this stream's device; every grid
    /// and block dimension is at least 1. Guaranteed by the host: the arguments match
    /// the kernel's declared parameters, buffer arguments start at multiples of
    /// `kernel_arg_alignment`, and a written buffer overlaps no other argument.
    fn launch(
        &self,
        kernel: &Handle<P::Kernel>,
        dims: LaunchDims,
        args: Vec<KernelArg<P::Buffer>>,
    ) -> Result<()> {
        let _ = (kernel, dims, args);
        Err(Error::unsupported("this device cannot launch kernels"))
    }

    /// Enqueues a standard operation the device lists in [`Device::ops`] (ABI 1.1).
    /// Default: `Unsupported`.
    ///
    /// Guaranteed by the SDK: see [`Op`] and [`crate::Tensor`] (a known kind, its number
    /// of tensors, every range in bounds and exactly the bytes its layout spans).
    /// Guaranteed by the host: everything else the header lists (shapes, dtypes,
    /// parameters, overlaps). The plugin checks indices and labels when the work runs:
    /// one out of range fails the work, naming its position and value, before anything
    /// is written.
    fn run_op(&self, op: Op<P::Buffer>) -> Result<()> {
        Err(Error::unsupported(format!(
            "this device does not provide the standard operation {}",
            op.kind
        )))
    }

    /// Records an event at the current end of the stream.
    fn record_event(&self) -> Result<P::Event>;

    /// Makes later work wait until `event` (of any device of this plugin) completes. If
    /// the work before `event` failed, later work fails with `Aborted`.
    fn wait_event(&self, event: &Handle<P::Event>) -> Result<()>;

    /// Makes later work wait until an event of another backend completes (see
    /// [`ExternalWait`]; the SDK has taken care of the host's callbacks). If the
    /// outcome is an error, later work fails with it (it is `Aborted`). Returning an
    /// error refuses the wait: the SDK then releases the host's event without waiting.
    fn wait_external(&self, event: ExternalWait) -> Result<()>;

    /// Blocks until all enqueued work is done; returns the first failure since the last
    /// one reported.
    fn synchronize(&self) -> Result<()>;

    /// `Ok(true)` when all enqueued work is done, `Ok(false)` while some is pending; the
    /// first failure since the last one reported otherwise.
    fn query(&self) -> Result<bool>;
}

/// A point on a stream's timeline.
pub trait Event: Send + Sync + 'static {
    /// `Ok(true)` once the work before the event has finished, `Ok(false)` before; that
    /// work's failure if it failed.
    fn query(&self) -> Result<bool>;

    /// Blocks until the work before the event has finished or `timeout` has passed
    /// (`None`: no limit); [`ErrorCode::Timeout`](crate::ErrorCode::Timeout) if it ran
    /// out; that work's failure if it failed.
    fn wait(&self, timeout: Option<Duration>) -> Result<()>;

    /// The time from `earlier` to this event (only called when
    /// [`Plugin::EVENT_TIMING`] is true). Default: `Unsupported`.
    ///
    /// Guaranteed by the SDK: both events belong to the same device. Guaranteed by the
    /// host: both are complete.
    fn elapsed_since(&self, earlier: &Self) -> Result<Duration> {
        let _ = earlier;
        Err(Error::unsupported(
            "this device's events carry no timestamps",
        ))
    }
}

/// The kernel type of a plugin without kernels: no value of it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoKernel {}
