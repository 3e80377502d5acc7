//! The conformance suite's `abi` profile: checks that call a plugin's C table itself,
//! beneath the HAL, where the host's own validation cannot hide what the plugin does.
//!
//! Each check is named (`DeviceImpl::abi_check`) and runs on one open device of the
//! plugin:
//!
//! - `struct_sizes` — argument structs larger than the plugin knows (a newer host) are
//!   accepted, give the same answers, and the bytes beyond what the plugin knows are
//!   left alone; structs smaller than their `MIN_SIZE` are `XPU_ERROR_INVALID_ARGUMENT`.
//! - `null_arguments` — every function of the table refuses a NULL argument struct
//!   with `XPU_ERROR_INVALID_ARGUMENT`.
//! - `null_handles` — a NULL device, buffer, stream or event where the function needs
//!   one is `XPU_ERROR_INVALID_ARGUMENT`, also when the other handles are valid.
//! - `properties` — the device's name, vendor and driver are non-empty strings, its
//!   kind and dtypes are values the ABI defines, its memory and largest allocation are
//!   positive and consistent, and a device that names a kernel format has kernel
//!   functions and a power-of-two argument alignment.
//! - `enumeration` — `device_count` is the same on every call, and opening an index at
//!   or past it is `XPU_ERROR_INVALID_ARGUMENT`.
//! - `out_of_memory` — allocations that each fit but together do not end in
//!   `XPU_ERROR_OUT_OF_MEMORY` (no other code), and freeing them gives all the memory
//!   back.
//! - `error_objects` — an error has a code the ABI defines and a message, both stable
//!   until it is destroyed.
//! - `unknown_values` — a builtin kind or dtype the ABI does not define is refused
//!   (`UNSUPPORTED` or `INVALID_ARGUMENT`), not run; an unknown fault number is
//!   `XPU_ERROR_UNSUPPORTED`.
//! - `entry_point` — the entry point, called again, returns a table with the same
//!   name, version and ABI.

use std::ffi::CStr;
use std::mem::size_of;

use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::struct_size;

use crate::device::DeviceShared;
use crate::error::PluginError;
use crate::load::{Args, Func, Plugin, HOST_ABI};

/// The names of the checks, in the order the suite lists them.
pub(crate) const CHECKS: &[&str] = &[
    "struct_sizes",
    "null_arguments",
    "null_handles",
    "properties",
    "enumeration",
    "out_of_memory",
    "error_objects",
    "unknown_values",
    "entry_point",
];

/// Bytes a "newer host" appends to an argument struct.
const TAIL: usize = 64;
/// What those bytes hold; a plugin that writes beyond what it knows changes them.
const SENTINEL: u8 = 0xA5;

/// An argument struct with bytes beyond it, as a host of a newer minor version passes.
#[repr(C)]
struct Padded<A> {
    args: A,
    tail: [u8; TAIL],
}

impl<A: Args> Padded<A> {
    fn new() -> Self {
        let mut args = A::new();
        set_size(&mut args, size_of::<Padded<A>>());
        Padded {
            args,
            tail: [SENTINEL; TAIL],
        }
    }

    fn tail_intact(&self) -> bool {
        self.tail.iter().all(|&b| b == SENTINEL)
    }
}

/// Sets an argument struct's `struct_size`, its first field in every version.
fn set_size<A: Args>(args: &mut A, size: usize) {
    // SAFETY: every argument struct starts with `size_t struct_size` (the header's
    // rule, mirrored by `args_struct!`), so its first `usize` is that field.
    unsafe { (args as *mut A).cast::<usize>().write(size) };
}

/// Runs check `name` on `device`.
pub(crate) fn run(device: &DeviceShared, name: &str) -> Result<(), String> {
    let plugin = &device.plugin;
    // The device is open, and stays open while `device` is borrowed: every check
    // below may call the table with its handle.
    let result = match name {
        "struct_sizes" => struct_sizes(plugin, device),
        "null_arguments" => null_arguments(plugin),
        "null_handles" => null_handles(plugin, device),
        "properties" => properties(plugin, device),
        "enumeration" => enumeration(plugin),
        "out_of_memory" => out_of_memory(plugin, device),
        "error_objects" => error_objects(plugin),
        "unknown_values" => unknown_values(plugin, device),
        "entry_point" => entry_point(plugin),
        other => Err(format!(
            "no ABI check is called `{other}`; the checks are {}",
            CHECKS.join(", ")
        )),
    };
    result.map_err(|e| format!("{}: {e}", device.id))
}

