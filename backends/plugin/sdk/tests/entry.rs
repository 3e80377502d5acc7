//! The SDK's C entry points, called directly as a host would call them: good and bad
//! arguments, small and large `struct_size`, NULL and wrong-kind handles, panicking and
//! failing implementations, and the external-event protocol.
//!
//! Three plugins live in this test binary, each behind an entry of its own name:
//! - `probe`: a small working plugin. Its streams run work at once; `fill` of `u8` and
//!   host copies really execute, every other builtin and every launch is answered with
//!   an `Unsupported` error whose message is the operation the SDK handed over, so the
//!   tests can see what arrived. Filling with the byte `0xEE` panics. Its devices accept
//!   injected faults: they count losses in [`INJECTED`] and record slowdowns in
//!   [`SLOWED`].
//! - `panicky`: `device_count` panics.
//! - `broken`: `Plugin::new` fails; it has neither kernels nor event timing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{c_void, CStr};
use std::mem::size_of;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::{
    struct_size, take_raw, BufferRange, Builtin, DType, Device, DeviceKind, DeviceProperties,
    Error, ErrorCode, Event, ExternalWait, Fault, Handle, HostDestination, HostSource, KernelArg,
    KernelCode, LaunchDims, MemoryInfo, Plugin, Result, Scalar, Stream,
};

// ------------------------------------------------------------------- the probe plugin --

struct Probe;
struct ProbeDevice(u32);
struct ProbeBuffer(Mutex<Vec<u8>>);
struct ProbeStream {
    device: u32,
    external: Mutex<Vec<ExternalWait>>,
}
struct ProbeEvent(Instant);
struct ProbeKernel(String);

/// Faults `Lost` injected into the probe's devices, by device index.
static INJECTED: [AtomicU32; 2] = [AtomicU32::new(0), AtomicU32::new(0)];
/// Faults `Slow` injected into the probe's devices: device index and delay, in order.
static SLOWED: Mutex<Vec<(u32, Duration)>> = Mutex::new(Vec::new());

impl Plugin for Probe {
    const NAME: &'static CStr = c"probe";
    const VERSION: &'static CStr = c"1.2.3";
    const EVENT_TIMING: bool = true;
    const KERNELS: bool = true;
    type Device = ProbeDevice;
    type Stream = ProbeStream;
    type Event = ProbeEvent;
    type Buffer = ProbeBuffer;
    type Kernel = ProbeKernel;

    fn new() -> Result<Self> {
        Ok(Probe)
    }
    fn device_count(&self) -> Result<u32> {
        Ok(2)
    }
    fn open_device(&self, index: u32) -> Result<ProbeDevice> {
        if index >= 2 {
            return Err(Error::invalid_argument(format!(
                "probe has 2 devices; {index} is not one"
            )));
        }
        Ok(ProbeDevice(index))
    }
}

impl Device<Probe> for ProbeDevice {
    fn properties(&self) -> Result<DeviceProperties> {
        Ok(DeviceProperties {
            name: format!("probe {}", self.0),
            vendor: "tests".into(),
            driver: "none".into(),
            kind: DeviceKind::Npu,
            dtypes: vec![DType::U8, DType::I32, DType::F32],
            memory_bytes: 4096,
            max_allocation: 1024,
            kernel_arg_alignment: 16,
            timeline_events: true,
            event_timing: true,
            kernel_format: Some("probe-code".into()),
        })
    }
    fn capabilities(&self) -> Result<Vec<String>> {
        Ok(vec!["probe=1".into(), format!("index={}", self.0)])
    }
    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            total: 4096,
            free: 1000,
        })
    }
    fn allocate(&self, size: u64) -> Result<ProbeBuffer> {
        Ok(ProbeBuffer(Mutex::new(vec![0; size as usize])))
    }
    fn create_stream(&self) -> Result<ProbeStream> {
        Ok(ProbeStream {
            device: self.0,
            external: Mutex::new(Vec::new()),
        })
    }
    fn inject_fault(&self, fault: Fault) -> Result<()> {
        match fault {
            Fault::Lost => {
                INJECTED[self.0 as usize].fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Fault::Slow(delay) => {
                SLOWED.lock().unwrap().push((self.0, delay));
                Ok(())
            }
            other => Err(Error::unsupported(format!("probe cannot inject {other}"))),
        }
    }
    fn load_kernel(&self, code: KernelCode<'_>) -> Result<ProbeKernel> {
        Ok(ProbeKernel(format!(
            "{} {} {:?}",
            code.format, code.entry_point, code.code
        )))
    }
}

fn span(r: &BufferRange<ProbeBuffer>) -> std::ops::Range<usize> {
    r.offset as usize..r.end() as usize
}

impl Stream<Probe> for ProbeStream {
    fn copy_host_to_device(&self, src: HostSource, dst: BufferRange<ProbeBuffer>) -> Result<()> {
        // SAFETY: the copy runs inside the call, before the host can see it complete.
        dst.buffer.0.lock().unwrap()[span(&dst)].copy_from_slice(unsafe { src.as_slice() });
        Ok(())
    }
    fn copy_device_to_host(
        &self,
        src: BufferRange<ProbeBuffer>,
        mut dst: HostDestination,
    ) -> Result<()> {
        // SAFETY: as above.
        unsafe { dst.as_mut_slice() }.copy_from_slice(&src.buffer.0.lock().unwrap()[span(&src)]);
        Ok(())
    }
    fn copy_device_to_device(
        &self,
        src: BufferRange<ProbeBuffer>,
        dst: BufferRange<ProbeBuffer>,
    ) -> Result<()> {
        let bytes = src.buffer.0.lock().unwrap()[span(&src)].to_vec();
        dst.buffer.0.lock().unwrap()[span(&dst)].copy_from_slice(&bytes);
        Ok(())
    }
    fn builtin(&self, op: Builtin<ProbeBuffer>) -> Result<()> {
        match op {
            Builtin::Fill {
                value: Scalar::U8(0xEE),
                ..
            } => panic!("the probe was told to panic"),
            Builtin::Fill {
                dst,
                value: Scalar::U8(v),
            } => {
                dst.buffer.0.lock().unwrap()[span(&dst)].fill(v);
                Ok(())
            }
            other => Err(Error::unsupported(format!("{other:?}"))),
        }
    }
    fn launch(
        &self,
        kernel: &Handle<ProbeKernel>,
        dims: LaunchDims,
        args: Vec<KernelArg<ProbeBuffer>>,
    ) -> Result<()> {
        Err(Error::unsupported(format!(
            "{} {dims:?} {args:?}",
            kernel.0
        )))
    }
    fn record_event(&self) -> Result<ProbeEvent> {
        Ok(ProbeEvent(Instant::now()))
    }
    fn wait_event(&self, _event: &Handle<ProbeEvent>) -> Result<()> {
        Ok(())
    }
    fn wait_external(&self, event: ExternalWait) -> Result<()> {
        if self.device == 1 {
            return Err(Error::unsupported("probe device 1 refuses external waits"));
        }
        self.external.lock().unwrap().push(event);
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        let waits = std::mem::take(&mut *self.external.lock().unwrap());
        waits.iter().try_for_each(ExternalWait::wait)
    }
    fn query(&self) -> Result<bool> {
        Ok(self
            .external
            .lock()
            .unwrap()
            .iter()
            .all(|w| w.poll().is_some()))
    }
}

