//! The `collectives` profile: can the device take part in communicators
//! (`xpu-collectives`), alone, with devices of its own backend, and with devices of every
//! other backend?
//!
//! Each operation family runs over three device sets built from the device under test and
//! its peers:
//!
//! - **self**: two ranks on the device itself (local paths, two streams of one device);
//! - **backend**: the device and one other device of its backend (peer paths where the
//!   backend has them), skipped when the run has no such device;
//! - **mixed**: the device and one device of every other backend in the run (host-staged
//!   paths), skipped when the run has a single backend.
//!
//! Every operation runs with each of its algorithms (forced through selector overrides),
//! in place and out of place where the API allows, at 1, 7 and 4099 elements. Reductions
//! run every dtype every rank supports and every [`ReduceOp`]; data movement does not
//! interpret elements, so it runs one dtype per element size. The self and backend sets
//! run every dtype with every reduction and every size with the ring and direct
//! algorithms; the mixed sets, whose ranks' arithmetic their own sets check, and the other
//! algorithms, built from the same transfers and reductions, run each dtype, reduction and
//! size at least once, so that a run over many devices stays short (see `steps`). Inputs and expected results
//! come from [`xpu_collectives::check`], whose values reduce exactly in every dtype and
//! order, so results are compared bit for bit; bytes around every buffer must stay
//! untouched, and out-of-place send buffers unchanged. Each rank runs on its own thread,
//! as an application drives a communicator; a rank that meets an error aborts the
//! communicator so that the others are released at once.
//!
//! The failure cases check what a rank sees when another misbehaves: a missing rank is a
//! timeout naming it on every waiting rank, different calls are a desync reported on every
//! rank, and `abort` releases a waiting rank.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use xpu_collectives::check;
use xpu_collectives::comm::select::Selector;
use xpu_collectives::{Algorithm, Collective, CommOptions, Communicator, Rank, ReduceOp, Topology};
use xpu_hal::{Allocation, DType, Device, Error, Stream};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome, Profile};
use crate::cases::util::hold;

/// Element counts every operation runs at: one element, an odd count smaller than most
/// chunkings, and an odd count that splits unevenly over any number of ranks.
const SIZES: [usize; 3] = [1, 7, 4099];

/// Bytes before and after every buffer that must stay untouched.
const GUARD: u64 = 256;

/// The guard pattern.
const GUARD_BYTE: u8 = 0xA5;

/// What receive buffers hold before an operation, so stale data cannot pass.
const FILLER_BYTE: u8 = 0x5A;

/// How long a rank of the sweeps waits for the others (far above what any operation
/// needs; a hang fails the case through the runner's limit first).
const SWEEP_TIMEOUT: Duration = Duration::from_secs(45);

/// The timeout of the failure cases.
const SHORT_TIMEOUT: Duration = Duration::from_millis(300);

/// At most this many wrong results are described in a failure message.
const REPORTED: usize = 4;

// ---------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------

/// The device sets a case builds communicators over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetKind {
    /// Two ranks on the device under test.
    SelfPair,
    /// The device and another device of its backend.
    Backend,
    /// The device and one device of every other backend.
    Mixed,
}

/// What a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// One collective kind, swept.
    Op(Collective),
    /// Point to point in every direction.
    SendRecv,
    /// Barriers, and the order they impose on streams.
    Barrier,
}

macro_rules! family_cases {
    ($( $fn_name:ident, $name:literal, $family:expr, $set:expr, $what:literal, $where:literal; )*) => {
        $(
            fn $fn_name(ctx: &CaseContext) -> CaseOutcome {
                run_family(ctx, $family, $set)
            }
        )*

        /// The cases of the `collectives` profile.
        pub(crate) const CASES: &[Case] = &[
            $(
                Case {
                    name: concat!("collectives.", $name),
                    profile: Profile::Collectives,
                    description: concat!($what, " ", $where),
                    run: $fn_name,
                    exclusive: false,
                },
            )*
            Case {
                name: "collectives.timeout_names_missing_rank",
                profile: Profile::Collectives,
                description: "when a rank never calls an all-reduce, every waiting rank gets a timeout naming the missing rank, and the communicator is failed for the late rank too",
                run: timeout_names_missing_rank,
                exclusive: false,
            },
            Case {
                name: "collectives.desync_on_every_rank",
                profile: Profile::Collectives,
                description: "ranks calling all-reduces of different sizes all get a desync error naming both calls, and the communicator still works afterwards",
                run: desync_on_every_rank,
                exclusive: false,
            },
            Case {
                name: "collectives.abort_releases_waiting_rank",
                profile: Profile::Collectives,
                description: "abort releases a rank waiting for the others with an aborted error, and later calls fail at once",
                run: abort_releases_waiting_rank,
                exclusive: false,
            },
        ];
    };
}

const SELF: &str = "on two ranks of the device itself";
const BACKEND: &str = "on the device and another device of its backend";
const MIXED: &str = "on the device and one device of every other backend in the run";

