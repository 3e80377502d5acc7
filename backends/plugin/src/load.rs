//! Loading one shared library and checking its function table: the `sys` layer of the
//! crate. Everything that touches the library's memory directly lives here; the HAL
//! objects call the plugin only through [`Plugin::call`].

use std::ffi::c_char;
use std::mem::{offset_of, size_of, ManuallyDrop, MaybeUninit};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use xpu_hal::Error;
use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::struct_size;

use crate::error::{LoadErrorKind, PluginError};

/// The ABI version this host speaks: the header's `MAJOR.MINOR`.
pub(crate) const HOST_ABI: (u32, u32) = (XPU_PLUGIN_ABI_MAJOR, XPU_PLUGIN_ABI_MINOR);

/// The longest plugin name accepted.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// How many messages [`Plugin::record`] keeps; later ones are counted only.
const MAX_DIAGNOSTICS: usize = 256;

/// How many extension structs are followed before the chain is taken to be cyclic.
const MAX_EXTENSIONS: usize = 64;

/// A plugin function taking an argument struct `A`.
pub(crate) type Func<A> = unsafe extern "C" fn(args: *mut A) -> *mut xpu_error;

/// ABI structs that are valid when every byte is zero.
///
/// # Safety
/// Implement only for `#[repr(C)]` types whose fields are integers, raw pointers,
/// `Option` of `extern "C"` function pointers, or arrays and structs of those.
pub(crate) unsafe trait Zeroed: Copy {
    /// The all-zero value: every count 0, every pointer NULL, every function absent.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract says all-zero bytes are a valid `Self`.
        unsafe { MaybeUninit::<Self>::zeroed().assume_init() }
    }
}

/// Argument structs: zeroed, with `struct_size` set to what this host knows.
pub(crate) trait Args: Zeroed {
    /// A zeroed struct whose `struct_size` is `XPU_STRUCT_SIZE(type, last field)`.
    fn new() -> Self;
}

macro_rules! abi_structs {
    ($($t:ident => $last:ident),* $(,)?) => {$(
        // SAFETY: every field of this mirror of the C struct is an integer, a raw
        // pointer, an optional function pointer, or an array or struct of those.
        unsafe impl Zeroed for $t {}
        impl Args for $t {
            fn new() -> Self {
                let mut a = <$t as Zeroed>::zeroed();
                a.struct_size = struct_size!($t, $last);
                a
            }
        }
    )*};
}

abi_structs!(
    xpu_device_count_args => count,
    xpu_device_open_args => device,
    xpu_device_close_args => device,
    xpu_device_properties_args => kernel_format,
    xpu_memory_info_args => free,
    xpu_buffer_allocate_args => buffer,
    xpu_buffer_free_args => buffer,
    xpu_stream_create_args => stream,
    xpu_stream_args => stream,
    xpu_stream_query_args => done,
    xpu_copy_args => length,
    xpu_builtin_args => scalar,
    xpu_event_record_args => event,
    xpu_event_args => event,
    xpu_event_query_args => done,
    xpu_event_wait_args => timeout_ns,
    xpu_event_elapsed_args => elapsed_ns,
    xpu_stream_wait_event_args => event,
    xpu_stream_wait_external_args => external,
    xpu_kernel_load_args => kernel,
    xpu_kernel_destroy_args => kernel,
    xpu_kernel_launch_args => arg_count,
    xpu_capabilities_args => count,
    xpu_device_ops_args => count,
    xpu_op_args => params,
    xpu_tensor => range,
    xpu_device_fault_args => delay_ns,
    xpu_group_create_args => size,
    xpu_group_part => recv,
    xpu_group_run_args => part_count,
    xpu_group_args => group,
    xpu_group_id_args => id_len,
);

// SAFETY: as above: a size, pointers, integers and optional function pointers.
unsafe impl Zeroed for xpu_plugin_api {}
// SAFETY: as above.
unsafe impl Zeroed for xpu_extension_base {}
// SAFETY: as above.
unsafe impl Zeroed for xpu_capabilities_extension {}
// SAFETY: as above.
unsafe impl Zeroed for xpu_kernel_arg {}
// SAFETY: as above.
unsafe impl Zeroed for xpu_op_support {}

