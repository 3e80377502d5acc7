//! Communicators over real devices: host devices, and Vulkan (lavapipe) beside them where
//! a driver is installed. Every operation, algorithm, dtype and reduction, in place and
//! out of place, checked element by element; then the failure paths.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xpu_collectives::check;
use xpu_collectives::{
    Algorithm, Collective, CommOptions, CommStats, Communicator, ReduceOp, Topology,
};
use xpu_hal::{DType, Device, DeviceSelector, Error, LaunchDims, Registry};
use xpu_host::{HostBackend, HostConfig};

mod support;
use support::{check_every, forced, gate, run, KINDS};

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(HostBackend::new(HostConfig {
        devices: 6,
        capacity: 256 << 20,
    })))
    .unwrap();
    r.register(Arc::new(xpu_vulkan::VulkanBackend::new()))
        .unwrap();
    r
}

fn devices(sel: &str) -> Vec<Device> {
    registry()
        .devices(&DeviceSelector::parse(sel).unwrap())
        .unwrap()
}

fn comm(devices: Vec<Device>, overrides: &str, timeout: Duration) -> Communicator {
    support::communicator(devices, overrides, timeout)
}

/// Runs every operation with every algorithm forced by an override (an operation the
/// algorithm lacks ignores its override and runs the model's choice, checked here too).
fn sweep(comm_for: impl Fn(&str) -> Communicator, dtypes: &[DType], sizes: &[usize]) {
    for algo in Algorithm::ALL {
        let comm = comm_for(&forced(algo.name()));
        for kind in KINDS {
            let chosen = comm.algorithm_for(kind, 4).0;
            assert_eq!(
                chosen == algo,
                algo.implements(kind) && comm.offers(algo),
                "{kind} forced to {algo} chose {chosen}"
            );
            check_every(&comm, kind, dtypes, sizes, &format!("{algo} on {comm:?}:"));
        }
    }
}

#[test]
fn every_operation_is_exact_on_host_ranks() {
    let devs = devices("host:0,1,2");
    sweep(
        |o| comm(devs.clone(), o, Duration::from_secs(60)),
        &DType::ALL,
        &[1, 5, 1000 + 3],
    );
}

#[test]
fn every_algorithm_is_exact_on_two_to_five_ranks() {
    // Powers of two and not (halving-doubling folds extra ranks), odd and even counts
    // (the second tree is shifted or mirrored), roots at the last rank.
    for sel in ["host:0,1", "host:0,1,2,3", "host:0,1,2,3,4"] {
        let devs = devices(sel);
        sweep(
            |o| comm(devs.clone(), o, Duration::from_secs(60)),
            &[DType::I32, DType::F16],
            &[1, 3, 1000 + 3],
        );
    }
}

#[test]
fn three_ranks_on_one_device_are_exact_with_every_algorithm() {
    let d = devices("host:0");
    let devs = vec![d[0].clone(), d[0].clone(), d[0].clone()];
    sweep(
        |o| comm(devs.clone(), o, Duration::from_secs(60)),
        &[DType::F32],
        &[7],
    );
}

#[test]
fn large_messages_cross_many_pieces() {
    let devs = devices("host:0,1,2");
    for algo in Algorithm::ALL {
        let c = comm(
            devs.clone(),
            &format!("allreduce:{0},broadcast:{0},reduce:{0}", algo.name()),
            Duration::from_secs(60),
        );
        for kind in [
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            // Halves of more than one piece, for the double binary tree.
            let wrong = run(&c, kind, DType::F32, ReduceOp::Sum, (2 << 20) + 7, false);
            assert_eq!(wrong, vec![0, 0, 0], "{algo} {kind}");
        }
    }
}

