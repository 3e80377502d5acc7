//! Graphs recorded once and replayed many times, and static placement of a recorded
//! graph by a list-scheduling policy (HEFT and its kin).
//!
//! A training step submits the same tasks every iteration. [`Scheduler::record`] runs a
//! sequence of submissions and keeps it as a [`Graph`]: each task with its accesses
//! already merged, the device it ran on, and its dependencies on the other tasks of the
//! graph. [`Scheduler::replay`] submits the graph again with that work done: no
//! validation beyond the handles still being registered, no placement, and dependency
//! inference only for each handle's first access in the graph (the accesses after it
//! just move the handle's state on, [`crate::deps::HandleDeps::advance`]). Dependencies
//! on tasks submitted before the replay come from those first accesses, so replays
//! order correctly after whatever came before them, including the previous replay.
//!
//! Consecutive tasks placed on one device replay as one task, a *run* (as a CUDA graph
//! launches as one unit): the run's accesses are its items' merged, so it costs one
//! dependency analysis, one set of replicas and fetches and one event. Its items'
//! operations are validated once per device into an [`xpu_hal::KeptBatch`] over the
//! run's handles, and each replay binds the replicas of the time to it: one submission
//! to the stream whose cost does not grow with the run. A run is recorded under its first
//! item's id; the ids of its other items name it (waiting for one waits for the run, a
//! task ordered after one runs after the run). A failure inside a run fails the run and
//! so every item of it, with a message naming the run and the cause; a run that did not
//! start because of another failure runs again whole. A run's handles must fit in half
//! its device's memory together (longer stretches are cut into several runs), and while
//! a profile is recorded ([`Scheduler::start_profiling`]; not
//! [`Scheduler::start_profiling_runs`]) or every task is timed
//! ([`Scheduler::time_every_task`]) every item replays on its own, to have its span or
//! its timing.
//!
//! [`Scheduler::plan`] turns a recorded graph into a [`crate::sim::CostGraph`] — the
//! tasks' predicted times on each device from the performance models, the bytes each
//! dependency carries over the measured copy bandwidth into each device plus a fixed
//! hand-off per crossing — schedules it
//! with a [`crate::sim::Policy`] (HEFT by default), and returns the graph with that
//! placement, ready to replay. Record under `dmda` first so that the models know the
//! tasks.
//!
//! A recorded graph keeps only the explicit dependencies among its own tasks; order it
//! after earlier work through data, or wait for that work before replaying.

use std::ops::Range;
use std::sync::OnceLock;

use rustc_hash::FxHashMap as HashMap;

use super::*;
use crate::sim;

/// One recorded submission.
#[derive(Clone)]
pub(super) enum Item {
    Task {
        pending: Arc<Pending>,
        /// Where it ran (set when dispatched).
        placed: Option<(usize, usize)>,
        /// Indices of the items it depends on.
        internal: Vec<u32>,
        /// Per access: whether it is the graph's first access to that handle.
        entry: Vec<bool>,
    },
    Collective {
        comm: Communicator,
        kind: CollectiveTask,
        send: Vec<Handle>,
        recv: Vec<Handle>,
        ranks: Vec<usize>,
        accesses: Vec<(Handle, AccessMode)>,
        internal: Vec<u32>,
        entry: Vec<bool>,
    },
}

impl Item {
    fn accesses(&self) -> &[(Handle, AccessMode)] {
        match self {
            Item::Task { pending, .. } => &pending.accesses,
            Item::Collective { accesses, .. } => accesses,
        }
    }
}

/// A recording in progress.
pub(super) struct Recording {
    first: u64,
    items: Vec<Item>,
    /// Task id → item index.
    index: HashMap<u64, usize>,
}

impl Recording {
    /// An empty recording whose first task will be `first`.
    pub(super) fn new(first: u64) -> Recording {
        Recording {
            first,
            items: Vec::new(),
            index: HashMap::default(),
        }
    }

    /// What it recorded.
    pub(super) fn into_items(self) -> Vec<Item> {
        self.items
    }

    fn internal(&self, deps: &BTreeSet<u64>) -> Vec<u32> {
        deps.iter()
            .filter(|d| **d >= self.first)
            .filter_map(|d| self.index.get(d).map(|i| *i as u32))
            .collect()
    }

