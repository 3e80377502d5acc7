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
pub mod op;
pub mod select;
mod shared_memory;
mod small;
mod staging;
mod transport;
mod wait;

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
    shared: Option<(u64, Arc<Work>)>,
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
    seqs: Vec<AtomicU64>,
    /// Per rank: one more than the latest operation it is through with on the slots
    /// (`small.rs`).
    through: Vec<AtomicU64>,
    /// Set with `State::failed`, readable without the lock.
    failed_flag: AtomicBool,
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
    /// Operations run in shared memory, and enqueued.
    ran_shared: AtomicU64,
    ran_enqueued: AtomicU64,
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
        let slots = (n > 1
            && devices.iter().all(|d| {
                d.capabilities()
                    .supports_kernel_format(xpu_hal::KernelFormat::HostFunction)
            }))
        .then(|| Slots::new(n));
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
                seqs: (0..n).map(|_| AtomicU64::new(0)).collect(),
                through: (0..n).map(|_| AtomicU64::new(0)).collect(),
                failed_flag: AtomicBool::new(false),
                slots,
                nccl,
                refusals: (0..n).map(|_| Mutex::new(None)).collect(),
                may_stage,
                staging: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
                ran_shared: AtomicU64::new(0),
                ran_enqueued: AtomicU64::new(0),
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
    fn collective(&self, rank: usize, seq: u64, arrival: Arrival) -> Result<bool> {
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
            if let Some(work) = self.plan_shared(seq, &pending) {
                let work = Arc::new(work);
                self.ran_shared.fetch_add(1, Ordering::Relaxed);
                st.shared = Some((seq, work.clone()));
                drop(st);
                // After unlocking: a spinning rank that sees this takes the lock at once.
                self.finished_seq.store(seq + 1, Ordering::Release);
                self.wake();
                return work.participate(rank, self.spinner).map(|()| true);
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
            return result.map(|()| false);
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
                    return result.clone().map(|()| false);
                }
            }
            // Before failures: the other ranks wait for this rank's share.
            if let Some((planned, work)) = &st.shared {
                if *planned == seq {
                    let work = work.clone();
                    drop(st);
                    return work.participate(rank, self.spinner).map(|()| true);
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

    /// The operation as shares for the ranks' threads, when it can run that way: every
    /// rank brought host views of idle buffers, all asked for the same thing, and no
    /// override names another algorithm.
    fn plan_shared(&self, seq: u64, pending: &Pending) -> Option<Work> {
        if self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let mut descs = Vec::with_capacity(pending.arrivals.len());
        let mut buffers = Vec::with_capacity(pending.arrivals.len());
        let mut host = Vec::with_capacity(pending.arrivals.len());
        for a in &pending.arrivals {
            let a = a.as_ref()?;
            descs.push(*a.desc.as_ref().ok()?);
            buffers.push(a.buffers.clone());
            host.push(a.host.clone()?);
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
            reason = "every buffer is host-addressable and every stream idle",
            "collective algorithm chosen"
        );
        Some(work)
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

/// One rank of a communicator: the handle its driving thread calls operations on.
#[derive(Clone)]
pub struct Rank {
    shared: Arc<Shared>,
    rank: usize,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank")
            .field("rank", &self.rank)
            .field("device", &self.device().id().to_string())
            .finish()
    }
}

/// Checks that a slice is usable by this rank: on its device, not freed.
fn check_slice(device: &Device, b: &BufferSlice<'_>, what: &str) -> Result<Slice> {
    if b.allocation.device() != device.id() {
        return Err(Error::invalid(format!(
            "the {what} is on {}, but this rank's device is {}; pass memory of the rank's own device",
            b.allocation.device(),
            device.id()
        )));
    }
    if b.allocation.is_freed() {
        return Err(Error::invalid(format!(
            "the {what} was freed; keep it alive until the operation is enqueued"
        )));
    }
    match b.offset.checked_add(b.len) {
        Some(end) if end <= b.allocation.size() => Ok(Slice::from_buffer(b)),
        _ => Err(Error::invalid(format!(
            "the {what} [{}..+{}) is out of bounds of its {}-byte allocation",
            b.offset,
            b.len,
            b.allocation.size()
        ))),
    }
}

fn check_len(len: u64, expected: u64, what: &str) -> Result<()> {
    if len != expected {
        return Err(Error::invalid(format!(
            "the {what} is {len} bytes but must be {expected}"
        )));
    }
    Ok(())
}

fn check_dtype(device: &Device, bytes: u64, dtype: DType, what: &str) -> Result<()> {
    if !bytes.is_multiple_of(dtype.size() as u64) {
        return Err(Error::invalid(format!(
            "the {what} is {bytes} bytes, not a whole number of {} elements ({} bytes each)",
            dtype.name(),
            dtype.size()
        )));
    }
    if !device.capabilities().supports_dtype(dtype) {
        return Err(Error::unsupported(format!(
            "{} cannot reduce {} (not in its builtin dtypes); use a dtype every rank supports",
            device.id(),
            dtype.name()
        )));
    }
    Ok(())
}

/// Send and receive must be identical (in place) or disjoint.
fn check_aliasing(send: &Slice, recv: &Slice) -> Result<()> {
    if send.overlaps(recv) && !send.same_as(recv) {
        return Err(Error::invalid(
            "the send and receive buffers partly overlap; pass the same range (in place) or disjoint ranges",
        ));
    }
    Ok(())
}

impl Rank {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.devices.len()
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.shared.devices[self.rank]
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::invalid(format!(
                "the stream is on {}, but rank {} is {}; enqueue on a stream of the rank's device",
                stream.device().id(),
                self.rank,
                self.device().id()
            )));
        }
        Ok(())
    }

    fn io(&self, stream: &Stream) -> Result<RankIo> {
        self.check_stream(stream)?;
        Ok(RankIo {
            device: self.device().clone(),
            stream: stream.clone(),
        })
    }

    fn arrive(
        &self,
        stream: &Stream,
        build: impl FnOnce() -> Result<(OpDesc, RankBuffers)>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let (desc, buffers) = match build() {
            Ok((d, b)) => (Ok(d), b),
            Err(e) => (
                Err(e),
                RankBuffers {
                    send: None,
                    recv: None,
                },
            ),
        };
        let sh = &self.shared;
        if sh.aborted.load(Ordering::Acquire) || sh.failed_flag.load(Ordering::Acquire) {
            return Err(sh.failure());
        }
        let seq = sh.seqs[self.rank].fetch_add(1, Ordering::Relaxed);
        if let Some(slots) = &sh.slots {
            match &desc {
                Ok(d) if self.small_path(d) => return self.small(slots, seq, *d, &buffers, stream),
                Ok(d) => sh.announce(slots, self.rank, seq, Some(*d))?,
                Err(e) => {
                    // Refused here: go the way the others went, so they learn of it.
                    sh.refuse(slots, self.rank, seq, e)?;
                    sh.await_slots(slots, seq, &"the operation")?;
                    let theirs = (0..self.size()).find_map(|q| slots.desc(q, seq));
                    if theirs.is_some_and(|d| self.small_path(&d)) {
                        return Err(sh.refused(seq, self.rank, Some(e)));
                    }
                }
            }
        }
        let io = self.io(stream)?;
        let mut staged: Option<Staged> = None;
        let host = match &desc {
            Ok(d) => {
                // The root of an in-place broadcast reads its receive buffer.
                let recv_is_input = d.kind == Collective::Broadcast
                    && d.root == Some(self.rank)
                    && buffers.send.is_none();
                self.host_buffers(&io, &buffers, recv_is_input, &mut staged)
            }
            Err(_) => None,
        };
        let stream = io.stream.clone();
        let shared = self.shared.collective(
            self.rank,
            seq,
            Arrival {
                desc,
                io,
                buffers,
                host,
            },
        );
        let Some(staged) = staged else {
            return shared.map(|_| ());
        };
        let uploaded = match shared {
            Ok(true) => staged.upload(&stream),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        self.shared.staging[self.rank]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(staged.into_buffers());
        uploaded
    }

    /// Whether `desc` takes the small path (`small.rs`): it fits the slots, and no
    /// override names an enqueued algorithm for it. The same on every rank.
    fn small_path(&self, desc: &OpDesc) -> bool {
        small::fits(desc, self.size())
            && matches!(
                self.shared.options.selector.forced(desc.kind, desc.bytes),
                None | Some(Algorithm::SharedMemory)
            )
    }

    /// Runs a small operation through the slots: now when the stream is idle, else as a
    /// host function on the stream, in stream order.
    fn small(
        &self,
        slots: &Slots,
        seq: u64,
        desc: OpDesc,
        buffers: &RankBuffers,
        stream: &Stream,
    ) -> Result<()> {
        let view = |s: &Option<Slice>| match s {
            None => Some(None),
            Some(s) if s.len == 0 => Some(Some(HostRange::staged(
                std::ptr::NonNull::dangling().as_ptr(),
                0,
            ))),
            Some(s) => HostRange::of(s).map(Some),
        };
        let host = match (view(&buffers.send), view(&buffers.recv)) {
            (Some(send), Some(recv)) => HostBuffers { send, recv },
            _ => {
                self.shared.announce(slots, self.rank, seq, None)?;
                return Err(Error::backend_message(
                    "collectives",
                    format!(
                        "internal error: memory of {} has no host view",
                        self.device().id()
                    ),
                ));
            }
        };
        let sh = &self.shared;
        if matches!(stream.query(), Ok(true)) {
            let result = sh.exchange(slots, self.rank, seq, desc, &host);
            if result.is_ok() && self.rank == 0 {
                sh.ran_shared.fetch_add(1, Ordering::Relaxed);
            }
            return result;
        }
        let shared = self.shared.clone();
        let rank = self.rank;
        let exchange = move |_: &mut xpu_hal::HostKernelContext<'_>| {
            let Some(slots) = shared.slots.as_ref() else {
                return Err("internal error: the communicator has no slots".to_string());
            };
            let result = shared.exchange(slots, rank, seq, desc, &host);
            if result.is_ok() && rank == 0 {
                shared.ran_shared.fetch_add(1, Ordering::Relaxed);
            }
            result.map_err(|e| e.to_string())
        };
        let launched = self
            .device()
            .load_kernel(xpu_hal::KernelDesc {
                name: "collective exchange".into(),
                entry_point: "exchange".into(),
                source: xpu_hal::KernelSource::HostFunction(Arc::new(exchange)),
                params: Vec::new(),
            })
            .and_then(|k| stream.launch(&k, xpu_hal::LaunchDims::linear(1, 1), &[]));
        if launched.is_err() {
            sh.announce(slots, self.rank, seq, None)?;
        }
        launched
    }

    /// The CPU's view of the rank's buffers, when the device has one and the stream is
    /// idle, so that the data is ready now.
    fn host_buffers(
        &self,
        io: &RankIo,
        buffers: &RankBuffers,
        recv_is_input: bool,
        staged: &mut Option<Staged>,
    ) -> Option<HostBuffers> {
        if !io.device.capabilities().host_addressable {
            if !self.shared.may_stage[self.rank] || !matches!(io.stream.query(), Ok(true)) {
                return None;
            }
            let mut pool = self.shared.staging[self.rank]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (host, s) = staging::stage(&io.stream, buffers, recv_is_input, &mut pool)?;
            *staged = Some(s);
            return Some(host);
        }
        let view = |s: &Option<Slice>| match s {
            None => Some(None),
            Some(s) => HostRange::of(s).map(Some),
        };
        let host = HostBuffers {
            send: view(&buffers.send)?,
            recv: view(&buffers.recv)?,
        };
        matches!(io.stream.query(), Ok(true)).then_some(host)
    }

    /// Every rank's `recv` becomes the reduction over ranks of their `send`. `send` and
    /// `recv` have the same length, a whole number of `dtype` elements; pass the same
    /// range for an in-place operation.
    pub fn all_reduce<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
            check_dtype(self.device(), s.len, dtype, "send buffer")?;
            check_aliasing(&s, &r)?;
            Ok((
                OpDesc {
                    kind: Collective::AllReduce,
                    bytes: s.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: None,
                },
                RankBuffers {
                    send: Some(s),
                    recv: Some(r),
                },
            ))
        })
    }

    /// The root's `recv` becomes the reduction over ranks of their `send`. `recv` is
    /// needed on the root only (others pass `None`).
    pub fn reduce<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: Option<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let send = send.into();
        self.arrive(stream, || {
            self.check_root(root)?;
            let s = check_slice(self.device(), &send, "send buffer")?;
            check_dtype(self.device(), s.len, dtype, "send buffer")?;
            let r = match (recv, self.rank == root) {
                (Some(b), true) => {
                    let r = check_slice(self.device(), &b, "receive buffer")?;
                    check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
                    check_aliasing(&s, &r)?;
                    Some(r)
                }
                (None, true) => {
                    return Err(Error::invalid(
                        "the root of a reduce needs a receive buffer",
                    ))
                }
                (_, false) => None,
            };
            Ok((
                OpDesc {
                    kind: Collective::Reduce,
                    bytes: s.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: Some(root),
                },
                RankBuffers {
                    send: Some(s),
                    recv: r,
                },
            ))
        })
    }

    /// Every rank's `recv` becomes the root's data: the root's `send`, or its `recv` when
    /// it passes no `send` (in place). Other ranks pass `None` for `send`.
    pub fn broadcast<'a, 'b>(
        &self,
        send: Option<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let recv = recv.into();
        self.arrive(stream, || {
            self.check_root(root)?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            let s = match send {
                Some(b) if self.rank == root => {
                    let s = check_slice(self.device(), &b, "send buffer")?;
                    check_len(s.len, r.len, "send buffer (the receive buffer's length)")?;
                    check_aliasing(&s, &r)?;
                    Some(s)
                }
                _ => None,
            };
            Ok((
                OpDesc {
                    kind: Collective::Broadcast,
                    bytes: r.len,
                    dtype: None,
                    op: None,
                    root: Some(root),
                },
                RankBuffers {
                    send: s,
                    recv: Some(r),
                },
            ))
        })
    }

    /// Every rank's `recv` (size × `send`'s length) becomes all ranks' `send`, in rank
    /// order.
    pub fn all_gather<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(r.len, s.len * self.size() as u64, "receive buffer (ranks × the send buffer)")?;
            let own = r.sub(self.rank as u64 * s.len, s.len);
            if s.overlaps(&r) && !s.same_as(&own) {
                return Err(Error::invalid(
                    "the send buffer overlaps the receive buffer other than at this rank's own block; pass that block (in place) or disjoint ranges",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::AllGather,
                    bytes: s.len,
                    dtype: None,
                    op: None,
                    root: None,
                },
                RankBuffers { send: Some(s), recv: Some(r) },
            ))
        })
    }

    /// Rank `r`'s `recv` becomes block `r` of the reduction over ranks of their `send`
    /// (size × `recv`'s length).
    pub fn reduce_scatter<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        dtype: DType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(s.len, r.len * self.size() as u64, "send buffer (ranks × the receive buffer)")?;
            check_dtype(self.device(), r.len, dtype, "receive buffer")?;
            let own = s.sub(self.rank as u64 * r.len, r.len);
            if s.overlaps(&r) && !r.same_as(&own) {
                return Err(Error::invalid(
                    "the receive buffer overlaps the send buffer other than at this rank's own block; pass that block (in place) or disjoint ranges",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::ReduceScatter,
                    bytes: r.len,
                    dtype: Some(dtype),
                    op: Some(op),
                    root: None,
                },
                RankBuffers { send: Some(s), recv: Some(r) },
            ))
        })
    }

    /// Block `q` of rank `r`'s `recv` becomes block `r` of rank `q`'s `send`; both are
    /// size × block bytes and must not overlap.
    pub fn all_to_all<'a, 'b>(
        &self,
        send: impl Into<BufferSlice<'a>>,
        recv: impl Into<BufferSlice<'b>>,
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        self.arrive(stream, || {
            let s = check_slice(self.device(), &send, "send buffer")?;
            let r = check_slice(self.device(), &recv, "receive buffer")?;
            check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
            let n = self.size() as u64;
            if !s.len.is_multiple_of(n) {
                return Err(Error::invalid(format!(
                    "the send buffer is {} bytes, not {n} equal blocks",
                    s.len
                )));
            }
            if s.overlaps(&r) {
                return Err(Error::invalid(
                    "all-to-all cannot run in place; pass disjoint send and receive buffers",
                ));
            }
            Ok((
                OpDesc {
                    kind: Collective::AllToAll,
                    bytes: s.len / n,
                    dtype: None,
                    op: None,
                    root: None,
                },
                RankBuffers {
                    send: Some(s),
                    recv: Some(r),
                },
            ))
        })
    }

    /// Returns once every rank has called it; work each rank enqueues on `stream` after
    /// the barrier starts only when every rank's stream has reached it.
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        self.arrive(stream, || {
            Ok((
                OpDesc {
                    kind: Collective::Barrier,
                    bytes: 0,
                    dtype: None,
                    op: None,
                    root: None,
                },
                RankBuffers {
                    send: None,
                    recv: None,
                },
            ))
        })
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(Error::invalid(format!(
                "root {root} is not a rank; the communicator has {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank {
            return Err(Error::invalid(format!(
                "peer {peer} is not another rank of this {}-rank communicator (this is rank {})",
                self.size(),
                self.rank
            )));
        }
        Ok(())
    }

    /// Sends `data` to rank `peer`: copies it into communicator memory on `stream` and
    /// returns; the matching [`Rank::recv`] delivers it.
    pub fn send<'a>(
        &self,
        data: impl Into<BufferSlice<'a>>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let data = data.into();
        self.check_peer(peer)?;
        let io = self.io(stream)?;
        let s = check_slice(self.device(), &data, "send buffer")?;
        {
            let st = self.shared.lock();
            self.shared.check_failed(&st)?;
        }
        let copy: Allocation = self.device().allocate(s.len)?;
        let copy = Slice::whole(&copy);
        if s.len > 0 {
            io.stream.copy(s.buf(), copy.buf())?;
        }
        let ready = io.stream.record_event()?;
        let mut st = self.shared.lock();
        st.posted
            .entry((self.rank, peer))
            .or_default()
            .push_back(Posted { data: copy, ready });
        drop(st);
        self.shared.arrived.notify_all();
        Ok(())
    }

    /// Receives into `data` the oldest unmatched send from rank `peer`, waiting for it
    /// up to the communicator's timeout; the lengths must agree.
    pub fn recv<'a>(
        &self,
        data: impl Into<BufferSlice<'a>>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let data = data.into();
        self.check_peer(peer)?;
        let io = self.io(stream)?;
        let d = check_slice(self.device(), &data, "receive buffer")?;
        let deadline = Instant::now() + self.shared.options.timeout;
        let mut st = self.shared.lock();
        let posted = loop {
            self.shared.check_failed(&st)?;
            if let Some(p) = st
                .posted
                .get_mut(&(peer, self.rank))
                .and_then(VecDeque::pop_front)
            {
                break p;
            }
            let now = Instant::now();
            if now >= deadline {
                let error = Error::Timeout {
                    message: format!(
                        "rank {} waited {:.1} s in recv for a send from {}, which never came; the communicator is now failed: abort it and make a new one",
                        self.rank,
                        self.shared.options.timeout.as_secs_f64(),
                        self.shared.rank_name(peer)
                    ),
                };
                self.shared.set_failed(&mut st, error.clone());
                drop(st);
                self.shared.arrived.notify_all();
                return Err(error);
            }
            st = self
                .shared
                .arrived
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        drop(st);
        if posted.data.len != d.len {
            return Err(Error::invalid(format!(
                "rank {} sent {} bytes but rank {} receives {}; post matching sizes",
                peer, posted.data.len, self.rank, d.len
            )));
        }
        if d.len == 0 {
            return Ok(());
        }
        // The transfer's sending side runs on the communicator's own stream of the
        // sender's device, ordered after the sender's copy by its event.
        let aux = self.shared.aux_stream(peer)?;
        aux.wait_event(&posted.ready)?;
        let ranks: Vec<RankIo> = (0..self.size())
            .map(|r| {
                if r == peer {
                    RankIo {
                        device: self.shared.devices[peer].clone(),
                        stream: aux.clone(),
                    }
                } else {
                    io.clone()
                }
            })
            .collect();
        let mut transport = self
            .shared
            .transport
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        transport.copy(&ranks, peer, &posted.data, self.rank, &d)
    }
}