#[test]
fn mixed_host_and_vulkan_ranks_are_exact() {
    // Two groups for hierarchical algorithms: the host devices, and the Vulkan device.
    let devs = devices("host:0,1;vulkan:*");
    if !devs.iter().any(|d| d.backend() == "vulkan") {
        eprintln!("skipped: no Vulkan device (install mesa-vulkan-drivers)");
        return;
    }
    let common: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|d| devs.iter().all(|dev| dev.capabilities().supports_dtype(*d)))
        .collect();
    sweep(
        |o| comm(devs.clone(), o, Duration::from_secs(60)),
        &common,
        &[3, 4099],
    );
    // Groups that are not contiguous in rank order.
    let d = devices("host:0,1,2;vulkan:*");
    let devs = vec![d[0].clone(), d[3].clone(), d[1].clone(), d[2].clone()];
    sweep(
        |o| comm(devs.clone(), o, Duration::from_secs(60)),
        &[DType::F32],
        &[4099],
    );
    // Forced staged rings went through the process's staging pool, whose buffers are
    // pinned for a Vulkan device that imports host memory.
    let imports = devs.iter().any(xpu_vulkan::imports_host_memory);
    let staging = xpu_memory::host_staging().stats();
    assert!(staging.acquired > 0, "{staging:?}");
    assert_eq!(staging.pins > 0, imports, "{staging:?}");
    assert_eq!(
        staging.pin_failures,
        0,
        "{:?}",
        xpu_memory::host_staging().last_pin_error()
    );
}

#[test]
fn hierarchical_gathers_cross_many_pieces_on_mixed_ranks() {
    // Groups {host:0, host:2} and {vulkan:0} with the Vulkan rank in the middle: the
    // leaders' ring moves runs of blocks, and the chains within the host group carry
    // the whole gathered buffer in several pieces.
    let d = devices("host:0,1;vulkan:*");
    if !d.iter().any(|d| d.backend() == "vulkan") {
        eprintln!("skipped: no Vulkan device (install mesa-vulkan-drivers)");
        return;
    }
    let devs = vec![d[0].clone(), d[2].clone(), d[1].clone()];
    let c = comm(
        devs,
        "allgather:hierarchical,reducescatter:hierarchical",
        Duration::from_secs(120),
    );
    for kind in [Collective::AllGather, Collective::ReduceScatter] {
        let elems = (1 << 20) + 7;
        assert_eq!(c.algorithm_for(kind, elems * 4).0, Algorithm::Hierarchical);
        for in_place in [false, true] {
            let wrong = run(
                &c,
                kind,
                DType::F32,
                ReduceOp::Sum,
                elems as usize,
                in_place,
            );
            assert_eq!(wrong, vec![0, 0, 0], "{kind} in_place={in_place}");
        }
    }
}

#[test]
fn a_single_rank_communicator_copies_through() {
    let c = comm(devices("host:0"), "", Duration::from_secs(10));
    for kind in KINDS {
        assert_eq!(
            run(&c, kind, DType::I32, ReduceOp::Sum, 17, false),
            vec![0],
            "{kind}"
        );
    }
}

#[test]
fn send_and_recv_deliver_in_order_both_ways() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(30));
    std::thread::scope(|s| {
        for rank in c.ranks() {
            s.spawn(move || {
                let me = rank.rank();
                let peer = 1 - me;
                let device = rank.device().clone();
                let stream = device.create_stream().unwrap();
                let mine: Vec<Vec<u8>> = (0..3)
                    .map(|k| vec![(me * 10 + k) as u8; 1000 + k])
                    .collect();
                // Both ranks send first: buffered sends cannot deadlock.
                for data in &mine {
                    let a = device.allocate(data.len() as u64).unwrap();
                    stream.write(&a, data).unwrap();
                    rank.send(&a, peer, &stream).unwrap();
                }
                for k in 0..3 {
                    let a = device.allocate(1000 + k as u64).unwrap();
                    rank.recv(&a, peer, &stream).unwrap();
                    stream.synchronize().unwrap();
                    assert_eq!(
                        stream.read(&a).unwrap(),
                        vec![(peer * 10 + k) as u8; 1000 + k]
                    );
                }
            });
        }
    });
}

/// Pins the calling thread to `core` alone.
fn pin_to(core: usize) {
    // SAFETY: a valid set holding one core, applied to this thread only.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut one);
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
    }
}

