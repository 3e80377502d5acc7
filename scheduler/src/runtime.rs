//! The [`Scheduler`]: submission, placement, data movement and waiting.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xpu_collectives::{Communicator, ReduceOp};
use xpu_hal::{Allocation, DType, Device, Error, Event, HostBuffer, KernelArg, Result};

use crate::codelet::{Builtin, Codelet, Implementation};
use crate::data::{Handle, HandleState, Replica};
use crate::deps::AccessMode;
use crate::perfmodel::PerfModels;
use crate::policy::{Candidate, Policy};
use crate::profile::{MemorySample, Profile, Span, SpanKind};
use crate::stream::{wait_for, Point, StreamSlot};
use crate::task::{Task, TaskId};

/// A marker event is recorded on a device's task stream every this many tasks, so that
/// the scheduler learns how far each device has got without waiting for it.
const MARKER_EVERY: u32 = 8;
/// Tasks a device may have enqueued and not finished before its worker takes another
/// from the queues (queued policies): few enough that a fast device takes more of the
/// work, enough to keep it fed while the worker dispatches the next.
const DEPTH: u64 = 4;
/// How long an idle worker sleeps before it looks again (new work wakes it earlier).
const WORKER_NAP: Duration = Duration::from_millis(2);

/// A codelet is timed on every run until a footprint has this many samples, and on one
/// run in [`SAMPLE_EVERY`] after that (to notice when it changes).
const CALIBRATION_SAMPLES: u64 = 10;
/// See [`CALIBRATION_SAMPLES`].
const SAMPLE_EVERY: u64 = 32;
/// Assumed bytes per second of a copy to or from a device before any was measured.
const DEFAULT_BANDWIDTH: f64 = 8e9;
/// Copies smaller than this are not timed: their time is mostly latency.
const MIN_TIMED_COPY: u64 = 256 << 10;

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

/// A collective a [`Scheduler`] runs as a task ([`Scheduler::collective`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CollectiveTask {
    /// Every rank's receive handle becomes the reduction of all send handles (same
    /// size).
    AllReduce {
        /// Element type.
        dtype: DType,
        /// The reduction.
        op: ReduceOp,
    },
    /// Rank `r`'s receive handle becomes block `r` of the reduction of all send handles
    /// (each ranks × the receive handle's size).
    ReduceScatter {
        /// Element type.
        dtype: DType,
        /// The reduction.
        op: ReduceOp,
    },
    /// Every rank's receive handle (ranks × the send handle's size) becomes all send
    /// handles in rank order.
    AllGather,
}

impl CollectiveTask {
    fn name(&self) -> &'static str {
        match self {
            CollectiveTask::AllReduce { .. } => "all_reduce",
            CollectiveTask::ReduceScatter { .. } => "reduce_scatter",
            CollectiveTask::AllGather => "all_gather",
        }
    }

    fn sizes(&self) -> &'static str {
        match self {
            CollectiveTask::AllReduce { .. } => "an all-reduce needs both the same size",
            CollectiveTask::ReduceScatter { .. } => {
                "a reduce-scatter's send handle is ranks × its receive handle"
            }
            CollectiveTask::AllGather => {
                "an all-gather's receive handle is ranks × its send handle"
            }
        }
    }
}

/// What a scheduler has done so far, read at one instant (under its lock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Tasks submitted (including those that failed to start).
    pub tasks: u64,
    /// Tasks started on each device, in device order.
    pub placed: Vec<u64>,
    /// Copies that brought a handle to a device (from its home or a peer).
    pub fetches: u64,
    /// Copies of a handle back to its home.
    pub write_backs: u64,
    /// Bytes those copies moved.
    pub bytes_moved: u64,
    /// Replicas dropped to make room.
    pub evictions: u64,
}

/// A task's record while it may still be pending.
struct TaskRecord {
    label: String,
    point: Point,
    /// The points on other devices' streams of a collective task.
    extra: Vec<Point>,
    failed: Option<String>,
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
    /// Marker events on its task stream, oldest first, with the `seq` they cover.
    markers: VecDeque<(u64, Event)>,
    /// The highest `seq` of its task stream known to have completed.
    completed: u64,
    since_marker: u32,
    /// Bytes per second of copies to it, as measured (None: not yet).
    bandwidth: Option<f64>,
}

struct State {
    streams: Vec<StreamSlot>,
    handles: HashMap<u64, HandleState>,
    tasks: HashMap<u64, TaskRecord>,
    next_task: u64,
    devices: Vec<DeviceState>,
    models: PerfModels,
    measurements: Vec<Measurement>,
    /// Copies from homes so far.
    copies: u64,
    clock: u64,
    /// Asynchronous failures observed and not yet reported.
    errors: Vec<Error>,
    stats: SchedStats,
    profiling: Option<Profiling>,
    /// Bytes of replicas held per device.
    replica_bytes: Vec<u64>,
    queues: Queues,
    /// Set when the last handle to the scheduler is dropped: workers finish the queues
    /// and exit.
    shutdown: bool,
}

/// A task submitted under a queued policy and not dispatched yet.
struct Pending {
    task: Task,
    label: String,
    accesses: Vec<(Handle, AccessMode)>,
    deps: BTreeSet<u64>,
    /// Devices that can run it, with the implementation each runs.
    candidates: Vec<(usize, usize)>,
    footprint: u64,
    /// Dependencies not dispatched yet.
    remaining: usize,
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
}

