//! `xpu train`: data-parallel training of a model over the selected devices, with a
//! progress bar, lines or JSON objects while it runs and a summary at the end; a
//! device that fails is dropped and the run continues from the last checkpoint.
//!
//! - `compare`: `--compare-with SEL`.
//! - `faults`: `--inject-fault DEVICE@STEP`.
//! - `output`: the progress bar, the lines and JSON objects, the timeline.
//! - `plot`: `--plot FILE.svg`.

mod compare;
mod faults;
mod output;
mod plot;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde_json::json;
use xpu::{Device, Registry, Result};
use xpu_train::checkpoint::{Checkpoint, Writer};
use xpu_train::elastic;
use xpu_train::{unsupported_op, Precision, TrainConfig, Trainer};

use output::{busy, is_all_reduce, peak_memory, Logged, Reporter, Timeline};

/// The models `xpu train` trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// A decoder-only transformer (attention, GELU MLP, layer norm) learning to reverse
    /// a sequence of digits.
    Transformer,
    /// An MLP over two embedded operands learning `(a + b) mod p`.
    Mlp,
}

/// The dtypes `xpu train` stores and multiplies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    /// Everything in `f32`.
    F32,
    /// `bf16` parameters' copies, activations, gradients and matrix products; `f32`
    /// master weights, optimizer state and accumulation.
    Bf16,
    /// As `bf16`, in `f16`, with a dynamic loss scale.
    F16,
}

impl Dtype {
    /// The trainer's precision.
    pub fn precision(self) -> Precision {
        match self {
            Dtype::F32 => Precision::F32,
            Dtype::Bf16 => Precision::Bf16,
            Dtype::F16 => Precision::F16,
        }
    }
}

/// The options of `xpu train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// The model.
    #[arg(long, value_enum, default_value = "transformer")]
    pub model: ModelKind,
    /// Devices to train on, one replica each (default: XPU_DEVICES, else every device
    /// that provides the model's operations).
    #[arg(long)]
    pub devices: Option<String>,
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// What parameters, activations and gradients are stored and multiplied in (the
    /// master weights, the optimizer state and the sum over the batch stay f32; f16
    /// scales the loss dynamically, skipping an update whose gradients overflow).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
    /// Examples (sequences for the transformer) per step (default: 64 for the
    /// transformer, 256 for the MLP).
    #[arg(long)]
    pub batch: Option<u64>,
    /// Examples per micro-batch, the unit the batch is shared in (default: 8 for the
    /// transformer, 32 for the MLP).
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f32,
    /// The seed of the data and the initial parameters.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The MLP's task: the modulus (the classes).
    #[arg(long, default_value_t = 23)]
    pub modulus: u32,
    /// The transformer's task: digits to reverse.
    #[arg(long, default_value_t = 6)]
    pub digits: u32,
    /// Model width of the transformer, embedding width of the MLP (default: 64 and
    /// 32).
    #[arg(long)]
    pub width: Option<u64>,
    /// Hidden width of the MLP.
    #[arg(long, default_value_t = 128)]
    pub hidden: u64,
    /// Attention heads of the transformer (dividing the width).
    #[arg(long, default_value_t = 4)]
    pub heads: u64,
    /// Blocks of the transformer.
    #[arg(long, default_value_t = 2)]
    pub layers: u64,
    /// Steps between logged lines.
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
    /// Held-out examples the final accuracy is measured on.
    #[arg(long, default_value_t = 1024)]
    pub eval_examples: u64,
    /// Write checkpoints into this directory (every --checkpoint-every steps and at
    /// the end), on a thread of their own while training goes on.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (with --checkpoint-dir).
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub checkpoint_every: u64,
    /// Continue from a checkpoint: a file, or a directory whose `latest` names one.
    /// The run goes on to --steps in all; the devices may differ from the first run's.
    #[arg(long, value_name = "PATH")]
    pub resume: Option<PathBuf>,
    /// Write the scheduler's timeline of the whole run (Chrome/Perfetto trace JSON:
    /// every task, copy and all-reduce on every device) to FILE. Timing every task
    /// (also done with --json, for the busy and overlap figures) costs throughput.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Print one JSON object per logged step and a summary object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Draw the loss curve and each device's busy share over the run into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Make DEVICE fail for real (through its backend: host and sim-npu devices can)
    /// when step STEP begins, to see the run drop it and continue from the last
    /// checkpoint on the others; with `:slow=DURATION` (e.g. `host:1@20:slow=2ms`) it
    /// becomes a straggler instead, every operation taking that much longer, and with
    /// `:speed=PERCENT%` (e.g. `host:1@20:speed=50%`, host devices) it runs at that
    /// share of its speed, to see its share rebalanced. Under `mpirun --enable-recovery`, `process:N@STEP` makes
    /// process N die at that step instead, to see the others go on without it.
    /// Repeatable.
    #[arg(long, value_name = "DEVICE@STEP[:slow=DURATION|:speed=PERCENT%]")]
    pub inject_fault: Vec<String>,
    /// Train the same steps again on these devices and report the precision of their
    /// losses and final weights against the run's (exit status 1 when outside the
    /// documented tolerance).
    #[arg(long, value_name = "SEL")]
    pub compare_with: Option<String>,
    /// When a device lacks an operation the model needs, run that operation on
    /// another device of the group instead of refusing the device (the scheduler
    /// moves the data both ways).
    #[arg(long)]
    pub allow_fallback: bool,
}

