//! The SDK's standard-operation entry points (ABI 1.1), `device_ops` and `op_enqueue`,
//! called directly as a faulty host would call them: every descriptor the SDK must
//! refuse is refused with the documented error code and a message naming the field,
//! and the plugin's `Stream::run_op` is never called for it (counted per thread: the
//! SDK calls it on the caller's thread, and each test has a thread of its own).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::mem::size_of;
use std::ptr::{null, null_mut};
use std::time::Duration;

use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::{
    struct_size, take_raw, BufferRange, Builtin, DType, Device, DeviceKind, DeviceProperties,
    Error, ErrorCode, Event, ExternalWait, Handle, HostDestination, HostSource, MemoryInfo,
    NoKernel, Op, OpKind, OpParams, OpSupport, Plugin, ReduceOp, Result, Stream,
};

// ------------------------------------------------------------------ the counting plugin --

thread_local! {
    /// How often `run_op` was called on this thread, and the last operation, described.
    static RUN_OPS: Cell<u32> = const { Cell::new(0) };
    static LAST_OP: RefCell<String> = const { RefCell::new(String::new()) };
}

fn run_ops() -> u32 {
    RUN_OPS.with(Cell::get)
}

struct Counting;
struct CDevice(u32);
struct CBuffer;
struct CStream;
struct CEvent;

impl Plugin for Counting {
    const NAME: &'static CStr = c"counting";
    const VERSION: &'static CStr = c"1";
    type Device = CDevice;
    type Stream = CStream;
    type Event = CEvent;
    type Buffer = CBuffer;
    type Kernel = NoKernel;

    fn new() -> Result<Self> {
        Ok(Counting)
    }
    fn device_count(&self) -> Result<u32> {
        Ok(2)
    }
    fn open_device(&self, index: u32) -> Result<CDevice> {
        Ok(CDevice(index))
    }
}

impl Device<Counting> for CDevice {
    fn properties(&self) -> Result<DeviceProperties> {
        Ok(DeviceProperties {
            name: format!("counting {}", self.0),
            vendor: "tests".into(),
            driver: "none".into(),
            kind: DeviceKind::Npu,
            dtypes: DType::ALL.to_vec(),
            memory_bytes: 1 << 20,
            max_allocation: 1 << 20,
            kernel_arg_alignment: 1,
            timeline_events: false,
            event_timing: false,
            kernel_format: None,
        })
    }
    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            total: 1 << 20,
            free: 1 << 20,
        })
    }
    fn allocate(&self, _size: u64) -> Result<CBuffer> {
        Ok(CBuffer)
    }
    fn create_stream(&self) -> Result<CStream> {
        Ok(CStream)
    }
    /// Listed twice (merged), and once with no dtype (dropped).
    fn ops(&self) -> Result<Vec<OpSupport>> {
        Ok(vec![
            OpSupport {
                kind: OpKind::Relu,
                dtypes: vec![DType::F32],
            },
            OpSupport {
                kind: OpKind::Matmul,
                dtypes: Vec::new(),
            },
            OpSupport {
                kind: OpKind::Relu,
                dtypes: vec![DType::F64],
            },
            OpSupport {
                kind: OpKind::Reduce,
                dtypes: vec![DType::F32],
            },
        ])
    }
}

