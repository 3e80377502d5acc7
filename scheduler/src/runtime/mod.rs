//! The [`Scheduler`]: submission, placement, data movement and waiting.
//!
//! This module holds the state and the public entry points; the work is split by topic:
//! `dispatch` (what the policy sees, enqueuing a task), `movement` (replicas, fetches,
//! write-backs, eviction), `queue` (the queued policies' queues and workers),
//! `collective` (collectives as tasks) and `profiling`.

mod collective;
mod dispatch;
mod movement;
mod profiling;
mod queue;
mod record;
mod recovery;
mod window;

pub use collective::CollectiveTask;
use profiling::{finish_profile, write_trace};
use queue::worker;
pub use record::Graph;

use std::collections::{BTreeSet, VecDeque};

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xpu_collectives::{Communicator, ReduceOp};
use xpu_hal::{Allocation, DType, Device, Error, Event, HostBuffer, KernelArg, Result};

use recovery::MAX_ATTEMPTS;

use crate::codelet::{Builtin, Codelet, Implementation};
use crate::data::{Change, Handle, HandleState, Place, Replica};
use crate::deps::AccessMode;
use crate::perfmodel::PerfModels;
use crate::policy::{Candidate, Policy};
use crate::profile::{MemorySample, Profile, Span, SpanKind};
use crate::stream::{wait_for, Point, StreamSlot};
use crate::task::{Task, TaskId};

static NEXT_SCHEDULER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Tasks a device may have enqueued and not finished before its worker takes another
/// from the queues (queued policies): few enough that a fast device takes more of the
/// work, enough to keep it fed while the worker dispatches the next.
const DEPTH: u64 = 4;
/// A handle whose dependency state lists more tasks than this forgets the finished ones
/// before its next access.
const PRUNE_ABOVE: usize = 64;
/// How long an idle worker sleeps before it looks again (new work wakes it earlier).
const WORKER_NAP: Duration = Duration::from_millis(2);

/// A codelet is timed on every run until a footprint has this many samples, and on one
/// run in [`SAMPLE_EVERY`] after that (to notice when it changes).
const CALIBRATION_SAMPLES: u64 = 10;
/// See [`CALIBRATION_SAMPLES`].
const SAMPLE_EVERY: u64 = 32;
/// While calibrating, timings on one stream not yet harvested, at most: enough that a
/// program submitting many codelets at once (a training step) calibrates them all in
/// a few rounds, few enough that samples do not arrive long after the fact.
const TIMINGS_UNDER_WAY: u64 = 64;
/// Assumed bytes per second of a copy to or from a device before any was measured.
const DEFAULT_BANDWIDTH: f64 = 8e9;
/// What handing data from one device to another costs beyond its bytes: an event the
/// receiver's stream waits for (a small copy goes on its task stream, see
/// [`OVERLAP_MIN_BYTES`]). A wait that finds the other device's work done costs about
/// 2 µs on the 2-core build machine; one that must sleep costs tens. Without it a
/// policy would split chains of small tasks across devices for nothing.
const HANDOFF: f64 = 5e-6;
/// Copies smaller than this are not timed: their time is mostly latency.
const MIN_TIMED_COPY: u64 = 256 << 10;
/// Copies to a device of at least this many bytes go on its copy stream, to overlap
/// the tasks before them; smaller ones, whose time is mostly latency, go on its task
/// stream, where they cost no hand-off between threads.
const OVERLAP_MIN_BYTES: u64 = 64 << 10;

/// How a [`Scheduler`] works.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOptions {
    /// The placement policy.
    pub policy: Policy,
    /// Where performance models persist; `None`: the default cache directory
    /// ([`crate::perfmodel::default_dir`]).
    pub model_dir: Option<PathBuf>,
    /// Keep models in memory only.
    pub no_persist: bool,
    /// Profile from the start and write the trace here when the scheduler is dropped
    /// (see [`crate::profile`]).
    pub profile: Option<PathBuf>,
}

