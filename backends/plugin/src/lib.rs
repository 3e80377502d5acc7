//! # xpu-plugin: vendor accelerators loaded at run time
//!
//! A vendor makes an NPU an xpu device by building a shared library against one C
//! header, `include/xpu_plugin.h` (its Rust mirror is `xpu_plugin_sdk::abi`), and
//! exporting `xpu_plugin_get_api`. This crate finds such libraries, checks them, and
//! turns each into a HAL [`Backend`](xpu_hal::backend::Backend) named `plugin.<name>`
//! whose devices behave like built-in ones: the HAL validates every argument before
//! the plugin sees it, so a plugin may rely on the "the host validates" promises of the
//! header.
//!
//! ## Finding plugins
//!
//! [`discover`] takes the paths the user named (a `--plugin PATH` flag) and the
//! entries of [`PATH_ENV`] (`XPU_PLUGIN_PATH`, split like `PATH`); each is a file or a
//! folder whose `*.so` (`*.dylib`, `*.dll`) files are all loaded. It never fails as a
//! whole: every file or entry that cannot be used becomes a [`LoadError`] naming its
//! path and cause, and the rest load. Two rules keep foreign code out of the process:
//!
//! - Nothing is ever loaded relative to the current directory by accident. A relative
//!   entry of `XPU_PLUGIN_PATH` is refused (the variable is inherited, the directory
//!   is wherever the process happened to start), and an empty entry is skipped rather
//!   than meaning `.`. A relative path the user typed is resolved against the current
//!   directory explicitly, because that is where they typed it.
//! - On Unix, a file is loaded only if it and its folder are owned by the current user
//!   or root and are not writable by every user ([`check_file`]); the checked,
//!   canonical path is what gets loaded.
//!
//! ## Loading and checking
//!
//! `Plugin::open` (the crate's only contact with raw library memory) loads the file
//! with `libloading` — on Unix with every symbol bound at once (`RTLD_NOW`), so that an
//! unresolved symbol is a load error rather than a crash at the first call —, calls the
//! entry point with this host's ABI version, and checks the returned table: not NULL; `struct_size` large enough to hold the version fields;
//! the same major version (a newer and an older major each get an error naming both
//! versions); `struct_size` at least `XPU_PLUGIN_API_MIN_SIZE`; every required
//! function present (an error names the first one missing); a name of the form
//! `[a-z0-9_-]+`. The table is then copied into a zeroed host-side table, up to the
//! smaller of the two sizes: a field beyond the plugin's `struct_size` is absent, and a
//! newer plugin's extra fields are never read. That one copy is the versioning rule of
//! the header; every plugin minor version works with every host minor version.
//!
//! Optional parts: `event_elapsed` (event timing), native kernels (`kernel_load`,
//! `kernel_launch` and `kernel_destroy` — all three, or the plugin is treated as having
//! none), the capabilities extension (its strings are
//! [`PluginDevice::extra_capabilities`]) and, from ABI 1.1, the standard operations
//! (`device_ops` and `op_enqueue`, both or none, read only from a plugin whose
//! `abi_minor` is at least 1): the list becomes the device's `Capabilities::ops`
//! (unknown operation numbers and dtypes an operation is not defined on are ignored,
//! at most 1024 entries are read), and `run_op` passes each operation as an
//! `xpu_op_args` with one `xpu_tensor` per operand, in the HAL's operand order; and,
//! from ABI 1.2, fault injection (`device_inject_fault`, read only from a plugin whose
//! `abi_minor` is at least 2): `DeviceImpl::inject_fault` passes the HAL's
//! `Fault::Lost` as `XPU_FAULT_LOST` and `Fault::Slow(delay)` as `XPU_FAULT_SLOW` with
//! `delay_ns` (saturating at `u64::MAX`), and on a plugin without the function returns
//! an `Unsupported` error naming the plugin. After a loss the plugin fails the device's
//! later calls with `DEVICE_LOST`, which maps onto `DeviceLost` like any other; a slow
//! device runs its streams' operations that much later, with unchanged results; and,
//! from ABI 1.3, native collectives (`group_create`, `group_run`, `group_abort`,
//! `group_destroy`, all four or none, read only from a plugin whose `abi_minor` is at
//! least 3): `DeviceImpl::collective_group` makes a `group::PluginGroup`, a HAL
//! `CollectiveGroup` with the library's name and stated figures, whose operations are
//! one `group_run` each, numbered on every rank's stream (its numbering locks taken in
//! address order) so that the streams' checkpoints cover them and hold their buffers.
//!
//! A library that passed the checks is never unloaded, even when the last object of
//! the plugin is gone: the ABI lets a destroyed stream finish in the background, and
//! unmapping code that a plugin thread may still run would crash the process. Every
//! object of a plugin holds the loaded library (`Arc`) all the same, so the table is
//! provably alive wherever it is used.
//!
//! ## Errors
//!
//! A plugin's error object is copied out (code and message) and destroyed at once, then
//! mapped onto [`xpu_hal::Error`] by code: `INVALID_ARGUMENT` → `InvalidArgument`,
//! `OUT_OF_MEMORY` → `OutOfMemory` (with the device's free and total memory for an
//! allocation), `UNSUPPORTED`, `UNAVAILABLE`, `DEVICE_LOST`, `TIMEOUT` and `ABORTED`
//! likewise; `INTERNAL` and any code the ABI does not define become `Backend` with a
//! [`PluginError`] (the raw code, the function, the message) as the source. Messages
//! name the device and the plugin function. Errors of frees, destroys and closes, which
//! run in `Drop` and have no caller, are kept as the backend's
//! [`diagnostics`](xpu_hal::backend::Backend::diagnostics).
//!
//! ## Objects and lifetimes
//!
//! ```text
//!   PluginBackend ── Arc<Plugin> (table, library)
//!   PluginDevice ─── Arc<DeviceShared>  (xpu_device*; closed when the last child goes)
//!     PluginAllocation, PluginKernel, PluginEvent, StreamShared ── Arc<DeviceShared>
//!   PluginStream ─── Arc<StreamShared>  (xpu_stream*; work it uses, held by number)
//!     PluginEvent ── Weak<StreamShared> (releases what the work before it held)
//! ```
//!
//! Every handle is destroyed in `Drop` of its owner, exactly once, after every user of
//! it is gone, and children always before their device, as the header requires.
//!
//! A stream keeps what its enqueued work uses — the shares of host memory of copies,
//! the device buffers, the kernel of a launch, a waited-on event — numbered in
//! enqueue order (enqueues are serialised so that the numbers follow the plugin's
//! order). They are dropped when `synchronize` returns, when a query reports the stream
//! idle, or when an event recorded after them is seen complete — the HAL's contract on
//! held resources and the header's on host memory. A dropped stream is synchronized
//! before `stream_destroy`, so nothing it held is released while the plugin could
//! still touch it. A synchronize that reports `DeviceLost` leaves the work's fate
//! unknown, so what it held stays held (and is leaked when the stream goes) — except
//! after a loss this host injected, when the ABI 1.2 rules promise that synchronize
//! returned only once the work had stopped.
//!
//! ## Waiting on other backends' events
//!
//! A stream waiting on an event of another backend passes the plugin an
//! `xpu_external_event` whose `wait` calls [`xpu_hal::Event::wait`] and whose `release`
//! drops the event; the plugin calls them on a thread of its own. `wait` can only say
//! "failed"; its error is kept with the stream and added to the aborted error the
//! plugin then reports, so the cause reaches the user.
//!
//! ## Thread safety
//!
//! Every object is `Send + Sync`. The header allows calls from any thread; the crate
//! adds only the serialisation of enqueues on one stream described above.

mod abi_check;
mod backend;
mod device;
mod discover;
mod error;
mod event;
mod group;
mod kernel;
mod load;
mod memory;
mod std_ops;
mod stream;

pub use backend::PluginBackend;
pub use device::PluginDevice;
pub use discover::{check_file, discover, discover_from, Discovery, LIBRARY_EXTENSIONS, PATH_ENV};
pub use error::{LoadError, LoadErrorKind, PluginError};
pub use event::PluginEvent;
pub use kernel::PluginKernel;
pub use memory::PluginAllocation;
pub use stream::PluginStream;

/// The prefix of every plugin backend's name: `plugin.` followed by the plugin's name.
pub const BACKEND_PREFIX: &str = "plugin.";

/// The plugin ABI version this host implements, `(major, minor)`.
pub const HOST_ABI_VERSION: (u32, u32) = load::HOST_ABI;
