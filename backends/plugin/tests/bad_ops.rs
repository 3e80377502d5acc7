//! Bad data from a plugin's standard operations (ABI 1.1), each defect a real shared
//! library built from `tests/fixtures/bad.c` (the `BAD_OPS_*` modes): what the device
//! then lists in `Capabilities::ops`, what `Stream::run_op` and `synchronize` return,
//! and what the backend's diagnostics say. Nothing may crash, hang or succeed silently.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use xpu_hal::backend::{Backend, DeviceImpl};
use xpu_hal::ops::{Layout, Op, OpKind, RawTensor, Tensor};
use xpu_hal::{Allocation, DType, Device, DeviceId, Error, RawSlice, Registry};
use xpu_plugin::PluginBackend;

const DEVICE: &str = "plugin.bad:0";

/// One of the `BAD_OPS_*` plugins, loaded and registered, with its device 0.
struct Bad {
    backend: Arc<PluginBackend>,
    device: Device,
    _registry: Registry,
}

impl Bad {
    fn load(defect: &str) -> Bad {
        let backend = Arc::new(PluginBackend::load(support::bad(defect)).unwrap());
        let mut registry = Registry::new();
        registry.register(backend.clone()).unwrap();
        let device = registry.device(&DeviceId::new("plugin.bad", 0)).unwrap();
        Bad {
            backend,
            device,
            _registry: registry,
        }
    }

    /// What the device lists, as plain pairs.
    fn ops(&self) -> Vec<(OpKind, Vec<DType>)> {
        self.device
            .capabilities()
            .ops
            .iter()
            .map(|s| (s.kind, s.dtypes.clone()))
            .collect()
    }

    fn diagnostics(&self) -> Vec<String> {
        self.backend.diagnostics()
    }

    /// The device still does ordinary work: a write and a read back.
    fn round_trip(&self) {
        let a = self.device.allocate(64).unwrap();
        let s = self.device.create_stream().unwrap();
        let data: Vec<u8> = (0..64).collect();
        s.write(&a, &data).unwrap();
        assert_eq!(s.read(&a).unwrap(), data);
    }
}

/// Two buffers of four `dtype` elements each.
fn buffers(device: &Device, dtype: DType) -> (Allocation, Allocation) {
    let bytes = 4 * dtype.size() as u64;
    (
        device.allocate(bytes).unwrap(),
        device.allocate(bytes).unwrap(),
    )
}

fn relu<'a>(x: &'a Allocation, y: &'a Allocation, dtype: DType) -> Op<Tensor<'a>> {
    Op::Relu {
        x: Tensor::new(x, dtype, &[4]).unwrap(),
        y: Tensor::new(y, dtype, &[4]).unwrap(),
    }
}

fn assert_contains(e: &Error, needles: &[&str]) {
    let text = e.to_string();
    for n in needles {
        assert!(text.contains(n), "`{n}` not in: {text}");
    }
}

/// `relu` on f32 through the HAL: refused as unsupported, naming the device and the
/// operation (the device lists nothing).
fn relu_is_unsupported(bad: &Bad) {
    let (x, y) = buffers(&bad.device, DType::F32);
    let s = bad.device.create_stream().unwrap();
    let e = s.run_op(&relu(&x, &y, DType::F32)).unwrap_err();
    println!("{e}");
    assert_eq!(e.kind(), "unsupported", "{e}");
    assert_contains(&e, &[DEVICE, "relu"]);
    s.synchronize().unwrap();
}

/// `relu` on f32 straight to the backend's stream, past the HAL's check of the
/// device's list: the backend itself must not call a function pair it did not accept.
fn relu_below_the_hal(backend: &PluginBackend) -> Result<(), Error> {
    let device = backend.create_plugin_device(0).unwrap();
    let stream = device.create_stream().unwrap();
    let tensor = || RawTensor {
        memory: RawSlice {
            memory: device.allocate(16).unwrap(),
            offset: 0,
            len: 16,
        },
        layout: Layout::contiguous(DType::F32, &[4]).unwrap(),
    };
    let result = stream.run_op(Op::Relu {
        x: tensor(),
        y: tensor(),
    });
    stream.synchronize().unwrap();
    result
}

