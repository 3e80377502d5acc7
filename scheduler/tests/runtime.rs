//! The scheduler on real devices: host devices, Vulkan on lavapipe, and both example
//! plugins (sim-npu built as a dependency, the C example compiled here as a vendor
//! would), alone and mixed, under every policy. Random task programs run against the
//! same program executed in order on one host device, byte for byte; then dependency
//! order with host functions, eviction under a small memory budget, failures and bad
//! input. A backend that `XPU_REQUIRE` names must be present; others are skipped with
//! the reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use xpu_hal::{BinaryOp, DType, Device, Error, HostBuffer, KernelParam, Scalar};
use xpu_host::{HostBackend, HostConfig};
use xpu_scheduler::{Builtin, Codelet, Policy, Scheduler, SchedulerOptions, Task};

mod common;
use common::*;

/// The program through a scheduler over `devices`.
fn scheduled(devices: &[Device], policy: Policy, init: &[Vec<f32>], prog: &[Step]) -> Vec<Vec<u8>> {
    let sched = Scheduler::new(devices, options(policy)).unwrap();
    let handles: Vec<_> = register_all(&sched, init);
    submit_program(&sched, &handles, prog).unwrap();
    sched.wait_all().unwrap();
    // Half read while registered, half given back.
    handles
        .iter()
        .enumerate()
        .map(|(i, h)| {
            if i % 2 == 0 {
                sched.read(*h).unwrap()
            } else {
                let mut b = sched.unregister(*h).unwrap();
                b.as_slice().unwrap().to_vec()
            }
        })
        .collect()
}

const DEVICE_SETS: [&str; 6] = [
    "host:0",
    "host:0,1,2",
    "host:0;vulkan:0",
    "host:0,1;plugin.simnpu:0;plugin.minimal:0",
    "vulkan:0;plugin.simnpu:0,1",
    "host:0;vulkan:0;plugin.simnpu:0;plugin.minimal:0",
];

#[test]
fn random_programs_match_a_sequential_run_on_every_device_set_and_policy() {
    let base: u64 = std::env::var("XPU_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for (k, sel) in DEVICE_SETS.iter().enumerate() {
        let Some(devs) = devices(sel) else { continue };
        for policy in Policy::ALL {
            for round in 0..3u64 {
                let seed = base ^ (1000 * k as u64 + 10 * round + policy as u64 + 1);
                let (init, prog) = program(seed, 6, 40);
                let want = reference(&init, &prog);
                let got = scheduled(&devs, policy, &init, &prog);
                for (h, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w,
                        "{sel}, {policy}, seed {seed} (XPU_TEST_SEED={base}): handle {h} differs from the sequential run\n{prog:?}"
                    );
                }
            }
        }
    }
}

// ------------------------------------------------------------------ dependencies --

/// A host function appending its tag to a shared log when it runs, after reading and
/// writing one-byte handles.
fn logger(log: &Arc<Mutex<Vec<u32>>>, tag: u32, params: Vec<KernelParam>) -> Codelet {
    let log = log.clone();
    Codelet::new(format!("log{tag}"))
        .host(params, move |_| {
            std::thread::sleep(std::time::Duration::from_millis(u64::from(tag % 3)));
            log.lock().unwrap().push(tag);
            Ok(())
        })
        .build()
        .unwrap()
}

#[test]
fn hazards_order_tasks_across_host_devices() {
    let Some(devs) = devices("host:0,1,2") else {
        return;
    };
    for policy in Policy::ALL {
        let sched = Scheduler::new(&devs, options(policy)).unwrap();
        let a = sched.create(8).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let w = KernelParam::Buffer(xpu_hal::Access::Write);
        let r = KernelParam::Buffer(xpu_hal::Access::Read);
        // t0 writes; t1, t2 read (RAW, free among themselves); t3 writes (WAR, WAW).
        sched
            .submit(Task::new(&logger(&log, 0, vec![w])).write(a))
            .unwrap();
        sched
            .submit(Task::new(&logger(&log, 1, vec![r])).read(a))
            .unwrap();
        sched
            .submit(Task::new(&logger(&log, 2, vec![r])).read(a))
            .unwrap();
        sched
            .submit(Task::new(&logger(&log, 3, vec![w])).write(a))
            .unwrap();
        sched.wait_all().unwrap();
        let order = log.lock().unwrap().clone();
        let pos = |t: u32| order.iter().position(|x| *x == t).unwrap();
        assert_eq!(order.len(), 4, "{order:?}");
        assert!(pos(0) < pos(1) && pos(0) < pos(2), "{policy}: {order:?}");
        assert!(pos(3) > pos(1) && pos(3) > pos(2), "{policy}: {order:?}");
    }
}