/// The error's code, or a message saying the call succeeded.
fn code_of(result: Result<(), PluginError>, what: &str) -> Result<u32, String> {
    match result {
        Ok(()) => Err(format!("{what} succeeded")),
        Err(e) => Ok(e.code),
    }
}

/// `result` must be an error with `code`.
fn expect_code(
    result: Result<(), PluginError>,
    code: u32,
    code_name: &str,
    what: &str,
) -> Result<(), String> {
    match result {
        Ok(()) => Err(format!("{what} succeeded; it must fail with {code_name}")),
        Err(e) if e.code == code => Ok(()),
        Err(e) => Err(format!(
            "{what} failed with code {} ({}); it must be {code_name}",
            e.code, e.message
        )),
    }
}

/// Calls `f` with `args` sized as this host knows it, with a padded copy, and with
/// `struct_size` one byte below the minimum; `same` compares the padded call's
/// outputs with the exact call's, `release` undoes a successful call.
///
/// # Safety
/// `f` is the plugin's function for argument structs of type `A`; `fill` makes a
/// valid call of it.
unsafe fn sizes<A: Args + Copy>(
    plugin: &Plugin,
    f: Func<A>,
    function: &'static str,
    fill: impl Fn(&mut A),
    same: impl Fn(&A, &A) -> Result<(), String>,
    release: impl Fn(&A),
) -> Result<(), String> {
    let mut exact = A::new();
    fill(&mut exact);
    // SAFETY: the caller's contract.
    unsafe { plugin.call_raw(f, &mut exact, function) }
        .map_err(|e| format!("{function} with the struct as this host knows it: {e}"))?;
    release(&exact);
    let mut padded = Padded::<A>::new();
    let size = size_of::<Padded<A>>();
    fill(&mut padded.args);
    set_size(&mut padded.args, size);
    // SAFETY: the caller's contract; the struct is followed by its tail, so all of the
    // `struct_size` bytes it declares are valid.
    let outcome = unsafe { plugin.call_raw(f, &mut padded.args, function) };
    if outcome.is_ok() {
        release(&padded.args);
    }
    outcome.map_err(|e| {
        format!("{function} with struct_size {size} (a newer host's larger struct) failed: {e}; a plugin must accept a struct larger than it knows and read only its own fields")
    })?;
    if !padded.tail_intact() {
        return Err(format!(
            "{function} wrote beyond the fields it knows into a larger struct (struct_size {size}); write only the output fields of your own version"
        ));
    }
    same(&exact, &padded.args).map_err(|e| {
        format!("{function} answered differently for a larger struct (struct_size {size}): {e}")
    })?;
    let mut small = A::new();
    fill(&mut small);
    let min = A::new();
    let below = first_usize(&min) - 1;
    set_size(&mut small, below);
    // SAFETY: the caller's contract; the struct is whole, only its declared size is
    // too small.
    let outcome = unsafe { plugin.call_raw(f, &mut small, function) };
    if outcome.is_ok() {
        release(&small);
    }
    expect_code(
        outcome,
        error_code::INVALID_ARGUMENT,
        "XPU_ERROR_INVALID_ARGUMENT",
        &format!("{function} with struct_size {below}, one byte below its MIN_SIZE"),
    )
}

/// An argument struct's `struct_size`.
fn first_usize<A: Args>(args: &A) -> usize {
    // SAFETY: as for `set_size`: the first field is `size_t struct_size`.
    unsafe { (args as *const A).cast::<usize>().read() }
}