    /// Notes that task `id` was dispatched on device `d` with implementation `i`.
    pub(super) fn placed(&mut self, id: u64, d: usize, i: usize) {
        if let Some(&k) = self.index.get(&id) {
            if let Some(Item::Task { placed, .. }) = self.items.get_mut(k) {
                *placed = Some((d, i));
            }
        }
    }

    /// Records a task at its submission.
    pub(super) fn task(&mut self, id: u64, pending: &Pending) {
        let internal = self.internal(&pending.deps);
        self.index.insert(id, self.items.len());
        let mut p = pending.clone();
        p.deps.clear();
        p.task.after.clear();
        self.items.push(Item::Task {
            pending: Arc::new(p),
            placed: None,
            internal,
            entry: Vec::new(),
        });
    }

    /// Records a collective at its submission.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn collective(
        &mut self,
        id: u64,
        comm: &Communicator,
        kind: CollectiveTask,
        send: &[Handle],
        recv: &[Handle],
        ranks: &[usize],
        accesses: &[(Handle, AccessMode)],
        deps: &BTreeSet<u64>,
    ) {
        let internal = self.internal(deps);
        self.index.insert(id, self.items.len());
        self.items.push(Item::Collective {
            comm: comm.clone(),
            kind,
            send: send.to_vec(),
            recv: recv.to_vec(),
            ranks: ranks.to_vec(),
            accesses: accesses.to_vec(),
            internal,
            entry: Vec::new(),
        });
    }
}

/// A recorded sequence of tasks (see the module docs). Cheap to replay; tied to the
/// scheduler it was recorded on and to the handles it uses, which must stay registered.
#[derive(Clone)]
pub struct Graph {
    items: Vec<Item>,
    handles: Vec<Handle>,
    /// The scheduler it was recorded on.
    scheduler: u64,
    /// How it replays, worked out at its first replay (placement decides it).
    plan: Arc<OnceLock<ReplayPlan>>,
}

/// One item of a replayed run: the recorded task and, per access of it, the index of
/// its handle among the run's accesses.
pub(super) struct RunItem {
    pub(super) pending: Arc<Pending>,
    pub(super) slots: Vec<u32>,
}

/// Consecutive tasks of a graph placed on one device, replayed as one task.
pub(super) struct Run {
    pub(super) items: Vec<RunItem>,
    /// Its operations as validated on a device (index) the last time it ran there.
    kept: Mutex<Option<(usize, xpu_hal::KeptBatch)>>,
}

impl Run {
    /// Its operations as kept on device `d`, if they are.
    pub(super) fn kept_on(&self, d: usize) -> Option<xpu_hal::KeptBatch> {
        match &*self.kept.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((on, kept)) if *on == d => Some(kept.clone()),
            _ => None,
        }
    }

    /// Keeps its operations as validated on device `d`.
    pub(super) fn keep(&self, d: usize, kept: xpu_hal::KeptBatch) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some((d, kept));
    }
}

/// A stretch of a graph as it replays.
enum Segment {
    /// Items replayed one by one.
    Items(Range<usize>),
    /// Items replayed as one task (`pending`, whose `run` they are), which also waits
    /// for the items before the run that its items were explicitly ordered after.
    Run {
        range: Range<usize>,
        pending: Arc<Pending>,
        after: Vec<u32>,
    },
}

/// How a graph replays: its segments, and for every item the item it is recorded
/// under (the first of its run, or itself).
struct ReplayPlan {
    segments: Vec<Segment>,
    recorded_as: Vec<u32>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("tasks", &self.items.len())
            .field("handles", &self.handles.len())
            .finish()
    }
}

impl Graph {
    /// Tasks (and collectives) in it.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The device index each item runs on (a collective: its first rank's).
    pub fn placement(&self) -> Vec<usize> {
        self.items
            .iter()
            .map(|i| match i {
                Item::Task { placed, .. } => placed.map_or(0, |p| p.0),
                Item::Collective { ranks, .. } => ranks.first().copied().unwrap_or(0),
            })
            .collect()
    }

    /// Dependencies among its items, as (from, to) index pairs.
    pub fn edges(&self) -> Vec<(usize, usize)> {
        edges_of(&self.items).collect()
    }
}

/// A replay learns how far the devices have got every this many tasks.
const REPLAY_POLL_EVERY: usize = 32;

