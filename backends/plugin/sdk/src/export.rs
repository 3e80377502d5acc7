//! The C side: every function of `xpu_plugin_api`, written once for any [`Plugin`],
//! and the table and entry point that [`export_plugin!`](crate::export_plugin) puts
//! into the vendor's library.
//!
//! Each entry point does the same five things, in order:
//!
//! 1. runs inside `catch_unwind`, so that a panic becomes an `XPU_ERROR_INTERNAL`
//!    error object carrying the panic message instead of unwinding into C;
//! 2. refuses a NULL argument struct, and one whose `struct_size` is below the
//!    struct's `MIN_SIZE`, with `XPU_ERROR_INVALID_ARGUMENT` naming the struct and both
//!    sizes; it copies only the bytes within `struct_size` (later fields read as zero);
//! 3. turns every handle into the plugin's object, refusing NULL and objects of the
//!    wrong kind, and checks what is cheap to check (ranges within their buffers and on
//!    the stream's device, element alignment, matching element counts, identical or
//!    disjoint operands, known enum values);
//! 4. calls the trait method;
//! 5. writes each output field only if it lies within the caller's `struct_size`.
//!
//! The checks in 3 repeat some the host has already made. They are a few comparisons
//! per call, and they mean a plugin written in safe Rust cannot be driven out of bounds
//! by a faulty host.

use std::any::{Any, TypeId};
use std::ffi::{c_char, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{mpsc, Mutex, OnceLock};

use crate::abi::{self, *};
use crate::error::{Error, ErrorCode, Result};
use crate::handle::{Boxed, DeviceId, Handle, Kind};
use crate::host::{ExternalWait, HostDestination, HostSource};
use crate::plugin::{Device, Event, Plugin, Stream};
use crate::struct_size;
use crate::types::{
    timeout_from_ns, Access, BinaryOp, BufferRange, Builtin, DType, DeviceProperties, Fault,
    KernelArg, KernelCode, LaunchDims, Scalar,
};

// ------------------------------------------------------------------ argument structs --

/// An argument struct of the ABI: its C name, and its size in the ABI version that
/// introduced it (its MIN_SIZE).
trait ArgStruct: Copy {
    const NAME: &'static str;
    const MIN_NAME: &'static str;
    const LAST: &'static str;
    /// The ABI version that introduced the struct: "1.0", "1.1" for the standard
    /// operations', "1.2" for fault injection's.
    const SINCE: &'static str;
    fn min_size() -> usize;
}

macro_rules! arg_struct {
    ($($t:ident, $last:ident, $min:literal $(, since $since:literal)?;)*) => {$(
        impl ArgStruct for $t {
            const NAME: &'static str = stringify!($t);
            const MIN_NAME: &'static str = $min;
            const LAST: &'static str = stringify!($last);
            const SINCE: &'static str = arg_struct!(@since $($since)?);
            fn min_size() -> usize {
                struct_size!($t, $last)
            }
        }
    )*};
    (@since) => { "1.0" };
    (@since $since:literal) => { $since };
}

arg_struct! {
    xpu_device_count_args, count, "XPU_DEVICE_COUNT_ARGS_MIN_SIZE";
    xpu_device_open_args, device, "XPU_DEVICE_OPEN_ARGS_MIN_SIZE";
    xpu_device_close_args, device, "XPU_DEVICE_CLOSE_ARGS_MIN_SIZE";
    xpu_device_properties_args, kernel_format, "XPU_DEVICE_PROPERTIES_ARGS_MIN_SIZE";
    xpu_memory_info_args, free, "XPU_MEMORY_INFO_ARGS_MIN_SIZE";
    xpu_buffer_allocate_args, buffer, "XPU_BUFFER_ALLOCATE_ARGS_MIN_SIZE";
    xpu_buffer_free_args, buffer, "XPU_BUFFER_FREE_ARGS_MIN_SIZE";
    xpu_stream_create_args, stream, "XPU_STREAM_CREATE_ARGS_MIN_SIZE";
    xpu_stream_args, stream, "XPU_STREAM_ARGS_MIN_SIZE";
    xpu_stream_query_args, done, "XPU_STREAM_QUERY_ARGS_MIN_SIZE";
    xpu_copy_args, length, "XPU_COPY_ARGS_MIN_SIZE";
    xpu_builtin_args, scalar, "XPU_BUILTIN_ARGS_MIN_SIZE";
    xpu_event_record_args, event, "XPU_EVENT_RECORD_ARGS_MIN_SIZE";
    xpu_event_args, event, "XPU_EVENT_ARGS_MIN_SIZE";
    xpu_event_query_args, done, "XPU_EVENT_QUERY_ARGS_MIN_SIZE";
    xpu_event_wait_args, timeout_ns, "XPU_EVENT_WAIT_ARGS_MIN_SIZE";
    xpu_event_elapsed_args, elapsed_ns, "XPU_EVENT_ELAPSED_ARGS_MIN_SIZE";
    xpu_stream_wait_event_args, event, "XPU_STREAM_WAIT_EVENT_ARGS_MIN_SIZE";
    xpu_stream_wait_external_args, external, "XPU_STREAM_WAIT_EXTERNAL_ARGS_MIN_SIZE";
    xpu_kernel_load_args, kernel, "XPU_KERNEL_LOAD_ARGS_MIN_SIZE";
    xpu_kernel_destroy_args, kernel, "XPU_KERNEL_DESTROY_ARGS_MIN_SIZE";
    xpu_kernel_launch_args, arg_count, "XPU_KERNEL_LAUNCH_ARGS_MIN_SIZE";
    xpu_capabilities_args, count, "XPU_CAPABILITIES_ARGS_MIN_SIZE";
    xpu_device_ops_args, count, "XPU_DEVICE_OPS_ARGS_MIN_SIZE", since "1.1";
    xpu_op_args, params, "XPU_OP_ARGS_MIN_SIZE", since "1.1";
    xpu_tensor, range, "XPU_TENSOR_MIN_SIZE", since "1.1";
    xpu_device_fault_args, delay_ns, "XPU_DEVICE_FAULT_ARGS_MIN_SIZE", since "1.2";
    xpu_group_create_args, bus_bytes_per_s, "XPU_GROUP_CREATE_ARGS_MIN_SIZE", since "1.3";
    xpu_group_part, recv, "XPU_GROUP_PART_MIN_SIZE", since "1.3";
    xpu_group_run_args, part_count, "XPU_GROUP_RUN_ARGS_MIN_SIZE", since "1.3";
    xpu_group_args, group, "XPU_GROUP_ARGS_MIN_SIZE", since "1.3";
    xpu_group_id_args, id_len, "XPU_GROUP_ID_ARGS_MIN_SIZE", since "1.4";
}

/// The caller's argument struct: a copy of the fields within its `struct_size` (the
/// rest zero), the size, and where to write outputs.
struct Args<T> {
    v: T,
    size: usize,
    ptr: *mut T,
}

/// Reads an argument struct under the `struct_size` rules.
///
/// # Safety
/// `ptr` is null or points to a struct of type `T` (possibly of a newer or older minor
/// version) of at least `struct_size` bytes, valid for the call.
unsafe fn read<T: ArgStruct>(ptr: *mut T) -> Result<Args<T>> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "the {} pointer is NULL; pass a struct with struct_size set",
            T::NAME
        )));
    }
    // SAFETY: every argument struct starts with `size_t struct_size`, which the caller
    // set; an unaligned read accepts any pointer the caller made.
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    if size < T::min_size() {
        return Err(Error::invalid_argument(format!(
            "{}.struct_size is {size}, smaller than {} ({} bytes, the struct's size in ABI {}); \
             set it to XPU_STRUCT_SIZE({}, {}) or larger",
            T::NAME,
            T::MIN_NAME,
            T::min_size(),
            T::SINCE,
            T::NAME,
            T::LAST
        )));
    }
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the caller's struct holds at least `size` bytes and ours
    // `size_of::<T>()`; copying the smaller count never reads beyond the caller's
    // struct_size nor writes beyond ours.
    unsafe {
        ptr::copy_nonoverlapping(
            ptr.cast::<u8>().cast_const(),
            v.as_mut_ptr().cast::<u8>(),
            size.min(std::mem::size_of::<T>()),
        )
    };
    // SAFETY: every field of the ABI's structs (integers, raw pointers, optional
    // function pointers) is valid for any bit pattern, including all zeros.
    let v = unsafe { v.assume_init() };
    Ok(Args { v, size, ptr })
}