#[test]
fn explicit_dependencies_and_pinning_are_honoured() {
    let Some(devs) = devices("host:0,1") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Eager)).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let first = sched
        .submit(Task::new(&logger(&log, 5, vec![])).on(&devs[1]))
        .unwrap();
    sched
        .submit(
            Task::new(&logger(&log, 1, vec![]))
                .on(&devs[0])
                .after(first),
        )
        .unwrap();
    sched.wait_all().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![5, 1]);
}

// ---------------------------------------------------------------------- memory --

#[test]
fn replicas_are_evicted_and_written_back_under_a_small_device_memory() {
    // Two host devices of 1 MiB each; twelve 256 KiB handles cycled through them.
    let backend = HostBackend::new(HostConfig {
        devices: 2,
        capacity: 1 << 20,
    });
    let devs: Vec<Device> = (0..2)
        .map(|i| {
            Device::from_impl(
                xpu_hal::DeviceId::new("host", i),
                Arc::new(backend.create_host_device(i).unwrap()),
            )
        })
        .collect();
    let sched = Scheduler::new(&devs, options(Policy::Eager)).unwrap();
    let elems = (256 << 10) / 4;
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let v: Vec<f32> = vec![i as f32; elems];
            sched
                .register(HostBuffer::from_bytes(&bytes(&v)).unwrap())
                .unwrap()
        })
        .collect();
    let add = Codelet::from_builtin(Builtin::Accumulate {
        op: BinaryOp::Sum,
        dtype: DType::F32,
    });
    // h[i] += h[i-1], round after round: every handle moves between devices and their
    // memories.
    for _ in 0..3 {
        for i in 1..handles.len() {
            sched
                .submit(Task::new(&add).read_write(handles[i]).read(handles[i - 1]))
                .unwrap();
        }
    }
    sched.wait_all().unwrap();
    let stats = sched.stats();
    assert!(stats.evictions > 0 && stats.write_backs > 0, "{stats:?}");
    assert_eq!(stats.placed.iter().sum::<u64>(), stats.tasks);
    // The same in order on the host.
    let mut want: Vec<f32> = (0..12).map(|i| i as f32).collect();
    for _ in 0..3 {
        for i in 1..12 {
            want[i] += want[i - 1];
        }
    }
    for (i, h) in handles.iter().enumerate() {
        let got = sched.read(*h).unwrap();
        assert_eq!(got, bytes(&vec![want[i]; elems]), "handle {i}");
    }
}

/// `write` replaces a handle's value in place: a recorded graph replayed after it reads
/// the new value on every device (the copies made from the old one are dropped), tasks
/// before it keep the old one, and a write of the wrong length is refused.
#[test]
fn a_written_handle_feeds_the_next_replay_with_its_new_value() {
    let Some(devs) = devices("host:0,1") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let elems = 1024;
    let input = sched
        .register(HostBuffer::from_bytes(&bytes(&vec![1.0; elems])).unwrap())
        .unwrap();
    let outs: Vec<_> = (0..2)
        .map(|_| sched.create(elems as u64 * 4).unwrap())
        .collect();
    let double = Codelet::from_builtin(Builtin::Scale {
        alpha: Scalar::F32(2.0),
    });
    // Each device doubles the input into its own output.
    let graph = sched
        .record(|s| {
            for (out, dev) in outs.iter().zip(&devs) {
                s.submit(Task::new(&double).read(input).write(*out).on(dev))?;
            }
            Ok(())
        })
        .unwrap();
    sched.wait_all().unwrap();
    for v in [3.0f32, -0.5, 7.25] {
        sched.write(input, &bytes(&vec![v; elems])).unwrap();
        sched.replay(&graph).unwrap();
        sched.wait_all().unwrap();
        for out in &outs {
            assert_eq!(
                sched.read(*out).unwrap(),
                bytes(&vec![2.0 * v; elems]),
                "{v}"
            );
        }
    }
    // A task submitted before a write reads the value of its time.
    let early = sched.create(elems as u64 * 4).unwrap();
    sched
        .submit(Task::new(&double).read(input).write(early).on(&devs[1]))
        .unwrap();
    sched.write(input, &bytes(&vec![100.0; elems])).unwrap();
    assert_eq!(sched.read(early).unwrap(), bytes(&vec![14.5; elems]));
    let e = sched.write(input, &[0u8; 3]).unwrap_err();
    assert!(e.to_string().contains("give its whole value"), "{e}");
}