family_cases! {
    allreduce_self, "allreduce_self", Family::Op(Collective::AllReduce), SetKind::SelfPair,
        "all-reduce with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on two ranks of the device itself";
    allreduce_backend, "allreduce_backend", Family::Op(Collective::AllReduce), SetKind::Backend,
        "all-reduce with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on the device and another device of its backend";
    allreduce_mixed, "allreduce_mixed", Family::Op(Collective::AllReduce), SetKind::Mixed,
        "all-reduce with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on the device and one device of every other backend in the run";
    reduce_self, "reduce_self", Family::Op(Collective::Reduce), SetKind::SelfPair,
        "reduce to each root with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on two ranks of the device itself";
    reduce_backend, "reduce_backend", Family::Op(Collective::Reduce), SetKind::Backend,
        "reduce to each root with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on the device and another device of its backend";
    reduce_mixed, "reduce_mixed", Family::Op(Collective::Reduce), SetKind::Mixed,
        "reduce to each root with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements,", "on the device and one device of every other backend in the run";
    broadcast_self, "broadcast_self", Family::Op(Collective::Broadcast), SetKind::SelfPair,
        "broadcast from each root with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements,", "on two ranks of the device itself";
    broadcast_backend, "broadcast_backend", Family::Op(Collective::Broadcast), SetKind::Backend,
        "broadcast from each root with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements,", "on the device and another device of its backend";
    broadcast_mixed, "broadcast_mixed", Family::Op(Collective::Broadcast), SetKind::Mixed,
        "broadcast from each root with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements,", "on the device and one device of every other backend in the run";
    allgather_self, "allgather_self", Family::Op(Collective::AllGather), SetKind::SelfPair,
        "all-gather with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements per rank,", "on two ranks of the device itself";
    allgather_backend, "allgather_backend", Family::Op(Collective::AllGather), SetKind::Backend,
        "all-gather with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements per rank,", "on the device and another device of its backend";
    allgather_mixed, "allgather_mixed", Family::Op(Collective::AllGather), SetKind::Mixed,
        "all-gather with ring and direct, every element size, in place and out of place, at 1, 7 and 4099 elements per rank,", "on the device and one device of every other backend in the run";
    reducescatter_self, "reducescatter_self", Family::Op(Collective::ReduceScatter), SetKind::SelfPair,
        "reduce-scatter with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements per rank,", "on two ranks of the device itself";
    reducescatter_backend, "reducescatter_backend", Family::Op(Collective::ReduceScatter), SetKind::Backend,
        "reduce-scatter with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements per rank,", "on the device and another device of its backend";
    reducescatter_mixed, "reducescatter_mixed", Family::Op(Collective::ReduceScatter), SetKind::Mixed,
        "reduce-scatter with ring and direct, every common dtype and reduction, in place and out of place, at 1, 7 and 4099 elements per rank,", "on the device and one device of every other backend in the run";
    alltoall_self, "alltoall_self", Family::Op(Collective::AllToAll), SetKind::SelfPair,
        "all-to-all, every element size, at 1, 7 and 4099 elements per block,", "on two ranks of the device itself";
    alltoall_backend, "alltoall_backend", Family::Op(Collective::AllToAll), SetKind::Backend,
        "all-to-all, every element size, at 1, 7 and 4099 elements per block,", "on the device and another device of its backend";
    alltoall_mixed, "alltoall_mixed", Family::Op(Collective::AllToAll), SetKind::Mixed,
        "all-to-all, every element size, at 1, 7 and 4099 elements per block,", "on the device and one device of every other backend in the run";
    sendrecv_self, "sendrecv_self", Family::SendRecv, SetKind::SelfPair,
        "buffered sends of 1, 7 and 16387 bytes between every pair of ranks, both ways, received in order,", "on two ranks of the device itself";
    sendrecv_backend, "sendrecv_backend", Family::SendRecv, SetKind::Backend,
        "buffered sends of 1, 7 and 16387 bytes between every pair of ranks, both ways, received in order,", "on the device and another device of its backend";
    sendrecv_mixed, "sendrecv_mixed", Family::SendRecv, SetKind::Mixed,
        "buffered sends of 1, 7 and 16387 bytes between every pair of ranks, both ways, received in order,", "on the device and one device of every other backend in the run";
    barrier_self, "barrier_self", Family::Barrier, SetKind::SelfPair,
        "barriers complete on every rank, and work after a barrier waits for a rank held before it,", "on two ranks of the device itself";
    barrier_backend, "barrier_backend", Family::Barrier, SetKind::Backend,
        "barriers complete on every rank, and work after a barrier waits for a rank held before it,", "on the device and another device of its backend";
    barrier_mixed, "barrier_mixed", Family::Barrier, SetKind::Mixed,
        "barriers complete on every rank, and work after a barrier waits for a rank held before it,", "on the device and one device of every other backend in the run";
}

// The descriptions above spell the sets out; these keep them in one place for messages.
fn set_phrase(kind: SetKind) -> &'static str {
    match kind {
        SetKind::SelfPair => SELF,
        SetKind::Backend => BACKEND,
        SetKind::Mixed => MIXED,
    }
}

// ---------------------------------------------------------------------------------
// Device sets and communicators
// ---------------------------------------------------------------------------------

