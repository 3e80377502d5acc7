//! [`Exec`]: where a model's operations go. Training submits them to the scheduler as
//! tasks; the direct path of `xpu bench train` runs them straight on one device's
//! stream, to measure what the scheduler costs.

use std::collections::HashMap;

use xpu_hal::ops::{Op, Tensor};
use xpu_hal::{Allocation, Device, Error, Result, Stream};
use xpu_scheduler::{AccessMode, Builtin, Codelet, Handle, Scheduler, Task, TensorRef};

/// Runs a model's operations.
pub(crate) trait Exec {
    /// Runs `op` on `device` (under the codelet name `name`); `record` is given the
    /// task when the scheduler runs it, to predict a micro-batch's time.
    fn op(
        &self,
        device: &Device,
        name: &str,
        op: Op<TensorRef>,
        record: &mut dyn FnMut(&Task),
    ) -> Result<()>;

    /// The builtin `op` over whole handles on `device`, `buffers` in the builtin's
    /// order ([`Builtin`]).
    fn builtin(&self, device: &Device, op: Builtin, buffers: &[Handle]) -> Result<()>;

    /// `h`'s bytes once everything submitted before that writes it has run.
    fn read(&self, h: Handle) -> Result<Vec<u8>>;
}

/// How builtin `op` uses its buffer `i`.
fn access(op: &Builtin, i: usize) -> AccessMode {
    match (op, i) {
        (Builtin::Accumulate { .. }, 0) => AccessMode::ReadWrite,
        (Builtin::Fill { .. }, _) => AccessMode::Write,
        (Builtin::Binary { .. }, 2) | (Builtin::Scale { .. } | Builtin::Cast { .. }, 1) => {
            AccessMode::Write
        }
        _ => AccessMode::Read,
    }
}

impl Exec for Scheduler {
    fn op(
        &self,
        device: &Device,
        name: &str,
        op: Op<TensorRef>,
        record: &mut dyn FnMut(&Task),
    ) -> Result<()> {
        let task = Task::op(name, op)?.on(device);
        record(&task);
        self.submit(task)?;
        Ok(())
    }

    fn builtin(&self, device: &Device, op: Builtin, buffers: &[Handle]) -> Result<()> {
        let codelet = Codelet::from_builtin(op);
        let mut task = Task::new(&codelet);
        for (i, h) in buffers.iter().enumerate() {
            task = task.access(*h, access(&op, i));
        }
        self.submit(task.on(device))?;
        Ok(())
    }

    fn read(&self, h: Handle) -> Result<Vec<u8>> {
        Scheduler::read(self, h)
    }
}

/// Operations run in order on one stream of one device, each handle backed by an
/// allocation of its own: the model without the scheduler.
pub(crate) struct Direct {
    pub(crate) stream: Stream,
    pub(crate) memory: HashMap<Handle, Allocation>,
}

impl Direct {
    /// The allocation backing `h`.
    pub(crate) fn allocation(&self, h: Handle) -> Result<&Allocation> {
        self.memory
            .get(&h)
            .ok_or_else(|| Error::invalid(format!("{h} has no allocation on the direct path")))
    }
}

impl Exec for Direct {
    fn op(
        &self,
        _device: &Device,
        _name: &str,
        op: Op<TensorRef>,
        _record: &mut dyn FnMut(&Task),
    ) -> Result<()> {
        let op = op.try_map(|_, _, t| {
            let a = self.allocation(t.handle)?;
            Ok::<_, Error>(Tensor::with_layout(a, t.layout).at(t.offset))
        })?;
        self.stream.run_op(&op)
    }

    fn builtin(&self, _device: &Device, op: Builtin, buffers: &[Handle]) -> Result<()> {
        let memory = buffers
            .iter()
            .map(|h| self.allocation(*h))
            .collect::<Result<Vec<_>>>()?;
        let expected = op.buffers();
        if memory.len() != expected {
            return Err(Error::invalid(format!(
                "{op:?} takes {expected} buffers, not {}",
                memory.len()
            )));
        }
        match op {
            Builtin::Fill { value } => self.stream.fill(memory[0], value),
            Builtin::Binary { op, dtype } => self
                .stream
                .binary(op, dtype, memory[0], memory[1], memory[2]),
            Builtin::Accumulate { op, dtype } => {
                self.stream.accumulate(op, dtype, memory[0], memory[1])
            }
            Builtin::Scale { alpha } => self.stream.scale(memory[0], memory[1], alpha),
            Builtin::Cast { from, to } => self.stream.cast(memory[0], from, memory[1], to),
        }
    }

    fn read(&self, h: Handle) -> Result<Vec<u8>> {
        self.stream.read(self.allocation(h)?)
    }
}
