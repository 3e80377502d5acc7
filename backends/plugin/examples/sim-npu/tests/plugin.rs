//! The simulated NPU through its exported C table, with the default configuration
//! (2 devices of 256 MiB, no latency, unlimited bandwidth): properties, memory,
//! copies, every builtin operation of every dtype against the host backend's
//! reference, events across streams and devices, external waits, failures, kernels.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::*;
use xpu_hal::reference as ops;
use xpu_plugin_sdk::abi::*;
use xpu_plugin_sdk::{DType, ErrorCode, Scalar};
use xpu_sim_npu::bytecode::{self, BinOp, Instr, Module};

#[test]
fn the_table_and_properties_describe_a_simulated_npu() {
    let api = api();
    assert_eq!(cstr(api.name), "simnpu");
    assert_eq!(cstr(api.version), env!("CARGO_PKG_VERSION"));
    assert_eq!((api.abi_major, api.abi_minor), (1, 4));
    assert!(api.event_elapsed.is_some() && api.kernel_load.is_some());
    assert!(api.device_ops.is_some() && api.op_enqueue.is_some());
    assert!(api.device_inject_fault.is_some());

    assert_eq!(device_count().unwrap(), 2);
    let e = open(2).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("XPU_SIMNPU_DEVICES"), "{e}");

    let d = open(1).unwrap();
    let p = properties(d);
    assert_eq!(cstr(p.name), "simnpu 1 (simulated NPU)");
    assert_eq!(p.kind, device_kind::NPU);
    assert_eq!(p.dtype_mask, 0x7f);
    assert_eq!(p.memory_bytes, 256 << 20);
    assert_eq!(p.max_allocation, 256 << 20);
    assert_eq!(p.kernel_arg_alignment, 64);
    assert_eq!((p.timeline_events, p.event_timing), (1, 1));
    assert_eq!(cstr(p.kernel_format), "simnpu-bytecode");
    assert!(cstr(p.driver).starts_with("xpu-sim-npu "));
    assert_eq!(
        capabilities(d),
        ["simulated=1", "latency_us=0", "bandwidth_gbps=unlimited"]
    );
    close(d);
}

#[test]
fn memory_is_an_arena_with_real_out_of_memory() {
    let d = open(0).unwrap();
    let (total, free0) = memory(d);
    assert_eq!((total, free0), (256 << 20, 256 << 20));
    let a = alloc(d, 100).unwrap();
    assert_eq!(
        memory(d).1,
        free0 - 256,
        "allocations take whole 256-byte blocks"
    );
    let big = alloc(d, (256 << 20) - 256).unwrap();
    assert_eq!(memory(d).1, 0);
    let e = alloc(d, 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory);
    assert!(
        e.message()
            .contains("plugin.simnpu:0 cannot allocate 1 bytes"),
        "{e}"
    );
    assert!(e.message().contains("XPU_SIMNPU_MEMORY"), "{e}");
    free(big);
    free(a);
    assert_eq!(memory(d).1, free0);
    close(d);
}

#[test]
fn copies_land_at_their_offsets_only() {
    let d = open(0).unwrap();
    let s = stream(d);
    let b = alloc(d, 1000).unwrap();
    let c = alloc(d, 1000).unwrap();
    let background = pattern(1, 1000);
    write(s, range(b, 0, 1000), &background).unwrap();
    write(s, range(c, 0, 1000), &background).unwrap();
    let data = pattern(2, 333);
    write(s, range(b, 7, 333), &data).unwrap();
    copy(s, range(b, 7, 333), range(c, 601, 333)).unwrap();
    let got = read(s, range(c, 0, 1000)).unwrap();
    assert_eq!(&got[..601], &background[..601]);
    assert_eq!(&got[601..934], &data[..]);
    assert_eq!(&got[934..], &background[934..]);
    let got = read(s, range(b, 0, 1000)).unwrap();
    assert_eq!(&got[..7], &background[..7]);
    assert_eq!(&got[7..340], &data[..]);
    assert_eq!(&got[340..], &background[340..]);
    free(b);
    free(c);
    destroy_stream(s);
    close(d);
}