/// Copies the first `size` bytes of the plugin's `T` at `src` into a zeroed `T`.
///
/// This is the versioning rule of the header in one place: a field beyond a smaller
/// struct (an older plugin's) reads as zero / NULL — absent —, and the fields of a
/// larger struct (a newer plugin's) beyond this host's `T` are never read.
///
/// # Safety
/// `src` points to at least `min(size, size_of::<T>())` readable bytes.
pub(crate) unsafe fn read_prefix<T: Zeroed>(src: *const T, size: usize) -> T {
    let mut out = T::zeroed();
    let n = size.min(size_of::<T>());
    // SAFETY: `src` has `n` readable bytes (the caller's contract), `out` has
    // `size_of::<T>() >= n` writable ones, and the two do not overlap (`out` is a local).
    // Any bytes are valid for the fields copied: integers, pointers and optional
    // function pointers the plugin wrote, zero elsewhere.
    unsafe {
        std::ptr::copy_nonoverlapping(src.cast::<u8>(), (&mut out as *mut T).cast::<u8>(), n)
    };
    out
}

/// A handle (`xpu_device*`, `xpu_stream*` …) owned by the plugin.
#[derive(Debug)]
pub(crate) struct Handle<T>(pub(crate) *mut T);

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Handle<T> {}

// SAFETY: the header's THREAD SAFETY section: every function may be called from any
// thread, concurrently with calls on other objects; calls on one stream from several
// threads are serialised by the plugin; destroy functions are never called
// concurrently with other calls on the same object, which the owners of these handles
// ensure by destroying only in `Drop`.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

/// The entry points of kernel support: all three or none.
#[derive(Clone, Copy)]
pub(crate) struct KernelFns {
    pub(crate) load: Func<xpu_kernel_load_args>,
    pub(crate) destroy: Func<xpu_kernel_destroy_args>,
    pub(crate) launch: Func<xpu_kernel_launch_args>,
}

/// The entry points of the standard operations (ABI 1.1): both or none.
#[derive(Clone, Copy)]
pub(crate) struct OpFns {
    pub(crate) list: Func<xpu_device_ops_args>,
    pub(crate) enqueue: Func<xpu_op_args>,
}

/// The entry points of the native collectives (ABI 1.3): all four or none, and the
/// identifier of groups across processes (ABI 1.4) with them.
#[derive(Clone, Copy)]
pub(crate) struct GroupFns {
    pub(crate) create: Func<xpu_group_create_args>,
    pub(crate) run: Func<xpu_group_run_args>,
    pub(crate) abort: Func<xpu_group_args>,
    pub(crate) destroy: Func<xpu_group_args>,
    /// Only from a plugin of ABI 1.4 or later.
    pub(crate) id: Option<Func<xpu_group_id_args>>,
}

