//! Communicators: groups of ranks, each a device of any backend, and the collective
//! operations between them.
//!
//! A [`Communicator`] is made from a device list; rank `r` is device `r`. Each rank is
//! driven through its [`Rank`] handle, typically from its own thread, exactly as a
//! process per GPU drives NCCL: every rank calls the same operations in the same order
//! with its own buffers and stream.
//!
//! ## Rendezvous and execution (`rendezvous.rs`)
//!
//! Calls are matched by sequence number. Each rank's call checks its arguments and
//! arrives; the last rank to arrive checks that all ranks asked for the same operation
//! (a mismatch is a *desync*, reported on every rank with what each asked for), chooses
//! the algorithm, and enqueues the whole operation on every rank's stream; then every
//! call returns. The data movement itself runs asynchronously on those streams, ordered
//! after the work each rank enqueued before the call and before what it enqueues after,
//! so communication overlaps computation on other streams. A call blocks only until all
//! ranks have arrived.
//!
//! ## Failures (`failure.rs`)
//!
//! A rank that does not arrive within the timeout ([`CommOptions::timeout`]) makes every
//! waiting rank return [`xpu_hal::Error::Timeout`] naming the missing ranks, the
//! operation and its sequence number. A timeout, a desync detected after enqueueing began,
//! or [`Communicator::abort`] leaves the communicator failed: every later call returns the
//! same error at once, and the application makes a new communicator. `abort` never waits
//! for a rank or a device, so it returns even when a rank is stuck.
//!
//! ## Point to point
//!
//! [`Rank::send`] copies its buffer into communicator memory on the sender's stream and
//! returns without waiting for the receiver (a buffered send, so that exchanges between
//! two ranks cannot deadlock); [`Rank::recv`] waits for the matching send — the oldest
//! unmatched one from that peer — and enqueues the transfer.

mod across_topology;
pub mod algorithms;
mod args;
mod failure;
mod grouped;
mod native_across;
pub mod op;
mod rank;
mod rendezvous;
pub mod select;
mod shared_memory;
mod small;
mod span;
mod span_native;
mod staging;
mod transport;
mod wait;

use crossbeam_utils::CachePadded;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xpu_hal::{Allocation, BufferSlice, DType, Device, Error, Result, Stream};

use crate::topology::Topology;
use algorithms::{Algorithm, RankBuffers, Run};
use op::{Collective, OpDesc, ReduceOp};
use select::{CostModel, Selector};
use shared_memory::{HostBuffers, HostRange, Work};
use small::Slots;
use staging::Staged;
use transport::{RankIo, Slice, Transport};
use wait::Spinner;

pub use rank::Rank;
pub(crate) use shared_memory::reduce_into as reduce_bytes;

/// How long a rank waiting for the others spins before it sleeps.
const SPIN: Duration = Duration::from_micros(100);

/// How a communicator behaves.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// How long a rank waits for the others to arrive at an operation before the
    /// operation fails with a timeout on every waiting rank.
    pub timeout: Duration,
    /// Algorithm overrides (by default from `XPU_COLL_ALGO`).
    pub selector: Selector,
}

/// The longest timeout `XPU_COLL_TIMEOUT` may set: deadlines are computed from it, and
/// a wait of longer is a wait forever in all but name.
const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

impl CommOptions {
    /// Refuses a timeout of zero or of more than 30 days, with the reason.
    pub fn validate(&self) -> Result<()> {
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Error::invalid(format!(
                "a communicator timeout of {:?}: give more than zero and at most {} s (30 days)",
                self.timeout,
                MAX_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }

    /// The defaults: `XPU_COLL_TIMEOUT` seconds (default 300) and the `XPU_COLL_ALGO`
    /// overrides.
    pub fn from_env() -> Result<Self> {
        let timeout = match std::env::var("XPU_COLL_TIMEOUT") {
            Ok(v) => {
                v.trim()
                    .parse()
                    .ok()
                    .and_then(|s: f64| Duration::try_from_secs_f64(s).ok())
                    .filter(|d| !d.is_zero() && *d <= MAX_TIMEOUT)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "XPU_COLL_TIMEOUT is `{v}`; give the timeout in seconds, a positive number of at most {} (30 days)",
                            MAX_TIMEOUT.as_secs()
                        ))
                    })?
            }
            Err(_) => Duration::from_secs(300),
        };
        Ok(CommOptions {
            timeout,
            selector: Selector::from_env()?,
        })
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(300),
            selector: Selector::default(),
        }
    }
}