#[test]
fn ranks_whose_threads_share_one_core_finish_small_operations_exactly() {
    // Each waiting rank must hand the core to the other (it may not move: its thread is
    // allowed that core alone), thousands of times.
    let c = comm(devices("host:0,1"), "", Duration::from_secs(60));
    // SAFETY: reads which core this thread runs on; no arguments.
    let core = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
    std::thread::scope(|s| {
        for rank in c.ranks() {
            s.spawn(move || {
                pin_to(core);
                let me = rank.rank() as f32;
                let device = rank.device().clone();
                let stream = device.create_stream().unwrap();
                let (send, recv) = (
                    device.allocate(1024).unwrap(),
                    device.allocate(1024).unwrap(),
                );
                for k in 0..2000u32 {
                    let value = k as f32 + me;
                    let input: Vec<u8> = (0..256).flat_map(|_| value.to_le_bytes()).collect();
                    stream.write(&send, &input).unwrap();
                    rank.all_reduce(&send, &recv, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap();
                    if k % 97 == 0 || k == 1999 {
                        let got = stream.read(&recv).unwrap();
                        let want = (2 * k + 1) as f32;
                        assert!(
                            got.chunks_exact(4)
                                .all(|b| f32::from_le_bytes(b.try_into().unwrap()) == want),
                            "operation {k}: want {want} everywhere"
                        );
                    }
                }
                stream.synchronize().unwrap();
            });
        }
    });
}

#[test]
fn barrier_orders_streams_across_ranks() {
    let c = comm(devices("host:0,1,2"), "", Duration::from_secs(30));
    std::thread::scope(|s| {
        for rank in c.ranks() {
            s.spawn(move || {
                let stream = rank.device().create_stream().unwrap();
                rank.barrier(&stream).unwrap();
                stream.synchronize().unwrap();
            });
        }
    });
}

#[test]
fn a_missing_rank_times_out_on_every_waiting_rank_naming_it() {
    let timeout = Duration::from_millis(300);
    let c = comm(devices("host:0,1,2"), "", timeout);
    let start = Instant::now();
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .take(2)
            .map(|rank| {
                s.spawn(move || {
                    let stream = rank.device().create_stream().unwrap();
                    let a = rank.device().allocate(64).unwrap();
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A guard against hanging, not a speed check: the errors come back, not forever later.
    assert!(start.elapsed() < timeout + Duration::from_secs(10));
    for e in &errors {
        let text = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }), "{text}");
        assert!(
            text.contains("rank 2 (host:2)") && text.contains("allreduce") && text.contains("#0"),
            "{text}"
        );
    }
    // The communicator is failed; the late rank is told at once.
    let late = c.rank(2).unwrap();
    let stream = late.device().create_stream().unwrap();
    let a = late.device().allocate(64).unwrap();
    let e = late
        .all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(c.failed().is_some());
}

#[test]
fn different_calls_are_a_desync_on_every_rank() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(30));
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let stream = rank.device().create_stream().unwrap();
                    let elems = if rank.rank() == 0 { 16 } else { 32 };
                    let a = rank.device().allocate(elems * 4).unwrap();
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert!(
            e.contains("desync") && e.contains("16 × f32") && e.contains("32 × f32"),
            "{e}"
        );
    }
    // Nothing was enqueued, so the communicator still works.
    assert_eq!(
        run(
            &c,
            Collective::AllReduce,
            DType::F32,
            ReduceOp::Sum,
            8,
            false
        ),
        vec![0, 0]
    );
}

#[test]
fn invalid_arguments_on_one_rank_fail_the_operation_everywhere() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(30));
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let stream = rank.device().create_stream().unwrap();
                    // Rank 1 passes a length that is not a whole number of f32s.
                    let bytes = if rank.rank() == 1 { 10 } else { 16 };
                    let a = rank.device().allocate(bytes).unwrap();
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert!(
            e.contains("rank 1 (host:1)") && e.contains("whole number"),
            "{e}"
        );
    }
}

