//! The training loop: replicas, micro-batches, the overlapped all-reduce and AdamW.
//!
//! A step's global batch is cut into fixed micro-batches. Each replica computes a
//! contiguous range of them (in rank order, sized from the devices' speeds so that
//! the step ends soonest), each micro-batch's gradients going to its own slot of the
//! replica's gradient buckets (`[micro-batches, elements]`). The micro-batches run in
//! rounds aligned at the end, so that every replica's last micro-batch is in the last
//! round. In that round the backward pass goes bucket by bucket across the replicas;
//! as soon as every replica has submitted the work that finishes a bucket, each sums
//! its slots up to its blocks of the fixed summation tree ([`crate::tree`]) and the
//! blocks are all-reduced: the scheduler runs that while the replicas compute the
//! buckets before it. Then every replica finishes the tree above the blocks and
//! applies AdamW. Most steps replay a recorded one instead of submitting its tasks
//! again (see [`Trainer::step`]).
//!
//! **Determinism.** The sum over micro-batches is one fixed tree of `f32` additions,
//! whoever computes which part of it; the all-reduce only moves the blocks (each row
//! has one non-zero contributor and adding zeros is exact), whatever its algorithm. So
//! on devices that compute a micro-batch alike (the host devices, whatever their
//! thread counts), the trajectory does not depend on the split or the number of
//! replicas at all, and a resumed run continues bit for bit. (Devices of different
//! backends round differently; their trajectories agree within tolerance.) The
//! all-reduce moves one row per block, usually one or two per replica, rather than
//! every micro-batch's gradients.
//!
//! Every labelled row's loss gradient is `1 / labelled rows of the global batch`, so
//! the summed gradient is the mean over the global batch whatever the split. The
//! reported loss is the mean of the per-row losses, summed on the host in example
//! order.

use std::sync::atomic::Ordering;
use std::time::Instant;

use xpu_collectives::{CommOptions, Communicator, ReduceOp};
use xpu_hal::{DType, Device, Error, HostBuffer, Result, Scalar};
use xpu_scheduler::{Builtin, Codelet, Graph, Handle, Scheduler, SchedulerOptions, Task};

use crate::checkpoint::Checkpoint;
use crate::data::{Dataset, ModularAddition, Reverse};
use crate::mlp::{Mlp, MlpShape};
use crate::model::{MicroBatch, Model};
use crate::precision::{LossScale, Precision};
use crate::replica::Replica;
use crate::split;
use crate::transformer::{Transformer, TransformerShape};
use crate::tree::Plan;

/// The models [`Trainer`] trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ModelKind {
    /// An MLP over two embedded operands learning `(a + b) mod p` (`modulus`, `width`
    /// for the embedding, `hidden`).
    Mlp,
    /// A decoder-only transformer learning to reverse `digits` digits (`width`,
    /// `heads`, `layers`; its MLPs are `4·width` wide).
    Transformer,
}

/// What to train and how.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainConfig {
    /// The model (and with it the task).
    pub model: ModelKind,
    /// The seed of the data and of the initial parameters.
    pub seed: u64,
    /// Examples per step (a multiple of `micro_batch`).
    pub global_batch: u64,
    /// Examples per micro-batch.
    pub micro_batch: u64,
    /// AdamW learning rate.
    pub lr: f32,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// The modulus of the modular-addition task (classes).
    pub modulus: u32,
    /// Digits the transformer reverses (its context is twice that).
    pub digits: u32,
    /// Embedding width of the MLP, model width of the transformer.
    pub width: u64,
    /// Hidden width of the MLP.
    pub hidden: u64,
    /// Attention heads of the transformer.
    pub heads: u64,
    /// Blocks of the transformer.
    pub layers: u64,
    /// Steps between re-splitting the batch from the learned speeds, which is also
    /// done after each of the first that many steps (0: never).
    pub rebalance_every: u64,
    /// When a device lacks a standard operation the model needs, run that operation
    /// of its replica on the first device of the group that has it (the scheduler
    /// moves the data) instead of refusing the device.
    #[serde(default)]
    pub allow_fallback: bool,
    /// What parameters, activations and gradients are stored and multiplied in
    /// ([`Precision`]); the masters, the moments and the accumulation over the batch
    /// are `f32` in every case.
    #[serde(default)]
    pub precision: Precision,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Mlp,
            seed: 1,
            global_batch: 256,
            micro_batch: 32,
            lr: 3e-3,
            weight_decay: 0.01,
            modulus: 23,
            digits: 6,
            width: 32,
            hidden: 128,
            heads: 4,
            layers: 2,
            rebalance_every: 10,
            allow_fallback: false,
            precision: Precision::F32,
        }
    }
}

impl TrainConfig {
    /// The transformer's defaults: 2 blocks of width 64 and 4 heads reversing 6 digits,
    /// 64 sequences per step in micro-batches of 8.
    pub fn transformer() -> TrainConfig {
        TrainConfig {
            model: ModelKind::Transformer,
            global_batch: 64,
            micro_batch: 8,
            width: 64,
            ..TrainConfig::default()
        }
    }

    /// The loss scale a run starts with: 1 unless the precision scales the loss.
    pub(crate) fn initial_loss_scale(&self) -> f32 {
        if self.precision.scales_loss() {
            LossScale::default().scale
        } else {
            1.0
        }
    }