impl Event for ProbeEvent {
    fn query(&self) -> Result<bool> {
        Ok(true)
    }
    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        match timeout {
            Some(t) if t.is_zero() => Err(Error::timeout("zero timeout")),
            _ => Ok(()),
        }
    }
    fn elapsed_since(&self, earlier: &Self) -> Result<Duration> {
        Ok(self.0.saturating_duration_since(earlier.0))
    }
}

xpu_plugin_sdk::export_plugin!(Probe as probe_get_api);

// ------------------------------------------------------ the panicking and broken ones --

struct Panicky;

impl Plugin for Panicky {
    const NAME: &'static CStr = c"panicky";
    const VERSION: &'static CStr = c"0";
    type Device = ProbeDevice;
    type Stream = ProbeStream;
    type Event = ProbeEvent;
    type Buffer = ProbeBuffer;
    type Kernel = ProbeKernel;

    fn new() -> Result<Self> {
        Ok(Panicky)
    }
    fn device_count(&self) -> Result<u32> {
        panic!("device_count exploded: {}", 42)
    }
    fn open_device(&self, _index: u32) -> Result<ProbeDevice> {
        Err(Error::internal("unreachable in these tests"))
    }
}

// `ProbeDevice` and `ProbeStream` implement the traits for `Probe`; the other plugins
// need them for themselves too.
macro_rules! reuse_probe_types {
    ($p:ty) => {
        impl Device<$p> for ProbeDevice {
            fn properties(&self) -> Result<DeviceProperties> {
                <ProbeDevice as Device<Probe>>::properties(self)
            }
            fn memory_info(&self) -> Result<MemoryInfo> {
                <ProbeDevice as Device<Probe>>::memory_info(self)
            }
            fn allocate(&self, size: u64) -> Result<ProbeBuffer> {
                <ProbeDevice as Device<Probe>>::allocate(self, size)
            }
            fn create_stream(&self) -> Result<ProbeStream> {
                <ProbeDevice as Device<Probe>>::create_stream(self)
            }
        }
        impl Stream<$p> for ProbeStream {
            fn copy_host_to_device(
                &self,
                _: HostSource,
                _: BufferRange<ProbeBuffer>,
            ) -> Result<()> {
                Ok(())
            }
            fn copy_device_to_host(
                &self,
                _: BufferRange<ProbeBuffer>,
                _: HostDestination,
            ) -> Result<()> {
                Ok(())
            }
            fn copy_device_to_device(
                &self,
                _: BufferRange<ProbeBuffer>,
                _: BufferRange<ProbeBuffer>,
            ) -> Result<()> {
                Ok(())
            }
            fn builtin(&self, _: Builtin<ProbeBuffer>) -> Result<()> {
                Ok(())
            }
            fn record_event(&self) -> Result<ProbeEvent> {
                Ok(ProbeEvent(Instant::now()))
            }
            fn wait_event(&self, _: &Handle<ProbeEvent>) -> Result<()> {
                Ok(())
            }
            fn wait_external(&self, _: ExternalWait) -> Result<()> {
                Ok(())
            }
            fn synchronize(&self) -> Result<()> {
                Ok(())
            }
            fn query(&self) -> Result<bool> {
                Ok(true)
            }
        }
    };
}
reuse_probe_types!(Panicky);
reuse_probe_types!(Broken);

xpu_plugin_sdk::export_plugin!(Panicky as panicky_get_api);

struct Broken;

impl Plugin for Broken {
    const NAME: &'static CStr = c"broken";
    const VERSION: &'static CStr = c"0";
    type Device = ProbeDevice;
    type Stream = ProbeStream;
    type Event = ProbeEvent;
    type Buffer = ProbeBuffer;
    type Kernel = ProbeKernel;

    fn new() -> Result<Self> {
        Err(Error::unavailable("the broken plugin found no hardware"))
    }
    fn device_count(&self) -> Result<u32> {
        Ok(0)
    }
    fn open_device(&self, _index: u32) -> Result<ProbeDevice> {
        Err(Error::internal("unreachable"))
    }
}

xpu_plugin_sdk::export_plugin!(Broken as broken_get_api);

// ------------------------------------------------------------------------- helpers --

fn host_info(major: u32, minor: u32) -> xpu_host_info {
    xpu_host_info {
        struct_size: size_of::<xpu_host_info>(),
        extensions: null(),
        abi_major: major,
        abi_minor: minor,
    }
}

type Entry = unsafe extern "C" fn(*const xpu_host_info) -> *const xpu_plugin_api;

fn table(entry: Entry) -> &'static xpu_plugin_api {
    let host = host_info(1, 0);
    // SAFETY: `host` is valid for the call; the table is static.
    let api = unsafe { entry(&host) };
    assert!(!api.is_null());
    // SAFETY: non-null tables are static.
    unsafe { &*api }
}

fn probe() -> &'static xpu_plugin_api {
    table(probe_get_api)
}

/// An argument struct with every field zero (valid for all of them) but struct_size.
fn args<T>() -> T {
    // SAFETY: every ABI argument struct is valid all-zero.
    let mut v: T = unsafe { std::mem::zeroed() };
    // SAFETY: every ABI argument struct starts with `size_t struct_size`.
    unsafe { (&mut v as *mut T).cast::<usize>().write(size_of::<T>()) };
    v
}