/// The devices of a set, rank by rank, or a skip naming what the run lacks.
fn device_set(ctx: &CaseContext, kind: SetKind) -> Result<Vec<Device>, CaseError> {
    let device = ctx.device.clone();
    match kind {
        SetKind::SelfPair => Ok(vec![device.clone(), device]),
        SetKind::Backend => {
            let peer = ctx
                .peers
                .iter()
                .find(|p| p.backend() == device.backend() && p.id() != device.id())
                .ok_or_else(|| {
                    CaseError::skip(format!(
                        "needs a second device of backend `{}` in the run",
                        device.backend()
                    ))
                })?;
            Ok(vec![device, peer.clone()])
        }
        SetKind::Mixed => {
            let mut set = vec![device];
            for p in &ctx.peers {
                if set.iter().all(|d| d.backend() != p.backend()) {
                    set.push(p.clone());
                }
            }
            if set.len() < 2 {
                return Err(CaseError::skip(format!(
                    "needs a device of a backend other than `{}` in the run",
                    ctx.device.backend()
                )));
            }
            Ok(set)
        }
    }
}

fn set_name(devices: &[Device]) -> String {
    let ids: Vec<String> = devices.iter().map(|d| d.id().to_string()).collect();
    format!("[{}]", ids.join(", "))
}

/// A communicator over `devices` with `overrides` forcing algorithms.
fn communicator(
    devices: &[Device],
    topology: &Topology,
    overrides: &str,
    timeout: Duration,
) -> Result<Communicator, CaseError> {
    let selector = Selector::parse(overrides)?;
    Ok(Communicator::with_topology(
        devices.to_vec(),
        topology.clone(),
        CommOptions { timeout, selector },
    )?)
}

/// Runs `body` for every rank of `comm` on a thread of its own, with a new stream of
/// the rank's device. The first rank whose body fails aborts the communicator, so that
/// the others are released, and its error is the result.
fn on_ranks<T, F>(comm: &Communicator, body: F) -> Result<Vec<T>, CaseError>
where
    T: Send,
    F: Fn(&Rank, &Stream) -> Result<T, CaseError> + Sync,
{
    let first_failure: Mutex<Option<usize>> = Mutex::new(None);
    let ranks = comm.ranks();
    let results: Vec<Result<T, CaseError>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|rank| {
                let body = &body;
                let first_failure = &first_failure;
                s.spawn(move || {
                    let result = rank
                        .device()
                        .create_stream()
                        .map_err(CaseError::from)
                        .and_then(|stream| body(rank, &stream));
                    if result.is_err() {
                        first_failure
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(rank.rank());
                        comm.abort();
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(CaseError::fail(format!(
                        "the thread of rank {r} panicked; a backend must turn panics into errors"
                    )))
                })
            })
            .collect()
    });
    let first = *first_failure.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(results.len());
    let mut errors: Vec<(usize, CaseError)> = Vec::new();
    for (r, result) in results.into_iter().enumerate() {
        match result {
            Ok(v) => out.push(v),
            Err(e) => errors.push((r, e)),
        }
    }
    if errors.is_empty() {
        return Ok(out);
    }
    let pick = errors
        .iter()
        .position(|(r, _)| Some(*r) == first)
        .unwrap_or(0);
    let (r, e) = errors.swap_remove(pick);
    Err(e.context(format!("rank {r} ({})", comm.devices()[r].id())))
}

// ---------------------------------------------------------------------------------
// Sweeps of one collective
// ---------------------------------------------------------------------------------

/// One call every rank makes, and what it is checked against.
#[derive(Debug, Clone, Copy)]
struct Step {
    kind: Collective,
    algorithm: Algorithm,
    dtype: DType,
    /// The reduction, for reducing kinds.
    op: Option<ReduceOp>,
    /// Elements of the operation's unit: the buffer of all-reduce, reduce and broadcast,
    /// one rank's block of all-gather, reduce-scatter and all-to-all.
    elems: usize,
    in_place: bool,
    /// The root of reduce and broadcast.
    root: usize,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.kind, self.algorithm, self.dtype.name())?;
        if let Some(op) = self.op {
            write!(f, " {op}")?;
        }
        write!(
            f,
            " × {} elements, {}",
            self.elems,
            if self.in_place {
                "in place"
            } else {
                "out of place"
            }
        )?;
        if matches!(self.kind, Collective::Reduce | Collective::Broadcast) {
            write!(f, ", root {}", self.root)?;
        }
        Ok(())
    }
}

fn is_reduction(kind: Collective) -> bool {
    matches!(
        kind,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    )
}

/// The algorithms `kind` has.
fn algorithms(kind: Collective) -> Vec<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| a.implements(kind))
        .collect()
}

/// Whether `algorithm` runs the thorough plan on the self and backend sets: ring,
/// direct and shared memory do, and so does the devices' own library (a vendor's code,
/// which shares nothing with xpu's algorithms); the others, which are built from the
/// same transfers and reductions as ring and direct, run the short plan everywhere so
/// that the profile stays quick.
fn thorough_for(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::Ring | Algorithm::Direct | Algorithm::SharedMemory | Algorithm::Native
    )
}

