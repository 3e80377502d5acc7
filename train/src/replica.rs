//! One replica of the model on one device: its handles, and the layers a model is
//! built from, submitted as standard-operation tasks pinned to that device.

use xpu_hal::ops::{Layout, Op};
use xpu_hal::{DType, Device, Error, HostBuffer, Result};
use xpu_scheduler::{Handle, Scheduler, Task, TensorRef};

use crate::data::Dataset;
use crate::exec::Exec;
use crate::model::Model;
use crate::trainer::TrainConfig;

use crate::model::MicroBatch;
use crate::params::Slot;

/// The handles of one replica.
pub(crate) struct Replica {
    /// Its device.
    pub(crate) device: Device,
    /// The device's index among the scheduler's devices.
    pub(crate) sched_index: usize,
    /// Parameters, gradients and the AdamW moments, one handle per bucket each.
    pub(crate) params: Vec<Handle>,
    /// Per bucket, one slot of gradients per micro-batch of the step (`[M, elements]`):
    /// a micro-batch's gradients accumulate into its own slot, zero elsewhere, so that
    /// the all-reduce gives every replica every micro-batch's gradients exactly.
    pub(crate) grad_slots: Vec<Handle>,
    /// Per bucket, the slots summed in micro-batch order.
    pub(crate) grads: Vec<Handle>,
    pub(crate) m: Vec<Handle>,
    pub(crate) v: Vec<Handle>,
    /// The model's activations and their gradients, for one micro-batch at a time.
    pub(crate) scratch: Vec<Handle>,
    /// The elements of each bucket.
    pub(crate) bucket_elements: Vec<u64>,
    /// The model's constant buffers.
    pub(crate) constants: Vec<Handle>,
    /// `[rows]` ones: a bias gradient is `onesᵀ·dy`.
    pub(crate) ones: Handle,
    /// `[rows]`: the gradient of each example's loss (1 / the global batch).
    pub(crate) dloss: Handle,
    /// Per-example losses of the replica's micro-batches this step.
    pub(crate) loss: Handle,
    /// When set, the tasks submitted are also kept here (to predict a micro-batch's
    /// time on each device from the scheduler's models).
    pub(crate) recording: std::sync::Mutex<Option<Vec<Task>>>,
    /// Floating-point operations of the matrix products submitted so far (the model
    /// FLOPs of the utilisation figure).
    pub(crate) matmul_flops: std::sync::atomic::AtomicU64,
    /// Operations the device lacks, each with the device that runs it instead.
    pub(crate) fallback: Vec<(xpu_hal::ops::OpKind, Device)>,
}

/// The floating-point operations of `op` when it is a matrix product: `2·k` per
/// element of the product, with `k` the contracted extent.
fn matmul_flops(op: &Op<TensorRef>) -> u64 {
    let Op::Matmul { a, c, trans_a, .. } = op else {
        return 0;
    };
    let dims = a.layout.dims();
    let k = match (dims.len(), trans_a) {
        (r, false) if r >= 2 => dims[r - 1],
        (r, true) if r >= 2 => dims[r - 2],
        _ => 0,
    };
    c.layout.elements().saturating_mul(k).saturating_mul(2)
}

/// A dense `f32` tensor of `dims` at element `offset` of `handle`.
pub(crate) fn view(handle: Handle, offset: u64, dims: &[u64]) -> Result<TensorRef> {
    Ok(TensorRef::strided(
        handle,
        offset * 4,
        Layout::contiguous(DType::F32, dims)?,
    ))
}

/// A dense tensor of `dtype` at the start of `handle`.
pub(crate) fn whole(handle: Handle, dtype: DType, dims: &[u64]) -> Result<TensorRef> {
    TensorRef::new(handle, dtype, dims)
}

impl Replica {
    /// A replica of `model` on `device` (the scheduler's device `sched_index`): the
    /// initial parameters of `config`'s seed, zero moments, and the buffers of one
    /// step's micro-batches. `fallback` names the devices that run the operations
    /// `device` lacks.
    pub(crate) fn new(
        sched: &Scheduler,
        device: &Device,
        sched_index: usize,
        model: &dyn Model,
        data: &dyn Dataset,
        config: &TrainConfig,
        fallback: Vec<(xpu_hal::ops::OpKind, Device)>,
    ) -> Result<Replica> {
        let layout = model.layout();
        let micro_batches = config.global_batch / config.micro_batch;
        let rows = model.loss_rows();
        // Every labelled row of the global batch weighs the same in the mean loss.
        let targets = config.global_batch * data.targets_per_example();
        let mut params = Vec::new();
        let (mut grad_slots, mut grads) = (Vec::new(), Vec::new());
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for values in &layout.initial_values(config.seed) {
            params.push(sched.register(HostBuffer::from_bytes(bytemuck::cast_slice(values))?)?);
            let zeros = vec![0u8; values.len() * 4];
            grad_slots.push(sched.create(zeros.len() as u64 * micro_batches)?);
            grads.push(sched.create(zeros.len() as u64)?);
            m.push(sched.register(HostBuffer::from_bytes(&zeros)?)?);
            v.push(sched.register(HostBuffer::from_bytes(&zeros)?)?);
        }
        let scratch = model
            .scratch()
            .into_iter()
            .map(|e| sched.create(e * 4))
            .collect::<Result<Vec<_>>>()?;
        let constants = model
            .constants()
            .iter()
            .map(|c| sched.register(HostBuffer::from_bytes(bytemuck::cast_slice(c))?))
            .collect::<Result<Vec<_>>>()?;
        let ones = sched.register(HostBuffer::from_bytes(bytemuck::cast_slice(&vec![
            1.0f32;
            rows as usize
        ]))?)?;
        let dloss = sched.register(HostBuffer::from_bytes(bytemuck::cast_slice(&vec![
            1.0f32 / (targets as f32);
            rows as usize
        ]))?)?;
        let loss = sched.create(micro_batches * rows * 4)?;
        Ok(Replica {
            device: device.clone(),
            sched_index,
            params,
            grad_slots,
            grads,
            bucket_elements: layout.bucket_elements.clone(),
            m,
            v,
            scratch,
            constants,
            ones,
            dloss,
            loss,
            recording: std::sync::Mutex::new(None),
            matmul_flops: std::sync::atomic::AtomicU64::new(0),
            fallback,
        })
    }

