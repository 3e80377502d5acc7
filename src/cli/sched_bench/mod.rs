//! `xpu bench scheduler`: Task Bench (Slaughter et al., SC'20) on the xpu scheduler.
//!
//! A graph of `steps` rows of at most `width` points ([`patterns`]) becomes one task per
//! `(step, point)`, submitted row by row in sequential task flow. Data is double-buffered
//! as in Task Bench's implementations: one 16-byte handle per point and step parity;
//! task `(s, p)` reads the handles of its dependencies (parity `s - 1`) and writes its
//! own (parity `s`), so the scheduler infers read-after-write edges for the pattern's
//! dependencies and write-after-read edges for the reuse of the buffers. (`trivial`
//! tasks touch no data.) Each task is a host function that busy-waits `--grain-us`
//! microseconds (spinning on [`Instant::now`]) and then writes `(step, point)` and a
//! checksum of them into its output; with `--check` it first verifies that each input
//! holds `(step - 1, dependency)` with a valid checksum, and every mismatch (a violated
//! dependency, a race on a buffer, a task run twice or never, a wrong final value) is
//! counted in `wrong`.
//!
//! The tasks are host functions, so every selected device must load host functions
//! (the host backend's devices); other devices are refused with the reason, rather than
//! measured with a builtin operation that could neither wait nor check.
//!
//! Timing: one untimed warm-up run of the whole graph (performance models calibrate,
//! buffers are first touched), then `--iterations` runs, each from the first submit to
//! the return of `wait_all`; the median is reported (and the best). `per_task_ns` is the
//! median wall time over the number of tasks, the scheduler's overhead per task at
//! grain 0. `efficiency` is Task Bench's: `tasks × grain / (wall × devices)`, the
//! useful share of the devices' time.
//!
//! METG(50%) (`--metg`): the smallest grain at which the efficiency is at least 50%.
//! The search starts at 1000 µs and halves the grain while the efficiency stays at or
//! above 50% (doubling it instead, up to 4 ms, if 1000 µs is already below), then
//! bisects geometrically [`BISECTIONS`] times between the last grain above and the first
//! below; each probe is a full measurement (warm-up and median of `--iterations` runs).
//! Beside the grain it reports Task Bench's own figure at that probe, the task
//! granularity `wall × devices / tasks` (at exactly 50% efficiency, twice the grain).

pub mod patterns;
pub mod placement;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use xpu::scheduler::{Codelet, Handle, Policy, Scheduler, SchedulerOptions, Task};
use xpu::{Access, Device, Error, KernelFormat, KernelParam, Result, Scalar};

use patterns::{mix, Graph, Kind, Pattern, MAX_EXTENT};

/// Bytes of each task's output: step (u32), point (u32), checksum (u64), little-endian.
const OUTPUT_BYTES: u64 = 16;
/// The widest graph the bench builds (two handles per point).
const MAX_WIDTH: u64 = 1 << 20;
/// Where the METG search starts, µs.
const METG_START_US: f64 = 1000.0;
/// The smallest grain the METG search tries, µs.
const METG_FLOOR_US: f64 = 1.0 / 16.0;
/// The largest grain the METG search tries, µs.
const METG_CEILING_US: f64 = 4_000.0;
/// Geometric bisections between the last grain above 50% and the first below.
pub const BISECTIONS: usize = 4;

