//! What the conformance suite cannot reach on the example C plugin: its native kernels
//! through `kernel_load`/`kernel_launch`, the resources a stream holds while work is in
//! flight, failures crossing between the plugin and another backend with their
//! messages, and objects outliving their device handle.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use xpu_hal::backend::Backend;
use xpu_hal::{
    Access, Device, Error, HostBuffer, KernelArg, KernelDesc, KernelParam, KernelSource,
    LaunchDims, Scalar,
};
use xpu_plugin::PluginBackend;

const FORMAT: &str = "xpu-minimal-v1";

use support::Setup;

fn kernel_desc(entry: &str, message: &str, params: Vec<KernelParam>) -> KernelDesc {
    let mut bytes = b"XMK1".to_vec();
    bytes.extend_from_slice(message.as_bytes());
    KernelDesc {
        name: format!("test.{entry}"),
        entry_point: entry.to_string(),
        source: KernelSource::PluginNative {
            format: FORMAT.to_string(),
            bytes,
        },
        params,
    }
}

fn sleep_kernel(device: &Device) -> xpu_hal::Kernel {
    device
        .load_kernel(kernel_desc(
            "sleep",
            "",
            vec![KernelParam::Scalar(xpu_hal::DType::I32)],
        ))
        .unwrap()
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn native_kernels_launch_with_buffers_scalars_and_dims() {
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 0);
    let stream = device.create_stream().unwrap();
    let mix = device
        .load_kernel(kernel_desc(
            "mix_i32",
            "",
            vec![
                KernelParam::Buffer(Access::Read),
                KernelParam::Buffer(Access::ReadWrite),
                KernelParam::Scalar(xpu_hal::DType::I32),
            ],
        ))
        .unwrap();
    let src: Vec<i32> = (0..1000).map(|i| i * 1_000_003).collect();
    let a = device.allocate(4 * 1000 + 8).unwrap();
    let b = device.allocate(4 * 1000).unwrap();
    stream.write(a.slice(8, 4000), &bytes(&src)).unwrap();
    stream.write(&b, &bytes(&vec![1; 1000])).unwrap();
    for k in [1, 2] {
        stream
            .launch(
                &mix,
                LaunchDims::linear(4, 64),
                &[
                    KernelArg::Buffer(a.slice(8, 4000)),
                    KernelArg::Buffer(b.whole()),
                    KernelArg::Scalar(Scalar::I32(k)),
                ],
            )
            .unwrap();
    }
    let got = i32s(&stream.read(&b).unwrap());
    for (i, (g, s)) in got.iter().zip(&src).enumerate() {
        // ((1 * 3 + s + 1) * 3 + s + 2), wrapping
        let want = 1i32
            .wrapping_mul(3)
            .wrapping_add(*s)
            .wrapping_add(1)
            .wrapping_mul(3)
            .wrapping_add(*s)
            .wrapping_add(2);
        assert_eq!(*g, want, "element {i}");
    }
    // The launch dimensions reach the kernel.
    let dims = device
        .load_kernel(kernel_desc(
            "dims_u32",
            "",
            vec![KernelParam::Buffer(Access::Write)],
        ))
        .unwrap();
    let out = device.allocate(24).unwrap();
    stream
        .launch(
            &dims,
            LaunchDims {
                grid: [3, 5, 7],
                block: [2, 4, 6],
            },
            &[KernelArg::Buffer(out.whole())],
        )
        .unwrap();
    assert_eq!(i32s(&stream.read(&out).unwrap()), [3, 5, 7, 2, 4, 6]);
    // The HAL's alignment check uses the plugin's kernel_arg_alignment (4).
    let e = stream
        .launch(
            &dims,
            LaunchDims::linear(1, 1),
            &[KernelArg::Buffer(out.slice(2, 8))],
        )
        .unwrap_err();
    assert_eq!(e.kind(), "invalid-argument", "{e}");
}

#[test]
fn kernel_load_errors_name_the_kernel() {
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 1);
    let mut desc = kernel_desc("nope", "", vec![]);
    let e = device.load_kernel(desc.clone()).unwrap_err();
    assert_eq!(e.kind(), "invalid-argument", "{e}");
    assert!(
        e.to_string().contains("test.nope") && e.to_string().contains("`nope`"),
        "{e}"
    );
    desc.source = KernelSource::PluginNative {
        format: "other-format".to_string(),
        bytes: b"XMK1".to_vec(),
    };
    let e = device.load_kernel(desc.clone()).unwrap_err();
    assert_eq!(e.kind(), "unsupported", "{e}");
    assert!(e.to_string().contains(FORMAT), "{e}");
    desc.source = KernelSource::PluginNative {
        format: FORMAT.to_string(),
        bytes: b"ELF?".to_vec(),
    };
    let e = device.load_kernel(desc).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
}