/// Each device learns models of its own, as StarPU keeps them per device: tasks timed on
/// one host device teach nothing about another of the same kind, which may run at
/// another speed (throttled, or sharing its cores).
#[test]
fn each_device_learns_models_of_its_own() {
    let Some(devs) = devices("host:0,1") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let elems = 4096;
    let input = sched
        .register(HostBuffer::from_bytes(&bytes(&vec![1.0; elems])).unwrap())
        .unwrap();
    let out = sched.create(elems as u64 * 4).unwrap();
    let double = Codelet::from_builtin(Builtin::Scale {
        alpha: Scalar::F32(2.0),
    });
    let task = || Task::new(&double).read(input).write(out);
    sched.time_every_task(true);
    for _ in 0..8 {
        sched.submit(task().on(&devs[0])).unwrap();
    }
    sched.wait_all().unwrap();
    assert!(sched.predict_task(&task(), 0).is_some());
    assert_eq!(sched.predict_task(&task(), 1), None);
}

/// A replayed run keeps its operations validated once and binds them, each replay, to
/// the replicas of the time: here the replicas it used are evicted between replays (a
/// device of 1 MiB, other 256 KiB handles passing through), so it runs on new memory.
#[test]
fn a_replayed_run_binds_the_replicas_of_the_time() {
    let backend = HostBackend::new(HostConfig {
        devices: 1,
        capacity: 1 << 20,
    });
    let dev = Device::from_impl(
        xpu_hal::DeviceId::new("host", 0),
        Arc::new(backend.create_host_device(0).unwrap()),
    );
    let sched = Scheduler::new(std::slice::from_ref(&dev), options(Policy::Dmda)).unwrap();
    let elems = (256 << 10) / 4;
    let register = |v: f32| {
        sched
            .register(HostBuffer::from_bytes(&bytes(&vec![v; elems])).unwrap())
            .unwrap()
    };
    let (a, b) = (register(1.0), register(0.0));
    let others: Vec<_> = (0..4).map(|i| register(10.0 + i as f32)).collect();
    let add = Codelet::from_builtin(Builtin::Accumulate {
        op: BinaryOp::Sum,
        dtype: DType::F32,
    });
    // b += a, twice: one run.
    let graph = sched
        .record(|s| {
            s.submit(Task::new(&add).read_write(b).read(a))?;
            s.submit(Task::new(&add).read_write(b).read(a))?;
            Ok(())
        })
        .unwrap();
    let mut want = 2.0f32;
    for round in 0..3 {
        // Four other handles through the device push a and b out of its memory.
        let before = sched.stats().evictions;
        for w in others.windows(2) {
            sched
                .submit(Task::new(&add).read_write(w[1]).read(w[0]))
                .unwrap();
        }
        sched.wait_all().unwrap();
        assert!(
            sched.stats().evictions > before,
            "round {round}: nothing was evicted"
        );
        sched.replay(&graph).unwrap();
        want += 2.0;
        sched.wait_all().unwrap();
        assert_eq!(
            sched.read(b).unwrap(),
            bytes(&vec![want; elems]),
            "round {round}"
        );
    }
    assert_eq!(sched.read(a).unwrap(), bytes(&vec![1.0; elems]));
}

// -------------------------------------------------------------------- failures --

#[test]
fn a_failing_task_is_reported_at_the_next_wait() {
    let Some(devs) = devices("host:0") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let fails = Codelet::new("fails")
        .host(vec![], |_| Err("this codelet fails on purpose".to_string()))
        .build()
        .unwrap();
    sched.submit(Task::new(&fails)).unwrap();
    let e = sched.wait_all().unwrap_err();
    assert!(e.to_string().contains("fails on purpose"), "{e}");
    // Reported once; the scheduler goes on.
    sched.wait_all().unwrap();
    let ok = Codelet::new("ok").host(vec![], |_| Ok(())).build().unwrap();
    sched.submit(Task::new(&ok)).unwrap();
    sched.wait_all().unwrap();
}

// ------------------------------------------------------------------- bad input --

