//! The devices' own collective library as an algorithm: the last rank to arrive hands
//! the whole operation to the communicator's group (a
//! [`xpu_hal::group::CollectiveGroup`] its backend offers: NCCL for CUDA, a plugin's
//! native collectives), which enqueues every rank's part on its stream in one call.
//! The rendezvous before it keeps xpu's desync detection and timeouts.

use xpu_hal::group::{GroupOp, GroupPart, GroupReduce};
use xpu_hal::{Error, Result};

use super::{Collective, Run};
use crate::comm::op::ReduceOp;

/// The library's reduction of `op`.
pub(crate) fn group_reduce(op: ReduceOp) -> GroupReduce {
    match op {
        ReduceOp::Sum => GroupReduce::Sum,
        ReduceOp::Prod => GroupReduce::Prod,
        ReduceOp::Min => GroupReduce::Min,
        ReduceOp::Max => GroupReduce::Max,
        ReduceOp::Avg => GroupReduce::Avg,
    }
}

impl Run<'_> {
    /// Runs the operation through the devices' own library.
    pub(super) fn native(&mut self) -> Result<()> {
        let Some(group) = self.native else {
            return Err(Error::backend_message(
                "collectives",
                "internal error: the native library was chosen for a communicator without one",
            ));
        };
        let bytes = usize::try_from(self.bytes)
            .map_err(|_| Error::invalid("the operation does not fit this platform's sizes"))?;
        let count = bytes / self.elem() as usize;
        let op = self.op.map(group_reduce).unwrap_or(GroupReduce::Sum);
        let root = self.root;
        let call = match self.kind {
            Collective::AllReduce => GroupOp::AllReduce {
                count,
                dtype: self.dtype()?,
                op,
            },
            Collective::Reduce => GroupOp::Reduce {
                count,
                dtype: self.dtype()?,
                op,
                root,
            },
            Collective::ReduceScatter => GroupOp::ReduceScatter {
                count,
                dtype: self.dtype()?,
                op,
            },
            Collective::Broadcast => GroupOp::Broadcast { bytes, root },
            Collective::AllGather => GroupOp::AllGather { bytes },
            Collective::AllToAll => GroupOp::AllToAll { bytes },
            Collective::Barrier | Collective::SendRecv => {
                return Err(Error::backend_message(
                    "collectives",
                    format!(
                        "internal error: the native library does not run {}",
                        self.kind
                    ),
                ))
            }
        };
        let parts: Vec<GroupPart<'_>> = self
            .ranks
            .iter()
            .zip(self.buffers)
            .map(|(io, b)| GroupPart {
                stream: &io.stream,
                send: b.send.as_ref().map(|s| s.buf()),
                recv: b.recv.as_ref().map(|r| r.buf()),
            })
            .collect();
        group.run(call, &parts)
    }
}