/// Work is really asynchronous, and what it uses is held exactly until it is known to
/// be done: by an event seen complete, or by synchronize.
#[test]
fn host_memory_is_held_until_the_work_is_known_to_be_done() {
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 0);
    let stream = device.create_stream().unwrap();
    let sleep = sleep_kernel(&device);
    let dst = device.allocate(4096).unwrap();
    let mut host = HostBuffer::from_bytes(&[7u8; 4096]).unwrap();
    let start = stream.record_event().unwrap();
    stream
        .launch(
            &sleep,
            LaunchDims::linear(1, 1),
            &[KernelArg::Scalar(Scalar::I32(100))],
        )
        .unwrap();
    stream.copy_from_host(&host, 0, &dst).unwrap();
    let after_copy = stream.record_event().unwrap();
    let mut back = HostBuffer::new(4096).unwrap();
    stream.copy_to_host(&dst, &back, 0).unwrap();
    assert!(
        !stream.query().unwrap(),
        "the sleeping kernel has not run yet"
    );
    assert!(!after_copy.query().unwrap());
    assert_eq!(host.in_flight(), 1);
    assert!(host.as_mut_slice().is_err());
    // Freeing the destination early is safe: the stream holds the buffer.
    dst.free().unwrap();
    after_copy.wait().unwrap();
    assert_eq!(
        host.in_flight(),
        0,
        "released once an event after it completed"
    );
    assert_eq!(
        back.in_flight(),
        1,
        "the later copy is not known to be done"
    );
    stream.synchronize().unwrap();
    assert_eq!(back.in_flight(), 0);
    assert_eq!(back.as_slice().unwrap(), &[7u8; 4096][..]);
    let elapsed = after_copy.elapsed_since(&start).unwrap();
    assert!(elapsed >= Duration::from_millis(90), "{elapsed:?}");
}

/// A failed kernel's message reaches synchronize and the events after it, and so does
/// it reach a stream of another backend waiting on such an event; the failure is
/// reported once.
#[test]
fn a_failing_kernel_reports_its_message_everywhere() {
    const MARKER: &str = "deliberate failure 0x51de";
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 0);
    let host = setup.device("host", 0);
    let stream = device.create_stream().unwrap();
    let fail = device
        .load_kernel(kernel_desc("fail", MARKER, vec![]))
        .unwrap();
    stream.launch(&fail, LaunchDims::linear(1, 1), &[]).unwrap();
    let event = stream.record_event().unwrap();
    let host_stream = host.create_stream().unwrap();
    host_stream.wait_event(&event).unwrap();
    let e = event.wait().unwrap_err();
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    assert!(e.to_string().contains(MARKER), "{e}");
    let e = host_stream.synchronize().unwrap_err();
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    assert!(e.to_string().contains(MARKER), "{e}");
    let e = stream.synchronize().unwrap_err();
    assert!(e.to_string().contains(MARKER), "{e}");
    assert!(e.to_string().contains("plugin.minimal:0"), "{e}");
    stream.synchronize().unwrap();
    let a = device.allocate(16).unwrap();
    stream.write(&a, &[1; 16]).unwrap();
}

/// A plugin stream waiting on a failed event of another backend reports an aborted
/// error that carries the other backend's message (the ABI's `wait` returns only a
/// number).
#[test]
fn a_failed_foreign_event_keeps_its_message() {
    const MARKER: &str = "host kernel failure 0xf0e1";
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 1);
    let host = setup.device("host", 0);
    let host_stream = host.create_stream().unwrap();
    let failing = host
        .load_kernel(KernelDesc {
            name: "test.fail".to_string(),
            entry_point: "main".to_string(),
            source: KernelSource::host_fn(|_| Err(MARKER.to_string())),
            params: vec![],
        })
        .unwrap();
    host_stream
        .launch(&failing, LaunchDims::linear(1, 1), &[])
        .unwrap();
    let host_event = host_stream.record_event().unwrap();
    let stream = device.create_stream().unwrap();
    stream.wait_event(&host_event).unwrap();
    let event = stream.record_event().unwrap();
    let e = event.wait().unwrap_err();
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    assert!(e.to_string().contains(MARKER), "{e}");
    let e = stream.synchronize().unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    assert!(e.to_string().contains(MARKER), "{e}");
    stream.synchronize().unwrap();
    let _ = host_stream.synchronize();
}

/// Buffers, streams with queued work, events and kernels may outlive the device
/// handle and the registry; the device is closed after the last of them, and the
/// memory accounting comes back in full.
#[test]
fn objects_outlive_their_device_handle() {
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 1);
    let total = device.memory_info().unwrap().total;
    let stream = device.create_stream().unwrap();
    let sleep = sleep_kernel(&device);
    let a = device.allocate(1 << 20).unwrap();
    let b = device.allocate(1 << 20).unwrap();
    stream
        .launch(
            &sleep,
            LaunchDims::linear(1, 1),
            &[KernelArg::Scalar(Scalar::I32(30))],
        )
        .unwrap();
    stream.copy(&a, &b).unwrap();
    let event = stream.record_event().unwrap();
    assert!(device.memory_info().unwrap().free <= total - (2 << 20));
    // A stream dropped with work queued finishes it before it is destroyed.
    drop(stream);
    drop(sleep);
    assert!(
        event.query().unwrap(),
        "the dropped stream finished its work"
    );
    drop(a);
    drop(event);
    assert!(device.memory_info().unwrap().free <= total - (1 << 20));
    drop(b);
    assert_eq!(device.memory_info().unwrap().free, total);
}

/// Many threads on one device: allocation, streams and events from all of them.
#[test]
fn threads_share_a_device() {
    let setup = Setup::new(support::minimal());
    let device = setup.device("plugin.minimal", 0);
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let device = device.clone();
            s.spawn(move || {
                for i in 0..20u8 {
                    let stream = device.create_stream().unwrap();
                    let a = device.allocate(333).unwrap();
                    let data = vec![t ^ i; 333];
                    let host = HostBuffer::from_bytes(&data).unwrap();
                    stream.copy_from_host(&host, 0, &a).unwrap();
                    let e = stream.record_event().unwrap();
                    e.wait().unwrap();
                    assert_eq!(stream.read(&a).unwrap(), data);
                }
            });
        }
    });
}

#[test]
fn the_backend_lists_devices_without_opening_them() {
    let plugin = PluginBackend::load(support::minimal()).unwrap();
    let list = plugin.enumerate().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].name, "plugin.minimal device 0");
}
