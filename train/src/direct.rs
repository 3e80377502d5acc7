//! The same training on one device without the scheduler: every operation enqueued in
//! order on one stream, each buffer an allocation of its own. It exists to measure what
//! the scheduler costs (`xpu bench train` compares the two in the same run) and gives
//! the same losses as [`crate::Trainer`] on that device.

use std::collections::HashMap;

use xpu_hal::{Device, Result, Scalar};
use xpu_scheduler::{Handle, Scheduler, SchedulerOptions};

use crate::data::Dataset;
use crate::exec::Direct;
use crate::model::{MicroBatch, Model};
use crate::precision::LossScale;
use crate::replica::Replica;
use crate::trainer::{model_of, tokens_per_step, TrainConfig};
use crate::tree::Plan;

/// Training of one replica straight on one device's stream.
pub struct DirectTrainer {
    config: TrainConfig,
    model: Box<dyn Model>,
    data: Box<dyn Dataset>,
    replica: Replica,
    /// Names the buffers (the models address them by handle); runs nothing.
    _names: Scheduler,
    exec: Direct,
    /// Per micro-batch, its tokens' and labels' handles.
    inputs: Vec<(Handle, Handle)>,
    step: u64,
    tokens_per_step: u64,
    /// With `f16`, the dynamic loss scale.
    loss_scale: Option<LossScale>,
}

impl DirectTrainer {
    /// A trainer of `config`'s model on `device` alone, initialised as
    /// [`crate::Trainer::new`] would.
    pub fn new(device: &Device, config: TrainConfig) -> Result<DirectTrainer> {
        let (model, data) = model_of(&config)?;
        let names = Scheduler::new(
            std::slice::from_ref(device),
            SchedulerOptions {
                no_persist: true,
                ..SchedulerOptions::default()
            },
        )?;
        let replica = Replica::new(
            &names,
            device,
            0,
            model.as_ref(),
            data.as_ref(),
            &config,
            Vec::new(),
        )?;
        let stream = device.create_stream()?;
        let mut memory = HashMap::new();
        for h in replica.handles() {
            let bytes = names.read(h)?;
            let a = device.allocate(bytes.len() as u64)?;
            stream.write(&a, &bytes)?;
            memory.insert(h, a);
        }
        let n = config.micro_batch as usize;
        let sample = data.examples(0, n);
        let mut inputs = Vec::new();
        for _ in 0..config.global_batch / config.micro_batch {
            let mut pair = Vec::with_capacity(2);
            for len in [sample.tokens.len(), sample.labels.len()] {
                let bytes = (len * 4) as u64;
                let h = names.create(bytes)?;
                memory.insert(h, device.allocate(bytes)?);
                pair.push(h);
            }
            inputs.push((pair[0], pair[1]));
        }
        stream.synchronize()?;
        let tokens_per_step = tokens_per_step(data.as_ref(), &config);
        let config_scales = config.precision.scales_loss();
        Ok(DirectTrainer {
            config,
            model,
            data,
            replica,
            _names: names,
            exec: Direct { stream, memory },
            inputs,
            step: 0,
            tokens_per_step,
            loss_scale: config_scales.then(LossScale::default),
        })
    }

    /// Input tokens of one step.
    pub fn tokens_per_step(&self) -> u64 {
        self.tokens_per_step
    }

    /// One step over the next global batch; returns the mean loss.
    pub fn step(&mut self) -> Result<f64> {
        let n = self.config.micro_batch;
        let r = &self.replica;
        let stream = &self.exec.stream;
        for g in &r.grad_slots {
            stream.fill(self.exec.allocation(*g)?, Scalar::from_f64(r.dtype, 0.0))?;
        }
        let first = self.step * self.config.global_batch;
        let buckets = self.model.layout().specs.len();
        let rows = self.model.loss_rows();
        for (j, &(tokens, labels)) in self.inputs.iter().enumerate() {
            let j = j as u64;
            let ex = self.data.examples(first + j * n, n as usize);
            stream.write(
                self.exec.allocation(tokens)?,
                bytemuck::cast_slice(&ex.tokens),
            )?;
            stream.write(
                self.exec.allocation(labels)?,
                bytemuck::cast_slice(&ex.labels),
            )?;
            let mb = MicroBatch {
                index: j,
                tokens,
                labels,
                loss_offset: j * rows,
            };
            self.model.forward(&self.exec, r, &mb)?;
            for bucket in (0..buckets).rev() {
                self.model.backward(&self.exec, r, &mb, bucket)?;
            }
        }
        self.step += 1;
        let plan = Plan::new(&[self.inputs.len() as u64]);
        for b in 0..r.bucket_elements.len() {
            r.sum_blocks(&self.exec, &plan, 0, b)?;
        }
        let scale = self.loss_scale.map(|s| s.scale);
        crate::replica::sum_all(&[r], &self.exec, &plan, 0, scale)?;
        crate::replica::apply_all(
            &[r],
            &self.exec,
            &self.config,
            self.step,
            &mut self.loss_scale,
        )?;
        let bytes = stream.read(self.exec.allocation(r.loss)?)?;
        let losses = r.decode(&bytes)?;
        let sum: f64 = losses.iter().map(|l| f64::from(*l)).sum();
        Ok(sum / (self.config.global_batch * self.data.targets_per_example()) as f64)
    }
}