/// The arguments of `xpu bench scheduler`.
#[derive(Args, Debug, Clone)]
pub struct SchedBenchArgs {
    /// The dependency pattern: trivial, no_comm, stencil_1d, stencil_1d_periodic, dom,
    /// tree, fft, all_to_all, nearest, spread, random_nearest (Task Bench's).
    #[arg(long, value_parser = parse_pattern)]
    pub pattern: Kind,
    /// Points per step (the graph's width).
    #[arg(long, value_parser = parse_width, allow_negative_numbers = true)]
    pub width: u64,
    /// Steps (the graph's height).
    #[arg(long, value_parser = parse_steps, allow_negative_numbers = true)]
    pub steps: u64,
    /// Microseconds each task busy-waits on its device (fractions allowed).
    #[arg(long = "grain-us", default_value = "0", value_parser = parse_grain, allow_negative_numbers = true, value_name = "US")]
    pub grain_us: f64,
    /// Devices to schedule on; host devices only (default: XPU_DEVICES, else host:*).
    #[arg(long)]
    pub devices: Option<String>,
    /// The placement policy: eager, ws, dmda or heft (default: XPU_SCHED, else dmda).
    #[arg(long)]
    pub policy: Option<String>,
    /// Verify in every task that each input holds what its dependency wrote, and the
    /// final values; mismatches are counted as `wrong` (exit code 1 if any).
    #[arg(long)]
    pub check: bool,
    /// Also search the smallest grain reaching 50% efficiency (METG(50%)).
    #[arg(long)]
    pub metg: bool,
    /// Also record the graph once and compare submitting it task by task with replaying
    /// the recording (`Scheduler::record` / `replay`), in alternating rounds.
    #[arg(long)]
    pub replay: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Timed runs of the graph per measurement, after one warm-up run (the median is
    /// reported).
    #[arg(long, default_value = "5", value_parser = parse_iterations, allow_negative_numbers = true)]
    pub iterations: u64,
    /// Neighbourhood of nearest and random_nearest, dependencies per point of spread.
    #[arg(long, default_value = "3", value_parser = parse_radix, allow_negative_numbers = true)]
    pub radix: u64,
    /// Steps after which spread and random_nearest repeat (at least 1).
    #[arg(long, default_value = "3", value_parser = parse_period, allow_negative_numbers = true)]
    pub period: u64,
    /// Probability that random_nearest keeps each neighbour (0 to 1).
    #[arg(long, default_value_t = 0.25)]
    pub fraction: f64,
    /// Seed of random_nearest.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub(crate) fn parse_pattern(s: &str) -> std::result::Result<Kind, String> {
    s.parse()
}

/// A whole number in `1..=max`, for `what`.
fn parse_count(s: &str, what: &str, max: u64) -> std::result::Result<u64, String> {
    let v: i128 = s
        .trim()
        .parse()
        .map_err(|_| format!("{what} must be a whole number, not `{s}`"))?;
    if v < 1 || v > i128::from(max) {
        return Err(format!("{what} must be between 1 and {max}, not {v}"));
    }
    Ok(v as u64)
}

pub(crate) fn parse_width(s: &str) -> std::result::Result<u64, String> {
    parse_count(s, "the width", MAX_WIDTH)
}

pub(crate) fn parse_steps(s: &str) -> std::result::Result<u64, String> {
    parse_count(s, "the number of steps", MAX_EXTENT)
}

fn parse_radix(s: &str) -> std::result::Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_count(s, "the radix", MAX_WIDTH)
        .map_err(|_| format!("the radix must be between 0 and {MAX_WIDTH}, not `{s}`"))
}

fn parse_period(s: &str) -> std::result::Result<u64, String> {
    parse_count(s, "the period", MAX_EXTENT)
}

pub(crate) fn parse_iterations(s: &str) -> std::result::Result<u64, String> {
    parse_count(s, "the number of iterations", 1_000_000)
}

fn parse_grain(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("the grain must be a number of microseconds, not `{s}`"))?;
    if !v.is_finite() || !(0.0..=1e7).contains(&v) {
        return Err(format!(
            "the grain must be between 0 and 10000000 microseconds (10 s), not {s}"
        ));
    }
    Ok(v)
}

/// The value a task `(step, point)` writes.
fn encode(out: &mut [u8], step: u64, point: u64) -> std::result::Result<(), String> {
    let out = out
        .get_mut(..OUTPUT_BYTES as usize)
        .ok_or("the output buffer is smaller than 16 bytes")?;
    out[..4].copy_from_slice(&(step as u32).to_le_bytes());
    out[4..8].copy_from_slice(&(point as u32).to_le_bytes());
    out[8..].copy_from_slice(&checksum(step, point).to_le_bytes());
    Ok(())
}