/// Writes output field `$field` of `$args` if it lies within the caller's struct_size;
/// evaluates to whether it did.
macro_rules! write_out {
    ($args:expr, $t:ty, $field:ident, $value:expr) => {{
        let args = &$args;
        let fits = struct_size!($t, $field) <= args.size;
        if fits {
            // SAFETY: the field lies within the caller's struct_size, so within the
            // struct the caller allocated and lent us for the call.
            unsafe { ptr::addr_of_mut!((*args.ptr).$field).write_unaligned($value) };
        }
        fits
    }};
}

// ------------------------------------------------------------------------ plumbing --

/// Runs one entry point: catches panics and turns the outcome into an error object.
fn guard(function: &'static str, f: impl FnOnce() -> Result<()>) -> *mut xpu_error {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(e)) => e.into_raw(),
        Err(payload) => {
            let e = Error::from_panic(
                ErrorCode::Internal,
                &format!("the plugin's {function}"),
                &*payload,
            );
            // A payload whose destructor panics must not unwind into C either.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            e.into_raw()
        }
    }
}

/// The process's one value of each plugin type, made on first use and kept for ever.
/// Looked up by `device_count` and `device_open` only, so a lock is cheap enough.
static INSTANCES: Mutex<Vec<(TypeId, &'static (dyn Any + Send + Sync))>> = Mutex::new(Vec::new());

fn instance<P: Plugin>() -> Result<&'static P> {
    let mut list = INSTANCES.lock().unwrap_or_else(|p| p.into_inner());
    let id = TypeId::of::<P>();
    let made = match list.iter().find(|(t, _)| *t == id) {
        Some((_, made)) => *made,
        None => {
            let made: &'static Result<P> = Box::leak(Box::new(P::new()));
            list.push((id, made));
            made
        }
    };
    match made.downcast_ref::<Result<P>>() {
        Some(Ok(plugin)) => Ok(plugin),
        Some(Err(e)) => Err(e.clone()),
        None => Err(Error::internal(
            "the plugin registry holds a value of another type",
        )),
    }
}

/// A device as the host holds it: the plugin's device and what the SDK keeps alive for
/// it (the property strings, the capability strings).
struct DeviceState<P: Plugin> {
    device: P::Device,
    props: RawProperties,
    capabilities: OnceLock<RawStrings>,
    ops: OnceLock<Vec<xpu_op_support>>,
}

/// [`DeviceProperties`] as C values, valid until the device is closed.
struct RawProperties {
    name: CString,
    vendor: CString,
    driver: CString,
    kind: u32,
    dtype_mask: u32,
    memory_bytes: u64,
    max_allocation: u64,
    kernel_arg_alignment: u64,
    timeline_events: u32,
    event_timing: u32,
    kernel_format: Option<CString>,
}

fn c_string(field: &str, value: String) -> Result<CString> {
    CString::new(value).map_err(|_| {
        Error::internal(format!(
            "the device property `{field}` contains a NUL byte; C strings cannot hold it"
        ))
    })
}

impl RawProperties {
    fn new<P: Plugin>(p: DeviceProperties) -> Result<Self> {
        Ok(RawProperties {
            name: c_string("name", p.name)?,
            vendor: c_string("vendor", p.vendor)?,
            driver: c_string("driver", p.driver)?,
            kind: p.kind.raw(),
            dtype_mask: DType::mask(&p.dtypes),
            memory_bytes: p.memory_bytes,
            max_allocation: p.max_allocation,
            kernel_arg_alignment: p.kernel_arg_alignment.max(1),
            timeline_events: u32::from(p.timeline_events),
            event_timing: u32::from(p.event_timing && P::EVENT_TIMING),
            kernel_format: match p.kernel_format {
                Some(f) if P::KERNELS => Some(c_string("kernel_format", f)?),
                _ => None,
            },
        })
    }
}

/// Owned C strings and the array of pointers to them that the host reads.
struct RawStrings {
    _strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

// SAFETY: the pointers point into `_strings`, which is owned, never changed and freed
// with this value; sharing them is sharing immutable bytes.
unsafe impl Send for RawStrings {}
// SAFETY: as above.
unsafe impl Sync for RawStrings {}

impl RawStrings {
    fn new(strings: Vec<String>) -> Result<Self> {
        let strings = strings
            .into_iter()
            .map(|s| c_string("capabilities", s))
            .collect::<Result<Vec<_>>>()?;
        let pointers = strings.iter().map(|s| s.as_ptr()).collect();
        Ok(RawStrings {
            _strings: strings,
            pointers,
        })
    }
}

/// A field name made of a path and a suffix (`xpu_copy_args.dst` + `.buffer`), built
/// only when an error message needs it.
struct Field<'a, D: fmt::Display>(&'a D, &'static str);

impl<D: fmt::Display> fmt::Display for Field<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.0, self.1)
    }
}

