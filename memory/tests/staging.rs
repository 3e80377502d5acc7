//! The stream-ordered host staging pool, on host device streams.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xpu_hal::{Device, DeviceId, KernelDesc, KernelSource, LaunchDims, Stream};
use xpu_host::{HostBackend, HostConfig};
use xpu_memory::{host_staging, StagingPool, DEFAULT_STAGING_LIMIT};

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

/// Holds `stream` busy until the returned flag is set.
fn gate(d: &Device, stream: &Stream) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let flag = open.clone();
    let k = d
        .load_kernel(KernelDesc {
            name: "gate".into(),
            entry_point: String::new(),
            source: KernelSource::host_fn(move |_| {
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(())
            }),
            params: vec![],
        })
        .unwrap();
    stream.launch(&k, LaunchDims::linear(1, 1), &[]).unwrap();
    open
}

/// An event on `stream` that has completed.
fn finished(stream: &Stream) -> xpu_hal::Event {
    let e = stream.record_event().unwrap();
    e.wait().unwrap();
    e
}

#[test]
fn a_busy_buffer_is_reused_in_stream_order_only_at_the_limit() {
    let d = device();
    let s = d.create_stream().unwrap();
    let pool = StagingPool::new(64 << 10);
    let a = pool.acquire(1000).unwrap();
    assert!(a.buffer().len() >= 1000);
    assert!(a.ready_after().is_none());
    let open = gate(&d, &s);
    pool.release(a, s.record_event().unwrap());
    // At the limit, with only a busy buffer: that one, with the event to wait for.
    let b = pool.acquire(2000).unwrap();
    let after = b
        .ready_after()
        .expect("a pending buffer comes with its event");
    assert!(!after.query().unwrap());
    let st = pool.stats();
    assert_eq!((st.allocated, st.reused_pending, st.reused_idle), (1, 1, 0));
    open.store(true, Ordering::Release);
    pool.release(b, finished(&s));
    // Its last use is over: reused without a wait.
    let c = pool.acquire(10).unwrap();
    assert!(c.ready_after().is_none());
    assert_eq!(pool.stats().reused_idle, 1);
    assert_eq!(pool.stats().reserved_bytes, 64 << 10);
    assert_eq!(pool.stats().over_limit, 0);
}

#[test]
fn under_the_limit_consecutive_pieces_get_different_buffers() {
    let d = device();
    let s = d.create_stream().unwrap();
    let pool = StagingPool::new(1 << 20);
    let open = gate(&d, &s);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let b = pool.acquire(100 << 10).unwrap();
        assert!(b.ready_after().is_none(), "new buffers need no wait");
        seen.push(b.buffer() as *const _ as usize);
        pool.release(b, s.record_event().unwrap());
    }
    let st = pool.stats();
    assert_eq!(st.allocated, 4);
    assert_eq!(st.reserved_bytes, 4 * (128 << 10));
    // Past the limit, the oldest release comes back first.
    pool.set_limit(st.reserved_bytes);
    let first = pool.acquire(100 << 10).unwrap();
    assert!(first.ready_after().is_some());
    assert_eq!(pool.stats().reused_pending, 1);
    open.store(true, Ordering::Release);
    pool.release(first, finished(&s));
    assert_eq!(pool.empty_cache(), 4 * (128 << 10));
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert_eq!(pool.stats().peak_reserved_bytes, 4 * (128 << 10));
}

#[test]
fn nothing_large_enough_goes_over_the_limit_instead_of_failing() {
    let d = device();
    let s = d.create_stream().unwrap();
    let pool = StagingPool::new(64 << 10);
    let open = gate(&d, &s);
    let small = pool.acquire(10).unwrap();
    pool.release(small, s.record_event().unwrap());
    // The busy small buffer cannot serve it, and cannot be dropped yet.
    let big = pool.acquire(1 << 20).unwrap();
    assert!(big.buffer().len() >= 1 << 20);
    assert_eq!(pool.stats().over_limit, 1);
    open.store(true, Ordering::Release);
    pool.release(big, finished(&s));
    // Idle released buffers too small for a request make room for it.
    pool.set_limit(1 << 20);
    let bigger = pool.acquire(2 << 20).unwrap();
    assert!(bigger.ready_after().is_none());
    assert_eq!(pool.stats().over_limit, 2);
    assert_eq!(pool.stats().reserved_bytes, 2 << 20);
}