/// Calls table function `f` with `a`, taking the error object back.
fn call<A>(f: PluginFn<A>, a: &mut A) -> std::result::Result<(), Error> {
    let f = f.expect("the function is in the table");
    // SAFETY: `a` is a valid argument struct for `f`; the error is ours to free.
    match unsafe { take_raw(f(a)) } {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn expect_err<A>(f: PluginFn<A>, a: &mut A, code: ErrorCode, needle: &str) -> Error {
    let e = call(f, a).expect_err("the call should fail");
    assert_eq!(e.code(), code, "{e}");
    assert!(e.message().contains(needle), "`{needle}` not in: {e}");
    e
}

fn open(api: &xpu_plugin_api, index: u32) -> *mut xpu_device {
    let mut a: xpu_device_open_args = args();
    a.index = index;
    call(api.device_open, &mut a).unwrap();
    assert!(!a.device.is_null());
    a.device
}

fn close(api: &xpu_plugin_api, device: *mut xpu_device) {
    let mut a: xpu_device_close_args = args();
    a.device = device;
    call(api.device_close, &mut a).unwrap();
}

fn stream(api: &xpu_plugin_api, device: *mut xpu_device) -> *mut xpu_stream {
    let mut a: xpu_stream_create_args = args();
    a.device = device;
    call(api.stream_create, &mut a).unwrap();
    a.stream
}

fn destroy_stream(api: &xpu_plugin_api, stream: *mut xpu_stream) {
    let mut a: xpu_stream_args = args();
    a.stream = stream;
    call(api.stream_destroy, &mut a).unwrap();
}

fn sync(api: &xpu_plugin_api, stream: *mut xpu_stream) -> std::result::Result<(), Error> {
    let mut a: xpu_stream_args = args();
    a.stream = stream;
    call(api.stream_synchronize, &mut a)
}

fn alloc(api: &xpu_plugin_api, device: *mut xpu_device, size: u64) -> *mut xpu_buffer {
    let mut a: xpu_buffer_allocate_args = args();
    a.device = device;
    a.size = size;
    call(api.buffer_allocate, &mut a).unwrap();
    a.buffer
}

fn free(api: &xpu_plugin_api, buffer: *mut xpu_buffer) {
    let mut a: xpu_buffer_free_args = args();
    a.buffer = buffer;
    call(api.buffer_free, &mut a).unwrap();
}

fn range(buffer: *mut xpu_buffer, offset: u64, length: u64) -> xpu_buffer_range {
    xpu_buffer_range {
        buffer,
        offset,
        length,
    }
}

fn record(api: &xpu_plugin_api, stream: *mut xpu_stream) -> *mut xpu_event {
    let mut a: xpu_event_record_args = args();
    a.stream = stream;
    call(api.event_record, &mut a).unwrap();
    a.event
}

fn destroy_event(api: &xpu_plugin_api, event: *mut xpu_event) {
    let mut a: xpu_event_args = args();
    a.event = event;
    call(api.event_destroy, &mut a).unwrap();
}

fn write(api: &xpu_plugin_api, s: *mut xpu_stream, dst: xpu_buffer_range, bytes: &[u8]) {
    let mut a: xpu_copy_args = args();
    a.stream = s;
    a.dst = dst;
    a.host = bytes.as_ptr().cast_mut().cast();
    a.length = bytes.len() as u64;
    call(api.copy_host_to_device, &mut a).unwrap();
}

fn read(api: &xpu_plugin_api, s: *mut xpu_stream, src: xpu_buffer_range) -> Vec<u8> {
    let mut out = vec![0u8; src.length as usize];
    let mut a: xpu_copy_args = args();
    a.stream = s;
    a.src = src;
    a.host = out.as_mut_ptr().cast();
    a.length = src.length;
    call(api.copy_device_to_host, &mut a).unwrap();
    sync(api, s).unwrap();
    out
}

fn cstr(p: *const std::ffi::c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the plugin returns NUL-terminated strings valid while we look.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
}

// --------------------------------------------------------------------- negotiation --

#[test]
fn the_entry_accepts_any_minor_of_major_1_and_refuses_the_rest() {
    for minor in [0, 1, 99] {
        let host = host_info(1, minor);
        // SAFETY: valid host info.
        assert!(!unsafe { probe_get_api(&host) }.is_null(), "minor {minor}");
    }
    for major in [0, 2] {
        let host = host_info(major, 0);
        // SAFETY: valid host info.
        assert!(unsafe { probe_get_api(&host) }.is_null(), "major {major}");
    }
    // SAFETY: NULL is allowed.
    assert!(unsafe { probe_get_api(null()) }.is_null());
    let mut small = host_info(1, 0);
    small.struct_size = struct_size!(xpu_host_info, abi_major);
    // SAFETY: valid for its struct_size.
    assert!(unsafe { probe_get_api(&small) }.is_null());
    // A newer host's larger struct is fine.
    #[repr(C)]
    struct Newer {
        info: xpu_host_info,
        more: u64,
    }
    let mut newer = Newer {
        info: host_info(1, 5),
        more: 7,
    };
    newer.info.struct_size = size_of::<Newer>();
    // SAFETY: valid for its struct_size.
    assert!(!unsafe { probe_get_api(&newer.info) }.is_null());
}

#[test]
fn the_table_describes_the_plugin() {
    let api = probe();
    assert_eq!(api.struct_size, struct_size!(xpu_plugin_api, group_id));
    assert_eq!((api.abi_major, api.abi_minor), (1, 4));
    // The standard operations' entry points are always there; the defaults provide none.
    assert!(api.device_ops.is_some() && api.op_enqueue.is_some());
    // So is fault injection's; the default refuses.
    assert!(api.device_inject_fault.is_some());
    // Native collectives only where the plugin says it has them.
    assert!(api.group_create.is_none() && api.group_run.is_none());
    assert!(api.group_abort.is_none() && api.group_destroy.is_none());
    assert!(api.group_id.is_none());
    assert_eq!(cstr(api.name), "probe");
    assert_eq!(cstr(api.version), "1.2.3");
    assert!(api.error_code.is_some() && api.error_message.is_some() && api.error_destroy.is_some());
    assert!(
        api.event_elapsed.is_some() && api.kernel_load.is_some() && api.kernel_launch.is_some()
    );
    // The capabilities extension hangs off the table.
    assert!(!api.extensions.is_null());
    // SAFETY: the extension chain is static.
    let ext = unsafe { &*api.extensions };
    assert_eq!(ext.type_, extension_type::CAPABILITIES);
    assert!(ext.next.is_null());

    // Optional functions are absent where the plugin's constants say so.
    let broken = table(broken_get_api);
    assert!(broken.event_elapsed.is_none());
    assert!(broken.kernel_load.is_none() && broken.kernel_destroy.is_none());
    assert!(broken.kernel_launch.is_none());
    assert!(broken.device_count.is_some());
}

#[test]
fn error_functions_never_fail() {
    let api = probe();
    // SAFETY: NULL is accepted by all three.
    unsafe {
        assert_eq!(api.error_code.unwrap()(null()), error_code::INTERNAL);
        assert!(!api.error_message.unwrap()(null()).is_null());
        api.error_destroy.unwrap()(null_mut());
    }
    let mut a: xpu_device_open_args = args();
    a.index = 5;
    // SAFETY: valid args; the error is read and destroyed once below.
    let e = unsafe { api.device_open.unwrap()(&mut a) };
    assert!(!e.is_null());
    // SAFETY: `e` is a live error object.
    unsafe {
        assert_eq!(api.error_code.unwrap()(e), error_code::INVALID_ARGUMENT);
        assert!(cstr(api.error_message.unwrap()(e)).contains("probe has 2 devices"));
        api.error_destroy.unwrap()(e);
    }
}

// --------------------------------------------------------------------- struct_size --

#[test]
fn small_and_null_structs_are_refused_with_their_names_and_sizes() {
    let api = probe();
    let mut a: xpu_device_count_args = args();
    a.struct_size = 16;
    let e = expect_err(
        api.device_count,
        &mut a,
        ErrorCode::InvalidArgument,
        "xpu_device_count_args.struct_size is 16",
    );
    assert!(
        e.message()
            .contains("XPU_DEVICE_COUNT_ARGS_MIN_SIZE (20 bytes"),
        "{e}"
    );
    assert_eq!(a.count, 0, "nothing is written into a refused struct");

    let mut c: xpu_copy_args = args();
    c.struct_size = struct_size!(xpu_copy_args, host);
    expect_err(
        api.copy_host_to_device,
        &mut c,
        ErrorCode::InvalidArgument,
        "XPU_COPY_ARGS_MIN_SIZE",
    );

    let f = api.device_count.unwrap();
    // SAFETY: NULL is what is being tested; the error is ours.
    let e = unsafe { take_raw(f(null_mut())) }.unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(
        e.message()
            .contains("xpu_device_count_args pointer is NULL"),
        "{e}"
    );
}

#[test]
fn outputs_are_written_only_within_struct_size() {
    let api = probe();
    let f = api.device_count.unwrap();
    let min = struct_size!(xpu_device_count_args, count);
    assert_eq!(min, 20);

    // An ABI 1.0 host that sets struct_size to MIN_SIZE: the 4 padding bytes after
    // `count`, and everything beyond, stay untouched.
    #[repr(C, align(8))]
    struct Raw([u8; 64]);
    let mut raw = Raw([0xAB; 64]);
    raw.0[..8].copy_from_slice(&min.to_ne_bytes());
    raw.0[8..16].copy_from_slice(&0usize.to_ne_bytes());
    // SAFETY: the buffer holds a valid struct of `min` bytes.
    assert!(unsafe { take_raw(f(raw.0.as_mut_ptr().cast())) }.is_none());
    assert_eq!(u32::from_ne_bytes(raw.0[16..20].try_into().unwrap()), 2);
    assert!(raw.0[20..].iter().all(|&b| b == 0xAB));

    // A newer host with a larger struct: accepted, only known fields written.
    let mut raw = Raw([0xCD; 64]);
    raw.0[..8].copy_from_slice(&64usize.to_ne_bytes());
    raw.0[8..16].copy_from_slice(&0usize.to_ne_bytes());
    // SAFETY: as above, with 64 bytes.
    assert!(unsafe { take_raw(f(raw.0.as_mut_ptr().cast())) }.is_none());
    assert_eq!(u32::from_ne_bytes(raw.0[16..20].try_into().unwrap()), 2);
    assert!(raw.0[20..].iter().all(|&b| b == 0xCD));
}

// ------------------------------------------------------------------------- devices --

#[test]
fn devices_report_properties_memory_and_capabilities() {
    let api = probe();
    let mut count: xpu_device_count_args = args();
    call(api.device_count, &mut count).unwrap();
    assert_eq!(count.count, 2);

    let d = open(api, 1);
    let mut p: xpu_device_properties_args = args();
    p.device = d;
    call(api.device_properties, &mut p).unwrap();
    assert_eq!(cstr(p.name), "probe 1");
    assert_eq!(cstr(p.vendor), "tests");
    assert_eq!(cstr(p.kernel_format), "probe-code");
    assert_eq!(p.kind, device_kind::NPU);
    assert_eq!(
        p.dtype_mask,
        (1 << dtype::U8) | (1 << dtype::I32) | (1 << dtype::F32)
    );
    assert_eq!(
        (p.memory_bytes, p.max_allocation, p.kernel_arg_alignment),
        (4096, 1024, 16)
    );
    assert_eq!((p.timeline_events, p.event_timing), (1, 1));

    let mut m: xpu_memory_info_args = args();
    m.device = d;
    call(api.memory_info, &mut m).unwrap();
    assert_eq!((m.total, m.free), (4096, 1000));

    // SAFETY: the extension chain is static and starts with the capabilities one.
    let ext = unsafe { &*api.extensions.cast::<xpu_capabilities_extension>() };
    let mut c: xpu_capabilities_args = args();
    c.device = d;
    call(ext.capabilities, &mut c).unwrap();
    assert_eq!(c.count, 2);
    // SAFETY: `count` strings, valid until the device is closed.
    let caps: Vec<String> = (0..c.count as usize)
        .map(|i| cstr(unsafe { *c.capabilities.add(i) }))
        .collect();
    assert_eq!(caps, ["probe=1", "index=1"]);

    // An allocation beyond max_allocation is refused before the plugin sees it.
    let mut a: xpu_buffer_allocate_args = args();
    a.device = d;
    a.size = 1025;
    expect_err(
        api.buffer_allocate,
        &mut a,
        ErrorCode::InvalidArgument,
        "max_allocation, 1024 bytes",
    );
    a.size = 0;
    expect_err(
        api.buffer_allocate,
        &mut a,
        ErrorCode::InvalidArgument,
        "size is 0",
    );
    close(api, d);
}

/// `device_inject_fault` (ABI 1.2): a known fault reaches the device's
/// `inject_fault` (`XPU_FAULT_SLOW` with its `delay_ns`); an unknown number, a small
/// struct (one that stops at `fault`, before `delay_ns`, included) and a bad device
/// are refused before it; the trait's default refuses every fault.
#[test]
fn injected_faults_reach_the_device_and_unknown_ones_are_refused() {
    let api = probe();
    let d = open(api, 1);
    let before = INJECTED[1].load(Ordering::SeqCst);
    let mut a: xpu_device_fault_args = args();
    a.device = d;
    a.fault = fault::LOST;
    call(api.device_inject_fault, &mut a).unwrap();
    assert_eq!(INJECTED[1].load(Ordering::SeqCst), before + 1);

    a.fault = fault::SLOW;
    a.delay_ns = 20_000_000;
    call(api.device_inject_fault, &mut a).unwrap();
    a.delay_ns = 0;
    call(api.device_inject_fault, &mut a).unwrap();
    assert_eq!(
        *SLOWED.lock().unwrap(),
        vec![(1, Duration::from_millis(20)), (1, Duration::ZERO)]
    );

    a.fault = 99;
    let e = expect_err(
        api.device_inject_fault,
        &mut a,
        ErrorCode::Unsupported,
        "xpu_device_fault_args.fault is 99",
    );
    assert!(e.message().contains("nothing was injected"), "{e}");
    a.fault = 0;
    expect_err(
        api.device_inject_fault,
        &mut a,
        ErrorCode::Unsupported,
        "fault is 0",
    );
    assert_eq!(INJECTED[1].load(Ordering::SeqCst), before + 1);

    let mut small: xpu_device_fault_args = args();
    small.device = d;
    small.fault = fault::LOST;
    small.struct_size = struct_size!(xpu_device_fault_args, device);
    let e = expect_err(
        api.device_inject_fault,
        &mut small,
        ErrorCode::InvalidArgument,
        "XPU_DEVICE_FAULT_ARGS_MIN_SIZE",
    );
    assert!(e.message().contains("ABI 1.2"), "{e}");
    // A struct that ends at `fault` lacks `delay_ns`, which 1.2 introduced with it: it is
    // refused like any other too-small struct, whatever the fault number.
    for number in [fault::SLOW, fault::LOST] {
        let mut short: xpu_device_fault_args = args();
        short.device = d;
        short.fault = number;
        short.delay_ns = 20_000_000;
        short.struct_size = struct_size!(xpu_device_fault_args, fault);
        let e = expect_err(
            api.device_inject_fault,
            &mut short,
            ErrorCode::InvalidArgument,
            "XPU_DEVICE_FAULT_ARGS_MIN_SIZE",
        );
        assert!(e.message().contains("ABI 1.2"), "{e}");
        assert!(
            e.message()
                .contains("XPU_STRUCT_SIZE(xpu_device_fault_args, delay_ns)"),
            "{e}"
        );
    }
    assert_eq!(SLOWED.lock().unwrap().len(), 2, "nothing more was injected");

    let mut none: xpu_device_fault_args = args();
    none.fault = fault::LOST;
    expect_err(
        api.device_inject_fault,
        &mut none,
        ErrorCode::InvalidArgument,
        "xpu_device_fault_args.device is NULL",
    );
    assert_eq!(INJECTED[1].load(Ordering::SeqCst), before + 1);
    close(api, d);

    // The default of a device that does not override it.
    let e =
        <ProbeDevice as Device<Panicky>>::inject_fault(&ProbeDevice(0), Fault::Lost).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported);
    assert!(e.message().contains("no fault injection"), "{e}");
    let e = <ProbeDevice as Device<Panicky>>::inject_fault(
        &ProbeDevice(0),
        Fault::Slow(Duration::from_millis(20)),
    )
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported);
    assert!(e.message().contains("slow by 20ms"), "{e}");

    // The mapping between the C values and `Fault`.
    assert_eq!(Fault::from_raw(fault::LOST, 0), Some(Fault::Lost));
    assert_eq!(Fault::from_raw(fault::LOST, 7), Some(Fault::Lost));
    assert_eq!(Fault::Lost.raw(), fault::LOST);
    assert_eq!(Fault::Lost.delay_ns(), 0);
    let slow = Fault::Slow(Duration::from_millis(20));
    assert_eq!(Fault::from_raw(fault::SLOW, 20_000_000), Some(slow));
    assert_eq!((slow.raw(), slow.delay_ns()), (fault::SLOW, 20_000_000));
    assert_eq!(
        Fault::from_raw(fault::SLOW, 0),
        Some(Fault::Slow(Duration::ZERO))
    );
    assert_eq!(Fault::Slow(Duration::MAX).delay_ns(), u64::MAX);
    assert_eq!(Fault::from_raw(0, 0), None);
    assert_eq!(Fault::from_raw(3, 0), None);
}