/// The name of kernel argument `i`'s range, for messages.
struct KernelArgRange(usize);

impl fmt::Display for KernelArgRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel argument {}'s range", self.0)
    }
}

/// # Safety
/// `ptr` is null or a live device handle of this plugin.
unsafe fn device<'a, P: Plugin>(
    ptr: *mut xpu_device,
    what: &str,
) -> Result<&'a Boxed<DeviceState<P>>> {
    // SAFETY: forwarded contract.
    unsafe { Boxed::borrow(ptr, Kind::Device, what) }
}

/// # Safety
/// `ptr` is null or a live stream handle of this plugin.
unsafe fn stream<'a, P: Plugin>(ptr: *mut xpu_stream, what: &str) -> Result<&'a Boxed<P::Stream>> {
    // SAFETY: forwarded contract.
    unsafe { Boxed::borrow(ptr, Kind::Stream, what) }
}

/// A checked range of a buffer of `device`.
///
/// # Safety
/// `raw.buffer` is null or a live buffer handle of this plugin.
unsafe fn range<P: Plugin>(
    raw: &xpu_buffer_range,
    device: DeviceId,
    what: impl fmt::Display,
) -> Result<BufferRange<P::Buffer>> {
    // SAFETY: forwarded contract.
    let buffer =
        unsafe { Handle::<P::Buffer>::borrow(raw.buffer, Kind::Buffer, Field(&what, ".buffer")) }?;
    let size = Handle::size(&buffer);
    match raw.offset.checked_add(raw.length) {
        Some(end) if end <= size => {}
        _ => {
            return Err(Error::invalid_argument(format!(
                "{what} (offset {}, length {}) does not lie within its buffer of {size} bytes",
                raw.offset, raw.length
            )))
        }
    }
    if Handle::device(&buffer) != device {
        return Err(Error::invalid_argument(format!(
            "{what}.buffer belongs to another device than the stream; copy it over first"
        )));
    }
    Ok(BufferRange {
        buffer,
        offset: raw.offset,
        length: raw.length,
    })
}

fn dtype(raw: u32, what: &str) -> Result<DType> {
    DType::from_raw(raw).ok_or_else(|| {
        Error::unsupported(format!(
            "{what} is {raw}, which is no xpu_dtype of ABI {}.{}",
            XPU_PLUGIN_ABI_MAJOR, XPU_PLUGIN_ABI_MINOR
        ))
    })
}

fn binary_op(raw: u32) -> Result<BinaryOp> {
    BinaryOp::from_raw(raw).ok_or_else(|| {
        Error::unsupported(format!(
            "xpu_builtin_args.op is {raw}, which is no xpu_binary_op of ABI {}.{}",
            XPU_PLUGIN_ABI_MAJOR, XPU_PLUGIN_ABI_MINOR
        ))
    })
}

/// The number of `dtype` elements in `r`, checking alignment and whole elements.
fn elements<B>(r: &BufferRange<B>, dtype: DType, what: &str) -> Result<u64> {
    let size = dtype.size();
    if !r.offset.is_multiple_of(size) || !r.length.is_multiple_of(size) {
        return Err(Error::invalid_argument(format!(
            "{what} (offset {}, length {}) is not aligned to whole {dtype} elements of {size} bytes",
            r.offset, r.length
        )));
    }
    Ok(r.length / size)
}

fn same_count(counts: &[(u64, &str)]) -> Result<()> {
    if let Some(((first, first_name), rest)) = counts.split_first() {
        for (count, name) in rest {
            if count != first {
                return Err(Error::invalid_argument(format!(
                    "{name} holds {count} elements but {first_name} holds {first}; the operands must have the same element count"
                )));
            }
        }
    }
    Ok(())
}

fn identical_or_disjoint<B>(pairs: &[(&BufferRange<B>, &BufferRange<B>, &str)]) -> Result<()> {
    for (x, y, what) in pairs {
        if x.overlaps(y) && !x.same_as(y) {
            return Err(Error::invalid_argument(format!(
                "{what} overlap without being the same range; operands must be identical or disjoint"
            )));
        }
    }
    Ok(())
}

/// Gives a new object to the host through an output field, or takes it back if the
/// field does not fit (which the `MIN_SIZE` check already rules out).
macro_rules! hand_out {
    ($args:expr, $t:ty, $field:ident, $raw:expr, $take_back:expr) => {{
        let raw = $raw;
        if !write_out!($args, $t, $field, raw) {
            $take_back(raw);
            return Err(Error::internal(concat!(
                stringify!($t),
                ".",
                stringify!($field),
                " lies beyond struct_size"
            )));
        }
    }};
}

// ---------------------------------------------------------------------------- devices --

unsafe extern "C" fn device_count<P: Plugin>(args: *mut xpu_device_count_args) -> *mut xpu_error {
    guard("device_count", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        let count = instance::<P>()?.device_count()?;
        write_out!(a, xpu_device_count_args, count, count);
        Ok(())
    })
}

unsafe extern "C" fn device_open<P: Plugin>(args: *mut xpu_device_open_args) -> *mut xpu_error {
    guard("device_open", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        let device = instance::<P>()?.open_device(a.v.index)?;
        let props = RawProperties::new::<P>(device.properties()?)?;
        let state = DeviceState::<P> {
            device,
            props,
            capabilities: OnceLock::new(),
            ops: OnceLock::new(),
        };
        hand_out!(
            a,
            xpu_device_open_args,
            device,
            Boxed::into_raw(Kind::Device, None, state),
            |raw: *mut xpu_device| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Boxed::<DeviceState<P>>::take(raw, Kind::Device, "") })
            }
        );
        Ok(())
    })
}

unsafe extern "C" fn device_close<P: Plugin>(args: *mut xpu_device_close_args) -> *mut xpu_error {
    guard("device_close", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host closes a device it opened, once.
        let state = unsafe {
            Boxed::<DeviceState<P>>::take(a.v.device, Kind::Device, "xpu_device_close_args.device")
        }?;
        drop(state);
        Ok(())
    })
}

