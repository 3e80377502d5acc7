//! Host-specific behaviour through the HAL: real memory accounting, panics in work,
//! early frees, and the environment configuration.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;

use xpu_hal::backend::Backend;
use xpu_hal::{
    Access, BinaryOp, DType, Device, DeviceSelector, Error, KernelArg, KernelDesc, KernelParam,
    KernelSource, LaunchDims, Registry, Scalar,
};
use xpu_host::{HostBackend, HostConfig};

fn device(capacity: u64) -> Device {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 2,
        capacity,
    })))
    .unwrap();
    r.devices(&DeviceSelector::parse("host:0").unwrap())
        .unwrap()
        .remove(0)
}

#[test]
fn capacity_is_enforced_and_returned() {
    let d = device(1 << 20);
    let a = d.allocate(600 << 10).unwrap();
    assert_eq!(d.memory_info().unwrap().free, (1 << 20) - (600 << 10));
    // Fits under max_allocation but not in what is left: the backend's own accounting.
    let err = d.allocate(600 << 10).unwrap_err();
    match err {
        Error::OutOfMemory {
            requested, free, ..
        } => {
            assert_eq!(requested, 600 << 10);
            assert_eq!(free, (1 << 20) - (600 << 10));
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    a.free().unwrap();
    assert_eq!(d.memory_info().unwrap().free, 1 << 20);
    let b = d.allocate(900 << 10).unwrap();
    drop(b);
    assert_eq!(d.memory_info().unwrap().free, 1 << 20, "drop frees too");
}

fn sleepy_kernel(d: &Device, ms: u64) -> xpu_hal::Kernel {
    d.load_kernel(KernelDesc {
        name: "sleep".into(),
        entry_point: String::new(),
        source: KernelSource::host_fn(move |_| {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        }),
        params: vec![],
    })
    .unwrap()
}

#[test]
fn memory_freed_while_in_flight_returns_after_the_work() {
    let d = device(1 << 20);
    let s = d.create_stream().unwrap();
    let a = d.allocate(1 << 19).unwrap();
    s.launch(&sleepy_kernel(&d, 30), LaunchDims::linear(1, 1), &[])
        .unwrap();
    s.fill(&a, Scalar::U8(7)).unwrap();
    a.free().unwrap();
    // The fill still holds the block until it has run.
    s.synchronize().unwrap();
    assert_eq!(d.memory_info().unwrap().free, 1 << 20);
}

/// An injected loss fails the work still queued and every later call on the device,
/// for good, and leaves the other devices of the backend working.
#[test]
fn an_injected_loss_fails_queued_work_and_every_later_call() {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 2,
        capacity: 1 << 20,
    })))
    .unwrap();
    let both = r
        .devices(&DeviceSelector::parse("host:0,1").unwrap())
        .unwrap();
    let (d, other) = (&both[0], &both[1]);
    let s = d.create_stream().unwrap();
    let a = d.allocate(64).unwrap();
    s.launch(&sleepy_kernel(d, 50), LaunchDims::linear(1, 1), &[])
        .unwrap();
    s.fill(&a, Scalar::U8(7)).unwrap();
    d.inject_fault(xpu_hal::backend::Fault::Lost).unwrap();
    let lost = |e: Error| assert!(matches!(e, Error::DeviceLost { .. }), "{e}");
    lost(s.synchronize().unwrap_err());
    // Sticky: the queued fill never ran and nothing new is accepted.
    lost(s.synchronize().unwrap_err());
    lost(s.fill(&a, Scalar::U8(1)).unwrap_err());
    lost(s.query().unwrap_err());
    lost(s.record_event().unwrap_err());
    lost(d.allocate(16).unwrap_err());
    lost(d.create_stream().unwrap_err());
    lost(d.memory_info().unwrap_err());
    assert!(d.inject_fault(xpu_hal::backend::Fault::Lost).is_ok());
    // The other device is untouched.
    let s1 = other.create_stream().unwrap();
    let b = other.allocate(16).unwrap();
    s1.fill(&b, Scalar::U8(3)).unwrap();
    assert_eq!(s1.read(&b).unwrap(), vec![3u8; 16]);
}

/// An injected slowdown makes every operation take at least that much longer and
/// changes no result; zero ends it.
#[test]
fn an_injected_slowdown_delays_work_and_keeps_results() {
    use std::time::{Duration, Instant};
    use xpu_hal::backend::Fault;
    let d = device(1 << 20);
    let s = d.create_stream().unwrap();
    let a = d.allocate(64).unwrap();
    d.inject_fault(Fault::Slow(Duration::from_millis(20)))
        .unwrap();
    let t = Instant::now();
    for v in 1..=3u8 {
        s.fill(&a, Scalar::U8(v)).unwrap();
    }
    s.synchronize().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(60),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.read(&a).unwrap(), vec![3u8; 64]);
    // A batch of three operations is slowed as three.
    let t = Instant::now();
    let mut batch = s.batch();
    for v in 4..=6u8 {
        batch.fill(&a, Scalar::U8(v)).unwrap();
    }
    batch.submit().unwrap();
    s.synchronize().unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(60),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.read(&a).unwrap(), vec![6u8; 64]);
    d.inject_fault(Fault::Slow(Duration::ZERO)).unwrap();
    s.fill(&a, Scalar::U8(9)).unwrap();
    assert_eq!(s.read(&a).unwrap(), vec![9u8; 64]);
}