impl Scheduler {
    /// Runs `submit` (which submits tasks through the scheduler it is given) and
    /// returns what it submitted as a [`Graph`] to replay. The tasks run as usual.
    pub fn record(&self, submit: impl FnOnce(&Scheduler) -> Result<()>) -> Result<Graph> {
        {
            let mut st = self.drained();
            if st.recording.is_some() {
                return Err(Error::invalid(
                    "a recording is already in progress; recordings do not nest",
                ));
            }
            let first = st.next_task;
            st.recording = Some(Recording {
                first,
                items: Vec::new(),
                index: HashMap::default(),
            });
        }
        let outcome = submit(self);
        let mut st = self.drained();
        let Some(rec) = st.recording.take() else {
            return Err(Error::invalid("the recording was lost"));
        };
        outcome?;
        let mut items = rec.items;
        if let Some(k) = items
            .iter()
            .position(|i| matches!(i, Item::Task { placed: None, .. }))
        {
            return Err(Error::invalid(format!(
                "recorded task {k} did not start, so the graph cannot be replayed; fix its failure first"
            )));
        }
        // Each handle's first access in the graph.
        let mut seen: HashMap<u64, ()> = HashMap::default();
        let mut handles = Vec::new();
        for item in &mut items {
            let entry: Vec<bool> = item
                .accesses()
                .iter()
                .map(|(h, _)| {
                    let first = seen.insert(h.id, ()).is_none();
                    if first {
                        handles.push(*h);
                    }
                    first
                })
                .collect();
            match item {
                Item::Task { entry: e, .. } | Item::Collective { entry: e, .. } => *e = entry,
            }
        }
        Ok(Graph {
            items,
            handles,
            scheduler: self.shared.id,
            plan: Arc::default(),
        })
    }

