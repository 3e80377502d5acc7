//! NCCL as an algorithm: the last rank to arrive hands the whole operation to the
//! communicator's [`NcclGroup`], which enqueues every rank's part on its stream in one
//! NCCL group call. The rendezvous before it keeps xpu's desync detection and timeouts.

use xpu_cuda::nccl::{NcclOp, NcclPart, NcclReduce};
use xpu_hal::{Error, Result};

use super::{Collective, Run};
use crate::comm::op::ReduceOp;

fn reduce(op: ReduceOp) -> NcclReduce {
    match op {
        ReduceOp::Sum => NcclReduce::Sum,
        ReduceOp::Prod => NcclReduce::Prod,
        ReduceOp::Min => NcclReduce::Min,
        ReduceOp::Max => NcclReduce::Max,
        ReduceOp::Avg => NcclReduce::Avg,
    }
}

impl Run<'_> {
    /// Runs the operation through NCCL.
    pub(super) fn nccl(&mut self) -> Result<()> {
        let Some(group) = self.nccl else {
            return Err(Error::backend_message(
                "collectives",
                "internal error: NCCL was chosen for a communicator without an NCCL group",
            ));
        };
        let bytes = usize::try_from(self.bytes)
            .map_err(|_| Error::invalid("the operation does not fit this platform's sizes"))?;
        let count = bytes / self.elem() as usize;
        let op = self.op.map(reduce).unwrap_or(NcclReduce::Sum);
        let root = self.root;
        let call = match self.kind {
            Collective::AllReduce => NcclOp::AllReduce {
                count,
                dtype: self.dtype()?,
                op,
            },
            Collective::Reduce => NcclOp::Reduce {
                count,
                dtype: self.dtype()?,
                op,
                root,
            },
            Collective::ReduceScatter => NcclOp::ReduceScatter {
                count,
                dtype: self.dtype()?,
                op,
            },
            Collective::Broadcast => NcclOp::Broadcast { bytes, root },
            Collective::AllGather => NcclOp::AllGather { bytes },
            Collective::AllToAll => NcclOp::AllToAll { bytes },
            Collective::Barrier | Collective::SendRecv => {
                return Err(Error::backend_message(
                    "collectives",
                    format!("internal error: NCCL does not run {}", self.kind),
                ))
            }
        };
        let parts: Vec<NcclPart<'_>> = self
            .ranks
            .iter()
            .zip(self.buffers)
            .map(|(io, b)| NcclPart {
                stream: &io.stream,
                send: b.send.as_ref().map(|s| s.buf()),
                recv: b.recv.as_ref().map(|r| r.buf()),
            })
            .collect();
        group.run(call, &parts)
    }
}