/// A throttle keeps results; a share of speed outside 1 to 100 % is refused with the
/// reason, and 100 % ends the throttle.
#[test]
fn a_throttled_device_keeps_its_results_and_bad_throttles_are_refused() {
    use xpu_hal::backend::Fault;
    let d = device(1 << 20);
    let s = d.create_stream().unwrap();
    let a = d.allocate(4096).unwrap();
    for bad in [0, 101, u32::MAX] {
        let e = d.inject_fault(Fault::Throttle(bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert!(e.to_string().contains("1 to 100"), "{e}");
    }
    d.inject_fault(Fault::Throttle(25)).unwrap();
    let mut batch = s.batch();
    for v in 1..=5u8 {
        batch.fill(&a, Scalar::U8(v)).unwrap();
    }
    batch.submit().unwrap();
    s.fill(a.slice(0, 16), Scalar::U8(9)).unwrap();
    let mut want = vec![5u8; 4096];
    want[..16].fill(9);
    assert_eq!(s.read(&a).unwrap(), want);
    d.inject_fault(Fault::Throttle(100)).unwrap();
    s.fill(&a, Scalar::U8(7)).unwrap();
    assert_eq!(s.read(&a).unwrap(), vec![7u8; 4096]);
}

#[test]
fn a_panicking_kernel_becomes_an_error_and_the_stream_lives_on() {
    let d = device(1 << 20);
    let s = d.create_stream().unwrap();
    let k = d
        .load_kernel(KernelDesc {
            name: "boom".into(),
            entry_point: String::new(),
            source: KernelSource::host_fn(|_| panic!("kaboom")),
            params: vec![],
        })
        .unwrap();
    let a = d.allocate(16).unwrap();
    s.launch(&k, LaunchDims::linear(1, 1), &[]).unwrap();
    let after = s.record_event().unwrap();
    let err = s.synchronize().unwrap_err();
    assert!(matches!(err, Error::Aborted { .. }), "{err}");
    assert!(err.to_string().contains("kaboom"), "{err}");
    assert!(
        after.wait().is_err(),
        "an event after the failure reports it"
    );
    // Reported once; the stream works again.
    s.fill(&a, Scalar::I32(5)).unwrap();
    s.synchronize().unwrap();
    assert_eq!(s.read(&a).unwrap(), [5, 0, 0, 0].repeat(4));
}

#[test]
fn host_kernels_see_their_arguments() {
    let d = device(1 << 20);
    let s = d.create_stream().unwrap();
    let k = d
        .load_kernel(KernelDesc {
            name: "axpy".into(),
            entry_point: String::new(),
            source: KernelSource::host_fn(|ctx| {
                let a = match ctx.scalar(2)? {
                    Scalar::F32(v) => v,
                    _ => return Err("alpha must be f32".into()),
                };
                let x: Vec<f32> = bytemuck::pod_collect_to_vec(ctx.bytes(0)?);
                let y: &mut [f32] =
                    bytemuck::try_cast_slice_mut(ctx.bytes_mut(1)?).map_err(|e| e.to_string())?;
                for (y, x) in y.iter_mut().zip(x) {
                    *y += a * x;
                }
                Ok(())
            }),
            params: vec![
                KernelParam::Buffer(Access::Read),
                KernelParam::Buffer(Access::ReadWrite),
                KernelParam::Scalar(DType::F32),
            ],
        })
        .unwrap();
    let x = d.allocate(16).unwrap();
    let y = d.allocate(16).unwrap();
    s.fill(&x, Scalar::F32(2.0)).unwrap();
    s.fill(&y, Scalar::F32(1.0)).unwrap();
    s.launch(
        &k,
        LaunchDims::linear(1, 4),
        &[
            KernelArg::Buffer(x.whole()),
            KernelArg::Buffer(y.whole()),
            KernelArg::Scalar(Scalar::F32(3.0)),
        ],
    )
    .unwrap();
    s.accumulate(BinaryOp::Sum, DType::F32, &y, &x).unwrap();
    let out: Vec<f32> = bytemuck::pod_collect_to_vec(&s.read(&y).unwrap());
    assert_eq!(out, vec![9.0; 4]);
}

#[test]
fn enumerate_lists_configured_devices_and_rejects_others() {
    let b = HostBackend::new(HostConfig {
        devices: 3,
        capacity: 1 << 20,
    });
    assert_eq!(b.enumerate().unwrap().len(), 3);
    assert!(b.create_device(3).is_err());
}

#[test]
fn growable_allocations_charge_the_backed_length_exactly() {
    let d = device(1 << 20);
    let page = d.capabilities().virtual_memory_granularity.unwrap();
    assert!(page.is_power_of_two());
    // A reservation far beyond the capacity is only addresses.
    let a = d.allocate_growable(64 << 20, 1).unwrap();
    assert!(a.is_growable());
    assert_eq!(a.size(), page);
    assert_eq!(a.reserved(), 64 << 20);
    assert_eq!(d.memory_info().unwrap().free, (1 << 20) - page);
    a.resize(4 * page).unwrap();
    assert_eq!(d.memory_info().unwrap().free, (1 << 20) - 4 * page);
    a.resize(2 * page).unwrap();
    assert_eq!(d.memory_info().unwrap().free, (1 << 20) - 2 * page);
    // Growing past the capacity is the out-of-memory error of a plain allocation, and
    // leaves the allocation as it was.
    match a.resize(2 * (1 << 20)) {
        Err(Error::OutOfMemory {
            requested, free, ..
        }) => {
            assert_eq!(requested, 2 * (1 << 20) - 2 * page);
            assert_eq!(free, (1 << 20) - 2 * page);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(a.size(), 2 * page);
    drop(a);
    assert_eq!(
        d.memory_info().unwrap().free,
        1 << 20,
        "drop returns the backed bytes"
    );
}

#[test]
fn growable_memory_keeps_its_address_and_contents_and_works_with_every_op() {
    let d = device(16 << 20);
    let page = d.capabilities().virtual_memory_granularity.unwrap();
    let s = d.create_stream().unwrap();
    let a = d.allocate_growable(8 * page, page).unwrap();
    let data: Vec<u8> = (0..page).map(|i| (i * 7 + 3) as u8).collect();
    s.write(&a, &data).unwrap();
    a.resize(3 * page).unwrap();
    assert_eq!(&s.read(a.slice(0, page)).unwrap(), &data);
    // Fill, copy and a kernel on the grown part.
    s.fill(a.slice(page, 2 * page), Scalar::U8(0x5A)).unwrap();
    s.copy(a.slice(0, page), a.slice(2 * page, page)).unwrap();
    let k = d
        .load_kernel(KernelDesc {
            name: "inc".into(),
            entry_point: String::new(),
            source: KernelSource::host_fn(|ctx| {
                for b in ctx.bytes_mut(0)? {
                    *b = b.wrapping_add(1);
                }
                Ok(())
            }),
            params: vec![KernelParam::Buffer(Access::ReadWrite)],
        })
        .unwrap();
    s.launch(
        &k,
        LaunchDims::linear(1, 1),
        &[KernelArg::Buffer(a.slice(page, page))],
    )
    .unwrap();
    let all = s.read(&a).unwrap();
    assert_eq!(&all[..page as usize], &data[..]);
    assert!(all[page as usize..2 * page as usize]
        .iter()
        .all(|b| *b == 0x5B));
    assert_eq!(&all[2 * page as usize..], &data[..]);
    // Shrunk, the tail is refused; grown again, it reads as fresh memory.
    a.resize(page).unwrap();
    let refused = s.fill(a.slice(page, page), Scalar::U8(1));
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
    a.resize(2 * page).unwrap();
    assert_eq!(&s.read(a.slice(0, page)).unwrap(), &data);
    // A plain allocation does not resize.
    let plain = d.allocate(page).unwrap();
    assert!(!plain.is_growable());
    assert!(matches!(
        plain.resize(2 * page),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn shrinking_under_queued_work_never_faults() {
    let d = device(16 << 20);
    let page = d.capabilities().virtual_memory_granularity.unwrap();
    let s = d.create_stream().unwrap();
    let a = d.allocate_growable(4 * page, 4 * page).unwrap();
    // Queued behind a sleeping kernel, the fill of the tail runs after the shrink.
    s.launch(&sleepy_kernel(&d, 50), LaunchDims::linear(1, 1), &[])
        .unwrap();
    s.fill(a.slice(page, 3 * page), Scalar::U8(9)).unwrap();
    a.resize(page).unwrap();
    s.synchronize().unwrap();
    assert_eq!(d.memory_info().unwrap().free, (16 << 20) - page);
}

#[test]
fn an_allocation_belongs_to_its_own_device_handle_only() {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 2,
        capacity: 1 << 20,
    })))
    .unwrap();
    let devs = r
        .devices(&DeviceSelector::parse("host:0,1").unwrap())
        .unwrap();
    let a = devs[0].allocate(64).unwrap();
    assert!(a.belongs_to(&devs[0]));
    assert!(a.belongs_to(&devs[0].clone()));
    assert!(!a.belongs_to(&devs[1]));
    // The same id in another registry is another device.
    let other = device(1 << 20);
    assert_eq!(other.id(), devs[0].id());
    assert!(!a.belongs_to(&other));
}
