//! Fault injection through the plugin ABI 1.2 (`device_inject_fault`), end to end: the
//! HAL's `Device::inject_fault` on a device of the simulated NPU (its real shared
//! library, loaded as a plugin) loses that device for real — every later call on it
//! returns `DeviceLost`, work queued before the injection fails — while its other device
//! keeps working, or makes it a straggler whose operations take longer with unchanged
//! results; plugins without fault injection (ABI 1.0, a 1.2 plugin that leaves
//! the function NULL, and tables that misdeclare it) answer `Unsupported`, naming the
//! plugin, without the plugin being called.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xpu_hal::backend::{Backend, DeviceImpl, Fault};
use xpu_hal::{
    Device, DeviceId, Error, HostBuffer, KernelDesc, KernelSource, LaunchDims, Registry, Scalar,
};
use xpu_plugin::PluginBackend;

use support::Setup;

/// Asserts that `what` failed with `DeviceLost` on `plugin.simnpu:1`, saying the fault
/// was injected.
fn assert_lost<T>(result: xpu_hal::Result<T>, what: &str) {
    match result {
        Err(Error::DeviceLost { device, message }) => {
            assert_eq!(device, "plugin.simnpu:1", "{what}: {message}");
            assert!(message.contains("injected"), "{what}: {message}");
        }
        Err(e) => panic!("{what}: expected DeviceLost, got {e}"),
        Ok(_) => panic!("{what} succeeded on a lost device"),
    }
}

/// Data that round-trips through `device` (a fresh buffer and stream).
fn round_trip(device: &Device) {
    let a = device.allocate(1000).unwrap();
    let s = device.create_stream().unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    s.write(&a, &data).unwrap();
    assert_eq!(s.read(&a).unwrap(), data);
}

/// (a) After `Fault::Lost` on `plugin.simnpu:1`, allocation, stream creation, copies,
/// builtins, events, memory queries, synchronize and query on it all fail with
/// `DeviceLost`, for good; `plugin.simnpu:0` keeps working.
#[test]
fn an_injected_loss_fails_every_later_call_on_that_device_only() {
    let setup = Setup::new(support::sim_npu());
    assert_eq!(setup.plugin.abi_version(), (1, 4));
    let d0 = setup.device("plugin.simnpu", 0);
    let d1 = setup.device("plugin.simnpu", 1);
    let a1 = d1.allocate(256).unwrap();
    let b1 = d1.allocate(256).unwrap();
    let s1 = d1.create_stream().unwrap();
    s1.write(&a1, &[5; 256]).unwrap();
    let before = s1.record_event().unwrap();
    before.wait().unwrap();

    d1.inject_fault(Fault::Lost).unwrap();

    assert_lost(d1.allocate(64), "allocate");
    assert_lost(d1.create_stream(), "create_stream");
    assert_lost(d1.memory_info(), "memory_info");
    assert_lost(s1.write(&a1, &[1; 256]), "copy from the host");
    assert_lost(s1.read(&a1), "copy to the host");
    assert_lost(s1.copy(&a1, &b1), "device-to-device copy");
    assert_lost(s1.fill(&a1, Scalar::U8(9)), "fill");
    assert_lost(s1.record_event(), "record_event");
    assert_lost(s1.wait_event(&before), "wait_event");
    assert_lost(before.wait(), "event wait");
    assert_lost(before.query(), "event query");
    assert_lost(s1.synchronize(), "synchronize");
    assert_lost(s1.query(), "query");
    // It does not come back.
    assert_lost(s1.synchronize(), "a second synchronize");
    assert_lost(d1.allocate(64), "a second allocate");
    // Injecting again is harmless, and a slowdown does not bring it back.
    d1.inject_fault(Fault::Lost).unwrap();
    d1.inject_fault(Fault::Slow(Duration::from_millis(1)))
        .unwrap();
    d1.inject_fault(Fault::Slow(Duration::ZERO)).unwrap();
    assert_lost(d1.allocate(64), "allocate after a slowdown");
    assert_lost(s1.synchronize(), "synchronize after a slowdown");

    // The other device of the same plugin is not affected.
    round_trip(&d0);
    let info = d0.memory_info().unwrap();
    assert!(info.free > 0 && info.total >= info.free, "{info:?}");
    let s0 = d0.create_stream().unwrap();
    let a0 = d0.allocate(64).unwrap();
    s0.fill(&a0, Scalar::U8(3)).unwrap();
    assert_eq!(s0.read(&a0).unwrap(), vec![3u8; 64]);
}