/// How a communicator's collectives have run so far ([`Communicator::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Operations the ranks' threads ran in shared memory.
    pub shared_memory: u64,
    /// Operations enqueued on the ranks' streams.
    pub enqueued: u64,
}

/// One rank's arrival at a collective.
struct Arrival {
    desc: std::result::Result<OpDesc, Error>,
    io: RankIo,
    buffers: RankBuffers,
    /// The CPU's view of the buffers, when all of them have one and the rank's stream
    /// was idle on arrival (see `shared_memory/`).
    host: Option<HostBuffers>,
    /// Whether the rank's stream had no work pending on arrival.
    idle: bool,
    /// Where the rank, called in a group, waits for the plan instead of waiting here
    /// (`grouped.rs`).
    deferred: Option<Arc<grouped::Deferred>>,
}

/// How a collective ran, for the rank that called it.
pub(crate) enum Outcome {
    /// Enqueued on the ranks' streams by an algorithm.
    Enqueued,
    /// Done in shared memory by the ranks' threads.
    Shared,
    /// Planned in shared memory, to run on the ranks' streams: the caller enqueues its
    /// share ([`Work::participate_queued`]).
    Queued(Arc<Work>),
    /// Not planned yet (the rank was called in a group): the caller enqueues a share
    /// that waits for the plan.
    Deferred(Arc<grouped::Deferred>),
}

struct Pending {
    seq: u64,
    arrivals: Vec<Option<Arrival>>,
}

/// A buffered send waiting for its receive.
struct Posted {
    data: Slice,
    /// Recorded on the sender's stream behind the copy into `data`.
    ready: xpu_hal::Event,
}

struct State {
    pending: Option<Pending>,
    /// The result of the latest finished collective, for ranks that waited on it.
    finished: Option<(u64, std::result::Result<(), Error>)>,
    /// The latest collective run by the ranks' threads in shared memory, for the ranks
    /// that waited on it to run their shares.
    shared: Option<(u64, Arc<Work>, bool)>,
    /// Set once the communicator can no longer be used.
    failed: Option<Error>,
    /// Unmatched sends per (from, to).
    posted: HashMap<(usize, usize), VecDeque<Posted>>,
}

struct Shared {
    devices: Vec<Device>,
    topology: Topology,
    model: CostModel,
    options: CommOptions,
    state: Mutex<State>,
    arrived: Condvar,
    aborted: AtomicBool,
    /// One past the sequence number of the latest finished (or planned, in shared
    /// memory) collective, for waiters that spin before they sleep.
    finished_seq: AtomicU64,
    /// Ranks asleep on `arrived`, so that waking nobody costs no system call.
    sleepers: AtomicUsize,
    /// How the ranks' threads wait for each other.
    spinner: Spinner,
    /// Per rank: the sequence number of its next operation.
    seqs: Vec<CachePadded<AtomicU64>>,
    /// Per rank: one more than the latest operation it is through with on the slots
    /// (`small.rs`).
    through: Vec<CachePadded<AtomicU64>>,
    /// Set with `State::failed`, readable without the lock.
    failed_flag: AtomicBool,
    /// Whether every device runs host functions (host devices): then small operations
    /// have slots, and shared-memory shares can run on busy streams.
    host_functions: bool,
    /// The slots of small operations, when every device runs host functions.
    slots: Option<Slots>,
    /// The devices' own collective library, when their backend offers one over these
    /// devices (NCCL for CUDA, a plugin's native collectives).
    native: Option<Box<dyn xpu_hal::group::CollectiveGroup>>,
    /// Per rank: the latest operation it refused on the small path's terms, and why.
    refusals: Vec<Mutex<Option<(u64, Error)>>>,
    /// Per rank: whether it may stage its buffers through host memory for shared-memory
    /// execution (`staging.rs`), and its staging buffers between operations.
    may_stage: Vec<bool>,
    staging: Vec<Mutex<Vec<xpu_hal::HostBuffer>>>,
    /// Operations run in shared memory, and enqueued. Each per-rank or counted value
    /// that a rank writes on every operation has a cache line of its own, so that the
    /// ranks' cores do not pass lines back and forth.
    ran_shared: CachePadded<AtomicU64>,
    ran_enqueued: CachePadded<AtomicU64>,
    transport: Mutex<Transport>,
    /// The communicator's own stream per rank, created on first use.
    aux: Mutex<Vec<Option<Stream>>>,
}