// ------------------------------------------------------------------ builtins --

/// Runs `$body` with `$T` bound to the Rust type of an SDK dtype.
macro_rules! with_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        xpu_hal::with_dtype!(DType, $dtype, $T => $body)
    };
}

fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytemuck::pod_collect_to_vec(bytes)
}

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Sample data of `n` elements of `dtype`: random bits mixed with ordinary numbers,
/// zeros and (for floats) NaN and infinities.
fn sample(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let size = dtype.size() as usize;
    let mut out = pattern(seed, n * size);
    let specials: Vec<Vec<u8>> = with_type!(dtype, T => {
        let v: Vec<f64> = vec![0.0, 1.0, -2.0, 3.5, 100.0, -0.0, f64::NAN, f64::INFINITY];
        v.into_iter()
            .map(|x| {
                let mut one = [<T as bytemuck::Zeroable>::zeroed()];
                ops::cast::<f64, T>(&[x], &mut one);
                bytes(&one)
            })
            .collect()
    });
    for (i, chunk) in out.chunks_exact_mut(size).enumerate() {
        if i % 3 == 0 {
            chunk.copy_from_slice(&specials[(i / 3) % specials.len()]);
        }
    }
    out
}

fn hal_op(op: u32) -> xpu_hal::BinaryOp {
    xpu_hal::BinaryOp::ALL[op as usize]
}

/// `op(a, b)` computed by the host backend's functions.
fn reference_binary(dtype: DType, op: u32, a: &[u8], b: &[u8]) -> Vec<u8> {
    with_type!(dtype, T => {
        let (a, b) = (typed::<T>(a), typed::<T>(b));
        let mut out = a.clone();
        ops::binary(hal_op(op), &a, &b, &mut out);
        bytes(&out)
    })
}

fn reference_scale(dtype: DType, alpha: &[u8; 8], src: &[u8]) -> Vec<u8> {
    with_type!(dtype, T => {
        let alpha: T = bytemuck::pod_read_unaligned(&alpha[..dtype.size() as usize]);
        let src = typed::<T>(src);
        let mut out = src.clone();
        ops::scale(alpha, &src, &mut out);
        bytes(&out)
    })
}

fn reference_cast(from: DType, to: DType, src: &[u8]) -> Vec<u8> {
    with_type!(from, S => with_type!(to, D => {
        let src = typed::<S>(src);
        let mut out = vec![<D as bytemuck::Zeroable>::zeroed(); src.len()];
        ops::cast(&src, &mut out);
        bytes(&out)
    }))
}

const N: usize = 61;