/// (a) An absurd count: the host reads its limit of 1024 entries, not a byte more (the
/// entry at index 1024 is not listed, and reading 1 << 30 entries would crash), and
/// says so in a diagnostic. The device works, operations included.
#[test]
fn an_absurd_operation_count_is_read_up_to_the_limit() {
    let bad = Bad::load("OPS_HUGE_COUNT");
    assert_eq!(
        bad.ops(),
        vec![
            (OpKind::BiasAdd, vec![DType::F32]),
            (OpKind::Relu, vec![DType::F32]),
        ],
        "index 1023 is read, index 1024 (gelu) is not"
    );
    let d = bad.diagnostics();
    println!("{d:?}");
    assert_eq!(d.len(), 1, "{d:?}");
    for needle in [DEVICE, "device_ops", "1073741824", "first 1024"] {
        assert!(d[0].contains(needle), "`{needle}` not in {d:?}");
    }
    let (x, y) = buffers(&bad.device, DType::F32);
    let s = bad.device.create_stream().unwrap();
    s.run_op(&relu(&x, &y, DType::F32)).unwrap();
    s.synchronize().unwrap();
    bad.round_trip();
}

/// (b) A NULL array with a nonzero count: nothing is read through it; the device
/// provides no operation, says why in a diagnostic, and otherwise works.
#[test]
fn a_null_operation_array_with_a_count_lists_nothing() {
    let bad = Bad::load("OPS_NULL_LIST");
    assert!(bad.ops().is_empty(), "{:?}", bad.ops());
    let d = bad.diagnostics();
    println!("{d:?}");
    assert_eq!(d.len(), 1, "{d:?}");
    for needle in [
        DEVICE,
        "device_ops",
        "NULL",
        "3 entries",
        "no standard operation",
    ] {
        assert!(d[0].contains(needle), "`{needle}` not in {d:?}");
    }
    relu_is_unsupported(&bad);
    bad.round_trip();
}

/// (c) Operation numbers no ABI version defines, dtype bits of dtypes an operation is
/// not defined on and bits that are no dtype at all are ignored (a newer plugin may
/// list more); what is valid is listed, entries of one operation merged, operations
/// left without a dtype dropped. Ignoring them is the header's rule, not a plugin
/// fault: no diagnostic.
#[test]
fn unknown_operations_and_dtypes_are_ignored() {
    let bad = Bad::load("OPS_UNKNOWN");
    assert_eq!(
        bad.ops(),
        vec![
            (OpKind::Relu, vec![DType::F32, DType::F64]),
            (OpKind::Gather, vec![DType::U8]),
        ]
    );
    assert!(bad.diagnostics().is_empty(), "{:?}", bad.diagnostics());
    // A listed operation runs; an ignored dtype bit does not make relu run on a dtype
    // the device did not list.
    let s = bad.device.create_stream().unwrap();
    let (x, y) = buffers(&bad.device, DType::F32);
    s.run_op(&relu(&x, &y, DType::F32)).unwrap();
    let (x, y) = buffers(&bad.device, DType::F16);
    let e = s.run_op(&relu(&x, &y, DType::F16)).unwrap_err();
    println!("{e}");
    assert_eq!(e.kind(), "unsupported", "{e}");
    assert_contains(&e, &[DEVICE, "relu on f32, f64 but not on f16"]);
    s.synchronize().unwrap();
}

/// (d) `device_ops` failing: the device provides no operation, and the diagnostic
/// names the device, the function and the plugin's message. The device still opens
/// and works.
#[test]
fn a_failing_operation_list_is_a_diagnostic() {
    let bad = Bad::load("OPS_LIST_ERROR");
    assert!(bad.ops().is_empty(), "{:?}", bad.ops());
    let d = bad.diagnostics();
    println!("{d:?}");
    assert_eq!(d.len(), 1, "{d:?}");
    for needle in [
        DEVICE,
        "device_ops",
        "XPU_ERROR_INTERNAL",
        "the operation table is corrupt",
        "no standard operation",
    ] {
        assert!(d[0].contains(needle), "`{needle}` not in {d:?}");
    }
    relu_is_unsupported(&bad);
    bad.round_trip();
}