#[test]
fn bad_input_is_refused_with_the_reason() {
    let Some(devs) = devices("host:0,1") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let h = sched.create(16).unwrap();
    let fill = Codelet::from_builtin(Builtin::Fill {
        value: Scalar::F32(1.0),
    });

    // A handle after unregistering.
    let gone = sched.create(16).unwrap();
    sched.unregister(gone).unwrap();
    let e = sched.submit(Task::new(&fill).write(gone)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("not registered"), "{e}");
    assert!(sched.read(gone).is_err());

    // No implementation for any device.
    let wgsl = Codelet::new("wgsl-only")
        .kernel(
            xpu_hal::KernelSource::Wgsl(String::new()),
            "main",
            vec![],
            |_| xpu_hal::LaunchDims::linear(1, 1),
        )
        .build()
        .unwrap();
    let e = sched
        .submit(Task::new(&wgsl).named("the wgsl task"))
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("the wgsl task"), "{e}");
    assert!(e.to_string().contains("host:0"), "{e}");

    // The wrong number of arguments for a builtin.
    let e = sched
        .submit(Task::new(&fill).write(h).read(sched.create(16).unwrap()))
        .unwrap_err();
    assert!(e.to_string().contains("takes 1 distinct handles"), "{e}");

    // Waiting for a task never submitted.
    let e = sched
        .submit(
            Task::new(&fill)
                .write(h)
                .after(xpu_scheduler::TaskId::from_index(99)),
        )
        .unwrap_err();
    assert!(e.to_string().contains("has not been submitted"), "{e}");

    // A device that is not the scheduler's.
    let other = devices("host:2").unwrap().remove(0);
    let e = sched
        .submit(Task::new(&fill).write(h).on(&other))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not one of this scheduler's devices"),
        "{e}"
    );

    // Nothing was lost: the scheduler still works.
    sched.submit(Task::new(&fill).write(h)).unwrap();
    assert_eq!(sched.read(h).unwrap(), bytes(&[1.0; 4]));

    // Schedulers over nothing or the same device twice.
    assert!(Scheduler::new(&[], options(Policy::Eager)).is_err());
    assert!(Scheduler::new(&[devs[0].clone(), devs[0].clone()], options(Policy::Eager)).is_err());
}

// ------------------------------------------------------------------- profiling --

#[test]
fn a_profile_times_every_task_and_copy_and_writes_a_trace() {
    let sel = if devices("host:0;vulkan:0").is_some() {
        "host:0,1;vulkan:0"
    } else {
        "host:0,1"
    };
    let Some(devs) = devices(sel) else { return };
    let path = std::env::temp_dir().join(format!("xpu-sched-profile-{}.json", std::process::id()));
    let (init, prog) = program(7, 4, 30);
    {
        let sched = Scheduler::new(
            &devs,
            SchedulerOptions {
                profile: Some(path.clone()),
                ..options(Policy::Dmda)
            },
        )
        .unwrap();
        let handles: Vec<_> = register_all(&sched, &init);
        let add = Codelet::from_builtin(Builtin::Accumulate {
            op: BinaryOp::Max,
            dtype: DType::F32,
        });
        for (i, _) in prog.iter().enumerate() {
            let (a, b) = (i % 4, (i + 1) % 4);
            sched
                .submit(Task::new(&add).read_write(handles[a]).read(handles[b]))
                .unwrap();
        }
        let profile = sched.stop_profiling().unwrap();
        let tasks = profile
            .spans
            .iter()
            .filter(|s| s.kind == xpu_scheduler::profile::SpanKind::Task)
            .count();
        assert_eq!(tasks, prog.len(), "every task timed: {profile}");
        assert!(profile
            .spans
            .iter()
            .all(|s| s.end >= s.start && s.start >= 0.0));
        for s in profile.summary() {
            assert!((0.0..=1.0 + 1e-9).contains(&s.busy_fraction), "{profile}");
        }
        let trace = profile.to_chrome_json();
        let events = trace["traceEvents"].as_array().unwrap();
        assert!(events.iter().any(|e| e["ph"] == "s"), "dependency arrows");
        assert!(events.iter().any(|e| e["ph"] == "C"), "memory counters");
        // XPU_PROFILE's file is written at drop only while profiling: start again.
        sched.start_profiling().unwrap();
        sched
            .submit(Task::new(&add).read_write(handles[0]).read(handles[1]))
            .unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["ph"] == "X"));
    std::fs::remove_file(&path).unwrap();
}

