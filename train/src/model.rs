//! What a model gives the trainer: its parameters in buckets, its scratch buffers, and
//! its forward and backward passes over one micro-batch as tasks on a replica.

use xpu_hal::Result;
use xpu_scheduler::Handle;

use crate::exec::Exec;

use crate::params::ParamLayout;
use crate::replica::Replica;

/// One micro-batch on a replica: its inputs and where its losses go.
pub(crate) struct MicroBatch {
    /// Its index in the step (its gradient slot).
    pub(crate) index: u64,
    /// `i32` token indices, as the model's data lays them out.
    pub(crate) tokens: Handle,
    /// `i32` labels, one per row of the loss (−1: no loss on that row).
    pub(crate) labels: Handle,
    /// Element offset of its rows in the replica's loss handle.
    pub(crate) loss_offset: u64,
}

/// The dtype of a scratch buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// The compute dtype (activations and their gradients).
    Compute,
    /// `f32` whatever the compute dtype (layer norm's row statistics).
    F32,
}

/// A model the trainer can train data-parallel.
pub(crate) trait Model: Send + Sync {
    /// The parameters, bucket by bucket. The backward pass finishes the buckets'
    /// gradients from the last bucket to the first.
    fn layout(&self) -> &ParamLayout;

    /// The standard operations it runs (on the compute dtype).
    fn ops(&self) -> &'static [xpu_hal::ops::OpKind];

    /// Constant buffers a replica holds (a mask), made once, in the compute dtype.
    fn constants(&self) -> Vec<Vec<f32>> {
        Vec::new()
    }

    /// The elements of each scratch buffer a replica needs for one micro-batch, and
    /// their dtype.
    fn scratch(&self) -> Vec<(u64, Stored)>;

    /// Rows of the loss per micro-batch (examples, or tokens).
    fn loss_rows(&self) -> u64;

    /// The forward pass, ending with the per-row losses.
    fn forward(&self, sched: &dyn Exec, r: &Replica, mb: &MicroBatch) -> Result<()>;

    /// The part of the backward pass that finishes the gradients of `bucket` (called for
    /// the last bucket first, after [`Model::forward`]). Gradients accumulate.
    fn backward(&self, sched: &dyn Exec, r: &Replica, mb: &MicroBatch, bucket: usize)
        -> Result<()>;

    /// The scratch buffer holding the logits `[loss_rows, classes]` after the forward
    /// pass, and the number of classes.
    fn logits(&self, r: &Replica) -> (Handle, u64);
}