/// One dtype per element size, for operations that only move bytes.
const MOVE_DTYPES: [DType; 4] = [DType::U8, DType::F16, DType::F32, DType::F64];

/// The dtypes a reduction runs: those every rank supports. Skips when there is none,
/// naming what each rank lacks.
fn reduction_dtypes(devices: &[Device]) -> Result<Vec<DType>, CaseError> {
    let common: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|d| {
            devices
                .iter()
                .all(|dev| dev.capabilities().supports_dtype(*d))
        })
        .collect();
    if common.is_empty() {
        let lacking: Vec<String> = devices
            .iter()
            .map(|dev| {
                let missing: Vec<&str> = DType::ALL
                    .into_iter()
                    .filter(|d| !dev.capabilities().supports_dtype(*d))
                    .map(DType::name)
                    .collect();
                format!("{} lacks {}", dev.id(), missing.join(", "))
            })
            .collect();
        return Err(CaseError::skip(format!(
            "no dtype is supported by every rank ({})",
            lacking.join("; ")
        )));
    }
    Ok(common)
}

/// The steps of a sweep of `kind` with `algorithm` over `devices`, in place and out of
/// place where the operation allows, with the root moving from rank to rank.
///
/// `thorough`: every dtype with every reduction at 7 elements, and every dtype at 1 and
/// 4099 elements (the sizes that stress chunking: fewer elements than ranks, an uneven
/// split). Otherwise (the mixed sets, whose ranks' arithmetic their own sets check
/// thoroughly) each dtype, each reduction and each size at least once: every dtype at 7
/// elements, every reduction on one dtype, and 1 and 4099 elements on the first and last
/// dtypes.
fn steps(
    kind: Collective,
    algorithm: Algorithm,
    devices: &[Device],
    thorough: bool,
) -> Result<Vec<Step>, CaseError> {
    let n = devices.len();
    let reducing = is_reduction(kind);
    let dtypes = if reducing {
        reduction_dtypes(devices)?
    } else {
        MOVE_DTYPES.to_vec()
    };
    // Integer averages are computed through f64 on each rank.
    let f64_everywhere = devices
        .iter()
        .all(|d| d.capabilities().supports_dtype(DType::F64));
    let usable = |dtype: DType, op: Option<ReduceOp>| {
        op != Some(ReduceOp::Avg) || dtype.is_float() || f64_everywhere
    };
    let ops: Vec<Option<ReduceOp>> = if reducing {
        ReduceOp::ALL.into_iter().map(Some).collect()
    } else {
        vec![None]
    };
    let first_op = ops[0];
    let (middle, edges) = (SIZES[1], [SIZES[0], SIZES[2]]);
    let mut combos: Vec<(DType, Option<ReduceOp>, usize)> = Vec::new();
    if thorough {
        for &dtype in &dtypes {
            combos.extend(ops.iter().map(|&op| (dtype, op, middle)));
            combos.extend(edges.iter().map(|&elems| (dtype, first_op, elems)));
        }
    } else {
        combos.extend(dtypes.iter().map(|&dtype| (dtype, first_op, middle)));
        let main = if dtypes.contains(&DType::F32) {
            DType::F32
        } else {
            dtypes[0]
        };
        combos.extend(ops[1..].iter().map(|&op| (main, op, middle)));
        let mut ends = vec![dtypes[0]];
        ends.extend(dtypes.last().filter(|d| **d != dtypes[0]));
        for elems in edges {
            combos.extend(ends.iter().map(|&dtype| (dtype, first_op, elems)));
        }
    }
    let in_place: &[bool] = if kind == Collective::AllToAll {
        &[false]
    } else {
        &[false, true]
    };
    let mut out = Vec::new();
    for (dtype, op, elems) in combos {
        if !usable(dtype, op) {
            continue;
        }
        for &in_place in in_place {
            let root = out.len() % n;
            out.push(Step {
                kind,
                algorithm,
                dtype,
                op,
                elems,
                in_place,
                root,
            });
        }
    }
    Ok(out)
}

fn run_family(ctx: &CaseContext, family: Family, set: SetKind) -> CaseOutcome {
    let devices = device_set(ctx, set)?;
    let topology = Topology::discover(&devices)?;
    let name = set_name(&devices);
    let result = match family {
        Family::Op(kind) => sweep(kind, &devices, &topology, set != SetKind::Mixed),
        Family::SendRecv => send_recv(&devices, &topology),
        Family::Barrier => barrier(&devices, &topology),
    };
    result.map_err(|e| e.context(format!("{} {name}", set_phrase(set))))
}