/// The validated function table: required functions as plain function pointers,
/// optional ones as `Option`.
#[derive(Clone, Copy)]
pub(crate) struct Table {
    pub(crate) error_code: unsafe extern "C" fn(error: *const xpu_error) -> u32,
    pub(crate) error_message: unsafe extern "C" fn(error: *const xpu_error) -> *const c_char,
    pub(crate) error_destroy: unsafe extern "C" fn(error: *mut xpu_error),
    pub(crate) device_count: Func<xpu_device_count_args>,
    pub(crate) device_open: Func<xpu_device_open_args>,
    pub(crate) device_close: Func<xpu_device_close_args>,
    pub(crate) device_properties: Func<xpu_device_properties_args>,
    pub(crate) memory_info: Func<xpu_memory_info_args>,
    pub(crate) buffer_allocate: Func<xpu_buffer_allocate_args>,
    pub(crate) buffer_free: Func<xpu_buffer_free_args>,
    pub(crate) stream_create: Func<xpu_stream_create_args>,
    pub(crate) stream_destroy: Func<xpu_stream_args>,
    pub(crate) stream_synchronize: Func<xpu_stream_args>,
    pub(crate) stream_query: Func<xpu_stream_query_args>,
    pub(crate) copy_host_to_device: Func<xpu_copy_args>,
    pub(crate) copy_device_to_host: Func<xpu_copy_args>,
    pub(crate) copy_device_to_device: Func<xpu_copy_args>,
    pub(crate) builtin: Func<xpu_builtin_args>,
    pub(crate) event_record: Func<xpu_event_record_args>,
    pub(crate) event_destroy: Func<xpu_event_args>,
    pub(crate) event_query: Func<xpu_event_query_args>,
    pub(crate) event_wait: Func<xpu_event_wait_args>,
    pub(crate) stream_wait_event: Func<xpu_stream_wait_event_args>,
    pub(crate) stream_wait_external: Func<xpu_stream_wait_external_args>,
    pub(crate) event_elapsed: Option<Func<xpu_event_elapsed_args>>,
    pub(crate) kernels: Option<KernelFns>,
    pub(crate) capabilities: Option<Func<xpu_capabilities_args>>,
    /// Only from a plugin of ABI 1.1 or later that has both functions.
    pub(crate) ops: Option<OpFns>,
    /// `device_inject_fault`: only from a plugin of ABI 1.2 or later whose table reaches
    /// it.
    pub(crate) inject_fault: Option<Func<xpu_device_fault_args>>,
    /// Only from a plugin of ABI 1.3 or later that has all four functions.
    pub(crate) groups: Option<GroupFns>,
}

macro_rules! required {
    ($api:expr, $($f:ident),* $(,)?) => {
        ($(
            match $api.$f {
                Some(f) => f,
                None => {
                    return Err(LoadErrorKind::MissingFunction {
                        function: stringify!($f),
                    })
                }
            },
        )*)
    };
}

impl Table {
    /// Checks that every required function is present.
    fn from_api(api: &xpu_plugin_api) -> Result<Table, LoadErrorKind> {
        let (error_code, error_message, error_destroy) =
            required!(api, error_code, error_message, error_destroy);
        let (device_count, device_open, device_close, device_properties, memory_info) = required!(
            api,
            device_count,
            device_open,
            device_close,
            device_properties,
            memory_info
        );
        let (buffer_allocate, buffer_free) = required!(api, buffer_allocate, buffer_free);
        let (
            stream_create,
            stream_destroy,
            stream_synchronize,
            stream_query,
            copy_host_to_device,
            copy_device_to_host,
            copy_device_to_device,
            builtin,
        ) = required!(
            api,
            stream_create,
            stream_destroy,
            stream_synchronize,
            stream_query,
            copy_host_to_device,
            copy_device_to_host,
            copy_device_to_device,
            builtin
        );
        let (
            event_record,
            event_destroy,
            event_query,
            event_wait,
            stream_wait_event,
            stream_wait_external,
        ) = required!(
            api,
            event_record,
            event_destroy,
            event_query,
            event_wait,
            stream_wait_event,
            stream_wait_external
        );
        let kernels = match (api.kernel_load, api.kernel_destroy, api.kernel_launch) {
            (Some(load), Some(destroy), Some(launch)) => Some(KernelFns {
                load,
                destroy,
                launch,
            }),
            _ => None,
        };
        Ok(Table {
            error_code,
            error_message,
            error_destroy,
            device_count,
            device_open,
            device_close,
            device_properties,
            memory_info,
            buffer_allocate,
            buffer_free,
            stream_create,
            stream_destroy,
            stream_synchronize,
            stream_query,
            copy_host_to_device,
            copy_device_to_host,
            copy_device_to_device,
            builtin,
            event_record,
            event_destroy,
            event_query,
            event_wait,
            stream_wait_event,
            stream_wait_external,
            event_elapsed: api.event_elapsed,
            kernels,
            capabilities: None,
            ops: match (api.device_ops, api.op_enqueue) {
                (Some(list), Some(enqueue)) => Some(OpFns { list, enqueue }),
                _ => None,
            },
            inject_fault: api.device_inject_fault,
            groups: match (
                api.group_create,
                api.group_run,
                api.group_abort,
                api.group_destroy,
            ) {
                (Some(create), Some(run), Some(abort), Some(destroy)) => Some(GroupFns {
                    create,
                    run,
                    abort,
                    destroy,
                    id: api.group_id,
                }),
                _ => None,
            },
        })
    }
}