/// What the run has trained, for the summary and the plot.
#[derive(Default)]
struct History {
    /// `(step, loss)` of every step; steps trained again after a recovery replace
    /// the first tries.
    losses: Vec<(u64, f64)>,
    /// Per device, `(last step of a window, busy share)`.
    busy: Vec<(String, Vec<(u64, f64)>)>,
    /// Changes of the group.
    marks: Vec<(u64, String)>,
    /// Seconds spent in steps that counted, their matrix-product FLOPs and tokens.
    seconds: f64,
    flops: u64,
    tokens: u64,
}

impl History {
    fn window_busy(&mut self, step: u64, busy: &serde_json::Map<String, serde_json::Value>) {
        for (device, frac) in busy {
            let f = frac.as_f64().unwrap_or(0.0);
            match self.busy.iter_mut().find(|(d, _)| d == device) {
                Some((_, points)) => points.push((step, f)),
                None => self.busy.push((device.clone(), vec![(step, f)])),
            }
        }
    }
}

/// The configuration `args` ask for.
fn config_of(args: &TrainArgs) -> TrainConfig {
    let base = match args.model {
        ModelKind::Transformer => TrainConfig::transformer(),
        ModelKind::Mlp => TrainConfig::default(),
    };
    TrainConfig {
        seed: args.seed,
        global_batch: args.batch.unwrap_or(base.global_batch),
        micro_batch: args.micro_batch.unwrap_or(base.micro_batch),
        lr: args.lr,
        modulus: args.modulus,
        digits: args.digits,
        width: args.width.unwrap_or(base.width),
        hidden: args.hidden,
        heads: args.heads,
        layers: args.layers,
        allow_fallback: args.allow_fallback,
        precision: args.dtype.precision(),
        ..base
    }
}

/// Refuses option values no run can use.
fn check(args: &TrainArgs) -> Result<()> {
    if args.steps == 0 || args.steps > 10_000_000 {
        return Err(xpu::Error::invalid(format!(
            "--steps {}: give 1 to 10000000",
            args.steps
        )));
    }
    if args.checkpoint_every == 0 {
        return Err(xpu::Error::invalid(
            "--checkpoint-every 0: give the steps between checkpoints (at least 1)",
        ));
    }
    if args.log_every == 0 || args.eval_examples > 1 << 24 {
        return Err(xpu::Error::invalid(
            "--log-every must be at least 1 and --eval-examples at most 16777216",
        ));
    }
    Ok(())
}

/// Writes `text` to `path`, saying what it was on failure.
fn write_file(path: &Path, what: &str, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| {
        xpu::Error::invalid(format!(
            "cannot write the {what} to {}: {e}",
            path.display()
        ))
    })
}