unsafe extern "C" fn device_properties<P: Plugin>(
    args: *mut xpu_device_properties_args,
) -> *mut xpu_error {
    guard("device_properties", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_device_properties_args.device") }?;
        let p = &d.value.props;
        type A = xpu_device_properties_args;
        write_out!(a, A, name, p.name.as_ptr());
        write_out!(a, A, vendor, p.vendor.as_ptr());
        write_out!(a, A, driver, p.driver.as_ptr());
        write_out!(a, A, kind, p.kind);
        write_out!(a, A, dtype_mask, p.dtype_mask);
        write_out!(a, A, memory_bytes, p.memory_bytes);
        write_out!(a, A, max_allocation, p.max_allocation);
        write_out!(a, A, kernel_arg_alignment, p.kernel_arg_alignment);
        write_out!(a, A, timeline_events, p.timeline_events);
        write_out!(a, A, event_timing, p.event_timing);
        write_out!(
            a,
            A,
            kernel_format,
            p.kernel_format.as_ref().map_or(ptr::null(), |f| f.as_ptr())
        );
        Ok(())
    })
}

unsafe extern "C" fn memory_info<P: Plugin>(args: *mut xpu_memory_info_args) -> *mut xpu_error {
    guard("memory_info", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_memory_info_args.device") }?;
        let info = d.value.device.memory_info()?;
        write_out!(a, xpu_memory_info_args, total, info.total);
        write_out!(a, xpu_memory_info_args, free, info.free);
        Ok(())
    })
}

unsafe extern "C" fn device_inject_fault<P: Plugin>(
    args: *mut xpu_device_fault_args,
) -> *mut xpu_error {
    guard("device_inject_fault", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_device_fault_args.device") }?;
        let fault = Fault::from_raw(a.v.fault, a.v.delay_ns).ok_or_else(|| {
            Error::unsupported(format!(
                "xpu_device_fault_args.fault is {}, which is no xpu_fault this plugin knows (ABI {XPU_PLUGIN_ABI_MAJOR}.{XPU_PLUGIN_ABI_MINOR}); nothing was injected",
                a.v.fault
            ))
        })?;
        d.value.device.inject_fault(fault)
    })
}

unsafe extern "C" fn capabilities<P: Plugin>(args: *mut xpu_capabilities_args) -> *mut xpu_error {
    guard("capabilities", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_capabilities_args.device") }?;
        let caps = match d.value.capabilities.get() {
            Some(caps) => caps,
            None => {
                let made = RawStrings::new(d.value.device.capabilities()?)?;
                // Another thread may have won the race; either value is the same list.
                let _ = d.value.capabilities.set(made);
                d.value
                    .capabilities
                    .get()
                    .ok_or_else(|| Error::internal("the capability list was not kept"))?
            }
        };
        write_out!(
            a,
            xpu_capabilities_args,
            capabilities,
            caps.pointers.as_ptr()
        );
        write_out!(a, xpu_capabilities_args, count, caps.pointers.len() as u64);
        Ok(())
    })
}

// ----------------------------------------------------------------------------- memory --

unsafe extern "C" fn buffer_allocate<P: Plugin>(
    args: *mut xpu_buffer_allocate_args,
) -> *mut xpu_error {
    guard("buffer_allocate", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_buffer_allocate_args.device") }?;
        let size = a.v.size;
        let max = d.value.props.max_allocation;
        if size == 0 || size > max {
            return Err(Error::invalid_argument(format!(
                "xpu_buffer_allocate_args.size is {size}; it must be from 1 to the device's max_allocation, {max} bytes"
            )));
        }
        let buffer = d.value.device.allocate(size)?;
        hand_out!(
            a,
            xpu_buffer_allocate_args,
            buffer,
            Handle::into_raw(Handle::new(Kind::Buffer, d.device, size, buffer)),
            |raw: *mut xpu_buffer| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Handle::<P::Buffer>::take(raw, Kind::Buffer, "") })
            }
        );
        Ok(())
    })
}

unsafe extern "C" fn buffer_free<P: Plugin>(args: *mut xpu_buffer_free_args) -> *mut xpu_error {
    guard("buffer_free", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host frees a buffer it allocated, once.
        let buffer = unsafe {
            Handle::<P::Buffer>::take(a.v.buffer, Kind::Buffer, "xpu_buffer_free_args.buffer")
        }?;
        drop(buffer);
        Ok(())
    })
}

// ---------------------------------------------------------------------------- streams --

unsafe extern "C" fn stream_create<P: Plugin>(args: *mut xpu_stream_create_args) -> *mut xpu_error {
    guard("stream_create", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_stream_create_args.device") }?;
        let s = d.value.device.create_stream()?;
        hand_out!(
            a,
            xpu_stream_create_args,
            stream,
            Boxed::into_raw(Kind::Stream, Some(d.device), s),
            |raw: *mut xpu_stream| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Boxed::<P::Stream>::take(raw, Kind::Stream, "") })
            }
        );
        Ok(())
    })
}

unsafe extern "C" fn stream_destroy<P: Plugin>(args: *mut xpu_stream_args) -> *mut xpu_error {
    guard("stream_destroy", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host destroys a stream it created, once.
        let s = unsafe {
            Boxed::<P::Stream>::take(a.v.stream, Kind::Stream, "xpu_stream_args.stream")
        }?;
        drop(s);
        Ok(())
    })
}

unsafe extern "C" fn stream_synchronize<P: Plugin>(args: *mut xpu_stream_args) -> *mut xpu_error {
    guard("stream_synchronize", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_stream_args.stream") }?;
        s.value.synchronize()
    })
}

unsafe extern "C" fn stream_query<P: Plugin>(args: *mut xpu_stream_query_args) -> *mut xpu_error {
    guard("stream_query", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_stream_query_args.stream") }?;
        let done = s.value.query()?;
        write_out!(a, xpu_stream_query_args, done, u32::from(done));
        Ok(())
    })
}

fn host_length(a: &xpu_copy_args, range: u64, what: &str) -> Result<usize> {
    if a.length != range {
        return Err(Error::invalid_argument(format!(
            "xpu_copy_args.length is {} but {what}.length is {range}; they must be equal",
            a.length
        )));
    }
    let len = usize::try_from(a.length).map_err(|_| {
        Error::invalid_argument(format!(
            "xpu_copy_args.length ({}) does not fit this process's address space",
            a.length
        ))
    })?;
    if a.host.is_null() && len > 0 {
        return Err(Error::invalid_argument(
            "xpu_copy_args.host is NULL; pass the host memory to copy",
        ));
    }
    Ok(len)
}