/// A plugin's shared library, mapped for the rest of the process once it passed the
/// checks.
///
/// Every object of the plugin holds it through its `Arc<Plugin>`, so it is mapped
/// while any of them exists. Even after the last one it is not unmapped: the ABI lets
/// a destroyed stream finish its work in the background, and unmapping code that a
/// plugin thread may still run would crash the process.
struct Library {
    _inner: ManuallyDrop<libloading::Library>,
}

/// One loaded, validated plugin: its table, identity and the diagnostics recorded by
/// calls that had no caller to report to. Shared by every object of the plugin.
pub(crate) struct Plugin {
    pub(crate) table: Table,
    /// The file, as given.
    pub(crate) path: PathBuf,
    /// The plugin's name (`minimal`).
    pub(crate) plugin_name: String,
    /// The backend's name (`plugin.minimal`).
    pub(crate) backend: String,
    /// The plugin's own version string.
    pub(crate) version: String,
    /// The plugin's `abi_major.abi_minor`.
    pub(crate) abi: (u32, u32),
    /// The entry point, whose address tells libraries apart (loading one file twice
    /// maps it once).
    entry: xpu_plugin_get_api_fn,
    diagnostics: Mutex<(Vec<String>, usize)>,
    _library: Arc<Library>,
}

/// Whether `name` is a valid plugin name.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A NUL-terminated string from the plugin, lossily decoded; empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn plugin_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // Up to the NUL, or MAX_STRING_LEN bytes of a string that has none within them.
    let mut bytes = Vec::new();
    for i in 0..MAX_STRING_LEN {
        // SAFETY: NUL-terminated by the caller's contract, and read only up to the NUL.
        let b = unsafe { p.add(i).cast::<u8>().read() };
        if b == 0 {
            break;
        }
        bytes.push(b);
    }
    // Control characters (a terminal's escape sequences) are shown escaped: the
    // strings reach terminals and logs.
    let mut text = String::with_capacity(bytes.len());
    for c in String::from_utf8_lossy(&bytes).chars() {
        if c.is_control() {
            text.extend(c.escape_default());
        } else {
            text.push(c);
        }
    }
    text
}

/// The most bytes of a plugin string read: names, versions and messages are short, and
/// a string without its NUL must not make the host read on.
const MAX_STRING_LEN: usize = 4096;