#[test]
fn null_and_wrong_kind_handles_are_refused() {
    let api = probe();
    let d = open(api, 0);
    let s = stream(api, d);
    let e = record(api, s);

    let mut a: xpu_stream_args = args();
    expect_err(
        api.stream_synchronize,
        &mut a,
        ErrorCode::InvalidArgument,
        "xpu_stream_args.stream is NULL",
    );
    a.stream = e.cast();
    expect_err(
        api.stream_synchronize,
        &mut a,
        ErrorCode::InvalidArgument,
        "is not a stream of this plugin",
    );

    let mut b: xpu_buffer_allocate_args = args();
    b.device = s.cast();
    b.size = 8;
    expect_err(
        api.buffer_allocate,
        &mut b,
        ErrorCode::InvalidArgument,
        "is not a device",
    );

    let mut q: xpu_event_query_args = args();
    q.event = d.cast();
    expect_err(
        api.event_query,
        &mut q,
        ErrorCode::InvalidArgument,
        "is not an event",
    );

    let mut c: xpu_device_close_args = args();
    expect_err(
        api.device_close,
        &mut c,
        ErrorCode::InvalidArgument,
        "xpu_device_close_args.device is NULL",
    );

    destroy_event(api, e);
    destroy_stream(api, s);
    close(api, d);
}