unsafe extern "C" fn copy_host_to_device<P: Plugin>(args: *mut xpu_copy_args) -> *mut xpu_error {
    guard("copy_host_to_device", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_copy_args.stream") }?;
        // SAFETY: the host passes a buffer it allocated.
        let dst = unsafe { range::<P>(&a.v.dst, s.device, "xpu_copy_args.dst") }?;
        let len = host_length(&a.v, dst.length, "xpu_copy_args.dst")?;
        // SAFETY: the header makes the host keep `length` bytes at `host` valid until the
        // copy is reported complete; `HostSource`'s accessors require exactly that.
        let src = unsafe { HostSource::from_raw_parts(a.v.host.cast_const().cast(), len) };
        s.value.copy_host_to_device(src, dst)
    })
}

unsafe extern "C" fn copy_device_to_host<P: Plugin>(args: *mut xpu_copy_args) -> *mut xpu_error {
    guard("copy_device_to_host", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_copy_args.stream") }?;
        // SAFETY: the host passes a buffer it allocated.
        let src = unsafe { range::<P>(&a.v.src, s.device, "xpu_copy_args.src") }?;
        let len = host_length(&a.v, src.length, "xpu_copy_args.src")?;
        // SAFETY: as for host-to-device copies; the host does not touch the bytes until
        // the copy is reported complete.
        let dst = unsafe { HostDestination::from_raw_parts(a.v.host.cast(), len) };
        s.value.copy_device_to_host(src, dst)
    })
}

unsafe extern "C" fn copy_device_to_device<P: Plugin>(args: *mut xpu_copy_args) -> *mut xpu_error {
    guard("copy_device_to_device", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_copy_args.stream") }?;
        // SAFETY: the host passes buffers it allocated.
        let src = unsafe { range::<P>(&a.v.src, s.device, "xpu_copy_args.src") }?;
        // SAFETY: as above.
        let dst = unsafe { range::<P>(&a.v.dst, s.device, "xpu_copy_args.dst") }?;
        if src.length != dst.length || a.v.length != src.length {
            return Err(Error::invalid_argument(format!(
                "xpu_copy_args.src.length ({}), dst.length ({}) and length ({}) must be equal",
                src.length, dst.length, a.v.length
            )));
        }
        if src.overlaps(&dst) {
            return Err(Error::invalid_argument(
                "xpu_copy_args.src and dst overlap; a device-to-device copy needs disjoint ranges",
            ));
        }
        s.value.copy_device_to_device(src, dst)
    })
}

unsafe extern "C" fn builtin<P: Plugin>(args: *mut xpu_builtin_args) -> *mut xpu_error {
    guard("builtin", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_builtin_args.stream") }?;
        let dev = s.device;
        // SAFETY (for every `range` below): the host passes buffers it allocated.
        let op = match a.v.kind {
            abi::builtin_kind::FILL => {
                let dtype = dtype(a.v.dtype, "xpu_builtin_args.dtype")?;
                // SAFETY: see above.
                let dst = unsafe { range::<P>(&a.v.dst, dev, "xpu_builtin_args.dst") }?;
                elements(&dst, dtype, "xpu_builtin_args.dst")?;
                Builtin::Fill {
                    dst,
                    value: Scalar::from_le_bytes(dtype, a.v.scalar),
                }
            }
            abi::builtin_kind::BINARY => {
                let op = binary_op(a.v.op)?;
                let dtype = dtype(a.v.dtype, "xpu_builtin_args.dtype")?;
                // SAFETY: see above.
                let dst = unsafe { range::<P>(&a.v.dst, dev, "xpu_builtin_args.dst") }?;
                // SAFETY: see above.
                let x = unsafe { range::<P>(&a.v.a, dev, "xpu_builtin_args.a") }?;
                // SAFETY: see above.
                let y = unsafe { range::<P>(&a.v.b, dev, "xpu_builtin_args.b") }?;
                same_count(&[
                    (
                        elements(&dst, dtype, "xpu_builtin_args.dst")?,
                        "xpu_builtin_args.dst",
                    ),
                    (
                        elements(&x, dtype, "xpu_builtin_args.a")?,
                        "xpu_builtin_args.a",
                    ),
                    (
                        elements(&y, dtype, "xpu_builtin_args.b")?,
                        "xpu_builtin_args.b",
                    ),
                ])?;
                identical_or_disjoint(&[
                    (&dst, &x, "xpu_builtin_args.dst and a"),
                    (&dst, &y, "xpu_builtin_args.dst and b"),
                    (&x, &y, "xpu_builtin_args.a and b"),
                ])?;
                Builtin::Binary {
                    op,
                    dtype,
                    a: x,
                    b: y,
                    dst,
                }
            }
            abi::builtin_kind::ACCUMULATE => {
                let op = binary_op(a.v.op)?;
                let dtype = dtype(a.v.dtype, "xpu_builtin_args.dtype")?;
                // SAFETY: see above.
                let dst = unsafe { range::<P>(&a.v.dst, dev, "xpu_builtin_args.dst") }?;
                // SAFETY: see above.
                let src = unsafe { range::<P>(&a.v.a, dev, "xpu_builtin_args.a") }?;
                same_count(&[
                    (
                        elements(&dst, dtype, "xpu_builtin_args.dst")?,
                        "xpu_builtin_args.dst",
                    ),
                    (
                        elements(&src, dtype, "xpu_builtin_args.a")?,
                        "xpu_builtin_args.a",
                    ),
                ])?;
                identical_or_disjoint(&[(&dst, &src, "xpu_builtin_args.dst and a")])?;
                Builtin::Accumulate {
                    op,
                    dtype,
                    dst,
                    src,
                }
            }
            abi::builtin_kind::SCALE => {
                let dtype = dtype(a.v.dtype, "xpu_builtin_args.dtype")?;
                // SAFETY: see above.
                let dst = unsafe { range::<P>(&a.v.dst, dev, "xpu_builtin_args.dst") }?;
                // SAFETY: see above.
                let src = unsafe { range::<P>(&a.v.a, dev, "xpu_builtin_args.a") }?;
                same_count(&[
                    (
                        elements(&dst, dtype, "xpu_builtin_args.dst")?,
                        "xpu_builtin_args.dst",
                    ),
                    (
                        elements(&src, dtype, "xpu_builtin_args.a")?,
                        "xpu_builtin_args.a",
                    ),
                ])?;
                identical_or_disjoint(&[(&dst, &src, "xpu_builtin_args.dst and a")])?;
                Builtin::Scale {
                    alpha: Scalar::from_le_bytes(dtype, a.v.scalar),
                    src,
                    dst,
                }
            }
            abi::builtin_kind::CAST => {
                let src_dtype = dtype(a.v.dtype, "xpu_builtin_args.dtype")?;
                let dst_dtype = dtype(a.v.dst_dtype, "xpu_builtin_args.dst_dtype")?;
                // SAFETY: see above.
                let dst = unsafe { range::<P>(&a.v.dst, dev, "xpu_builtin_args.dst") }?;
                // SAFETY: see above.
                let src = unsafe { range::<P>(&a.v.a, dev, "xpu_builtin_args.a") }?;
                same_count(&[
                    (
                        elements(&dst, dst_dtype, "xpu_builtin_args.dst")?,
                        "xpu_builtin_args.dst",
                    ),
                    (
                        elements(&src, src_dtype, "xpu_builtin_args.a")?,
                        "xpu_builtin_args.a",
                    ),
                ])?;
                identical_or_disjoint(&[(&dst, &src, "xpu_builtin_args.dst and a")])?;
                Builtin::Cast {
                    src,
                    src_dtype,
                    dst,
                    dst_dtype,
                }
            }
            other => {
                return Err(Error::unsupported(format!(
                    "xpu_builtin_args.kind is {other}, which is no xpu_builtin_kind of ABI {}.{}",
                    XPU_PLUGIN_ABI_MAJOR, XPU_PLUGIN_ABI_MINOR
                )))
            }
        };
        s.value.builtin(op)
    })
}