// ----------------------------------------------------------------- collectives --

#[test]
fn collectives_are_tasks_ordered_by_their_handles() {
    use xpu_collectives::{CommOptions, Communicator, ReduceOp};
    use xpu_scheduler::CollectiveTask;
    for sel in ["host:0,1", "host:0;vulkan:0", "host:1;plugin.simnpu:0"] {
        let Some(devs) = devices(sel) else { continue };
        for policy in Policy::ALL {
            let sched = Scheduler::new(&devs, options(policy)).unwrap();
            let comm = Communicator::new(devs.clone(), CommOptions::default()).unwrap();
            let n = devs.len();
            let elems = 300;
            // Per rank: a gradient filled on its device, then all-reduced in place, then
            // halved by a task that must see the sum.
            let grads: Vec<_> = (0..n).map(|_| sched.create(elems * 4).unwrap()).collect();
            let halves: Vec<_> = (0..n).map(|_| sched.create(elems * 4).unwrap()).collect();
            for (r, g) in grads.iter().enumerate() {
                let fill = Codelet::from_builtin(Builtin::Fill {
                    value: Scalar::F32(r as f32 + 1.0),
                });
                sched
                    .submit(Task::new(&fill).write(*g).on(&devs[r]))
                    .unwrap();
            }
            sched
                .all_reduce(&comm, &grads, DType::F32, ReduceOp::Sum)
                .unwrap();
            let half = Codelet::from_builtin(Builtin::Scale {
                alpha: Scalar::F32(0.5),
            });
            for r in 0..n {
                sched
                    .submit(Task::new(&half).read(grads[r]).write(halves[r]))
                    .unwrap();
            }
            let sum: f32 = (1..=n).map(|r| r as f32).sum();
            for r in 0..n {
                assert_eq!(
                    sched.read(grads[r]).unwrap(),
                    bytes(&vec![sum; elems as usize]),
                    "{sel} {policy}"
                );
                assert_eq!(
                    sched.read(halves[r]).unwrap(),
                    bytes(&vec![sum / 2.0; elems as usize])
                );
            }
            // Reduce-scatter then all-gather: back to the full sum everywhere.
            let blocks: Vec<_> = (0..n)
                .map(|_| sched.create(elems * 4 / n as u64).unwrap())
                .collect();
            let full: Vec<_> = (0..n).map(|_| sched.create(elems * 4).unwrap()).collect();
            if (elems as usize).is_multiple_of(n) {
                sched
                    .collective(
                        &comm,
                        CollectiveTask::ReduceScatter {
                            dtype: DType::F32,
                            op: ReduceOp::Sum,
                        },
                        &grads,
                        &blocks,
                    )
                    .unwrap();
                sched
                    .collective(&comm, CollectiveTask::AllGather, &blocks, &full)
                    .unwrap();
                for f in &full {
                    assert_eq!(
                        sched.read(*f).unwrap(),
                        bytes(&vec![sum * n as f32; elems as usize])
                    );
                }
            }
            sched.wait_all().unwrap();
            // Bad input: the wrong number of handles, and mismatched sizes.
            let e = sched
                .all_reduce(&comm, &grads[..1], DType::F32, ReduceOp::Sum)
                .unwrap_err();
            assert!(e.to_string().contains("one of each per rank"), "{e}");
            let e = sched
                .collective(&comm, CollectiveTask::AllGather, &grads, &grads)
                .unwrap_err();
            assert!(e.to_string().contains("ranks × its send handle"), "{e}");
        }
    }
}

// ------------------------------------------------------------ record and replay --

