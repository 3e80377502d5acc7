//! `xpu bench train`: what training on the runtime costs and what its parallelism pays,
//! each figure beside its reference measured in the same run, in interleaved rounds
//! (mean and median of the rounds' tokens per second):
//!
//! - **overhead**: `xpu train`'s trainer on `host:0` against the same model run
//!   directly on the host device's stream, without the scheduler
//!   ([`xpu_train::direct`]);
//! - **two devices**: the trainer on `host:0,1` against `host:0` alone at the same
//!   global batch, and the share of the all-reduce hidden under computation;
//! - **heterogeneous**: `host:0` with `plugin.simnpu:0`, and with `host:1`, slowed to
//!   half the host's speed, against `host:0` alone: throttled (an injected fault that
//!   stretches each operation in proportion to its work) where the backend can, else
//!   by a delay per operation; a device already slower than that by itself is measured
//!   as it is.
//! - **precision**: with `--dtype bf16|f16`, every figure is in that dtype, and the
//!   trainer on `host:0` is also measured against itself in `f32`.
//!
//! With `--busy`, a competing busy process runs throughout.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::bench::{median, stats, Stats};
use xpu::backend::Fault;
use xpu::{Device, DeviceSelector, Error, Registry, Result};
use xpu_train::direct::DirectTrainer;
use xpu_train::{Precision, TrainConfig, Trainer};

