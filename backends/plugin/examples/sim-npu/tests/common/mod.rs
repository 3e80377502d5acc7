//! A minimal host for the tests: calls the plugin's exported table
//! (`xpu_sim_npu::xpu_plugin_get_api`) through the SDK's ABI types, as the loader does
//! after `dlopen`, and turns error objects back into `xpu_plugin_sdk::Error`s.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{c_char, c_void, CStr};
use std::mem::size_of;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Condvar, Mutex};

use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::{take_raw, Error};

pub type R<T> = std::result::Result<T, Error>;

/// The plugin's table, asked for as an ABI 1.0 host.
pub fn api() -> &'static xpu_plugin_api {
    let host = xpu_host_info {
        struct_size: size_of::<xpu_host_info>(),
        extensions: null(),
        abi_major: XPU_PLUGIN_ABI_MAJOR,
        abi_minor: XPU_PLUGIN_ABI_MINOR,
    };
    // SAFETY: `host` is valid for the call; the table is static.
    let table = unsafe { xpu_sim_npu::xpu_plugin_get_api(&host) };
    assert!(!table.is_null(), "the plugin refused an ABI 1.0 host");
    // SAFETY: non-null tables are static.
    unsafe { &*table }
}

/// An argument struct: all fields zero, `struct_size` set.
pub fn args<T>() -> T {
    // SAFETY: every ABI argument struct is valid all-zero.
    let mut v: T = unsafe { std::mem::zeroed() };
    // SAFETY: every ABI argument struct starts with `size_t struct_size`.
    unsafe { (&mut v as *mut T).cast::<usize>().write(size_of::<T>()) };
    v
}

