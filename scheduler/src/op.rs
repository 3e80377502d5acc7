//! Standard operations ([`xpu_hal::ops`]) as tasks.
//!
//! A training step is made of matmuls, activations, norms and optimizer updates on
//! views of a few buffers. [`Task::op`] turns one operation over [`TensorRef`]s (a
//! layout at a byte offset in a handle) into a task: a codelet whose implementation is
//! the operation with each tensor bound to a handle of the task by position
//! ([`OpSlot`]), and the task's accesses derived from the operation's — a tensor that
//! is written entirely, from the start of its handle and nothing read there, is a
//! `write` (the scheduler then brings no data for it); any other written tensor a
//! `read-write`, so the rest of the handle stays valid. A device runs the task when its
//! capabilities list the operation for the dtype of the operation's first tensor.

use xpu_hal::ops::{Access, HasLayout, Layout, Op};
use xpu_hal::{DType, Error, Result};

use crate::codelet::{Codelet, Implementation};
use crate::data::Handle;
use crate::deps::AccessMode;
use crate::task::Task;

/// A tensor of an operation submitted as a task: `layout` whose element 0 lies
/// `offset` bytes into `handle`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// The data.
    pub handle: Handle,
    /// Byte offset of element 0 (a multiple of the dtype's size).
    pub offset: u64,
    /// Shape, strides and dtype.
    pub layout: Layout,
}

impl TensorRef {
    /// A row-major tensor of `dims` at the start of `handle`.
    pub fn new(handle: Handle, dtype: DType, dims: &[u64]) -> Result<TensorRef> {
        Ok(TensorRef {
            handle,
            offset: 0,
            layout: Layout::contiguous(dtype, dims)?,
        })
    }

    /// A tensor with `layout` at byte `offset` of `handle`.
    pub fn strided(handle: Handle, offset: u64, layout: Layout) -> TensorRef {
        TensorRef {
            handle,
            offset,
            layout,
        }
    }

    /// The same elements with dimensions `i` and `j` swapped.
    pub fn transposed(mut self, i: usize, j: usize) -> Result<TensorRef> {
        self.layout = self.layout.transposed(i, j)?;
        Ok(self)
    }

    /// Whether it covers all of its handle, densely from the start.
    fn covers_handle(&self) -> bool {
        self.offset == 0
            && self.layout.is_contiguous()
            && self.layout.span_bytes() == self.handle.len()
    }
}

impl HasLayout for TensorRef {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// A tensor of an operation implementation: `layout` at byte `offset` of the task's
/// `handle`-th distinct handle (in the order the task lists them).
#[derive(Debug, Clone, PartialEq)]
pub struct OpSlot {
    /// Position of the handle among the task's distinct handles.
    pub handle: usize,
    /// Byte offset of element 0.
    pub offset: u64,
    /// Shape, strides and dtype.
    pub layout: Layout,
}

impl HasLayout for OpSlot {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Whether the operation reads tensor `name`, given as `access`: matmul's `c` only when
/// `beta` is not 0.
fn reads(op: &Op<OpSlot>, name: &str, access: Access) -> bool {
    match (op, name) {
        (Op::Matmul { beta, .. }, "c") => *beta != 0.0,
        _ => access != Access::Write,
    }
}

impl Task {
    /// A task running the standard operation `op` (checked here: shapes, dtypes,
    /// parameters, each tensor within its handle), under a codelet named `name` — the
    /// key of its performance model, so give operations of different shapes different
    /// names. Its accesses follow from the operation (see the module docs).
    pub fn op(name: impl Into<String>, op: Op<TensorRef>) -> Result<Task> {
        let name = name.into();
        xpu_hal::ops::check(&op)?;
        let mut handles: Vec<Handle> = Vec::new();
        let mut covered: Vec<bool> = Vec::new();
        let slots = op.by_ref().try_map(|operand, _, t| {
            let end = t.offset.checked_add(t.layout.span_bytes());
            if t.layout.elements() > 0 && end.is_none_or(|e| e > t.handle.len()) {
                return Err(Error::invalid(format!(
                    "{name}: `{operand}` spans bytes {}..{} of {:?}, which holds {} bytes",
                    t.offset,
                    end.map_or_else(|| "overflow".to_string(), |e| e.to_string()),
                    t.handle,
                    t.handle.len()
                )));
            }
            let at = match handles.iter().position(|h| *h == t.handle) {
                Some(i) => {
                    covered[i] = false;
                    i
                }
                None => {
                    handles.push(t.handle);
                    covered.push(t.covers_handle());
                    handles.len() - 1
                }
            };
            Ok(OpSlot {
                handle: at,
                offset: t.offset,
                layout: t.layout,
            })
        })?;
        let mut modes: Vec<Option<AccessMode>> = vec![None; handles.len()];
        for o in slots.operands() {
            let i = o.tensor.handle;
            let read = reads(&slots, o.name, o.access);
            let mode = match (read, o.access.writes()) {
                (true, true) => AccessMode::ReadWrite,
                (true, false) => AccessMode::Read,
                (false, _) if covered[i] => AccessMode::Write,
                (false, _) => AccessMode::ReadWrite,
            };
            modes[i] = Some(modes[i].map_or(mode, |m| m.merge(mode)));
        }
        let codelet = Codelet::from_op(name, slots);
        let mut task = Task::new(&codelet);
        for (h, m) in handles.into_iter().zip(modes) {
            task = task.access(h, m.unwrap_or(AccessMode::Read));
        }
        Ok(task)
    }
}

/// Checks a task's distinct `accesses` against an operation implementation: every slot
/// names one of them, lies within it, and the task's access covers the operation's.
pub(crate) fn check_slots(
    label: &str,
    op: &Op<OpSlot>,
    accesses: &[(Handle, AccessMode)],
) -> Result<()> {
    for o in op.operands() {
        let slot = o.tensor;
        let Some((handle, mode)) = accesses.get(slot.handle) else {
            return Err(Error::invalid(format!(
                "{label}: `{}` of {} is bound to handle {} but the task has {} distinct handles",
                o.name,
                op.kind(),
                slot.handle,
                accesses.len()
            )));
        };
        let end = slot.offset.saturating_add(slot.layout.span_bytes());
        if slot.layout.elements() > 0 && end > handle.len() {
            return Err(Error::invalid(format!(
                "{label}: `{}` spans bytes {}..{end} of {handle:?}, which holds {} bytes",
                o.name,
                slot.offset,
                handle.len()
            )));
        }
        if (reads(op, o.name, o.access) && !mode.reads()) || (o.access.writes() && !mode.writes()) {
            return Err(Error::invalid(format!(
                "{label}: {} {} `{}` but the task accesses {handle:?} as {}",
                op.kind(),
                if o.access.writes() { "writes" } else { "reads" },
                o.name,
                mode.name()
            )));
        }
    }
    Ok(())
}

impl Implementation {
    /// The operation's kind and the dtype that decides whether a device provides it.
    pub(crate) fn op_support(op: &Op<OpSlot>) -> (xpu_hal::ops::OpKind, DType) {
        let operands = op.operands();
        (op.kind(), operands[0].tensor.layout.dtype)
    }
}