#[test]
fn recorded_graphs_replay_like_resubmission_and_heft_plans_them() {
    for sel in ["host:0,1", "host:0;vulkan:0;plugin.simnpu:0"] {
        let Some(devs) = devices(sel) else { continue };
        for policy in Policy::ALL {
            let (init, prog) = program(31, 5, 25);
            // The program three times in order, on one host device.
            let tripled: Vec<Step> = prog.iter().chain(&prog).chain(&prog).copied().collect();
            let want = reference(&init, &tripled);
            let sched = Scheduler::new(&devs, options(policy)).unwrap();
            let handles: Vec<_> = register_all(&sched, &init);
            let graph = sched
                .record(|s| submit_program(s, &handles, &prog))
                .unwrap();
            assert_eq!(graph.len(), prog.len());
            sched.replay(&graph).unwrap();
            let (planned, makespan) = sched
                .plan(&graph, xpu_scheduler::sim::Policy::Heft)
                .unwrap();
            assert!(makespan.is_finite() && makespan >= 0.0);
            assert_eq!(planned.edges(), graph.edges());
            sched.replay(&planned).unwrap();
            sched.wait_all().unwrap();
            for (h, w) in handles.iter().zip(&want) {
                assert_eq!(&sched.read(*h).unwrap(), w, "{sel} {policy}");
            }
            // A graph needs its handles and its scheduler.
            let other = Scheduler::new(&devs, options(policy)).unwrap();
            let e = other.replay(&graph).unwrap_err();
            assert!(e.to_string().contains("another scheduler"), "{e}");
            sched.unregister(handles[0]).unwrap();
            let e = sched.replay(&graph).unwrap_err();
            assert!(e.to_string().contains("no longer registered"), "{e}");
        }
    }
}

/// A graph's consecutive tasks on one device replay as one task (a run): a failure
/// inside it fails the run, which says so and names the cause; its dependants fail;
/// waiting for any of its tasks waits for the run; a task ordered after one of them
/// runs after the run; and the next replay, with the cause gone, computes the values.
#[test]
fn a_replayed_run_fails_as_one_and_its_tasks_wait_and_order_as_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(devs) = devices("host:0") else {
        return;
    };
    for policy in Policy::ALL {
        let sched = Scheduler::new(&devs, options(policy)).unwrap();
        let (a, b, c) = (
            sched.create(4).unwrap(),
            sched.create(4).unwrap(),
            sched.create(4).unwrap(),
        );
        let broken = Arc::new(AtomicBool::new(false));
        let flag = broken.clone();
        let rw = KernelParam::Buffer(xpu_hal::Access::ReadWrite);
        let r = KernelParam::Buffer(xpu_hal::Access::Read);
        let w = KernelParam::Buffer(xpu_hal::Access::Write);
        // a += 1, failing while `broken`.
        let inc = Codelet::new("inc")
            .host(vec![rw], move |ctx| {
                if flag.load(Ordering::SeqCst) {
                    return Err("broken on purpose".into());
                }
                let x = ctx.bytes_mut(0)?;
                let v = f32::from_le_bytes(x[..4].try_into().unwrap()) + 1.0;
                x.copy_from_slice(&v.to_le_bytes());
                Ok(())
            })
            .build()
            .unwrap();
        // b = 2 × a.
        let double = Codelet::new("double")
            .host(vec![r, w], |ctx| {
                let v = f32::from_le_bytes(ctx.bytes(0)?[..4].try_into().unwrap());
                ctx.bytes_mut(1)?.copy_from_slice(&(2.0 * v).to_le_bytes());
                Ok(())
            })
            .build()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let fill = Codelet::from_builtin(Builtin::Fill {
            value: Scalar::F32(0.0),
        });
        let graph = sched
            .record(|s| {
                s.submit(Task::new(&fill).write(a).on(&devs[0]))?;
                s.submit(Task::new(&inc).read_write(a).on(&devs[0]))?;
                s.submit(Task::new(&inc).read_write(a).on(&devs[0]))?;
                s.submit(Task::new(&double).read(a).write(b).on(&devs[0]))?;
                Ok(())
            })
            .unwrap();
        sched.wait_all().unwrap();
        assert_eq!(sched.read(b).unwrap(), bytes(&[4.0]), "{policy}");

        // Waiting for a task inside the run waits for the run; a task ordered after
        // one of its tasks runs after all of it.
        let first = sched.replay(&graph).unwrap();
        let inner = xpu_scheduler::TaskId::from_index(first.index() + 2);
        let tail = sched
            .submit(Task::new(&logger(&log, 7, vec![w])).write(c).after(inner))
            .unwrap();
        sched.wait(inner).unwrap();
        sched.wait(tail).unwrap();
        assert_eq!(sched.read(b).unwrap(), bytes(&[4.0]), "{policy}");
        assert_eq!(*log.lock().unwrap(), [7]);

        // A failure inside the run.
        broken.store(true, Ordering::SeqCst);
        let first = sched.replay(&graph).unwrap();
        let e = sched.wait_all().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("replayed tasks"), "{policy}: {msg}");
        assert!(msg.contains("broken on purpose"), "{policy}: {msg}");
        for k in 0..4 {
            let e = sched
                .wait(xpu_scheduler::TaskId::from_index(first.index() + k))
                .unwrap_err();
            assert!(e.to_string().contains("replayed tasks"), "{policy}: {e}");
        }
        // What the run wrote has no value: a task reading it fails, naming the cause
        // (when submitted under `dmda`, when waited for under the queued policies).
        let e = sched
            .submit(Task::new(&double).read(b).write(c))
            .and_then(|t| sched.wait(t))
            .unwrap_err();
        assert!(e.to_string().contains("broken on purpose"), "{policy}: {e}");

        // Fixed: the next replay overwrites `a` first and computes again.
        broken.store(false, Ordering::SeqCst);
        sched.replay(&graph).unwrap();
        sched.wait_all().unwrap();
        assert_eq!(sched.read(b).unwrap(), bytes(&[4.0]), "{policy}");
    }
}

