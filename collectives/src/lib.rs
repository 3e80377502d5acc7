//! # xpu-collectives: topology and communicators across backends
//!
//! Collective operations (all-reduce and its relatives) are what let data-parallel
//! training scale. This crate builds them over the HAL, so a communicator's ranks can be
//! devices of any backend in any mix.
//!
//! ## Topology
//!
//! [`topology`] describes where devices sit and how fast each pair exchanges data: hwloc's
//! view of the machine (or an NCCL-format topology file where hwloc cannot see the real
//! PCI tree) joined with what each backend reports about its devices, classified per pair
//! into a [`LinkClass`] with a latency and a bandwidth, first estimated from the class and
//! then measured by [`topology::calibrate`]. Algorithms are chosen from these figures.

pub mod check;
pub mod comm;
pub mod topology;

pub use comm::algorithms::Algorithm;
pub use comm::op::{Collective, OpDesc, ReduceOp};
pub use comm::{CommOptions, Communicator, Rank};
pub use topology::{Link, LinkClass, TopoDevice, Topology};