/// Runs `xpu train`.
pub fn run(registry: &Registry, args: &TrainArgs) -> Result<bool> {
    let config = config_of(args);
    check(args)?;
    // A checkpoint to resume from is read and verified before any device is touched.
    let resume = args.resume.as_deref().map(Checkpoint::load).transpose()?;
    let devices = select(registry, args, &config)?;
    // Started by mpirun or srun: one group over every process's devices.
    let launch = super::launch::Launch::detect()?;
    // Across processes the faults are processes that die; within one, devices.
    let (process_faults, device_faults): (Vec<String>, Vec<String>) = args
        .inject_fault
        .iter()
        .cloned()
        .partition(|f| f.starts_with("process:"));
    if launch.is_some() && args.compare_with.is_some() {
        return Err(xpu::Error::invalid(
            "--compare-with trains within one process; run it without mpirun",
        ));
    }
    if launch.is_none() && !process_faults.is_empty() {
        return Err(xpu::Error::invalid(
            "--inject-fault process:N@STEP makes a process of a run across processes die; run it under mpirun --enable-recovery",
        ));
    }
    if launch.is_none() {
        // Checked before any device is touched (across processes, once the processes
        // are known).
        faults::parse(&device_faults, &devices, None, args.steps)?;
    }
    let compare_devices = match &args.compare_with {
        Some(text) => Some(registry.devices(&xpu::DeviceSelector::parse(text)?)?),
        None => None,
    };
    let start_point = resume.clone();
    let start = Instant::now();
    let mut trainer = match &launch {
        Some(launch) => {
            let options = xpu_collectives::CommOptions::from_env()?;
            let trainer = Trainer::across(
                launch.communicator(devices.clone(), options)?,
                config.clone(),
            )?;
            // What decides the steps every process takes.
            let resumed_at = resume.as_ref().map_or(0, |c| c.step);
            trainer.agree(
                "option",
                &format!("--steps {} from step {resumed_at}", args.steps),
            )?;
            trainer
        }
        None => Trainer::new(&devices, config.clone())?,
    };
    // Across processes, the first prints (and writes the checkpoints) for all.
    let mut printing = trainer.first_rank() == 0;
    let mut reporter = Reporter::new(printing, args.json, args.steps, 0);
    // This process's index among the processes it started with, and the step at which
    // it is to die.
    let process = trainer.communicator().and_then(|c| {
        c.processes()
            .iter()
            .position(|p| p.first_rank == c.first_rank())
    });
    let processes = trainer.communicator().map_or(1, |c| c.processes().len());
    let mut faults = faults::parse(
        &device_faults,
        &devices,
        process.map(|p| (p, processes)),
        args.steps,
    )?;
    let dies_at = faults::dies_at(
        &process_faults,
        trainer.communicator().map_or(1, |c| c.processes().len()),
        process,
        args.steps,
    )?;
    if let (Some(c), Some(path)) = (&resume, &args.resume) {
        trainer.restore(c)?;
        reporter.line(&format!(
            "resumed from {} at step {}",
            path.display(),
            c.step
        ));
    }
    if trainer.steps_done() >= args.steps {
        return Err(xpu::Error::invalid(format!(
            "the checkpoint is at step {}; give --steps beyond it",
            trainer.steps_done()
        )));
    }
    let mut writer = args
        .checkpoint_dir
        .as_deref()
        .filter(|_| printing)
        .map(Writer::new)
        .transpose()?;
    // Timing every task costs throughput: only when the figures are asked for.
    let profiled = args.json || args.profile.is_some() || args.plot.is_some();
    let mut timeline = if profiled {
        // Task by task only for a trace written to a file: otherwise replayed runs keep
        // their unprofiled cost, and the figures describe the run as it goes unwatched.
        Some(Timeline::start(&trainer, args.profile.is_some())?)
    } else {
        None
    };
    let names = trainer.rank_names();
    let model = match args.model {
        ModelKind::Transformer => "transformer",
        ModelKind::Mlp => "mlp",
    };
    reporter.line(&format!(
        "training the {model} ({} parameters, {}) on {}: {} examples per step in micro-batches of {}",
        trainer.parameters(),
        config.precision,
        names.join(", "),
        config.global_batch,
        config.micro_batch
    ));
    if let Reporter::Bar(bar) = &reporter {
        bar.set_position(trainer.steps_done());
    }
    // The state to fall back on when a device fails: the last checkpoint (in memory,
    // and on disk with --checkpoint-dir).
    let mut last_checkpoint = resume;
    let mut history = History::default();
    let mut first_step = None;
    let mut window = (0.0f64, 0u64, 0u64);
    let mut recoveries = Vec::new();
    while trainer.steps_done() < args.steps {
        let next = trainer.steps_done() + 1;
        if dies_at == Some(next) {
            // A real crash, as a process that dies takes no leave.
            eprintln!(
                "xpu train: injecting a fault at step {next}: process {} dies",
                process.unwrap_or(0)
            );
            std::process::abort();
        }
        for (device, fault) in faults::fire(&mut faults, next)? {
            let (what, text) = match fault {
                xpu::backend::Fault::Slow(d) => (
                    format!("slow {} us", d.as_micros()),
                    format!("every operation now takes {d:?} longer"),
                ),
                xpu::backend::Fault::Throttle(p) => (
                    format!("speed {p}%"),
                    format!("it now runs at {p}% of its speed"),
                ),
                _ => ("lost".to_string(), "it fails".to_string()),
            };
            if !printing {
                // Another process prints; this one says what it did on stderr.
                eprintln!("xpu train: injecting a fault at step {next}: {device}: {text}");
            }
            reporter.event(
                &format!("injecting a fault at step {next}: {device}: {text}"),
                json!({"step": next, "inject_fault": device, "fault": what}),
            );
        }
        let report = match trainer.step() {
            Ok(r) => r,
            Err(e) => {
                if let Some(t) = &mut timeline {
                    // The failed group's last window, as far as it was recorded.
                    let _ = t.window(&trainer, false);
                }
                // Across processes the surviving processes go on without the failed
                // ones; within one, the surviving devices.
                let recovered = if launch.is_some() {
                    elastic::recover_across(trainer, e, last_checkpoint.as_ref())
                } else {
                    elastic::recover(trainer, e, last_checkpoint.as_ref())
                };
                let (next_trainer, recovery) = match recovered {
                    Ok(done) => done,
                    Err(e) => {
                        reporter.finish();
                        if let Some(w) = &mut writer {
                            if let Some(path) = w.finish()?.last() {
                                eprintln!("xpu train: the latest checkpoint is {}", path.display());
                            }
                        }
                        return Err(e);
                    }
                };
                trainer = next_trainer;
                // The first process may have been the one lost.
                if !printing && trainer.first_rank() == 0 {
                    printing = true;
                    reporter = Reporter::new(printing, args.json, args.steps, 0);
                    writer = args
                        .checkpoint_dir
                        .as_deref()
                        .map(Writer::new)
                        .transpose()?;
                }
                reporter.recovered(&recovery);
                let lost: Vec<&str> = recovery.lost.iter().map(|(d, _)| d.as_str()).collect();
                history
                    .marks
                    .push((recovery.failed_step, format!("{} lost", lost.join(", "))));
                history.losses.retain(|(s, _)| *s <= recovery.resumed_at);
                recoveries.push(recovery);
                window = (0.0, 0, 0);
                if let Some(t) = &timeline {
                    t.restart(&trainer)?;
                }
                continue;
            }
        };
        // Every process keeps the checkpoint in memory (to go on from after a
        // failure); the first also writes it.
        if report.step % args.checkpoint_every == 0 || report.step == args.steps {
            let c = trainer.checkpoint()?;
            if let Some(w) = &mut writer {
                w.write(c.clone())?;
            }
            last_checkpoint = Some(c);
        }
        first_step.get_or_insert_with(|| start.elapsed().as_secs_f64());
        history.losses.push((report.step, report.loss));
        history.seconds += report.seconds;
        history.flops += report.matmul_flops;
        history.tokens += report.tokens;
        window.0 += report.seconds;
        window.1 += 1;
        window.2 += report.tokens;
        let tokens_per_s = report.tokens as f64 / report.seconds.max(1e-9);
        reporter.tick(&report, tokens_per_s);
        if report.step % args.log_every == 0 || report.step == args.steps {
            let profile = match &mut timeline {
                Some(t) => Some(t.window(&trainer, report.step < args.steps)?),
                None => None,
            };
            let busy = profile.as_ref().map(busy);
            if let Some(b) = &busy {
                history.window_busy(report.step, b);
            }
            reporter.logged(&Logged {
                report: &report,
                steps: args.steps,
                examples_per_s: (window.1 * config.global_batch) as f64 / window.0.max(1e-9),
                tokens_per_s: window.2 as f64 / window.0.max(1e-9),
                busy,
            });
            window = (0.0, 0, 0);
        }
        if report.skipped {
            let now = trainer.loss_scale().map_or(0.0, |s| s.scale);
            history.marks.push((report.step, "update skipped".into()));
            reporter.event(
                &format!(
                    "update skipped at step {}: gradients overflowed {} at loss scale {}; the scale is now {now}",
                    report.step,
                    config.precision,
                    report.loss_scale.unwrap_or(0.0)
                ),
                json!({"step": report.step, "skipped_update": true, "loss_scale": now}),
            );
        }
        for why in &report.stragglers {
            history.marks.push((report.step, "straggler".into()));
            reporter.event(
                &format!("straggler found after step {}: {why}", report.step),
                json!({"step": report.step, "straggler": why}),
            );
        }
        for why in &report.left_out {
            history.marks.push((report.step, "left out".into()));
            reporter.event(
                &format!("left out of the group after step {}: {why}", report.step),
                json!({"step": report.step, "left_out": why}),
            );
        }
    }
    reporter.finish();
    if !printing {
        return Ok(true);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let whole = timeline.and_then(|mut t| t.whole.take());
    if let (Some(path), Some(p)) = (&args.profile, &whole) {
        let text = serde_json::to_string(&p.to_chrome_json())
            .map_err(|e| xpu::Error::invalid(format!("could not encode the timeline: {e}")))?;
        write_file(path, "timeline", &text)?;
    }
    let (busy_all, overlap, peak) = match &whole {
        Some(p) => (busy(p), p.overlap_fraction(is_all_reduce), peak_memory(p)),
        None => Default::default(),
    };
    let kept = match &mut writer {
        Some(w) => w.finish()?,
        None => Vec::new(),
    };
    let accuracy = trainer.accuracy(args.eval_examples)?;
    let final_loss = history.losses.last().map_or(f64::NAN, |r| r.1);
    // Model FLOP utilisation: the matrix products' FLOP/s over the sum of the final
    // group's matrix-product peaks in the run's dtype, measured now (after training, so
    // that start-up is not charged for it).
    let final_devices = trainer.devices();
    let mut peaks = serde_json::Map::new();
    let mut peak_sum = 0.0;
    for d in &final_devices {
        let p = xpu_train::peak::matmul_peak(d, config.precision.dtype())?;
        peak_sum += p;
        peaks.insert(d.id().to_string(), json!(p));
    }
    let model_flops_per_s = history.flops as f64 / history.seconds.max(1e-9);
    let mfu = model_flops_per_s / peak_sum.max(1.0);
    let tokens_per_s = history.tokens as f64 / history.seconds.max(1e-9);
    let comparison = match &compare_devices {
        Some(other) => Some(compare::compare(
            other,
            &config,
            start_point.as_ref(),
            args.steps,
            &history.losses,
            &compare::weights(&trainer)?,
        )?),
        None => None,
    };
    let matched = comparison.as_ref().is_none_or(compare::Comparison::matches);
    let stats = trainer.scheduler().stats();
    let final_names = trainer.rank_names();
    if let Some(path) = &args.plot {
        let title = format!(
            "xpu train --model {model}: {} steps on {}",
            args.steps,
            names.join(", ")
        );
        let text = plot::svg(&plot::Series {
            title: &title,
            losses: &history.losses,
            busy: &history.busy,
            marks: &history.marks,
        });
        write_file(path, "plot", &text)?;
    }
    if args.json {
        println!(
            "{}",
            json!({
                "summary": true,
                "model": model,
                "dtype": config.precision,
                "loss_scale": trainer.loss_scale().map(|s| s.scale),
                "skipped_updates": trainer.loss_scale().map_or(0, |s| s.skipped),
                "final_loss": final_loss,
                "accuracy": accuracy,
                "steps": args.steps,
                "devices": final_names,
                "started_on": names,
                "parameters": trainer.parameters(),
                "seconds": elapsed,
                "time_to_first_step_s": first_step,
                "tokens_per_s": tokens_per_s,
                "model_flops_per_s": model_flops_per_s,
                "matmul_peak_flops": peaks,
                "mfu": mfu,
                "tasks_per_device": stats.placed,
                "busy_frac": busy_all,
                "overlap_frac": overlap,
                "peak_memory_bytes": peak,
                "recoveries": recoveries.len(),
                "replayed_steps": trainer.replayed_steps(),
                "compare": comparison.as_ref().map(compare::Comparison::to_json),
                "checkpoints": kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            })
        );
        return Ok(matched);
    }
    println!(
        "done: {} steps in {elapsed:.1} s (first step after {:.2} s); final loss {final_loss:.4}; accuracy {:.1}% of the labels of {} held-out examples",
        args.steps,
        first_step.unwrap_or(0.0),
        accuracy * 100.0,
        args.eval_examples
    );
    // Across processes the matrix products and peaks are this process's devices'.
    let whose = if launch.is_some() {
        "this process's devices'"
    } else {
        "the devices'"
    };
    println!(
        "{tokens_per_s:.0} tokens/s; matrix products at {:.2} GFLOP/s, {:.1}% of {whose} measured peak ({:.1} GFLOP/s)",
        model_flops_per_s * 1e-9,
        mfu * 100.0,
        peak_sum * 1e-9
    );
    if whole.is_some() {
        let shares: Vec<String> = busy_all
            .iter()
            .map(|(d, f)| format!("{d} {:.0}%", f.as_f64().unwrap_or(0.0) * 100.0))
            .collect();
        println!(
            "busy: {}; all-reduce time hidden under computation: {:.0}%",
            shares.join(", "),
            overlap * 100.0
        );
    }
    if !recoveries.is_empty() {
        println!(
            "recovered from {} failure(s); finished on {}",
            recoveries.len(),
            final_names.join(", ")
        );
    }
    if let Some(path) = &args.profile {
        println!(
            "timeline: {} (open it in https://ui.perfetto.dev)",
            path.display()
        );
    }
    if let Some(path) = &args.plot {
        println!("plot: {}", path.display());
    }
    if let Some(last) = kept.last() {
        println!("latest checkpoint: {}", last.display());
    }
    if let Some(c) = &comparison {
        c.print();
    }
    Ok(matched)
}

/// The devices named by `--devices` (each must provide the model's operations), or by
/// default every device that does, saying which were left out.
fn select(registry: &Registry, args: &TrainArgs, config: &TrainConfig) -> Result<Vec<Device>> {
    let explicit = args.devices.is_some() || std::env::var_os(xpu::DEVICES_ENV).is_some();
    let sel = match &args.devices {
        Some(text) => xpu::DeviceSelector::parse(text)?,
        None => xpu::selector_from_env("*")?,
    };
    let devices = registry.devices(&sel)?;
    if explicit || args.allow_fallback {
        return Ok(devices);
    }
    let mut kept = Vec::new();
    for d in devices {
        match unsupported_op(config, &d)? {
            None => kept.push(d),
            Some(op) => eprintln!(
                "xpu train: leaving out {}: it does not provide {op} on f32",
                d.id()
            ),
        }
    }
    Ok(kept)
}
