//! `xpu bench placement`: placement policies on devices that differ, with transfers.
//!
//! The same Task Bench dependency pattern as `xpu bench scheduler`, but every task is a
//! HAL builtin on `--kib` KiB of `f32`, so that every kind of device can run it (host
//! devices, Vulkan, plugins) and devices of different speeds compete for the work: a
//! task with dependencies adds the first and the last of its inputs (`Binary` sum), a
//! task with one scales it by ½, a task of the first step fills its output. Outputs are
//! double-buffered by step parity as in `xpu bench scheduler`, so each edge between
//! tasks on different devices is a copy the policy must account for.
//!
//! One scheduler per policy over the same devices: `eager` and `dmda` each run the
//! graph once to warm up (`dmda` learns its performance models and copy bandwidths),
//! then in alternating rounds, each timed from the first submit to the return of
//! `wait_all`. After the rounds the `dmda` scheduler records one run
//! ([`Scheduler::record`]), plans it with HEFT on its learned costs
//! ([`Scheduler::plan`]), and replays the plan in as many timed rounds: HEFT's
//! predicted makespan is reported beside what the replay measured. Every run's final
//! outputs must equal the first `eager` run's byte for byte (`wrong` counts those
//! that do not).

use std::time::Instant;

use clap::Args;
use serde::Serialize;
use xpu::scheduler::{sim, Builtin, Codelet, Handle, Policy, Scheduler, SchedulerOptions, Task};
use xpu::{BinaryOp, DType, Device, Error, Result, Scalar};

use super::patterns::{Graph, Kind, Pattern};
use super::{parse_iterations, parse_pattern, parse_steps, parse_width};

/// The largest `--kib` accepted (64 MiB per handle).
const MAX_KIB: u64 = 64 << 10;

/// The arguments of `xpu bench placement`.
#[derive(Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Devices to place on, of any backends (default: XPU_DEVICES, else host:0,1).
    #[arg(long)]
    pub devices: Option<String>,
    /// The dependency pattern (Task Bench's, as `xpu bench scheduler`).
    #[arg(long, default_value = "stencil_1d", value_parser = parse_pattern)]
    pub pattern: Kind,
    /// Points per step.
    #[arg(long, default_value = "4", value_parser = parse_width, allow_negative_numbers = true)]
    pub width: u64,
    /// Steps.
    #[arg(long, default_value = "40", value_parser = parse_steps, allow_negative_numbers = true)]
    pub steps: u64,
    /// KiB of `f32` each task reads per input and writes.
    #[arg(long, default_value = "1024", value_parser = parse_kib, allow_negative_numbers = true)]
    pub kib: u64,
    /// Timed rounds per policy, after one warm-up run each.
    #[arg(long, default_value = "3", value_parser = parse_iterations, allow_negative_numbers = true)]
    pub rounds: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_kib(s: &str) -> std::result::Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(k) if (1..=MAX_KIB).contains(&k) => Ok(k),
        _ => Err(format!(
            "`{s}` is not a size in KiB from 1 to {MAX_KIB}; e.g. --kib 1024"
        )),
    }
}

/// The report.
#[derive(Debug, Serialize)]
struct Report {
    pattern: &'static str,
    width: u64,
    steps: u64,
    kib: u64,
    devices: Vec<String>,
    tasks: u64,
    rounds: u64,
    /// Median wall time per policy, seconds.
    eager_s: f64,
    dmda_s: f64,
    /// `eager_s / dmda_s`.
    dmda_speedup: f64,
    /// HEFT's makespan predicted from dmda's learned costs, and the median replay of
    /// its placement.
    heft_predicted_s: f64,
    heft_replayed_s: f64,
    /// `dmda_s / heft_predicted_s`.
    dmda_over_heft: f64,
    /// Tasks run per device in the last timed round of each policy.
    eager_placed: Vec<u64>,
    dmda_placed: Vec<u64>,
    heft_placed: Vec<u64>,
    wrong: u64,
}

/// The graph's data and codelets on one scheduler.
struct Run {
    sched: Scheduler,
    handles: [Vec<Handle>; 2],
}

impl Run {
    fn new(devices: &[Device], policy: Policy, graph: &Graph, bytes: u64) -> Result<Run> {
        let sched = Scheduler::new(
            devices,
            SchedulerOptions {
                policy,
                no_persist: true,
                ..SchedulerOptions::default()
            },
        )?;
        let mut handles = [Vec::new(), Vec::new()];
        for parity in &mut handles {
            for _ in 0..graph.width {
                parity.push(sched.create(bytes)?);
            }
        }
        Ok(Run { sched, handles })
    }

    /// Submits the graph on `sched` (also used inside a recording).
    fn submit(&self, sched: &Scheduler, graph: &Graph) -> Result<()> {
        let sum = Codelet::from_builtin(Builtin::Binary {
            op: BinaryOp::Sum,
            dtype: DType::F32,
        });
        let half = Codelet::from_builtin(Builtin::Scale {
            alpha: Scalar::F32(0.5),
        });
        for step in 0..graph.steps {
            let (out, inp) = ((step % 2) as usize, ((step + 1) % 2) as usize);
            for point in graph.points(step) {
                let deps = graph.deps(step, point);
                let dst = self.handles[out][point as usize];
                let task = match (deps.first(), deps.last()) {
                    (Some(&a), Some(&b)) if a != b => Task::new(&sum)
                        .read(self.handles[inp][a as usize])
                        .read(self.handles[inp][b as usize])
                        .write(dst),
                    (Some(&a), _) => Task::new(&half)
                        .read(self.handles[inp][a as usize])
                        .write(dst),
                    _ => Task::new(&Codelet::from_builtin(Builtin::Fill {
                        value: Scalar::F32(point as f32 + 1.0),
                    }))
                    .write(dst),
                };
                sched.submit(task)?;
            }
        }
        Ok(())
    }

