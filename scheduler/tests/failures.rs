//! Failures and lost devices: a failed task fails the tasks that depend on it and no
//! others, also those queued behind it on the same stream; a device lost mid-run is
//! dropped and its work placed elsewhere, and only what needed its data fails. Checked
//! on host devices and on the sim-npu plugin with its fault injection
//! (`XPU_SIMNPU_LOSE_AFTER`), under every policy, against a sequential run of the tasks
//! that should succeed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex, OnceLock};

use xpu_hal::{Access, DType, Device, DeviceSelector, KernelParam, Registry, Scalar};
use xpu_host::{HostBackend, HostConfig};
use xpu_scheduler::{Builtin, Codelet, Handle, Policy, Scheduler, Task};

mod common;
use common::{
    bytes, options, program, reference, register_all, sim_npu, submit_program, Rng, Step,
};

/// Device 0 of the sim-npu plugin is lost after this many operations.
const LOSE_AFTER: u64 = 40;

/// Operations the NPU has left when a test spends the rest of [`LOSE_AFTER`] up front:
/// fewer than the copies and tasks of the smallest share a policy gives it, even on a
/// loaded machine (runs have seen dmda give it as few as 5 tasks and 3 copies), so that
/// it is lost with work queued on it.
const SPARE_OPS: u64 = 2;

/// Host devices, and one sim-npu device that is lost after [`LOSE_AFTER`] operations
/// (set before the plugin reads its configuration, once per process).
fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        std::env::set_var("XPU_SIMNPU_DEVICES", "1");
        std::env::set_var("XPU_SIMNPU_LOSE_AFTER", format!("0:{LOSE_AFTER}"));
        let mut r = Registry::new();
        r.register(Arc::new(HostBackend::new(HostConfig {
            devices: 3,
            capacity: 256 << 20,
        })))
        .unwrap();
        Mutex::new(r)
    })
}

fn host(sel: &str) -> Vec<Device> {
    registry()
        .lock()
        .unwrap()
        .devices(&DeviceSelector::parse(sel).unwrap())
        .unwrap()
}

/// A fresh sim-npu device (each load of the plugin is a new device with its own
/// operation count), with `host:0`; `None` when the plugin was not built and is not
/// required.
fn host_and_doomed_npu() -> Option<Vec<Device>> {
    registry();
    let Some(lib) = sim_npu() else {
        assert!(
            !common::is_required("plugin.simnpu"),
            "the sim-npu plugin is required but was not built"
        );
        eprintln!("skipped: the sim-npu plugin was not built");
        return None;
    };
    let plugin = xpu_plugin::PluginBackend::load(&lib).unwrap();
    let mut r = Registry::new();
    r.register(Arc::new(plugin)).unwrap();
    let mut devices = host("host:0");
    devices.extend(
        r.devices(&DeviceSelector::parse("plugin.simnpu:0").unwrap())
            .unwrap(),
    );
    Some(devices)
}

/// A codelet whose host implementation fails, reading its first buffer and writing
/// its second.
fn failing() -> Codelet {
    Codelet::new("fails")
        .host(
            vec![
                KernelParam::Buffer(Access::Read),
                KernelParam::Buffer(Access::Write),
            ],
            |_| Err("this codelet fails on purpose".to_string()),
        )
        .build()
        .unwrap()
}

fn fill(v: f32) -> Codelet {
    Codelet::from_builtin(Builtin::Fill {
        value: Scalar::F32(v),
    })
}

fn f32s(v: f32, n: usize) -> Vec<u8> {
    bytes(&vec![v; n])
}