#[test]
fn a_training_step_with_an_all_reduce_records_and_replays() {
    use xpu_collectives::{CommOptions, Communicator, ReduceOp};
    let Some(devs) = devices("host:0,1") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let comm = Communicator::new(devs.clone(), CommOptions::default()).unwrap();
    let elems = 64usize;
    let grads: Vec<_> = (0..2)
        .map(|_| sched.create(elems as u64 * 4).unwrap())
        .collect();
    let weights: Vec<_> = (0..2)
        .map(|_| sched.create(elems as u64 * 4).unwrap())
        .collect();
    let step = |s: &Scheduler| -> xpu_hal::Result<()> {
        for r in 0..2 {
            let fill = Codelet::from_builtin(Builtin::Fill {
                value: Scalar::F32(r as f32 + 1.0),
            });
            s.submit(Task::new(&fill).write(grads[r]).on(&devs[r]))?;
        }
        s.all_reduce(&comm, &grads, DType::F32, ReduceOp::Sum)?;
        let sub = Codelet::from_builtin(Builtin::Accumulate {
            op: BinaryOp::Sum,
            dtype: DType::F32,
        });
        for r in 0..2 {
            s.submit(Task::new(&sub).read_write(weights[r]).read(grads[r]))?;
        }
        Ok(())
    };
    let graph = sched.record(step).unwrap();
    assert_eq!(graph.len(), 5);
    for _ in 0..3 {
        sched.replay(&graph).unwrap();
    }
    // Four steps, each adding 1 + 2 to every weight.
    for w in &weights {
        assert_eq!(sched.read(*w).unwrap(), bytes(&vec![12.0; elems]));
    }
}

/// A replay profiled by runs keeps its runs, one span each; one profiled task by task
/// splits them, a span per task; both compute the same values.
#[test]
fn a_replay_profiled_by_runs_keeps_them_and_one_profiled_by_tasks_splits_them() {
    use xpu_scheduler::profile::SpanKind;
    let Some(devs) = devices("host:0") else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let a = sched.create(64 * 4).unwrap();
    let b = sched.create(64 * 4).unwrap();
    let fill = Codelet::from_builtin(Builtin::Fill {
        value: Scalar::F32(1.0),
    });
    let add = Codelet::from_builtin(Builtin::Accumulate {
        op: BinaryOp::Sum,
        dtype: DType::F32,
    });
    let graph = sched
        .record(|s| {
            s.submit(Task::new(&fill).write(b))?;
            for _ in 0..4 {
                s.submit(Task::new(&add).read_write(a).read(b))?;
            }
            Ok(())
        })
        .unwrap();
    let tasks = |p: &xpu_scheduler::profile::Profile| -> Vec<String> {
        p.spans
            .iter()
            .filter(|s| s.kind == SpanKind::Task)
            .map(|s| s.name.clone())
            .collect()
    };
    sched.start_profiling_runs().unwrap();
    sched.replay(&graph).unwrap();
    let runs = tasks(&sched.stop_profiling().unwrap());
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].starts_with("run of 5 replayed tasks"), "{runs:?}");
    sched.start_profiling().unwrap();
    sched.replay(&graph).unwrap();
    let split = tasks(&sched.stop_profiling().unwrap());
    assert_eq!(split.len(), 5, "{split:?}");
    // The recording and both replays each added 4 × 1.
    assert_eq!(sched.read(a).unwrap().len(), 64 * 4);
    let got: Vec<f32> = sched
        .read(a)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(got.iter().all(|&v| v == 12.0), "{got:?}");
}