/// Whether `bytes` hold what task `(step, point)` writes.
fn encodes(bytes: &[u8], step: u64, point: u64) -> bool {
    let mut want = [0u8; OUTPUT_BYTES as usize];
    encode(&mut want, step, point).is_ok() && bytes.get(..want.len()) == Some(&want[..])
}

fn checksum(step: u64, point: u64) -> u64 {
    mix((step << 32) | point)
}

fn spin(grain: Duration) {
    if grain.is_zero() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < grain {
        std::hint::spin_loop();
    }
}

/// The task codelets of one grain: one per number of inputs, built on first use.
struct Codelets {
    grain: Duration,
    by_inputs: Vec<Option<Codelet>>,
}

/// One timed measurement of the graph at one grain.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    grain_us: f64,
    /// Median wall time of the timed runs, seconds.
    wall_s: f64,
    /// Best wall time, seconds.
    wall_best_s: f64,
    efficiency: f64,
    /// Task Bench's task granularity: wall × devices / tasks, µs.
    granularity_us: f64,
}

/// A graph's tasks and data on a scheduler.
struct Bench {
    sched: Scheduler,
    graph: Arc<Graph>,
    tasks: u64,
    /// Output handles by step parity and point (empty for `trivial`).
    handles: [Vec<Handle>; 2],
    check: bool,
    wrong: Arc<AtomicU64>,
    ran: Arc<AtomicU64>,
}

impl Bench {
    fn new(devices: &[Device], policy: Policy, graph: Graph, check: bool) -> Result<Bench> {
        let sched = Scheduler::new(
            devices,
            SchedulerOptions {
                policy,
                model_dir: None,
                no_persist: true,
                ..SchedulerOptions::default()
            },
        )?;
        let data = graph.pattern.kind != Kind::Trivial;
        let width = if data { graph.width } else { 0 };
        let mut handles = [Vec::new(), Vec::new()];
        for parity in &mut handles {
            for _ in 0..width {
                parity.push(sched.create(OUTPUT_BYTES)?);
            }
        }
        Ok(Bench {
            sched,
            tasks: graph.tasks(),
            graph: Arc::new(graph),
            handles,
            check,
            wrong: Arc::new(AtomicU64::new(0)),
            ran: Arc::new(AtomicU64::new(0)),
        })
    }

    fn has_data(&self) -> bool {
        !self.handles[0].is_empty()
    }