fn sweep(kind: Collective, devices: &[Device], topology: &Topology, thorough: bool) -> CaseOutcome {
    let mut wrong: Vec<String> = Vec::new();
    for algorithm in algorithms(kind) {
        let comm = communicator(
            devices,
            topology,
            &format!("{}:{}", kind.name(), algorithm.name()),
            SWEEP_TIMEOUT,
        )?;
        if !comm.offers(algorithm) {
            // Shared memory needs every rank host addressable (or staging through host
            // memory), the native library a backend that offers one over these devices
            // (NCCL, a plugin's native collectives): the others run the rest.
            continue;
        }
        let chosen = comm.algorithm_for(kind, 4).0;
        if chosen != algorithm {
            return Err(CaseError::fail(format!(
                "forcing {kind} to {algorithm} through an override chose {chosen}"
            )));
        }
        let plan = steps(
            kind,
            algorithm,
            devices,
            thorough && thorough_for(algorithm),
        )?;
        let per_rank = on_ranks(&comm, |rank, stream| {
            let mut found = Vec::new();
            for step in &plan {
                let w = run_step(rank, stream, step).map_err(|e| e.context(step))?;
                found.extend(w);
            }
            Ok(found)
        })?;
        wrong.extend(per_rank.into_iter().flatten());
        let stats = comm.stats();
        if algorithm == Algorithm::SharedMemory && stats.shared_memory == 0 {
            return Err(CaseError::fail(format!(
                "{kind} forced to shared memory over idle streams never ran in shared memory ({} enqueued)",
                stats.enqueued
            )));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let total = wrong.len();
    wrong.truncate(REPORTED);
    Err(CaseError::fail(format!(
        "{total} wrong result(s): {}{}",
        wrong.join("; "),
        if total > REPORTED { "; …" } else { "" }
    )))
}

/// Buffers in one allocation, each with guard bytes on both sides: one write fills
/// them all and one read checks them all.
struct Guarded {
    alloc: Allocation,
    /// Offset and length of each buffer.
    regions: Vec<(u64, u64)>,
}

impl Guarded {
    /// New guarded buffers holding `parts`.
    fn new(device: &Device, stream: &Stream, parts: &[&[u8]]) -> Result<Self, CaseError> {
        let mut bytes = vec![GUARD_BYTE; GUARD as usize];
        let mut regions = Vec::with_capacity(parts.len());
        for part in parts {
            regions.push((bytes.len() as u64, part.len() as u64));
            bytes.extend_from_slice(part);
            bytes.extend(std::iter::repeat_n(GUARD_BYTE, GUARD as usize));
        }
        let alloc = device.allocate(bytes.len() as u64)?;
        stream.write(&alloc, &bytes)?;
        Ok(Guarded { alloc, regions })
    }

    /// Buffer `i`.
    fn all(&self, i: usize) -> xpu_hal::BufferSlice<'_> {
        let (offset, len) = self.regions[i];
        self.alloc.slice(offset, len)
    }

    /// `[offset, offset + len)` of buffer `i`.
    fn part(&self, i: usize, offset: u64, len: u64) -> xpu_hal::BufferSlice<'_> {
        self.alloc.slice(self.regions[i].0 + offset, len)
    }

    /// Reads the buffers back: their contents, or a description of the damaged guards.
    fn read(&self, stream: &Stream) -> Result<Result<Vec<Vec<u8>>, String>, CaseError> {
        let bytes = stream.read(&self.alloc)?;
        let mut inside = vec![false; bytes.len()];
        for &(offset, len) in &self.regions {
            inside[offset as usize..(offset + len) as usize].fill(true);
        }
        let bad = bytes
            .iter()
            .zip(&inside)
            .filter(|(b, inside)| !**inside && **b != GUARD_BYTE)
            .count();
        if bad > 0 {
            let sizes: Vec<String> = self.regions.iter().map(|(_, l)| l.to_string()).collect();
            return Ok(Err(format!(
                "{bad} byte(s) around its buffers ({} bytes) were overwritten",
                sizes.join(" and ")
            )));
        }
        Ok(Ok(self
            .regions
            .iter()
            .map(|&(offset, len)| bytes[offset as usize..(offset + len) as usize].to_vec())
            .collect()))
    }
}