/// (d) `Fault::Slow(20 ms)` on `plugin.simnpu:0` makes it a straggler: three
/// operations then a synchronize take at least 60 ms, and the data are right;
/// `Fault::Slow(0)` ends the slowdown, and results stay right.
#[test]
fn an_injected_slowdown_delays_every_operation_until_zero_ends_it() {
    let setup = Setup::new(support::sim_npu());
    let d0 = setup.device("plugin.simnpu", 0);
    let d1 = setup.device("plugin.simnpu", 1);
    let a = d0.allocate(4096).unwrap();
    let b = d0.allocate(4096).unwrap();
    let s = d0.create_stream().unwrap();

    d0.inject_fault(Fault::Slow(Duration::from_millis(20)))
        .unwrap();
    let start = Instant::now();
    s.fill(&a, Scalar::U8(7)).unwrap();
    s.copy(&a, &b).unwrap();
    s.fill(&a, Scalar::U8(9)).unwrap();
    s.synchronize().unwrap();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(60),
        "three operations on a device slowed by 20 ms took {took:?}"
    );
    assert_eq!(s.read(&a).unwrap(), vec![9u8; 4096]);
    assert_eq!(s.read(&b).unwrap(), vec![7u8; 4096]);
    // The plugin's other device is not slowed, and works.
    round_trip(&d1);

    // A zero delay ends the slowdown; results stay right.
    d0.inject_fault(Fault::Slow(Duration::ZERO)).unwrap();
    s.fill(&b, Scalar::U8(3)).unwrap();
    s.copy(&b, &a).unwrap();
    s.synchronize().unwrap();
    assert_eq!(s.read(&a).unwrap(), vec![3u8; 4096]);
    assert_eq!(s.read(&b).unwrap(), vec![3u8; 4096]);
    round_trip(&d0);
}

/// A host kernel that blocks its stream until [`Gate::open`].
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }
}

/// (b) Work queued before the injection but not yet run — held behind a wait on a host
/// stream — fails instead of running: synchronize reports `DeviceLost` (and, the loss
/// being injected, gives back the host memory the work was lent), and so does an event
/// recorded after it; a stream of another backend waiting on that event fails with the
/// loss in its message.
#[test]
fn work_queued_before_the_injection_fails_with_the_loss() {
    let setup = Setup::new(support::sim_npu());
    let d1 = setup.device("plugin.simnpu", 1);
    let host = setup.device("host", 0);
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    let hold = host
        .load_kernel(KernelDesc {
            name: "test.hold".to_string(),
            entry_point: "main".to_string(),
            source: KernelSource::host_fn(move |_| {
                held.wait();
                Ok(())
            }),
            params: vec![],
        })
        .unwrap();
    let host_stream = host.create_stream().unwrap();
    host_stream
        .launch(&hold, LaunchDims::linear(1, 1), &[])
        .unwrap();
    let released = host_stream.record_event().unwrap();

    let a1 = d1.allocate(256).unwrap();
    let s1 = d1.create_stream().unwrap();
    s1.write(&a1, &[7; 256]).unwrap();
    s1.wait_event(&released).unwrap();
    let source = HostBuffer::from_bytes(&[1u8; 256]).unwrap();
    s1.copy_from_host(&source, 0, &a1).unwrap();
    s1.fill(&a1, Scalar::U8(2)).unwrap();
    let mut back = HostBuffer::from_bytes(&[0xAAu8; 256]).unwrap();
    s1.copy_to_host(&a1, &back, 0).unwrap();
    let after = s1.record_event().unwrap();
    let watcher = host.create_stream().unwrap();
    watcher.wait_event(&after).unwrap();
    assert!(
        !s1.query().unwrap(),
        "the work is held behind the host kernel"
    );

    d1.inject_fault(Fault::Lost).unwrap();
    gate.open();
    host_stream.synchronize().unwrap();

    assert_lost(s1.synchronize(), "synchronize of the queued work");
    // The work stopped without running, and the host memory it was lent is free again.
    assert_eq!(source.in_flight(), 0);
    assert_eq!(back.in_flight(), 0);
    assert_eq!(back.as_slice().unwrap(), &[0xAAu8; 256][..]);
    assert_lost(after.wait(), "the event after the queued work");
    let e = watcher.synchronize().unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert_lost(s1.synchronize(), "a later synchronize");
}

/// Injects `Lost` and `Slow` into device 0 of the plugin at `path`, expecting `Unsupported` naming
/// the plugin and its missing function, and checks the device still works.
fn refuses_injection(path: &Path, plugin: &str) {
    let backend = Arc::new(PluginBackend::load(path).unwrap());
    let device = backend.create_plugin_device(0).unwrap();
    for fault in [Fault::Lost, Fault::Slow(Duration::from_millis(20))] {
        let e = DeviceImpl::inject_fault(&device, fault).unwrap_err();
        println!("{e}");
        assert!(matches!(e, Error::Unsupported { .. }), "{plugin}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("plugin `{plugin}`")),
            "{plugin}: {text}"
        );
        assert!(text.contains("no fault injection"), "{plugin}: {text}");
        assert!(text.contains("device_inject_fault"), "{plugin}: {text}");
        assert!(
            !text.contains("device_inject_fault was called"),
            "{plugin}: the plugin's function was called: {text}"
        );
    }
    drop(device);
    let mut registry = Registry::new();
    let name = backend.name().to_string();
    registry.register(backend).unwrap();
    round_trip(&registry.device(&DeviceId::new(name, 0)).unwrap());
}

/// (c) A plugin without fault injection — built against ABI 1.0, or a 1.2 plugin that
/// leaves `device_inject_fault` NULL — answers `Unsupported` naming the plugin. So does
/// a table that has the function but may not mean it: a 1.1 plugin whose table reaches
/// the member, and a 1.2 plugin whose `struct_size` stops before it (the function is
/// never called).
#[test]
fn plugins_without_fault_injection_answer_unsupported() {
    refuses_injection(&support::minimal_1_0(), "minimal");
    refuses_injection(&support::minimal(), "minimal");
    refuses_injection(&support::bad("FAULT_MINOR_1"), "bad");
    refuses_injection(&support::bad("FAULT_SHORT_TABLE"), "bad");
}