#[test]
fn staged_copies_through_the_pool_move_the_bytes() {
    let d = device();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let src = d.allocate(300 << 10).unwrap();
    let dst = d.allocate(300 << 10).unwrap();
    let data: Vec<u8> = (0..300 << 10).map(|i| (i % 251) as u8).collect();
    s1.write(&src, &data).unwrap();
    let pool = StagingPool::new(128 << 10);
    // Three pieces through at most one buffer's worth of limit: each waits for the last.
    for piece in 0..3u64 {
        let b = pool.acquire(100 << 10).unwrap();
        if let Some(e) = b.ready_after() {
            s1.wait_event(e).unwrap();
        }
        let (off, len) = (piece * (100 << 10), 100 << 10);
        s1.copy_to_host(src.slice(off, len), b.buffer(), 0).unwrap();
        s2.wait_event(&s1.record_event().unwrap()).unwrap();
        s2.copy_from_host(b.buffer(), 0, dst.slice(off, len))
            .unwrap();
        pool.release(b, s2.record_event().unwrap());
    }
    assert_eq!(s2.read(&dst).unwrap(), data);
    assert_eq!(host_staging().limit(), DEFAULT_STAGING_LIMIT);
}

#[test]
fn a_discarded_buffer_leaves_the_accounts() {
    let pool = StagingPool::new(1 << 20);
    let b = pool.acquire(5000).unwrap();
    assert_eq!(pool.stats().reserved_bytes, 64 << 10);
    pool.discard(b);
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert_eq!(pool.stats().peak_reserved_bytes, 64 << 10);
}

#[test]
fn figures_add_up_while_threads_acquire_and_release() {
    let d = device();
    let pool = Arc::new(StagingPool::new(256 << 10));
    let running = Arc::new(AtomicBool::new(true));
    // The watcher signals its first read before any worker starts, so that it runs
    // while they do, however the threads are scheduled.
    let watching = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (pool, running, watching) = (pool.clone(), running.clone(), watching.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            loop {
                let st = pool.stats();
                assert_eq!(
                    st.acquired,
                    st.reused_idle + st.reused_pending + st.allocated,
                    "{st:?}"
                );
                assert!(st.reserved_bytes <= st.peak_reserved_bytes, "{st:?}");
                reads += 1;
                watching.store(true, Ordering::Release);
                if !running.load(Ordering::Acquire) {
                    break;
                }
                std::thread::yield_now();
            }
            reads
        })
    };
    while !watching.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let workers: Vec<_> = (0..3usize)
        .map(|t| {
            let (pool, d) = (pool.clone(), d.clone());
            std::thread::spawn(move || {
                let s = d.create_stream().unwrap();
                for i in 0..300usize {
                    let b = pool
                        .acquire(1 + (i * 7919 + t * 104_729) % (200 << 10))
                        .unwrap();
                    if i % 17 == 0 {
                        pool.discard(b);
                    } else {
                        pool.release(b, finished(&s));
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    running.store(false, Ordering::Release);
    assert!(monitor.join().unwrap() > 0);
    let st = pool.stats();
    assert_eq!(st.acquired, 900);
    assert_eq!(
        st.acquired,
        st.reused_idle + st.reused_pending + st.allocated
    );
}

/// `vulkan:0`, or `None` (with a note) where there is none and CI does not require one.
fn vulkan() -> Option<Device> {
    use xpu_hal::backend::Backend;
    let backend = xpu_vulkan::VulkanBackend::new();
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

#[test]
fn buffers_are_pinned_once_for_each_device_that_pins_and_stay_pinned_when_reused() {
    let host = device();
    let Some(vulkan) = vulkan() else { return };
    let imports = xpu_vulkan::imports_host_memory(&vulkan);
    let pool = StagingPool::new(DEFAULT_STAGING_LIMIT);
    let (hs, vs) = (
        host.create_stream().unwrap(),
        vulkan.create_stream().unwrap(),
    );
    let len = 1 << 20;
    let src = host.allocate(len as u64).unwrap();
    let dst = vulkan.allocate(len as u64).unwrap();
    for round in 0..4u8 {
        hs.fill(&src, xpu_hal::Scalar::U8(round)).unwrap();
        let staging = pool.acquire_for(len, &[&host, &vulkan]).unwrap();
        if let Some(e) = staging.ready_after() {
            hs.wait_event(e).unwrap();
        }
        hs.copy_to_host(&src, staging.buffer(), 0).unwrap();
        let staged = hs.record_event().unwrap();
        vs.wait_event(&staged).unwrap();
        vs.copy_from_host(staging.buffer(), 0, &dst).unwrap();
        pool.release(staging, vs.record_event().unwrap());
        let got = vs.read(&dst).unwrap();
        assert!(got.iter().all(|&b| b == round), "round {round}");
    }
    let stats = pool.stats();
    // One buffer, reused every round: pinned for the Vulkan device once, and never for
    // the host device, which has nothing to pin.
    assert_eq!(stats.allocated, 1, "{stats:?}");
    assert_eq!(stats.pins, u64::from(imports), "{stats:?}");
    assert_eq!(stats.pin_failures, 0, "{:?}", pool.last_pin_error());
}