#[test]
fn builtins_match_the_host_reference_for_every_dtype() {
    let d = open(0).unwrap();
    let s = stream(d);
    let buf = alloc(d, 4096).unwrap();
    for dtype in DType::ALL {
        let dt = dtype.raw();
        let len = (N * dtype.size() as usize) as u64;
        // Three disjoint element-aligned ranges at odd element offsets.
        let (ra, rb, rd) = (
            range(buf, 8, len),
            range(buf, 8 + len + 16, len),
            range(buf, 8 + 2 * len + 40, len),
        );
        let (a, b) = (
            sample(dtype, N, 10 + u64::from(dt)),
            sample(dtype, N, 20 + u64::from(dt)),
        );
        let load = |x: &[u8], y: &[u8]| {
            write(s, ra, x).unwrap();
            write(s, rb, y).unwrap();
        };

        // fill
        let mut value = [0u8; 8];
        value[..dtype.size() as usize]
            .copy_from_slice(&a[3 * dtype.size() as usize..4 * dtype.size() as usize]);
        let mut op = Op::new(builtin_kind::FILL, dt, rd);
        op.scalar = value;
        builtin(s, &op).unwrap();
        let one = &value[..dtype.size() as usize];
        assert_eq!(read(s, rd).unwrap(), one.repeat(N), "fill {dtype}");

        for binop in 0..4 {
            let name = format!("{dtype} op {binop}");
            let want = reference_binary(dtype, binop, &a, &b);
            // dst = a op b, all disjoint.
            load(&a, &b);
            let mut op = Op::new(builtin_kind::BINARY, dt, rd);
            op.op = binop;
            (op.a, op.b) = (ra, rb);
            builtin(s, &op).unwrap();
            assert_eq!(read(s, rd).unwrap(), want, "binary {name}");
            // dst is a.
            op.dst = ra;
            builtin(s, &op).unwrap();
            assert_eq!(read(s, ra).unwrap(), want, "binary dst=a {name}");
            // dst is b.
            load(&a, &b);
            op.dst = rb;
            builtin(s, &op).unwrap();
            assert_eq!(read(s, rb).unwrap(), want, "binary dst=b {name}");
            // all three the same.
            load(&a, &b);
            (op.dst, op.a, op.b) = (ra, ra, ra);
            builtin(s, &op).unwrap();
            assert_eq!(
                read(s, ra).unwrap(),
                reference_binary(dtype, binop, &a, &a),
                "binary self {name}"
            );
            // accumulate: dst op= src, and dst op= dst.
            load(&a, &b);
            let mut acc = Op::new(builtin_kind::ACCUMULATE, dt, ra);
            acc.op = binop;
            acc.a = rb;
            builtin(s, &acc).unwrap();
            assert_eq!(read(s, ra).unwrap(), want, "accumulate {name}");
            load(&b, &a);
            acc.a = ra;
            builtin(s, &acc).unwrap();
            assert_eq!(
                read(s, ra).unwrap(),
                reference_binary(dtype, binop, &b, &b),
                "accumulate self {name}"
            );
        }

        // scale, disjoint and in place.
        let mut alpha = [0u8; 8];
        alpha[..dtype.size() as usize]
            .copy_from_slice(&b[6 * dtype.size() as usize..7 * dtype.size() as usize]);
        let want = reference_scale(dtype, &alpha, &a);
        load(&a, &b);
        let mut op = Op::new(builtin_kind::SCALE, dt, rd);
        op.a = ra;
        op.scalar = alpha;
        builtin(s, &op).unwrap();
        assert_eq!(read(s, rd).unwrap(), want, "scale {dtype}");
        op.dst = ra;
        builtin(s, &op).unwrap();
        assert_eq!(read(s, ra).unwrap(), want, "scale in place {dtype}");

        // casts to every dtype, and in place where the sizes agree.
        for to in DType::ALL {
            let want = reference_cast(dtype, to, &a);
            load(&a, &b);
            let dst = range(buf, 3000, (N * to.size() as usize) as u64);
            let mut op = Op::new(builtin_kind::CAST, dt, dst);
            op.dst_dtype = to.raw();
            op.a = ra;
            builtin(s, &op).unwrap();
            assert_eq!(read(s, dst).unwrap(), want, "cast {dtype} -> {to}");
            if to.size() == dtype.size() {
                op.dst = ra;
                builtin(s, &op).unwrap();
                assert_eq!(read(s, ra).unwrap(), want, "cast in place {dtype} -> {to}");
            }
        }
    }
    // A readable spot check: 2.5f32 + 4 = 6.5.
    let r = range(buf, 0, 4);
    write(s, r, &2.5f32.to_le_bytes()).unwrap();
    let mut acc = Op::new(builtin_kind::ACCUMULATE, dtype::F32, r);
    acc.a = range(buf, 4, 4);
    write(s, acc.a, &4f32.to_le_bytes()).unwrap();
    builtin(s, &acc).unwrap();
    assert_eq!(read(s, r).unwrap(), 6.5f32.to_le_bytes());
    free(buf);
    destroy_stream(s);
    close(d);
}

// -------------------------------------------------------------------- events --