    fn check(&self) -> Result<()> {
        if self.micro_batch == 0 || self.global_batch == 0 {
            return Err(Error::invalid(
                "the global batch and the micro-batch must be at least 1 example",
            ));
        }
        if !self.global_batch.is_multiple_of(self.micro_batch) {
            return Err(Error::invalid(format!(
                "the global batch ({}) is not a multiple of the micro-batch ({}); choose sizes that divide",
                self.global_batch, self.micro_batch
            )));
        }
        if self.global_batch > 1 << 20 || self.micro_batch > 1 << 16 {
            return Err(Error::invalid(format!(
                "a global batch of {} and micro-batches of {} examples are more than this trainer takes (2^20 and 2^16)",
                self.global_batch, self.micro_batch
            )));
        }
        if !(2..=1 << 16).contains(&self.modulus) {
            return Err(Error::invalid(format!(
                "the modulus is {}; give 2 to 65536",
                self.modulus
            )));
        }
        if !(1..=1 << 14).contains(&self.width) || !(1..=1 << 14).contains(&self.hidden) {
            return Err(Error::invalid(format!(
                "widths of {} (model) and {} (hidden) are outside 1 to 16384",
                self.width, self.hidden
            )));
        }
        if !(1..=64).contains(&self.digits) {
            return Err(Error::invalid(format!(
                "{} digits to reverse: give 1 to 64",
                self.digits
            )));
        }
        let rate_ok = self.lr.is_finite() && self.lr > 0.0;
        let decay_ok = self.weight_decay.is_finite() && self.weight_decay >= 0.0;
        if !(rate_ok && decay_ok) {
            return Err(Error::invalid(format!(
                "learning rate {} and weight decay {} must be finite, the rate above 0 and the decay at least 0",
                self.lr, self.weight_decay
            )));
        }
        Ok(())
    }
}

/// The first standard operation the model needs on `dtype` that `device` does not
/// provide.
fn missing_op(model: &dyn Model, device: &Device, dtype: DType) -> Option<xpu_hal::ops::OpKind> {
    missing_ops(model, device, dtype).first().copied()
}

/// The standard operations the model needs on `dtype` that `device` does not provide
/// (the update's reduction and AdamW run on `f32`).
fn missing_ops(model: &dyn Model, device: &Device, dtype: DType) -> Vec<xpu_hal::ops::OpKind> {
    let caps = device.capabilities();
    let on = |k: xpu_hal::ops::OpKind| match k {
        xpu_hal::ops::OpKind::AdamW | xpu_hal::ops::OpKind::Reduce => DType::F32,
        _ => dtype,
    };
    model
        .ops()
        .iter()
        .copied()
        .chain([xpu_hal::ops::OpKind::Reduce])
        .filter(|k| !caps.supports_op(*k, on(*k)))
        .fold(Vec::new(), |mut out, k| {
            if !out.contains(&k) {
                out.push(k);
            }
            out
        })
}

/// For each device, where each operation it lacks runs instead: the first device of
/// `devices` that provides it (with `allow`), else the error naming the operation.
fn fallbacks(
    model: &dyn Model,
    devices: &[Device],
    allow: bool,
    dtype: DType,
) -> Result<Vec<Vec<(xpu_hal::ops::OpKind, Device)>>> {
    devices
        .iter()
        .map(|d| {
            missing_ops(model, d, dtype)
                .into_iter()
                .map(|op| {
                    if !allow {
                        return Err(Error::unsupported(format!(
                            "{} does not provide the standard operation {op} on {dtype}, which the model needs; choose other devices (`xpu devices` lists what each provides), another --dtype, or let another device of the group run it with --allow-fallback",
                            d.id()
                        )));
                    }
                    devices
                        .iter()
                        .find(|o| missing_ops(model, o, dtype).iter().all(|k| *k != op))
                        .map(|o| (op, o.clone()))
                        .ok_or_else(|| {
                            Error::unsupported(format!(
                                "{} does not provide the standard operation {op} on {dtype} and no device of the group does; add one that does (`xpu devices` lists what each provides)",
                                d.id()
                            ))
                        })
                })
                .collect()
        })
        .collect()
}

/// The first standard operation the model of `config` needs that `device` does not
/// provide, if any (to leave such devices out of a default selection).
pub fn unsupported_op(
    config: &TrainConfig,
    device: &Device,
) -> Result<Option<xpu_hal::ops::OpKind>> {
    let (model, _) = model_of(config)?;
    Ok(missing_op(model.as_ref(), device, config.precision.dtype()))
}

/// Input tokens of one global batch of `config` drawn from `data`.
pub(crate) fn tokens_per_step(data: &dyn Dataset, config: &TrainConfig) -> u64 {
    data.examples(0, 1).tokens.len() as u64 * config.global_batch
}

/// The model and task of `config`.
pub(crate) fn model_of(config: &TrainConfig) -> Result<(Box<dyn Model>, Box<dyn Dataset>)> {
    Ok(match config.model {
        ModelKind::Mlp => (
            Box::new(Mlp::new(MlpShape {
                classes: u64::from(config.modulus),
                embed: config.width,
                hidden: config.hidden,
                micro_batch: config.micro_batch,
            })?),
            Box::new(ModularAddition {
                modulus: config.modulus,
                seed: config.seed,
            }),
        ),
        ModelKind::Transformer => {
            let data = Reverse {
                digits: config.digits,
                seed: config.seed,
            };
            (
                Box::new(Transformer::new(TransformerShape {
                    vocab: 11,
                    context: data.context(),
                    width: config.width,
                    heads: config.heads,
                    layers: config.layers,
                    micro_batch: config.micro_batch,
                })?),
                Box::new(data),
            )
        }
    })
}

/// What differs between two texts, as `(theirs, ours)`: the differing fields when
/// both are JSON objects, else the texts themselves.
fn differences(theirs: &str, ours: &str) -> (String, String) {
    let parse = |t: &str| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t);
    if let (Ok(a), Ok(b)) = (parse(theirs), parse(ours)) {
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let mut left = Vec::new();
        let mut right = Vec::new();
        for k in keys {
            let (x, y) = (a.get(k), b.get(k));
            if x != y {
                let show =
                    |v: Option<&serde_json::Value>| v.map_or("nothing".into(), |v| v.to_string());
                left.push(format!("{k} {}", show(x)));
                right.push(format!("{k} {}", show(y)));
            }
        }
        return (left.join(", "), right.join(", "));
    }
    (format!("`{theirs}`"), format!("`{ours}`"))
}

/// The share of the measured step time a new split must save to replace the current
/// one.
const SPLIT_GAIN: f64 = 0.03;
/// How far, as a share of the predicted step time, a split one micro-batch away from
/// the models' choice may be predicted slower and still be measured against it: the
/// models leave out what devices running side by side cost each other (shared cores,
/// caches, memory bandwidth), so splits they put this close are settled by their
/// measured step times.
const NEAR_TIE: f64 = 0.1;