// ---------------------------------------------------------------- copies and ranges --

#[test]
fn copies_round_trip_and_bad_ranges_are_refused() {
    let api = probe();
    let d0 = open(api, 0);
    let d1 = open(api, 1);
    let s = stream(api, d0);
    let b = alloc(api, d0, 64);
    let other = alloc(api, d1, 64);

    write(api, s, range(b, 8, 4), &[1, 2, 3, 4]);
    let mut dd: xpu_copy_args = args();
    dd.stream = s;
    dd.src = range(b, 8, 4);
    dd.dst = range(b, 32, 4);
    dd.length = 4;
    call(api.copy_device_to_device, &mut dd).unwrap();
    assert_eq!(read(api, s, range(b, 6, 8)), [0, 0, 1, 2, 3, 4, 0, 0]);
    assert_eq!(read(api, s, range(b, 32, 4)), [1, 2, 3, 4]);

    let bytes = [0u8; 16];
    let mut a: xpu_copy_args = args();
    a.stream = s;
    a.host = bytes.as_ptr().cast_mut().cast();
    a.length = 16;
    a.dst = range(b, 56, 16);
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "(offset 56, length 16) does not lie within its buffer of 64 bytes",
    );
    a.dst = range(b, u64::MAX, 16);
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "does not lie within",
    );
    a.dst = range(other, 0, 16);
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "belongs to another device",
    );
    a.dst = range(b, 0, 8);
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "length is 16 but xpu_copy_args.dst.length is 8",
    );
    a.dst = range(b, 0, 16);
    a.host = null_mut();
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "host is NULL",
    );
    a.dst = range(null_mut(), 0, 16);
    expect_err(
        api.copy_host_to_device,
        &mut a,
        ErrorCode::InvalidArgument,
        "xpu_copy_args.dst.buffer is NULL",
    );

    dd.dst = range(b, 10, 4);
    expect_err(
        api.copy_device_to_device,
        &mut dd,
        ErrorCode::InvalidArgument,
        "overlap",
    );
    dd.dst = range(b, 40, 4);
    dd.length = 3;
    expect_err(
        api.copy_device_to_device,
        &mut dd,
        ErrorCode::InvalidArgument,
        "must be equal",
    );

    free(api, b);
    free(api, other);
    destroy_stream(api, s);
    close(api, d0);
    close(api, d1);
}