impl Plugin {
    /// Loads the library at `path` (already checked by the caller) and validates its
    /// table. `given` is the path to name in messages.
    pub(crate) fn open(path: &Path, given: &Path) -> Result<Plugin, LoadErrorKind> {
        // Never unmapped, also when the plugin is refused below: its initialisers have
        // run and may have started threads that run its code.
        let library =
            ManuallyDrop::new(load_library(path).map_err(|e| LoadErrorKind::NotALibrary {
                message: e.to_string(),
            })?);
        // SAFETY: `xpu_plugin_get_api_fn` is the type the header gives the entry point.
        // The function pointer is copied out of the symbol but the library it points
        // into stays loaded as long as the returned `Plugin` (forever, see `Library`).
        let entry: xpu_plugin_get_api_fn =
            match unsafe { library.get::<xpu_plugin_get_api_fn>(XPU_PLUGIN_ENTRY_SYMBOL) } {
                Ok(symbol) => *symbol,
                Err(_) => return Err(LoadErrorKind::MissingEntryPoint),
            };
        let host = xpu_host_info {
            struct_size: struct_size!(xpu_host_info, abi_minor),
            extensions: std::ptr::null(),
            abi_major: HOST_ABI.0,
            abi_minor: HOST_ABI.1,
        };
        // SAFETY: the entry point has the header's signature and `host` is a valid
        // `xpu_host_info` for the duration of the call.
        let api = unsafe { entry(&host) };
        if api.is_null() {
            return Err(LoadErrorKind::Refused { host: HOST_ABI });
        }
        // SAFETY: a non-null table has static lifetime and starts, in every ABI
        // version, with `size_t struct_size`.
        let size = unsafe { api.cast::<usize>().read_unaligned() };
        let versions_end = offset_of!(xpu_plugin_api, abi_minor) + size_of::<u32>();
        if size < versions_end {
            return Err(LoadErrorKind::TableTooSmall {
                size,
                min: struct_size!(xpu_plugin_api, kernel_launch),
            });
        }
        // SAFETY: the table has at least `size >= versions_end` bytes, so both version
        // fields lie within it; they sit where every ABI version keeps them.
        let (major, minor) = unsafe {
            let base = api.cast::<u8>();
            (
                base.add(offset_of!(xpu_plugin_api, abi_major))
                    .cast::<u32>()
                    .read_unaligned(),
                base.add(offset_of!(xpu_plugin_api, abi_minor))
                    .cast::<u32>()
                    .read_unaligned(),
            )
        };
        if major != HOST_ABI.0 {
            return Err(LoadErrorKind::IncompatibleMajor {
                plugin: (major, minor),
                host: HOST_ABI,
            });
        }
        let min = struct_size!(xpu_plugin_api, kernel_launch);
        if size < min {
            return Err(LoadErrorKind::TableTooSmall { size, min });
        }
        // SAFETY: the table has `size` readable bytes (its own declaration, at least
        // the 1.0 minimum checked above).
        let api = unsafe { read_prefix(api, size) };
        let mut table = Table::from_api(&api)?;
        if minor < 1 {
            // Members a 1.0 plugin cannot have meant: whatever lies there is not read.
            table.ops = None;
        }
        if minor < 2 {
            // Likewise the member of 1.2, for a 1.0 or 1.1 plugin.
            table.inject_fault = None;
        }
        if minor < 3 {
            // And those of 1.3, for a plugin of 1.2 or older.
            table.groups = None;
        }
        if minor < 4 {
            // And that of 1.4, for a plugin of 1.3 or older.
            if let Some(g) = table.groups.as_mut() {
                g.id = None;
            }
        }
        if api.name.is_null() {
            return Err(LoadErrorKind::InvalidName { name: None });
        }
        // SAFETY: `name` is a static NUL-terminated string (header: "static").
        let name = unsafe { plugin_string(api.name) };
        if !valid_name(&name) {
            return Err(LoadErrorKind::InvalidName { name: Some(name) });
        }
        // SAFETY: `version` is NULL or a static NUL-terminated string.
        let version = unsafe { plugin_string(api.version) };
        // SAFETY: the chain's structs are static and each starts with
        // `xpu_extension_base` (header, "extensions").
        table.capabilities = unsafe { find_capabilities(api.extensions) };
        Ok(Plugin {
            table,
            path: given.to_path_buf(),
            backend: format!("{}{name}", crate::BACKEND_PREFIX),
            plugin_name: name,
            version,
            abi: (major, minor),
            entry,
            diagnostics: Mutex::new((Vec::new(), 0)),
            _library: Arc::new(Library { _inner: library }),
        })
    }

    /// Whether `other` drives the same library (and so shares handles with this one).
    pub(crate) fn same_library(&self, other: &Plugin) -> bool {
        self.entry as usize == other.entry as usize
    }

    /// Copies an error object out of the plugin and destroys it.
    ///
    /// # Safety
    /// `error` is non-null, was returned by a function of this plugin, and has not been
    /// destroyed.
    pub(crate) unsafe fn take_error(
        &self,
        error: *mut xpu_error,
        function: &'static str,
    ) -> PluginError {
        // SAFETY: a live error object of this plugin (the caller's contract); the
        // header says these two never fail and the message lives until error_destroy.
        let (code, message) = unsafe {
            let code = (self.table.error_code)(error);
            let message = (self.table.error_message)(error);
            let message = if message.is_null() {
                "(the plugin gave no message)".to_string()
            } else {
                plugin_string(message)
            };
            (code, message)
        };
        // SAFETY: destroyed exactly once, here, after its message was copied.
        unsafe { (self.table.error_destroy)(error) };
        PluginError {
            function,
            code,
            message,
        }
    }