    /// Submits `graph` again (see the module docs); returns the id of its first task
    /// (the others follow in order). Under the queued policies the call first waits
    /// until earlier tasks have been dispatched; the graph's placement is used as
    /// recorded (or planned).
    pub fn replay(&self, graph: &Graph) -> Result<TaskId> {
        if graph.scheduler != self.shared.id {
            return Err(Error::invalid(
                "the graph was recorded on another scheduler; record it on this one",
            ));
        }
        let mut st = self.drained();
        st.poll(&self.shared);
        if st.recording.is_some() {
            return Err(Error::invalid(
                "replaying inside a recording is not supported; record the tasks themselves",
            ));
        }
        if let Some(h) = graph
            .handles
            .iter()
            .find(|h| !st.handles.contains_key(&h.id))
        {
            return Err(Error::invalid(format!(
                "the graph uses {h}, which is no longer registered; a replayed graph needs all its handles"
            )));
        }
        let plan = graph
            .plan
            .get_or_init(|| replay_plan(&self.shared, &graph.items));
        // While a profile that splits runs is recorded, or every task is timed, every
        // task runs on its own, to have its span or its timing.
        let fused = st.profiling.as_ref().is_none_or(|p| !p.split_runs) && !st.time_every;
        let base = st.next_task;
        st.next_task += graph.items.len() as u64;
        st.stats.tasks += graph.items.len() as u64;
        let now = self.now();
        let mut first_error = None;
        let mut since_poll = 0;
        // The item each item is recorded under: the first of its run, or itself when
        // runs replay item by item.
        let recorded_as = |i: u32| {
            if fused {
                plan.recorded_as[i as usize]
            } else {
                i
            }
        };
        for segment in &plan.segments {
            let range = match segment {
                Segment::Run {
                    range,
                    pending,
                    after,
                } if fused => {
                    let outcome = st.replay_run(&self.shared, base, range, pending, after, now);
                    if let Err(e) = outcome {
                        first_error.get_or_insert(e);
                    }
                    continue;
                }
                Segment::Run { range, .. } | Segment::Items(range) => range,
            };
            for k in range.clone() {
                since_poll += 1;
                if since_poll % REPLAY_POLL_EVERY == 0 {
                    // Forget what has run meanwhile, as submissions do: the books
                    // (tasks, events in flight) stay small instead of growing with the
                    // graph.
                    st.poll(&self.shared);
                }
                if let Err(e) =
                    st.replay_item(&self.shared, base, k, &graph.items[k], recorded_as, now)
                {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(TaskId(base)),
        }
    }

    /// `graph` placed by `policy` on this scheduler's devices (see the module docs):
    /// the predicted times come from the performance models and the transfer times
    /// from the measured bandwidths. Collectives keep their ranks. Returns the new
    /// graph and the predicted makespan in seconds.
    pub fn plan(&self, graph: &Graph, policy: sim::Policy) -> Result<(Graph, f64)> {
        let schedule = {
            let mut st = self.lock();
            schedule_items(&self.shared, &mut st, &graph.items, policy)?
        };
        let mut planned = graph.clone();
        planned.plan = Arc::default();
        for (item, placed) in planned.items.iter_mut().zip(&schedule.tasks) {
            if let Item::Task {
                pending, placed: p, ..
            } = item
            {
                if let Some(&c) = pending.candidates.iter().find(|c| c.0 == placed.processor) {
                    *p = Some(c);
                }
            }
        }
        Ok((planned, schedule.makespan))
    }
}

/// Runs shorter than this replay item by item.
const MIN_RUN: usize = 2;

impl State {
    /// Replays item `k` of a graph whose first task is `base` on its own; `recorded_as`
    /// maps an item to the item it is recorded under.
    fn replay_item(
        &mut self,
        shared: &Shared,
        base: u64,
        k: usize,
        item: &Item,
        recorded_as: impl Fn(u32) -> u32,
        now: f64,
    ) -> Result<()> {
        let id = base + k as u64;
        let (internal, entry) = match item {
            Item::Task {
                internal, entry, ..
            }
            | Item::Collective {
                internal, entry, ..
            } => (internal, entry),
        };
        let mut deps: BTreeSet<u64> = internal
            .iter()
            .map(|i| base + u64::from(recorded_as(*i)))
            .collect();
        let key = match item {
            Item::Task { pending, .. } => pending.task.codelet.id(),
            Item::Collective { .. } => 0,
        };
        for ((h, m), first) in item.accesses().iter().zip(entry) {
            if let Some(hs) = self.handles.get_mut(&h.id) {
                if *first {
                    hs.deps.access_keyed(id, *m, key, &mut deps);
                } else {
                    hs.deps.advance_keyed(id, *m, key);
                }
            }
        }
        let label = match item {
            Item::Task { pending, .. } => pending.label.clone(),
            Item::Collective { kind, .. } => Arc::from(kind.name()),
        };
        let after = match item {
            Item::Task { pending, .. } => pending.task.after.as_slice(),
            Item::Collective { .. } => &[],
        };
        if let Some(e) = self.fails_with_dependency(id, &label, item.accesses(), &deps, after) {
            return Err(e);
        }
        match item {
            Item::Task {
                pending, placed, ..
            } => {
                let chosen = placed.unwrap_or(pending.candidates[0]);
                self.start(shared, id, pending, &deps, chosen, now)
            }
            Item::Collective {
                comm,
                kind,
                send,
                recv,
                ranks,
                accesses,
                ..
            } => {
                let outcome = self.run_collective(
                    shared, comm, *kind, id, &label, ranks, send, recv, accesses, &deps,
                );
                if let Err(e) = &outcome {
                    self.fail_task(id, &label, accesses, &deps, format!("{label} failed: {e}"));
                }
                outcome
            }
        }
    }

    /// Replays the run of items `range` of a graph whose first task is `base` as one
    /// task, recorded under the id of its first item; `after` are the items before it
    /// that its items depend on (as recorded).
    fn replay_run(
        &mut self,
        shared: &Shared,
        base: u64,
        range: &Range<usize>,
        pending: &Arc<Pending>,
        after: &[u32],
        now: f64,
    ) -> Result<()> {
        let id = base + range.start as u64;
        let mut deps: BTreeSet<u64> = after.iter().map(|i| base + u64::from(*i)).collect();
        for (h, m) in &pending.accesses {
            self.access(h.id, id, *m, 0, &mut deps);
        }
        self.runs.insert(id, base + range.end as u64 - 1);
        if let Some(e) =
            self.fails_with_dependency(id, &pending.label, &pending.accesses, &deps, &[])
        {
            return Err(e);
        }
        let Some(&chosen) = pending.candidates.first() else {
            return Err(Error::invalid(format!(
                "{}: no device runs all its tasks",
                pending.label
            )));
        };
        self.start(shared, id, pending, &deps, chosen, now)
    }
}

/// The device a recorded task was placed on (`None` for a collective).
fn placed_on(item: &Item) -> Option<usize> {
    match item {
        Item::Task { placed, .. } => placed.map(|p| p.0),
        Item::Collective { .. } => None,
    }
}

/// How `items` replay (see [`ReplayPlan`]): each stretch of consecutive tasks placed on
/// one device becomes a run, as long as the handles it uses fit in half the device's
/// memory together (a run needs a replica of each at once).
fn replay_plan(shared: &Shared, items: &[Item]) -> ReplayPlan {
    let mut segments = Vec::new();
    let mut recorded_as: Vec<u32> = (0..items.len() as u32).collect();
    let mut loose = 0;
    let mut k = 0;
    while k < items.len() {
        let Some(d) = placed_on(&items[k]) else {
            k += 1;
            continue;
        };
        let cap = match shared.devices[d].info().memory_bytes / 2 {
            0 => u64::MAX,
            c => c,
        };
        let mut seen = rustc_hash::FxHashSet::default();
        let (mut end, mut bytes) = (k, 0u64);
        while end < items.len() && placed_on(&items[end]) == Some(d) {
            let add: u64 = items[end]
                .accesses()
                .iter()
                .filter(|(h, _)| !seen.contains(&h.id))
                .map(|(h, _)| h.len)
                .sum();
            if end > k && bytes.saturating_add(add) > cap {
                break;
            }
            bytes = bytes.saturating_add(add);
            seen.extend(items[end].accesses().iter().map(|(h, _)| h.id));
            end += 1;
        }
        if end - k >= MIN_RUN {
            if loose < k {
                segments.push(Segment::Items(loose..k));
            }
            segments.push(build_run(items, k..end, bytes, &mut recorded_as));
            loose = end;
        }
        k = end;
    }
    if loose < items.len() {
        segments.push(Segment::Items(loose..items.len()));
    }
    ReplayPlan {
        segments,
        recorded_as,
    }
}

/// The run of tasks `range` of `items` as one task (see [`Run`]); records in
/// `recorded_as` that its items are recorded under its first.
fn build_run(
    items: &[Item],
    range: Range<usize>,
    footprint: u64,
    recorded_as: &mut [u32],
) -> Segment {
    let mut accesses: Vec<(Handle, AccessMode)> = Vec::new();
    let mut index: HashMap<u64, u32> = HashMap::default();
    let mut run = Vec::with_capacity(range.len());
    let mut after = BTreeSet::new();
    // The devices every item can run on, the one they were placed on first.
    let mut devices: Vec<usize> = Vec::new();
    for j in range.clone() {
        let Item::Task {
            pending,
            placed,
            internal,
            ..
        } = &items[j]
        else {
            continue;
        };
        let mut slots = Vec::with_capacity(pending.accesses.len());
        for (h, m) in &pending.accesses {
            let slot = match index.get(&h.id) {
                Some(&slot) => {
                    // Read before it is written here: the run reads the old value.
                    let mode = &mut accesses[slot as usize].1;
                    if *mode == AccessMode::Read && m.writes() {
                        *mode = AccessMode::ReadWrite;
                    }
                    slot
                }
                None => {
                    let mode = match m {
                        AccessMode::Read => AccessMode::Read,
                        AccessMode::Write => AccessMode::Write,
                        // A reduction's order among the run's items is fixed.
                        AccessMode::ReadWrite | AccessMode::Reduce => AccessMode::ReadWrite,
                    };
                    accesses.push((*h, mode));
                    let slot = (accesses.len() - 1) as u32;
                    index.insert(h.id, slot);
                    slot
                }
            };
            slots.push(slot);
        }
        after.extend(
            internal
                .iter()
                .filter(|i| (**i as usize) < range.start)
                .map(|i| recorded_as[*i as usize]),
        );
        if j == range.start {
            devices = placed.iter().map(|p| p.0).collect();
            devices.extend(
                pending
                    .candidates
                    .iter()
                    .map(|c| c.0)
                    .filter(|c| Some(*c) != placed.map(|p| p.0)),
            );
        } else {
            devices.retain(|d| pending.candidates.iter().any(|c| c.0 == *d));
        }
        run.push(RunItem {
            pending: pending.clone(),
            slots,
        });
    }
    for r in &mut recorded_as[range.clone()] {
        *r = range.start as u32;
    }
    let first = run.first().map_or("", |i| i.pending.task.codelet.name());
    let name = format!("replay:{first}+{}", run.len());
    let label: Arc<str> = Arc::from(format!(
        "run of {} replayed tasks (graph items {}..{}) from `{first}`",
        run.len(),
        range.start,
        range.end
    ));
    let pending = Pending {
        task: Task::new(&Codelet::internal(name)),
        label,
        accesses,
        deps: BTreeSet::new(),
        candidates: devices.into_iter().map(|d| (d, 0)).collect(),
        footprint,
        remaining: 0,
        run: Some(Arc::new(Run {
            items: run,
            kept: Mutex::new(None),
        })),
    };
    Segment::Run {
        range,
        pending: Arc::new(pending),
        after: after.into_iter().collect(),
    }
}

/// Dependencies among `items`, as (from, to) index pairs.
fn edges_of(items: &[Item]) -> impl Iterator<Item = (usize, usize)> + '_ {
    items.iter().enumerate().flat_map(|(k, i)| {
        let internal = match i {
            Item::Task { internal, .. } | Item::Collective { internal, .. } => internal,
        };
        internal.iter().map(move |&f| (f as usize, k))
    })
}

/// Schedules `items` with `policy` on the scheduler's devices, with the costs the
/// performance models and measured bandwidths predict (see [`Scheduler::plan`]).
pub(super) fn schedule_items(
    shared: &Shared,
    st: &mut State,
    items: &[Item],
    policy: sim::Policy,
) -> Result<sim::Schedule> {
    let n = shared.devices.len();
    let mut tasks = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        let cost = match item {
            Item::Task { pending, .. } => {
                let mut cost = vec![f64::INFINITY; n];
                let mut known = Vec::new();
                for &(d, _) in &pending.candidates {
                    let p = st.models.predict(
                        pending.task.codelet.name(),
                        &shared.archs[d],
                        pending.footprint,
                    );
                    if let Some(p) = p {
                        known.push(p);
                    }
                    cost[d] = p.unwrap_or(f64::NAN);
                }
                // Uncalibrated on a device: the mean of the others (a guess that
                // neither favours nor avoids it), or a microsecond with no data.
                let guess = if known.is_empty() {
                    1e-6
                } else {
                    known.iter().sum::<f64>() / known.len() as f64
                };
                for c in &mut cost {
                    if c.is_nan() {
                        *c = guess;
                    }
                }
                cost
            }
            Item::Collective {
                comm,
                kind,
                send,
                ranks,
                ..
            } => {
                let collective = match kind {
                    CollectiveTask::AllReduce { .. } => xpu_collectives::Collective::AllReduce,
                    CollectiveTask::ReduceScatter { .. } => {
                        xpu_collectives::Collective::ReduceScatter
                    }
                    CollectiveTask::AllGather => xpu_collectives::Collective::AllGather,
                };
                let bytes = send.first().map_or(0, |h| h.len);
                let (algorithm, _) = comm.algorithm_for(collective, bytes);
                let t = comm.estimate(collective, algorithm, bytes).unwrap_or(1e-6);
                let mut cost = vec![f64::INFINITY; n];
                if let Some(&d) = ranks.first() {
                    cost[d] = t;
                }
                cost
            }
        };
        tasks.push(sim::Task {
            id: format!("t{k}"),
            cost,
        });
    }
    // An edge carries the bytes of the handles the producer writes and the consumer
    // reads; the link factor is seconds per byte into the receiving device.
    let mut edges = Vec::new();
    for (from, to) in edges_of(items) {
        let written: Vec<u64> = items[from]
            .accesses()
            .iter()
            .filter(|(_, m)| m.writes())
            .map(|(h, _)| h.id)
            .collect();
        let bytes: u64 = items[to]
            .accesses()
            .iter()
            .filter(|(h, m)| m.reads() && written.contains(&h.id))
            .map(|(h, _)| h.len)
            .sum();
        // Every crossing costs a hand-off too, counted as the bytes the default
        // bandwidth moves in that time.
        edges.push(sim::Edge {
            from,
            to,
            cost: bytes as f64 + HANDOFF * DEFAULT_BANDWIDTH,
        });
    }
    let links: Vec<Vec<f64>> = (0..n)
        .map(|p| {
            (0..n)
                .map(|q| {
                    if p == q {
                        0.0
                    } else {
                        1.0 / st.devices[q].bandwidth.unwrap_or(DEFAULT_BANDWIDTH)
                    }
                })
                .collect()
        })
        .collect();
    let names = shared.devices.iter().map(|d| d.id().to_string()).collect();
    let cost_graph = sim::CostGraph::new(names, tasks, edges, Some(links))?;
    Ok(policy.schedule(&cost_graph))
}
