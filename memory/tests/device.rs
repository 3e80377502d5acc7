//! The HAL adapter on a host device.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use xpu_hal::{Device, DeviceId};
use xpu_host::{HostBackend, HostConfig};
use xpu_memory::{replay_on_device, reuse_scenario, Budget, Config, DeviceAllocator, MIB};

fn device() -> Device {
    let backend = HostBackend::new(HostConfig {
        devices: 1,
        capacity: 256 << 20,
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
    let a = alloc.allocate(160 * MIB, id).unwrap();
    let err = alloc.allocate(160 * MIB, id).unwrap_err();
    assert_eq!(err.kind(), "out-of-memory", "{err}");
    assert!(err.to_string().contains("largest free block"), "{err}");
    alloc.free(a).unwrap();
    assert!(alloc.allocate(160 * MIB, id).is_ok());
    assert!(!serde_json::to_string(&alloc.snapshot()).unwrap().is_empty());
}

#[test]
fn budget_spans_devices() {
    let backend = HostBackend::new(HostConfig {
        devices: 2,
        capacity: 64 << 20,
    });
    let devs: Vec<Device> = (0..2)
        .map(|i| {
            Device::from_impl(
                DeviceId::new("host", i),
                Arc::new(backend.create_host_device(i).unwrap()),
            )
        })
        .collect();
    let budget = Budget::new("hosts", 48 * MIB);
    let allocs: Vec<DeviceAllocator> = devs
        .iter()
        .map(|d| DeviceAllocator::with_budget(d.clone(), Config::xpu(), &budget))
        .collect();
    let streams: Vec<_> = devs.iter().map(|d| d.create_stream().unwrap()).collect();
    let ids: Vec<_> = allocs
        .iter()
        .zip(&streams)
        .map(|(a, s)| a.register_stream(s))
        .collect();
    let a = allocs[0].allocate(30 * MIB, ids[0]).unwrap();
    // host:1 has 64 MiB of its own, but the budget has 18 MiB left.
    let err = allocs[1].allocate(30 * MIB, ids[1]).unwrap_err();
    assert_eq!(err.kind(), "out-of-memory", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("hosts") && msg.contains("host:0") && msg.contains("host:1"),
        "{msg}"
    );
    let b = allocs[1].allocate(16 * MIB, ids[1]).unwrap();
    assert_eq!(budget.reserved(), 46 * MIB);
    allocs[0].free(a).unwrap();
    allocs[0].empty_cache();
    let c = allocs[1].allocate(30 * MIB, ids[1]).unwrap();
    streams[1].write(c.slice(), &vec![5u8; 30 << 20]).unwrap();
    assert_eq!(streams[1].read(c.slice()).unwrap()[(30 << 20) - 1], 5);
    allocs[1].free(b).unwrap();
    allocs[1].free(c).unwrap();
    drop(allocs);
    assert_eq!(budget.reserved(), 0);
}

#[test]
fn replay_on_a_host_device() {
    let dev = device();
    let trace = reuse_scenario();
    let r = replay_on_device(&trace, &dev, Config::xpu(), 3).unwrap();
    assert_eq!(r.target, "host:0");
    assert_eq!(r.peak_reserved_bytes, 128 * MIB);
    assert_eq!(r.steady_device_allocs, 0);
    let m = dev.memory_info().unwrap();
    assert_eq!(m.free, m.total, "the cache is emptied after the replay");
}

#[test]
fn expandable_segments_on_devices_that_grow() {
    let dev = device();
    let alloc = DeviceAllocator::new(dev.clone(), Config::xpu());
    let Some(g) = dev.capabilities().virtual_memory_granularity else {
        assert!(!alloc.expandable());
        eprintln!("host:0 has no virtual memory; expandable segments are not used");
        return;
    };
    assert!(alloc.expandable());
    let stream = dev.create_stream().unwrap();
    let s = alloc.register_stream(&stream);
    let blocks: Vec<_> = (0..4)
        .map(|_| alloc.allocate(4 * MIB, s).unwrap())
        .collect();
    assert!(blocks
        .iter()
        .all(|b| b.block.segment == blocks[0].block.segment));
    for (i, b) in blocks.iter().enumerate() {
        stream
            .write(b.slice(), &vec![i as u8 + 1; 4 << 20])
            .unwrap();
    }
    for (i, b) in blocks.iter().enumerate() {
        let back = stream.read(b.slice()).unwrap();
        assert!(
            back.iter().all(|v| *v == i as u8 + 1),
            "block {i} after growth"
        );
    }
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert!(snap.segments[0].size.is_multiple_of(g));
    assert!(alloc.stats().num_segment_grows >= 3);
    let mut blocks = blocks;
    let last = blocks.pop().unwrap();
    alloc.free(last).unwrap();
    assert!(alloc.empty_cache() >= 4 * MIB - g);
    let first = blocks.remove(0);
    assert!(stream.read(first.slice()).unwrap().iter().all(|v| *v == 1));
    alloc.free(first).unwrap();
    for b in blocks {
        alloc.free(b).unwrap();
    }
    alloc.empty_cache();
    assert_eq!(alloc.stats().reserved_bytes.current, 0);
}