/// (e) `op_enqueue` refusing at once: the caller gets the error, mapped by its code,
/// naming the device, the function and the plugin's message; the stream is not
/// poisoned (synchronize succeeds, later work runs).
#[test]
fn enqueue_time_refusals_reach_the_caller() {
    let bad = Bad::load("OPS_ENQUEUE_ERROR");
    assert_eq!(
        bad.ops(),
        vec![
            (OpKind::BiasAdd, vec![DType::F32]),
            (OpKind::Relu, vec![DType::F32]),
            (OpKind::ReluBackward, vec![DType::F32]),
        ]
    );
    let device = &bad.device;
    let s = device.create_stream().unwrap();
    let (x, y) = buffers(device, DType::F32);
    let (dy, bias) = buffers(device, DType::F32);

    // INVALID_ARGUMENT: invalid-argument, with the operation's name in front.
    let e = s.run_op(&relu(&x, &y, DType::F32)).unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_contains(
        &e,
        &[
            "relu",
            DEVICE,
            "op_enqueue",
            "tensor 1 lies in memory the device cannot write",
        ],
    );

    // UNSUPPORTED: unsupported.
    let e = s
        .run_op(&Op::BiasAdd {
            x: Tensor::new(&x, DType::F32, &[1, 4]).unwrap(),
            bias: Tensor::new(&bias, DType::F32, &[4]).unwrap(),
            y: Tensor::new(&y, DType::F32, &[1, 4]).unwrap(),
        })
        .unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert_contains(
        &e,
        &[
            DEVICE,
            "op_enqueue",
            "bias_add needs the bias in on-chip memory",
        ],
    );

    // INTERNAL: a backend error carrying the plugin's error.
    let e = s
        .run_op(&Op::ReluBackward {
            x: Tensor::new(&x, DType::F32, &[4]).unwrap(),
            dy: Tensor::new(&dy, DType::F32, &[4]).unwrap(),
            dx: Tensor::new(&y, DType::F32, &[4]).unwrap(),
        })
        .unwrap_err();
    println!("{e}");
    let Error::Backend { backend, source } = &e else {
        panic!("expected a backend error, got {e:?}");
    };
    assert_eq!(backend, "plugin.bad");
    let plugin_error = source
        .downcast_ref::<xpu_plugin::PluginError>()
        .expect("the source is the plugin's error");
    assert_eq!(plugin_error.function, "op_enqueue");
    assert_contains(
        &e,
        &[
            "plugin.bad",
            "op_enqueue",
            "XPU_ERROR_INTERNAL",
            "the operation queue overflowed",
        ],
    );

    // Refused work is not the stream's failure.
    s.synchronize().unwrap();
    let data: Vec<u8> = (0..16).collect();
    s.write(&x, &data).unwrap();
    assert_eq!(s.read(&x).unwrap(), data);
    assert!(bad.diagnostics().is_empty(), "{:?}", bad.diagnostics());
}

/// (f) Work that fails after `op_enqueue` accepted it: the next synchronize (or query)
/// returns the plugin's error, once; the stream then works again.
#[test]
fn an_asynchronous_failure_is_reported_by_the_next_synchronize() {
    const MESSAGE: &str = "index at position 2 is 8, outside [0, 8)";
    let bad = Bad::load("OPS_ASYNC_ERROR");
    assert_eq!(bad.ops(), vec![(OpKind::Relu, vec![DType::F32])]);
    let s = bad.device.create_stream().unwrap();
    let (x, y) = buffers(&bad.device, DType::F32);

    s.run_op(&relu(&x, &y, DType::F32)).unwrap();
    let e = s.synchronize().unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_contains(&e, &[DEVICE, "stream_synchronize", MESSAGE]);
    s.synchronize().unwrap();

    s.run_op(&relu(&x, &y, DType::F32)).unwrap();
    let e = s.query().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_contains(&e, &[DEVICE, "stream_query", MESSAGE]);
    assert!(s.query().unwrap());
    s.synchronize().unwrap();

    let data: Vec<u8> = (0..16).collect();
    s.write(&x, &data).unwrap();
    assert_eq!(s.read(&x).unwrap(), data);
}

/// (g) Half of the pair: `device_ops` without `op_enqueue`, or `op_enqueue` without
/// `device_ops`. Either way the device provides no operation, the HAL refuses them, and
/// the backend's own stream refuses them too without calling the plugin.
#[test]
fn half_of_the_operation_functions_provides_nothing() {
    for defect in ["OPS_NO_ENQUEUE", "OPS_NO_LIST"] {
        let bad = Bad::load(defect);
        assert!(bad.ops().is_empty(), "{defect}: {:?}", bad.ops());
        relu_is_unsupported(&bad);
        let e = relu_below_the_hal(&bad.backend).unwrap_err();
        println!("{defect}: {e}");
        assert_eq!(e.kind(), "unsupported", "{defect}: {e}");
        assert_contains(&e, &[DEVICE, "relu", "both device_ops and op_enqueue"]);
        assert!(
            !e.to_string().contains("op_enqueue was called"),
            "{defect}: {e}"
        );
        bad.round_trip();
    }
}

/// A plugin of ABI 1.0 cannot mean the members of 1.1, even if its table is long
/// enough to hold them: they are not read.
#[test]
fn a_1_0_plugin_with_operation_functions_provides_nothing() {
    let bad = Bad::load("OPS_MINOR_0");
    assert_eq!(bad.backend.abi_version(), (1, 0));
    assert!(bad.ops().is_empty(), "{:?}", bad.ops());
    relu_is_unsupported(&bad);
    let e = relu_below_the_hal(&bad.backend).unwrap_err();
    assert_eq!(e.kind(), "unsupported", "{e}");
    bad.round_trip();
}
