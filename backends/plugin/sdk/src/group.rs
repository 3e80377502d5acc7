//! Native collectives (ABI 1.3): a plugin whose devices come with a collective library
//! of their own offers it as a [`Group`] over a set of its devices. The host weighs the
//! library against its own algorithms with the figures in [`NewGroup`] and hands it
//! whole operations ([`GroupCall`]), every rank's part at once.
//!
//! A plugin opts in with [`Plugin::COLLECTIVES`](crate::Plugin::COLLECTIVES) and
//! implements [`Plugin::create_group`](crate::Plugin::create_group); the SDK then exports
//! `group_create`, `group_run`, `group_abort` and `group_destroy`, and checks every call
//! before the plugin sees it: the devices are distinct devices of this plugin, there is
//! one part per rank, each part's stream belongs to its rank's device, and every range
//! lies on that device with the length the operation implies, identical to or disjoint
//! from the rank's other range — or, for all-gather and reduce-scatter in place, the
//! rank's block of it. A plugin that reads what it needs before it writes (as
//! `xpu-sim-npu` does) handles all of these alike.

use std::ffi::CStr;
use std::time::Duration;

use crate::error::Result;
use crate::plugin::Plugin;
use crate::types::{BufferRange, DType};

/// What a group is asked to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// How long a rank's part may wait for its peers' parts once it has started (and,
    /// across processes, how long joining may take); `None`: the plugin's own default.
    pub timeout: Option<Duration>,
    /// Set for a group that spans processes (ABI 1.4): where this process's devices
    /// sit in it. `None`: a group of this process's devices alone.
    pub across: Option<GroupAcross>,
}

/// Where this process's devices sit in a group across processes (ABI 1.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAcross {
    /// The identifier [`Plugin::group_id`](crate::Plugin::group_id) made in one process.
    pub id: Vec<u8>,
    /// The ranks in all processes.
    pub size: usize,
    /// The rank in the whole group of each device given, in their order (checked by
    /// the SDK: distinct and below `size`).
    pub ranks: Vec<usize>,
}

/// A group, made by [`Plugin::create_group`](crate::Plugin::create_group), with what the
/// host is told about its library.
pub struct NewGroup<P: Plugin> {
    /// The group.
    pub group: Box<dyn Group<P>>,
    /// The library's name and version, for reports (`c"simccl 1.0"`).
    pub library: &'static CStr,
    /// The time of an empty operation, if the library states it.
    pub latency: Option<Duration>,
    /// Its bus bandwidth in bytes per second, if it states it. The host expects an
    /// operation of `B` bytes per rank to take `latency + B × factor / bus_bytes_per_s`
    /// with nccl-tests' bus-bandwidth factors (see the header); with either figure
    /// absent it prefers the library wherever the library implements the operation.
    pub bus_bytes_per_s: Option<u64>,
}

/// A reduction of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum (a NaN operand is ignored).
    Min,
    /// Maximum (a NaN operand is ignored).
    Max,
    /// The sum divided by the number of ranks: multiplied by `1/n` in the dtype's
    /// precision, and for integers through `f64` by the next `f64` above `1/n`,
    /// truncated toward zero (`xpu_hal::reference::average` computes exactly this).
    Avg,
}

impl CollectiveOp {
    /// The `xpu_collective_op` value.
    pub const fn raw(self) -> u32 {
        use crate::abi::collective_op as c;
        match self {
            CollectiveOp::Sum => c::SUM,
            CollectiveOp::Prod => c::PROD,
            CollectiveOp::Min => c::MIN,
            CollectiveOp::Max => c::MAX,
            CollectiveOp::Avg => c::AVG,
        }
    }

    /// The operation of an `xpu_collective_op` value.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        use crate::abi::collective_op as c;
        Some(match raw {
            c::SUM => CollectiveOp::Sum,
            c::PROD => CollectiveOp::Prod,
            c::MIN => CollectiveOp::Min,
            c::MAX => CollectiveOp::Max,
            c::AVG => CollectiveOp::Avg,
            _ => return None,
        })
    }
}

/// One operation, described the same for every rank. Element counts are of `dtype`;
/// byte counts are for the operations that only move bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCall {
    /// Every rank's recv (`count` elements) = `op` over the ranks' send.
    AllReduce {
        /// Elements per rank.
        count: u64,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: CollectiveOp,
    },
    /// Root's recv = `op` over the ranks' send; the other ranks have no recv.
    Reduce {
        /// Elements per rank.
        count: u64,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: CollectiveOp,
        /// The rank that receives.
        root: usize,
    },
    /// Root's send (or, without one, its recv) to every rank's recv.
    Broadcast {
        /// Bytes.
        bytes: u64,
        /// The rank whose data it is.
        root: usize,
    },
    /// Every recv (`n × bytes`) = the ranks' sends in rank order.
    AllGather {
        /// Bytes each rank contributes.
        bytes: u64,
    },
    /// Rank r's recv (`count` elements) = `op` over block r of the ranks' sends.
    ReduceScatter {
        /// Elements each rank receives.
        count: u64,
        /// Their type.
        dtype: DType,
        /// The reduction.
        op: CollectiveOp,
    },
    /// Block q of rank r's recv = block r of rank q's send (`bytes` per block).
    AllToAll {
        /// Bytes per block.
        bytes: u64,
    },
}

/// One rank's part of an operation: its stream and ranges (`None` where the rank has
/// none). The ranges hold their buffers, so work enqueued with them may keep them.
pub struct GroupPart<'a, P: Plugin> {
    /// The rank's stream, on the rank's device.
    pub stream: &'a P::Stream,
    /// The send range.
    pub send: Option<BufferRange<P::Buffer>>,
    /// The receive range.
    pub recv: Option<BufferRange<P::Buffer>>,
}

/// A native collective communicator over devices of the plugin, rank `r` on the `r`-th
/// device it was made for (across processes: the parts are this process's devices', in
/// their order, and roots and blocks are ranks of the whole group). Dropping it is
/// `group_destroy`: it should return only once no part of the group runs any more.
pub trait Group<P: Plugin>: Send + Sync + 'static {
    /// Enqueues `call` on every rank's stream, `parts[r]` being rank `r`'s (guaranteed
    /// by the SDK: one part per rank of this process, on the rank's device, ranges as
    /// `call` needs).
    /// Returns at once; a rank's part fails its stream's work with `Timeout` when its
    /// peers do not start within the group's timeout, and with `Aborted` when a peer's
    /// part failed or the group was aborted. An error returned here must leave nothing
    /// enqueued on any stream.
    fn run(&self, call: GroupCall, parts: Vec<GroupPart<'_, P>>) -> Result<()>;

    /// Releases every part that waits and fails every part not yet finished, now and
    /// from then on, with `Aborted`. Returns at once.
    fn abort(&self);
}