/// Runs one step on one rank; returns descriptions of what this rank found wrong.
fn run_step(rank: &Rank, stream: &Stream, step: &Step) -> Result<Vec<String>, CaseError> {
    let (r, n) = (rank.rank(), rank.size());
    let device = rank.device();
    let Step {
        kind,
        dtype,
        elems,
        in_place,
        root,
        ..
    } = *step;
    let op = step.op.unwrap_or(ReduceOp::Sum);
    let size = dtype.size();
    let block = (elems * size) as u64;
    let (send_elems, recv_elems) = match kind {
        Collective::AllGather => (elems, elems * n),
        Collective::ReduceScatter => (elems * n, elems),
        Collective::AllToAll => (elems * n, elems * n),
        _ => (elems, elems),
    };
    let input = check::input(dtype, step.op, r, n, send_elems);
    let own = r as u64 * block;

    // Buffer 0 is `send`; buffer 1, when the operation is out of place, `recv`.
    let buffers = match (kind, in_place) {
        (Collective::AllGather, true) => {
            // The send buffer is this rank's block of the receive buffer.
            let mut data = vec![FILLER_BYTE; recv_elems * size];
            data[own as usize..(own + block) as usize].copy_from_slice(&input);
            Guarded::new(device, stream, &[&data])?
        }
        (_, true) => Guarded::new(device, stream, &[&input])?,
        (_, false) => Guarded::new(
            device,
            stream,
            &[&input, &vec![FILLER_BYTE; recv_elems * size]],
        )?,
    };
    let send = buffers.all(0);
    let target = if in_place { 0 } else { 1 };
    let recv = buffers.all(target);
    match kind {
        Collective::AllReduce => rank.all_reduce(send, recv, dtype, op, stream)?,
        Collective::Reduce => {
            rank.reduce(send, (r == root).then_some(recv), dtype, op, root, stream)?
        }
        Collective::Broadcast if in_place => rank.broadcast(None, send, root, stream)?,
        Collective::Broadcast => rank.broadcast((r == root).then_some(send), recv, root, stream)?,
        Collective::AllGather if in_place => {
            rank.all_gather(buffers.part(0, own, block), send, stream)?
        }
        Collective::AllGather => rank.all_gather(send, recv, stream)?,
        Collective::ReduceScatter if in_place => {
            rank.reduce_scatter(send, buffers.part(0, own, block), dtype, op, stream)?
        }
        Collective::ReduceScatter => rank.reduce_scatter(send, recv, dtype, op, stream)?,
        Collective::AllToAll => rank.all_to_all(send, recv, stream)?,
        Collective::Barrier | Collective::SendRecv => {
            return Err(CaseError::fail(format!(
                "{kind} is not swept by element; this is a bug in the case"
            )))
        }
    }

    let mut wrong = Vec::new();
    let whose = || format!("rank {r} ({})", device.id());
    // The result.
    let want: Option<Vec<u8>> = match kind {
        Collective::AllReduce => Some(check::reduced(dtype, op, n, elems)),
        Collective::Reduce if r == root => Some(check::reduced(dtype, op, n, elems)),
        Collective::Reduce => None,
        Collective::Broadcast => Some(check::input(dtype, None, root, n, elems)),
        Collective::AllGather => Some(
            (0..n)
                .flat_map(|q| check::input(dtype, None, q, n, elems))
                .collect(),
        ),
        Collective::ReduceScatter => {
            let all = check::reduced(dtype, op, n, elems * n);
            Some(all[own as usize..(own + block) as usize].to_vec())
        }
        Collective::AllToAll => Some(
            (0..n)
                .flat_map(|q| {
                    let theirs = check::input(dtype, None, q, n, elems * n);
                    theirs[own as usize..(own + block) as usize].to_vec()
                })
                .collect(),
        ),
        Collective::Barrier | Collective::SendRecv => None,
    };
    let back = match buffers.read(stream)? {
        Ok(back) => back,
        Err(guards) => {
            wrong.push(format!("{step}: {}: {guards}", whose()));
            return Ok(wrong);
        }
    };
    let got = match kind {
        Collective::ReduceScatter if in_place => &back[0][own as usize..(own + block) as usize],
        _ => &back[target][..],
    };
    if let Some(want) = want {
        let w = check::wrong_elements(dtype, got, &want);
        if w > 0 {
            wrong.push(format!(
                "{step}: {} has {w} wrong element(s) of {}",
                whose(),
                want.len() / size
            ));
        }
    }
    // An out-of-place send buffer keeps its data.
    if !in_place {
        let w = check::wrong_elements(dtype, &back[0], &input);
        if w > 0 {
            wrong.push(format!(
                "{step}: {} has {w} changed element(s) in its send buffer",
                whose()
            ));
        }
    }
    Ok(wrong)
}

// ---------------------------------------------------------------------------------
// Point to point
// ---------------------------------------------------------------------------------

/// Bytes of each message between a pair of ranks.
const MESSAGES: [usize; 3] = [1, 7, 4 * 4096 + 3];

fn message(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    crate::cases::util::pattern(((from * 31 + to) * 7 + k) as u64 + 9000, len)
}

