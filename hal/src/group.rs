//! Vendor collective libraries through the contract: a backend whose devices have one
//! (NCCL for CUDA; HCCL, CNCL or BKCL behind a plugin's native collectives, ABI 1.3)
//! offers a [`CollectiveGroup`] over a set of its devices, and the collectives layer
//! runs whole operations through it without naming the backend. A group may state its
//! cost ([`GroupCost`]), which the collectives' cost model weighs against its own
//! algorithms; one that states none is preferred wherever it implements the operation.

use std::time::Duration;

use crate::{BufferSlice, DType, Device, Result, Stream};

/// How a group is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// How long one rank's part of an operation may wait for the other ranks' parts
    /// once it has started on its stream, where the library bounds its waits.
    pub timeout: Duration,
}

/// A library's own figures for its operations: one moving `B` bytes per rank is
/// expected to take `latency + B × factor / bus_bytes_per_s`, with nccl-tests'
/// bus-bandwidth factor of the operation (all-reduce `2(n−1)/n`; all-gather,
/// reduce-scatter and all-to-all `(n−1)/n` of the whole buffer; reduce and broadcast 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupCost {
    /// The time of an empty operation.
    pub latency: Duration,
    /// Bus bandwidth, bytes per second (positive).
    pub bus_bytes_per_s: f64,
}

/// A reduction a group computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupReduce {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over the ranks.
    Avg,
}

/// One collective, described the same for every rank. Counts are elements of `dtype`;
/// byte lengths are for operations that only move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOp {
    /// All-reduce of `count` elements.
    AllReduce {
        /// Elements per rank.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: GroupReduce,
    },
    /// Reduce of `count` elements to `root`.
    Reduce {
        /// Elements per rank.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: GroupReduce,
        /// The rank that receives the result.
        root: usize,
    },
    /// Broadcast of `bytes` from `root`.
    Broadcast {
        /// Bytes broadcast.
        bytes: usize,
        /// The rank whose data it is.
        root: usize,
    },
    /// All-gather of `bytes` per rank.
    AllGather {
        /// Bytes each rank contributes.
        bytes: usize,
    },
    /// Reduce-scatter of `count` elements per rank.
    ReduceScatter {
        /// Elements each rank receives.
        count: usize,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: GroupReduce,
    },
    /// Blocks of `bytes` between every pair.
    AllToAll {
        /// Bytes per block.
        bytes: usize,
    },
}

/// One rank's part of an operation: its stream and buffers (`None` where the rank has
/// none, as non-roots of a reduce).
pub struct GroupPart<'a> {
    /// The rank's stream, on its device.
    pub stream: &'a Stream,
    /// The send buffer.
    pub send: Option<BufferSlice<'a>>,
    /// The receive buffer.
    pub recv: Option<BufferSlice<'a>>,
}

/// A vendor library's communicators over devices of one backend, rank `r` on the
/// `r`-th device it was made for.
pub trait CollectiveGroup: Send + Sync {
    /// The number of ranks.
    fn size(&self) -> usize;

    /// The library's name and version, for reports (`nccl 2.23.4`, `simccl 1.0`).
    fn library(&self) -> String;

    /// The library's figures, if it states them.
    fn cost(&self) -> Option<GroupCost> {
        None
    }

    /// Enqueues `op` for every rank, `parts[r]` being rank `r`'s stream and buffers.
    /// Each rank's stream then counts the work as its own.
    fn run(&self, op: GroupOp, parts: &[GroupPart<'_>]) -> Result<()>;

    /// Releases every rank's part that waits and fails every part not yet finished,
    /// now and from then on (the communicator was aborted). Returns at once; may be
    /// called from any thread, more than once.
    fn abort(&self);
}

/// The vendor library's group over `devices`, when they all belong to one backend that
/// offers one ([`crate::backend::DeviceImpl::collective_group`]); `None` otherwise, and an
/// error saying why when the backend offers one but could not make it (the library is
/// absent, a device appears twice).
pub fn collective_group(
    devices: &[Device],
    config: GroupConfig,
) -> Option<Result<Box<dyn CollectiveGroup>>> {
    let first = devices.first()?;
    if devices.iter().any(|d| d.backend() != first.backend()) {
        return None;
    }
    first.implementation().collective_group(devices, config)
}