#[test]
fn events_order_streams_across_devices() {
    let (d0, d1) = (open(0).unwrap(), open(1).unwrap());
    let (s0, s1) = (stream(d0), stream(d1));
    let (b0, b1) = (alloc(d0, 64).unwrap(), alloc(d1, 64).unwrap());
    let gate = Gate::new();

    // s0: start, wait for the gate, copy, done. s1 waits for s0's `done`.
    let start = record(s0);
    wait_external(s0, &gate).unwrap();
    let data = pattern(3, 64);
    write_async(s0, range(b0, 0, 64), &data).unwrap();
    let done = record(s0);
    wait_event(s1, done).unwrap();
    let later = pattern(4, 64);
    write_async(s1, range(b1, 0, 64), &later).unwrap();
    let after = record(s1);

    std::thread::sleep(Duration::from_millis(20));
    assert!(event_done(start).unwrap());
    // `start` completed no later than now (its timestamp is at most this); `done`
    // cannot complete before the gate opens below.
    let start_seen = Instant::now();
    assert!(
        !event_done(done).unwrap(),
        "s0 must hold work behind the external wait"
    );
    assert!(
        !event_done(after).unwrap(),
        "s1 must hold work behind s0's event"
    );
    assert!(!query(s0).unwrap() && !query(s1).unwrap());
    let e = event_wait(after, 1_000_000).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout);

    std::thread::sleep(Duration::from_millis(20));
    let opened = Instant::now();
    gate.open(0);
    event_wait(after, u64::MAX).unwrap();
    assert!(event_done(done).unwrap());
    // The device's timestamps and the host's clock are the same monotonic clock, so
    // the time between the events covers at least what the host saw between them.
    let held = opened.duration_since(start_seen).as_nanos() as u64;
    let elapsed = elapsed_ns(start, done).unwrap();
    assert!(
        elapsed >= held,
        "{elapsed} ns between the events, {held} ns held"
    );
    let e = elapsed_ns(start, after).unwrap_err();
    assert_eq!(
        e.code(),
        ErrorCode::InvalidArgument,
        "events of two devices: {e}"
    );
    sync(s0).unwrap();
    sync(s1).unwrap();
    assert_eq!(read(s0, range(b0, 0, 64)).unwrap(), data);
    assert_eq!(read(s1, range(b1, 0, 64)).unwrap(), later);
    assert_eq!(*gate.released.lock().unwrap(), 1, "released exactly once");

    for e in [start, done, after] {
        destroy_event(e);
    }
    free(b0);
    free(b1);
    destroy_stream(s0);
    destroy_stream(s1);
    close(d0);
    close(d1);
}

#[test]
fn a_failure_aborts_later_work_until_it_is_reported() {
    let d = open(0).unwrap();
    let (s, other) = (stream(d), stream(d));
    let b = alloc(d, 16).unwrap();
    write(s, range(b, 0, 16), &[1; 16]).unwrap();

    let gate = Gate::new();
    wait_external(s, &gate).unwrap();
    let mut fill = Op::new(builtin_kind::FILL, dtype::U8, range(b, 0, 16));
    fill.scalar[0] = 9;
    builtin(s, &fill).unwrap();
    let event = record(s);
    wait_event(other, event).unwrap();
    gate.open(5);

    let e = event_wait(event, u64::MAX).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    let e = sync(s).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(e.message().contains("status 5"), "{e}");
    // Reported once; the fill was skipped; the stream works again.
    sync(s).unwrap();
    assert_eq!(read(s, range(b, 0, 16)).unwrap(), [1; 16]);
    builtin(s, &fill).unwrap();
    assert_eq!(read(s, range(b, 0, 16)).unwrap(), [9; 16]);
    // The stream that waited on the failed event fails too.
    let e = sync(other).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(
        e.message()
            .contains("waited for an event whose work failed"),
        "{e}"
    );
    sync(other).unwrap();

    destroy_event(event);
    free(b);
    destroy_stream(s);
    destroy_stream(other);
    close(d);
}

