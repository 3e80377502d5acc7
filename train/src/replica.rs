//! One replica of the model on one device: its handles, and the layers a model is
//! built from, submitted as standard-operation tasks pinned to that device.

use xpu_hal::ops::{Layout, Op};
use xpu_hal::{DType, Device, Result};
use xpu_scheduler::{Handle, Scheduler, Task, TensorRef};

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
    /// Submits `op` on this replica's device, under the codelet name `name`.
    pub(crate) fn run(&self, sched: &Scheduler, name: &str, op: Op<TensorRef>) -> Result<()> {
        let flops = matmul_flops(&op);
        let task = Task::op(name, op)?.on(&self.device);
        if let Some(kept) = self
            .recording
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            kept.push(task.clone());
        }
        sched.submit(task)?;
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
        sched: &Scheduler,
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
        sched: &Scheduler,
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