impl SchedulerOptions {
    /// The defaults, with the policy from `XPU_SCHED` and the profile's file from
    /// `XPU_PROFILE` when set.
    pub fn from_env() -> Result<SchedulerOptions> {
        let mut o = SchedulerOptions {
            profile: std::env::var_os("XPU_PROFILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            ..SchedulerOptions::default()
        };
        if let Some(v) = std::env::var_os("XPU_SCHED") {
            let v = v.to_string_lossy();
            o.policy = v
                .parse()
                .map_err(|e: Error| Error::invalid(format!("XPU_SCHED: {e}")))?;
        }
        Ok(o)
    }
}

/// What a scheduler has done so far, read at one instant (under its lock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Tasks submitted (including those that failed to start).
    pub tasks: u64,
    /// Tasks started on each device, in device order (a task run again counts again).
    pub placed: Vec<u64>,
    /// Tasks dispatched again because work before them failed or their device was lost.
    pub retried: u64,
    /// Copies that brought a handle to a device (from its home or a peer).
    pub fetches: u64,
    /// Copies of a handle back to its home.
    pub write_backs: u64,
    /// Bytes those copies moved.
    pub bytes_moved: u64,
    /// Replicas dropped to make room.
    pub evictions: u64,
}

/// Points on streams; the usual few inline.
type Points = SmallVec<[Point; 4]>;

/// A task's record while it may still be pending.
struct TaskRecord {
    label: Arc<str>,
    point: Point,
    /// The points on other devices' streams of a collective task.
    extra: Vec<Point>,
    failed: Option<String>,
    /// The points it waited for: the copies and writes that made its inputs, and its
    /// dependencies' ends.
    inputs: Points,
    /// For a task that failed without running: its dependencies, which the tasks after
    /// it wait for in its place.
    through: Vec<u64>,
    /// What running it again needs (`None` for collectives and failed tasks).
    redo: Option<Redo>,
    /// For a collective, what it accesses (other tasks keep theirs in `redo`): what it
    /// writes has no value if it fails.
    collective: Vec<(Handle, AccessMode)>,
}

/// What running a dispatched task again needs, should work before it fail.
struct Redo {
    pending: Arc<Pending>,
    /// Its dependencies when they are not `pending.deps` (replayed graphs).
    deps: Option<BTreeSet<u64>>,
    /// How many times it has been dispatched.
    attempts: u32,
}

impl TaskRecord {
    /// Every point the task ends at.
    fn points(&self) -> impl Iterator<Item = Point> + '_ {
        std::iter::once(self.point).chain(self.extra.iter().copied())
    }
}

/// What a pending timing measures.
enum Timed {
    /// One run of a codelet.
    Task {
        codelet: String,
        arch: String,
        footprint: u64,
    },
    /// A copy of `bytes` to device `device`.
    Copy { device: usize, bytes: u64 },
}

/// A pending timing: two events around the work.
struct Measurement {
    what: Timed,
    start: Event,
    end: Event,
}

/// What the scheduler tracks of one device.
struct DeviceState {
    /// Seconds since the scheduler's epoch when the device is expected to be free.
    busy_until: f64,
    /// Bytes per second of copies to it, as measured (None: not yet).
    bandwidth: Option<f64>,
    /// Why it is no longer used, once it was lost.
    lost: Option<String>,
}

