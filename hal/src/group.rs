//! Vendor collective libraries through the contract: a backend whose devices have one
//! (NCCL for CUDA; HCCL, CNCL or BKCL behind a plugin's native collectives, ABI 1.3)
//! offers a [`CollectiveGroup`] over a set of its devices, and the collectives layer
//! runs whole operations through it without naming the backend. A group may state its
//! cost ([`GroupCost`]), which the collectives' cost model weighs against its own
//! algorithms; one that states none is preferred wherever it implements the operation.
//!
//! A group may also span processes, as NCCL's and the vendor libraries' communicators
//! do: one process makes an identifier ([`group_id`]: `ncclGetUniqueId`,
//! `HcclGetRootInfo`), hands it to the others through its own means (the collectives
//! send it over MPI), and every process joins with its own devices and their ranks
//! ([`collective_group_across`], [`GroupAcross`]). Joining is collective: it returns once
//! every rank of every process has joined, or fails after the group's timeout.

use std::time::Duration;

use crate::{BufferSlice, DType, Device, Result, Stream};

/// How a group is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// How long one rank's part of an operation may wait for the other ranks' parts
    /// once it has started on its stream, where the library bounds its waits.
    pub timeout: Duration,
}

/// Where this process's devices sit in a group that spans processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAcross {
    /// The identifier one process made with [`group_id`]: the same bytes in every
    /// process.
    pub id: Vec<u8>,
    /// The ranks in all processes.
    pub size: usize,
    /// The rank of each of this process's devices in the whole group, `ranks[i]` for
    /// `devices[i]`: distinct, below `size`, and each rank of the group in exactly one
    /// process.
    pub ranks: Vec<usize>,
}

impl GroupAcross {
    /// Checks the ranks against `devices` local devices: one per device, distinct and
    /// below `size`, and an identifier of at most [`GroupAcross::MAX_ID`] bytes.
    pub fn check(&self, devices: usize) -> Result<()> {
        if self.id.is_empty() || self.id.len() > Self::MAX_ID {
            return Err(crate::Error::invalid(format!(
                "a group identifier of {} bytes; pass the 1 to {} bytes group_id made in one process",
                self.id.len(),
                Self::MAX_ID
            )));
        }
        if self.ranks.len() != devices || devices == 0 {
            return Err(crate::Error::invalid(format!(
                "{} ranks for {devices} devices; give each of this process's devices its rank in the group",
                self.ranks.len()
            )));
        }
        let mut seen = self.ranks.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.ranks.len() || seen.last().is_some_and(|&r| r >= self.size) {
            return Err(crate::Error::invalid(format!(
                "the ranks {:?} are not distinct ranks of a group of {}; give each device its own rank below the group's size",
                self.ranks, self.size
            )));
        }
        Ok(())
    }

    /// The longest identifier a group may have (HCCL's root info is 4,108 bytes,
    /// NCCL's unique id 128).
    pub const MAX_ID: usize = 8192;
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
/// `r`-th device it was made for. A group across processes ([`collective_group_across`])
/// has the ranks of every process, and this process's parts are those of its own
/// devices, in their order; roots are ranks of the whole group.
pub trait CollectiveGroup: Send + Sync {
    /// The number of ranks, in every process.
    fn size(&self) -> usize;

    /// The number of this process's ranks: the parts [`CollectiveGroup::run`] takes.
    fn local_size(&self) -> usize {
        self.size()
    }

    /// The library's name and version, for reports (`nccl 2.23.4`, `simccl 1.0`).
    fn library(&self) -> String;

    /// The library's figures, if it states them.
    fn cost(&self) -> Option<GroupCost> {
        None
    }

    /// Enqueues `op` for every rank of this process, `parts[i]` being the stream and
    /// buffers of the `i`-th device the group was made for. Each rank's stream then
    /// counts the work as its own.
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

/// Whether the backend of `devices` (all of one backend) can make groups that span
/// processes; false for a mix of backends or an empty list.
pub fn spans_processes(devices: &[Device]) -> bool {
    devices.first().is_some_and(|first| {
        devices.iter().all(|d| d.backend() == first.backend())
            && first.implementation().collective_groups_across()
    })
}

/// A fresh identifier for a group across processes, made by one process with one of
/// its devices; every process then joins with it ([`collective_group_across`]).
pub fn group_id(device: &Device) -> Result<Vec<u8>> {
    let id = device.implementation().collective_group_id()?;
    if id.is_empty() || id.len() > GroupAcross::MAX_ID {
        return Err(crate::Error::backend_message(
            device.backend(),
            format!(
                "made a group identifier of {} bytes; at most {} are allowed",
                id.len(),
                GroupAcross::MAX_ID
            ),
        ));
    }
    Ok(id)
}

/// This process's part of the vendor library's group across processes: `devices`, of
/// one backend, at the ranks `across` gives them. Collective: every process of the group
/// calls it with the same identifier, and it returns once all have joined, or fails
/// with a timeout after `config.timeout`.
pub fn collective_group_across(
    devices: &[Device],
    across: &GroupAcross,
    config: GroupConfig,
) -> Result<Box<dyn CollectiveGroup>> {
    across.check(devices.len())?;
    let first = &devices[0];
    if !spans_processes(devices) {
        return Err(crate::Error::unsupported(format!(
            "{} offers no collective library across processes for these devices; the collectives' own algorithms run",
            first.backend()
        )));
    }
    let group = first
        .implementation()
        .collective_group_across(devices, across, config)?;
    if group.size() != across.size || group.local_size() != devices.len() {
        return Err(crate::Error::backend_message(
            first.backend(),
            format!(
                "made a group of {} ranks, {} here, for {} ranks, {} here",
                group.size(),
                group.local_size(),
                across.size,
                devices.len()
            ),
        ));
    }
    Ok(group)
}