/// How many times slower than before, against the others, a device must become to be
/// reported as a straggler.
pub const STRAGGLER_FACTOR: f64 = 1.5;

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The step number, from 1.
    pub step: u64,
    /// The mean loss over the global batch.
    pub loss: f64,
    /// Micro-batches each replica computed.
    pub shares: Vec<u64>,
    /// The replicas' devices, in the order of `shares`.
    pub devices: Vec<String>,
    /// Devices left out of the group after this step, each with the reason.
    pub left_out: Vec<String>,
    /// Wall-clock seconds of the step.
    pub seconds: f64,
    /// Input tokens of the global batch.
    pub tokens: u64,
    /// Floating-point operations of the step's matrix products, on all replicas (the
    /// model FLOPs of a utilisation figure).
    pub matmul_flops: u64,
    /// Devices the rebalancing after this step found slower than at the one before,
    /// against the others: each with how much, and its new share.
    pub stragglers: Vec<String>,
    /// With loss scaling: the scale the step's gradients were computed with.
    pub loss_scale: Option<f32>,
    /// Whether the update was skipped (with loss scaling, the gradients overflowed;
    /// the scale is halved for the next step).
    pub skipped: bool,
}

/// Data-parallel training of one model over a set of devices.
pub struct Trainer {
    config: TrainConfig,
    sched: Scheduler,
    comm: Option<Communicator>,
    model: Box<dyn Model>,
    data: Box<dyn Dataset>,
    replicas: Vec<Replica>,
    shares: Vec<u64>,
    /// The tasks of one micro-batch (forward and backward), for predicted times.
    micro_batch_tasks: Vec<Task>,
    /// The first replica's tasks of one step outside its micro-batches (collectives
    /// aside): the work a replica does once per step whatever its share (zeroing,
    /// summing, the update), for predicted times.
    step_tasks: Vec<Task>,
    /// Step times of the splits used lately (replayed steps only).
    measured: split::Measured,
    step: u64,
    /// Input tokens of one global batch.
    tokens_per_step: u64,
    /// Each device's predicted time of a micro-batch at the last rebalancing.
    predicted: Vec<(String, f64)>,
    /// With `f16`, the dynamic loss scale.
    loss_scale: Option<LossScale>,
    /// Per micro-batch of a step, its tokens' and labels' handles (written each step).
    inputs: Vec<(Handle, Handle)>,
    /// The step recorded for replay, if any.
    replay: Option<Replay>,
    /// Matrix-product FLOPs of the replayed steps.
    replayed_flops: u64,
    /// Steps replayed so far.
    replayed: u64,
}

/// A step recorded for replay, with what it was recorded for.
struct Replay {
    /// The shares and the loss scale (its bits) it was recorded with.
    key: (Vec<u64>, Option<u32>),
    graph: Graph,
    /// Its matrix products' FLOPs.
    flops: u64,
}

impl Trainer {
    /// A trainer of the MLP on `devices` (one replica each, in order), its parameters
    /// initialised from the seed.
    pub fn new(devices: &[Device], config: TrainConfig) -> Result<Trainer> {
        config.check()?;
        if devices.is_empty() {
            return Err(Error::invalid("no device to train on; select at least one"));
        }
        let comm = if devices.len() > 1 {
            Some(Communicator::new(
                devices.to_vec(),
                CommOptions::from_env()?,
            )?)
        } else {
            None
        };
        Trainer::build(devices, config, comm)
    }

    /// A trainer whose group is `comm`'s ranks, in every process the communicator spans
    /// (one replica per rank, in rank order; this process holds the replicas of its own
    /// ranks). Every process calls this with the same configuration (checked) and then
    /// makes the same calls in the same order: each step is one step of the whole
    /// group, the global batch shared among all its ranks, and every process reports
    /// the same losses. A communicator within one process gives the trainer of
    /// [`Trainer::new`] on its devices.
    ///
    /// Across processes no device is left out of the group (re-forming it would need
    /// every process), and the all-reduce of a bucket waits for the bucket's backward
    /// pass on this process's devices.
    pub fn across(comm: Communicator, config: TrainConfig) -> Result<Trainer> {
        config.check()?;
        let devices = comm.devices().to_vec();
        if devices.is_empty() {
            return Err(Error::invalid("no device to train on; select at least one"));
        }
        let procs = comm.processes();
        if procs.is_empty() {
            let comm = (devices.len() > 1).then_some(comm);
            return Trainer::build(&devices, config, comm);
        }
        let trainer = Trainer::build(&devices, config, Some(comm))?;
        let text = serde_json::to_string(&trainer.config).map_err(|e| {
            Error::invalid(format!(
                "could not encode the configuration to compare it: {e}"
            ))
        })?;
        trainer.agree("training configuration", &text)?;
        Ok(trainer)
    }

