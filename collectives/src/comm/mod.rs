//! Communicators: groups of ranks, each a device of any backend, and the collective
//! operations between them.
//!
//! A [`Communicator`] is made from a device list; rank `r` is device `r`. Each rank is
//! driven through its [`Rank`] handle, typically from its own thread, exactly as a
//! process per GPU drives NCCL: every rank calls the same operations in the same order
//! with its own buffers and stream.
//!
//! ## Rendezvous and execution
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
//! ## Failures
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

pub mod algorithms;
mod args;
pub mod op;
mod rank;
pub mod select;
mod shared_memory;
mod small;
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

impl CommOptions {
    /// The defaults: `XPU_COLL_TIMEOUT` seconds (default 300) and the `XPU_COLL_ALGO`
    /// overrides.
    pub fn from_env() -> Result<Self> {
        let timeout = match std::env::var("XPU_COLL_TIMEOUT") {
            Ok(v) => {
                let secs: f64 = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                        "XPU_COLL_TIMEOUT is `{v}`; give the timeout in seconds, a positive number"
                    ))
                    })?;
                Duration::from_secs_f64(secs)
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
    /// NCCL communicators, when every rank is a distinct CUDA device and NCCL loads.
    nccl: Option<xpu_cuda::nccl::NcclGroup>,
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
        // All-CUDA communicators delegate to NCCL where it is installed.
        let nccl = if n > 1 && devices.iter().all(|d| d.backend() == "cuda") {
            match xpu_cuda::nccl::NcclGroup::new(&devices) {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::debug!(error = %e, "NCCL is not used; the xpu algorithms run");
                    None
                }
            }
        } else {
            None
        };
        model.nccl = nccl.is_some();
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
                nccl,
                refusals: (0..n).map(|_| Mutex::new(None)).collect(),
                may_stage,
                staging: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
                ran_shared: CachePadded::new(AtomicU64::new(0)),
                ran_enqueued: CachePadded::new(AtomicU64::new(0)),
                aux: Mutex::new(vec![None; n]),
            }),
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.devices.len()
    }

    /// The ranks' devices, by rank.
    pub fn devices(&self) -> &[Device] {
        &self.shared.devices
    }

    /// The topology the algorithms are chosen from.
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// The handle of rank `rank`.
    pub fn rank(&self, rank: usize) -> Result<Rank> {
        if rank >= self.size() {
            return Err(Error::invalid(format!(
                "rank {rank} does not exist; the communicator has {} ranks (0 to {})",
                self.size(),
                self.size() - 1
            )));
        }
        Ok(Rank {
            shared: self.shared.clone(),
            rank,
        })
    }

    /// Every rank's handle, in rank order.
    pub fn ranks(&self) -> Vec<Rank> {
        (0..self.size())
            .map(|rank| Rank {
                shared: self.shared.clone(),
                rank,
            })
            .collect()
    }

    /// Whether the communicator can run `algorithm` at all: shared memory needs every
    /// rank host addressable (or staging through host memory), NCCL an all-CUDA
    /// communicator with libnccl; the others always can (for the operations they
    /// implement).
    pub fn offers(&self, algorithm: Algorithm) -> bool {
        match algorithm {
            Algorithm::SharedMemory => self.shared.model.shared_memory_beta.is_some(),
            Algorithm::Nccl => self.shared.nccl.is_some(),
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

    /// Fails the communicator: every rank waiting in an operation returns
    /// [`Error::Aborted`] at once, and so does every later call. Work already enqueued on
    /// the streams is not cancelled. Returns without waiting for any rank or device.
    pub fn abort(&self) {
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

    /// Arrives at the next collective; returns when it has been enqueued on every rank,
    /// or run in shared memory (then `true`).
    fn collective(&self, rank: usize, seq: u64, arrival: Arrival) -> Result<Outcome> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        let n = self.devices.len();
        let pending = st.pending.get_or_insert_with(|| Pending {
            seq,
            arrivals: (0..n).map(|_| None).collect(),
        });
        if pending.seq != seq {
            return Err(Error::backend_message(
                "collectives",
                format!(
                    "internal error: rank {rank} arrived at operation #{seq} while #{} is pending",
                    pending.seq
                ),
            ));
        }
        pending.arrivals[rank] = Some(arrival);
        if pending.arrivals.iter().all(Option::is_some) {
            let Some(pending) = st.pending.take() else {
                return Err(Error::backend_message(
                    "collectives",
                    "internal error: no pending operation",
                ));
            };
            // Planned under the lock, so that a waiting rank finds either the operation
            // still pending or its share.
            if let Some((work, queued)) = self.plan_shared(seq, &pending) {
                let work = Arc::new(work);
                self.ran_shared.fetch_add(1, Ordering::Relaxed);
                st.shared = Some((seq, work.clone(), queued));
                drop(st);
                // After unlocking: a spinning rank that sees this takes the lock at once.
                self.finished_seq.store(seq + 1, Ordering::Release);
                self.wake();
                return self.take_part(rank, work, queued);
            }
            drop(st);
            let result = self.run(seq, pending);
            if result.is_ok() {
                self.ran_enqueued.fetch_add(1, Ordering::Relaxed);
            }
            let mut st = self.lock();
            if let Err(e) = &result {
                if matches!(e, Error::Aborted { .. }) || st.failed.is_some() {
                    // Already failed (or aborted while enqueueing): keep the first error.
                } else if !matches!(e, Error::InvalidArgument { .. }) {
                    self.set_failed(&mut st, e.clone());
                }
            }
            st.finished = Some((seq, result.clone()));
            self.finished_seq.store(seq + 1, Ordering::Release);
            drop(st);
            self.wake();
            return result.map(|()| Outcome::Enqueued);
        }
        let deadline = Instant::now() + self.options.timeout;
        // Spin briefly before sleeping (see `wait.rs`).
        drop(st);
        self.spinner.spin(SPIN, || {
            self.finished_seq.load(Ordering::Acquire) > seq || self.aborted.load(Ordering::Acquire)
        });
        let mut st = self.lock();
        loop {
            if let Some((done, result)) = &st.finished {
                if *done == seq {
                    return result.clone().map(|()| Outcome::Enqueued);
                }
            }
            // Before failures: the other ranks wait for this rank's share.
            if let Some((planned, work, queued)) = &st.shared {
                if *planned == seq {
                    let (work, queued) = (work.clone(), *queued);
                    drop(st);
                    return self.take_part(rank, work, queued);
                }
            }
            self.check_failed(&st)?;
            let now = Instant::now();
            if now >= deadline {
                let error = self.timeout_error(&st, seq);
                self.set_failed(&mut st, error.clone());
                drop(st);
                self.arrived.notify_all();
                return Err(error);
            }
            self.sleepers.fetch_add(1, Ordering::AcqRel);
            st = self
                .arrived
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            self.sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Wakes the ranks asleep on `arrived`, if any. Call after changing the state under
    /// its lock: a rank that went to sleep before that change is counted by then.
    fn wake(&self) {
        if self.sleepers.load(Ordering::Acquire) > 0 {
            self.arrived.notify_all();
        }
    }

    /// This rank's part of a shared-memory operation: its share now, or (`queued`) the
    /// share for its stream to run.
    fn take_part(&self, rank: usize, work: Arc<Work>, queued: bool) -> Result<Outcome> {
        if queued {
            return Ok(Outcome::Queued(work));
        }
        work.participate(rank, self.spinner)
            .map(|()| Outcome::Shared)
    }

    /// The operation as shares, when it can run that way: every rank brought host views
    /// of its buffers, all asked for the same thing, and no override names another
    /// algorithm. With every stream idle the ranks' threads run the shares now; otherwise,
    /// when every device runs host functions, each stream runs its share when it gets
    /// there (then `true`).
    fn plan_shared(&self, seq: u64, pending: &Pending) -> Option<(Work, bool)> {
        if self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let mut descs = Vec::with_capacity(pending.arrivals.len());
        let mut buffers = Vec::with_capacity(pending.arrivals.len());
        let mut host = Vec::with_capacity(pending.arrivals.len());
        let mut idle = true;
        for a in &pending.arrivals {
            let a = a.as_ref()?;
            descs.push(*a.desc.as_ref().ok()?);
            buffers.push(a.buffers.clone());
            host.push(a.host.clone()?);
            idle &= a.idle;
        }
        let queued = !idle;
        if queued && !self.host_functions {
            return None;
        }
        let first = descs[0];
        if descs.iter().any(|d| *d != first) {
            return None;
        }
        if let Some(forced) = self.options.selector.forced(first.kind, first.bytes) {
            if forced != Algorithm::SharedMemory {
                return None;
            }
        }
        let work = Work::plan(&first, &buffers, &host)?;
        tracing::debug!(
            seq,
            op = %first,
            algorithm = Algorithm::SharedMemory.name(),
            reason = if queued {
                "every buffer is host-addressable; the shares run on the streams"
            } else {
                "every buffer is host-addressable and every stream idle"
            },
            "collective algorithm chosen"
        );
        Some((work, queued))
    }

    fn timeout_error(&self, st: &State, seq: u64) -> Error {
        let Some(pending) = st.pending.as_ref().filter(|p| p.seq == seq) else {
            return Error::Timeout {
                message: format!(
                    "operation #{seq} did not finish within {:?}",
                    self.options.timeout
                ),
            };
        };
        let what = pending
            .arrivals
            .iter()
            .flatten()
            .find_map(|a| a.desc.as_ref().ok())
            .map_or_else(|| "the operation".to_string(), |d| d.to_string());
        let missing: Vec<usize> = pending
            .arrivals
            .iter()
            .enumerate()
            .filter(|(_, a)| a.is_none())
            .map(|(r, _)| r)
            .collect();
        self.timeout_message(&what, seq, &missing)
    }

    /// The timeout of operation `seq` (`what`) that the ranks `missing` never called.
    fn timeout_message(&self, what: &str, seq: u64, missing: &[usize]) -> Error {
        let names: Vec<String> = missing.iter().map(|&r| self.rank_name(r)).collect();
        let waited: Vec<String> = (0..self.devices.len())
            .filter(|r| !missing.contains(r))
            .map(|r| r.to_string())
            .collect();
        Error::Timeout {
            message: format!(
                "{what} #{seq} timed out after {:.1} s: {} never called it (ranks {} waited); the communicator is now failed: abort it and make a new one",
                self.options.timeout.as_secs_f64(),
                names.join(", "),
                waited.join(", ")
            ),
        }
    }

    /// The error of operation `seq` on every rank when `rank` refused it (`why`).
    fn refused(&self, seq: u64, rank: usize, why: Option<&Error>) -> Error {
        Error::invalid(format!(
            "operation #{seq} was refused on every rank because {} passed invalid arguments{}",
            self.rank_name(rank),
            why.map_or_else(String::new, |e| format!(": {e}"))
        ))
    }

    /// Fails the communicator with `error` (keeping an earlier failure).
    fn set_failed(&self, st: &mut State, error: Error) {
        st.failed.get_or_insert(error);
        self.failed_flag.store(true, Ordering::Release);
    }

    /// Fails the communicator with `error` and wakes every waiting rank.
    fn fail(&self, error: Error) {
        let mut st = self.lock();
        self.set_failed(&mut st, error);
        drop(st);
        self.arrived.notify_all();
    }

    /// Whether the communicator was aborted or failed (read without the lock).
    fn stopping(&self) -> bool {
        self.aborted.load(Ordering::Acquire) || self.failed_flag.load(Ordering::Acquire)
    }

    /// Why the communicator can no longer be used.
    fn failure(&self) -> Error {
        let st = self.lock();
        match self.check_failed(&st) {
            Err(e) => e,
            Ok(()) => Error::aborted("the communicator failed"),
        }
    }

    /// Checks that every rank asked for the same, then enqueues the operation.
    fn run(&self, seq: u64, pending: Pending) -> Result<()> {
        let mut ios = Vec::with_capacity(pending.arrivals.len());
        let mut buffers = Vec::with_capacity(pending.arrivals.len());
        let mut descs = Vec::with_capacity(pending.arrivals.len());
        for (r, a) in pending.arrivals.into_iter().enumerate() {
            let Some(a) = a else {
                return Err(Error::backend_message(
                    "collectives",
                    "internal error: a rank is missing",
                ));
            };
            match a.desc {
                Ok(d) => descs.push(d),
                Err(e) => return Err(self.refused(seq, r, Some(&e))),
            }
            ios.push(a.io);
            buffers.push(a.buffers);
        }
        let first = descs[0];
        if let Some((r, d)) = descs.iter().enumerate().find(|(_, d)| **d != first) {
            return Err(Error::invalid(format!(
                "desync at operation #{seq}: {} called {first} but {} called {d}; every rank must call the same operations in the same order",
                self.rank_name(0),
                self.rank_name(r)
            )));
        }
        // Shared memory was not possible (`plan_shared`): the best enqueued algorithm.
        let (algorithm, why) =
            self.options
                .selector
                .choose_where(&self.model, first.kind, first.bytes, |a| {
                    a != Algorithm::SharedMemory
                });
        tracing::debug!(
            seq,
            op = %first,
            algorithm = algorithm.name(),
            reason = %why,
            "collective algorithm chosen"
        );
        let groups = self.topology.groups();
        let mut transport = self.transport.lock().unwrap_or_else(|p| p.into_inner());
        let mut run = Run {
            ranks: &ios,
            buffers: &buffers,
            transport: &mut transport,
            algorithm,
            kind: first.kind,
            bytes: first.bytes,
            dtype: first.dtype,
            op: first.op,
            root: first.root.unwrap_or(0),
            groups: &groups,
            nccl: self.nccl.as_ref(),
        };
        run.execute().map_err(|e| {
            Error::aborted(format!(
                "{first} #{seq} failed while it was being enqueued, so the ranks' streams hold part of it ({e}); the communicator is now failed: synchronize the streams, then make a new one"
            ))
        })
    }
}