/// Asserts that `r` failed with `DEVICE_LOST` saying the fault was injected into `device`.
fn assert_injected_loss<T: std::fmt::Debug>(r: R<T>, device: &str, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), ErrorCode::DeviceLost, "{what}: {e}");
    assert!(e.message().contains(device), "{what}: {e}");
    assert!(e.message().contains("injected"), "{what}: {e}");
}

/// `device_inject_fault` with `XPU_FAULT_LOST` (ABI 1.2): the work queued behind a held
/// wait fails instead of running, every later call on the device, its streams and its
/// events fails with `DEVICE_LOST` for good, the release functions still work, and the
/// other device is not affected.
#[test]
fn an_injected_loss_fails_queued_work_and_every_later_call() {
    let (d0, d1) = (open(0).unwrap(), open(1).unwrap());
    let (b0, b1) = (alloc(d0, 256).unwrap(), alloc(d1, 256).unwrap());
    let (s0, s1) = (stream(d0), stream(d1));
    let data = pattern(7, 256);
    write(s1, range(b1, 0, 256), &data).unwrap();
    let before = record(s1);
    event_wait(before, u64::MAX).unwrap();

    // Queued behind an external wait the test holds: a copy back, and an event.
    let gate = Gate::new();
    wait_external(s1, &gate).unwrap();
    let mut out = vec![0xAAu8; 256];
    read_async(s1, range(b1, 0, 256), &mut out).unwrap();
    let after = record(s1);
    // A stream of the other device waits on the event after the loss.
    wait_event(s0, after).unwrap();

    inject_fault(d1, fault::LOST).unwrap();
    gate.open(0);
    assert_injected_loss(sync(s1), "plugin.simnpu:1", "synchronize after the loss");
    assert_eq!(out, vec![0xAA; 256], "the queued copy must not have run");
    // The worker dropped the failed wait; the SDK's thread gives the event back once
    // the host's `wait` returns, which may be just after the synchronize.
    let deadline = Instant::now() + Duration::from_secs(10);
    while *gate.released.lock().unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the external event behind the loss was not released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*gate.released.lock().unwrap(), 1, "released exactly once");
    assert_injected_loss(event_wait(after, u64::MAX), "plugin.simnpu:1", "event_wait");
    assert_injected_loss(event_done(before), "plugin.simnpu:1", "event_query");
    // The other device's stream fails the work after its wait, as for any failed event,
    // and then works again.
    let e = sync(s0).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(e.message().contains("injected"), "{e}");

    // Every later call on the lost device fails, and keeps failing.
    assert_injected_loss(sync(s1), "plugin.simnpu:1", "a second synchronize");
    assert_injected_loss(query(s1), "plugin.simnpu:1", "stream_query");
    assert_injected_loss(try_memory(d1), "plugin.simnpu:1", "memory_info");
    assert_injected_loss(alloc(d1, 64), "plugin.simnpu:1", "buffer_allocate");
    assert_injected_loss(try_stream(d1), "plugin.simnpu:1", "stream_create");
    assert_injected_loss(try_record(s1), "plugin.simnpu:1", "event_record");
    assert_injected_loss(
        write_async(s1, range(b1, 0, 4), &[1, 2, 3, 4]),
        "plugin.simnpu:1",
        "copy_host_to_device",
    );
    assert_injected_loss(
        read_async(s1, range(b1, 0, 4), &mut [0; 4]),
        "plugin.simnpu:1",
        "copy_device_to_host",
    );
    assert_injected_loss(
        copy(s1, range(b1, 0, 4), range(b1, 8, 4)),
        "plugin.simnpu:1",
        "copy_device_to_device",
    );
    let mut fill = Op::new(builtin_kind::FILL, dtype::U8, range(b1, 0, 16));
    fill.scalar[0] = 3;
    assert_injected_loss(builtin(s1, &fill), "plugin.simnpu:1", "builtin");
    assert_injected_loss(
        wait_event(s1, before),
        "plugin.simnpu:1",
        "stream_wait_event",
    );
    let refused = Gate::new();
    assert_injected_loss(
        wait_external(s1, &refused),
        "plugin.simnpu:1",
        "stream_wait_external",
    );
    // A refused external event is released, by the SDK's thread, without a wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while *refused.released.lock().unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the refused external event was not released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let code = bytecode::axpy().encode().unwrap();
    assert_injected_loss(
        kernel_load(d1, c"simnpu-bytecode", &code, c"axpy"),
        "plugin.simnpu:1",
        "kernel_load",
    );
    // Injecting again changes nothing, nor does a slowdown; an unknown fault is refused.
    inject_fault(d1, fault::LOST).unwrap();
    inject_slow(d1, 1_000_000).unwrap();
    inject_slow(d1, 0).unwrap();
    assert_injected_loss(sync(s1), "plugin.simnpu:1", "synchronize after a slowdown");
    assert_injected_loss(
        alloc(d1, 64),
        "plugin.simnpu:1",
        "allocate after a slowdown",
    );
    let e = inject_fault(d0, 99).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("99"), "{e}");

    // The other device works.
    sync(s0).unwrap();
    write(s0, range(b0, 0, 256), &data).unwrap();
    assert_eq!(read(s0, range(b0, 0, 256)).unwrap(), data);
    assert_eq!(try_memory(d0).unwrap().0, 256 << 20);

    // The release functions work on the lost device.
    destroy_event(before);
    destroy_event(after);
    free(b1);
    destroy_stream(s1);
    close(d1);
    free(b0);
    destroy_stream(s0);
    close(d0);
}