/// Calls table function `f` with `a`.
pub fn call<A>(f: PluginFn<A>, a: &mut A) -> R<()> {
    let f = f.expect("the function is in the table");
    // SAFETY: `a` is a valid argument struct for `f`; the error object is ours.
    match unsafe { take_raw(f(a)) } {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

pub fn cstr(p: *const c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the plugin returns NUL-terminated strings valid while we read them.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub fn device_count() -> R<u32> {
    let mut a: xpu_device_count_args = args();
    call(api().device_count, &mut a)?;
    Ok(a.count)
}

pub fn open(index: u32) -> R<*mut xpu_device> {
    let mut a: xpu_device_open_args = args();
    a.index = index;
    call(api().device_open, &mut a)?;
    Ok(a.device)
}

pub fn close(device: *mut xpu_device) {
    let mut a: xpu_device_close_args = args();
    a.device = device;
    call(api().device_close, &mut a).unwrap();
}

pub fn properties(device: *mut xpu_device) -> xpu_device_properties_args {
    let mut a: xpu_device_properties_args = args();
    a.device = device;
    call(api().device_properties, &mut a).unwrap();
    a
}

pub fn memory(device: *mut xpu_device) -> (u64, u64) {
    let mut a: xpu_memory_info_args = args();
    a.device = device;
    call(api().memory_info, &mut a).unwrap();
    (a.total, a.free)
}

pub fn capabilities(device: *mut xpu_device) -> Vec<String> {
    let api = api();
    // SAFETY: the plugin's extension chain is static; its first entry is checked below.
    let ext = unsafe { &*api.extensions.cast::<xpu_capabilities_extension>() };
    assert_eq!(ext.base.type_, extension_type::CAPABILITIES);
    let mut a: xpu_capabilities_args = args();
    a.device = device;
    call(ext.capabilities, &mut a).unwrap();
    // SAFETY: `count` strings, valid until the device is closed.
    (0..a.count as usize)
        .map(|i| cstr(unsafe { *a.capabilities.add(i) }))
        .collect()
}

/// `memory_info`, failing as the plugin does.
pub fn try_memory(device: *mut xpu_device) -> R<(u64, u64)> {
    let mut a: xpu_memory_info_args = args();
    a.device = device;
    call(api().memory_info, &mut a)?;
    Ok((a.total, a.free))
}

/// `device_inject_fault` with fault number `fault` (ABI 1.2).
pub fn inject_fault(device: *mut xpu_device, fault: u32) -> R<()> {
    let mut a: xpu_device_fault_args = args();
    a.device = device;
    a.fault = fault;
    call(api().device_inject_fault, &mut a)
}

/// `device_inject_fault` with `XPU_FAULT_SLOW` and `delay_ns` (ABI 1.2).
pub fn inject_slow(device: *mut xpu_device, delay_ns: u64) -> R<()> {
    let mut a: xpu_device_fault_args = args();
    a.device = device;
    a.fault = fault::SLOW;
    a.delay_ns = delay_ns;
    call(api().device_inject_fault, &mut a)
}

pub fn alloc(device: *mut xpu_device, size: u64) -> R<*mut xpu_buffer> {
    let mut a: xpu_buffer_allocate_args = args();
    a.device = device;
    a.size = size;
    call(api().buffer_allocate, &mut a)?;
    Ok(a.buffer)
}

pub fn free(buffer: *mut xpu_buffer) {
    let mut a: xpu_buffer_free_args = args();
    a.buffer = buffer;
    call(api().buffer_free, &mut a).unwrap();
}

pub fn stream(device: *mut xpu_device) -> *mut xpu_stream {
    let mut a: xpu_stream_create_args = args();
    a.device = device;
    call(api().stream_create, &mut a).unwrap();
    a.stream
}

/// `stream_create`, failing as the plugin does.
pub fn try_stream(device: *mut xpu_device) -> R<*mut xpu_stream> {
    let mut a: xpu_stream_create_args = args();
    a.device = device;
    call(api().stream_create, &mut a)?;
    Ok(a.stream)
}

pub fn destroy_stream(stream: *mut xpu_stream) {
    let mut a: xpu_stream_args = args();
    a.stream = stream;
    call(api().stream_destroy, &mut a).unwrap();
}

pub fn sync(stream: *mut xpu_stream) -> R<()> {
    let mut a: xpu_stream_args = args();
    a.stream = stream;
    call(api().stream_synchronize, &mut a)
}

pub fn query(stream: *mut xpu_stream) -> R<bool> {
    let mut a: xpu_stream_query_args = args();
    a.stream = stream;
    call(api().stream_query, &mut a)?;
    Ok(a.done != 0)
}

pub fn range(buffer: *mut xpu_buffer, offset: u64, length: u64) -> xpu_buffer_range {
    xpu_buffer_range {
        buffer,
        offset,
        length,
    }
}

/// Enqueues a host-to-device copy. `bytes` must stay alive and unchanged until the
/// stream is synchronized.
pub fn write_async(stream: *mut xpu_stream, dst: xpu_buffer_range, bytes: &[u8]) -> R<()> {
    let mut a: xpu_copy_args = args();
    a.stream = stream;
    a.dst = dst;
    a.host = bytes.as_ptr().cast_mut().cast();
    a.length = bytes.len() as u64;
    call(api().copy_host_to_device, &mut a)
}

/// Copies `bytes` to the device and synchronizes.
pub fn write(stream: *mut xpu_stream, dst: xpu_buffer_range, bytes: &[u8]) -> R<()> {
    write_async(stream, dst, bytes)?;
    sync(stream)
}

/// Copies a range to the host and synchronizes.
pub fn read(stream: *mut xpu_stream, src: xpu_buffer_range) -> R<Vec<u8>> {
    let mut out = vec![0u8; src.length as usize];
    let mut a: xpu_copy_args = args();
    a.stream = stream;
    a.src = src;
    a.host = out.as_mut_ptr().cast();
    a.length = src.length;
    call(api().copy_device_to_host, &mut a)?;
    sync(stream)?;
    Ok(out)
}

pub fn copy(stream: *mut xpu_stream, src: xpu_buffer_range, dst: xpu_buffer_range) -> R<()> {
    let mut a: xpu_copy_args = args();
    a.stream = stream;
    a.src = src;
    a.dst = dst;
    a.length = src.length;
    call(api().copy_device_to_device, &mut a)
}

/// A builtin operation's arguments.
pub struct Op {
    pub kind: u32,
    pub op: u32,
    pub dtype: u32,
    pub dst_dtype: u32,
    pub dst: xpu_buffer_range,
    pub a: xpu_buffer_range,
    pub b: xpu_buffer_range,
    pub scalar: [u8; 8],
}

impl Op {
    pub fn new(kind: u32, dtype: u32, dst: xpu_buffer_range) -> Op {
        Op {
            kind,
            op: 0,
            dtype,
            dst_dtype: 0,
            dst,
            a: range(null_mut(), 0, 0),
            b: range(null_mut(), 0, 0),
            scalar: [0; 8],
        }
    }
}

pub fn builtin(stream: *mut xpu_stream, op: &Op) -> R<()> {
    let mut a: xpu_builtin_args = args();
    a.stream = stream;
    a.kind = op.kind;
    a.op = op.op;
    a.dtype = op.dtype;
    a.dst_dtype = op.dst_dtype;
    a.dst = op.dst;
    a.a = op.a;
    a.b = op.b;
    a.scalar = op.scalar;
    call(api().builtin, &mut a)
}

pub fn record(stream: *mut xpu_stream) -> *mut xpu_event {
    let mut a: xpu_event_record_args = args();
    a.stream = stream;
    call(api().event_record, &mut a).unwrap();
    a.event
}

/// `event_record`, failing as the plugin does.
pub fn try_record(stream: *mut xpu_stream) -> R<*mut xpu_event> {
    let mut a: xpu_event_record_args = args();
    a.stream = stream;
    call(api().event_record, &mut a)?;
    Ok(a.event)
}

/// Enqueues a device-to-host copy into `out`, which must stay alive and untouched until
/// the stream is synchronized.
pub fn read_async(stream: *mut xpu_stream, src: xpu_buffer_range, out: &mut [u8]) -> R<()> {
    let mut a: xpu_copy_args = args();
    a.stream = stream;
    a.src = src;
    a.host = out.as_mut_ptr().cast();
    a.length = src.length;
    call(api().copy_device_to_host, &mut a)
}

pub fn destroy_event(event: *mut xpu_event) {
    let mut a: xpu_event_args = args();
    a.event = event;
    call(api().event_destroy, &mut a).unwrap();
}

pub fn event_done(event: *mut xpu_event) -> R<bool> {
    let mut a: xpu_event_query_args = args();
    a.event = event;
    call(api().event_query, &mut a)?;
    Ok(a.done != 0)
}

pub fn event_wait(event: *mut xpu_event, timeout_ns: u64) -> R<()> {
    let mut a: xpu_event_wait_args = args();
    a.event = event;
    a.timeout_ns = timeout_ns;
    call(api().event_wait, &mut a)
}

pub fn elapsed_ns(start: *mut xpu_event, end: *mut xpu_event) -> R<u64> {
    let mut a: xpu_event_elapsed_args = args();
    a.start = start;
    a.end = end;
    call(api().event_elapsed, &mut a)?;
    Ok(a.elapsed_ns)
}

pub fn wait_event(stream: *mut xpu_stream, event: *mut xpu_event) -> R<()> {
    let mut a: xpu_stream_wait_event_args = args();
    a.stream = stream;
    a.event = event;
    call(api().stream_wait_event, &mut a)
}

/// An event of "another backend" that the test completes by hand.
#[derive(Default)]
pub struct Gate {
    status: Mutex<Option<i32>>,
    cv: Condvar,
    pub released: Mutex<u32>,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Completes the event: `status` 0 for success, nonzero for failure.
    pub fn open(&self, status: i32) {
        *self.status.lock().unwrap() = Some(status);
        self.cv.notify_all();
    }
}

unsafe extern "C" fn gate_wait(context: *mut c_void) -> i32 {
    // SAFETY: the context is an `Arc<Gate>` lent by `wait_external` until release.
    let gate = unsafe { &*context.cast::<Gate>() };
    let mut status = gate.status.lock().unwrap();
    loop {
        if let Some(s) = *status {
            return s;
        }
        status = gate.cv.wait(status).unwrap();
    }
}

unsafe extern "C" fn gate_release(context: *mut c_void) {
    // SAFETY: as in `gate_wait`; this takes back the lent reference.
    let gate = unsafe { Arc::from_raw(context.cast::<Gate>().cast_const()) };
    *gate.released.lock().unwrap() += 1;
}

/// Makes `stream` wait for `gate`.
pub fn wait_external(stream: *mut xpu_stream, gate: &Arc<Gate>) -> R<()> {
    let mut a: xpu_stream_wait_external_args = args();
    a.stream = stream;
    a.external = xpu_external_event {
        context: Arc::into_raw(gate.clone()).cast_mut().cast(),
        wait: Some(gate_wait),
        release: Some(gate_release),
    };
    // Ownership passes with the call, also when it fails.
    call(api().stream_wait_external, &mut a)
}

pub fn kernel_load(
    device: *mut xpu_device,
    format: &CStr,
    code: &[u8],
    entry: &CStr,
) -> R<*mut xpu_kernel> {
    let mut a: xpu_kernel_load_args = args();
    a.device = device;
    a.format = format.as_ptr();
    a.code = code.as_ptr();
    a.code_length = code.len() as u64;
    a.entry_point = entry.as_ptr();
    call(api().kernel_load, &mut a)?;
    Ok(a.kernel)
}

pub fn kernel_destroy(kernel: *mut xpu_kernel) {
    let mut a: xpu_kernel_destroy_args = args();
    a.kernel = kernel;
    call(api().kernel_destroy, &mut a).unwrap();
}

pub fn buffer_arg(r: xpu_buffer_range, access: u32) -> xpu_kernel_arg {
    xpu_kernel_arg {
        kind: kernel_arg_kind::BUFFER,
        access,
        range: r,
        dtype: 0,
        scalar: [0; 8],
    }
}

pub fn scalar_arg(s: xpu_plugin_sdk::Scalar) -> xpu_kernel_arg {
    xpu_kernel_arg {
        kind: kernel_arg_kind::SCALAR,
        access: 0,
        range: range(null_mut(), 0, 0),
        dtype: s.dtype().raw(),
        scalar: s.to_le_bytes(),
    }
}

pub fn launch(
    stream: *mut xpu_stream,
    kernel: *mut xpu_kernel,
    grid: [u32; 3],
    block: [u32; 3],
    kargs: &[xpu_kernel_arg],
) -> R<()> {
    let mut a: xpu_kernel_launch_args = args();
    a.stream = stream;
    a.kernel = kernel;
    a.grid = grid;
    a.block = block;
    a.args = kargs.as_ptr();
    a.arg_count = kargs.len() as u64;
    call(api().kernel_launch, &mut a)
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