// ----------------------------------------------------------------------------- events --

unsafe extern "C" fn event_record<P: Plugin>(args: *mut xpu_event_record_args) -> *mut xpu_error {
    guard("event_record", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_event_record_args.stream") }?;
        let event = s.value.record_event()?;
        hand_out!(
            a,
            xpu_event_record_args,
            event,
            Handle::into_raw(Handle::new(Kind::Event, s.device, 0, event)),
            |raw: *mut xpu_event| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Handle::<P::Event>::take(raw, Kind::Event, "") })
            }
        );
        Ok(())
    })
}

unsafe extern "C" fn event_destroy<P: Plugin>(args: *mut xpu_event_args) -> *mut xpu_error {
    guard("event_destroy", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host destroys an event it recorded, once.
        let e =
            unsafe { Handle::<P::Event>::take(a.v.event, Kind::Event, "xpu_event_args.event") }?;
        drop(e);
        Ok(())
    })
}

unsafe extern "C" fn event_query<P: Plugin>(args: *mut xpu_event_query_args) -> *mut xpu_error {
    guard("event_query", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes an event it recorded.
        let e = unsafe {
            Handle::<P::Event>::borrow(a.v.event, Kind::Event, "xpu_event_query_args.event")
        }?;
        let done = e.query()?;
        write_out!(a, xpu_event_query_args, done, u32::from(done));
        Ok(())
    })
}

unsafe extern "C" fn event_wait<P: Plugin>(args: *mut xpu_event_wait_args) -> *mut xpu_error {
    guard("event_wait", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes an event it recorded.
        let e = unsafe {
            Handle::<P::Event>::borrow(a.v.event, Kind::Event, "xpu_event_wait_args.event")
        }?;
        e.wait(timeout_from_ns(a.v.timeout_ns))
    })
}

unsafe extern "C" fn event_elapsed<P: Plugin>(args: *mut xpu_event_elapsed_args) -> *mut xpu_error {
    guard("event_elapsed", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes events it recorded.
        let start = unsafe {
            Handle::<P::Event>::borrow(a.v.start, Kind::Event, "xpu_event_elapsed_args.start")
        }?;
        // SAFETY: as above.
        let end = unsafe {
            Handle::<P::Event>::borrow(a.v.end, Kind::Event, "xpu_event_elapsed_args.end")
        }?;
        if Handle::device(&start) != Handle::device(&end) {
            return Err(Error::invalid_argument(
                "xpu_event_elapsed_args.start and end belong to different devices; elapsed time needs two events of one device",
            ));
        }
        let elapsed = end.elapsed_since(&start)?;
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        write_out!(a, xpu_event_elapsed_args, elapsed_ns, ns);
        Ok(())
    })
}

unsafe extern "C" fn stream_wait_event<P: Plugin>(
    args: *mut xpu_stream_wait_event_args,
) -> *mut xpu_error {
    guard("stream_wait_event", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_stream_wait_event_args.stream") }?;
        // SAFETY: the host passes an event it recorded (on any device of this plugin).
        let e = unsafe {
            Handle::<P::Event>::borrow(a.v.event, Kind::Event, "xpu_stream_wait_event_args.event")
        }?;
        s.value.wait_event(&e)
    })
}

/// The host's external event, owned by the SDK from the moment the call's arguments
/// are read. Dropping it calls `release` (once), so every path — the waiter thread
/// finishing, a refused call, a thread that could not start — gives it back exactly
/// once.
struct External {
    context: *mut std::ffi::c_void,
    wait: Option<unsafe extern "C" fn(*mut std::ffi::c_void) -> i32>,
    release: Option<unsafe extern "C" fn(*mut std::ffi::c_void)>,
}

// SAFETY: the header says `wait` and `release` are thread-safe and made to be called
// on a plugin thread; the context is only passed back to them.
unsafe impl Send for External {}

impl External {
    /// Calls the host's `wait` (once: it consumes the event, and `release` follows when
    /// it is dropped). `None` if there is no `wait`.
    fn wait(&mut self) -> Option<i32> {
        let wait = self.wait.take()?;
        // SAFETY: `wait` and `context` are the host's; called once, on a plugin thread.
        Some(unsafe { wait(self.context) })
    }
}

impl Drop for External {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            // SAFETY: `release` and `context` are the host's; called exactly once, after
            // `wait` if it was called at all.
            unsafe { release(self.context) };
        }
    }
}

/// How the waiter thread learns whether the stream took the wait.
enum Go {
    /// The stream accepted the wait: call `wait`, then `release`.
    Run,
    /// The call failed: only `release`.
    Cancel,
}

