//! The HAL adapter on a host device.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use xpu_hal::{Device, DeviceId};
use xpu_host::{HostBackend, HostConfig};
use xpu_memory::{Config, DeviceAllocator, MIB};

fn device() -> Device {
    let backend = HostBackend::new(HostConfig {
        devices: 1,
        capacity: 64 << 20,
    });
    Device::from_impl(
        DeviceId::new("host", 0),
        Arc::new(backend.create_host_device(0).unwrap()),
    )
}

#[test]
fn blocks_are_usable_slices_and_reused() {
    let dev = device();
    let alloc = DeviceAllocator::new(dev.clone(), Config::xpu());
    let stream = dev.create_stream().unwrap();
    let s = alloc.register_stream(&stream);
    let a = alloc.allocate(1000, s).unwrap();
    let b = alloc.allocate(1000, s).unwrap();
    assert_eq!(
        a.allocation.id(),
        b.allocation.id(),
        "small blocks share a segment"
    );
    stream.write(a.slice(), &[7u8; 1000]).unwrap();
    stream.write(b.slice(), &[9u8; 1000]).unwrap();
    assert_eq!(stream.read(a.slice()).unwrap(), vec![7u8; 1000]);
    assert_eq!(stream.read(b.slice()).unwrap(), vec![9u8; 1000]);
    let (_, off, len) = a.parts();
    assert_eq!((off, len), (0, 1000));
    let key = (a.block.segment, a.block.offset);
    alloc.free(a).unwrap();
    let c = alloc.allocate(900, s).unwrap();
    assert_eq!((c.block.segment, c.block.offset), key);
    assert_eq!(alloc.stats().num_device_alloc, 1);
    alloc.free(b).unwrap();
    alloc.free(c).unwrap();
    assert_eq!(alloc.empty_cache(), 2 * MIB);
}

#[test]
fn cross_stream_free_uses_events() {
    let dev = device();
    let alloc = DeviceAllocator::new(dev.clone(), Config::xpu());
    let (s0, s1) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let (i0, i1) = (alloc.register_stream(&s0), alloc.register_stream(&s1));
    let a = alloc.allocate(4096, i0).unwrap();
    alloc.record_stream(&a, i1).unwrap();
    s1.write(a.slice(), &[1u8; 4096]).unwrap();
    alloc.free(a).unwrap();
    s1.synchronize().unwrap();
    let b = alloc.allocate(4096, i0).unwrap();
    assert_eq!(
        b.block.offset, 0,
        "the block came back once the event completed"
    );
    alloc.free(b).unwrap();
}

#[test]
fn device_oom_is_a_hal_error_with_a_report() {
    let dev = device();
    let alloc = DeviceAllocator::new(dev.clone(), Config::xpu());
    let s = dev.create_stream().unwrap();
    let id = alloc.register_stream(&s);
    let a = alloc.allocate(40 * MIB, id).unwrap();
    let err = alloc.allocate(40 * MIB, id).unwrap_err();
    assert_eq!(err.kind(), "out-of-memory", "{err}");
    assert!(err.to_string().contains("largest free block"), "{err}");
    alloc.free(a).unwrap();
    assert!(alloc.allocate(40 * MIB, id).is_ok());
    assert!(!serde_json::to_string(&alloc.snapshot()).unwrap().is_empty());
}