/// `device_inject_fault` with `XPU_FAULT_SLOW` (ABI 1.2): a builtin, a kernel launch and
/// a copy each take the 20 ms delay longer on the stream's timeline (events see at least
/// 60 ms between them), with unchanged results; `delay_ns` 0 ends the slowdown.
#[test]
fn an_injected_slowdown_delays_every_operation_on_the_worker() {
    let d = open(0).unwrap();
    let s = stream(d);
    let code = bytecode::axpy().encode().unwrap();
    let k = kernel_load(d, c"simnpu-bytecode", &code, c"axpy").unwrap();
    let n = 64u64;
    let (x, y, z) = (
        alloc(d, 4 * n).unwrap(),
        alloc(d, 4 * n).unwrap(),
        alloc(d, 4 * n).unwrap(),
    );
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    write(s, range(x, 0, 4 * n), &f32s(&xs)).unwrap();
    let kargs = [
        scalar_arg(Scalar::F32(2.0)),
        buffer_arg(range(x, 0, 4 * n), access::READ),
        buffer_arg(range(y, 0, 4 * n), access::READ_WRITE),
    ];
    let mut fill = Op::new(builtin_kind::FILL, dtype::F32, range(y, 0, 4 * n));
    fill.scalar[..4].copy_from_slice(&1.0f32.to_le_bytes());

    for delay_ns in [20_000_000, 0] {
        inject_slow(d, delay_ns).unwrap();
        let start = record(s);
        // y = 1; y = 2x + y; z = y.
        builtin(s, &fill).unwrap();
        launch(s, k, [1, 1, 1], [64, 1, 1], &kargs).unwrap();
        copy(s, range(y, 0, 4 * n), range(z, 0, 4 * n)).unwrap();
        let end = record(s);
        sync(s).unwrap();
        if delay_ns > 0 {
            let took = elapsed_ns(start, end).unwrap();
            assert!(
                took >= 3 * delay_ns,
                "three slowed operations took {took} ns"
            );
        }
        let got = from_f32s(&read(s, range(z, 0, 4 * n)).unwrap());
        for (i, v) in got.iter().enumerate() {
            assert_eq!(
                *v,
                2.0 * i as f32 + 1.0,
                "element {i} (delay {delay_ns} ns)"
            );
        }
        destroy_event(start);
        destroy_event(end);
    }

    kernel_destroy(k);
    for b in [x, y, z] {
        free(b);
    }
    destroy_stream(s);
    close(d);
}

