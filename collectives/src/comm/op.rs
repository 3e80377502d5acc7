//! What a collective call is: its kind, reduction, and the description every rank must
//! agree on.

use std::fmt;
use std::str::FromStr;

use xpu_hal::{BinaryOp, DType, Error};

/// How a reduction combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
    /// The sum divided by the number of ranks. Floating-point dtypes multiply the sum by
    /// 1/n in their own precision; integer dtypes divide with truncation toward zero
    /// (computed through `f64`: exact while the sum's magnitude is below 2^51 / n).
    Avg,
}

impl ReduceOp {
    /// Every operation.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The lowercase name, as nccl-tests prints it (`sum`, `prod`, `min`, `max`, `avg`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The HAL operator that combines two partial results (`Avg` combines by summing).
    pub const fn combine(self) -> BinaryOp {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => BinaryOp::Sum,
            ReduceOp::Prod => BinaryOp::Prod,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Max => BinaryOp::Max,
        }
    }
}

pub(crate) use xpu_hal::reference::avg_factor;

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown reduction `{s}`; expected one of sum, prod, min, max, avg"
                ))
            })
    }
}

/// The kinds of collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// Every rank ends with the reduction of all ranks' buffers.
    AllReduce,
    /// The root ends with the reduction of all ranks' buffers.
    Reduce,
    /// Every rank ends with the root's buffer.
    Broadcast,
    /// Every rank ends with all ranks' buffers, concatenated in rank order.
    AllGather,
    /// Rank `r` ends with block `r` of the reduction of all ranks' buffers.
    ReduceScatter,
    /// Rank `r` ends with block `r` of every rank's buffer, in rank order.
    AllToAll,
    /// Every rank waits until all ranks reach the barrier.
    Barrier,
    /// One rank's buffer is copied to another's.
    SendRecv,
}

impl Collective {
    /// Every kind that has algorithms to choose from.
    pub const ALL: [Collective; 8] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Barrier,
        Collective::SendRecv,
    ];

    /// The name used in messages, overrides and benchmarks (`allreduce`, `broadcast` …).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllToAll => "alltoall",
            Collective::Barrier => "barrier",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// The bus-bandwidth factor nccl-tests applies to the algorithm bandwidth for `n`
    /// ranks: 2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and
    /// all-to-all, 1 otherwise.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (n - 1.0) / n
            }
            _ => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted: String = s
            .trim()
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .collect();
        Collective::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(&wanted))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown collective `{s}`; expected one of allreduce, reduce, broadcast, allgather, reducescatter, alltoall, barrier, sendrecv"
                ))
            })
    }
}

/// What one rank asked for: every rank of a collective must ask for the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpDesc {
    /// The operation.
    pub kind: Collective,
    /// Bytes per rank of the operation's unit: the buffer of all-reduce, reduce and
    /// broadcast; one rank's block of all-gather, reduce-scatter and all-to-all.
    pub bytes: u64,
    /// The element type, for reductions.
    pub dtype: Option<DType>,
    /// The reduction, for reductions.
    pub op: Option<ReduceOp>,
    /// The root rank of reduce and broadcast.
    pub root: Option<usize>,
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        match (self.dtype, self.op) {
            (Some(dtype), Some(op)) => write!(
                f,
                " of {} × {} ({op})",
                self.bytes / dtype.size() as u64,
                dtype.name()
            )?,
            _ if self.kind != Collective::Barrier => write!(f, " of {} bytes", self.bytes)?,
            _ => {}
        }
        if let Some(root) = self.root {
            write!(f, " with root {root}")?;
        }
        Ok(())
    }
}