// -------------------------------------------------------------------------- builtins --

fn builtin_args(s: *mut xpu_stream, kind: u32, dt: u32) -> xpu_builtin_args {
    let mut a: xpu_builtin_args = args();
    a.stream = s;
    a.kind = kind;
    a.dtype = dt;
    a
}

#[test]
fn builtins_are_decoded_and_checked() {
    let api = probe();
    let d = open(api, 0);
    let s = stream(api, d);
    let b = alloc(api, d, 256);

    // A fill of u8 really runs.
    let mut a = builtin_args(s, builtin_kind::FILL, dtype::U8);
    a.dst = range(b, 3, 5);
    a.scalar = [9, 0, 0, 0, 0, 0, 0, 0];
    call(api.builtin, &mut a).unwrap();
    assert_eq!(read(api, s, range(b, 2, 7)), [0, 9, 9, 9, 9, 9, 0]);

    // Other operations reach the plugin decoded (the probe echoes them).
    let mut a = builtin_args(s, builtin_kind::SCALE, dtype::F32);
    a.dst = range(b, 0, 16);
    a.a = range(b, 0, 16);
    a.scalar = Scalar::F32(2.5).to_le_bytes();
    let e = expect_err(
        api.builtin,
        &mut a,
        ErrorCode::Unsupported,
        "Scale { alpha: F32(2.5)",
    );
    assert!(
        e.message().contains("offset: 0, length: 16")
            || e.message().contains("offset 0, length 16"),
        "{e}"
    );

    let mut a = builtin_args(s, builtin_kind::BINARY, dtype::I32);
    a.op = binary_op::MAX;
    a.dst = range(b, 0, 16);
    a.a = range(b, 0, 16);
    a.b = range(b, 16, 16);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::Unsupported,
        "Binary { op: Max, dtype: I32",
    );

    let mut a = builtin_args(s, builtin_kind::CAST, dtype::F32);
    a.dst_dtype = dtype::U8;
    a.a = range(b, 0, 16);
    a.dst = range(b, 64, 4);
    expect_err(api.builtin, &mut a, ErrorCode::Unsupported, "Cast {");

    // Unknown enum values: unsupported, naming the field.
    let mut a = builtin_args(s, 9, dtype::F32);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::Unsupported,
        "xpu_builtin_args.kind is 9",
    );
    let mut a = builtin_args(s, builtin_kind::FILL, 7);
    a.dst = range(b, 0, 4);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::Unsupported,
        "xpu_builtin_args.dtype is 7",
    );
    let mut a = builtin_args(s, builtin_kind::ACCUMULATE, dtype::F32);
    a.op = 4;
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::Unsupported,
        "xpu_builtin_args.op is 4",
    );

    // Misaligned, mismatched, partially overlapping.
    let mut a = builtin_args(s, builtin_kind::FILL, dtype::I32);
    a.dst = range(b, 2, 8);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::InvalidArgument,
        "not aligned to whole i32 elements",
    );
    let mut a = builtin_args(s, builtin_kind::ACCUMULATE, dtype::F32);
    a.dst = range(b, 0, 16);
    a.a = range(b, 16, 8);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::InvalidArgument,
        "same element count",
    );
    a.a = range(b, 8, 16);
    expect_err(
        api.builtin,
        &mut a,
        ErrorCode::InvalidArgument,
        "overlap without being the same range",
    );
    let mut a = builtin_args(s, builtin_kind::CAST, dtype::F32);
    a.dst_dtype = dtype::I32;
    a.a = range(b, 0, 16);
    a.dst = range(b, 0, 16);
    expect_err(api.builtin, &mut a, ErrorCode::Unsupported, "Cast {");

    free(api, b);
    destroy_stream(api, s);
    close(api, d);
}