struct State {
    streams: Vec<StreamSlot>,
    handles: HashMap<u64, HandleState>,
    tasks: HashMap<u64, TaskRecord>,
    next_task: u64,
    devices: Vec<DeviceState>,
    models: PerfModels,
    /// Timings under way, per stream, in the order they were enqueued there.
    measurements: Vec<VecDeque<Measurement>>,
    /// What the policy sees of each candidate device of the task being placed (kept
    /// between tasks so that placing one allocates nothing).
    infos: Vec<Candidate>,
    /// Copies from homes so far.
    copies: u64,
    clock: u64,
    /// Asynchronous failures observed and not yet reported.
    errors: Vec<Error>,
    stats: SchedStats,
    profiling: Option<Profiling>,
    /// Whether every task is timed for the models (else only while they calibrate and
    /// now and then after: [`Scheduler::time_every_task`]).
    time_every: bool,
    /// Bytes of replicas held per device.
    replica_bytes: Vec<u64>,
    queues: Queues,
    /// The graph being recorded, if any.
    recording: Option<record::Recording>,
    /// Per stream: dispatched tasks, oldest first, with the `seq` of their point on it,
    /// until the stream has passed them.
    live: Vec<VecDeque<(u64, u64)>>,
    /// Whether ready tasks go to per-device deques (`ws`) rather than the central queue.
    ws: bool,
    /// Set when the last handle to the scheduler is dropped: workers finish the queues
    /// and exit.
    shutdown: bool,
    /// A device was found lost while enqueuing, and what it had in flight is not yet
    /// recovered.
    unrecovered_loss: bool,
    /// Tasks `heft` holds until the next wait.
    window: window::Window,
    /// Replayed runs still recorded, by the id of their task (that of the run's first
    /// item) to the id of their last item: the ids in between name the run.
    runs: std::collections::BTreeMap<u64, u64>,
}

/// A task submitted and not dispatched yet (queued policies), or being dispatched.
#[derive(Clone)]
struct Pending {
    task: Task,
    label: Arc<str>,
    accesses: Vec<(Handle, AccessMode)>,
    deps: BTreeSet<u64>,
    /// Devices that can run it, with the implementation each runs.
    candidates: SmallVec<[(usize, usize); 4]>,
    footprint: u64,
    /// Dependencies not dispatched yet.
    remaining: usize,
    /// For a replayed run of a graph: its items, which it runs in place of a codelet's
    /// implementation (see the `record` module).
    run: Option<Arc<record::Run>>,
}

/// The queues of the queued policies.
#[derive(Default)]
struct Queues {
    pending: HashMap<u64, Pending>,
    /// Per pending task: the pending tasks waiting for it.
    successors: HashMap<u64, Vec<u64>>,
    /// Ready tasks, oldest first (`eager`).
    central: VecDeque<u64>,
    /// Ready tasks per device (`ws`).
    local: Vec<VecDeque<u64>>,
    /// Where the next ready task of a submission goes (`ws`).
    next: usize,
}

/// A span whose events have not been read yet.
struct PendingSpan {
    kind: SpanKind,
    name: String,
    task: Option<u64>,
    device: usize,
    stream: usize,
    bytes: u64,
    deps: Vec<u64>,
    start: Event,
    end: Event,
}

/// A profile being recorded (see the `profile` module).
struct Profiling {
    /// When it started, on the host's clock.
    started: Instant,
    /// Per device: its origin event and the host seconds (since `started`) at which it
    /// completed; `None` for a device that cannot time events.
    origins: Vec<Option<(Event, f64)>>,
    spans: Vec<PendingSpan>,
    memory: Vec<MemorySample>,
    /// Whether replayed runs are split into their tasks, to have a span each.
    split_runs: bool,
}

struct Shared {
    /// A process-unique id (recorded graphs belong to one scheduler).
    id: u64,
    devices: Vec<Device>,
    archs: Vec<String>,
    policy: Policy,
    /// Where the trace goes when the scheduler is dropped.
    profile_path: Option<PathBuf>,
    state: Mutex<State>,
    /// Signalled when tasks become ready or are dispatched.
    work: Condvar,
    epoch: Instant,
}

/// Task graphs over a set of devices (see the crate docs). Cheap to clone; every clone
/// drives the same devices, streams and data.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
    /// Stops the workers when the last clone goes.
    owner: Arc<Owner>,
}