fn send_recv(devices: &[Device], topology: &Topology) -> CaseOutcome {
    let comm = communicator(devices, topology, "", SWEEP_TIMEOUT)?;
    let per_rank = on_ranks(&comm, |rank, stream| {
        let (me, n) = (rank.rank(), rank.size());
        let device = rank.device();
        // Every rank sends everything first: buffered sends cannot deadlock.
        let mut keep = Vec::new();
        for peer in (0..n).filter(|&p| p != me) {
            for (k, &len) in MESSAGES.iter().enumerate() {
                let data = Guarded::new(device, stream, &[&message(me, peer, k, len)])?;
                rank.send(data.all(0), peer, stream).map_err(|e| {
                    CaseError::from(e).context(format!("send of {len} bytes to rank {peer}"))
                })?;
                keep.push(data);
            }
        }
        let mut wrong = Vec::new();
        for peer in (0..n).filter(|&p| p != me) {
            for (k, &len) in MESSAGES.iter().enumerate() {
                let what = format!(
                    "sendrecv of {len} bytes from rank {peer} ({}) to rank {me} ({}), message {k}",
                    devices[peer].id(),
                    device.id()
                );
                let into = Guarded::new(device, stream, &[&vec![FILLER_BYTE; len]])?;
                rank.recv(into.all(0), peer, stream)
                    .map_err(|e| CaseError::from(e).context(&what))?;
                match into.read(stream)? {
                    Ok(got) => {
                        let w =
                            check::wrong_elements(DType::U8, &got[0], &message(peer, me, k, len));
                        if w > 0 {
                            wrong.push(format!("{what}: {w} wrong byte(s) of {len}"));
                        }
                    }
                    Err(guards) => wrong.push(format!("{what}: {guards}")),
                }
            }
        }
        // The sent buffers may be reused once the sends are enqueued; they were not
        // changed by the transfers.
        for (i, data) in keep.iter().enumerate() {
            let (peer_index, k) = (i / MESSAGES.len(), i % MESSAGES.len());
            let peer = (0..n).filter(|&p| p != me).nth(peer_index).unwrap_or(me);
            if let Ok(bytes) = data.read(stream)? {
                if bytes[0] != message(me, peer, k, MESSAGES[k]) {
                    wrong.push(format!(
                        "the send buffer of message {k} from rank {me} to rank {peer} changed"
                    ));
                }
            }
        }
        Ok(wrong)
    })?;
    let wrong: Vec<String> = per_rank.into_iter().flatten().collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        let total = wrong.len();
        Err(CaseError::fail(format!(
            "{total} wrong result(s): {}",
            wrong
                .into_iter()
                .take(REPORTED)
                .collect::<Vec<_>>()
                .join("; ")
        )))
    }
}

// ---------------------------------------------------------------------------------
// Barriers
// ---------------------------------------------------------------------------------

fn barrier(devices: &[Device], topology: &Topology) -> CaseOutcome {
    let comm = communicator(devices, topology, "", SWEEP_TIMEOUT)?;
    // Rank 0's stream is held before the barrier: then an event recorded behind the
    // barrier on every other rank must not complete before rank 0 is released.
    let after: Mutex<Vec<(usize, xpu_hal::Event)>> = Mutex::new(Vec::new());
    on_ranks(&comm, |rank, stream| {
        let me = rank.rank();
        // Plain barriers first.
        for _ in 0..3 {
            rank.barrier(stream)?;
        }
        stream.synchronize()?;
        let hold = if me == 0 { Some(hold(stream)?) } else { None };
        rank.barrier(stream)?;
        if me != 0 {
            let event = stream.record_event()?;
            after
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((me, event));
        }
        // A second barrier only to meet: every rank has recorded its event before rank
        // 0 looks at them (it enqueues nothing that rank 0's held stream could reach).
        rank.barrier(stream)?;
        if let Some(hold) = hold {
            let how = hold.how();
            for (r, event) in after.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if event.query()? {
                    return Err(CaseError::fail(format!(
                        "work rank {r} ({}) enqueued after a barrier completed while rank 0 ({}) was held before it ({how})",
                        devices[*r].id(),
                        devices[0].id()
                    )));
                }
            }
            hold.open();
        }
        stream.synchronize()?;
        if me != 0 {
            for (r, event) in after.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if *r == me && !event.query()? {
                    return Err(CaseError::fail(format!(
                        "an event rank {me} recorded after the barrier is not complete after synchronize"
                    )));
                }
            }
        }
        Ok(())
    })?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------

/// The ranks of the failure cases: two on the device, and one on the first peer when
/// the run has one.
fn failure_set(ctx: &CaseContext) -> Vec<Device> {
    let mut set = vec![ctx.device.clone(), ctx.device.clone()];
    if let Some(p) = ctx.peers.first() {
        set.push(p.clone());
    }
    set
}

/// An f32 all-reduce of `elems` elements in place on `rank`.
fn small_all_reduce(rank: &Rank, stream: &Stream, elems: u64) -> xpu_hal::Result<()> {
    let a = rank.device().allocate(elems * 4)?;
    rank.all_reduce(&a, &a, DType::F32, ReduceOp::Sum, stream)
}