    /// The trainer on `devices` (this process's replicas) with `comm` over them (and,
    /// when it spans processes, the other processes' ranks).
    fn build(
        devices: &[Device],
        config: TrainConfig,
        comm: Option<Communicator>,
    ) -> Result<Trainer> {
        let (model, data) = model_of(&config)?;
        let mut fallback = fallbacks(
            model.as_ref(),
            devices,
            config.allow_fallback,
            config.precision.dtype(),
        )?
        .into_iter();
        // The devices' speeds are learned afresh in every run (the first steps
        // calibrate them): a speed from an earlier run, under other load or an
        // injected fault, would misplace the first steps and could leave a device
        // out for good.
        let sched = Scheduler::new(
            devices,
            SchedulerOptions {
                no_persist: true,
                ..SchedulerOptions::from_env()?
            },
        )?;
        let micro_batches = config.global_batch / config.micro_batch;
        let mut replicas = Vec::with_capacity(devices.len());
        for (sched_index, device) in devices.iter().enumerate() {
            replicas.push(Replica::new(
                &sched,
                device,
                sched_index,
                model.as_ref(),
                data.as_ref(),
                &config,
                fallback.next().unwrap_or_default(),
            )?);
        }
        let ranks = comm.as_ref().map_or(devices.len(), Communicator::size);
        let shares = split::proportional(micro_batches, &vec![None; ranks]);
        let tokens_per_step = tokens_per_step(data.as_ref(), &config);
        let config_scales = config.precision.scales_loss();
        let sample = data.examples(0, config.micro_batch as usize);
        let inputs = (0..micro_batches)
            .map(|_| {
                Ok((
                    sched.create(sample.tokens.len() as u64 * 4)?,
                    sched.create(sample.labels.len() as u64 * 4)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Trainer {
            data,
            config,
            sched,
            comm,
            model,
            replicas,
            shares,
            micro_batch_tasks: Vec::new(),
            step_tasks: Vec::new(),
            measured: split::Measured::default(),
            step: 0,
            tokens_per_step,
            predicted: Vec::new(),
            loss_scale: config_scales.then(LossScale::default),
            inputs,
            replay: None,
            replayed_flops: 0,
            replayed: 0,
        })
    }

    /// The communicator when the group spans processes (the other processes hold the
    /// replicas of the ranks that are not this process's).
    fn span(&self) -> Option<&Communicator> {
        self.comm.as_ref().filter(|c| !c.processes().is_empty())
    }

    /// Ranks of the group, in every process.
    pub fn ranks(&self) -> usize {
        self.span().map_or(self.replicas.len(), Communicator::size)
    }

    /// The rank of this process's first replica (0 unless the group spans processes).
    pub fn first_rank(&self) -> usize {
        self.span().map_or(0, Communicator::first_rank)
    }

    /// Every rank's device name, in rank order; across processes each with its process
    /// (`host:0@p1`).
    pub fn rank_names(&self) -> Vec<String> {
        match self.span() {
            Some(c) => c
                .processes()
                .iter()
                .flat_map(|p| p.devices.iter().map(move |d| format!("{d}@p{}", p.index)))
                .collect(),
            None => self
                .replicas
                .iter()
                .map(|r| r.device.id().to_string())
                .collect(),
        }
    }

    /// `mine` (one value per position, this process's filled in, zero elsewhere) with
    /// every process's positions filled in: a sum over the processes, exact because
    /// each position has one non-zero contributor. Within one process, `mine` itself.
    fn everywhere(&self, mine: Vec<f32>) -> Result<Vec<f32>> {
        let Some(comm) = self.span() else {
            return Ok(mine);
        };
        let zeros = vec![0f32; mine.len()];
        let mut handles = Vec::with_capacity(self.replicas.len());
        for i in 0..self.replicas.len() {
            let values = if i == 0 { &mine } else { &zeros };
            let buffer = HostBuffer::from_bytes(bytemuck::cast_slice(values))?;
            handles.push(self.sched.register(buffer)?);
        }
        let summed = self
            .sched
            .all_reduce(comm, &handles, DType::F32, ReduceOp::Sum)
            .and_then(|_| self.sched.read(handles[0]));
        for h in handles {
            self.sched.unregister(h)?;
        }
        Ok(bytemuck::pod_collect_to_vec(&summed?))
    }

    /// The group's communicator (none for a single device in one process).
    pub fn communicator(&self) -> Option<&Communicator> {
        self.comm.as_ref()
    }

    /// Aborts the group's communicator: every rank waiting in one of its collectives,
    /// in every process it spans, returns an error. (After a failure within a group
    /// across processes, so that the other processes stop instead of waiting out the
    /// timeout.)
    pub fn abort(&self) {
        if let Some(comm) = &self.comm {
            comm.abort();
        }
    }

    /// Checks that every process of the group gives the same `text` for `what` (its
    /// options, its configuration as JSON), naming the first process that differs and
    /// what differs. Within one process there is nothing to compare.
    pub fn agree(&self, what: &str, text: &str) -> Result<()> {
        let Some(comm) = self.span() else {
            return Ok(());
        };
        let procs = comm.processes();
        let Some(me) = procs.iter().position(|p| p.first_rank == self.first_rank()) else {
            return Ok(());
        };
        // The lengths, then the bytes (each exact in f32), every process in its row.
        let mut lengths = vec![0f32; procs.len()];
        lengths[me] = text.len() as f32;
        let lengths = self.everywhere(lengths)?;
        let longest = lengths.iter().fold(0f32, |a, &b| a.max(b)) as usize;
        let mut bytes = vec![0f32; procs.len() * longest];
        for (slot, &b) in bytes[me * longest..].iter_mut().zip(text.as_bytes()) {
            *slot = f32::from(b);
        }
        let bytes = self.everywhere(bytes)?;
        for (p, (row, &len)) in procs.iter().zip(bytes.chunks(longest.max(1)).zip(&lengths)) {
            let theirs: Vec<u8> = row.iter().take(len as usize).map(|&b| b as u8).collect();
            if theirs == text.as_bytes() {
                continue;
            }
            let (theirs, ours) = differences(&String::from_utf8_lossy(&theirs), text);
            return Err(Error::invalid(format!(
                "the processes of the group were started with different {what}s: {} has {theirs}, this one ({}) {ours}; start every process with the same options",
                p.describe(),
                procs[me].describe(),
            )));
        }
        Ok(())
    }

    /// Steps done so far.
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// Steps replayed from a recorded one so far (see [`Trainer::step`]).
    pub fn replayed_steps(&self) -> u64 {
        self.replayed
    }

    /// The parameter count.
    pub fn parameters(&self) -> u64 {
        self.model.layout().total()
    }

    /// Micro-batches each rank of the group computes in the next step.
    pub fn shares(&self) -> &[u64] {
        &self.shares
    }

    /// Fixes the micro-batches each replica computes (in rank order; they must add up
    /// to the step's micro-batches). Rebalancing may change them again.
    pub fn set_shares(&mut self, shares: &[u64]) -> Result<()> {
        let total = self.config.global_batch / self.config.micro_batch;
        if shares.len() != self.ranks() || shares.iter().sum::<u64>() != total {
            return Err(Error::invalid(format!(
                "shares {shares:?}: give one per rank of the group ({}) adding up to the {total} micro-batches of a step",
                self.ranks()
            )));
        }
        self.shares = shares.to_vec();
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The replicas' devices, in rank order.
    pub fn devices(&self) -> Vec<Device> {
        self.replicas.iter().map(|r| r.device.clone()).collect()
    }

    /// The scheduler the trainer runs on.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Replica `rank`'s parameters, bucket by bucket.
    pub fn read_parameters(&self, rank: usize) -> Result<Vec<Vec<f32>>> {
        let r = self
            .replicas
            .get(rank)
            .ok_or_else(|| Error::invalid(format!("there is no replica {rank}")))?;
        r.params
            .iter()
            .map(|h| Ok(bytemuck::pod_collect_to_vec(&self.sched.read(*h)?)))
            .collect()
    }

    /// One training step over the next global batch.
    ///
    /// The first `rebalance_every` steps, whose timings calibrate the scheduler's
    /// models and feed a rebalancing each, submit their tasks one by one. The others
    /// replay the step recorded with the current split and loss scale
    /// ([`Scheduler::record`]): the same tasks, without their submission cost, the
    /// inputs written into the same handles — every `rebalance_every`-th task by task
    /// with every task timed ([`Scheduler::time_every_task`]), so that the models follow
    /// the devices for the rebalancing after it. The update (AdamW's step count changes
    /// every step) is submitted every time.
    pub fn step(&mut self) -> Result<StepReport> {
        let start = Instant::now();
        let flops_before: u64 = self.matmul_flops();
        let n = self.config.micro_batch;
        let shares = self.shares.clone();
        // The order of the sum and the blocks the replicas exchange.
        let plan = Plan::new(&shares);
        if self.comm.is_some() {
            for r in &mut self.replicas {
                r.set_exchange(&self.sched, plan.rows)?;
            }
        }
        // Every micro-batch's inputs, into its handles.
        let first_example = self.step * self.config.global_batch;
        for (j, &(tokens, labels)) in self.inputs.iter().enumerate() {
            let ex = self.data.examples(first_example + j as u64 * n, n as usize);
            self.sched.write(tokens, bytemuck::cast_slice(&ex.tokens))?;
            self.sched.write(labels, bytemuck::cast_slice(&ex.labels))?;
        }
        let step = self.step + 1;
        let every = self.config.rebalance_every;
        let learning = every > 0 && (step <= every || step.is_multiple_of(every));
        let loss_scale = self.loss_scale.map(|s| s.scale);
        let key = (shares.clone(), loss_scale.map(f32::to_bits));
        // Only steps replayed untimed measure a split's speed.
        let plain = !learning && self.replay.as_ref().is_some_and(|r| r.key == key);
        match &self.replay {
            Some(r) if r.key == key && (!learning || step > every) => {
                // A later step the rebalancing learns from replays task by task, every
                // task timed (see below).
                self.sched.time_every_task(learning);
                let replayed = self.sched.replay(&r.graph);
                self.sched.time_every_task(false);
                replayed?;
                self.replayed_flops += r.flops;
                self.replayed += 1;
            }
            _ if !learning => {
                self.replay = None;
                self.record_step_tasks();
                let before = self.matmul_flops();
                let mut kept = None;
                let graph = self.sched.record(|_| {
                    kept = self.submit_step(&plan, &shares, loss_scale)?;
                    Ok(())
                })?;
                self.replay = Some(Replay {
                    key,
                    graph,
                    flops: self.matmul_flops().saturating_sub(before),
                });
                if let Some(kept) = kept {
                    self.micro_batch_tasks = kept;
                }
            }
            _ => {
                // The rebalancing after this step predicts from what it measures: after
                // the first steps (which calibrate the models anyway), every task is
                // timed, so that the models follow a device that slowed down.
                self.sched.time_every_task(step > every);
                self.record_step_tasks();
                let submitted = self.submit_step(&plan, &shares, loss_scale);
                self.sched.time_every_task(false);
                if let Some(kept) = submitted? {
                    self.micro_batch_tasks = kept;
                }
            }
        }
        let replicas: Vec<&Replica> = self.replicas.iter().collect();
        let skipped = crate::replica::apply_all(
            &replicas,
            &self.sched,
            &self.config,
            step,
            &mut self.loss_scale,
        )?;
        if let Some(tasks) = self.replicas.first().and_then(|r| {
            r.step_recording
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
        }) {
            self.step_tasks = tasks;
        }
        // The losses, in example order (each process's, gathered across processes).
        let rows = self.model.loss_rows();
        let ranges = split::ranges(&shares);
        let mut losses = vec![0f32; (plan.m * rows) as usize];
        for (r, range) in self.replicas.iter().zip(&ranges[self.first_rank()..]) {
            if range.is_empty() {
                continue;
            }
            let mine = r.decode(&self.sched.read(r.loss)?)?;
            let (at, n) = (
                (range.start * rows) as usize,
                ((range.end - range.start) * rows) as usize,
            );
            let (Some(to), Some(from)) = (losses.get_mut(at..at + n), mine.get(..n)) else {
                return Err(Error::invalid(
                    "internal error: a replica's losses do not fit its micro-batches",
                ));
            };
            to.copy_from_slice(from);
        }
        let sum: f64 = self.everywhere(losses)?.iter().map(|&l| f64::from(l)).sum();
        self.sched.wait_all()?;
        self.step = step;
        if plain {
            self.measured.add(&shares, start.elapsed().as_secs_f64());
        }
        // Early on, after every step (as soon as the models know every device); then
        // every `rebalance_every` steps.
        let devices = self.rank_names();
        let (mut left_out, mut stragglers) = (Vec::new(), Vec::new());
        if learning {
            (left_out, stragglers) = self.rebalance(step < every)?;
            if step <= every {
                // Early predictions still move as the models calibrate: a change
                // then is no slowdown.
                stragglers.clear();
            }
        }
        Ok(StepReport {
            step,
            devices,
            left_out,
            loss: sum / (self.config.global_batch * self.data.targets_per_example()) as f64,
            shares,
            seconds: start.elapsed().as_secs_f64(),
            tokens: self.tokens_per_step,
            matmul_flops: self.matmul_flops().saturating_sub(flops_before),
            stragglers,
            loss_scale,
            skipped,
        })
    }

    /// Keeps the first replica's tasks of the step about to be submitted, the first
    /// time (see `step_tasks`).
    fn record_step_tasks(&self) {
        if self.step_tasks.is_empty() {
            if let Some(r) = self.replicas.first() {
                *r.step_recording.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
            }
        }
    }

    /// Submits one step up to the summed gradients: the slots zeroed, every replica's
    /// micro-batches (of `shares`) in rounds aligned at the end, each bucket's blocks
    /// exchanged as soon as the backward pass has finished it, and the tree of `plan`
    /// summed (divided by the loss `scale`, if any). Returns the tasks of one
    /// micro-batch when they were not kept yet.
    fn submit_step(
        &self,
        plan: &Plan,
        shares: &[u64],
        scale: Option<f32>,
    ) -> Result<Option<Vec<Task>>> {
        let dtype = self.config.precision.dtype();
        let zero = Codelet::from_builtin(Builtin::Fill {
            value: Scalar::from_f64(dtype, 0.0),
        });
        for r in &self.replicas {
            for g in &r.grad_slots {
                let task = Task::new(&zero).write(*g).on(&r.device);
                r.note(&task);
                self.sched.submit(task)?;
            }
        }
        let rows = self.model.loss_rows();
        // This process's replicas' micro-batches (the ranks from `first` on).
        let first = self.first_rank();
        let batches: Vec<Vec<MicroBatch>> = split::ranges(shares)
            .into_iter()
            .skip(first)
            .take(self.replicas.len())
            .map(|range| {
                range
                    .enumerate()
                    .map(|(k, j)| MicroBatch {
                        index: j,
                        tokens: self.inputs[j as usize].0,
                        labels: self.inputs[j as usize].1,
                        loss_offset: k as u64 * rows,
                    })
                    .collect()
            })
            .collect();
        let rounds = shares.iter().copied().max().unwrap_or(0);
        let buckets = self.model.layout().specs.len();
        let mut kept = None;
        let keep = self.micro_batch_tasks.is_empty();
        for round in 0..rounds {
            let last = round + 1 == rounds;
            for (r, mine) in self.replicas.iter().zip(&batches) {
                let share = mine.len() as u64;
                if round < rounds - share {
                    continue;
                }
                let mb = &mine[(round - (rounds - share)) as usize];
                if keep && kept.is_none() && !last {
                    *r.recording.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
                }
                r.micro_batch(|| self.model.forward(&self.sched, r, mb))?;
                if !last {
                    for bucket in (0..buckets).rev() {
                        r.micro_batch(|| self.model.backward(&self.sched, r, mb, bucket))?;
                    }
                    if let Some(tasks) =
                        r.recording.lock().unwrap_or_else(|p| p.into_inner()).take()
                    {
                        kept = Some(tasks);
                    }
                }
            }
            if last {
                for bucket in (0..buckets).rev() {
                    for (r, mine) in self.replicas.iter().zip(&batches) {
                        if let Some(mb) = mine.last() {
                            r.micro_batch(|| self.model.backward(&self.sched, r, mb, bucket))?;
                        }
                    }
                    for (i, r) in self.replicas.iter().enumerate() {
                        r.sum_blocks(&self.sched, plan, first + i, bucket)?;
                    }
                    if let Some(comm) = &self.comm {
                        let blocks: Vec<_> =
                            self.replicas.iter().map(|r| r.exchange[bucket]).collect();
                        self.sched
                            .all_reduce(comm, &blocks, DType::F32, ReduceOp::Sum)?;
                    }
                }
            }
        }
        let replicas: Vec<&Replica> = self.replicas.iter().collect();
        crate::replica::sum_all(&replicas, &self.sched, plan, first, scale)?;
        Ok(kept)
    }

    /// The dynamic loss scale (with `f16`).
    pub fn loss_scale(&self) -> Option<LossScale> {
        self.loss_scale
    }

    /// Floating-point operations of the matrix products submitted on every replica so
    /// far.
    fn matmul_flops(&self) -> u64 {
        self.replicas
            .iter()
            .map(|r| r.matmul_flops.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.replayed_flops
    }

    /// The run's state after the last step, copied to host memory (replica 0's
    /// parameters and moments: every replica holds the same) for a [`crate::checkpoint::Writer`].
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let r = &self.replicas[0];
        let read =
            |h| -> Result<Vec<f32>> { Ok(bytemuck::pod_collect_to_vec(&self.sched.read(h)?)) };
        let buckets = (0..r.params.len())
            .map(|b| Ok([read(r.params[b])?, read(r.m[b])?, read(r.v[b])?]))
            .collect::<Result<Vec<_>>>()?;
        Ok(Checkpoint {
            config: self.config.clone(),
            step: self.step,
            shares: self.shares.clone(),
            params: Checkpoint::entries(self.model.layout()),
            buckets,
            loss_scale: self.loss_scale,
        })
    }

    /// Continues from `c` on this trainer's devices (any number of them: with as many
    /// as the checkpoint's run, its split too). Refused, with nothing changed, when the
    /// checkpoint's model, task or optimisation differ from this trainer's.
    pub fn restore(&mut self, c: &Checkpoint) -> Result<()> {
        let (a, b) = (&c.config, &self.config);
        let fields = [
            ("model", format!("{:?}", a.model), format!("{:?}", b.model)),
            ("seed", a.seed.to_string(), b.seed.to_string()),
            (
                "batch",
                a.global_batch.to_string(),
                b.global_batch.to_string(),
            ),
            (
                "micro-batch",
                a.micro_batch.to_string(),
                b.micro_batch.to_string(),
            ),
            ("learning rate", a.lr.to_string(), b.lr.to_string()),
            (
                "weight decay",
                a.weight_decay.to_string(),
                b.weight_decay.to_string(),
            ),
            ("modulus", a.modulus.to_string(), b.modulus.to_string()),
            ("digits", a.digits.to_string(), b.digits.to_string()),
            ("width", a.width.to_string(), b.width.to_string()),
            ("hidden width", a.hidden.to_string(), b.hidden.to_string()),
            ("heads", a.heads.to_string(), b.heads.to_string()),
            ("layers", a.layers.to_string(), b.layers.to_string()),
        ];
        for (name, theirs, ours) in fields {
            if theirs != ours {
                return Err(Error::invalid(format!(
                    "the checkpoint (step {}) was made with {name} {theirs}, this run has {ours}; resume with the same settings"
                , c.step)));
            }
        }
        let entries = Checkpoint::entries(self.model.layout());
        if c.params != entries
            || c.buckets.len() != entries.len()
            || c.buckets
                .iter()
                .zip(&self.model.layout().bucket_elements)
                .any(|(b, &e)| b.iter().any(|part| part.len() as u64 != e))
        {
            return Err(Error::invalid(
                "the checkpoint's parameters do not match this model's names and shapes; nothing was loaded",
            ));
        }
        for r in &mut self.replicas {
            for (b, [params, m, v]) in c.buckets.iter().enumerate() {
                for (handle, values) in [
                    (&mut r.params[b], params),
                    (&mut r.m[b], m),
                    (&mut r.v[b], v),
                ] {
                    let new = self
                        .sched
                        .register(HostBuffer::from_bytes(bytemuck::cast_slice(values))?)?;
                    let old = std::mem::replace(handle, new);
                    self.sched.unregister(old)?;
                }
            }
        }
        // The compute copies from the masters; an `f16` run goes on with the
        // checkpoint's loss scale (a fresh one when it was saved by another precision).
        if let Some(scale) = &mut self.loss_scale {
            *scale = c.loss_scale.unwrap_or_default();
        }
        for r in &self.replicas {
            for b in 0..r.params.len() {
                r.refresh(&self.sched, b)?;
            }
            if let Some(scale) = self.loss_scale {
                r.set_loss_scale(&self.sched, scale.scale)?;
            }
        }
        self.step = c.step;
        if c.shares.len() == self.ranks() {
            self.shares = c.shares.clone();
        }
        self.replay = None;
        Ok(())
    }

    /// Re-splits the micro-batches so that the step ends soonest ([`split::fastest`]),
    /// from each device's predicted time for one micro-batch (the scheduler's learned
    /// models, over the tasks every device's models predict); unchanged while fewer
    /// than half of them are calibrated on some device. Across processes each process
    /// predicts its own devices and the predictions are exchanged, so that every
    /// process computes the same split.
    ///
    /// In the `early` phase (before step `rebalance_every`, while the models still rest
    /// on cold first runs) every device keeps at least one micro-batch. From then on, a
    /// device whose share would be no micro-batch at all is left out of the group (it
    /// would only slow the all-reduce and the update down): its replica is dropped and
    /// the communicator re-formed over the others. (Across processes every device
    /// keeps at least one micro-batch.) Returns those left out, with the reason, and the
    /// stragglers: devices predicted [`STRAGGLER_FACTOR`] times slower than at the last
    /// rebalancing, relative to the others.
    fn rebalance(&mut self, early: bool) -> Result<(Vec<String>, Vec<String>)> {
        if self.ranks() < 2 {
            return Ok((Vec::new(), Vec::new()));
        }
        let (predicted, fixed) = self.predictions()?;
        if !predicted.iter().all(Option::is_some) {
            return Ok((Vec::new(), Vec::new()));
        }
        let total = self.config.global_batch / self.config.micro_batch;
        // Early predictions rest on cold first runs: every device keeps at least one
        // micro-batch then, and only a later rebalancing may leave one out.
        let floor = u64::from(early || self.span().is_some());
        // Whether a device is worth keeping is judged on its micro-batches alone (the
        // per-step work, a small difference of predictions, only refines the split).
        let shares = split::at_least(split::fastest(total, &predicted, &[]), floor);
        let fastest = predicted
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.unwrap_or(f64::MAX).total_cmp(&b.1.unwrap_or(f64::MAX)))
            .map_or(0, |(i, _)| i);
        let names = self.rank_names();
        let slowed = self.slowdowns(&names, &predicted);
        self.predicted = names
            .iter()
            .zip(&predicted)
            .map(|(n, p)| (n.clone(), p.unwrap_or(0.0)))
            .collect();
        let mut left_out = Vec::new();
        let mut kept_times = predicted.clone();
        let mut kept_fixed = fixed.clone();
        if self.span().is_none() {
            let mut keep = Vec::new();
            kept_times.clear();
            kept_fixed.clear();
            for (i, r) in std::mem::take(&mut self.replicas).into_iter().enumerate() {
                if shares[i] > 0 || i == fastest || early {
                    keep.push(r);
                    kept_times.push(predicted[i]);
                    kept_fixed.push(fixed[i]);
                    continue;
                }
                left_out.push(format!(
                    "{}: a micro-batch takes it {:.2} ms against {:.2} ms on {}, so the step ends sooner without it ({total} micro-batches)",
                    r.device.id(),
                    predicted[i].unwrap_or(0.0) * 1e3,
                    predicted[fastest].unwrap_or(0.0) * 1e3,
                    names[fastest]
                ));
                self.release(&r)?;
            }
            self.replicas = keep;
        }
        if !left_out.is_empty() {
            self.replay = None;
            let devices: Vec<Device> = self.replicas.iter().map(|r| r.device.clone()).collect();
            self.comm = if devices.len() > 1 {
                Some(Communicator::new(devices, CommOptions::from_env()?)?)
            } else {
                None
            };
        }
        // Every device kept gets a micro-batch: it was kept on its micro-batches' speed.
        let mut next = split::at_least(split::fastest(total, &kept_times, &kept_fixed), 1);
        // The models' choice, checked against the step times measured with each split
        // lately (forgotten when the devices change).
        if !left_out.is_empty() || !slowed.is_empty() || next.len() != self.shares.len() {
            self.measured.clear();
        }
        // (Across processes each would measure its own times, and they must agree on
        // the split: the models decide alone there.)
        if !early && next.len() == self.shares.len() && self.span().is_none() {
            let candidates = split::near(&next, &kept_times, &kept_fixed, 1, NEAR_TIE);
            next = self.measured.choose(&self.shares, &candidates, SPLIT_GAIN);
        }
        let before = std::mem::replace(&mut self.shares, next);
        let kept_names = self.rank_names();
        let stragglers = slowed
            .into_iter()
            .map(|(i, was, now)| {
                let name = &names[i];
                let share = kept_names
                    .iter()
                    .position(|n| n == name)
                    .map_or(0, |k| self.shares[k]);
                format!(
                    "{name} slowed down: a micro-batch takes it {:.2} ms, {:.1}× the {:.2} ms of before; its share goes from {} to {share} of {total} micro-batches",
                    now * 1e3,
                    now / was,
                    was * 1e3,
                    before.get(i).copied().unwrap_or(0)
                )
            })
            .collect();
        Ok((left_out, stragglers))
    }

    /// Every rank's predicted time of one micro-batch, in seconds, and of the work it
    /// does once per step whatever its share (zero where it is not predicted): sums of
    /// the scheduler's predictions over the tasks of a micro-batch, and over those of a
    /// recorded step outside its micro-batches, each over the tasks every local
    /// device's model predicts, if at least half of them. `None` for a rank without a prediction
    /// of its micro-batch (across processes, those of a process without one).
    fn predictions(&self) -> Result<(Vec<Option<f64>>, Vec<f64>)> {
        let per = self.predicted_sums(&self.micro_batch_tasks);
        let mine: Vec<Option<f64>> = per.as_ref().map_or_else(
            || vec![None; self.replicas.len()],
            |p| p.iter().map(|&t| (t > 0.0).then_some(t)).collect(),
        );
        let fixed = self
            .predicted_sums(&self.step_tasks)
            .unwrap_or_else(|| vec![0.0; self.replicas.len()]);
        if self.span().is_none() {
            return Ok((mine, fixed));
        }
        // Across processes, each process's ranks in its rows: NaN marks a rank without
        // a prediction (NaN + 0 is NaN).
        let ranks = self.ranks();
        let mut all = vec![0f32; 2 * ranks];
        let first = self.first_rank();
        for (i, (p, f)) in mine.iter().zip(&fixed).enumerate() {
            all[first + i] = p.map_or(f32::NAN, |t| t as f32);
            all[ranks + first + i] = *f as f32;
        }
        let all = self.everywhere(all)?;
        let (times, fixed) = all.split_at(ranks);
        Ok((
            times
                .iter()
                .map(|&t| (t.is_finite() && t > 0.0).then_some(f64::from(t)))
                .collect(),
            fixed
                .iter()
                .map(|&f| {
                    if f.is_finite() {
                        f64::from(f).max(0.0)
                    } else {
                        0.0
                    }
                })
                .collect(),
        ))
    }

    /// Per local replica, the sum of the predicted times of `tasks` on its device, over
    /// the tasks every replica's model predicts; `None` unless that is at least half of
    /// them.
    fn predicted_sums(&self, tasks: &[Task]) -> Option<Vec<f64>> {
        let mut totals = vec![0.0f64; self.replicas.len()];
        let mut counted = 0usize;
        for t in tasks {
            let each: Option<Vec<f64>> = self
                .replicas
                .iter()
                .map(|r| self.sched.predict_task(t, r.sched_index))
                .collect();
            if let Some(each) = each {
                counted += 1;
                for (total, p) in totals.iter_mut().zip(each) {
                    *total += p;
                }
            }
        }
        (!tasks.is_empty() && counted * 2 >= tasks.len()).then_some(totals)
    }

    /// The ranks (by index, `names` their devices) whose predicted micro-batch time rose
    /// by [`STRAGGLER_FACTOR`] or more since the last rebalancing, relative to the median
    /// change of the others (a machine that slows down as a whole has no straggler):
    /// `(index, before, now)` in seconds.
    fn slowdowns(&self, names: &[String], predicted: &[Option<f64>]) -> Vec<(usize, f64, f64)> {
        let ratios: Vec<Option<(f64, f64)>> = names
            .iter()
            .zip(predicted)
            .map(|(name, now)| {
                let was = self.predicted.iter().find(|(n, _)| n == name)?.1;
                let now = (*now)?;
                (was > 0.0).then_some((was, now))
            })
            .collect();
        let mut out = Vec::new();
        for (i, ratio) in ratios.iter().enumerate() {
            let Some((was, now)) = *ratio else { continue };
            let mut others: Vec<f64> = ratios
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(_, r)| r.map(|(w, n)| n / w))
                .collect();
            if others.is_empty() {
                continue;
            }
            others.sort_by(f64::total_cmp);
            let median = others[others.len() / 2].max(1.0);
            if now / was >= STRAGGLER_FACTOR * median {
                out.push((i, was, now));
            }
        }
        out
    }

    /// Unregisters a dropped replica's buffers.
    fn release(&self, r: &Replica) -> Result<()> {
        for h in r.handles() {
            self.sched.unregister(h)?;
        }
        Ok(())
    }

    /// The share of the labelled rows of `examples` held-out examples (drawn after
    /// every training example a run of 2⁴⁰ examples could use) whose most likely class
    /// replica 0 predicts right.
    pub fn accuracy(&mut self, examples: u64) -> Result<f64> {
        let n = self.config.micro_batch;
        let r = &self.replicas[0];
        let (logits, classes) = self.model.logits(r);
        let rows_per_example = self.model.loss_rows() / n;
        let (mut right, mut counted) = (0u64, 0u64);
        let mut done = 0u64;
        while done < examples {
            let ex = self.data.examples((1 << 40) + done, n as usize);
            let tokens = self
                .sched
                .register(HostBuffer::from_bytes(bytemuck::cast_slice(&ex.tokens))?)?;
            let labels = self
                .sched
                .register(HostBuffer::from_bytes(bytemuck::cast_slice(&ex.labels))?)?;
            let mb = MicroBatch {
                index: 0,
                tokens,
                labels,
                loss_offset: 0,
            };
            self.model.forward(&self.sched, r, &mb)?;
            let values = r.decode(&self.sched.read(logits)?)?;
            let take = (examples - done).min(n);
            for (row, label) in ex
                .labels
                .iter()
                .enumerate()
                .take((take * rows_per_example) as usize)
            {
                if *label < 0 {
                    continue;
                }
                let c = classes as usize;
                let best = values[row * c..(row + 1) * c]
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i);
                right += u64::from(best as i32 == *label);
                counted += 1;
            }
            done += take;
            self.sched.unregister(tokens)?;
            self.sched.unregister(labels)?;
        }
        Ok(right as f64 / counted.max(1) as f64)
    }
}
