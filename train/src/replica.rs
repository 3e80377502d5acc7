//! One replica of the model on one device: its handles, and the layers a model is
//! built from, submitted as standard-operation tasks pinned to that device.

use xpu_hal::ops::{Layout, Op};
use xpu_hal::{DType, Device, Error, HostBuffer, Result, Scalar};
use xpu_scheduler::{Builtin, Handle, Scheduler, Task, TensorRef};

use crate::data::Dataset;
use crate::exec::Exec;
use crate::model::Model;
use crate::trainer::TrainConfig;

use crate::model::{MicroBatch, Stored};
use crate::params::Slot;
use crate::precision::{decode, encode, LossScale};
use crate::tree::{Node, Plan};

/// The handles of one replica.
pub(crate) struct Replica {
    /// Its device.
    pub(crate) device: Device,
    /// The compute dtype: of the parameters' copy the model reads, the activations,
    /// the gradient slots and the losses.
    pub(crate) dtype: DType,
    /// The device's index among the scheduler's devices.
    pub(crate) sched_index: usize,
    /// Parameters (`f32` masters), gradients and the AdamW moments, one handle per
    /// bucket each.
    pub(crate) params: Vec<Handle>,
    /// With a compute dtype other than `f32`: the parameters in it, cast from the
    /// masters after each update (else empty, and the model reads the masters).
    pub(crate) low: Vec<Handle>,
    /// With a compute dtype other than `f32`: per bucket, the gradient slots widened
    /// to `f32` before they are summed (else empty, and the slots are summed in
    /// place).
    pub(crate) wide: Vec<Handle>,
    /// With other replicas: per bucket, `[rows, elements]` `f32`, the rows of every
    /// replica's blocks of the sum (see [`crate::tree`]), all-reduced.
    pub(crate) exchange: Vec<Handle>,
    /// The rows of the exchange buffers.
    pub(crate) exchange_rows: u64,
    /// `[0]` (`i32`): the index of a row copied with a gather.
    pub(crate) row0: Handle,
    /// With loss scaling: per bucket, the summed gradients before they are divided by
    /// the scale (else empty).
    pub(crate) scaled: Vec<Handle>,
    /// With loss scaling: `[buckets]` `f32`, each bucket's summed gradients added up
    /// (infinite or NaN when any of them is).
    pub(crate) checks: Option<Handle>,
    /// Per bucket, one slot of gradients per micro-batch of the step (`[M, elements]`):
    /// a micro-batch's gradients accumulate into its own slot, zero elsewhere, so that
    /// the all-reduce gives every replica every micro-batch's gradients exactly.
    pub(crate) grad_slots: Vec<Handle>,
    /// Per bucket, the slots summed by the fixed tree (`f32`).
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
    /// `[rows]`: the gradient of each row's loss (1 / the labelled rows of the global
    /// batch, times the loss scale).
    pub(crate) dloss: Handle,
    /// The labelled rows of the global batch.
    pub(crate) targets: u64,
    /// Per-example losses of the replica's micro-batches this step.
    pub(crate) loss: Handle,
    /// When set, the tasks submitted are also kept here (to predict a micro-batch's
    /// time on each device from the scheduler's models).
    pub(crate) recording: std::sync::Mutex<Option<Vec<Task>>>,
    /// When set, every task of the step submitted for this replica outside its
    /// micro-batches is also kept here (to predict the work each replica does once per
    /// step whatever its share).
    pub(crate) step_recording: std::sync::Mutex<Option<Vec<Task>>>,
    /// Whether the tasks submitted now are a micro-batch's (see [`Replica::micro_batch`]).
    in_micro_batch: std::sync::atomic::AtomicBool,
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

/// A dense tensor of `dtype` and `dims` at element `offset` of `handle`.
pub(crate) fn dense(handle: Handle, dtype: DType, offset: u64, dims: &[u64]) -> Result<TensorRef> {
    Ok(TensorRef::strided(
        handle,
        offset * dtype.size() as u64,
        Layout::contiguous(dtype, dims)?,
    ))
}

/// A dense `f32` tensor of `dims` at element `offset` of `handle`.
pub(crate) fn view32(handle: Handle, offset: u64, dims: &[u64]) -> Result<TensorRef> {
    dense(handle, DType::F32, offset, dims)
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
        let dtype = config.precision.dtype();
        let size = dtype.size() as u64;
        let micro_batches = config.global_batch / config.micro_batch;
        let rows = model.loss_rows();
        let buckets = layout.bucket_elements.len();
        // Every labelled row of the global batch weighs the same in the mean loss.
        let targets = config.global_batch * data.targets_per_example();
        let register = |values: &[f32], dtype| -> Result<Handle> {
            sched.register(HostBuffer::from_bytes(&encode(values, dtype)?)?)
        };
        let mut params = Vec::new();
        let (mut low, mut wide, mut scaled) = (Vec::new(), Vec::new(), Vec::new());
        let (mut grad_slots, mut grads) = (Vec::new(), Vec::new());
        let (mut m, mut v) = (Vec::new(), Vec::new());
        for values in &layout.initial_values(config.seed) {
            let elements = values.len() as u64;
            params.push(register(values, DType::F32)?);
            if dtype != DType::F32 {
                low.push(register(values, dtype)?);
                wide.push(sched.create(elements * 4 * micro_batches)?);
            }
            if config.precision.scales_loss() {
                scaled.push(sched.create(elements * 4)?);
            }
            grad_slots.push(sched.create(elements * size * micro_batches)?);
            grads.push(sched.create(elements * 4)?);
            let zeros = vec![0.0f32; values.len()];
            m.push(register(&zeros, DType::F32)?);
            v.push(register(&zeros, DType::F32)?);
        }
        let checks = if config.precision.scales_loss() {
            Some(sched.create(buckets as u64 * 4)?)
        } else {
            None
        };
        let scratch = model
            .scratch()
            .into_iter()
            .map(|(e, stored)| {
                sched.create(match stored {
                    Stored::Compute => e * size,
                    Stored::F32 => e * 4,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let constants = model
            .constants()
            .iter()
            .map(|c| register(c, dtype))
            .collect::<Result<Vec<_>>>()?;
        let ones = register(&vec![1.0f32; rows as usize], dtype)?;
        let dloss = register(
            &vec![dloss_value(targets, config.initial_loss_scale()); rows as usize],
            dtype,
        )?;
        let loss = sched.create(micro_batches * rows * size)?;
        let row0 = sched.register(HostBuffer::from_bytes(&0i32.to_le_bytes())?)?;
        Ok(Replica {
            device: device.clone(),
            dtype,
            sched_index,
            params,
            low,
            wide,
            scaled,
            checks,
            exchange: Vec::new(),
            exchange_rows: 0,
            row0,
            grad_slots,
            grads,
            bucket_elements: layout.bucket_elements.clone(),
            m,
            v,
            scratch,
            constants,
            ones,
            dloss,
            targets,
            loss,
            recording: std::sync::Mutex::new(None),
            step_recording: std::sync::Mutex::new(None),
            in_micro_batch: std::sync::atomic::AtomicBool::new(false),
            matmul_flops: std::sync::atomic::AtomicU64::new(0),
            fallback,
        })
    }

    /// Every handle the replica holds.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.params
            .iter()
            .chain(&self.low)
            .chain(&self.wide)
            .chain(&self.scaled)
            .chain(&self.checks)
            .chain(&self.exchange)
            .chain([&self.row0])
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

    /// Bucket `b`'s `f32` micro-batch gradients: the slots, or their widened copy.
    fn leaves(&self, b: usize) -> Handle {
        self.wide.get(b).copied().unwrap_or(self.grad_slots[b])
    }

    /// Row `row` (`[1, elements]`, `f32`) of bucket `b`'s buffer `h`.
    fn row(&self, h: Handle, b: usize, row: u64) -> Result<TensorRef> {
        let e = self.bucket_elements[b];
        view32(h, row * e, &[1, e])
    }

    /// `y = x + bias`, rows of bucket `b` (`x` and `y` may be the same row).
    fn add_rows(
        &self,
        sched: &dyn Exec,
        b: usize,
        x: (Handle, u64),
        bias: (Handle, u64),
        y: (Handle, u64),
    ) -> Result<()> {
        let e = self.bucket_elements[b];
        self.run(
            sched,
            "sum_micro_batches",
            Op::BiasAdd {
                x: self.row(x.0, b, x.1)?,
                bias: view32(bias.0, bias.1 * e, &[e])?,
                y: self.row(y.0, b, y.1)?,
            },
        )
    }

    /// Copies row `from` to row `to` of bucket `b`, bit for bit.
    fn copy_row(
        &self,
        sched: &dyn Exec,
        b: usize,
        from: (Handle, u64),
        to: (Handle, u64),
    ) -> Result<()> {
        self.run(
            sched,
            "copy_gradients",
            Op::Gather {
                table: self.row(from.0, b, from.1)?,
                indices: whole(self.row0, DType::I32, &[1])?,
                out: self.row(to.0, b, to.1)?,
            },
        )
    }

    /// Bucket `b`'s exchange buffer.
    fn exchange(&self, b: usize) -> Result<Handle> {
        self.exchange.get(b).copied().ok_or_else(|| {
            Error::invalid("internal error: no exchange buffer for a plan over replicas")
        })
    }

    /// Sets the rows of the exchange buffers (one per bucket, `[rows, elements]` `f32`)
    /// for a plan of `rows` blocks.
    pub(crate) fn set_exchange(&mut self, sched: &Scheduler, rows: u64) -> Result<()> {
        if rows == self.exchange_rows && !self.exchange.is_empty() {
            return Ok(());
        }
        for h in std::mem::take(&mut self.exchange) {
            sched.unregister(h)?;
        }
        for &e in &self.bucket_elements {
            self.exchange.push(sched.create(rows * e * 4)?);
        }
        self.exchange_rows = rows;
        Ok(())
    }

    /// Bucket `b`'s micro-batch gradients summed, by the tree of `plan`, up to the
    /// blocks of replica `rank` (each left in the row of its first micro-batch); with
    /// other replicas in the plan, the blocks are copied to their rows of the exchange
    /// buffer, zero elsewhere, ready for the all-reduce.
    pub(crate) fn sum_blocks(
        &self,
        sched: &dyn Exec,
        plan: &Plan,
        rank: usize,
        b: usize,
    ) -> Result<()> {
        if let Some(&wide) = self.wide.get(b) {
            let cast = Builtin::Cast {
                from: self.dtype,
                to: DType::F32,
            };
            sched.builtin(&self.device, cast, &[self.grad_slots[b], wide])?;
        }
        let leaves = self.leaves(b);
        let mine = plan.blocks.get(rank).map_or(&[][..], Vec::as_slice);
        for &(block, _) in mine {
            self.sum_below(sched, plan.m, b, leaves, block)?;
        }
        if plan.blocks.len() > 1 {
            let exchange = self.exchange(b)?;
            let zero = Builtin::Fill {
                value: Scalar::F32(0.0),
            };
            sched.builtin(&self.device, zero, &[exchange])?;
            for &(block, row) in mine {
                self.copy_row(sched, b, (leaves, block.start), (exchange, row))?;
            }
        }
        Ok(())
    }

    /// Node `node`'s sum, from the leaves below it, into the row of its first
    /// micro-batch.
    fn sum_below(
        &self,
        sched: &dyn Exec,
        m: u64,
        b: usize,
        leaves: Handle,
        node: Node,
    ) -> Result<()> {
        let Some((left, right)) = node.children(m) else {
            return Ok(());
        };
        self.sum_below(sched, m, b, leaves, left)?;
        if let Some(right) = right {
            self.sum_below(sched, m, b, leaves, right)?;
            let at = (leaves, node.start);
            self.add_rows(sched, b, at, (leaves, right.start), at)?;
        }
        Ok(())
    }

    /// Where node `node`'s sum is once the blocks are exchanged, adding up what the
    /// blocks leave of the tree above them.
    fn sum_above(
        &self,
        sched: &dyn Exec,
        plan: &Plan,
        rank: usize,
        b: usize,
        node: Node,
    ) -> Result<(Handle, u64)> {
        let leaves = self.leaves(b);
        if let Some((owner, row)) = plan.block(node) {
            if owner == rank {
                return Ok((leaves, node.start));
            }
            return Ok((self.exchange(b)?, row));
        }
        let (left, right) = node.children(plan.m).ok_or_else(|| {
            Error::invalid("internal error: a micro-batch in no replica's blocks")
        })?;
        let left = self.sum_above(sched, plan, rank, b, left)?;
        let Some(right) = right else {
            return Ok(left);
        };
        let right = self.sum_above(sched, plan, rank, b, right)?;
        let at = (leaves, node.start);
        self.add_rows(sched, b, left, right, at)?;
        Ok(at)
    }

    /// Bucket `b`'s gradients summed over every micro-batch into its `f32` gradients,
    /// by the tree of `plan` from the blocks ([`Replica::sum_blocks`], exchanged when
    /// there are other replicas); with a loss `scale`, divided by it and added up
    /// into the bucket's check.
    pub(crate) fn sum_gradients(
        &self,
        sched: &dyn Exec,
        plan: &Plan,
        rank: usize,
        b: usize,
        scale: Option<f32>,
    ) -> Result<()> {
        let (sum, check) = match (scale, self.scaled.get(b), self.checks) {
            (Some(scale), Some(&scaled), Some(checks)) => (scaled, Some((scale, checks))),
            (None, ..) => (self.grads[b], None),
            _ => {
                return Err(Error::invalid(
                    "internal error: a loss scale on a replica made without loss scaling",
                ))
            }
        };
        let root = self.sum_above(sched, plan, rank, b, crate::tree::root(plan.m))?;
        self.copy_row(sched, b, root, (sum, 0))?;
        if let Some((scale, checks)) = check {
            let elements = self.bucket_elements[b];
            let unscale = Builtin::Scale {
                alpha: Scalar::F32(1.0 / scale),
            };
            sched.builtin(&self.device, unscale, &[sum, self.grads[b]])?;
            self.run(
                sched,
                "check_gradients",
                Op::Reduce {
                    x: view32(self.grads[b], 0, &[1, elements])?,
                    y: view32(checks, b as u64, &[1, 1])?,
                    op: xpu_hal::ops::ReduceOp::Sum,
                    axis: 1,
                },
            )?;
        }
        Ok(())
    }

    /// Whether every bucket's summed gradients are finite, from the checks' bytes.
    pub(crate) fn finite(checks: &[u8]) -> bool {
        decode(checks, DType::F32).is_ok_and(|c| c.iter().all(|x| x.is_finite()))
    }

    /// AdamW on bucket `b` with the gradients summed, as update number `step`; then the
    /// compute copy of its parameters cast from the masters.
    pub(crate) fn apply(
        &self,
        sched: &dyn Exec,
        config: &TrainConfig,
        b: usize,
        step: u64,
    ) -> Result<()> {
        let step = u32::try_from(step)
            .map_err(|_| Error::invalid("more than 2^32 steps: AdamW's step count is 32-bit"))?;
        let elements = self.bucket_elements[b];
        self.run(
            sched,
            "adamw",
            Op::AdamW {
                param: view32(self.params[b], 0, &[elements])?,
                grad: view32(self.grads[b], 0, &[elements])?,
                m: view32(self.m[b], 0, &[elements])?,
                v: view32(self.v[b], 0, &[elements])?,
                lr: config.lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: config.weight_decay,
                step,
            },
        )?;
        self.refresh(sched, b)
    }

    /// Bucket `b`'s compute copy cast from its masters (nothing with `f32`).
    pub(crate) fn refresh(&self, sched: &dyn Exec, b: usize) -> Result<()> {
        if let Some(&low) = self.low.get(b) {
            let cast = Builtin::Cast {
                from: DType::F32,
                to: self.dtype,
            };
            sched.builtin(&self.device, cast, &[self.params[b], low])?;
        }
        Ok(())
    }

    /// Sets the loss gradient for the loss scale `scale`.
    pub(crate) fn set_loss_scale(&self, sched: &dyn Exec, scale: f32) -> Result<()> {
        let value = Scalar::from_f64(self.dtype, f64::from(dloss_value(self.targets, scale)));
        sched.builtin(&self.device, Builtin::Fill { value }, &[self.dloss])
    }

    /// Values of the compute dtype, as `f32`.
    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<Vec<f32>> {
        decode(bytes, self.dtype)
    }

    /// A dense tensor of the compute dtype and `dims` at element `offset` of `handle`.
    pub(crate) fn view(&self, handle: Handle, offset: u64, dims: &[u64]) -> Result<TensorRef> {
        dense(handle, self.dtype, offset, dims)
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
        sched.op(device, name, op, &mut |task| self.note(task))?;
        self.matmul_flops
            .fetch_add(flops, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Keeps `task`, submitted for this replica, where its recorders are on (the step's
    /// only outside micro-batches).
    pub(crate) fn note(&self, task: &Task) {
        let in_micro_batch = self
            .in_micro_batch
            .load(std::sync::atomic::Ordering::Relaxed);
        let step = (!in_micro_batch).then_some(&self.step_recording);
        for recorder in std::iter::once(&self.recording).chain(step) {
            if let Some(kept) = recorder.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                kept.push(task.clone());
            }
        }
    }

    /// Runs `submit`, which submits part of a micro-batch's work for this replica.
    pub(crate) fn micro_batch<T>(&self, submit: impl FnOnce() -> Result<T>) -> Result<T> {
        use std::sync::atomic::Ordering;
        self.in_micro_batch.store(true, Ordering::Relaxed);
        let out = submit();
        self.in_micro_batch.store(false, Ordering::Relaxed);
        out
    }

    /// Parameter `slot`, in the compute dtype.
    pub(crate) fn param(&self, slot: &Slot) -> Result<TensorRef> {
        if self.low.is_empty() {
            slot.of(&self.params, self.dtype)
        } else {
            slot.of(&self.low, self.dtype)
        }
    }

    /// The gradient of parameter `slot` from micro-batch `mb`, in the compute dtype.
    pub(crate) fn grad(&self, slot: &Slot, mb: &MicroBatch) -> Result<TensorRef> {
        let mut t = slot.of(&self.grad_slots, self.dtype)?;
        t.offset += mb.index * self.bucket_elements[slot.bucket] * self.dtype.size() as u64;
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
                a: whole(self.ones, self.dtype, &[1, rows])?,
                b: dy.clone(),
                c: TensorRef::strided(
                    db.handle,
                    db.offset,
                    Layout::contiguous(self.dtype, &[1, out])?,
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

/// Every replica's gradients (`replicas` in rank order, the first of them rank
/// `first` of the plan) summed by the tree of `plan` after the backward passes and
/// [`Replica::sum_blocks`] (and the exchange); with a loss `scale`, divided by it and
/// checked.
pub(crate) fn sum_all(
    replicas: &[&Replica],
    exec: &dyn Exec,
    plan: &Plan,
    first: usize,
    scale: Option<f32>,
) -> Result<()> {
    for (i, r) in replicas.iter().enumerate() {
        for b in 0..r.bucket_elements.len() {
            r.sum_gradients(exec, plan, first + i, b, scale)?;
        }
    }
    Ok(())
}

/// The update of step `step` after [`sum_all`], on every replica: AdamW. With a loss
/// scale, only when every replica's check is finite; otherwise no replica updates, and
/// the scale is halved. Returns whether the update was skipped.
pub(crate) fn apply_all(
    replicas: &[&Replica],
    exec: &dyn Exec,
    config: &TrainConfig,
    step: u64,
    loss_scale: &mut Option<LossScale>,
) -> Result<bool> {
    let mut finite = true;
    if loss_scale.is_some() {
        for r in replicas {
            if let Some(checks) = r.checks {
                finite &= Replica::finite(&exec.read(checks)?);
            }
        }
    }
    if finite {
        // AdamW counts the updates applied.
        let applied = step - loss_scale.map_or(0, |s| s.skipped);
        for r in replicas {
            for b in 0..r.bucket_elements.len() {
                r.apply(exec, config, b, applied)?;
            }
        }
    }
    if let Some(scale) = loss_scale {
        if scale.observe(finite) {
            for r in replicas {
                r.set_loss_scale(exec, scale.scale)?;
            }
        }
    }
    Ok(!finite)
}

/// The gradient of each labelled row's loss: `scale / targets`.
fn dloss_value(targets: u64, scale: f32) -> f32 {
    scale / (targets as f32)
}