fn timeout_names_missing_rank(ctx: &CaseContext) -> CaseOutcome {
    let devices = failure_set(ctx);
    let topology = Topology::discover(&devices)?;
    let comm = communicator(&devices, &topology, "", SHORT_TIMEOUT)?;
    let missing = devices.len() - 1;
    let missing_name = format!("rank {missing} ({})", devices[missing].id());
    let start = Instant::now();
    let errors: Vec<(usize, xpu_hal::Result<()>)> = std::thread::scope(|s| {
        let handles: Vec<_> = comm
            .ranks()
            .into_iter()
            .take(missing)
            .map(|rank| {
                s.spawn(move || {
                    let result = rank
                        .device()
                        .create_stream()
                        .and_then(|stream| small_all_reduce(&rank, &stream, 16));
                    (rank.rank(), result)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .unwrap_or_else(|_| (r, Err(Error::invalid("the rank's thread panicked"))))
            })
            .collect()
    });
    let waited = start.elapsed();
    for (r, result) in errors {
        match result {
            Err(e @ Error::Timeout { .. }) => {
                let text = e.to_string();
                if !text.contains(&missing_name) || !text.contains("allreduce") {
                    return Err(CaseError::fail(format!(
                        "rank {r} timed out, but the message does not name {missing_name} and the all-reduce: {text}"
                    )));
                }
            }
            Err(e) => {
                return Err(CaseError::fail(format!(
                    "rank {r} waited for {missing_name}, which never called; expected a timeout error, got a {} error: {e}",
                    e.kind()
                )))
            }
            Ok(()) => {
                return Err(CaseError::fail(format!(
                    "rank {r}'s all-reduce succeeded although {missing_name} never called it"
                )))
            }
        }
    }
    let bound = SHORT_TIMEOUT + Duration::from_secs(5);
    if waited > bound {
        return Err(CaseError::fail(format!(
            "with a timeout of {:?}, the waiting ranks returned only after {:.1} s",
            SHORT_TIMEOUT,
            waited.as_secs_f64()
        )));
    }
    // The communicator is failed: the late rank is told at once.
    let late = comm.rank(missing)?;
    let stream = late.device().create_stream()?;
    match small_all_reduce(&late, &stream, 16) {
        Err(Error::Timeout { .. }) => {}
        Err(e) => {
            return Err(CaseError::fail(format!(
                "after the timeout, the late rank expected the timeout error again, got a {} error: {e}",
                e.kind()
            )))
        }
        Ok(()) => {
            return Err(CaseError::fail(
                "after the timeout, the late rank's all-reduce succeeded on a failed communicator",
            ))
        }
    }
    if comm.failed().is_none() {
        return Err(CaseError::fail(
            "after a timeout the communicator does not report itself failed",
        ));
    }
    Ok(())
}

fn desync_on_every_rank(ctx: &CaseContext) -> CaseOutcome {
    let devices = failure_set(ctx);
    let topology = Topology::discover(&devices)?;
    let comm = communicator(&devices, &topology, "", SWEEP_TIMEOUT)?;
    let results = on_ranks(&comm, |rank, stream| {
        // Rank 0 asks for 16 elements, the others for 32.
        let elems = if rank.rank() == 0 { 16 } else { 32 };
        Ok(small_all_reduce(rank, stream, elems))
    })?;
    for (r, result) in results.into_iter().enumerate() {
        let text = match result {
            Ok(()) => {
                return Err(CaseError::fail(format!(
                    "rank {r}'s all-reduce succeeded although the ranks asked for different sizes"
                )))
            }
            Err(e) => e.to_string(),
        };
        if !(text.contains("desync") && text.contains("16 × f32") && text.contains("32 × f32")) {
            return Err(CaseError::fail(format!(
                "rank {r} was not told of the desync with both calls (16 × f32 and 32 × f32): {text}"
            )));
        }
    }
    // Nothing was enqueued, so the communicator still works.
    let wrong = on_ranks(&comm, |rank, stream| {
        let step = Step {
            kind: Collective::AllReduce,
            algorithm: Algorithm::Direct,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            elems: 7,
            in_place: false,
            root: 0,
        };
        run_step(rank, stream, &step)
    })
    .map_err(|e| e.context("the all-reduce after the desync"))?;
    let wrong: Vec<String> = wrong.into_iter().flatten().collect();
    if !wrong.is_empty() {
        return Err(CaseError::fail(format!(
            "after the desync: {}",
            wrong.join("; ")
        )));
    }
    Ok(())
}

fn abort_releases_waiting_rank(ctx: &CaseContext) -> CaseOutcome {
    let devices = failure_set(ctx);
    let topology = Topology::discover(&devices)?;
    // Far longer than the case may run: only the abort can release the rank.
    let comm = communicator(&devices, &topology, "", Duration::from_secs(600))?;
    let rank = comm.rank(0)?;
    let stream = rank.device().create_stream()?;
    let result = std::thread::scope(|s| {
        let waiting = s.spawn(|| small_all_reduce(&rank, &stream, 16));
        // Whether the rank is already waiting or arrives after the abort, it must get
        // the abort; the pause only makes the first the usual case.
        std::thread::sleep(Duration::from_millis(50));
        comm.abort();
        waiting
            .join()
            .unwrap_or_else(|_| Err(Error::invalid("the rank's thread panicked")))
    });
    match result {
        Err(Error::Aborted { .. }) => {}
        Err(e) => {
            return Err(CaseError::fail(format!(
                "the aborted rank expected an aborted error, got a {} error: {e}",
                e.kind()
            )))
        }
        Ok(()) => {
            return Err(CaseError::fail(
                "an all-reduce missing its other ranks succeeded after abort",
            ))
        }
    }
    if !matches!(comm.failed(), Some(Error::Aborted { .. })) {
        return Err(CaseError::fail(
            "after abort, the communicator does not report itself aborted",
        ));
    }
    let other = comm.rank(1)?;
    let stream = other.device().create_stream()?;
    match small_all_reduce(&other, &stream, 16) {
        Err(Error::Aborted { .. }) => Ok(()),
        Err(e) => Err(CaseError::fail(format!(
            "a call after abort expected an aborted error, got a {} error: {e}",
            e.kind()
        ))),
        Ok(()) => Err(CaseError::fail(
            "an all-reduce on an aborted communicator succeeded",
        )),
    }
}