/// A plugin string (may be NULL) as Rust text.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string the plugin keeps valid during the call.
unsafe fn text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn struct_sizes(plugin: &Plugin, device: &DeviceShared) -> Result<(), String> {
    let t = &plugin.table;
    let d = device.handle.0;
    // SAFETY: each call below passes the plugin's own function for the struct type,
    // filled with the open device.
    unsafe {
        sizes(
            plugin,
            t.device_count,
            "device_count",
            |_| {},
            |a: &xpu_device_count_args, b| {
                (a.count == b.count)
                    .then_some(())
                    .ok_or_else(|| format!("count {} against {}", b.count, a.count))
            },
            |_| {},
        )?;
        sizes(
            plugin,
            t.device_properties,
            "device_properties",
            |a: &mut xpu_device_properties_args| a.device = d,
            |a, b| {
                let same = text(a.name) == text(b.name)
                    && a.memory_bytes == b.memory_bytes
                    && a.max_allocation == b.max_allocation
                    && a.dtype_mask == b.dtype_mask
                    && a.kind == b.kind;
                same.then_some(()).ok_or_else(|| {
                    "name, memory, largest allocation, dtypes or kind differ".to_string()
                })
            },
            |_| {},
        )?;
        sizes(
            plugin,
            t.memory_info,
            "memory_info",
            |a: &mut xpu_memory_info_args| a.device = d,
            |a, b| {
                (a.total == b.total)
                    .then_some(())
                    .ok_or_else(|| format!("total {} against {}", b.total, a.total))
            },
            |_| {},
        )?;
        let free_buffer = |a: &xpu_buffer_allocate_args| {
            let mut f = xpu_buffer_free_args::new();
            f.buffer = a.buffer;
            // SAFETY: a buffer the plugin just allocated, freed once.
            if let Err(e) = plugin.call_raw(t.buffer_free, &mut f, "buffer_free") {
                plugin.record(format!("{}: abi check: {e}", device.id));
            }
        };
        sizes(
            plugin,
            t.buffer_allocate,
            "buffer_allocate",
            |a: &mut xpu_buffer_allocate_args| {
                a.device = d;
                a.size = 4096;
            },
            |_, b| {
                (!b.buffer.is_null())
                    .then_some(())
                    .ok_or_else(|| "no buffer".to_string())
            },
            free_buffer,
        )?;
        let destroy = |a: &xpu_stream_create_args| {
            let mut s = xpu_stream_args::new();
            s.stream = a.stream;
            // SAFETY: a stream the plugin just created, with no work, destroyed once.
            if let Err(e) = plugin.call_raw(t.stream_destroy, &mut s, "stream_destroy") {
                plugin.record(format!("{}: abi check: {e}", device.id));
            }
        };
        sizes(
            plugin,
            t.stream_create,
            "stream_create",
            |a: &mut xpu_stream_create_args| a.device = d,
            |_, b| {
                (!b.stream.is_null())
                    .then_some(())
                    .ok_or_else(|| "no stream".to_string())
            },
            destroy,
        )?;
    }
    Ok(())
}