#[test]
fn a_destroyed_stream_finishes_its_work_first() {
    let d = open(1).unwrap();
    let s = stream(d);
    let b = alloc(d, 1 << 20).unwrap();
    let data = pattern(5, 1 << 20);
    for _ in 0..8 {
        write_async(s, range(b, 0, 1 << 20), &data).unwrap();
    }
    destroy_stream(s);
    let reader = stream(d);
    assert_eq!(read(reader, range(b, 0, 1 << 20)).unwrap(), data);
    destroy_stream(reader);
    free(b);
    close(d);
}

#[test]
fn streams_accept_work_from_several_threads() {
    let d = open(0).unwrap();
    let s = stream(d);
    let b = alloc(d, 4 * 4).unwrap();
    write(s, range(b, 0, 16), &[0; 16]).unwrap();
    let one = alloc(d, 4).unwrap();
    write(s, range(one, 0, 4), &1i32.to_le_bytes()).unwrap();
    let (s_addr, b_addr, one_addr) = (s as usize, b as usize, one as usize);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                for _ in 0..100 {
                    let mut acc = Op::new(
                        builtin_kind::ACCUMULATE,
                        dtype::I32,
                        range(b_addr as *mut _, t * 4, 4),
                    );
                    acc.a = range(one_addr as *mut _, 0, 4);
                    builtin(s_addr as *mut _, &acc).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let got = read(s, range(b, 0, 16)).unwrap();
    let counts: Vec<i32> = got
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(counts, [100; 4]);
    free(b);
    free(one);
    destroy_stream(s);
    close(d);
}

// ------------------------------------------------------------------- kernels --

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn axpy_runs_over_the_launched_invocations() {
    let d = open(0).unwrap();
    let s = stream(d);
    let code = bytecode::axpy().encode().unwrap();
    let k = kernel_load(d, c"simnpu-bytecode", &code, c"axpy").unwrap();
    let n = 300;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 13) as f32 + 0.1).collect();
    let xb = alloc(d, 4 * n as u64).unwrap();
    let yb = alloc(d, 64 + 4 * n as u64).unwrap();
    write(s, range(xb, 0, 4 * n as u64), &f32s(&x)).unwrap();
    let yr = range(yb, 64, 4 * n as u64);
    write(s, yr, &f32s(&y)).unwrap();

    let a = 1.5f32;
    let kargs = [
        scalar_arg(Scalar::F32(a)),
        buffer_arg(range(xb, 0, 4 * n as u64), access::READ),
        buffer_arg(yr, access::READ_WRITE),
    ];
    // 4 x 64 = 256 invocations: the last 44 elements stay as they were.
    launch(s, k, [4, 1, 1], [64, 1, 1], &kargs).unwrap();
    let got = from_f32s(&read(s, yr).unwrap());
    for i in 0..n {
        let want = if i < 256 { a * x[i] + y[i] } else { y[i] };
        assert_eq!(got[i].to_bits(), want.to_bits(), "element {i}");
    }

    // Enqueue-time checks.
    let e = launch(s, k, [1, 1, 1], [1, 1, 1], &kargs[..2]).unwrap_err();
    assert!(
        e.message()
            .contains("takes 3 arguments; the launch passed 2"),
        "{e}"
    );
    let mut bad = kargs;
    bad[0] = scalar_arg(Scalar::I32(1));
    let e = launch(s, k, [1, 1, 1], [1, 1, 1], &bad).unwrap_err();
    assert!(
        e.message()
            .contains("as an f32 scalar, but I32(1) was passed"),
        "{e}"
    );
    let mut bad = kargs;
    bad[2].access = access::READ;
    let e = launch(s, k, [1, 1, 1], [1, 1, 1], &bad).unwrap_err();
    assert!(
        e.message()
            .contains("loads from and stores to argument 2, but it was passed as Read"),
        "{e}"
    );
    let mut bad = kargs;
    bad[1] = buffer_arg(range(yb, 0, 128), access::READ);
    let e = launch(s, k, [1, 1, 1], [1, 1, 1], &bad).unwrap_err();
    assert!(e.message().contains("overlap"), "{e}");
    let mut bad = kargs;
    bad[1] = scalar_arg(Scalar::F32(0.0));
    let e = launch(s, k, [1, 1, 1], [1, 1, 1], &bad).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    // An empty range for a used buffer: no invocation touches anything.
    let mut empty = kargs;
    empty[1] = buffer_arg(range(null_mut(), 0, 0), access::READ);
    launch(s, k, [1, 1, 1], [1, 1, 1], &empty).unwrap();
    assert_eq!(from_f32s(&read(s, yr).unwrap()), got);

    kernel_destroy(k);
    free(xb);
    free(yb);
    destroy_stream(s);
    close(d);
}