#[test]
fn a_failed_task_fails_its_dependants_and_no_other_task() {
    for sel in ["host:0", "host:0,1"] {
        let devs = host(sel);
        for policy in Policy::ALL {
            let sched = Scheduler::new(&devs, options(policy)).unwrap();
            let n = 64;
            let a = sched.create(4 * n as u64).unwrap();
            let b = sched.create(4 * n as u64).unwrap();
            let c = sched.create(4 * n as u64).unwrap();
            let d = sched.create(4 * n as u64).unwrap();
            let doomed = sched
                .submit(Task::new(&failing()).read(a).write(b).named("doomed"))
                .unwrap();
            // Independent, and queued behind the failure on the same stream.
            sched.submit(Task::new(&fill(2.0)).write(c)).unwrap();
            // Depends on the failure.
            let dependant = sched.submit(
                Task::new(&Codelet::from_builtin(Builtin::Scale {
                    alpha: Scalar::F32(3.0),
                }))
                .read(b)
                .write(d)
                .named("dependant"),
            );
            // Independent again, after the dependant.
            sched
                .submit(
                    Task::new(&Codelet::from_builtin(Builtin::Accumulate {
                        op: xpu_hal::BinaryOp::Sum,
                        dtype: DType::F32,
                    }))
                    .read_write(c)
                    .read(a),
                )
                .unwrap();
            sched.submit(Task::new(&fill(7.0)).write(a)).unwrap();
            let e = sched.wait_all().unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("fails on purpose") && msg.contains("doomed") && msg.contains("host:"),
                "{sel} {policy}: the error names the task, its device and the cause: {msg}"
            );
            // Reported once.
            sched.wait_all().unwrap();
            let e = sched.wait(doomed).unwrap_err();
            assert!(e.to_string().contains("fails on purpose"), "{e}");
            // The dependant failed naming the failed task (at submission, when the
            // failure was already known, or when waited for).
            let why = match dependant {
                Err(e) => e.to_string(),
                Ok(t) => sched.wait(t).unwrap_err().to_string(),
            };
            assert!(
                why.contains(&format!("{b}, which has no value: {doomed}"))
                    && why.contains("fails on purpose"),
                "{sel} {policy}: {why}"
            );
            // The independent tasks ran, in order, also the one that only had to wait for
            // the failed task (it overwrites what that one read).
            assert_eq!(sched.read(c).unwrap(), f32s(2.0, n), "{sel} {policy}");
            assert_eq!(sched.read(a).unwrap(), f32s(7.0, n), "{sel} {policy}");
            // What the failed tasks write has no value.
            for h in [b, d] {
                let e = sched.read(h).unwrap_err();
                assert!(e.to_string().contains("has no value"), "{e}");
            }
            // The scheduler goes on.
            sched.submit(Task::new(&fill(1.0)).write(c)).unwrap();
            sched.wait_all().unwrap();
            assert_eq!(sched.read(c).unwrap(), f32s(1.0, n));
        }
    }
}

/// A step's accesses: handle, (reads, writes).
type Access2 = Vec<(usize, (bool, bool))>;

fn accesses(step: &Step) -> Access2 {
    match *step {
        Step::Binary(_, a, b, c) => {
            vec![(a, (true, false)), (b, (true, false)), (c, (false, true))]
        }
        Step::Accumulate(_, d, s, _) => vec![(d, (true, true)), (s, (true, false))],
        Step::Half(s, d) => vec![(s, (true, false)), (d, (false, true))],
        Step::Fill(d, _) => vec![(d, (false, true))],
    }
}

/// The accesses of a failing stand-in for `step`: the same handles, the written ones
/// read-written.
fn fail_accesses(step: &Step) -> Access2 {
    accesses(step)
        .into_iter()
        .map(|(h, (r, w))| (h, (r || w, w)))
        .collect()
}

