//! # xpu-hal: the contract every accelerator meets
//!
//! xpu drives CUDA GPUs, Vulkan GPUs, vendor NPUs loaded as plugins, and the CPU through
//! one contract. This crate *is* that contract: the traits a backend implements, the
//! handles the layers above (memory pools, collectives, the scheduler, a training
//! framework) hold, the errors everybody matches on, and the registry that finds
//! devices.
//!
//! ## Two layers: handles above, traits below
//!
//! ```text
//!   memory / collectives / scheduler / framework
//!        |  Device, Stream, Event, Allocation, Kernel   (concrete, validated handles)
//!        v
//!   [ validation: bounds, ownership, dtype, sizes, aliasing ]   <- the one place
//!        |  Arc<dyn DeviceImpl>, Box<dyn StreamImpl>, Arc<dyn EventImpl>
//!        v
//!   backends: host, vulkan, cuda, plugin
//! ```
//!
//! The layers above use concrete handle types ([`Device`], [`Stream`], [`Event`],
//! [`Allocation`], [`Kernel`]). Each handle wraps an object-safe backend trait object
//! ([`backend::DeviceImpl`], [`backend::StreamImpl`], [`backend::EventImpl`]) and checks
//! every argument before calling it. We chose handles over handing out `Arc<dyn Trait>`
//! directly so that validation lives in exactly one place that no backend can skip or
//! get subtly different: a vendor's plugin, the Vulkan backend and the host backend all
//! reject an out-of-bounds copy with the same typed error and the same message. Each
//! trait method lists what the HAL guarantees before calling it ("Guaranteed by the
//! HAL"), and a backend may rely on exactly that and nothing more.
//!
//! Dispatch is dynamic. Calls are coarse — one per copy, per launch, per event — and a
//! virtual call costs nanoseconds next to the microseconds of device work behind it,
//! so there are no generics over backends above this crate. The benchmarks measure
//! that overhead against calling the host backend directly.
//!
//! ## Memory model
//!
//! Device memory is addressed as `(allocation, offset, length)` — a [`BufferSlice`] —
//! so that a pool can carve one large allocation into many tensors on every backend.
//! Allocations are reference-counted handles; [`Allocation::free`] releases memory
//! early, and using a freed allocation is an [`Error::InvalidArgument`], not undefined
//! behaviour. Enqueued work holds the memory it touches, so freeing never pulls memory
//! out from under queued work. Zero-size allocations are valid and need no backend
//! memory; operations on empty ranges are validated and then do nothing.
//!
//! Devices with virtual memory (capability `virtual_memory_granularity`) also make
//! *growable* allocations ([`Device::allocate_growable`]): a reserved address range whose
//! backed prefix [`Allocation::resize`] grows and shrinks in place, which is what lets a
//! memory pool grow a segment without copying. Devices that declare `peer_access` copy
//! from the memory of other devices of their backend directly ([`Stream::copy_peer`]);
//! everything else crosses devices through host buffers.
//!
//! Host memory for asynchronous copies is a [`HostBuffer`]. Its bytes can only be
//! touched while no enqueued operation holds it, which the type enforces at run time
//! (an error that says to synchronize first), so asynchronous copies are safe Rust.
//! [`Stream::write`] and [`Stream::read`] are blocking conveniences on top.
//!
//! ## Execution model
//!
//! A [`Stream`] is an in-order queue. Copies (host→device, device→host,
//! device→device), builtin operations, kernel launches, event records and event waits
//! all enqueue and return at once. An [`Event`] marks a point on a stream; any stream
//! of any device of *any backend* may wait on it ([`Stream::wait_event`]). Waits within
//! a backend are native (timeline semaphores, `cuStreamWaitEvent` …); waits across
//! backends are bridged on the host by the waiting backend, which holds later work until
//! the foreign event's `wait` returns. A [`UserEvent`] is completed or failed by the
//! application itself, and streams wait on it the same way. Failures of enqueued work are reported by the next
//! [`Stream::synchronize`] or [`Stream::query`] and by every event recorded after the
//! failure; the stream is usable again once the error has been reported.
//!
//! ## Builtin operations
//!
//! Every backend implements the same small set of elementwise operations
//! ([`backend::BuiltinOp`]), because the collectives and the scheduler must be able to
//! reduce, scale and convert data on any device without knowing its kernel language:
//! fill; `dst = a op b` and `dst op= src` for sum, prod, min and max; scale; and cast
//! between all [`DType`]s. The arithmetic rules (integer wrap-around, `f16`/`bf16`
//! computed in `f32`, NaN handling, saturating casts) are in [`dtype`]; the host
//! backend is the reference implementation and the conformance suite checks every
//! backend against an independent host computation.
//!
//! ## Kernels
//!
//! A [`KernelDesc`] carries a [`KernelSource`] in one of several formats (a host
//! function, SPIR-V, WGSL, PTX, a plugin's native format) together with the declared
//! parameters, so that launches are validated here whatever the format: argument count
//! and kinds, scalar dtypes, and no writable buffer overlapping another argument.
//!
//! ## Errors
//!
//! One small enum, [`Error`], whose variants are remedies rather than causes:
//! `InvalidArgument` (fix the call), `OutOfMemory` (free or shrink), `Unsupported`
//! (the device lacks a capability), `Unavailable` (the backend is not on this machine),
//! `DeviceLost`, `Timeout`, `Aborted` (earlier work failed, or a worker panicked) and
//! `Backend` (a backend-specific failure with its source chain). Each message says what
//! was asked, what was found and what to do. Nothing reachable from a public entry point
//! panics; a panic inside a backend worker thread is caught there and becomes an
//! `Aborted` error at the next call that reports the stream's work.
//!
//! ## Vendor collective libraries
//!
//! [`group`] lets a backend offer its vendor collective library (NCCL for CUDA) over a
//! set of its devices, in this process or across processes, so that the collectives
//! layer uses it without importing the backend. [`shm`] is a step exchange in POSIX
//! shared memory for parties in several processes of one machine, which the
//! collectives use between processes and the simulated NPU's library between its ranks.
//!
//! ## Reference arithmetic
//!
//! [`reference`] holds what each builtin computes, element by element, on plain slices:
//! the host backend runs its builtins with it, and code that must compute exactly what a
//! device computes uses it through the HAL, not through a backend.
//!
//! ## Finding devices
//!
//! A [`Registry`] holds [`backend::Backend`]s. Enumeration is cheap and cached; a backend
//! that is not present (no driver, no library) is [`Availability::Unavailable`] with the
//! reason and lists no devices — never a panic, never a hard error. Devices are created
//! lazily on first use and shared after that. [`DeviceSelector`] parses the
//! `host:0,1;vulkan:*` syntax used by `--devices` and `XPU_DEVICES`.
//!
//! ## Thread safety
//!
//! Every handle is `Send + Sync` and cheap to clone. Streams accept work from several
//! threads at once. Two streams that touch the same bytes without an event between them
//! race, as on any accelerator: order them with events.

pub mod backend;
mod device;
pub mod dtype;
mod error;
mod event;
pub mod group;
mod id;
mod info;
mod kept;
mod kernel;
mod memory;
pub mod ops;
mod progress;
pub mod reference;
mod registry;
pub mod shm;
mod stream;
mod units;
mod validate;

pub use device::{Device, Kernel};
pub use dtype::{BinaryOp, DType, Scalar};
pub use error::{Error, MessageError, Result};
pub use event::{Event, ForeignEvent, UserEvent};
pub use half::{bf16, f16};
pub use id::{DeviceId, DeviceSelector};
pub use info::{topology_keys, Capabilities, DeviceInfo, DeviceKind, MemoryInfo};
pub use kept::KeptBatch;
pub use kernel::{
    Access, HostArg, HostKernelContext, HostKernelFn, KernelArg, KernelDesc, KernelFormat,
    KernelImpl, KernelParam, KernelSource, LaunchDims, RawKernelArg,
};
pub use memory::{
    downcast_raw, Allocation, BufferSlice, HostBuffer, HostMemory, HostSlice, HostView, Pin,
    RawAllocation, RawSlice,
};
pub use registry::{Availability, BackendStatus, Registry};
pub use stream::{Batch, Stream};
pub use units::parse_bytes;