    /// Calls `f(args)` and returns the plugin's error, if any, copied out.
    ///
    /// # Safety
    /// `f` is a function of this plugin's table taking `A`; `args` came from
    /// [`Args::new`] and every handle in it is live and belongs to this plugin; every
    /// pointer in it is valid for the duration the header gives it.
    pub(crate) unsafe fn call_raw<A>(
        &self,
        f: Func<A>,
        args: &mut A,
        function: &'static str,
    ) -> Result<(), PluginError> {
        // SAFETY: the caller's contract.
        let error = unsafe { f(args) };
        if error.is_null() {
            Ok(())
        } else {
            // SAFETY: a fresh error object returned by this plugin.
            Err(unsafe { self.take_error(error, function) })
        }
    }

    /// [`Plugin::call_raw`], with the error mapped onto the HAL's ([`Plugin::hal_error`]).
    ///
    /// # Safety
    /// As for [`Plugin::call_raw`].
    pub(crate) unsafe fn call<A>(
        &self,
        f: Func<A>,
        args: &mut A,
        function: &'static str,
        place: &str,
    ) -> xpu_hal::Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.call_raw(f, args, function) }.map_err(|e| self.hal_error(e, place))
    }

    /// Maps a plugin error onto the HAL's enum by its code; `place` is the device
    /// (`plugin.name:N`) or backend it concerns. `INTERNAL` and codes the ABI does not
    /// define become [`Error::Backend`] with the [`PluginError`] (and the raw code) as
    /// the source.
    pub(crate) fn hal_error(&self, e: PluginError, place: &str) -> Error {
        let text = format!("{place}: {}: {}", e.function, e.message);
        match e.code {
            error_code::INVALID_ARGUMENT => Error::invalid(text),
            error_code::OUT_OF_MEMORY => Error::OutOfMemory {
                device: place.to_string(),
                requested: 0,
                free: 0,
                capacity: 0,
                hint: format!("{}: {}", e.function, e.message),
            },
            error_code::UNSUPPORTED => Error::unsupported(text),
            error_code::UNAVAILABLE => Error::unavailable(self.backend.clone(), text),
            error_code::DEVICE_LOST => Error::DeviceLost {
                device: place.to_string(),
                message: format!("{}: {}", e.function, e.message),
            },
            error_code::TIMEOUT => Error::Timeout { message: text },
            error_code::ABORTED => Error::aborted(text),
            _ => Error::backend(self.backend.clone(), e),
        }
    }

    /// Records a problem no caller can be told about (a failed destroy or free), for
    /// [`xpu_hal::backend::Backend::diagnostics`].
    pub(crate) fn record(&self, message: String) {
        let mut d = self.diagnostics.lock().unwrap_or_else(|p| p.into_inner());
        if d.0.len() < MAX_DIAGNOSTICS {
            d.0.push(message);
        } else {
            d.1 += 1;
        }
    }

    /// The plugin's entry point (the library stays loaded as long as the plugin).
    pub(crate) fn entry_point(&self) -> xpu_plugin_get_api_fn {
        self.entry
    }

    /// Everything [`Plugin::record`] kept.
    pub(crate) fn diagnostics(&self) -> Vec<String> {
        let d = self.diagnostics.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = d.0.clone();
        if d.1 > 0 {
            out.push(format!("… and {} more", d.1));
        }
        out
    }

    /// Runs a release-type call (free, destroy, close) from a `Drop`: its error has no
    /// caller, so it is recorded.
    ///
    /// # Safety
    /// As for [`Plugin::call_raw`]; the handle is not used again.
    pub(crate) unsafe fn release<A>(
        &self,
        f: Func<A>,
        mut args: A,
        function: &'static str,
        place: &str,
    ) {
        // SAFETY: forwarded contract.
        if let Err(e) = unsafe { self.call_raw(f, &mut args, function) } {
            self.record(format!("{place}: {e}"));
        }
    }
}

/// Maps the library. On Unix every symbol is bound now (`RTLD_NOW`), so that a plugin
/// with an unresolved symbol is refused here instead of killing the process at its
/// first call, and its symbols stay private to it (`RTLD_LOCAL`).
fn load_library(path: &Path) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading a library runs its initialisers, which is native code of the
        // plugin's vendor; running that code is what loading a plugin means. The file
        // passed the ownership and permission checks, and the library is only reached
        // through its entry point.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }
    }
}