#[test]
fn abort_releases_waiting_ranks_at_once() {
    let c = comm(devices("host:0,1,2"), "", Duration::from_secs(600));
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let rank = c.rank(0).unwrap();
            let stream = rank.device().create_stream().unwrap();
            let a = rank.device().allocate(64).unwrap();
            rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                .unwrap_err()
        });
        std::thread::sleep(Duration::from_millis(50));
        c.abort();
        let e = waiting.join().unwrap();
        assert!(matches!(e, Error::Aborted { .. }), "{e}");
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(c.failed(), Some(Error::Aborted { .. })));
}

#[test]
fn wrong_devices_streams_and_roots_are_refused() {
    let devs = devices("host:0,1");
    let c = comm(devs.clone(), "", Duration::from_secs(30));
    let r0 = c.rank(0).unwrap();
    let other_stream = devs[1].create_stream().unwrap();
    let a = devs[0].allocate(16).unwrap();
    let e = r0
        .all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &other_stream)
        .unwrap_err();
    assert!(e.to_string().contains("stream is on host:1"), "{e}");
    assert!(c.rank(2).is_err());
    assert!(r0.send(&a, 0, &devs[0].create_stream().unwrap()).is_err());
    assert!(Communicator::with_topology(
        vec![],
        Topology::discover(&[]).unwrap(),
        CommOptions::default()
    )
    .is_err());
}

/// An exact in-place f32 sum all-reduce of 4099 elements per rank, each rank's stream
/// first held busy by `hold` (given its device and stream) through a gate that `release`
/// opens once every rank has returned from the call.
fn all_reduce_behind_gates(
    c: &Communicator,
    release: &AtomicBool,
    hold: impl Fn(&Device, &xpu_hal::Stream) + Sync,
) {
    let n = c.size();
    let returned = AtomicUsize::new(0);
    let elems = 4099;
    std::thread::scope(|s| {
        for rank in c.ranks() {
            let (returned, hold) = (&returned, &hold);
            s.spawn(move || {
                let r = rank.rank();
                let device = rank.device().clone();
                let stream = device.create_stream().unwrap();
                let input = check::input(DType::F32, Some(ReduceOp::Sum), r, n, elems);
                let a = device.allocate(input.len() as u64).unwrap();
                stream.write(&a, &input).unwrap();
                hold(&device, &stream);
                rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                    .unwrap();
                if returned.fetch_add(1, Ordering::AcqRel) + 1 == n {
                    release.store(true, Ordering::Release);
                }
                stream.synchronize().unwrap();
                let got = stream.read(&a).unwrap();
                let want = check::reduced(DType::F32, ReduceOp::Sum, n, elems);
                assert_eq!(check::wrong_elements(DType::F32, &got, &want), 0);
            });
        }
    });
}

#[test]
fn host_ranks_run_in_shared_memory_whether_their_streams_are_idle_or_busy() {
    let c = comm(devices("host:0,1,2"), "", Duration::from_secs(60));
    assert_eq!(
        c.algorithm_for(Collective::AllReduce, 1 << 20).0,
        Algorithm::SharedMemory
    );
    let wrong = run(
        &c,
        Collective::AllReduce,
        DType::F32,
        ReduceOp::Sum,
        4099,
        false,
    );
    assert_eq!(wrong, vec![0, 0, 0]);
    assert_eq!(
        c.stats(),
        CommStats {
            shared_memory: 1,
            enqueued: 0
        }
    );
    // Each stream is held busy until every rank has returned from the call, so the data
    // is not ready when the ranks arrive: each stream runs its share behind the gate.
    let release = Arc::new(AtomicBool::new(false));
    all_reduce_behind_gates(&c, &release, |device, stream| {
        stream
            .launch(
                &gate(device, release.clone()),
                LaunchDims::linear(1, 1),
                &[],
            )
            .unwrap();
    });
    assert_eq!(
        c.stats(),
        CommStats {
            shared_memory: 2,
            enqueued: 0
        }
    );
}