unsafe extern "C" fn stream_wait_external<P: Plugin>(
    args: *mut xpu_stream_wait_external_args,
) -> *mut xpu_error {
    guard("stream_wait_external", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // Ownership passes with the call: from here on, every return releases the
        // event (through `External`'s drop), whether the call succeeds or not.
        let x = a.v.external;
        let mut external = External {
            context: x.context,
            wait: x.wait,
            release: x.release,
        };
        if external.wait.is_none() || external.release.is_none() {
            return Err(Error::invalid_argument(
                "xpu_stream_wait_external_args.external needs both `wait` and `release`",
            ));
        }
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_stream_wait_external_args.stream") }?;
        let (pending, signal) = ExternalWait::pending();
        let (go_tx, go_rx) = mpsc::sync_channel::<Go>(1);
        // The thread is started before the stream sees the wait, so that a failure to
        // start it is an error of this call (and drops, so releases, the event).
        std::thread::Builder::new()
            .name(format!("xpu-{}-external-wait", P::NAME.to_string_lossy()))
            .spawn(move || {
                // A dropped sender (the plugin panicked) counts as a cancel.
                if !matches!(go_rx.recv(), Ok(Go::Run)) {
                    return; // `external` drops here: release only.
                }
                let status = external.wait().unwrap_or(1);
                // Released before the stream's later work is let go, so that a host
                // that has seen that work complete finds the event given back.
                drop(external);
                let outcome = if status == 0 {
                    Ok(())
                } else {
                    Err(Error::aborted(format!(
                        "the event of another backend that this stream waited for reports that the work before it failed (status {status})"
                    )))
                };
                // Callbacks run here; a panicking one must not take the thread down.
                let _ = catch_unwind(AssertUnwindSafe(move || signal.complete(outcome)));
            })
            .map_err(|e| {
                Error::internal(format!(
                    "could not start a thread to wait for another backend's event: {e}"
                ))
            })?;
        match s.value.wait_external(pending) {
            Ok(()) => {
                // The thread holds the receiver until it has read this, so it cannot fail.
                let _ = go_tx.send(Go::Run);
                Ok(())
            }
            Err(e) => {
                let _ = go_tx.send(Go::Cancel);
                Err(e)
            }
        }
    })
}

// ---------------------------------------------------------------------------- kernels --

fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::invalid_argument(format!("{what} is NULL")));
    }
    // SAFETY: the header makes the host pass NUL-terminated strings valid for the call;
    // the returned borrow does not outlive the entry point that made it.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Error::invalid_argument(format!("{what} is not UTF-8")))
}

unsafe extern "C" fn kernel_load<P: Plugin>(args: *mut xpu_kernel_load_args) -> *mut xpu_error {
    guard("kernel_load", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a device it opened.
        let d = unsafe { device::<P>(a.v.device, "xpu_kernel_load_args.device") }?;
        let format = c_str(a.v.format, "xpu_kernel_load_args.format")?;
        let entry_point = c_str(a.v.entry_point, "xpu_kernel_load_args.entry_point")?;
        let len = usize::try_from(a.v.code_length).map_err(|_| {
            Error::invalid_argument(
                "xpu_kernel_load_args.code_length does not fit this process's address space",
            )
        })?;
        let code: &[u8] = if len == 0 {
            &[]
        } else if a.v.code.is_null() {
            return Err(Error::invalid_argument("xpu_kernel_load_args.code is NULL"));
        } else {
            // SAFETY: the host passes `code_length` bytes at `code`, valid for the call.
            unsafe { std::slice::from_raw_parts(a.v.code, len) }
        };
        let kernel = d.value.device.load_kernel(KernelCode {
            format,
            code,
            entry_point,
        })?;
        hand_out!(
            a,
            xpu_kernel_load_args,
            kernel,
            Handle::into_raw(Handle::new(Kind::Kernel, d.device, 0, kernel)),
            |raw: *mut xpu_kernel| {
                // SAFETY: `raw` was just made and never given out.
                drop(unsafe { Handle::<P::Kernel>::take(raw, Kind::Kernel, "") })
            }
        );
        Ok(())
    })
}

unsafe extern "C" fn kernel_destroy<P: Plugin>(
    args: *mut xpu_kernel_destroy_args,
) -> *mut xpu_error {
    guard("kernel_destroy", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host destroys a kernel it loaded, once.
        let k = unsafe {
            Handle::<P::Kernel>::take(a.v.kernel, Kind::Kernel, "xpu_kernel_destroy_args.kernel")
        }?;
        drop(k);
        Ok(())
    })
}

unsafe extern "C" fn kernel_launch<P: Plugin>(args: *mut xpu_kernel_launch_args) -> *mut xpu_error {
    guard("kernel_launch", || {
        // SAFETY: the host passes a valid struct (ABI contract).
        let a = unsafe { read(args) }?;
        // SAFETY: the host passes a stream it created.
        let s = unsafe { stream::<P>(a.v.stream, "xpu_kernel_launch_args.stream") }?;
        // SAFETY: the host passes a kernel it loaded.
        let kernel = unsafe {
            Handle::<P::Kernel>::borrow(a.v.kernel, Kind::Kernel, "xpu_kernel_launch_args.kernel")
        }?;
        if Handle::device(&kernel) != s.device {
            return Err(Error::invalid_argument(
                "xpu_kernel_launch_args.kernel was loaded on another device than the stream's; load it on this device",
            ));
        }
        if a.v.grid.contains(&0) || a.v.block.contains(&0) {
            return Err(Error::invalid_argument(format!(
                "xpu_kernel_launch_args.grid {:?} and block {:?} must be at least 1 in every dimension",
                a.v.grid, a.v.block
            )));
        }
        let count = usize::try_from(a.v.arg_count).map_err(|_| {
            Error::invalid_argument("xpu_kernel_launch_args.arg_count is too large")
        })?;
        let raw_args: &[xpu_kernel_arg] = if count == 0 {
            &[]
        } else if a.v.args.is_null() {
            return Err(Error::invalid_argument(format!(
                "xpu_kernel_launch_args.args is NULL but arg_count is {count}"
            )));
        } else {
            // SAFETY: the host passes `arg_count` arguments at `args`, valid for the call.
            unsafe { std::slice::from_raw_parts(a.v.args, count) }
        };
        let mut out = Vec::with_capacity(count);
        for (i, arg) in raw_args.iter().enumerate() {
            out.push(match arg.kind {
                abi::kernel_arg_kind::BUFFER => {
                    let access = Access::from_raw(arg.access).ok_or_else(|| {
                        Error::unsupported(format!(
                            "kernel argument {i}: access {} is no xpu_access of ABI 1.0",
                            arg.access
                        ))
                    })?;
                    let range = if arg.range.length == 0 {
                        None
                    } else {
                        // SAFETY: the host passes buffers it allocated.
                        Some(unsafe { range::<P>(&arg.range, s.device, KernelArgRange(i)) }?)
                    };
                    KernelArg::Buffer { range, access }
                }
                abi::kernel_arg_kind::SCALAR => {
                    let dtype = dtype(arg.dtype, &format!("kernel argument {i}'s dtype"))?;
                    KernelArg::Scalar(Scalar::from_le_bytes(dtype, arg.scalar))
                }
                other => {
                    return Err(Error::unsupported(format!(
                        "kernel argument {i}: kind {other} is no xpu_kernel_arg_kind of ABI 1.0"
                    )))
                }
            });
        }
        let dims = LaunchDims {
            grid: a.v.grid,
            block: a.v.block,
        };
        s.value.launch(&kernel, dims, out)
    })
}

