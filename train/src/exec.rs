//! [`Exec`]: where a model's operations go. Training submits them to the scheduler as
//! tasks; the direct path of `xpu bench train` runs them straight on one device's
//! stream, to measure what the scheduler costs.

use std::collections::HashMap;

use xpu_hal::ops::{Op, Tensor};
use xpu_hal::{Allocation, BinaryOp, DType, Device, Error, Result, Stream};
use xpu_scheduler::{Builtin, Codelet, Handle, Scheduler, Task, TensorRef};

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

    /// `out = a + b`, whole `f32` handles, on `device`.
    fn add(&self, device: &Device, a: Handle, b: Handle, out: Handle) -> Result<()>;
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

    fn add(&self, device: &Device, a: Handle, b: Handle, out: Handle) -> Result<()> {
        let add = Codelet::from_builtin(Builtin::Binary {
            op: BinaryOp::Sum,
            dtype: DType::F32,
        });
        self.submit(Task::new(&add).read(a).read(b).write(out).on(device))?;
        Ok(())
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

    fn add(&self, _device: &Device, a: Handle, b: Handle, out: Handle) -> Result<()> {
        self.stream.binary(
            BinaryOp::Sum,
            DType::F32,
            self.allocation(a)?,
            self.allocation(b)?,
            self.allocation(out)?,
        )
    }
}