    /// One timed run; returns its seconds.
    fn time(&self, graph: &Graph) -> Result<f64> {
        let start = Instant::now();
        self.submit(&self.sched, graph)?;
        self.sched.wait_all()?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// The last step's outputs.
    fn outputs(&self, graph: &Graph) -> Result<Vec<Vec<u8>>> {
        let last = graph.steps - 1;
        graph
            .points(last)
            .map(|p| {
                self.sched
                    .read(self.handles[(last % 2) as usize][p as usize])
            })
            .collect()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn placed_since(before: &[u64], after: &[u64]) -> Vec<u64> {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect()
}

/// Runs `xpu bench placement`; `Ok(false)` when a run's outputs differed.
pub fn run(devices: Vec<Device>, args: &PlacementArgs) -> Result<bool> {
    if devices.len() < 2 {
        return Err(Error::invalid(
            "placement needs at least two devices to choose between; e.g. --devices \"host:0;plugin.simnpu:0;vulkan:0\"",
        ));
    }
    let graph =
        Graph::new(Pattern::new(args.pattern), args.width, args.steps).map_err(Error::invalid)?;
    let bytes = args.kib * 1024;
    let eager = Run::new(&devices, Policy::Eager, &graph, bytes)?;
    let dmda = Run::new(&devices, Policy::Dmda, &graph, bytes)?;
    // Warm-up (dmda learns), and the reference outputs.
    eager.time(&graph)?;
    let reference = eager.outputs(&graph)?;
    dmda.time(&graph)?;
    let mut wrong = 0u64;
    let mut check = |run: &Run| -> Result<()> {
        let got = run.outputs(&graph)?;
        wrong += got.iter().zip(&reference).filter(|(g, r)| g != r).count() as u64;
        Ok(())
    };
    check(&dmda)?;
    let (mut te, mut td) = (Vec::new(), Vec::new());
    let (mut eager_placed, mut dmda_placed) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let before = eager.sched.stats().placed;
        te.push(eager.time(&graph)?);
        eager_placed = placed_since(&before, &eager.sched.stats().placed);
        check(&eager)?;
        let before = dmda.sched.stats().placed;
        td.push(dmda.time(&graph)?);
        dmda_placed = placed_since(&before, &dmda.sched.stats().placed);
        check(&dmda)?;
    }
    // HEFT on what dmda learned, replayed.
    let recorded = dmda.sched.record(|s| dmda.submit(s, &graph))?;
    dmda.sched.wait_all()?;
    let (planned, predicted) = dmda.sched.plan(&recorded, sim::Policy::Heft)?;
    let mut th = Vec::new();
    let mut heft_placed = Vec::new();
    for _ in 0..args.rounds {
        let before = dmda.sched.stats().placed;
        let start = Instant::now();
        dmda.sched.replay(&planned)?;
        dmda.sched.wait_all()?;
        th.push(start.elapsed().as_secs_f64());
        heft_placed = placed_since(&before, &dmda.sched.stats().placed);
        check(&dmda)?;
    }
    let (eager_s, dmda_s) = (median(te), median(td));
    let report = Report {
        pattern: args.pattern.name(),
        width: args.width,
        steps: args.steps,
        kib: args.kib,
        devices: devices.iter().map(|d| d.id().to_string()).collect(),
        tasks: graph.tasks(),
        rounds: args.rounds,
        eager_s,
        dmda_s,
        dmda_speedup: eager_s / dmda_s,
        heft_predicted_s: predicted,
        heft_replayed_s: median(th),
        dmda_over_heft: dmda_s / predicted,
        eager_placed,
        dmda_placed,
        heft_placed,
        wrong,
    };
    if args.json {
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        println!(
            "{}, width {}, steps {} ({} tasks), {} KiB per handle, on {}",
            report.pattern,
            report.width,
            report.steps,
            report.tasks,
            report.kib,
            report.devices.join(", ")
        );
        println!(
            "medians of {} alternating rounds after a warm-up; tasks per device in the last round",
            report.rounds
        );
        println!(
            "  eager          {:>9.2} ms  {:?}",
            eager_s * 1e3,
            report.eager_placed
        );
        println!(
            "  dmda           {:>9.2} ms  {:?}  ({:.2}x eager)",
            dmda_s * 1e3,
            report.dmda_placed,
            report.dmda_speedup
        );
        println!(
            "  heft predicted {:>9.2} ms  (dmda / heft = {:.2})",
            predicted * 1e3,
            report.dmda_over_heft
        );
        println!(
            "  heft replayed  {:>9.2} ms  {:?}",
            report.heft_replayed_s * 1e3,
            report.heft_placed
        );
        println!("wrong {wrong}");
    }
    Ok(wrong == 0)
}