// -------------------------------------------------------------------------- panics --

#[test]
fn panics_become_internal_errors_with_the_message() {
    let api = table(panicky_get_api);
    let mut a: xpu_device_count_args = args();
    let e = expect_err(
        api.device_count,
        &mut a,
        ErrorCode::Internal,
        "device_count exploded: 42",
    );
    assert!(
        e.message().contains("the plugin's device_count panicked"),
        "{e}"
    );
    // And again: the plugin is still there.
    expect_err(api.device_count, &mut a, ErrorCode::Internal, "exploded");

    // A panic deep in a stream method, and the stream still works afterwards.
    let api = probe();
    let d = open(api, 0);
    let s = stream(api, d);
    let b = alloc(api, d, 8);
    let mut f = builtin_args(s, builtin_kind::FILL, dtype::U8);
    f.dst = range(b, 0, 8);
    f.scalar[0] = 0xEE;
    expect_err(
        api.builtin,
        &mut f,
        ErrorCode::Internal,
        "the probe was told to panic",
    );
    f.scalar[0] = 1;
    call(api.builtin, &mut f).unwrap();
    assert_eq!(read(api, s, range(b, 0, 8)), [1; 8]);
    free(api, b);
    destroy_stream(api, s);
    close(api, d);
}

#[test]
fn a_failed_plugin_creation_is_reported_by_every_device_call() {
    let api = table(broken_get_api);
    for _ in 0..2 {
        let mut a: xpu_device_count_args = args();
        expect_err(
            api.device_count,
            &mut a,
            ErrorCode::Unavailable,
            "found no hardware",
        );
        let mut o: xpu_device_open_args = args();
        expect_err(
            api.device_open,
            &mut o,
            ErrorCode::Unavailable,
            "found no hardware",
        );
        assert!(o.device.is_null());
    }
}

// -------------------------------------------------------------------------- events --

#[test]
fn events_query_wait_and_time() {
    let api = probe();
    let d0 = open(api, 0);
    let d1 = open(api, 1);
    let s0 = stream(api, d0);
    let s1 = stream(api, d1);
    let e0 = record(api, s0);
    std::thread::sleep(Duration::from_millis(2));
    let e1 = record(api, s0);
    let other = record(api, s1);

    let mut q: xpu_event_query_args = args();
    q.event = e0;
    call(api.event_query, &mut q).unwrap();
    assert_eq!(q.done, 1);

    let mut w: xpu_event_wait_args = args();
    w.event = e1;
    w.timeout_ns = u64::MAX;
    call(api.event_wait, &mut w).unwrap();
    w.timeout_ns = 0;
    expect_err(api.event_wait, &mut w, ErrorCode::Timeout, "zero timeout");

    let mut el: xpu_event_elapsed_args = args();
    el.start = e0;
    el.end = e1;
    call(api.event_elapsed, &mut el).unwrap();
    assert!(el.elapsed_ns >= 2_000_000, "{}", el.elapsed_ns);
    el.end = other;
    expect_err(
        api.event_elapsed,
        &mut el,
        ErrorCode::InvalidArgument,
        "different devices",
    );

    // A stream waits on an event of another device of the plugin, which the host may
    // destroy right after.
    let mut sw: xpu_stream_wait_event_args = args();
    sw.stream = s1;
    sw.event = e0;
    call(api.stream_wait_event, &mut sw).unwrap();

    for e in [e0, e1, other] {
        destroy_event(api, e);
    }
    destroy_stream(api, s0);
    destroy_stream(api, s1);
    close(api, d0);
    close(api, d1);
}

// --------------------------------------------------------------- external events --

/// A host-side external event that counts what the plugin does with it.
#[derive(Default)]
struct Probe2 {
    status: i32,
    waits: AtomicU32,
    releases: AtomicU32,
    released_after_wait: AtomicU32,
    wait_thread: Mutex<Option<ThreadId>>,
}

unsafe extern "C" fn probe_wait(context: *mut c_void) -> i32 {
    // SAFETY: the context is an `Arc<Probe2>` made by `external` and alive until release.
    let p = unsafe { &*context.cast::<Probe2>() };
    *p.wait_thread.lock().unwrap() = Some(std::thread::current().id());
    std::thread::sleep(Duration::from_millis(5));
    p.waits.fetch_add(1, Ordering::SeqCst);
    p.status
}

unsafe extern "C" fn probe_release(context: *mut c_void) {
    // SAFETY: as in `probe_wait`; this gives back the reference `external` made.
    let p = unsafe { Arc::from_raw(context.cast::<Probe2>().cast_const()) };
    if p.waits.load(Ordering::SeqCst) == 1 {
        p.released_after_wait.fetch_add(1, Ordering::SeqCst);
    }
    p.releases.fetch_add(1, Ordering::SeqCst);
}

fn external(p: &Arc<Probe2>) -> xpu_external_event {
    xpu_external_event {
        context: Arc::into_raw(p.clone()).cast_mut().cast(),
        wait: Some(probe_wait),
        release: Some(probe_release),
    }
}

