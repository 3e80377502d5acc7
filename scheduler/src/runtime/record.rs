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
        let base = st.next_task;
        st.next_task += graph.items.len() as u64;
        st.stats.tasks += graph.items.len() as u64;
        let now = self.now();
        let mut first_error = None;
        for (k, item) in graph.items.iter().enumerate() {
            if k > 0 && k % REPLAY_POLL_EVERY == 0 {
                // Forget what has run meanwhile, as submissions do: the books (tasks,
                // events in flight) stay small instead of growing with the graph.
                st.poll(&self.shared);
            }
            let id = base + k as u64;
            let (internal, entry) = match item {
                Item::Task {
                    internal, entry, ..
                }
                | Item::Collective {
                    internal, entry, ..
                } => (internal, entry),
            };
            let mut deps: BTreeSet<u64> = internal.iter().map(|i| base + u64::from(*i)).collect();
            let key = match item {
                Item::Task { pending, .. } => pending.task.codelet.id(),
                Item::Collective { .. } => 0,
            };
            for ((h, m), first) in item.accesses().iter().zip(entry) {
                if let Some(hs) = st.handles.get_mut(&h.id) {
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
            let failed = st.fails_with_dependency(id, &label, item.accesses(), &deps, after);
            let outcome = match (failed, item) {
                (Some(e), _) => Err(e),
                (
                    None,
                    Item::Task {
                        pending, placed, ..
                    },
                ) => {
                    let chosen = placed.unwrap_or(pending.candidates[0]);
                    st.start(&self.shared, id, pending, &deps, chosen, now)
                }
                (
                    None,
                    Item::Collective {
                        comm,
                        kind,
                        send,
                        recv,
                        ranks,
                        accesses,
                        ..
                    },
                ) => {
                    match st.run_collective(
                        &self.shared,
                        comm,
                        *kind,
                        id,
                        &label,
                        ranks,
                        send,
                        recv,
                        &deps,
                    ) {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            st.fail_task(
                                id,
                                &label,
                                accesses,
                                &deps,
                                format!("{label} failed: {e}"),
                            );
                            Err(e)
                        }
                    }
                }
            };
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
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
