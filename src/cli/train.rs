//! `xpu train`: data-parallel training of a model over the selected devices, with a
//! line (or a JSON object) per logged step and a summary.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde_json::json;
use xpu::scheduler::Profile;
use xpu::{Device, Registry, Result};
use xpu_train::checkpoint::{Checkpoint, Writer};
use xpu_train::{unsupported_op, TrainConfig, Trainer};

/// The models `xpu train` trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// A decoder-only transformer (attention, GELU MLP, layer norm) learning to reverse
    /// a sequence of digits.
    Transformer,
    /// An MLP over two embedded operands learning `(a + b) mod p`.
    Mlp,
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
}

/// The run's timeline, profiled a logging window at a time.
struct Timeline {
    /// The windows so far, as one profile.
    whole: Option<Profile>,
}

impl Timeline {
    fn start(trainer: &Trainer) -> Result<Timeline> {
        trainer.scheduler().start_profiling()?;
        Ok(Timeline { whole: None })
    }

    /// Ends the current window (returning it) and starts the next.
    fn window(&mut self, trainer: &Trainer, next: bool) -> Result<Profile> {
        let window = trainer.scheduler().stop_profiling()?;
        let offset = match &self.whole {
            None => 0.0,
            Some(w) => w.length,
        };
        match &mut self.whole {
            None => self.whole = Some(window.clone()),
            Some(w) => w.append(window.clone(), offset),
        }
        if next {
            trainer.scheduler().start_profiling()?;
        }
        Ok(window)
    }
}

/// Each device's busy share of `p`, by device id.
fn busy(p: &Profile) -> serde_json::Map<String, serde_json::Value> {
    p.summary()
        .into_iter()
        .filter(|d| d.tasks > 0)
        .map(|d| (d.device, json!(d.busy_fraction)))
        .collect()
}

/// The largest replica memory each device held in `p`, by device id.
fn peak_memory(p: &Profile) -> serde_json::Map<String, serde_json::Value> {
    let mut peak = vec![0u64; p.devices.len()];
    for m in &p.memory {
        if let Some(v) = peak.get_mut(m.device) {
            *v = (*v).max(m.bytes);
        }
    }
    p.devices
        .iter()
        .zip(peak)
        .map(|(d, b)| (d.clone(), json!(b)))
        .collect()
}

/// Whether a span is an all-reduce of the gradients.
fn is_all_reduce(s: &xpu::scheduler::profile::Span) -> bool {
    s.name == "all_reduce"
}

