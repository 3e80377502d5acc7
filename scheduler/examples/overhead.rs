//! The scheduler's per-task costs on two host devices: submitting empty independent
//! tasks to completion, a chain through one handle, and recording a 10,000-task graph
//! then replaying it (the replay's submission time beside the first submission's).
//!
//! `cargo run --release -p xpu-scheduler --example overhead`

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Instant;

use xpu_hal::{Access, Device, DeviceId, KernelParam};
use xpu_host::{HostBackend, HostConfig};
use xpu_scheduler::{Codelet, Policy, Scheduler, SchedulerOptions, Task};

fn main() {
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
    let empty = Codelet::new("empty")
        .host(vec![], |_| Ok(()))
        .build()
        .unwrap();
    let touch = Codelet::new("touch")
        .host(vec![KernelParam::Buffer(Access::ReadWrite)], |_| Ok(()))
        .build()
        .unwrap();
    const N: u32 = 10_000;
    for policy in Policy::ALL {
        let options = SchedulerOptions {
            policy,
            no_persist: true,
            ..SchedulerOptions::default()
        };
        let sched = Scheduler::new(&devs, options).unwrap();
        // Warm up (kernels loaded, models calibrated).
        for _ in 0..1000 {
            sched.submit(Task::new(&empty)).unwrap();
        }
        sched.wait_all().unwrap();
        let t = Instant::now();
        for _ in 0..N {
            sched.submit(Task::new(&empty)).unwrap();
        }
        let submitted = t.elapsed();
        sched.wait_all().unwrap();
        let done = t.elapsed();
        let h = sched.create(64).unwrap();
        let t = Instant::now();
        let graph = sched
            .record(|s| {
                for _ in 0..N {
                    s.submit(Task::new(&touch).read_write(h))?;
                }
                Ok(())
            })
            .unwrap();
        let recorded = t.elapsed();
        sched.wait_all().unwrap();
        let t = Instant::now();
        sched.replay(&graph).unwrap();
        let replayed = t.elapsed();
        sched.wait_all().unwrap();
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / f64::from(N);
        println!(
            "{policy:>5}: empty tasks submit {:.3} µs, to completion {:.3} µs; chain of {N}: record {:.3} µs, replay {:.3} µs per task ({:.0}% of recording)",
            per(submitted),
            per(done),
            per(recorded),
            per(replayed),
            100.0 * replayed.as_secs_f64() / recorded.as_secs_f64()
        );
    }
}