    /// Every handle the replica holds.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.params
            .iter()
            .chain(&self.grad_slots)
            .chain(&self.grads)
            .chain(&self.m)
            .chain(&self.v)
            .chain(&self.scratch)
            .chain(&self.constants)
            .chain([&self.ones, &self.dloss, &self.loss])
            .copied()
            .collect()
    }

    /// The update of step `step`: per bucket, the micro-batches' gradient slots summed
    /// in micro-batch order, then AdamW.
    pub(crate) fn update(&self, sched: &dyn Exec, config: &TrainConfig, step: u64) -> Result<()> {
        let micro_batches = config.global_batch / config.micro_batch;
        let step = u32::try_from(step)
            .map_err(|_| Error::invalid("more than 2^32 steps: AdamW's step count is 32-bit"))?;
        for (b, &elements) in self.bucket_elements.iter().enumerate() {
            self.run(
                sched,
                "sum_micro_batches",
                Op::Reduce {
                    x: view(self.grad_slots[b], 0, &[micro_batches, elements])?,
                    y: view(self.grads[b], 0, &[1, elements])?,
                    op: xpu_hal::ops::ReduceOp::Sum,
                    axis: 0,
                },
            )?;
            self.run(
                sched,
                "adamw",
                Op::AdamW {
                    param: view(self.params[b], 0, &[elements])?,
                    grad: view(self.grads[b], 0, &[elements])?,
                    m: view(self.m[b], 0, &[elements])?,
                    v: view(self.v[b], 0, &[elements])?,
                    lr: config.lr,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: config.weight_decay,
                    step,
                },
            )?;
        }
        Ok(())
    }

    /// Runs `op` on this replica's device (or the one it falls back to for the
    /// operation), under the codelet name `name`.
    pub(crate) fn run(&self, sched: &dyn Exec, name: &str, op: Op<TensorRef>) -> Result<()> {
        let flops = matmul_flops(&op);
        let device = self
            .fallback
            .iter()
            .find(|(kind, _)| *kind == op.kind())
            .map_or(&self.device, |(_, d)| d);
        sched.op(device, name, op, &mut |task| {
            if let Some(kept) = self
                .recording
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                kept.push(task.clone());
            }
        })?;
        self.matmul_flops
            .fetch_add(flops, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Parameter `slot`.
    pub(crate) fn param(&self, slot: &Slot) -> Result<TensorRef> {
        slot.of(&self.params)
    }

    /// The gradient of parameter `slot` from micro-batch `mb`.
    pub(crate) fn grad(&self, slot: &Slot, mb: &MicroBatch) -> Result<TensorRef> {
        let mut t = slot.of(&self.grad_slots)?;
        t.offset += mb.index * self.bucket_elements[slot.bucket] * 4;
        Ok(t)
    }

    /// `y = x·w + b` for `x` `[rows, in]`, `w` `[in, out]`, `b` `[out]`.
    pub(crate) fn linear(
        &self,
        sched: &dyn Exec,
        name: &str,
        x: TensorRef,
        w: &Slot,
        b: &Slot,
        y: TensorRef,
    ) -> Result<()> {
        self.run(
            sched,
            &format!("{name}.matmul"),
            Op::Matmul {
                a: x,
                b: self.param(w)?,
                c: y.clone(),
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta: 0.0,
            },
        )?;
        self.run(
            sched,
            &format!("{name}.bias"),
            Op::BiasAdd {
                x: y.clone(),
                bias: self.param(b)?,
                y,
            },
        )
    }

    /// The backward pass of [`Replica::linear`]: `dw += xᵀ·dy`, `db += Σ dy`, and
    /// `dx = dy·wᵀ` when `dx` is given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_backward(
        &self,
        sched: &dyn Exec,
        mb: &MicroBatch,
        name: &str,
        x: TensorRef,
        w: &Slot,
        b: &Slot,
        dy: TensorRef,
        dx: Option<TensorRef>,
    ) -> Result<()> {
        let rows = dy.layout.dims()[0];
        self.run(
            sched,
            &format!("{name}.dw"),
            Op::Matmul {
                a: x,
                b: dy.clone(),
                c: self.grad(w, mb)?,
                trans_a: true,
                trans_b: false,
                alpha: 1.0,
                beta: 1.0,
            },
        )?;
        let db = self.grad(b, mb)?;
        let out = db.layout.dims()[0];
        self.run(
            sched,
            &format!("{name}.db"),
            Op::Matmul {
                a: whole(self.ones, DType::F32, &[1, rows])?,
                b: dy.clone(),
                c: TensorRef::strided(
                    db.handle,
                    db.offset,
                    Layout::contiguous(DType::F32, &[1, out])?,
                ),
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta: 1.0,
            },
        )?;
        if let Some(dx) = dx {
            self.run(
                sched,
                &format!("{name}.dx"),
                Op::Matmul {
                    a: dy,
                    b: self.param(w)?,
                    c: dx,
                    trans_a: false,
                    trans_b: true,
                    alpha: 1.0,
                    beta: 0.0,
                },
            )?;
        }
        Ok(())
    }
}
