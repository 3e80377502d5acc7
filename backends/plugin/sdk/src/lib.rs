//! # xpu-plugin-sdk: write an xpu vendor plugin in Rust
//!
//! xpu loads vendor accelerators as plugins: shared libraries that export one symbol,
//! `xpu_plugin_get_api`, returning a table of C functions defined by the header
//! `xpu_plugin.h` (in `backends/plugin/include/`; it is the normative text). This
//! crate lets a vendor write such a library in safe Rust: implement four traits, call
//! one macro, build a `cdylib`.
//!
//! ```text
//!   host (xpu, the loader)                        your crate
//!   ─────────────────────                         ──────────
//!   dlopen + xpu_plugin_get_api ──► export_plugin!(MyPlugin)   (entry + static table)
//!   table->copy_host_to_device  ──► export: catch_unwind, struct_size, handles, checks
//!                                         └──► <MyStream as Stream<MyPlugin>>::copy_host_to_device
//!   error_code / error_destroy  ◄── Error::into_raw (a heap object the host frees)
//! ```
//!
//! ## The pieces
//!
//! - [`abi`]: the header's types, field for field (`tests/layout.rs` proves it by
//!   compiling the header with the system C compiler). A Rust host uses them too.
//! - [`Plugin`], [`Device`], [`Stream`], [`Event`]: the traits a vendor implements.
//!   Buffers and kernels are plain associated types ([`Plugin::Buffer`],
//!   [`Plugin::Kernel`]). Each method lists what the SDK has checked before calling it.
//! - [`export_plugin!`]: generates the entry point and a static function table whose
//!   every function is the SDK's generic implementation for your [`Plugin`].
//! - [`Error`] / [`ErrorCode`]: what a method returns when it fails.
//! - [`Handle`]: how the plugin sees its buffers, events and kernels in arguments —
//!   reference-counted, so enqueued work can keep them.
//! - [`HostSource`], [`HostDestination`], [`ExternalWait`]: what the host lends for
//!   copies and cross-backend waits.
//! - [`Op`], [`OpKind`], [`OpSupport`]: the standard operations of ABI 1.1, which a
//!   device lists with [`Device::ops`] and runs with [`Stream::run_op`] (both optional;
//!   the defaults provide none).
//! - [`Fault`] and [`Device::inject_fault`]: fault injection of ABI 1.2, for testing
//!   what runs above a plugin against a device that is lost or slows down at a chosen
//!   moment (optional; the default refuses with `Unsupported`).
//! - [`Group`], [`Plugin::create_group`] and [`Plugin::COLLECTIVES`]: native
//!   collectives of ABI 1.3, for devices whose vendor ships a collective library
//!   (optional; off by default, and then the functions are absent from the table).
//!
//! ## What the SDK does at the boundary, so that the plugin does not have to
//!
//! - **Panics never cross into C.** Every entry point runs under `catch_unwind`; a panic
//!   becomes an error object with code `XPU_ERROR_INTERNAL` and the panic message. (The
//!   library must be built with `panic = "unwind"`, the default; with `abort` there is
//!   nothing to catch.) Work a plugin runs on its own threads should catch its panics
//!   too, and report them as `Aborted` through the stream ([`Error::from_panic`]).
//! - **Errors are heap objects.** An `Err` returned by a trait method is moved into an
//!   object the host reads with `error_code`/`error_message` and frees with
//!   `error_destroy`, once.
//! - **`struct_size` is honoured both ways.** A NULL argument struct, or one whose
//!   `struct_size` is below its `MIN_SIZE` (its size in ABI 1.0), is refused with
//!   `XPU_ERROR_INVALID_ARGUMENT` naming the struct and both sizes. Only the bytes
//!   within `struct_size` are read (fields beyond it read as zero), and an output field
//!   is written only if it lies within it. A larger struct from a newer host is fine.
//! - **Versions are negotiated.** The entry point returns the table to a host of ABI
//!   major version 1 with any minor version, and NULL to anything else (another major,
//!   or a NULL or truncated `xpu_host_info`).
//! - **Handles are boxed objects.** Every `xpu_device*`, `xpu_stream*`, `xpu_buffer*`,
//!   `xpu_event*` and `xpu_kernel*` is a heap object made around the plugin's value,
//!   tagged with its kind, so NULL and wrong-kind pointers are refused with
//!   `INVALID_ARGUMENT`. Buffers, events and kernels are reference-counted: a stream
//!   that keeps a [`Handle`] for enqueued work keeps the object alive after the host
//!   frees it, which makes "destroy the event while a stream still waits on it" safe.
//! - **Cheap checks are repeated.** Ranges lie within their buffers and on the stream's
//!   device; builtin operands are element-aligned, agree in element count and are
//!   identical or disjoint; enum values are known; launch dimensions are at least 1.
//!   The host has checked all of this already (the header allows a plugin to rely on
//!   it); checking again costs a few comparisons and means a faulty host cannot drive a
//!   safe-Rust plugin out of bounds.
//! - **External events are waited for on a plugin thread.** For `stream_wait_external`
//!   the SDK starts a thread that calls the host's `wait` exactly once and then
//!   `release` exactly once; the stream receives an [`ExternalWait`] that completes
//!   with the outcome, after `release` has returned (so a host that sees the stream's
//!   later work done knows the event was given back). Ownership of the event passes with the call, as the header
//!   says: if the call fails (a bad stream, or the stream refuses the wait), the SDK
//!   calls `release` once and never `wait`. Only a struct the SDK cannot read (NULL, or
//!   `struct_size` below its `MIN_SIZE`) leaves the event with the host.
//! - **Strings live as long as the header says.** Device properties and capability
//!   strings are copied into C strings owned by the device handle, valid until the
//!   device is closed; error messages until the error is destroyed; the name and
//!   version are `'static`.
//!
//! What stays the plugin's job: host memory lent to a copy may only be touched while
//! the copy is outstanding (the accessors are `unsafe` for that reason, see
//! [`HostSource`]); streams run work in order and report failures asynchronously; a
//! destroyed stream lets its work finish.
//!
//! ## A minimal plugin
//!
//! A device whose streams run every operation at once, on the calling thread (a real
//! plugin enqueues; see the `xpu-sim-npu` crate for one with a worker thread per
//! stream, a memory arena, latency and bandwidth simulation, and a kernel format):
//!
//! ```
//! use std::ffi::CStr;
//! use std::sync::Mutex;
//! use std::time::Duration;
//! use xpu_plugin_sdk::{
//!     Builtin, BufferRange, DType, Device, DeviceKind, DeviceProperties, Error, Event,
//!     ExternalWait, Handle, HostDestination, HostSource, MemoryInfo, NoKernel, Plugin,
//!     Result, Stream,
//! };
//!
//! struct Tiny;
//! struct TinyDevice;
//! struct TinyStream;
//! struct TinyEvent;
//! struct TinyBuffer(Mutex<Vec<u8>>);
//!
//! impl Plugin for Tiny {
//!     const NAME: &'static CStr = c"tiny";
//!     const VERSION: &'static CStr = c"0.1.0";
//!     type Device = TinyDevice;
//!     type Stream = TinyStream;
//!     type Event = TinyEvent;
//!     type Buffer = TinyBuffer;
//!     type Kernel = NoKernel;
//!
//!     fn new() -> Result<Self> {
//!         Ok(Tiny)
//!     }
//!     fn device_count(&self) -> Result<u32> {
//!         Ok(1)
//!     }
//!     fn open_device(&self, index: u32) -> Result<TinyDevice> {
//!         match index {
//!             0 => Ok(TinyDevice),
//!             _ => Err(Error::invalid_argument(format!("tiny has 1 device, not {}", index + 1))),
//!         }
//!     }
//! }
//!
//! impl Device<Tiny> for TinyDevice {
//!     fn properties(&self) -> Result<DeviceProperties> {
//!         Ok(DeviceProperties {
//!             name: "tiny device".into(),
//!             vendor: "example".into(),
//!             driver: "0.1.0".into(),
//!             kind: DeviceKind::Other,
//!             dtypes: vec![DType::U8],
//!             memory_bytes: 1 << 20,
//!             max_allocation: 1 << 20,
//!             kernel_arg_alignment: 1,
//!             timeline_events: false,
//!             event_timing: false,
//!             kernel_format: None,
//!         })
//!     }
//!     fn memory_info(&self) -> Result<MemoryInfo> {
//!         Ok(MemoryInfo { total: 1 << 20, free: 1 << 20 })
//!     }
//!     fn allocate(&self, size: u64) -> Result<TinyBuffer> {
//!         Ok(TinyBuffer(Mutex::new(vec![0; size as usize])))
//!     }
//!     fn create_stream(&self) -> Result<TinyStream> {
//!         Ok(TinyStream)
//!     }
//! }
//!
//! fn bytes(r: &BufferRange<TinyBuffer>) -> Result<std::sync::MutexGuard<'_, Vec<u8>>> {
//!     r.buffer.0.lock().map_err(|_| Error::internal("poisoned"))
//! }
//!
//! impl Stream<Tiny> for TinyStream {
//!     fn copy_host_to_device(&self, src: HostSource, dst: BufferRange<TinyBuffer>) -> Result<()> {
//!         let (start, end) = (dst.offset as usize, dst.end() as usize);
//!         // SAFETY: the copy runs inside this call, before the host can see it complete.
//!         bytes(&dst)?[start..end].copy_from_slice(unsafe { src.as_slice() });
//!         Ok(())
//!     }
//!     fn copy_device_to_host(&self, src: BufferRange<TinyBuffer>, mut dst: HostDestination) -> Result<()> {
//!         let (start, end) = (src.offset as usize, src.end() as usize);
//!         // SAFETY: as above.
//!         unsafe { dst.as_mut_slice() }.copy_from_slice(&bytes(&src)?[start..end]);
//!         Ok(())
//!     }
//!     fn copy_device_to_device(&self, _: BufferRange<TinyBuffer>, _: BufferRange<TinyBuffer>) -> Result<()> {
//!         Err(Error::unsupported("not in this example"))
//!     }
//!     fn builtin(&self, _: Builtin<TinyBuffer>) -> Result<()> {
//!         Err(Error::unsupported("not in this example"))
//!     }
//!     fn record_event(&self) -> Result<TinyEvent> {
//!         Ok(TinyEvent)
//!     }
//!     fn wait_event(&self, _: &Handle<TinyEvent>) -> Result<()> {
//!         Ok(())
//!     }
//!     fn wait_external(&self, event: ExternalWait) -> Result<()> {
//!         event.wait() // a real stream holds later work instead of blocking the caller
//!     }
//!     fn synchronize(&self) -> Result<()> {
//!         Ok(())
//!     }
//!     fn query(&self) -> Result<bool> {
//!         Ok(true)
//!     }
//! }
//!
//! impl Event for TinyEvent {
//!     fn query(&self) -> Result<bool> {
//!         Ok(true)
//!     }
//!     fn wait(&self, _: Option<Duration>) -> Result<()> {
//!         Ok(())
//!     }
//! }
//!
//! // In the library: `xpu_plugin_sdk::export_plugin!(Tiny);` exports
//! // `xpu_plugin_get_api`. Here, an entry under another name:
//! xpu_plugin_sdk::export_plugin!(Tiny as tiny_get_api);
//!
//! let host = xpu_plugin_sdk::abi::xpu_host_info {
//!     struct_size: std::mem::size_of::<xpu_plugin_sdk::abi::xpu_host_info>(),
//!     extensions: std::ptr::null(),
//!     abi_major: 1,
//!     abi_minor: 0,
//! };
//! // SAFETY: `host` is a valid host info for the call.
//! let api = unsafe { &*tiny_get_api(&host) };
//! // SAFETY: the name is a static C string.
//! assert_eq!(unsafe { CStr::from_ptr(api.name) }, c"tiny");
//! ```
//!
//! Build it as a `cdylib` (`crate-type = ["cdylib"]`, or `["cdylib", "rlib"]` to test
//! it from Rust as well); `docs/plugin-guide.md` walks through building, loading and
//! certifying it with `xpu conformance`.

