//! [`KeptBatch`]: a batch of operations validated once and enqueued many times, each
//! time over memory given anew — what a CUDA graph is to the launches it captured.
//!
//! A recorded sequence of work (a training step, a replayed task graph) enqueues the
//! same operations again and again, often on the same buffers, sometimes on buffers
//! that replaced them (a buffer evicted and allocated again). Validating and preparing
//! each operation every time costs the submitting thread as much as the first time. A
//! kept batch is a [`crate::Batch`] whose buffers are replaced by *slots*: the
//! allocations it was kept over, by position. Enqueuing it
//! ([`crate::Stream::submit_kept`]) takes one allocation per slot and checks only what
//! the per-operation validation depended on — the same device, the same sizes, and no
//! allocation bound twice (two slots sharing memory could overlap where the operations
//! were checked not to) — so its cost does not grow with the number of operations on
//! the submitting thread. The backend receives the operations with the slots bound
//! ([`crate::backend::StreamImpl::batch_kept`]); the host backend binds them on its
//! worker as it runs them.
//!
//! A kept batch holds no memory: its operations point at slots, never at allocations,
//! so keeping one does not keep its buffers alive.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::backend::{BatchOp, BuiltinOp};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernel::RawKernelArg;
use crate::memory::{RawAllocation, RawSlice};
use crate::ops::RawTensor;

/// Slot `index` of a kept batch, standing where an allocation stood. Never reaches a
/// backend: binding replaces it.
struct Slot {
    index: usize,
    size: u64,
}

impl RawAllocation for Slot {
    fn size(&self) -> u64 {
        self.size
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// A batch validated once, to be enqueued many times over memory given each time (see
/// the module docs). Cheap to clone.
#[derive(Clone)]
pub struct KeptBatch {
    inner: Arc<KeptInner>,
}

struct KeptInner {
    device: Device,
    /// The size of each slot's allocation.
    sizes: Vec<u64>,
    /// The operations, their slices on [`Slot`]s.
    ops: Vec<BatchOp>,
}

impl fmt::Debug for KeptBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptBatch")
            .field("device", &self.inner.device.id().to_string())
            .field("operations", &self.inner.ops.len())
            .field("slots", &self.inner.sizes.len())
            .finish()
    }
}

/// `slice` with its memory replaced by what `f` makes of it.
fn map_slice(
    slice: &RawSlice,
    f: &mut impl FnMut(&Arc<dyn RawAllocation>) -> Result<Arc<dyn RawAllocation>>,
) -> Result<RawSlice> {
    Ok(RawSlice {
        memory: f(&slice.memory)?,
        offset: slice.offset,
        len: slice.len,
    })
}

/// `op` with the memory of every slice replaced by what `f` makes of it.
fn map_op(
    op: &BatchOp,
    f: &mut impl FnMut(&Arc<dyn RawAllocation>) -> Result<Arc<dyn RawAllocation>>,
) -> Result<BatchOp> {
    Ok(match op {
        BatchOp::Builtin(b) => BatchOp::Builtin(match b {
            BuiltinOp::Fill { dst, value } => BuiltinOp::Fill {
                dst: map_slice(dst, f)?,
                value: *value,
            },
            BuiltinOp::Binary {
                op,
                dtype,
                a,
                b,
                dst,
            } => BuiltinOp::Binary {
                op: *op,
                dtype: *dtype,
                a: map_slice(a, f)?,
                b: map_slice(b, f)?,
                dst: map_slice(dst, f)?,
            },
            BuiltinOp::Accumulate {
                op,
                dtype,
                dst,
                src,
            } => BuiltinOp::Accumulate {
                op: *op,
                dtype: *dtype,
                dst: map_slice(dst, f)?,
                src: map_slice(src, f)?,
            },
            BuiltinOp::Scale { alpha, src, dst } => BuiltinOp::Scale {
                alpha: *alpha,
                src: map_slice(src, f)?,
                dst: map_slice(dst, f)?,
            },
            BuiltinOp::Cast {
                src,
                src_dtype,
                dst,
                dst_dtype,
            } => BuiltinOp::Cast {
                src: map_slice(src, f)?,
                src_dtype: *src_dtype,
                dst: map_slice(dst, f)?,
                dst_dtype: *dst_dtype,
            },
        }),
        BatchOp::Launch { kernel, dims, args } => {
            let mut mapped = Vec::with_capacity(args.len());
            for arg in args {
                mapped.push(match arg {
                    RawKernelArg::Buffer(Some(s), access) => {
                        RawKernelArg::Buffer(Some(map_slice(s, f)?), *access)
                    }
                    other => other.clone(),
                });
            }
            BatchOp::Launch {
                kernel: kernel.clone(),
                dims: *dims,
                args: mapped,
            }
        }
        BatchOp::Op(op) => BatchOp::Op(Box::new(op.by_ref().try_map(|_, _, t| {
            Ok::<_, Error>(RawTensor {
                memory: map_slice(&t.memory, f)?,
                layout: t.layout,
            })
        })?)),
    })
}