impl Stream<Counting> for CStream {
    fn copy_host_to_device(&self, _: HostSource, _: BufferRange<CBuffer>) -> Result<()> {
        Ok(())
    }
    fn copy_device_to_host(&self, _: BufferRange<CBuffer>, _: HostDestination) -> Result<()> {
        Ok(())
    }
    fn copy_device_to_device(
        &self,
        _: BufferRange<CBuffer>,
        _: BufferRange<CBuffer>,
    ) -> Result<()> {
        Ok(())
    }
    fn builtin(&self, _: Builtin<CBuffer>) -> Result<()> {
        Ok(())
    }
    fn run_op(&self, op: Op<CBuffer>) -> Result<()> {
        RUN_OPS.with(|c| c.set(c.get() + 1));
        let tensors: Vec<String> = op
            .tensors
            .iter()
            .map(|t| {
                format!(
                    "{:?}{:?}/{:?}@{}+{}",
                    t.dtype, t.dims, t.strides, t.range.offset, t.range.length
                )
            })
            .collect();
        LAST_OP.with(|l| *l.borrow_mut() = format!("{} {tensors:?} {:?}", op.kind, op.params));
        Ok(())
    }
    fn record_event(&self) -> Result<CEvent> {
        Ok(CEvent)
    }
    fn wait_event(&self, _: &Handle<CEvent>) -> Result<()> {
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

impl Event for CEvent {
    fn query(&self) -> Result<bool> {
        Ok(true)
    }
    fn wait(&self, _: Option<Duration>) -> Result<()> {
        Ok(())
    }
}

xpu_plugin_sdk::export_plugin!(Counting as counting_get_api);

// ------------------------------------------------------------------------- helpers --

fn api() -> &'static xpu_plugin_api {
    let host = xpu_host_info {
        struct_size: size_of::<xpu_host_info>(),
        extensions: null(),
        abi_major: 1,
        abi_minor: 1,
    };
    // SAFETY: `host` is valid for the call; the table is static.
    let api = unsafe { counting_get_api(&host) };
    assert!(!api.is_null());
    // SAFETY: non-null tables are static.
    unsafe { &*api }
}

/// An argument struct with every field zero (valid for all of them) but struct_size.
fn args<T>() -> T {
    // SAFETY: every ABI argument struct is valid all-zero.
    let mut v: T = unsafe { std::mem::zeroed() };
    // SAFETY: every ABI argument struct starts with `size_t struct_size`.
    unsafe { (&mut v as *mut T).cast::<usize>().write(size_of::<T>()) };
    v
}

fn call<A>(f: PluginFn<A>, a: &mut A) -> std::result::Result<(), Error> {
    let f = f.expect("the function is in the table");
    // SAFETY: `a` is an argument struct for `f` (possibly a deliberately bad one, which
    // the SDK must refuse); the error is ours to free.
    match unsafe { take_raw(f(a)) } {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// A fixture: device 0 and 1 of the plugin, a stream of device 0, a 64-byte buffer on
/// each device; closed again on drop.
struct Fixture {
    api: &'static xpu_plugin_api,
    devices: [*mut xpu_device; 2],
    stream: *mut xpu_stream,
    buffer: *mut xpu_buffer,
    other_buffer: *mut xpu_buffer,
}

impl Fixture {
    fn new() -> Fixture {
        let api = api();
        let open = |index| {
            let mut a: xpu_device_open_args = args();
            a.index = index;
            call(api.device_open, &mut a).unwrap();
            a.device
        };
        let devices = [open(0), open(1)];
        let mut s: xpu_stream_create_args = args();
        s.device = devices[0];
        call(api.stream_create, &mut s).unwrap();
        let alloc = |device| {
            let mut a: xpu_buffer_allocate_args = args();
            a.device = device;
            a.size = 64;
            call(api.buffer_allocate, &mut a).unwrap();
            a.buffer
        };
        Fixture {
            api,
            devices,
            stream: s.stream,
            buffer: alloc(devices[0]),
            other_buffer: alloc(devices[1]),
        }
    }

    /// A contiguous f32 tensor of `dims` at byte `offset` of the fixture's buffer.
    fn tensor(&self, dims: &[u64], offset: u64) -> xpu_tensor {
        let mut t: xpu_tensor = args();
        t.dtype = dtype::F32;
        t.rank = dims.len() as u32;
        let mut stride = 1;
        for (i, &d) in dims.iter().enumerate().rev() {
            t.dims[i] = d;
            t.strides[i] = stride;
            stride *= d;
        }
        t.range = xpu_buffer_range {
            buffer: self.buffer,
            offset,
            length: stride * 4,
        };
        t
    }

    /// Enqueues `op` on the fixture's stream with `tensors`, with `edit` applied to the
    /// argument struct first.
    fn enqueue(
        &self,
        op: u32,
        tensors: &[*const xpu_tensor],
        edit: impl FnOnce(&mut xpu_op_args),
    ) -> std::result::Result<(), Error> {
        let mut a: xpu_op_args = args();
        a.stream = self.stream;
        a.op = op;
        a.tensor_count = tensors.len() as u32;
        a.tensors = tensors.as_ptr();
        edit(&mut a);
        call(self.api.op_enqueue, &mut a)
    }

    /// `relu` of two descriptors.
    fn relu(&self, x: &xpu_tensor, y: &xpu_tensor) -> std::result::Result<(), Error> {
        self.enqueue(op::RELU, &[x, y], |_| {})
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let api = self.api;
        for b in [self.buffer, self.other_buffer] {
            let mut a: xpu_buffer_free_args = args();
            a.buffer = b;
            call(api.buffer_free, &mut a).unwrap();
        }
        let mut s: xpu_stream_args = args();
        s.stream = self.stream;
        call(api.stream_destroy, &mut s).unwrap();
        for d in self.devices {
            let mut c: xpu_device_close_args = args();
            c.device = d;
            call(api.device_close, &mut c).unwrap();
        }
    }
}

/// Asserts that `result` is a refusal with `code` whose message holds every needle, and
/// that the plugin's `run_op` was not called for it.
#[track_caller]
fn refused(result: std::result::Result<(), Error>, code: ErrorCode, needles: &[&str]) {
    let e = match result {
        Ok(()) => panic!("accepted; wanted {code:?} with {needles:?}"),
        Err(e) => e,
    };
    assert_eq!(e.code(), code, "{e}");
    for n in needles {
        assert!(e.message().contains(n), "`{n}` not in: {e}");
    }
    assert_eq!(
        run_ops(),
        0,
        "run_op was called for a refused descriptor: {e}"
    );
}

// --------------------------------------------------------------------------- tests --

/// The control: good descriptors reach `run_op` once, decoded; a newer host's larger
/// structs are accepted (their extra bytes unread).
#[test]
fn good_descriptors_reach_run_op() {
    let f = Fixture::new();
    let x = f.tensor(&[2, 4], 0);
    let y = f.tensor(&[2, 4], 32);
    f.relu(&x, &y).unwrap();
    assert_eq!(run_ops(), 1);
    let last = LAST_OP.with(|l| l.borrow().clone());
    assert_eq!(
        last,
        r#"relu ["F32[2, 4]/[4, 1]@0+32", "F32[2, 4]/[4, 1]@32+32"] None"#
    );

    // A strided (every other column) view and a broadcast input pass too.
    let mut strided = f.tensor(&[2, 2], 0);
    strided.strides = [4, 2, 0, 0];
    strided.range.length = (4 + 2 + 1) * 4;
    let mut broadcast = f.tensor(&[2, 2], 32);
    broadcast.strides = [0, 1, 0, 0];
    broadcast.range.length = 8;
    f.relu(&broadcast, &strided).unwrap();
    assert_eq!(run_ops(), 2);

    #[repr(C)]
    struct NewerTensor {
        t: xpu_tensor,
        more: u64,
    }
    #[repr(C)]
    struct NewerArgs {
        a: xpu_op_args,
        more: u64,
    }
    let mut nx = NewerTensor { t: x, more: 7 };
    nx.t.struct_size = size_of::<NewerTensor>();
    let mut newer = NewerArgs { a: args(), more: 9 };
    let tensors: [*const xpu_tensor; 2] = [&nx.t, &y];
    newer.a.struct_size = size_of::<NewerArgs>();
    newer.a.stream = f.stream;
    newer.a.op = op::RELU;
    newer.a.tensor_count = 2;
    newer.a.tensors = tensors.as_ptr();
    call(f.api.op_enqueue, &mut newer.a).unwrap();
    assert_eq!(run_ops(), 3);
}

#[test]
fn unknown_operations_are_unsupported() {
    let f = Fixture::new();
    let x = f.tensor(&[4], 0);
    let y = f.tensor(&[4], 16);
    for op in [0, op::DROPOUT + 1, u32::MAX] {
        refused(
            f.enqueue(op, &[&x, &y], |_| {}),
            ErrorCode::Unsupported,
            &[&format!("xpu_op_args.op is {op}"), "no XPU_OP_*"],
        );
    }
}

#[test]
fn a_wrong_tensor_count_is_invalid() {
    let f = Fixture::new();
    let x = f.tensor(&[4], 0);
    refused(
        f.enqueue(op::RELU, &[&x, &x, &x], |_| {}),
        ErrorCode::InvalidArgument,
        &["tensor_count is 3, but relu takes 2"],
    );
    refused(
        f.enqueue(op::RELU, &[&x], |_| {}),
        ErrorCode::InvalidArgument,
        &["tensor_count is 1"],
    );
    refused(
        f.enqueue(op::RELU, &[], |a| a.tensors = null()),
        ErrorCode::InvalidArgument,
        &["tensor_count is 0"],
    );
    // A count far beyond XPU_OP_MAX_TENSORS is refused before anything is read.
    refused(
        f.enqueue(op::RELU, &[&x, &x], |a| a.tensor_count = u32::MAX),
        ErrorCode::InvalidArgument,
        &["tensor_count is 4294967295"],
    );
}

#[test]
fn null_tensor_pointers_are_invalid() {
    let f = Fixture::new();
    let x = f.tensor(&[4], 0);
    refused(
        f.enqueue(op::RELU, &[&x, &x], |a| a.tensors = null()),
        ErrorCode::InvalidArgument,
        &["xpu_op_args.tensors is NULL but tensor_count is 2"],
    );
    refused(
        f.enqueue(op::RELU, &[&x, null()], |_| {}),
        ErrorCode::InvalidArgument,
        &["tensor 1", "xpu_tensor pointer is NULL"],
    );
    refused(
        f.enqueue(op::RELU, &[null(), &x], |_| {}),
        ErrorCode::InvalidArgument,
        &["tensor 0", "xpu_tensor pointer is NULL"],
    );
}

#[test]
fn ranks_outside_1_to_4_are_invalid() {
    let f = Fixture::new();
    let y = f.tensor(&[4], 16);
    for rank in [0, 5, u32::MAX] {
        let mut x = f.tensor(&[4], 0);
        x.rank = rank;
        refused(
            f.relu(&x, &y),
            ErrorCode::InvalidArgument,
            &[&format!("tensor 0 has rank {rank}"), "1 to 4 dimensions"],
        );
    }
    // A dimension of 0: no element, which the host never sends.
    let mut x = f.tensor(&[4, 1], 0);
    x.dims[1] = 0;
    refused(
        f.relu(&y, &x),
        ErrorCode::InvalidArgument,
        &["tensor 1 has shape [4, 0] with no element"],
    );
}

#[test]
fn unknown_dtypes_are_unsupported() {
    let f = Fixture::new();
    let y = f.tensor(&[4], 16);
    for dt in [7, 31, u32::MAX] {
        let mut x = f.tensor(&[4], 0);
        x.dtype = dt;
        refused(
            f.relu(&y, &x),
            ErrorCode::Unsupported,
            &[&format!("tensor 1's dtype is {dt}"), "no xpu_dtype"],
        );
    }
}

#[test]
fn ranges_outside_their_buffer_are_invalid() {
    let f = Fixture::new();
    let y = f.tensor(&[4], 0);
    // 16 bytes from 56 in a 64-byte buffer; and an offset that overflows.
    for offset in [56, 64, u64::MAX - 7] {
        let x = f.tensor(&[4], offset);
        refused(
            f.relu(&x, &y),
            ErrorCode::InvalidArgument,
            &[
                "tensor 0's range",
                "does not lie within its buffer of 64 bytes",
            ],
        );
    }
    // No buffer, a buffer of another device, and a handle of another kind.
    let mut x = f.tensor(&[4], 0);
    x.range.buffer = null_mut();
    refused(
        f.relu(&y, &x),
        ErrorCode::InvalidArgument,
        &["tensor 1's range.buffer"],
    );
    x.range.buffer = f.other_buffer;
    refused(
        f.relu(&y, &x),
        ErrorCode::InvalidArgument,
        &["tensor 1's range.buffer belongs to another device"],
    );
    x.range.buffer = f.stream.cast();
    refused(
        f.relu(&y, &x),
        ErrorCode::InvalidArgument,
        &["tensor 1's range.buffer"],
    );
}

#[test]
fn a_span_that_does_not_match_the_layout_is_invalid() {
    let f = Fixture::new();
    let y = f.tensor(&[4], 32);
    // Too short and too long for f32[4] (16 bytes).
    for length in [12, 20, 0] {
        let mut x = f.tensor(&[4], 0);
        x.range.length = length;
        refused(
            f.relu(&x, &y),
            ErrorCode::InvalidArgument,
            &[
                "tensor 0 (f32 [4], strides [1]) spans 16 bytes",
                &format!("length {length}"),
            ],
        );
    }
    // Strides make the span larger than the contiguous size the range claims.
    let mut x = f.tensor(&[2, 2], 0);
    x.strides = [4, 1, 0, 0];
    refused(
        f.relu(&x, &y),
        ErrorCode::InvalidArgument,
        &["spans 24 bytes", "length 16"],
    );
    // Not at a whole element.
    let x = f.tensor(&[4], 2);
    refused(
        f.relu(&x, &y),
        ErrorCode::InvalidArgument,
        &["tensor 0", "offset 2", "whole element"],
    );
    // A layout whose span overflows 64 bits.
    let mut x = f.tensor(&[4], 0);
    x.strides[0] = u64::MAX / 2;
    refused(
        f.relu(&x, &y),
        ErrorCode::InvalidArgument,
        &["more than 2^64"],
    );
    let mut x = f.tensor(&[2, 2], 0);
    x.dims = [u64::MAX, u64::MAX, 0, 0];
    refused(
        f.relu(&x, &y),
        ErrorCode::InvalidArgument,
        &["more than 2^64"],
    );
}

/// `struct_size` below the 1.1 size (the MIN_SIZE of the structs ABI 1.1 introduced) is
/// refused, naming the struct, the macro and the version; so is a NULL argument struct
/// and a NULL stream.
#[test]
fn small_structs_and_null_handles_are_invalid() {
    let f = Fixture::new();
    let x = f.tensor(&[4], 0);
    let y = f.tensor(&[4], 16);
    for size in [
        0,
        8,
        struct_size!(xpu_op_args, tensors),
        struct_size!(xpu_op_args, params) - 1,
    ] {
        refused(
            f.enqueue(op::RELU, &[&x, &y], |a| a.struct_size = size),
            ErrorCode::InvalidArgument,
            &[
                &format!("xpu_op_args.struct_size is {size}"),
                "XPU_OP_ARGS_MIN_SIZE",
                "ABI 1.1",
            ],
        );
    }
    for size in [
        0,
        struct_size!(xpu_tensor, strides),
        struct_size!(xpu_tensor, range) - 1,
    ] {
        let mut small = x;
        small.struct_size = size;
        refused(
            f.relu(&y, &small),
            ErrorCode::InvalidArgument,
            &[
                "tensor 1",
                &format!("xpu_tensor.struct_size is {size}"),
                "XPU_TENSOR_MIN_SIZE",
                "ABI 1.1",
            ],
        );
    }
    let e = unsafe_null_args(f.api);
    refused(
        Err(e),
        ErrorCode::InvalidArgument,
        &["xpu_op_args pointer is NULL"],
    );
    refused(
        f.enqueue(op::RELU, &[&x, &y], |a| a.stream = null_mut()),
        ErrorCode::InvalidArgument,
        &["xpu_op_args.stream"],
    );
    refused(
        f.enqueue(op::RELU, &[&x, &y], |a| a.stream = f.buffer.cast()),
        ErrorCode::InvalidArgument,
        &["xpu_op_args.stream"],
    );
}

fn unsafe_null_args(api: &xpu_plugin_api) -> Error {
    let f = api.op_enqueue.unwrap();
    // SAFETY: NULL is what is being tested; the error is ours.
    unsafe { take_raw(f(null_mut())) }.expect("a NULL struct is refused")
}

/// Parameters with values no ABI 1.1 enum has: unsupported, naming the field.
#[test]
fn unknown_parameter_values_are_unsupported() {
    let f = Fixture::new();
    let x = f.tensor(&[2, 4], 0);
    let y = f.tensor(&[2, 1], 32);
    refused(
        f.enqueue(op::REDUCE, &[&x, &y], |a| {
            a.params.reduce = xpu_op_reduce_params { op: 4, axis: 1 }
        }),
        ErrorCode::Unsupported,
        &["params.reduce.op is 4"],
    );
    let r = f.tensor(&[4], 0);
    refused(
        f.enqueue(op::RANDOM, &[&r], |a| {
            a.params.random = xpu_op_random_params {
                distribution: 3,
                a: 0.0,
                b: 1.0,
                reserved: 0,
                seed: 1,
                offset: 0,
            }
        }),
        ErrorCode::Unsupported,
        &["params.random.distribution is 3"],
    );
    // The same reduce with a real operator reaches the plugin, decoded.
    f.enqueue(op::REDUCE, &[&x, &y], |a| {
        a.params.reduce = xpu_op_reduce_params {
            op: reduce_op::MAX,
            axis: 1,
        }
    })
    .unwrap();
    assert_eq!(run_ops(), 1);
    let last = LAST_OP.with(|l| l.borrow().clone());
    let want = OpParams::Reduce {
        op: ReduceOp::Max,
        axis: 1,
    };
    assert!(last.ends_with(&format!("{want:?}")), "{last}");
}

/// `device_ops`: the list is merged per operation, operations without a dtype are
/// dropped; a small struct or a NULL device is refused without writing anything.
#[test]
fn device_ops_lists_merged_entries_and_refuses_bad_structs() {
    let f = Fixture::new();
    let mut a: xpu_device_ops_args = args();
    a.device = f.devices[0];
    call(f.api.device_ops, &mut a).unwrap();
    assert!(!a.ops.is_null());
    // SAFETY: `count` entries, valid until the device is closed.
    let list = unsafe { std::slice::from_raw_parts(a.ops, a.count as usize) };
    let pairs: Vec<(u32, u32)> = list.iter().map(|s| (s.op, s.dtype_mask)).collect();
    assert_eq!(
        pairs,
        [
            (op::RELU, (1 << dtype::F32) | (1 << dtype::F64)),
            (op::REDUCE, 1 << dtype::F32)
        ]
    );

    let mut small: xpu_device_ops_args = args();
    small.device = f.devices[0];
    small.struct_size = struct_size!(xpu_device_ops_args, ops);
    let e = call(f.api.device_ops, &mut small).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.message().contains("XPU_DEVICE_OPS_ARGS_MIN_SIZE"), "{e}");
    assert!(e.message().contains("ABI 1.1"), "{e}");
    assert!(small.ops.is_null() && small.count == 0);

    let mut none: xpu_device_ops_args = args();
    let e = call(f.api.device_ops, &mut none).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.message().contains("xpu_device_ops_args.device"), "{e}");
    assert!(none.ops.is_null() && none.count == 0);
}