struct Shared {
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

/// A device's worker under a queued policy: takes ready tasks it can run while the
/// device has room, until shut down with the queues empty.
fn worker(shared: &Shared, d: usize) {
    let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        st.poll(shared);
        let room = st.outstanding(d) < DEPTH;
        if room {
            if let Some(id) = st.pop_ready(shared.policy, d) {
                st.start_pending(shared, id, d);
                shared.work.notify_all();
                continue;
            }
        }
        if st.shutdown && st.queues.pending.is_empty() {
            break;
        }
        if room {
            st = match shared.work.wait_timeout(st, WORKER_NAP) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        } else {
            // Full: wait for the device to finish its oldest marked task.
            let oldest = st.devices[d].markers.front().map(|(_, e)| e.clone());
            drop(st);
            match oldest {
                Some(e) => {
                    let _ = e.wait_timeout(WORKER_NAP);
                }
                None => std::thread::sleep(WORKER_NAP),
            }
            st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
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

fn compute_stream(d: usize) -> usize {
    2 * d
}

fn copy_stream(d: usize) -> usize {
    2 * d + 1
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
        let mut streams = Vec::with_capacity(2 * n);
        for d in devices {
            streams.push(StreamSlot::new(d.create_stream()?, 2 * n));
            streams.push(StreamSlot::new(d.create_stream()?, 2 * n));
        }
        let dir = if options.no_persist {
            None
        } else {
            options
                .model_dir
                .clone()
                .or_else(crate::perfmodel::default_dir)
        };
        let archs = devices
            .iter()
            .map(|d| format!("{}/{}", d.backend(), d.name()))
            .collect();
        let mut sched = Scheduler {
            shared: Arc::new(Shared {
                devices: devices.to_vec(),
                archs,
                policy: options.policy,
                profile_path: options.profile.clone(),
                state: Mutex::new(State {
                    streams,
                    handles: HashMap::new(),
                    tasks: HashMap::new(),
                    next_task: 0,
                    devices: (0..n)
                        .map(|_| DeviceState {
                            busy_until: 0.0,
                            markers: VecDeque::new(),
                            completed: 0,
                            since_marker: 0,
                            bandwidth: None,
                        })
                        .collect(),
                    models: PerfModels::new(dir),
                    measurements: Vec::new(),
                    copies: 0,
                    clock: 0,
                    errors: Vec::new(),
                    stats: SchedStats {
                        placed: vec![0; n],
                        ..SchedStats::default()
                    },
                    profiling: None,
                    replica_bytes: vec![0; n],
                    queues: Queues {
                        local: (0..n).map(|_| VecDeque::new()).collect(),
                        ..Queues::default()
                    },
                    shutdown: false,
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
        if sched.shared.profile_path.is_some() {
            sched.start_profiling()?;
        }
        Ok(sched)
    }

    /// Starts recording a profile (see [`crate::profile`]): waits for the work already
    /// enqueued, then times every task and copy from here on. Restarts a profile that
    /// is being recorded.
    pub fn start_profiling(&self) -> Result<()> {
        let mut st = self.lock();
        let started = Instant::now();
        let mut origins = Vec::with_capacity(self.shared.devices.len());
        for (d, device) in self.shared.devices.iter().enumerate() {
            if !device.capabilities().event_timing {
                origins.push(None);
                continue;
            }
            for s in [copy_stream(d), compute_stream(d)] {
                st.streams[s].stream.synchronize()?;
            }
            let origin = st.streams[compute_stream(d)].stream.record_event()?;
            origin.wait()?;
            origins.push(Some((origin, started.elapsed().as_secs_f64())));
        }
        st.profiling = Some(Profiling {
            started,
            origins,
            spans: Vec::new(),
            memory: Vec::new(),
        });
        Ok(())
    }

    /// Stops profiling and returns the profile, once everything profiled has run.
    pub fn stop_profiling(&self) -> Result<Profile> {
        self.wait_all()?;
        let mut st = self.lock();
        let Some(p) = st.profiling.take() else {
            return Err(Error::invalid(
                "no profile is being recorded; call start_profiling first (or set XPU_PROFILE)",
            ));
        };
        Ok(finish_profile(&self.shared, p))
    }

    /// Stops profiling and writes the Chrome/Perfetto trace to `path`; returns the
    /// profile.
    pub fn write_profile(&self, path: &std::path::Path) -> Result<Profile> {
        let profile = self.stop_profiling()?;
        write_trace(&profile, path)?;
        Ok(profile)
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
    pub fn submit(&self, task: Task) -> Result<TaskId> {
        let mut st = self.lock();
        st.poll(&self.shared);
        let label = task.label();
        // Arguments: known handles, each once (merging modes).
        let mut accesses: Vec<(Handle, AccessMode)> = Vec::with_capacity(task.accesses.len());
        for (h, m) in &task.accesses {
            if !st.handles.contains_key(&h.id) {
                return Err(Error::invalid(format!(
                    "{label}: {h} is not registered with this scheduler (unregistered, or from another one)"
                )));
            }
            match accesses.iter_mut().find(|(a, _)| a.id == h.id) {
                Some((_, mode)) => *mode = mode.merge(*m),
                None => accesses.push((*h, *m)),
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
        let mut candidates: Vec<(usize, usize)> = Vec::new();
        for (d, device) in self.shared.devices.iter().enumerate() {
            if let Some(p) = &task.pinned {
                if p != device {
                    continue;
                }
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
        for (h, m) in &accesses {
            if let Some(hs) = st.handles.get_mut(&h.id) {
                hs.deps.access(id, *m, &mut deps);
            }
        }
        deps.extend(task.after.iter().map(|t| t.0));
        st.next_task += 1;
        st.stats.tasks += 1;
        // A task after a failed one fails too.
        if let Some((dep, why)) = deps.iter().find_map(|d| {
            st.tasks
                .get(d)
                .and_then(|t| t.failed.clone().map(|f| (*d, f)))
        }) {
            let message = format!("{label} depends on task {dep}, which failed: {why}");
            st.fail_task(id, &label, &accesses, message.clone());
            return Err(Error::aborted(message));
        }
        let footprint: u64 = accesses.iter().map(|(h, _)| h.len).sum();
        if self.shared.policy.queued() {
            st.enqueue(
                self.shared.devices.len(),
                Pending {
                    task,
                    label,
                    accesses,
                    deps,
                    candidates,
                    footprint,
                    remaining: 0,
                },
                id,
            );
            drop(st);
            self.shared.work.notify_all();
            return Ok(TaskId(id));
        }
        // Placement.
        let now = self.now();
        let chosen = if candidates.len() == 1 {
            candidates[0]
        } else {
            let infos: Vec<Candidate> = candidates
                .iter()
                .map(|&(d, _)| {
                    st.candidate(&self.shared, &task.codelet, d, &accesses, footprint, now)
                })
                .collect();
            candidates[self.shared.policy.choose(&infos)]
        };
        let pending = Pending {
            task,
            label,
            accesses,
            deps,
            candidates,
            footprint,
            remaining: 0,
        };
        st.start(&self.shared, id, &pending, chosen, now)
            .map(|()| TaskId(id))
    }

    /// A collective over one handle per rank of `comm`, as a task: rank `r`'s handles
    /// are `send[r]` (read) and `recv[r]` (written; the same handle as `send[r]` for an
    /// in-place operation), on rank `r`'s device, which must be one of the scheduler's.
    /// It waits for what wrote those handles, and what reads them after waits for it,
    /// like any task; the operation itself is enqueued on each rank's task stream, so
    /// it overlaps the work other devices do meanwhile. Under the queued policies the
    /// call first waits until every task submitted before it has been dispatched.
    pub fn collective(
        &self,
        comm: &Communicator,
        kind: CollectiveTask,
        send: &[Handle],
        recv: &[Handle],
    ) -> Result<TaskId> {
        let n = comm.size();
        let label = kind.name().to_string();
        if send.len() != n || recv.len() != n {
            return Err(Error::invalid(format!(
                "{label}: the communicator has {n} ranks but {} send and {} receive handles were given; give one of each per rank",
                send.len(),
                recv.len()
            )));
        }
        let mut ranks = Vec::with_capacity(n);
        for (r, device) in comm.devices().iter().enumerate() {
            let Some(d) = self.shared.devices.iter().position(|x| x == device) else {
                return Err(Error::invalid(format!(
                    "{label}: rank {r} is on {}, which is not one of this scheduler's devices",
                    device.id()
                )));
            };
            ranks.push(d);
        }
        for (r, (s, v)) in send.iter().zip(recv).enumerate() {
            let (bytes_s, bytes_r) = (s.len, v.len);
            let ok = match kind {
                CollectiveTask::AllReduce { .. } => bytes_s == bytes_r,
                CollectiveTask::ReduceScatter { .. } => bytes_s == bytes_r * n as u64,
                CollectiveTask::AllGather => bytes_r == bytes_s * n as u64,
            };
            if !ok {
                return Err(Error::invalid(format!(
                    "{label}: rank {r}'s send handle is {bytes_s} bytes and its receive handle {bytes_r}; {}",
                    kind.sizes()
                )));
            }
        }
        let mut st = self.drained();
        st.poll(&self.shared);
        let mut seen = BTreeSet::new();
        for h in send.iter().chain(recv) {
            if !st.handles.contains_key(&h.id) {
                return Err(Error::invalid(format!(
                    "{label}: {h} is not registered with this scheduler (unregistered, or from another one)"
                )));
            }
            seen.insert(h.id);
        }
        let distinct = send
            .iter()
            .zip(recv)
            .map(|(s, v)| if s.id == v.id { 1 } else { 2 })
            .sum::<usize>();
        if seen.len() != distinct {
            return Err(Error::invalid(format!(
                "{label}: a handle appears on two ranks; each rank needs handles of its own"
            )));
        }
        let id = st.next_task;
        st.next_task += 1;
        st.stats.tasks += 1;
        let mut deps = BTreeSet::new();
        let mut accesses = Vec::with_capacity(2 * n);
        for (s, v) in send.iter().zip(recv) {
            if s.id == v.id {
                accesses.push((*s, AccessMode::ReadWrite));
            } else {
                accesses.push((*s, AccessMode::Read));
                accesses.push((*v, AccessMode::Write));
            }
        }
        for (h, m) in &accesses {
            if let Some(hs) = st.handles.get_mut(&h.id) {
                hs.deps.access(id, *m, &mut deps);
            }
        }
        if let Some((dep, why)) = deps.iter().find_map(|d| {
            st.tasks
                .get(d)
                .and_then(|t| t.failed.clone().map(|f| (*d, f)))
        }) {
            let message = format!("{label} depends on task {dep}, which failed: {why}");
            st.fail_task(id, &label, &accesses, message.clone());
            return Err(Error::aborted(message));
        }
        match st.run_collective(
            &self.shared,
            comm,
            kind,
            id,
            &label,
            &ranks,
            send,
            recv,
            &deps,
        ) {
            Ok(()) => Ok(TaskId(id)),
            Err(e) => {
                st.fail_task(id, &label, &accesses, format!("{label} failed: {e}"));
                Err(e)
            }
        }
    }

    /// An in-place all-reduce of one handle per rank (see [`Scheduler::collective`]).
    pub fn all_reduce(
        &self,
        comm: &Communicator,
        handles: &[Handle],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<TaskId> {
        self.collective(
            comm,
            CollectiveTask::AllReduce { dtype, op },
            handles,
            handles,
        )
    }

    /// Waits until every task submitted so far has run; returns the first failure of any
    /// of them not yet reported (each is reported once).
    pub fn wait_all(&self) -> Result<()> {
        let (streams, seen): (Vec<xpu_hal::Stream>, Vec<u64>) = {
            let st = self.drained();
            (
                st.streams.iter().map(|s| s.stream.clone()).collect(),
                (0..st.devices.len())
                    .map(|d| st.streams[compute_stream(d)].seq)
                    .collect(),
            )
        };
        let mut first: Option<Error> = None;
        for s in &streams {
            if let Err(e) = s.synchronize() {
                first.get_or_insert(e);
            }
        }
        let mut st = self.lock();
        st.poll(&self.shared);
        // Everything submitted before the synchronizations has run.
        let now = self.now();
        for (i, slots) in streams.iter().enumerate().step_by(2) {
            let _ = slots;
            let d = i / 2;
            let done = st.streams[compute_stream(d)].seq.min(seen[d]);
            let dev = &mut st.devices[d];
            dev.completed = dev.completed.max(done);
            if dev.completed >= st.streams[compute_stream(d)].seq {
                st.devices[d].busy_until = now;
            }
        }
        st.poll(&self.shared);
        if let Some(e) = first {
            st.errors.push(e);
        }
        if st.errors.is_empty() {
            Ok(())
        } else {
            Err(st.errors.remove(0))
        }
    }

    /// Waits until `task` has run.
    pub fn wait(&self, task: TaskId) -> Result<()> {
        let event = {
            let mut st = self.lock();
            while st.queues.pending.contains_key(&task.0) {
                st = match self.shared.work.wait_timeout(st, WORKER_NAP) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
            let Some(rec) = st.tasks.get(&task.0) else {
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
            let mut events = Vec::with_capacity(points.len());
            for p in points {
                events.push(st.streams[p.stream].event_covering(p.seq)?);
            }
            events
        };
        for e in event {
            e.wait()?;
        }
        Ok(())
    }

    /// The handle's current value, once every task submitted so far that writes it has
    /// run.
    pub fn read(&self, handle: Handle) -> Result<Vec<u8>> {
        let mut st = self.drained();
        st.bring_home(&self.shared, handle)?;
        let hs = st
            .handles
            .get_mut(&handle.id)
            .ok_or_else(|| unknown(handle))?;
        let bytes = hs.home.buffer.as_slice()?.to_vec();
        Ok(bytes)
    }

    /// Gives `handle`'s home buffer back with the handle's current value, once every
    /// task submitted so far that uses it has run; the handle can no longer be used.
    pub fn unregister(&self, handle: Handle) -> Result<HostBuffer> {
        let mut st = self.drained();
        st.bring_home(&self.shared, handle)?;
        let hs = st
            .handles
            .remove(&handle.id)
            .ok_or_else(|| unknown(handle))?;
        Ok(hs.home.buffer)
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

/// Reads the profiled events (the work has run) into a [`Profile`].
fn finish_profile(shared: &Shared, p: Profiling) -> Profile {
    let mut spans = Vec::with_capacity(p.spans.len());
    let mut length: f64 = 0.0;
    for span in p.spans {
        let Some(Some((origin, zero))) = p.origins.get(span.device) else {
            continue;
        };
        let (Ok(a), Ok(b)) = (
            span.start.elapsed_since(origin),
            span.end.elapsed_since(origin),
        ) else {
            continue;
        };
        let (start, end) = (zero + a.as_secs_f64(), zero + b.as_secs_f64());
        length = length.max(end);
        spans.push(Span {
            kind: span.kind,
            name: span.name,
            task: span.task,
            device: span.device,
            stream: span.stream,
            start,
            end,
            bytes: span.bytes,
            deps: span.deps,
        });
    }
    Profile {
        devices: shared.devices.iter().map(|d| d.id().to_string()).collect(),
        timed: p.origins.iter().map(Option::is_some).collect(),
        spans,
        memory: p.memory,
        length,
    }
}

/// Writes `profile`'s trace to `path`.
fn write_trace(profile: &Profile, path: &std::path::Path) -> Result<()> {
    let text = serde_json::to_string(&profile.to_chrome_json())
        .map_err(|e| Error::backend_message("scheduler", e.to_string()))?;
    std::fs::write(path, text).map_err(|e| {
        Error::invalid(format!(
            "could not write the profile to {}: {e}",
            path.display()
        ))
    })
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
        Some(Implementation::Builtin(_)) | None => {}
    }
    Ok(())
}

impl State {
    /// Learns how far devices have got and collects finished timings.
    fn poll(&mut self, shared: &Shared) {
        for d in 0..self.devices.len() {
            while let Some((seq, e)) = self.devices[d].markers.front() {
                match e.query() {
                    Ok(true) => {
                        let seq = *seq;
                        self.devices[d].completed = seq;
                        self.devices[d].markers.pop_front();
                    }
                    Ok(false) => break,
                    Err(err) => {
                        self.errors.push(err);
                        self.devices[d].markers.pop_front();
                    }
                }
            }
        }
        let mut pending = Vec::new();
        for m in std::mem::take(&mut self.measurements) {
            match m.end.query() {
                Ok(true) => {
                    let Ok(t) = m.end.elapsed_since(&m.start) else {
                        continue;
                    };
                    let t = t.as_secs_f64();
                    match m.what {
                        Timed::Task {
                            codelet,
                            arch,
                            footprint,
                        } => self.models.record(&codelet, &arch, footprint, t),
                        Timed::Copy { device, bytes } if t > 0.0 => {
                            let measured = bytes as f64 / t;
                            let bw = &mut self.devices[device].bandwidth;
                            // A running average that follows changes within a few copies.
                            *bw = Some(bw.map_or(measured, |b| 0.75 * b + 0.25 * measured));
                        }
                        Timed::Copy { .. } => {}
                    }
                }
                Ok(false) => pending.push(m),
                Err(_) => {}
            }
        }
        self.measurements = pending;
        // Forget tasks every device has passed (failed ones stay: dependants must
        // learn of the failure).
        let completed: Vec<u64> = self.devices.iter().map(|d| d.completed).collect();
        let before = self.tasks.len();
        self.tasks.retain(|_, t| {
            t.failed.is_some()
                || t.points()
                    .any(|p| p.seq > completed.get(p.stream / 2).copied().unwrap_or(0))
        });
        if self.tasks.len() != before {
            // Done: neither waiting in the queues nor possibly still running.
            let (tasks, pending) = (&self.tasks, &self.queues.pending);
            for h in self.handles.values_mut() {
                h.deps
                    .prune(|t| !tasks.contains_key(&t) && !pending.contains_key(&t));
            }
        }
        let _ = shared;
    }

    /// What the policy sees of device `d` for a task.
    fn candidate(
        &mut self,
        shared: &Shared,
        codelet: &Codelet,
        d: usize,
        accesses: &[(Handle, AccessMode)],
        footprint: u64,
        now: f64,
    ) -> Candidate {
        let arch = &shared.archs[d];
        let exec = self.models.predict(codelet.name(), arch, footprint);
        let samples = self.models.samples(codelet.name(), arch);
        let bandwidth = self.devices[d].bandwidth.unwrap_or(DEFAULT_BANDWIDTH);
        let transfer: f64 = accesses
            .iter()
            .filter(|(_, m)| m.reads())
            .filter_map(|(h, _)| self.handles.get(&h.id))
            .filter(|hs| !hs.replicas[d].as_ref().is_some_and(|r| r.valid))
            .map(|hs| hs.handle.len as f64 / bandwidth)
            .sum();
        let dev = &self.devices[d];
        let queued = self.streams[compute_stream(d)]
            .seq
            .saturating_sub(dev.completed);
        Candidate {
            device: d,
            queued,
            free_in: (dev.busy_until - now).max(0.0),
            exec,
            samples,
            transfer,
        }
    }

    /// Enqueues collective task `id`: every rank's data on its device, its stream behind
    /// the points it depends on, then the ranks' calls made together (each rank's call
    /// returns once all have arrived), each from a thread of its own.
    #[allow(clippy::too_many_arguments)]
    fn run_collective(
        &mut self,
        shared: &Shared,
        comm: &Communicator,
        kind: CollectiveTask,
        id: u64,
        label: &str,
        ranks: &[usize],
        send: &[Handle],
        recv: &[Handle],
        deps: &BTreeSet<u64>,
    ) -> Result<()> {
        let dep_points: Vec<Point> = deps
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .flat_map(TaskRecord::points)
            .collect();
        let mut memory = Vec::with_capacity(ranks.len());
        for (r, &d) in ranks.iter().enumerate() {
            let s = compute_stream(d);
            let m_send = self.replica(shared, send[r], d)?;
            if let Some(p) = self.fetch(shared, send[r], d, &m_send)? {
                wait_for(&mut self.streams, s, p)?;
            }
            let m_recv = if recv[r].id == send[r].id {
                m_send.clone()
            } else {
                self.replica(shared, recv[r], d)?
            };
            for p in &dep_points {
                wait_for(&mut self.streams, s, *p)?;
            }
            memory.push((m_send, m_recv, self.streams[s].stream.clone()));
        }
        let call = |r: usize| -> Result<()> {
            let (send, recv, stream) = &memory[r];
            let rank = comm.rank(r)?;
            match kind {
                CollectiveTask::AllReduce { dtype, op } => {
                    rank.all_reduce(send, recv, dtype, op, stream)
                }
                CollectiveTask::ReduceScatter { dtype, op } => {
                    rank.reduce_scatter(send, recv, dtype, op, stream)
                }
                CollectiveTask::AllGather => rank.all_gather(send, recv, stream),
            }
        };
        let outcomes: Vec<Result<()>> = std::thread::scope(|scope| {
            let others: Vec<_> = (1..ranks.len())
                .map(|r| scope.spawn(move || call(r)))
                .collect();
            let mut all = vec![call(0)];
            for h in others {
                all.push(h.join().unwrap_or_else(|_| {
                    Err(Error::aborted("a rank's thread of the collective panicked"))
                }));
            }
            all
        });
        if let Some(Err(e)) = outcomes.into_iter().find(Result::is_err) {
            comm.abort();
            return Err(e);
        }
        let mut points = Vec::with_capacity(ranks.len());
        for (r, &d) in ranks.iter().enumerate() {
            let s = compute_stream(d);
            let point = self.streams[s].advance(s);
            if let Some(h) = self.handles.get_mut(&recv[r].id) {
                h.written(d, point);
            }
            self.stats.placed[d] += 1;
            points.push(point);
        }
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.to_string(),
                point: points[0],
                extra: points[1..].to_vec(),
                failed: None,
            },
        );
        Ok(())
    }

    /// Tasks enqueued on device `d`'s task stream and not known to have finished.
    fn outstanding(&self, d: usize) -> u64 {
        self.streams[compute_stream(d)]
            .seq
            .saturating_sub(self.devices[d].completed)
    }

    /// Queues task `id` (queued policies): ready at once if everything it depends on
    /// has been dispatched, else when the last of those is.
    fn enqueue(&mut self, devices: usize, mut pending: Pending, id: u64) {
        let mut remaining = 0;
        for dep in &pending.deps {
            if self.queues.pending.contains_key(dep) {
                remaining += 1;
                self.queues.successors.entry(*dep).or_default().push(id);
            }
        }
        pending.remaining = remaining;
        let first = pending.candidates.first().map_or(0, |c| c.0);
        let can = pending.candidates.iter().map(|c| c.0).collect::<Vec<_>>();
        self.queues.pending.insert(id, pending);
        if remaining == 0 {
            // A submission has no device of its own: spread over the candidates.
            let start = self.queues.next;
            self.queues.next = (start + 1) % devices.max(1);
            let home = (0..devices)
                .map(|k| (start + k) % devices)
                .find(|d| can.contains(d))
                .unwrap_or(first);
            self.make_ready(id, home);
        }
    }

    /// Puts a ready task in the queue its policy uses (`near`: the device whose work
    /// made it ready, for `ws`).
    fn make_ready(&mut self, id: u64, near: usize) {
        self.queues.central.push_back(id);
        let runs_near = self
            .queues
            .pending
            .get(&id)
            .is_some_and(|p| p.candidates.iter().any(|c| c.0 == near));
        let at = if runs_near {
            near
        } else {
            self.queues
                .pending
                .get(&id)
                .and_then(|p| p.candidates.first())
                .map_or(near, |c| c.0)
        };
        if let Some(q) = self.queues.local.get_mut(at) {
            q.push_back(id);
        }
    }

    /// The next ready task device `d` takes under `policy`, removed from the queues.
    fn pop_ready(&mut self, policy: Policy, d: usize) -> Option<u64> {
        let runs = |q: &Queues, id: &u64| {
            q.pending
                .get(id)
                .is_some_and(|p| p.candidates.iter().any(|c| c.0 == d))
        };
        let id = match policy {
            Policy::Ws => {
                // Its own newest first, then the oldest of the most loaded other deque.
                let own = self.queues.local[d]
                    .iter()
                    .rposition(|id| runs(&self.queues, id))
                    .and_then(|i| self.queues.local[d].remove(i));
                own.or_else(|| {
                    let mut victims: Vec<usize> = (0..self.queues.local.len())
                        .filter(|&v| v != d && !self.queues.local[v].is_empty())
                        .collect();
                    victims.sort_by_key(|&v| std::cmp::Reverse(self.queues.local[v].len()));
                    victims.into_iter().find_map(|v| {
                        let i = self.queues.local[v]
                            .iter()
                            .position(|id| runs(&self.queues, id))?;
                        self.queues.local[v].remove(i)
                    })
                })?
            }
            _ => {
                let i = self
                    .queues
                    .central
                    .iter()
                    .position(|id| runs(&self.queues, id))?;
                self.queues.central.remove(i)?
            }
        };
        // Out of the other policy's queue too.
        if let Some(i) = self.queues.central.iter().position(|x| *x == id) {
            self.queues.central.remove(i);
        }
        for q in &mut self.queues.local {
            if let Some(i) = q.iter().position(|x| *x == id) {
                q.remove(i);
            }
        }
        Some(id)
    }

    /// Dispatches queued task `id` on device `d` and releases what waited for it.
    fn start_pending(&mut self, shared: &Shared, id: u64, d: usize) {
        let Some(pending) = self.queues.pending.remove(&id) else {
            return;
        };
        let chosen = pending
            .candidates
            .iter()
            .copied()
            .find(|c| c.0 == d)
            .unwrap_or((d, 0));
        let failed_dep = pending.deps.iter().find_map(|dep| {
            self.tasks
                .get(dep)
                .and_then(|t| t.failed.clone().map(|f| (*dep, f)))
        });
        let outcome = match failed_dep {
            Some((dep, why)) => {
                let message = format!(
                    "{} depends on task {dep}, which failed: {why}",
                    pending.label
                );
                self.fail_task(id, &pending.label, &pending.accesses, message.clone());
                Err(Error::aborted(message))
            }
            None => {
                let now = shared.epoch.elapsed().as_secs_f64();
                self.start(shared, id, &pending, chosen, now)
            }
        };
        if let Err(e) = outcome {
            // Reported at the next wait; dependants fail when they are dispatched.
            self.errors.push(e);
        }
        for s in self.queues.successors.remove(&id).unwrap_or_default() {
            let ready = match self.queues.pending.get_mut(&s) {
                Some(p) => {
                    p.remaining = p.remaining.saturating_sub(1);
                    p.remaining == 0
                }
                None => false,
            };
            if ready {
                self.make_ready(s, d);
            }
        }
    }

    /// Dispatches task `id` on `chosen`, or — when that device's memory cannot hold the
    /// task's data even after eviction — on the next candidates in turn. A task that
    /// cannot start anywhere is recorded as failed (its dependants fail too).
    fn start(
        &mut self,
        shared: &Shared,
        id: u64,
        p: &Pending,
        chosen: (usize, usize),
        now: f64,
    ) -> Result<()> {
        let mut order = vec![chosen];
        order.extend(p.candidates.iter().copied().filter(|c| *c != chosen));
        let mut last = None;
        for (d, implementation) in order {
            match self.dispatch(
                shared,
                &p.task,
                id,
                &p.label,
                d,
                implementation,
                &p.accesses,
                &p.deps,
                p.footprint,
                now,
            ) {
                Ok(()) => return Ok(()),
                Err(e @ Error::OutOfMemory { .. }) => last = Some((d, e)),
                Err(e) => {
                    last = Some((d, e));
                    break;
                }
            }
        }
        let (d, e) = last.unwrap_or((
            chosen.0,
            Error::invalid(format!("{}: no device to run on", p.label)),
        ));
        let message = format!(
            "{} could not be started on {}: {e}",
            p.label,
            shared.devices[d].id()
        );
        self.fail_task(id, &p.label, &p.accesses, message);
        Err(e)
    }

    /// When profiling device `d`: an event on stream `s` before a copy.
    fn profiling_start(&mut self, d: usize, s: usize) -> Result<Option<Event>> {
        let timed = self
            .profiling
            .as_ref()
            .is_some_and(|p| p.origins.get(d).is_some_and(Option::is_some));
        if timed {
            Ok(Some(self.streams[s].stream.record_event()?))
        } else {
            Ok(None)
        }
    }

    /// Closes a copy's span begun by [`State::profiling_start`]; returns the end event.
    fn profiling_end(
        &mut self,
        start: Option<Event>,
        kind: SpanKind,
        handle: u64,
        d: usize,
        s: usize,
        bytes: u64,
    ) -> Result<Option<Event>> {
        let Some(start) = start else {
            return Ok(None);
        };
        let end = self.streams[s].stream.record_event()?;
        if let Some(p) = &mut self.profiling {
            p.spans.push(PendingSpan {
                kind,
                name: format!("handle {handle}"),
                task: None,
                device: d,
                stream: usize::from(s == copy_stream(d)),
                bytes,
                deps: Vec::new(),
                start,
                end: end.clone(),
            });
        }
        Ok(Some(end))
    }

    /// Notes a change of the replica bytes held on device `d`.
    fn replica_bytes_changed(&mut self, d: usize, added: u64, removed: u64) {
        let held = &mut self.replica_bytes[d];
        *held = held.saturating_add(added).saturating_sub(removed);
        let bytes = *held;
        if let Some(p) = &mut self.profiling {
            p.memory.push(MemorySample {
                device: d,
                at: p.started.elapsed().as_secs_f64(),
                bytes,
            });
        }
    }

    /// Records a task that could not run, so that its dependants fail too.
    fn fail_task(
        &mut self,
        id: u64,
        label: &str,
        accesses: &[(Handle, AccessMode)],
        message: String,
    ) {
        let _ = accesses;
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.to_string(),
                point: Point { stream: 0, seq: 0 },
                extra: Vec::new(),
                failed: Some(message),
            },
        );
    }

    /// A replica of `handle` on device `d`, allocated if missing.
    fn replica(&mut self, shared: &Shared, handle: Handle, d: usize) -> Result<Allocation> {
        self.clock += 1;
        let clock = self.clock;
        if let Some(Some(r)) = self.handles.get_mut(&handle.id).map(|h| &mut h.replicas[d]) {
            r.last_use = clock;
            return Ok(r.memory.clone());
        }
        let device = &shared.devices[d];
        let memory = match device.allocate(handle.len) {
            Ok(m) => m,
            Err(Error::OutOfMemory { .. }) => {
                self.evict(shared, d, handle.len, handle)?;
                match device.allocate(handle.len) {
                    Ok(m) => m,
                    Err(Error::OutOfMemory { .. }) => {
                        // Evicted replicas are freed once the work queued on them has
                        // run: wait for the device, then try again.
                        for s in [compute_stream(d), copy_stream(d)] {
                            if let Err(e) = self.streams[s].stream.synchronize() {
                                self.errors.push(e);
                            }
                        }
                        device.allocate(handle.len)?
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if let Some(h) = self.handles.get_mut(&handle.id) {
            h.replicas[d] = Some(Replica {
                memory: memory.clone(),
                valid: false,
                ready: None,
                last_use: clock,
            });
        }
        self.replica_bytes_changed(d, handle.len, 0);
        Ok(memory)
    }

    /// Frees at least `need` bytes of replicas on device `d` (never `keep`'s), least
    /// recently used first; a replica that holds the only valid copy is written back to
    /// its home first.
    fn evict(&mut self, shared: &Shared, d: usize, need: u64, keep: Handle) -> Result<()> {
        let mut victims: Vec<(u64, u64)> = self
            .handles
            .values()
            .filter(|h| h.handle.id != keep.id)
            .filter_map(|h| h.replicas[d].as_ref().map(|r| (r.last_use, h.handle.id)))
            .collect();
        victims.sort_unstable();
        let mut freed = 0;
        for (_, id) in victims {
            if freed >= need {
                break;
            }
            let sole = self.handles.get(&id).is_some_and(|h| {
                h.replicas[d].as_ref().is_some_and(|r| r.valid)
                    && !h.home.valid
                    && h.valid_on().all(|e| e == d)
            });
            if sole {
                self.write_home(shared, id, d)?;
            }
            if let Some(h) = self.handles.get_mut(&id) {
                if let Some(r) = h.replicas[d].take() {
                    freed += r.memory.size();
                    self.stats.evictions += 1;
                    let size = r.memory.size();
                    self.replica_bytes_changed(d, 0, size);
                }
            }
        }
        if freed < need {
            return Err(Error::OutOfMemory {
                device: shared.devices[d].id().to_string(),
                requested: need,
                free: freed,
                capacity: shared.devices[d].info().memory_bytes,
                hint: "the handles one task uses do not fit the device together; use smaller handles or a device with more memory".to_string(),
            });
        }
        Ok(())
    }

    /// Copies device `d`'s replica of handle `id` to its home (which becomes valid).
    fn write_home(&mut self, shared: &Shared, id: u64, d: usize) -> Result<()> {
        let s = copy_stream(d);
        let (memory, ready) = match self.handles.get(&id).and_then(|h| h.replicas[d].as_ref()) {
            Some(r) => (r.memory.clone(), r.ready),
            None => return Ok(()),
        };
        if let Some(p) = ready {
            wait_for(&mut self.streams, s, p)?;
        }
        let profiled = self.profiling_start(d, s)?;
        let Some(h) = self.handles.get_mut(&id) else {
            return Ok(());
        };
        self.streams[s]
            .stream
            .copy_to_host(&memory, &h.home.buffer, 0)?;
        let point = self.streams[s].advance(s);
        self.profiling_end(profiled, SpanKind::WriteBack, id, d, s, memory.size())?;
        let Some(h) = self.handles.get_mut(&id) else {
            return Ok(());
        };
        h.home.valid = true;
        h.home.ready = Some(point);
        self.stats.write_backs += 1;
        self.stats.bytes_moved += memory.size();
        let _ = shared;
        Ok(())
    }

    /// Makes device `d`'s replica of `handle` valid, copying from the cheapest valid
    /// copy; returns the point after which it is.
    fn fetch(
        &mut self,
        shared: &Shared,
        handle: Handle,
        d: usize,
        dst: &Allocation,
    ) -> Result<Option<Point>> {
        let Some(h) = self.handles.get(&handle.id) else {
            return Err(unknown(handle));
        };
        if let Some(r) = &h.replicas[d] {
            if r.valid {
                return Ok(r.ready);
            }
        }
        let s = copy_stream(d);
        // A peer copy from a device of the same backend that allows it.
        let device = &shared.devices[d];
        let peer = h.valid_on().find(|&e| {
            let other = &shared.devices[e];
            other.backend() == device.backend()
                && device.capabilities().peer_access
                && other.capabilities().peer_access
        });
        let point = if let Some(e) = peer {
            let (src, ready) = match &h.replicas[e] {
                Some(r) => (r.memory.clone(), r.ready),
                None => return Err(unknown(handle)),
            };
            if let Some(p) = ready {
                wait_for(&mut self.streams, s, p)?;
            }
            let profiled = self.profiling_start(d, s)?;
            self.streams[s].stream.copy_peer(&src, dst)?;
            let point = self.streams[s].advance(s);
            self.profiling_end(profiled, SpanKind::Fetch, handle.id, d, s, handle.len)?;
            point
        } else {
            if !h.home.valid {
                let Some(e) = h.valid_on().next() else {
                    return Err(Error::invalid(format!(
                        "{handle} has no valid copy anywhere; this is a scheduler bug"
                    )));
                };
                self.write_home(shared, handle.id, e)?;
            }
            let Some(h) = self.handles.get(&handle.id) else {
                return Err(unknown(handle));
            };
            if let Some(p) = h.home.ready {
                wait_for(&mut self.streams, s, p)?;
            }
            // Copies from the home are timed now and then, to learn the bandwidth.
            self.copies += 1;
            let timed = shared.devices[d].capabilities().event_timing
                && handle.len >= MIN_TIMED_COPY
                && (self.devices[d].bandwidth.is_none()
                    || self.copies.is_multiple_of(SAMPLE_EVERY));
            let profiled = self.profiling_start(d, s)?;
            let start = match (&profiled, timed) {
                (Some(e), _) => Some(e.clone()),
                (None, true) => Some(self.streams[s].stream.record_event()?),
                (None, false) => None,
            };
            let Some(h) = self.handles.get(&handle.id) else {
                return Err(unknown(handle));
            };
            self.streams[s]
                .stream
                .copy_from_host(&h.home.buffer, 0, dst)?;
            let profiled_end =
                self.profiling_end(profiled, SpanKind::Fetch, handle.id, d, s, handle.len)?;
            if let Some(start) = start {
                let end = match profiled_end {
                    Some(e) => e,
                    None => self.streams[s].stream.record_event()?,
                };
                self.measurements.push(Measurement {
                    what: Timed::Copy {
                        device: d,
                        bytes: handle.len,
                    },
                    start,
                    end,
                });
            }
            self.streams[s].advance(s)
        };
        if let Some(h) = self.handles.get_mut(&handle.id) {
            if let Some(r) = &mut h.replicas[d] {
                r.valid = true;
                r.ready = Some(point);
            }
        }
        self.stats.fetches += 1;
        self.stats.bytes_moved += handle.len;
        Ok(Some(point))
    }

    /// Makes the home of `handle` valid and waits until every task submitted so far that
    /// uses it has run.
    fn bring_home(&mut self, shared: &Shared, handle: Handle) -> Result<()> {
        let Some(h) = self.handles.get(&handle.id) else {
            return Err(unknown(handle));
        };
        let source = if h.home.valid {
            None
        } else {
            h.valid_on().next()
        };
        if let Some(e) = source {
            self.write_home(shared, handle.id, e)?;
        }
        // Every stream, so that every copy and task that used the home has also let go
        // of it (the lock keeps new work out meanwhile).
        let mut first = None;
        for slot in &self.streams {
            if let Err(e) = slot.stream.synchronize() {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Enqueues task `id` on device `d`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        shared: &Shared,
        task: &Task,
        id: u64,
        label: &str,
        d: usize,
        implementation: usize,
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
        footprint: u64,
        now: f64,
    ) -> Result<()> {
        let s = compute_stream(d);
        // Data: a replica of every handle on the device, valid for those it reads.
        let mut memories = Vec::with_capacity(accesses.len());
        for (h, m) in accesses {
            let memory = self.replica(shared, *h, d)?;
            if m.reads() {
                if let Some(p) = self.fetch(shared, *h, d, &memory)? {
                    wait_for(&mut self.streams, s, p)?;
                }
            }
            memories.push(memory);
        }
        // Dependencies on other streams.
        let dep_points: Vec<Point> = deps
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .flat_map(TaskRecord::points)
            .collect();
        for p in dep_points {
            wait_for(&mut self.streams, s, p)?;
        }
        // Timing, while the model learns (and now and then after).
        let arch = &shared.archs[d];
        let profiled = self
            .profiling
            .as_ref()
            .is_some_and(|p| p.origins.get(d).is_some_and(Option::is_some));
        let timed = profiled
            || shared.devices[d].capabilities().event_timing && {
                let samples = self
                    .models
                    .get(task.codelet.name())
                    .archs
                    .get(arch)
                    .and_then(|a| a.history.get(&footprint))
                    .map_or(0, |h| h.count);
                samples < CALIBRATION_SAMPLES || id.is_multiple_of(SAMPLE_EVERY)
            };
        let start = if timed {
            Some(self.streams[s].stream.record_event()?)
        } else {
            None
        };
        // The work.
        let stream = &self.streams[s].stream;
        match &task.codelet.implementations()[implementation] {
            Implementation::Builtin(op) => {
                let m = &memories;
                match *op {
                    Builtin::Fill { value } => stream.fill(&m[0], value)?,
                    Builtin::Binary { op, dtype } => {
                        stream.binary(op, dtype, &m[0], &m[1], &m[2])?
                    }
                    Builtin::Accumulate { op, dtype } => {
                        stream.accumulate(op, dtype, &m[0], &m[1])?
                    }
                    Builtin::Scale { alpha } => stream.scale(&m[0], &m[1], alpha)?,
                    Builtin::Cast { from, to } => stream.cast(&m[0], from, &m[1], to)?,
                }
            }
            Implementation::Kernel { dims, .. } => {
                let kernel = task
                    .codelet
                    .kernel(&shared.devices[d], implementation)?
                    .ok_or_else(|| Error::invalid(format!("{label}: no kernel")))?;
                let sizes: Vec<u64> = accesses.iter().map(|(h, _)| h.len).collect();
                let mut args: Vec<KernelArg<'_>> = memories
                    .iter()
                    .map(|m| KernelArg::Buffer(m.whole()))
                    .collect();
                args.extend(task.scalars.iter().map(|v| KernelArg::Scalar(*v)));
                stream.launch(&kernel, dims(&sizes), &args)?;
            }
        }
        let point = self.streams[s].advance(s);
        if let Some(start) = start {
            let end = self.streams[s].stream.record_event()?;
            if let (true, Some(p)) = (profiled, &mut self.profiling) {
                p.spans.push(PendingSpan {
                    kind: SpanKind::Task,
                    name: label.to_string(),
                    task: Some(id),
                    device: d,
                    stream: 0,
                    bytes: footprint,
                    deps: deps.iter().copied().collect(),
                    start: start.clone(),
                    end: end.clone(),
                });
            }
            self.measurements.push(Measurement {
                what: Timed::Task {
                    codelet: task.codelet.name().to_string(),
                    arch: arch.clone(),
                    footprint,
                },
                start,
                end,
            });
        }
        // The data it wrote is valid there only.
        for (h, m) in accesses {
            if m.writes() {
                if let Some(hs) = self.handles.get_mut(&h.id) {
                    hs.written(d, point);
                }
            }
        }
        // Bookkeeping for placement.
        let predicted = self
            .models
            .predict(task.codelet.name(), arch, footprint)
            .unwrap_or(0.0);
        let dev = &mut self.devices[d];
        dev.busy_until = dev.busy_until.max(now) + predicted;
        dev.since_marker += 1;
        if dev.since_marker >= MARKER_EVERY || shared.policy.queued() {
            dev.since_marker = 0;
            let e = self.streams[s].event_at_end()?;
            self.devices[d].markers.push_back((point.seq, e));
        }
        self.tasks.insert(
            id,
            TaskRecord {
                label: label.to_string(),
                point,
                extra: Vec::new(),
                failed: None,
            },
        );
        self.stats.placed[d] += 1;
        Ok(())
    }
}
