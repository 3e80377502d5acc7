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
//!
//! ## Communicators
//!
//! [`Communicator`] groups ranks, one device each; every rank calls the same operations
//! in the same order through its [`Rank`] handle, usually from its own thread. The last
//! rank to arrive checks that all asked for the same ([`OpDesc`]), picks an
//! [`Algorithm`] with the α-β model of [`comm::select`] (overridable with
//! `XPU_COLL_ALGO`), and enqueues the whole operation on every rank's stream; the data
//! moves asynchronously there, through the device's own memory, a peer copy, or host
//! staging between backends ([`comm`]'s transport). Timeouts name the ranks that never
//! arrived, and [`Communicator::abort`] never waits.
//!
//! Three faster paths take over where they can:
//!
//! - **small operations** (≤ 4 KiB) on host ranks skip the rendezvous: each rank copies
//!   its input into a slot, raises a flag, and computes its own result from the others'
//!   slots (an LL-style exchange of a few cache lines);
//! - **shared memory**: when every rank's memory is addressable by the CPU (host memory,
//!   or a device sharing it) — or reachable only through host memory anyway, then staged
//!   once each way — and every stream is idle, the ranks' own threads reduce straight from
//!   each other's buffers into each other's outputs in one pass, and the call returns with
//!   the operation done; on host devices with busy streams the same shares run on the
//!   streams, as host functions, when every stream has reached the operation;
//! - **the devices' own library** ([`Algorithm::Native`]): when the devices' backend
//!   offers one over them ([`xpu_hal::group`]) — NCCL for CUDA devices where it is
//!   installed, a plugin's native collectives (plugin ABI 1.3) for its NPUs — the last
//!   rank to arrive hands the whole operation to it, after the same rendezvous. A
//!   library that states its cost is weighed against the algorithms above by the cost
//!   model; one that does not is preferred wherever it implements the operation.
//!   `XPU_COLL_ALGO` forces either way (`allreduce:native`, `allreduce:ring`). Across
//!   processes, a library whose groups span them (NCCL ≥ 2.14, a plugin of ABI 1.4)
//!   gets a group over every process's ranks when all processes agree on it, and runs
//!   the operations it is chosen for instead of the leaders' exchange (see [`process`]).
//!
//! [`Communicator::stats`] counts which way operations ran.
//!
//! ## Checking
//!
//! [`check`] makes inputs whose reductions are exact in every dtype and order, so tests,
//! the conformance profile and `xpu bench collectives` count wrong elements exactly.

pub mod check;
pub mod comm;
pub mod process;
pub mod topology;

pub use comm::algorithms::Algorithm;
pub use comm::op::{Collective, OpDesc, ReduceOp};
pub use comm::{CommOptions, CommStats, Communicator, Rank};
pub use topology::{Link, LinkClass, TopoDevice, Topology};