fn null_arguments(plugin: &Plugin) -> Result<(), String> {
    let t = &plugin.table;
    macro_rules! null {
        ($($f:ident),* $(,)?) => {{
            let mut wrong = Vec::new();
            $(
                // SAFETY: the header's functions take a pointer to their argument
                // struct; NULL is what this check passes, and the plugin must refuse it.
                let e = unsafe { (t.$f)(std::ptr::null_mut()) };
                let outcome = if e.is_null() {
                    Ok(())
                } else {
                    // SAFETY: a fresh error object of this plugin.
                    Err(unsafe { plugin.take_error(e, stringify!($f)) })
                };
                if let Err(m) = expect_code(
                    outcome,
                    error_code::INVALID_ARGUMENT,
                    "XPU_ERROR_INVALID_ARGUMENT",
                    concat!(stringify!($f), " with NULL arguments"),
                ) {
                    wrong.push(m);
                }
            )*
            wrong
        }};
    }
    let wrong = null!(
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
    );
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Calls `f` with `args` and requires `XPU_ERROR_INVALID_ARGUMENT`, collecting what went
/// otherwise into `wrong`.
///
/// # Safety
/// `f` is the plugin's function for `A`; `args` is valid apart from the NULL handle the
/// check is about.
unsafe fn refuses<A>(
    plugin: &Plugin,
    f: Func<A>,
    mut args: A,
    what: &str,
    wrong: &mut Vec<String>,
) {
    // SAFETY: the caller's contract.
    let outcome = unsafe { plugin.call_raw(f, &mut args, "") };
    if let Err(m) = expect_code(
        outcome,
        error_code::INVALID_ARGUMENT,
        "XPU_ERROR_INVALID_ARGUMENT",
        what,
    ) {
        wrong.push(m);
    }
}

fn null_handles(plugin: &Plugin, device: &DeviceShared) -> Result<(), String> {
    let t = &plugin.table;
    let d = device.handle.0;
    let mut wrong = Vec::new();
    // A live stream and event, for the calls where the other handle is the NULL one.
    let mut sc = xpu_stream_create_args::new();
    sc.device = d;
    // SAFETY: a fresh argument struct with the open device.
    unsafe { plugin.call_raw(t.stream_create, &mut sc, "stream_create") }
        .map_err(|e| e.to_string())?;
    let stream = sc.stream;
    // SAFETY: every call below passes the plugin's own function with an argument
    // struct that is valid apart from the NULL handle the call is about.
    unsafe {
        let mut a = xpu_buffer_allocate_args::new();
        a.size = 64;
        refuses(
            plugin,
            t.buffer_allocate,
            a,
            "buffer_allocate on a NULL device",
            &mut wrong,
        );
        refuses(
            plugin,
            t.device_properties,
            xpu_device_properties_args::new(),
            "device_properties of a NULL device",
            &mut wrong,
        );
        refuses(
            plugin,
            t.memory_info,
            xpu_memory_info_args::new(),
            "memory_info of a NULL device",
            &mut wrong,
        );
        refuses(
            plugin,
            t.stream_create,
            xpu_stream_create_args::new(),
            "stream_create on a NULL device",
            &mut wrong,
        );
        refuses(
            plugin,
            t.device_close,
            xpu_device_close_args::new(),
            "device_close of a NULL device",
            &mut wrong,
        );
        refuses(
            plugin,
            t.buffer_free,
            xpu_buffer_free_args::new(),
            "buffer_free of a NULL buffer",
            &mut wrong,
        );
        refuses(
            plugin,
            t.stream_synchronize,
            xpu_stream_args::new(),
            "stream_synchronize of a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.stream_destroy,
            xpu_stream_args::new(),
            "stream_destroy of a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.stream_query,
            xpu_stream_query_args::new(),
            "stream_query of a NULL stream",
            &mut wrong,
        );
        let mut host = [0u8; 8];
        let mut c = xpu_copy_args::new();
        c.host = host.as_mut_ptr().cast();
        refuses(
            plugin,
            t.copy_host_to_device,
            c,
            "copy_host_to_device on a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.copy_device_to_host,
            c,
            "copy_device_to_host on a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.copy_device_to_device,
            xpu_copy_args::new(),
            "copy_device_to_device on a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.builtin,
            xpu_builtin_args::new(),
            "builtin on a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.event_record,
            xpu_event_record_args::new(),
            "event_record on a NULL stream",
            &mut wrong,
        );
        refuses(
            plugin,
            t.event_query,
            xpu_event_query_args::new(),
            "event_query of a NULL event",
            &mut wrong,
        );
        refuses(
            plugin,
            t.event_wait,
            xpu_event_wait_args::new(),
            "event_wait on a NULL event",
            &mut wrong,
        );
        refuses(
            plugin,
            t.event_destroy,
            xpu_event_args::new(),
            "event_destroy of a NULL event",
            &mut wrong,
        );
        let mut w = xpu_stream_wait_event_args::new();
        w.stream = stream;
        refuses(
            plugin,
            t.stream_wait_event,
            w,
            "stream_wait_event on a NULL event (the stream live)",
            &mut wrong,
        );
        let mut w = xpu_stream_wait_event_args::new();
        let mut r = xpu_event_record_args::new();
        r.stream = stream;
        if plugin
            .call_raw(t.event_record, &mut r, "event_record")
            .is_ok()
        {
            w.event = r.event;
            refuses(
                plugin,
                t.stream_wait_event,
                w,
                "stream_wait_event on a NULL stream (the event live)",
                &mut wrong,
            );
            let mut e = xpu_event_args::new();
            e.event = r.event;
            let _ = plugin.call_raw(t.event_destroy, &mut e, "event_destroy");
        }
        if let Some(k) = &t.kernels {
            refuses(
                plugin,
                k.load,
                xpu_kernel_load_args::new(),
                "kernel_load on a NULL device",
                &mut wrong,
            );
            refuses(
                plugin,
                k.launch,
                xpu_kernel_launch_args::new(),
                "kernel_launch on a NULL stream and kernel",
                &mut wrong,
            );
        }
        let mut s = xpu_stream_args::new();
        s.stream = stream;
        if let Err(e) = plugin.call_raw(t.stream_destroy, &mut s, "stream_destroy") {
            plugin.record(format!("{}: abi check: {e}", device.id));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn properties(plugin: &Plugin, device: &DeviceShared) -> Result<(), String> {
    let mut p = xpu_device_properties_args::new();
    p.device = device.handle.0;
    // SAFETY: a fresh argument struct with the open device.
    unsafe { plugin.call_raw(plugin.table.device_properties, &mut p, "device_properties") }
        .map_err(|e| e.to_string())?;
    let mut wrong = Vec::new();
    for (field, value) in [("name", p.name), ("vendor", p.vendor), ("driver", p.driver)] {
        // SAFETY: a string the plugin returned, valid until the device is closed.
        match unsafe { text(value) } {
            Some(t) if !t.trim().is_empty() => {}
            Some(_) => wrong.push(format!("{field} is empty")),
            None => wrong.push(format!("{field} is NULL")),
        }
    }
    if p.kind > device_kind::OTHER {
        wrong.push(format!("kind {} is not an xpu_device_kind", p.kind));
    }
    let defined = (1u32 << 7) - 1;
    if p.dtype_mask & !defined != 0 {
        wrong.push(format!(
            "dtype_mask {:#x} has bits of no xpu_dtype (defined: {defined:#x})",
            p.dtype_mask
        ));
    }
    if p.memory_bytes == 0 {
        wrong.push("memory_bytes is 0".to_string());
    }
    if p.max_allocation == 0 || p.max_allocation > p.memory_bytes {
        wrong.push(format!(
            "max_allocation is {}, not between 1 and memory_bytes ({})",
            p.max_allocation, p.memory_bytes
        ));
    }
    if !p.kernel_format.is_null() {
        if plugin.table.kernels.is_none() {
            wrong.push(
                "the device names a kernel format but the plugin has no kernel_load, kernel_launch and kernel_destroy".to_string(),
            );
        }
        if !p.kernel_arg_alignment.is_power_of_two() {
            wrong.push(format!(
                "kernel_arg_alignment {} is not a power of two",
                p.kernel_arg_alignment
            ));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("device_properties: {}", wrong.join("; ")))
    }
}

fn enumeration(plugin: &Plugin) -> Result<(), String> {
    let t = &plugin.table;
    let mut counts = Vec::new();
    for _ in 0..3 {
        let mut a = xpu_device_count_args::new();
        // SAFETY: a fresh argument struct of the function's type.
        unsafe { plugin.call_raw(t.device_count, &mut a, "device_count") }
            .map_err(|e| e.to_string())?;
        counts.push(a.count);
    }
    if counts.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "device_count changed between calls: {counts:?}; enumeration must be stable"
        ));
    }
    let count = counts[0];
    if count == 0 {
        return Err("device_count is 0 while a device of the plugin is open".to_string());
    }
    for index in [count, count.saturating_add(7), u32::MAX] {
        let mut a = xpu_device_open_args::new();
        a.index = index;
        // SAFETY: a fresh argument struct of the function's type.
        let outcome = unsafe { plugin.call_raw(t.device_open, &mut a, "device_open") };
        if outcome.is_ok() && !a.device.is_null() {
            let mut c = xpu_device_close_args::new();
            c.device = a.device;
            // SAFETY: the device the plugin wrongly opened, closed once.
            let _ = unsafe { plugin.call_raw(t.device_close, &mut c, "device_close") };
        }
        expect_code(
            outcome,
            error_code::INVALID_ARGUMENT,
            "XPU_ERROR_INVALID_ARGUMENT",
            &format!("device_open of index {index} with {count} device(s)"),
        )?;
    }
    Ok(())
}

fn out_of_memory(plugin: &Plugin, device: &DeviceShared) -> Result<(), String> {
    let t = &plugin.table;
    let d = device.handle.0;
    let info = || -> Result<xpu_memory_info_args, String> {
        let mut m = xpu_memory_info_args::new();
        m.device = d;
        // SAFETY: a fresh argument struct with the open device.
        unsafe { plugin.call_raw(t.memory_info, &mut m, "memory_info") }
            .map_err(|e| e.to_string())?;
        Ok(m)
    };
    let mut p = xpu_device_properties_args::new();
    p.device = d;
    // SAFETY: a fresh argument struct with the open device.
    unsafe { plugin.call_raw(t.device_properties, &mut p, "device_properties") }
        .map_err(|e| e.to_string())?;
    let before = info()?;
    let size = p.max_allocation.min(p.memory_bytes).max(1);
    // Each fits; together they cannot: a few more than the memory holds.
    let most = (p.memory_bytes / size).saturating_add(4).min(1 << 16);
    let mut buffers = Vec::new();
    let mut failure = None;
    for _ in 0..most {
        let mut a = xpu_buffer_allocate_args::new();
        a.device = d;
        a.size = size;
        // SAFETY: a fresh argument struct with the open device.
        match unsafe { plugin.call_raw(t.buffer_allocate, &mut a, "buffer_allocate") } {
            Ok(()) => buffers.push(a.buffer),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let allocated = buffers.len();
    for b in buffers {
        let mut f = xpu_buffer_free_args::new();
        f.buffer = b;
        // SAFETY: a buffer this check allocated, freed once.
        if let Err(e) = unsafe { plugin.call_raw(t.buffer_free, &mut f, "buffer_free") } {
            return Err(format!("buffer_free after the out-of-memory check: {e}"));
        }
    }
    let what = format!(
        "allocating {size} bytes at a time ({} bytes of memory, the largest allocation {})",
        p.memory_bytes, p.max_allocation
    );
    match failure {
        None => {
            return Err(format!(
                "{what}: all {allocated} allocations succeeded, more than the memory holds"
            ))
        }
        Some(e) if e.code == error_code::OUT_OF_MEMORY => {}
        Some(e) => {
            return Err(format!(
                "{what}: allocation {} failed with code {} ({}); memory running out must be XPU_ERROR_OUT_OF_MEMORY",
                allocated + 1,
                e.code,
                e.message
            ))
        }
    }
    let after = info()?;
    if after.free != before.free {
        return Err(format!(
            "free memory was {} bytes before {what} and {} after every buffer was freed",
            before.free, after.free
        ));
    }
    Ok(())
}

fn error_objects(plugin: &Plugin) -> Result<(), String> {
    let t = &plugin.table;
    let mut a = xpu_device_open_args::new();
    a.index = u32::MAX;
    // SAFETY: a fresh argument struct of the function's type.
    let e = unsafe { (t.device_open)(&mut a) };
    if e.is_null() {
        return Err("device_open of index 2^32-1 succeeded".to_string());
    }
    // SAFETY: a live error object, read twice before it is destroyed once.
    let (c1, m1, c2, m2) = unsafe {
        let c1 = (t.error_code)(e);
        let m1 = text((t.error_message)(e));
        let c2 = (t.error_code)(e);
        let m2 = text((t.error_message)(e));
        (t.error_destroy)(e);
        (c1, m1, c2, m2)
    };
    if !(error_code::INVALID_ARGUMENT..=error_code::INTERNAL).contains(&c1) {
        return Err(format!(
            "an error's code is {c1}, which the ABI does not define (1 to 8)"
        ));
    }
    if c1 != c2 || m1 != m2 {
        return Err("an error's code or message changed between two reads".to_string());
    }
    match m1 {
        Some(m) if !m.trim().is_empty() => Ok(()),
        _ => Err("an error has no message; say what was asked and what was wrong".to_string()),
    }
}

fn unknown_values(plugin: &Plugin, device: &DeviceShared) -> Result<(), String> {
    let t = &plugin.table;
    let d = device.handle.0;
    let mut s = xpu_stream_create_args::new();
    s.device = d;
    // SAFETY: a fresh argument struct with the open device.
    unsafe { plugin.call_raw(t.stream_create, &mut s, "stream_create") }
        .map_err(|e| e.to_string())?;
    let mut b = xpu_buffer_allocate_args::new();
    b.device = d;
    b.size = 64;
    // SAFETY: as above.
    let allocated = unsafe { plugin.call_raw(t.buffer_allocate, &mut b, "buffer_allocate") };
    let mut outcome = allocated.map_err(|e| e.to_string());
    if outcome.is_ok() {
        let range = xpu_buffer_range {
            buffer: b.buffer,
            offset: 0,
            length: 64,
        };
        for (kind, dtype, what) in [
            (0xFFFF, 0, "builtin kind 65535"),
            (0, 0xFFFF, "a fill of dtype 65535"),
        ] {
            let mut a = xpu_builtin_args::new();
            a.stream = s.stream;
            a.kind = kind;
            a.dtype = dtype;
            a.dst_dtype = dtype;
            a.dst = range;
            a.a = range;
            a.b = range;
            // SAFETY: a fresh argument struct with the plugin's live stream and buffer;
            // the values this check is about are the only ones the ABI does not define.
            let r = unsafe { plugin.call_raw(t.builtin, &mut a, "builtin") };
            let mut sync = xpu_stream_args::new();
            sync.stream = s.stream;
            // SAFETY: the live stream.
            let synced =
                unsafe { plugin.call_raw(t.stream_synchronize, &mut sync, "stream_synchronize") };
            match code_of(r, what) {
                Ok(c) if c == error_code::UNSUPPORTED || c == error_code::INVALID_ARGUMENT => {}
                Ok(c) => {
                    outcome = Err(format!(
                        "{what} failed with code {c}; a value the ABI does not define is XPU_ERROR_UNSUPPORTED or XPU_ERROR_INVALID_ARGUMENT"
                    ));
                    break;
                }
                Err(m) => {
                    outcome = Err(format!(
                        "{m} (the stream then reported {synced:?}); a value the ABI does not define must be refused when it is enqueued"
                    ));
                    break;
                }
            }
        }
        let mut f = xpu_buffer_free_args::new();
        f.buffer = b.buffer;
        // SAFETY: the buffer allocated above, no work in flight (the stream was
        // synchronized), freed once.
        if let Err(e) = unsafe { plugin.call_raw(t.buffer_free, &mut f, "buffer_free") } {
            plugin.record(format!("{}: abi check: {e}", device.id));
        }
    }
    let mut destroy = xpu_stream_args::new();
    destroy.stream = s.stream;
    // SAFETY: the stream created above, destroyed once.
    if let Err(e) = unsafe { plugin.call_raw(t.stream_destroy, &mut destroy, "stream_destroy") } {
        plugin.record(format!("{}: abi check: {e}", device.id));
    }
    outcome?;
    if let Some(f) = t.inject_fault {
        let mut a = xpu_device_fault_args::new();
        a.device = d;
        a.fault = 999;
        // SAFETY: a fresh argument struct with the open device; the fault number is
        // one the ABI does not define, which the plugin must refuse changing nothing.
        let r = unsafe { plugin.call_raw(f, &mut a, "device_inject_fault") };
        expect_code(
            r,
            error_code::UNSUPPORTED,
            "XPU_ERROR_UNSUPPORTED",
            "device_inject_fault of fault number 999",
        )?;
    }
    Ok(())
}

fn entry_point(plugin: &Plugin) -> Result<(), String> {
    let host = xpu_host_info {
        struct_size: struct_size!(xpu_host_info, abi_minor),
        extensions: std::ptr::null(),
        abi_major: HOST_ABI.0,
        abi_minor: HOST_ABI.1,
    };
    let entry = plugin.entry_point();
    // SAFETY: the plugin's entry point, loaded and never unloaded; `host` is valid for
    // the call; the header allows calling it more than once.
    let api = unsafe { entry(&host) };
    if api.is_null() {
        return Err(
            "the entry point, called again with the same host, returned no table".to_string(),
        );
    }
    // SAFETY: a non-null table of static lifetime; the loader checked that this
    // plugin's table reaches its name and version, and a second call must return the
    // same kind of table.
    let (major, minor, name, version) = unsafe {
        (
            (*api).abi_major,
            (*api).abi_minor,
            text((*api).name),
            text((*api).version),
        )
    };
    let same = (major, minor) == plugin.abi
        && name.as_deref() == Some(plugin.plugin_name.as_str())
        && version.as_deref().unwrap_or("") == plugin.version;
    if same {
        Ok(())
    } else {
        Err(format!(
            "the entry point, called again, returned ABI {major}.{minor}, name {name:?}, version {version:?}; the first call returned ABI {}.{}, name `{}`, version `{}`",
            plugin.abi.0, plugin.abi.1, plugin.plugin_name, plugin.version
        ))
    }
}