/// A group of ranks over devices of any backends. Cheap to clone; see the module docs.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
    /// The communicator's processes, when it spans more than this one.
    span: Option<Arc<span::Span>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self
            .shared
            .devices
            .iter()
            .map(|d| d.id().to_string())
            .collect();
        f.debug_struct("Communicator").field("ranks", &ids).finish()
    }
}

impl Communicator {
    /// A communicator whose rank `r` is `devices[r]`, with the machine's topology read
    /// by hwloc and refined by cached calibration figures where there are some
    /// ([`Topology::discover_calibrated`]). The same device may appear twice (two ranks on
    /// one device).
    pub fn new(devices: Vec<Device>, options: CommOptions) -> Result<Self> {
        let topology = Topology::discover_calibrated(&devices)?;
        Self::with_topology(devices, topology, options)
    }

    /// A communicator over `devices` with a topology already made (from a file, or
    /// calibrated), whose devices are `devices` in order.
    pub fn with_topology(
        devices: Vec<Device>,
        topology: Topology,
        options: CommOptions,
    ) -> Result<Self> {
        options.validate()?;
        if devices.is_empty() {
            return Err(Error::invalid(
                "a communicator needs at least one device; give the ranks' devices",
            ));
        }
        if topology.len() != devices.len()
            || devices
                .iter()
                .zip(&topology.devices)
                .any(|(d, t)| d.id().to_string() != t.id)
        {
            return Err(Error::invalid(
                "the topology was made from other devices than the communicator's; make it from the same list",
            ));
        }
        let n = devices.len();
        // A rank may stage through host memory when its device is not host addressable
        // and every path between it and the others crosses host memory anyway.
        let may_stage: Vec<bool> = (0..n)
            .map(|r| {
                !devices[r].capabilities().host_addressable
                    && (0..n).filter(|&q| q != r).all(|q| {
                        [(r, q), (q, r)].iter().all(|&(a, b)| {
                            topology
                                .link(a, b)
                                .is_ok_and(|l| l.class == crate::topology::LinkClass::HostStaged)
                        })
                    })
            })
            .collect();
        let mut model = CostModel::from_topology(&topology);
        // Shared memory runs when every rank is host addressable or may stage; it moves
        // data as fast as the slowest of the devices' own copies and the staged ranks'
        // links.
        let addressable = |r: usize| devices[r].capabilities().host_addressable;
        if (0..n).all(|r| addressable(r) || may_stage[r]) {
            let local = (0..n).filter_map(|r| topology.link(r, r).ok());
            let staged = (0..n)
                .filter(|&r| may_stage[r])
                .flat_map(|r| (0..n).filter(move |&q| q != r).map(move |q| (r, q)))
                .flat_map(|(r, q)| [topology.link(r, q).ok(), topology.link(q, r).ok()])
                .flatten();
            model.shared_memory_beta = Some(
                local
                    .chain(staged)
                    .map(|l| select::beta(l.bandwidth_gbps))
                    .fold(0.0, f64::max),
            );
        }
        // Communicators whose devices' backend offers a vendor library (all-CUDA ones:
        // NCCL, where it is installed; a plugin's native collectives) may delegate to it,
        // as the cost model decides.
        let native = if n > 1 {
            let config = xpu_hal::group::GroupConfig {
                timeout: options.timeout,
            };
            match xpu_hal::group::collective_group(&devices, config) {
                Some(Ok(g)) => Some(g),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "the devices' own collective library is not used; the xpu algorithms run");
                    None
                }
                None => None,
            }
        } else {
            None
        };
        model.native = native
            .as_ref()
            .map(|g| select::NativeFigures::of(g.as_ref()));
        // Small operations go through slots where every rank runs host functions.
        let host_functions = devices.iter().all(|d| {
            d.capabilities()
                .supports_kernel_format(xpu_hal::KernelFormat::HostFunction)
        });
        let slots = (n > 1 && host_functions).then(|| Slots::new(n));
        Ok(Communicator {
            shared: Arc::new(Shared {
                transport: Mutex::new(Transport::new(&devices)),
                devices,
                topology,
                model,
                options,
                state: Mutex::new(State {
                    pending: None,
                    finished: None,
                    shared: None,
                    failed: None,
                    posted: HashMap::new(),
                }),
                arrived: Condvar::new(),
                aborted: AtomicBool::new(false),
                finished_seq: AtomicU64::new(0),
                sleepers: AtomicUsize::new(0),
                spinner: Spinner::new(n),
                seqs: (0..n)
                    .map(|_| CachePadded::new(AtomicU64::new(0)))
                    .collect(),
                through: (0..n)
                    .map(|_| CachePadded::new(AtomicU64::new(0)))
                    .collect(),
                failed_flag: AtomicBool::new(false),
                host_functions,
                slots,
                native,
                refusals: (0..n).map(|_| Mutex::new(None)).collect(),
                may_stage,
                staging: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
                ran_shared: CachePadded::new(AtomicU64::new(0)),
                ran_enqueued: CachePadded::new(AtomicU64::new(0)),
                aux: Mutex::new(vec![None; n]),
            }),
            span: None,
        })
    }

    /// The number of ranks, in every process for a communicator across processes.
    pub fn size(&self) -> usize {
        match &self.span {
            Some(span) => span.size,
            None => self.shared.devices.len(),
        }
    }

    /// This process's ranks' devices, by rank: every rank's, unless the communicator
    /// spans processes.
    pub fn devices(&self) -> &[Device] {
        &self.shared.devices
    }

    /// The communicator rank of this process's first device: 0 unless the communicator
    /// spans processes. This process's ranks are that one and those after it.
    pub fn first_rank(&self) -> usize {
        self.span.as_ref().map_or(0, |s| s.procs[s.me].first_rank)
    }

    /// The processes a communicator across processes spans, in process order; empty for
    /// a communicator within one process.
    pub fn processes(&self) -> &[crate::process::ProcessInfo] {
        self.span.as_ref().map_or(&[], |s| &s.procs)
    }

    /// Whether the processes of a communicator across processes share memory (they all
    /// run on one machine and mapped one segment): their all-reduces then run there,
    /// and every operation's header is checked there first. False within one process.
    pub fn shares_memory_between_processes(&self) -> bool {
        self.span.as_ref().is_some_and(|s| s.shm.is_some())
    }

    /// The topology the algorithms are chosen from.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// The handle of rank `rank`, which must be one of this process's.
    pub fn rank(&self, rank: usize) -> Result<Rank> {
        if rank >= self.size() {
            return Err(Error::invalid(format!(
                "rank {rank} does not exist; the communicator has {} ranks (0 to {})",
                self.size(),
                self.size() - 1
            )));
        }
        let first = self.first_rank();
        let local = self.shared.devices.len();
        if !(first..first + local).contains(&rank) {
            return Err(Error::invalid(format!(
                "rank {rank} belongs to another process; this process holds ranks {first} to {}",
                first + local - 1
            )));
        }
        Ok(Rank {
            shared: self.shared.clone(),
            rank: rank - first,
            span: self.span.clone(),
        })
    }

    /// This process's ranks' handles, in rank order: every rank's, unless the
    /// communicator spans processes.
    pub fn ranks(&self) -> Vec<Rank> {
        (0..self.shared.devices.len())
            .map(|rank| Rank {
                shared: self.shared.clone(),
                rank,
                span: self.span.clone(),
            })
            .collect()
    }

    /// Whether the communicator can run `algorithm` at all: shared memory needs every
    /// rank host addressable (or staging through host memory), the native library a
    /// backend that offers one over these devices; the others always can (for the
    /// operations they implement).
    pub fn offers(&self, algorithm: Algorithm) -> bool {
        match algorithm {
            Algorithm::SharedMemory => self.shared.model.shared_memory_beta.is_some(),
            Algorithm::Native => self.shared.native.is_some(),
            _ => true,
        }
    }

    /// The algorithm an operation of `bytes` per rank would use, and why.
    pub fn algorithm_for(&self, kind: Collective, bytes: u64) -> (Algorithm, String) {
        self.shared
            .options
            .selector
            .choose(&self.shared.model, kind, bytes)
    }

    /// The cost model's estimate of an operation of `bytes` per rank with `algorithm`,
    /// µs; `None` when the algorithm does not implement the operation or cannot run here.
    pub fn estimate(&self, kind: Collective, algorithm: Algorithm, bytes: u64) -> Option<f64> {
        self.shared.model.estimate(kind, algorithm, bytes)
    }

    /// The algorithm an operation of `bytes` per rank would use when shared-memory
    /// execution cannot run (a busy stream, a buffer without a host view), and why.
    pub fn enqueued_algorithm_for(&self, kind: Collective, bytes: u64) -> (Algorithm, String) {
        self.shared
            .options
            .selector
            .choose_where(&self.shared.model, kind, bytes, |a| {
                a != Algorithm::SharedMemory
            })
    }

    /// The devices' own collective library the communicator may use (its name and
    /// version), if their backend offers one.
    /// For a communicator across processes, the library spanning them where there is
    /// one, else that of this process's devices.
    pub fn native_library(&self) -> Option<String> {
        self.span
            .as_ref()
            .and_then(|s| s.native.as_ref())
            .map(|n| n.library())
            .or_else(|| self.shared.native.as_ref().map(|g| g.library()))
    }

    /// Fails the communicator: every rank waiting in an operation returns
    /// [`Error::Aborted`] at once, and so does every later call. Work already enqueued on
    /// the streams is not cancelled, except the native library's parts, which fail
    /// where they wait for other ranks. Returns without waiting for any rank or device.
    pub fn abort(&self) {
        if let Some(native) = &self.shared.native {
            native.abort();
        }
        if let Some(span) = &self.span {
            if let Some(native) = &span.native {
                native.abort();
            }
            span.aborted.store(true, Ordering::Release);
            span.give_up(crate::process::GiveUp::Aborted);
        }
        self.shared.aborted.store(true, Ordering::Release);
        self.shared.failed_flag.store(true, Ordering::Release);
        if let Ok(mut st) = self.shared.state.try_lock() {
            st.failed
                .get_or_insert_with(|| Error::aborted("the communicator was aborted"));
        }
        self.shared.arrived.notify_all();
    }

    /// How many operations ran in shared memory and how many were enqueued.
    pub fn stats(&self) -> CommStats {
        CommStats {
            shared_memory: self.shared.ran_shared.load(Ordering::Relaxed),
            enqueued: self.shared.ran_enqueued.load(Ordering::Relaxed),
        }
    }

    /// Whether the communicator has failed (timeout, desync or abort).
    pub fn failed(&self) -> Option<Error> {
        if self.shared.aborted.load(Ordering::Acquire) {
            return Some(Error::aborted("the communicator was aborted"));
        }
        self.shared.lock().failed.clone()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_failed(&self, st: &State) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(st
                .failed
                .clone()
                .unwrap_or_else(|| Error::aborted("the communicator was aborted")));
        }
        match &st.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn aux_stream(&self, rank: usize) -> Result<Stream> {
        let mut aux = self.aux.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &aux[rank] {
            return Ok(s.clone());
        }
        let s = self.devices[rank].create_stream()?;
        aux[rank] = Some(s.clone());
        Ok(s)
    }

    fn rank_name(&self, r: usize) -> String {
        format!("rank {r} ({})", self.devices[r].id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_of_zero_or_past_30_days_is_refused() {
        let mut o = CommOptions::default();
        assert!(o.validate().is_ok());
        for t in [
            Duration::ZERO,
            Duration::MAX,
            MAX_TIMEOUT + Duration::from_nanos(1),
        ] {
            o.timeout = t;
            assert!(
                matches!(o.validate(), Err(Error::InvalidArgument { .. })),
                "{t:?}"
            );
        }
        o.timeout = MAX_TIMEOUT;
        assert!(o.validate().is_ok());
    }
}