pub mod abi;
mod error;
pub mod export;
mod group;
mod handle;
mod host;
mod ops;
mod plugin;
mod types;

pub use error::{
    error_code, error_destroy, error_message, panic_message, take_raw, Error, ErrorCode, Result,
};
pub use group::{CollectiveOp, Group, GroupAcross, GroupCall, GroupConfig, GroupPart, NewGroup};
pub use handle::Handle;
pub use host::{ExternalSignal, ExternalWait, HostDestination, HostSource};
pub use ops::{Distribution, Op, OpKind, OpParams, OpSupport, ReduceOp, Tensor};
pub use plugin::{Device, Event, NoKernel, Plugin, Stream};
pub use types::{
    Access, BinaryOp, BufferRange, Builtin, DType, DeviceKind, DeviceProperties, Fault, KernelArg,
    KernelCode, LaunchDims, MemoryInfo, Scalar,
};

/// Exports a [`Plugin`] as an xpu plugin library.
///
/// `export_plugin!(MyPlugin)` defines, in the calling module,
///
/// ```text
/// #[no_mangle]
/// pub unsafe extern "C" fn xpu_plugin_get_api(host: *const xpu_host_info) -> *const xpu_plugin_api
/// ```
///
/// — the symbol the host looks up — returning a static table whose functions are the
/// SDK's implementations for `MyPlugin` (see the [crate docs](crate) for what they do),
/// or NULL for a host of another ABI major version. It also checks at compile time that
/// [`Plugin::NAME`] matches `[a-z0-9_-]+`. Use it once per library.
///
/// `export_plugin!(MyPlugin as my_entry)` defines the same function under the name
/// `my_entry`, without exporting it as the ABI symbol: for tests, and for programs that
/// link a plugin statically and hand its table to a Rust host.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        /// The xpu plugin entry point (`XPU_PLUGIN_ENTRY_SYMBOL`): the function table
        /// for a host of ABI major version 1, or NULL.
        ///
        /// # Safety
        /// `host` is NULL or points to an `xpu_host_info` of at least its `struct_size`
        /// bytes, valid for the call.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xpu_plugin_get_api(
            host: *const $crate::abi::xpu_host_info,
        ) -> *const $crate::abi::xpu_plugin_api {
            $crate::__plugin_entry_body!($plugin, host)
        }
    };
    ($plugin:ty as $name:ident) => {
        /// An xpu plugin entry point: the function table for a host of ABI major
        /// version 1, or NULL.
        ///
        /// # Safety
        /// `host` is NULL or points to an `xpu_host_info` of at least its `struct_size`
        /// bytes, valid for the call.
        pub unsafe extern "C" fn $name(
            host: *const $crate::abi::xpu_host_info,
        ) -> *const $crate::abi::xpu_plugin_api {
            $crate::__plugin_entry_body!($plugin, host)
        }
    };
}

/// The body shared by both forms of [`export_plugin!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __plugin_entry_body {
    ($plugin:ty, $host:ident) => {{
        const _: () = ::std::assert!(
            $crate::export::valid_name(<$plugin as $crate::Plugin>::NAME),
            "Plugin::NAME must match [a-z0-9_-]+"
        );
        static CAPABILITIES: $crate::abi::xpu_capabilities_extension =
            $crate::export::capabilities_extension::<$plugin>();
        static API: $crate::abi::xpu_plugin_api =
            $crate::export::api_table::<$plugin>(&CAPABILITIES);
        // SAFETY: the caller's contract is `get_api`'s.
        unsafe { $crate::export::get_api($host, &API) }
    }};
}