#[test]
fn a_rank_that_dies_between_operations_times_out_naming_it() {
    let timeout = Duration::from_millis(300);
    let c = comm(devices("host:0,1,2"), "", timeout);
    let waited: Vec<Option<(Error, Duration)>> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let stream = rank.device().create_stream().unwrap();
                    let a = rank.device().allocate(1 << 16).unwrap();
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap();
                    if rank.rank() == 1 {
                        // The thread driving rank 1 dies after operation #0.
                        return None;
                    }
                    let start = Instant::now();
                    let e = rank
                        .all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap_err();
                    Some((e, start.elapsed()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (e, took) in waited.into_iter().flatten() {
        let text = e.to_string();
        assert!(matches!(e, Error::Timeout { .. }), "{text}");
        assert!(
            text.contains("rank 1 (host:1)") && text.contains("#1"),
            "{text}"
        );
        // A guard against hanging, not a speed check.
        assert!(took < timeout + Duration::from_secs(10), "{took:?}");
    }
}

#[test]
fn small_operations_on_busy_streams_run_in_stream_order() {
    // Each stream is held by a gate until every rank has returned from its calls, so the
    // small operations run later, on the streams' workers; they must still be exact.
    let c = comm(devices("host:0,1,2"), "", Duration::from_secs(60));
    let n = c.size();
    let release = Arc::new(AtomicBool::new(false));
    let returned = AtomicUsize::new(0);
    let elems = 100;
    std::thread::scope(|s| {
        for rank in c.ranks() {
            let (release, returned) = (release.clone(), &returned);
            s.spawn(move || {
                let r = rank.rank();
                let device = rank.device().clone();
                let stream = device.create_stream().unwrap();
                let input = check::input(DType::I32, Some(ReduceOp::Sum), r, n, elems);
                let a = device.allocate(input.len() as u64).unwrap();
                let b = device.allocate(input.len() as u64).unwrap();
                stream.write(&a, &input).unwrap();
                stream
                    .launch(
                        &gate(&device, release.clone()),
                        LaunchDims::linear(1, 1),
                        &[],
                    )
                    .unwrap();
                // Two in a row: the second reads what the first wrote.
                rank.all_reduce(&a, &b, DType::I32, ReduceOp::Sum, &stream)
                    .unwrap();
                rank.broadcast(None, &b, 0, &stream).unwrap();
                if returned.fetch_add(1, Ordering::AcqRel) + 1 == n {
                    release.store(true, Ordering::Release);
                }
                stream.synchronize().unwrap();
                let want = check::reduced(DType::I32, ReduceOp::Sum, n, elems);
                let got = stream.read(&b).unwrap();
                assert_eq!(check::wrong_elements(DType::I32, &got, &want), 0);
            });
        }
    });
    assert_eq!(c.stats().shared_memory, 2);
}

#[test]
fn a_small_call_against_a_large_one_is_a_desync_on_both() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(60));
    let start = Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .map(|rank| {
                s.spawn(move || {
                    let stream = rank.device().create_stream().unwrap();
                    // Rank 0's call takes the small path, rank 1's the rendezvous.
                    let elems = if rank.rank() == 0 { 16 } else { 1 << 20 };
                    let a = rank.device().allocate(elems * 4).unwrap();
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A guard against waiting for the timeout, not a speed check.
    assert!(start.elapsed() < Duration::from_secs(30));
    for e in &errors {
        assert!(
            e.contains("desync") && e.contains("16 × f32") && e.contains("1048576 × f32"),
            "{e}"
        );
    }
}

#[test]
fn operations_keep_their_order_across_streams_without_blocking_the_caller() {
    // Operation #0 is queued behind a gate on one stream; #1, #2 and #3 (small) and #4
    // (large) are called on another, idle stream. The gate opens only once every rank has
    // returned from all five calls, so no call may wait for #0; each rank still runs its
    // operations in order (#1 after #0), and every result is exact. A call that waited
    // would hold the gate shut until the timeout and fail.
    let c = comm(devices("host:0,1"), "", Duration::from_secs(10));
    let n = c.size();
    let release = Arc::new(AtomicBool::new(false));
    let returned = AtomicUsize::new(0);
    let elems = 64;
    let large = 64 << 10;
    std::thread::scope(|s| {
        for rank in c.ranks() {
            let (release, returned) = (release.clone(), &returned);
            s.spawn(move || {
                let r = rank.rank();
                let device = rank.device().clone();
                let (gated, idle) = (
                    device.create_stream().unwrap(),
                    device.create_stream().unwrap(),
                );
                let input = check::input(DType::I64, Some(ReduceOp::Sum), r, n, elems);
                let big = check::input(DType::I64, Some(ReduceOp::Sum), r, n, large);
                let bufs: Vec<_> = (0..4)
                    .map(|_| device.allocate(input.len() as u64).unwrap())
                    .collect();
                let (big_in, big_out) = (
                    device.allocate(big.len() as u64).unwrap(),
                    device.allocate(big.len() as u64).unwrap(),
                );
                gated.write(&bufs[0], &input).unwrap();
                idle.write(&bufs[2], &input).unwrap();
                idle.write(&big_in, &big).unwrap();
                gated
                    .launch(
                        &gate(&device, release.clone()),
                        LaunchDims::linear(1, 1),
                        &[],
                    )
                    .unwrap();
                rank.all_reduce(&bufs[0], &bufs[1], DType::I64, ReduceOp::Sum, &gated)
                    .unwrap();
                for k in 0..3 {
                    let (a, b) = if k % 2 == 0 {
                        (&bufs[2], &bufs[3])
                    } else {
                        (&bufs[3], &bufs[2])
                    };
                    rank.all_reduce(a, b, DType::I64, ReduceOp::Sum, &idle)
                        .unwrap();
                }
                rank.all_reduce(&big_in, &big_out, DType::I64, ReduceOp::Sum, &idle)
                    .unwrap();
                if returned.fetch_add(1, Ordering::AcqRel) + 1 == n {
                    release.store(true, Ordering::Release);
                }
                gated.synchronize().unwrap();
                idle.synchronize().unwrap();
                // #0 gives the sum S; #1 S again (from the same inputs); #2 n·S; #3 n²·S.
                let want = check::reduced(DType::I64, ReduceOp::Sum, n, elems);
                let scaled: Vec<u8> = want
                    .chunks_exact(8)
                    .flat_map(|c| {
                        let v = i64::from_le_bytes(c.try_into().unwrap());
                        (v * (n * n) as i64).to_le_bytes()
                    })
                    .collect();
                let first = gated.read(&bufs[1]).unwrap();
                assert_eq!(check::wrong_elements(DType::I64, &first, &want), 0);
                let last = idle.read(&bufs[3]).unwrap();
                assert_eq!(check::wrong_elements(DType::I64, &last, &scaled), 0);
                let want = check::reduced(DType::I64, ReduceOp::Sum, n, large);
                let got = idle.read(&big_out).unwrap();
                assert_eq!(check::wrong_elements(DType::I64, &got, &want), 0);
            });
        }
    });
}

#[test]
fn busy_streams_of_devices_without_host_functions_take_the_enqueued_algorithms() {
    let devs = devices("host:0;vulkan:*");
    if !devs.iter().any(|d| d.backend() == "vulkan") {
        eprintln!("skipped: no Vulkan device (install mesa-vulkan-drivers)");
        return;
    }
    let c = comm(devs, "", Duration::from_secs(60));
    let release = Arc::new(AtomicBool::new(false));
    let host = c.devices()[0].clone();
    let gated = host.create_stream().unwrap();
    gated
        .launch(&gate(&host, release.clone()), LaunchDims::linear(1, 1), &[])
        .unwrap();
    // Both ranks' streams wait behind the gate: the Vulkan one through an event.
    let behind = gated.record_event().unwrap();
    all_reduce_behind_gates(&c, &release, |_, stream| {
        stream.wait_event(&behind).unwrap();
    });
    assert_eq!(
        c.stats(),
        CommStats {
            shared_memory: 0,
            enqueued: 1
        }
    );
}

#[test]
fn a_stream_that_never_reaches_a_queued_share_times_out_the_others() {
    let timeout = Duration::from_millis(300);
    let c = comm(devices("host:0,1,2"), "", timeout);
    let release = Arc::new(AtomicBool::new(false));
    let results: Vec<xpu_hal::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = c
            .ranks()
            .into_iter()
            .map(|rank| {
                let release = release.clone();
                s.spawn(move || {
                    let device = rank.device().clone();
                    let stream = device.create_stream().unwrap();
                    let a = device.allocate(64 << 10).unwrap();
                    if rank.rank() == 1 {
                        // Rank 1's stream is stuck until the others have failed.
                        stream
                            .launch(
                                &gate(&device, release.clone()),
                                LaunchDims::linear(1, 1),
                                &[],
                            )
                            .unwrap();
                    }
                    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, &stream)
                        .unwrap();
                    if rank.rank() == 1 {
                        std::thread::sleep(timeout * 3);
                        release.store(true, Ordering::Release);
                    }
                    stream.synchronize()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, result) in results.iter().enumerate() {
        let e = result.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("abandoned") || e.contains("timed out"),
            "rank {r}: {e}"
        );
    }
    assert!(c.failed().is_some());
}

#[test]
fn shrink_within_one_process_is_refused_with_what_to_do() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(10));
    match c.shrink() {
        Err(Error::InvalidArgument { message }) => {
            assert!(message.contains("Communicator::new"), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.size())),
    }
}

/// One thread calls every rank in turn, in a group: every operation is exact, small and
/// large, in place and out of place, on idle streams and on streams held by a gate
/// until every call has returned (without the group the first call would wait for the
/// second forever).
#[test]
fn one_thread_calls_every_rank_in_a_group_on_busy_and_idle_streams() {
    let c = comm(devices("host:0,1,2"), "", Duration::from_secs(60));
    assert!(c.can_group());
    for kind in KINDS {
        for dtype in [DType::F32, DType::BF16] {
            for elems in [1, 7, 3000, 70_001] {
                for in_place in [false, true] {
                    for busy in [false, true] {
                        if kind == Collective::AllToAll && in_place {
                            continue;
                        }
                        let wrong = support::run_grouped(
                            &c,
                            kind,
                            dtype,
                            ReduceOp::Sum,
                            elems,
                            in_place,
                            busy,
                        );
                        assert!(
                            wrong.iter().all(|&w| w == 0),
                            "{kind} {} × {elems} in_place={in_place} busy={busy}: wrong {wrong:?}",
                            dtype.name()
                        );
                    }
                }
            }
        }
    }
    // Barriers too, and then ranks on threads of their own again.
    let streams: Vec<_> = c
        .ranks()
        .iter()
        .map(|r| r.device().create_stream().unwrap())
        .collect();
    c.grouped(|| {
        for (r, s) in c.ranks().iter().zip(&streams) {
            r.barrier(s)?;
        }
        Ok(())
    })
    .unwrap();
    for s in &streams {
        s.synchronize().unwrap();
    }
    assert_eq!(
        run(
            &c,
            Collective::AllReduce,
            DType::F32,
            ReduceOp::Sum,
            5000,
            false
        ),
        vec![0, 0, 0]
    );
}

/// Every rank of `c`, a stream and a buffer of `bytes` on its device each.
fn streams_and_buffers(
    c: &Communicator,
    bytes: u64,
) -> (
    Vec<xpu_collectives::Rank>,
    Vec<xpu_hal::Stream>,
    Vec<xpu_hal::Allocation>,
) {
    let ranks = c.ranks();
    let streams = ranks
        .iter()
        .map(|r| r.device().create_stream().unwrap())
        .collect();
    let bufs = ranks
        .iter()
        .map(|r| r.device().allocate(bytes).unwrap())
        .collect();
    (ranks, streams, bufs)
}

/// Groups are refused where a call could wait for another rank (a device that is not
/// host addressable) and when nested; a call refused inside a group, or whose ranks
/// disagree, fails the operation on every rank's stream instead of leaving the ranks
/// called before it waiting.
#[test]
fn grouped_calls_that_cannot_run_fail_every_rank_instead_of_waiting() {
    let c = comm(devices("host:0,1"), "", Duration::from_secs(60));
    let nested = c.grouped(|| c.grouped(|| Ok(())));
    assert!(
        matches!(nested, Err(Error::InvalidArgument { .. })),
        "{nested:?}"
    );
    if let Some(vulkan) = devices("vulkan:*").first() {
        let mixed = comm(
            vec![devices("host:0")[0].clone(), vulkan.clone()],
            "",
            Duration::from_secs(60),
        );
        assert!(!mixed.can_group());
        let refused = mixed.grouped(|| Ok(()));
        assert!(
            matches!(refused, Err(Error::Unsupported { .. })),
            "{refused:?}"
        );
    }
    // Ranks that disagree (a desync) on large operations: the last to be called learns
    // of it, and the first's queued share fails instead of waiting.
    let (ranks, streams, bufs) = streams_and_buffers(&c, 4 * 3000);
    let started = Instant::now();
    let last = c.grouped(|| {
        ranks[0].all_reduce(&bufs[0], &bufs[0], DType::F32, ReduceOp::Sum, &streams[0])?;
        ranks[1].all_reduce(
            bufs[1].slice(0, 4 * 2000),
            bufs[1].slice(0, 4 * 2000),
            DType::F32,
            ReduceOp::Sum,
            &streams[1],
        )
    });
    let e = last.unwrap_err().to_string();
    assert!(e.contains("desync"), "{e}");
    let first = streams[0].synchronize().unwrap_err().to_string();
    assert!(first.contains("desync"), "{first}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // A call refused in a group (a buffer of the wrong size) fails the communicator.
    let c = comm(devices("host:0,1"), "", Duration::from_secs(60));
    let (ranks, streams, bufs) = streams_and_buffers(&c, 4 * 3000);
    let refused = c.grouped(|| {
        ranks[0].all_reduce(&bufs[0], &bufs[0], DType::F32, ReduceOp::Sum, &streams[0])?;
        ranks[1].all_reduce(
            &bufs[1],
            bufs[1].slice(0, 8),
            DType::F32,
            ReduceOp::Sum,
            &streams[1],
        )
    });
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
    assert!(c.failed().is_some());
    assert!(streams[0].synchronize().is_err());
    assert!(started.elapsed() < Duration::from_secs(30));
    // A group that fails after a rank queued its part (here: rank 1 is given rank 0's
    // stream) fails the communicator, so that the queued part does not wait for it.
    let c = comm(devices("host:0,1"), "", Duration::from_secs(60));
    let (ranks, streams, bufs) = streams_and_buffers(&c, 4 * 3000);
    let started = Instant::now();
    let failed = c.grouped(|| {
        ranks[0].all_reduce(&bufs[0], &bufs[0], DType::F32, ReduceOp::Sum, &streams[0])?;
        ranks[1].all_reduce(&bufs[1], &bufs[1], DType::F32, ReduceOp::Sum, &streams[0])
    });
    assert!(
        matches!(failed, Err(Error::InvalidArgument { .. })),
        "{failed:?}"
    );
    assert!(c.failed().is_some());
    assert!(streams[0].synchronize().is_err());
    assert!(started.elapsed() < Duration::from_secs(30));
    // An override that forces an enqueued algorithm cannot run in a group.
    let c = comm(
        devices("host:0,1"),
        "allreduce:ring",
        Duration::from_secs(60),
    );
    let rank = c.rank(0).unwrap();
    let stream = rank.device().create_stream().unwrap();
    let buf = rank.device().allocate(4 * 3000).unwrap();
    let forced = c.grouped(|| rank.all_reduce(&buf, &buf, DType::F32, ReduceOp::Sum, &stream));
    assert!(
        matches!(forced, Err(Error::Unsupported { .. })),
        "{forced:?}"
    );
    assert!(c.failed().is_some());
}