/// Runs `xpu train`.
pub fn run(registry: &Registry, args: &TrainArgs) -> Result<bool> {
    let base = match args.model {
        ModelKind::Transformer => TrainConfig::transformer(),
        ModelKind::Mlp => TrainConfig::default(),
    };
    let config = TrainConfig {
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
        ..base
    };
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
    // A checkpoint to resume from is read and verified before any device is touched.
    let resume = args.resume.as_deref().map(Checkpoint::load).transpose()?;
    let devices = select(registry, args, &config)?;
    let start = Instant::now();
    let mut trainer = Trainer::new(&devices, config.clone())?;
    if let (Some(c), Some(path)) = (&resume, &args.resume) {
        trainer.restore(c)?;
        if !args.json {
            println!("resumed from {} at step {}", path.display(), c.step);
        }
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
        .map(Writer::new)
        .transpose()?;
    // Timing every task costs throughput: only when the figures are asked for.
    let mut timeline = if args.json || args.profile.is_some() {
        Some(Timeline::start(&trainer)?)
    } else {
        None
    };
    let names: Vec<String> = devices.iter().map(|d| d.id().to_string()).collect();
    let model = match args.model {
        ModelKind::Transformer => "transformer",
        ModelKind::Mlp => "mlp",
    };
    let examples_per_step = config.global_batch;
    if !args.json {
        println!(
            "training the {model} ({} parameters) on {}: {} examples per step in micro-batches of {}",
            trainer.parameters(),
            names.join(", "),
            config.global_batch,
            config.micro_batch
        );
    }
    let mut first_step = None;
    let mut last = None;
    let mut window = (0.0f64, 0u64);
    for _ in trainer.steps_done()..args.steps {
        let report = trainer.step()?;
        if let Some(w) = &mut writer {
            if report.step % args.checkpoint_every == 0 || report.step == args.steps {
                w.write(trainer.checkpoint()?)?;
            }
        }
        first_step.get_or_insert_with(|| start.elapsed().as_secs_f64());
        window.0 += report.seconds;
        window.1 += 1;
        if report.step % args.log_every == 0 || report.step == args.steps {
            let per_s = (window.1 * examples_per_step) as f64 / window.0.max(1e-9);
            window = (0.0, 0);
            let profile = match &mut timeline {
                Some(t) => Some(t.window(&trainer, report.step < args.steps)?),
                None => None,
            };
            if args.json {
                println!(
                    "{}",
                    json!({
                        "step": report.step,
                        "loss": report.loss,
                        "examples_per_s": per_s,
                        "shares": report.shares,
                        "devices": report.devices,
                        "busy_frac": profile.as_ref().map(busy),
                    })
                );
            } else {
                let shares: Vec<String> = report.shares.iter().map(u64::to_string).collect();
                println!(
                    "step {:>6}/{}  loss {:.4}  {:>9.0} examples/s  micro-batches {}",
                    report.step,
                    args.steps,
                    report.loss,
                    per_s,
                    shares.join("+")
                );
            }
        }
        for why in &report.left_out {
            if args.json {
                println!("{}", json!({"step": report.step, "left_out": why}));
            } else {
                println!("left out of the group after step {}: {why}", report.step);
            }
        }
        last = Some(report);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let whole = timeline.and_then(|mut t| t.whole.take());
    if let (Some(path), Some(p)) = (&args.profile, &whole) {
        let text = serde_json::to_string(&p.to_chrome_json())
            .map_err(|e| xpu::Error::invalid(format!("could not encode the timeline: {e}")))?;
        std::fs::write(path, text).map_err(|e| {
            xpu::Error::invalid(format!(
                "cannot write the timeline to {}: {e}",
                path.display()
            ))
        })?;
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
    let final_loss = last.map_or(f64::NAN, |r| r.loss);
    let stats = trainer.scheduler().stats();
    if args.json {
        println!(
            "{}",
            json!({
                "summary": true,
                "model": model,
                "final_loss": final_loss,
                "accuracy": accuracy,
                "steps": args.steps,
                "devices": names,
                "parameters": trainer.parameters(),
                "seconds": elapsed,
                "time_to_first_step_s": first_step,
                "tasks_per_device": stats.placed,
                "busy_frac": busy_all,
                "overlap_frac": overlap,
                "peak_memory_bytes": peak,
                "checkpoints": kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "done: {} steps in {elapsed:.1} s (first step after {:.2} s); final loss {final_loss:.4}; accuracy {:.1}% of the labels of {} held-out examples",
            args.steps,
            first_step.unwrap_or(0.0),
            accuracy * 100.0,
            args.eval_examples
        );
        let shares: Vec<String> = busy_all
            .iter()
            .map(|(d, f)| format!("{d} {:.0}%", f.as_f64().unwrap_or(0.0) * 100.0))
            .collect();
        if whole.is_some() {
            println!(
                "busy: {}; all-reduce time hidden under computation: {:.0}%",
                shares.join(", "),
                overlap * 100.0
            );
        }
        if let Some(path) = &args.profile {
            println!(
                "timeline: {} (open it in https://ui.perfetto.dev)",
                path.display()
            );
        }
        if let Some(last) = kept.last() {
            println!("latest checkpoint: {}", last.display());
        }
    }
    Ok(true)
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
    if explicit {
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