#[test]
fn kernel_loading_and_run_time_failures_are_reported() {
    let d = open(1).unwrap();
    let s = stream(d);
    let axpy = bytecode::axpy().encode().unwrap();
    let e = kernel_load(d, c"spirv", &axpy, c"axpy").unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported);
    let e = kernel_load(d, c"simnpu-bytecode", b"SNPU\x07", c"axpy").unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("encoding version 7"), "{e}");
    let e = kernel_load(d, c"simnpu-bytecode", &axpy, c"gemm").unwrap_err();
    assert!(e.message().contains("no function `gemm`"), "{e}");

    // A kernel that traps: the launch is accepted, synchronize reports the trap once.
    let module = Module::new()
        .function(
            "iota_then_trap",
            1,
            vec![
                Instr::Index { rd: 0 },
                Instr::Const { rd: 1, value: 2.0 },
                Instr::Binary {
                    op: BinOp::Mul,
                    rd: 0,
                    ra: 0,
                    rb: 1,
                },
                Instr::Store { arg: 0, rs: 0 },
                Instr::Trap { code: 7 },
            ],
        )
        .unwrap()
        .function(
            "iota",
            1,
            vec![Instr::Index { rd: 0 }, Instr::Store { arg: 0, rs: 0 }],
        )
        .unwrap();
    let code = module.encode().unwrap();
    let trap = kernel_load(d, c"simnpu-bytecode", &code, c"iota_then_trap").unwrap();
    let iota = kernel_load(d, c"simnpu-bytecode", &code, c"iota").unwrap();
    let b = alloc(d, 40).unwrap();
    let arg = [buffer_arg(range(b, 0, 40), access::WRITE)];
    launch(s, trap, [10, 1, 1], [1, 1, 1], &arg).unwrap();
    let e = sync(s).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted);
    assert!(e.message().contains("kernel `iota_then_trap`"), "{e}");
    assert!(e.message().contains("trapped with code 7"), "{e}");
    launch(s, iota, [2, 1, 1], [5, 1, 1], &arg).unwrap();
    let got = from_f32s(&read(s, range(b, 0, 40)).unwrap());
    assert_eq!(got, (0..10).map(|i| i as f32).collect::<Vec<_>>());

    kernel_destroy(trap);
    kernel_destroy(iota);
    free(b);
    destroy_stream(s);
    close(d);
}

#[test]
fn the_host_gets_no_time_back_from_an_idle_device() {
    // With no latency configured, a burst of small operations completes quickly: the
    // simulation adds nothing on top of the work itself.
    let d = open(0).unwrap();
    let s = stream(d);
    let b = alloc(d, 64).unwrap();
    let start = Instant::now();
    let mut fill = Op::new(builtin_kind::FILL, dtype::U8, range(b, 0, 64));
    for i in 0..200u8 {
        fill.scalar[0] = i;
        builtin(s, &fill).unwrap();
    }
    sync(s).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(read(s, range(b, 0, 64)).unwrap(), [199; 64]);
    free(b);
    destroy_stream(s);
    close(d);
}
