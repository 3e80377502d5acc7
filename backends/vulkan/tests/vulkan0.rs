//! What is particular to Vulkan devices, on `vulkan:0`: ranges larger than the
//! device's largest storage binding (`maxStorageBufferRange`, 128 MiB on lavapipe) are
//! bound in pieces by the builtin operations, and host buffers are pinned (imported)
//! wherever the device has `VK_EXT_external_memory_host`. (The `copy.pinned`
//! conformance case runs pinned copies on every device.)

#![allow(clippy::unwrap_used)]

use xpu_hal::backend::Backend;
use xpu_hal::{BinaryOp, DType, Device, DeviceId, HostBuffer, Scalar};
use xpu_vulkan::VulkanBackend;

/// The first Vulkan device, or `None` (with a note) where there is none and CI does not
/// require one.
fn device() -> Option<Device> {
    let backend = VulkanBackend::new();
    match backend.enumerate() {
        Ok(_) => Some(Device::from_impl(
            DeviceId::new("vulkan", 0),
            backend.create_device(0).unwrap(),
        )),
        Err(e) => {
            let required = std::env::var("XPU_REQUIRE")
                .is_ok_and(|v| v.split(',').any(|p| p.trim() == "vulkan"));
            assert!(!required, "Vulkan is required here: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn builtins_cover_ranges_beyond_one_binding() {
    let Some(d) = device() else { return };
    let s = d.create_stream().unwrap();
    let len = 160 * MIB;
    let a = d.allocate(len).unwrap();
    let b = d.allocate(len).unwrap();
    s.fill(&a, Scalar::F32(1.5)).unwrap();
    s.fill(&b, Scalar::F32(2.25)).unwrap();
    s.binary(BinaryOp::Sum, DType::F32, &a, &b, &a).unwrap();
    // A packed dtype at an odd offset, across the piece boundaries too.
    let odd = b.slice(3, len - 5);
    s.fill(odd, Scalar::U8(7)).unwrap();
    s.synchronize().unwrap();
    for at in [0, 64 * MIB - 8, 128 * MIB - 8, 128 * MIB, len - 16] {
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&s.read(a.slice(at, 16)).unwrap());
        assert_eq!(got, vec![3.75f32; 4], "at byte {at}");
    }
    let head = s.read(b.slice(0, 8)).unwrap();
    let f = 2.25f32.to_le_bytes();
    assert_eq!(&head[..3], &f[..3], "bytes before the range are untouched");
    assert_eq!(&head[3..], &[7u8; 5]);
    let tail = s.read(b.slice(len - 8, 8)).unwrap();
    assert_eq!(&tail[..6], &[7u8; 6]);
    assert_eq!(&tail[6..], &f[2..], "bytes after the range are untouched");
    let mid = s.read(b.slice(128 * MIB - 2, 4)).unwrap();
    assert_eq!(mid, vec![7u8; 4]);
}

#[test]
fn host_buffers_are_imported_where_the_device_has_the_extension() {
    let Some(d) = device() else { return };
    let imports = xpu_vulkan::imports_host_memory(&d);
    let mut host = HostBuffer::from_bytes(&vec![7u8; 2 * MIB as usize]).unwrap();
    assert_eq!(d.pin_host(&host).unwrap(), imports, "{:?}", d.info().extra);
    // Through the import both ways, queued behind a fill.
    let s = d.create_stream().unwrap();
    let a = d.allocate(2 * MIB).unwrap();
    s.fill(&a, Scalar::U8(1)).unwrap();
    s.copy_from_host(&host, MIB + 5, a.slice(3, MIB - 5))
        .unwrap();
    s.copy_to_host(a.slice(0, MIB), &host, 0).unwrap();
    s.synchronize().unwrap();
    let got = host.as_slice().unwrap();
    assert_eq!(&got[..3], &[1u8; 3]);
    assert!(got[3..MIB as usize - 2].iter().all(|&b| b == 7));
    assert_eq!(&got[MIB as usize - 2..MIB as usize], &[1u8; 2]);
}

/// Streams dropped as soon as the last batch that waited on their semaphores has
/// signalled: the driver may still be finishing that submission on its queue thread
/// (Mesa's emulated timeline semaphores, lavapipe's, release the points a submission
/// waited on after it signals), so the semaphores must outlive the stream until the
/// queues have passed it. Destroying them at once crashed lavapipe's queue thread now
/// and then (a time point put back on the free list of a destroyed timeline). Here a
/// producer's batch waits for a host step and runs a while, a waiter on another stream
/// waits for it and holds the producer's last reference, and a stream whose last batch
/// waited for its own host step is dropped at once; the values must come out right
/// every round.
#[test]
fn a_stream_dropped_right_after_its_waiter_finishes_leaves_the_queue_sound() {
    let Some(d) = device() else { return };
    let host = Device::from_impl(
        DeviceId::new("host", 0),
        xpu_host::HostBackend::new(xpu_host::HostConfig {
            devices: 1,
            capacity: 1 << 20,
        })
        .create_device(0)
        .unwrap(),
    );
    let pause = host
        .load_kernel(xpu_hal::KernelDesc {
            name: "pause".into(),
            entry_point: String::new(),
            source: xpu_hal::KernelSource::host_fn(|_| {
                std::thread::sleep(std::time::Duration::from_micros(200));
                Ok(())
            }),
            params: vec![],
        })
        .unwrap();
    let host_stream = host.create_stream().unwrap();
    // Makes `stream` wait for a host step that completes a little later.
    let behind_host_step = |stream: &xpu_hal::Stream| {
        host_stream
            .launch(&pause, xpu_hal::LaunchDims::linear(1, 1), &[])
            .unwrap();
        stream
            .wait_event(&host_stream.record_event().unwrap())
            .unwrap();
    };
    let buf = d.allocate(256).unwrap();
    let big = d.allocate(4 * MIB).unwrap();
    for i in 0..200i32 {
        let waiter = d.create_stream().unwrap();
        let producer = d.create_stream().unwrap();
        behind_host_step(&producer);
        producer.fill(&buf, Scalar::I32(i)).unwrap();
        // Work the device runs for a while after the submission.
        producer
            .binary(BinaryOp::Sum, DType::F32, &big, &big, &big)
            .unwrap();
        let event = producer.record_event().unwrap();
        waiter.wait_event(&event).unwrap();
        waiter.fill(buf.slice(0, 4), Scalar::I32(i + 1)).unwrap();
        // The waiter's batch holds the last reference to the producer's stream: it
        // goes when that batch has signalled.
        drop(event);
        drop(producer);
        waiter.synchronize().unwrap();
        let got = waiter.read(buf.slice(0, 8)).unwrap();
        assert_eq!(got[..4], (i + 1).to_le_bytes(), "round {i}");
        assert_eq!(got[4..], i.to_le_bytes(), "round {i}");
        // A stream whose last batch waited for its own host step, dropped at once.
        let alone = d.create_stream().unwrap();
        behind_host_step(&alone);
        alone.fill(buf.slice(8, 8), Scalar::I32(i)).unwrap();
        drop(alone);
    }
}