/// Polls `cond` until it holds; the 10 s limit is only a hang guard.
fn wait_for(cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn external_waits_run_on_a_plugin_thread_and_release_once() {
    let api = probe();
    let d = open(api, 0);
    let s = stream(api, d);

    // Success: wait on another thread, then release, each exactly once.
    let p = Arc::new(Probe2::default());
    let mut a: xpu_stream_wait_external_args = args();
    a.stream = s;
    a.external = external(&p);
    call(api.stream_wait_external, &mut a).unwrap();
    sync(api, s).unwrap();
    // The SDK releases the event before it lets the stream's later work run.
    assert_eq!(p.releases.load(Ordering::SeqCst), 1);
    assert_eq!(p.waits.load(Ordering::SeqCst), 1);
    assert_eq!(p.released_after_wait.load(Ordering::SeqCst), 1);
    let waiter = p.wait_thread.lock().unwrap().unwrap();
    assert_ne!(waiter, std::thread::current().id());
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(p.releases.load(Ordering::SeqCst), 1);
    assert_eq!(Arc::strong_count(&p), 1);

    // Failure reported by the host's wait: the stream's later work fails with Aborted.
    let p = Arc::new(Probe2 {
        status: 3,
        ..Probe2::default()
    });
    a.external = external(&p);
    call(api.stream_wait_external, &mut a).unwrap();
    let e = sync(api, s).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(e.message().contains("status 3"), "{e}");
    assert_eq!(p.releases.load(Ordering::SeqCst), 1);
    assert_eq!(p.waits.load(Ordering::SeqCst), 1);

    destroy_stream(api, s);
    close(api, d);
}

#[test]
fn refused_external_waits_are_released_without_waiting() {
    let api = probe();
    let d1 = open(api, 1);
    let refusing = stream(api, d1);
    let p = Arc::new(Probe2::default());
    let releases = |n: u32| wait_for(|| p.releases.load(Ordering::SeqCst) == n);

    // Ownership passes with the call: a refusal releases the event and never waits.
    let mut a: xpu_stream_wait_external_args = args();
    a.stream = refusing;
    a.external = external(&p);
    expect_err(
        api.stream_wait_external,
        &mut a,
        ErrorCode::Unsupported,
        "refuses external waits",
    );
    releases(1);
    a.stream = null_mut();
    a.external = external(&p);
    expect_err(
        api.stream_wait_external,
        &mut a,
        ErrorCode::InvalidArgument,
        "stream is NULL",
    );
    releases(2);
    a.stream = refusing;
    a.external = external(&p);
    a.external.wait = None;
    expect_err(
        api.stream_wait_external,
        &mut a,
        ErrorCode::InvalidArgument,
        "needs both `wait` and `release`",
    );
    releases(3);

    // Without `release` there is nothing the plugin can give back.
    a.external = external(&p);
    a.external.release = None;
    expect_err(
        api.stream_wait_external,
        &mut a,
        ErrorCode::InvalidArgument,
        "needs both `wait` and `release`",
    );
    // SAFETY: made by `external` above; the plugin could not release it.
    drop(unsafe { Arc::from_raw(a.external.context.cast::<Probe2>().cast_const()) });

    // A struct the plugin cannot read leaves the event with the host.
    a.external = external(&p);
    a.struct_size = 8;
    expect_err(
        api.stream_wait_external,
        &mut a,
        ErrorCode::InvalidArgument,
        "XPU_STREAM_WAIT_EXTERNAL_ARGS_MIN_SIZE",
    );
    // SAFETY: as above.
    drop(unsafe { Arc::from_raw(a.external.context.cast::<Probe2>().cast_const()) });

    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(p.waits.load(Ordering::SeqCst), 0);
    assert_eq!(p.releases.load(Ordering::SeqCst), 3);
    assert_eq!(Arc::strong_count(&p), 1);

    destroy_stream(api, refusing);
    close(api, d1);
}

// ------------------------------------------------------------------------- kernels --

#[test]
fn kernels_load_and_launch_with_checked_arguments() {
    let api = probe();
    let d0 = open(api, 0);
    let d1 = open(api, 1);
    let s0 = stream(api, d0);
    let s1 = stream(api, d1);
    let b = alloc(api, d0, 64);

    let code = [1u8, 2, 3];
    let mut l: xpu_kernel_load_args = args();
    l.device = d0;
    l.code = code.as_ptr();
    l.code_length = 3;
    l.entry_point = c"main".as_ptr();
    expect_err(
        api.kernel_load,
        &mut l,
        ErrorCode::InvalidArgument,
        "format is NULL",
    );
    l.format = c"probe-code".as_ptr();
    l.code = null();
    expect_err(
        api.kernel_load,
        &mut l,
        ErrorCode::InvalidArgument,
        "code is NULL",
    );
    l.code = code.as_ptr();
    call(api.kernel_load, &mut l).unwrap();
    let k = l.kernel;

    let kargs = [
        xpu_kernel_arg {
            kind: kernel_arg_kind::BUFFER,
            access: access::READ_WRITE,
            range: range(b, 16, 16),
            dtype: 0,
            scalar: [0; 8],
        },
        xpu_kernel_arg {
            kind: kernel_arg_kind::BUFFER,
            access: access::READ,
            range: range(null_mut(), 0, 0),
            dtype: 0,
            scalar: [0; 8],
        },
        xpu_kernel_arg {
            kind: kernel_arg_kind::SCALAR,
            access: 0,
            range: range(null_mut(), 0, 0),
            dtype: dtype::I32,
            scalar: Scalar::I32(-3).to_le_bytes(),
        },
    ];
    let mut a: xpu_kernel_launch_args = args();
    a.stream = s0;
    a.kernel = k;
    a.grid = [2, 1, 1];
    a.block = [32, 1, 1];
    a.args = kargs.as_ptr();
    a.arg_count = 3;
    let e = expect_err(
        api.kernel_launch,
        &mut a,
        ErrorCode::Unsupported,
        "probe-code main [1, 2, 3]",
    );
    assert!(e.message().contains("range: None, access: Read"), "{e}");
    assert!(e.message().contains("Scalar(I32(-3))"), "{e}");
    assert!(e.message().contains("access: ReadWrite"), "{e}");

    a.grid = [2, 0, 1];
    expect_err(
        api.kernel_launch,
        &mut a,
        ErrorCode::InvalidArgument,
        "at least 1",
    );
    a.grid = [1, 1, 1];
    a.args = null();
    expect_err(
        api.kernel_launch,
        &mut a,
        ErrorCode::InvalidArgument,
        "args is NULL but arg_count is 3",
    );
    a.args = kargs.as_ptr();
    a.stream = s1;
    expect_err(
        api.kernel_launch,
        &mut a,
        ErrorCode::InvalidArgument,
        "loaded on another device",
    );

    let mut kd: xpu_kernel_destroy_args = args();
    kd.kernel = k;
    call(api.kernel_destroy, &mut kd).unwrap();

    free(api, b);
    destroy_stream(api, s0);
    destroy_stream(api, s1);
    close(api, d0);
    close(api, d1);
}