impl KeptBatch {
    /// Keeps `ops` (validated on `device`) over `memory`: each slice on `memory[i]`
    /// (zero-size allocations have no memory and no slice on them) becomes a slice on
    /// slot `i`. Fails if an operation uses memory that is not in the list.
    pub(crate) fn new(
        device: Device,
        ops: Vec<BatchOp>,
        memory: &[(Option<Arc<dyn RawAllocation>>, u64)],
    ) -> Result<KeptBatch> {
        let slots: Vec<Arc<dyn RawAllocation>> = memory
            .iter()
            .enumerate()
            .map(|(index, (_, size))| {
                Arc::new(Slot { index, size: *size }) as Arc<dyn RawAllocation>
            })
            .collect();
        let by_address: std::collections::HashMap<*const (), usize> = memory
            .iter()
            .enumerate()
            .filter_map(|(i, (raw, _))| raw.as_ref().map(|r| (Arc::as_ptr(r) as *const (), i)))
            .collect();
        let mut to_slot = |m: &Arc<dyn RawAllocation>| -> Result<Arc<dyn RawAllocation>> {
            by_address
                .get(&(Arc::as_ptr(m) as *const ()))
                .map(|i| slots[*i].clone())
                .ok_or_else(|| {
                    Error::invalid(
                        "an operation of the batch uses memory that is not among the allocations it is kept over; list every allocation the batch uses",
                    )
                })
        };
        let ops = ops
            .iter()
            .map(|op| map_op(op, &mut to_slot))
            .collect::<Result<Vec<_>>>()?;
        Ok(KeptBatch {
            inner: Arc::new(KeptInner {
                device,
                sizes: memory.iter().map(|(_, size)| *size).collect(),
                ops,
            }),
        })
    }

    /// The device it was validated for.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Its operations.
    pub fn len(&self) -> usize {
        self.inner.ops.len()
    }

    /// Whether it has no operation.
    pub fn is_empty(&self) -> bool {
        self.inner.ops.is_empty()
    }

    /// The size each slot's allocation must have.
    pub fn slot_sizes(&self) -> &[u64] {
        &self.inner.sizes
    }

    /// Its operations with slot `i` bound to `memory[i]`, in order, made as they are
    /// iterated. For a backend's [`crate::backend::StreamImpl::batch_kept`]: the HAL
    /// has checked `memory` (one allocation per slot, of the slot's size, on the batch's
    /// device, none twice), so each operation meets the guarantees of its single call.
    pub fn bound<'a>(
        &'a self,
        memory: &'a [Option<Arc<dyn RawAllocation>>],
    ) -> impl Iterator<Item = Result<BatchOp>> + 'a {
        self.inner.ops.iter().map(move |op| {
            map_op(op, &mut |m: &Arc<dyn RawAllocation>| {
                let slot = m.clone().into_any().downcast::<Slot>().map_err(|_| {
                    Error::backend_message(
                        "hal",
                        "internal error: a kept batch holds memory instead of a slot",
                    )
                })?;
                memory
                    .get(slot.index)
                    .and_then(Clone::clone)
                    .ok_or_else(|| {
                        Error::backend_message(
                            "hal",
                            format!(
                                "internal error: slot {} of a kept batch is unbound",
                                slot.index
                            ),
                        )
                    })
            })
        })
    }
}