/// Walks an extension chain for the capabilities extension.
///
/// # Safety
/// `ext` is NULL or the head of a chain of static structs, each starting with
/// `xpu_extension_base` and at least `base.struct_size` bytes long.
unsafe fn find_capabilities(
    mut ext: *const xpu_extension_base,
) -> Option<Func<xpu_capabilities_args>> {
    for _ in 0..MAX_EXTENSIONS {
        if ext.is_null() {
            return None;
        }
        // SAFETY: a chain element (the caller's contract); its base is read within the
        // declared size only.
        let base: xpu_extension_base = unsafe { read_prefix(ext, size_of::<xpu_extension_base>()) };
        if base.type_ == extension_type::CAPABILITIES
            && base.struct_size >= struct_size!(xpu_capabilities_extension, capabilities)
        {
            // SAFETY: an extension of this type is an `xpu_capabilities_extension` of
            // `struct_size` bytes, which covers `capabilities`.
            let full: xpu_capabilities_extension =
                unsafe { read_prefix(ext.cast::<xpu_capabilities_extension>(), base.struct_size) };
            return full.capabilities;
        }
        ext = base.next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("minimal"));
        assert!(valid_name("sim-npu_2"));
        assert!(!valid_name(""));
        assert!(!valid_name("Sim"));
        assert!(!valid_name("a b"));
        assert!(!valid_name("a.b"));
        assert!(!valid_name(&"a".repeat(MAX_NAME_LEN + 1)));
    }

    #[test]
    fn plugin_strings_are_bounded_and_escaped() {
        let s = b"v1\x1b[2J\x07ok\0";
        // SAFETY: a NUL-terminated byte string.
        let text = unsafe { plugin_string(s.as_ptr().cast()) };
        assert_eq!(text, "v1\\u{1b}[2J\\u{7}ok");
        let mut long = vec![b'x'; MAX_STRING_LEN + 100];
        long.push(0);
        // SAFETY: NUL-terminated; read only up to MAX_STRING_LEN bytes.
        let text = unsafe { plugin_string(long.as_ptr().cast()) };
        assert_eq!(text.len(), MAX_STRING_LEN);
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { plugin_string(std::ptr::null()) }, "");
    }

    /// The argument structs' sizes follow `XPU_STRUCT_SIZE`, not `sizeof`.
    #[test]
    fn args_sizes_exclude_tail_padding() {
        let a = xpu_device_count_args::new();
        assert_eq!(a.struct_size, 8 + size_of::<usize>() + 4);
        assert!(a.struct_size < size_of::<xpu_device_count_args>());
        assert!(a.extensions.is_null());
        assert_eq!(a.count, 0);
    }

    /// What a newer host (ABI 1.1, with one more function) sees in a 1.0 table.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct NextTable {
        base: xpu_plugin_api,
        future: Option<unsafe extern "C" fn()>,
    }
    // SAFETY: a table and an optional function pointer.
    unsafe impl Zeroed for NextTable {}

    unsafe extern "C" fn never() {}

    #[test]
    fn fields_beyond_a_smaller_table_are_absent() {
        let mut next = NextTable::zeroed();
        next.future = Some(never);
        next.base.abi_major = 1;
        next.base.struct_size = struct_size!(xpu_plugin_api, kernel_launch);
        // A newer host reads a 1.0 plugin's table: its extra field is absent.
        // SAFETY: `next` is larger than the declared size.
        let seen: NextTable =
            unsafe { read_prefix((&next as *const NextTable).cast(), next.base.struct_size) };
        assert!(seen.future.is_none());
        assert_eq!(seen.base.abi_major, 1);
        // An older host reads a newer plugin's larger table: it stops at its own size.
        // SAFETY: `next` has `size_of::<NextTable>()` bytes.
        let old: xpu_plugin_api =
            unsafe { read_prefix((&next as *const NextTable).cast(), size_of::<NextTable>()) };
        assert_eq!(old.abi_major, 1);
    }
}