    /// The codelet for tasks with `inputs` inputs.
    fn codelet(&self, codelets: &mut Codelets, inputs: usize) -> Result<Codelet> {
        if codelets.by_inputs.len() <= inputs {
            codelets.by_inputs.resize(inputs + 1, None);
        }
        if let Some(c) = &codelets.by_inputs[inputs] {
            return Ok(c.clone());
        }
        let output = usize::from(self.has_data());
        let mut params = vec![KernelParam::Buffer(Access::Read); inputs];
        if output == 1 {
            params.push(KernelParam::Buffer(Access::Write));
        }
        params.push(KernelParam::Scalar(xpu::DType::I64));
        params.push(KernelParam::Scalar(xpu::DType::I64));
        let graph = self.graph.clone();
        let wrong = self.wrong.clone();
        let ran = self.ran.clone();
        let check = self.check;
        let grain = codelets.grain;
        let scalar = |ctx: &xpu::HostKernelContext<'_>, i: usize| match ctx.scalar(i)? {
            Scalar::I64(v) => u64::try_from(v).map_err(|_| format!("argument {i} is negative")),
            other => Err(format!("argument {i} is {other:?}, not an i64")),
        };
        // Named per grain, so that the performance models of different grains differ.
        let name = format!(
            "taskbench.{}.in{inputs}.{}ns",
            graph.pattern.kind,
            grain.as_nanos()
        );
        let codelet = Codelet::new(name)
            .host(params, move |ctx| {
                let step = scalar(ctx, inputs + output)?;
                let point = scalar(ctx, inputs + output + 1)?;
                spin(grain);
                if check {
                    ran.fetch_add(1, Ordering::Relaxed);
                    let want = graph.deps(step, point);
                    let mut bad = u64::from(want.len() != inputs);
                    for (i, dep) in want.iter().enumerate().take(inputs) {
                        if !encodes(ctx.bytes(i)?, step.wrapping_sub(1), *dep) {
                            bad += 1;
                        }
                    }
                    if bad > 0 {
                        wrong.fetch_add(bad, Ordering::Relaxed);
                    }
                }
                if output == 1 {
                    encode(ctx.bytes_mut(inputs)?, step, point)?;
                }
                Ok(())
            })
            .build()?;
        codelets.by_inputs[inputs] = Some(codelet.clone());
        Ok(codelet)
    }

    /// Submits every task of the graph, row by row.
    fn submit_graph(&self, codelets: &mut Codelets) -> Result<()> {
        let g = &*self.graph;
        for step in 0..g.steps {
            let (out, inp) = ((step % 2) as usize, ((step + 1) % 2) as usize);
            for point in g.points(step) {
                let deps = g.deps(step, point);
                let mut task = Task::new(&self.codelet(codelets, deps.len())?);
                if self.has_data() {
                    for d in deps {
                        task = task.read(self.handles[inp][d as usize]);
                    }
                    task = task.write(self.handles[out][point as usize]);
                }
                self.sched.submit(
                    task.scalar(Scalar::I64(step as i64))
                        .scalar(Scalar::I64(point as i64)),
                )?;
            }
        }
        Ok(())
    }

    /// Submits the whole graph and waits for it; returns the seconds from the first
    /// submit to the end of the wait.
    fn run_once(&self, codelets: &mut Codelets) -> Result<f64> {
        self.timed(|b| b.submit_graph(codelets))
            .map(|(_, wall)| wall)
    }

    /// Runs `submit` (which submits the whole graph one way or another), waits for the
    /// tasks and, with `--check`, counts what is wrong; returns the seconds `submit`
    /// took and the seconds to the end of the wait.
    fn timed(&self, submit: impl FnOnce(&Self) -> Result<()>) -> Result<(f64, f64)> {
        let g = &*self.graph;
        let ran_before = self.ran.load(Ordering::Relaxed);
        let start = Instant::now();
        submit(self)?;
        let submitted = start.elapsed().as_secs_f64();
        self.sched.wait_all()?;
        let wall = start.elapsed().as_secs_f64();
        if self.check {
            let ran = self.ran.load(Ordering::Relaxed) - ran_before;
            let mut bad = ran.abs_diff(self.tasks);
            // The last step's outputs.
            if self.has_data() {
                let last = g.steps - 1;
                let parity = (last % 2) as usize;
                for point in g.points(last) {
                    let bytes = self.sched.read(self.handles[parity][point as usize])?;
                    bad += u64::from(!encodes(&bytes, last, point));
                }
            }
            self.wrong.fetch_add(bad, Ordering::Relaxed);
        }
        Ok((submitted, wall))
    }

    /// `--replay`: the graph recorded once, then `iterations` rounds that each submit
    /// it task by task and replay the recording, alternately.
    fn replay(&self, grain_us: f64, iterations: u64) -> Result<ReplayReport> {
        let mut codelets = Codelets {
            grain: Duration::from_secs_f64(grain_us * 1e-6),
            by_inputs: Vec::with_capacity(self.graph.max_deps().min(64) as usize + 1),
        };
        self.run_once(&mut codelets)?;
        let mut recorded = None;
        self.timed(|b| {
            recorded = Some(b.sched.record(|_| b.submit_graph(&mut codelets))?);
            Ok(())
        })?;
        let graph = recorded.ok_or_else(|| Error::invalid("the recording returned nothing"))?;
        let rounds = iterations.max(1) as usize;
        let (mut submit, mut submit_wall) =
            (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        let (mut replay, mut replay_wall) =
            (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for _ in 0..rounds {
            let (s, w) = self.timed(|b| b.submit_graph(&mut codelets))?;
            submit.push(s);
            submit_wall.push(w);
            let (s, w) = self.timed(|b| b.sched.replay(&graph).map(|_| ()))?;
            replay.push(s);
            replay_wall.push(w);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (submit_s, replay_s) = (median(&mut submit), median(&mut replay));
        Ok(ReplayReport {
            rounds: rounds as u64,
            submit_s,
            replay_s,
            ratio: replay_s / submit_s,
            submit_wall_s: median(&mut submit_wall),
            replay_wall_s: median(&mut replay_wall),
        })
    }

    /// One warm-up run, then `iterations` timed runs at `grain_us`.
    fn measure(&self, grain_us: f64, iterations: u64) -> Result<Measured> {
        let mut codelets = Codelets {
            grain: Duration::from_secs_f64(grain_us * 1e-6),
            by_inputs: Vec::with_capacity(self.graph.max_deps().min(64) as usize + 1),
        };
        self.run_once(&mut codelets)?;
        let mut walls = Vec::with_capacity(iterations as usize);
        for _ in 0..iterations.max(1) {
            walls.push(self.run_once(&mut codelets)?);
        }
        walls.sort_by(f64::total_cmp);
        let wall_s = walls[walls.len() / 2];
        let devices = self.sched.devices().len() as f64;
        let tasks = self.tasks as f64;
        Ok(Measured {
            grain_us,
            wall_s,
            wall_best_s: walls[0],
            efficiency: if wall_s > 0.0 {
                tasks * grain_us * 1e-6 / (wall_s * devices)
            } else {
                0.0
            },
            granularity_us: wall_s * devices / tasks * 1e6,
        })
    }

    /// METG(50%) (see the module docs): the smallest passing probe, if any, and every
    /// probe in order.
    fn metg(&self, iterations: u64) -> Result<(Option<Measured>, Vec<Measured>)> {
        let mut probes = Vec::new();
        let mut probe = |grain: f64| -> Result<Measured> {
            let m = self.measure(grain, iterations)?;
            probes.push(m.clone());
            Ok(m)
        };
        let mut above: Option<Measured> = None;
        let mut below: Option<f64> = None;
        let mut g = METG_START_US;
        let first = probe(g)?;
        if first.efficiency >= 0.5 {
            above = Some(first);
            while g / 2.0 >= METG_FLOOR_US {
                g /= 2.0;
                let m = probe(g)?;
                if m.efficiency >= 0.5 {
                    above = Some(m);
                } else {
                    below = Some(g);
                    break;
                }
            }
        } else {
            below = Some(g);
            while g * 2.0 <= METG_CEILING_US {
                g *= 2.0;
                let m = probe(g)?;
                if m.efficiency >= 0.5 {
                    above = Some(m);
                    break;
                }
                below = Some(g);
            }
        }
        if let (Some(mut hi), Some(mut lo)) = (above.clone(), below) {
            for _ in 0..BISECTIONS {
                let mid = (hi.grain_us * lo).sqrt();
                let m = probe(mid)?;
                if m.efficiency >= 0.5 {
                    hi = m;
                } else {
                    lo = mid;
                }
            }
            above = Some(hi);
        }
        Ok((above, probes))
    }
}

/// What `xpu bench scheduler --json` prints.
#[derive(Debug, Serialize)]
struct Report {
    pattern: &'static str,
    width: u64,
    steps: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    radix: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<u64>,
    devices: Vec<String>,
    policy: &'static str,
    tasks: u64,
    edges: u64,
    /// FNV-1a digest of the graph (see [`Graph::edges_and_digest`]), hexadecimal.
    digest: String,
    grain_us: f64,
    iterations: u64,
    /// Which statistic `wall_s` is.
    wall_stat: &'static str,
    wall_s: f64,
    wall_best_s: f64,
    per_task_ns: f64,
    efficiency: f64,
    checked: bool,
    wrong: u64,
    /// Tasks the scheduler started on each device (in `devices` order), over every run
    /// (warm-ups and METG probes included).
    placed: Vec<u64>,
    /// Copies that brought a handle to a device, over every run.
    fetches: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    metg: Option<MetgReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replay: Option<ReplayReport>,
    /// METG(50%) in µs; null when no grain up to the ceiling reached 50%.
    #[serde(skip_serializing_if = "Option::is_none")]
    metg_us: Option<Option<f64>>,
}

/// What `--replay` measured (medians over the rounds).
#[derive(Debug, Serialize)]
struct ReplayReport {
    rounds: u64,
    /// Seconds from the first submit to the return of the last.
    submit_s: f64,
    /// Seconds the `replay` call took.
    replay_s: f64,
    /// `replay_s / submit_s`.
    ratio: f64,
    /// Seconds to the end of the wait after submitting.
    submit_wall_s: f64,
    /// Seconds to the end of the wait after replaying.
    replay_wall_s: f64,
}

#[derive(Debug, Serialize)]
struct MetgReport {
    /// The passing probe the search ended on.
    found: Option<Measured>,
    /// Every probe, in the order run.
    probes: Vec<Measured>,
    bisections: usize,
}

/// Runs `xpu bench scheduler` on `devices`; `Ok(false)` when `--check` found mismatches.
pub fn run(devices: Vec<Device>, args: &SchedBenchArgs) -> Result<bool> {
    if devices.is_empty() {
        return Err(Error::invalid(
            "no devices selected; pass --devices, e.g. host:0,1",
        ));
    }
    if let Some(d) = devices.iter().find(|d| {
        !d.capabilities()
            .supports_kernel_format(KernelFormat::HostFunction)
    }) {
        return Err(Error::invalid(format!(
            "xpu bench scheduler runs each task as a host function (the busy-wait of --grain-us and the --check verification run on the CPU), and {} cannot load host functions; select host devices, e.g. --devices host:0,1",
            d.id()
        )));
    }
    let policy = match &args.policy {
        Some(p) => p.parse()?,
        None => SchedulerOptions::from_env()?.policy,
    };
    let mut pattern = Pattern::new(args.pattern);
    pattern.radix = args.radix;
    pattern.period = args.period;
    pattern.fraction = args.fraction;
    pattern.seed = args.seed;
    let graph = Graph::new(pattern, args.width, args.steps).map_err(Error::invalid)?;
    let (edges, digest) = graph.edges_and_digest();
    let bench = Bench::new(&devices, policy, graph, args.check)?;
    let main = bench.measure(args.grain_us, args.iterations)?;
    let metg = if args.metg {
        Some(bench.metg(args.iterations)?)
    } else {
        None
    };
    let replay = if args.replay {
        Some(bench.replay(args.grain_us, args.iterations)?)
    } else {
        None
    };
    let wrong = bench.wrong.load(Ordering::Relaxed);
    let stats = bench.sched.stats();
    let kind = args.pattern;
    let uses_radix = matches!(kind, Kind::Nearest | Kind::Spread | Kind::RandomNearest);
    let report = Report {
        pattern: kind.name(),
        width: args.width,
        steps: args.steps,
        radix: uses_radix.then_some(args.radix),
        period: kind.needs_period().then_some(args.period),
        devices: devices.iter().map(|d| d.id().to_string()).collect(),
        policy: policy.name(),
        tasks: bench.tasks,
        edges,
        digest: format!("{digest:016x}"),
        grain_us: args.grain_us,
        iterations: args.iterations,
        wall_stat: "median",
        wall_s: main.wall_s,
        wall_best_s: main.wall_best_s,
        per_task_ns: main.wall_s / bench.tasks as f64 * 1e9,
        efficiency: main.efficiency,
        checked: args.check,
        wrong,
        placed: stats.placed,
        fetches: stats.fetches,
        metg_us: metg
            .as_ref()
            .map(|(found, _)| found.as_ref().map(|m| m.grain_us)),
        metg: metg.map(|(found, probes)| MetgReport {
            found,
            probes,
            bisections: BISECTIONS,
        }),
        replay,
    };
    if args.json {
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print_text(&report);
    }
    Ok(wrong == 0)
}

fn print_text(r: &Report) {
    let mut shape = format!("{}, width {}, steps {}", r.pattern, r.width, r.steps);
    if let Some(radix) = r.radix {
        shape.push_str(&format!(", radix {radix}"));
    }
    if let Some(period) = r.period {
        shape.push_str(&format!(", period {period}"));
    }
    println!(
        "xpu bench scheduler: {shape} on {} (policy {})",
        r.devices.join(", "),
        r.policy
    );
    println!(
        "tasks {}, edges {}, graph digest {}",
        r.tasks, r.edges, r.digest
    );
    let placed: Vec<String> = r
        .devices
        .iter()
        .zip(&r.placed)
        .map(|(d, n)| format!("{d} {n}"))
        .collect();
    println!(
        "tasks placed over all runs: {}; copies to devices: {}",
        placed.join(", "),
        r.fetches
    );
    println!(
        "grain {} us: wall {:.6} s (median of {} runs after a warm-up; best {:.6} s), {:.1} ns per task, efficiency {:.1}%",
        r.grain_us,
        r.wall_s,
        r.iterations,
        r.wall_best_s,
        r.per_task_ns,
        r.efficiency * 100.0
    );
    if let Some(m) = &r.metg {
        let probes: Vec<String> = m
            .probes
            .iter()
            .map(|p| format!("{:.3} us {:.1}%", p.grain_us, p.efficiency * 100.0))
            .collect();
        match &m.found {
            Some(f) => println!(
                "METG(50%): {:.3} us (task granularity {:.3} us at {:.1}% efficiency)",
                f.grain_us,
                f.granularity_us,
                f.efficiency * 100.0
            ),
            None => println!("METG(50%): not reached at grains up to {METG_CEILING_US} us"),
        }
        println!("  probes: {}", probes.join(", "));
    }
    if let Some(p) = &r.replay {
        println!(
            "replay: submitting the graph took {:.3} ms, replaying its recording {:.3} ms ({:.1}% of submitting; medians of {} alternating rounds); to the end of the wait {:.3} ms and {:.3} ms",
            p.submit_s * 1e3,
            p.replay_s * 1e3,
            p.ratio * 100.0,
            p.rounds,
            p.submit_wall_s * 1e3,
            p.replay_wall_s * 1e3
        );
    }
    let checked = if r.checked {
        "checked"
    } else {
        "not checked; pass --check"
    };
    println!("wrong {} ({checked})", r.wrong);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_encode_step_point_and_checksum() {
        let mut b = [0u8; 16];
        encode(&mut b, 7, 3).unwrap();
        assert!(encodes(&b, 7, 3));
        assert!(!encodes(&b, 6, 3));
        assert!(!encodes(&b, 7, 2));
        assert!(!encodes(&[0u8; 16], 0, 0));
        b[12] ^= 1;
        assert!(!encodes(&b, 7, 3));
        assert!(encode(&mut [0u8; 8], 0, 0).is_err());
    }

    #[test]
    fn bad_numbers_are_refused_with_the_reason() {
        assert_eq!(parse_width("8").unwrap(), 8);
        assert!(parse_width("0").unwrap_err().contains("between 1 and"));
        assert!(parse_width("-2").unwrap_err().contains("not -2"));
        assert!(parse_steps("x").unwrap_err().contains("whole number"));
        assert_eq!(parse_grain("2.5").unwrap(), 2.5);
        assert!(parse_grain("-1").unwrap_err().contains("between 0"));
        assert!(parse_grain("nan").is_err());
        assert_eq!(parse_radix("0").unwrap(), 0);
        assert!(parse_radix("-1").unwrap_err().contains("between 0 and"));
    }
}