#[test]
fn random_programs_with_failing_tasks_match_a_sequential_run_of_the_rest() {
    let base: u64 = std::env::var("XPU_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for sel in ["host:0", "host:0,1,2"] {
        let devs = host(sel);
        for policy in Policy::ALL {
            for round in 0..3u64 {
                let seed = base ^ (77 + 10 * round + policy as u64 + sel.len() as u64 * 1000);
                let (init, prog) = program(seed, 6, 40);
                // Some steps fail instead (reading and writing what they would).
                let mut rng = Rng(seed | 1);
                let fails: Vec<bool> = (0..prog.len()).map(|_| rng.below(8) == 0).collect();
                // Which tasks fail: those that do, and those that read a handle whose
                // last writer failed (a task that only overwrites it gives it a value
                // again).
                let access = |t: usize| {
                    if fails[t] {
                        fail_accesses(&prog[t])
                    } else {
                        accesses(&prog[t])
                    }
                };
                let mut failed = vec![false; prog.len()];
                let mut poisoned = vec![false; init.len()];
                for t in 0..prog.len() {
                    let acc = access(t);
                    failed[t] = fails[t] || acc.iter().any(|(h, m)| m.0 && poisoned[*h]);
                    for (h, m) in &acc {
                        if m.1 {
                            poisoned[*h] = failed[t];
                        }
                    }
                }
                let survivors: Vec<Step> = prog
                    .iter()
                    .zip(&failed)
                    .filter(|(_, f)| !**f)
                    .map(|(s, _)| *s)
                    .collect();
                let want = reference(&init, &survivors);
                let sched = Scheduler::new(&devs, options(policy)).unwrap();
                let handles: Vec<Handle> = register_all(&sched, &init);
                for (step, fail) in prog.iter().zip(&fails) {
                    let outcome = if *fail {
                        // The same handles, read or read-written, by a codelet that fails.
                        let acc = fail_accesses(step);
                        let params = acc
                            .iter()
                            .map(|(_, m)| {
                                KernelParam::Buffer(if m.1 {
                                    Access::ReadWrite
                                } else {
                                    Access::Read
                                })
                            })
                            .collect();
                        let codelet = Codelet::new("fails")
                            .host(params, |_| Err("this codelet fails on purpose".to_string()))
                            .build()
                            .unwrap();
                        let task = acc.iter().fold(Task::new(&codelet), |t, (h, m)| {
                            if m.1 {
                                t.read_write(handles[*h])
                            } else {
                                t.read(handles[*h])
                            }
                        });
                        sched.submit(task).map(|_| ())
                    } else {
                        submit_program(&sched, &handles, std::slice::from_ref(step))
                    };
                    // A dependant of a failure already known is refused at submission.
                    if let Err(e) = outcome {
                        assert!(e.to_string().contains("which has no value"), "{e}");
                    }
                }
                let first = sched.wait_all();
                assert_eq!(
                    first.is_err(),
                    fails.iter().any(|f| *f),
                    "{sel} {policy} seed {seed}: {first:?}"
                );
                for (h, handle) in handles.iter().enumerate() {
                    let got = sched.read(*handle);
                    if poisoned[h] {
                        assert!(
                            got.is_err(),
                            "{sel} {policy}, seed {seed} (XPU_TEST_SEED={base}): handle {h} was written by a failed task, yet read\n{prog:?}\nfails {fails:?}\nfailed {failed:?}\n{}",
                            (0..prog.len() as u64).map(|t| format!("{t}: {:?}", sched.wait(xpu_scheduler::TaskId::from_index(t)).err())).collect::<Vec<_>>().join("\n")
                        );
                    } else {
                        assert!(
                            got.as_ref().is_ok_and(|g| *g == want[h]),
                            "{sel} {policy}, seed {seed} (XPU_TEST_SEED={base}): handle {h} differs from a sequential run of the tasks that did not fail ({:?})\n{prog:?}\nfails {fails:?}\nfailed {failed:?}\nwant {:?}\n{}",
                            got.as_ref().map(|g| g[..8].to_vec()),
                            &want[h][..8],
                            (0..prog.len() as u64).map(|t| format!("{t}: {:?}", sched.wait(xpu_scheduler::TaskId::from_index(t)).err().map(|e| e.to_string().chars().take(150).collect::<String>()))).collect::<Vec<_>>().join("\n")
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_lost_device_is_dropped_and_only_what_needed_its_data_fails() {
    let Some(devs) = host_and_doomed_npu() else {
        return;
    };
    let sched = Scheduler::new(&devs, options(Policy::Dmda)).unwrap();
    let npu = &devs[1];
    let n = 256u64;
    // Written on the NPU only: its one copy will go with it.
    let only_there = sched.create(4 * n).unwrap();
    sched
        .submit(Task::new(&fill(3.0)).write(only_there).on(npu))
        .unwrap();
    sched.wait_all().unwrap();
    // Also on the host: survives.
    let both = sched.create(4 * n).unwrap();
    sched
        .submit(Task::new(&fill(4.0)).write(both).on(npu))
        .unwrap();
    assert_eq!(sched.read(both).unwrap(), f32s(4.0, n as usize));
    // Burn the NPU's remaining operations on tasks pinned there, until it is lost.
    let scratch = sched.create(4 * n).unwrap();
    let mut lost_at = None;
    for k in 0..2 * LOSE_AFTER {
        match sched.submit(Task::new(&fill(k as f32)).write(scratch).on(npu)) {
            Ok(_) => {}
            Err(e) => {
                lost_at = Some(e.to_string());
                break;
            }
        }
        if let Err(e) = sched.wait_all() {
            assert!(e.to_string().contains("lost"), "{e}");
        }
    }
    let why = lost_at.expect("the NPU was never lost");
    assert!(
        why.contains("plugin.simnpu:0") && why.contains("lost"),
        "{why}"
    );
    // Its one copy went with it: tasks that need it fail naming the handle.
    let use_it = sched
        .submit(
            Task::new(&Codelet::from_builtin(Builtin::Scale {
                alpha: Scalar::F32(2.0),
            }))
            .read(only_there)
            .write(scratch),
        )
        .and_then(|t| sched.wait(t));
    let e = use_it.unwrap_err().to_string();
    assert!(
        e.contains(&only_there.to_string()) && e.contains("lost"),
        "{e}"
    );
    let e = sched.read(only_there).unwrap_err().to_string();
    assert!(e.contains("lost"), "{e}");
    let _ = sched.wait_all();
    // Data that also lived elsewhere is still there; new work goes to the host.
    assert_eq!(sched.read(both).unwrap(), f32s(4.0, n as usize));
    let t = sched
        .submit(
            Task::new(&Codelet::from_builtin(Builtin::Scale {
                alpha: Scalar::F32(0.5),
            }))
            .read(both)
            .write(scratch),
        )
        .unwrap();
    sched.wait(t).unwrap();
    assert_eq!(sched.read(scratch).unwrap(), f32s(2.0, n as usize));
    // Writing the lost handle anew gives it a value again.
    sched
        .submit(Task::new(&fill(5.0)).write(only_there))
        .unwrap();
    assert_eq!(sched.read(only_there).unwrap(), f32s(5.0, n as usize));
    let before = sched.stats().placed[1];
    sched.wait_all().unwrap();
    assert_eq!(
        sched.stats().placed[1],
        before,
        "nothing more runs on a lost device"
    );
}

#[test]
fn work_in_flight_on_a_lost_device_is_placed_again_with_the_same_results() {
    let base: u64 = std::env::var("XPU_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for policy in Policy::ALL {
        let Some(devs) = host_and_doomed_npu() else {
            return;
        };
        // Inputs that stay valid at home; outputs each written once, from two inputs.
        // Large enough that every policy gives the NPU a share.
        let seed = base ^ (5 + policy as u64);
        let mut rng = Rng(seed | 1);
        let init: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..1 << 16).map(|_| rng.below(1000) as f32 / 8.0).collect())
            .collect();
        let ops = [
            xpu_hal::BinaryOp::Sum,
            xpu_hal::BinaryOp::Max,
            xpu_hal::BinaryOp::Min,
        ];
        let prog: Vec<Step> = (0..6 * LOSE_AFTER as usize)
            .map(|k| {
                let a = rng.below(4);
                let b = (a + 1 + rng.below(3)) % 4;
                Step::Binary(ops[rng.below(3)], a, b, 4 + k)
            })
            .collect();
        let mut all = init.clone();
        all.extend((0..prog.len()).map(|_| vec![0.0; init[0].len()]));
        let want = reference(&all, &prog);
        // Spend part of the NPU's operations first, so that it is lost within the share
        // any policy gives it: the dynamic policies' share depends on timing, and on a
        // loaded machine it can be smaller than the whole budget.
        {
            let npu = &devs[1];
            let stream = npu.create_stream().unwrap();
            let buf = npu.allocate(64).unwrap();
            for _ in 0..LOSE_AFTER - SPARE_OPS {
                stream.fill(&buf, Scalar::F32(0.0)).unwrap();
            }
            stream.synchronize().unwrap();
        }
        let sched = Scheduler::new(&devs, options(policy)).unwrap();
        let handles: Vec<Handle> = register_all(&sched, &all);
        submit_program(&sched, &handles, &prog).unwrap();
        let outcome = sched.wait_all();
        let stats = sched.stats();
        assert!(
            stats.placed[1] > 0,
            "{policy}: nothing ran on the NPU: {stats:?}"
        );
        assert!(
            stats.retried > 0,
            "{policy}: nothing was placed again: {stats:?} {outcome:?}"
        );
        for (h, handle) in handles.iter().enumerate() {
            // An output computed on the NPU before it was lost went with it; every
            // other value is the sequential one. (An input whose copy to the NPU was
            // under way when it was lost stays lent to it: a device lost this way may
            // still read it, so the plugin host never takes it back, and reading it is
            // refused as busy rather than racing the device.)
            match sched.read(*handle) {
                Ok(got) => assert!(
                    got == want[h],
                    "{policy}, seed {seed} (XPU_TEST_SEED={base}): handle {h} differs from the sequential run ({outcome:?})"
                ),
                Err(e) => assert!(
                    (h >= 4 && e.to_string().contains("was lost"))
                        || (h < 4 && e.to_string().contains("still used by")),
                    "{policy}: handle {h}: {e}"
                ),
            }
        }
    }
}

/// A collective skipped because work before it on a rank's stream failed leaves what it
/// was to write without a value: a task reading it fails, naming the cause, instead of
/// reading the value from before.
#[test]
fn a_collective_skipped_behind_a_failure_leaves_its_outputs_without_value() {
    use xpu_collectives::{CommOptions, Communicator, ReduceOp};
    let devs = host("host:0,1");
    for (policy, busy_peer) in Policy::ALL
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        let sched = Scheduler::new(&devs, options(policy)).unwrap();
        let comm = Communicator::new(devs.clone(), CommOptions::default()).unwrap();
        let n = 16;
        let grads: Vec<Handle> = (0..2)
            .map(|r| {
                sched
                    .register(xpu_hal::HostBuffer::from_bytes(&f32s(r as f32 + 1.0, n)).unwrap())
                    .unwrap()
            })
            .collect();
        let (x, y, z) = (
            sched.create(4).unwrap(),
            sched.create(4).unwrap(),
            sched.create(4).unwrap(),
        );
        // Fails after a pause on device 0's stream, with the all-reduce queued behind it.
        let slow_failure = Codelet::new("slow_failure")
            .host(
                vec![
                    KernelParam::Buffer(Access::Read),
                    KernelParam::Buffer(Access::Write),
                ],
                |_| {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    Err("failed on purpose after a pause".to_string())
                },
            )
            .build()
            .unwrap();
        let _ = sched.submit(Task::new(&slow_failure).read(x).write(y).on(&devs[0]));
        if busy_peer {
            // Device 1 busy too: both parts are queued on the streams, and rank 1's
            // learns of rank 0's skip where it runs.
            let slow = Codelet::new("slow")
                .host(vec![KernelParam::Buffer(Access::Write)], |_| {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    Ok(())
                })
                .build()
                .unwrap();
            sched
                .submit(Task::new(&slow).write(z).on(&devs[1]))
                .unwrap();
        }
        let reduced = sched.all_reduce(&comm, &grads, DType::F32, ReduceOp::Sum);
        if let Err(e) = &reduced {
            // Refused at once: a rank that ran its part found the other's skipped.
            assert!(
                e.to_string().contains("skipped it"),
                "{policy} {busy_peer}: {e}"
            );
        }
        let copy = Codelet::from_builtin(Builtin::Scale {
            alpha: Scalar::F32(1.0),
        });
        let out = sched.create((n * 4) as u64).unwrap();
        let reader = sched.submit(Task::new(&copy).read(grads[0]).write(out).on(&devs[0]));
        let _ = sched.wait_all();
        // Either the all-reduce ran (3 everywhere) or what reads its output fails,
        // saying why.
        match reader.and_then(|t| sched.wait(t)) {
            Ok(()) => assert_eq!(
                sched.read(out).unwrap(),
                f32s(3.0, n),
                "{policy} {busy_peer}"
            ),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("no value"), "{policy} {busy_peer}: {msg}");
                assert!(
                    msg.contains("failed on purpose") || msg.contains("skipped it"),
                    "{policy} {busy_peer}: {msg}"
                );
            }
        }
    }
}