/// The options of `xpu bench train`.
#[derive(clap::Args, Debug)]
pub struct BenchTrainArgs {
    /// The model: `transformer` or `mlp`.
    #[arg(long, default_value = "transformer")]
    pub model: String,
    /// The dtype every path trains in (see `xpu train --dtype`).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::cli::train::Dtype,
    /// Steps per round and path.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Run a competing busy process throughout.
    #[arg(long)]
    pub busy: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Something that trains a step at a time.
trait Stepper {
    /// One step; its input tokens.
    fn step(&mut self) -> Result<u64>;
}

impl Stepper for Trainer {
    fn step(&mut self) -> Result<u64> {
        Ok(Trainer::step(self)?.tokens)
    }
}

impl Stepper for DirectTrainer {
    fn step(&mut self) -> Result<u64> {
        DirectTrainer::step(self)?;
        Ok(self.tokens_per_step())
    }
}

/// Tokens per second of `steps` steps.
fn round(s: &mut dyn Stepper, steps: u64) -> Result<f64> {
    let t = Instant::now();
    let mut tokens = 0;
    for _ in 0..steps {
        tokens += s.step()?;
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// One comparison's figures.
struct Row {
    name: &'static str,
    xpu: Stats,
    reference_name: String,
    reference: Stats,
    /// The ratio to reach, where there is one.
    target: Option<f64>,
    extra: Option<(String, f64)>,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.xpu.mean / self.reference.mean.max(1e-12)
    }
}

/// `a` and `b` measured in interleaved rounds, after `warmup` steps each.
fn compare(
    a: &mut dyn Stepper,
    b: &mut dyn Stepper,
    args: &BenchTrainArgs,
    warmup: u64,
) -> Result<(Stats, Stats)> {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    round(a, warmup)?;
    round(b, warmup)?;
    for _ in 0..args.rounds {
        ta.push(round(a, args.steps)?);
        tb.push(round(b, args.steps)?);
    }
    Ok((stats(&mut ta, |x| x), stats(&mut tb, |x| x)))
}

/// A busy process competing for the cores, killed when dropped.
struct Busy(Child);

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn one(registry: &Registry, sel: &str) -> Result<Option<Device>> {
    Ok(registry
        .devices(&DeviceSelector::parse(sel)?)
        .ok()
        .and_then(|mut d| (!d.is_empty()).then(|| d.remove(0))))
}

/// Seconds of one micro-batch on `trainer`'s devices: a step's time over its
/// micro-batches (the median of a few steps).
fn micro_batch_seconds(trainer: &mut Trainer, micro_batches: u64) -> Result<f64> {
    let mut t = Vec::new();
    for _ in 0..5 {
        t.push(trainer.step()?.seconds / micro_batches as f64);
    }
    Ok(median(&mut t))
}

/// Makes `device` run at about `host_mb / speed` per micro-batch: as it is when it is
/// that slow by itself; else throttled ([`Fault::Throttle`], each operation stretched
/// in proportion to its work, as a device of lower throughput would run) where its
/// backend can; else through a delay per operation found by the secant method over a
/// few measured settings (a short sleep costs more than it asks for, so no single
/// measurement predicts the rest). Returns how it was slowed and the speed reached
/// (the host's micro-batch time over its own, each measured past the calibration
/// steps).
fn throttle(
    device: &Device,
    config: &TrainConfig,
    host_mb: f64,
    speed: f64,
) -> Result<(String, f64)> {
    let micro_batches = config.global_batch / config.micro_batch;
    let mut alone = Trainer::new(std::slice::from_ref(device), config.clone())?;
    for _ in 0..=config.rebalance_every {
        alone.step()?;
    }
    let want = host_mb / speed;
    let t0 = micro_batch_seconds(&mut alone, micro_batches)?;
    if t0 >= want {
        return Ok(("as it is".into(), host_mb / t0));
    }
    let percent = ((100.0 * t0 / want).round() as u32).clamp(1, 100);
    match device.inject_fault(Fault::Throttle(percent)) {
        Ok(()) => {
            let t = micro_batch_seconds(&mut alone, micro_batches)?;
            return Ok((format!("throttled to {percent}% of its speed"), host_mb / t));
        }
        Err(Error::Unsupported { .. }) => {}
        Err(e) => return Err(e),
    }
    let mut measure = |d: f64| -> Result<f64> {
        device.inject_fault(Fault::Slow(Duration::from_secs_f64(d.max(0.0))))?;
        micro_batch_seconds(&mut alone, micro_batches)
    };
    let (mut d0, mut t0) = (0.0, t0);
    let (mut d1, mut t1) = (100e-6, measure(100e-6)?);
    for _ in 0..4 {
        if (t1 - want).abs() <= 0.05 * want || t1 <= t0 {
            break;
        }
        let next = (d1 + (want - t1) * (d1 - d0) / (t1 - t0)).clamp(0.0, 0.1);
        (d0, t0) = (d1, t1);
        d1 = next;
        t1 = measure(d1)?;
    }
    Ok((
        format!("slowed by {} us per operation", (d1.max(0.0) * 1e6).round()),
        host_mb / t1,
    ))
}

/// Ends the slowdowns [`throttle`] may have injected into `device`.
fn unthrottle(device: &Device) -> Result<()> {
    device.inject_fault(Fault::Slow(Duration::ZERO))?;
    match device.inject_fault(Fault::Throttle(100)) {
        Err(Error::Unsupported { .. }) => Ok(()),
        other => other,
    }
}

/// Runs `xpu bench train`.
pub fn run(registry: &Registry, args: &BenchTrainArgs) -> Result<()> {
    let base = match args.model.as_str() {
        "transformer" => TrainConfig::transformer(),
        "mlp" => TrainConfig::default(),
        other => {
            return Err(Error::invalid(format!(
                "--model {other}: choose transformer or mlp"
            )))
        }
    };
    let config = TrainConfig {
        precision: args.dtype.precision(),
        ..base
    };
    if args.steps == 0 || args.rounds == 0 || args.steps > 100_000 || args.rounds > 1000 {
        return Err(Error::invalid(
            "--steps (1 to 100000) and --rounds (1 to 1000) must be positive",
        ));
    }
    let _busy = if args.busy {
        Some(Busy(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| Error::invalid(format!("could not start a busy process: {e}")))?,
        ))
    } else {
        None
    };
    let host0 =
        one(registry, "host:0")?.ok_or_else(|| Error::invalid("xpu bench train needs host:0"))?;
    let threads = host0
        .info()
        .extra
        .iter()
        .find_map(|e| e.strip_prefix("threads="))
        .unwrap_or("?")
        .to_string();
    let micro_batches = config.global_batch / config.micro_batch;
    // Each trainer is measured past its start: the first `rebalance_every` steps submit
    // task by task while the models calibrate, and the step after records the replay.
    let warmup = args.steps.max(2 * config.rebalance_every);
    let mut rows = Vec::new();
    // The scheduler's overhead.
    let mut single = Trainer::new(std::slice::from_ref(&host0), config.clone())?;
    let mut direct = DirectTrainer::new(&host0, config.clone())?;
    let (xpu_t, direct_t) = compare(&mut single, &mut direct, args, warmup)?;
    rows.push(Row {
        name: "trainer on host:0 vs the same ops without the scheduler",
        xpu: xpu_t,
        reference_name: "direct on host:0".into(),
        reference: direct_t,
        target: Some(0.8),
        extra: None,
    });
    // The precision against f32, when it is not f32.
    if config.precision != Precision::F32 {
        let f32_config = TrainConfig {
            precision: Precision::F32,
            ..config.clone()
        };
        let mut wide = Trainer::new(std::slice::from_ref(&host0), f32_config)?;
        let (low_t, f32_t) = compare(&mut single, &mut wide, args, warmup)?;
        rows.push(Row {
            name: "trainer on host:0 in --dtype vs in f32",
            xpu: low_t,
            reference_name: "trainer on host:0 in f32".into(),
            reference: f32_t,
            target: None,
            extra: None,
        });
    }
    // Two host devices.
    let mut skipped = Vec::new();
    match one(registry, "host:1")? {
        Some(host1) => {
            let mut two = Trainer::new(&[host0.clone(), host1], config.clone())?;
            let (two_t, one_t) = compare(&mut two, &mut single, args, warmup)?;
            // Runs as one span each: the round runs as it does unprofiled.
            two.scheduler().start_profiling_runs()?;
            round(&mut two, args.steps)?;
            let overlap = two
                .scheduler()
                .stop_profiling()?
                .overlap_fraction(|s| s.name == "all_reduce");
            rows.push(Row {
                name: "trainer on host:0,1 vs host:0, same global batch",
                xpu: two_t,
                reference_name: "trainer on host:0".into(),
                reference: one_t,
                target: Some(1.5),
                extra: Some(("overlap_frac (target 0.5)".into(), overlap)),
            });
        }
        None => skipped.push("two devices: no host:1".to_string()),
    }
    // Host with a second device at half its speed: sim-npu, and host:1 (whose
    // throttle sleeps, leaving its core to host:0 and the scheduler).
    for (sel, name) in [
        (
            "plugin.simnpu:0",
            "trainer on host:0 + plugin.simnpu:0 at half speed vs host:0",
        ),
        (
            "host:1",
            "trainer on host:0 + host:1 at half speed vs host:0",
        ),
    ] {
        let Some(other) = one(registry, sel)? else {
            skipped.push(format!(
                "{name}: no {sel} (load sim-npu with --plugin libxpu_sim_npu.so)"
            ));
            continue;
        };
        let host_mb = micro_batch_seconds(&mut single, micro_batches)?;
        let (how, speed) = match throttle(&other, &config, host_mb, 0.5) {
            Ok(done) => done,
            Err(e @ Error::Unsupported { .. }) => {
                skipped.push(format!("{name}: cannot slow {sel} down: {e}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut mixed = Trainer::new(&[host0.clone(), other.clone()], config.clone())?;
        let measured = compare(&mut mixed, &mut single, args, warmup);
        unthrottle(&other)?;
        let (mixed_t, one_t) = measured?;
        rows.push(Row {
            name,
            xpu: mixed_t,
            reference_name: "trainer on host:0".into(),
            reference: one_t,
            target: Some(1.2),
            extra: Some((
                format!("{sel} speed / host:0's ({how}; above 0.5 when it is slower by itself)"),
                speed,
            )),
        });
    }
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "tokens_per_s": r.xpu,
                    "reference": r.reference_name,
                    "reference_tokens_per_s": r.reference,
                    "ratio": r.ratio(),
                    "target": r.target,
                    "extra": r.extra.as_ref().map(|(k, v)| json!({"name": k, "value": v})),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "model": args.model,
                "dtype": config.precision,
                "steps_per_round": args.steps,
                "rounds": args.rounds,
                "busy": args.busy,
                "host_threads_per_device": threads,
                "figures": rows,
                "skipped": skipped,
            })
        );
        return Ok(());
    }
    println!(
        "xpu bench train: {} in {}, {} steps per round, {} interleaved rounds, {threads} thread(s) per host device{}",
        args.model,
        config.precision,
        args.steps,
        args.rounds,
        if args.busy { ", a busy process competing" } else { "" }
    );
    println!(
        "{:<62} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7}",
        "tokens/s", "xpu mean", "xpu p50", "ref mean", "ref p50", "ratio", "target"
    );
    for r in &rows {
        println!(
            "{:<62} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>7.2} {:>7}",
            r.name,
            r.xpu.mean,
            r.xpu.p50,
            r.reference.mean,
            r.reference.p50,
            r.ratio(),
            r.target.map_or("-".to_string(), |t| format!("{t:.2}"))
        );
        println!("  reference: {}", r.reference_name);
        if let Some((k, v)) = &r.extra {
            println!("  {k}: {v:.2}");
        }
    }
    for s in &skipped {
        println!("skipped: {s}");
    }
    Ok(())
}