// ------------------------------------------------------------- standard operations --

mod std_ops;

// -------------------------------------------------------------- native collectives --

mod group;

// ------------------------------------------------------------------ table and entry --

/// Whether `name` is a valid plugin name: `[a-z0-9_-]+`. Checked at compile time by
/// [`export_plugin!`](crate::export_plugin).
pub const fn valid_name(name: &CStr) -> bool {
    let bytes = name.to_bytes();
    if bytes.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if !matches!(bytes[i], b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-') {
            return false;
        }
        i += 1;
    }
    true
}

/// The capabilities extension of `P`'s table (used by
/// [`export_plugin!`](crate::export_plugin), which places it in a static).
pub const fn capabilities_extension<P: Plugin>() -> xpu_capabilities_extension {
    xpu_capabilities_extension {
        base: xpu_extension_base {
            struct_size: struct_size!(xpu_capabilities_extension, capabilities),
            type_: abi::extension_type::CAPABILITIES,
            next: ptr::null(),
        },
        capabilities: Some(capabilities::<P> as unsafe extern "C" fn(_) -> _),
    }
}

/// `P`'s function table (used by [`export_plugin!`](crate::export_plugin), which places
/// it in a static). Event timing, kernels and native collectives (ABI 1.3, across
/// processes 1.4) are present
/// as `P`'s constants say; the standard operations (ABI 1.1) and fault injection (ABI
/// 1.2) always are, and their trait defaults provide none.
pub const fn api_table<P: Plugin>(
    capabilities: &'static xpu_capabilities_extension,
) -> xpu_plugin_api {
    macro_rules! f {
        ($name:ident) => {
            Some($name::<P> as unsafe extern "C" fn(_) -> _)
        };
    }
    xpu_plugin_api {
        struct_size: struct_size!(xpu_plugin_api, group_id),
        extensions: (capabilities as *const xpu_capabilities_extension).cast(),
        abi_major: XPU_PLUGIN_ABI_MAJOR,
        abi_minor: XPU_PLUGIN_ABI_MINOR,
        name: P::NAME.as_ptr(),
        version: P::VERSION.as_ptr(),
        error_code: Some(crate::error::error_code as unsafe extern "C" fn(_) -> _),
        error_message: Some(crate::error::error_message as unsafe extern "C" fn(_) -> _),
        error_destroy: Some(crate::error::error_destroy as unsafe extern "C" fn(_)),
        device_count: f!(device_count),
        device_open: f!(device_open),
        device_close: f!(device_close),
        device_properties: f!(device_properties),
        memory_info: f!(memory_info),
        buffer_allocate: f!(buffer_allocate),
        buffer_free: f!(buffer_free),
        stream_create: f!(stream_create),
        stream_destroy: f!(stream_destroy),
        stream_synchronize: f!(stream_synchronize),
        stream_query: f!(stream_query),
        copy_host_to_device: f!(copy_host_to_device),
        copy_device_to_host: f!(copy_device_to_host),
        copy_device_to_device: f!(copy_device_to_device),
        builtin: f!(builtin),
        event_record: f!(event_record),
        event_destroy: f!(event_destroy),
        event_query: f!(event_query),
        event_wait: f!(event_wait),
        stream_wait_event: f!(stream_wait_event),
        stream_wait_external: f!(stream_wait_external),
        event_elapsed: if P::EVENT_TIMING {
            f!(event_elapsed)
        } else {
            None
        },
        kernel_load: if P::KERNELS { f!(kernel_load) } else { None },
        kernel_destroy: if P::KERNELS { f!(kernel_destroy) } else { None },
        kernel_launch: if P::KERNELS { f!(kernel_launch) } else { None },
        device_ops: Some(std_ops::device_ops::<P> as unsafe extern "C" fn(_) -> _),
        op_enqueue: Some(std_ops::op_enqueue::<P> as unsafe extern "C" fn(_) -> _),
        device_inject_fault: f!(device_inject_fault),
        group_create: if P::COLLECTIVES {
            Some(group::group_create::<P> as unsafe extern "C" fn(_) -> _)
        } else {
            None
        },
        group_run: if P::COLLECTIVES {
            Some(group::group_run::<P> as unsafe extern "C" fn(_) -> _)
        } else {
            None
        },
        group_abort: if P::COLLECTIVES {
            Some(group::group_abort::<P> as unsafe extern "C" fn(_) -> _)
        } else {
            None
        },
        group_destroy: if P::COLLECTIVES {
            Some(group::group_destroy::<P> as unsafe extern "C" fn(_) -> _)
        } else {
            None
        },
        group_id: if P::COLLECTIVES && P::COLLECTIVES_ACROSS {
            Some(group::group_id::<P> as unsafe extern "C" fn(_) -> _)
        } else {
            None
        },
    }
}

/// The body of the entry point: version negotiation. Returns `api` for a host of ABI
/// major version [`XPU_PLUGIN_ABI_MAJOR`] (any minor), and NULL for a NULL or too small
/// `xpu_host_info` or another major version. Never unwinds.
///
/// # Safety
/// `host` is null or points to an `xpu_host_info` of at least its `struct_size` bytes,
/// valid for the call.
pub unsafe fn get_api(
    host: *const xpu_host_info,
    api: &'static xpu_plugin_api,
) -> *const xpu_plugin_api {
    let accepted = catch_unwind(|| {
        if host.is_null() {
            return false;
        }
        // SAFETY: the struct starts with `size_t struct_size` (forwarded contract).
        let size = unsafe { host.cast::<usize>().read_unaligned() };
        if size < struct_size!(xpu_host_info, abi_minor) {
            return false;
        }
        // SAFETY: `abi_major` lies within `struct_size` (checked above).
        let major = unsafe { ptr::addr_of!((*host).abi_major).read_unaligned() };
        major == XPU_PLUGIN_ABI_MAJOR
    });
    if matches!(accepted, Ok(true)) {
        api
    } else {
        ptr::null()
    }
}