/// The workers of a queued policy; dropping the last owner lets them drain the queues
/// and joins them.
#[derive(Default)]
struct Owner {
    shared: Option<Arc<Shared>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let Some(shared) = &self.shared else {
            return;
        };
        {
            let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.flush(shared);
            st.shutdown = true;
        }
        shared.work.notify_all();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            if w.thread().id() != std::thread::current().id() {
                let _ = w.join();
            }
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self
            .shared
            .devices
            .iter()
            .map(|d| d.id().to_string())
            .collect();
        f.debug_struct("Scheduler")
            .field("devices", &ids)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

/// The streams the scheduler keeps per device: tasks, copies, collectives.
const STREAMS_PER_DEVICE: usize = 3;

fn compute_stream(d: usize) -> usize {
    STREAMS_PER_DEVICE * d
}

fn copy_stream(d: usize) -> usize {
    STREAMS_PER_DEVICE * d + 1
}

/// The stream of device `d` that collective tasks run on: their waits for the other
/// ranks hold it, not the device's tasks, which go on meanwhile.
fn collective_stream(d: usize) -> usize {
    STREAMS_PER_DEVICE * d + 2
}

/// The device of stream `s`.
fn device_of(s: usize) -> usize {
    s / STREAMS_PER_DEVICE
}

impl Scheduler {
    /// A scheduler over `devices` (distinct, at least one).
    pub fn new(devices: &[Device], options: SchedulerOptions) -> Result<Scheduler> {
        if devices.is_empty() {
            return Err(Error::invalid(
                "a scheduler needs at least one device; select some with --devices or XPU_DEVICES",
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e == d) {
                return Err(Error::invalid(format!(
                    "{} is listed twice; give each device once",
                    d.id()
                )));
            }
        }
        let n = devices.len();
        let all = STREAMS_PER_DEVICE * n;
        let mut streams = Vec::with_capacity(all);
        for d in devices {
            for _ in 0..STREAMS_PER_DEVICE {
                streams.push(StreamSlot::new(d.create_stream()?, all));
            }
        }
        let dir = if options.no_persist {
            None
        } else {
            options
                .model_dir
                .clone()
                .or_else(crate::perfmodel::default_dir)
        };
        // Each device has models of its own, as StarPU keeps them per device: two devices
        // of one kind may still run at different speeds (one throttled, or sharing its
        // cores with other work), and a shared model would predict their average.
        let archs = devices
            .iter()
            .map(|d| format!("{}/{}", d.id(), d.name()))
            .collect();
        let mut sched = Scheduler {
            shared: Arc::new(Shared {
                id: NEXT_SCHEDULER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                devices: devices.to_vec(),
                archs,
                policy: options.policy,
                profile_path: options.profile.clone(),
                state: Mutex::new(State {
                    streams,
                    handles: HashMap::default(),
                    tasks: HashMap::default(),
                    next_task: 0,
                    devices: (0..n)
                        .map(|_| DeviceState {
                            busy_until: 0.0,
                            bandwidth: None,
                            lost: None,
                        })
                        .collect(),
                    models: PerfModels::new(dir),
                    measurements: (0..all).map(|_| VecDeque::new()).collect(),
                    infos: Vec::with_capacity(n),
                    copies: 0,
                    clock: 0,
                    errors: Vec::new(),
                    stats: SchedStats {
                        placed: vec![0; n],
                        ..SchedStats::default()
                    },
                    profiling: None,
                    time_every: false,
                    replica_bytes: vec![0; n],
                    queues: Queues {
                        local: (0..n).map(|_| VecDeque::new()).collect(),
                        ..Queues::default()
                    },
                    recording: None,
                    live: (0..all).map(|_| VecDeque::new()).collect(),
                    ws: options.policy == Policy::Ws,
                    shutdown: false,
                    unrecovered_loss: false,
                    window: window::Window::default(),
                    runs: Default::default(),
                }),
                work: Condvar::new(),
                epoch: Instant::now(),
            }),
            owner: Arc::new(Owner::default()),
        };
        if options.policy.queued() {
            let mut workers = Vec::with_capacity(n);
            for (d, device) in devices.iter().enumerate() {
                let shared = sched.shared.clone();
                let handle = std::thread::Builder::new()
                    .name(format!("xpu-sched-{}", device.id()))
                    .spawn(move || worker(&shared, d))
                    .map_err(|e| {
                        Error::backend_message(
                            "scheduler",
                            format!("could not start a worker thread: {e}"),
                        )
                    })?;
                workers.push(handle);
            }
            sched.owner = Arc::new(Owner {
                shared: Some(sched.shared.clone()),
                workers: Mutex::new(workers),
            });
        }
        if options.policy == Policy::Heft {
            // Held tasks are dispatched when the last clone goes.
            sched.owner = Arc::new(Owner {
                shared: Some(sched.shared.clone()),
                workers: Mutex::new(Vec::new()),
            });
        }
        if sched.shared.profile_path.is_some() {
            sched.start_profiling()?;
        }
        Ok(sched)
    }

    /// Its devices, in placement order.
    pub fn devices(&self) -> &[Device] {
        &self.shared.devices
    }

    /// Its policy.
    pub fn policy(&self) -> Policy {
        self.shared.policy
    }

    /// The state, once every task submitted so far has been dispatched (queued
    /// policies; at once otherwise).
    fn drained(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        st.flush(&self.shared);
        while !st.queues.pending.is_empty() {
            st = match self.shared.work.wait_timeout(st, WORKER_NAP) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        st
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> f64 {
        self.shared.epoch.elapsed().as_secs_f64()
    }

    /// Takes `buffer` as the home of a new handle; its bytes are the handle's value.
    /// The scheduler owns the buffer until [`Scheduler::unregister`] gives it back.
    pub fn register(&self, buffer: HostBuffer) -> Result<Handle> {
        if buffer.in_flight() > 0 {
            return Err(Error::invalid(
                "the buffer is still used by enqueued copies; synchronize their streams before registering it",
            ));
        }
        let handle = Handle::fresh(buffer.len() as u64);
        let n = self.shared.devices.len();
        self.lock()
            .handles
            .insert(handle.id, HandleState::new(handle, buffer, n));
        Ok(handle)
    }

    /// A new handle of `len` bytes, zero-filled.
    pub fn create(&self, len: u64) -> Result<Handle> {
        let len = usize::try_from(len)
            .map_err(|_| Error::invalid(format!("{len} bytes do not fit this host")))?;
        self.register(HostBuffer::new(len)?)
    }

    /// Submits `task` (see the crate docs). Returns at once: the task runs when what it
    /// depends on has run.
    pub fn submit(&self, mut task: Task) -> Result<TaskId> {
        let mut st = self.lock();
        if st.poll(&self.shared) > 0 {
            self.shared.work.notify_all();
        }
        let label = task.label();
        // Arguments: known handles, each once (merging modes), in the task's own list.
        let mut accesses = std::mem::take(&mut task.accesses);
        if let Some((h, _)) = accesses
            .iter()
            .find(|(h, _)| !st.handles.contains_key(&h.id))
        {
            return Err(Error::invalid(format!(
                "{label}: {h} is not registered with this scheduler (unregistered, or from another one)"
            )));
        }
        let mut k = 0;
        while k < accesses.len() {
            let (h, m) = accesses[k];
            match accesses[..k].iter().position(|(a, _)| a.id == h.id) {
                Some(first) => {
                    accesses[first].1 = accesses[first].1.merge(m);
                    accesses.remove(k);
                }
                None => k += 1,
            }
        }
        for t in &task.after {
            if t.0 >= st.next_task {
                return Err(Error::invalid(format!(
                    "{label}: {t} has not been submitted; a task can only follow earlier tasks"
                )));
            }
        }
        // Where it can run.
        let mut reasons = Vec::new();
        let mut candidates: SmallVec<[(usize, usize); 4]> = SmallVec::new();
        for (d, device) in self.shared.devices.iter().enumerate() {
            if let Some(p) = &task.pinned {
                if p != device {
                    continue;
                }
            }
            if let Some(why) = &st.devices[d].lost {
                reasons.push(format!("{} was lost ({why})", device.id()));
                continue;
            }
            match task.codelet.implementation_for(device) {
                Ok(i) => candidates.push((d, i)),
                Err(why) => reasons.push(why),
            }
        }
        if let Some(p) = &task.pinned {
            if !self.shared.devices.contains(p) {
                return Err(Error::invalid(format!(
                    "{label} is pinned to {}, which is not one of this scheduler's devices",
                    p.id()
                )));
            }
        }
        if candidates.is_empty() {
            return Err(Error::unsupported(format!(
                "{label} (codelet `{}`) can run on none of the scheduler's devices: {}",
                task.codelet.name(),
                reasons.join("; ")
            )));
        }
        check_arguments(&task, &accesses, candidates[0].1)?;
        // Dependencies.
        let id = st.next_task;
        let mut deps = BTreeSet::new();
        // Reductions commute only with reductions by the same codelet.
        let key = task.codelet.id();
        for (h, m) in &accesses {
            st.access(h.id, id, *m, key, &mut deps);
        }
        deps.extend(task.after.iter().map(|t| st.resolve(t.0)));
        st.next_task += 1;
        st.stats.tasks += 1;
        // A task that reads what a failed task wrote fails too (queued policies and
        // heft learn it when they dispatch the task: the writers before it may not
        // have been yet).
        if self.shared.policy == Policy::Dmda {
            if let Some(e) = st.fails_with_dependency(id, &label, &accesses, &deps, &task.after) {
                return Err(e);
            }
        }
        let footprint: u64 = accesses.iter().map(|(h, _)| h.len).sum();
        let pending = Pending {
            task,
            label,
            accesses,
            deps,
            candidates,
            footprint,
            remaining: 0,
            run: None,
        };
        if let Some(rec) = &mut st.recording {
            rec.task(id, &pending);
        }
        if self.shared.policy.queued() {
            st.enqueue(self.shared.devices.len(), pending, id);
            drop(st);
            self.shared.work.notify_all();
            return Ok(TaskId(id));
        }
        // Placement.
        let pending = Arc::new(pending);
        if self.shared.policy == Policy::Heft {
            st.hold(id, pending);
            if st.window.len() >= crate::policy::HEFT_WINDOW {
                st.flush(&self.shared);
            }
            return Ok(TaskId(id));
        }
        let now = self.now();
        let candidates = &pending.candidates;
        let chosen = if candidates.len() == 1 {
            candidates[0]
        } else {
            // Gathered in a list kept for the purpose (no allocation per task).
            let mut infos = std::mem::take(&mut st.infos);
            infos.clear();
            for &(d, _) in candidates {
                infos.push(st.candidate(
                    &self.shared,
                    &pending.task.codelet,
                    d,
                    &pending.accesses,
                    footprint,
                    now,
                ));
            }
            let k = self.shared.policy.choose(&infos);
            st.infos = infos;
            candidates[k]
        };
        st.start(&self.shared, id, &pending, &pending.deps, chosen, now)
            .map(|()| TaskId(id))
    }

    /// Waits until every task submitted so far has run; returns the first failure of any
    /// of them not yet reported (each is reported once). Tasks that depend on a failed
    /// one fail too (waiting for one of them says why); independent tasks run, also
    /// those that shared a stream with the failed one (see the `recovery` module).
    pub fn wait_all(&self) -> Result<()> {
        loop {
            let streams: Vec<Option<xpu_hal::Stream>> = {
                let st = self.drained();
                st.streams
                    .iter()
                    .enumerate()
                    .map(|(s, slot)| {
                        st.devices[device_of(s)]
                            .lost
                            .is_none()
                            .then(|| slot.stream.clone())
                    })
                    .collect()
            };
            let mut taken: Vec<Option<Error>> = streams
                .iter()
                .map(|s| s.as_ref().and_then(|s| s.synchronize().err()))
                .collect();
            let mut st = self.lock();
            let again = st.poll_streams(&self.shared, &mut taken);
            st.poll(&self.shared);
            if again {
                // Tasks were dispatched again: wait for them too.
                continue;
            }
            let now = self.now();
            for dev in &mut st.devices {
                dev.busy_until = dev.busy_until.min(now);
            }
            return if st.errors.is_empty() {
                Ok(())
            } else {
                Err(st.errors.remove(0))
            };
        }
    }

    /// Waits until `task` has run; an `Aborted` error when it failed, saying why (a task
    /// that depends on a failed one names it).
    pub fn wait(&self, task: TaskId) -> Result<()> {
        loop {
            let events = {
                let mut st = self.lock();
                st.flush(&self.shared);
                while st.queues.pending.contains_key(&task.0) {
                    st = match self.shared.work.wait_timeout(st, WORKER_NAP) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                let Some(rec) = st.tasks.get(&st.resolve(task.0)) else {
                    if task.0 >= st.next_task {
                        return Err(Error::invalid(format!("{task} has not been submitted")));
                    }
                    return Ok(());
                };
                if let Some(why) = &rec.failed {
                    return Err(Error::aborted(format!(
                        "{task} ({}) failed: {why}",
                        rec.label
                    )));
                }
                let points: Vec<Point> = rec.points().collect();
                points
                    .into_iter()
                    .filter_map(|p| st.streams[p.stream].event_after(p.seq))
                    .collect::<Vec<Event>>()
            };
            if events.iter().all(|e| e.wait().is_ok()) {
                return Ok(());
            }
            // Something failed before it: learn what, and whether it runs again.
            self.lock().poll(&self.shared);
        }
    }

    /// The handle's current value, once every task submitted so far that writes it has
    /// run.
    pub fn read(&self, handle: Handle) -> Result<Vec<u8>> {
        let mut st = self.home(handle)?;
        let hs = st
            .handles
            .get_mut(&handle.id)
            .ok_or_else(|| unknown(handle))?;
        let bytes = hs.home.buffer.as_slice()?.to_vec();
        Ok(bytes)
    }

    /// Replaces `handle`'s value with `bytes` (its whole length) once every task
    /// submitted so far that uses it has run: tasks submitted after read `bytes`. The
    /// handle stays the same, so a recorded graph that uses it replays on the new value
    /// (a training step's inputs); its copies on the devices are dropped.
    pub fn write(&self, handle: Handle, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 != handle.len() {
            return Err(Error::invalid(format!(
                "{} bytes for {handle}, which holds {}; give its whole value",
                bytes.len(),
                handle.len()
            )));
        }
        let buffer = HostBuffer::from_bytes(bytes)?;
        let n = self.shared.devices.len();
        let mut st = self.home(handle)?;
        let hs = st
            .handles
            .get_mut(&handle.id)
            .ok_or_else(|| unknown(handle))?;
        *hs = HandleState::new(handle, buffer, n);
        Ok(())
    }

    /// Gives `handle`'s home buffer back with the handle's current value, once every
    /// task submitted so far that uses it has run; the handle can no longer be used.
    pub fn unregister(&self, handle: Handle) -> Result<HostBuffer> {
        let mut st = self.home(handle)?;
        let hs = st
            .handles
            .remove(&handle.id)
            .ok_or_else(|| unknown(handle))?;
        Ok(hs.home.buffer)
    }

    /// The state, with `handle`'s current value in its home once every task submitted so
    /// far that uses it has run (tasks run again after a failure included).
    fn home(&self, handle: Handle) -> Result<MutexGuard<'_, State>> {
        let mut st = self.drained();
        let mut lost = None;
        for _ in 0..=MAX_ATTEMPTS {
            st.poll(&self.shared);
            if !st.queues.pending.is_empty() {
                drop(st);
                st = self.drained();
                continue;
            }
            let hs = st.handles.get(&handle.id).ok_or_else(|| unknown(handle))?;
            if let Some(why) = hs.value_lost(u64::MAX) {
                return Err(Error::aborted(format!("{handle} has no value: {why}")));
            }
            let mut taken = st.bring_home(&self.shared, handle)?;
            if taken.iter().all(Option::is_none) {
                return Ok(st);
            }
            if let Some(e) = taken
                .iter()
                .flatten()
                .find(|e| matches!(e, Error::DeviceLost { .. }))
            {
                lost = Some(e.clone());
            }
            // Work failed meanwhile: recover, then bring the value home again.
            st.poll_taken(&self.shared, &mut taken);
            drop(st);
            st = self.drained();
        }
        // A device that keeps failing is lost: say so, so that the caller can act on it.
        Err(lost.unwrap_or_else(|| {
            Error::aborted(format!(
                "{handle}: work kept failing while its value was brought home; see the errors of wait_all"
            ))
        }))
    }

    /// What it has done so far.
    pub fn stats(&self) -> SchedStats {
        self.lock().stats.clone()
    }

    /// Writes the performance models to their directory.
    pub fn save_models(&self) -> Result<()> {
        let st = self.lock();
        st.models
            .save()
            .map_err(|e| Error::backend_message("scheduler", e))
    }

    /// The predicted seconds of `codelet` on device `d` for `footprint` bytes, if its
    /// model is calibrated.
    pub fn predict(&self, codelet: &Codelet, d: usize, footprint: u64) -> Option<f64> {
        let arch = self.shared.archs.get(d)?;
        self.lock().models.predict(codelet.name(), arch, footprint)
    }

    /// Whether every task submitted from now on is timed to teach the performance models
    /// (on devices with event timing). Off by default: once a model is calibrated, only
    /// one task in 32 is, which keeps the cost of timing low but lets a model follow a
    /// device that changes speed (a straggler) only slowly. A caller that relies on the
    /// models tracking the devices (a trainer rebalancing its split) turns it on for the
    /// work it learns from. While it is on, a replayed graph runs task by task, each
    /// timed, instead of in fused runs ([`Scheduler::replay`]).
    pub fn time_every_task(&self, on: bool) {
        self.lock().time_every = on;
    }

    /// The predicted seconds of `task` on device `d` (its codelet's model at the task's
    /// footprint: the bytes of its distinct handles), if the model is calibrated.
    pub fn predict_task(&self, task: &Task, d: usize) -> Option<f64> {
        let mut seen: SmallVec<[u64; 8]> = SmallVec::new();
        let mut footprint = 0;
        for (h, _) in &task.accesses {
            if !seen.contains(&h.id) {
                seen.push(h.id);
                footprint += h.len;
            }
        }
        self.predict(&task.codelet, d, footprint)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let profile = {
            let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            for s in &st.streams {
                let _ = s.stream.synchronize();
            }
            let _ = st.models.save();
            st.profiling.take()
        };
        if let (Some(p), Some(path)) = (profile, self.profile_path.clone()) {
            let profile = finish_profile(self, p);
            // A drop cannot return the error: say it where the user asked for a file.
            if let Err(e) = write_trace(&profile, &path) {
                eprintln!("xpu: XPU_PROFILE: {e}");
            }
        }
    }
}

fn unknown(handle: Handle) -> Error {
    Error::invalid(format!(
        "{handle} is not registered with this scheduler (unregistered, or from another one)"
    ))
}

/// Checks the task's arguments against implementation `i` of its codelet, so that a
/// mismatch is an error of the submission rather than of the device.
fn check_arguments(task: &Task, accesses: &[(Handle, AccessMode)], i: usize) -> Result<()> {
    let label = task.label();
    match task.codelet.implementations().get(i) {
        Some(Implementation::Builtin(op))
            if accesses.len() != op.buffers() || !task.scalars.is_empty() =>
        {
            return Err(Error::invalid(format!(
                    "{label}: the builtin {op:?} takes {} distinct handles and no scalars; the task gives {} handles and {} scalars",
                    op.buffers(),
                    accesses.len(),
                    task.scalars.len()
                )));
        }
        Some(Implementation::Kernel { params, .. }) => {
            let want = accesses.len() + task.scalars.len();
            if params.len() != want {
                return Err(Error::invalid(format!(
                    "{label}: codelet `{}` declares {} parameters; the task gives {} distinct handles and {} scalars",
                    task.codelet.name(),
                    params.len(),
                    accesses.len(),
                    task.scalars.len()
                )));
            }
        }
        Some(Implementation::Op(op)) => {
            if !task.scalars.is_empty() {
                return Err(Error::invalid(format!(
                    "{label}: a standard operation takes no scalars; the task gives {}",
                    task.scalars.len()
                )));
            }
            crate::op::check_slots(&label, op, accesses)?;
        }
        Some(Implementation::Builtin(_)) | None => {}
    }
    Ok(())
}
